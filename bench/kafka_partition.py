"""Benchmark: what one Kafka partition of one broker carries, with the product's messages and settings.

    .local/venv/bin/python bench/kafka_partition.py [--records 3000000] [--batch 1000,64]
        [--partitions 1,2] [--port-base 29780] [--no-docs]

docs/capacity.md sizes partitions and brokers from a records/s-per-partition figure; until this
bench it was a lower bound read off the streamer benchmark. Here the broker is measured alone:

- Messages: `stamp_batch` messages (schemas/c/stamp_batch.h, 64-byte records with realistic T1..T4
  from bench/processor_records.make_messages) of `batch` records: 1000 is what a busy agent's
  stamp_streamer sends per ring-buffer wake-up, 64 a quiet one.
- Producer: one librdkafka producer (confluent-kafka) with **the streamer's settings**
  (collectors/kafka_producer.h: idempotence, acks=all, linger 5 ms, lz4, batch.size 1 MB), keyed
  by session so the messages spread over the topic's partitions like the product's.
- Consumer: one consumer reading the topic from the beginning (librdkafka defaults, like the
  processors' aiokafka fetches: whole record batches).
- Per row: produce rate (records/s, MB/s of record bytes before compression), consume rate, and
  the **broker's CPU seconds** (utime + stime of the Kafka JVM from /proc, while producing and
  while consuming): records per broker CPU-second is the figure that other load on this shared
  2-core machine changes least, and the one capacity.md scales by.

Kafka: a Kafka-only services.stack.Stack on --port-base (its own run dir, replication factor 1),
stopped at the end. Results go to stdout and, unless --no-docs, to the "kafka_partition" section
of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path
from statistics import median

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "schemas" / "python")]

from bench.process_cpu import cpu_seconds  # noqa: E402
from bench.processor_records import make_messages  # noqa: E402
from bench.processor_records import produce as produce_messages  # noqa: E402
from bench.report import kafka_only_stack, machine_line, write_section  # noqa: E402
from processors.delay.topics import ensure_topics  # noqa: E402

SECTION = "kafka_partition"
RECORD_BYTES = 64

# collectors/kafka_producer.h, the settings every agent's producer uses
STREAMER_PRODUCER = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 5,
    "compression.type": "lz4",
    "batch.size": 1_000_000,
    "queue.buffering.max.messages": 1_000_000,
    "queue.buffering.max.kbytes": 1024 * 1024,
    "message.timeout.ms": 600_000,
}


def produce(bootstrap: str, topic: str, messages) -> float:
    """Seconds to produce every message and have every delivery acknowledged, as the streamer does."""
    return produce_messages(bootstrap, topic, messages, settings=STREAMER_PRODUCER)


def consume(bootstrap: str, topic: str, partitions: int, n_messages: int, timeout_s: float = 300.0) -> float:
    """Seconds to read n_messages from the beginning of every partition (assigned, no group: a
    group join is not the partition's work; the clock starts at the first fetch)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    got, t0, deadline = 0, time.perf_counter(), time.monotonic() + timeout_s
    try:
        while got < n_messages:
            if time.monotonic() > deadline:
                raise RuntimeError(f"consumed {got} of {n_messages} messages in {timeout_s} s")
            got += sum(1 for m in c.consume(num_messages=1000, timeout=1.0) if not m.error())
        return time.perf_counter() - t0
    finally:
        c.close()


def warm_up(bootstrap: str) -> None:
    """One acknowledged message first: the broker's idempotence coordinator loads on the first
    producer id request ("Coordinator load in progress"), which is start-up, not throughput."""
    topic = f"bench.kp.warmup.{uuid.uuid4().hex[:8]}"
    ensure_topics(bootstrap, [topic], partitions=1)
    produce(bootstrap, topic, [(b"k", b"v")])


def run_row(bootstrap: str, broker_pid: int, messages, batch: int, partitions: int) -> dict:
    n_records = sum((len(v) - 56) // RECORD_BYTES for _, v in messages)  # 56: the batch header
    topic = f"bench.kp.{uuid.uuid4().hex[:8]}"
    ensure_topics(bootstrap, [topic], partitions=partitions)
    time.sleep(1.0)  # leadership settled
    c0 = cpu_seconds(broker_pid)
    produce_s = produce(bootstrap, topic, messages)
    c1 = cpu_seconds(broker_pid)
    consume_s = consume(bootstrap, topic, partitions, len(messages))
    c2 = cpu_seconds(broker_pid)
    return {
        "batch": batch,
        "partitions": partitions,
        "messages": len(messages),
        "records": n_records,
        "produce_s": produce_s,
        "consume_s": consume_s,
        "broker_cpu_produce": c1 - c0,
        "broker_cpu_consume": c2 - c1,
    }


def group_rows(rows: list[dict]) -> dict[tuple[int, int], list[dict]]:
    out: dict[tuple[int, int], list[dict]] = {}
    for r in rows:
        out.setdefault((r["batch"], r["partitions"]), []).append(r)
    return out


def report(rows: list[dict], machine: str, args) -> str:
    out = [
        "## Kafka: records/s per partition of one broker (`bench/kafka_partition.py`)",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {machine}; "
        "broker (one Kafka 4.3.1, replication factor 1), producer and consumer on the same machine.",
        "Messages: `stamp_batch` (64-byte records, realistic T1..T4), one librdkafka producer with the",
        "streamer's settings (collectors/kafka_producer.h: idempotence, acks=all, linger 5 ms, lz4,",
        "batch.size 1 MB), keyed by session; then one consumer reads the topic from the beginning.",
        "Broker CPU = utime + stime of the Kafka JVM (/proc) while producing / while consuming.",
        "",
        "Medians over the rounds (rows interleaved); ranges in brackets.",
        "",
        "| records per message | partitions | records x rounds | produce records/s (MB/s) | consume records/s "
        "| broker CPU-s produce / consume | records per broker CPU-second, produce / consume |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for (batch, partitions), runs in group_rows(rows).items():
        produce_rate = median(r["records"] / r["produce_s"] for r in runs)
        consume_rate = median(r["records"] / r["consume_s"] for r in runs)
        cpu_p = median(r["broker_cpu_produce"] for r in runs)
        cpu_c = median(r["broker_cpu_consume"] for r in runs)
        per_cpu_p = [r["records"] / max(r["broker_cpu_produce"], 0.01) for r in runs]
        per_cpu_c = [r["records"] / max(r["broker_cpu_consume"], 0.01) for r in runs]
        out.append(
            f"| {batch} | {partitions} | {runs[0]['records']:,} x {len(runs)} "
            f"| **{produce_rate:,.0f}** ({produce_rate * RECORD_BYTES / 1e6:.0f}) | {consume_rate:,.0f} "
            f"| {cpu_p:.2f} / {cpu_c:.2f} "
            f"| **{median(per_cpu_p):,.0f}** ({min(per_cpu_p):,.0f}-{max(per_cpu_p):,.0f}) "
            f"/ {median(per_cpu_c):,.0f} ({min(per_cpu_c):,.0f}-{max(per_cpu_c):,.0f}) |"
        )
    out += [
        "",
        "The produce rate is bounded by this machine, not by the partition: producer, broker and",
        "consumer share 2 cores (the broker's CPU-seconds show how much of them it used). Records per",
        "broker CPU-second is what docs/capacity.md divides by; one partition is served by one broker",
        "thread at a time, so a partition's ceiling is about one core's worth of that figure.",
        f"Command: `.local/venv/bin/python bench/kafka_partition.py --records {args.records} "
        f"--batch {args.batch} --partitions {args.partitions} --rounds {args.rounds}`.",
    ]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=3_000_000)
    ap.add_argument("--batch", default="1000,64", help="records per message, comma-separated rows")
    ap.add_argument("--partitions", default="1,2", help="partitions of the topic, comma-separated rows")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of all rows; the report gives medians")
    ap.add_argument("--port-base", type=int, default=29780)
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()
    machine = machine_line()
    rows = []
    with kafka_only_stack("sco-bench-kp-stack", args.port_base) as stack:
        bootstrap, broker_pid = stack.kafka_bootstrap, stack.running_pid("kafka")
        warm_up(bootstrap)
        batches = [int(x) for x in args.batch.split(",")]
        # 16 sessions: enough keys that each partition gets its share (keyed like the streamer)
        messages = {b: make_messages(args.records, b, sessions=16, rate=25_000)[0] for b in batches}
        for rnd in range(1, args.rounds + 1):  # rounds interleave the rows: drift hits them all
            for batch in batches:
                for partitions in (int(x) for x in args.partitions.split(",")):
                    row = run_row(bootstrap, broker_pid, messages[batch], batch, partitions)
                    rows.append(row)
                    print(
                        f"round {rnd}, batch {batch:5d}, {partitions} partition(s): produce "
                        f"{row['records'] / row['produce_s']:,.0f} records/s, consume "
                        f"{row['records'] / row['consume_s']:,.0f} records/s, broker CPU "
                        f"{row['broker_cpu_produce']:.2f} + {row['broker_cpu_consume']:.2f} s",
                        flush=True,
                    )
    text = report(rows, machine, args)
    print(text)
    if not args.no_docs:
        write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
