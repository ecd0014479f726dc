"""The agent's signals: SIGUSR1 writes every thread's stack to its log and changes nothing else (the
way to see why an agent does not answer or does not stop); SIGTERM then stops it cleanly."""

from __future__ import annotations

import signal
import time

from tests.agent.agent_env import start_agent
from tests.isolation import own_name


def test_sigusr1_writes_every_thread_stack_and_the_agent_keeps_serving(tmp_path):
    agent = start_agent(
        None, "sigs", tmp_path, instance=own_name("sigs"), extra_args=["--state-dir", str(tmp_path / "state")]
    )
    try:
        agent.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while "agent/__main__.py" not in agent.log() and time.monotonic() < deadline:  # the last thread written
            time.sleep(0.1)
        log = agent.log()
        assert "most recent call first" in log, log[-2000:]
        assert log.count("Thread 0x") + log.count("Current thread 0x") >= 2, log[-3000:]  # all threads
        assert "agent/__main__.py" in log, log[-3000:]  # the main thread, waiting for a signal
        assert agent.proc.poll() is None  # still running
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        with agent.channel() as ch:
            reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        assert agent.stop() == 0
    assert "agent stopped" in agent.log()
