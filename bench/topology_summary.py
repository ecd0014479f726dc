"""Benchmark: the summary topic (processors/newest.py) - what it costs the delay and loss workers
per line, and what the topology leader reads with it at 1 000 and 10 000 routers.

    .local/venv/bin/python bench/topology_summary.py [--sessions 2000] [--seconds 30] [--flows 2000]
        [--rounds 5] [--leader-points-per-cpu-s 100840] [--no-docs]

Input: bench/topology_points.py's - the lines the delay and loss processors publish for `sessions`
STAMP sessions (10 packets/s, three directions, stamp_delay + stamp_delay_histogram) and `flows`
flows (T = 1 s) over `seconds` seconds, with one counter line per 100, in calls of 2000 lines
(SEGSCOPE_*_MAX_LINES_PER_MESSAGE's default, what one publish_lines call sends per message).

1. Publisher: NewestLines.take over every call (what the delay worker's publish_lines adds when the
   summary is on; the loss worker instead hands take_known the joiner's list of its complete lines),
   in ns per line handed to publish_lines (histograms and counters included: the prefix test
   rejects them) and per measured line; beside it, what publish_lines already does per line
   ("\\n".join + encode of the message). Rounds interleaved, medians.
2. Reader: TopologyModel.apply_metrics_text + settle over the summary's messages vs over every
   message: points per second of the model's reading (the summary is the same line protocol).
3. The leader's load: series = sessions x 3 directions + flows (docs/capacity.md's assumptions: 10
   sessions and 20 flows per router); points/s = series / S for a summary interval S (S = "every
   point": today's reading, one point per series and second); cores = points/s / the worker's
   points per CPU-second measured by bench/topology_points.py (--leader-points-per-cpu-s).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from statistics import median

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "schemas" / "python")]

from bench.loss_records import make_messages as loss_messages  # noqa: E402
from bench.processor_records import make_messages as stamp_messages  # noqa: E402
from bench.report import machine_line, write_section  # noqa: E402
from bench.topology_points import LINES_PER_MESSAGE, messages_of, product_lines  # noqa: E402
from processors.delay.aggregate import DelayAggregator  # noqa: E402
from processors.loss.join import LossJoiner  # noqa: E402
from processors.newest import NewestLines  # noqa: E402
from processors.topology.model import MEASURED_PREFIXES, TopologyModel  # noqa: E402
from segscope_schemas import altmark_block, stamp_record  # noqa: E402

SECTION = "topology_summary"
SESSIONS_PER_ROUTER, FLOWS_PER_ROUTER = 10, 20  # docs/capacity.md section 2
INTERVALS_S = (5, 10, 15)


def producers_ns_per_line(sessions: int, seconds: int, flows: int) -> tuple[float, float, float, float]:
    """What making a line costs the delay aggregator (ingest + flush, per stamp_delay line: its
    histogram twin included) and the loss joiner (ingest + flush, per altmark_loss line), on
    topology_points' input: the scale for NewestLines.take's cost. And the loss worker's path with
    the summary on: the joiner listing its complete lines (keep_complete, the same run again, the
    difference per line) and NewestLines.take_known over that list, ns per line."""
    msgs, _ = stamp_messages(sessions * 10 * seconds, 1000, sessions, rate=10)
    batches = [stamp_record.decode_batch(value) for _, value in msgs]
    agg = DelayAggregator()
    t0 = time.perf_counter()
    for hdr, recs in batches:
        agg.ingest(hdr.node, recs)
    delay_lines = [line for line in agg.flush_all() if line.startswith("stamp_delay,")]
    delay_s = time.perf_counter() - t0
    blocks = [altmark_block.decode_batch(value) for _, value in loss_messages(flows, seconds, 1000)]
    loss_s, flush_s = {}, {False: [], True: []}
    for _ in range(3):  # the flush alone, with and without the list, alternately: the least of each
        for keep in (False, True):
            joiner = LossJoiner(timeout_s=5, retention_s=5)
            joiner.keep_complete = keep
            t0 = time.perf_counter()
            for hdr, recs in blocks:
                joiner.ingest(hdr.node, recs, 0)
            t1 = time.perf_counter()
            loss_lines = joiner.flush(0)
            t2 = time.perf_counter()
            loss_s[keep] = min(loss_s.get(keep, 1e9), t2 - t0)
            flush_s[keep].append(t2 - t1)
    entries = joiner.complete_out
    assert len(entries) == len(loss_lines)  # every block complete
    held = NewestLines()
    t0 = time.perf_counter()
    held.take_known(entries)
    known_s = time.perf_counter() - t0
    assert len(held) == flows
    per_line = 1e9 / len(loss_lines)
    return (
        delay_s / len(delay_lines) * 1e9,
        loss_s[False] * per_line,
        (min(flush_s[True]) - min(flush_s[False])) * per_line,
        known_s * per_line,
    )


def take_all(calls: list[list[str]]) -> tuple[float, NewestLines]:
    held = NewestLines(LINES_PER_MESSAGE)
    t0 = time.perf_counter()
    for call in calls:
        held.take(call)
    return time.perf_counter() - t0, held


def join_all(calls: list[list[str]]) -> float:
    """publish_lines' own per-line work: the message text and its bytes."""
    t0 = time.perf_counter()
    for call in calls:
        "\n".join(call).encode()
    return time.perf_counter() - t0


