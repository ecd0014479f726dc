"""Benchmark: measurement points/s one topology worker reads from segscope.metrics.

    .local/venv/bin/python bench/topology_points.py [--sessions 2000] [--seconds 30] [--flows 2000]
        [--port-base 29740] [--no-docs]

The topology processor has one writer (processors/topology/README.md, "N workers"), and every
worker reads the whole `segscope.metrics` topic: one core's line reading is its limit, and
docs/capacity.md needs that figure.

Input: what the product writes on segscope.metrics, made by the product's own writers: the delay
aggregator's lines (`stamp_delay` + `stamp_delay_histogram`, three directions) for `sessions`
sessions at 10 packets/s over `seconds` seconds, the loss joiner's `altmark_loss` lines for `flows`
flows over the same seconds, and one `segscope_processor` counter line per 100 measurement lines,
packed 2000 lines per message like the delay worker's publish_lines.

1. Pure, one process: TopologyModel.apply_metrics_text per message (this tree), against the way
   the processor read a message until this bench (parse every line, then apply_point), both on
   the same messages, interleaved rounds; points/s = stamp_delay + altmark_loss points taken.
2. The worker (`python -m processors.topology`, pinned to CPU 1 with taskset), ArangoDB = the
   tests' in-process stand-in (tests/topology/arango_standin.py: no ArangoDB can be installed
   here; the worker writes little, since documents change only per edge), on a Kafka-only
   services.stack.Stack: started on empty topics, then the messages are produced; rate = points /
   (produce start to the worker's counters showing every point), and per CPU-second of the worker.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from statistics import median

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "schemas" / "python"), str(REPO / "tests" / "topology")]

from bench.loss_records import make_messages as loss_messages  # noqa: E402
from bench.process_cpu import cpu_seconds  # noqa: E402
from bench.processor_records import make_messages as stamp_messages  # noqa: E402
from bench.processor_records import produce  # noqa: E402
from bench.report import kafka_only_stack, machine_line, write_section  # noqa: E402
from processors.delay.aggregate import DelayAggregator  # noqa: E402
from processors.delay.topics import ensure_topics  # noqa: E402
from processors.loss.join import LossJoiner  # noqa: E402
from processors.topology.model import TopologyModel  # noqa: E402
from segscope_schemas import altmark_block, stamp_record  # noqa: E402
from segscope_schemas.line_protocol import parse_lines  # noqa: E402

SECTION = "topology_points"
LINES_PER_MESSAGE = 2000  # SEGSCOPE_DELAY_MAX_LINES_PER_MESSAGE's default


def product_lines(sessions: int, seconds: int, flows: int) -> list[str]:
    """The lines the delay and loss processors would publish for this load, in publishing order."""
    agg = DelayAggregator()
    msgs, _ = stamp_messages(sessions * 10 * seconds, 1000, sessions, rate=10)
    for _, value in msgs:
        hdr, recs = stamp_record.decode_batch(value)
        agg.ingest(hdr.node, recs)
    lines = agg.flush_all()
    joiner = LossJoiner(timeout_s=5, retention_s=5)
    for _, value in loss_messages(flows, seconds, 1000):
        hdr, recs = altmark_block.decode_batch(value)
        joiner.ingest(hdr.node, recs, 0)
    lines += joiner.flush(0)
    out = []
    for i, line in enumerate(lines):
        out.append(line)
        if i % 100 == 99:  # every process's counters share the topic
            out.append(f"segscope_processor,processor=delay,instance=bench records_in={i}i {time.time_ns()}")
    return out


def messages_of(lines: list[str]) -> list[str]:
    return ["\n".join(lines[i : i + LINES_PER_MESSAGE]) for i in range(0, len(lines), LINES_PER_MESSAGE)]


def parser_at(commit: str):
    """parse_lines of segscope_schemas/line_protocol.py as it was at `commit` (git show)."""
    import importlib.util

    source = subprocess.run(
        ["git", "show", f"{commit}:schemas/python/segscope_schemas/line_protocol.py"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    spec = importlib.util.spec_from_loader(f"line_protocol_{commit}", loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    exec(compile(source, f"line_protocol@{commit}", "exec"), module.__dict__)
    return module.parse_lines


def reader_parse_all(parse):
    """How app.handle_metrics read a message before apply_metrics_text (commit 4edd64a)."""

    def read(model: TopologyModel, text: str) -> None:
        points, bad = parse(text)
        model.counters.malformed_lines += len(bad)
        for p in points:
            model.apply_point(p)

    return read


def read_and_settle(model: TopologyModel, text: str) -> None:
    """This tree: only the measured lines, stamp_delay fields parsed at settle, which the app runs
    every flush (1 s); here after every message (about half a second of this input): no cheaper
    than the app."""
    model.apply_metrics_text(text)
    model.settle()


def read_line_by_line(model: TopologyModel, text: str) -> None:
    """The line loop apply_metrics_text used until commit 0c3e1bf (and still uses for a message with
    escapes or unusual line breaks): every line split on its own, the tags of every measured line
    parsed."""
    model._apply_lines(text)
    model.settle()


def bench_pure(messages: list[str], rounds: int, before: str) -> dict:
    readers = {
        f"parse every line, the parser of {before} (before)": reader_parse_all(parser_at(before)),
        "parse every line, this tree's parser": reader_parse_all(parse_lines),
        "only stamp_delay / altmark_loss lines, line by line, fields at settle (0c3e1bf)": read_line_by_line,
        "one pass per message, tag sets parsed once per series, fields at settle (this tree)": read_and_settle,
    }
    rates: dict[str, list[float]] = {name: [] for name in readers}
    points = {}
    for _ in range(rounds):
        for name, read in readers.items():
            model = TopologyModel()
            t0 = time.perf_counter()
            for text in messages:
                read(model, text)
            elapsed = time.perf_counter() - t0
            points[name] = model.counters.points_in + model.counters.points_stale
            rates[name].append(points[name] / elapsed)
    assert len(set(points.values())) == 1, points  # all read the same points
    return {"rates": rates, "points": next(iter(points.values()))}


def counters(bootstrap: str, topic: str) -> dict[str, int]:
    """The topology worker's newest segscope_processor line on the topic, as ints."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False})
    newest: dict[str, int] = {}
    try:
        try:
            _, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        except KafkaException:  # the topic's leader is not elected yet
            return newest
        if high <= 0:
            return newest
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for m in c.consume(num_messages=1000, timeout=1.0):
                if m.error():
                    continue
                value = m.value() or b""
                if m.key() == b"topology" and value.startswith(b"segscope_processor,processor=topology"):
                    fields = value.decode().splitlines()[0].split(" ")[1]
                    newest = {k: int(v.rstrip("i")) for k, v in (f.split("=", 1) for f in fields.split(","))}
                if m.offset() >= high - 1:
                    return newest
        raise RuntimeError(f"could not read {topic} to its end ({high}) in 30 s")
    finally:
        c.close()


