"""Double-marking delay in the loss join (processors/loss/join.py): exact mean one-way delay of
the D-marked packets of a complete block, none (and counted) when the two edges disagree."""

from __future__ import annotations

import pytest
from test_loss_join import RX, T0, TS, TX, head, rec

from processors.loss.join import NS_PER_S, LossJoiner
from segscope_schemas import altmark_block as ab

U64 = (1 << 64) - 1


def dm(r, n: int, ts_sum: int):
    r["dmark_packets"] = n
    r["dmark_ts_sum_ns"] = ts_sum & U64
    return r


def test_equal_counts_give_exact_mean_delay():
    j = LossJoiner()
    tx_ts = [1_795_305_600_000_000_000 + i * 1_000_000 for i in range(3)]
    rx_ts = [t + d for t, d in zip(tx_ts, (2_000_100, 2_000_300, 2_000_501))]  # 2000.3003... us mean
    j.ingest("A", dm(rec(TX, 1000, 1_200_000), 3, sum(tx_ts)), T0)
    j.ingest("B", dm(rec(RX, 999, 1_198_800), 3, sum(rx_ts)), T0)
    mean_us = (2_000_100 + 2_000_300 + 2_000_501) / 3 / 1000
    assert j.flush(T0) == [
        f"{head()} tx_packets=1000i,rx_packets=999i,lost=1i,loss_ratio=0.001,tx_bytes=1200000i,"
        f'rx_bytes=1198800i,dmark_packets=3i,dmark_delay_mean_us={mean_us!r},complete=true,reason="ok",'
        f"newest_ns={TS + NS_PER_S}i {TS}"
    ]
    assert (j.counters.dmark_delays, j.counters.dmark_mismatch) == (1, 0)
    assert ab.dmark_delay_ns(3, sum(tx_ts), 3, sum(rx_ts)) == int(mean_us * 1000)  # schema helper agrees


def test_sums_that_wrapped_and_negative_delay():
    """The sums are mod 2^64 deltas: rx's may be numerically smaller than tx's. A negative delay
    (clocks disagree) is published as such, never dropped."""
    j = LossJoiner()
    j.ingest("A", dm(rec(TX, 10, 1000), 2, U64 - 99), T0)  # tx sum just below 2^64
    j.ingest("B", dm(rec(RX, 10, 1000), 2, 4_000_001 - 100), T0)  # rx sum wrapped: diff = 4 000 001
    j.ingest("A", dm(rec(TX, 5, 500, block=TS // NS_PER_S + 1), 1, 5_000), T0)
    j.ingest("B", dm(rec(RX, 5, 500, block=TS // NS_PER_S + 1), 1, 2_000), T0)  # -3 us
    lines = j.flush(T0)
    assert "dmark_packets=2i,dmark_delay_mean_us=2000.0005," in lines[0]
    assert "dmark_packets=1i,dmark_delay_mean_us=-3.0," in lines[1]


@pytest.mark.parametrize("tx_n, rx_n", [(3, 2), (0, 1), (4, 0)])
def test_different_counts_no_delay_counted(tx_n, rx_n):
    j = LossJoiner()
    j.ingest("A", dm(rec(TX, 100, 1000), tx_n, 10**18), T0)
    j.ingest("B", dm(rec(RX, 99, 990), rx_n, 10**18 + 5000), T0)
    (line,) = j.flush(T0)
    assert "dmark" not in line and ",complete=true," in line
    assert (j.counters.dmark_delays, j.counters.dmark_mismatch) == (0, 1)


def test_no_double_marking_no_field_no_counter_and_incomplete_never_has_delay():
    j = LossJoiner(timeout_s=1, retention_s=10)
    j.ingest("A", rec(TX, 100, 1000), T0)
    j.ingest("B", rec(RX, 100, 1000), T0)
    j.ingest("A", dm(rec(TX, 7, 70, block=TS // NS_PER_S + 1), 2, 100), T0)  # rx never comes
    lines = j.flush(T0 + NS_PER_S)
    assert len(lines) == 2 and not any("dmark" in x for x in lines)
    assert ",complete=false," in lines[1]
    assert (j.counters.dmark_delays, j.counters.dmark_mismatch) == (0, 0)


def test_replay_and_reemission_count_the_delay_once():
    j = LossJoiner(timeout_s=1, retention_s=10)
    tx = dm(rec(TX, 10, 100), 2, 1_000)
    j.ingest("A", tx, T0)
    assert "missing_rx" in j.flush(T0 + NS_PER_S)[0]  # incomplete first
    j.ingest("B", dm(rec(RX, 10, 100), 2, 5_000), T0 + NS_PER_S)
    j.ingest("A", tx, T0 + NS_PER_S)  # duplicate replay
    (line,) = j.flush(T0 + 2 * NS_PER_S)
    assert "dmark_packets=2i,dmark_delay_mean_us=2.0,complete=true" in line
    assert j.flush(T0 + 3 * NS_PER_S) == []
    assert (j.counters.dmark_delays, j.counters.duplicate_records) == (1, 1)


def test_same_counts_other_sum_is_a_conflict_not_a_duplicate():
    j = LossJoiner()
    j.ingest("A", dm(rec(TX, 10, 100), 2, 1_000), T0)
    j.ingest("A", dm(rec(TX, 10, 100), 2, 1_001), T0)
    j.ingest("B", dm(rec(RX, 10, 100), 2, 5_000), T0)
    (line,) = j.flush(T0)
    assert 'reason="conflicting_records"' in line and "dmark" not in line
