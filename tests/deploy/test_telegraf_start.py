"""Telegraf's configuration (services/telegraf/telegraf.conf, also the chart's): started while Kafka
is not reachable, as in a pod that starts before the Kafka pod is Ready, it keeps running and
retries the Kafka input instead of exiting (a crash loop in Kubernetes)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TELEGRAF = REPO / ".local" / "bin" / "telegraf"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_telegraf_outlives_an_unreachable_kafka(tmp_path):
    env = dict(
        os.environ,
        SEGSCOPE_KAFKA_BOOTSTRAP="127.0.0.1:1",  # nothing listens on port 1: connection refused
        SEGSCOPE_TOPIC_METRICS="segscope.metrics",
        SEGSCOPE_TELEGRAF_GROUP="telegraf-start-test",
        SEGSCOPE_TELEGRAF_HEALTH=f"127.0.0.1:{free_port()}",
        SEGSCOPE_INFLUX_URL="http://127.0.0.1:1",
        SEGSCOPE_INFLUX_DB="segscope",
        SEGSCOPE_INFLUX_USER="writer",
        SEGSCOPE_INFLUX_PASSWORD="unused",
    )
    log = tmp_path / "telegraf.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [str(TELEGRAF), "--config", str(REPO / "services" / "telegraf" / "telegraf.conf")],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        time.sleep(8)  # the first start attempt fails within a second; the interval is 5 s
        exited = proc.poll()
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    text = log.read_text()
    assert exited is None, f"telegraf exited ({exited}) while Kafka was unreachable:\n{text[-2000:]}"
    assert "kafka_consumer" in text, text[-2000:]
