"""Unit tests of the alternate-marking loss joiner (processors/loss/join.py): exact lines for
joined blocks and for every hard case (missing side, late side, duplicates, agent restart,
partial block, conflicting reports, rx > tx, period mismatch, counter wrap, eviction)."""

from __future__ import annotations

import numpy as np
import pytest

from processors.loss.join import NS_PER_S, LossJoiner, _run_ends, _runs
from segscope_schemas import altmark_block as ab

B = 1_795_305_600  # a block index at period 1000 ms (TAI seconds of 2026-11-22)
TS = B * NS_PER_S  # its block_start_ns = the line timestamp
END = TS + NS_PER_S  # its end: the line's newest_ns
T0 = 5_000 * NS_PER_S  # processor clock at the first ingest
TX, RX = ab.DIR_TX, ab.DIR_RX


def rec(
    direction, packets, nbytes, block=B, flow=7, boot=1, method=ab.METHOD_DSCP, period_ms=1000, flags=0
) -> np.ndarray:
    r = np.zeros(1, dtype=ab.ALTMARK_BLOCK_DTYPE)
    r["block_index"] = block
    r["block_start_ns"] = block * period_ms * 1_000_000
    r["colour"] = block & 1
    r["period_ms"] = period_ms
    r["flow_id"] = flow
    r["direction"] = direction
    r["method"] = method
    r["packets"] = packets
    r["bytes"] = nbytes
    r["boot_id"] = boot
    r["flags"] = flags
    return r


def head(flow=7, method="dscp", tx="A", rx="B", period=1000, path="unknown"):
    return f"altmark_loss,flow={flow},method={method},period_ms={period},tx_node={tx},rx_node={rx},path={path}"


def joined_ab(j: LossJoiner, tx=1000, rx=990, block=B, now=T0):
    j.ingest("A", rec(TX, tx, tx * 1200, block=block), now)
    j.ingest("B", rec(RX, rx, rx * 1200, block=block), now)


def test_complete_block_exact_line_and_no_reemission():
    j = LossJoiner(timeout_s=10)
    j.ingest("A", rec(TX, 1000, 1_200_000), T0)
    assert j.flush(T0) == []  # one side only, timeout not reached
    j.ingest("B", rec(RX, 990, 1_188_000), T0 + NS_PER_S)
    assert j.flush(T0 + NS_PER_S) == [
        f"{head()} tx_packets=1000i,rx_packets=990i,lost=10i,loss_ratio=0.01,tx_bytes=1200000i,"
        f'rx_bytes=1188000i,complete=true,reason="ok",newest_ns={END}i {TS}'
    ]
    assert j.flush(T0 + 2 * NS_PER_S) == []  # nothing changed, nothing re-published
    c = j.counters
    assert (c.records_in, c.batches_in, c.points_out, c.blocks_complete, c.blocks_incomplete) == (2, 2, 1, 1, 0)


def test_rfc9343_method_tag_and_max_flowmonid():
    j = LossJoiner()
    j.ingest("A", rec(TX, 4, 400, flow=0xFFFFF, method=ab.METHOD_RFC9343), T0)
    j.ingest("B", rec(RX, 3, 300, flow=0xFFFFF, method=ab.METHOD_RFC9343), T0)
    assert j.flush(T0) == [
        f"{head(flow=1048575, method='rfc9343')} tx_packets=4i,rx_packets=3i,lost=1i,loss_ratio=0.25,"
        f'tx_bytes=400i,rx_bytes=300i,complete=true,reason="ok",newest_ns={END}i {TS}'
    ]


def test_zero_traffic_block_has_no_loss_ratio():
    j = LossJoiner()
    joined_ab(j, tx=0, rx=0)
    assert j.flush(T0) == [
        f"{head()} tx_packets=0i,rx_packets=0i,lost=0i,tx_bytes=0i,rx_bytes=0i,complete=true,reason=\"ok\","
        f"newest_ns={END}i {TS}"
    ]


