"""HeartbeatLease: publish only while surely still a member of the consumer group."""

from __future__ import annotations

import logging
import time

from processors.runtime.config import SESSION_TIMEOUT_S

log = logging.getLogger("segscope.worker")


class HeartbeatLease:
    """Whether this worker is surely still a member of its consumer group, so it may publish the
    results of the partitions it was assigned.

    Why: the broker drops a member whose heartbeats stop for the session timeout (6 s) and gives
    its partitions to the others. A worker that stalls that long without dying (SIGSTOP, a paused
    VM, a starved host) runs again with its timers overdue: its flush fires before its consumer
    thread's next heartbeat learns it was dropped, and publishes the results it holds for
    partitions another worker owns now, e.g. blocks timed out without their rx side that the new
    owner has already joined. InfluxDB keeps whichever came last: the stale line. Found by
    stopping a loss worker for 9 s mid-stream (tests/processors/test_worker_stall.py).

    So publication needs a lease: the send time of the last heartbeat the coordinator answered
    (or of the last assignment) plus the session timeout, minus a margin for the publish itself.
    The broker cannot have dropped the member before that. Heartbeats go every 2 s, so a running
    worker always holds the lease; a stalled one loses it and publishes nothing until a heartbeat
    says it is still a member, or the rebalance it learns of instead revokes its partitions
    (PartitionMoves / Leadership then drop what they fed). What is left: a stall of more than the
    margin between the check and the send of one flush."""

    def __init__(self, session_timeout_s: float = SESSION_TIMEOUT_S, margin_s: float = 1.5) -> None:
        self.session_timeout_s, self.margin_s = session_timeout_s, margin_s
        self.renewed_at: float | None = None  # time.monotonic() of the last renewal's request
        self.installed = False
        self.held = 0  # flushes that did not publish because the lease had run out

    def renew(self, sent_at: float) -> None:
        # the heartbeat task runs in Faust's consumer thread: one float store, read by the main loop
        if self.renewed_at is None or sent_at > self.renewed_at:
            self.renewed_at = sent_at

    def valid(self, now: float | None = None) -> bool:
        if self.renewed_at is None:
            return False
        now = time.monotonic() if now is None else now
        return now - self.renewed_at < self.session_timeout_s - self.margin_s

    def allows_publishing(self) -> bool:
        """valid(), counting the flushes it holds back (the `publish_held_no_lease` counter)."""
        if self.valid():
            return True
        self.held += 1
        if self.held == 1 or self.held % 100 == 0:
            log.warning("no heartbeat answered for %.1f s: results held until the group says this worker is still a "
                        "member (held %d flushes)", time.monotonic() - (self.renewed_at or 0), self.held)  # fmt: skip
        return False

    def joined(self, app) -> None:
        """At every assignment: the group just synced, so this worker is a member now; and from
        then on every heartbeat the coordinator accepts renews the lease (install)."""
        self.install(app)
        self.renew(time.monotonic())

    def install(self, app) -> None:
        """Renew on every heartbeat the coordinator accepts (Faust's aiokafka consumer, in its own
        thread); called at an assignment, when the coordinator exists."""
        if self.installed:
            return
        coordinator = app.consumer._thread._ensure_consumer()._coordinator
        original = coordinator._do_heartbeat

        async def _do_heartbeat() -> bool:
            sent_at = time.monotonic()
            ok = await original()  # True also while the group rebalances: still a member until it rejoins
            if ok:
                self.renew(sent_at)
            return ok

        coordinator._do_heartbeat = _do_heartbeat
        self.installed = True
