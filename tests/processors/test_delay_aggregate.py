"""Unit tests of the delay aggregator on constructed record arrays with known answers."""

from __future__ import annotations

import re

import numpy as np
import pytest

from processors.delay.aggregate import (
    NS_PER_S,
    Counters,
    DelayAggregator,
    clock_tai_ns,
    counters_line,
    escape_tag,
    format_float,
)
from segscope_schemas import delay_histogram
from segscope_schemas.stamp_record import STAMP_RECORD_DTYPE, decode_batch, encode_batch

BASE_S = 1_700_000_000  # a TAI second in the past (Nov 2023) of any machine running this


def make_records(seq, t1, fwd, rev, hold=1_000, ssid=1) -> np.ndarray:
    """Records with given sender_seq, T1 (ns), forward and reverse delay (ns); T3 = T2 + hold."""
    n = len(seq)
    r = np.zeros(n, dtype=STAMP_RECORD_DTYPE)
    t1 = np.asarray(t1, dtype=np.int64)
    r["sender_seq"] = seq
    r["ssid"] = ssid
    r["t1_ns"] = t1
    r["t2_ns"] = t1 + np.asarray(fwd, dtype=np.int64)
    r["t3_ns"] = r["t2_ns"].astype(np.int64) + hold
    r["t4_ns"] = r["t3_ns"].astype(np.int64) + np.asarray(rev, dtype=np.int64)
    return r


def parse_line(line: str) -> tuple[str, dict[str, str], dict[str, float | int], int]:
    head, fields_s, ts = line.rsplit(" ", 2)
    parts = re.split(r"(?<!\\),", head)  # a tag value may hold an escaped comma (path)
    tags = {k: v.replace("\\,", ",") for k, v in (p.split("=", 1) for p in parts[1:])}
    fields = {}
    for kv in fields_s.split(","):
        k, v = kv.split("=", 1)
        fields[k] = int(v[:-1]) if v.endswith("i") else float(v)
    return parts[0], tags, fields, int(ts)


def by_direction(lines: list[str]) -> dict[tuple[str, str, int], dict]:
    """{(ssid, direction, ts): fields} of the stamp_delay lines; checks that each has exactly one
    stamp_delay_histogram line with the same tags and timestamp whose buckets hold `count` delays,
    all between min_us and max_us (within the scheme's 2.2 %)."""
    out, hist = {}, {}
    for line in lines:
        meas, tags, fields, ts = parse_line(line)
        assert meas in ("stamp_delay", "stamp_delay_histogram")
        key = (tuple(sorted(tags.items())), ts)
        target = out if meas == "stamp_delay" else hist
        assert key not in target, f"two {meas} lines for {key}"
        target[key] = fields
    assert set(hist) == set(out)
    for key, fields in out.items():
        assert sum(hist[key].values()) == fields["count"]
        if fields["min_us"] > 0.001:  # above the `low` bucket (<= 1 ns)
            lowest, highest = delay_histogram.quantile_us(hist[key], 1e-9), delay_histogram.quantile_us(hist[key], 1)
            assert fields["min_us"] / 1.023 <= lowest <= highest <= fields["max_us"] * 1.023
    return {(dict(k)["ssid"], dict(k)["direction"], ts): f for (k, ts), f in out.items()}


def delay_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("stamp_delay,")]


def far_future(agg: DelayAggregator) -> int:
    """A wall clock a day from now: every session is idle and all its seconds close."""
    return clock_tai_ns() + 86_400 * NS_PER_S


