"""docs/querying.md runs: every code block marked `<!-- test: NAME -->` is extracted from the doc
and run against data the real processors produced, and the numbers it returns are checked against
what was fed in.

One module-scoped run: path records on a paths topic of this test; STAMP records of four sessions
on three paths (15 min ago, 20 s) through the real delay processor (`python -m processors.delay`)
and alternate-marking blocks of four flows with known loss through the real loss processor, both
writing to segscope.metrics -> Telegraf -> the stack's InfluxDB; then the rollups are backfilled
for this run's series (rollups.backfill, what `segscope-influx-setup --backfill` runs). The doc's
example paths are replaced by this run's own (unique SIDs), so other tests' points on the shared
stack never mix in; queries over all paths are checked on this run's paths.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import Producer

from processors.delay.topics import ensure_topics
from segscope_schemas import altmark_block as ab
from segscope_schemas import delay_histogram, influxql, path_record
from segscope_schemas.stamp_record import STAMP_RECORD_DTYPE, encode_batch
from services.influxdb import rollups
from tests.processors.conftest import stop_worker

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "querying.md"
NS = 1_000_000_000
SECONDS = 20
RATES = {"a1": 100, "a2": 40, "b": 100, "c": 100}  # records per second of each session; a2 unlike a1:
# a mean of the two sessions' means is then not their packet-weighted mean
DOC_PATH = "fc00:2::e,fc00:3::d6"  # the doc's example path


def doc_blocks() -> dict[str, tuple[str, str]]:
    """{name: (language, code)} of every block the doc marks for this test."""
    text = DOC.read_text()
    found = re.findall(r"<!-- test: (\w+) -->\n```(\w+)\n(.*?)```", text, re.S)
    blocks = {name: (lang, code) for name, lang, code in found}
    assert len(blocks) == len(found) == text.count("<!-- test:"), "a marked block without a code block"
    return blocks


def nearest_rank(values_ns: np.ndarray, q: float) -> float:
    s = np.sort(values_ns)
    return float(s[math.ceil(q * len(s)) - 1]) / 1000


def tai_utc_offset_s() -> int:
    return round((time.clock_gettime_ns(time.CLOCK_TAI) - time.time_ns()) / NS)


def forward_delays(rng, kind: str) -> np.ndarray:
    """[second][packet] forward delays in ns of one session, shaped to make a point:
    a: bulk only; b: a 3 % tail at 9-10 ms in every second (the worst p99);
    c: one second with 10 packets at 40 ms (max and mean of per-second p99s mislead)."""
    lo, hi = {"a1": (1_900_000, 2_300_000), "a2": (2_000_000, 2_600_000), "b": (3_000_000, 3_200_000),
              "c": (2_800_000, 3_000_000)}[kind]  # fmt: skip
    d = rng.integers(lo, hi, (SECONDS, RATES[kind]))
    if kind == "b":
        d[:, :3] = rng.integers(9_000_000, 10_000_000, (SECONDS, 3))
    if kind == "c":
        d[7, :10] = 40_000_000 + rng.integers(0, 100_000, 10)
    for row in d:
        rng.shuffle(row)
    return d


def stamp_records(ssid: int, first_second: int, fwd: np.ndarray) -> np.ndarray:
    n, rate = fwd.size, fwd.shape[1]
    r = np.zeros(n, dtype=STAMP_RECORD_DTYPE)
    r["ssid"] = ssid
    r["sender_seq"] = np.arange(n)
    t1 = first_second * NS + np.repeat(np.arange(SECONDS), rate) * NS + np.tile(np.arange(rate) * (NS // rate), SECONDS)
    r["t1_ns"] = t1
    r["t2_ns"] = t1 + fwd.reshape(-1)
    r["t3_ns"] = r["t2_ns"] + 10_000
    r["t4_ns"] = r["t3_ns"] + 1_000_000
    return r


def block(direction: int, index: int, packets: int, flow: int) -> np.ndarray:
    r = np.zeros(1, dtype=ab.ALTMARK_BLOCK_DTYPE)
    r["block_index"], r["block_start_ns"], r["colour"] = index, index * NS, index & 1
    r["period_ms"], r["flow_id"], r["direction"], r["method"] = 1000, flow, direction, ab.METHOD_DSCP
    r["packets"], r["bytes"], r["boot_id"] = packets, packets * 1000, 1
    return r


def start(module: str, args: list[str], log: Path, instance: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=f"{REPO}:{REPO / 'schemas' / 'python'}", SEGSCOPE_INSTANCE=instance)
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", module, *args, "-l", "info"], cwd=REPO, env=env,
                                stdout=out, stderr=subprocess.STDOUT)  # fmt: skip


@pytest.fixture(scope="module")
def data(stack, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("querying")
    run = uuid.uuid4().hex[:8]
    r1, r2 = run[:4], run[4:]
    paths = {"a": f"fc00:{r1}:{r2}::e,fc00:{r1}:{r2}::d6", "b": f"fc00:{r1}:{r2}::4e", "c": f"fc00:{r1}:{r2}::c"}
    bootstrap = stack.kafka_bootstrap
    topics = {k: f"test.querying.{run}.{k}" for k in ("records", "blocks", "paths", "deadletter")}
    ensure_topics(bootstrap, [topics["records"], topics["blocks"]], partitions=2)
    ensure_topics(bootstrap, [topics["paths"], topics["deadletter"]])
    node_a, node_b, tx, rx = f"qa{run}", f"qb{run}", f"qtx{run}", f"qrx{run}"
    # session -> (node, ssid, path, delay shape); flow -> (path, lost per block, incomplete block)
    sessions = {"a1": (node_a, 1, "a"), "a2": (node_b, 2, "a"), "b": (node_a, 3, "b"), "c": (node_a, 4, "c")}
    flow_base = int(run, 16) % 1_000_000 * 4 + 1
    flows = {
        flow_base: ("a", [0] * 10, None),
        flow_base + 1: ("a", [0, 3, 0, 0, 7, 0, 0, 1, 0, 0], None),
        flow_base + 2: ("b", [0, 0, 0, 0, 0, 0, 2, 0, 0, 0], 2),  # lost 2, and one incomplete block
        flow_base + 3: ("c", [0] * 10, 4),  # block 4: the rx side never comes (incomplete, no loss number)
    }

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": "lz4"})
    for node, ssid, p in sessions.values():
        key, value = path_record.encode(
            path_record.PathRecord.stamp(node, ssid, "sender", paths[p].split(","), [], time.time_ns())
        )
        producer.produce(topics["paths"], key=key, value=value)
    for flow, (p, _, _) in flows.items():
        rec = path_record.PathRecord.flow(tx, flow, "tx", paths[p].split(","), "dscp", 1000, time.time_ns())
        key, value = path_record.encode(rec)
        producer.produce(topics["paths"], key=key, value=value)
    assert producer.flush(30) == 0

    offset = tai_utc_offset_s()
    common = ["--bootstrap", bootstrap, "--metrics-topic", "segscope.metrics", "--deadletter-topic",
              topics["deadletter"], "--paths-topic", topics["paths"], "--tai-utc-offset-s", str(offset)]  # fmt: skip
    procs = [
        start(
            "processors.delay",
            [
                *common,
                "--records-topic",
                topics["records"],
                "--app-id",
                f"q-delay-{run}",
                "--grace-s",
                "1",
                "--datadir",
                str(tmp / "delay"),
            ],
            tmp / "delay.log",
            f"q-delay-{run}",
        ),
        start(
            "processors.loss",
            [
                *common,
                "--blocks-topic",
                topics["blocks"],
                "--app-id",
                f"q-loss-{run}",
                "--timeout-s",
                "2",
                "--flush-interval-s",
                "0.5",
                "--datadir",
                str(tmp / "loss"),
            ],
            tmp / "loss.log",
            f"q-loss-{run}",
        ),
    ]
    try:
        rng = np.random.default_rng(16)
        first = time.clock_gettime_ns(time.CLOCK_TAI) // NS - 900  # 15 minutes ago
        truth = {}
        for name, (node, ssid, _) in sessions.items():
            fwd = forward_delays(rng, name)
            truth[name] = fwd
            recs = stamp_records(ssid, first, fwd)
            for i, chunk in enumerate(np.array_split(recs, 10)):
                producer.produce(topics["records"], key=f"{node}/{ssid}".encode(), value=encode_batch(chunk, node, i))
        for flow, (_, lost, missing) in flows.items():
            for i, loss in enumerate(lost):
                b = first + i
                tx_batch = ab.encode_batch(block(ab.DIR_TX, b, 1000, flow), tx, 2 * i)
                producer.produce(topics["blocks"], key=ab.kafka_key(tx, flow), value=tx_batch)
                if i != missing:
                    rx_batch = ab.encode_batch(block(ab.DIR_RX, b, 1000 - loss, flow), rx, 2 * i + 1)
                    producer.produce(topics["blocks"], key=ab.kafka_key(rx, flow), value=rx_batch)
        assert producer.flush(30) == 0

        in_run = f"\"path\" =~ /{r1}:{r2}/"
        want_delay = len(sessions) * SECONDS * 3  # directions
        deadline = time.monotonic() + 90
        while True:
            for proc, log in zip(procs, ("delay.log", "loss.log")):
                assert proc.poll() is None, (tmp / log).read_text()[-3000:]
            n_delay = stack.influx_query(f'SELECT count("count") FROM "stamp_delay" WHERE {in_run}')
            hist = stack.influx_query(f"SELECT sum(*) FROM \"stamp_delay_histogram\" WHERE {in_run}")
            n_hist = sum(v for k, v in (hist[0] if hist else {}).items() if k != "time" and v)
            blocks = stack.influx_query(f'SELECT count("tx_packets") FROM "altmark_loss" WHERE {in_run}')
            done = (n_delay and n_delay[0]["count"] == want_delay, blocks and blocks[0]["count"] == 10 * len(flows))
            incomplete = stack.influx_query(
                f'SELECT "reason" FROM "altmark_loss" WHERE {in_run} AND "complete" = false'
            )
            if all(done) and len(incomplete) == 2 and n_hist == 3 * sum(RATES.values()) * SECONDS:  # every delay
                break
            assert time.monotonic() < deadline, (n_delay, blocks, incomplete, (tmp / "delay.log").read_text()[-2000:])
            time.sleep(0.5)
        # the loop counted `count` and `tx_packets`: the newest points' other fields (sum_us, lost,
        # ...) may still be mid-write (InfluxDB 1.x, influxdata/influxdb#8546) and the backfill
        # below reads them once, into rollups the tests assert exactly
        time.sleep(0.5)
        t0 = (first - offset) * NS

        def run_q(statement: str) -> list[dict]:
            return influxql.series(stack.influx_url, statement, db=stack.influx_db, timeout=120)

        end = t0 + (SECONDS + 1) * NS
        written = rollups.backfill(run_q, stack.influx_db, t0, end, where=in_run, say=lambda _: None)
        assert written > 0
    finally:
        for proc in procs:
            stop_worker(proc)
    return {"paths": paths, "sessions": sessions, "truth": truth, "flows": flows, "run": run}


def in_doc(code: str, data) -> str:
    """The doc's code with its example path replaced by this run's path a."""
    return code.replace(DOC_PATH, data["paths"]["a"])


def query(stack, name: str, data) -> list[dict]:
    lang, code = doc_blocks()[name]
    assert lang == "sql"
    return influxql.series(stack.influx_url, in_doc(code, data), db=stack.influx_db)


def path_delays(data, p: str) -> np.ndarray:
    return np.concatenate([data["truth"][s].reshape(-1) for s, (_, _, q) in data["sessions"].items() if q == p])


def test_the_doc_has_every_recipe():
    assert set(doc_blocks()) == {"worst_paths_p99", "worst_paths_p99_python", "flows_with_loss",
                                 "flows_with_loss_rollup", "path_week", "path_week_p99", "pandas_day"}  # fmt: skip


def test_worst_paths_by_p99_this_hour(stack, data):
    _, code = doc_blocks()["worst_paths_p99_python"]
    _, sql = doc_blocks()["worst_paths_p99"]
    scope = {"url": stack.influx_url, "query": in_doc(sql, data)}
    exec(compile(in_doc(code, data), "docs/querying.md:worst_paths_p99_python", "exec"), scope)
    mine = {data["paths"][p]: p for p in "abc"}
    worst = [(p99, mine[path]) for p99, path in scope["worst"] if path in mine]
    true_p99 = {p: nearest_rank(path_delays(data, p), 0.99) for p in "abc"}
    assert [p for _, p in worst] == sorted("abc", key=lambda p: -true_p99[p]) == ["b", "c", "a"]
    for p99, p in worst:
        assert abs(p99 - true_p99[p]) <= 0.022 * true_p99[p], (p, p99, true_p99[p])
    # what the doc says about per-second p99s, on path c's raw points
    rows = stack.influx_query(
        f"SELECT max(\"p99_us\"), mean(\"p99_us\") FROM \"stamp_delay\" WHERE \"path\" = '{data['paths']['c']}' "
        "AND \"direction\" = 'forward'"
    )
    assert rows[0]["max"] > 10 * true_p99["c"] and rows[0]["mean"] > 1.3 * true_p99["c"], (rows, true_p99["c"])


def test_flows_with_any_loss_today(stack, data):
    got = {int(s["tags"]["flow"]): (s["tags"]["path"], s["values"]) for s in query(stack, "flows_with_loss", data)}
    mine = {f: v for f, v in got.items() if f in data["flows"]}
    want = {f: (data["paths"][p], sum(lost)) for f, (p, lost, _) in data["flows"].items() if sum(lost)}
    assert set(mine) == set(want) and len(want) == 2
    for f, (path, values) in mine.items():
        ((_, lost, tx, ratio),) = values
        n_complete = 10 - (data["flows"][f][2] is not None)
        assert (path, lost, tx) == (want[f][0], want[f][1], 1000 * n_complete)
        assert ratio == pytest.approx(want[f][1] / (1000 * n_complete))

    rollup = {int(s["tags"]["flow"]): s["values"][0] for s in query(stack, "flows_with_loss_rollup", data)}
    for f, (_, lost, missing) in data["flows"].items():
        _, r_lost, r_tx, incomplete = rollup[f]
        assert (r_lost, r_tx, incomplete) == (sum(lost), 1000 * (10 - (missing is not None)), missing is not None)


def test_delay_of_one_path_over_a_week_from_the_rollups(stack, data):
    d = path_delays(data, "a")
    ((row,),) = [s["values"] for s in query(stack, "path_week", data)]
    _, mean_us, min_us, max_us, packets = row
    assert packets == d.size == SECONDS * (RATES["a1"] + RATES["a2"])
    assert mean_us == pytest.approx(int(d.sum()) / d.size / 1000, rel=1e-9)
    assert (min_us, max_us) == (d.min() / 1000, d.max() / 1000)
    ((cols, vals),) = [(s["columns"], s["values"][0]) for s in query(stack, "path_week_p99", data)]
    buckets = {c.removeprefix("sum_"): v for c, v in zip(cols, vals)}
    assert sum(v for k, v in buckets.items() if k != "time" and v) == d.size
    p99, true = delay_histogram.quantile_us(buckets, 0.99), nearest_rank(d, 0.99)
    assert abs(p99 - true) <= 0.022 * true, (p99, true)


def test_a_day_of_one_path_in_pandas(stack, data, monkeypatch):
    pytest.importorskip("pandas")
    monkeypatch.setenv("SEGSCOPE_INFLUX_URL", stack.influx_url)
    lang, code = doc_blocks()["pandas_day"]
    assert lang == "python"
    scope: dict = {}
    exec(compile(in_doc(code, data), "docs/querying.md:pandas_day", "exec"), scope)
    day, per_minute = scope["day"], scope["per_minute"]
    d = path_delays(data, "a")
    assert len(day) == 2 * SECONDS and int(day["count"].sum()) == d.size
    assert set(day["node"]) == {data["sessions"]["a1"][0], data["sessions"]["a2"][0]}
    assert day.index.is_monotonic_increasing and str(day.index.tz) == "UTC"
    weighted = (per_minute["mean_us"] * per_minute["count"]).sum() / per_minute["count"].sum()
    assert weighted == pytest.approx(int(d.sum()) / d.size / 1000, rel=1e-9)
    assert per_minute["max_us"].max() == d.max() / 1000
