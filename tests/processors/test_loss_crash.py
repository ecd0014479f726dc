"""The loss processor through kill -9: every block joined from both sides, exact, in InfluxDB.

tx records of blocks go out first, their rx records a few blocks later (as the egress collector
reports at block end + T/2 on another node). The worker is SIGKILLed while blocks wait for their
rx side; the restarted worker must replay their tx records (uncommitted) and join them: every
block in InfluxDB complete, lost = tx - rx exactly, none published incomplete.
"""

from __future__ import annotations

import random
import signal
import subprocess
import time
import uuid

from confluent_kafka import Producer

from processors.delay.topics import ensure_topics
from segscope_schemas import altmark_block as ab
from segscope_schemas import names
from tests.processors.test_loss_app import NS, rec, start_worker

BLOCKS, LAG = 30, 4  # rx of block i is sent with tx of block i + LAG
KILL_AFTER = 14  # blocks sent before the kill


def test_loss_processor_survives_kill_9(stack, tmp_path):
    run = uuid.uuid4().hex[:8]
    topic, dl, app_id = f"test.losscrash.{run}", f"test.losscrash.{run}.dl", f"losscrash-{run}"
    tx, rx = f"ctx{run}", f"crx{run}"
    ensure_topics(stack.kafka_bootstrap, [topic], partitions=2)
    ensure_topics(stack.kafka_bootstrap, [dl])
    rnd = random.Random(run)
    flow = rnd.randrange(1, 0xFFFFF)
    b0 = time.clock_gettime_ns(time.CLOCK_TAI) // NS - 300
    sent_tx = [rnd.randrange(500, 2000) for _ in range(BLOCKS)]
    lost = [rnd.choice([0, 0, 1, 3, 17]) for _ in range(BLOCKS)]
    producer = Producer({"bootstrap.servers": stack.kafka_bootstrap, "enable.idempotence": True, "acks": "all"})
    seq = iter(range(1_000_000))

    def send(node: str, r) -> None:
        producer.produce(topic, key=ab.kafka_key(node, flow), value=ab.encode_batch(r, node, next(seq)))

    def send_block(i: int) -> None:
        if i < BLOCKS:
            send(tx, rec(ab.DIR_TX, b0 + i, sent_tx[i], sent_tx[i] * 100, flow))
        j = i - LAG
        if 0 <= j < BLOCKS:
            got = sent_tx[j] - lost[j]
            send(rx, rec(ab.DIR_RX, b0 + j, got, got * 100, flow))
        producer.flush(10)

    # the worker's timeout (2 s) is longer than the time between a block's tx and rx here (~1 s)
    proc, log = start_worker(stack.kafka_bootstrap, tmp_path, topic, names.TOPIC_METRICS, dl, app_id)
    try:
        for i in range(KILL_AFTER):
            send_block(i)
            time.sleep(0.25)
        time.sleep(1.0)  # the worker has joined what it can and holds the rest
        proc.send_signal(signal.SIGKILL)  # no flush, no commit
        proc.wait()
        for i in range(KILL_AFTER, BLOCKS + LAG):  # the rx sides of the waiting blocks come now
            send_block(i)
        t_restart = time.monotonic()
        (tmp_path / "second").mkdir()
        proc, log = start_worker(stack.kafka_bootstrap, tmp_path / "second", topic, names.TOPIC_METRICS, dl, app_id)
        query = f"SELECT * FROM altmark_loss WHERE tx_node = '{tx}' AND flow = '{flow}'"
        deadline = time.monotonic() + 90
        rows: list[dict] = []
        while time.monotonic() < deadline:
            rows = stack.influx_query(query)
            if len(rows) >= BLOCKS and all(r.get("complete") for r in rows):
                break
            time.sleep(1)
        caught_up_s = time.monotonic() - t_restart
        by_block = {r["time"] // NS: r for r in rows}
        want = {b0 + i - 37: lost[i] for i in range(BLOCKS)}  # points in UTC (the worker's offset: 37)
        assert sorted(by_block) == sorted(want), (len(by_block), len(want))
        assert all(r["complete"] is True and r["reason"] == "ok" for r in rows), [
            (r["time"] // NS, r["reason"]) for r in rows if not r["complete"]
        ]
        assert {t: int(r["lost"]) for t, r in by_block.items()} == want
        print(f"\n[crash] {BLOCKS} blocks, all complete and exact {caught_up_s:.1f} s after the restart")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()  # never left running after the test
                proc.wait()
