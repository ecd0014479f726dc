"""PartitionMoves: what a worker does when its consumer group rebalances."""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from processors.runtime.acks import InOrderAcks
from processors.runtime.clock import ActiveClock
from processors.runtime.commits import ExactCommits, rewind_uncommitted
from processors.runtime.lease import HeartbeatLease

log = logging.getLogger("segscope.worker")


def _tps(partitions) -> str:
    """topic[p, ...] for a log line."""
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return " ".join(f"{t}{sorted(ps)}" for t, ps in sorted(by_topic.items())) or "nothing"


class PartitionMoves:
    """What a worker does when its consumer group rebalances (a worker joins, leaves or dies).

    A Kafka rebalance moves partitions between live workers. The worker that loses a partition
    still holds, in memory, the open results (seconds, blocks) of the keys that partition carries
    and the unacked messages that fed them; their new owner replays those messages (never
    committed) and computes the same results from scratch. If the old owner kept them, it would
    publish them again later from the part it had (an idle session closes by the wall clock),
    and InfluxDB would keep whichever came last. So:

    - on revoke (every member of the group, before the new assignment), `paused` is set under
      `lock`, after any flush in progress ended: the flush timer publishes nothing until the
      assignment is known;
    - on assignment, under the same lock: the partitions this worker lost are passed to
      `on_lost(partitions)` (drop the state they fed without publishing; `take_keys` gives the
      result keys `seen` on them), their held messages are forgotten, then `await on_assigned()`
      runs (re-read the progress topic: the old owner wrote there, before it acked anything, what
      it had made final; its revoke flushed its producer first) and the pause ends;
    - a message of a lost partition that Faust fetched before the rebalance and hands over after
      it is skipped (`moved_away`).

    One mechanism for every processor: the delay processor (one input topic, result keys =
    sessions) and the loss processor (two stages, the collector topic and the by-flow topic,
    each with its held messages; its state is dropped by flow partition).

    Partitions that stay assigned are replayed from their committed offset too (Kafka's eager
    rebalance resets every position); the processors count those records once (duplicate and
    final-horizon checks).
    """

    def __init__(self, app, pending: dict[str, InOrderAcks], on_lost: Callable[[set], int],
                 on_assigned: Callable[[], Awaitable[None]], clock: ActiveClock | None = None) -> None:  # fmt: skip
        """pending: the held (unacked) messages of each input topic this guards; clock: the
        processor's timeout clock, stopped from revoke to assignment."""
        self.pending, self.on_lost, self.on_assigned, self.clock = pending, on_lost, on_assigned, clock
        self.lock = asyncio.Lock()
        self.paused = False
        self.owned: set = set()  # partitions (TP) of the input topics this worker owns
        self.lost: set = set()  # partitions it owned before the last assignment and not since
        self.key_partition: dict = {}  # result key (session, flow) -> the TP its records came on
        self.lease = HeartbeatLease()  # publish only while surely still a member (a stall past the session)
        self.counts = {
            "rebalances": 0,
            "publish_held_no_lease": 0,
            "partitions_lost": 0,
            "partitions_reset_after_stall": 0,
            "keys_dropped": 0,
            "messages_forgotten": 0,
            "messages_of_moved_partitions": 0,
            "partitions_refetched": 0,
            "messages_expired_unread": 0,
            "refetches_moved_away": 0,
            "messages_released_at_rebalance": 0,
        }
        self.commits = ExactCommits(set(pending), self.counts)  # no commit past a message never acked
        app.on_partitions_revoked.connect(self._revoked)
        app.on_partitions_assigned.connect(self._assigned)

    def moved_away(self, tp) -> bool:
        """True for a message of a partition this worker lost: one Faust had fetched before the
        rebalance and hands over after it. Skip it (no ingest, no ack): its new owner replays
        it. Ingesting it would recreate the dropped state, and acking it would commit an offset
        of a partition another worker is still working through (Kafka checks the generation of
        a commit, not who owns the partition), losing that worker's unfinished results."""
        if tp in self.lost:
            self.counts["messages_of_moved_partitions"] += 1
            return True
        return False

    def batches(self, handler: Callable[[list], Awaitable[None]]) -> Callable[[list], Awaitable[None]]:
        """`handler(messages)` for BatchIntake, run under `lock` (a rebalance's partition moves and
        a flush never interleave with it) and not while a rebalance is under way (the batch is
        let go: read again from the committed offset after it, counted); the messages of
        partitions this worker lost are left out (moved_away)."""

        async def take(messages: list) -> None:
            async with self.lock:
                if self.paused:
                    self.counts["messages_released_at_rebalance"] += len(messages)
                    return
                lost = self.lost
                if lost:
                    messages = [m for m in messages if not self.moved_away(m.tp)]
                if messages:
                    await handler(messages)

        return take

    def seen(self, keys, tp) -> None:
        """The keys a message fed, and the partition it came on."""
        for key in keys:
            self.key_partition[key] = tp

    def take_keys(self, partitions: set) -> set:
        """The result keys last seen on these partitions, forgotten here."""
        keys = {k for k, tp in self.key_partition.items() if tp in partitions}
        for k in keys:
            del self.key_partition[k]
        return keys

    def may_publish(self) -> bool:
        """Whether a flush may publish (call it under `lock`): not while a rebalance is under way
        (which keys stay here is not known yet), nor after a stall that may have cost this worker
        its membership (HeartbeatLease: another worker may own these keys now)."""
        if self.paused:
            return False
        if not self.lease.allows_publishing():
            self.counts["publish_held_no_lease"] += 1
            return False
        return True

    async def _revoked(self, sender, revoked, **kwargs) -> None:
        self.commits.forget(revoked)
        async with self.lock:
            self.paused = True
            if self.clock is not None:
                self.clock.pause()

    async def _assigned(self, sender, assigned, **kwargs) -> None:
        # Read before joined() renews it: had the lease run out, the group may have dropped this
        # worker meanwhile and given its partitions to another, which published and committed past
        # the state held here (a stall past the session timeout). Assigned them again, this worker
        # would publish that stale state over the other's results: a partial second written over a
        # complete one, found with one of two delay workers stopped 12 s. So the partitions it keeps
        # are reset like lost ones, and rebuilt from the committed offset and the progress topic.
        was_member = self.lease.valid()
        rewind_uncommitted(sender, set(self.pending), self.commits.sought)
        self.commits.install(sender.consumer)
        self.lease.joined(sender)
        async with self.lock:
            now = {tp for tp in assigned if tp.topic in self.pending}
            kept_stale = set() if was_member else self.owned & now
            lost = self.owned - now
            self.owned = now
            self.lost = (self.lost | lost) - now
            self.counts["rebalances"] += 1
            if kept_stale:
                dropped = self.on_lost(kept_stale)
                self.counts["partitions_reset_after_stall"] += len(kept_stale)
                self.counts["keys_dropped"] += dropped
                for topic, held in self.pending.items():
                    self.counts["messages_forgotten"] += held.drop({tp for tp in kept_stale if tp.topic == topic})
                log.info(
                    "rebalance after a stall: partitions %s kept but reset, %d keys dropped", _tps(kept_stale), dropped
                )
            if lost:
                dropped = self.on_lost(lost)
                self.counts["partitions_lost"] += len(lost)
                self.counts["keys_dropped"] += dropped
                for topic, held in self.pending.items():
                    self.counts["messages_forgotten"] += held.drop({tp for tp in lost if tp.topic == topic})
                log.info("rebalance: partitions %s moved away, %d keys dropped", _tps(lost), dropped)
            await self.on_assigned()
            self.paused = False
            if self.clock is not None:
                self.clock.resume()
            log.info("rebalance: own %s", _tps(now))
