"""The delay processor through a stall past the session timeout: SIGSTOP, SIGCONT, nothing lost,
nothing counted twice.

A loaded machine or a paused VM stops a worker without killing it. Records keep flowing; the
worker is stopped (SIGSTOP) for STALL_S, longer than the 6 s session timeout, so the broker drops
it from the group (and, with two workers, the other one takes its partitions); then it runs again
(SIGCONT), learns it was dropped, and rejoins. Once, on resume, Faust/aiokafka raised
KeyError(TopicPartition(...)) during that rejoin and the worker died. Here the worker must keep
running, write no traceback, and per second InfluxDB's `count` must equal the records sent in it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid

import numpy as np
import pytest
from confluent_kafka import Producer

from processors.delay.topics import ensure_topics
from segscope_schemas.stamp_record import encode_batch
from tests.processors.test_delay_crash import NS, stamp_batch, start_worker, wait_consuming

RATE, BATCH = 200, 20  # records per second, in batches of BATCH
DURATION_S = 30
STOP_AT_S, STALL_S = 5, 12  # > the 6 s session timeout (processors/worker.py SESSION_TIMEOUT_S)
NODES = 4  # keys on both partitions


def produce(bootstrap: str, topic: str, run: str, sent: dict, errors: list, stop: threading.Event) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    seq, batch_seq = 0, 0
    t_end = time.monotonic() + DURATION_S
    while time.monotonic() < t_end and not stop.is_set():
        for n in range(NODES):
            node = f"stall{run}n{n}"
            t0 = time.clock_gettime_ns(time.CLOCK_TAI)
            r = stamp_batch(seq, t0, BATCH, RATE)
            seconds, counts = np.unique(r["t1_ns"] // NS, return_counts=True)
            for s, c in zip(seconds.tolist(), counts.tolist()):
                sent[node, s] = sent.get((node, s), 0) + c
            p.produce(topic, encode_batch(r, node, batch_seq), key=f"{node}/1".encode(),
                      on_delivery=lambda err, msg: err and errors.append(err))  # fmt: skip
        p.poll(0)
        seq += BATCH
        batch_seq += 1
        time.sleep(BATCH / RATE)
    assert p.flush(30) == 0


def stop_all(workers: list) -> None:
    for w in workers:
        if w.poll() is None:
            os.killpg(w.pid, signal.SIGCONT)
            os.killpg(w.pid, signal.SIGTERM)
            try:
                w.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(w.pid, signal.SIGKILL)
                w.wait()


@pytest.mark.parametrize("workers_n", [1, 2], ids=["alone", "one-of-two"])
def test_delay_processor_survives_a_stall(stack, tmp_path, workers_n):
    run = uuid.uuid4().hex[:8]
    topic, deadletter, app_id = f"test.stall.{run}", f"test.stall.{run}.dl", f"stall-{run}"
    ensure_topics(stack.kafka_bootstrap, [topic], partitions=2)
    ensure_topics(stack.kafka_bootstrap, [deadletter])
    logs = [tmp_path / f"worker{i}.log" for i in range(workers_n)]
    workers = [start_worker(stack.kafka_bootstrap, topic, deadletter, app_id, tmp_path / f"faust{i}", log)
               for i, log in enumerate(logs)]  # fmt: skip
    sent: dict[tuple[str, int], int] = {}
    errors: list = []
    stop = threading.Event()
    stalled = workers[0]
    try:
        for log in logs:
            wait_consuming(log, 0, topic)
        producer = threading.Thread(target=produce, args=(stack.kafka_bootstrap, topic, run, sent, errors, stop))
        producer.start()
        time.sleep(STOP_AT_S)
        os.killpg(stalled.pid, signal.SIGSTOP)
        time.sleep(STALL_S)
        os.killpg(stalled.pid, signal.SIGCONT)
        producer.join()
        assert not errors, errors
        total = sum(sent.values())
        assert total >= NODES * RATE * (DURATION_S - 4), total
        query = f"SELECT \"count\", node FROM stamp_delay WHERE node =~ /^stall{run}n/ AND direction = 'forward'"
        query += " AND time > now() - 10m"
        offset = round((time.clock_gettime_ns(time.CLOCK_TAI) - time.time_ns()) / NS)  # TAI - UTC here
        want = {(node, s - offset): c for (node, s), c in sent.items()}
        got: dict = {}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            got = {(r["node"], r["time"] // NS): int(r["count"]) for r in stack.influx_query(query)}
            if got == want:
                break
            time.sleep(1)
        texts = [log.read_text(errors="replace") for log in logs]
        for w, text in zip(workers, texts):
            assert w.poll() is None, f"a worker died after the stall:\n{text[-4000:]}"
            assert "Traceback" not in text, text[-4000:]
        assert texts[0].count("rebalance: own") >= 2, f"the stalled worker did not rejoin: {tmp_path}"
        assert got == want, (
            f"per node and second (UTC) sent vs in InfluxDB differ: missing {sorted(set(want) - set(got))[:5]}, "
            f"extra {sorted(set(got) - set(want))[:5]}, "
            f"wrong {[(k, want[k], got[k]) for k in want if k in got and got[k] != want[k]][:5]}"
        )
        print(f"\n[stall] {workers_n} worker(s), {total} records, {len(want)} node-seconds, each counted once")
    finally:
        stop.set()
        stop_all(workers)
