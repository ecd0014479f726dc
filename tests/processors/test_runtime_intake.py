"""processors/runtime/intake.py on real Kafka: the delay worker (`python -m processors.delay`) takes a
backlog of small messages in batches, counts every record once and commits to the end.

3000 messages of 20 records (two sessions, 15 s of data an hour old) are in the topic before the
worker starts. With Faust's per-event path every message was its own hand-over and ack; the intake
hands the processor one batch per fetch: `input_batches` on the worker's counters line is a
small fraction of `batches_in`. The results stay exact (every second's point, each record once) and
the group's committed offset reaches the end of the topic (batches acked whole, ExactCommits)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
from confluent_kafka import Consumer, Producer, TopicPartition

from processors.delay.topics import ensure_topics
from segscope_schemas.stamp_record import STAMP_RECORD_DTYPE, encode_batch
from tests.processors.conftest import stop_worker

REPO = Path(__file__).resolve().parents[2]
NS = 1_000_000_000
MESSAGES, PER_MESSAGE, SESSIONS = 3000, 20, 2


def messages(first_second: int) -> list[tuple[bytes, bytes]]:
    """MESSAGES messages alternating between the sessions, 2000 records per session-second."""
    out = []
    per_session = MESSAGES // SESSIONS * PER_MESSAGE
    for i in range(MESSAGES):
        ssid = i % SESSIONS + 1
        seq = np.arange(PER_MESSAGE) + (i // SESSIONS) * PER_MESSAGE
        r = np.zeros(PER_MESSAGE, dtype=STAMP_RECORD_DTYPE)
        r["ssid"], r["sender_seq"] = ssid, seq
        r["t1_ns"] = first_second * NS + seq * (15 * NS // per_session)
        r["t2_ns"] = r["t1_ns"] + 2_000_000
        r["t3_ns"] = r["t2_ns"] + 10_000
        r["t4_ns"] = r["t3_ns"] + 1_000_000
        out.append((f"intake/{ssid}".encode(), encode_batch(r, "intake", i)))
    return out


def counters(line: str) -> dict[str, int]:
    body = line.rsplit(" ", 2)[1]
    return {k: int(v[:-1]) for k, v in (kv.split("=", 1) for kv in body.split(",")) if v.endswith("i")}


def test_a_backlog_of_small_messages_is_taken_in_batches_counted_once_and_committed(stack, tmp_path):
    bootstrap = stack.kafka_bootstrap
    run = uuid.uuid4().hex[:6]
    records, metrics, dead = f"test.intake.{run}.records", f"test.intake.{run}.metrics", f"test.intake.{run}.dl"
    ensure_topics(bootstrap, [records, metrics, dead])
    first = time.clock_gettime_ns(time.CLOCK_TAI) // NS - 3600
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "compression.type": "lz4"})
    for key, value in messages(first):
        producer.produce(records, key=key, value=value)
        producer.poll(0)
    assert producer.flush(30) == 0
    app_id = f"test-intake-{run}"
    env = dict(os.environ, PYTHONPATH=f"{REPO}:{REPO / 'schemas' / 'python'}", SEGSCOPE_DELAY_HEALTH="127.0.0.1:0")
    argv = [sys.executable, "-m", "processors.delay", "--bootstrap", bootstrap, "--records-topic", records]
    argv += ["--metrics-topic", metrics, "--deadletter-topic", dead, "--app-id", app_id]
    argv += ["--datadir", str(tmp_path / "faust"), "--retention-s", "3", "--tai-utc-offset-s", "0", "-l", "info"]
    with open(tmp_path / "w.log", "w") as log:
        worker = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{run}", "auto.offset.reset": "earliest"})
    reader.subscribe([metrics])
    group = Consumer({"bootstrap.servers": bootstrap, "group.id": app_id})
    points: dict[tuple[str, str], int] = {}
    last: dict[str, int] = {}
    committed = None
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            assert worker.poll() is None, (tmp_path / "w.log").read_text()[-3000:]
            for m in reader.consume(num_messages=500, timeout=0.5):
                if m.error():
                    continue
                for line in m.value().decode().split("\n"):
                    if line.startswith("stamp_delay,"):
                        head, fields, ts = line.rsplit(" ", 2)
                        points[(head, ts)] = int(fields.split("count=", 1)[1].split("i", 1)[0])
                    elif line.startswith("segscope_processor,"):
                        last = counters(line)
            if last.get("batches_in") == MESSAGES and len(points) == 3 * SESSIONS * 15:
                committed = group.committed([TopicPartition(records, 0)], timeout=10)[0].offset
                if committed == MESSAGES:
                    break
        assert last["batches_in"] == MESSAGES and last["records_in"] == MESSAGES * PER_MESSAGE, last
        # every second of both sessions, each record once (per direction the counts add up)
        assert len(points) == 3 * SESSIONS * 15
        for direction in ("forward", "reverse", "round_trip"):
            assert sum(c for (head, _), c in points.items() if head.endswith(direction)) == MESSAGES * PER_MESSAGE
        assert last["duplicate_records"] == 0 and last["processing_errors"] == 0, last
        # taken in batches: per-event hand-over would be one batch per message
        assert 1 <= last["input_batches"] <= MESSAGES // 30, last
        assert committed == MESSAGES  # acked by the batch, committed to the end
    finally:
        reader.close()
        group.close()
        stop_worker(worker)
