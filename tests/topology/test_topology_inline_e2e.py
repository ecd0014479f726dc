"""End to end through the real Kafka: inline_hop_delay lines on the metrics topic -> the topology
processor (`python -m processors.topology`) -> link edges in ArangoDB (the stand-in, or the real
one of SEGSCOPE_ARANGO_URL).

Two processors on the same inputs (per-run topics on the shared stack): `plain` reads the metrics
topic, `summary` reads the summary topic (SEGSCOPE_TOPIC_METRICS_NEWEST) to which the test publishes
what processors/newest.py keeps of the same lines, as an in-line worker with the summary on does.
Node views of line5 with a one-hop STAMP session A -> R (ssid 7) go to the views topic.

Phase 1: A -> R measured by STAMP (second S1) and by flows 1 and 2 (S1 + 1 s): STAMP gives the
link's delay, the in-line value is beside it; R -> B and R -> A by one flow each; B -> R not
measured (measured=false); a span (not a link). Phase 2: flows 1 and 2 on A -> R 40 s after the
STAMP point (the session stopped): the in-line delay is the link's. Both databases must hold the
numbers worked out below from the lines, and the same documents.
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

from arango import ArangoClient
from confluent_kafka import Producer
from test_topology_inline import BR_KEY, RB_KEY, hop
from test_topology_model import AR_KEY, ONE_HOP, RA_KEY, views
from test_topology_workers import counters, documents, wait_for

from processors.delay.topics import ensure_topics
from processors.newest import NewestLines

REPO = Path(__file__).resolve().parents[2]
S = 1_000_000_000


def stamp_line(ts: int) -> str:
    """stamp_delay of ONE_HOP's forward direction (schemas/metrics.md): 100 packets, mean 2044.9 us."""
    return (
        "stamp_delay,node=A,ssid=7,path=fc00:12::2,direction=forward count=100i,sum_us=204490.0,min_us=2034.9,"
        f"mean_us=2044.9,max_us=2094.9,p50_us=2044.0,p99_us=2090.0,ipdv_mean_us=6.3,unsynchronized=0i {ts}"
    )