def test_exact_stats_of_one_second():
    rng = np.random.default_rng(7)
    n = 500
    seq = np.arange(100, 100 + n)
    t1 = BASE_S * NS_PER_S + np.sort(rng.integers(0, NS_PER_S, n))
    fwd = rng.integers(1_000_000, 5_000_000, n)  # 1..5 ms
    rev = rng.integers(500_000, 900_000, n)
    hold = 7_000
    agg = DelayAggregator()
    agg.ingest("A", make_records(seq, t1, fwd, rev, hold=hold))
    lines = agg.flush(far_future(agg))
    assert len(lines) == 6  # stamp_delay + stamp_delay_histogram per direction
    got = by_direction(lines)
    ts = BASE_S * NS_PER_S
    rt = fwd + rev  # (T4-T1)-(T3-T2) = fwd + rev
    for direction, vals in (("forward", fwd), ("reverse", rev), ("round_trip", rt)):
        f = got[("1", direction, ts)]
        assert f["count"] == n
        assert f["sum_us"] == sum(vals.tolist()) / 1000  # exact
        assert f["min_us"] == min(vals.tolist()) / 1000
        assert f["max_us"] == max(vals.tolist()) / 1000
        assert f["mean_us"] == pytest.approx(sum(vals.tolist()) / n / 1000, rel=1e-12)
        p50, p99 = np.percentile(vals, [50, 99])
        assert f["p50_us"] == pytest.approx(p50 / 1000, rel=1e-12)
        assert f["p99_us"] == pytest.approx(p99 / 1000, rel=1e-12)
        ipdv = sum(abs(a - b) for a, b in zip(vals.tolist()[1:], vals.tolist()[:-1])) / (n - 1)
        assert f["ipdv_mean_us"] == pytest.approx(ipdv / 1000, rel=1e-12)
        # the histogram point: p50 / p99 of nearest rank read back within the stated 2.2 %
        (hist,) = [
            parse_line(x)[2]
            for x in lines
            if x.startswith(f"stamp_delay_histogram,node=A,ssid=1,path=unknown,direction={direction} ")
        ]
        ordered = sorted(vals.tolist())
        for q in (0.5, 0.99):
            exact_us = ordered[int(np.ceil(q * n)) - 1] / 1000
            assert delay_histogram.quantile_us(hist, q) == pytest.approx(exact_us, rel=0.022)
    assert agg.counters.points_out == 3
    assert agg.counters.records_in == n and agg.counters.batches_in == 1


def test_ipdv_by_hand_uses_sender_seq_order():
    # forward delays by seq 1..4: 10, 14, 11, 11 us -> |4|,|3|,|0| -> mean 7/3 us.
    # Records arrive out of order; IPDV must follow sender_seq, not arrival order.
    t0 = BASE_S * NS_PER_S
    seq = [3, 1, 4, 2]
    fwd = [11_000, 10_000, 11_000, 14_000]
    rev = [5_000, 5_000, 6_000, 5_000]  # by seq: 5,5,5,6 -> |0|,|0|,|1| -> 1/3 us
    recs = make_records(seq, [t0 + s * 1000 for s in seq], fwd, rev)
    agg = DelayAggregator()
    agg.ingest("A", recs)
    got = by_direction(agg.flush(far_future(agg)))
    assert got[("1", "forward", t0)]["ipdv_mean_us"] == pytest.approx(7 / 3)
    assert got[("1", "reverse", t0)]["ipdv_mean_us"] == pytest.approx(1 / 3)
    assert got[("1", "forward", t0)]["p50_us"] == 11.0  # median of 10,11,11,14


def test_single_packet_has_no_ipdv_field():
    t0 = BASE_S * NS_PER_S
    agg = DelayAggregator()
    agg.ingest("A", make_records([1], [t0], [2_500], [1_500]))
    lines = agg.flush(far_future(agg))
    f = by_direction(lines)[("1", "forward", t0)]
    assert f == {
        "count": 1,
        "sum_us": 2.5,
        "min_us": 2.5,
        "mean_us": 2.5,
        "max_us": 2.5,
        "p50_us": 2.5,
        "p99_us": 2.5,
        "unsynchronized": 1,
        "newest_ns": t0,  # the record's T1 (TAI - UTC is 0 here)
    }  # fmt: skip  (Error Estimate 0: S bit clear)


