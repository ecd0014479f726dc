#!/usr/bin/env python3
"""Recovery of the delay processor after kill -9, with a steady stream of STAMP records.

An isolated stack (Kafka, InfluxDB, Telegraf on their own ports). A producer sends --rate records
per second (batches of 100, one session per 1 000 records/s) for --seconds; the real worker
(`python -m processors.delay`, as in tests/processors/test_delay_crash.py) is SIGKILLed at
--kill-at and restarted --down seconds later. Measured: the time from the restart until InfluxDB
holds every second sent with its exact count (caught up), and whether it ever does. Printed and
written into docs/benchmarks.md (section processor_recovery).

    .local/venv/bin/python bench/processor_recovery.py [--rate 10000] [--seconds 40]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "schemas" / "python")]
from bench.report import machine, machine_line, write_section  # noqa: E402
from processors.delay.topics import ensure_topics  # noqa: E402
from segscope_schemas.stamp_record import STAMP_RECORD_DTYPE, encode_batch  # noqa: E402
from services.stack import Stack  # noqa: E402
from tests.processors.test_delay_crash import start_worker, wait_consuming  # noqa: E402

NS = 1_000_000_000
BATCH = 100


def produce(bootstrap: str, topic: str, node: str, rate: int, seconds: float, sent: dict, errors: list) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5})
    sessions = max(1, rate // 1000)
    seq = [0] * sessions
    t_end, next_t, batch_seq = time.monotonic() + seconds, time.monotonic(), 0
    while time.monotonic() < t_end:
        for s in range(sessions):
            t0 = time.clock_gettime_ns(time.CLOCK_TAI)
            r = np.zeros(BATCH, dtype=STAMP_RECORD_DTYPE)
            r["ssid"] = s + 1
            r["sender_seq"] = np.arange(seq[s], seq[s] + BATCH)
            r["t1_ns"] = t0 + np.arange(BATCH) * (NS * sessions // rate)
            r["t2_ns"] = r["t1_ns"] + 2_000_000
            r["t3_ns"] = r["t2_ns"] + 10_000
            r["t4_ns"] = r["t3_ns"] + 1_000_000
            secs, counts = np.unique(r["t1_ns"] // NS, return_counts=True)
            for sec, c in zip(secs.tolist(), counts.tolist()):
                sent[(s + 1, sec)] = sent.get((s + 1, sec), 0) + c
            p.produce(topic, encode_batch(r, node, batch_seq), key=f"{node}/{s + 1}".encode(),
                      on_delivery=lambda e, m: e and errors.append(e))  # fmt: skip
            seq[s] += BATCH
            batch_seq += 1
        p.poll(0)
        next_t += BATCH * sessions / rate
        time.sleep(max(0.0, next_t - time.monotonic()))
    p.flush(60)


def run(stack: Stack, rate: int, seconds: float, kill_at: float, down: float, tmp: Path) -> dict:
    run_id = uuid.uuid4().hex[:8]
    node, topic, dl, app_id = f"rec{run_id}", f"bench.recovery.{run_id}", f"bench.recovery.{run_id}.dl", run_id
    ensure_topics(stack.kafka_bootstrap, [topic], partitions=2)
    ensure_topics(stack.kafka_bootstrap, [dl])
    log = tmp / "worker.log"
    worker = start_worker(stack.kafka_bootstrap, topic, dl, app_id, tmp / "faust", log)
    sent: dict = {}
    errors: list = []
    try:
        wait_consuming(log, 0, topic)
        t = threading.Thread(target=produce, args=(stack.kafka_bootstrap, topic, node, rate, seconds, sent, errors))
        t.start()
        time.sleep(kill_at)
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        kill_utc_s = time.time_ns() // NS
        time.sleep(down)
        t_restart = time.monotonic()
        worker = start_worker(stack.kafka_bootstrap, topic, dl, app_id, tmp / "faust", log)
        offset = round((time.clock_gettime_ns(time.CLOCK_TAI) - time.time_ns()) / NS)
        query = f"SELECT \"count\" FROM stamp_delay WHERE node = '{node}' AND direction = 'forward' GROUP BY ssid"

        def in_influx() -> dict:
            return {(int(r["ssid"]), r["time"] // NS): int(r["count"]) for r in stack.influx_query(query)}

        # caught up: every second that ended before the kill is in InfluxDB with its exact count
        before = {(ssid, sec - offset): c for (ssid, sec), c in list(sent.items()) if sec - offset < kill_utc_s}
        deadline, caught_up_s = time.monotonic() + 180, None
        while time.monotonic() < deadline:
            got = in_influx()
            if all(got.get(k) == c for k, c in before.items()):
                caught_up_s = time.monotonic() - t_restart
                break
            time.sleep(0.25)
        t.join()
        want = {(ssid, sec - offset): c for (ssid, sec), c in sent.items()}
        deadline, got = time.monotonic() + 120, {}
        while time.monotonic() < deadline:  # and, in the end, everything
            got = in_influx()
            if got == want:
                break
            time.sleep(0.5)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
    return {
        "rate": rate,
        "seconds": seconds,
        "kill_at_s": kill_at,
        "down_s": down,
        "records": sum(sent.values()),
        "series_seconds": len(want),
        "exact": got == want,
        "missing_seconds": len(set(want) - set(got)),
        "wrong_seconds": sum(1 for k in want if k in got and got[k] != want[k]),
        "wrong": sorted(
            (k[0], k[1] - min(sec for _, sec in want), want[k], got[k]) for k in want if k in got and got[k] != want[k]
        )[:20],
        "caught_up_after_restart_s": None if caught_up_s is None else round(caught_up_s, 1),
        "producer_errors": len(errors),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=40)
    ap.add_argument("--kill-at", type=float, default=15)
    ap.add_argument("--down", type=float, default=5)
    ap.add_argument("--port-base", type=int, default=29900)
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()
    stack = Stack(run_dir=REPO / ".run" / "bench-recovery", port_base=args.port_base, fresh=True)
    stack.up()
    tmp = REPO / ".run" / "bench-recovery" / "work"
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        res = run(stack, args.rate, args.seconds, args.kill_at, args.down, tmp)
    finally:
        stack.down()
    m = machine()
    print(json.dumps({**res, "machine": m}))
    if not args.no_doc:
        section = f"""## Delay processor recovery after kill -9 (`bench/processor_recovery.py`)

Machine: {machine_line(m)}, {m['date']}.
{res['rate']:,} records/s ({res['rate'] // 1000} sessions, batches of {BATCH}) for {res['seconds']:g} s into an
isolated stack (Kafka, InfluxDB, Telegraf); the worker is SIGKILLed at {res['kill_at_s']:g} s and restarted
{res['down_s']:g} s later. Caught up = InfluxDB holds every second that ended before the kill with its exact
count (the restarted worker replayed what the dead one had consumed but not finished); exact = at the end
every second sent is in InfluxDB once, with its exact count.

| records | session-seconds | exact in InfluxDB | missing | wrong | caught up after the restart |
|---|---|---|---|---|---|
| {res['records']:,} | {res['series_seconds']} | {res['exact']} | {res['missing_seconds']} | {res['wrong_seconds']} | {res['caught_up_after_restart_s']} s |

The restart replays the input of every second still open at the kill (the worker runs with a 5 s
retention here; 60 s by default), skips the replayed records of seconds that were already final
(the progress topic), and the group hands the dead member's partitions over after its 6 s session
timeout.
"""  # noqa: E501 - markdown report: one table row or paragraph per line
        write_section("processor_recovery", section)
    return 0 if res["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
