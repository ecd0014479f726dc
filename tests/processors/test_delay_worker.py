"""End to end through real Kafka: stamp_batch messages -> Faust delay worker -> line protocol.

Two sessions over three seconds, a replayed (duplicate) batch and a malformed message. The
worker runs as a subprocess (`python -m processors.delay`) on topics unique to this test;
the test reads the metrics and dead-letter topics and checks exact aggregates. Session A's SID
list is published on the test's paths topic after the worker started (its PathBook follows the
topic): A's points carry it as `path`; B has no path record: `unknown`, counted. Each point has
its stamp_delay_histogram twin; the counters carry the worker's SEGSCOPE_INSTANCE.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import Consumer, Producer

from processors.delay.topics import ensure_topics
from segscope_schemas import delay_histogram, path_record
from segscope_schemas.stamp_error_estimate import ee_to_error_ns
from segscope_schemas.stamp_record import STAMP_RECORD_DTYPE, encode_batch
from tests.processors.conftest import stop_worker

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
NS = 1_000_000_000


def session_records(rng, ssid: int, first_second: int, seconds: int, per_second: int) -> np.ndarray:
    n = seconds * per_second
    r = np.zeros(n, dtype=STAMP_RECORD_DTYPE)
    r["ssid"] = ssid
    r["sender_seq"] = np.arange(n)
    offsets = np.repeat(np.arange(seconds), per_second) * NS + np.tile(
        np.linspace(0, NS - NS // per_second, per_second).astype(np.int64), seconds
    )
    t1 = first_second * NS + offsets
    fwd = rng.integers(1_900_000, 2_300_000, n)  # ~2 ms
    hold = rng.integers(5_000, 20_000, n)
    rev = rng.integers(900_000, 1_200_000, n)  # ~1 ms
    r["t1_ns"] = t1
    r["t2_ns"] = t1 + fwd
    r["t3_ns"] = t1 + fwd + hold
    r["t4_ns"] = t1 + fwd + hold + rev
    return r


def expected_lines(node: str, recs: np.ndarray) -> dict[tuple, dict]:
    """Expected fields per (node, ssid, direction, ts), computed from plain Python ints."""
    out = {}
    t1 = recs["t1_ns"].astype(np.int64)
    for second in np.unique(t1 // NS):
        sel = recs[(t1 // NS) == second]
        sel = sel[np.argsort(sel["sender_seq"])]
        t = {k: [int(x) for x in sel[k]] for k in ("t1_ns", "t2_ns", "t3_ns", "t4_ns")}
        ee = list(zip((int(x) for x in sel["sender_err_est"]), (int(x) for x in sel["reflector_err_est"])))
        synced = [(s, r) for s, r in ee if s & 0x8000 and r & 0x8000]  # RFC 8762 S bit on both sides
        clock = {"unsynchronized": len(ee) - len(synced), "newest_ns": max(t["t1_ns"])}  # TAI = UTC on this host
        if synced:
            err = [
                ee_to_error_ns((s >> 8) & 0x3F, s & 0xFF) + ee_to_error_ns((r >> 8) & 0x3F, r & 0xFF) for s, r in synced
            ]
            clock["error_estimate_max_us"] = max(err) / 1000
        values = {
            "forward": [b - a for a, b in zip(t["t1_ns"], t["t2_ns"])],
            "reverse": [d - c for c, d in zip(t["t3_ns"], t["t4_ns"])],
            "round_trip": [(d - a) - (c - b) for a, b, c, d in zip(t["t1_ns"], t["t2_ns"], t["t3_ns"], t["t4_ns"])],
        }
        for direction, v in values.items():
            p50, p99 = np.percentile(np.array(v), [50, 99])
            out[(node, str(int(sel["ssid"][0])), direction, int(second) * NS)] = {
                "count": len(v),
                "sum_us": sum(v) / 1000,
                "min_us": min(v) / 1000,
                "max_us": max(v) / 1000,
                "mean_us": sum(v) / len(v) / 1000,
                "p50_us": p50 / 1000,
                "p99_us": p99 / 1000,
                "ipdv_mean_us": sum(abs(x - y) for x, y in zip(v[1:], v[:-1])) / (len(v) - 1) / 1000,
                **clock,
            }
    return out


def parse_line(line: str):
    head, fields_s, ts = line.rsplit(" ", 2)
    parts = re.split(r"(?<!\\),", head)  # tag values may hold escaped commas (path)
    tags = {k: v.replace("\\,", ",") for k, v in (p.split("=", 1) for p in parts[1:])}
    fields = {}
    for kv in fields_s.split(","):
        k, v = kv.split("=", 1)
        fields[k] = int(v[:-1]) if v.endswith("i") else float(v)
    return parts[0], tags, fields, int(ts)


@pytest.fixture
def topics(kafka_bootstrap):
    run = uuid.uuid4().hex[:8]
    names = {
        "records": f"test.delay.{run}.records",
        "metrics": f"test.delay.{run}.metrics",
        "deadletter": f"test.delay.{run}.deadletter",
        "app_id": f"test-delay-{run}",
        "paths": f"test.delay.{run}.paths",
        "instance": f"delay-test-{run}",
    }
    ensure_topics(kafka_bootstrap, [names["records"]], partitions=2)  # like segscope.stamp.records
    ensure_topics(kafka_bootstrap, [names["metrics"], names["deadletter"]])
    return names


@pytest.fixture
def worker(kafka_bootstrap, topics, tmp_path):
    log_path = tmp_path / "worker.log"
    env = dict(os.environ, PYTHONPATH=f"{REPO}:{REPO / 'schemas' / 'python'}", SEGSCOPE_INSTANCE=topics["instance"])
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [
                PY,
                "-m",
                "processors.delay",
                "--bootstrap",
                kafka_bootstrap,
                "--records-topic",
                topics["records"],
                "--metrics-topic",
                topics["metrics"],
                "--deadletter-topic",
                topics["deadletter"],
                "--app-id",
                topics["app_id"],
                "--paths-topic",
                topics["paths"],
                "--grace-s",
                "1",
                "--datadir",
                str(tmp_path / "faust"),
                "-l",
                "info",
            ],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    yield proc, log_path
    stop_worker(proc)


def test_worker_aggregates_two_sessions_and_dead_letters_garbage(kafka_bootstrap, topics, worker):
    proc, log_path = worker
    rng = np.random.default_rng(3)
    # T1 two minutes in the past: the worker's wall clock (CLOCK_TAI) closes these seconds
    # once the sessions are idle for the grace period.
    first = time.clock_gettime_ns(time.CLOCK_TAI) // NS - 120
    sessions = {("A", 1): session_records(rng, 1, first, 3, 200), ("B", 2): session_records(rng, 2, first + 1, 3, 150)}
    expected = {}
    for (node, _), recs in sessions.items():
        expected.update(expected_lines(node, recs))

    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": f"{topics['app_id']}-reader",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topics["metrics"], topics["deadletter"]])

    def counters_seen(until) -> dict:
        """Read metrics lines until a segscope_processor line satisfies until(fields)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"worker exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            msg = consumer.poll(0.5)
            if msg is None or msg.error() or msg.topic() != topics["metrics"]:
                continue
            for line in msg.value().decode().split("\n"):
                meas, _, fields, _ = parse_line(line)
                if meas == "segscope_processor" and until(fields):
                    return fields
        pytest.fail(f"no counters line as wanted:\n{log_path.read_text()[-3000:]}")

    # the worker is up (its PathBook read the empty topic); A's path arrives while it runs
    assert counters_seen(lambda f: True)["path_records"] == 0
    path_a = ["fc00:2::e", "fc00:3::d6"]
    paths_producer = Producer({"bootstrap.servers": kafka_bootstrap})
    key, value = path_record.encode(path_record.PathRecord.stamp("A", 1, "sender", path_a, ["fc00:1::e"], 1))
    paths_producer.produce(topics["paths"], key=key, value=value)
    assert paths_producer.flush(30) == 0
    counters_seen(lambda f: f["path_records"] == 1)

    delivered = []
    # lz4 like collectors/stamp_streamer.c: the worker must have the codec
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5, "compression.type": "lz4"})

    def on_delivery(err, msg):
        assert err is None, err
        delivered.append((msg.key(), msg.value(), msg.partition(), msg.offset()))

    batch_seq = 0
    # a valid header announcing 3 records, but the value was cut 10 bytes short
    garbage = encode_batch(session_records(rng, 9, first, 1, 3), "A", 999)[:-10]
    for (node, ssid), recs in sessions.items():
        key = f"{node}/{ssid}".encode()
        for i, chunk in enumerate(np.array_split(recs, 7)):
            batch_seq += 1
            producer.produce(
                topics["records"], key=key, value=encode_batch(chunk, node, batch_seq), on_delivery=on_delivery
            )
            if i == 3:  # a replay of this batch (streamer retry): must be deduplicated
                producer.produce(
                    topics["records"], key=key, value=encode_batch(chunk, node, batch_seq), on_delivery=on_delivery
                )
        producer.produce(topics["records"], key=key, value=garbage, on_delivery=on_delivery)
    assert producer.flush(30) == 0
    n_records = sum(len(r) for r in sessions.values())
    replayed = sum(len(np.array_split(r, 7)[3]) for r in sessions.values())

    got, hists, paths, letters, last_counters, consumer_lag = {}, {}, {}, [], None, {}
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"worker exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            if msg.topic() == topics["deadletter"]:
                letters.append(json.loads(msg.value()))
                continue
            for line in msg.value().decode().split("\n"):
                meas, tags, fields, ts = parse_line(line)
                key = (tags.get("node"), tags.get("ssid"), tags.get("direction"), ts)
                if meas == "stamp_delay":
                    got[key] = fields
                    paths[key] = tags["path"]
                elif meas == "stamp_delay_histogram":
                    hists[key] = (tags["path"], fields)
                elif meas == "segscope_consumer":  # one line per assigned input partition
                    assert tags["processor"] == "delay" and tags["topic"] == topics["records"]
                    assert tags["instance"] == topics["instance"]
                    consumer_lag[int(tags["partition"])] = fields
                else:
                    assert meas == "segscope_processor"
                    assert tags == {"processor": "delay", "instance": topics["instance"]}
                    last_counters = fields
            if (
                len(got) >= len(expected)
                and len(letters) >= 2
                and last_counters
                and last_counters["records_in"] == n_records + replayed
                and last_counters["points_out"] >= len(expected)
                and sum(f["highwater"] for f in consumer_lag.values()) == len(delivered)
                and all(f["lag_messages"] == 0 for f in consumer_lag.values())
            ):
                break
    finally:
        consumer.close()

    assert set(got) == set(expected), log_path.read_text()[-3000:]
    for key, want in expected.items():
        have = got[key]
        assert set(have) == set(want), key
        for field in ("count", "min_us", "max_us", "unsynchronized", "newest_ns"):
            assert have[field] == want[field], (key, field)
        assert have["sum_us"] == pytest.approx(want["sum_us"], rel=1e-15), key  # an exact ns sum / 1000
        # path: A's SID list as published (the inventory tag's value), B never published: unknown
        assert paths[key] == (",".join(path_a) if key[0] == "A" else "unknown"), key
        hist_path, buckets = hists[key]
        assert hist_path == paths[key] and sum(buckets.values()) == want["count"], key
        assert delay_histogram.quantile_us(buckets, 1.0) == pytest.approx(want["max_us"], rel=0.022), key
        for field in ("mean_us", "p50_us", "p99_us", "ipdv_mean_us"):
            assert have[field] == pytest.approx(want[field], rel=1e-9), (key, field)

    # garbage: dead-lettered with reason, original bytes and position, once per session key
    assert len(letters) == 2
    garbage_at = {(k, p, o) for k, v, p, o in delivered if v == garbage}
    for letter in letters:
        assert letter["reason"] == "length_mismatch"
        assert letter["source_topic"] == topics["records"]
        assert base64.b64decode(letter["value_b64"]) == garbage
        assert (base64.b64decode(letter["key_b64"]), letter["partition"], letter["offset"]) in garbage_at

    # consumer lag: both input partitions reported, every message read
    assert sorted(consumer_lag) == [0, 1]
    assert sum(f["highwater"] for f in consumer_lag.values()) == len(delivered)
    assert all(f["lag_messages"] == 0 for f in consumer_lag.values())

    c = last_counters
    assert c["records_in"] == n_records + replayed
    assert c["batches_in"] == 2 * 8
    assert c["malformed_batches"] == 2
    assert c["duplicate_records"] == replayed
    assert c["late_records_dropped"] == 0 and c["negative_delays"] == 0
    assert c["points_out"] == len(expected) == c["histogram_points_out"]
    assert c["path_unknown"] == sum(1 for k in expected if k[0] == "B")
    assert c["path_records"] == 1 and c["path_records_malformed"] == 0
