"""Kafka for the processor tests: the suite's session `stack` (tests/conftest.py).

Every test uses its own topic names and consumer groups, so it never sees another run's data.
To run this directory beside another test run, isolate the stack:
SEGSCOPE_STACK_PORT_BASE=29700 SEGSCOPE_STACK_RUN_DIR=.run/stack-29700 .local/venv/bin/pytest tests/processors
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def kafka_bootstrap(stack) -> str:
    return stack.kafka_bootstrap


def topic_config(bootstrap: str, topic: str, name: str) -> str:
    """One configuration value of a topic, as the broker reports it."""
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return admin.describe_configs([res])[res].result(timeout=10)[name].value


def stop_worker(proc) -> None:
    """SIGTERM a worker (it flushes and exits 0) and wait; kill it if it hangs: never left running."""
    import signal
    import subprocess

    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
