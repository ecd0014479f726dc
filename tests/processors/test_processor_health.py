"""The processors' health endpoint (segscope_schemas/health.py, processors/worker.py):
/healthz /readyz /metrics /status of real workers on real Kafka, and its parts alone.

What a Kubernetes probe or an operator relies on: liveness and readiness tell different things
(a topology worker that cannot reach ArangoDB is alive, not ready, and says why), /metrics has the
same counters the worker publishes on segscope.metrics plus its consumer lag, and a bad or busy
address stops the worker with the variable to fix.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import Producer

from processors.delay.topics import ensure_topics
from segscope_schemas.health import Health, HealthAddressError, parse_address, prometheus_text
from segscope_schemas.stamp_record import STAMP_RECORD_DTYPE, encode_batch
from tests.processors.conftest import stop_worker

REPO = Path(__file__).resolve().parents[2]
NS = 1_000_000_000


# -- the parts ------------------------------------------------------------------------------------
def test_prometheus_text_from_line_protocol():
    lines = [
        "segscope_processor,processor=delay records_in=12i,open_seconds=3i 1700000000000000000",
        r"segscope_consumer,processor=delay,topic=a\,b,partition=0 highwater=40i,lag_messages=0i 1",
        'stamp_delay,node=A mean_us=12.5,path="x y",ok=true 1',
    ]
    text = prometheus_text(lines)
    assert 'segscope_processor_records_in{processor="delay"} 12\n' in text
    assert 'segscope_processor_open_seconds{processor="delay"} 3\n' in text
    assert 'segscope_consumer_highwater{processor="delay",topic="a,b",partition="0"} 40\n' in text
    assert 'stamp_delay_mean_us{node="A"} 12.5\n' in text
    assert "path" not in text and "stamp_delay_ok" not in text  # string and boolean fields skipped
    assert text.count("# TYPE segscope_processor_records_in gauge") == 1


def test_parse_address_names_the_setting():
    assert parse_address("127.0.0.1:9641", "X") == ("127.0.0.1", 9641)
    assert parse_address("[::1]:0", "X") == ("::1", 0)
    assert parse_address("off", "X") is None
    with pytest.raises(HealthAddressError, match=r"SEGSCOPE_DELAY_HEALTH='9641' is not HOST:PORT; fix"):
        parse_address("9641", "SEGSCOPE_DELAY_HEALTH")
    with pytest.raises(HealthAddressError, match="is not HOST:PORT"):
        parse_address("h:99999", "X")


def test_liveness_and_readiness_are_separate():
    h = Health("t", stale_after_s=0.3)
    st = h.state()
    assert st["alive"] and not st["ready"] and st["reason"] == "starting"
    h.ok()
    assert h.state()["ready"]
    h.not_ready("ArangoDB down")
    st = h.state()
    assert st["alive"] and not st["ready"] and st["reason"] == "ArangoDB down"
    h.ok()
    time.sleep(0.4)  # no tick and no success for longer than stale_after_s
    st = h.state()
    assert not st["alive"] and not st["ready"] and st["reason"].startswith("loop has not run for")
    h.tick()
    st = h.state()
    assert st["alive"] and not st["ready"] and st["reason"].startswith("no successful publish for")


# -- real workers ---------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metric(text: str, name: str, **labels) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
        if not labels and line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def spawn(module: str, args: list[str], env_extra: dict[str, str], log_path: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=f"{REPO}:{REPO / 'schemas' / 'python'}", **env_extra)
    with open(log_path, "w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", module, *args, "-l", "info"],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def records(ssid: int, first_second: int, seconds: int, per_second: int) -> np.ndarray:
    n = seconds * per_second
    r = np.zeros(n, dtype=STAMP_RECORD_DTYPE)
    r["ssid"] = ssid
    r["sender_seq"] = np.arange(n)
    t1 = first_second * NS + np.arange(n) * (NS // per_second)
    r["t1_ns"], r["t2_ns"], r["t3_ns"], r["t4_ns"] = t1, t1 + 2_000_000, t1 + 2_010_000, t1 + 3_000_000
    return r


def test_delay_worker_health_metrics_and_consumer_lag(kafka_bootstrap, tmp_path):
    run = uuid.uuid4().hex[:8]
    t = {k: f"test.health.{run}.{k}" for k in ("records", "metrics", "deadletter")}
    ensure_topics(kafka_bootstrap, [t["records"]], partitions=2)
    ensure_topics(kafka_bootstrap, [t["metrics"], t["deadletter"]])
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = spawn(
        "processors.delay",
        [
            "--bootstrap",
            kafka_bootstrap,
            "--records-topic",
            t["records"],
            "--metrics-topic",
            t["metrics"],
            "--deadletter-topic",
            t["deadletter"],
            "--app-id",
            f"test-health-{run}",
            "--grace-s",
            "1",
            "--retention-s",
            "8",
            "--datadir",
            str(tmp_path / "faust"),
        ],
        {"SEGSCOPE_DELAY_HEALTH": f"127.0.0.1:{port}"},
        tmp_path / "worker.log",
    )
    try:
        # produce first: the worker reads a backlog of 2 x 10 messages (200 records each)
        first = time.clock_gettime_ns(time.CLOCK_TAI) // NS - 100
        producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5, "compression.type": "lz4"})
        n_messages = 0
        for node, ssid in (("A", 1), ("B", 2)):
            for i, chunk in enumerate(np.array_split(records(ssid, first, 5, 400), 10)):
                producer.produce(t["records"], key=f"{node}/{ssid}".encode(), value=encode_batch(chunk, node, i + 1))
                n_messages += 1
        assert producer.flush(30) == 0

        deadline = time.monotonic() + 60
        seen_held = None
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            try:
                code, body = get(base + "/metrics")
            except OSError:
                time.sleep(0.2)
                continue
            hw = [metric(body, "segscope_consumer_highwater", partition=p) for p in (0, 1)]
            unacked = metric(body, "segscope_processor_unacked_messages", processor="delay")
            if None not in hw and sum(hw) == n_messages and unacked:
                held = sum(metric(body, "segscope_consumer_uncommitted_messages", partition=p) for p in (0, 1))
                seen_held = (held, unacked)
                break
            time.sleep(0.2)
        assert seen_held is not None, (tmp_path / "worker.log").read_text()[-3000:]
        held, unacked = seen_held
        # the open seconds' messages are held uncommitted (what a restart would replay)
        assert held >= unacked > 0
        assert get(base + "/healthz") == (200, "ok\n")

        # after the retention window every second is final: all acked, committed, nothing behind
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            code, body = get(base + "/metrics")
            held = sum(metric(body, "segscope_consumer_uncommitted_messages", partition=p) or 0 for p in (0, 1))
            if metric(body, "segscope_processor_unacked_messages", processor="delay") == 0 and held == 0:
                break
            time.sleep(0.5)
        assert held == 0, body
        assert metric(body, "segscope_processor_records_in", processor="delay") == 2 * 5 * 400
        assert metric(body, "segscope_processor_open_seconds", processor="delay") == 0
        assert all(metric(body, "segscope_consumer_lag_messages", partition=p) == 0 for p in (0, 1))
        assert metric(body, "segscope_up", process="processor-delay") == 1
        assert get(base + "/readyz") == (200, "ready\n")
        code, status = get(base + "/status")
        assert code == 200 and '"ready": true' in status
        assert get(base + "/nothing")[0] == 404
    finally:
        stop_worker(proc)
    assert proc.returncode == 0, (tmp_path / "worker.log").read_text()[-3000:]


def test_topology_worker_alive_but_not_ready_without_arangodb(kafka_bootstrap, tmp_path):
    port = free_port()
    run = uuid.uuid4().hex[:8]
    closed = free_port()  # nothing listens there
    proc = spawn(
        "processors.topology",
        [
            "--bootstrap",
            kafka_bootstrap,
            "--topology-topic",
            f"test.health.{run}.topology",
            "--metrics-topic",
            f"test.health.{run}.metrics",
            "--deadletter-topic",
            f"test.health.{run}.deadletter",
            "--app-id",
            f"test-health-topo-{run}",
            "--arango-url",
            f"http://127.0.0.1:{closed}",
            "--datadir",
            str(tmp_path / "faust"),
        ],
        {"SEGSCOPE_TOPOLOGY_HEALTH": f"127.0.0.1:{port}", "SEGSCOPE_ARANGO_PASSWORD": "x"},
        tmp_path / "worker.log",
    )
    try:
        deadline = time.monotonic() + 60
        ready = None
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            try:
                ready = get(f"http://127.0.0.1:{port}/readyz")
            except OSError:
                time.sleep(0.3)
                continue
            if "ArangoDB" in ready[1]:
                break
            time.sleep(0.3)
        # the reason names ArangoDB and the connection failure (basic auth connects lazily: the write fails)
        assert ready is not None and ready[0] == 503, ready
        assert "ArangoDB write failed" in ready[1] and "connect" in ready[1], ready
        assert get(f"http://127.0.0.1:{port}/healthz") == (200, "ok\n")
        code, body = get(f"http://127.0.0.1:{port}/metrics")
        assert metric(body, "segscope_up", process="processor-topology") == 0
    finally:
        stop_worker(proc)


def test_busy_or_bad_health_address_stops_the_worker_with_the_fix(kafka_bootstrap, tmp_path):
    bad = subprocess.run(
        [sys.executable, "-m", "processors.delay", "--bootstrap", kafka_bootstrap],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=f"{REPO}:{REPO / 'schemas' / 'python'}", SEGSCOPE_DELAY_HEALTH="9641"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2
    assert "SEGSCOPE_DELAY_HEALTH='9641' is not HOST:PORT; fix" in bad.stderr

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        run = uuid.uuid4().hex[:8]
        proc = spawn(
            "processors.delay",
            [
                "--bootstrap",
                kafka_bootstrap,
                "--records-topic",
                f"test.health.{run}.records",
                "--app-id",
                f"test-health-busy-{run}",
                "--datadir",
                str(tmp_path / "faust"),
            ],
            {"SEGSCOPE_DELAY_HEALTH": f"127.0.0.1:{port}"},
            tmp_path / "worker.log",
        )
        try:
            proc.wait(timeout=60)
        finally:
            stop_worker(proc)
    log = (tmp_path / "worker.log").read_text()
    assert proc.returncode != 0, log[-3000:]
    assert f"SEGSCOPE_DELAY_HEALTH=127.0.0.1:{port}: cannot listen" in log, log[-3000:]
