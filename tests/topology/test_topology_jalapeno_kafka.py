"""The optional outputs to Jalapeno's Kafka: link events (gobmp-arango's EventMessage shape) and
line protocol on jalapeno.telemetry (telegraf-egress: data_format "influx"). Real Kafka (the
shared stack); per-run topic names, so nothing else reads or writes them."""

from __future__ import annotations

import json
import time
import uuid

import jalapeno_fixture as jf
from confluent_kafka import Consumer, TopicPartition
from test_topology_jalapeno import AR, Clocks, jalapeno_sink, model
from test_topology_model import stamp

from processors.delay.topics import ensure_topics
from processors.topology import jalapeno_kafka, telemetry
from processors.topology.config import ConfigError, TopologyConfig
from processors.topology.jalapeno_kafka import JalapenoKafka
from segscope_schemas.line_protocol import parse_lines

METRICS = (
    "stamp_delay,node=A,ssid=7,direction=forward count=100i,mean_us=2044.9 1795306905000000000\n"
    "segscope_processor,processor=delay messages_in=5i 1795306905000000000\n"
    "altmark_loss,flow=3,tx_node=A complete=true,loss_ratio=0.01 1795306905000000000\n"
    "stamp\\,delay,node=B x=1i 1795306905000000000\n"
)


def consume(bootstrap: str, topic: str, n: int, timeout_s: float = 15.0) -> list:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex}", "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    out, deadline = [], time.monotonic() + timeout_s
    try:
        while len(out) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                out.append(m)
    finally:
        c.close()
    return out


def test_selected_lines_are_forwarded_unchanged_as_line_protocol():
    assert telemetry.select_lines(METRICS, frozenset(telemetry.DEFAULT_MEASUREMENTS)) == [
        METRICS.splitlines()[0],
        METRICS.splitlines()[2],
    ]
    assert len(telemetry.select_lines(METRICS, None)) == 4
    assert telemetry.select_lines(METRICS, frozenset({"stamp,delay"})) == [METRICS.splitlines()[3]]
    big = ["m x=1i " + str(i) for i in range(200_000)]
    msgs = telemetry.messages(big)
    assert len(msgs) > 1 and all(len(m) <= telemetry.MAX_MESSAGE_BYTES for m in msgs)
    assert sum(m.count(b"\n") + 1 for m in msgs) == len(big)


def test_settings_are_off_by_default_and_checked():
    c = TopologyConfig.from_env({})
    assert (c.jalapeno_link_events_topic, c.jalapeno_telemetry_topic, c.jalapeno_kafka) == ("", "", "")
    assert c.telemetry_measurements() == frozenset({"stamp_delay", "altmark_loss"})
    assert (
        TopologyConfig.from_env({"SEGSCOPE_TOPOLOGY_JALAPENO_TELEMETRY_MEASUREMENTS": "*"}).telemetry_measurements()
        is None
    )
    for env, var in (
        ({"SEGSCOPE_TOPOLOGY_REFRESH_S": "0"}, "SEGSCOPE_TOPOLOGY_REFRESH_S"),
        ({"SEGSCOPE_TOPOLOGY_STALE_AFTER_S": "20"}, "SEGSCOPE_TOPOLOGY_STALE_AFTER_S"),
        ({"SEGSCOPE_ARANGO_BATCH_SIZE": "0"}, "SEGSCOPE_ARANGO_BATCH_SIZE"),
        (
            {
                "SEGSCOPE_TOPOLOGY_JALAPENO_TELEMETRY_TOPIC": "jalapeno.telemetry",
                "SEGSCOPE_TOPOLOGY_JALAPENO_TELEMETRY_MEASUREMENTS": " , ",
            },
            "SEGSCOPE_TOPOLOGY_JALAPENO_TELEMETRY_MEASUREMENTS",
        ),
    ):
        try:
            TopologyConfig.from_env(env)
        except ConfigError as e:
            assert var in str(e)
        else:
            raise AssertionError(f"{env} accepted")
    c = TopologyConfig.from_env({"SEGSCOPE_TOPOLOGY_STALE_AFTER_S": "0", "SEGSCOPE_TOPOLOGY_JALAPENO_IP_EDGES": ""})
    assert (c.stale_after_s, c.jalapeno_ip_edges, c.refresh_s) == (0.0, "", 30.0)