def test_newest_ns_is_the_largest_t1_of_the_second_in_utc_and_follows_late_records():
    t0 = (BASE_S + 37) * NS_PER_S  # TAI
    agg = DelayAggregator(grace_s=0.5, tai_utc_offset_s=37)
    # two batches of second t0, out of order; a record of the next second does not count for it
    agg.ingest("A", make_records([2, 1], [t0 + 700_000_000, t0 + 100_000_000], [1_000] * 2, [1_000] * 2), t0)
    agg.ingest("A", make_records([3, 4], [t0 + 400_000_000, t0 + 1_600_000_000], [1_000] * 2, [1_000] * 2), t0)
    first = by_direction(agg.flush(t0 + 1_600_000_000))  # watermark 1.6 s >= end + grace 1.5 s
    utc = BASE_S * NS_PER_S
    assert {k: f["newest_ns"] for k, f in first.items()} == {
        ("1", d, utc): utc + 700_000_000 for d in ("forward", "reverse", "round_trip")
    }
    # a late record with a later T1 in the same second: the re-emission carries it
    agg.ingest("A", make_records([5], [t0 + 900_000_000], [1_000], [1_000]), t0 + 1_700_000_000)
    again = by_direction(agg.flush(t0 + 1_700_000_000))
    assert again[("1", "forward", utc)]["newest_ns"] == utc + 900_000_000
    assert again[("1", "forward", utc)]["count"] == 4  # seq 1, 2, 3 and the late 5


def test_second_boundaries_and_watermark_grace():
    t0 = BASE_S * NS_PER_S
    # last ns of second 0, first ns of second 1, and one in second 1 end
    t1 = [t0 + NS_PER_S - 1, t0 + NS_PER_S, t0 + 2 * NS_PER_S - 1]
    agg = DelayAggregator(grace_s=2.0)
    now = t0  # wall clock that never forces anything: the session is not idle
    agg.ingest("A", make_records([1, 2, 3], t1, [1000, 2000, 3000], [1000] * 3), now_tai_ns=now)
    assert agg.flush(now) == []  # watermark t0+2s-1 < end of second 0 + 2 s
    # a record at exactly end(second 0) + grace closes second 0 only
    agg.ingest("A", make_records([4], [t0 + 3 * NS_PER_S], [4000], [1000]), now_tai_ns=now)
    got = by_direction(agg.flush(now))
    assert set(got) == {("1", d, t0) for d in ("forward", "reverse", "round_trip")}
    assert got[("1", "forward", t0)]["count"] == 1 and got[("1", "forward", t0)]["max_us"] == 1.0
    # watermark end(second 1) + grace - 1 ns: second 1 stays open
    agg.ingest("A", make_records([5], [t0 + 4 * NS_PER_S - 1], [5000], [1000]), now_tai_ns=now)
    assert agg.flush(now) == []
    agg.ingest("A", make_records([6], [t0 + 4 * NS_PER_S], [6000], [1000]), now_tai_ns=now)
    got = by_direction(agg.flush(now))
    f = got[("1", "forward", t0 + NS_PER_S)]
    assert f["count"] == 2 and f["min_us"] == 2.0 and f["max_us"] == 3.0


def test_idle_session_flushed_by_wall_clock():
    t0 = BASE_S * NS_PER_S
    agg = DelayAggregator(grace_s=2.0)
    agg.ingest("A", make_records([1], [t0], [1000], [1000]), now_tai_ns=t0 + 10_000)
    assert agg.flush(t0 + NS_PER_S) == []  # not idle for 2 s yet
    assert len(delay_lines(agg.flush(t0 + 3 * NS_PER_S))) == 3  # idle and wall clock past end + grace


def test_small_grace_closes_by_data_time_and_idle_closes_by_wall_clock():
    t0 = BASE_S * NS_PER_S
    agg = DelayAggregator(grace_s=0.5, idle_s=2.0)
    # a busy session: second 0 closes as soon as a record with T1 >= end + 0.5 s has arrived
    agg.ingest("A", make_records([1, 2], [t0 + 900_000_000, t0 + 1_499_000_000], [1000] * 2, [1000] * 2), t0)
    assert agg.flush(t0 + 1_600_000_000) == []  # watermark 1.499 s: not yet
    agg.ingest("A", make_records([3], [t0 + 1_500_000_000], [1000], [1000]), t0 + 1_600_000_000)
    assert len(delay_lines(agg.flush(t0 + 1_600_000_000))) == 3
    # then the session falls silent: second 1 waits for 2 s without records (not the 0.5 s grace),
    # so a lagging input does not make the wall clock close seconds whose records are on their way
    assert agg.flush(t0 + 3_500_000_000) == []  # silent for 1.9 s
    assert len(delay_lines(agg.flush(t0 + 3_600_000_000))) == 3
    assert agg.counters.seconds_reemitted == 0


