"""Faust app of the loss processor: altmark_batch messages in, altmark_loss line protocol out.

Run from the repository root:
    python -m processors.loss [--bootstrap HOST:PORT --timeout-s 10 ...]   (flags -> env)
    faust -A processors.loss.app worker --without-web -l info               (same worker)

Settings: processors/loss/config.py (SEGSCOPE_KAFKA_BOOTSTRAP, SEGSCOPE_TOPIC_ALTMARK_BLOCKS,
SEGSCOPE_TOPIC_METRICS, SEGSCOPE_TOPIC_DEADLETTER, SEGSCOPE_LOSS_APP_ID, SEGSCOPE_LOSS_TIMEOUT_S, ...).

Per Kafka message the agent decodes the batch (np.frombuffer) and hands its records to the
LossJoiner (processors/loss/join.py); a message that is not an altmark_batch goes to the
dead-letter topic with the reason, and so does a batch with unusable records (its good
records are still used). Everything that is published happens in the flush timer: it sweeps
blocks whose other side did not come within the timeout (complete=false), publishes joined
and changed blocks, and the segscope_processor,processor=loss counters.

Crash safety, as in processors/delay: a message is acknowledged (its offset committable) only
when every block it fed has left the joiner (retention_s after the block was first seen) and
the lines published before were acknowledged by Kafka. A worker killed with -9 is replaced by
one that replays those messages, rebuilds the blocks with both sides and publishes the same
lines again (InfluxDB overwrites them): never a block joined from one side only. A replayed
message can also hold a record of a block that was already final (a batch spans blocks); so
before it acks, the worker writes each flow's highest evicted block to <app_id>.progress, and a
new worker skips replayed records of those blocks (replayed_records_skipped).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import faust
from aiokafka import codec as aiokafka_codec

from processors.delay.aggregate import counters_line
from processors.delay.topics import ensure_topics
from processors.loss.config import LossConfig
from processors.loss.join import LossJoiner
from processors.paths import PathBook
from processors.worker import InOrderAcks, ProcessorHealth, dead_letter, faust_app_settings, read_progress
from segscope_schemas.altmark_block import MalformedBatch, decode_batch
from segscope_schemas.names import TOPIC_CONFIG, TOPIC_PATHS

log = logging.getLogger("segscope.loss")

cfg = LossConfig.from_env()
joiner = LossJoiner(timeout_s=cfg.timeout_s, retention_s=cfg.retention_s, tai_utc_offset_s=cfg.tai_utc_offset_s)
# every flow's SID list (segscope.paths, schemas/paths.md): the `path` tag of altmark_loss
paths = PathBook(cfg.bootstrap, cfg.paths_topic)
joiner.flow_path = paths.path_for_flow


def clock_ns() -> int:
    """The joiner's clock: only differences matter (timeouts, retention), so monotonic."""
    return time.monotonic_ns()


