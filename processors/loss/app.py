"""Faust app of the loss processor: altmark_batch messages in, altmark_loss line protocol out.

Run from the repository root:
    python -m processors.loss [--bootstrap HOST:PORT --timeout-s 10 ...]   (flags -> env)
    faust -A processors.loss.app worker --without-web -l info               (same worker)

Settings: processors/loss/config.py (SEGSCOPE_KAFKA_BOOTSTRAP, SEGSCOPE_TOPIC_ALTMARK_BLOCKS,
SEGSCOPE_TOPIC_ALTMARK_BY_FLOW, SEGSCOPE_TOPIC_METRICS, SEGSCOPE_TOPIC_DEADLETTER,
SEGSCOPE_LOSS_APP_ID, SEGSCOPE_LOSS_TIMEOUT_S, ...).

Two stages in one worker, N workers in one consumer group (the app id):
- split_messages (repartition) reads the collectors' messages (keyed by node, so a flow's tx and
  rx records can be in different partitions), checks the records, and re-sends them to the
  by-flow topic, partition flow_partition(flow_id) (processors/loss/keying.py): the collector
  messages of one fetch (processors/runtime/intake.py BatchIntake: no per-event work of Faust's)
  go out as one message per node and partition (at most 8192 records). A message that is not an
  altmark_batch goes to the dead-letter topic with the reason, and so does a batch with unusable
  records (its good records go on).
  A source message is acked only when Kafka acknowledged every re-keyed message its records went
  to; a worker killed before that is replayed, and the join counts the copies once (duplicates).
- join_messages reads the by-flow topic: every record of a flow, from both nodes, comes to the
  one worker that owns the flow's partition. It decodes the batches (np.frombuffer) and hands
  the records of a fetch's messages of a node to the LossJoiner in one call
  (processors/loss/join.py, vectorised). Everything it publishes
  happens in the flush timer: blocks whose other side did not come within the timeout
  (complete=false), joined and changed blocks, and the segscope_processor,processor=loss counters.

Crash safety, as in processors/delay: a by-flow message is acknowledged (its offset committable)
only when every block it fed has left the joiner (retention_s after the block was first seen: a
message ingested at t is done once a flush at t + retention_s evicted) and the lines published
before were acknowledged by Kafka. A worker killed with -9 is replaced by one that replays those
messages, rebuilds the blocks with both sides and publishes the same lines again (InfluxDB
overwrites them): never a block joined from one side only. A replayed message can also hold a
record of a block that was already final (a batch spans blocks); so before it acks, the worker
writes each flow's highest evicted block (and the nodes of its sides, for the tags of a later
missing side) to <app_id>.progress, and a worker skips replayed records of those blocks
(replayed_records_skipped).

Rebalance (a worker joins, leaves or dies): processors/runtime/moves.py's PartitionMoves, as in the
delay processor. On revoke the flush pauses (after the flush in progress); on assignment, for the
partitions it lost, a worker forgets their held messages of both stages (not acked: the new owner
replays them from the committed offset) and the open blocks of their flows (never published by
two workers), reads the progress topic again (the previous owner wrote its flows there before
it acked) and skips what Faust had fetched of a lost partition before the rebalance.

A worker that stalls past the session timeout without dying publishes nothing when it runs again
until a heartbeat says it is still a member (runtime/lease.py HeartbeatLease), and the joiner's timeouts
leave out stalls and rebalance pauses (runtime/clock.py ActiveClock): docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import faust
import numpy as np
from aiokafka import codec as aiokafka_codec

from processors.delay.aggregate import counters_line
from processors.delay.topics import ensure_topics
from processors.loss.config import LossConfig
from processors.loss.join import LossJoiner
from processors.loss.keying import by_flow_key, flow_partition, split_by_partition
from processors.newest import attach_newest
from processors.paths import PathBook
from processors.runtime.acks import InOrderAcks
from processors.runtime.clock import ActiveClock
from processors.runtime.config import faust_app_settings
from processors.runtime.deadletters import dead_letter, decode_or_dead_letter
from processors.runtime.health import ProcessorHealth
from processors.runtime.input_watch import InputWatch
from processors.runtime.intake import BatchIntake
from processors.runtime.moves import PartitionMoves
from processors.runtime.timers import every
from processors.runtime.topics import read_progress
from segscope_schemas.altmark_block import DIR_RX, DIR_TX, check_records, decode_batch, encode_batch
from segscope_schemas.batch_envelope import join_records
from segscope_schemas.names import TOPIC_CONFIG, TOPIC_PATHS

log = logging.getLogger("segscope.loss")

cfg = LossConfig.from_env()
joiner = LossJoiner(timeout_s=cfg.timeout_s, retention_s=cfg.retention_s, tai_utc_offset_s=cfg.tai_utc_offset_s)
# every flow's SID list (segscope.paths, schemas/paths.md): the `path` tag of altmark_loss
paths = PathBook(cfg.bootstrap, cfg.paths_topic)
joiner.flow_path = paths.path_for_flow
joiner.flow_paths = paths.paths_for_flows  # the same for many flows (a flush's new ones), the lock taken once
joiner.flow_path_version = lambda: paths.version  # the joiner keeps each flow's path until it changes
# partitions of the by-flow topic, read from Kafka at start (every worker must use the same count)
by_flow_partitions = 0
PROGRESS_BUCKETS = 16  # progress messages per by-flow partition (each a snapshot of its flows)


# the joiner's clock: only differences matter (timeouts, retention), so monotonic; without the
# time this worker could not read (stalls, rebalance pauses: runtime/clock.py ActiveClock)
active_clock = ActiveClock()


def clock_ns() -> int:
    return active_clock.now_ns()


def topic_partitions(topic: str) -> int:
    from confluent_kafka.admin import AdminClient

    from segscope_kafka import kafka_config

    meta = AdminClient(kafka_config({"bootstrap.servers": cfg.bootstrap})).list_topics(topic, timeout=30)
    return len(meta.topics[topic].partitions)


class LossApp(faust.App):
    async def on_first_start(self) -> None:
        global by_flow_partitions
        self.conf.datadir.parent.mkdir(parents=True, exist_ok=True)  # Faust makes only the last level
        await super().on_first_start()
        # The collector compresses with lz4; without cramjam aiokafka fails on the first fetch.
        if not aiokafka_codec.has_lz4():
            raise RuntimeError("aiokafka has no lz4 codec: install cramjam (requirements.txt)")
        # Faust ignores a missing source topic (and then never consumes it).
        ensure_topics(cfg.bootstrap, [cfg.blocks_topic, cfg.metrics_topic, cfg.deadletter_topic])
        ensure_topics(
            cfg.bootstrap, [cfg.by_flow_topic], partitions=cfg.by_flow_partitions or topic_partitions(cfg.blocks_topic)
        )
        by_flow_partitions = topic_partitions(cfg.by_flow_topic)
        if cfg.by_flow_partitions and by_flow_partitions != cfg.by_flow_partitions:
            # growing it would move flows to other partitions while blocks are open: an operator's step
            log.warning(
                "%s has %d partitions, not %d (SEGSCOPE_LOSS_BY_FLOW_PARTITIONS): using %d; to change it, "
                "stop every loss worker, let the input drain, then recreate or grow the topic",
                cfg.by_flow_topic,
                by_flow_partitions,
                cfg.by_flow_partitions,
                by_flow_partitions,
            )
        # the progress topic keeps the newest value per key (partition and bucket): compacted, it stays small
        ensure_topics(cfg.bootstrap, [PROGRESS_TOPIC], config={"cleanup.policy": "compact"})
        ensure_topics(cfg.bootstrap, [cfg.paths_topic], config=TOPIC_CONFIG[TOPIC_PATHS])
        load_progress(read_progress(cfg.bootstrap, PROGRESS_TOPIC, f"{cfg.app_id}-progress-reader"))
        paths.start()  # the paths published so far, before the first block is published
        intake.install()  # before the consumer's fetcher starts
        health.serve()
        log.info(
            "loss processor: %s -> %s (%d partitions) -> %s (dead letters: %s), broker %s, group %s, "
            "timeout %.1f s, retention %.0f s",
            cfg.blocks_topic,
            cfg.by_flow_topic,
            by_flow_partitions,
            cfg.metrics_topic,
            cfg.deadletter_topic,
            cfg.bootstrap,
            cfg.app_id,
            cfg.timeout_s,
            cfg.retention_s,
        )

    async def on_stop(self) -> None:
        # A clean stop publishes what is ready; blocks still waiting for a side are not published
        # as incomplete: their messages stay uncommitted and the next worker joins them.
        try:
            await flush_blocks_locked()
            await ack_split_messages()
        except Exception as e:  # the producer may already be gone; say so, don't hide it
            log.warning("final flush on stop failed: %r", e)
        paths.stop()
        await super().on_stop()


app = LossApp(
    cfg.app_id,
    **faust_app_settings(cfg.bootstrap, cfg.datadir),
    consumer_max_fetch_size=16 * 1024 * 1024,  # default 1 MiB = only a few 4000-record batches
    broker_max_poll_records=2000,
    producer_max_request_size=4 * 1024 * 1024,
)

health = ProcessorHealth(app, "loss", cfg, stale_after_s=max(15.0, 5 * cfg.flush_interval_s))

blocks_topic = app.topic(
    cfg.blocks_topic, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
)
by_flow_topic = app.topic(
    cfg.by_flow_topic, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
)
metrics_topic = app.topic(cfg.metrics_topic, key_serializer="raw", value_serializer="raw")
# the newest complete altmark_loss line of each series, to SEGSCOPE_TOPIC_METRICS_NEWEST every interval ("": off)
newest = attach_newest(app, cfg, key=b"loss")
joiner.keep_complete = newest.enabled  # the joiner lists its complete lines' series and timestamps for it
deadletter_topic = app.topic(cfg.deadletter_topic, key_serializer="raw", value_serializer="raw")
PROGRESS_TOPIC = f"{cfg.app_id}.progress"
progress_topic = app.topic(PROGRESS_TOPIC, key_serializer="raw", value_serializer="raw")
progress_written: dict[tuple[int, int, int], int] = {}  # flow -> the final_upto Kafka has for it
# the joiner clock of the flush whose evictions the last progress write covered
progress_covered_ns: int | None = None


# -- progress ------------------------------------------------------------------


def load_progress(values: list[dict]) -> None:
    """Seed the joiner with the flows' final blocks (and side nodes) previous owners wrote.
    Two formats: one flow per message (before the by-flow topic) and a snapshot of the flows of
    one by-flow partition and bucket ({"flows": [[flow_id, method, period_ms, final_upto,
    tx_node, rx_node], ...]})."""
    for v in values:
        entries = v.get("flows") or [[v["flow_id"], v["method"], v["period_ms"], v["final_upto"], None, None]]
        for flow_id, method, period_ms, upto, tx_node, rx_node in entries:
            flow = (int(flow_id), int(method), int(period_ms))
            if int(upto) > progress_written.get(flow, -1):
                progress_written[flow] = int(upto)
            for direction, node in ((DIR_TX, tx_node), (DIR_RX, rx_node)):
                if node is not None:
                    joiner.flow_nodes.setdefault((flow[0], flow[1], direction), node)
    for flow, upto in progress_written.items():
        if upto > joiner.final_upto.get(flow, -1):
            joiner.final_upto[flow] = upto
    if progress_written:
        log.info("loss processor: %d flows resume from %s", len(progress_written), PROGRESS_TOPIC)


async def write_progress() -> None:
    """Each flow's highest evicted block, delivered before any message behind it is acked: one
    snapshot message per by-flow partition and bucket that changed (key p<partition>/b<bucket>,
    compacted), not one message per flow (10 000 flows at T = 1 s would be 10 000 messages/s)."""
    changed = [flow for flow, upto in joiner.evicted_upto.items() if upto > progress_written.get(flow, -1)]
    if not changed:
        return
    for flow in changed:
        progress_written[flow] = joiner.evicted_upto[flow]
    ids = np.fromiter((f[0] for f in changed), dtype=np.uint64, count=len(changed))
    dirty = set(zip(flow_partition(ids, by_flow_partitions).tolist(), (ids % PROGRESS_BUCKETS).tolist()))
    flows = list(progress_written)
    ids = np.fromiter((f[0] for f in flows), dtype=np.uint64, count=len(flows))
    snapshot: dict[tuple[int, int], list] = {}
    nodes = joiner.flow_nodes
    places = zip(flow_partition(ids, by_flow_partitions).tolist(), (ids % PROGRESS_BUCKETS).tolist())
    for flow, where in zip(flows, places):
        if where in dirty:
            tx_node = nodes.get((flow[0], flow[1], DIR_TX))
            rx_node = nodes.get((flow[0], flow[1], DIR_RX))
            snapshot.setdefault(where, []).append([*flow, progress_written[flow], tx_node, rx_node])
    sent = []
    for (partition, bucket), entries in sorted(snapshot.items()):
        value = json.dumps({"partition": partition, "bucket": bucket, "flows": entries}).encode()
        sent.append(await progress_topic.send(key=f"p{partition}/b{bucket}".encode(), value=value))
    await asyncio.gather(*sent)


# -- stage 1: repartition by flow ----------------------------------------------

# source messages with the delivery futures of their re-keyed messages, acked once all delivered
split_pending = InOrderAcks(lambda: app.consumer)


# A by-flow message holds at most this many records (64 bytes each: 512 KiB, below the broker's
# default message.max.bytes of 1 MiB).
BY_FLOW_MAX_RECORDS = 8192


async def split_messages(messages: list) -> None:
    """Check the collector messages of one fetch and re-send their good records by flow, the
    messages of a node in one by-flow message per partition; the messages of each partition are
    held with the delivery futures of the messages their records went to. A message that is not
    an altmark_batch goes to the dead-letter topic, and so does one with unusable records (its
    good records go on)."""
    c = joiner.counters
    letters: dict[int, bytes] = {}  # message number -> its dead letter
    sent_for: dict[int, list] = {}  # message number -> the delivery futures of its records
    by_node: dict[str, list] = {}  # node -> [(message number, header, records)]
    for i, message in enumerate(messages):
        header, records, letter = decode_or_dead_letter(message, decode_batch, c)
        if letter is not None:
            letters[i] = letter
            sent_for[i] = []
            continue
        c.batches_in += 1
        c.records_in += len(records)
        by_node.setdefault(header.node, []).append((i, header, records))
    for node, parts in by_node.items():
        sent: list = []
        try:
            records = join_records([r for _, _, r in parts])
            problems = check_records(records)
            bad = problems != ""
            if bad.any():
                start = 0
                for i, _, part in parts:
                    mine = problems[start : start + len(part)]
                    start += len(part)
                    if (mine != "").any():
                        invalid: dict[str, int] = {}
                        for p in mine[mine != ""].tolist():
                            invalid[p] = invalid.get(p, 0) + 1
                        letter = json.dumps(invalid, sort_keys=True)
                        letters[i] = dead_letter("invalid_records", letter, messages[i])
                c.invalid_records += int(np.count_nonzero(bad))
                records = records[~bad]
            batch_seq = parts[0][1].batch_seq
            for partition, part in split_by_partition(records, by_flow_partitions):
                for a in range(0, len(part), BY_FLOW_MAX_RECORDS):
                    body = encode_batch(part[a : a + BY_FLOW_MAX_RECORDS], node, batch_seq)
                    key = by_flow_key(node, partition)
                    sent.append(await by_flow_topic.send(key=key, value=body, partition=partition))
                    c.rekeyed_batches_out += 1
        except Exception as e:  # a bug or an input we did not foresee: keep the messages, count them
            c.processing_errors += len(parts)
            log.exception("split failed at %s", ", ".join(where(messages[i]) for i, _, _ in parts))
            for i, _, _ in parts:
                letters[i] = dead_letter("processing_error", repr(e), messages[i])
            sent = []
        for i, _, _ in parts:
            sent_for[i] = sent
    await send_dead_letters(messages, letters)
    held: dict = {}  # tp -> (offsets, the delivery futures of their records)
    for i, message in enumerate(messages):
        offsets, futures = held.setdefault(message.tp, ([], {}))
        offsets.append(message.offset)
        for fut in sent_for[i]:
            futures[id(fut)] = fut
    for tp, (offsets, futures) in held.items():
        split_pending.hold(tp, offsets, list(futures.values()))


async def send_dead_letters(messages: list, letters: dict[int, bytes]) -> None:
    """Send the dead letters of messages (message number -> letter) and wait until Kafka has them:
    a message is held (acked later) only after its dead letter is delivered."""
    sent = [await deadletter_topic.send(key=messages[i].key, value=letter) for i, letter in sorted(letters.items())]
    if sent:
        await asyncio.gather(*sent)


def where(message) -> str:
    return f"{message.topic}[{message.partition}]@{message.offset}"


def all_delivered(sent: list) -> bool:
    for fut in sent:
        if not fut.done():
            return False
        if fut.exception() is not None:  # Kafka refused it after the producer's retries: stop, replay
            raise RuntimeError(f"re-keyed batch not delivered to {cfg.by_flow_topic}: {fut.exception()!r}")
    return True


async def ack_split_messages() -> None:
    async with moves.lock:
        if moves.paused:  # a rebalance is under way: which partitions stay here is not known yet
            return
        await split_pending.ack_finished(all_delivered)


# every(): one asyncio.sleep per tick, not Faust's app.timer (runtime/timers.py: the CPU an idle worker burns)
@every(app, 0.25)
async def ack_split_timer() -> None:
    try:
        await ack_split_messages()
    except RuntimeError as e:
        log.error("%s", e)
        await app.crash(e)  # not acked: the replacement worker replays these messages


# -- stage 2: join ---------------------------------------------------------------

# every by-flow message with the joiner clock when it was ingested, held unacked until a flush at
# least retention_s later evicted its blocks and the progress covering them was written (and every
# earlier message of its partition acked: InOrderAcks says why)
pending = InOrderAcks(lambda: app.consumer)


async def join_messages(messages: list) -> None:
    """Decode the by-flow messages of one fetch and feed the joiner, the records of a node in one
    call; hold the messages of each partition with the joiner clock of that call. A message that
    is not an altmark_batch goes to the dead-letter topic, and so do the messages of a call that
    failed."""
    c = joiner.counters
    now = clock_ns()
    letters: dict[int, bytes] = {}
    by_node: dict[str, list] = {}  # node -> [(message number, records)]
    for i, message in enumerate(messages):
        header, records, letter = decode_or_dead_letter(message, decode_batch, c)
        if letter is not None:
            letters[i] = letter
            continue
        c.rekeyed_batches_in += 1
        by_node.setdefault(header.node, []).append((i, records))
    for node, parts in by_node.items():
        try:
            joiner.ingest_checked(node, join_records([r for _, r in parts]), now)
        except Exception as e:  # a bug or an input we did not foresee: keep the messages, count them
            c.processing_errors += len(parts)
            log.exception("ingest failed at %s", ", ".join(where(messages[i]) for i, _ in parts))
            for i, _ in parts:
                letters[i] = dead_letter("processing_error", repr(e), messages[i])
    await send_dead_letters(messages, letters)
    offsets: dict = {}
    for message in messages:
        offsets.setdefault(message.tp, []).append(message.offset)
    for tp, taken in offsets.items():
        pending.hold(tp, taken, now)


@every(app, 0.1)
async def clock_reading() -> None:
    """Read the joiner's clock every 0.1 s: a longer gap is a stall its timeouts leave out."""
    clock_ns()