def test_link_events_and_telemetry_reach_jalapenos_topics(stack, arango):
    run = uuid.uuid4().hex[:8]
    events, tele = f"jal-{run}.gobmp.parsed.ls_link_events", f"jal-{run}.jalapeno.telemetry"
    ensure_topics(stack.kafka_bootstrap, [events, tele])
    jk = JalapenoKafka(stack.kafka_bootstrap, link_events_topic=events, telemetry_topic=tele)
    # the sink sends one event per annotated igpv6_graph edge
    jf.build(arango)
    sink = jalapeno_sink(arango, model(stamp("forward", 2044.9)), Clocks(), link_events=jk.link_events)
    assert sink.flush()["annotated"] == 1 and sink.counters.link_events_out == 1
    assert jk.forward_metrics(METRICS, b"A") == 2
    assert jk.flush(10.0) == 0
    (ev,) = consume(stack.kafka_bootstrap, events, 1)
    assert ev.key() == AR.encode()
    assert json.loads(ev.value()) == {"TopicType": 9, "_key": AR, "_id": f"igpv6_graph/{AR}", "action": "update"}
    (msg,) = consume(stack.kafka_bootstrap, tele, 1)
    points, bad = parse_lines(msg.value().decode())  # what telegraf-egress's influx parser gets
    assert bad == [] and [p.measurement for p in points] == ["stamp_delay", "altmark_loss"]
    assert points[0].fields["mean_us"] == 2044.9 and points[0].timestamp_ns == 1795306905000000000
    assert jk.counters.jalapeno_kafka_errors == 0
    off = JalapenoKafka(stack.kafka_bootstrap)
    assert off.link_events("igpv6_graph", [AR]) == 0 and off.forward_metrics(METRICS) == 0


def test_a_new_leader_forwards_what_it_held_beyond_what_was_forwarded_before(stack):
    run = uuid.uuid4().hex[:8]
    tele, source = f"jal-{run}.jalapeno.telemetry", f"m-{run}"
    ensure_topics(stack.kafka_bootstrap, [tele])

    def line(i: int) -> str:
        return f"stamp_delay,node=A,ssid=7,direction=forward count=100i,mean_us={1000 + i} {1795306905000000000 + i}"

    first = JalapenoKafka(stack.kafka_bootstrap, telemetry_topic=tele)
    for offset in (0, 1, 2):  # read as a standby: held, nothing sent before the marks are known
        assert first.hold(line(offset), b"A", (source, 0, offset)) == 1
    assert first.send_held() == 0
    assert first.read_marks(None) == {} and first.send_held() == 3 and first.flush(10.0) == 0
    # a restarted (or new) leader re-read offsets 1 and 2 (its lookback) and read offset 3
    second = JalapenoKafka(stack.kafka_bootstrap, telemetry_topic=tele)
    for offset in (1, 2, 3):
        second.hold(line(offset), b"A", (source, 0, offset))
    assert second.read_marks(None) == {(source, 0): 2}
    assert second.send_held() == 1 and second.counters.telemetry_lines_forwarded_before == 2
    assert second.flush(10.0) == 0
    got = consume(stack.kafka_bootstrap, tele, 4)
    assert sorted(m.value().decode() for m in got) == [line(i) for i in range(4)]
    assert second.producer.list_topics(tele).topics[tele].partitions.keys() == {0}
    c = Consumer({"bootstrap.servers": stack.kafka_bootstrap, "group.id": f"t-{run}"})
    assert c.get_watermark_offsets(TopicPartition(tele, 0), timeout=10) == (0, 4)  # each line once, no more
    c.close()
    assert dict(got[-1].headers())["segscope_source"] == f"{source}:0:{got[-1].value().decode()[-1]}".encode()
    # a standby lets go of what it held longer than HOLD_S (the leader of that time sent it)
    standby = JalapenoKafka(stack.kafka_bootstrap, telemetry_topic=tele)
    standby.hold(line(5), b"A", (source, 0, 5), now=100.0)
    standby.hold(line(6), b"A", (source, 0, 6), now=100.0 + jalapeno_kafka.HOLD_S + 1)
    assert standby.counters.telemetry_lines_unheld == 1 and len(standby.held) == 1