def test_missing_rx_published_incomplete_after_timeout_then_overwritten_when_rx_arrives():
    j = LossJoiner(timeout_s=10, retention_s=60)
    joined_ab(j, block=B - 1)  # teaches the flow's nodes
    j.flush(T0)
    j.ingest("A", rec(TX, 500, 600_000), T0)
    assert j.flush(T0 + 10 * NS_PER_S - 1) == []
    incomplete = f'{head()} tx_packets=500i,tx_bytes=600000i,complete=false,reason="missing_rx",newest_ns={END}i {TS}'
    assert j.flush(T0 + 10 * NS_PER_S) == [incomplete]
    assert j.flush(T0 + 11 * NS_PER_S) == []
    # the rx side arrives late (within retention): same measurement, tags, timestamp -> overwrite
    j.ingest("B", rec(RX, 499, 598_800), T0 + 30 * NS_PER_S)
    assert j.flush(T0 + 30 * NS_PER_S) == [
        f"{head()} tx_packets=500i,rx_packets=499i,lost=1i,loss_ratio=0.002,tx_bytes=600000i,"
        f'rx_bytes=598800i,complete=true,reason="ok",newest_ns={END}i {TS}'
    ]
    c = j.counters
    assert (c.points_out, c.points_reemitted, c.blocks_complete, c.blocks_incomplete) == (3, 1, 2, 1)


def test_missing_tx_of_a_new_flow_names_unknown_node():
    j = LossJoiner(timeout_s=2)
    j.ingest("B", rec(RX, 10, 1000, flow=9), T0)
    assert j.flush(T0 + 2 * NS_PER_S) == [
        f'{head(flow=9, tx="unknown")} rx_packets=10i,rx_bytes=1000i,complete=false,reason="missing_tx",'
        f"newest_ns={END}i {TS}"
    ]


def test_late_record_after_retention_is_dropped_and_counted():
    j = LossJoiner(timeout_s=1, retention_s=5)
    j.ingest("A", rec(TX, 5, 500), T0)
    assert len(j.flush(T0 + 5 * NS_PER_S)) == 1  # published incomplete, then evicted
    assert j.open_blocks() == 0
    j.ingest("B", rec(RX, 5, 500), T0 + 6 * NS_PER_S)
    assert j.flush(T0 + 100 * NS_PER_S) == []
    assert j.counters.late_records_dropped == 1 and j.open_blocks() == 0
    j.ingest("B", rec(RX, 5, 500, block=B + 1), T0 + 6 * NS_PER_S)  # a newer block is still taken
    assert j.counters.late_records_dropped == 1 and j.open_blocks() == 1


def test_duplicates_counted_not_double_counted():
    j = LossJoiner()
    batch = np.concatenate([rec(TX, 1000, 1_200_000), rec(TX, 1000, 1_200_000)])
    j.ingest("A", batch, T0)
    j.ingest("B", rec(RX, 990, 1_188_000), T0)
    lines = j.flush(T0)
    assert lines == [
        f"{head()} tx_packets=1000i,rx_packets=990i,lost=10i,loss_ratio=0.01,tx_bytes=1200000i,"
        f'rx_bytes=1188000i,complete=true,reason="ok",newest_ns={END}i {TS}'
    ]
    j.ingest("B", rec(RX, 990, 1_188_000), T0 + NS_PER_S)  # replay after publication
    assert j.flush(T0 + NS_PER_S) == []
    assert j.counters.duplicate_records == 2 and j.counters.points_out == 1


def test_agent_restart_mid_block_is_incomplete_never_a_wrong_loss():
    j = LossJoiner()
    # tx agent on A counted 400 packets of block B under boot 1, restarted, and its new
    # instance (boot 2) reports the same block with the 600 it saw: neither is the block's count
    j.ingest("A", rec(TX, 400, 48_000, boot=1), T0)
    j.ingest("A", rec(TX, 600, 72_000, boot=2), T0)
    j.ingest("B", rec(RX, 990, 118_800, boot=5), T0)
    assert j.flush(T0) == [
        f'{head()} tx_packets=400i,rx_packets=990i,tx_bytes=48000i,rx_bytes=118800i,'
        f'complete=false,reason="agent_restart",newest_ns={END}i {TS}'
    ]
    # the next block, fully counted by boot 2, joins normally; a late replay of boot 1 is no new restart
    j.ingest("A", rec(TX, 1000, 120_000, block=B + 1, boot=2), T0)
    j.ingest("B", rec(RX, 1000, 120_000, block=B + 1, boot=5), T0)
    j.ingest("A", rec(TX, 400, 48_000, boot=1), T0)
    assert j.flush(T0) == [
        f"{head()} tx_packets=1000i,rx_packets=1000i,lost=0i,loss_ratio=0.0,tx_bytes=120000i,"
        f'rx_bytes=120000i,complete=true,reason="ok",newest_ns={END + NS_PER_S}i {TS + NS_PER_S}'
    ]
    assert j.counters.agent_restarts == 1 and j.counters.duplicate_records == 1
    assert j.counters.conflicting_records == 0


