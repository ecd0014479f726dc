"""The in-line processor as several workers of one consumer group: the results of one worker.

An egress streamer sends six flows in real time (lost packets included) onto a 3-partition topic.
Three consumer groups read it at once, each writing to its own metrics topic:
  one    1 worker from start to end (the reference);
  grow   2 workers sharing the flows, a third joins midway (a rebalance moves flows to it);
  shrink 3 workers, one SIGKILLed midway (its flows go to the others after the session timeout),
         one stopped with SIGTERM later.
The final value of every point (measurement + tags + timestamp: what InfluxDB keeps) must be the
same in the three groups, field for field, and the loss accounting exact in each: per flow,
received + lost = the packets sent, lost = the packets dropped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid

from confluent_kafka import Producer

from processors.delay.topics import ensure_topics
from tests.processors.inline_records import NS, LiveFlows
from tests.processors.test_delay_scaleout import results
from tests.processors.test_inline_app import start_worker

FLOWS, RATE, TICK_S, DURATION_S, PARTITIONS = 6, 100, 0.1, 12, 3


def test_workers_sharing_flows_give_the_results_of_one(stack, tmp_path):
    bootstrap = stack.kafka_bootstrap
    run = uuid.uuid4().hex[:6]
    records = f"test.inline.n.{run}.records"
    ensure_topics(bootstrap, [records], partitions=PARTITIONS)
    groups = ("one", "grow", "shrink")
    topics = {
        g: {"records": records, "metrics": f"test.inline.n.{run}.{g}.metrics",
            "deadletter": f"test.inline.n.{run}.dl", "paths": f"test.inline.n.{run}.paths"}
        for g in groups
    }  # fmt: skip
    ensure_topics(bootstrap, [t["metrics"] for t in topics.values()] + [f"test.inline.n.{run}.dl"])
    ensure_topics(bootstrap, [f"test.inline.n.{run}.paths"], config={"cleanup.policy": "compact"})
    egress = f"nB{run}"
    flows = LiveFlows(egress, [int(run[:4], 16) * 8 + i for i in range(1, FLOWS + 1)], drop=0.02, seed=int(run, 16))
    workers: dict[str, list[subprocess.Popen]] = {g: [] for g in groups}

    def start(group: str) -> None:
        i = len(workers[group])
        workers[group].append(
            start_worker(
                bootstrap,
                tmp_path,
                f"{group}{i}",
                topics[group],
                f"test-inline-n-{run}-{group}",
                "--retention-s",
                "4",
                "--grace-s",
                "0.5",
            )  # fmt: skip
        )

    def log(group: str, i: int) -> str:
        return (tmp_path / f"{group}{i}.log").read_text(errors="replace")

    errors: list = []

    def produce() -> None:
        p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
        t_end = time.monotonic() + DURATION_S
        while True:
            last = time.monotonic() >= t_end
            for key, value in flows.tick(time.clock_gettime_ns(time.CLOCK_TAI), int(RATE * TICK_S), NS // RATE, last):
                p.produce(records, value, key, on_delivery=lambda err, msg: err and errors.append(err))
            p.poll(0)
            if last:
                break
            time.sleep(TICK_S)
        assert p.flush(30) == 0

    try:
        for group, n in (("one", 1), ("grow", 2), ("shrink", 3)):
            for _ in range(n):
                start(group)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not all(
            "rebalance: own" in log(g, i) for g in groups for i in range(len(workers[g]))
        ):
            time.sleep(0.2)
        producer = threading.Thread(target=produce)
        producer.start()
        time.sleep(DURATION_S * 0.35)
        start("grow")  # a third worker joins: flows move to it
        os.killpg(workers["shrink"][0].pid, signal.SIGKILL)  # a worker dies: no flush, no commit
        time.sleep(DURATION_S * 0.3)
        os.killpg(workers["shrink"][1].pid, signal.SIGTERM)  # scale down: a clean stop
        producer.join()
        assert not errors, errors
        want = {f: (flows.sent(f) - flows.lost[f], flows.lost[f]) for f in flows.flows}

        def totals(res: dict) -> dict:
            out = {f: [0, 0] for f in flows.flows}
            for (m, tags, _), fields in res.items():
                if m == "inline_loss" and dict(tags)["egress"] == egress:
                    out[int(dict(tags)["flow"])][0] += fields["received"]
                    out[int(dict(tags)["flow"])][1] += fields["lost"]
            return {f: tuple(v) for f, v in out.items()}

        deadline = time.monotonic() + 90
        res: dict = {}
        while time.monotonic() < deadline:
            res = {g: results(bootstrap, topics[g]["metrics"]) for g in groups}
            if (
                all(totals(r) == want for r in res.values())
                and res["one"].keys() == res["grow"].keys() == res["shrink"].keys()
            ):
                break
            time.sleep(1)
        for g in groups:
            for i, w in enumerate(workers[g]):
                if w.poll() is None:
                    assert "Traceback" not in log(g, i), log(g, i)[-3000:]
        for g in groups:
            assert totals(res[g]) == want, (g, totals(res[g]), want)
        one = res["one"]
        assert len([k for k in one if k[0] == "inline_delay"]) >= FLOWS * (DURATION_S - 1)
        for g in ("grow", "shrink"):
            other = res[g]
            missing, extra = one.keys() - other.keys(), other.keys() - one.keys()
            differ = [k for k in one.keys() & other.keys() if one[k] != other[k]]
            assert not missing and not extra and not differ, (
                f"{g}: {len(missing)} points missing, {len(extra)} extra, {len(differ)} differ, "
                f"e.g. {[(k, one[k], other[k]) for k in differ[:2]]} {sorted(missing)[:2]} {sorted(extra)[:2]}"
            )
        # the join and the kill did move flows: the workers of grow and shrink logged more than one assignment
        assert log("grow", 0).count("rebalance: own") >= 2 and log("shrink", 2).count("rebalance: own") >= 2
        sent = sum(flows.sent(f) for f in flows.flows)
        print(f"\n[inline workers] {sent} packets, {len(one)} points; 1, 2->3 and 3->1 workers identical")
    finally:
        for g in groups:
            for w in workers[g]:
                if w.poll() is None:
                    os.killpg(w.pid, signal.SIGTERM)
            for w in workers[g]:
                try:
                    w.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(w.pid, signal.SIGKILL)
                    w.wait()
