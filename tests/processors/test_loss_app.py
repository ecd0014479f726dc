"""End to end through the real stack: altmark_batch messages -> Faust loss worker (subprocess,
`python -m processors.loss`) -> segscope.metrics -> Telegraf -> InfluxDB.

Checks exact altmark_loss points in InfluxDB (lost, ratio, bytes, double-marking delay), a block
whose rx side never arrives published complete=false only after the timeout and overwritten to
complete=true when the side comes late, a duplicate replay that does not double count,
malformed messages and invalid records in the dead-letter topic with their reason, and the
processor's counters. A second test measures the worker's records/s on its own topics.
"""

from __future__ import annotations

import base64
import json
import os
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from processors.delay.topics import ensure_topics
from segscope_schemas import altmark_block as ab
from tests.processors.conftest import stop_worker

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
NS = 1_000_000_000
TAI_UTC = 37
TIMEOUT_S = 2.0


def rec(
    direction, block, packets, nbytes, flow, method=ab.METHOD_DSCP, boot=1, dm=0, dm_sum=0, flags=0, period_ms=1000
) -> np.ndarray:
    r = np.zeros(1, dtype=ab.ALTMARK_BLOCK_DTYPE)
    r["block_index"] = block
    r["block_start_ns"] = block * period_ms * 1_000_000
    r["colour"] = block & 1
    r["period_ms"] = period_ms
    r["flow_id"] = flow
    r["direction"] = direction
    r["method"] = method
    r["packets"] = packets
    r["bytes"] = nbytes
    r["boot_id"] = boot
    r["flags"] = flags
    r["dmark_packets"] = dm
    r["dmark_ts_sum_ns"] = dm_sum
    return r


def start_worker(
    bootstrap: str,
    tmp_path: Path,
    blocks: str,
    metrics: str,
    deadletter: str,
    app_id: str,
    timeout_s: float = 0,
    retention_s: float = 60,
):
    log_path = tmp_path / f"{app_id}.log"
    env = dict(os.environ, PYTHONPATH=f"{REPO}:{REPO / 'schemas' / 'python'}")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [
                PY,
                "-m",
                "processors.loss",
                "--bootstrap",
                bootstrap,
                "--blocks-topic",
                blocks,
                "--metrics-topic",
                metrics,
                "--deadletter-topic",
                deadletter,
                "--app-id",
                app_id,
                "--timeout-s",
                str(timeout_s or TIMEOUT_S),
                "--retention-s",
                str(retention_s),
                "--flush-interval-s",
                "0.5",
                "--tai-utc-offset-s",
                str(TAI_UTC),
                "--datadir",
                str(tmp_path / app_id),
                "-l",
                "info",
            ],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return proc, log_path


def tail_consumer(bootstrap: str, topic: str) -> Consumer:
    """A consumer positioned at the current end of `topic` (shared topics carry other data)."""
    c = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"amcol-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False}
    )
    meta = c.list_topics(topic, timeout=10).topics[topic]
    parts = []
    for p in meta.partitions:
        _, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        parts.append(TopicPartition(topic, p, high))
    c.assign(parts)
    return c


def parse_fields(fields_s: str) -> dict:
    out = {}
    for kv in fields_s.split(","):
        k, v = kv.split("=", 1)
        out[k] = int(v[:-1]) if v.endswith("i") else v
    return out


@pytest.fixture
def workers():
    """Worker processes a test starts; stopped (SIGTERM, then kill) even when the test fails."""
    procs = []
    yield procs
    for proc in procs:
        stop_worker(proc)


@pytest.fixture
def run_names(stack):
    run = uuid.uuid4().hex[:6]
    names = {
        "run": run,
        "blocks": f"amcol.test.{run}.blocks",
        "deadletter": f"amcol.test.{run}.deadletter",
        "app_id": f"amcol-loss-{run}",
        "tx_node": f"amcolA{run}",
        "rx_node": f"amcolB{run}",
    }
    ensure_topics(stack.kafka_bootstrap, [names["blocks"]], partitions=2)
    ensure_topics(stack.kafka_bootstrap, [names["deadletter"]])
    return names


