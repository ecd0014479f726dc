"""Keying by flow: which partition of the by-flow topic a flow's block records go to.

A flow's tx records come from its ingress node and its rx records from its egress node; the
collectors key their messages by node (`<node>/<flow_id>`, or `<node>` with --group-flows), so
the two sides can land in different partitions of segscope.altmark.blocks and thus at different
workers. The loss processor's repartition stage (processors/loss/app.py, agent split_batches)
re-sends every record to partition flow_partition(flow_id) of the by-flow topic; there both sides
of every block of a flow meet, whichever node sent them, and one worker owns the flow.

The partition is chosen here, not by a client library's key hash, so that every worker (and any
other producer) computes the same one: a multiplicative hash of flow_id modulo the partition
count (controller flow ids are often sequential; the hash keeps any stride spread out). All
methods and periods of one flow id share a partition.
"""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B1)  # Knuth's multiplicative hash constant (2^32 / phi)


def flow_partition(flow_ids: np.ndarray, partitions: int) -> np.ndarray:
    """Partition of each flow id (array in, array of int64 out)."""
    mixed = (np.asarray(flow_ids).astype(np.uint64) * _GOLDEN) & np.uint64(0xFFFFFFFF)
    return ((mixed >> np.uint64(8)) % np.uint64(partitions)).astype(np.int64)


def split_by_partition(records: np.ndarray, partitions: int) -> list[tuple[int, np.ndarray]]:
    """[(partition, its records in their original order)] for the partitions that get any."""
    if len(records) == 0:
        return []
    part = flow_partition(records["flow_id"], partitions)
    if partitions == 1 or part.min() == part.max():
        return [(int(part[0]), records)]
    order = np.argsort(part, kind="stable")
    part_sorted = part[order]
    cuts = np.flatnonzero(np.diff(part_sorted)) + 1
    return [
        (int(part_sorted[a]), records[order[a:b]])
        for a, b in zip(np.concatenate(([0], cuts)), np.concatenate((cuts, [len(records)])))
    ]


def by_flow_key(node: str, partition: int) -> bytes:
    """Key of a re-keyed message: the sending node and the partition (the partition is chosen
    explicitly; the key only tells a reader where the records came from)."""
    return f"{node}/p{partition}".encode()