def test_batch_spanning_sessions_and_seconds():
    t0 = BASE_S * NS_PER_S
    a = make_records([1, 2], [t0 + 1, t0 + NS_PER_S + 1], [1000, 2000], [100, 100], ssid=7)
    b = make_records([1, 2], [t0 + 2, t0 + NS_PER_S + 2], [3000, 4000], [100, 100], ssid=8)
    mixed = np.concatenate([a[:1], b, a[1:]])
    agg = DelayAggregator()
    agg.ingest("A", mixed)
    got = by_direction(agg.flush(far_future(agg)))
    assert len(got) == 12
    assert got[("7", "forward", t0)]["max_us"] == 1.0
    assert got[("7", "forward", t0 + NS_PER_S)]["max_us"] == 2.0
    assert got[("8", "forward", t0)]["max_us"] == 3.0
    assert got[("8", "forward", t0 + NS_PER_S)]["max_us"] == 4.0


def test_duplicates_deduped_and_counted():
    t0 = BASE_S * NS_PER_S
    recs = make_records([1, 2, 3], [t0, t0 + 10, t0 + 20], [1000, 2000, 3000], [500] * 3)
    agg = DelayAggregator()
    now = t0
    agg.ingest("A", recs, now_tai_ns=now)
    agg.ingest("A", recs[1:], now_tai_ns=now)  # replay of seq 2, 3
    # the replayed copy carries other timestamps: the first one must win
    replay = make_records([2], [t0 + 10], [9_999_000], [500])
    agg.ingest("A", replay, now_tai_ns=now)
    got = by_direction(agg.flush(far_future(agg)))
    f = got[("1", "forward", t0)]
    assert f["count"] == 3 and f["max_us"] == 3.0 and f["mean_us"] == 2.0
    assert agg.counters.duplicate_records == 3
    assert agg.counters.records_in == 6


def test_late_record_reemits_full_aggregate_and_old_ones_are_dropped():
    t0 = BASE_S * NS_PER_S
    agg = DelayAggregator(grace_s=2.0, retention_s=10.0)
    now = t0 + 60 * NS_PER_S  # wall clock ahead of the data, but never idle: ingest and flush share it
    agg.ingest("A", make_records([1, 2], [t0, t0 + 1], [1000, 3000], [100, 100]), now_tai_ns=now)
    agg.ingest("A", make_records([10], [t0 + 5 * NS_PER_S], [1000], [100]), now_tai_ns=now)
    first = by_direction(agg.flush(now))
    assert first[("1", "forward", t0)]["count"] == 2
    # late record for second 0 (within retention): re-emitted with the same tags + timestamp
    agg.ingest("A", make_records([3], [t0 + 2], [8000], [100]), now_tai_ns=now)
    again = agg.flush(now)
    got = by_direction(again)
    assert set(got) == {("1", d, t0) for d in ("forward", "reverse", "round_trip")}
    f = got[("1", "forward", t0)]
    assert f["count"] == 3 and f["mean_us"] == 4.0 and f["max_us"] == 8.0
    assert agg.counters.seconds_reemitted == 1
    # a duplicate of an already emitted record does not trigger a different aggregate
    agg.ingest("A", make_records([3], [t0 + 2], [8000], [100]), now_tai_ns=now)
    assert by_direction(agg.flush(now))[("1", "forward", t0)]["count"] == 3
    assert agg.counters.duplicate_records == 1
    # move the watermark beyond retention of second 0: its records are now dropped
    agg.ingest("A", make_records([20], [t0 + 12 * NS_PER_S], [1000], [100]), now_tai_ns=now)
    agg.flush(now)
    agg.ingest("A", make_records([4, 5], [t0 + 3, t0 + 4], [1000, 1000], [100, 100]), now_tai_ns=now)
    assert agg.flush(now) == []
    assert agg.counters.late_records_dropped == 2


def test_negative_and_absurd_delays_are_kept_and_counted():
    t0 = BASE_S * NS_PER_S
    # forward -2 us (T2 < T1), reverse 20 s (absurd)
    recs = make_records([1, 2], [t0, t0 + 5], [-2000, 1000], [20 * NS_PER_S, 1000])
    agg = DelayAggregator(absurd_threshold_s=10.0)
    agg.ingest("A", recs)
    got = by_direction(agg.flush(far_future(agg)))
    assert got[("1", "forward", t0)]["min_us"] == -2.0
    assert got[("1", "forward", t0)]["count"] == 2
    assert got[("1", "reverse", t0)]["max_us"] == 20e6
    assert agg.counters.negative_delays == 1  # forward of seq 1; its round trip is 20 s - 2 us > 0
    assert agg.counters.absurd_delays == 2  # reverse and round trip of seq 1


