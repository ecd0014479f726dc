"""The delay aggregator (processors/delay/aggregate.py) against its reference
(delay_aggregate_reference.py, the aggregator before the flush computed the statistics of all closed
seconds in one vectorised pass) on random input: several nodes (one needing tag escaping) and
sessions, batches spanning sessions and seconds, records out of T1 order, late records that re-open
closed seconds, records older than the retention (dropped), duplicates inside and across batches
(replays), one-way and loopback records, negative, absurd and wrapped-around delays (the statistics'
exact fallback), a far-future T1, synchronized and unsynchronized clocks, seconds of 1 and 2 records,
paths known for some sessions (one with a comma, one that changes after its first emission),
progress seeds (seed_final), flushes at random times (by data time and by the idle wall clock) and
flush_all. Every flush must return the same lines in the same order, and the counters and the
per-session state must be equal."""

from __future__ import annotations

import numpy as np
import pytest

from processors.delay.aggregate import NS_PER_S, DelayAggregator, bucket_floors, bucket_indexes
from segscope_schemas import delay_histogram
from segscope_schemas.stamp_record import STAMP_RECORD_DTYPE, STAMP_RECORD_F_LOOPBACK, STAMP_RECORD_F_ONE_WAY
from tests.processors.delay_aggregate_reference import DelayAggregator as ReferenceAggregator

BASE_S = 1_700_000_000
NODES = ("A", "B", "node x,y=z")  # the last one needs tag escaping
SSIDS = (1, 2, 3, 65535)
SYNCED_EE = 0x8000 | (0x01 << 8) | 0x20  # S bit set, scale 1, multiplier 32
UNSYNCED_EE = 0x0120
ZERO_ERROR_EE = 0x8000  # S bit set, scale 0, multiplier 0


class Paths:
    """path_of for both aggregators: known for some sessions, unknown for others, and one that
    changes (a re-emitted second keeps the path of its first emission)."""

    def __init__(self):
        self.epoch = 0

    def __call__(self, node: str, ssid: int) -> str | None:
        if ssid == 2:
            return None
        if ssid == 3:
            return f"fc00::{self.epoch}"
        return f"fc00:{node}::e,fc00::{ssid}"  # a comma: escaped


