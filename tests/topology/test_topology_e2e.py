"""End to end: injected delay on link A-R ends up on the ArangoDB edges A->R and R->A.

netlab line5 with the delay relay on link ar; a one-hop STAMP session A -> R (no SRH: the test
packet goes from A's loopback fc00:1::1 to R's r0 address fc00:12::2; XDP reflector on R's r0,
XDP collector on A's a0), the real streamer and delay processor on per-run topics,
node view publishers for A, R and B (A declares the sessions in its view), the topology
processor (`python -m processors.topology`, Faust) and the ArangoDB stand-in (or a real
ArangoDB with SEGSCOPE_ARANGO_URL). The topology processor reads the measurements from the delay
processor's summary topic (SEGSCOPE_TOPIC_METRICS_NEWEST, every second), as a large network
would: the edges must still carry exactly the newest point the metrics topic has.

Phases as in tests/e2e/test_stamp_pipeline.py: BASE (ssid 61) with 200 us each way measures the
path's own latency (sender syscall, veths, relay wake-up, reflector), then MAIN (ssid 62) with
2000 us A->R and 1000 us R->A. Asserted:
- the edge A->R (R->A) carries `latency` == `unidir_link_delay` == the mean_us of the newest
  forward (reverse) stamp_delay point of MAIN, exactly (what the pipeline measured, unchanged);
- that value == injected + relay lateness + the path latency BASE measured, within TOLERANCE_US
  (one second's mean of 100 packets, so wider than the e2e test's 20 s mean: 300 us still
  catches a lost, doubled or swapped delay, each >= 1000 us off);
- the path documents keyed by SID list exist for both directions with the same numbers;
- one document per key: the graph has exactly 3 nodes, 4 links, 4 edges, 3 SIDs, 2 paths;
- a malformed view is dead-lettered and counted, never written.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from topo_arango import arango_target

from collectors.topology import NodeViewPublisher
from netlab import Lab, relay_lateness_us, teardown
from netlab.lab import RELAY_IF_B
from processors.delay.topics import ensure_topics
from processors.topology.writer import ArangoWriter
from segscope_schemas.line_protocol import parse_lines
from tests.isolation import own_name

REPO = Path(__file__).resolve().parents[2]
LINE5 = REPO / "netlab" / "topologies" / "line5.yaml"
BUILD = REPO / "build"
PREFIX = own_name("topoe")
BASE, MAIN = 61, 62
BASE_US, FWD_US, REV_US = 200, 2000, 1000
BASE_S, MAIN_S, RATE = 6, 10, 100
TOLERANCE_US = 300
SENDER, REFLECTOR = "fc00:1::1", "fc00:12::2"
AR_KEY = "200_0_2_0_A_fc00:12::1_R_fc00:12::2"
RA_KEY = "200_0_2_0_R_fc00:12::2_A_fc00:12::1"
FWD_PATH, REV_PATH = "200_0_0_A_200_0_0_R_fc00:12::2", "200_0_0_R_200_0_0_A_fc00:1::1"

pytestmark = [pytest.mark.e2e, pytest.mark.datapath]


def sh(cmd):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed: {r.stderr}{r.stdout}")
    return r.stdout


def spawn(name, cmd, run_dir, env, procs):
    log = open(run_dir / f"{name}.log", "w")
    procs[name] = subprocess.Popen(
        [str(c) for c in cmd],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
        env={**os.environ, **env},
        start_new_session=True,
    )


def stop(procs, only=None):
    for name, p in reversed(list(procs.items())):
        if only is not None and name != only:
            continue
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def send(lab, ssid, duration_s):
    out = sh(
        [
            BUILD / "collectors" / "stamp_sender",
            "--netns",
            lab.ns("A"),
            "--src",
            SENDER,
            "--dst",
            REFLECTOR,
            "--ssid",
            ssid,
            "--sport",
            50000 + ssid,
            "--rate",
            RATE,
            "--duration",
            duration_s,
        ]
    )
    return json.loads(out.strip().splitlines()[-1])


def read_topic(bootstrap, topic, timeout_s=20.0) -> list[bytes]:
    """Every message now in the topic (up to its high watermark when the call starts: the
    metrics topic keeps receiving counter lines, so "until quiet" would never end)."""
    from confluent_kafka import TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"topoe-read-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
        todo = {p for p, end in ends.items() if end > 0}
        c.assign([TopicPartition(topic, p, 0) for p in todo])
        out, deadline = [], time.monotonic() + timeout_s
        while todo and time.monotonic() < deadline:
            msg = c.poll(0.3)
            if msg is None or msg.error():
                continue
            if msg.offset() < ends[msg.partition()]:
                out.append(msg.value())
            if msg.offset() >= ends[msg.partition()] - 1:
                todo.discard(msg.partition())
        assert not todo, f"could not read {topic} to its end in {timeout_s} s"
    finally:
        c.close()
    return out


def stamp_points(bootstrap, topic):
    pts = []
    for value in read_topic(bootstrap, topic):
        pts += [p for p in parse_lines(value.decode())[0] if p.measurement == "stamp_delay"]
    return pts


def mean_of(points, ssid, direction):
    sel = [p for p in points if p.tags["ssid"] == str(ssid) and p.tags["direction"] == direction]
    n = sum(p.fields["count"] for p in sel)
    return sum(p.fields["mean_us"] * p.fields["count"] for p in sel) / n


def newest(points, ssid, direction):
    sel = [p for p in points if p.tags["ssid"] == str(ssid) and p.tags["direction"] == direction]
    return max(sel, key=lambda p: p.timestamp_ns)


@pytest.fixture(scope="module")
def e2e(stack, bpffs, tmp_path_factory):
    run = uuid.uuid4().hex[:8]
    run_dir = tmp_path_factory.mktemp("topoe")
    topics = {
        "records": f"topo.e2e.records.{run}",
        "metrics": f"topo.e2e.metrics.{run}",
        "topology": f"topo.e2e.topology.{run}",
        # the delay processor's summary (processors/newest.py): the topology processor reads it, not metrics
        "newest": f"topo.e2e.newest.{run}",
    }
    ensure_topics(stack.kafka_bootstrap, list(topics.values()) + ["segscope.deadletter"])
    teardown(PREFIX)
    lab = Lab.up(LINE5, prefix=PREFIX, delay_us={"ar": (BASE_US, BASE_US)})
    procs: dict[str, subprocess.Popen] = {}
    attached, publishers = [], []
    refl_pin = Path("/sys/fs/bpf/segscope") / lab.ns("R") / "stamp_reflector"
    coll_pin = Path("/sys/fs/bpf/segscope") / lab.ns("A") / "stamp_collector"
    refl, coll = BUILD / "datapath" / "stamp_reflector", BUILD / "datapath" / "stamp_collector"
    with arango_target() as arango:
        try:
            # R's r0 answers with XDP_TX into the relay's rb: netlab runs xdp_pass on relay ends
            assert "xdp" in sh(["ip", "-n", lab.relay_ns("ar"), "link", "show", "dev", RELAY_IF_B])
            sh([refl, "attach", "--netns", lab.ns("R"), "--dev", "r0", "--pin-dir", refl_pin])
            attached.append((refl, lab.ns("R"), "r0", refl_pin))
            sh([refl, "add-address", "--pin-dir", refl_pin, REFLECTOR])
            sh([coll, "attach", "--netns", lab.ns("A"), "--dev", "a0", "--pin-dir", coll_pin])
            attached.append((coll, lab.ns("A"), "a0", coll_pin))
            for ssid in (BASE, MAIN):
                sh([refl, "add-session", "--pin-dir", refl_pin, "--ssid", ssid, "--sender", SENDER])
                sh([coll, "activate", "--pin-dir", coll_pin, "--ssid", ssid, "--port", 50000 + ssid])
            kafka = stack.kafka_bootstrap
            spawn(
                "streamer",
                [
                    BUILD / "collectors" / "stamp_streamer",
                    "--ringbuf",
                    coll_pin / "stamp_records",
                    "--datapath-stats",
                    coll_pin / "stamp_collector_stats",
                    "--brokers",
                    kafka,
                    "--node",
                    "A",
                    "--topic",
                    topics["records"],
                    "--metrics-topic",
                    topics["metrics"],
                ],
                run_dir,
                {},
                procs,
            )
            spawn(
                "delay",
                [sys.executable, "-m", "processors.delay"],
                run_dir,
                {
                    "SEGSCOPE_KAFKA_BOOTSTRAP": kafka,
                    "SEGSCOPE_TOPIC_STAMP_RECORDS": topics["records"],
                    "SEGSCOPE_TOPIC_METRICS": topics["metrics"],
                    "SEGSCOPE_DELAY_APP_ID": f"topoe-delay-{run}",
                    "SEGSCOPE_DELAY_DATADIR": str(run_dir / "delay"),
                    "SEGSCOPE_TOPIC_METRICS_NEWEST": topics["newest"],
                    "SEGSCOPE_SUMMARY_INTERVAL_S": "1",
                },
                procs,
            )
            topo_env = {
                "SEGSCOPE_KAFKA_BOOTSTRAP": kafka,
                "SEGSCOPE_TOPIC_TOPOLOGY": topics["topology"],
                "SEGSCOPE_TOPIC_METRICS": topics["metrics"],
                "SEGSCOPE_TOPIC_METRICS_NEWEST": topics["newest"],
                "SEGSCOPE_SUMMARY_INTERVAL_S": "1",
                "SEGSCOPE_TOPOLOGY_APP_ID": f"topoe-topology-{run}",
                "SEGSCOPE_TOPOLOGY_DATADIR": str(run_dir / "topology"),
                "SEGSCOPE_ARANGO_URL": arango.url,
                "SEGSCOPE_ARANGO_USER": arango.user,
                "SEGSCOPE_ARANGO_PASSWORD": arango.password,
                "SEGSCOPE_ARANGO_DB": arango.db_name,
            }
            spawn("topology", [sys.executable, "-m", "processors.topology"], run_dir, topo_env, procs)
            # the agent's section format (agent/server.py), as the agent would hand it over
            sessions = [
                {
                    "ssid": s,
                    "role": "STAMP_ROLE_SENDER",
                    "sender_address": SENDER,
                    "reflector_address": REFLECTOR,
                    "segments": [],
                    "return_segments": [],
                    "state": "STAMP_SESSION_STATE_RUNNING",
                }
                for s in (BASE, MAIN)
            ]
            for node in ("A", "R", "B"):
                pub = NodeViewPublisher(
                    node,
                    lab.ns(node),
                    kafka,
                    interval_s=5.0,
                    topic=topics["topology"],
                    poll_s=0.5,
                    metrics_topic=topics["metrics"],
                )
                if node == "A":
                    pub.set_section("stamp_sessions", sessions)
                publishers.append(pub.start())
            bad = Producer({"bootstrap.servers": kafka})
            bad.produce(topics["topology"], key=b"X", value=b"{not json")
            bad.flush(10)

            relay = [lab.relay_stats("ar")]
            sent = {"base": send(lab, BASE, BASE_S)}
            relay.append(lab.relay_stats("ar"))
            lab.set_delay("ar", FWD_US, REV_US)
            sent["main"] = send(lab, MAIN, MAIN_S)
            relay.append(lab.relay_stats("ar"))
            writer = ArangoWriter(arango.url, arango.db_name, arango.user, arango.password)
            # the delay processor closes MAIN's last second ~2 s (grace) after the sender stops;
            # wait until the edge shows a MAIN point and no newer one has come for 3 s
            last, stable_since, deadline = None, None, time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    edge = writer.db.collection("segscope_graph_edge").get(AR_KEY) or {}
                except Exception:
                    edge = {}
                src = edge.get("delay_source", {})
                cur = (src.get("ssid"), edge.get("delay_measured_at_ns"))
                if cur[0] == MAIN and cur == last:
                    if time.monotonic() - stable_since >= 3.0:
                        break
                else:
                    last, stable_since = cur, time.monotonic()
                time.sleep(0.5)
            collections = (
                "segscope_node",
                "segscope_link",
                "segscope_srv6_sid",
                "segscope_graph_edge",
                "segscope_path",
            )
            docs = {c: {d["_key"]: d for d in writer.all_documents(c)} for c in collections}
            # a restarted processor (new consumer group: replays both topics from the start) reads
            # every document back and finds them current; the database must hold the same documents
            stop(procs, only="topology")
            restart_ns = time.time_ns()
            spawn(
                "topology2",
                [sys.executable, "-m", "processors.topology"],
                run_dir,
                {
                    **topo_env,
                    "SEGSCOPE_TOPOLOGY_APP_ID": f"topoe-topology2-{run}",
                    "SEGSCOPE_TOPOLOGY_DATADIR": str(run_dir / "topology2"),
                },
                procs,
            )
            replayed, deadline = None, time.monotonic() + 60
            while replayed is None and time.monotonic() < deadline:
                time.sleep(2)
                for v in read_topic(kafka, topics["metrics"]):
                    for p in parse_lines(v.decode())[0]:
                        if (
                            p.measurement == "segscope_processor"
                            and p.tags.get("processor") == "topology"
                            and p.timestamp_ns > restart_ns
                            and p.fields["documents_read_back"] >= 16
                        ):
                            replayed = p.fields
            docs_after = {c: {d["_key"]: d for d in writer.all_documents(c)} for c in collections}
            yield {
                "docs": docs,
                "docs_after": docs_after,
                "replayed": replayed,
                "sent": sent,
                "kafka": kafka,
                "topics": topics,
                "lab": lab,
                "late": {"base": relay_lateness_us(relay[0], relay[1]), "main": relay_lateness_us(relay[1], relay[2])},
                "collector": json.loads(sh([coll, "stats", "--pin-dir", coll_pin, "--json"])),
                "reflector": json.loads(sh([refl, "stats", "--pin-dir", refl_pin, "--json"])),
                "relay": relay[-1],
                "run_dir": run_dir,
                "standin": arango.standin,
            }
        finally:
            for pub in publishers:
                pub.stop()
            stop(procs)
            for tool, ns, dev, pin in reversed(attached):
                subprocess.run(
                    [str(tool), "detach", "--netns", ns, "--dev", dev, "--pin-dir", str(pin)], capture_output=True
                )
            lab.down()


def test_graph_has_one_document_per_key(e2e):
    docs = e2e["docs"]
    assert {c: len(d) for c, d in docs.items()} == {
        "segscope_node": 3,
        "segscope_link": 4,
        "segscope_srv6_sid": 3,
        "segscope_graph_edge": 4,
        "segscope_path": 2,
    }
    assert sorted(docs["segscope_node"]) == ["200_0_0_A", "200_0_0_B", "200_0_0_R"]
    assert {AR_KEY, RA_KEY} <= set(docs["segscope_graph_edge"])
    assert sorted(docs["segscope_path"]) == sorted([FWD_PATH, REV_PATH])


def test_edges_carry_the_injected_delay(e2e):
    pts = stamp_points(e2e["kafka"], e2e["topics"]["metrics"])
    late = e2e["late"]
    assert all(s["send_errors"] == 0 for s in e2e["sent"].values())
    # the STAMP pipeline's own accounting is tests/e2e's subject; here: (nearly) every packet
    # made it, so the newest second is a full one, but for the sender's last packet when a loaded
    # machine ran the sender late (then alone in a second of its own: below)
    sent = sum(s["sent"] for s in e2e["sent"].values())
    print(
        "\naccounting: sent",
        sent,
        "reflected",
        e2e["reflector"]["reflected"],
        "collected",
        e2e["collector"]["collected"],
        "relay",
        {d: {k: v for k, v in e2e["relay"][d].items() if k != "lateness_ns"} for d in ("a_to_b", "b_to_a")},
    )
    assert sent == RATE * (BASE_S + MAIN_S) and e2e["collector"]["collected"] >= 0.99 * sent
    path_fwd = mean_of(pts, BASE, "forward") - BASE_US - late["base"]["a_to_b"]
    path_rev = mean_of(pts, BASE, "reverse") - BASE_US - late["base"]["b_to_a"]
    edges = e2e["docs"]["segscope_graph_edge"]
    report = {}
    for key, direction, injected, lateness, path in (
        (AR_KEY, "forward", FWD_US, late["main"]["a_to_b"], path_fwd),
        (RA_KEY, "reverse", REV_US, late["main"]["b_to_a"], path_rev),
    ):
        edge, point = edges[key], newest(pts, MAIN, direction)
        # exactly what the pipeline measured in MAIN's newest second ...
        assert edge["delay_source"] == {
            "kind": "stamp",
            "node": "A",
            "ssid": MAIN,
            "direction": direction,
            "count": point.fields["count"],
        }
        assert edge["delay_measured_at_ns"] == point.timestamp_ns
        assert edge["latency"] == edge["unidir_link_delay"] == round(point.fields["mean_us"], 3)
        if point.fields.get("ipdv_mean_us") is None:
            # a second of one packet has no variation, and the edge none either: the sender's last
            # packet alone in a second of its own, when a loaded machine ran the sender late
            assert point.fields["count"] == 1 and "unidir_delay_variation" not in edge, edge
        else:
            assert edge["unidir_delay_variation"] == round(point.fields["ipdv_mean_us"], 3)
        # ... and that is the injected delay plus the path's own latency
        report[direction] = {
            "edge_us": edge["unidir_link_delay"],
            "injected_us": injected,
            "relay_late_us": round(lateness, 1),
            "path_latency_us": round(path, 1),
            "error_us": round(edge["unidir_link_delay"] - injected - lateness - path, 1),
        }
        assert abs(report[direction]["error_us"]) <= TOLERANCE_US, report
        # the injected delay is a floor: no packet of that second arrived earlier
        assert edge["unidir_link_delay_min_max"][0] >= injected - 5
        assert 0 < path < 500
    print("\nedge delays vs injected:", json.dumps(report))
    # B's side was not measured: no measurement fields there
    assert not any("latency" in e for k, e in edges.items() if k not in (AR_KEY, RA_KEY))


def test_path_documents_keyed_by_sid_list_carry_the_same_numbers(e2e):
    paths, edges = e2e["docs"]["segscope_path"], e2e["docs"]["segscope_graph_edge"]
    fwd, rev = paths[FWD_PATH], paths[REV_PATH]
    assert (fwd["src"], fwd["dst"], fwd["sid_list"], fwd["links"]) == (
        "segscope_node/200_0_0_A",
        "segscope_node/200_0_0_R",
        [REFLECTOR],
        [AR_KEY],
    )
    assert (rev["src_node"], rev["dst_node"], rev["sid_list"], rev["links"]) == ("R", "A", [SENDER], [RA_KEY])
    assert fwd["delay_us"] == edges[AR_KEY]["unidir_link_delay"]
    assert rev["delay_us"] == edges[RA_KEY]["unidir_link_delay"]
    assert sorted(s["ssid"] for s in fwd["stamp_sessions"]) == [BASE, MAIN]
    assert abs(fwd["round_trip_delay_us"] - fwd["delay_us"] - rev["delay_us"]) < 1.0


def test_malformed_view_is_dead_lettered_and_counted(e2e):
    letters = [json.loads(v) for v in read_topic(e2e["kafka"], "segscope.deadletter")]
    ours = [d for d in letters if d.get("source_topic") == e2e["topics"]["topology"]]
    # once: the restarted processor replays the topic but finds the letter already sent
    assert len(ours) == 1 and {d["reason"] for d in ours} == {"bad_json"}
    assert len({(d["partition"], d["offset"]) for d in ours}) == 1
    lines = [
        p
        for v in read_topic(e2e["kafka"], e2e["topics"]["metrics"])
        for p in parse_lines(v.decode())[0]
        if p.measurement == "segscope_processor" and p.tags.get("processor") == "topology"
    ]
    last = max(lines, key=lambda p: p.timestamp_ns).fields
    assert last["malformed_views"] == 1 and last["dead_letters"] == 1 and last["views_in"] >= 3
    assert last["flush_errors"] == 0 and last["document_errors"] == 0 and last["nodes"] == 3
    assert "X" not in {d["name"] for d in e2e["docs"]["segscope_node"].values()}


def test_publishers_report_their_counters(e2e):
    lines = [
        p
        for v in read_topic(e2e["kafka"], e2e["topics"]["metrics"])
        for p in parse_lines(v.decode())[0]
        if p.measurement == "segscope_topology_publisher"
    ]
    by_node = {}
    for p in sorted(lines, key=lambda p: p.timestamp_ns):
        by_node[p.tags["node"]] = p.fields
    assert sorted(by_node) == ["A", "B", "R"]
    for fields in by_node.values():
        assert fields["views_published"] >= 1 and fields["delivery_errors"] == 0 and fields["build_errors"] == 0


def test_a_restarted_processor_replays_into_the_same_documents(e2e):
    assert e2e["replayed"] is not None, "the restarted processor did not rewrite the documents within 60 s"
    assert e2e["replayed"]["document_errors"] == 0 and e2e["replayed"]["points_in"] > 0
    before, after = e2e["docs"], e2e["docs_after"]
    assert {c: sorted(d) for c, d in after.items()} == {c: sorted(d) for c, d in before.items()}

    def content(doc):  # everything but ArangoDB's revision, which every rewrite changes
        return {k: v for k, v in doc.items() if k != "_rev"}

    for coll in before:
        for key, doc in before[coll].items():
            assert content(after[coll][key]) == content(doc), (coll, key)