def test_roundtrip_through_encode_decode_batch():
    t0 = BASE_S * NS_PER_S
    recs = make_records(np.arange(4000), t0 + np.arange(4000) * 1000, np.full(4000, 1500), np.full(4000, 700))
    hdr, decoded = decode_batch(encode_batch(recs, node="A", batch_seq=1))
    agg = DelayAggregator()
    agg.ingest(hdr.node, decoded)
    got = by_direction(agg.flush(far_future(agg)))
    assert got[("1", "round_trip", t0)] == {
        "count": 4000,
        "sum_us": 8800.0,
        "min_us": 2.2,
        "mean_us": 2.2,
        "max_us": 2.2,
        "p50_us": 2.2,
        "p99_us": 2.2,
        "ipdv_mean_us": 0.0,
        "unsynchronized": 4000,
        "newest_ns": t0 + 3999 * 1000,
    }


def test_line_protocol_escaping():
    assert escape_tag("A") == "A"
    assert escape_tag("node a,b=c") == r"node\ a\,b\=c"
    assert escape_tag("") == "unknown"
    assert escape_tag("x\ny") == r"x\ y"
    assert escape_tag("ends\\") == "ends\\\\"
    t0 = BASE_S * NS_PER_S
    agg = DelayAggregator()
    agg.ingest("edge router,1", make_records([1], [t0], [1000], [1000]))
    line = agg.flush(far_future(agg))[0]
    assert line.startswith(
        r"stamp_delay,node=edge\ router\,1,ssid=1,path=unknown,direction=forward count=1i,sum_us=1.0,min_us=1.0,"
    )
    assert line.endswith(f" {t0}")
    assert format_float(3.0) == "3.0" and format_float(0.1) == "0.1"


def test_counters_line():
    c = Counters(records_in=5, batches_in=2, malformed_batches=1)
    line = counters_line(c, "delay", 123, extra={"open_seconds": 4})
    assert line.startswith("segscope_processor,processor=delay records_in=5i,batches_in=2i,malformed_batches=1i,")
    assert ",open_seconds=4i 123" in line
    for name in ("duplicate_records", "late_records_dropped", "points_out", "negative_delays"):
        assert f"{name}=0i" in line


def test_far_future_t1_does_not_close_or_evict_the_session():
    # Without the cap the watermark would jump a day ahead: every second would be evicted
    # and all further records of the session dropped as late.
    t0 = BASE_S * NS_PER_S
    now = t0 + NS_PER_S // 2
    agg = DelayAggregator(grace_s=2.0, retention_s=30.0, max_future_s=10.0)
    agg.ingest("A", make_records([1, 2], [t0, t0 + 86_400 * NS_PER_S], [1000, 1000], [100, 100]), now_tai_ns=now)
    assert agg.counters.future_records == 1
    first = by_direction(agg.flush(now))  # watermark capped at now + 10 s: second 0 closes
    assert set(first) == {("1", d, t0) for d in ("forward", "reverse", "round_trip")}
    agg.ingest("A", make_records([3], [t0 + 100], [3000], [100]), now_tai_ns=now)
    again = by_direction(agg.flush(now))
    assert agg.counters.late_records_dropped == 0
    assert again[("1", "forward", t0)]["count"] == 2 and again[("1", "forward", t0)]["max_us"] == 3.0
    assert all(ts == t0 for _, _, ts in again)  # the far-future second stays open


def test_points_are_stamped_in_utc_while_seconds_are_binned_in_tai():
    """TAI - UTC = 37 s: a record sent at TAI second S lands in the point of UTC second S - 37."""
    seq = np.arange(4)
    t1 = (BASE_S * NS_PER_S) + np.array([0, 1, 2, NS_PER_S - 1])  # all in TAI second BASE_S
    recs = make_records(seq, t1, fwd=[1000] * 4, rev=[2000] * 4)
    agg = DelayAggregator(tai_utc_offset_s=37)
    agg.ingest("A", recs, now_tai_ns=BASE_S * NS_PER_S)
    lines = agg.flush(far_future(agg))
    got = by_direction(lines)
    assert {ts for (_, _, ts) in got} == {(BASE_S - 37) * NS_PER_S}
    assert got[("1", "forward", (BASE_S - 37) * NS_PER_S)]["count"] == 4


