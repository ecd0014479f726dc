"""The in-line processor through kill -9: every sampled packet counted once.

An egress "streamer" sends three flows in real time (a message per flow every 0.1 s, 200 packets/s
each, 3 % of them lost on the way) to a 2-partition topic; the real worker (`python -m
processors.inline`, reorder window 3 s, so seconds become final and their progress is written
during the run) writes to the stack's metrics topic, Telegraf to InfluxDB. At 7 s the worker is
SIGKILLed (no flush, no commit) and restarted 3 s later: it must replay what was not final, skip
what was (the progress topic), and continue each flow's loss accounting where the final seconds
ended. Exact, per flow: inline_delay `count` per second = the packets that arrived in it;
inline_loss received + lost over the run = the packets sent, lost = the packets dropped.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid

from confluent_kafka import Producer

from processors.delay.topics import ensure_topics
from tests.processors.conftest import topic_config
from tests.processors.inline_records import NS, TAI_UTC, LiveFlows
from tests.processors.test_inline_app import start_worker, wait_for

RATE, TICK_S = 200, 0.1
DURATION_S, KILL_AT_S, DOWN_S = 16, 7, 3


def test_inline_processor_survives_kill_9(stack, tmp_path):
    bootstrap = stack.kafka_bootstrap
    run = uuid.uuid4().hex[:6]
    topics = {k: f"test.inline.crash.{run}.{k}" for k in ("records", "deadletter", "paths")}
    topics["metrics"] = "segscope.metrics"
    ensure_topics(bootstrap, [topics["records"]], partitions=2)
    ensure_topics(bootstrap, [topics["deadletter"]])
    ensure_topics(bootstrap, [topics["paths"]], config={"cleanup.policy": "compact"})
    egress, app_id = f"crashB{run}", f"test-inline-crash-{run}"
    flows = LiveFlows(egress, [int(run[:4], 16) + i for i in (1, 2, 3)], drop=0.03, seed=int(run, 16))
    extra = ("--retention-s", "3", "--grace-s", "0.5")
    worker = start_worker(bootstrap, tmp_path, "w", topics, app_id, *extra)
    errors: list = []
    stop = threading.Event()

    def produce() -> None:
        p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                      "compression.type": "lz4"})  # fmt: skip
        t_end = time.monotonic() + DURATION_S
        per_tick = int(RATE * TICK_S)
        while not stop.is_set():
            last = time.monotonic() >= t_end
            now = time.clock_gettime_ns(time.CLOCK_TAI)
            for key, value in flows.tick(now, per_tick, NS // RATE, last=last):
                p.produce(topics["records"], value, key, on_delivery=lambda err, msg: err and errors.append(err))
            p.poll(0)
            if last:
                break
            time.sleep(TICK_S)
        assert p.flush(30) == 0

    try:
        wait_for(tmp_path / "w.log", "rebalance: own")
        producer = threading.Thread(target=produce)
        producer.start()
        time.sleep(KILL_AT_S)
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        mark = len((tmp_path / "w.log").read_text(errors="replace"))
        time.sleep(DOWN_S)
        t_restart = time.monotonic()
        worker = start_worker(bootstrap, tmp_path, "w", topics, app_id, *extra)
        producer.join()
        assert not errors, errors
        want_counts = {f: {s - TAI_UTC: c for s, c in flows.received[f].items()} for f in flows.flows}
        flow_filter = " OR ".join(f"flow = '{f}'" for f in flows.flows)

        def read() -> tuple[dict, dict]:
            delay = stack.influx_query_settled(
                f"SELECT \"count\" FROM inline_delay WHERE egress = '{egress}' AND ({flow_filter}) GROUP BY flow",
                settle_s=0.5,
            )
            loss = stack.influx_query_settled(
                f"SELECT received, lost FROM inline_loss WHERE egress = '{egress}' AND ({flow_filter}) GROUP BY flow",
                settle_s=0.5,
            )
            counts: dict = {f: {} for f in flows.flows}
            for r in delay:
                counts[int(r["flow"])][r["time"] // NS] = r["count"]
            totals: dict = {f: [0, 0] for f in flows.flows}
            for r in loss:
                totals[int(r["flow"])][0] += r["received"]
                totals[int(r["flow"])][1] += r["lost"]
            return counts, totals

        want_totals = {f: [flows.sent(f) - flows.lost[f], flows.lost[f]] for f in flows.flows}
        deadline = time.monotonic() + 90
        counts, totals = read()
        while time.monotonic() < deadline and (counts != want_counts or totals != want_totals):
            assert worker.poll() is None, (tmp_path / "w.log").read_text(errors="replace")[-3000:]
            time.sleep(1)
            counts, totals = read()
        caught_up_s = time.monotonic() - t_restart
        log = (tmp_path / "w.log").read_text(errors="replace")
        assert "Traceback" not in log, log[-3000:]
        for f in flows.flows:
            missing = sorted(set(want_counts[f]) - set(counts[f]))
            wrong = [(s, want_counts[f][s], counts[f][s]) for s in want_counts[f] if counts[f].get(s, want_counts[f][s])
                     != want_counts[f][s]]  # fmt: skip
            assert counts[f] == want_counts[f], (f, missing, wrong)
            # received + lost = sent: every seq counted once, across the kill
            assert totals[f] == want_totals[f], (f, totals[f], want_totals[f], flows.sent(f))
        # the restarted worker took the final seconds from the progress topic
        assert "flows resume from" in log[mark:], log[mark:][-3000:]
        assert topic_config(bootstrap, f"{app_id}.progress", "cleanup.policy") == "compact"
        sent = sum(flows.sent(f) for f in flows.flows)
        lost = sum(flows.lost.values())
        assert lost > 0 and sent >= 3 * RATE * (DURATION_S - 2)
        print(
            f"\n[inline crash] {sent} packets sent, {lost} lost, all counted once {caught_up_s:.1f} s after the restart"
        )
    finally:
        stop.set()
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGTERM)
            try:
                worker.wait(timeout=30)
            except Exception:  # noqa: BLE001 - hung: killed, never left running
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()
