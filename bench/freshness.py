"""Benchmark: packet-to-InfluxDB delay (freshness) of stamp_delay and altmark_loss, live.

    .local/venv/bin/python bench/freshness.py [--port-base 29850 --run-dir /tmp/fre-stack]
        [--sessions 100] [--rate 100] [--batch-ms 200] [--per-session] [--duration 60] [--flows 4]
        [--period-ms 1000]
        [--grace-s G] [--delay-flush-s F] [--loss-flush-s F] [--poll-s 0.2] [--no-docs]

A driver thread produces synthetic STAMP records with live CLOCK_TAI times, as an agent would:
every --batch-ms, one stamp_batch message per node (key "<node>", like collectors/stamp_streamer.c
with its defaults --key node --linger-ms 200) holding the records whose T1 fell in the last
--batch-ms (--sessions x --rate records/s; 10 nodes); --per-session: one message per session
(key "<node>/<ssid>", the streamer's --key session). A second thread plays the alternate-marking collectors
of --flows flows at period T = --period-ms: at each block end + T/2 (the collector's read margin)
it produces the tx and the rx record of the block that just ended. The real delay and loss
processors (`python -m processors.delay`, `python -m processors.loss`, one worker each, their
defaults unless --grace-s/--delay-flush-s/--loss-flush-s) publish on the stack's metrics topic,
the stack's Telegraf writes to InfluxDB.

Measured like segscope-freshness does it (processors/freshness.py Tracker, same queries), but
over the whole run and with a finer poll (--poll-s): every new point of a series is a sample,
(poll time - its newest_ns): for stamp_delay the newest packet's T1, for altmark_loss the block
end ("block end to visible", which contains the T/2 read margin). The poll time is an upper
bound of the time the point became visible: samples are too large by at most --poll-s. The
real segscope-freshness runs beside it (default settings) and its segscope_freshness lines are
read back from InfluxDB as a cross-check. Targets: stamp_delay p99 <= 2 s at 10 000
records/s; altmark_loss <= T/2 + 2 s after the block ends.

The stack: --port-base/--run-dir of a running isolated stack (services.stack up --port-base N
--run-dir DIR), or, without them, one started here on port base 29880 and stopped at the end.
The first 10 s of samples (group joins, first seconds) are left out.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "schemas" / "python")]
import numpy as np  # noqa: E402

from bench.report import machine_line, write_section  # noqa: E402
from processors.delay.topics import ensure_topics  # noqa: E402
from processors.freshness import SOURCES, Tracker, query  # noqa: E402
from segscope_schemas import altmark_block as ab  # noqa: E402
from segscope_schemas import names  # noqa: E402
from segscope_schemas.stamp_record import STAMP_RECORD_DTYPE, encode_batch  # noqa: E402

NS = 1_000_000_000
SECTION = "freshness"
WARMUP_S = 10.0
NODES = 10


def tai_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_TAI)


def drive_stamp(
    bootstrap: str,
    topic: str,
    sessions: int,
    rate: int,
    batch_ms: int,
    per_node: bool,
    stop: threading.Event,
    out: dict,
):
    """Records of `sessions` sessions at `rate` pps each, T1 on a grid of 1/rate s, produced every
    batch_ms with the records whose T1 (and T4 = T1 + 1.2 ms) lie before now."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": "lz4", "acks": "all"})
    step = NS // rate
    keys = [(f"fresh{n % NODES}", n // NODES + 1) for n in range(sessions)]
    next_t1 = (tai_ns() // step + 1) * step
    seq, batch_seq, records, late_s = 0, 0, 0, 0.0
    tick = batch_ms / 1000
    next_tick = time.monotonic() + tick
    while not stop.is_set():
        now = tai_ns()
        t1 = np.arange(next_t1, now - 1_200_000, step, dtype=np.int64)
        if len(t1):
            next_t1 = int(t1[-1]) + step
            r = np.zeros(len(t1), dtype=STAMP_RECORD_DTYPE)
            r["sender_seq"] = np.arange(seq, seq + len(t1))
            r["t1_ns"] = t1
            r["t2_ns"] = t1 + 500_000
            r["t3_ns"] = t1 + 510_000
            r["t4_ns"] = t1 + 1_010_000
            seq += len(t1)
            if per_node:  # one message per node with all its sessions' records
                for node in sorted({n for n, _ in keys}):
                    ssids = [ssid for n, ssid in keys if n == node]
                    rs = np.concatenate([r] * len(ssids))
                    rs["ssid"] = np.repeat(ssids, len(r))
                    p.produce(topic, encode_batch(rs, node, batch_seq), key=node.encode())
                    batch_seq += 1
                    records += len(rs)
            else:
                for node, ssid in keys:
                    r["ssid"] = ssid
                    p.produce(topic, encode_batch(r, node, batch_seq), key=f"{node}/{ssid}".encode())
                    batch_seq += 1
                    records += len(r)
            p.poll(0)
        next_tick += tick
        wait = next_tick - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        else:
            late_s = max(late_s, -wait)
            next_tick = time.monotonic()
    p.flush(30)
    out.update(records=records, messages=batch_seq, driver_late_s=late_s)


def drive_altmark(bootstrap: str, topic: str, flows: int, period_ms: int, stop: threading.Event, out: dict):
    """Each flow's tx and rx record of every block, produced at block end + T/2 (the collector's
    read margin), 1 % loss."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    period = period_ms * 1_000_000
    index = tai_ns() // period + 1  # the first block that starts after now
    blocks = 0
    while not stop.is_set():
        read_at = (index + 1) * period + period // 2
        while not stop.is_set() and tai_ns() < read_at:
            time.sleep(min(0.05, max(0.0, (read_at - tai_ns()) / NS)))
        if stop.is_set():
            break
        for flow in range(1, flows + 1):
            for node, direction, packets in (("fresh-tx", ab.DIR_TX, 1000), ("fresh-rx", ab.DIR_RX, 990)):
                r = np.zeros(1, dtype=ab.ALTMARK_BLOCK_DTYPE)
                r["block_index"], r["block_start_ns"] = index, index * period
                r["colour"], r["period_ms"], r["flow_id"] = index & 1, period_ms, 9000 + flow
                r["direction"], r["method"], r["boot_id"] = direction, ab.METHOD_DSCP, 1
                r["packets"], r["bytes"] = packets, packets * 1200
                p.produce(topic, ab.encode_batch(r, node, blocks), key=ab.kafka_key(node, 9000 + flow))
                blocks += 1
        p.poll(0)
        index += 1
    p.flush(30)
    out.update(block_records=blocks)


def start(module: str, args: list[str], log: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=f"{REPO}:{REPO / 'schemas' / 'python'}")
    for name in ("DELAY", "LOSS"):  # health probes on any free port: the defaults may be taken
        env.setdefault(f"SEGSCOPE_{name}_HEALTH", "127.0.0.1:0")
    with open(log, "w") as f:
        return subprocess.Popen(
            [sys.executable, "-m", module, *args], cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT
        )


def stop_proc(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def wait_for(log: Path, text: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise RuntimeError(f"{log}: no {text!r} within {timeout} s:\n{log.read_text(errors='replace')[-2000:]}")


def stats(values: list[float]) -> dict:
    if not values:
        return {"n": 0, "p50": float("nan"), "p99": float("nan"), "max": float("nan"), "min": float("nan")}
    a = np.asarray(values) / 1000
    p50, p99 = np.percentile(a, [50, 99])
    return {"n": len(a), "p50": p50, "p99": p99, "max": a.max(), "min": a.min()}


def telegraf_setting(run_dir: Path, key: str) -> str:
    conf = (run_dir / "telegraf" / "telegraf.conf").read_text()
    m = re.search(rf"^\s*{key}\s*=\s*(\S+)", conf, re.M)
    return m.group(1).strip('"') if m else "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port-base", type=int, help="port base of a running isolated stack (with --run-dir)")
    ap.add_argument("--run-dir", help="run dir of that stack")
    ap.add_argument("--sessions", type=int, default=100)
    ap.add_argument("--rate", type=int, default=100, help="packets/s per session")
    ap.add_argument(
        "--batch-ms", type=int, default=200, help="the driver's message period (the streamer's --linger-ms)"
    )
    ap.add_argument(
        "--per-session",
        action="store_true",
        help="one message per session (the streamer's --key session) instead of per node (--key node)",
    )
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--flows", type=int, default=4)
    ap.add_argument("--period-ms", type=int, default=1000)
    ap.add_argument("--grace-s", type=float, help="delay processor SEGSCOPE_DELAY_GRACE_S (default: its own)")
    ap.add_argument("--delay-flush-s", type=float, help="delay processor flush interval (default: its own)")
    ap.add_argument("--loss-flush-s", type=float, help="loss processor flush interval (default: its own)")
    ap.add_argument("--poll-s", type=float, default=0.2, help="InfluxDB poll period = the samples' error bound")
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()

    from services.stack import Stack

    own = args.port_base is None
    stack = Stack(run_dir=args.run_dir or "/tmp/bench-freshness-stack", port_base=args.port_base or 29880, fresh=own)
    if own:
        stack.up()
    bootstrap, influx = stack.kafka_bootstrap, stack.influx_url
    run = uuid.uuid4().hex[:8]
    records_topic, blocks_topic = f"bench.fresh.{run}.records", f"bench.fresh.{run}.blocks"
    ensure_topics(bootstrap, [records_topic, blocks_topic], partitions=2)
    ensure_topics(bootstrap, [f"bench.fresh.{run}.dl", names.TOPIC_METRICS])
    tmp = Path(tempfile.mkdtemp(prefix="bench-fresh-"))
    common = ["--bootstrap", bootstrap, "--metrics-topic", names.TOPIC_METRICS]
    common += ["--deadletter-topic", f"bench.fresh.{run}.dl", "-l", "info"]
    delay_args = ["--records-topic", records_topic, "--app-id", f"bench-fresh-delay-{run}"]
    delay_args += ["--datadir", str(tmp / "delay")]
    if args.grace_s is not None:
        delay_args += ["--grace-s", str(args.grace_s)]
    if args.delay_flush_s is not None:
        delay_args += ["--flush-interval-s", str(args.delay_flush_s)]
    loss_args = ["--blocks-topic", blocks_topic, "--app-id", f"bench-fresh-loss-{run}"]
    loss_args += ["--datadir", str(tmp / "loss")]
    if args.loss_flush_s is not None:
        loss_args += ["--flush-interval-s", str(args.loss_flush_s)]
    procs = [
        start("processors.delay", common + delay_args, tmp / "delay.log"),
        start("processors.loss", common + loss_args, tmp / "loss.log"),
    ]
    fresh_env_args = ["--influx-url", influx, "--bootstrap", bootstrap, "--report-s", "10"]
    stop = threading.Event()
    stamp_out: dict = {}
    loss_out: dict = {}
    threads = []
    tracker = Tracker()
    samples = {m: [] for m in SOURCES}
    idle_closed = {m: 0 for m in SOURCES}  # samples of the sessions' last second, left out
    cpu0 = {}
    try:
        wait_for(tmp / "delay.log", f"| {records_topic} ")
        wait_for(tmp / "loss.log", f"| {blocks_topic}")
        procs.append(start("processors.freshness", fresh_env_args, tmp / "freshness.log"))
        threads = [
            threading.Thread(
                target=drive_stamp,
                args=(
                    bootstrap,
                    records_topic,
                    args.sessions,
                    args.rate,
                    args.batch_ms,
                    not args.per_session,
                    stop,
                    stamp_out,
                ),
            ),
            threading.Thread(
                target=drive_altmark, args=(bootstrap, blocks_topic, args.flows, args.period_ms, stop, loss_out)
            ),
        ]
        for t in threads:
            t.start()
        t_start, t_start_ns = time.monotonic(), time.time_ns()
        load = [os.getloadavg()[0]]
        cpu0 = {p.pid: cpu_s(p.pid) for p in procs[:2]}
        first = True
        stop_ns = None  # UTC when the driver stopped
        while time.monotonic() - t_start < args.duration + 5:
            now = time.time_ns()
            for m, (q, _) in SOURCES.items():
                before = len(tracker.samples[m])
                tracker.observe(m, query(influx, stack.influx_db, None, q), now, first_poll=first)
                for ms in tracker.samples[m][before:] if time.monotonic() - t_start >= WARMUP_S else ():
                    # A session's last second before the driver stopped never sees a record past its
                    # end + grace: the idle rule closes it (SEGSCOPE_DELAY_IDLE_S after the last
                    # record), which is how a stopped session ends, not the freshness of a running one.
                    if m == "stamp_delay" and stop_ns is not None and now - ms * 1e6 >= stop_ns - NS:
                        idle_closed[m] += 1
                    else:
                        samples[m].append(ms)
                tracker.samples[m] = []
            first = False
            if time.monotonic() - t_start >= 5 * len(load):
                load.append(os.getloadavg()[0])  # every 5 s: how busy the others on the machine keep it
            if time.monotonic() - t_start >= args.duration and stop_ns is None:
                stop.set()  # the last 5 s: the pipeline drains while the poll goes on
                stop_ns = time.time_ns()
            time.sleep(max(0.0, args.poll_s - (time.time_ns() - now) / NS))
        cpu = {p.pid: cpu_s(p.pid) - cpu0[p.pid] for p in procs[:2]}
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
        for p in procs:
            stop_proc(p)
    monitor = query(
        influx,
        stack.influx_db,
        None,
        'SELECT "samples", "estimated", "p50_ms", "p99_ms", "max_ms" FROM "segscope_freshness" '
        f'WHERE time >= {t_start_ns} GROUP BY "measurement"',
    )
    if own:
        stack.down()

    d, lo = stats(samples["stamp_delay"]), stats(samples["altmark_loss"])
    period_s = args.period_ms / 1000
    loss_target = period_s / 2 + 2
    rate = stamp_out.get("records", 0) / args.duration
    flush = telegraf_setting(stack.run_dir, "flush_interval")
    from processors.delay.config import DelayConfig
    from processors.loss.config import LossConfig

    delay_cfg, loss_cfg = DelayConfig.from_env({}), LossConfig.from_env({})  # the defaults
    grace = delay_cfg.grace_s if args.grace_s is None else args.grace_s
    delay_flush = delay_cfg.flush_interval_s if args.delay_flush_s is None else args.delay_flush_s
    loss_flush = loss_cfg.flush_interval_s if args.loss_flush_s is None else args.loss_flush_s
    settings = (
        f"delay grace {grace} s (idle {delay_cfg.idle_s} s), delay flush every {delay_flush} s, loss flush every "
        f"{loss_flush} s, Telegraf flush_interval {flush}"
    )
    print(f"settings: {settings}")
    load_text = f"1-min load average during the run {min(load):.1f}..{max(load):.1f} (2 cores)"
    print(load_text)
    print(
        f"driver: {stamp_out.get('records', 0):,} STAMP records ({rate:,.0f}/s) in {stamp_out.get('messages', 0):,} "
        f"messages, most late tick {stamp_out.get('driver_late_s', 0):.3f} s; {loss_out.get('block_records', 0)} "
        f"block records; CPU s over the run: delay worker {cpu[procs[0].pid]:.1f}, loss worker {cpu[procs[1].pid]:.1f}"
    )
    print(
        f"stamp_delay packet-to-InfluxDB: n={d['n']} p50 {d['p50']:.2f} s, p99 {d['p99']:.2f} s, "
        f"max {d['max']:.2f} s, min {d['min']:.2f} s (target p99 <= 2 s: {'met' if d['p99'] <= 2 else 'MISSED'})"
    )
    print(
        f"altmark_loss block end to visible: n={lo['n']} p50 {lo['p50']:.2f} s, p99 {lo['p99']:.2f} s, "
        f"max {lo['max']:.2f} s (target <= T/2 + 2 = {loss_target:.1f} s: "
        f"{'met' if lo['max'] <= loss_target else 'MISSED'})"
    )
    monitor_lines = []
    for s in monitor:
        for row in s["values"]:
            monitor_lines.append(f"{s['tags']['measurement']}: {row[1:]}")
    print("segscope-freshness reports (samples, estimated, p50_ms, p99_ms, max_ms):")
    for line in monitor_lines:
        print("  ", line)
    print(f"left out: {idle_closed['stamp_delay']} stamp_delay samples of the sessions' last second (idle rule)")
    print(f"logs: {tmp}")

    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = f"""## Freshness: packet-to-InfluxDB delay (`bench/freshness.py`)

Run {date} on {machine_line()}; Kafka, InfluxDB, Telegraf, both processors and the driver on
the same machine (2 cores, shared with other engineers' test runs). Settings: {settings}.
Load: {args.sessions} STAMP sessions x {args.rate} pps = {rate:,.0f} records/s for {args.duration:.0f} s
(live CLOCK_TAI times, one message per {'session' if args.per_session else 'node (10 sessions)'} every {args.batch_ms} ms) through one delay worker;
{args.flows} alternate-marking flows at T = {args.period_ms} ms (tx and rx record at block end + T/2)
through one loss worker. CPU over the run: delay worker {cpu[procs[0].pid]:.1f} s, loss worker
{cpu[procs[1].pid]:.1f} s; {load_text}. Samples after a {WARMUP_S:.0f} s warm-up, InfluxDB polled every {args.poll_s} s
(samples are upper bounds, too large by at most that). Left out: the {idle_closed["stamp_delay"]} `stamp_delay` samples of
each session's last second when the driver stopped (no later record closes it: the idle rule does,
`SEGSCOPE_DELAY_IDLE_S` after the session's last record; that is how a stopped session ends, not
the freshness of a running one).

| measurement | samples | p50 | p99 | max | target |
| --- | --- | --- | --- | --- | --- |
| `stamp_delay`: visible − newest T1 | {d['n']} | {d['p50']:.2f} s | **{d['p99']:.2f} s** | {d['max']:.2f} s | p99 ≤ 2 s: {'met' if d['p99'] <= 2 else 'missed'} |
| `altmark_loss`: visible − block end | {lo['n']} | {lo['p50']:.2f} s | {lo['p99']:.2f} s | **{lo['max']:.2f} s** | ≤ T/2 + 2 s = {loss_target:.1f} s: {'met' if lo['max'] <= loss_target else 'missed'} |

Command: `.local/venv/bin/python bench/freshness.py {' '.join(sys.argv[1:])}`.
"""  # noqa: E501 - markdown report: one table row or paragraph per line
    if not args.no_docs:
        write_section(SECTION, text)
        print("updated docs/benchmarks.md")
    return 0


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (and its reaped children) from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    sys.exit(main())