class LossApp(faust.App):
    async def on_first_start(self) -> None:
        self.conf.datadir.parent.mkdir(parents=True, exist_ok=True)  # Faust makes only the last level
        await super().on_first_start()
        # The collector compresses with lz4; without cramjam aiokafka fails on the first fetch.
        if not aiokafka_codec.has_lz4():
            raise RuntimeError("aiokafka has no lz4 codec: install cramjam (requirements.txt)")
        # Faust ignores a missing source topic (and then never consumes it).
        ensure_topics(cfg.bootstrap, [cfg.blocks_topic, cfg.metrics_topic, cfg.deadletter_topic])
        # the progress topic keeps the newest value per key (session or flow): compacted, it stays small
        ensure_topics(cfg.bootstrap, [PROGRESS_TOPIC], config={"cleanup.policy": "compact"})
        ensure_topics(cfg.bootstrap, [cfg.paths_topic], config=TOPIC_CONFIG[TOPIC_PATHS])
        load_progress()
        paths.start()  # the paths published so far, before the first block is published
        health.serve()
        log.info(
            "loss processor: %s -> %s (dead letters: %s), broker %s, group %s, timeout %.1f s, retention %.0f s",
            cfg.blocks_topic,
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
            await publish_lines(joiner.flush(clock_ns()))
            await write_progress()
            await ack_finished_messages()
            await publish_counters()
        except Exception as e:  # the producer may already be gone; say so, don't hide it
            log.warning("final flush on stop failed: %r", e)
        paths.stop()
        await super().on_stop()


app = LossApp(
    cfg.app_id,
    **faust_app_settings(cfg.bootstrap, cfg.datadir),
    broker_max_poll_records=2000,
    producer_max_request_size=4 * 1024 * 1024,
)

health = ProcessorHealth(app, "loss", cfg, stale_after_s=max(15.0, 5 * cfg.flush_interval_s))

blocks_topic = app.topic(
    cfg.blocks_topic, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
)
metrics_topic = app.topic(cfg.metrics_topic, key_serializer="raw", value_serializer="raw")
deadletter_topic = app.topic(cfg.deadletter_topic, key_serializer="raw", value_serializer="raw")
PROGRESS_TOPIC = f"{cfg.app_id}.progress"
progress_topic = app.topic(PROGRESS_TOPIC, key_serializer="raw", value_serializer="raw")
progress_written: dict[tuple[int, int, int], int] = {}


def load_progress() -> None:
    """Seed the joiner with the flows' final blocks a previous worker wrote (read once, at start)."""
    for v in read_progress(cfg.bootstrap, PROGRESS_TOPIC, f"{cfg.app_id}-progress-reader"):
        flow = (int(v["flow_id"]), int(v["method"]), int(v["period_ms"]))
        progress_written[flow] = max(progress_written.get(flow, -1), int(v["final_upto"]))
    joiner.final_upto.update(progress_written)
    if progress_written:
        log.info("loss processor: %d flows resume from %s", len(progress_written), PROGRESS_TOPIC)


async def write_progress() -> None:
    """Each flow's highest evicted block, delivered before any message behind it is acked."""
    sent = []
    # a snapshot: the await below lets the stream agent evict more blocks meanwhile
    for flow, upto in list(joiner.evicted_upto.items()):
        if upto > progress_written.get(flow, -1):
            value = json.dumps({"flow_id": flow[0], "method": flow[1], "period_ms": flow[2], "final_upto": upto})
            # key = the whole flow key: the topic is compacted to the newest value per key
            key = f"{flow[0]}/{flow[1]}/{flow[2]}".encode()
            sent.append(await progress_topic.send(key=key, value=value.encode()))
            progress_written[flow] = upto
    if sent:
        await asyncio.gather(*sent)


def handle_message(message, now_ns: int) -> tuple[bytes | None, set]:
    """Decode one message and feed the joiner: (a dead letter or None, the block keys it fed)."""
    value = message.value
    try:
        if value is None:
            raise MalformedBatch("null_value", "message has no value (tombstone)")
        header, records = decode_batch(value)
    except MalformedBatch as e:
        joiner.counters.malformed_batches += 1
        return dead_letter(e.reason, e.detail, message), set()
    try:
        invalid = joiner.ingest(header.node, records, now_ns)
    except Exception as e:  # a bug or an input we did not foresee: keep the message, count it
        joiner.counters.processing_errors += 1
        log.exception("ingest failed at %s[%d]@%d", message.topic, message.partition, message.offset)
        return dead_letter("processing_error", repr(e), message), set()
    touched = set(
        zip(
            records["flow_id"].tolist(),
            records["method"].tolist(),
            records["period_ms"].tolist(),
            records["block_index"].tolist(),
        )
    )
    if invalid:  # the good records of the batch were used; the bad ones are kept here
        return dead_letter("invalid_records", json.dumps(invalid, sort_keys=True), message), touched
    return None, touched


# Every input message with the block keys it fed, held unacked until ack_finished_messages() finds
# every one of them evicted (and every earlier message of its partition acked: InOrderAcks says why).
pending = InOrderAcks()


async def ack_finished_messages() -> None:
    await pending.ack_finished(lambda touched: touched.isdisjoint(joiner.blocks))


@app.agent(blocks_topic)
async def process_batches(stream) -> None:
    manual = stream.noack()
    async for event in manual.events():
        letter, touched = handle_message(event.message, clock_ns())
        if letter is not None:
            await (await deadletter_topic.send(key=event.message.key, value=letter))  # delivered first
        event.message.value = None  # the records are in the joiner: keep the offset, not the bytes
        pending.hold(manual, event, touched)


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
    }
    line = counters_line(joiner.counters, "loss", ts, extra=extra, instance=health.instance)
    await health.publish(metrics_topic, b"loss", line, ts)


_last_log = 0.0


@app.timer(interval=cfg.flush_interval_s)
async def flush_blocks() -> None:
    """Timeout sweep + publication: joined blocks, timed-out blocks, re-emissions, counters."""
    global _last_log
    await publish_lines(joiner.flush(clock_ns()))
    await write_progress()
    await ack_finished_messages()
    await publish_counters()
    now = time.monotonic()
    if now - _last_log >= 10.0:
        _last_log = now
        log.info("loss counters %s", json.dumps(joiner.counters.as_dict()))
