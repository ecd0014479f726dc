"""The local service stack for real: Kafka -> Telegraf -> InfluxDB, and start/stop of a second stack.

Every test publishes under its own measurement name (with a per-run tag), so the tests don't see
each other's points even on a stack that other tests also use.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from services.stack import METRICS_TOPIC, SERVICE_NAMES, TELEGRAF_GROUP, TOPIC_PARTITIONS, Stack, port_open
from tests.isolation import extra_stack

REPO = Path(__file__).resolve().parents[2]
POINT_WAIT = 30.0  # s; Telegraf flushes every second, typically seen in 1-3 s
# a second, isolated stack (tests/isolation.py slot 3; 29600 and .run/sv-test-isolated in a lone run)
ISOLATED_RUN_DIR, ISOLATED_PORT_BASE = extra_stack("sv-test-isolated", slot=3, default_port_base=29600)
if os.environ.get("SEGSCOPE_TEST_SERVICES_PORT_BASE"):
    ISOLATED_PORT_BASE = int(os.environ["SEGSCOPE_TEST_SERVICES_PORT_BASE"])


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    """Publish each value as its own message, in order, and fail unless all were acknowledged."""
    errors: list[str] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    for value in values:
        producer.produce(topic, value, on_delivery=lambda err, msg: errors.append(str(err)) if err else None)
    assert producer.flush(15) == 0, "messages still queued after 15 s"
    assert errors == []


def wait_rows(stack: Stack, query: str, count: int, timeout: float = POINT_WAIT) -> tuple[list[dict], float]:
    """Poll InfluxQL until it returns at least `count` rows; returns the rows and the wait."""
    t0 = time.monotonic()
    rows: list[dict] = []
    while time.monotonic() - t0 < timeout:
        rows = stack.influx_query(query)
        if len(rows) >= count:
            return rows, time.monotonic() - t0
        time.sleep(0.2)
    return rows, time.monotonic() - t0


def kafka_consumer_errors(stack: Stack, before_ns: int | None = None) -> tuple[int, int]:
    """(time, errors) of Telegraf's newest internal_gather sample for kafka_consumer ((0, 0) if none)."""
    where = "input = 'kafka_consumer'" + (f" AND time <= {before_ns}" if before_ns else "")
    rows = stack.influx_query(f"SELECT last(errors) FROM internal_gather WHERE {where}")
    return (rows[0]["time"], rows[0]["last"]) if rows else (0, 0)