def bench_worker(bootstrap: str, messages: list[str], expected: int, tmp: Path, cpu: int) -> dict:
    from topo_arango import arango_target

    run = uuid.uuid4().hex[:8]
    metrics, views, dl = f"bench.topo.metrics.{run}", f"bench.topo.views.{run}", f"bench.topo.dl.{run}"
    ensure_topics(bootstrap, [metrics, views, dl], partitions=1)
    with arango_target() as arango:
        env = {
            **os.environ,
            "PYTHONPATH": f"{REPO}:{REPO / 'schemas' / 'python'}",
            "SEGSCOPE_KAFKA_BOOTSTRAP": bootstrap,
            "SEGSCOPE_TOPIC_TOPOLOGY": views,
            "SEGSCOPE_TOPIC_METRICS": metrics,
            "SEGSCOPE_TOPIC_DEADLETTER": dl,
            "SEGSCOPE_TOPOLOGY_APP_ID": f"bench-topo-{run}",
            "SEGSCOPE_TOPOLOGY_DATADIR": str(tmp / "topo"),
            "SEGSCOPE_TOPOLOGY_HEALTH": "off",
            "SEGSCOPE_INSTANCE": "bench-topo",
            "SEGSCOPE_ARANGO_URL": arango.url,
            "SEGSCOPE_ARANGO_USER": arango.user,
            "SEGSCOPE_ARANGO_PASSWORD": arango.password,
            "SEGSCOPE_ARANGO_DB": arango.db_name,
        }
        log = open(tmp / "topology-worker.log", "w")
        proc = subprocess.Popen(
            ["taskset", "-c", str(cpu), sys.executable, "-m", "processors.topology", "-l", "warn"],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 90
            while "flushes" not in counters(bootstrap, metrics):  # up, caught up, flushing
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"topology worker did not start: see {tmp / 'topology-worker.log'}")
                time.sleep(0.5)
            c0, t0 = cpu_seconds(proc.pid), time.perf_counter()
            produce(bootstrap, metrics, [(b"delay", text.encode()) for text in messages])
            deadline = time.monotonic() + 300
            while True:
                seen = counters(bootstrap, metrics)
                taken = seen.get("points_in", 0) + seen.get("points_stale", 0)
                if taken >= expected:
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"worker took {taken} of {expected} points: see {tmp / 'topology-worker.log'}")
                time.sleep(0.2)
            wall, cpu_used = time.perf_counter() - t0, cpu_seconds(proc.pid) - c0
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
    return {"points": taken, "wall": wall, "cpu": cpu_used}


