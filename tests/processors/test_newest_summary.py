"""The summary topic with real workers on real Kafka (the shared stack, topics unique to the run):
a delay and a loss worker (`python -m processors.delay` / `processors.loss`) with
SEGSCOPE_TOPIC_METRICS_NEWEST set publish their results to the run's metrics topic and, every
SEGSCOPE_SUMMARY_INTERVAL_S, the newest line of each series to the run's summary topic.

Within one summary interval the input makes the workers publish an older point after a newer one
of the same series (a late STAMP record re-opens a second that was published before; a block
whose rx side comes after the flow's later blocks were published) and a newest block that is
incomplete. The summary must hold exactly the newest (complete) line of every series, and a
topology model fed from the summary must end with the same measures as one fed from the metrics
topic. A holder keeping the last-arrived line fails (the older re-emissions), so does one that
drops a series or keeps incomplete blocks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from processors.delay.topics import ensure_topics
from processors.topology.model import TopologyModel
from segscope_schemas import altmark_block as ab
from segscope_schemas.line_protocol import parse_line
from segscope_schemas.stamp_record import encode_batch
from tests.processors.conftest import stop_worker
from tests.processors.test_delay_worker import session_records
from tests.processors.test_loss_app import rec

REPO = Path(__file__).resolve().parents[2]
NS = 1_000_000_000
TAI_UTC = 37
NOT_SERVED_YET = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
}
# long enough for the whole input to land in the workers' first summary interval (checked below)
INTERVAL_S = 24


def start(module: str, args: list[str], env: dict, log_path: Path) -> subprocess.Popen:
    with open(log_path, "w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", module, *args, "-l", "info"],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def watermark(consumer: Consumer, topic: str, timeout_s: float = 20) -> int:
    """The end offset of partition 0. A topic created a moment ago may not be served by its leader
    yet (NOT_LEADER_FOR_PARTITION, LEADER_NOT_AVAILABLE on a busy broker): asked again until it is."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
        except KafkaException as exc:
            if not exc.args[0].retriable() and exc.args[0].code() not in NOT_SERVED_YET:
                raise
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def read_all(bootstrap: str, topic: str) -> list[tuple[int, bytes, bytes]]:
    """(broker timestamp ms, key, value) of every message now in the one-partition topic."""
    c = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"nsum-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False}
    )
    try:
        end = watermark(c, topic)
        c.assign([TopicPartition(topic, 0, 0)])
        out, deadline = [], time.monotonic() + 20
        while len(out) < end and time.monotonic() < deadline:
            for m in c.consume(num_messages=1000, timeout=0.3):
                if m.error() is None and m.offset() < end:
                    out.append((m.timestamp()[1], m.key(), m.value()))
        assert len(out) == end, f"read {len(out)} of {end} messages of {topic}"
        return out
    finally:
        c.close()


def measured(messages) -> list[tuple[int, str]]:
    """(message timestamp, line) of the stamp_delay / altmark_loss lines, in topic order."""
    return [
        (ts, line)
        for ts, _, value in messages
        for line in value.decode().split("\n")
        if line.startswith(("stamp_delay,", "altmark_loss,"))
    ]


def newest_per_series(lines: list[str]) -> dict[str, str]:
    """What the summary must hold, computed with the full parser: per head, the complete line with the
    highest timestamp, the last arrived of equal ones."""
    out: dict[str, tuple[int, str]] = {}
    for line in lines:
        p = parse_line(line)
        if p.measurement == "altmark_loss" and p.fields["complete"] is not True:
            continue
        head = line.split(" ")[0]
        if head not in out or out[head][0] <= p.timestamp_ns:
            out[head] = (p.timestamp_ns, line)
    return {head: line for head, (_, line) in out.items()}


def model_of(texts: list[str]) -> dict:
    model = TopologyModel()
    for text in texts:
        model.apply_metrics_text(text)
    model.settle()
    return {
        "stamp": {k: (m.timestamp_ns, m.fields, m.tags) for k, m in model.stamp.items()},
        "loss": {k: (m.timestamp_ns, m.fields, m.tags) for k, m in model.loss.items()},
    }


@pytest.fixture
def workers():
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        stop_worker(proc)


