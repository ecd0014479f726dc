"""processors/runtime/acks.py: batches held until finished, acked per partition in offset order,
into Faust's consumer bookkeeping (what ExactCommits then commits)."""

from __future__ import annotations

import asyncio

from faust.types import TP

from processors.runtime.acks import InOrderAcks, ack_offsets
from processors.runtime.commits import ExactCommits
from tests.processors.test_exact_commits import FaustBookkeeping

A, B = TP("in", 0), TP("in", 1)


def held(consumer):
    acks = InOrderAcks(lambda: consumer)
    acks.hold(A, [0, 1, 2], "a0")
    acks.hold(B, [0, 1], "b0")
    acks.hold(A, [3, 4], "a1")
    acks.hold(B, [2], "b1")
    return acks


def test_a_batch_is_acked_only_after_every_earlier_batch_of_its_partition():
    consumer = FaustBookkeeping([A, B])
    acks = held(consumer)
    assert len(acks) == 8
    done = {"a1", "b0"}  # a1 is finished but a0, before it in A, is not
    assert asyncio.run(acks.ack_finished(lambda state: state in done)) == 2
    assert consumer._acked[A] == [] and consumer._acked[B] == [0, 1]
    assert len(acks) == 6
    done |= {"a0"}
    assert asyncio.run(acks.ack_finished(lambda state: state in done)) == 5
    assert sorted(consumer._acked[A]) == [0, 1, 2, 3, 4] and len(acks) == 1  # b1 still held


def test_dropped_partitions_are_never_acked():
    consumer = FaustBookkeeping([A, B])
    acks = held(consumer)
    assert acks.drop({B}) == 3
    assert len(acks) == 5
    asyncio.run(acks.ack_finished(lambda state: True))
    assert consumer._acked[B] == [] and len(acks) == 0


def test_offsets_below_the_committed_one_or_acked_before_are_left_out():
    consumer = FaustBookkeeping([A])
    consumer._committed_offset[A] = 5
    assert ack_offsets(consumer, A, [3, 4, 5, 6]) == 2  # a replay of what was committed: 3, 4
    assert ack_offsets(consumer, A, [6, 7]) == 1
    assert consumer._acked[A] == [5, 6, 7] and consumer._acked_index[A] == {5, 6, 7}


def test_what_batches_ack_commits_exactly_the_finished_run():
    """The commit rule on what the batch acks leave: the run from the committed offset, no further."""
    consumer = FaustBookkeeping([A])
    commits = ExactCommits({"in"}, {"partitions_refetched": 0, "messages_expired_unread": 0})
    commits.install(consumer)
    consumer._committed_offset[A] = 10
    acks = InOrderAcks(lambda: consumer)
    acks.hold(A, [10, 11, 12], "first")
    acks.hold(A, [13, 14], "second")
    asyncio.run(acks.ack_finished(lambda state: state == "first"))
    assert consumer._new_offset(A) == 13
