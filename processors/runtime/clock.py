"""ActiveClock: the time a worker could read its input, for timeouts that are evidence."""

from __future__ import annotations

import time


class ActiveClock:
    """A monotonic clock (ns) that leaves out the time the worker could not consume: stalls of
    the process (a gap of more than stall_s between two readings, all of it but the reading
    interval: the app reads it every 0.1 s), rebalance pauses (it stands still from revoke to
    assignment) and the time its input is stale (no fetch answered: a Kafka outage; the app pauses
    it from runtime/input_watch.py).

    Why: a block's (or second's) timeout says "its other side did not come in timeout_s", and
    that is only evidence while the worker was reading. After a 9 s stall, or a rebalance that
    waited 6 s for a dead member, the other side is in the input the worker is about to read
    (or replay): timed out by the wall clock, the block would be published incomplete and
    corrected a moment later, a false missing_rx in InfluxDB meanwhile. After an outage longer
    than the retention, the other side would come to an evicted block and be dropped as late."""

    def __init__(self, stall_s: float = 1.0, reading_interval_s: float = 0.1) -> None:
        self.stall_ns = int(stall_s * 1e9)
        self.interval_ns = int(reading_interval_s * 1e9)  # of a stall, this much is counted
        self.left_out_ns = 0  # stalls and pauses so far
        self.last_ns = time.monotonic_ns()  # the last reading
        self.paused_at: int | None = None  # the active time a pause stopped at
        self.paused_by: set[str] = set()  # why it stands still: "rebalance", "input" (InputWatch)

    def now_ns(self) -> int:
        now = time.monotonic_ns()
        gap = now - self.last_ns
        if gap > self.stall_ns:
            self.left_out_ns += gap - self.interval_ns
        self.last_ns = now
        active = now - self.left_out_ns
        return active if self.paused_at is None else self.paused_at

    def pause(self, reason: str = "rebalance") -> None:
        """Stand still until resume(reason); pauses for several reasons overlap (a rebalance while
        the input is stale): the clock runs again when the last of them ends."""
        if not self.paused_by:
            self.paused_at = self.now_ns()
        self.paused_by.add(reason)

    def resume(self, reason: str = "rebalance") -> None:
        if reason not in self.paused_by:
            return
        self.paused_by.discard(reason)
        if not self.paused_by:
            stopped_at, self.paused_at = self.paused_at, None
            self.left_out_ns += self.now_ns() - stopped_at