async def ack_finished_messages() -> None:
    if progress_covered_ns is not None:
        horizon = progress_covered_ns - joiner.retention_ns
        await pending.ack_finished(lambda ingested_ns: ingested_ns <= horizon)


async def publish_lines(lines: list[str]) -> None:
    """Send the lines and wait until Kafka acknowledged every message."""
    step = cfg.max_lines_per_message
    sent = []
    for i in range(0, len(lines), step):
        sent.append(await metrics_topic.send(key=b"loss", value="\n".join(lines[i : i + step]).encode()))
    if sent:
        await asyncio.gather(*sent)


async def publish_counters() -> None:
    ts = time.time_ns()
    extra = {
        "open_blocks": joiner.open_blocks(),
        "path_records": paths.records,
        "path_records_malformed": paths.malformed,
        **moves.counts,
        **input_watch.counts,
        **newest.counts(),
    }
    line = counters_line(joiner.counters, "loss", ts, extra=extra, instance=health.instance)
    await health.publish(metrics_topic, b"loss", line, ts)


async def flush_blocks_locked() -> None:
    """Timeout sweep + publication (joined, timed-out and changed blocks), progress, acks, counters."""
    global progress_covered_ns
    async with moves.lock:
        if not moves.may_publish():  # a rebalance is under way, or a stall may have cost the membership
            return
        lines = joiner.flush(clock_ns())
        flushed_at = joiner.last_flush_ns
        await publish_lines(lines)
        # each series' newest complete line for the summary, once it is on the metrics topic
        newest.take_known(joiner.complete_out, incomplete=len(lines) - len(joiner.complete_out))
        await write_progress()
        progress_covered_ns = flushed_at
        await ack_finished_messages()
        await publish_counters()


