"""N loss workers in one consumer group give the same altmark_loss points as one worker.

One input, streamed block by block into a 3-partition topic the way collectors with
--group-flows send it (one message per node and block, key = node, so every flow's tx and rx
records are in different messages and often in different partitions). Three consumer groups read
it at the same time, each with its own by-flow topic (3 partitions) and its own metrics topic:
one worker, two workers, and three workers of which one is killed with SIGKILL mid-stream and
replaced (the group rebalances after the session timeout; the replacement and the survivors
replay what was not committed). For every point identity (measurement, tags,
timestamp) the last line each group published must be identical, all fields, to the one-worker
group's; and the one-worker group's must be the truth (lost = tx - rx for joined blocks,
complete=false missing_rx for the rx records never sent).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
from confluent_kafka import Consumer, Producer

from processors.delay.topics import ensure_topics
from segscope_schemas import altmark_block as ab
from tests.processors.conftest import stop_worker

REPO = Path(__file__).resolve().parents[2]
NS = 1_000_000_000
FLOWS, BLOCKS, PARTITIONS = 40, 10, 3
# A full run beside other work (load 12-16) once left one block missing_rx in the killed group at the
# old 60 s: the kill, the 6 s session timeout, the replacement's start and the rebalance all
# stretch on a loaded 2-core runner. Both bounds only wait longer; the points must still be exact.
RETENTION_S = 150.0  # a block stays open this long (active time) for a late side
RESULTS_WITHIN_S = 150.0
TAI_UTC = 37


def start(
    bootstrap: str,
    tmp: Path,
    name: str,
    blocks: str,
    app_id: str,
    metrics: str,
    dl: str,
    retention_s: float = 60,
    module: str = "processors.loss",
    env: dict | None = None,
) -> subprocess.Popen:
    """A loss worker (`module`: processors.loss, or a test wrapper taking its flags) logging to tmp/<name>.log."""
    env = dict(os.environ, PYTHONPATH=f"{REPO}:{REPO / 'schemas' / 'python'}", **(env or {}))
    with open(tmp / f"{name}.log", "w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", module, "--bootstrap", bootstrap, "--blocks-topic", blocks]
            + ["--by-flow-topic", f"{app_id}.by_flow", "--by-flow-partitions", str(PARTITIONS)]
            + ["--metrics-topic", metrics, "--deadletter-topic", dl, "--app-id", app_id]
            # retention well above kill -> rebalance done (the 6 s session timeout + the rebalance, longer on a
            # loaded CI machine): an rx record the rebalance held back must find its block still open, not
            # evicted (then it is rightly dropped as late and counted, and the block stays missing_rx: a
            # failure of this test with retention 6 s, not a loss)
            + ["--timeout-s", "1.5", "--retention-s", str(retention_s), "--flush-interval-s", "0.3"]
            + ["--tai-utc-offset-s", str(TAI_UTC), "--datadir", str(tmp / name), "-l", "info"],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def worker_warnings(tmp: Path, group: str) -> list[str]:
    """The warnings and errors a group's workers logged (what a failed join needs explained: a
    rebalance, a record dropped as late, a held publication), the last 20."""
    lines = []
    for log in sorted(tmp.glob(f"{group}*.log")):
        lines += [
            f"{log.stem}: {line}"
            for line in log.read_text(errors="replace").splitlines()
            if "WARN" in line or "ERROR" in line
        ]
    return lines[-20:]


def outcomes(last: dict[str, str], tx_node: str | None = None) -> dict[tuple[int, int], tuple]:
    """(flow, block) -> ("ok", lost) or (reason,), from the last altmark_loss line of each point
    (identity "head timestamp" -> fields); only the points of tx_node's blocks if given."""
    out = {}
    for ident, fields_s in last.items():
        if tx_node is not None and f"tx_node={tx_node}," not in ident:
            continue
        flow = int(ident.split(",flow=", 1)[1].split(",", 1)[0])
        block = int(ident.rsplit(" ", 1)[1]) // NS + TAI_UTC
        f = dict(kv.split("=", 1) for kv in fields_s.split(","))
        out[flow, block] = ("ok", int(f["lost"][:-1])) if f["reason"] == '"ok"' else (f["reason"].strip('"'),)
    return out


def block_batch(node: str, direction: int, block: int, counts: dict[int, int]) -> bytes:
    r = np.zeros(len(counts), dtype=ab.ALTMARK_BLOCK_DTYPE)
    r["flow_id"] = list(counts)
    r["packets"] = list(counts.values())
    r["bytes"] = r["packets"] * 100
    r["block_index"], r["block_start_ns"], r["colour"] = block, block * NS, block & 1
    r["period_ms"], r["direction"], r["method"], r["boot_id"] = 1000, direction, ab.METHOD_DSCP, 1
    return ab.encode_batch(r, node, block)


