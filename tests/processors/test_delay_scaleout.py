"""The delay processor as N workers of one consumer group: the same results as one worker.

One producer streams STAMP records of 12 sessions (keyed <node>/<ssid>, as the streamer and the
agent key them) in real time onto a 3-partition topic. Three consumer groups read it at once,
each writing to its own metrics topic:
  one    1 worker from start to end (the reference);
  grow   2 workers, a third joins midway (scale up: the partitions move to a live worker);
  shrink 3 workers, one SIGKILLed midway (its partitions go to the survivors after the session
         timeout), one stopped with SIGTERM later (scale down).
The retention window is 4 s, so the killed worker dies before its first commit: its successor
must read the partition from the beginning (processors/worker.py rewind_uncommitted), not from
where Faust's prefetch left it.
The final value of every result point (measurement + tags + timestamp, the identity InfluxDB
overwrites by) must be identical in the three groups, field for field, and every record sent is
counted exactly once. Counter lines (segscope_*) are per worker and not compared.
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
from processors.worker import read_topic
from segscope_schemas.line_protocol import parse_lines
from segscope_schemas.stamp_record import STAMP_RECORD_DTYPE, encode_batch

REPO = Path(__file__).resolve().parents[2]
NS = 1_000_000_000
SESSIONS = 12
RATE = 50  # records per second per session
DURATION_S = 10
PARTITIONS = 3


def start_worker(bootstrap, topic, metrics, deadletter, app_id, datadir: Path, log: Path, health: str):
    env = dict(os.environ, PYTHONPATH=f"{REPO}:{REPO / 'schemas' / 'python'}", SEGSCOPE_DELAY_HEALTH=health)
    args = [sys.executable, "-m", "processors.delay", "--bootstrap", bootstrap, "--records-topic", topic]
    args += ["--metrics-topic", metrics, "--deadletter-topic", deadletter, "--app-id", app_id]
    args += ["--grace-s", "1", "--retention-s", "4", "--datadir", str(datadir), "-l", "info"]
    with open(log, "a") as f:
        return subprocess.Popen(args, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def results(bootstrap: str, metrics: str) -> dict[tuple, dict]:
    """Final fields per point identity, in the order the lines were published (one partition)."""
    out: dict[tuple, dict] = {}
    for _, value in read_topic(bootstrap, metrics, f"reader-{uuid.uuid4().hex[:6]}"):
        points, bad = parse_lines(value.decode())
        assert not bad, bad
        for p in points:
            if not p.measurement.startswith("segscope_"):
                out[(p.measurement, tuple(sorted(p.tags.items())), p.timestamp_ns)] = p.fields
    return out


def forward_counts(res: dict[tuple, dict]) -> int:
    return sum(f["count"] for (m, tags, _), f in res.items() if m == "stamp_delay" and ("direction", "forward") in tags)


def short_points(ref: dict, got: dict) -> list:
    """(ssid, second, reference count, count) of the forward points that differ in count."""
    out = []
    for (m, tags, ts), f in ref.items():
        if m == "stamp_delay" and ("direction", "forward") in tags:
            other = got.get((m, tags, ts))
            if other is None or other["count"] != f["count"]:
                out.append((dict(tags)["ssid"], ts // NS, f["count"], other and other["count"]))
    return sorted(out)[:30]


def test_two_and_three_workers_give_the_results_of_one(stack, tmp_path):
    bootstrap = stack.kafka_bootstrap
    run = uuid.uuid4().hex[:8]
    node, topic, deadletter = f"scale{run}", f"test.scale.{run}", f"test.scale.{run}.dl"
    ensure_topics(bootstrap, [topic], partitions=PARTITIONS)
    groups = ("one", "grow", "shrink")
    metrics = {g: f"test.scale.{run}.{g}.metrics" for g in groups}
    ensure_topics(bootstrap, [deadletter, *metrics.values()])
    workers: dict[str, list] = {g: [] for g in groups}

    def start(group: str) -> None:
        i = len(workers[group])
        log = tmp_path / f"{group}{i}.log"
        workers[group].append(
            (
                start_worker(
                    bootstrap,
                    topic,
                    metrics[group],
                    deadletter,
                    f"scale-{run}-{group}",
                    tmp_path / f"{group}{i}",
                    log,
                    "127.0.0.1:0",
                ),
                log,
            )  # fmt: skip
        )

    sent = 0
    errors: list = []

    def produce() -> None:
        nonlocal sent
        p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
        seq, batch_seq = np.zeros(SESSIONS + 1, dtype=np.int64), 0
        per_batch = RATE // 10
        t_end = time.monotonic() + DURATION_S
        while time.monotonic() < t_end:
            t0 = time.clock_gettime_ns(time.CLOCK_TAI)
            for ssid in range(1, SESSIONS + 1):
                r = np.zeros(per_batch, dtype=STAMP_RECORD_DTYPE)
                r["ssid"] = ssid
                r["sender_seq"] = np.arange(seq[ssid], seq[ssid] + per_batch)
                r["t1_ns"] = t0 + np.arange(per_batch) * (NS // RATE)
                r["t2_ns"] = r["t1_ns"] + 1_000_000 + ssid * 10_000 + (r["sender_seq"] * 7919) % 300_000
                r["t3_ns"] = r["t2_ns"] + 10_000
                r["t4_ns"] = r["t3_ns"] + 900_000 + (r["sender_seq"] * 104729) % 200_000
                p.produce(topic, encode_batch(r, node, batch_seq), key=f"{node}/{ssid}".encode(),
                          on_delivery=lambda err, msg: err and errors.append(err))  # fmt: skip
                seq[ssid] += per_batch
                sent += per_batch
                batch_seq += 1
            p.poll(0)
            time.sleep(0.1)
        assert p.flush(30) == 0

    try:
        for group, n in (("one", 1), ("grow", 2), ("shrink", 3)):
            for _ in range(n):
                start(group)
        # every worker has its first assignment before the stream starts (later ones rebalance)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(
            "rebalance: own" in log.read_text(errors="replace") for g in groups for _, log in workers[g]
        ):
            time.sleep(0.2)
        producer = threading.Thread(target=produce)
        producer.start()
        time.sleep(DURATION_S * 0.35)
        start("grow")  # scale up
        proc, _ = workers["shrink"][0]
        os.killpg(proc.pid, signal.SIGKILL)  # a worker dies: no flush, no commit
        time.sleep(DURATION_S * 0.3)
        proc, _ = workers["shrink"][1]
        os.killpg(proc.pid, signal.SIGTERM)  # scale down: a clean stop
        producer.join()
        assert not errors, errors
        deadline = time.monotonic() + 60
        res = {}
        while time.monotonic() < deadline:
            res = {g: results(bootstrap, metrics[g]) for g in groups}
            if all(forward_counts(r) == sent for r in res.values()):
                break
            time.sleep(1)
        for group in groups:
            for proc, log in workers[group]:
                if proc.poll() is None:
                    assert "Traceback" not in log.read_text(errors="replace"), log.read_text(errors="replace")[-3000:]
        counts = {g: forward_counts(r) for g, r in res.items()}
        for g in groups:
            if counts[g] != sent:
                print(f"\n[scale-out] {g}: {short_points(res['one'], res[g])}")
        assert counts == {g: sent for g in groups}, (
            sent,
            counts,
            {g: short_points(res["one"], res[g]) for g in groups},
        )
        one = res["one"]
        assert len(one) >= SESSIONS * 3 * (DURATION_S - 1)
        for group in ("grow", "shrink"):
            other = res[group]
            missing, extra = one.keys() - other.keys(), other.keys() - one.keys()
            differ = [k for k in one.keys() & other.keys() if one[k] != other[k]]
            assert not missing and not extra and not differ, (
                f"{group}: {len(missing)} points missing, {len(extra)} extra, {len(differ)} differ, "
                f"e.g. {[(k, one[k], other[k]) for k in differ[:2]]} {sorted(missing)[:2]} {sorted(extra)[:2]}"
            )
        print(f"\n[scale-out] {sent} records, {len(one)} points; 1, 2->3 and 3->1 workers identical")
    finally:
        for group in groups:
            for proc, _ in workers[group]:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
            for proc, _ in workers[group]:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