def test_stack_is_ready(stack: Stack, capsys) -> None:
    status = stack.status()
    for name in SERVICE_NAMES:
        assert status[name]["alive"] and status[name]["ready"], (name, status[name])
    # The consumer group Telegraf joined is on the metrics topic.
    with capsys.disabled():
        print(f"\n[timing] session stack up: {stack.last_up_seconds:.1f} s")
    cli = subprocess.run(
        [str(REPO / ".local/venv/bin/python"), "-m", "services.stack", "status", "--run-dir", str(stack.run_dir)]
        + (["--port-base", str(stack.port_base)] if stack.port_base is not None else []),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 0, cli.stderr
    cli_status = json.loads(cli.stdout)
    assert {n: cli_status[n]["pid"] for n in SERVICE_NAMES} == {n: status[n]["pid"] for n in SERVICE_NAMES}
    assert cli_status["telegraf"]["consumer_group"] == TELEGRAF_GROUP


def test_up_again_reuses_running_services(stack: Stack) -> None:
    pids = {n: stack.read_pid(n) for n in SERVICE_NAMES}
    again = Stack(run_dir=stack.run_dir, port_base=stack.port_base, quiet=True)
    again.up()
    assert again.started == set()
    assert {n: again.read_pid(n) for n in SERVICE_NAMES} == pids
    assert again.last_up_seconds < 15


def test_topics_exist_with_their_partition_counts(stack: Stack) -> None:
    from confluent_kafka.admin import AdminClient

    topics = AdminClient({"bootstrap.servers": stack.kafka_bootstrap}).list_topics(timeout=10).topics
    assert {name: len(topics[name].partitions) for name in TOPIC_PARTITIONS} == TOPIC_PARTITIONS


def test_metrics_on_kafka_land_in_influxdb(stack: Stack, capsys) -> None:
    run = uuid.uuid4().hex[:8]
    t = time.time_ns()
    first = f"sv_stack_probe,run={run},node=A,ssid=1 count=10i,mean_us=123.5 {t}"
    second = f"sv_stack_probe,run={run},node=B,ssid=2 count=20i,mean_us=7.25 {t + 1000}"
    produce(stack.kafka_bootstrap, METRICS_TOPIC, [first.encode(), second.encode()])

    query = f"SELECT * FROM sv_stack_probe WHERE run = '{run}'"
    _, waited = wait_rows(stack, query, 2)
    with capsys.disabled():
        print(f"\n[timing] Kafka -> Telegraf -> InfluxDB: 2 points visible after {waited:.2f} s")
    # two rows are there once a field of each is: the other may still be mid-write (InfluxDB 1.x)
    rows = stack.influx_query_settled(query, settle_s=0.5)
    assert rows == [
        {"time": t, "count": 10, "mean_us": 123.5, "node": "A", "run": run, "ssid": "1"},
        {"time": t + 1000, "count": 20, "mean_us": 7.25, "node": "B", "run": run, "ssid": "2"},
    ]
    time.sleep(1.5)  # one more flush: nothing else may show up (no duplicates, no host tag)
    assert stack.influx_query(query) == rows


def test_malformed_message_is_counted_and_does_not_block_later_ones(stack: Stack) -> None:
    run = uuid.uuid4().hex[:8]
    t = time.time_ns()
    _, errors_before = kafka_consumer_errors(stack, before_ns=time.time_ns())
    produce(
        stack.kafka_bootstrap,
        METRICS_TOPIC,
        [
            f"sv_stack_bad,run={run},seq=1 v=1i {t}".encode(),
            b"bad line no fields",
            # One bad line makes Telegraf drop its whole message, good lines included.
            f"sv_stack_bad,run={run},seq=2 v=2i {t + 1}\nsv_stack_bad,run={run} this is not line protocol".encode(),
            f"sv_stack_bad,run={run},seq=3 v=3i {t + 2}".encode(),
        ],
    )
    rows, _ = wait_rows(stack, f"SELECT * FROM sv_stack_bad WHERE run = '{run}'", 2)
    assert [(r["seq"], r["v"]) for r in rows] == [("1", 1), ("3", 3)]

    # Telegraf's own counter (inputs.internal, every 5 s) shows both rejected messages.
    after_ns = time.time_ns()
    deadline = time.monotonic() + 20
    while True:
        sample_time, errors_after = kafka_consumer_errors(stack)
        if sample_time > after_ns and errors_after - errors_before >= 2:
            break
        assert time.monotonic() < deadline, (
            f"internal_gather errors went {errors_before} -> {errors_after} (sample at {sample_time})"
        )
        time.sleep(0.5)
    assert errors_after - errors_before == 2


def test_influx_write_and_query_helpers(stack: Stack) -> None:
    run = uuid.uuid4().hex[:8]
    stack.influx_write([f"sv_stack_direct,run={run} a=1i,b=\"x\" 1000", f"sv_stack_direct,run={run} a=2i 2000"])
    rows = stack.influx_query(f"SELECT sum(a) FROM sv_stack_direct WHERE run = '{run}' GROUP BY run")
    assert rows == [{"time": 0, "sum": 3, "run": run}]
    with pytest.raises(Exception, match="400"):
        stack.influx_write("sv_stack_direct no_fields_here")


def test_settled_query_returns_only_points_that_were_there_before(stack: Stack) -> None:
    """influx_query_settled re-reads the rows of its first query after the settle time: a point
    written during the settle time is left out (it may be mid-write), an earlier one is returned
    with the fields it has on the second read."""
    run = uuid.uuid4().hex[:8]
    stack.influx_write(f"sv_settled,run={run} a=1i,b=2i 1000")
    later = threading.Timer(0.3, stack.influx_write, args=(f"sv_settled,run={run} a=3i,b=4i 2000",))
    later.start()
    rows = stack.influx_query_settled(f"SELECT * FROM sv_settled WHERE run = '{run}'", settle_s=1.0)
    later.join()
    assert rows == [{"time": 1000, "a": 1, "b": 2, "run": run}]
    assert len(stack.influx_query(f"SELECT * FROM sv_settled WHERE run = '{run}'")) == 2  # the later one is in


def _pids_gone(pids: dict[str, int]) -> dict[str, str]:
    """Which of the PIDs still exist in /proc (with their state letter)."""
    alive = {}
    for name, pid in pids.items():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            alive[name] = stat.rsplit(")", 1)[1].split()[0]
        except OSError:
            pass
    return alive


def test_isolated_second_stack_up_down(stack: Stack, capsys) -> None:
    base = ISOLATED_PORT_BASE
    ports = [base, base + 1, base + 2, base + 3]
    busy = [p for p in ports if port_open(p)]
    assert not busy, f"ports {busy} in use; set SEGSCOPE_TEST_SERVICES_PORT_BASE"
    run_dir = ISOLATED_RUN_DIR
    default_pids = {n: stack.read_pid(n) for n in SERVICE_NAMES}
    other = Stack(run_dir=run_dir, port_base=base, fresh=True)
    assert other.kafka_bootstrap == f"127.0.0.1:{base}"
    assert other.influx_url == f"http://127.0.0.1:{base + 2}"
    with other:  # up() ... down()
        up_s = other.last_up_seconds
        pids = {n: other.read_pid(n) for n in SERVICE_NAMES}
        assert all(pids.values()) and not set(pids.values()) & set(default_pids.values())
        assert port_open(base) and port_open(base + 2)

        # Its own pipeline: a point on its Kafka lands in its InfluxDB only.
        run = uuid.uuid4().hex[:8]
        produce(other.kafka_bootstrap, METRICS_TOPIC, [f"sv_stack_iso,run={run} v=1i 1000".encode()])
        rows, _ = wait_rows(other, f"SELECT * FROM sv_stack_iso WHERE run = '{run}'", 1)
        assert rows == [{"time": 1000, "v": 1, "run": run}]
        assert stack.influx_query(f"SELECT * FROM sv_stack_iso WHERE run = '{run}'") == []
    down_s = other.last_down_seconds

    assert _pids_gone(pids) == {}, "processes left after down"
    assert not any(other.pid_path(n).exists() for n in SERVICE_NAMES)
    assert not any(port_open(p) for p in ports)
    assert all(not s["alive"] for n, s in other.status().items())
    # The session stack was not touched.
    assert {n: stack.running_pid(n) for n in SERVICE_NAMES} == default_pids

    # Up from stopped keeps Kafka's data: the metrics topic still holds the one message; so does a
    # Kafka that was SIGKILLed (log recovery), and `status` says ready only with usable topics.
    def metrics_offsets(s: Stack) -> tuple[int, int]:
        consumer = Consumer({"bootstrap.servers": s.kafka_bootstrap, "group.id": "sv-check"})
        try:
            return consumer.get_watermark_offsets(TopicPartition(METRICS_TOPIC, 0), timeout=10)
        finally:
            consumer.close()

    kafka_only = Stack(run_dir=run_dir, port_base=base)
    try:
        kafka_only.up(only=["kafka"])
        assert metrics_offsets(kafka_only) == (0, 1)
        os.kill(kafka_only.read_pid("kafka"), signal.SIGKILL)
        crashed = Stack(run_dir=run_dir, port_base=base, quiet=True)
        deadline = time.monotonic() + 10  # a JVM's threads take a moment to exit after SIGKILL
        while crashed.status()["kafka"]["alive"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert crashed.status()["kafka"]["alive"] is False
        crashed.up(only=["kafka"])  # after a crash
        assert metrics_offsets(crashed) == (0, 1)
        status = crashed.status()["kafka"]
        assert status["ready"] and "topics_unusable" not in status
        crashed.down()
        wiped = Stack(run_dir=run_dir, port_base=base, fresh=True)  # --fresh
        wiped.up(only=["kafka"])
        kafka_only_pid = wiped.read_pid("kafka")
        assert metrics_offsets(wiped) == (0, 0)
        wiped.down()  # its own child: reaped here
        kafka_only.down()  # reaps the SIGKILLed one
    finally:
        Stack(run_dir=run_dir, port_base=base, quiet=True).down()
    assert _pids_gone({"kafka": kafka_only_pid}) == {}
    other.down()  # down when nothing runs is fine
    with capsys.disabled():
        print(
            f"\n[timing] isolated stack: up {up_s:.1f} s, down {down_s:.1f} s; "
            f"kafka-only up with its data {kafka_only.last_up_seconds:.1f} s, "
            f"after kill -9 {crashed.last_up_seconds:.1f} s, fresh {wiped.last_up_seconds:.1f} s"
        )
