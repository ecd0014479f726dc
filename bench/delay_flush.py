"""Benchmark: CPU per closed session-second of the delay aggregator's flush, old vs new.

    .local/venv/bin/python bench/delay_flush.py [--rounds 7] [--rows 100x100,1000x100,100x1000] [--no-docs]

A row SxR is S sessions at R records per session-second, in 100-ms batches per session (the
streamer's shape), 2 seconds of data plus the 0.5 s grace. Per round and implementation: a fresh
DelayAggregator ingests them (not timed), then one flush closes the 2 x S session-seconds
(timed: process CPU time). "old" is the aggregator before the flush computed all closed seconds'
statistics in one vectorised pass (tests/processors/delay_aggregate_reference.py, one numpy
percentile/mean/histogram per second and direction); "new" is processors/delay/aggregate.py. Both
run in this process, interleaved, the order alternating per round; the median round is reported,
and every round checks that both emitted the same lines. Results go to stdout and, unless
--no-docs, to the "delay_flush" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "schemas" / "python")]
import numpy as np  # noqa: E402

from bench.report import machine_line, write_section  # noqa: E402
from processors.delay.aggregate import NS_PER_S, DelayAggregator  # noqa: E402
from segscope_schemas.stamp_record import STAMP_RECORD_DTYPE  # noqa: E402
from tests.processors.delay_aggregate_reference import DelayAggregator as OldAggregator  # noqa: E402

SECTION = "delay_flush"
GRACE_S = 0.5  # the delay processor's default
SECONDS = 2  # closed per session and round
BATCHES_PER_S = 10
SYNCED_EE = 0x8000 | (0x01 << 8) | 0x20


def make_batches(sessions: int, rate: int, start_s: int) -> list[tuple[str, np.ndarray]]:
    """(node, records) per 100 ms and session, 10 sessions per node, SECONDS + grace of data."""
    rng = np.random.default_rng(1)
    per_batch = rate // BATCHES_PER_S
    out = []
    for b in range(int((SECONDS + GRACE_S + 0.1) * BATCHES_PER_S)):
        for s in range(sessions):
            seq = b * per_batch + np.arange(per_batch)
            r = np.zeros(per_batch, dtype=STAMP_RECORD_DTYPE)
            r["ssid"] = s % 10 + 1
            r["sender_seq"] = seq
            t1 = start_s * NS_PER_S + (seq * NS_PER_S) // rate
            fwd = rng.integers(1_000_000, 3_000_000, per_batch)
            rev = rng.integers(500_000, 1_500_000, per_batch)
            r["t1_ns"] = t1
            r["t2_ns"] = t1 + fwd
            r["t3_ns"] = t1 + fwd + 10_000
            r["t4_ns"] = t1 + fwd + 10_000 + rev
            r["sender_err_est"] = r["reflector_err_est"] = SYNCED_EE
            out.append((f"R{s // 10}", r))
    return out


def flush_cpu(cls, batches: list[tuple[str, np.ndarray]], now_ns: int) -> tuple[float, list[str]]:
    agg = cls(grace_s=GRACE_S, path_of=lambda node, ssid: f"fc00:{node}::{ssid},fc00::e")
    for node, records in batches:
        agg.ingest(node, records, now_tai_ns=now_ns)
    t0 = time.process_time()
    lines = agg.flush(now_ns)
    return time.process_time() - t0, lines


def bench_row(sessions: int, rate: int, rounds: int) -> dict:
    start_s = time.clock_gettime_ns(time.CLOCK_TAI) // NS_PER_S - 3600
    batches = make_batches(sessions, rate, start_s)
    now_ns = time.clock_gettime_ns(time.CLOCK_TAI)  # not idle: seconds close by data time
    cpu = {"old": [], "new": []}
    closed = sessions * SECONDS
    for r in range(rounds):
        order = [("old", OldAggregator), ("new", DelayAggregator)]
        got = {}
        for name, cls in order if r % 2 == 0 else order[::-1]:
            seconds_cpu, got[name] = flush_cpu(cls, batches, now_ns)
            cpu[name].append(seconds_cpu)
        if got["old"] != got["new"]:
            raise SystemExit(f"{sessions}x{rate}: old and new emitted different lines")
        if len(got["new"]) != closed * 3 * 2:
            raise SystemExit(f"{sessions}x{rate}: {len(got['new'])} lines, want {closed * 6}")
    old, new = statistics.median(cpu["old"]), statistics.median(cpu["new"])
    return {
        "sessions": sessions,
        "rate": rate,
        "closed": closed,
        "old_us": old / closed * 1e6,
        "new_us": new / closed * 1e6,
        "old_all": cpu["old"],
        "new_all": cpu["new"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--rows", default="100x100,1000x100,100x1000", help="SESSIONSxRECORDS_PER_S,...")
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()
    env_line = machine_line()
    rows = []
    for spec in args.rows.split(","):
        sessions, rate = (int(x) for x in spec.split("x"))
        row = bench_row(sessions, rate, args.rounds)
        rows.append(row)
        print(
            f"{sessions} sessions x {rate} records/s: {row['closed']} session-seconds per flush, CPU per closed "
            f"session-second old {row['old_us']:.0f} us, new {row['new_us']:.0f} us "
            f"({row['old_us'] / row['new_us']:.1f}x less); old rounds "
            f"{[round(x * 1e3, 1) for x in row['old_all']]} ms, new {[round(x * 1e3, 1) for x in row['new_all']]} ms",
            flush=True,
        )
    table = "\n".join(
        f"| {r['sessions']:,} x {r['rate']:,} | {r['closed']:,} "
        f"| {r['old_us']:.0f} µs ({r['old_us'] / r['rate']:.2f} µs/record) "
        f"| **{r['new_us']:.0f} µs** ({r['new_us'] / r['rate']:.2f} µs/record) | {r['old_us'] / r['new_us']:.1f}x |"
        for r in rows
    )
    text = f"""## Delay processor: flush CPU per closed session-second (`bench/delay_flush.py`)

Run {time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())} on {env_line}; one process, no Kafka.
Per row: S sessions at R records per session-second in 100-ms batches, {SECONDS} s of data + the {GRACE_S} s grace,
ingested into a fresh aggregator, then one `flush()` closes the {SECONDS} x S session-seconds (3 directions each:
`stamp_delay` + `stamp_delay_histogram` lines); its process CPU time is divided by the session-seconds closed.
old = the aggregator before the vectorised flush (`tests/processors/delay_aggregate_reference.py`: numpy
percentile, mean and histogram per second and direction); new = `processors/delay/aggregate.py` (one pass over
all seconds closed in the flush). Interleaved, order alternating, {args.rounds} rounds, median; every round
checks that both emitted the same lines.

| sessions x records/s | session-seconds per flush | old: CPU per session-second | new | less CPU |
| --- | --- | --- | --- | --- |
{table}

Command: `.local/venv/bin/python bench/delay_flush.py --rounds {args.rounds} --rows {args.rows}`.
"""
    if not args.no_docs:
        write_section(SECTION, text)


if __name__ == "__main__":
    main()
