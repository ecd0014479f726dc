"""Faust app of the topology processor: node views + measurements in, ArangoDB documents out.

Run from the repository root:
    python -m processors.topology [--arango-url http://HOST:8529 --arango-password ...]
    faust -A processors.topology.app worker --without-web -l info     (same, settings from env)

Inputs (Kafka):
  segscope.topology  node views (JSON, schemas/topology.md), key = node. A malformed view goes to
                     segscope.deadletter (reason bad_json / bad_schema / unsupported_version /
                     bad_node / bad_field / not_an_object / null_value) and is counted.
  segscope.metrics   line protocol; the processor reads `stamp_delay` and `altmark_loss` points
                     (schemas/metrics.md) and ignores the rest (counted). Measurements come from
                     this topic rather than InfluxDB queries: no polling, the same newest-wins
                     semantics as InfluxDB's overwrite, and no dependency on Telegraf being up.
Output: ArangoDB through processors/topology/writer.py, every flush interval (1 s), only what
changed (and everything every SEGSCOPE_TOPOLOGY_REFRESH_S in jalapeno mode); counters as
`segscope_processor,processor=topology ...` lines on segscope.metrics. Optionally (jalapeno_kafka.py)
link events and the measurement lines to Jalapeno's Kafka.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import faust

from processors.delay.topics import ensure_topics
from processors.topology.config import TopologyConfig
from processors.topology.jalapeno_kafka import JalapenoKafka
from processors.topology.model import Identity, MalformedView, Names, TopologyModel
from processors.topology.sink import TopologySink
from processors.topology.writer import ArangoWriter
from processors.worker import ProcessorHealth, dead_letter, escape_instance, faust_app_settings
from segscope_schemas.line_protocol import parse_lines

log = logging.getLogger("segscope.topology")

cfg = TopologyConfig.from_env()
model = TopologyModel(
    identity=Identity(protocol_id=cfg.protocol_id, domain_id=cfg.domain_id),
    names=Names(
        jalapeno_nodes=cfg.jalapeno_nodes, jalapeno_edges=cfg.jalapeno_edges, jalapeno_ip_edges=cfg.jalapeno_ip_edges
    ),
)
extra_counters = {
    "messages_in": 0,
    "metrics_messages_in": 0,
    "dead_letters": 0,
    "processing_errors": 0,
    "connect_errors": 0,
}
sink: TopologySink | None = None
# optional outputs to Jalapeno's Kafka (both off by default)
jalapeno_kafka = (
    JalapenoKafka(
        cfg.jalapeno_kafka or cfg.bootstrap,
        link_events_topic=cfg.jalapeno_link_events_topic,
        telemetry_topic=cfg.jalapeno_telemetry_topic,
        telemetry_measurements=cfg.telemetry_measurements(),
    )
    if cfg.jalapeno_link_events_topic or cfg.jalapeno_telemetry_topic
    else None
)
link_events = jalapeno_kafka.link_events if jalapeno_kafka is not None and cfg.mode == "jalapeno" else None


class TopologyApp(faust.App):
    async def on_first_start(self) -> None:
        self.conf.datadir.parent.mkdir(parents=True, exist_ok=True)
        await super().on_first_start()
        ensure_topics(cfg.bootstrap, [cfg.topology_topic, cfg.metrics_topic, cfg.deadletter_topic])
        health.serve()
        log.info(
            "topology processor: %s + %s -> ArangoDB %s db %s (mode %s), group %s",
            cfg.topology_topic,
            cfg.metrics_topic,
            cfg.arango_url,
            cfg.arango_db,
            cfg.mode,
            cfg.app_id,
        )

    async def on_stop(self) -> None:
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
topology_topic = app.topic(cfg.topology_topic, key_serializer="raw", value_serializer="raw")
metrics_in = app.topic(cfg.metrics_topic, key_serializer="raw", value_serializer="raw")
metrics_out = app.topic(cfg.metrics_topic, key_serializer="raw", value_serializer="raw")
deadletter_topic = app.topic(cfg.deadletter_topic, key_serializer="raw", value_serializer="raw")


def handle_view(message) -> bytes | None:
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


def handle_metrics(message) -> None:
    extra_counters["metrics_messages_in"] += 1
    if not message.value:
        return
    try:
        text = message.value.decode()
    except UnicodeDecodeError:
        model.counters.malformed_lines += 1
        return
    if jalapeno_kafka is not None:
        jalapeno_kafka.forward_metrics(text, message.key)
    if "stamp_delay" not in text and "altmark_loss" not in text:  # cheap skip of other producers' lines
        return
    points, bad = parse_lines(text)
    model.counters.malformed_lines += len(bad)
    for p in points:
        model.apply_point(p)


@app.agent(topology_topic)
async def process_views(stream) -> None:
    async for event in stream.events():
        letter = handle_view(event.message)
        if letter is not None:
            extra_counters["dead_letters"] += 1
            await deadletter_topic.send(key=event.message.key, value=letter)


@app.agent(metrics_in)
async def process_metrics(stream) -> None:
    async for event in stream.events():
        handle_metrics(event.message)


def counters_line() -> str:
    fields = {**model.counters.as_dict(), **extra_counters, "nodes": len(model.views)}
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
