"""segscope-topics (the chart's init container) against the real Kafka: creates, grows, refuses
bad input with the field named, and --check reports a short topic."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka.admin import AdminClient

from services.kafka import topics


def partitions(bootstrap: str, name: str) -> int:
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
    return len(md[name].partitions) if name in md else 0


def test_creates_then_grows_and_never_shrinks(stack):
    name = f"segscope-test.topics.{uuid.uuid4().hex[:8]}"
    said = []
    have = topics.ensure(stack.kafka_bootstrap, {name: 1}, replication=1, timeout_s=30, say=said.append)
    assert have == {name: 1} and partitions(stack.kafka_bootstrap, name) == 1
    have = topics.ensure(stack.kafka_bootstrap, {name: 3}, replication=1, timeout_s=30, say=said.append)
    assert have == {name: 3} and partitions(stack.kafka_bootstrap, name) == 3
    assert said == [f"segscope-topics: {name}: created", f"segscope-topics: {name}: grown"]
    # asking for fewer leaves the topic alone (Kafka cannot shrink; the deployment's number is a floor)
    assert topics.ensure(stack.kafka_bootstrap, {name: 2}, replication=1, timeout_s=30, say=said.append) == {name: 3}
    assert len(said) == 2


def test_registry_topic_config_is_set_at_creation(stack, monkeypatch):
    """A registry topic with a config (segscope.paths: compacted) gets it from segscope-topics; the
    stack made the real segscope.paths the same way."""
    from tests.processors.conftest import topic_config

    name = f"segscope-test.topics.{uuid.uuid4().hex[:8]}"
    monkeypatch.setitem(topics.TOPIC_CONFIG, name, {"cleanup.policy": "compact"})
    topics.ensure(stack.kafka_bootstrap, {name: 1}, replication=1, timeout_s=30, say=lambda s: None)
    assert topic_config(stack.kafka_bootstrap, name, "cleanup.policy") == "compact"
    assert topic_config(stack.kafka_bootstrap, "segscope.paths", "cleanup.policy") == "compact"


def test_registry_topics_ready_and_check_mode(stack, capsys):
    assert topics.main(["--bootstrap", stack.kafka_bootstrap, "--check"]) == 0
    out = capsys.readouterr().out
    assert "segscope.stamp.records" in out and "segscope.altmark.blocks" in out and "segscope.paths" in out
    # more partitions than the stack made: --check reports the topic short, changes nothing
    assert topics.main(["--bootstrap", stack.kafka_bootstrap, "--check", "--partitions", "segscope.metrics=7"]) == 1
    assert partitions(stack.kafka_bootstrap, "segscope.metrics") < 7


@pytest.mark.parametrize(
    "arg,says",
    [("segscope.stamp.records=0", "N >= 1"), ("segscope.stamp.records", "TOPIC=N"), ("nope=2", "not a segscope topic")],
)
def test_bad_partitions_argument_is_named(arg, says, capsys):
    with pytest.raises(SystemExit) as exc:
        topics.main(["--bootstrap", "127.0.0.1:1", "--partitions", arg])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"--partitions {arg!r}" in err and says in err


def test_unreachable_kafka_is_an_error_not_a_hang(capsys):
    assert topics.main(["--bootstrap", "127.0.0.1:1", "--timeout", "3"]) == 1
    assert "did not answer within 3 s" in capsys.readouterr().err


def test_started_before_its_broker_waits_and_finds_the_topics_created(tmp_path):
    """The chart starts the init container beside the Kafka pod. A broker that has just started
    acknowledges a creation before its metadata cache shows the topic: segscope-topics must read
    until the topics show, not report them missing. Without that wait it reported them missing in
    3 of 10 early starts with other test runs loading the machine, and in none of 12 on a quiet one:
    this test guards the fix, it cannot show the race every time. Three early starts, each on a fresh
    broker; all must exit 0 with every topic at its partitions."""
    import os
    import re
    import subprocess
    import sys
    import time
    from pathlib import Path

    from services.kafka.kafka import Kafka
    from tests.isolation import extra_stack

    run_dir, base = extra_stack("sv-topics-early", slot=4, default_port_base=29900)
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{repo}:{repo / 'schemas' / 'python'}"}
    for _ in range(3):
        kafka = Kafka(run_dir, lambda line: None, port=base, controller_port=base + 1, fresh=True)
        cmd = [sys.executable, "-m", "services.kafka.topics", "--bootstrap", kafka.bootstrap, "--timeout", "60",
               "--partitions", "segscope.stamp.records=2"]  # fmt: skip
        tool = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            time.sleep(2)  # the tool is waiting for the broker (backing off between its tries)
            kafka.start()
            out, _ = tool.communicate(timeout=90)
        finally:
            if tool.poll() is None:
                tool.kill()
            kafka.stop()
        assert tool.returncode == 0, out
        assert re.search(r"segscope\.stamp\.records +2 partitions \(wanted 2\)", out), out
