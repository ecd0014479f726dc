"""Leadership: which of the N topology workers writes (README.md, "N workers").

The leader is the worker that owns partition 0 of Faust's leader topic
`<app id>-__assignor-__leader` (one partition, in the workers' consumer group; Faust's
assignor gives it to exactly one member, `app.is_leader()`). A rebalance (a worker joins, leaves,
or was killed and missed the session timeout) may move it:

- on revoke (every member, before the new assignment), `leading` is cleared under `lock`, after
  a write in progress ended: no worker writes until the assignment is known, so two leaders never
  write at once; a leader that stalls past the session timeout without dying writes nothing more
  until a heartbeat says it is still a member (`membership`, processors/runtime/lease.py HeartbeatLease);
- on assignment, under the same lock, the new owner sets `leading` and, if it was not leading
  before, calls `on_take_over()` (read the database back before the next diff; send the dead
  letters the old leader may not have sent).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from processors.runtime.lease import HeartbeatLease

log = logging.getLogger("segscope.topology.leadership")


class Leadership:
    def __init__(self, app, on_take_over: Callable[[], Awaitable[None]]) -> None:
        from faust.types import TP

        self.lease = TP(f"{app.conf.id}-__assignor-__leader", 0)
        self.on_take_over = on_take_over
        self.lock = asyncio.Lock()
        self.leading = False
        self.membership = HeartbeatLease()  # write only while surely still a member (flush checks it)
        self.counts = {"rebalances": 0, "take_overs": 0, "hand_overs": 0}
        app.on_partitions_revoked.connect(self._revoked)
        app.on_partitions_assigned.connect(self._assigned)

    async def _revoked(self, sender, revoked, **kwargs) -> None:
        async with self.lock:
            if self.leading:
                self.counts["hand_overs"] += 1
            self.leading = False

    async def _assigned(self, sender, assigned, **kwargs) -> None:
        self.membership.joined(sender)
        async with self.lock:
            self.counts["rebalances"] += 1
            lead = self.lease in assigned
            if lead:
                self.counts["take_overs"] += 1
                log.info("leader: this worker writes ArangoDB from now on")
                await self.on_take_over()
            else:
                log.info("standby: another worker writes ArangoDB; the model is kept current")
            self.leading = lead
