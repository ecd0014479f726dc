"""processors/runtime/moves.py PartitionMoves.batches: the wrapper BatchIntake calls the processors'
batch handlers through (under the lock, nothing while a rebalance is under way, nothing of a
partition this worker lost)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from faust.types import TP

from processors.runtime.moves import PartitionMoves

KEPT, LOST = TP("in", 0), TP("in", 1)


def moves_and_calls():
    signal = SimpleNamespace(connect=lambda handler: None)
    app = SimpleNamespace(on_partitions_revoked=signal, on_partitions_assigned=signal)
    moves = PartitionMoves(app, {"in": None}, on_lost=lambda lost: 0, on_assigned=None)
    calls: list[list] = []

    async def handler(messages):
        assert moves.lock.locked()  # a flush or a rebalance's moves never run meanwhile
        calls.append([(m.tp, m.offset) for m in messages])

    return moves, moves.batches(handler), calls


def messages(*where):
    return [SimpleNamespace(tp=tp, offset=offset) for tp, offset in where]


def test_a_batch_reaches_the_handler_whole_and_under_the_lock():
    moves, take, calls = moves_and_calls()
    asyncio.run(take(messages((KEPT, 1), (LOST, 7), (KEPT, 2))))
    assert calls == [[(KEPT, 1), (LOST, 7), (KEPT, 2)]]


def test_messages_of_a_lost_partition_are_left_out_and_counted():
    moves, take, calls = moves_and_calls()
    moves.lost = {LOST}
    asyncio.run(take(messages((KEPT, 1), (LOST, 7), (KEPT, 2))))
    asyncio.run(take(messages((LOST, 8))))
    assert calls == [[(KEPT, 1), (KEPT, 2)]]
    assert moves.counts["messages_of_moved_partitions"] == 2


def test_nothing_is_processed_while_a_rebalance_is_under_way():
    moves, take, calls = moves_and_calls()
    moves.paused = True
    asyncio.run(take(messages((KEPT, 1), (KEPT, 2))))
    assert calls == []
    assert moves.counts["messages_released_at_rebalance"] == 2
