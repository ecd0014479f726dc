"""NewestLines: the newest `stamp_delay` / complete `altmark_loss` / `inline_hop_delay` line of
every series a delay, loss or in-line worker published since its last summary, sent to the summary
topic every interval (the measurements are the topology model's MEASURED_PREFIXES; an
`inline_hop_delay` line with measured=false is held like any other: the model keeps the newest
point of a hop, measured or not; tests/topology/test_topology_inline.py holds a model fed from the
summary equal to one fed every line).

Why (docs/capacity.md sections 3 and 5): the topology processor's leader keeps, per series, only
the newest point (processors/topology/model.py), yet it read every point of segscope.metrics:
500 k points/s at 10 000 routers, about five of its cores. With SEGSCOPE_TOPIC_METRICS_NEWEST set,
every delay and loss worker also hands the lines of each publish_lines call to a NewestLines, and
a timer publishes what it holds every SEGSCOPE_SUMMARY_INTERVAL_S to that topic; the topology
workers (same variable) read that topic instead: series / interval points per second.

The rule is the topology model's, so a model fed from the summary keeps the same newest measures as
one fed from segscope.metrics (tests/processors/test_newest_lines.py holds the two equal):
- series = the line's head (measurement and tags, the text before the first blank): every path of a
  session or flow is its own series, and the model keeps the newest over them;
- newest by the line's timestamp, not by arrival: a re-emitted older second does not replace a
  newer line held; an equal timestamp replaces (the model keeps the last arrived of equal ones), and
  a replaced series moves to the end of the summary, so that ties between two heads of one model key
  (a path change) resolve as they did on segscope.metrics;
- `stamp_delay,` lines (not `stamp_delay_histogram`) and `altmark_loss,` lines with complete=true
  only (the model ignores incomplete blocks: metrics.md, loss numbers only from complete blocks).

Kill/restart: a clean stop publishes what is held (after the worker's final flush). A line held
but not published when a worker is killed is superseded by its series' next point (sessions and
flows produce one every second / block; the partition's new owner publishes it), and what a
restarted worker re-emits passes through publish_lines again: what topology sees is newest-wins,
at most one interval + one second older than segscope.metrics after a kill (a session or flow that
ended just then keeps its previous summary's point). Counted in the worker's segscope_processor line:
newest_lines_held (taken, replacing or not), newest_lines_older (older than the held line of their
series: superseded, not sent), newest_lines_incomplete and newest_lines_malformed (the model would
not take them either), newest_lines_published, newest_messages_published, newest_publish_errors (a
failed send: its lines are held again and go with the next summary).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from processors.runtime.config import ConfigError
from processors.topology.model import MEASURED_PREFIXES, complete_is_true
from segscope_schemas.line_protocol import LineError, parse_fields, parse_line

log = logging.getLogger("segscope.newest")

LOSS_PREFIX = "altmark_loss,"


def newest_env() -> dict[str, tuple[str, str]]:
    """The summary's settings, the same variables in the delay, loss and topology processors."""
    return {
        # the summary topic; "" = off (the topology processor then reads segscope.metrics whole).
        # Turn it on above ~1 000 routers (docs/capacity.md): the names registry's is segscope.metrics.newest
        "newest_topic": ("SEGSCOPE_TOPIC_METRICS_NEWEST", ""),
        # how often a delay / loss worker publishes the summary: the topology's measured values are up to
        # this much older; must be below the topology refresh (30 s) and the worker's retention
        "summary_interval_s": ("SEGSCOPE_SUMMARY_INTERVAL_S", "10"),
    }