def test_partial_block_flag_is_incomplete_even_with_both_sides():
    j = LossJoiner()
    # the rx agent started during block B (counters reset): its count covers part of the block
    j.ingest("A", rec(TX, 1000, 120_000), T0)
    j.ingest("B", rec(RX, 300, 36_000, boot=8, flags=ab.F_PARTIAL), T0)
    assert j.flush(T0) == [
        f'{head()} tx_packets=1000i,rx_packets=300i,tx_bytes=120000i,rx_bytes=36000i,'
        f'complete=false,reason="partial_block",newest_ns={END}i {TS}'
    ]
    assert j.counters.partial_records == 1


def test_restart_evidence_arriving_after_a_complete_line_republishes_incomplete():
    j = LossJoiner()
    joined_ab(j)
    assert j.flush(T0)[0].endswith(f'complete=true,reason="ok",newest_ns={END}i {TS}')
    j.ingest("B", rec(RX, 10, 1200, boot=2), T0 + NS_PER_S)
    assert j.flush(T0 + NS_PER_S) == [
        f'{head()} tx_packets=1000i,rx_packets=990i,tx_bytes=1200000i,rx_bytes=1188000i,'
        f'complete=false,reason="agent_restart",newest_ns={END}i {TS}'
    ]
    assert j.counters.points_reemitted == 1


def test_rx_exceeding_tx_is_incomplete_not_negative_loss():
    j = LossJoiner()
    joined_ab(j, tx=100, rx=101)
    assert j.flush(T0) == [
        f'{head()} tx_packets=100i,rx_packets=101i,tx_bytes=120000i,rx_bytes=121200i,'
        f'complete=false,reason="rx_exceeds_tx",newest_ns={END}i {TS}'
    ]
    assert j.counters.rx_exceeds_tx == 1


@pytest.mark.parametrize(
    "other_node, other_boot, reason",
    [
        ("A", 1, "conflicting_records"),  # same agent, same boot, other numbers: a collector bug
        ("C", 1, "conflicting_nodes"),  # a second node claims to be the flow's ingress
    ],
)
def test_conflicting_reports_of_one_side(other_node, other_boot, reason):
    j = LossJoiner()
    joined_ab(j)
    j.ingest(other_node, rec(TX, 1001, 1_201_200, boot=other_boot), T0)
    assert j.flush(T0) == [
        f'{head()} tx_packets=1000i,rx_packets=990i,tx_bytes=1200000i,rx_bytes=1188000i,'
        f'complete=false,reason="{reason}",newest_ns={END}i {TS}'
    ]
    assert j.counters.conflicting_records == 1


def test_period_mismatch_never_joins():
    j = LossJoiner(timeout_s=1)
    j.ingest("A", rec(TX, 1000, 1000), T0)
    j.ingest("B", rec(RX, 500, 500, block=2 * B, period_ms=500), T0)
    # both blocks start at TS but are different blocks (period is part of the key); the missing
    # side's node tag is the one the flow is known to use, so each point keeps its series
    assert j.flush(T0 + NS_PER_S) == [
        f'{head(period=500)} rx_packets=500i,rx_bytes=500i,complete=false,reason="missing_tx",'
        f"newest_ns={TS + NS_PER_S // 2}i {TS}",
        f'{head()} tx_packets=1000i,tx_bytes=1000i,complete=false,reason="missing_rx",newest_ns={END}i {TS}',
    ]


def test_counter_wrap_in_the_collector_delta_gives_the_right_loss():
    # the datapath's per-colour counter wrapped between the snapshots that bound block B
    tx_delta = ab.counter_delta((1 << 64) - 4, 996)
    rx_delta = ab.counter_delta(3, 1000)  # no wrap on rx
    assert (tx_delta, rx_delta) == (1000, 997)
    j = LossJoiner()
    j.ingest("A", rec(TX, tx_delta, 0), T0)
    j.ingest("B", rec(RX, rx_delta, 0), T0)
    assert j.flush(T0) == [
        f"{head()} tx_packets=1000i,rx_packets=997i,lost=3i,loss_ratio=0.003,"
        f'tx_bytes=0i,rx_bytes=0i,complete=true,reason="ok",newest_ns={END}i {TS}'
    ]


