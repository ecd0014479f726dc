"""A processor through a Kafka outage: it waits quietly, resumes, loses nothing, and a stop while
Kafka is gone ends at its deadline.

The test's own broker (a stack slot of its own: it is stopped and started here) takes STAMP
records from a producer that keeps measuring through the outage and holds what it measured, as an
agent's Kafka client does, until the worker has been reading again for a while: a client
reconnects with a backoff of its own (librdkafka's goes up to 10 s), so the held records can come
after the worker's first flushes. The real delay worker (`python -m processors.delay`):
- while the broker is down, paces its retries: aiokafka's producer sender alone turned about
  2 000 metadata attempts and 6 000 ERROR lines a second on a full core (kafka_pacing.py);
- holds its sessions' idle clocks while its input is stale (runtime/input_watch.py): before, the
  first flush after the outage evicted the silent session's seconds by the wall clock and the held
  records that came after it were dropped as late (975 of them in a run where the broker took 14 s
  to come back);
- after the broker's restart, publishes every second with the exact count of records sent in it;
- stopped (SIGTERM) while the broker is down again, exits at SEGSCOPE_STOP_TIMEOUT_S with the
  deadline's exit code and says why, instead of waiting for a broker that is gone (stopping.py);
  before, it never exited (SIGKILL after 60 s here, 30 s in Kubernetes).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest
from confluent_kafka import Producer

from processors.delay.topics import ensure_topics
from processors.runtime.stopping import EXIT_STOP_DEADLINE
from processors.runtime.topics import read_topic
from segscope_schemas import altmark_block as ab
from segscope_schemas import names
from segscope_schemas.line_protocol import parse_line
from segscope_schemas.stamp_record import encode_batch
from services.kafka.kafka import Kafka
from tests.isolation import extra_stack
from tests.processors.conftest import stop_worker
from tests.processors.test_delay_crash import NS, REPO, stamp_batch, start_worker, wait_consuming
from tests.processors.test_loss_app import rec
from tests.processors.test_loss_app import start_worker as start_loss_worker

RATE, BATCH = 100, 10  # records per second, in batches of BATCH
OUTAGE_S = 6
STOP_TIMEOUT_S = 4
# the loss worker's block timeout: more than the time its clock counts before it finds the input
# stale (the broker stops ~0.5 s after block B's tx side; stale 4 s after the last fetch answer)
LOSS_TIMEOUT_S = 9
# the worker's CPU and log while no broker answers, per second: measured 0.03 CPU-s and 46 lines
# paced, 1 CPU-s and 6 000 lines before
MAX_CPU_PER_S, MAX_LINES_PER_S = 0.25, 300


@pytest.fixture
def broker():
    run_dir, base = extra_stack("pr-outage", slot=5, default_port_base=29500)
    kafka = Kafka(run_dir, lambda line: None, port=base, controller_port=base + 1, fresh=True)
    kafka.start()
    try:
        yield kafka
    finally:
        kafka.stop()


def cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def published_counts(bootstrap: str, node: str) -> dict[int, int]:
    """second -> the forward count of the newest stamp_delay point the worker published for `node`."""
    got: dict[int, int] = {}
    for _key, value in read_topic(bootstrap, names.TOPIC_METRICS, f"outage-read-{uuid.uuid4().hex[:8]}"):
        for line in value.decode(errors="replace").splitlines():
            if line.startswith("stamp_delay,") and f"node={node}," in line and "direction=forward" in line:
                p = parse_line(line)
                got[p.timestamp_ns // NS] = p.fields["count"]
    return got


def processor_lines(bootstrap: str, since_ns: int, processor: str = "delay") -> list[dict]:
    """The fields of a processor's segscope_processor lines stamped at or after since_ns."""
    out = []
    for _key, value in read_topic(bootstrap, names.TOPIC_METRICS, f"outage-read-{uuid.uuid4().hex[:8]}"):
        for line in value.decode(errors="replace").splitlines():
            if line.startswith(f"segscope_processor,processor={processor},"):
                p = parse_line(line)
                if p.timestamp_ns >= since_ns:
                    out.append(p.fields)
    return out


def loss_lines(bootstrap: str, flow: int) -> list:
    """The altmark_loss points of `flow`, in the order the loss worker published them."""
    out = []
    for _key, value in read_topic(bootstrap, names.TOPIC_METRICS, f"outage-read-{uuid.uuid4().hex[:8]}"):
        for line in value.decode(errors="replace").splitlines():
            if line.startswith("altmark_loss,") and f"flow={flow}," in line:
                out.append(parse_line(line))
    return out