def check_newest(cfg, env: dict[str, tuple[str, str]], retention_s: float) -> None:
    """ConfigError naming the variable and the fix for a summary setting that cannot work."""
    topic_var, interval_var = env["newest_topic"][0], env["summary_interval_s"][0]
    if not cfg.newest_topic:
        return  # off: the interval is not used
    if cfg.newest_topic == cfg.metrics_topic:
        raise ConfigError(
            f"{topic_var}={cfg.newest_topic!r} is the metrics topic: use its own topic, e.g. segscope.metrics.newest"
        )
    # below the retention: a held line is published before the input behind it can be acked
    bound = min(30.0, retention_s)
    if not 0 < cfg.summary_interval_s < bound:
        raise ConfigError(
            f"{interval_var}={cfg.summary_interval_s}: use 0 < interval < {bound:g} s "
            f"(the topology refresh period, 30 s, and the worker's retention), e.g. {min(10.0, bound / 2):g}"
        )


@dataclass
class NewestCounters:
    newest_lines_held: int = 0
    newest_lines_older: int = 0
    newest_lines_incomplete: int = 0
    newest_lines_malformed: int = 0
    newest_lines_published: int = 0
    newest_messages_published: int = 0
    newest_publish_errors: int = 0


class NewestLines:
    def __init__(self, max_lines_per_message: int = 2000, enabled: bool = True):
        self.enabled = enabled
        self.max_lines_per_message = max_lines_per_message
        # series head -> (timestamp ns, line), in the order of each series' last replacement
        self.held: dict[object, tuple[int, str]] = {}
        self.counters = NewestCounters()

    def __len__(self) -> int:
        return len(self.held)

    def take(self, lines: list[str]) -> None:
        """Hold the newest measured line of each series among `lines` (one publish_lines call's):
        each line's series (its head) and timestamp are read here, then take_known holds them. A
        plain line takes finds, slices and an int(); any other goes to the full parser, and an
        altmark_loss line is held only when the model's rule says complete (the same outcome as
        the model: tests/processors/test_newest_lines.py). The loss worker does not come here: its
        joiner hands take_known the heads and timestamps it already has."""
        if not self.enabled:
            return
        entries: list[tuple[object, int, str]] = []
        incomplete = 0
        for line in lines:
            if not line.startswith(MEASURED_PREFIXES):
                continue
            blank, last = line.find(" "), line.rfind(" ")
            try:
                if blank == last or line[blank - 1] == "\\":
                    raise ValueError  # no timestamp, or an escaped blank in the tags: parsed in full
                ts = int(line[last + 1 :])
            except ValueError:
                entry = self._parsed_entry(line)
                if entry is not None:
                    entries.append(entry)
                continue
            if line[0] == "a":  # altmark_loss: complete blocks only (the model's rule)
                complete = self._complete(line[blank + 1 : last])
                if not complete:
                    incomplete += complete is False  # None: counted malformed
                    continue
            entries.append((line[:blank], ts, line))
        self.take_known(entries, incomplete)

    def take_known(self, entries: list[tuple[object, int, str]], incomplete: int = 0) -> None:
        """Hold (head, timestamp ns, line) entries of complete measured lines whose head and timestamp
        the producer already knows (the loss joiner's complete_out): take()'s rule without reading
        the lines, which cost about half of what the joiner spent making them. incomplete: how many
        lines the producer published beside them that the model would not take (counted as take()
        counts them)."""
        if not self.enabled:
            return
        held = self.held
        taken = older = 0
        for head, ts, line in entries:
            old = held.get(head)
            if old is not None:
                if old[0] > ts:
                    older += 1
                    continue
                del held[head]  # re-inserted at the end: the last replaced series is published last
            held[head] = (ts, line)
            taken += 1
        self.counters.newest_lines_held += taken
        self.counters.newest_lines_older += older
        self.counters.newest_lines_incomplete += incomplete

    def _complete(self, fields: str) -> bool | None:
        """The model's rule for any field set: complete=true (or t, True, ...) as the last `complete`
        field; None (counted malformed) when a field set with escapes does not parse."""
        if "\\" not in fields:
            return complete_is_true(fields)
        return self._complete_escaped(fields)

    def _complete_escaped(self, fields: str) -> bool | None:
        """complete=true in a field set with escapes; None (counted malformed) when it does not parse."""
        try:
            return parse_fields(fields).get("complete") is True
        except LineError:
            self.counters.newest_lines_malformed += 1
            return None

    def _parsed_entry(self, line: str) -> tuple[object, int, str] | None:
        """(series, timestamp, line) of a line the plain split cannot read, from the full parser;
        None (counted) for one the model would not take either."""
        try:
            point = parse_line(line)
        except LineError:
            point = None
        if point is None or point.timestamp_ns is None:
            self.counters.newest_lines_malformed += 1  # the model would count it malformed too
            return None
        if point.measurement == "altmark_loss" and point.fields.get("complete") is not True:
            self.counters.newest_lines_incomplete += 1
            return None
        return (point.measurement, tuple(sorted(point.tags.items()))), point.timestamp_ns, line

    def take_back(self, lines: list[str]) -> None:
        """Lines whose publication failed, held again unless a newer line of the series came meanwhile
        (not counted as held a second time)."""
        before = self.counters.newest_lines_held
        self.take(lines)
        self.counters.newest_lines_held = before

    def drain(self) -> list[str]:
        """The held lines, oldest replacement first, and an empty holder."""
        lines = [line for _, line in self.held.values()]
        self.held = {}
        return lines

    def messages(self, lines: list[str]) -> list[bytes]:
        step = self.max_lines_per_message
        return ["\n".join(lines[i : i + step]).encode() for i in range(0, len(lines), step)]

    async def publish(self, topic, key: bytes) -> int:
        """Send what is held to `topic` (a Faust topic), several lines per message, and wait until
        Kafka acknowledged it; on a failure hold the lines again (raised on). Returns the lines sent."""
        lines = self.drain()
        if not lines:
            return 0
        try:
            sent = [await topic.send(key=key, value=body) for body in self.messages(lines)]
            await asyncio.gather(*sent)
        except Exception:
            self.counters.newest_publish_errors += 1
            self.take_back(lines)
            raise
        self.counters.newest_lines_published += len(lines)
        self.counters.newest_messages_published += len(sent)
        return len(lines)

    def counts(self) -> dict[str, int]:
        """The counters for the worker's segscope_processor line ({} when the summary is off)."""
        if not self.enabled:
            return {}
        return {**self.counters.__dict__, "newest_series_held": len(self.held)}