def test_invalid_records_dropped_with_reasons():
    j = LossJoiner()
    bad_colour = rec(TX, 1, 1)
    bad_colour["colour"] = 1 - (B & 1)
    bad_start = rec(RX, 1, 1)
    bad_start["block_start_ns"] += 1
    bad_dir = rec(3, 1, 1)
    invalid = j.ingest("A", np.concatenate([bad_colour, bad_start, bad_dir, rec(TX, 1, 1)]), T0)
    assert invalid == {"colour_mismatch": 1, "bad_block_start": 1, "bad_direction": 1}
    assert j.counters.invalid_records == 3 and j.counters.records_in == 4 and j.open_blocks() == 1


def test_timestamp_is_block_start_in_utc():
    j = LossJoiner(tai_utc_offset_s=37)
    joined_ab(j)
    assert j.flush(T0)[0].endswith(f' {TS - 37 * NS_PER_S}')


def test_tags_are_escaped():
    j = LossJoiner()
    j.ingest("edge A,1", rec(TX, 2, 2), T0)
    j.ingest("B=2", rec(RX, 2, 2), T0)
    assert j.flush(T0)[0].startswith(
        r"altmark_loss,flow=7,method=dscp,period_ms=1000,tx_node=edge\ A\,1,rx_node=B\=2,path=unknown "
    )


def test_batch_round_trip_into_joiner():
    hdr, recs = ab.decode_batch(ab.encode_batch(rec(TX, 3, 30), "A", 11))
    j = LossJoiner()
    j.ingest(hdr.node, recs, T0)
    j.ingest("B", rec(RX, 3, 30), T0)
    assert j.flush(T0)[0].startswith(f"{head()} tx_packets=3i,rx_packets=3i,lost=0i,loss_ratio=0.0,")


def test_counters_line():
    j = LossJoiner()
    joined_ab(j)
    j.ingest("A", rec(TX, 1000, 1_200_000), T0)
    j.flush(T0)
    assert j.counters_line(123) == (
        "segscope_processor,processor=loss records_in=3i,batches_in=3i,malformed_batches=0i,invalid_records=0i,"
        "duplicate_records=1i,conflicting_records=0i,partial_records=0i,agent_restarts=0i,"
        "late_records_dropped=0i,replayed_records_skipped=0i,points_out=1i,points_reemitted=0i,blocks_complete=1i,"
        "blocks_incomplete=0i,"
        "rx_exceeds_tx=0i,dmark_delays=0i,dmark_mismatch=0i,processing_errors=0i,rekeyed_batches_out=0i,"
        "rekeyed_batches_in=0i,blocks_handed_over=0i,path_unknown=1i,open_blocks=1i 123"
    )


def test_path_tag_is_the_tx_sides_path_fixed_at_first_publication():
    """path = flow_path(flow, tx node) when the block is first published; a re-publication (late
    side) keeps it even if the path became known or changed meanwhile (same series, overwritten)."""
    known: dict[tuple[int, str | None], str] = {}
    j = LossJoiner(timeout_s=1.0)
    j.flow_path = lambda flow_id, tx_node: known.get((flow_id, tx_node))
    j.ingest("A", rec(TX, 500, 600_000), T0)
    assert j.flush(T0 + NS_PER_S)[0].startswith(f"{head(rx='unknown')} tx_packets=500i,")  # no rx, no path yet
    known[(7, "A")] = "fc00:2::e,fc00:3::d6"
    j.ingest("B", rec(RX, 499, 598_800), T0 + NS_PER_S)
    assert j.flush(T0 + NS_PER_S)[0].startswith(f"{head()} tx_packets=500i,rx_packets=499i,lost=1i,")
    j.ingest("A", rec(TX, 10, 10, block=B + 1), T0)
    j.ingest("B", rec(RX, 10, 10, block=B + 1), T0)
    escaped = r"fc00:2::e\,fc00:3::d6"
    assert j.flush(T0)[0].startswith(head(path=escaped) + " tx_packets=10i,")
    assert j.counters.path_unknown == 1  # once per block


