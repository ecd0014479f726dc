"""Benchmark: in-line IOAM records per CPU-second of the in-line processor's worker.

    .local/venv/bin/python bench/inline_records.py [--records 1000000] [--batch 200,1000,3900]
        [--flows 4] [--rate 25000] [--transit 3] [--rounds 3] [--scaling-rounds 5]
        [--bootstrap HOST:PORT] [--no-docs]

1. Pure core: decode_batch + InlineAggregator.ingest per message, then flush, one process, no
   Kafka (CPU time of this process).
2. Worker, per batch size: the product worker (`python -m processors.inline`, pinned to CPU 1)
   starts on a fresh topic; once it owns its partitions the bench reads its CPU time (utime +
   stime, /proc/<pid>/stat), produces the records (lz4, as a streamer does), waits until every
   expected inline_delay point is on the metrics topic and reads the CPU time again: records per
   CPU-second and CPU per message of the worker (the idle timers for the time the last second
   waits for the idle rule included). --rounds runs per size, fresh worker and topic each.
3. Scaling: one worker vs. two workers of one group on a 2-partition topic (flow f on partition
   f mod 2, each worker pinned to a CPU of its own), rounds alternating; the figure is records /
   the busiest of two workers' CPU seconds over records / one worker's CPU seconds.

Data: `--flows` flows at `--rate` sampled packets/s each (transmit times one hour ago), every
packet through `--transit` IOAM transit nodes (the trace the records carry: ingress + transit
entries), one-way and hop delays random; messages of `--batch` records of one flow (the egress
streamer batches one flow's records per message). Every run checks it received each expected
point exactly once. Without --bootstrap a Kafka-only stack of its own on --port-base.
Results: stdout and, unless --no-docs, the "inline_records" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "schemas" / "python")]
import numpy as np  # noqa: E402

from bench.process_cpu import cpu_seconds, pinned, stop  # noqa: E402
from bench.processor_records import produce  # noqa: E402
from bench.report import kafka_only_stack, machine_line, write_section  # noqa: E402
from bench.trees import archived_tree, short_commit  # noqa: E402
from processors.delay.topics import ensure_topics  # noqa: E402
from processors.inline.aggregate import InlineAggregator  # noqa: E402
from segscope_schemas import ioam_record as ir  # noqa: E402
from tests.processors.inline_records import Hop, records  # noqa: E402

NS = 1_000_000_000
SECTION = "inline_records"
FLUSH_INTERVAL_S = 0.25
PARTITIONS = 2


def owned_partitions(log: Path, topic: str) -> tuple[set[int] | None, int]:
    """(the partitions of `topic` the worker's last assignment gave it, None before the first; how
    many assignments it logged), from PartitionMoves' `rebalance: own <topic>[0, 1] ...` lines."""
    pattern = re.compile(r"rebalance: own (.*)")
    owns = [m.group(1) for m in pattern.finditer(log.read_text(errors="replace"))]
    if not owns:
        return None, 0
    mine = re.search(re.escape(topic) + r"\[([0-9, ]*)\]", owns[-1])
    return ({int(x) for x in mine.group(1).split(",") if x.strip()} if mine else set()), len(owns)


