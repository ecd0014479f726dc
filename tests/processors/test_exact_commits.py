"""ExactCommits (processors/worker.py): no commit past a message the streams never got, and that
message is read again.

- The commit rule on Faust's own bookkeeping (acked offsets, committed offsets), offset by offset.
- On real Kafka: one loss worker whose fetch loop loses the hand-over of one collector message
  (tests/processors/skip_handover.py, what faust-streaming does when a rebalance cuts a hand-over
  off). Faust alone commits past it and that block stays incomplete for good; with ExactCommits
  the worker reads the partition again from that message and every block is exact.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict

from aiokafka.errors import IllegalStateError
from confluent_kafka import Consumer, Producer, TopicPartition
from faust.types import TP

from processors.delay.topics import ensure_topics
from processors.worker import ExactCommits
from segscope_schemas import altmark_block as ab
from tests.processors.conftest import stop_worker
from tests.processors.test_loss_workers import NS, block_batch, outcomes, start


class FaustBookkeeping:
    """The consumer state ExactCommits reads and writes, as faust.transport.consumer.Consumer
    keeps it: acked offsets per partition (list + index), committed offsets (the next offset to
    read; 0 and none are both None there), gaps; seek() records where it was sent."""

    def __init__(self, assigned):
        self._acked = defaultdict(list)
        self._acked_index = defaultdict(set)
        self._committed_offset = defaultdict(lambda: None)
        self._gap = {}
        self.assigned = set(assigned)
        self.seeks: list = []
        self.first_offset = 0  # of every partition (retention deleted nothing)

    def assignment(self):
        return self.assigned

    def ack(self, tp, *offsets):
        for o in offsets:
            self._acked[tp].append(o)
            self._acked_index[tp].add(o)

    async def seek(self, tp, offset):
        self.seeks.append((tp, offset))

    async def earliest_offsets(self, *tps):
        return {tp: self.first_offset for tp in tps}


async def settle():
    """Let the read_again task ExactCommits started run to its end."""
    for _ in range(5):
        await asyncio.sleep(0)


def guard(topics=("in",)):
    tp = TP("in", 0)
    consumer = FaustBookkeeping([tp])
    counts = {"partitions_refetched": 0, "messages_expired_unread": 0}
    g = ExactCommits(set(topics), counts, retry_s=3.0)
    g.install(consumer)
    return g, consumer, counts, tp


def test_commits_the_run_that_starts_at_the_committed_offset():
    async def run():
        g, consumer, counts, tp = guard()
        consumer._committed_offset[tp] = 10
        consumer.ack(tp, 12, 10, 11, 14)
        assert consumer._new_offset(tp) == 13  # 10, 11, 12 done; 13 not
        assert consumer._acked[tp] == [14] and consumer._acked_index[tp] == {14}
        consumer._committed_offset[tp] = 13
        # the stages ack in offset order: 14 acked without 13 means 13 never reached them
        assert consumer._new_offset(tp) is None
        await settle()
        assert consumer.seeks == [(tp, 13)] and counts["partitions_refetched"] == 1

    asyncio.run(run())


def test_a_message_missing_at_the_committed_offset_is_not_committed_past_and_is_read_again():
    """Faust alone commits 30 here (it refuses only when the lowest acked offset is above c + 1)."""

    async def run():
        g, consumer, counts, tp = guard()
        consumer._committed_offset[tp] = 22
        consumer.ack(tp, *range(23, 30))
        assert consumer._new_offset(tp) is None
        await settle()
        assert consumer.seeks == [(tp, 22)] and counts["partitions_refetched"] == 1
        assert consumer._new_offset(tp) is None  # still missing: no second seek within retry_s
        await settle()
        assert consumer.seeks == [(tp, 22)]
        g.refetched[tp] = (22, time.monotonic() - 5)  # retry_s later, still missing: once more
        consumer._new_offset(tp)
        await settle()
        assert consumer.seeks == [(tp, 22), (tp, 22)] and counts["partitions_refetched"] == 2
        consumer.ack(tp, 22)  # read again and acked: everything up to 29 commits
        assert consumer._new_offset(tp) == 30

    asyncio.run(run())


def test_offsets_retention_deleted_unread_are_counted_and_not_waited_for():
    """A group stopped longer than the topic's retention: committed 100, the log starts at 150,
    Kafka's reset hands over 150 onwards. No endless seek back: the run starts at 150."""

    async def run():
        g, consumer, counts, tp = guard()
        consumer.first_offset = 150
        consumer._committed_offset[tp] = 100
        consumer.ack(tp, 150, 151)
        assert consumer._new_offset(tp) is None
        await settle()
        assert consumer.seeks == [] and counts["messages_expired_unread"] == 50
        assert counts["partitions_refetched"] == 0
        assert consumer._new_offset(tp) == 152

    asyncio.run(run())


