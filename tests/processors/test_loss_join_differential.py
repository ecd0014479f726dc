"""The loss joiner (processors/loss/join.py) against its reference (loss_join_reference.py, the
joiner before the int-keyed block index and the column-wise line formatting) on random input:
batches of every size with duplicates inside and across batches, replays, conflicting sides and
nodes, agent restarts, partial and invalid records, rx > tx, zero traffic, double marking (equal
and mismatched counts, clocks both ways), two periods and both methods, escaped node names,
paths known for some flows, flushes at random times (timeouts, re-emissions, evictions, late
records), progress seeds (final_upto), partitions handed over (forget_flows) and paths kept
per flow series (flow_path_version), blocks out of their slot (more open blocks of a series than
slots). Every flush must return the same lines in the same order,
and the counters and the per-flow state must be equal."""

from __future__ import annotations

import numpy as np
import pytest

from processors.loss.join import NS_PER_S, LossJoiner, complete_fields, loss_fields
from segscope_schemas import altmark_block as ab
from tests.processors.loss_join_reference import LossJoiner as ReferenceJoiner

B0 = 1_795_305_600  # a block index at period 1000 ms
NODES = ("A", "B", "C", "node x,y=z")  # the last one needs tag escaping
FLOWS = (7, 8, 9, 0xFFFFF, 2**32 - 1)


def flow_path(flow_id: int, tx_node: str | None) -> str | None:
    if flow_id % 2:
        return None
    return f"fc00::{flow_id % 7},fc00:{tx_node or 'any'}::1"


def random_records(rng: np.random.Generator, n: int, node: str, first_block: int) -> np.ndarray:
    r = np.zeros(n, dtype=ab.ALTMARK_BLOCK_DTYPE)
    period = rng.choice([1000, 500], n, p=[0.85, 0.15])
    index = first_block + rng.integers(0, 6, n)
    r["period_ms"] = period
    r["block_index"] = index
    r["block_start_ns"] = index.astype(np.uint64) * period.astype(np.uint64) * np.uint64(1_000_000)
    r["colour"] = index & 1
    r["flow_id"] = rng.choice(FLOWS, n)
    r["method"] = rng.choice([ab.METHOD_DSCP, ab.METHOD_RFC9343], n, p=[0.8, 0.2])
    # mostly A sends tx and B rx; the other nodes either (conflicting nodes)
    r["direction"] = {"A": ab.DIR_TX, "B": ab.DIR_RX}.get(node, 0) or rng.choice([ab.DIR_TX, ab.DIR_RX], n)
    # counts a function of the block mostly (both sides and re-sends agree), sometimes not (conflicts)
    key = r["flow_id"].astype(np.int64) % 1000 * 7 + index.astype(np.int64) * 13
    tx = np.where(key % 11 == 0, 0, key % 5000 + 100) + np.where(rng.random(n) < 0.03, 1, 0)
    tx[key % 13 == 0] += 2**40
    rx = tx - (key % 4) + np.where(key % 17 == 0, 5, 0)  # rx > tx now and then
    r["packets"] = np.where(r["direction"] == ab.DIR_TX, tx, rx.clip(min=0))
    r["bytes"] = r["packets"] * 100 + np.where(rng.random(n) < 0.02, 7, 0)
    r["boot_id"] = np.where(rng.random(n) < 0.02, 2, 1)
    r["flags"] = np.where(rng.random(n) < 0.02, ab.F_PARTIAL, 0)
    r["dmark_packets"] = np.where(key % 3 == 0, 0, key % 3 + 2) + np.where(rng.random(n) < 0.03, 1, 0)
    skew = rng.choice(np.array([0, 5_000_000, 2**64 - 7_000], dtype=np.uint64), n)  # the clocks disagree both ways
    r["dmark_ts_sum_ns"] = r["block_start_ns"] * r["dmark_packets"].astype(np.uint64) + skew
    bad = rng.random(n) < 0.03
    r["colour"][bad] ^= 1  # invalid: colour_mismatch
    return r