def attach_newest(app, cfg, key: bytes) -> NewestLines:
    """The worker's NewestLines and, when cfg.newest_topic is set, the timer that publishes it every
    cfg.summary_interval_s (it creates the topic before its first send) and once more at a clean
    stop; off: a holder whose take() does nothing."""
    newest = NewestLines(cfg.max_lines_per_message, enabled=bool(cfg.newest_topic))
    if not newest.enabled:
        return newest
    topic = app.topic(cfg.newest_topic, key_serializer="raw", value_serializer="raw")
    topic_ready = False

    async def publish_newest_lines() -> None:
        nonlocal topic_ready
        if not topic_ready:
            from processors.delay.topics import ensure_topics

            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, ensure_topics, cfg.bootstrap, [cfg.newest_topic])
            topic_ready = True
        try:
            await newest.publish(topic, key)
        except Exception as e:  # held again: the next interval sends them
            log.warning("summary to %s not sent (%r): held for the next interval", cfg.newest_topic, e)

    app.timer(interval=cfg.summary_interval_s)(publish_newest_lines)

    async def publish_at_stop(sender=None, **kwargs) -> None:
        # faust.App.on_stop sends on_before_shutdown after the consumer stopped and before the
        # producer's last flush; the processors call it last in their on_stop, after their final
        # publish_lines: so a clean stop (a rolling update, a scale-down) publishes what is held
        try:
            await asyncio.wait_for(publish_newest_lines(), timeout=10.0)
        except asyncio.TimeoutError:
            log.warning("summary to %s not sent at stop within 10 s", cfg.newest_topic)

    app.on_before_shutdown.connect(publish_at_stop)
    return newest