def test_loss_worker_to_influxdb(stack, run_names, tmp_path, workers):
    n = run_names
    bootstrap = stack.kafka_bootstrap
    rnd = random.Random(n["run"])
    f1, f2 = rnd.randrange(1, 0xFFFFF), rnd.randrange(1, 0xFFFFF)
    b0 = time.clock_gettime_ns(time.CLOCK_TAI) // NS - 600  # blocks 10 minutes ago, T = 1 s
    metrics_tail = tail_consumer(bootstrap, "segscope.metrics")
    dl = tail_consumer(bootstrap, n["deadletter"])
    proc, log_path = start_worker(bootstrap, tmp_path, n["blocks"], "segscope.metrics", n["deadletter"], n["app_id"])
    workers.append(proc)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": "lz4"})
    seq = iter(range(1_000_000))

    def send(node: str, flow: int, *recs, value: bytes | None = None) -> None:
        body = value if value is not None else ab.encode_batch(np.concatenate(recs), node, next(seq))
        producer.produce(n["blocks"], key=ab.kafka_key(node, flow), value=body)

    tx, rx = n["tx_node"], n["rx_node"]
    # flow 1: 4 blocks; block 0 with 4 D-marked packets (exact mean 1500.25 us), block 1 with a
    # D-marked packet lost (no delay), block 2 without traffic
    tx_counts = [1000, 2000, 0, 500]
    rx_counts = [990, 1999, 0, 500]
    dm_tx_sum = 4 * 1_795_000_000_000_000_000
    for i, (t, r) in enumerate(zip(tx_counts, rx_counts)):
        dm = {0: (4, 4, dm_tx_sum, dm_tx_sum + 6_001_000), 1: (3, 2, 77, 99)}.get(i, (0, 0, 0, 0))
        send(tx, f1, rec(ab.DIR_TX, b0 + i, t, t * 1500, f1, dm=dm[0], dm_sum=dm[2]))
        send(rx, f1, rec(ab.DIR_RX, b0 + i, r, r * 1500, f1, dm=dm[1], dm_sum=dm[3]))
    send(tx, f1, rec(ab.DIR_TX, b0 + 1, 2000, 2000 * 1500, f1, dm=3, dm_sum=77))  # replay (duplicate)
    # flow 2 (rfc9343): one joined block teaches its rx node (tags of a later missing side), then
    # a block with tx only -> incomplete after the timeout
    send(tx, f2, rec(ab.DIR_TX, b0 - 1, 100, 100 * 1500, f2, method=ab.METHOD_RFC9343))
    send(rx, f2, rec(ab.DIR_RX, b0 - 1, 100, 100 * 1500, f2, method=ab.METHOD_RFC9343))
    send(tx, f2, rec(ab.DIR_TX, b0, 300, 300 * 1500, f2, method=ab.METHOD_RFC9343))
    # garbage: cut short, wrong magic, and a batch with one unusable record among good ones
    good = ab.encode_batch(rec(ab.DIR_TX, b0 + 5, 1, 1, f1), tx, 999)
    send(tx, f1, value=good[:-10])
    send(tx, f1, value=b"XXXX" + good[4:])
    bad = rec(ab.DIR_TX, b0 + 6, 1, 1, f1)
    bad["colour"] ^= 1
    send(tx, f1, rec(ab.DIR_TX, b0 + 4, 7, 70, f1), bad)
    send(rx, f1, rec(ab.DIR_RX, b0 + 4, 7, 70, f1))
    assert producer.flush(30) == 0
    t_sent = time.monotonic()

    def series(flow: int, settled: bool = False) -> dict[int, dict]:
        """settled: only points written completely (the loops below wait for a point's time or its
        `complete`; InfluxDB 1.x can return a point mid-write with other fields null)."""
        query = f"SELECT * FROM altmark_loss WHERE tx_node = '{tx}' AND flow = '{flow}'"
        rows = stack.influx_query_settled(query, settle_s=0.5) if settled else stack.influx_query(query)
        return {r["time"]: r for r in rows}

    ts = [(b0 + i - TAI_UTC) * NS for i in range(6)]
    want_f1 = {
        ts[0]: dict(
            tx_packets=1000,
            rx_packets=990,
            lost=10,
            loss_ratio=0.01,
            tx_bytes=1_500_000,
            rx_bytes=1_485_000,
            dmark_packets=4,
            dmark_delay_mean_us=1500.25,
            complete=True,
            reason="ok",
            newest_ns=ts[0] + NS,  # the block's end
        ),
        ts[1]: dict(
            tx_packets=2000,
            rx_packets=1999,
            lost=1,
            loss_ratio=0.0005,
            tx_bytes=3_000_000,
            rx_bytes=2_998_500,
            dmark_packets=None,
            dmark_delay_mean_us=None,
            complete=True,
            reason="ok",
        ),
        ts[2]: dict(tx_packets=0, rx_packets=0, lost=0, loss_ratio=None, complete=True, reason="ok"),
        ts[3]: dict(tx_packets=500, rx_packets=500, lost=0, loss_ratio=0.0, complete=True, reason="ok"),
        ts[4]: dict(tx_packets=7, rx_packets=7, lost=0, complete=True, reason="ok"),
    }
    incomplete_seen_at = None
    letters, counters = [], None
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"worker exited {proc.returncode}: {log_path.read_text()[-3000:]}")
            for m in metrics_tail.consume(num_messages=1000, timeout=0.3):
                for line in m.value().decode().split("\n"):
                    head, fields_s, _ = line.rsplit(" ", 2)
                    if (
                        head.startswith("altmark_loss,")
                        and f"flow={f2}," in head
                        and f"tx_node={tx}," in head
                        and "complete=false" in fields_s
                        and incomplete_seen_at is None
                    ):
                        incomplete_seen_at = time.monotonic()
                    if head.startswith("segscope_processor,processor=loss,instance="):
                        c = parse_fields(fields_s)
                        if c["records_in"] == 15:  # ours (another loss worker would differ)
                            counters = c
            for m in dl.consume(num_messages=100, timeout=0.1):
                letters.append(json.loads(m.value()))
            have = series(f1)
            if all(t in have for t in want_f1) and incomplete_seen_at and len(letters) >= 3 and counters:
                break
    finally:
        metrics_tail.close()
        dl.close()

    have = series(f1, settled=True)
    for t, want in want_f1.items():
        row = have.get(t)
        assert row is not None, (t, sorted(have), log_path.read_text()[-2000:])
        assert row["method"] == "dscp" and row["rx_node"] == rx and row["period_ms"] == "1000"
        for k, v in want.items():
            assert row.get(k) == v, (t, k, row)
    assert set(have) == set(want_f1)  # the invalid record's block b0+6 was never published

    # flow 2: complete=false only after the timeout, no loss number
    assert incomplete_seen_at is not None and incomplete_seen_at - t_sent >= TIMEOUT_S - 0.6
    deadline = time.monotonic() + 30  # Telegraf flushes to InfluxDB on its own interval
    while time.monotonic() < deadline and ts[0] not in series(f2):
        time.sleep(0.3)
    row = series(f2, settled=True)[ts[0]]
    assert row["rx_node"] == rx  # the node last seen on that side: same series later
    assert (row["complete"], row["reason"], row["tx_packets"], row["lost"], row["method"]) == (
        False,
        "missing_rx",
        300,
        None,
        "rfc9343",
    )
    # ... and the late rx side turns it into a complete point with the same identity
    send(rx, f2, rec(ab.DIR_RX, b0, 297, 297 * 1500, f2, method=ab.METHOD_RFC9343))
    assert producer.flush(30) == 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and series(f2)[ts[0]]["complete"] is not True:
        time.sleep(0.5)
    assert len(series(f2)) == 2  # b0 - 1 and b0: overwritten, not a second point
    row = series(f2, settled=True)[ts[0]]
    assert (row["complete"], row["reason"], row["lost"], row["rx_packets"]) == (True, "ok", 3, 297)

    reasons = sorted(x["reason"] for x in letters)
    assert reasons == ["bad_magic", "invalid_records", "length_mismatch"], letters
    inv = next(x for x in letters if x["reason"] == "invalid_records")
    assert json.loads(inv["detail"]) == {"colour_mismatch": 1}
    assert all(
        x["source_topic"] == n["blocks"] and base64.b64decode(x["key_b64"]) == ab.kafka_key(tx, f1) for x in letters
    )

    assert counters is not None, log_path.read_text()[-2000:]
    assert (
        counters["batches_in"],
        counters["malformed_batches"],
        counters["invalid_records"],
        counters["duplicate_records"],
        counters["dmark_delays"],
        counters["dmark_mismatch"],
    ) == (14, 2, 1, 1, 1, 1)