# -- rebalance ---------------------------------------------------------------------


def drop_flows(partitions: set) -> int:
    """A rebalance moved these partitions away: forget the open blocks of the flows of its by-flow
    partitions without publishing (their new owner replays their unacked input)."""
    lost = {tp.partition for tp in partitions if tp.topic == cfg.by_flow_topic}
    if not lost or not by_flow_partitions:
        return 0
    forgotten = joiner.forget_flows(lambda flow_ids: np.isin(flow_partition(flow_ids, by_flow_partitions), list(lost)))
    log.info("%s partitions %s moved away: %d open blocks forgotten", cfg.by_flow_topic, sorted(lost), forgotten)
    return forgotten


async def after_assignment() -> None:
    if by_flow_partitions and any(tp.topic == cfg.by_flow_topic for tp in moves.owned):
        # the previous owners of these flows wrote how far they are final before they acked;
        # read in the event loop on purpose, as the delay processor does: no by-flow message may be
        # joined before the seeds are in place (a replayed record of a final block would be joined)
        load_progress(read_progress(cfg.bootstrap, PROGRESS_TOPIC, f"{cfg.app_id}-progress-reader"))


# held messages of both stages; a flush (publish, progress, acks) and a rebalance never interleave
moves = PartitionMoves(
    app,
    {cfg.blocks_topic: split_pending, cfg.by_flow_topic: pending},
    on_lost=drop_flows,
    on_assigned=after_assignment,
    clock=active_clock,
)
intake = BatchIntake(app, moves.counts)
intake.take(blocks_topic, moves.batches(split_messages))
intake.take(by_flow_topic, moves.batches(join_messages))
input_watch = InputWatch(app, {cfg.blocks_topic, cfg.by_flow_topic})


CATCHUP_S = 10


@every(app, 1.0)
async def stop_the_clock_while_input_stale() -> None:
    """No fetch answered (a Kafka outage): the blocks' other sides cannot come in, so their
    timeouts and retention stand still (runtime/input_watch.py), and CATCHUP_S longer once the
    input answers again: the collectors' clients that held the other sides reconnect with a backoff
    of their own, as the delay processor's idle clocks allow for."""
    if input_watch.stale():
        active_clock.pause("input")
    elif time.time() - input_watch.answered_again_at >= CATCHUP_S:
        active_clock.resume("input")


_last_log = 0.0


@every(app, cfg.flush_interval_s)
async def flush_blocks() -> None:
    global _last_log
    await flush_blocks_locked()
    now = time.monotonic()
    if now - _last_log >= 10.0:
        _last_log = now
        log.info("loss counters %s", json.dumps({**joiner.counters.as_dict(), **moves.counts}))