def test_inline_hop_delays_reach_the_edges_from_the_metrics_topic_and_from_the_summary(stack, arango, tmp_path):
    run = uuid.uuid4().hex[:8]
    bootstrap = stack.kafka_bootstrap
    topics = {
        "views": f"topo.i.views.{run}",
        "metrics": f"topo.i.metrics.{run}",
        "newest": f"topo.i.newest.{run}",
        "dead": f"topo.i.dead.{run}",
    }
    ensure_topics(bootstrap, list(topics.values()))
    prod = Producer({"bootstrap.servers": bootstrap})
    newest = NewestLines()  # what an in-line worker with the summary on holds and publishes

    def publish(lines: list[str]) -> None:
        """As the in-line processor: the lines on the metrics topic, their summary on the newest topic."""
        prod.produce(topics["metrics"], key=b"inline", value="\n".join(lines).encode())
        newest.take(lines)
        for message in newest.messages(newest.drain()):
            prod.produce(topics["newest"], key=b"inline", value=message)
        prod.flush(10)

    now = time.time_ns()
    s1 = (now // S - 100) * S  # data time: well inside SEGSCOPE_TOPOLOGY_STALE_AFTER_S (300 s)
    for v in views(sessions=[ONE_HOP], t=now):
        prod.produce(topics["views"], key=v["node"].encode(), value=json.dumps(v).encode())
    phase1 = [
        stamp_line(s1),
        hop(1, 0, "A:a0->R:r0", s1 + S, count=10, sum_us=20000.0, min_us=1990.0, max_us=2015.0, ipdv=3.0),
        hop(2, 0, "A:a0->R:r0", s1 + S, count=30, sum_us=63000.0, min_us=2050.0, max_us=2200.0, ipdv=5.0),
        hop(1, 1, "R:r1->B:b0", s1 + S, count=1, sum_us=512.0, min_us=512.0, max_us=512.0),
        hop(3, 0, "B:b0->R:r1", s1 + S, measured=False, path="fc00:2::e\\,fc00:1::d6"),
        hop(3, 1, "R:r0->A:a0", s1 + S, count=4, sum_us=4004.0, min_us=1000.0, max_us=1002.0, ipdv=0.5),
        hop(4, "0-1", "A:a0->B:b0", s1 + S, count=2, sum_us=5000.0, min_us=2400.0, max_us=2600.0),
    ]
    publish(phase1)

    procs: dict[str, subprocess.Popen] = {}
    dbs = {"plain": f"{arango.db_name}_plain", "summary": f"{arango.db_name}_summary"}

    def spawn(name: str, extra: dict) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": f"{REPO}:{REPO / 'schemas' / 'python'}",
            "SEGSCOPE_KAFKA_BOOTSTRAP": bootstrap,
            "SEGSCOPE_TOPIC_TOPOLOGY": topics["views"],
            "SEGSCOPE_TOPIC_METRICS": topics["metrics"],
            "SEGSCOPE_TOPIC_DEADLETTER": topics["dead"],
            "SEGSCOPE_TOPOLOGY_APP_ID": f"topo-i-{name}-{run}",
            "SEGSCOPE_TOPOLOGY_DATADIR": str(tmp_path / name),
            "SEGSCOPE_TOPOLOGY_HEALTH": "off",
            "SEGSCOPE_INSTANCE": name,
            "SEGSCOPE_ARANGO_URL": arango.url,
            "SEGSCOPE_ARANGO_USER": arango.user,
            "SEGSCOPE_ARANGO_PASSWORD": arango.password,
            "SEGSCOPE_ARANGO_DB": dbs[name],
            **extra,
        }
        log = open(tmp_path / f"{name}.log", "w")
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "processors.topology", "-l", "warn"], cwd=REPO, env=env, stdout=log, stderr=log
        )

    client = ArangoClient(hosts=arango.url)

    def edges_when(name: str, done) -> dict | None:
        docs = documents(client, dbs[name], arango.user, arango.password)
        edges = docs.get("segscope_graph_edge", {})
        return docs if edges and done(edges) else None

    try:
        spawn("plain", {})
        spawn("summary", {"SEGSCOPE_TOPIC_METRICS_NEWEST": topics["newest"]})

        def phase1_done(edges):
            ar = edges.get(AR_KEY, {})
            return ar.get("link_delay_source") == "stamp" and "inline_link_delay" in ar and RA_KEY in edges

        docs1 = {n: wait_for(f"phase 1 in {n}", lambda n=n: edges_when(n, phase1_done), 90) for n in dbs}
        for name, docs in docs1.items():
            edges = docs["segscope_graph_edge"]
            ar, rb, ra, br = edges[AR_KEY], edges[RB_KEY], edges[RA_KEY], edges[BR_KEY]
            # STAMP gives A -> R's delay (its second is 1 s behind the flows': within the window)
            assert (ar["latency"], ar["unidir_link_delay_min_max"], ar["unidir_delay_variation"]) == (
                2044.9,
                [2034.9, 2094.9],
                6.3,
            ), name
            assert ar["delay_source"] == {"kind": "stamp", "node": "A", "ssid": 7, "direction": "forward", "count": 100}
            assert ar["delay_measured_at_ns"] == ar["stamp_link_delay_measured_at_ns"] == s1
            # the flows' own value beside it: (20000 + 63000) / 40; IPDV (3 x 9 + 5 x 29) / 38
            assert ar["inline_link_delay"] == {
                "mean_us": 2075.0,
                "min_us": 1990.0,
                "max_us": 2200.0,
                "variation_us": 4.526,
                "count": 40,
                "flows": [1, 2],
            }, name
            assert ar["inline_link_delay_measured_at_ns"] == s1 + S
            assert (rb["link_delay_source"], rb["unidir_link_delay"], rb["unidir_link_delay_min_max"]) == (
                "inline",
                512.0,
                [512.0, 512.0],
            )
            assert "unidir_delay_variation" not in rb  # one packet
            assert (ra["unidir_link_delay"], ra["unidir_delay_variation"], ra["delay_source"]) == (
                1001.0,
                0.5,
                {"kind": "inline", "flows": [3], "count": 4},
            )
            assert not {"latency", "inline_link_delay", "link_delay_source"} & set(br), name  # measured=false

        # phase 2: the session stopped at s1; the flows measure A -> R 40 s later
        publish(
            [
                hop(1, 0, "A:a0->R:r0", s1 + 40 * S, count=20, sum_us=41000.0, min_us=2030.0, max_us=2100.0, ipdv=4.0),
                hop(2, 0, "A:a0->R:r0", s1 + 40 * S, count=20, sum_us=43000.0, min_us=2100.0, max_us=2250.0, ipdv=6.0),
            ]
        )

        def phase2_done(edges):
            return edges.get(AR_KEY, {}).get("link_delay_source") == "inline"

        docs2 = {n: wait_for(f"phase 2 in {n}", lambda n=n: edges_when(n, phase2_done), 60) for n in dbs}
        for name, docs in docs2.items():
            ar = docs["segscope_graph_edge"][AR_KEY]
            # 84000 / 40; IPDV (4 x 19 + 6 x 19) / 38
            assert (ar["latency"], ar["unidir_link_delay_min_max"], ar["unidir_delay_variation"]) == (
                2100.0,
                [2030.0, 2250.0],
                5.0,
            ), name
            assert ar["delay_source"] == {"kind": "inline", "flows": [1, 2], "count": 40}
            assert ar["delay_measured_at_ns"] == ar["inline_link_delay_measured_at_ns"] == s1 + 40 * S
            assert ar["stamp_link_delay"]["mean_us"] == 2044.9  # not stale: kept beside it
        assert docs2["plain"] == docs2["summary"]  # the summary path writes what the metrics path writes

        def counted():
            got = counters(bootstrap, topics["metrics"])
            ok = all(got.get(n, {}).get("points_in", 0) >= 8 for n in dbs)
            return got if ok else None

        stats = wait_for("both processors' counters", counted, 20)
        for name in dbs:
            c = stats[name]
            assert (c["inline_span_points"], c["malformed_lines"], c["measurements_unmapped"]) == (1, 0, 0), name
            assert (c["inline_hops_not_measured"], c["flush_errors"], c["document_errors"]) == (1, 0, 0), name
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        if arango.standin is None:
            sys_db = client.db("_system", username=arango.user, password=arango.password)
            for db in dbs.values():
                if sys_db.has_database(db):
                    sys_db.delete_database(db)