def test_acked_below_the_committed_offset_are_forgotten():
    _, consumer, _, tp = guard()
    consumer._committed_offset[tp] = 5
    consumer.ack(tp, 3, 4, 5, 6)  # 3, 4: a replay of what another worker committed
    assert consumer._new_offset(tp) == 7
    assert consumer._acked[tp] == [] and consumer._acked_index[tp] == set()


def test_uncommitted_partition_starts_where_it_was_sought_and_other_topics_only_wait():
    async def run():
        g, consumer, counts, tp = guard(topics=("other",))
        g.sought[tp] = 0  # rewind_uncommitted sought it to its first offset; Faust says None
        consumer.ack(tp, 1, 2)
        assert consumer._new_offset(tp) is None
        await settle()
        assert consumer.seeks == [] and counts["partitions_refetched"] == 0  # not a guarded topic
        consumer.ack(tp, 0)
        assert consumer._new_offset(tp) == 3

    asyncio.run(run())


def test_nothing_known_about_the_start_commits_the_first_run_as_faust_does():
    _, consumer, _, tp = guard()
    consumer.ack(tp, 7, 8, 10)
    assert consumer._new_offset(tp) == 9


BLOCKS, FLOWS = 8, 20


def test_a_lost_hand_over_is_read_again_and_every_block_is_exact(stack, tmp_path):
    bootstrap = stack.kafka_bootstrap
    run = uuid.uuid4().hex[:6]
    blocks, dl, metrics = f"test.exact.{run}.blocks", f"test.exact.{run}.dl", f"test.exact.{run}.metrics"
    ensure_topics(bootstrap, [blocks, dl, metrics], partitions=1)  # one partition: offsets are known
    tx, rx = f"xtx{run}", f"xrx{run}"
    flows = list(range(100, 100 + FLOWS))
    b0 = time.clock_gettime_ns(time.CLOCK_TAI) // NS - 300
    sent = {(f, b0 + i): 1000 + 10 * f + i for f in flows for i in range(BLOCKS)}
    lost = {(f, b): (f + b) % 3 for f, b in sent}
    # offsets: 0 tx of block 0, then per block i >= 1: tx of i (2i - 1), rx of i - 1 (2i).
    # Offset 5 is block 3's tx: its records reach the joiner only if 5 is read again.
    skip = 5
    app_id = f"exact-{run}"
    worker = start(
        bootstrap,
        tmp_path,
        "w",
        blocks,
        app_id,
        metrics,
        dl,
        module="tests.processors.skip_handover",
        env={"SEGSCOPE_TEST_SKIP_HANDOVER": f"{blocks}:0:{skip}"},
    )
    tail = Consumer({"bootstrap.servers": bootstrap, "group.id": f"exact-read-{run}", "auto.offset.reset": "earliest"})
    tail.subscribe([metrics])
    last: dict[str, str] = {}
    refetched = 0

    def read(timeout: float = 0.2) -> None:
        nonlocal refetched
        for m in tail.consume(num_messages=1000, timeout=timeout):
            for line in m.value().decode().split("\n"):
                if line.startswith("altmark_loss,"):
                    head, fields_s, ts = line.rsplit(" ", 2)
                    last[f"{head} {ts}"] = fields_s
                elif line.startswith("segscope_processor,") and "partitions_refetched=" in line:
                    refetched = max(refetched, int(line.split("partitions_refetched=", 1)[1].split("i", 1)[0]))

    log = tmp_path / "w.log"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "health on" not in log.read_text(errors="replace"):
            assert worker.poll() is None, log.read_text(errors="replace")[-3000:]
            time.sleep(0.2)
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "enable.idempotence": True})
        for i in range(BLOCKS + 1):
            if i < BLOCKS:
                block = b0 + i
                producer.produce(
                    blocks, key=tx.encode(), value=block_batch(tx, ab.DIR_TX, block, {f: sent[f, block] for f in flows})
                )
            if i >= 1:
                prev = b0 + i - 1
                got = {f: sent[f, prev] - lost[f, prev] for f in flows}
                producer.produce(blocks, key=rx.encode(), value=block_batch(rx, ab.DIR_RX, prev, got))
            assert producer.flush(10) == 0
            time.sleep(0.2)
        want = {k: ("ok", lost[k]) for k in sent}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (outcomes(last, tx) != want or refetched == 0):
            assert worker.poll() is None, log.read_text(errors="replace")[-3000:]
            read()
        text = log.read_text(errors="replace")
        assert f"skipped hand-over of {blocks}:0:{skip}" in text  # the fault happened
        got = outcomes(last, tx)
        assert got == want, {k: v for k, v in got.items() if want.get(k) != v}
        assert refetched >= 1 and f"message {skip} was never handed over" in text, text[-3000:]
        # and the group commits everything once it has it: 2 * BLOCKS messages
        group = Consumer({"bootstrap.servers": bootstrap, "group.id": app_id})
        try:
            deadline = time.monotonic() + 20
            committed = None
            while time.monotonic() < deadline:
                committed = group.committed([TopicPartition(blocks, 0)], timeout=10)[0].offset
                if committed == 2 * BLOCKS:
                    break
                time.sleep(0.5)
            assert committed == 2 * BLOCKS
        finally:
            group.close()
    finally:
        stop_worker(worker)
        tail.close()