def test_one_way_and_loopback_records_measure_only_their_directions():
    """One-way records (T1, T2) feed only `forward`; loopback records (T1, T4) only
    `round_trip` = T4 - T1; two-way records of the same second feed all three."""
    from segscope_schemas.stamp_record import STAMP_RECORD_F_LOOPBACK, STAMP_RECORD_F_ONE_WAY

    t1 = BASE_S * NS_PER_S + np.array([10, 20, 30])
    recs = make_records([0, 1, 2], t1, fwd=[1000, 3000, 5000], rev=[700, 700, 700], hold=100)
    recs["flags"][0] = STAMP_RECORD_F_ONE_WAY
    recs["t3_ns"][0] = recs["t4_ns"][0] = 0
    recs["flags"][1] = STAMP_RECORD_F_LOOPBACK
    recs["t2_ns"][1] = recs["t3_ns"][1] = 0
    recs["t4_ns"][1] = t1[1] + 9000
    agg = DelayAggregator()
    agg.ingest("A", recs, now_tai_ns=BASE_S * NS_PER_S)
    got = by_direction(agg.flush(far_future(agg)))
    ts = BASE_S * NS_PER_S
    assert got[("1", "forward", ts)]["count"] == 2  # one-way + two-way
    assert got[("1", "forward", ts)]["min_us"] == 1.0 and got[("1", "forward", ts)]["max_us"] == 5.0
    assert got[("1", "reverse", ts)]["count"] == 1  # two-way only
    assert got[("1", "round_trip", ts)]["count"] == 2  # loopback + two-way
    assert got[("1", "round_trip", ts)]["max_us"] == 9.0  # loopback: T4 - T1
    assert got[("1", "round_trip", ts)]["min_us"] == 5.7  # two-way: 5000 + 700 ns
    assert agg.counters.negative_delays == 0


def test_a_second_of_one_way_records_has_no_reverse_point():
    from segscope_schemas.stamp_record import STAMP_RECORD_F_ONE_WAY

    t1 = BASE_S * NS_PER_S + np.array([1, 2])
    recs = make_records([0, 1], t1, fwd=[1000, 2000], rev=[0, 0])
    recs["flags"] = STAMP_RECORD_F_ONE_WAY
    agg = DelayAggregator()
    agg.ingest("A", recs, now_tai_ns=BASE_S * NS_PER_S)
    lines = agg.flush(far_future(agg))
    assert [parse_line(l)[1]["direction"] for l in delay_lines(lines)] == ["forward"]
    assert agg.counters.points_out == 1


def test_seed_final_skips_replayed_records_of_finished_seconds():
    """After a restart, a replayed message may hold the tail of a second the previous worker already
    published complete: its records are skipped and counted, never emitted as a partial second."""
    agg = DelayAggregator(grace_s=1.0, retention_s=5.0)
    agg.seed_final("A", 3, 1_700_000_006)
    r = np.zeros(4, dtype=STAMP_RECORD_DTYPE)
    r["ssid"] = 3
    r["sender_seq"] = [0, 1, 2, 3]
    r["t1_ns"] = [
        1_700_000_005_900_000_000,
        1_700_000_005_950_000_000,
        1_700_000_006_000_000_000,
        1_700_000_006_5 * 10**8,
    ]
    r["t2_ns"] = r["t1_ns"] + 1000
    r["t3_ns"] = r["t2_ns"]
    r["t4_ns"] = r["t3_ns"] + 1000
    agg.ingest("A", r, now_tai_ns=1_700_000_007 * 10**9)
    assert agg.counters.replayed_records_skipped == 2
    lines = agg.flush_all()
    assert [
        int(line.split("count=")[1].split("i")[0]) for line in delay_lines(lines) if "direction=forward" in line
    ] == [2]