@pytest.mark.parametrize("per_message, n_flows", [(1, 1000), (1000, 10_000)])
def test_loss_worker_throughput(stack, tmp_path, per_message, n_flows, workers):
    """Records/s of one worker: n_flows blocks x tx/rx as 1-record batches (the collector's
    default: one message per flow and tick) or 1000-record batches (--group-flows)."""
    bootstrap = stack.kafka_bootstrap
    run = uuid.uuid4().hex[:6]
    blocks, metrics, dl = f"amcol.test.{run}.blocks", f"amcol.test.{run}.metrics", f"amcol.test.{run}.dl"
    ensure_topics(bootstrap, [blocks, metrics, dl])
    b0 = time.clock_gettime_ns(time.CLOCK_TAI) // NS - 600
    messages = []
    for first in range(0, n_flows, per_message):
        for node, direction, packets in (("amcolA", ab.DIR_TX, 100), ("amcolB", ab.DIR_RX, 99)):
            recs = np.concatenate(
                [rec(direction, b0, packets, packets * 100, flow) for flow in range(first, first + per_message)]
            )
            key = ab.kafka_key(node, first) if per_message == 1 else node.encode()
            messages.append((key, ab.encode_batch(recs, node, first)))
    metrics_c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"amcol-{run}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    metrics_c.subscribe([metrics])
    proc, log_path = start_worker(bootstrap, tmp_path, blocks, metrics, dl, f"amcol-loss-bench-{run}")
    workers.append(proc)
    t0 = t_done = None
    complete_lines = 0
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and t_done is None:
            if proc.poll() is not None:
                pytest.fail(f"worker exited {proc.returncode}: {log_path.read_text()[-3000:]}")
            for m in metrics_c.consume(num_messages=1000, timeout=0.1):
                for line in m.value().decode().split("\n"):
                    if line.startswith("altmark_loss,"):
                        complete_lines += "lost=1i," in line and "complete=true" in line
                    elif line.startswith("segscope_processor,processor=loss"):
                        c = parse_fields(line.rsplit(" ", 2)[1])
                        if t0 is None:
                            # the worker is up (its first counters): now send everything at once
                            t0 = time.monotonic()
                            producer = Producer(
                                {
                                    "bootstrap.servers": bootstrap,
                                    "linger.ms": 20,
                                    "compression.type": "lz4",
                                    "queue.buffering.max.messages": 100_000,
                                }
                            )
                            for key, value in messages:
                                producer.produce(blocks, key=key, value=value)
                            assert producer.flush(60) == 0
                        elif c["records_in"] == 2 * n_flows and c["blocks_complete"] == n_flows:
                            t_done = time.monotonic()
                            done = c
    finally:
        metrics_c.close()
        stop_worker(proc)
    assert t_done is not None, log_path.read_text()[-2000:]
    rate = 2 * n_flows / (t_done - t0)
    print(
        f"\n[loss worker] {2 * n_flows} records in {per_message}-record batches: {rate:,.0f} records/s "
        f"from produce to all lines published (counters every 0.5 s: rate is a lower bound)"
    )
    assert complete_lines == n_flows
    # the repartition stage sent the records of several collector messages of a node in one by-flow
    # message (Gathering in processors/loss/app.py), and the join stage took every one of them
    assert done["rekeyed_batches_in"] == done["rekeyed_batches_out"], done
    if per_message == 1:  # one record per message: without gathering, one by-flow message per message
        assert done["rekeyed_batches_out"] < done["batches_in"], done