def assert_same_state(new: LossJoiner, ref: ReferenceJoiner) -> None:
    assert new.counters.as_dict() == ref.counters.as_dict()
    assert new.flow_nodes == ref.flow_nodes
    assert new.evicted_upto == ref.evicted_upto
    assert new.boots == ref.boots
    assert new.open_blocks() == ref.open_blocks()


@pytest.mark.parametrize("seed", range(12))
def test_joiner_equals_reference_on_random_input(seed):
    rng = np.random.default_rng(seed)
    timeout_s, retention_s = (2.0, 6.0) if seed % 2 else (1.0, 1.0)
    new = LossJoiner(timeout_s=timeout_s, retention_s=retention_s, tai_utc_offset_s=37)
    ref = ReferenceJoiner(timeout_s=timeout_s, retention_s=retention_s, tai_utc_offset_s=37)
    new.flow_path = ref.flow_path = flow_path
    step = 0
    if seed % 2 == 0:  # paths kept per flow series while the (here changing) version stays
        new.flow_path_version = lambda: step // 7
    if seed % 4 == 1:  # block keys made by Python (beyond 2^19 flow series) from the 3rd series on
        new._series_in_numpy = 2
    if seed % 4 >= 2:  # 2 slots per flow series: most open blocks are out of their slot (_displaced)
        new._ring, new._slot_rows = 2, np.full((0, 2), -1, dtype=np.int32)
    if seed % 3 == 0:  # a restart: the progress topic says these blocks were final before it
        for flow in FLOWS[:2]:
            new.final_upto[(flow, ab.METHOD_DSCP, 1000)] = ref.final_upto[(flow, ab.METHOD_DSCP, 1000)] = B0 + 2
    now = 1_000 * NS_PER_S
    kept: list[tuple[str, np.ndarray]] = []  # batches to replay later
    lines_out = 0
    for step in range(100):
        if kept and rng.random() < 0.15:
            node, records = kept[rng.integers(len(kept))]  # a replayed batch
        else:
            size = int(rng.choice([1, 2, 5, 31, 32, 33, 80, 200]))
            node = str(rng.choice(NODES, p=[0.45, 0.45, 0.05, 0.05]))
            records = random_records(rng, size, node, B0 + step // 8)
            if size > 1 and rng.random() < 0.3:  # the same side twice in one batch
                records = np.concatenate([records, records[rng.integers(0, size, 3)]])
            kept.append((node, records))
        assert new.ingest(node, records, now) == ref.ingest(node, records, now)
        now += int(rng.integers(0, NS_PER_S // 4))
        if rng.random() < 0.3:
            got, want = new.flush(now), ref.flush(now)
            assert got == want
            lines_out += len(got)
        if rng.random() < 0.03:
            drop = int(rng.choice(FLOWS))
            assert new.forget_flows(lambda ids, drop=drop: ids == drop) == ref.forget_flows(
                lambda ids, drop=drop: ids == drop
            )
        assert_same_state(new, ref)
    now += int(retention_s * NS_PER_S) + 1
    assert new.flush(now) == ref.flush(now)
    assert_same_state(new, ref)
    assert new.open_blocks() == 0 and lines_out > 50


def test_complete_fields_is_loss_fields_for_complete_blocks():
    """The column-wise formatter of complete blocks without double marking writes what
    loss_fields writes (the one definition of the field set)."""
    rng = np.random.default_rng(1)
    # the edge counts as uint64 from the start: a Python list holding 2**64 - 1 becomes float64 in
    # np.concatenate, and its cast back rounds to 2**64 (invalid: the edge was never tested)
    edges = np.array([0, 1, 3, 2**63, 2**64 - 1], dtype=np.uint64)
    tx = np.concatenate([edges, rng.integers(0, 2**62, 300, dtype=np.uint64)])
    assert tx[4] == 2**64 - 1
    rx = (tx - np.minimum(tx, rng.integers(0, 1000, len(tx)).astype(np.uint64))).astype(np.uint64)
    tb = rng.integers(0, 2**63, len(tx), dtype=np.uint64)
    rb = rng.integers(0, 2**63, len(tx), dtype=np.uint64)
    # counts below 2^16 (written from a table), bytes up to 2^63 - 1 (as int64) and beyond
    small = np.concatenate([[0, 1, 9, 10, 65535], rng.integers(0, 65536, 300)]).astype(np.uint64)
    small_rx = small - np.minimum(small, rng.integers(0, 50, len(small)).astype(np.uint64))
    wide = np.concatenate([np.array([2**63 - 1, 65536], np.uint64), rng.integers(0, 2**63, 303, dtype=np.uint64)])
    got = complete_fields(small, small_rx, wide, wide[::-1].copy())
    columns = (c.tolist() for c in (small, small_rx, wide, wide[::-1]))
    want = [loss_fields(a, b, c, d, None, None) for a, b, c, d in zip(*columns)]
    assert got == want and "tx_packets=65535i," in "".join(got) and f"{2**63 - 1}i" in got[0]
    got = complete_fields(tx, rx, tb, rb)
    want = [
        loss_fields(a, b, c, d, None, None) for a, b, c, d in zip(tx.tolist(), rx.tolist(), tb.tolist(), rb.tolist())
    ]
    assert got == want
    ends = [1795306905000000000 + i * 10**9 for i in range(len(tx))]
    got = complete_fields(tx, rx, tb, rb, ends)
    want = [
        loss_fields(a, b, c, d, None, None, e)
        for a, b, c, d, e in zip(tx.tolist(), rx.tolist(), tb.tolist(), rb.tolist(), ends)
    ]
    assert got == want


@pytest.mark.parametrize("ring", [2, 64])
def test_many_new_blocks_of_one_series_in_one_batch(ring):
    """150 consecutive blocks of each of two flows in one batch per side: with 2 slots per series
    most blocks of the batch share a slot with another new one, with 64 the later ones displace
    the earlier (all stay open: retention 300 s); late duplicates of the oldest find them."""
    new = LossJoiner(timeout_s=10.0, retention_s=300.0)
    ref = ReferenceJoiner(timeout_s=10.0, retention_s=300.0)
    assert new._ring == 512  # 300 blocks of 1 s open per series, and a margin
    new._ring, new._slot_rows = ring, np.full((0, ring), -1, dtype=np.int32)
    now = 1_000 * NS_PER_S

    def side(node: str, direction: int, packets: int) -> np.ndarray:
        r = np.zeros(300, dtype=ab.ALTMARK_BLOCK_DTYPE)
        index = B0 + np.tile(np.arange(150), 2)
        r["flow_id"], r["period_ms"], r["method"], r["direction"] = np.repeat([7, 8], 150), 1000, 1, direction
        r["block_index"], r["block_start_ns"] = index, index.astype(np.uint64) * np.uint64(10**9)
        r["colour"], r["packets"], r["bytes"], r["boot_id"] = index & 1, packets, packets * 100, 1
        return r

    for node, records in (("A", side("A", ab.DIR_TX, 1000)), ("B", side("B", ab.DIR_RX, 990))):
        assert new.ingest(node, records, now) == ref.ingest(node, records, now)
    got = new.flush(now)
    assert got == ref.flush(now) and len(got) == 300 and all("complete=true" in line for line in got)
    # late copies of the oldest blocks are duplicates of open blocks, not new ones
    again = side("A", ab.DIR_TX, 1000)[:20]
    assert new.ingest("A", again, now) == ref.ingest("A", again, now)
    assert new.counters.duplicate_records == 20 and new.open_blocks() == 300
    assert_same_state(new, ref)
    now += 301 * NS_PER_S
    assert new.flush(now) == ref.flush(now) == []
    assert new.open_blocks() == 0 and not new._displaced