def test_clock_fields_bound_the_one_way_error_and_count_unsynchronized_records():
    """error_estimate_max_us = the largest sender + reflector Error Estimate among synchronized
    records (RFC 8762 §4.2.1, exact as ee_to_error_ns); records with an S bit clear are counted in
    `unsynchronized` instead, on every direction's line of the second."""
    from segscope_schemas.stamp_error_estimate import TsFormat, ee_encode, ee_to_error_ns, ee_unpack

    t0 = BASE_S * NS_PER_S
    recs = make_records(np.arange(4), t0 + np.arange(4) * 1000, np.full(4, 1500), np.full(4, 700))
    sender = [ee_encode(True, TsFormat.PTP, e) for e in (1_000, 250_000, 1_000, 1_000)]
    reflector = [ee_encode(True, TsFormat.PTP, e) for e in (2_000, 30_000, 5_000, 7_000)]
    reflector[3] = ee_encode(False, TsFormat.PTP, 7_000)  # this reflector lost its sync
    recs["sender_err_est"], recs["reflector_err_est"] = sender, reflector
    agg = DelayAggregator()
    agg.ingest("A", recs)
    got = by_direction(agg.flush(far_future(agg)))

    def ns(ee):
        f = ee_unpack(ee)
        return ee_to_error_ns(f.scale, f.multiplier)

    want = max(ns(s) + ns(r) for s, r in zip(sender[:3], reflector[:3])) / 1000
    for direction in ("forward", "reverse", "round_trip"):
        line = got[("1", direction, t0)]
        assert line["unsynchronized"] == 1
        assert line["error_estimate_max_us"] == pytest.approx(want, abs=0.001)
    assert want > 250  # the second record's 250 us sender estimate dominates


def test_clock_error_matches_the_scalar_decoder_over_the_field():
    from processors.delay.aggregate import clock_error_ns
    from segscope_schemas.stamp_error_estimate import ee_to_error_ns

    rng = np.random.default_rng(7)
    ee = rng.integers(0, 1 << 16, 5000).astype(np.uint16) | 0x8000  # synchronized, every scale
    ee[ee & 0xFF == 0] |= 1  # Multiplier 0 is malformed
    zero = np.full(len(ee), 0x8001, dtype=np.uint16)  # the other side: 1 * 2^-32 s -> 1 ns
    got = clock_error_ns(ee, zero)
    for e, g in zip(ee.tolist(), got.tolist()):
        scale, mult = (e >> 8) & 0x3F, e & 0xFF
        want = min(ee_to_error_ns(scale, mult), 86_400 * 10**9) + 1
        assert g == want, (hex(e), g, want)


def test_records_held_past_the_retention_of_an_idle_session_make_whole_seconds():
    """An agent cut off from Kafka for longer than the retention delivers what it held: the seconds
    after the session's newest one were never published and are kept whole; only a record for a
    second that was published and evicted is dropped (counted)."""
    t0 = BASE_S * NS_PER_S
    agg = DelayAggregator(grace_s=0.5, retention_s=5.0, idle_s=2.0)
    now = t0 + NS_PER_S // 2
    agg.ingest("A", make_records([1, 2], [t0 + 1, t0 + 2], [1000, 1000], [100, 100]), now_tai_ns=now)
    now += 20 * NS_PER_S  # the agent is cut off: nothing for 20 s, the session is idle past the retention
    first = by_direction(agg.flush(now))
    assert first[("1", "forward", t0)]["count"] == 2 and agg.open_seconds() == 0
    # what it held: the rest of second 0 (published and evicted: late) and seconds 1 to 3
    held = make_records(
        [3, 4, 5, 6, 7],
        [t0 + 3, t0 + NS_PER_S, t0 + NS_PER_S + 5, t0 + 2 * NS_PER_S, t0 + 3 * NS_PER_S],
        [1000] * 5,
        [100] * 5,
    )
    agg.ingest("A", held, now_tai_ns=now)
    assert agg.counters.late_records_dropped == 1
    now += 3 * NS_PER_S  # idle again: they close by the clock
    got = by_direction(agg.flush(now))
    assert {s: got[("1", "forward", t0 + s * NS_PER_S)]["count"] for s in (1, 2, 3)} == {1: 2, 2: 1, 3: 1}
    assert ("1", "forward", t0) not in got  # second 0 is not published again from its tail
