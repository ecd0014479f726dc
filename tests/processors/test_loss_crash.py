"""The loss processor through kill -9: every block joined from both sides, exact, in InfluxDB.

tx records of blocks go out first, their rx records a few blocks later (as the egress collector
reports at block end + T/2 on another node). The worker is SIGKILLed while blocks wait for their
rx side; the restarted worker must replay their tx records (uncommitted) and join them: every
block in InfluxDB complete, lost = tx - rx exactly, none published incomplete.
"""

from __future__ import annotations

import random
import signal
import time
import uuid

import numpy as np
from confluent_kafka import Producer

from processors.delay.topics import ensure_topics
from processors.loss.keying import flow_partition
from segscope_schemas import altmark_block as ab
from segscope_schemas import names
from tests.processors.conftest import stop_worker, topic_config
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
        # the loop judged `complete` only: the newest point may still be mid-write with `lost` or
        # `reason` null (InfluxDB 1.x, influxdata/influxdb#8546): the asserts read settled points
        rows = stack.influx_query_settled(query, settle_s=0.5)
        by_block = {r["time"] // NS: r for r in rows}
        want = {b0 + i - 37: lost[i] for i in range(BLOCKS)}  # points in UTC (the worker's offset: 37)
        assert sorted(by_block) == sorted(want), (len(by_block), len(want))
        assert all(r["complete"] is True and r["reason"] == "ok" for r in rows), [
            (r["time"] // NS, r["reason"]) for r in rows if not r["complete"]
        ]
        assert {t: int(r["lost"]) for t, r in by_block.items()} == want
        # the progress topic keeps the newest value per session/flow only
        assert topic_config(stack.kafka_bootstrap, f"{app_id}.progress", "cleanup.policy") == "compact"
        print(f"\n[crash] {BLOCKS} blocks, all complete and exact {caught_up_s:.1f} s after the restart")
    finally:
        stop_worker(proc)


def wait_committed(bootstrap: str, group: str, topic: str, partition: int, offset: int, timeout_s=20) -> None:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if c.committed([TopicPartition(topic, partition)], timeout=5)[0].offset > offset:
                return
            time.sleep(0.1)
    finally:
        c.close()
    raise AssertionError(f"group {group} did not commit {topic}[{partition}]@{offset} within {timeout_s} s")


def wait_consuming(proc, log, partitions: int, timeout_s: float = 60) -> None:
    """Until the worker's health endpoint reports a consumer line for each input partition."""
    import re
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        m = re.search(r"health on http://127.0.0.1:(\d+)/healthz", log.read_text(errors="replace"))
        if m:
            with urllib.request.urlopen(f"http://127.0.0.1:{m.group(1)}/metrics", timeout=3) as r:
                if r.read().decode().count("segscope_consumer_highwater{") >= partitions:
                    return
        time.sleep(0.2)
    raise AssertionError("the worker did not start consuming: " + log.read_text(errors="replace")[-3000:])


def test_replayed_record_of_an_evicted_block_is_not_joined_again(stack, tmp_path):
    """Block F is joined, evicted and its rx message committed; its tx message is acked too but
    stays uncommitted behind an earlier one of block W, still in the joiner. After kill -9 the new
    worker replays F's tx record alone: it must skip it (<app_id>.progress says F is final), not
    wait for an rx side that will never come again and publish F incomplete over its exact point.

        t=0    rx(F)                     partition 1 (offset 0)
        t=4.4  tx(W)                     partition 0 (offset 0): W waits (its rx never comes)
        t=4.5  tx(F)                     partition 0 (offset 1): F complete
        t=5    F evicted (retention 5 s): rx(F) committed on the by-flow topic (offset 0 there; the
               repartition stage put all three in the flow's partition, offsets 0, 1, 2)
        kill -9 before W is evicted (t=9.4), restart: tx(W) and tx(F) are replayed
    """
    run = uuid.uuid4().hex[:8]
    topic, dl, app_id = f"test.lossskip.{run}", f"test.lossskip.{run}.dl", f"lossskip-{run}"
    tx, rx = f"stx{run}", f"srx{run}"
    ensure_topics(stack.kafka_bootstrap, [topic], partitions=2)
    ensure_topics(stack.kafka_bootstrap, [dl])
    flow = random.Random(run).randrange(1, 0xFFFFF)
    b0 = time.clock_gettime_ns(time.CLOCK_TAI) // NS - 300
    f_block, w_block, sent, got = b0, b0 + 1, 1000, 997
    producer = Producer({"bootstrap.servers": stack.kafka_bootstrap, "enable.idempotence": True, "acks": "all"})
    offsets: list[int] = []

    def send(node: str, part: int, r) -> None:
        value = ab.encode_batch(r, node, len(offsets) + 1)
        producer.produce(
            topic,
            key=ab.kafka_key(node, flow),
            value=value,
            partition=part,
            on_delivery=lambda err, msg: offsets.append(msg.offset() if err is None else -1),
        )
        producer.flush(10)

    proc, log = start_worker(stack.kafka_bootstrap, tmp_path, topic, names.TOPIC_METRICS, dl, app_id, 5, 5)
    try:
        wait_consuming(proc, log, partitions=2)
        t0 = time.monotonic()
        send(rx, 1, rec(ab.DIR_RX, f_block, got, got * 100, flow))
        time.sleep(max(0.0, t0 + 4.4 - time.monotonic()))
        send(tx, 0, rec(ab.DIR_TX, w_block, 50, 5000, flow))
        send(tx, 0, rec(ab.DIR_TX, f_block, sent, sent * 100, flow))
        assert offsets == [0, 0, 1], offsets
        by_flow_partition = int(flow_partition(np.array([flow]), 2)[0])
        # F evicted, rx(F) committed on the by-flow topic (the source messages are committed as soon as re-keyed)
        wait_committed(stack.kafka_bootstrap, app_id, f"{topic}.by_flow", by_flow_partition, 0)
        assert time.monotonic() - t0 < 9.0, "too late: W was evicted too, nothing held to replay"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        first = log.read_text(errors="replace")
        (tmp_path / "second").mkdir()
        proc, log = start_worker(
            stack.kafka_bootstrap, tmp_path / "second", topic, names.TOPIC_METRICS, dl, app_id, 5, 5
        )
        query = f"SELECT * FROM altmark_loss WHERE tx_node = '{tx}' AND flow = '{flow}'"
        deadline = time.monotonic() + 60
        rows: dict[int, dict] = {}
        while time.monotonic() < deadline:
            rows = {r["time"] // NS: r for r in stack.influx_query(query)}
            # W (tx only) is published incomplete by the new worker after its timeout: then F's
            # fate is decided too (a re-joined F would time out at the same moment)
            if len(rows) == 2 and not rows.get(w_block - 37, {}).get("complete", True):
                time.sleep(2.0)  # one more flush: an incomplete F would come now
                rows = {r["time"] // NS: r for r in stack.influx_query(query)}
                break
            time.sleep(0.5)
        f_row = rows[f_block - 37]
        assert (f_row["complete"], f_row["reason"], f_row["lost"]) == (True, "ok", sent - got), f_row
        assert rows[w_block - 37]["complete"] is False
        assert "1 flows resume from" in log.read_text(errors="replace"), first[-2000:]
    finally:
        stop_worker(proc)
