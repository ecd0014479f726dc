"""What offsets a processor commits: only past messages it acked, and from a partition's start
where the group never committed (faust-streaming's own rules commit past unacked messages)."""

from __future__ import annotations

import asyncio
import bisect
import logging
import time

from aiokafka.errors import IllegalStateError

log = logging.getLogger("segscope.worker")


def rewind_uncommitted(app, topics: set, sought: dict | None = None) -> None:
    """Read a partition the group never committed (or committed only offset 0) from its beginning
    after every rebalance, as `consumer_auto_offset_reset="earliest"` promises.

    Found here (faust-streaming 0.11 with aiokafka): while a rebalance has the flow stopped, Faust
    drops the records aiokafka fetched meanwhile and calls perform_seek() to go back to the
    committed offsets; aiokafka seeks only to committed offsets > 0, so a partition without one
    keeps its advanced position and the records fetched during the pause are never processed. A
    worker that gains such a partition (a worker joining or dying in the first retention_s of a
    group, before anything was acked) skipped everything before the end. Wrapping perform_seek
    (Faust calls it at each assignment and while the flow is stopped) seeks those partitions to
    their beginning instead; what the group read before is replayed and counted once there."""
    consumer = app.consumer
    if getattr(consumer, "_segscope_rewinds_uncommitted", False):
        return
    original = consumer.perform_seek

    async def perform_seek() -> None:
        await original()
        tps = [tp for tp in consumer.assignment() if tp.topic in topics and not consumer._committed_offset.get(tp)]
        if tps:
            # a concrete offset, not aiokafka's seek_to_beginning: that leaves the position unset
            # until the reset is done, and Faust's livelock check asserts on it meanwhile
            earliest = await consumer.earliest_offsets(*tps)
            for tp in tps:
                await consumer.seek(tp, earliest[tp])  # also clears Faust's read offset of tp
                if sought is not None:
                    sought[tp] = earliest[tp]  # ExactCommits: the first offset to ack there

    consumer.perform_seek = perform_seek
    consumer._segscope_rewinds_uncommitted = True