def test_every_rebalance_counter_is_documented():
    """PartitionMoves' counters go out on the processors' segscope_processor lines: each has a
    row in schemas/metrics.md, so an operator can look up what it counts."""
    from pathlib import Path
    from types import SimpleNamespace

    from processors.runtime.input_watch import InputWatch
    from processors.worker import PartitionMoves

    signal = SimpleNamespace(connect=lambda handler: None)
    app = SimpleNamespace(on_partitions_revoked=signal, on_partitions_assigned=signal)
    moves = PartitionMoves(app, {"in": None}, on_lost=lambda lost: 0, on_assigned=None)
    doc = (Path(__file__).resolve().parents[2] / "schemas" / "metrics.md").read_text()
    assert {"partitions_refetched", "messages_expired_unread"} <= set(moves.counts)
    undocumented = [name for name in moves.counts if f"`{name}`" not in doc]
    assert undocumented == []
    watch = InputWatch(app, {"in"})  # the input watch's counters go out on the same lines
    assert set(watch.counts) == {"input_stalls", "input_stale_ms"}
    assert [name for name in watch.counts if f"`{name}`" not in doc] == []


class RevokedDuringLookup(FaustBookkeeping):
    """A rebalance revokes the partitions while earliest_offsets is awaited (a worker resumed
    after a stall past the session timeout: its commit timer and the rejoin run together); a seek
    of an unassigned partition raises as aiokafka's does."""

    def __init__(self, assigned, revoke_at_lookup=True):
        super().__init__(assigned)
        self.revoke_at_lookup = revoke_at_lookup

    async def earliest_offsets(self, *tps):
        if self.revoke_at_lookup:
            self.assigned = set()
        return await super().earliest_offsets(*tps)

    async def seek(self, tp, offset):
        if tp not in self.assigned:
            raise IllegalStateError(f"No current assignment for partition {tp}")
        await super().seek(tp, offset)


def test_a_read_again_whose_partition_a_rebalance_took_meanwhile_does_nothing():
    """Found by test_delay_sigstop: the seek back raised IllegalStateError in a task nobody
    awaited. The new owner reads the partition from the committed offset (never past the gap)."""

    async def run():
        tp = TP("in", 0)
        counts = {"partitions_refetched": 0, "messages_expired_unread": 0}
        g = ExactCommits({"in"}, counts)
        for revoke_at_lookup in (True, False):  # revoked during the lookup; between check and seek
            consumer = RevokedDuringLookup([tp], revoke_at_lookup)
            g.install(consumer)
            if not revoke_at_lookup:
                consumer.assignment = lambda: {tp}  # the check still sees it, the seek does not
                consumer.assigned = set()
            await g.read_again(tp, 22)
            assert consumer.seeks == []
        assert counts["refetches_moved_away"] == 2 and counts["partitions_refetched"] == 0

    asyncio.run(run())


def test_a_revoke_forgets_what_was_known_of_the_partition():
    g, consumer, counts, tp = guard()
    g.sought[tp], g.refetched[tp], g.floor[tp] = 5, (7, time.monotonic()), 3
    g.forget({tp})
    assert tp not in g.sought and tp not in g.refetched and tp not in g.floor
