"""The loss joiner's per-record check (small batches) agrees with the vectorised
segscope_schemas.altmark_block.check_records on every record, including edge values."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from processors.loss.join import ALTMARK_BLOCK_DTYPE, SMALL_BATCH, LossJoiner, record_problem
from segscope_schemas import altmark_block as ab

U64 = (1 << 64) - 1


def edgy(bits: int, extra=()) -> st.SearchStrategy[int]:
    top = (1 << bits) - 1
    return st.one_of(st.sampled_from([0, 1, 2, 3, top, top - 1, *extra]), st.integers(0, top))


record = st.fixed_dictionaries(
    {
        "block_index": edgy(64, [ab.block_index(1_795_305_600 * 10**9, 1000)]),
        "period_ms": edgy(32, [1000, 400, 1]),
        "direction": edgy(8),
        "colour": edgy(8),
        "method": edgy(8),
        "flow_id": edgy(32, [ab.FLOWMONID_MAX, ab.FLOWMONID_MAX + 1]),
        "flags": edgy(16),
        "start_mode": st.sampled_from(["exact", "off_by_one", "random"]),
        "start": edgy(64),
    }
)


def to_array(d: dict) -> np.ndarray:
    r = np.zeros(1, dtype=ALTMARK_BLOCK_DTYPE)
    for k in ("block_index", "period_ms", "direction", "colour", "method", "flow_id", "flags"):
        r[k] = d[k]
    exact = d["block_index"] * d["period_ms"] * 1_000_000
    start = {"exact": exact, "off_by_one": exact + 1, "random": d["start"]}[d["start_mode"]]
    r["block_start_ns"] = start & U64
    return r


@settings(max_examples=300, deadline=None)
@given(record)
def test_record_problem_matches_check_records(d):
    arr = to_array(d)
    row = dict(zip(ALTMARK_BLOCK_DTYPE.names, arr.tolist()[0]))
    assert record_problem(row) == ab.check_records(arr).tolist()[0]


def test_small_and_large_batches_drop_the_same_records():
    rng = np.random.default_rng(5)
    recs = np.zeros(SMALL_BATCH + 10, dtype=ALTMARK_BLOCK_DTYPE)
    recs["block_index"] = 1000 + np.arange(len(recs))
    recs["period_ms"] = 1000
    recs["block_start_ns"] = recs["block_index"] * 1_000_000_000
    recs["colour"] = recs["block_index"] & 1
    recs["direction"], recs["method"], recs["flow_id"] = 1, 1, 7
    bad = rng.choice(len(recs), 12, replace=False)
    recs["colour"][bad[:6]] ^= 1
    recs["flags"][bad[6:]] = 0x8
    big, small = LossJoiner(), LossJoiner()
    assert big.ingest("A", recs, 0) == {"colour_mismatch": 6, "unknown_flags": 6}
    merged: dict[str, int] = {}
    for i in range(0, len(recs), 5):
        for k, v in small.ingest("A", recs[i : i + 5], 0).items():
            merged[k] = merged.get(k, 0) + v
    assert merged == {"colour_mismatch": 6, "unknown_flags": 6}
    assert sorted(big.blocks) == sorted(small.blocks) and len(big.blocks) == len(recs) - 12