class ExactCommits:
    """Commit an offset only when every message before it was acked here, and fetch again a
    message Faust never handed to the streams.

    Found by churn (tests/processors/churn_stress.py, 1 of 13 runs with kills, joins and stops
    1.5 s apart): one collector message (offset 22) was never re-keyed, the worker re-keyed 13-21
    and 23-29, and the group committed 30. Two things in faust-streaming 0.15 meet there:
    - its fetch loop hands a message to the streams under `wait_first(callback, suspend_flow)`;
      when a rebalance starts meanwhile, the hand-over is cancelled and the message is marked
      read all the same. The seek to the committed offset after the rebalance should bring it
      back, but messages of the same fetch handed over after that seek mark later offsets read,
      and the re-fetched message is then dropped as already read;
    - its commit (Consumer._new_offset) commits the run of consecutive acked offsets from the
      lowest acked one. Knowing the committed offset c, it refuses only when that lowest one is
      above c + 1; but c is the next offset to read, not the last one read, so a message at c
      that was never acked is committed past. A message skipped right at c is lost for good.
    So _new_offset is replaced: the run must start at c itself (where rewind_uncommitted sought
    an uncommitted partition, at that offset). A partition of `topics` whose acked offsets start
    above c lost a message: it is counted (`partitions_refetched`) and read again from c (a seek,
    at most once per `retry_s` per offset). The processors count the messages read twice once,
    as after every rebalance (duplicate and final-horizon checks). Other topics just wait. If c
    is below the partition's first offset, retention deleted those messages before the group
    read them (a group stopped longer than the topic's retention; Kafka's offset reset skips
    them too): they are counted (`messages_expired_unread`) and the run starts at the first offset.

    Faust's gap filling (offsets a transactional or compacted topic skips) is left out: our
    topics are written by idempotent producers without transactions and are not compacted, so
    their offsets have no gaps."""

    def __init__(self, topics: set, counts: dict, retry_s: float = 3.0) -> None:
        self.topics, self.counts, self.retry_s = topics, counts, retry_s
        self.sought: dict = {}  # TP -> the offset rewind_uncommitted sought it to (nothing committed)
        self.refetched: dict = {}  # TP -> (offset, time.monotonic()) of the last seek back
        self.floor: dict = {}  # TP -> its first offset, where retention deleted offsets never read
        self.consumer = None
        self.reading_again: set = set()  # read_again tasks under way
        counts.setdefault("refetches_moved_away", 0)

    def install(self, consumer) -> None:
        if self.consumer is consumer:
            return
        self.consumer = consumer
        consumer._new_offset = self.new_offset

    def start_of(self, tp) -> int | None:
        """The first offset this worker must ack in tp before it may commit anything there."""
        committed = self.consumer._committed_offset.get(tp)  # Faust: None for none and for 0
        known = [x for x in (committed or self.sought.get(tp), self.floor.get(tp)) if x is not None]
        return max(known) if known else None

    def new_offset(self, tp) -> int | None:
        """The offset to commit in tp: one past the run of acked offsets that starts at start_of(tp),
        those offsets forgotten; None when there is none."""
        consumer = self.consumer
        acked = consumer._acked[tp]
        if not acked:
            return None
        acked.sort()
        index = consumer._acked_index[tp]
        consumer._gap.pop(tp, None)
        start = self.start_of(tp)
        if start is not None:
            done = bisect.bisect_left(acked, start)  # acked below the committed offset: committed already
            if done:
                index.difference_update(acked[:done])
                del acked[:done]
            if not acked:
                return None
            if acked[0] != start:
                self.missing(tp, start)
                return None
        end = 1  # the run of consecutive offsets from acked[0]
        while end < len(acked) and acked[end] == acked[end - 1] + 1:
            end += 1
        index.difference_update(acked[:end])
        offset = acked[end - 1] + 1
        del acked[:end]
        return offset

    def missing(self, tp, offset: int) -> None:
        """Message `offset` of tp was never acked while later ones were: read tp again from it."""
        if tp.topic not in self.topics or tp not in self.consumer.assignment():
            return
        last = self.refetched.get(tp)
        now = time.monotonic()
        if last is not None and last[0] == offset and now - last[1] < self.retry_s:
            return
        self.refetched[tp] = (offset, now)
        task = asyncio.get_running_loop().create_task(self.read_again(tp, offset))  # commit runs in the app's loop
        self.reading_again.add(task)  # a reference until done: the loop keeps only a weak one
        task.add_done_callback(self.reading_again.discard)

    def forget(self, partitions) -> None:
        """A rebalance took these partitions: what was known of them (sought, refetched, floor) is
        stale; the next assignment finds it again."""
        for tp in partitions:
            self.sought.pop(tp, None)
            self.refetched.pop(tp, None)
            self.floor.pop(tp, None)

    async def read_again(self, tp, offset: int) -> None:
        """Seek tp back to `offset`, unless a rebalance took tp meanwhile.

        Found by a stall past the session timeout (tests/processors/test_delay_sigstop.py): the
        commit that found the gap ran right before the rejoin, the rebalance revoked tp while
        earliest_offsets was awaited, and the seek raised IllegalStateError ("No current
        assignment") in a task nobody awaited. The new owner reads tp from the committed offset,
        which is not past `offset` (ExactCommits refused it): nothing to do here then."""
        try:
            first = (await self.consumer.earliest_offsets(tp))[tp]
            if tp not in self.consumer.assignment():
                self.counts["refetches_moved_away"] += 1
                return
            await self._seek_back(tp, offset, first)
        except IllegalStateError:  # revoked between the check and the seek (the consumer's thread)
            self.counts["refetches_moved_away"] += 1

    async def _seek_back(self, tp, offset: int, first: int) -> None:
        if first > offset:
            self.floor[tp] = first
            self.counts["messages_expired_unread"] += first - offset
            log.warning("%s: messages %d..%d were deleted (topic retention) before this group read them", tp, offset,
                        first - 1)  # fmt: skip
            return
        await self.consumer.seek(tp, offset)
        self.counts["partitions_refetched"] += 1
        log.warning("%s: message %d was never handed over while later ones were: reading again from it", tp, offset)