def test_one_flush_keeps_each_blocks_own_path_within_a_series():
    """The tags are made once per flow series and nodes in a flush; two blocks of one series whose
    paths differ (one re-published with the path of its first publication, one published first
    after the path changed) still get each its own path in the same flush."""
    known: dict[tuple[int, str | None], str] = {}
    version = [0]
    j = LossJoiner(timeout_s=1.0)
    j.flow_path = lambda flow_id, tx_node: known.get((flow_id, tx_node))
    j.flow_path_version = lambda: version[0]
    j.ingest("A", rec(TX, 500, 600_000), T0)
    assert j.flush(T0 + NS_PER_S)[0].startswith(f"{head(rx='unknown')} tx_packets=500i,")  # no path yet
    known[(7, "A")] = "fc00:2::e,fc00:3::d6"
    version[0] += 1
    j.ingest("B", rec(RX, 499, 598_800), T0 + NS_PER_S)  # block B again: its first path stays
    j.ingest("A", rec(TX, 10, 10, block=B + 1), T0 + NS_PER_S)
    j.ingest("B", rec(RX, 10, 10, block=B + 1), T0 + NS_PER_S)
    lines = j.flush(T0 + NS_PER_S)
    assert len(lines) == 2
    assert lines[0].startswith(f"{head()} tx_packets=500i,rx_packets=499i,lost=1i,")
    assert lines[1].startswith(head(path=r"fc00:2::e\,fc00:3::d6") + " tx_packets=10i,")


def test_runs_group_consecutive_equal_rows_only():
    """_runs / _run_ends: the one-pass grouping a flush uses for paths and tags (its rows are in key
    order). Equal rows that are not consecutive make runs of their own, object columns compare by
    value, and the run ends of a value are in ascending order (the last one wins an assignment)."""
    series = np.array([4, 4, 4, 9, 9, 4, 2], dtype=np.int64)
    nodes = np.array([0, 0, 1, 1, 1, 0, 0], dtype=np.int64)
    paths = np.empty(7, dtype=object)
    paths[:] = ["p", "p", "p", "p", "q", "p", "p"]
    first, run = _runs(series, nodes, paths)
    assert first.tolist() == [0, 2, 3, 4, 5, 6]
    assert run.tolist() == [0, 0, 1, 2, 3, 4, 5]
    assert _run_ends(series).tolist() == [2, 4, 5, 6]
    column = np.full(10, -1)
    column[series[_run_ends(series)]] = _run_ends(series)
    assert column[4] == 5  # the last row of series 4
    assert _runs(np.array([], dtype=np.int64))[0].tolist() == []
    assert _runs(np.array([3]))[1].tolist() == [0]


def test_one_flush_with_a_series_tx_node_changing_back_and_forth():
    """Three blocks of one series in one flush whose tx nodes go A, C, A: each line names its own
    block's tx node and that node's path, and the path source is asked once per (flow, tx node)."""
    asked: list[tuple[int, str | None]] = []

    def flow_path(flow_id, tx_node):
        asked.append((flow_id, tx_node))
        return f"fc00::{tx_node}"

    j = LossJoiner(timeout_s=1.0)
    j.flow_path = flow_path
    j.flow_path_version = lambda: 0
    for block, tx_node in ((B, "A"), (B + 1, "C"), (B + 2, "A")):
        j.ingest(tx_node, rec(TX, 100, 1000, block=block), T0)
        j.ingest("B", rec(RX, 100, 1000, block=block), T0)
    lines = j.flush(T0)
    assert [line.split(" ")[0] for line in lines] == [
        head(tx="A", path="fc00::A"),
        head(tx="C", path="fc00::C"),
        head(tx="A", path="fc00::A"),
    ]
    assert sorted(asked) == [(7, "A"), (7, "C")]