def make_messages(n_records: int, batch: int, flows: int, rate: int, transit: int):
    """(key, value, flow index) messages, flows interleaved, and the (flow, second) pairs: the
    inline_delay points the worker must emit."""
    rng = np.random.default_rng(1)
    per_flow = n_records // flows
    start = (time.clock_gettime_ns(time.CLOCK_TAI) // NS - 3600) * NS
    ingress = Hop(1, 0xFFFF, 11, 64)
    hops = [Hop(10 + k, 100 + 2 * k, 101 + 2 * k, 63 - k) for k in range(transit)]
    by_flow, points = [], 0
    for f in range(flows):
        seq = np.arange(per_flow)
        tx = start + (seq * NS) // rate
        t, times = tx, []
        for _ in hops:
            t = t + rng.integers(100_000, 900_000, per_flow)
            times.append(t)
        rx = t + rng.integers(50_000, 200_000, per_flow)
        recs = records(f + 1, seq, tx, rx, ingress, list(zip(hops, times)))
        points += len(np.unique(tx // NS))
        key = f"bench-egress/{f + 1}".encode()
        by_flow.append([(key, ir.encode_batch(recs[i : i + batch], "bench-egress", i // batch), f)
                        for i in range(0, per_flow, batch)])  # fmt: skip
    messages = [m for group in zip(*by_flow) for m in group]
    return messages, points


def bench_pure(messages) -> tuple[float, float]:
    """(records per CPU-second of decode + ingest + flush, of decode + ingest alone)."""
    agg = InlineAggregator()
    c0 = time.process_time()
    for _, value, _ in messages:
        hdr, recs = ir.decode_batch(value)
        agg.ingest(hdr.node, recs)
    c_ingest = time.process_time() - c0
    agg.flush_all()
    c_all = time.process_time() - c0
    n = agg.counters.records_in
    return n / c_all, n / c_ingest


def worker_argv(bootstrap: str, topics: dict, app_id: str, datadir: Path) -> list[str]:
    """The product worker, `python -m processors.inline`, on the bench's topics."""
    return [sys.executable, "-m", "processors.inline", "--bootstrap", bootstrap, "--records-topic",
            topics["records"], "--metrics-topic", topics["metrics"], "--deadletter-topic", topics["deadletter"],
            "--paths-topic", topics["paths"], "--app-id", app_id, "--datadir", str(datadir),
            "--flush-interval-s", str(FLUSH_INTERVAL_S), "-l", "info"]  # fmt: skip


def run(
    bootstrap: str, messages, n_records: int, expected: int, n_workers: int, timeout_s: float, tree: Path = REPO
) -> dict:
    """n_workers workers of one group (CPU 1; two: CPU 0 and 1) on a fresh 2-partition topic;
    their CPU time from "the group has settled" to "every inline_delay point is out"."""
    from confluent_kafka import Consumer

    run_id = uuid.uuid4().hex[:8]
    topics = {k: f"bench.inline.{run_id}.{k}" for k in ("records", "metrics", "deadletter", "paths")}
    ensure_topics(bootstrap, [topics["records"]], partitions=PARTITIONS)
    ensure_topics(bootstrap, [topics["metrics"], topics["deadletter"]])
    ensure_topics(bootstrap, [topics["paths"]], config={"cleanup.policy": "compact"})
    tmp = Path(tempfile.mkdtemp(prefix="bench-inline-"))
    cpus = {1: [1], 2: [0, 1]}[n_workers]
    env = dict(os.environ, PYTHONPATH=f"{tree}:{tree / 'schemas' / 'python'}", SEGSCOPE_INLINE_HEALTH="127.0.0.1:0")
    logs = [tmp / f"w{i}.log" for i in range(n_workers)]
    workers = []
    for i, cpu in enumerate(cpus):
        with open(logs[i], "w") as log:
            argv = pinned(cpu, worker_argv(bootstrap, topics, f"bench-inline-{run_id}", tmp / f"faust{i}"))
            workers.append(subprocess.Popen(argv, cwd=tree, env={**env, "SEGSCOPE_INSTANCE": f"w{i}"}, stdout=log,
                                            stderr=subprocess.STDOUT))  # fmt: skip
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-inline-{run_id}-reader",
                       "auto.offset.reset": "earliest", "enable.auto.commit": False})  # fmt: skip
    reader.subscribe([topics["metrics"]])
    points: set[str] = set()
    lines = 0
    counters: dict[str, dict[str, int]] = {}

    def read(timeout: float) -> None:
        nonlocal lines
        for msg in reader.consume(num_messages=500, timeout=timeout):
            if msg.error():
                continue
            for line in msg.value().decode().split("\n"):
                if line.startswith("inline_delay,"):
                    head, _, ts = line.rsplit(" ", 2)
                    points.add(f"{head} {ts}")
                    lines += 1
                elif line.startswith("segscope_processor,"):
                    instance = re.search(r",instance=([^, ]+)", line).group(1)
                    body = line.rsplit(" ", 2)[1]
                    counters[instance] = {k: int(v[:-1]) for k, v in (kv.split("=") for kv in body.split(","))}

    try:
        deadline = time.monotonic() + 120
        while True:
            for w, log in zip(workers, logs):
                if w.poll() is not None:
                    raise RuntimeError(f"worker exited {w.returncode}; log {log}")
            shares = [owned_partitions(log, topics["records"])[0] for log in logs]
            if all(s is not None and len(s) == PARTITIONS // n_workers for s in shares):
                if set().union(*shares) == set(range(PARTITIONS)):
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the group did not settle: {shares}; logs in {tmp}")
            read(0.2)
        assignments = [owned_partitions(log, topics["records"])[1] for log in logs]
        cpu_start = [cpu_seconds(w.pid) for w in workers]
        t0 = time.monotonic()
        produce_s = produce(bootstrap, topics["records"], [(k, v) for k, v, _ in messages],
                            partition_of=dict((k, f % PARTITIONS) for k, _, f in messages).get)  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while len(points) < expected:
            if time.monotonic() > deadline:
                raise RuntimeError(f"timeout with {len(points)} of {expected} points; logs in {tmp}")
            read(0.5)
        wall = time.monotonic() - t0
        cpu = [cpu_seconds(w.pid) - c for w, c in zip(workers, cpu_start)]
        t_end = time.monotonic()
        while time.monotonic() - t_end < 3 * FLUSH_INTERVAL_S + 1.0:  # a late second emission would show now
            read(0.2)
        rebalanced = sum(owned_partitions(log, topics["records"])[1] - n for log, n in zip(logs, assignments))
    finally:
        reader.close()
        stop(workers)
    per_worker = [counters.get(f"w{i}", {}) for i in range(n_workers)]
    return {
        "workers": n_workers,
        "cpus": cpus,
        "cpu_s": cpu,
        "wall_s": wall,
        "produce_s": produce_s,
        "per_cpu_s": n_records / sum(cpu),
        "per_busiest_cpu_s": n_records / max(cpu),
        "records_in": [c.get("records_in", 0) for c in per_worker],
        "reemitted": sum(c.get("seconds_reemitted", 0) for c in per_worker),
        "points": len(points),
        "lines": lines,
        "rebalances_during": rebalanced,
        "logs": str(tmp),
    }


def check(res: dict, n_records: int, expected: int) -> None:
    """Every point there, once (a second twice only where the worker counted it re-emitted), every
    record taken by a worker, no rebalance in the window."""
    assert res["points"] == expected, (res, expected)
    assert res["lines"] - res["points"] <= res["reemitted"], res
    assert sum(res["records_in"]) == n_records, (res["records_in"], n_records)
    assert res["rebalances_during"] == 0, res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--batch", default="200,1000,3900", help="records per Kafka message, a comma list")
    ap.add_argument("--flows", type=int, default=4)
    ap.add_argument("--rate", type=int, default=25_000, help="sampled packets/s per flow in the data")
    ap.add_argument("--transit", type=int, default=3, help="IOAM transit nodes every packet passes")
    ap.add_argument("--rounds", type=int, default=3, help="one-worker runs per batch size")
    ap.add_argument("--scaling-batch", type=int, default=1000)
    ap.add_argument("--scaling-rounds", type=int, default=5, help="rounds of (1 worker, 2 workers); 0: none")
    ap.add_argument("--bootstrap", help="use this Kafka instead of starting one")
    ap.add_argument("--port-base", type=int, default=29460)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument(
        "--before",
        default="3839679",
        help="commit whose worker runs next to this tree's in the per-size runs ('': this tree only)",
    )
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()
    if args.flows % PARTITIONS:
        ap.error(f"--flows must be a multiple of {PARTITIONS}: each partition gets the same flows")
    batches = [int(b) for b in args.batch.split(",") if b.strip()]
    env_line = machine_line()
    rows, scaling = [], []
    trees = [("after", REPO)]
    if args.before:
        trees.insert(0, (f"before ({short_commit(args.before)})", archived_tree(args.before)))

    def measure(bootstrap: str) -> None:
        for batch in batches:
            messages, expected = make_messages(args.records, batch, args.flows, args.rate, args.transit)
            n = sum(len(v) - 56 for _, v, _ in messages) // ir.IOAM_RECORD_SIZE
            pure, pure_ingest = bench_pure(messages)
            print(f"[batch {batch}] pure: {pure:,.0f} records/CPU-s (ingest alone {pure_ingest:,.0f})", flush=True)
            runs: dict[str, list] = {name: [] for name, _ in trees}
            for r in range(args.rounds):
                for name, tree in trees:  # alternately: the same machine load for both
                    res = run(bootstrap, messages, n, expected, 1, args.timeout, tree)
                    check(res, n, expected)
                    print(f"[batch {batch} round {r + 1} {name}] {res}", flush=True)
                    runs[name].append(res)
            rows.append((batch, len(messages), n, expected, runs, pure, pure_ingest))
        if args.scaling_rounds:
            messages, expected = make_messages(args.records, args.scaling_batch, args.flows, args.rate, args.transit)
            n = sum(len(v) - 56 for _, v, _ in messages) // ir.IOAM_RECORD_SIZE
            for r in range(args.scaling_rounds):
                for workers in (1, 2):
                    res = run(bootstrap, messages, n, expected, workers, args.timeout)
                    check(res, n, expected)
                    print(f"[scaling round {r + 1}] {res}", flush=True)
                    scaling.append((r + 1, res))

    if args.bootstrap:
        measure(args.bootstrap)
    else:
        with kafka_only_stack("bench-inline", args.port_base) as stack:
            measure(stack.kafka_bootstrap)
    load = os.getloadavg()
    text = report(rows, scaling, args, env_line, load)
    print(text, flush=True)
    if not args.no_docs:
        write_section(SECTION, text)
        print("updated docs/benchmarks.md", flush=True)
    return 0


def report(rows, scaling, args, env_line: str, load) -> str:
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    table = []
    for batch, messages, _, _, by_tree, pure, pure_ingest in rows:
        for name, runs in by_tree.items():
            per_cpu = [r["per_cpu_s"] for r in runs]
            us_per_msg = [r["cpu_s"][0] / messages * 1e6 for r in runs]
            spread = f"{min(per_cpu):,.0f}-{max(per_cpu):,.0f}"
            table.append(
                f"| {name} | {batch} | {messages:,} | **{statistics.median(per_cpu):,.0f}** ({spread}) "
                f"| {statistics.median(us_per_msg):,.0f} | {statistics.median(r['wall_s'] for r in runs):.1f} s "
                f"| {pure:,.0f} | {pure_ingest:,.0f} |"
            )
    text = f"""## In-line processor: IOAM records per CPU-second (`bench/inline_records.py`)

Run {date} on {env_line}; broker, worker and driver on the same machine (load average
{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} over 1 / 5 / 15 min at the end).
Data per row: {rows[0][2] if rows else 0:,} records of {args.flows} flows at {args.rate:,} sampled packets/s each, every packet
through {args.transit} IOAM transit nodes (records of 256 bytes with {args.transit + 1} trace entries), messages of one flow's
records (as the egress streamer batches them), lz4, produced while the worker runs; {rows[0][3] if rows else 0} inline_delay
points expected and received per run (with their histogram, loss and {args.transit + 1} hop points each).
The worker is the product one (`python -m processors.inline`) pinned to CPU 1; its CPU time
(utime + stime of all its threads) from "it owns its partitions" to "every point is out",
idle timers included; {args.rounds} runs per row, each with a fresh worker and topic. "before" is
commit {args.before or "-"} (its tree from `git archive`: Faust's per-event path, one aggregator call per
message), "after" this tree (the batch intake: a fetch's messages in one batch, one aggregator call
per partition and node), alternately in each round.

| worker | records per message | messages | records per CPU-second of the worker, median (range) | worker CPU µs per message, median | wall, produce start to last point | pure core: decode + ingest + flush, per CPU-second | pure: decode + ingest |
| --- | --- | --- | --- | --- | --- | --- | --- |
{chr(10).join(table)}

Goal: ≥ 300 k records per CPU-second per worker at the streamer's batch size: one flow's records
per message, sent every linger period (200 ms, like the STAMP streamer's) or when full: a flow at
1 k sampled packets/s gives ~200 per message, 20 k/s and more full messages. Full is 3 900 records
(1 MB): librdkafka's default message.max.bytes (1 000 000) refuses a 4 000-record ioam_batch
(1 024 056 bytes), so an IOAM streamer cannot use the STAMP streamer's --max-batch 4096.
"""  # noqa: E501 - markdown report
    if scaling:
        ratios, lines = [], []
        for r, res in scaling:
            share = ", ".join(f"{x / sum(res['records_in']):.0%}" for x in res["records_in"])
            lines.append(
                f"| {r} | {res['workers']} (CPU {', '.join(map(str, res['cpus']))}) | **{res['per_cpu_s']:,.0f}** "
                f"| {', '.join(f'{x:.2f}' for x in res['cpu_s'])} "
                f"| {share} | {res['wall_s']:.1f} s |"
            )
            if res["workers"] == 2:
                one = next(o for q, o in scaling if q == r and o["workers"] == 1)
                ratios.append(res["per_busiest_cpu_s"] / one["per_cpu_s"])
        ratio = statistics.median(ratios)
        ones = statistics.median(res["cpu_s"][0] for _, res in scaling if res["workers"] == 1)
        busiest = statistics.median(max(res["cpu_s"]) for _, res in scaling if res["workers"] == 2)
        text += f"""
### Scaling: one worker vs. two workers on two partitions

{args.flows} flows, {args.scaling_batch} records per message, flow f on partition f mod 2 (each of two workers
gets half the records); one worker pinned to CPU 1, two workers of one group to CPU 0 and CPU 1;
rounds alternate, fresh workers and topic each run. Scaling figure = records / the busiest of the
two workers' CPU seconds over records / the one worker's CPU seconds.

| round | workers (CPU) | records per CPU-second, all workers | CPU seconds per worker | share of records | wall |
| --- | --- | --- | --- | --- | --- |
{chr(10).join(lines)}

Per round: {", ".join(f"{x:.2f}x" for x in ratios)}; median **{ratio:.2f}x** (goal ≥ 1.7x:
**{"met" if ratio >= 1.7 else "NOT met"}**); ratio of the medians {ones / busiest:.2f}x.
"""  # noqa: E501 - markdown report
    text += f"""
Command: `.local/venv/bin/python bench/inline_records.py --records {args.records} --batch {args.batch}
--rounds {args.rounds} --scaling-batch {args.scaling_batch} --scaling-rounds {args.scaling_rounds}`.
"""
    return text


if __name__ == "__main__":
    sys.exit(main())
