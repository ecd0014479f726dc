"""Faust app of the in-line processor: ioam_batch messages in, inline_* line protocol out.

Run from the repository root:
    python -m processors.inline [--bootstrap HOST:PORT ...]      (flags -> env)
    faust -A processors.inline.app worker --without-web -l info   (same worker)

Settings: processors/inline/config.py (SEGSCOPE_KAFKA_BOOTSTRAP, SEGSCOPE_TOPIC_IOAM_RECORDS,
SEGSCOPE_TOPIC_METRICS, SEGSCOPE_TOPIC_DEADLETTER, SEGSCOPE_INLINE_APP_ID, SEGSCOPE_INLINE_GRACE_S,
SEGSCOPE_INLINE_RETENTION_S, ...).

One stage, as the delay processor: the streamers key their messages <egress node>/<flow_id>, so
every record of a flow is in one partition, in the order the egress received them, and one worker
owns the flow. Input comes in batches (processors/runtime/intake.py: the messages of one fetch,
without Faust's per-event work): per message one decode (np.frombuffer), then per partition and
node one check and one vectorised fold of all their records into the aggregator
(processors/inline/aggregate.py); statistics and all output happen in the flush timer, which
batches many lines into one Kafka message. A message that is not an ioam_batch
goes to the dead-letter topic with the reason, and so does one with unusable records (reason
`invalid_records`, the count per problem; its good records go on).

Crash safety, as in processors/delay/app.py: an input message is acked (its offset committable)
only when every second it added records to has left the aggregator (evicted, retention_s of data
time after the second: the reorder window) and the lines of its last emission were acknowledged
by Kafka. Before acking, the worker writes each flow's progress to the compacted
<app_id>.progress topic: the seconds below `final_below_s` are final, and every seq up to
`base_seq` is accounted in them. A restarted worker (or the new owner after a rebalance) seeds its
flows with it: replayed records of final seconds are skipped (replayed_records_skipped), and the
loss accounting continues at base_seq + 1, so no seq is counted twice or missed; the seconds still
open are rebuilt from the replayed input and emitted again with the same identity (InfluxDB
overwrites). Rebalances, stalls and the commit rule: the processors' runtime (PartitionMoves,
HeartbeatLease, InOrderAcks, ExactCommits in processors/runtime/), exactly as the delay processor
uses them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time

import faust
from aiokafka import codec as aiokafka_codec

from processors.delay.aggregate import NS_PER_S, clock_tai_ns, counters_line
from processors.delay.topics import ensure_topics
from processors.inline.aggregate import InlineAggregator
from processors.inline.config import InlineConfig
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
from segscope_schemas.ioam_record import decode_batch
from segscope_schemas.names import TOPIC_CONFIG, TOPIC_PATHS

log = logging.getLogger("segscope.inline")

cfg = InlineConfig.from_env()
# SID lists of the in-line monitors and every node's IOAM identity (segscope.paths, schemas/paths.md)
paths = PathBook(cfg.bootstrap, cfg.paths_topic)
aggregator = InlineAggregator(
    grace_s=cfg.grace_s,
    idle_s=cfg.idle_s,
    retention_s=cfg.retention_s,
    tai_utc_offset_s=cfg.tai_utc_offset_s,
    book=paths,
)


class InlineApp(faust.App):
    async def on_first_start(self) -> None:
        self.conf.datadir.parent.mkdir(parents=True, exist_ok=True)  # Faust makes only the last level
        await super().on_first_start()
        # a streamer compresses with lz4; without cramjam aiokafka crashes on the first fetch
        if not aiokafka_codec.has_lz4():
            raise RuntimeError("aiokafka has no lz4 codec: install cramjam (requirements.txt)")
        # Faust ignores a missing source topic (and then never consumes it)
        ensure_topics(cfg.bootstrap, [cfg.records_topic, cfg.metrics_topic, cfg.deadletter_topic])
        # the progress topic keeps the newest value per flow: compacted, it stays small
        ensure_topics(cfg.bootstrap, [PROGRESS_TOPIC], config={"cleanup.policy": "compact"})
        ensure_topics(cfg.bootstrap, [cfg.paths_topic], config=TOPIC_CONFIG[TOPIC_PATHS])
        paths.start()  # the paths and IOAM nodes published so far, before the first record is taken
        intake.install()  # before the consumer's fetcher starts
        health.serve()  # the progress topic is read at each partition assignment (moves.on_assigned)
        log.info(
            "inline processor: %s -> %s (dead letters: %s), broker %s, group %s, grace %.1f s, retention %.0f s",
            cfg.records_topic,
            cfg.metrics_topic,
            cfg.deadletter_topic,
            cfg.bootstrap,
            cfg.app_id,
            cfg.grace_s,
            cfg.retention_s,
        )

    async def on_stop(self) -> None:
        # What is open is published for now, but its input stays uncommitted: the next worker
        # replays it and emits those seconds again, complete (InfluxDB overwrites them).
        try:
            await publish_lines(aggregator.flush_all())
            await write_progress()
            await ack_finished_messages()
            await publish_counters()
        except Exception as e:  # the producer may already be gone; say so, don't hide it
            log.warning("final flush on stop failed: %r", e)
        paths.stop()
        await super().on_stop()


app = InlineApp(
    cfg.app_id,
    **faust_app_settings(cfg.bootstrap, cfg.datadir),
    consumer_max_fetch_size=16 * 1024 * 1024,  # default 1 MiB = one 4000-record batch
    broker_max_poll_records=2000,
    producer_max_request_size=4 * 1024 * 1024,
)

health = ProcessorHealth(app, "inline", cfg, stale_after_s=max(15.0, 5 * cfg.flush_interval_s))

records_topic = app.topic(
    cfg.records_topic, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
)
metrics_topic = app.topic(cfg.metrics_topic, key_serializer="raw", value_serializer="raw")
deadletter_topic = app.topic(cfg.deadletter_topic, key_serializer="raw", value_serializer="raw")
# the newest inline_hop_delay line of each series, to SEGSCOPE_TOPIC_METRICS_NEWEST every interval ("": off)
newest = attach_newest(app, cfg, key=b"inline")
PROGRESS_TOPIC = f"{cfg.app_id}.progress"
progress_topic = app.topic(PROGRESS_TOPIC, key_serializer="raw", value_serializer="raw")
progress_written: dict[tuple[str, int], int] = {}  # flow -> the final_below_s Kafka has for it


def load_progress(values: list[dict]) -> None:
    """Seed the aggregator with what earlier owners of its partitions made final (read at each
    assignment: at start, and when a rebalance moves partitions to this worker)."""
    newest: dict[tuple[str, int], dict] = {}
    for v in values:
        key = (v["node"], int(v["flow_id"]))
        if key not in newest or int(v["final_below_s"]) > int(newest[key]["final_below_s"]):
            newest[key] = v
    for key, v in newest.items():
        final_below_s = int(v["final_below_s"])
        if final_below_s > progress_written.get(key, -(2**62)):
            progress_written[key] = final_below_s
        base = v.get("base_seq")
        aggregator.seed_final(key[0], key[1], final_below_s, None if base is None else int(base))
    if newest:
        log.info("inline processor: %d flows resume from %s", len(newest), PROGRESS_TOPIC)


CATCHUP_S = 10

# While no fetch is answered (a Kafka outage), the flows' silence is the consumer's: their idle
# clocks are held, CATCHUP_S ahead (runtime/input_watch.py)
input_watch = hold_idle_clocks_while_stale(
    app, {cfg.records_topic}, lambda: aggregator.flows.values(), lambda: clock_tai_ns() + CATCHUP_S * NS_PER_S
)


async def after_assignment() -> None:
    """As the delay processor's: the flows this worker keeps were silent during the rebalance because
    the consumer was; their idle clocks restart now, with CATCHUP_S for the replay to arrive. The
    progress topic is read in the event loop on purpose: no message may be processed before the
    seeds are in place."""
    hold_idle_clocks(aggregator.flows.values(), clock_tai_ns() + CATCHUP_S * NS_PER_S)
    load_progress(read_progress(cfg.bootstrap, PROGRESS_TOPIC, f"{cfg.app_id}-progress-reader"))


def drop_flows(keys: set) -> int:
    """A rebalance moved these flows' partition away: forget them without publishing (their new
    owner replays their unacked input and publishes them whole)."""
    for key in keys:
        aggregator.flows.pop(key, None)
        progress_written.pop(key, None)
    return len(keys)


async def write_progress() -> None:
    """Each flow's final seconds and accounted seqs, delivered before any message behind them is acked."""
    sent = []
    for key, st in list(aggregator.flows.items()):  # a snapshot: the await lets the agent add flows
        if st.final_s > progress_written.get(key, -(2**62)):
            value = {"node": key[0], "flow_id": key[1], "final_below_s": st.final_s, "base_seq": st.base_seq}
            sent.append(await progress_topic.send(key=f"{key[0]}/{key[1]}".encode(), value=json.dumps(value).encode()))
            progress_written[key] = st.final_s
    if sent:
        await asyncio.gather(*sent)


