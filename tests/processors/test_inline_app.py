"""End to end through the real stack: ioam_batch messages -> the in-line worker (subprocess,
`python -m processors.inline`) -> segscope.metrics -> Telegraf -> InfluxDB.

Two flows 10 minutes in the past (the idle rule closes their seconds), built with known times at
every node: flow 1 over A -> R1 -> R2 -> B with the ioam records of the four nodes and its in-line
record on the test's paths topic (names, path, departures resolved by subnet), with packets lost,
one delivered twice by the network, one reordered and a whole message replayed; flow 2 over
A -> X -> R2 -> B where X fills nothing (hops 0 and 1 not measured, the span 0-1 measured), without
records (names from ids, path unknown). Every field read back from InfluxDB is compared with the
value computed here from the times the records were built with. Malformed messages and a batch
with one unusable record go to the dead-letter topic with their reason; the counters line says
what happened.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import Producer

from processors.delay.topics import ensure_topics
from segscope_schemas import delay_histogram
from segscope_schemas import ioam_record as ir
from segscope_schemas import path_record as pr
from tests.processors.conftest import stop_worker
from tests.processors.inline_records import NS, TAI_UTC, Hop, entry_time_ns, records
from tests.processors.test_inline_aggregate import stats
from tests.processors.test_loss_app import tail_consumer

REPO = Path(__file__).resolve().parents[2]


def start_worker(bootstrap: str, tmp: Path, name: str, topics: dict, app_id: str, *extra: str, env=None):
    """`python -m processors.inline` on the test's topics, logging to tmp/<name>.log."""
    env = dict(os.environ, PYTHONPATH=f"{REPO}:{REPO / 'schemas' / 'python'}", **(env or {}))
    args = [sys.executable, "-m", "processors.inline", "--bootstrap", bootstrap]
    args += ["--records-topic", topics["records"], "--metrics-topic", topics["metrics"]]
    args += ["--deadletter-topic", topics["deadletter"], "--paths-topic", topics["paths"], "--app-id", app_id]
    args += ["--tai-utc-offset-s", str(TAI_UTC), "--datadir", str(tmp / name), "-l", "info", *extra]
    with open(tmp / f"{name}.log", "a") as log:
        return subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(log: Path, text: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not in {log}:\n{log.read_text(errors='replace')[-3000:]}")


@pytest.fixture
def workers():
    procs: list = []
    yield procs
    for p in procs:
        stop_worker(p)


def test_inline_worker_to_influxdb(stack, tmp_path, workers):
    bootstrap = stack.kafka_bootstrap
    run = uuid.uuid4().hex[:6]
    rng = np.random.default_rng(int(run, 16))
    topics = {k: f"test.inline.{run}.{k}" for k in ("records", "deadletter", "paths")}
    topics["metrics"] = "segscope.metrics"  # the stack's Telegraf reads it into InfluxDB
    ensure_topics(bootstrap, [topics["records"]], partitions=2)
    ensure_topics(bootstrap, [topics["deadletter"]])
    ensure_topics(bootstrap, [topics["paths"]], config={"cleanup.policy": "compact"})
    a, r1, r2, b = (f"{n}{run}" for n in ("A", "R1", "R2", "B"))
    f1, f2 = (int(x) for x in rng.choice(np.arange(1, 1 << 20), 2, replace=False))
    # names: the ioam records of the four nodes and flow 1's in-line tx record
    p = Producer({"bootstrap.servers": bootstrap})
    for name, node_id, ifs, sids in (
        (a, 1, [pr.IoamInterface("a0", 11, 3, ("fc00:12::/64",))], []),
        (r1, 7, [pr.IoamInterface("r1a", 70, 4, ("fc00:12::/64",)), pr.IoamInterface("r1b", 71, 5, ("fc00:23::/64",))],
         ["fc00:7::e"]),
        (r2, 8, [pr.IoamInterface("r2a", 80, 6, ("fc00:23::/64",)), pr.IoamInterface("r2b", 81, 7, ("fc00:34::/64",))],
         ["fc00:8::e"]),
        (b, 99, [pr.IoamInterface("b0", 90, 5, ("fc00:34::/64",))], ["fc00:9::d6"]),
    ):  # fmt: skip
        p.produce(topics["paths"], *reversed(pr.encode(pr.IoamNode(name, node_id, tuple(ifs), (1,), tuple(sids), 1))))
    path = ["fc00:7::e", "fc00:8::e", "fc00:9::d6"]
    p.produce(topics["paths"], *reversed(pr.encode(pr.PathRecord.inline(a, f1, "tx", path, 1, 4, 100, 1))))
    assert p.flush(30) == 0

    dl = tail_consumer(bootstrap, topics["deadletter"])
    metrics_tail = tail_consumer(bootstrap, "segscope.metrics")
    workers.append(start_worker(bootstrap, tmp_path, "w", topics, f"test-inline-{run}", env={"SEGSCOPE_INSTANCE": run}))

    A = Hop(1, 0xFFFF, 11, 64)
    R1, R2 = Hop(7, 70, 70, 63), Hop(8, 80, 81, 62)
    base = time.clock_gettime_ns(time.CLOCK_TAI) // NS - 600
    per_s = 50
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": "lz4", "linger.ms": 5})
    batch_seq = iter(range(10**6))

    def send(recs: np.ndarray, flow: int, value: bytes | None = None) -> None:
        producer.produce(topics["records"], key=f"{b}/{flow}".encode(),
                         value=value or ir.encode_batch(recs, b, next(batch_seq)))  # fmt: skip

    # flow 1: 3 s, 50 packets a second; lost: 7, 8, 60, 149 (the last of the run is received);
    # 20 arrives twice (network duplicate), 31 after 32 (reordered)
    n = 3 * per_s
    seq = np.arange(n)
    tx = base * NS + seq * (NS // per_s) + 1234
    t1 = tx + rng.integers(100_000, 300_000, n)
    t2 = t1 + rng.integers(400_000, 900_000, n)
    rx = t2 + rng.integers(50_000, 150_000, n)
    lost1 = {7, 8, 60, 148}
    order = [s for s in range(n) if s not in lost1]
    order.insert(order.index(20) + 3, 20)  # a second copy of 20, 3 packets later
    i31 = order.index(31)
    order[i31], order[i31 + 1] = order[i31 + 1], order[i31]  # 32 before 31
    arrival = np.array(order)
    rx_arrival = rx[arrival].copy()
    rx_arrival[order.index(20, order.index(20) + 1)] += 7_000  # the copy's own receive time
    flow1 = records(f1, arrival, tx[arrival], rx_arrival, A, [(R1, t1[arrival]), (R2, t2[arrival])])
    for i in range(0, len(flow1), 20):
        send(flow1[i : i + 20], f1)
    send(flow1[40:60], f1)  # a replay of a whole message: counted once
    # flow 2: node 21 -> X (no IOAM) -> node 28 -> B, 1 s, nothing lost; no ioam record names 21 or 28
    A2, R28 = Hop(21, 0xFFFF, 11, 64), Hop(28, 80, 81, 62)
    s2 = np.arange(per_s)
    tx2 = base * NS + s2 * (NS // per_s) + 777
    t22 = tx2 + rng.integers(600_000, 800_000, per_s)
    rx2 = t22 + rng.integers(50_000, 150_000, per_s)
    send(records(f2, s2, tx2, rx2, A2, [(R28, t22)]), f2)
    # garbage: cut short, wrong magic, and one unusable record among good ones (its good ones go on)
    good = ir.encode_batch(flow1[:1], b, 999)
    send(None, f1, value=good[:-10])
    send(None, f1, value=b"XXXX" + good[4:])
    bad = records(f2, np.array([50, 51]), tx2[:2] + NS, rx2[:2] + NS, A2, [(R28, t22[:2] + NS)])
    bad["trace_type"][1] = 0xF80000
    send(bad, f2)
    assert producer.flush(30) == 0

    # what InfluxDB must hold, from the built times
    want_delay, want_hops, want_loss = {}, {}, {}
    kept = sorted(set(order))
    for second in range(3):
        sel = np.array([s for s in kept if s // per_s == second])
        e1, e2 = entry_time_ns(t1[sel]), entry_time_ns(t2[sel])
        want_delay[(f1, base + second)] = stats((rx[sel] - tx[sel]).tolist())
        want_hops[(f1, base + second)] = {
            ("0", f"{a}:a0->{r1}:r1a"): stats((e1 - tx[sel]).tolist()),
            ("1", f"{r1}:r1b->{r2}:r2a"): stats((e2 - e1).tolist()),
            ("2", f"{r2}:r2b->{b}:b0"): stats((rx[sel] - e2).tolist()),
        }
    want_loss[(f1, base)] = dict(received=48, lost=2, duplicated=1, reordered=1, loss_bursts=1, loss_burst_max=2)
    want_loss[(f1, base + 1)] = dict(received=49, lost=1, duplicated=0, reordered=0, loss_bursts=1, loss_burst_max=1)
    want_loss[(f1, base + 2)] = dict(received=49, lost=1, duplicated=0, reordered=0, loss_bursts=1, loss_burst_max=1)
    want_delay[(f2, base)] = stats((rx2 - tx2).tolist())
    want_delay[(f2, base + 1)] = stats([int(rx2[0] - tx2[0])])
    e22 = entry_time_ns(t22)
    want_hops[(f2, base)] = {
        ("0-1", "node-21:11->node-28:80"): stats((e22 - tx2).tolist()),
        ("2", f"node-28:unknown->{b}:b0"): stats((rx2 - e22).tolist()),  # B's record names its ifindex 5
    }
    want_loss[(f2, base)] = dict(received=50, lost=0, duplicated=0, reordered=0, loss_bursts=0, loss_burst_max=0)
    want_loss[(f2, base + 1)] = dict(received=1, lost=0, duplicated=0, reordered=0, loss_bursts=0, loss_burst_max=0)

    def query(measurement: str) -> list[dict]:
        return stack.influx_query_settled(
            f"SELECT * FROM {measurement} WHERE time >= {(base - TAI_UTC - 1) * NS} "
            f"AND (flow = '{f1}' OR flow = '{f2}') GROUP BY *",
            settle_s=0.5,
        )

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        loss_rows = query("inline_loss")
        if len(loss_rows) >= 5 and len(query("inline_hop_delay")) >= 3 * 3 + 5:
            break
        assert workers[0].poll() is None, (tmp_path / "w.log").read_text()[-3000:]
        time.sleep(1)
    time.sleep(1.5)  # a re-emission in flight would show now
    delay_rows, hop_rows, loss_rows = query("inline_delay"), query("inline_hop_delay"), query("inline_loss")
    hist_rows = query("inline_delay_histogram")

    def key(row) -> tuple[int, int]:
        return int(row["flow"]), row["time"] // NS + TAI_UTC

    got_delay = {key(r): r for r in delay_rows}
    assert set(got_delay) == set(want_delay)
    for k, want in want_delay.items():
        row = got_delay[k]
        for f, v in want.items():
            assert row[f] == pytest.approx(v, rel=1e-9), (k, f, row[f], v)
        ingress, path_tag = (a, ",".join(path)) if k[0] == f1 else ("node-21", "unknown")
        assert (row["ingress"], row["egress"], row["path"]) == (ingress, b, path_tag)
    # the histogram of flow 1's first second, bucket for bucket
    sel0 = np.array([s for s in kept if s < per_s])
    hist = next(r for r in hist_rows if key(r) == (f1, base))
    buckets = {f: int(v) for f, v in hist.items() if v is not None and (f[0] == "b" or f in ("low", "high"))}
    assert buckets == delay_histogram.counts(rx[sel0] - tx[sel0])

    got_hops: dict = {}
    for r in hop_rows:
        got_hops.setdefault(key(r), {})[(r["hop"], r["link"])] = r
    for k, hops in want_hops.items():
        for (hop, link), want in hops.items():
            row = got_hops[k][(hop, link)]
            assert row["measured"] is True and row["unmeasured"] == 0, row
            for f, v in want.items():
                assert row[f] == pytest.approx(v, rel=1e-9), (k, hop, f, row[f], v)
    not_measured = {hl: r for hl, r in got_hops[(f2, base)].items() if r["measured"] is False}
    assert set(not_measured) == {("0", "node-21:11->unknown:unknown"), ("1", "unknown:unknown->node-28:80")}
    assert all(r["unmeasured"] == per_s and r["count"] is None for r in not_measured.values())
    assert len(got_hops[(f1, base)]) == 3  # no span, no unmeasured hop where every node filled

    got_loss = {key(r): {f: r[f] for f in want_loss[key(r)]} for r in loss_rows}
    assert got_loss == want_loss
    assert sum(r["received"] + r["lost"] for r in loss_rows if int(r["flow"]) == f1) == n  # 0..149, each once

    # dead letters: the reason, the original message kept
    letters = []
    deadline = time.monotonic() + 20
    while len(letters) < 3 and time.monotonic() < deadline:
        letters += [json.loads(m.value()) for m in dl.consume(10, timeout=1) if m.error() is None]
    assert sorted(x["reason"] for x in letters) == ["bad_magic", "invalid_records", "length_mismatch"]
    invalid = next(x for x in letters if x["reason"] == "invalid_records")
    assert json.loads(invalid["detail"]) == {"bad_trace_type": 1}
    assert (
        ir.decode_batch(base64.b64decode(invalid["value_b64"]))[1].tobytes()
        == bad.astype(ir.IOAM_RECORD_DTYPE).tobytes()
    )

    # the counters line of this worker
    counters = {}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and counters.get("records_in", 0) < len(flow1) + 20 + per_s + 2:
        for m in metrics_tail.consume(100, timeout=0.5):
            for line in m.value().decode().split("\n"):
                if line.startswith(f"segscope_processor,processor=inline,instance={run} "):
                    counters = {k: int(v[:-1]) for k, v in (kv.split("=") for kv in line.split(" ")[1].split(","))}
    assert counters["records_in"] == len(flow1) + 20 + per_s + 2
    assert counters["duplicate_records"] == 20
    assert counters["malformed_batches"] == 2 and counters["invalid_records"] == 1
    assert counters["points_out"] == counters["histogram_points_out"] == len(want_delay)
    assert counters["path_unknown"] == 2  # flow 2's two seconds
    assert counters["hop_points_not_measured"] == 2 * 2  # flow 2: hops 0 and 1 in both its seconds
    assert counters["path_records"] == 5 and counters["path_records_malformed"] == 0
    dl.close()
    metrics_tail.close()


def test_inline_worker_summarises_its_hop_lines_for_the_topology(stack, tmp_path, workers):
    """With the summary topic set (processors/newest.py), the worker also publishes there the newest
    inline_hop_delay line of each hop series (measured or not) and nothing else of its own: the
    topology processor reads that instead of segscope.metrics."""
    from processors.worker import read_topic

    bootstrap = stack.kafka_bootstrap
    run = uuid.uuid4().hex[:6]
    topics = {k: f"test.inline.sum.{run}.{k}" for k in ("records", "deadletter", "paths", "metrics", "newest")}
    ensure_topics(bootstrap, [topics["records"]], partitions=2)
    ensure_topics(bootstrap, [topics["deadletter"], topics["metrics"], topics["newest"]])
    ensure_topics(bootstrap, [topics["paths"]], config={"cleanup.policy": "compact"})
    workers.append(start_worker(bootstrap, tmp_path, "w", topics, f"test-inline-sum-{run}", "--newest-topic",
                                topics["newest"], "--summary-interval-s", "1"))  # fmt: skip
    base = time.clock_gettime_ns(time.CLOCK_TAI) // NS - 600
    n = 150  # 3 s of one flow over A -> X (no IOAM) -> R -> B: hops 0 and 1 not measured, span 0-1, hop 2
    seq = np.arange(n)
    tx = base * NS + seq * (NS // 50)
    t2 = tx + 700_000
    p = Producer({"bootstrap.servers": bootstrap})
    p.produce(topics["records"], ir.encode_batch(records(7, seq, tx, t2 + 100_000, Hop(1, 0xFFFF, 11, 64),
                                                         [(Hop(8, 80, 81, 62), t2)]), "B", 1), b"B/7")  # fmt: skip
    assert p.flush(30) == 0
    want = {f"{h}": None for h in ("0", "1", "0-1", "2")}
    newest_ts = (base + 2 - TAI_UTC) * NS
    deadline = time.monotonic() + 60
    summary: dict[str, str] = {}
    # seconds base and base + 1 close as soon as the records are read (grace 0.5 s), the last one
    # idle_s later: a summary in between holds base + 1 as the newest, rightly; wait for the last
    while time.monotonic() < deadline and (
        len(summary) < len(want) or {ts for ts, _ in summary.values()} != {newest_ts}
    ):
        summary = {}
        for _, value in read_topic(bootstrap, topics["newest"], f"sum-reader-{uuid.uuid4().hex[:6]}"):
            for line in value.decode().split("\n"):
                assert line.startswith("inline_hop_delay,"), line  # only hop lines are summarised
                head, fields, ts = line.rsplit(" ", 2)
                hop = head.split(",hop=", 1)[1].split(",", 1)[0]
                summary[hop] = (int(ts), fields)
        time.sleep(1)
    assert set(summary) == set(want), summary
    # the newest second of each hop series: the flow's last second
    assert {ts for ts, _ in summary.values()} == {newest_ts}
    assert "measured=false" in summary["0"][1] and "measured=true" in summary["0-1"][1]
