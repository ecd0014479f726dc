"""Faust app of the delay processor: stamp_batch messages in, stamp_delay line protocol out.

Run from the repository root:
    faust -A processors.delay.app worker --without-web -l info
    python -m processors.delay [--bootstrap HOST:PORT ...]      (same worker, flags -> env)

Settings come from the environment (processors/delay/config.py): SEGSCOPE_KAFKA_BOOTSTRAP,
SEGSCOPE_TOPIC_STAMP_RECORDS, SEGSCOPE_TOPIC_METRICS, SEGSCOPE_TOPIC_DEADLETTER,
SEGSCOPE_DELAY_APP_ID (consumer group), SEGSCOPE_DELAY_GRACE_S, SEGSCOPE_DELAY_RETENTION_S, ...

Input comes in batches (processors/runtime/intake.py): the messages of one fetch, without
Faust's per-event work. Per message the worker decodes (np.frombuffer); the records of all the
messages of a partition in the batch go into the aggregator in one vectorised call, and the batch
is held (and later acked) as one. Statistics and all output happen in the 1 s timer, which
batches many lines into one Kafka message.

Crash safety (kill -9 loses nothing, counts nothing twice): an input message is acknowledged,
so its offset may be committed, only when every second it added records to has left the
aggregator (evicted after the retention window) and the lines of its last emission were
acknowledged by Kafka. A restarted worker therefore replays every message whose seconds were
still open, rebuilds those seconds completely, and emits them again: the same measurement, tags,
timestamp and fields, which InfluxDB overwrites instead of adding. A replayed message can also
hold the last records of a second that was already final (it spans two seconds); so before it
acks, the worker writes each session's eviction horizon to its progress topic
(<app_id>.progress), and a new worker skips replayed records below it (replayed_records_skipped).
The cost: on restart, up to retention_s (60 s) of input is read again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time

import faust
import numpy as np
from aiokafka import codec as aiokafka_codec

from processors.delay.aggregate import NS_PER_S, DelayAggregator, clock_tai_ns, counters_line
from processors.delay.config import DelayConfig
from processors.delay.topics import ensure_topics
from processors.newest import attach_newest
from processors.paths import PathBook
from processors.runtime.acks import InOrderAcks
from processors.runtime.config import faust_app_settings
from processors.runtime.deadletters import dead_letter, decode_or_dead_letter
from processors.runtime.health import ProcessorHealth
from processors.runtime.input_watch import hold_idle_clocks, hold_idle_clocks_while_stale
from processors.runtime.intake import BatchIntake
from processors.runtime.moves import PartitionMoves
from processors.runtime.topics import read_progress
from segscope_schemas.names import TOPIC_CONFIG, TOPIC_PATHS
from segscope_schemas.stamp_record import decode_batch

log = logging.getLogger("segscope.delay")

cfg = DelayConfig.from_env()
# every session's SID list (segscope.paths, schemas/paths.md): the `path` tag of stamp_delay
paths = PathBook(cfg.bootstrap, cfg.paths_topic)
aggregator = DelayAggregator(
    grace_s=cfg.grace_s,
    idle_s=cfg.idle_s,
    retention_s=cfg.retention_s,
    tai_utc_offset_s=cfg.tai_utc_offset_s,
    path_of=paths.path_for_session,
)


class DelayApp(faust.App):
    async def on_first_start(self) -> None:
        self.conf.datadir.parent.mkdir(parents=True, exist_ok=True)  # Faust makes only the last level
        await super().on_first_start()
        # The streamer compresses with lz4; without cramjam aiokafka crashes on the first
        # fetch. Say so at start rather than after the first batch.
        if not aiokafka_codec.has_lz4():
            raise RuntimeError("aiokafka has no lz4 codec: install cramjam (requirements.txt)")
        # Faust ignores a missing source topic (and then never consumes it), so make sure
        # all three exist before the consumer subscribes.
        ensure_topics(cfg.bootstrap, [cfg.records_topic, cfg.metrics_topic, cfg.deadletter_topic])
        # the progress topic keeps the newest value per key (session or flow): compacted, it stays small
        ensure_topics(cfg.bootstrap, [PROGRESS_TOPIC], config={"cleanup.policy": "compact"})
        ensure_topics(cfg.bootstrap, [cfg.paths_topic], config=TOPIC_CONFIG[TOPIC_PATHS])
        paths.start()  # the paths published so far, before the first record is taken
        intake.install()  # before the consumer's fetcher starts
        health.serve()  # the progress topic is read at each partition assignment (moves.on_assigned)
        log.info(
            "delay processor: %s -> %s (dead letters: %s), broker %s, group %s, grace %.1f s, retention %.0f s",
            cfg.records_topic,
            cfg.metrics_topic,
            cfg.deadletter_topic,
            cfg.bootstrap,
            cfg.app_id,
            cfg.grace_s,
            cfg.retention_s,
        )

    async def on_stop(self) -> None:
        # Emit what is still open so a clean stop loses nothing that was consumed.
        try:
            # What is open is published for now, but its input stays uncommitted: the next worker
            # replays it and emits those seconds again, complete (InfluxDB overwrites them).
            await publish_lines(aggregator.flush_all())
            await write_progress()
            await ack_finished_messages()
            await publish_counters()
        except Exception as e:  # the producer may already be gone; say so, don't hide it
            log.warning("final flush on stop failed: %r", e)
        paths.stop()
        await super().on_stop()


app = DelayApp(
    cfg.app_id,
    **faust_app_settings(cfg.bootstrap, cfg.datadir),
    consumer_max_fetch_size=16 * 1024 * 1024,  # default 1 MiB = only a few 4000-record batches
    broker_max_poll_records=2000,
    producer_max_request_size=4 * 1024 * 1024,
)

health = ProcessorHealth(app, "delay", cfg, stale_after_s=max(15.0, 5 * cfg.flush_interval_s))

records_topic = app.topic(
    cfg.records_topic, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
)
metrics_topic = app.topic(cfg.metrics_topic, key_serializer="raw", value_serializer="raw")
# the newest stamp_delay line of each series, to SEGSCOPE_TOPIC_METRICS_NEWEST every interval ("": off)
newest = attach_newest(app, cfg, key=b"delay")
PROGRESS_TOPIC = f"{cfg.app_id}.progress"
progress_topic = app.topic(PROGRESS_TOPIC, key_serializer="raw", value_serializer="raw")
progress_written: dict[tuple[str, int], int] = {}


def load_progress(values: list[dict]) -> None:
    """Seed the aggregator with the horizons earlier owners of its partitions wrote (read at each
    assignment: at start, and when a rebalance moves partitions to this worker)."""
    for v in values:
        key = (v["node"], int(v["ssid"]))
        progress_written[key] = max(progress_written.get(key, -(2**62)), int(v["final_below_s"]))
    for (node, ssid), s in progress_written.items():
        aggregator.seed_final(node, ssid, s)
    if progress_written:
        log.info("delay processor: %d sessions resume from %s", len(progress_written), PROGRESS_TOPIC)


CATCHUP_S = 10

# While no fetch is answered (a Kafka outage), the sessions' silence is the consumer's: their idle
# clocks are held, CATCHUP_S ahead (runtime/input_watch.py)
input_watch = hold_idle_clocks_while_stale(
    app, {cfg.records_topic}, lambda: aggregator.sessions.values(), lambda: clock_tai_ns() + CATCHUP_S * NS_PER_S
)


async def after_assignment() -> None:
    """The sessions this worker keeps were silent during the rebalance because the consumer was,
    not the sender: their idle clocks restart now. Otherwise the first flush after a pause of
    more than grace_s (retention_s) would close (evict) their open seconds by the wall clock
    just before the replay from the committed offset delivers the rest of those seconds."""
    # and the replay gets CATCHUP_S to arrive before the idle rule applies again (a loaded machine
    # took more than 2 s): a session that really stopped at the rebalance closes that much later
    hold_idle_clocks(aggregator.sessions.values(), clock_tai_ns() + CATCHUP_S * NS_PER_S)
    # read in the event loop on purpose: no message may be processed before the seeds are in
    # place (a replayed record of a final second would make a partial second; reading it in a
    # thread let the stream run meanwhile and failed the crash and scale-out tests)
    load_progress(read_progress(cfg.bootstrap, PROGRESS_TOPIC, f"{cfg.app_id}-progress-reader"))


def drop_sessions(keys: set) -> int:
    """A rebalance moved these sessions' partition away: forget them without publishing (their new
    owner replays their unacked input and publishes them whole)."""
    for key in keys:
        aggregator.sessions.pop(key, None)
        progress_written.pop(key, None)
    return len(keys)


async def write_progress() -> None:
    """Each session's eviction horizon, delivered before any message behind it is acked."""
    sent = []
    # a snapshot: the await below lets process_batches add sessions to the dict meanwhile
    for key, st in list(aggregator.sessions.items()):
        if st.horizon_s > progress_written.get(key, -(2**62)):
            value = json.dumps({"node": key[0], "ssid": key[1], "final_below_s": st.horizon_s}).encode()
            sent.append(await progress_topic.send(key=f"{key[0]}/{key[1]}".encode(), value=value))
            progress_written[key] = st.horizon_s
    if sent:
        await asyncio.gather(*sent)


