"""A loss worker that stalls past the session timeout, without dying, publishes nothing stale.

Two workers of one group. Worker A is stopped (SIGSTOP) right after it took the tx side of a
block, before that block's timeout (1.5 s): it holds blocks that wait for their rx side. The rx
side comes while A is stopped; after the 6 s session timeout the broker drops A and worker B
takes its partitions, replays them and publishes every block joined. Then A runs again
(SIGCONT) with its flush timer overdue. Without processors/worker.py's HeartbeatLease it
published, before its consumer thread learned it had been dropped, its held blocks as
complete=false missing_rx, after B's joined lines, and InfluxDB keeps the last: 113 wrong blocks
in the run that found it. Now A holds its results until a heartbeat or the rebalance answers,
and the last line of every block is the truth. The same lease guards the delay processor's and
the topology leader's writes (one class, processors/worker.py).
"""

from __future__ import annotations

import random
import re
import signal
import time
import uuid

from confluent_kafka import Consumer, Producer

from processors.delay.topics import ensure_topics
from segscope_schemas import altmark_block as ab
from tests.processors.conftest import stop_worker
from tests.processors.test_loss_workers import NS, block_batch, outcomes, start

FLOWS, BLOCKS, PARTITIONS = 30, 8, 3
STALL_S = 9.0  # > the 6 s session timeout (processors/worker.py SESSION_TIMEOUT_S)


def owned_by_flow(log_text: str) -> set[int] | None:
    """The by-flow partitions of the last `rebalance: own` line of a worker's log."""
    owns = re.findall(r"rebalance: own .*?\.by_flow\[([0-9, ]*)\]", log_text)
    return {int(p) for p in owns[-1].split(",")} if owns else None


def test_a_stalled_worker_publishes_nothing_stale(stack, tmp_path):
    bootstrap = stack.kafka_bootstrap
    run = uuid.uuid4().hex[:6]
    rnd = random.Random(run)
    blocks, dl, metrics = f"test.stall.{run}.blocks", f"test.stall.{run}.dl", f"test.stall.{run}.metrics"
    ensure_topics(bootstrap, [blocks], partitions=PARTITIONS)
    ensure_topics(bootstrap, [dl, metrics])
    tx, rx = f"stx{run}", f"srx{run}"
    flows = rnd.sample(range(1, 0xFFFFF), FLOWS)
    b0 = time.clock_gettime_ns(time.CLOCK_TAI) // NS - 300
    sent = {(f, b0 + i): rnd.randrange(100, 5000) for f in flows for i in range(BLOCKS)}
    lost = {k: rnd.choice([0, 1, 7]) for k in sent}
    app_id = f"stall-{run}"
    workers = [start(bootstrap, tmp_path, name, blocks, app_id, metrics, dl) for name in ("a", "b")]
    a, b = workers
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    tail = Consumer({"bootstrap.servers": bootstrap, "group.id": f"stall-read-{run}", "auto.offset.reset": "earliest"})
    tail.subscribe([metrics])
    last: dict[str, str] = {}  # point identity -> fields of the last line published
    stopped = False

    def send(node: str, direction: int, i: int) -> None:
        block = b0 + i
        counts = {f: sent[f, block] - (lost[f, block] if direction == ab.DIR_RX else 0) for f in flows}
        producer.produce(blocks, key=node.encode(), value=block_batch(node, direction, block, counts))
        assert producer.flush(10) == 0

    def read(timeout: float = 0.2) -> None:
        for m in tail.consume(num_messages=1000, timeout=timeout):
            if m.error():
                continue
            for line in m.value().decode().split("\n"):
                if line.startswith("altmark_loss,") and f"tx_node={tx}," in line:
                    head, fields_s, ts = line.rsplit(" ", 2)
                    last[f"{head} {ts}"] = fields_s

    def seen() -> dict[tuple[int, int], tuple]:
        return outcomes(last)

    def log(w: str) -> str:
        return (tmp_path / f"{w}.log").read_text(errors="replace")

    want = {k: ("ok", lost[k]) for k in sent}
    try:
        # both in the group, the three by-flow partitions split between them
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            owns = [owned_by_flow(log(w)) for w in ("a", "b")]
            if all(owns) and owns[0] | owns[1] == set(range(PARTITIONS)) and not owns[0] & owns[1]:
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"the two workers did not share the partitions: see {tmp_path}")
        for i in range(BLOCKS - 1):  # blocks 0 .. BLOCKS-2 joined before the stall
            send(tx, ab.DIR_TX, i)
            send(rx, ab.DIR_RX, i)
        send(tx, ab.DIR_TX, BLOCKS - 1)  # the last block's tx: A holds its blocks of it, waiting for rx
        time.sleep(0.6)  # A ingests it (its timeout is 1.5 s)
        a.send_signal(signal.SIGSTOP)
        stopped = True
        t_stop = time.monotonic()
        send(rx, ab.DIR_RX, BLOCKS - 1)
        # B takes A's partitions after the session timeout and publishes every block joined
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline and seen() != want:
            read()
        assert seen() == want, f"B did not publish the truth while A was stopped: see {tmp_path}"
        time.sleep(max(0.0, STALL_S - (time.monotonic() - t_stop)))
        a.send_signal(signal.SIGCONT)
        stopped = False
        # A runs again: its overdue flush, a heartbeat that says it was dropped, a rebalance
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and log("a").count("rebalance: own") < 2:
            read()
        assert log("a").count("rebalance: own") >= 2, f"A did not rejoin after the stall: see {tmp_path}"
        end = time.monotonic() + 3.0  # flushes of both after the rebalance (0.3 s each)
        while time.monotonic() < end:
            read()
        wrong = {k: v for k, v in seen().items() if want[k] != v}
        assert not wrong, (len(wrong), sorted(wrong.items())[:5], tmp_path)
        # what held A's results back says so: the lease (a flush came before the rebalance) or the
        # reset at the rebalance (it came first: the partitions A kept were emptied)
        held = "results held until the group says this worker is still a member" in log("a")
        reset = "rebalance after a stall: partitions" in log("a") or "moved away" in log("a")
        assert held or reset, tmp_path
        assert a.poll() is None and b.poll() is None
    finally:
        if stopped:
            a.send_signal(signal.SIGCONT)
        for w in workers:
            stop_worker(w)
        tail.close()
