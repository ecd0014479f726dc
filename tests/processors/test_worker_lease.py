"""processors/runtime/lease.py HeartbeatLease and runtime/clock.py ActiveClock, on their own (the
worker test with a real stall is test_worker_stall.py)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from processors.runtime import clock as clock_module
from processors.runtime import lease as lease_module
from processors.runtime.clock import ActiveClock
from processors.runtime.lease import HeartbeatLease

S = 1_000_000_000


def test_lease_runs_out_a_margin_before_the_session_timeout():
    lease = HeartbeatLease(session_timeout_s=6.0, margin_s=1.5)
    assert not lease.valid(now=100.0)  # never renewed: not a member yet
    lease.renew(100.0)
    assert lease.valid(now=100.0) and lease.valid(now=104.49)
    assert not lease.valid(now=104.5)  # the broker may drop it at 106: the publish needs the margin
    lease.renew(99.0)  # an older heartbeat's answer arriving late does not move it back
    assert lease.valid(now=104.49) and not lease.valid(now=104.5)
    lease.renew(103.0)
    assert lease.valid(now=107.0)


def test_allows_publishing_counts_what_it_holds(monkeypatch):
    lease = HeartbeatLease(session_timeout_s=6.0, margin_s=1.5)
    now = [50.0]
    monkeypatch.setattr(lease_module.time, "monotonic", lambda: now[0])
    lease.renew(50.0)
    assert lease.allows_publishing() and lease.held == 0
    now[0] = 59.0  # a 9 s stall
    assert not lease.allows_publishing() and not lease.allows_publishing()
    assert lease.held == 2
    lease.renew(59.1)  # a heartbeat the coordinator answered: still a member
    assert lease.allows_publishing() and lease.held == 2


def test_install_renews_on_accepted_heartbeats_only(monkeypatch):
    answers = iter([True, False, True])
    now = [10.0]
    monkeypatch.setattr(lease_module.time, "monotonic", lambda: now[0])

    class Coordinator:
        async def _do_heartbeat(self) -> bool:
            now[0] += 0.2  # the round trip: the lease counts from the request, not the answer
            return next(answers)

    coordinator = Coordinator()
    app = SimpleNamespace(consumer=SimpleNamespace(_thread=SimpleNamespace(_ensure_consumer=lambda: consumer)))
    consumer = SimpleNamespace(_coordinator=coordinator)
    lease = HeartbeatLease()
    lease.install(app)
    lease.install(app)  # twice (every assignment calls it): wrapped once
    assert asyncio.run(coordinator._do_heartbeat()) is True and lease.renewed_at == 10.0
    now[0] = 12.0
    assert asyncio.run(coordinator._do_heartbeat()) is False and lease.renewed_at == 10.0  # refused: no renewal
    now[0] = 14.0
    assert asyncio.run(coordinator._do_heartbeat()) is True and lease.renewed_at == 14.0


@pytest.fixture
def fake_ns(monkeypatch):
    now = [1000 * S]
    monkeypatch.setattr(clock_module.time, "monotonic_ns", lambda: now[0])
    return now


def test_active_clock_leaves_out_stalls(fake_ns):
    clock = ActiveClock(stall_s=1.0, reading_interval_s=0.1)
    t0 = clock.now_ns()
    for _ in range(10):  # read every 0.1 s: all counted
        fake_ns[0] += S // 10
        clock.now_ns()
    assert clock.now_ns() - t0 == S
    fake_ns[0] += 9 * S  # a 9 s stall: one reading interval of it counted
    assert clock.now_ns() - t0 == S + S // 10
    fake_ns[0] += S  # 1 s: not more than the stall threshold, counted
    assert clock.now_ns() - t0 == 2 * S + S // 10


def test_active_clock_stands_still_over_a_pause(fake_ns):
    clock = ActiveClock(stall_s=1.0)
    t0 = clock.now_ns()
    fake_ns[0] += S // 2
    clock.pause()  # a rebalance: revoked
    for _ in range(30):  # 3 s of rebalance, read all along
        fake_ns[0] += S // 10
        assert clock.now_ns() - t0 == S // 2
    clock.pause()  # a second revoke before the assignment changes nothing
    clock.resume()
    assert clock.now_ns() - t0 == S // 2
    fake_ns[0] += S // 10
    assert clock.now_ns() - t0 == S // 2 + S // 10
    clock.resume()  # an assignment without a revoke (the first one): nothing to leave out
    assert clock.now_ns() - t0 == S // 2 + S // 10


def test_lease_reads_the_real_clock():
    lease = HeartbeatLease()
    lease.renew(time.monotonic())
    assert lease.allows_publishing()


def test_active_clock_pauses_overlap_and_run_again_when_the_last_ends(fake_ns):
    """A rebalance while the input is stale (a Kafka outage): the clock stands still from the first
    pause to the end of the last, whichever order they end in."""
    clock = ActiveClock(stall_s=1.0)
    t0 = clock.now_ns()
    clock.pause("input")
    fake_ns[0] += S // 10
    clock.pause()  # the rebalance
    fake_ns[0] += S // 10
    clock.resume("input")  # the input answers again, the rebalance goes on
    fake_ns[0] += S // 10
    assert clock.now_ns() == t0
    clock.resume("input")  # again: nothing
    clock.resume()
    fake_ns[0] += S // 10
    assert clock.now_ns() - t0 == S // 10
    clock.resume("input")  # a resume without its pause changes nothing
    assert clock.now_ns() - t0 == S // 10