def report(machine: str, args, n_lines: int, n_messages: int, pure: dict, worker: dict | None) -> str:
    out = [
        "## Topology processor: points/s from segscope.metrics (`bench/topology_points.py`)",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {machine}.",
        f"Input, made by the product's writers: {args.sessions:,} STAMP sessions at 10 packets/s and "
        f"{args.flows:,} alternate-marking flows (T = 1 s) over {args.seconds} s: {n_lines:,} lines "
        f"(stamp_delay and stamp_delay_histogram for three directions, altmark_loss, one counter line per "
        f"100) in {n_messages:,} messages of {LINES_PER_MESSAGE} lines; {pure['points']:,} of them are points "
        "the topology model takes (stamp_delay, altmark_loss).",
        "",
        f"| reading a message (one process, {args.rounds} interleaved rounds) | points/s, median (range) |",
        "| --- | --- |",
    ]
    for name, rates in pure["rates"].items():
        out.append(f"| {name} | **{median(rates):,.0f}** ({min(rates):,.0f}-{max(rates):,.0f}) |")
    if worker:
        out += [
            "",
            "| one topology worker (taskset CPU 1), Kafka in, ArangoDB stand-in | points | wall | "
            "points/s wall | points per CPU-second |",
            "| --- | --- | --- | --- | --- |",
            f"| `python -m processors.topology` | {worker['points']:,} | {worker['wall']:.1f} s | "
            f"{worker['points'] / worker['wall']:,.0f} | **{worker['points'] / max(worker['cpu'], 0.01):,.0f}** |",
        ]
    out += [
        "",
        "Four changes: the parser splits with str.split when a line has no escapes (segscope's producers",
        "write none) instead of a character loop; only the lines the model reads are parsed (every",
        "`stamp_delay` line has a larger `stamp_delay_histogram` twin on the same topic); a",
        "`stamp_delay` / complete `altmark_loss` line is taken on its tags and timestamp, its fields",
        "parsed at the next flush for the newest line of each series only (TopologyModel.settle); and a",
        "plain message (ASCII, no escapes, only \\n line breaks: one-character tests in C) is split once,",
        "each measured line split on its blanks and its tag set looked up in a per-series cache instead",
        "of parsed (TopologyModel.apply_metrics_text; any other message is read line by line). The",
        "worker's figure is lower than the pure one: it also runs the Kafka reader thread, Faust, the",
        "flush every second (settle, documents, diff) and its counters; the stand-in is not ArangoDB",
        "(documents change per edge, not per point, so writes are a small share).",
        f"Command: `.local/venv/bin/python bench/topology_points.py --sessions {args.sessions} "
        f"--seconds {args.seconds} --flows {args.flows} --before {args.before}`.",
    ]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=2000)
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--flows", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", default="4edd64a", help="commit whose line-protocol parser is the 'before' row")
    ap.add_argument("--port-base", type=int, default=29740)
    ap.add_argument("--no-worker", action="store_true", help="the pure part only")
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()
    machine = machine_line()
    lines = product_lines(args.sessions, args.seconds, args.flows)
    messages = messages_of(lines)
    pure = bench_pure(messages, args.rounds, args.before)
    for name, rates in pure["rates"].items():
        print(f"pure, {name}: {median(rates):,.0f} points/s", flush=True)
    worker = None
    if not args.no_worker:
        with kafka_only_stack("sco-bench-topo-stack", args.port_base) as stack:
            with tempfile.TemporaryDirectory(prefix="bench-topo-") as tmp:
                worker = bench_worker(stack.kafka_bootstrap, messages, pure["points"], Path(tmp), cpu=1)
        print(f"worker: {worker['points'] / max(worker['cpu'], 0.01):,.0f} points per CPU-second", flush=True)
    text = report(machine, args, len(lines), len(messages), pure, worker)
    print(text)
    if not args.no_docs:
        write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
