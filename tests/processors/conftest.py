"""Kafka for the processor tests.

Uses the suite's session `stack` fixture (tests/conftest.py) when it exists, so a full test
run starts Kafka once; run alone, this directory starts a Kafka-only Stack on its own port
base and run dir. Either way it is a real broker, and every test uses its own topic names.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.stack import Stack

REPO = Path(__file__).resolve().parents[2]
OWN_PORT_BASE = int(os.environ.get("SEGSCOPE_TEST_PROCESSORS_PORT_BASE", "29300"))


@pytest.fixture(scope="session")
def kafka_bootstrap(request) -> str:
    try:
        stack = request.getfixturevalue("stack")
    except pytest.FixtureLookupError:
        stack = Stack(run_dir=REPO / ".run" / "test-processors", port_base=OWN_PORT_BASE)
        stack.up(only=["kafka"])
        request.addfinalizer(lambda: stack.down(only=["kafka"]))
    return stack.kafka_bootstrap
