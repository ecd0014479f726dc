"""InOrderAcks: input messages held unacked until their results are final, acked per partition in
offset order, a batch at a time."""

from __future__ import annotations

from typing import Callable


def ack_offsets(consumer, tp, offsets) -> int:
    """Mark `offsets` of tp acked in Faust's consumer bookkeeping (what Consumer.ack does for one
    message, for a batch: no Message objects, no lock, no sensor call per message); offsets below
    the committed one are committed already and left out. Returns how many were new."""
    committed = consumer._committed_offset[tp]
    index = consumer._acked_index[tp]
    acked = consumer._acked[tp]
    new = 0
    for offset in offsets:
        if (committed is None or offset >= committed) and offset not in index:
            index.add(offset)
            acked.append(offset)
            new += 1
    return new


class InOrderAcks:
    """Input messages held unacked until their results are final, acked per partition in offset
    order only: a message is acked when it and every earlier held message of its partition are
    finished. Messages are held a batch at a time: the offsets of one partition that one call of
    the processor's batch handler took, with one state (what must be final before they are).

    Why in order: Faust's commit (Consumer._new_offset, faust-streaming 0.11) takes the acked offsets
    of a partition and, when nothing was committed yet or the first unacked offset is the one right
    after the committed one, commits past that unacked message. A worker killed after such a commit
    would never see it again. With in-order acks the acked offsets never have a gap at the head.
    ExactCommits now replaces that commit rule (a message Faust never handed over leaves a gap
    in-order acks cannot prevent); in-order acks are still what lets it commit promptly."""

    def __init__(self, consumer_of: Callable[[], object] | None = None) -> None:
        """consumer_of(): the Faust consumer whose bookkeeping the acks go to (lambda: app.consumer)."""
        self.consumer_of = consumer_of
        self.held: list[tuple[object, list[int], object]] = []  # (tp, offsets, state), arrival order
        self.messages = 0  # offsets held, all partitions

    def __len__(self) -> int:
        return self.messages

    def hold(self, tp, offsets: list[int], state) -> None:
        """Hold these offsets of tp (in offset order, after every earlier held one of tp) until
        `finished(state)` says their results are final."""
        if offsets:
            self.held.append((tp, offsets, state))
            self.messages += len(offsets)

    def drop(self, partitions) -> int:
        """Drop the held messages of partitions this worker no longer owns (a rebalance moved them):
        they were never committed, so their new owner replays them. Returns how many."""
        keep = [h for h in self.held if h[0] not in partitions]
        dropped = self.messages - sum(len(h[1]) for h in keep)
        self.held = keep
        self.messages -= dropped
        return dropped

    async def ack_finished(self, finished: Callable[[object], bool]) -> int:
        """Ack, in order, the held batches whose state is finished, up to the first of each
        partition that is not; returns how many messages were acked."""
        consumer = self.consumer_of() if self.held else None
        blocked: set = set()
        keep = []
        acked = 0
        for tp, offsets, state in self.held:
            if tp not in blocked and finished(state):
                ack_offsets(consumer, tp, offsets)
                acked += len(offsets)
            else:
                blocked.add(tp)
                keep.append((tp, offsets, state))
        self.held = keep
        self.messages -= acked
        return acked
