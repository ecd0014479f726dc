"""The delay processor through kill -9: every record sent is counted in InfluxDB exactly once.

A producer sends STAMP records at a steady rate (session clocks = CLOCK_TAI now) to a per-test
records topic; the real worker (`python -m processors.delay`) writes to the stack's metrics topic,
Telegraf to InfluxDB. Midway the worker is SIGKILLed and restarted. The records of the seconds
that were open at the kill were consumed but never published: the restarted worker must replay
them (their offsets were not committed) and emit those seconds again, complete. The check is
exact: per second, InfluxDB's `count` equals the records sent in it, and their sum equals all
records sent.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
from confluent_kafka import Producer

from processors.delay.topics import ensure_topics
from segscope_schemas import names
from segscope_schemas.stamp_record import STAMP_RECORD_DTYPE, encode_batch
from tests.processors.conftest import topic_config

REPO = Path(__file__).resolve().parents[2]
NS = 1_000_000_000
RATE = 200  # records per second, in batches of BATCH
BATCH = 20


def stamp_batch(seq: int, t0: int, batch: int = BATCH, rate: int = RATE) -> np.ndarray:
    """`batch` records of session 1 from sender_seq `seq`, T1 from `t0` at `rate` per second, 3 ms round trip."""
    r = np.zeros(batch, dtype=STAMP_RECORD_DTYPE)
    r["ssid"] = 1
    r["sender_seq"] = np.arange(seq, seq + batch)
    r["t1_ns"] = t0 + np.arange(batch) * (NS // rate)
    r["t2_ns"] = r["t1_ns"] + 2_000_000
    r["t3_ns"] = r["t2_ns"] + 10_000
    r["t4_ns"] = r["t3_ns"] + 1_000_000
    return r


DURATION_S = 16
KILL_AT_S, DOWN_S = 7, 3


def start_worker(
    bootstrap: str, topic: str, deadletter: str, app_id: str, datadir: Path, log: Path, env: dict | None = None
):
    env = dict(os.environ, PYTHONPATH=f"{REPO}:{REPO / 'schemas' / 'python'}", **(env or {}))
    args = [sys.executable, "-m", "processors.delay", "--bootstrap", bootstrap, "--records-topic", topic]
    args += ["--metrics-topic", names.TOPIC_METRICS, "--deadletter-topic", deadletter, "--app-id", app_id]
    args += ["--grace-s", "1", "--retention-s", "5", "--datadir", str(datadir), "-l", "info"]
    with open(log, "a") as f:
        return subprocess.Popen(args, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def wait_consuming(log: Path, since: int, topic: str, timeout: float = 60) -> None:
    """Until the worker says it has the topic's partitions (Faust logs the assignment table)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")[since:]
        if f"| {topic} " in text:
            return
        time.sleep(0.2)
    raise AssertionError(f"worker did not start consuming:\n{log.read_text(errors='replace')[-3000:]}")


def test_delay_processor_survives_kill_9(stack, tmp_path):
    run = uuid.uuid4().hex[:8]
    node, topic, deadletter, app_id = f"crash{run}", f"test.crash.{run}", f"test.crash.{run}.dl", f"crash-{run}"
    ensure_topics(stack.kafka_bootstrap, [topic], partitions=2)
    ensure_topics(stack.kafka_bootstrap, [deadletter])
    log = tmp_path / "worker.log"
    worker = start_worker(stack.kafka_bootstrap, topic, deadletter, app_id, tmp_path / "faust", log)
    sent_per_second: dict[int, int] = {}
    stop = threading.Event()
    errors: list = []

    def produce() -> None:
        p = Producer({"bootstrap.servers": stack.kafka_bootstrap, "enable.idempotence": True, "acks": "all"})
        seq, batch_seq = 0, 0
        t_end = time.monotonic() + DURATION_S
        while time.monotonic() < t_end and not stop.is_set():
            t0 = time.clock_gettime_ns(time.CLOCK_TAI)
            r = stamp_batch(seq, t0)
            seconds, counts = np.unique(r["t1_ns"] // NS, return_counts=True)
            for s, c in zip(seconds.tolist(), counts.tolist()):
                sent_per_second[s] = sent_per_second.get(s, 0) + c
            p.produce(topic, encode_batch(r, node, batch_seq), key=f"{node}/1".encode(),
                      on_delivery=lambda err, msg: err and errors.append(err))  # fmt: skip
            p.poll(0)
            seq += BATCH
            batch_seq += 1
            time.sleep(BATCH / RATE)
        assert p.flush(30) == 0

    try:
        wait_consuming(log, 0, topic)
        producer = threading.Thread(target=produce)
        producer.start()
        time.sleep(KILL_AT_S)
        os.killpg(worker.pid, signal.SIGKILL)  # no flush, no commit of what is open
        worker.wait()
        mark = len(log.read_text(errors="replace"))
        time.sleep(DOWN_S)
        t_restart = time.monotonic()
        worker = start_worker(stack.kafka_bootstrap, topic, deadletter, app_id, tmp_path / "faust", log)
        producer.join()
        assert not errors, errors
        total = sum(sent_per_second.values())
        assert total >= RATE * (DURATION_S - 2), total  # the producer kept its rate
        # every second sent, in InfluxDB with the exact count (idle: the last seconds close after grace)
        query = (
            f"SELECT \"count\" FROM stamp_delay WHERE node = '{node}' AND direction = 'forward' AND time > now() - 10m"
        )
        deadline = time.monotonic() + 90
        got: dict[int, int] = {}
        while time.monotonic() < deadline:
            rows = stack.influx_query(query)
            got = {r["time"] // NS: int(r["count"]) for r in rows}
            if sum(got.values()) == total and len(got) == len(sent_per_second):
                break
            time.sleep(1)
        caught_up_s = time.monotonic() - t_restart
        worker_log = log.read_text(errors="replace")
        assert "Traceback" not in worker_log[mark:], worker_log[mark:][-3000:]
        offset = round((time.clock_gettime_ns(time.CLOCK_TAI) - time.time_ns()) / NS)  # TAI - UTC here
        want = {s - offset: c for s, c in sent_per_second.items()}
        assert got == want, (
            f"per second (UTC) sent vs in InfluxDB differ: missing {sorted(set(want) - set(got))}, "
            f"wrong {[(s, want[s], got[s]) for s in want if s in got and got[s] != want[s]]}"
        )
        # the progress topic keeps the newest value per session/flow only
        assert topic_config(stack.kafka_bootstrap, f"{app_id}.progress", "cleanup.policy") == "compact"
        print(f"\n[crash] {total} records, {len(want)} seconds, all in InfluxDB {caught_up_s:.1f} s after the restart")
    finally:
        stop.set()
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGTERM)
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()