deadletter_topic = app.topic(cfg.deadletter_topic, key_serializer="raw", value_serializer="raw")


def handle_messages(messages: list) -> tuple[list[tuple[object, bytes]], dict[tuple[str, int], int]]:
    """Decode messages and fold their records into the aggregator in one call: ([(message, its dead
    letter)], per session the last second the records belong to, which their acks wait for)."""
    letters = []
    parts: list[tuple[str, np.ndarray]] = []
    taken = []
    for message in messages:
        header, records, letter = decode_or_dead_letter(message, decode_batch, aggregator.counters)
        if letter is not None:
            letters.append((message, letter))
        else:
            parts.append((header.node, records))
            taken.append(message)
    if not parts:
        return letters, {}
    before = dataclasses.replace(aggregator.counters)
    try:
        return letters, aggregator.ingest_parts(parts)
    except Exception:  # noqa: BLE001 - found below, message by message
        pass
    # a bug or an input we did not foresee: fold the messages one by one to find the ones it fails
    # on; those are kept as dead letters, counted. The counters restart from before the failed
    # call; what it had added to the seconds is there twice now and merged once (duplicate_records).
    aggregator.counters = before
    touched: dict[tuple[str, int], int] = {}
    for (node, records), message in zip(parts, taken):
        try:
            for key, second in aggregator.ingest(node, records).items():
                touched[key] = max(second, touched.get(key, second))
        except Exception as e:
            aggregator.counters.processing_errors += 1
            log.exception("ingest failed at %s[%d]@%d", message.topic, message.partition, message.offset)
            letters.append((message, dead_letter("processing_error", repr(e), message)))
    return letters, touched


