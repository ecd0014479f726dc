"""Faust app of the topology processor: node views + measurements in, ArangoDB documents out.

Run from the repository root:
    python -m processors.topology [--arango-url http://HOST:8529 --arango-password ...]
    faust -A processors.topology.app worker --without-web -l info     (same, settings from env)

N workers of one consumer group (README.md, "N workers"): every worker reads both input topics
whole (inputs.py, no group) and keeps the model current; only the leader (leadership.py: owner of
Faust's one-partition leader topic) writes ArangoDB, sends dead letters and forwards to Jalapeno.
Killing the leader moves the lease to a warm standby, which reads the database back and writes
what differs: nothing lost, nothing duplicated.

Inputs (Kafka):
  segscope.topology  node views (JSON, schemas/topology.md), key = node. A malformed view goes to
                     segscope.deadletter (reason bad_json / bad_schema / unsupported_version /
                     bad_node / bad_field / not_an_object / null_value) and is counted.
  segscope.metrics   line protocol; the processor reads `stamp_delay`, `altmark_loss` and
                     `inline_hop_delay` points (schemas/metrics.md) and ignores the rest
                     (counted). Measurements come from this topic rather than InfluxDB queries:
                     no polling, the same newest-wins semantics as InfluxDB's overwrite, and no
                     dependency on Telegraf being up.
                     With SEGSCOPE_TOPIC_METRICS_NEWEST set, the delay, loss and in-line processors' summary
                     of it instead (the newest line of each series every SEGSCOPE_SUMMARY_INTERVAL_S,
                     processors/newest.py): the same lines, series / interval of them per second.
Output: ArangoDB through processors/topology/writer.py, every flush interval (1 s), only what
changed (and everything every SEGSCOPE_TOPOLOGY_REFRESH_S in jalapeno mode); counters as
`segscope_processor,processor=topology ...` lines on segscope.metrics. Optionally (jalapeno_kafka.py)
link events and the measurement lines to Jalapeno's Kafka.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import deque

import faust

from processors.delay.topics import ensure_topics
from processors.runtime.config import faust_app_settings
from processors.runtime.deadletters import dead_letter
from processors.runtime.health import ProcessorHealth, escape_instance
from processors.runtime.topics import once_led, watermarks
from processors.topology.config import TopologyConfig
from processors.topology.inputs import InputMessage, InputReader
from processors.topology.jalapeno_kafka import JALAPENO_SECURITY_PREFIX, JalapenoKafka
from processors.topology.leadership import Leadership
from processors.topology.model import MEASURED_PREFIXES, Identity, MalformedView, Names, TopologyModel
from processors.topology.sink import TopologySink
from processors.topology.writer import ArangoWriter

log = logging.getLogger("segscope.topology")

cfg = TopologyConfig.from_env()
model = TopologyModel(
    identity=Identity(protocol_id=cfg.protocol_id, domain_id=cfg.domain_id),
    names=Names(
        jalapeno_nodes=cfg.jalapeno_nodes,
        jalapeno_edges=cfg.jalapeno_edges,
        jalapeno_ip_edges=cfg.jalapeno_ip_edges,
        jalapeno_sids=cfg.jalapeno_sids,
    ),
    stamp_precedence_ns=int(cfg.stamp_precedence_s * 1e9),
)
extra_counters = {
    "messages_in": 0,
    "metrics_messages_in": 0,
    "dead_letters": 0,
    "processing_errors": 0,
    "connect_errors": 0,
    "dead_letters_sent": 0,
    "flushes_skipped_standby": 0,
    "flushes_skipped_catching_up": 0,
    "flushes_held_no_lease": 0,  # leading, but stalled past the session timeout: maybe not any more
}
# the dead letters of the last LETTERS_KEEP_S, sent or not: a standby that takes over sends those
# the old leader did not (it may have died before it read them)
LETTERS_KEEP_S = 600.0
TAKE_OVER_PAUSE_S = float(os.environ.get("SEGSCOPE_TOPOLOGY_TEST_TAKE_OVER_PAUSE_S", "0") or 0)
recent_letters: deque[tuple[float, InputMessage, bytes]] = deque()
sink: TopologySink | None = None
# optional outputs to Jalapeno's Kafka (both off by default)
jalapeno_kafka = (
    JalapenoKafka(
        cfg.jalapeno_kafka or cfg.bootstrap,
        link_events_topic=cfg.jalapeno_link_events_topic,
        telemetry_topic=cfg.jalapeno_telemetry_topic,
        telemetry_measurements=cfg.telemetry_measurements(),
        # Jalapeno's own cluster has its own security settings (jalapeno_kafka.py)
        **({"security_prefix": JALAPENO_SECURITY_PREFIX} if cfg.jalapeno_kafka else {}),
    )
    if cfg.jalapeno_link_events_topic or cfg.jalapeno_telemetry_topic
    else None
)
link_events = jalapeno_kafka.link_events if jalapeno_kafka is not None and cfg.mode == "jalapeno" else None


class TopologyApp(faust.App):
    async def on_first_start(self) -> None:
        self.conf.datadir.parent.mkdir(parents=True, exist_ok=True)
        await super().on_first_start()
        ensure_topics(cfg.bootstrap, [cfg.topology_topic, cfg.metrics_topic, MEASURES_TOPIC, cfg.deadletter_topic])
        # measurements older than stale_after_s are left out of the documents: no need to read them
        reader.start()
        health.serve()
        log.info(
            "topology processor: %s + %s -> ArangoDB %s db %s (mode %s), group %s",
            cfg.topology_topic,
            MEASURES_TOPIC,
            cfg.arango_url,
            cfg.arango_db,
            cfg.mode,
            cfg.app_id,
        )

    async def on_stop(self) -> None:
        reader.stop()
        try:
            await flush()
        except Exception as e:
            log.warning("final flush on stop failed: %r", e)
        if jalapeno_kafka is not None:
            await asyncio.get_running_loop().run_in_executor(None, jalapeno_kafka.flush, 5.0)
        await super().on_stop()


app = TopologyApp(
    cfg.app_id,
    **faust_app_settings(cfg.bootstrap, cfg.datadir),
)
health = ProcessorHealth(app, "topology", cfg, stale_after_s=max(15.0, 5 * cfg.flush_interval_s))
# where the measurements are read: segscope.metrics, or the delay and loss processors' summary of it
# (SEGSCOPE_TOPIC_METRICS_NEWEST: the newest line of each series every summary interval, processors/newest.py)
MEASURES_TOPIC = cfg.measures_topic()
# where reading it starts (0: its beginning); forwarded telemetry is read back as far
METRICS_LOOKBACK_S = cfg.stale_after_s + cfg.refresh_s if cfg.stale_after_s else 0.0
reader = InputReader(
    cfg.bootstrap, [cfg.topology_topic, MEASURES_TOPIC], lookback_s={MEASURES_TOPIC: METRICS_LOOKBACK_S}
)
metrics_out = app.topic(cfg.metrics_topic, key_serializer="raw", value_serializer="raw")
deadletter_topic = app.topic(cfg.deadletter_topic, key_serializer="raw", value_serializer="raw")


def handle_view(message: InputMessage) -> bytes | None:
    """Fold one node view into the model; return a dead letter or None."""
    extra_counters["messages_in"] += 1
    if message.value is None:
        model.counters.malformed_views += 1
        return dead_letter("null_value", "message has no value (tombstone)", message)
    try:
        view = json.loads(message.value)
    except ValueError as e:
        model.counters.malformed_views += 1
        return dead_letter("bad_json", str(e), message)
    try:
        model.apply_view(view)
    except MalformedView as e:
        return dead_letter(e.reason, e.detail, message)
    except Exception as e:
        extra_counters["processing_errors"] += 1
        log.exception("view at %s[%d]@%d failed", message.topic, message.partition, message.offset)
        return dead_letter("processing_error", repr(e), message)
    return None


def handle_metrics(message: InputMessage) -> None:
    extra_counters["metrics_messages_in"] += 1
    if not message.value:
        return
    try:
        text = message.value.decode()
    except UnicodeDecodeError:
        model.counters.malformed_lines += 1
        return
    if jalapeno_kafka is not None and jalapeno_kafka.hold(
        text, message.key, (message.topic, message.partition, message.offset)
    ):
        if leadership.leading:  # one copy: the leader's (standbys hold theirs for a take-over)
            jalapeno_kafka.send_held()
    if not any(prefix in text for prefix in MEASURED_PREFIXES):  # cheap skip of other producers' messages
        return
    model.apply_metrics_text(text)


async def apply_batch(batch: list[InputMessage]) -> None:
    for message in batch:
        if message.topic == cfg.topology_topic:
            letter = handle_view(message)
            if letter is not None:
                extra_counters["dead_letters"] += 1
                recent_letters.append((time.time(), message, letter))
                if leadership.leading and (message.topic, message.partition, message.offset) not in letters_sent_before:
                    await send_dead_letter(message, letter)
        else:
            handle_metrics(message)
    while recent_letters and recent_letters[0][0] < time.time() - LETTERS_KEEP_S:
        recent_letters.popleft()


# (topic, partition, offset) of the letters already on the dead-letter topic when this worker took
# over (the last LETTERS_KEEP_S): not sent again when the replayed view comes by
letters_sent_before: set[tuple[str, int, int]] = set()


async def send_dead_letter(message: InputMessage, letter: bytes) -> None:
    extra_counters["dead_letters_sent"] += 1
    await deadletter_topic.send(key=message.key, value=letter)


@app.task
async def read_inputs() -> None:
    """Apply the reader's batches to the model, in the event loop (where flush() snapshots it)."""
    loop = asyncio.get_running_loop()
    while True:
        batch = await loop.run_in_executor(None, reader.take, 0.2)
        if batch:
            await apply_batch(batch)