def test_broker_outage_paced_resumed_exact_and_a_stop_without_broker_ends_at_its_deadline(broker, tmp_path):
    run = uuid.uuid4().hex[:8]
    node, topic, app_id = f"outage{run}", f"test.outage.{run}", f"outage-{run}"
    ensure_topics(broker.bootstrap, [topic, f"{topic}.dl", names.TOPIC_METRICS])
    log = tmp_path / "worker.log"
    env = {"SEGSCOPE_STOP_TIMEOUT_S": str(STOP_TIMEOUT_S)}
    worker = start_worker(broker.bootstrap, topic, f"{topic}.dl", app_id, tmp_path / "faust", log, env=env)
    # a loss worker beside it: block A joined before the outage, block B's tx side before it and its
    # rx side held through it (an egress collector's client holding it), like the STAMP records
    blocks = f"test.outage.{run}.blocks"
    ensure_topics(broker.bootstrap, [blocks, f"{blocks}.dl"])
    loss_worker, loss_log = start_loss_worker(
        broker.bootstrap, tmp_path, blocks, names.TOPIC_METRICS, f"{blocks}.dl", f"outage-loss-{run}",
        timeout_s=LOSS_TIMEOUT_S,
    )  # fmt: skip
    flow, block_a = uuid.UUID(int=int(run, 16)).int % 0xFFFFF + 1, time.clock_gettime_ns(time.CLOCK_TAI) // NS - 300
    loss_producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "acks": "all"})

    def send_side(node: str, direction: int, block: int, packets: int) -> None:
        r = rec(direction, block, packets, packets * 100, flow)
        value = ab.encode_batch(r, node, block * 2 + direction)
        loss_producer.produce(blocks, key=ab.kafka_key(node, flow), value=value)
        assert loss_producer.flush(30) == 0

    sent: dict[int, int] = {}  # second (TAI) -> records sent in it
    errors: list = []
    stop = threading.Event()
    hold = threading.Event()  # set: measure on, keep the batches (the outage and the reconnect)
    holding = threading.Event()  # the producer keeps its batches now, and everything before is delivered

    def produce() -> None:
        p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "acks": "all",
                      "message.timeout.ms": 120_000})  # fmt: skip
        seq, held = 0, []
        while not stop.is_set():
            r = stamp_batch(seq, time.clock_gettime_ns(time.CLOCK_TAI), BATCH, RATE)
            seconds, counts = np.unique(r["t1_ns"] // NS, return_counts=True)
            for s, c in zip(seconds.tolist(), counts.tolist()):
                sent[s] = sent.get(s, 0) + c
            held.append(encode_batch(r, node, seq // BATCH))
            if hold.is_set() and not holding.is_set():
                assert p.flush(30) == 0  # nothing of before the outage is still in flight
                holding.set()
            if not hold.is_set():
                for value in held:  # the held ones first, in order
                    p.produce(topic, value, key=f"{node}/1".encode(),
                              on_delivery=lambda err, msg: err and errors.append(err))  # fmt: skip
                held.clear()
                holding.clear()
            p.poll(0)
            seq += BATCH
            time.sleep(BATCH / RATE)
        assert not held
        assert p.flush(60) == 0

    producer = threading.Thread(target=produce)
    try:
        wait_consuming(log, 0, topic)
        producer.start()
        wait_consuming(loss_log, 0, blocks)
        time.sleep(4)
        send_side("ltx", ab.DIR_TX, block_a, 1000)
        send_side("lrx", ab.DIR_RX, block_a, 997)
        send_side("ltx", ab.DIR_TX, block_a + 1, 800)  # block B: its rx side comes after the outage
        hold.set()
        assert holding.wait(30), "the producer did not deliver what it had before the outage"
        broker.stop()  # the outage
        time.sleep(1)  # the clients notice
        cpu0, lines0, t0 = cpu_s(worker.pid), len(log.read_text(errors="replace").splitlines()), time.monotonic()
        time.sleep(OUTAGE_S)
        cpu, lines = cpu_s(worker.pid) - cpu0, len(log.read_text(errors="replace").splitlines()) - lines0
        seconds = time.monotonic() - t0
        print(f"\n[outage] {seconds:.1f} s without a broker: the worker used {cpu:.2f} CPU-s, wrote {lines} log lines")
        assert worker.poll() is None, "the worker died while the broker was down"
        assert cpu < MAX_CPU_PER_S * seconds, f"busy while the broker was down: {cpu:.2f} CPU-s in {seconds:.1f} s"
        assert lines < MAX_LINES_PER_S * seconds, f"{lines} log lines in {seconds:.1f} s without a broker"

        broker.fresh = False  # the same data: topics, offsets and the group's commits survive
        broker.start()
        restarted_ns = time.time_ns()
        # the records come back only after two of the worker's flushes ran on the restarted broker:
        # the first flush's rules then apply to a session silent for the whole outage
        deadline = time.monotonic() + 60
        flushed = {"delay": 0, "loss": 0}
        while min(flushed.values()) < 2 and time.monotonic() < deadline:
            flushed = {name: len(processor_lines(broker.bootstrap, restarted_ns, name)) for name in flushed}
            time.sleep(0.5)
        assert min(flushed.values()) >= 2, f"the workers did not publish after the outage: {flushed}"
        hold.clear()
        send_side("lrx", ab.DIR_RX, block_a + 1, 790)
        time.sleep(2)  # and records after them
        stop.set()
        producer.join()
        assert not errors, errors
        # every second sent, with its exact count (the last ones close after the grace)
        want, deadline, got = dict(sent), time.monotonic() + 60, {}
        while time.monotonic() < deadline:
            got = published_counts(broker.bootstrap, node)
            if got == want:
                break
            time.sleep(1)
        assert got == want, (
            f"per second sent vs published differ: missing {sorted(set(want) - set(got))}, "
            f"wrong {[(s, want[s], got[s]) for s in want if s in got and got[s] != want[s]]}"
        )
        assert "Traceback" not in log.read_text(errors="replace")
        counters = processor_lines(broker.bootstrap, restarted_ns)[-1]
        print(f"[outage] input stalls {counters['input_stalls']}, stale for {counters['input_stale_ms']} ms")
        assert counters["late_records_dropped"] == 0, counters
        assert counters["input_stalls"] >= 1 and counters["input_stale_ms"] > 0, counters
        # the loss worker's timeout clock stood still through the outage: block B was never published
        # incomplete (a false missing_rx), and both blocks are exact
        deadline, points = time.monotonic() + 30, []
        while time.monotonic() < deadline:
            points = loss_lines(broker.bootstrap, flow)
            if len({p.timestamp_ns for p in points if p.fields.get("complete")}) == 2:
                break
            time.sleep(0.5)
        by_block: dict[int, list] = {}
        for p in points:
            by_block.setdefault(p.timestamp_ns, []).append(p.fields)
        assert len(by_block) == 2, points
        (a_ts, a), (b_ts, b) = sorted(by_block.items())
        assert b_ts - a_ts == NS
        print(f"[outage] loss lines of block A {[x['reason'] for x in a]}, of block B {[x['reason'] for x in b]}")
        assert [x["reason"] for x in b] == ["ok"], b
        assert (a[-1]["lost"], b[-1]["lost"]) == (3, 10)
        loss_counters = processor_lines(broker.bootstrap, restarted_ns, "loss")[-1]
        assert loss_counters["input_stalls"] >= 1 and loss_counters["late_records_dropped"] == 0, loss_counters
        stop_worker(loss_worker)

        broker.stop()  # gone again, and the worker is told to stop
        time.sleep(1)
        t_term = time.monotonic()
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            code = worker.wait(timeout=STOP_TIMEOUT_S + 20)
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - t_term
        print(f"[outage] SIGTERM without a broker: exit {code} after {took:.1f} s (deadline {STOP_TIMEOUT_S} s)")
        assert code == EXIT_STOP_DEADLINE, f"exit {code} after {took:.1f} s"
        assert STOP_TIMEOUT_S - 0.5 <= took <= STOP_TIMEOUT_S + 5, took
        assert f"stop not finished {STOP_TIMEOUT_S} s after SIGTERM" in log.read_text(errors="replace")
    finally:
        stop_worker(loss_worker)
        stop.set()
        if producer.is_alive():
            producer.join(timeout=90)
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()


@pytest.mark.parametrize("name", ["delay", "loss", "inline", "topology"])
def test_every_processor_runs_the_worker_with_the_stop_deadline(name):
    """The deadline and the pacing come with the settings every processor's app is made with."""
    code = (
        "import importlib, aiokafka.client as c; "
        f"app = importlib.import_module('processors.{name}.app').app; "
        "print(app.conf.Worker.__module__, app.conf.Worker.__name__, c.AIOKafkaClient._metadata_update.__name__)"
    )
    env = dict(os.environ, PYTHONPATH=f"{REPO}:{REPO / 'schemas' / 'python'}", SEGSCOPE_DELAY_HEALTH="off")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["processors.runtime.stopping", "Worker", "paced_metadata_update"], out.stdout


@pytest.mark.parametrize(
    ("name", "inputs"),
    [("delay", ["records_topic"]), ("loss", ["blocks_topic", "by_flow_topic"]), ("inline", ["records_topic"])],
)
def test_every_processor_watches_its_input_topics(name, inputs):
    """The delay, loss and in-line processors hold their idle clocks (the loss one: its timeout
    clock) while their input is stale; the watch must cover every input topic and nothing else."""
    code = (
        "import importlib; "
        f"m = importlib.import_module('processors.{name}.app'); "
        f"print(sorted(m.input_watch.topics) == sorted(getattr(m.cfg, t) for t in {inputs!r}), "
        "sorted(m.input_watch.topics))"
    )
    env = dict(os.environ, PYTHONPATH=f"{REPO}:{REPO / 'schemas' / 'python'}", SEGSCOPE_DELAY_HEALTH="off")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[0] == "True", out.stdout