def random_records(rng: np.random.Generator, n: int, data_s: int) -> np.ndarray:
    """n records of random sessions around data second data_s (some late, some far behind)."""
    r = np.zeros(n, dtype=STAMP_RECORD_DTYPE)
    r["ssid"] = rng.choice(SSIDS, n, p=[0.4, 0.25, 0.25, 0.1])
    back_s = rng.choice([0, 0, 0, 0, 1, 2, 4, 9], n)  # mostly now; some re-open seconds, some are too old
    t1 = (data_s - back_s) * NS_PER_S + rng.integers(0, NS_PER_S, n)
    fwd = rng.integers(100_000, 3_000_000, n)
    rev = rng.integers(100_000, 2_000_000, n)
    odd = rng.random(n)
    fwd = np.where(odd < 0.05, -rng.integers(1, 50_000, n), fwd)  # T2 < T1: negative
    rev = np.where((odd > 0.05) & (odd < 0.08), 20 * NS_PER_S, rev)  # absurd (> 10 s)
    fwd = np.where((odd > 0.08) & (odd < 0.10), rng.integers(2**60, 2**62, n), fwd)  # huge: exact fallback
    hold = rng.integers(1_000, 100_000, n)
    r["t1_ns"] = t1
    r["t2_ns"] = t1 + fwd
    r["t3_ns"] = r["t2_ns"].astype(np.int64) + hold
    r["t4_ns"] = r["t3_ns"].astype(np.int64) + rev
    wild = rng.random(n) < 0.01
    r["t4_ns"][wild] = np.uint64(2**64 - 5)  # wraps around in int64: negative round trip and reverse
    r["sender_seq"] = (t1 // 10_000_000) % 2**32  # 100 per second, a function of T1: replays are duplicates
    r["sender_seq"][rng.random(n) < 0.03] = 2**32 - 1
    r["flags"] = rng.choice([0, STAMP_RECORD_F_ONE_WAY, STAMP_RECORD_F_LOOPBACK], n, p=[0.85, 0.1, 0.05])
    r["sender_err_est"] = np.where(rng.random(n) < 0.9, SYNCED_EE, UNSYNCED_EE)
    r["reflector_err_est"] = np.where(rng.random(n) < 0.95, SYNCED_EE + rng.integers(0, 200, n), UNSYNCED_EE)
    zero = r["ssid"] == 65535  # synchronized with an error bound of 0 ns: error_estimate_max_us=0.0
    r["sender_err_est"][zero] = ZERO_ERROR_EE
    r["reflector_err_est"][zero] = np.where(rng.random(n) < 0.9, ZERO_ERROR_EE, UNSYNCED_EE)[zero]
    return r


def assert_same_state(new: DelayAggregator, ref: ReferenceAggregator) -> None:
    assert new.counters.as_dict() == ref.counters.as_dict()
    assert list(new.sessions) == list(ref.sessions)
    for key, st in new.sessions.items():
        rs = ref.sessions[key]
        assert (st.watermark_ns, st.horizon_s, st.final_below_s, st.last_ingest_tai_ns) == (
            rs.watermark_ns,
            rs.horizon_s,
            rs.final_below_s,
            rs.last_ingest_tai_ns,
        )
        assert sorted(st.seconds) == sorted(rs.seconds)
        for s, acc in st.seconds.items():
            racc = rs.seconds[s]
            assert (acc.emitted, acc.dirty, acc.path, acc.newest_t1_ns) == (
                racc.emitted,
                racc.dirty,
                racc.path,
                racc.newest_t1_ns,
            )
            if not acc.dirty:  # merged: the same records in the same order
                assert np.array_equal(acc.seq, racc.seq) and np.array_equal(acc.delays, racc.delays)


@pytest.mark.parametrize("seed", [1, 2])
def test_new_aggregator_emits_what_the_reference_emits(seed):
    rng = np.random.default_rng(seed)
    paths = Paths()
    settings = dict(grace_s=0.5, retention_s=5.0, idle_s=2.0, tai_utc_offset_s=37, path_of=paths)
    new, ref = DelayAggregator(**settings), ReferenceAggregator(**settings)
    now = BASE_S * NS_PER_S
    data_s = BASE_S - 3
    kept: list[tuple[str, np.ndarray]] = []
    lines_out = 0
    for _step in range(160):
        if kept and rng.random() < 0.1:
            node, records = kept[rng.integers(len(kept))]  # a replayed batch: duplicates
        else:
            size = int(rng.choice([1, 2, 3, 10, 40, 120, 300]))
            node = str(rng.choice(NODES, p=[0.45, 0.4, 0.15]))
            records = random_records(rng, size, data_s)
            if size > 1 and rng.random() < 0.3:  # duplicates inside one batch
                records = np.concatenate([records, records[rng.integers(0, size, 3)]])
            if rng.random() < 0.02:
                records["t1_ns"][0] = (BASE_S + 10_000) * NS_PER_S  # far future: kept, not the watermark
            kept.append((node, records))
        new.ingest(node, records, now_tai_ns=now)
        ref.ingest(node, records, now_tai_ns=now)
        if rng.random() < 0.03:
            node, ssid, below = str(rng.choice(NODES)), int(rng.choice(SSIDS)), data_s - int(rng.integers(0, 3))
            new.seed_final(node, ssid, below)
            ref.seed_final(node, ssid, below)
        if rng.random() < 0.05:
            paths.epoch += 1
        now += int(rng.integers(0, NS_PER_S // 3))
        if rng.random() < 0.25:
            data_s += 1
        if rng.random() < 0.35:
            flush_at = now + (int(rng.integers(2, 8)) * NS_PER_S if rng.random() < 0.1 else 0)  # idle close
            got, want = new.flush(flush_at), ref.flush(flush_at)
            assert got == want
            lines_out += len(got)
        if rng.random() < 0.02:
            got, want = new.flush_all(), ref.flush_all()
            assert got == want
            lines_out += len(got)
        assert_same_state(new, ref)
    got, want = new.flush_all(), ref.flush_all()
    assert got == want
    lines_out += len(got)
    now += 20_000 * NS_PER_S  # past the far-future second: every session idle, every second evicted
    assert new.flush(now) == ref.flush(now)
    assert_same_state(new, ref)
    assert new.open_seconds() == 0
    c = new.counters
    # the input reached every path the test is about
    assert lines_out > 300
    assert c.seconds_reemitted > 0 and c.duplicate_records > 0 and c.late_records_dropped > 0
    assert c.negative_delays > 0 and c.absurd_delays > 0 and c.future_records >= 0 and c.path_unknown > 0


def test_busy_sessions_at_100_records_per_second():
    """The bench's shape: many sessions at 100 records per second in 100-ms batches, closed by data
    time; plus seconds of exactly one and two records (no IPDV; the percentile of one value) and a
    session whose forward delays all fall in one histogram bucket."""
    rng = np.random.default_rng(5)
    new, ref = DelayAggregator(grace_s=0.5), ReferenceAggregator(grace_s=0.5)
    now = BASE_S * NS_PER_S
    for tick in range(40):
        for ssid in range(1, 51):
            n = 10 if ssid > 2 else (1 if tick % 10 == 0 else 0) + (ssid == 2 and tick % 10 == 1)
            if n == 0:
                continue
            r = np.zeros(n, dtype=STAMP_RECORD_DTYPE)
            r["ssid"] = ssid
            r["sender_seq"] = tick * 10 + np.arange(n)
            t1 = BASE_S * NS_PER_S + (tick * 10 + np.arange(n)) * 10_000_000 + rng.integers(0, 5_000_000, n)
            r["t1_ns"] = t1
            # session 3: a steady forward delay, 100 delays in one histogram bucket (>= 64: formatted, not looked up)
            r["t2_ns"] = t1 + (
                rng.integers(2_000_000, 2_001_000, n) if ssid == 3 else rng.integers(1_000_000, 3_000_000, n)
            )
            r["t3_ns"] = r["t2_ns"] + 10_000
            r["t4_ns"] = r["t3_ns"] + rng.integers(500_000, 1_500_000, n)
            r["sender_err_est"] = r["reflector_err_est"] = SYNCED_EE
            new.ingest("R1", r, now_tai_ns=now)
            ref.ingest("R1", r, now_tai_ns=now)
        now += NS_PER_S // 10
        got, want = new.flush(now), ref.flush(now)
        assert got == want
    got, want = new.flush_all(), ref.flush_all()
    assert got == want and len(got) > 0
    assert_same_state(new, ref)


def test_bucket_table_is_the_histogram_scheme():
    """The flush's table lookup of histogram buckets (bucket_floors: the smallest integer delay of
    each bucket, bisected on delay_histogram.bucket_indexes) gives bucket_indexes' answer for every
    integer up to 2^20, around every bucket floor, and for random delays of every magnitude."""
    floors = bucket_floors()
    assert len(floors) == delay_histogram.MAX_INDEX + 2 and np.all(np.diff(floors) >= 0)
    rng = np.random.default_rng(11)
    delays = np.concatenate(
        [
            np.arange(-100, 2**20),
            (floors[:, None] + np.arange(-2, 3)).ravel(),
            rng.integers(-(2**63), 2**63 - 1, 200_000),
            rng.integers(0, 2**36, 200_000),
            [np.iinfo(np.int64).min, np.iinfo(np.int64).max],
        ]
    )
    assert np.array_equal(bucket_indexes(delays), delay_histogram.bucket_indexes(delays))
    for value, name in delay_histogram.VECTORS:
        assert delay_histogram.field_names()[int(bucket_indexes(np.array([value]))[0]) + 1] == name