def letters_already_sent(since_s: float) -> set[tuple[str, int, int]]:
    """(source topic, partition, offset) of the dead letters on the dead-letter topic written in
    the last since_s seconds (blocking; run in an executor)."""
    from confluent_kafka import Consumer, TopicPartition

    from segscope_kafka import kafka_config

    c = Consumer(
        kafka_config(
            {"bootstrap.servers": cfg.bootstrap, "group.id": f"{cfg.app_id}-letters", "enable.auto.commit": False}
        )
    )
    out = set()
    try:
        topic = cfg.deadletter_topic
        parts = sorted(c.list_topics(topic, timeout=10).topics[topic].partitions)
        since_ms = int((time.time() - since_s) * 1000)
        wanted = [TopicPartition(topic, p, since_ms) for p in parts]
        starts = once_led(lambda t: c.offsets_for_times(wanted, timeout=t), topic, 10)
        for tp in starts:
            _, high = watermarks(c, topic, tp.partition, 10)
            if tp.offset < 0 or tp.offset >= high:
                continue
            c.assign([TopicPartition(topic, tp.partition, tp.offset)])
            pos = tp.offset
            while pos < high:
                for m in c.consume(num_messages=10000, timeout=1.0):
                    pos = m.offset() + 1
                    if m.error() is not None:
                        continue
                    try:
                        d = json.loads(m.value())
                        out.add((d["source_topic"], d["partition"], d["offset"]))
                    except (ValueError, KeyError, TypeError):
                        continue  # another processor's letter we cannot read: not ours
    finally:
        c.close()
    return out