def test_two_and_three_workers_and_a_kill_give_the_one_worker_points(stack, tmp_path):
    bootstrap = stack.kafka_bootstrap
    run = uuid.uuid4().hex[:6]
    rnd = random.Random(run)
    blocks, dl = f"test.lossn.{run}.blocks", f"test.lossn.{run}.dl"
    ensure_topics(bootstrap, [blocks], partitions=PARTITIONS)
    groups = {"one": 1, "two": 2, "three": 3}
    metrics = {g: f"test.lossn.{run}.metrics.{g}" for g in groups}
    ensure_topics(bootstrap, [dl, *metrics.values()])
    tx, rx = f"ntx{run}", f"nrx{run}"
    flows = rnd.sample(range(1, 0xFFFFF), FLOWS)
    b0 = time.clock_gettime_ns(time.CLOCK_TAI) // NS - 300
    sent = {(f, b0 + i): rnd.randrange(100, 5000) for f in flows for i in range(BLOCKS)}
    lost = {k: rnd.choice([0, 0, 1, 7]) for k in sent}
    no_rx = set(rnd.sample(sorted(sent), 12))  # their rx never comes: complete=false missing_rx

    workers: dict[str, list[subprocess.Popen]] = {}
    t_start = time.monotonic()
    try:
        for g, n in groups.items():
            workers[g] = [
                start(bootstrap, tmp_path, f"{g}{i}", blocks, f"lossn-{run}-{g}", metrics[g], dl, RETENTION_S)
                for i in range(n)
            ]
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})

        def send_block(i: int) -> None:
            # tx of block i with rx of block i - 1 (the egress collector reports later), keyed by node
            block = b0 + i
            if i < BLOCKS:
                producer.produce(
                    blocks, key=tx.encode(), value=block_batch(tx, ab.DIR_TX, block, {f: sent[f, block] for f in flows})
                )
            if i >= 1:
                prev = block - 1
                got = {f: sent[f, prev] - lost[f, prev] for f in flows if (f, prev) not in no_rx}
                producer.produce(blocks, key=rx.encode(), value=block_batch(rx, ab.DIR_RX, prev, got))
            assert producer.flush(10) == 0

        tails = {}
        for g in groups:
            c = Consumer(
                {"bootstrap.servers": bootstrap, "group.id": f"lossn-read-{run}-{g}", "auto.offset.reset": "earliest"}
            )
            c.subscribe([metrics[g]])
            tails[g] = c
        last: dict[str, dict[str, str]] = {g: {} for g in groups}  # identity -> last line

        def read(timeout: float = 0.2) -> None:
            for g, c in tails.items():
                for m in c.consume(num_messages=1000, timeout=timeout):
                    for line in m.value().decode().split("\n"):
                        if line.startswith("altmark_loss,"):
                            head, fields_s, ts = line.rsplit(" ", 2)
                            last[g][f"{head} {ts}"] = fields_s

        # every worker consumes (its first counters line) before the stream starts
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(
            all("health on" in (tmp_path / f"{g}{i}.log").read_text(errors="replace") for i in range(n))
            for g, n in groups.items()
        ):
            time.sleep(0.2)
        t_up = time.monotonic()
        for i in range(BLOCKS // 2):
            send_block(i)
            time.sleep(0.2)
        read()
        victim = workers["three"][0]
        victim.send_signal(signal.SIGKILL)  # mid-stream: no flush, no commit, no leave-group
        victim.wait()
        workers["three"].append(
            start(bootstrap, tmp_path, "three3", blocks, f"lossn-{run}-three", metrics["three"], dl, RETENTION_S)
        )
        for i in range(BLOCKS // 2, BLOCKS + 1):
            send_block(i)
            time.sleep(0.2)

        def truth() -> dict[tuple[int, int], tuple]:
            return {k: ("missing_rx",) if k in no_rx else ("ok", lost[k]) for k in sent}

        def seen(g: str) -> dict[tuple[int, int], tuple]:
            return outcomes(last[g], tx)

        want = truth()
        deadline = time.monotonic() + RESULTS_WITHIN_S
        while time.monotonic() < deadline and not all(seen(g) == want for g in groups):
            for g, procs in workers.items():
                for p in procs[1:] if g == "three" else procs:
                    assert p.poll() is None, f"a worker of group {g} exited {p.returncode}: see {tmp_path}"
            read()
        t_done = time.monotonic()
        time.sleep(1.0)  # one more flush: a late different line would show now
        read()
        print(f"\n[loss workers] workers up {t_up - t_start:.1f} s, stream and results {t_done - t_up:.1f} s")
        for g in groups:
            assert seen(g) == want, (
                g,
                {k: v for k, v in seen(g).items() if want.get(k) != v},
                worker_warnings(tmp_path, g),
            )
        ours = {g: {k: v for k, v in last[g].items() if f"tx_node={tx}," in k} for g in groups}
        assert len(ours["one"]) == FLOWS * BLOCKS
        for g in ("two", "three"):
            assert ours[g] == ours["one"], g  # every field of every point's last line
    finally:
        everyone = [p for procs in workers.values() for p in procs]
        for p in everyone:  # all at once: one by one, each stop would wait for its group's rebalance
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        give_up = time.monotonic() + 20
        for p in everyone:
            try:
                p.wait(timeout=max(0.1, give_up - time.monotonic()))
            except subprocess.TimeoutExpired:
                stop_worker(p)  # SIGTERM again, then kill: never left running
        for c in locals().get("tails", {}).values():
            c.close()