def read_all(messages: list[str]) -> tuple[float, int]:
    model = TopologyModel()
    t0 = time.perf_counter()
    for text in messages:
        model.apply_metrics_text(text)
    model.settle()
    return time.perf_counter() - t0, model.counters.points_in + model.counters.points_stale


def leader_table(rate: float) -> list[str]:
    out = [
        "| routers | series (sessions x 3 + flows) | every point (today) | "
        + " | ".join(f"summary S = {s} s" for s in INTERVALS_S)
        + " |",
        "| --- | --- | --- | " + " | ".join("---" for _ in INTERVALS_S) + " |",
    ]
    for routers in (1_000, 10_000):
        series = routers * (SESSIONS_PER_ROUTER * 3 + FLOWS_PER_ROUTER)
        cells = [f"{p / 1000:,.0f} k points/s = {p / rate:.2f} core" for p in [series / s for s in (1, *INTERVALS_S)]]
        out.append(f"| {routers:,} | {series:,} | " + " | ".join(cells) + " |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=2000)
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--flows", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--leader-points-per-cpu-s",
        type=float,
        default=100_840,
        help="the topology worker's points per CPU-second (bench/topology_points.py, docs/benchmarks.md)",
    )
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()
    machine = machine_line()
    lines = product_lines(args.sessions, args.seconds, args.flows)
    calls = [lines[i : i + LINES_PER_MESSAGE] for i in range(0, len(lines), LINES_PER_MESSAGE)]
    measured = sum(1 for line in lines if line.startswith(MEASURED_PREFIXES))
    every_message = messages_of(lines)

    kinds = {
        "stamp_delay": [line for line in lines if line.startswith("stamp_delay,")],
        "stamp_delay_histogram (passed over)": [line for line in lines if line.startswith("stamp_delay_histogram,")],
        "altmark_loss": [line for line in lines if line.startswith("altmark_loss,")],
    }
    kind_ns: dict[str, list[float]] = {name: [] for name in kinds}
    take_ns, join_ns, read_every, read_summary, delay_make_ns, loss_make_ns = [], [], [], [], [], []
    keep_ns, known_ns = [], []
    summary_lines: list[str] = []
    for _ in range(args.rounds):
        elapsed, held = take_all(calls)
        take_ns.append(elapsed / len(lines) * 1e9)
        join_ns.append(join_all(calls) / len(lines) * 1e9)
        for name, of_kind in kinds.items():
            elapsed, _ = take_all(
                [of_kind[i : i + LINES_PER_MESSAGE] for i in range(0, len(of_kind), LINES_PER_MESSAGE)]
            )
            kind_ns[name].append(elapsed / len(of_kind) * 1e9)
        delay_make, loss_make, keep, known = producers_ns_per_line(args.sessions, args.seconds, args.flows)
        delay_make_ns.append(delay_make)
        loss_make_ns.append(loss_make)
        keep_ns.append(keep)
        known_ns.append(known)
        summary_lines = held.drain()
        summary_messages = [body.decode() for body in held.messages(summary_lines)]
        elapsed, points = read_all(every_message)
        read_every.append(points / elapsed)
        # the steady state: the same series every interval (the model's per-series cache is warm)
        elapsed, summary_points = read_all(summary_messages * args.seconds)
        read_summary.append(summary_points / elapsed)
    series = args.sessions * 3 + args.flows
    assert len(summary_lines) == series, (len(summary_lines), series)  # one line per series, none lost

    per_measured = median(take_ns) * len(lines) / measured
    delay_ns, hist_ns, loss_ns = (median(v) for v in kind_ns.values())
    delay_cores = 300_000 * (delay_ns + hist_ns) / 1e9
    loss_path_ns = median(keep_ns) + median(known_ns)  # what the loss worker does with the summary on
    loss_cores = 200_000 * loss_path_ns / 1e9
    text = [
        "## Topology summary topic: the publishers' cost and the leader's load (`bench/topology_summary.py`)",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {machine}.",
        f"Input: bench/topology_points.py's, {args.sessions:,} sessions and {args.flows:,} flows over "
        f"{args.seconds} s: {len(lines):,} lines ({measured:,} stamp_delay / altmark_loss) in "
        f"{len(calls)} publish_lines calls of {LINES_PER_MESSAGE}; the summary of all of it: "
        f"{len(summary_lines):,} lines (= sessions x 3 + flows: one per series). {args.rounds} rounds, "
        "medians (range).",
        "",
        "| per line handed to publish_lines | ns, median (range) |",
        "| --- | --- |",
        f"| NewestLines.take (the summary on), the lines as publish_lines gets them | **{median(take_ns):,.0f}** "
        f"({min(take_ns):,.0f}-{max(take_ns):,.0f}); {per_measured:,.0f} per stamp_delay / altmark_loss line |",
        *[
            f"| NewestLines.take, {name} lines only | {median(v):,.0f} ({min(v):,.0f}-{max(v):,.0f}) |"
            for name, v in kind_ns.items()
        ],
        f"| the loss worker's path: the joiner listing its complete lines (keep_complete: its flush "
        f"with minus without, the least of 3 each) | {median(keep_ns):,.0f} "
        f"({min(keep_ns):,.0f}-{max(keep_ns):,.0f}) |",
        f"| the loss worker's path: NewestLines.take_known over that list | **{median(known_ns):,.0f}** "
        f"({min(known_ns):,.0f}-{max(known_ns):,.0f}) |",
        f"| publish_lines' own join + encode, for scale | {median(join_ns):,.0f} ({min(join_ns):,.0f}-"
        f"{max(join_ns):,.0f}) |",
        f"| the delay aggregator making a stamp_delay line (ingest + flush, its histogram twin included), for scale "
        f"| {median(delay_make_ns):,.0f} ({min(delay_make_ns):,.0f}-{max(delay_make_ns):,.0f}) |",
        f"| the loss joiner making an altmark_loss line (ingest of two block records + flush), for scale "
        f"| {median(loss_make_ns):,.0f} ({min(loss_make_ns):,.0f}-{max(loss_make_ns):,.0f}) |",
        "",
        f"So the summary adds {100 * (delay_ns + hist_ns) / median(delay_make_ns):.0f} % to the delay "
        f"aggregator's cost per line pair and {100 * loss_path_ns / median(loss_make_ns):.0f} % to the loss joiner's "
        "per line (the loss worker hands take_known the joiner's own list, not its lines: take() would add "
        f"{100 * loss_ns / median(loss_make_ns):.0f} %); measured in the same rounds; the workers' Kafka and "
        "Faust work comes on top of both, so the share of a worker's CPU is smaller.",
        "",
        "| TopologyModel reading (apply_metrics_text + settle) | points/s, median (range) |",
        "| --- | --- |",
        f"| every message of segscope.metrics | {median(read_every):,.0f} ({min(read_every):,.0f}-"
        f"{max(read_every):,.0f}) |",
        f"| the summary's messages, {args.seconds} intervals into one model | {median(read_summary):,.0f} "
        f"({min(read_summary):,.0f}-{max(read_summary):,.0f}) |",
        "",
        f"The leader's load (docs/capacity.md: {SESSIONS_PER_ROUTER} sessions and {FLOWS_PER_ROUTER} flows per "
        f"router), cores at {args.leader_points_per_cpu_s:,.0f} points per CPU-second of the topology worker "
        "(bench/topology_points.py's worker row):",
        "",
        *leader_table(args.leader_points_per_cpu_s),
        "",
        "The publishers' side at 10 000 routers: the delay workers hand publish_lines 300 k stamp_delay and "
        "300 k stamp_delay_histogram lines/s, the loss workers 200 k altmark_loss lines/s (one per flow and "
        f"block, i.e. per two block records): {delay_cores:.2f} + {loss_cores:.2f} cores in all for "
        "NewestLines.take and the loss path, spread over the workers.",
        f"Command: `.local/venv/bin/python bench/topology_summary.py --sessions {args.sessions} "
        f"--seconds {args.seconds} --flows {args.flows} --rounds {args.rounds}`.",
    ]
    out = "\n".join(text) + "\n"
    print(out)
    if not args.no_docs:
        write_section(SECTION, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