def test_bulk_path_source_gives_the_same_lines_and_is_dropped_with_its_source():
    """flow_paths (the app's PathBook.paths_for_flows: many flows, one lock) answers for flow_path:
    asked once per flush with each (flow, tx node) once, the same lines as flow_path one by one.
    Setting another flow_path drops it (it answered for the old source)."""
    paths = {(7, "A"): "fc00:2::e,fc00:3::d6", (8, "A"): "fc00:8::1"}
    bulk_calls: list[list] = []

    def flow_paths(questions):
        bulk_calls.append(list(questions))
        return [paths.get(q) for q in questions]

    def joiner(bulk: bool) -> LossJoiner:
        j = LossJoiner(timeout_s=1.0)
        j.flow_path = lambda flow_id, tx_node: paths.get((flow_id, tx_node))
        j.flow_path_version = lambda: 0
        if bulk:
            j.flow_paths = flow_paths
        for flow in (7, 8, 9):
            for block in (B, B + 1):
                j.ingest("A", rec(TX, 100, 1000, block=block, flow=flow), T0)
                j.ingest("B", rec(RX, 99, 990, block=block, flow=flow), T0)
        return j

    with_bulk, one_by_one = joiner(True), joiner(False)
    lines = with_bulk.flush(T0)
    assert lines == one_by_one.flush(T0)
    assert len(lines) == 6 and lines[0].startswith(head(path=r"fc00:2::e\,fc00:3::d6") + " ")
    assert lines[-1].startswith(head(flow=9) + " ")  # no record: unknown
    assert bulk_calls == [[(7, "A"), (8, "A"), (9, "A")]]
    assert with_bulk.counters.as_dict() == one_by_one.counters.as_dict()
    with_bulk.flow_path = lambda flow_id, tx_node: None
    assert with_bulk.flow_paths is None


@pytest.mark.parametrize("timeout_s, retention_s", [(0, 10), (10, 5), (-1, 10)])
def test_bad_timeouts_rejected(timeout_s, retention_s):
    with pytest.raises(ValueError, match="timeout_s"):
        LossJoiner(timeout_s=timeout_s, retention_s=retention_s)


@pytest.mark.parametrize("seed", range(5))
def test_any_arrival_order_with_replays_ends_in_the_same_exact_line(seed):
    # blocks B..B+9: tx, rx and replays of both arrive shuffled, with flushes in between;
    # every block's last line must be its exact complete line, and no complete line is ever wrong
    rng = np.random.default_rng(seed)
    tx = rng.integers(0, 10_000, 10)
    rx = tx - rng.integers(0, 50, 10).clip(max=tx)
    events = [(d, i) for i in range(10) for d in (TX, RX, TX, RX)]
    order = rng.permutation(len(events))
    j = LossJoiner(timeout_s=1000, retention_s=1000)
    last: dict[int, str] = {}
    for step, e in enumerate(order):
        d, i = events[e]
        n = int(tx[i] if d == TX else rx[i])
        j.ingest("A" if d == TX else "B", rec(d, n, n * 100, block=B + i), T0 + step)
        for line in j.flush(T0 + step):
            last[int(line.rsplit(" ", 1)[1])] = line
    assert len(last) == 10
    for i in range(10):
        lost = int(tx[i] - rx[i])
        ratio = f",loss_ratio={lost / int(tx[i])!r}" if tx[i] else ""
        assert last[TS + i * NS_PER_S] == (
            f"{head()} tx_packets={tx[i]}i,rx_packets={rx[i]}i,lost={lost}i{ratio},tx_bytes={tx[i] * 100}i,"
            f'rx_bytes={rx[i] * 100}i,complete=true,reason="ok",newest_ns={END + i * NS_PER_S}i {TS + i * NS_PER_S}'
        )
    assert j.counters.duplicate_records == 20 and j.counters.points_out == 10


def test_replayed_records_of_final_blocks_are_skipped():
    """After a restart the joiner is seeded with each flow's highest final block (the progress
    topic): a replayed record of such a block (its batch also held a newer block) is skipped and
    counted; it never makes a one-sided block that would be published incomplete."""
    j = LossJoiner(timeout_s=2.0, retention_s=10.0)
    j.final_upto[(7, ab.METHOD_DSCP, 1000)] = B
    j.ingest("A", np.concatenate([rec(TX, 1000, 1_200_000, block=B), rec(TX, 500, 600_000, block=B + 1)]), T0)
    j.ingest("B", rec(RX, 500, 600_000, block=B + 1), T0)
    assert j.counters.replayed_records_skipped == 1
    lines = j.flush(T0 + 3 * NS_PER_S)  # past the timeout: a one-sided block B would show here
    assert len(lines) == 1 and "complete=true" in lines[0] and "lost=0i" in lines[0], lines
