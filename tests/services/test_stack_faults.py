"""Telegraf SIGKILLed and InfluxDB restarted while points flow: every point lands once.

An isolated stack (its own ports and run dir). A producer writes distinct points to the metrics
topic at 200/s; midway Telegraf is SIGKILLed and brought back by `up`, later InfluxDB is stopped
for 3 s and brought back. Telegraf resumes from its consumer group's committed offsets (a point
written twice overwrites itself: same series and timestamp) and keeps what InfluxDB refused in its
buffer until it answers again. Exact: the measurement ends with every point, none missing."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid

from confluent_kafka import Producer

from segscope_schemas import names
from services.stack import Stack
from tests.isolation import extra_stack

N, RATE = 3000, 200


def test_telegraf_kill_and_influxdb_restart_lose_no_point():
    run_dir, base = extra_stack("sv-faults", slot=4, default_port_base=29800)
    stack = Stack(run_dir=run_dir, port_base=base, fresh=True, quiet=True)
    stack.up()
    run = uuid.uuid4().hex[:8]
    errors: list = []
    try:

        def produce() -> None:
            p = Producer({"bootstrap.servers": stack.kafka_bootstrap, "enable.idempotence": True, "acks": "all"})
            for i in range(N):
                line = f"sv_fault,run={run} seq={i}i {1_700_000_000_000_000_000 + i}"
                p.produce(names.TOPIC_METRICS, line.encode(), on_delivery=lambda e, m: e and errors.append(e))
                p.poll(0)
                time.sleep(1 / RATE)
            assert p.flush(30) == 0

        t = threading.Thread(target=produce)
        t.start()
        time.sleep(4)
        os.kill(stack.read_pid("telegraf"), signal.SIGKILL)
        time.sleep(1)
        Stack(run_dir=run_dir, port_base=base, quiet=True).up()  # brings Telegraf back
        time.sleep(2)
        Stack(run_dir=run_dir, port_base=base, quiet=True).down(only=["influxdb"])
        time.sleep(3)
        Stack(run_dir=run_dir, port_base=base, quiet=True).up()  # InfluxDB back with its data
        t.join()
        assert not errors, errors
        deadline, got = time.monotonic() + 90, 0
        while time.monotonic() < deadline:
            rows = stack.influx_query(f"SELECT count(seq) FROM sv_fault WHERE run = '{run}'")
            got = rows[0]["count"] if rows else 0
            if got >= N:
                break
            time.sleep(1)
        assert got == N
        distinct = stack.influx_query(f"SELECT count(distinct(seq)) FROM sv_fault WHERE run = '{run}'")
        assert distinct[0]["count"] == N
    finally:
        Stack(run_dir=run_dir, port_base=base, quiet=True).down()