def handle_messages(messages: list) -> tuple[list[tuple[object, bytes]], dict[tuple[str, int], int]]:
    """Decode messages (of one partition, in offset order) and fold the records of each node into
    the aggregator in one call: ([(message, its dead letter)], per flow the last second the records
    were added to, which their acks wait for)."""
    letters = []
    by_node: dict[str, list] = {}  # node -> [(message, records)]
    for message in messages:
        header, records, letter = decode_or_dead_letter(message, decode_batch, aggregator.counters)
        if letter is not None:
            letters.append((message, letter))
        else:
            by_node.setdefault(header.node, []).append((message, records))
    touched: dict[tuple[str, int], int] = {}
    for node, parts in by_node.items():
        try:
            before = dataclasses.replace(aggregator.counters)
            invalid, flows = aggregator.ingest_parts(node, [records for _, records in parts])
        except Exception:  # noqa: BLE001 - found below, message by message
            # a bug or an input we did not foresee: fold the messages one by one to find the ones it
            # fails on (dead letters, counted); the counters restart from before the failed call
            aggregator.counters = before
            invalid, flows = [], {}
            for message, records in parts:
                try:
                    problems, mine = aggregator.ingest(node, records)
                except Exception as e:
                    aggregator.counters.processing_errors += 1
                    log.exception("ingest failed at %s[%d]@%d", message.topic, message.partition, message.offset)
                    letters.append((message, dead_letter("processing_error", repr(e), message)))
                    problems, mine = {}, {}
                invalid.append(problems)
                for key, second in mine.items():
                    flows[key] = max(second, flows.get(key, second))
        for (message, _), problems in zip(parts, invalid):
            if problems:  # the good records went on; the message is kept whole with the count per problem
                letters.append((message, dead_letter("invalid_records", json.dumps(problems, sort_keys=True), message)))
        for key, second in flows.items():
            touched[key] = max(second, touched.get(key, second))
    return letters, touched


