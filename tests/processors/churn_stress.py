"""Churn stress for the loss workers (not in `make test`: run it by name, about 40 s a run).

    SEGSCOPE_STACK_PORT_BASE=29900 SEGSCOPE_STACK_RUN_DIR=/tmp/churn-stack \\
        .local/venv/bin/python -m pytest tests/processors/churn_stress.py -p no:cacheprovider
    CHURN_ACT=freeze (every change is a 9-s SIGSTOP) | kill | join | term; default: a random mix
    CHURN_WAIT=0..3 (seconds between starting the workers and the stream)

One group, 3 workers, 40 flows x 30 blocks at 0.25 s; every 6th block a membership change
(SIGKILL and a replacement, a new worker, a clean stop, or a 9-s stall). Then the last line of
every block must be the truth within 90 s, and still 1 s later. The stack's data stays in its run
dir after a failure (start it with `services.stack up --only kafka` without --fresh to read the
topics). Findings: docs/reliability.md (the lost hand-over row).
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
import uuid

from confluent_kafka import Consumer, Producer

from processors.delay.topics import ensure_topics
from segscope_schemas import altmark_block as ab
from tests.processors.conftest import stop_worker
from tests.processors.test_loss_workers import NS, block_batch, outcomes, start

FLOWS, BLOCKS, PARTITIONS = 40, 30, 3
WATCHED = (
    "late_records_dropped",
    "replayed_records_skipped",
    "duplicate_records",
    "blocks_handed_over",
    "partitions_refetched",
)


def test_churn(stack, tmp_path):
    bootstrap = stack.kafka_bootstrap
    run = uuid.uuid4().hex[:6]
    rnd = random.Random(run)
    blocks, dl, metrics = f"st.{run}.blocks", f"st.{run}.dl", f"st.{run}.metrics"
    ensure_topics(bootstrap, [blocks], partitions=PARTITIONS)
    ensure_topics(bootstrap, [dl, metrics])
    tx, rx = f"ntx{run}", f"nrx{run}"
    flows = rnd.sample(range(1, 0xFFFFF), FLOWS)
    b0 = time.clock_gettime_ns(time.CLOCK_TAI) // NS - 300
    sent = {(f, b0 + i): rnd.randrange(100, 5000) for f in flows for i in range(BLOCKS)}
    lost = {k: rnd.choice([0, 0, 1, 7]) for k in sent}
    no_rx = set(rnd.sample(sorted(sent), 12))
    app_id = f"st-{run}"
    names = iter(range(100))
    procs: dict = {}
    events: list = []

    def spawn() -> None:
        name = f"w{next(names)}"
        procs[name] = start(bootstrap, tmp_path, name, blocks, app_id, metrics, dl)
        events.append((time.monotonic(), "start", name))

    def change() -> None:
        alive = [n for n, p in procs.items() if p.poll() is None]
        act = os.environ.get("CHURN_ACT") or rnd.choice(["kill", "kill", "join", "term"])
        victim = rnd.choice(alive) if alive else None
        if act == "kill" and len(alive) > 1:
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait()
            events.append((time.monotonic(), "kill", victim))
            spawn()
        elif act == "freeze" and alive:
            procs[victim].send_signal(signal.SIGSTOP)
            events.append((time.monotonic(), "stop", victim))

            def cont(p=procs[victim], name=victim) -> None:
                time.sleep(9.0)
                p.send_signal(signal.SIGCONT)
                events.append((time.monotonic(), "cont", name))

            threading.Thread(target=cont, daemon=True).start()
        elif act == "term" and len(alive) > 1:
            stop_worker(procs[victim])
            events.append((time.monotonic(), "term", victim))
        else:
            spawn()

    for _ in range(3):
        spawn()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})

    def send_block(i: int) -> None:
        block = b0 + i
        if i < BLOCKS:
            counts = {f: sent[f, block] for f in flows}
            producer.produce(blocks, key=tx.encode(), value=block_batch(tx, ab.DIR_TX, block, counts))
        if i >= 1:
            prev = block - 1
            got = {f: sent[f, prev] - lost[f, prev] for f in flows if (f, prev) not in no_rx}
            producer.produce(blocks, key=rx.encode(), value=block_batch(rx, ab.DIR_RX, prev, got))
        assert producer.flush(10) == 0

    tail = Consumer({"bootstrap.servers": bootstrap, "group.id": f"st-read-{run}", "auto.offset.reset": "earliest"})
    tail.subscribe([metrics])
    last: dict[str, str] = {}

    def read(timeout: float = 0.2) -> None:
        for m in tail.consume(num_messages=1000, timeout=timeout):
            if m.error():
                continue
            for line in m.value().decode().split("\n"):
                if line.startswith("altmark_loss,"):
                    head, fields_s, ts = line.rsplit(" ", 2)
                    last[f"{head} {ts}"] = fields_s

    def seen() -> dict[tuple[int, int], tuple]:
        return outcomes(last)

    try:
        time.sleep(float(os.environ.get("CHURN_WAIT", 2)))
        for i in range(BLOCKS + 1):
            send_block(i)
            time.sleep(0.2)
            read(0.05)
            if i % 6 == 3 and i < BLOCKS - 2:
                change()
        want = {k: ("missing_rx",) if k in no_rx else ("ok", lost[k]) for k in sent}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and seen() != want:
            read()
        time.sleep(1.0)
        read()
        got = seen()
        diff = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
        t0 = events[0][0]
        report = {
            "wrong": len(diff),
            "first_wrong": [[list(k), list(g or ()), list(w)] for k, (g, w) in sorted(diff.items())[:20]],
            "b0": b0,
            "events": [(round(t - t0, 1), what, name) for t, what, name in events],
            "counters": {},
        }
        for name in procs:
            text = (tmp_path / f"{name}.log").read_text(errors="replace")
            lines = [x for x in text.splitlines() if "loss counters" in x]
            if lines:
                counters = json.loads(lines[-1].split("loss counters ", 1)[1])
                report["counters"][name] = {k: counters.get(k) for k in WATCHED}
        (tmp_path / "report.json").write_text(json.dumps(report, indent=1))
        assert not diff, f"{len(diff)} blocks wrong: {tmp_path / 'report.json'}"
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
            stop_worker(p)
        tail.close()