# Every input message, held unacked until ack_finished_messages() finds every second its batch
# added records to evicted (and every earlier message of its partition acked: InOrderAcks says why).
pending = InOrderAcks(lambda: app.consumer)
moves = PartitionMoves(
    app,
    {cfg.records_topic: pending},
    on_lost=lambda partitions: drop_sessions(moves.take_keys(partitions)),
    on_assigned=after_assignment,
)


def message_finished(touched: dict[tuple[str, int], int]) -> bool:
    for key, last_second in touched.items():
        st = aggregator.sessions.get(key)
        if st is not None and last_second >= st.horizon_s:
            return False  # this second may still be emitted again
    return True


async def ack_finished_messages() -> None:
    """Ack the pending messages whose every second has been evicted (after their last emission
    was delivered: the caller awaited it)."""
    await pending.ack_finished(message_finished)


async def process_batch(messages: list) -> None:
    """The messages of one fetch (BatchIntake), under moves.lock: per partition one aggregator
    call and one held batch; dead letters are delivered before the batch is held."""
    by_partition: dict = {}
    for message in messages:
        by_partition.setdefault(message.tp, []).append(message)
    held = []
    sent = []
    for tp, part in by_partition.items():
        letters, touched = handle_messages(part)
        moves.seen(touched, tp)
        for message, letter in letters:
            sent.append(await deadletter_topic.send(key=message.key, value=letter))
        held.append((tp, [m.offset for m in part], touched))
    if sent:
        await asyncio.gather(*sent)  # delivered, then held (acked later)
    for tp, offsets, touched in held:
        pending.hold(tp, offsets, touched)


intake = BatchIntake(app, moves.counts)
intake.take(records_topic, moves.batches(process_batch))


async def publish_lines(lines: list[str]) -> None:
    """Send the lines and wait until Kafka acknowledged every message; then hold each series' newest
    for the summary (a line is summarised only once it is on the metrics topic)."""
    step = cfg.max_lines_per_message
    sent = []
    for i in range(0, len(lines), step):
        sent.append(await metrics_topic.send(key=b"delay", value="\n".join(lines[i : i + step]).encode()))
    if sent:
        await asyncio.gather(*sent)
    newest.take(lines)


async def publish_counters() -> None:
    extra = {
        "open_seconds": aggregator.open_seconds(),
        "sessions": len(aggregator.sessions),
        "unacked_messages": len(pending),  # input held uncommitted until its seconds are final
        "path_records": paths.records,
        "path_records_malformed": paths.malformed,
        **moves.counts,
        **input_watch.counts,
        **newest.counts(),
    }
    ts = time.time_ns()
    line = counters_line(aggregator.counters, "delay", ts, extra=extra, instance=health.instance)
    await health.publish(metrics_topic, b"delay", line, ts)


_last_log = 0.0


@app.timer(interval=cfg.flush_interval_s)
async def flush_closed_seconds() -> None:
    global _last_log
    async with moves.lock:
        if not moves.may_publish():  # a rebalance is under way, or a stall may have cost the membership
            return
        await publish_lines(aggregator.flush())
        await write_progress()
        await ack_finished_messages()
    await publish_counters()
    now = time.monotonic()
    if now - _last_log >= 10.0:
        _last_log = now
        log.info("delay counters %s", json.dumps(aggregator.counters.as_dict()))