# Every input message, held unacked until ack_finished_messages() finds every second its batch
# added records to evicted (and every earlier message of its partition acked: runtime/acks.py).
pending = InOrderAcks(lambda: app.consumer)
moves = PartitionMoves(
    app,
    {cfg.records_topic: pending},
    on_lost=lambda partitions: drop_flows(moves.take_keys(partitions)),
    on_assigned=after_assignment,
)


def message_finished(touched: dict[tuple[str, int], int]) -> bool:
    for key, last_second in touched.items():
        st = aggregator.flows.get(key)
        if st is not None and last_second >= st.horizon_s:
            return False  # this second may still be emitted again
    return True


async def ack_finished_messages() -> None:
    await pending.ack_finished(message_finished)


async def process_batch(messages: list) -> None:
    """The messages of one fetch (BatchIntake), under moves.lock: per partition one held batch;
    dead letters are delivered before the batch is held."""
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
    """Send the lines and wait until Kafka acknowledged every message; then hold each hop series'
    newest for the summary (a line is summarised only once it is on the metrics topic)."""
    step = cfg.max_lines_per_message
    sent = []
    for i in range(0, len(lines), step):
        sent.append(await metrics_topic.send(key=b"inline", value="\n".join(lines[i : i + step]).encode()))
    if sent:
        await asyncio.gather(*sent)
    newest.take(lines)


async def publish_counters() -> None:
    extra = {
        "open_seconds": aggregator.open_seconds(),
        "flows": len(aggregator.flows),
        "signatures": len(aggregator.signatures),
        "unacked_messages": len(pending),  # input held uncommitted until its seconds are final
        "path_records": paths.records,
        "path_records_malformed": paths.malformed,
        **moves.counts,
        **input_watch.counts,
        **newest.counts(),
    }
    ts = time.time_ns()
    line = counters_line(aggregator.counters, "inline", ts, extra=extra, instance=health.instance)
    await health.publish(metrics_topic, b"inline", line, ts)


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
        log.info("inline counters %s", json.dumps({**aggregator.counters.as_dict(), **moves.counts}))