def test_summary_holds_the_newest_line_of_every_series(stack, tmp_path, workers):
    bootstrap = stack.kafka_bootstrap
    run = uuid.uuid4().hex[:6]
    t = {k: f"nsum.{run}.{k}" for k in ("records", "blocks", "metrics", "newest", "deadletter", "paths")}
    ensure_topics(bootstrap, [t["records"], t["blocks"]], partitions=2)
    ensure_topics(bootstrap, [t["metrics"], t["newest"], t["deadletter"], t["paths"]])
    env = dict(
        os.environ,
        PYTHONPATH=f"{REPO}:{REPO / 'schemas' / 'python'}",
        SEGSCOPE_TOPIC_METRICS_NEWEST=t["newest"],
        SEGSCOPE_SUMMARY_INTERVAL_S=str(INTERVAL_S),
    )
    common = ["--bootstrap", bootstrap, "--metrics-topic", t["metrics"], "--deadletter-topic", t["deadletter"]]
    common += ["--paths-topic", t["paths"], "--health", "off", "--tai-utc-offset-s", str(TAI_UTC)]
    started = time.time()
    delay_args = ["--records-topic", t["records"], "--app-id", f"nsum-delay-{run}", "--grace-s", "0.5"]
    delay_args += ["--datadir", str(tmp_path / "delay")]
    workers.append(start("processors.delay", common + delay_args, env, tmp_path / "delay.log"))
    loss_args = ["--blocks-topic", t["blocks"], "--app-id", f"nsum-loss-{run}", "--timeout-s", "2"]
    loss_args += ["--retention-s", "60", "--flush-interval-s", "0.5", "--datadir", str(tmp_path / "loss")]
    workers.append(start("processors.loss", common + loss_args, env, tmp_path / "loss.log"))

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    node, tx, rx = f"nsd{run}", f"nsA{run}", f"nsB{run}"
    rng = np.random.default_rng(17)
    first = time.clock_gettime_ns(time.CLOCK_TAI) // NS - 120  # two minutes ago: closed at once
    for ssid in (1, 2):
        producer.produce(t["records"], key=f"{node}/{ssid}".encode(), value=encode_batch(
            session_records(rng, ssid, first, 4, 20), node, ssid))  # fmt: skip
    # flow f: blocks 1-4 both sides, block 0 tx only (rx later); flow g: blocks 0-3 both sides, block 4 tx only
    f, g = int(rng.integers(1, 0xFFFFF)), int(rng.integers(1, 0xFFFFF))
    b0 = first - 480  # block indices are seconds (T = 1 s), ten minutes ago
    tx_recs = [rec(ab.DIR_TX, b0 + i, 1000, 90_000, f) for i in range(5)]
    tx_recs += [rec(ab.DIR_TX, b0 + i, 1000, 90_000, g) for i in range(5)]
    rx_recs = [rec(ab.DIR_RX, b0 + i, 1000 - i, 90_000, f) for i in range(1, 5)]
    rx_recs += [rec(ab.DIR_RX, b0 + i, 990 + i, 90_000, g) for i in range(4)]
    producer.produce(t["blocks"], key=f"{tx}/{f}".encode(), value=ab.encode_batch(np.concatenate(tx_recs), tx, 1))
    producer.produce(t["blocks"], key=f"{rx}/{f}".encode(), value=ab.encode_batch(np.concatenate(rx_recs), rx, 1))
    assert producer.flush(30) == 0

    def metrics_lines() -> list[str]:
        return [line for _, line in measured(read_all(bootstrap, t["metrics"]))]

    def wait_for(what: str, ok, timeout_s: float = 60):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for proc, name in zip(workers, ("delay", "loss")):
                if proc.poll() is not None:
                    pytest.fail(
                        f"{name} worker exited {proc.returncode}:\n{(tmp_path / f'{name}.log').read_text()[-3000:]}"
                    )
            lines = metrics_lines()
            if ok(lines):
                return lines
            time.sleep(0.3)
        pytest.fail(f"{what} not on {t['metrics']}")

    def has(lines, head_part: str, ts_s: int, extra: str = "") -> int:
        return sum(
            1 for line in lines if head_part in line.split(" ")[0] and line.endswith(f" {ts_s * NS}") and extra in line
        )

    # the newer points are out: then the late input that makes older ones come after them
    utc = first - TAI_UTC
    wait_for("session 1's third second and flow f's block 4", lambda ls: has(ls, "ssid=1,", utc + 2) == 3
             and has(ls, f"flow={f},", b0 - TAI_UTC + 4, "complete=true"))  # fmt: skip
    late = session_records(rng, 1, first, 1, 5)
    late["sender_seq"] += 10_000  # new records of the first second, not duplicates
    producer.produce(t["records"], key=f"{node}/1".encode(), value=encode_batch(late, node, 3))
    rx_late = rec(ab.DIR_RX, b0, 1000, 90_000, f)
    producer.produce(t["blocks"], key=f"{rx}/{f}".encode(), value=ab.encode_batch(rx_late, rx, 2))
    assert producer.flush(30) == 0
    wait_for(
        "the re-emitted first second, flow f's block 0 complete and flow g's block 4 incomplete",
        lambda ls: has(ls, "ssid=1,", utc) == 6
        and has(ls, f"flow={f},", b0 - TAI_UTC, "complete=true")
        and has(ls, f"flow={g},", b0 - TAI_UTC + 4, "complete=false")
        and has(ls, "ssid=1,", utc + 3) == has(ls, "ssid=2,", utc + 3) == 3,  # the last second: closed when idle
    )
    input_done = time.time()
    took = input_done - started  # 9.5 s on a quiet machine
    assert took < INTERVAL_S - 2, f"the input took {took:.1f} s, longer than a summary interval: raise INTERVAL_S"

    # the summaries: the first one of each worker, INTERVAL_S after its start
    deadline = time.monotonic() + INTERVAL_S + 30
    while time.monotonic() < deadline:
        summary = read_all(bootstrap, t["newest"])
        if {key for _, key, _ in summary} == {b"delay", b"loss"}:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"no summary from both workers on {t['newest']}: {[k for _, k, _ in summary]}")
    metrics = read_all(bootstrap, t["metrics"])
    on_metrics = measured(metrics)
    assert on_metrics and max(ts for ts, _ in on_metrics) < min(ts for ts, _, _ in summary), (
        "every result was published within the first summary interval"
    )
    summary_lines = [line for _, line in measured(summary)]
    assert len(summary_lines) == len(set(summary_lines))
    want = newest_per_series([line for _, line in on_metrics])
    assert sorted(summary_lines) == sorted(want.values())
    # the lines the scenario is about: newest by timestamp, not the last arrived; no incomplete block
    assert has(summary_lines, "ssid=1,", utc) == 0 and has(summary_lines, "ssid=1,", utc + 3) == 3
    assert has(summary_lines, f"flow={f},", b0 - TAI_UTC + 4, "complete=true") == 1
    assert has(summary_lines, f"flow={g},", b0 - TAI_UTC + 3, "complete=true") == 1
    assert len(summary_lines) == 2 * 3 + 2  # two sessions x three directions, two flows

    # the topology model reads the summary as it reads segscope.metrics, and keeps the same measures
    from_summary = model_of([v.decode() for _, _, v in summary])
    from_metrics = model_of([v.decode() for _, _, v in metrics])
    assert from_summary == from_metrics and len(from_metrics["stamp"]) == 6 and len(from_metrics["loss"]) == 2

    # the workers count it (segscope_processor lines, the newest after the summary)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        counters = {}
        for _, _, value in read_all(bootstrap, t["metrics"]):
            for line in value.decode().split("\n"):
                if line.startswith("segscope_processor,"):
                    p = parse_line(line)
                    counters[p.tags["processor"]] = p.fields
        if all(counters.get(name, {}).get("newest_lines_published") for name in ("delay", "loss")):
            break
        time.sleep(0.5)
    d, lo = counters["delay"], counters["loss"]
    # a clean stop publishes what is held: session 3's seconds, closed just before SIGTERM
    producer.produce(t["records"], key=f"{node}/3".encode(), value=encode_batch(
        session_records(rng, 3, first, 3, 20), node, 4))  # fmt: skip
    assert producer.flush(30) == 0
    wait_for("session 3's first two seconds", lambda ls: has(ls, "ssid=3,", utc + 1) == 3)
    stop_worker(workers[0])
    assert workers[0].returncode == 0, (tmp_path / "delay.log").read_text()[-3000:]
    at_stop = [line for _, line in measured(read_all(bootstrap, t["newest"])) if "ssid=3," in line]
    assert has(at_stop, "ssid=3,", utc + 2) == 3, at_stop  # its newest second, closed and summarised at stop
    assert d["newest_lines_published"] == 6 and lo["newest_lines_published"] == 2
    assert d["newest_lines_older"] == 3  # the re-emitted first second, three directions
    assert lo["newest_lines_older"] >= 1 and lo["newest_lines_incomplete"] >= 1
    assert d["newest_messages_published"] == lo["newest_messages_published"] == 1
    assert d["newest_publish_errors"] == lo["newest_publish_errors"] == 0