async def take_over() -> None:
    """This worker just became the leader: diff against the database, not against what it wrote
    before (leadership.py calls this under its lock, before the first write as leader).

    The reader task keeps applying views while this runs (every await below yields to it), and
    `leading` is set only when this returns: a malformed view read meanwhile is kept in
    recent_letters but not sent by apply_batch. So the kept letters are sent last, until none is
    left unsent, with no await between the final check and the return."""
    if sink is not None:
        sink.take_over()
    loop = asyncio.get_running_loop()
    try:
        sent = await loop.run_in_executor(None, letters_already_sent, LETTERS_KEEP_S)
    except Exception as e:  # noqa: BLE001 - Kafka unreachable: send them (a duplicate beats a loss)
        log.warning("cannot read %s back (%r): sending the recent dead letters again", cfg.deadletter_topic, e)
        sent = set()
    if jalapeno_kafka is not None and jalapeno_kafka.telemetry_topic:
        # forward what no leader forwarded while this worker was a standby (jalapeno_kafka.py)
        await loop.run_in_executor(None, jalapeno_kafka.read_marks, METRICS_LOOKBACK_S or None)
        jalapeno_kafka.send_held()
    if TAKE_OVER_PAUSE_S:  # test hook: a take-over whose reads are slow (a loaded runner, a slow Kafka)
        log.warning("test hook: taking over, pausing %.1f s before the dead letters", TAKE_OVER_PAUSE_S)
        await asyncio.sleep(TAKE_OVER_PAUSE_S)
    # the views still to be read (a restarted worker replays them) may hold letters sent before too
    letters_sent_before.clear()
    letters_sent_before.update(sent)
    await send_kept_letters(letters_sent_before)


