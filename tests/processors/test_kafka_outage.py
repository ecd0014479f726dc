"""A processor through a Kafka outage: it waits quietly, resumes, loses nothing, and a stop while
Kafka is gone ends at its deadline.

The test's own broker (a stack slot of its own: it is stopped and started here) takes STAMP
records from a producer that keeps sending through the outage (its client holds them and delivers
them when the broker is back). The real delay worker (`python -m processors.delay`):
- while the broker is down, paces its retries: aiokafka's producer sender alone turned about
  2 000 metadata attempts and 6 000 ERROR lines a second on a full core (kafka_pacing.py);
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
from segscope_schemas import names
from segscope_schemas.line_protocol import parse_line
from segscope_schemas.stamp_record import encode_batch
from services.kafka.kafka import Kafka
from tests.isolation import extra_stack
from tests.processors.test_delay_crash import NS, REPO, stamp_batch, start_worker, wait_consuming

RATE, BATCH = 100, 10  # records per second, in batches of BATCH
OUTAGE_S = 6
STOP_TIMEOUT_S = 4
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


def test_broker_outage_paced_resumed_exact_and_a_stop_without_broker_ends_at_its_deadline(broker, tmp_path):
    run = uuid.uuid4().hex[:8]
    node, topic, app_id = f"outage{run}", f"test.outage.{run}", f"outage-{run}"
    ensure_topics(broker.bootstrap, [topic, f"{topic}.dl", names.TOPIC_METRICS])
    log = tmp_path / "worker.log"
    env = {"SEGSCOPE_STOP_TIMEOUT_S": str(STOP_TIMEOUT_S)}
    worker = start_worker(broker.bootstrap, topic, f"{topic}.dl", app_id, tmp_path / "faust", log, env=env)
    sent: dict[int, int] = {}  # second (TAI) -> records sent in it
    errors: list = []
    stop = threading.Event()

    def produce() -> None:  # through the outage: librdkafka holds the batches and delivers them after
        p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "acks": "all",
                      "message.timeout.ms": 120_000})  # fmt: skip
        seq = 0
        while not stop.is_set():
            r = stamp_batch(seq, time.clock_gettime_ns(time.CLOCK_TAI), BATCH, RATE)
            seconds, counts = np.unique(r["t1_ns"] // NS, return_counts=True)
            for s, c in zip(seconds.tolist(), counts.tolist()):
                sent[s] = sent.get(s, 0) + c
            p.produce(topic, encode_batch(r, node, seq // BATCH), key=f"{node}/1".encode(),
                      on_delivery=lambda err, msg: err and errors.append(err))  # fmt: skip
            p.poll(0)
            seq += BATCH
            time.sleep(BATCH / RATE)
        assert p.flush(60) == 0

    producer = threading.Thread(target=produce)
    try:
        wait_consuming(log, 0, topic)
        producer.start()
        time.sleep(4)
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
        time.sleep(5)
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
