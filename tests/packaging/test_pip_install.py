"""`pip install .` into a fresh venv: every console entry point starts (--version, --help) and
the delay processor, run from that venv outside the checkout, aggregates records from the local
Kafka (imports from site-packages, names.toml shipped as package data)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import tomllib
import uuid
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import Consumer, Producer

from processors.delay.topics import ensure_topics
from segscope_schemas.stamp_record import STAMP_RECORD_DTYPE, encode_batch
from segscope_schemas.version import __version__
from tests.packaging.prepare import prep_dir, wait_for_step

REPO = Path(__file__).resolve().parents[2]
# every console program pyproject.toml declares (the Helm chart's commands are among them:
# tests/deploy/test_chart.py::test_chart_commands_are_entry_points)
ENTRY_POINTS = tuple(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"])
NS = 1_000_000_000


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    prepared = wait_for_step("venv")  # in `make test` the runner installs it while other tests run
    if prepared is not None:
        assert prepared[0], prepared[1]
        return prep_dir() / "pip-venv"
    root = tmp_path_factory.mktemp("fresh-venv")
    subprocess.run([sys.base_prefix + "/bin/python3", "-m", "venv", str(root)], check=True)
    pip = subprocess.run(
        [str(root / "bin" / "pip"), "install", "-q", str(REPO)], capture_output=True, text=True, timeout=600
    )
    assert pip.returncode == 0, pip.stderr[-3000:]
    return root


def clean_env() -> dict[str, str]:
    """No PYTHONPATH: the venv must bring everything itself."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.mark.parametrize("command", ENTRY_POINTS)
def test_entry_point_starts(venv, command, tmp_path):
    exe = venv / "bin" / command
    assert exe.exists(), f"{command} not installed"
    version = subprocess.run([str(exe), "--version"], capture_output=True, text=True, cwd=tmp_path, env=clean_env())
    assert version.returncode == 0 and version.stdout.strip() == f"segscope {__version__}", version
    usage = subprocess.run([str(exe), "--help"], capture_output=True, text=True, cwd=tmp_path, env=clean_env())
    assert usage.returncode == 0 and "usage" in usage.stdout.lower(), usage


def test_installed_delay_processor_aggregates_from_kafka(venv, stack, tmp_path):
    run = uuid.uuid4().hex[:8]
    records, metrics = f"test.pip.{run}.records", f"test.pip.{run}.metrics"
    ensure_topics(stack.kafka_bootstrap, [records, metrics, f"test.pip.{run}.dl"])
    first = time.clock_gettime_ns(time.CLOCK_TAI) // NS - 60
    r = np.zeros(300, dtype=STAMP_RECORD_DTYPE)
    r["ssid"], r["sender_seq"] = 5, np.arange(300)
    r["t1_ns"] = first * NS + np.arange(300) * (NS // 100)
    r["t2_ns"], r["t3_ns"], r["t4_ns"] = r["t1_ns"] + 1_000_000, r["t1_ns"] + 1_010_000, r["t1_ns"] + 2_000_000
    producer = Producer({"bootstrap.servers": stack.kafka_bootstrap})
    producer.produce(records, key=b"P/5", value=encode_batch(r, "P", 1))
    assert producer.flush(30) == 0
    log = tmp_path / "worker.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [str(venv / "bin" / "segscope-delay-processor"), "--bootstrap", stack.kafka_bootstrap,
             "--records-topic", records, "--metrics-topic", metrics, "--deadletter-topic", f"test.pip.{run}.dl",
             "--app-id", f"test-pip-{run}", "--grace-s", "1", "--datadir", str(tmp_path / "faust")],
            cwd=tmp_path, env=clean_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    counts: dict[int, int] = {}
    consumer = Consumer(
        {"bootstrap.servers": stack.kafka_bootstrap, "group.id": f"pip-{run}", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([metrics])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and sum(counts.values()) < 300:
            assert proc.poll() is None, log.read_text()[-3000:]
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            for line in msg.value().decode().splitlines():
                if line.startswith("stamp_delay,") and "direction=forward" in line:
                    count = int(line.split("count=")[1].split("i")[0])
                    counts[int(line.rsplit(" ", 1)[1])] = count
    finally:
        consumer.close()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    assert sorted(counts.values()) == [100, 100, 100], (counts, log.read_text()[-2000:])
    assert proc.returncode == 0
