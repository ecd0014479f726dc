"""The topology processor as N workers of one consumer group (README.md, "N workers"): one
leader writes, warm standbys take over. Real Kafka (the shared stack, per-run topics), real
`python -m processors.topology` workers, the ArangoDB stand-in (or SEGSCOPE_ARANGO_URL).

One run, two groups reading the same input topics: a single worker (database `one`) and three
workers (database `many`). Phase 1 (node views of line5 with two STAMP sessions, delay points,
a malformed view) is written before they start; once `many` holds it, its leader is killed
with SIGKILL and phase 2 goes in (R's view without its link to A: four documents must be
deleted, which the dead leader wrote and the new one did not; new delay points; another
malformed view). Both databases must then hold the same documents, and each dead-letter topic
each malformed view exactly once.
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
from test_topology_e2e import read_topic
from test_topology_model import AR_KEY, ONE_HOP, RA_KEY, VIA_R_TO_B, views

from processors.delay.topics import ensure_topics
from segscope_schemas.line_protocol import parse_lines

REPO = Path(__file__).resolve().parents[2]
COLLECTIONS = ("segscope_node", "segscope_link", "segscope_srv6_sid", "segscope_graph_edge", "segscope_path")


def delay_lines(ts_ns: int, mean_us: float) -> bytes:
    out = []
    for ssid, scale in ((7, 1.0), (8, 2.0)):
        for direction in ("forward", "backward"):
            m = mean_us * scale + (0 if direction == "forward" else 17)
            out.append(
                f"stamp_delay,node=A,ssid={ssid},direction={direction} count=100i,min_us={m - 10},"
                f"mean_us={m},max_us={m + 50},p50_us={m},p99_us={m + 40},ipdv_mean_us=6.3 {ts_ns}"
            )
    return "\n".join(out).encode()


def documents(client, db_name, user, password) -> dict:
    if not client.db("_system", username=user, password=password).has_database(db_name):
        return {}
    db = client.db(db_name, username=user, password=password)
    out = {}
    for c in COLLECTIONS:
        if not db.has_collection(c):
            return {}
        rows = db.aql.execute("FOR d IN @@collection RETURN d", bind_vars={"@collection": c})  # the writer's QUERY_ALL
        out[c] = {d["_key"]: {k: v for k, v in d.items() if k not in ("_rev", "_id")} for d in rows}
    return out


def counters(bootstrap, topic) -> dict[str, dict]:
    """The newest segscope_processor,processor=topology fields per instance."""
    newest: dict[str, tuple[int, dict]] = {}
    for v in read_topic(bootstrap, topic, timeout_s=5):
        for p in parse_lines(v.decode())[0]:
            if p.measurement == "segscope_processor" and p.tags.get("processor") == "topology":
                inst = p.tags["instance"]
                if inst not in newest or p.timestamp_ns > newest[inst][0]:
                    newest[inst] = (p.timestamp_ns, p.fields)
    return {i: f for i, (_, f) in newest.items()}


def wait_for(what, check, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"{what} did not happen within {timeout_s} s")


def test_three_workers_write_what_one_writes_and_a_killed_leader_loses_nothing(stack, arango, tmp_path):
    run = uuid.uuid4().hex[:8]
    bootstrap = stack.kafka_bootstrap
    topics = {"views": f"topo.w.views.{run}", "metrics": f"topo.w.metrics.{run}"}
    letters = {"one": f"topo.w.dead1.{run}", "many": f"topo.w.deadn.{run}"}
    telemetry = {"one": f"topo.w.tel1.{run}", "many": f"topo.w.teln.{run}"}  # as Jalapeno's jalapeno.telemetry
    ensure_topics(bootstrap, [*topics.values(), *letters.values(), *telemetry.values()])
    prod = Producer({"bootstrap.servers": bootstrap})
    now = time.time_ns()
    for v in views(sessions=[ONE_HOP, VIA_R_TO_B], t=now):
        prod.produce(topics["views"], key=v["node"].encode(), value=json.dumps(v).encode())
    prod.produce(topics["views"], key=b"X", value=b"{not json")
    prod.produce(topics["metrics"], key=b"A", value=delay_lines(now, 1000.0))
    prod.flush(10)

    procs: dict[str, subprocess.Popen] = {}

    def spawn(name: str, group: str, db_name: str, deadletter: str, telemetry_topic: str) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": f"{REPO}:{REPO / 'schemas' / 'python'}",
            "SEGSCOPE_KAFKA_BOOTSTRAP": bootstrap,
            "SEGSCOPE_TOPIC_TOPOLOGY": topics["views"],
            "SEGSCOPE_TOPIC_METRICS": topics["metrics"],
            "SEGSCOPE_TOPIC_DEADLETTER": deadletter,
            "SEGSCOPE_TOPOLOGY_APP_ID": f"topo-w-{group}-{run}",
            "SEGSCOPE_TOPOLOGY_DATADIR": str(tmp_path / name),
            "SEGSCOPE_TOPOLOGY_HEALTH": "off",
            "SEGSCOPE_INSTANCE": name,
            "SEGSCOPE_ARANGO_URL": arango.url,
            "SEGSCOPE_ARANGO_USER": arango.user,
            "SEGSCOPE_ARANGO_PASSWORD": arango.password,
            "SEGSCOPE_ARANGO_DB": db_name,
            "SEGSCOPE_TOPOLOGY_JALAPENO_TELEMETRY_TOPIC": telemetry_topic,
        }
        log = open(tmp_path / f"{name}.log", "w")
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "processors.topology", "-l", "warn"], cwd=REPO, env=env, stdout=log, stderr=log
        )

    one_db, many_db = f"{arango.db_name}_one", f"{arango.db_name}_many"
    client = ArangoClient(hosts=arango.url)
    try:
        spawn("one", "one", one_db, letters["one"], telemetry["one"])
        for i in (1, 2, 3):
            spawn(f"w{i}", "many", many_db, letters["many"], telemetry["many"])

        def phase1_written(db):
            docs = documents(client, db, arango.user, arango.password)
            edge = docs.get("segscope_graph_edge", {}).get(AR_KEY, {})
            return docs if edge.get("unidir_link_delay") == 1000.0 else None

        t0 = time.monotonic()
        wait_for("phase 1 in both databases", lambda: phase1_written(one_db) and phase1_written(many_db), 45)
        leaders = wait_for(
            "one leader among w1..w3",
            lambda: [i for i, f in counters(bootstrap, topics["metrics"]).items() if f["leader"] == 1 and i != "one"],
            10,
        )
        assert len(leaders) == 1, leaders
        procs[leaders[0]].send_signal(signal.SIGKILL)
        procs[leaders[0]].wait(5)
        t1 = time.monotonic()

        # phase 2: R loses its interface towards A (A-R link and edges, both ways, go away), new points
        r = views(nodes="R", t=now + 1_000_000_000)[0]
        r["interfaces"] = [i for i in r["interfaces"] if i["name"] != "r0"]
        prod.produce(topics["views"], key=b"R", value=json.dumps(r).encode())
        prod.produce(topics["views"], key=b"Y", value=b"[1, 2")
        prod.produce(topics["metrics"], key=b"A", value=delay_lines(now + 1_000_000_000, 1500.0))
        prod.flush(10)

        def phase2_written(db):
            docs = documents(client, db, arango.user, arango.password)
            paths = docs.get("segscope_path", {}).values()
            done = AR_KEY not in docs.get("segscope_link", {}) and any(
                d.get("delay_us") == 3000.0 or d.get("delay_mean_us") == 3000.0 for d in paths
            )
            return docs if done else None

        one = wait_for("phase 2 in the single worker's database", lambda: phase2_written(one_db), 30)
        many = wait_for("phase 2 written by the new leader", lambda: phase2_written(many_db), 40)
        print(f"phase 1 written {t1 - t0:.1f} s after start, phase 2 {time.monotonic() - t1:.1f} s after the kill")
        assert {c: sorted(d) for c, d in many.items()} == {c: sorted(d) for c, d in one.items()}
        assert many == one
        for coll in ("segscope_link", "segscope_graph_edge"):
            assert AR_KEY not in many[coll] and RA_KEY not in many[coll]  # deleted by the new leader

        stats = counters(bootstrap, topics["metrics"])
        new_leader = [i for i, f in stats.items() if f["leader"] == 1 and i not in ("one", leaders[0])]
        assert len(new_leader) == 1 and stats[new_leader[0]]["take_overs"] >= 1
        assert stats[new_leader[0]]["documents_read_back"] > 0 and stats[new_leader[0]]["document_errors"] == 0
        # jalapeno.telemetry: each stamp_delay line of both phases exactly once, from one worker at a
        # time (phase 1 read by all three before any led, phase 2 while none led, after the kill)
        sent_lines = sorted(delay_lines(now, 1000.0).decode().split("\n"))
        sent_lines += sorted(delay_lines(now + 1_000_000_000, 1500.0).decode().split("\n"))
        for name, topic in telemetry.items():

            def forwarded(topic=topic):
                lines = [line for v in read_topic(bootstrap, topic, timeout_s=5) for line in v.decode().split("\n")]
                return lines if len(lines) >= len(sent_lines) else None

            assert sorted(wait_for(f"the lines on {name}'s telemetry topic", forwarded, 10)) == sorted(sent_lines)
        assert stats[new_leader[0]]["telemetry_lines_sent"] == 4  # phase 2: the old leader was dead by then
        assert stats["one"]["telemetry_lines_sent"] == 8
        for name, topic in letters.items():
            # the new leader writes phase 2's letter once it has read the views: wait for two, then
            # check there are exactly these two

            def letters_of(topic=topic):
                sent = [json.loads(v) for v in read_topic(bootstrap, topic, timeout_s=5)]
                return sent if len(sent) >= 2 else None

            sent = wait_for(f"the dead letters on {name}'s topic", letters_of, 45)  # a loaded runner is late
            assert sorted((d["offset"], d["reason"]) for d in sent) == [
                (3, "bad_json"),
                (5, "bad_json"),
            ], name  # each malformed view once: no loss, no duplicate
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


def test_a_malformed_view_read_while_taking_over_is_dead_lettered_once(stack, arango, tmp_path):
    """A worker taking over keeps reading views while its reads (the database, the dead-letter
    topic, Jalapeno's telemetry marks) go on; it leads only when they end. A malformed view read
    in that time is neither the old leader's (dead) nor sent by the reader (not leading yet): the
    take-over must send it. The test hook makes the take-over's reads last 2.5 s (well within the session timeout:
    a longer callback would be a new rebalance, whose take-over sends the kept letters anyway)."""
    run = uuid.uuid4().hex[:8]
    bootstrap = stack.kafka_bootstrap
    views_topic, metrics, letters = f"topo.t.views.{run}", f"topo.t.metrics.{run}", f"topo.t.dead.{run}"
    ensure_topics(bootstrap, [views_topic, metrics, letters])
    env = {
        **os.environ,
        "PYTHONPATH": f"{REPO}:{REPO / 'schemas' / 'python'}",
        "SEGSCOPE_KAFKA_BOOTSTRAP": bootstrap,
        "SEGSCOPE_TOPIC_TOPOLOGY": views_topic,
        "SEGSCOPE_TOPIC_METRICS": metrics,
        "SEGSCOPE_TOPIC_DEADLETTER": letters,
        "SEGSCOPE_TOPOLOGY_APP_ID": f"topo-t-{run}",
        "SEGSCOPE_TOPOLOGY_DATADIR": str(tmp_path / "w"),
        "SEGSCOPE_TOPOLOGY_HEALTH": "off",
        "SEGSCOPE_INSTANCE": "w",
        "SEGSCOPE_ARANGO_URL": arango.url,
        "SEGSCOPE_ARANGO_USER": arango.user,
        "SEGSCOPE_ARANGO_PASSWORD": arango.password,
        "SEGSCOPE_ARANGO_DB": f"{arango.db_name}_t",
        "SEGSCOPE_TOPOLOGY_TEST_TAKE_OVER_PAUSE_S": "2.5",
    }
    log_path = tmp_path / "w.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "processors.topology", "-l", "warn"], cwd=REPO, env=env, stdout=log, stderr=log
        )
    try:
        wait_for("the take-over's pause", lambda: "pausing" in log_path.read_text(), 60)
        prod = Producer({"bootstrap.servers": bootstrap})
        prod.produce(views_topic, key=b"X", value=b"{during the take-over")
        prod.flush(10)
        wait_for("the worker to lead", lambda: counters(bootstrap, metrics).get("w", {}).get("leader") == 1, 30)
        prod.produce(views_topic, key=b"Y", value=b"{once leading")
        prod.flush(10)

        def letters_of():
            sent = [json.loads(v) for v in read_topic(bootstrap, letters, timeout_s=5)]
            return sent if len(sent) >= 2 else None

        sent = wait_for("both dead letters", letters_of, 30)
        time.sleep(2)  # a duplicate would come right after
        sent = [json.loads(v) for v in read_topic(bootstrap, letters, timeout_s=5)]
        assert sorted((d["offset"], d["reason"]) for d in sent) == [(0, "bad_json"), (1, "bad_json")]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