async def send_kept_letters(on_topic: set[tuple[str, int, int]]) -> None:
    """Send each kept letter whose view is not in on_topic, adding it there; again while sending
    let the reader keep more (a snapshot per round: the deque may grow under an await)."""
    while True:
        todo = [(m, letter) for _, m, letter in recent_letters if (m.topic, m.partition, m.offset) not in on_topic]
        if not todo:
            return
        for message, letter in todo:
            on_topic.add((message.topic, message.partition, message.offset))
            await send_dead_letter(message, letter)


leadership = Leadership(app, take_over)


def counters_line() -> str:
    fields = {
        **model.counters.as_dict(),
        **extra_counters,
        "nodes": len(model.views),
        "leader": int(leadership.leading),
        "input_messages_read": reader.messages_read,
        "input_read_errors": reader.read_errors,
        "caught_up": int(reader.caught_up),
        **leadership.counts,
    }
    if sink is not None:
        fields.update({k: v for k, v in sink.writer.counters.__dict__.items()})
        fields.update({k: v for k, v in sink.counters.__dict__.items()})
    if jalapeno_kafka is not None:
        fields.update(jalapeno_kafka.counters.__dict__)
    return (
        f"segscope_processor,processor=topology,instance={escape_instance(health.instance)} "
        + ",".join(f"{k}={int(v)}i" for k, v in fields.items())
        + f" {time.time_ns()}"
    )


_last_log = 0.0


async def flush() -> None:
    model.settle()  # every worker, standbys too: parse the stamp_delay fields taken since the last flush
    async with leadership.lock:  # a rebalance waits for the write in progress, and vice versa
        if not leadership.leading:
            extra_counters["flushes_skipped_standby"] += 1
        elif not leadership.membership.allows_publishing():  # runtime/lease.py HeartbeatLease
            extra_counters["flushes_held_no_lease"] += 1
        else:
            if jalapeno_kafka is not None:
                jalapeno_kafka.send_held()  # lines held while take_over read the telemetry topic back
            if not reader.caught_up:
                extra_counters["flushes_skipped_catching_up"] += 1
            else:
                await write()
                return
    await health.publish(metrics_out, b"topology", counters_line(), time.time_ns())


async def write() -> None:
    global sink, _last_log
    loop = asyncio.get_running_loop()
    if sink is None:
        try:  # jwt fetches a token here: ArangoDB may not be up yet; try again next flush
            writer = await loop.run_in_executor(
                None,
                lambda: ArangoWriter(
                    cfg.arango_url,
                    cfg.arango_db,
                    cfg.arango_user,
                    cfg.arango_password,
                    mode=cfg.mode,
                    auth_method=cfg.arango_auth,
                    names=model.names,
                    batch_size=cfg.batch_size,
                ),
            )
        except Exception as e:
            extra_counters["connect_errors"] += 1
            log.warning("cannot connect to ArangoDB %s: %r (retrying every flush)", cfg.arango_url, e)
            health.health.not_ready(f"cannot connect to ArangoDB {cfg.arango_url}: {e!r}")
            await metrics_out.send(key=b"topology", value=counters_line().encode())
            return
        sink = TopologySink(
            model, writer, refresh_s=cfg.refresh_s, stale_after_s=cfg.stale_after_s or None, link_events=link_events
        )
    await loop.run_in_executor(None, sink.load_jalapeno_sids)  # when due; blocking HTTP off the event loop
    snap = sink.snapshot()  # in the event loop: the model is ours here
    await loop.run_in_executor(None, sink.write, snap)  # blocking HTTP off the event loop
    # alive (it retries every flush) but not ready while its documents are not being written
    problem = f"ArangoDB write failed: {sink.last_error}" if sink.last_error else ""
    await health.publish(metrics_out, b"topology", counters_line(), time.time_ns(), problem=problem)
    now = time.monotonic()
    if now - _last_log >= 10.0:
        _last_log = now
        log.info(
            "topology counters %s%s",
            counters_line().split(" ")[1],
            f" last error: {sink.last_error}" if sink.last_error else "",
        )


@app.timer(interval=cfg.flush_interval_s)
async def flush_timer() -> None:
    await flush()
