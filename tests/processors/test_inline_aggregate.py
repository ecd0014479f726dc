"""The in-line aggregator (processors/inline/aggregate.py, hops.py) on hand-built records whose true
delays, losses, duplicates, reorderings and missing hops the test sets: every number checked is
the one the records were built with, computed here from plain Python values."""

from __future__ import annotations

import numpy as np
import pytest

from processors.inline.aggregate import InlineAggregator
from processors.paths import PathBook
from segscope_schemas import delay_histogram
from segscope_schemas import ioam_record as ir
from segscope_schemas import path_record as pr
from segscope_schemas.line_protocol import parse_line
from tests.processors.inline_records import NS, TAI_UTC, Hop, entry_time_ns, records

BASE_S = 1_700_000_000  # TAI seconds, long past
A = Hop(node_id=1, ingress_if=0xFFFF, egress_if=11, hop_limit=64)  # ingress edge: leaves with 64
R1 = Hop(node_id=7, ingress_if=70, egress_if=70, hop_limit=63)  # an SRv6 End: egress id = the SID route's device
R2 = Hop(node_id=8, ingress_if=80, egress_if=81, hop_limit=62)
FLOW = 7


def aggregator(book=None, **kw) -> InlineAggregator:
    """An aggregator whose ingest clock is BASE_S (the records' time), not the machine's: its idle
    and future rules then see the test's time."""
    agg = InlineAggregator(tai_utc_offset_s=TAI_UTC, book=book, **kw)
    ingest = agg.ingest
    agg.ingest = lambda node, recs, now_tai_ns=BASE_S * NS: ingest(node, recs, now_tai_ns)
    return agg


def close(agg: InlineAggregator, seconds_after: int = 30) -> list[str]:
    """Flush with the clock far past the data: every second closes and is evicted."""
    return agg.flush(now_tai_ns=(BASE_S + seconds_after) * NS)


def points(lines: list[str]) -> dict[tuple, dict]:
    """(measurement, tags as sorted tuple, UTC second) -> fields; no identity twice (the last wins:
    what InfluxDB keeps)."""
    out = {}
    for line in lines:
        p = parse_line(line)
        out[(p.measurement, tuple(sorted(p.tags.items())), p.timestamp_ns // NS + TAI_UTC)] = p.fields
    return out


def of(pts: dict, measurement: str, **tags) -> dict[int, dict]:
    """second (TAI) -> fields of the points of `measurement` whose tags include `tags`."""
    return {
        s: f for (m, t, s), f in pts.items() if m == measurement and all(dict(t).get(k) == v for k, v in tags.items())
    }


def stats(values_ns: list[int]) -> dict:
    """What stamp_delay's fields are for these delays (in seq order), from plain Python."""
    v = values_ns
    p50, p99 = np.percentile(np.array(v), [50, 99])
    out = {
        "count": len(v),
        "sum_us": sum(v) / 1000,
        "min_us": min(v) / 1000,
        "max_us": max(v) / 1000,
        "mean_us": sum(v) / len(v) / 1000,
        "p50_us": p50 / 1000,
        "p99_us": p99 / 1000,
    }
    if len(v) >= 2:
        out["ipdv_mean_us"] = sum(abs(a - b) for a, b in zip(v[1:], v[:-1])) / (len(v) - 1) / 1000
    return out


def assert_stats(fields: dict, want: dict) -> None:
    for k, v in want.items():
        assert fields[k] == pytest.approx(v, rel=1e-12, abs=1e-9), (k, fields[k], v)


def two_transit_flow(n: int, second: int, rng, seq0: int = 0):
    """n packets A -> R1 -> R2 -> egress in one second: true times of every node."""
    tx = second * NS + np.sort(rng.choice(NS - 10_000_000, n, replace=False)).astype(np.int64)
    t1 = tx + rng.integers(100_000, 300_000, n)
    t2 = t1 + rng.integers(400_000, 900_000, n)
    rx = t2 + rng.integers(50_000, 150_000, n)
    return np.arange(seq0, seq0 + n), tx, t1, t2, rx


def test_one_way_and_hop_delays_are_the_built_ones():
    rng = np.random.default_rng(1)
    agg = aggregator()
    want_e2e, want_hops = {}, {}
    for second in (BASE_S, BASE_S + 1):
        seq, tx, t1, t2, rx = two_transit_flow(200, second, rng, seq0=(second - BASE_S) * 200)
        recs = records(FLOW, seq, tx, rx, A, [(R1, t1), (R2, t2)])
        for i in range(0, 200, 37):  # several messages
            agg.ingest("B", recs[i : i + 37])
        e1, e2 = entry_time_ns(t1), entry_time_ns(t2)  # µs truncation, as the kernel writes them
        want_e2e[second] = stats((rx - tx).tolist())
        want_hops[second] = {
            "0": stats((e1 - tx).tolist()),
            "1": stats((e2 - e1).tolist()),
            "2": stats((rx - e2).tolist()),
        }
    pts = points(close(agg))
    delay = of(pts, "inline_delay", flow="7", ingress="node-1", egress="B", path="unknown")
    assert sorted(delay) == [BASE_S, BASE_S + 1]
    hist = of(pts, "inline_delay_histogram", flow="7", ingress="node-1", egress="B", path="unknown")
    for second, fields in delay.items():
        assert_stats(fields, want_e2e[second])
        assert sum(hist[second].values()) == fields["count"]
    for second in delay:
        for hop, want in want_hops[second].items():
            got = of(pts, "inline_hop_delay", hop=hop)[second]
            assert got["measured"] is True and got["unmeasured"] == 0
            assert_stats(got, want)
        # the hops telescope: their sums are the one-way sum (entry times are exact µs here)
        hop_sum = sum(of(pts, "inline_hop_delay", hop=h)[second]["sum_us"] for h in ("0", "1", "2"))
        assert hop_sum == pytest.approx(delay[second]["sum_us"], rel=1e-12)
    links = {dict(t)["hop"]: dict(t) for (m, t, _) in pts if m == "inline_hop_delay"}
    # without ioam records: nodes by id, interfaces by IOAM id; R1's and R2's departure unknown
    # (they may be SRv6 endpoints: the kernel's egress id would be the SID route's device)
    assert links["0"]["link"] == "node-1:11->node-7:70"
    assert links["1"]["link"] == "node-7:unknown->node-8:80"
    assert links["2"]["link"] == "node-8:unknown->B:ifindex-5"
    assert (links["2"]["from_node"], links["2"]["to_node"], links["2"]["to_if"]) == ("node-8", "B", "ifindex-5")
    assert agg.counters.hop_from_if_unresolved == 2 * 2  # hops 1 and 2, two seconds
    assert agg.counters.negative_delays == agg.counters.duplicate_records == 0


def test_histogram_is_stamp_delay_histograms_encoding():
    rng = np.random.default_rng(2)
    agg = aggregator()
    seq, tx, t1, t2, rx = two_transit_flow(300, BASE_S, rng)
    rx[5] = tx[5] - 2_000  # a negative delay (disagreeing clocks): kept, counted, bucket `low`
    agg.ingest("B", records(FLOW, seq, tx, rx, A, [(R1, t1), (R2, t2)]))
    lines = close(agg)
    hist_line = next(line for line in lines if line.startswith("inline_delay_histogram,"))
    assert hist_line.split(" ")[1] == delay_histogram.fields_text(rx - tx)
    assert agg.counters.negative_delays == 1


def test_newest_ns_and_timestamps_are_utc():
    agg = aggregator()
    tx = np.array([BASE_S * NS + 10, BASE_S * NS + 900_000_000])
    rx = tx + 1_000_000
    agg.ingest("B", records(FLOW, np.arange(2), tx, rx, A, []))
    for line in close(agg):
        p = parse_line(line)
        assert p.timestamp_ns == (BASE_S - TAI_UTC) * NS
        if p.measurement != "inline_delay_histogram":
            assert p.fields["newest_ns"] == BASE_S * NS + 900_000_000 - TAI_UTC * NS


def test_a_transit_node_without_ioam_is_found_by_hop_limit_and_spanned():
    """A -> X (no IOAM: decrements, fills nothing) -> R2 -> B: hops 0 and 1 are not measured, the
    span 0-1 is the A -> R2 delay, hop 2 is measured."""
    rng = np.random.default_rng(3)
    seq, tx, _, t2, rx = two_transit_flow(100, BASE_S, rng)
    r2 = Hop(8, 80, 81, 62)  # 64 at A, 63 after X, R2 forwards with 62: one router between
    agg = aggregator()
    agg.ingest("B", records(FLOW, seq, tx, rx, A, [(r2, t2)]))
    pts = points(close(agg))
    hops = {dict(t)["hop"]: (dict(t), f) for (m, t, _), f in pts.items() if m == "inline_hop_delay"}
    assert set(hops) == {"0", "1", "2", "0-1"}
    for h in ("0", "1"):
        tags, fields = hops[h]
        assert fields == {"measured": False, "unmeasured": 100, "newest_ns": int(tx.max()) - TAI_UTC * NS}
    assert hops["0"][0]["link"] == "node-1:11->unknown:unknown"
    assert hops["1"][0]["link"] == "unknown:unknown->node-8:80"
    e2 = entry_time_ns(t2)
    assert_stats(hops["0-1"][1], stats((e2 - tx).tolist()))
    assert hops["0-1"][0]["link"] == "node-1:11->node-8:80"
    assert_stats(hops["2"][1], stats((rx - e2).tolist()))
    assert agg.counters.hop_points_not_measured == 2


def test_a_router_after_the_last_filler_is_found_at_the_egress():
    rng = np.random.default_rng(4)
    seq, tx, t1, _, rx = two_transit_flow(50, BASE_S, rng)
    agg = aggregator()
    agg.ingest("B", records(FLOW, seq, tx, rx, A, [(R1, t1)], arrival_hop_limit=R1.hop_limit - 1))
    hops = {dict(t)["hop"]: f for (m, t, _), f in points(close(agg)).items() if m == "inline_hop_delay"}
    assert set(hops) == {"0", "1", "2", "1-2"}
    assert hops["0"]["measured"] and not hops["1"]["measured"] and not hops["2"]["measured"]
    assert_stats(hops["1-2"], stats((rx - entry_time_ns(t1)).tolist()))


def book_with(inline_path=("fc00:7::e", "fc00:8::e", "fc00:9::d6"), r1_ioam=True) -> PathBook:
    """Names for A (id 1), R1 (id 7, SID fc00:7::e), R2 (id 8, SID fc00:8::e, a router on the way),
    B (id 99, SID fc00:9::d6): devices with their prefixes, so departures resolve by subnet."""
    book = PathBook()

    def ioam(name, node_id, interfaces, sids):
        book.apply(*pr.encode(pr.IoamNode(name, node_id, tuple(interfaces), (1,), tuple(sids), 1)))

    ioam("A", 1, [pr.IoamInterface("a0", 11, 3, ("fc00:12::/64",))], [])
    if r1_ioam:
        ioam("R1", 7, [pr.IoamInterface("r1a", 70, 4, ("fc00:12::/64",)),
                       pr.IoamInterface("r1b", 71, 5, ("fc00:23::/64",))], ["fc00:7::e"])  # fmt: skip
    ioam("R2", 8, [pr.IoamInterface("r2a", 80, 6, ("fc00:23::/64",)),
                   pr.IoamInterface("r2b", 81, 7, ("fc00:34::/64",))], ["fc00:8::e"])  # fmt: skip
    ioam("B", 99, [pr.IoamInterface("b0", 90, 5, ("fc00:34::/64",))], ["fc00:9::d6"])
    if inline_path is not None:
        book.apply(*pr.encode(pr.PathRecord.inline("A", FLOW, "tx", list(inline_path), 1, 4, 100, 1)))
    return book


def test_names_from_the_ioam_records_and_departures_resolved_by_subnet():
    rng = np.random.default_rng(5)
    seq, tx, t1, t2, rx = two_transit_flow(80, BASE_S, rng)
    agg = aggregator(book=book_with())
    agg.ingest("B", records(FLOW, seq, tx, rx, A, [(R1, t1), (R2, t2)]))
    pts = points(close(agg))
    assert of(pts, "inline_delay", ingress="A", egress="B", path="fc00:7::e,fc00:8::e,fc00:9::d6")
    links = {dict(t)["hop"]: dict(t) for (m, t, _) in pts if m == "inline_hop_delay"}
    # R1 is an End: the trace says it sent on r1a (70, the SID route's device); the subnet it shares
    # with R2's ingress device says r1b
    assert links["0"]["link"] == "A:a0->R1:r1a"
    assert links["1"]["link"] == "R1:r1b->R2:r2a"
    assert links["2"]["link"] == "R2:r2b->B:b0"
    assert links["1"]["path"] == "fc00:7::e,fc00:8::e,fc00:9::d6"
    assert agg.counters.hop_from_if_unresolved == 0 and agg.counters.path_unknown == 0


def test_a_router_that_is_no_endpoint_keeps_its_egress_id_without_prefixes():
    """No prefixes known: a transit node that owns none of the flow's SIDs was routed toward the
    destination, its egress id is right; an endpoint's is not (unknown)."""
    book = PathBook()
    book.apply(*pr.encode(pr.IoamNode("R1", 7, (pr.IoamInterface("r1a", 70), pr.IoamInterface("r1b", 71)), (1,),
                                      ("fc00:7::e",), 1)))  # fmt: skip
    book.apply(*pr.encode(pr.IoamNode("R2", 8, (pr.IoamInterface("r2a", 80), pr.IoamInterface("r2b", 81)), (1,),
                                      (), 1)))  # fmt: skip
    book.apply(*pr.encode(pr.PathRecord.inline("A", FLOW, "tx", ["fc00:7::e", "fc00:9::d6"], 1, 4, 100, 1)))
    rng = np.random.default_rng(6)
    seq, tx, t1, t2, rx = two_transit_flow(10, BASE_S, rng)
    agg = aggregator(book=book)
    agg.ingest("B", records(FLOW, seq, tx, rx, A, [(R1, t1), (R2, t2)]))
    links = {dict(t)["hop"]: dict(t)["link"] for (m, t, _) in points(close(agg)) if m == "inline_hop_delay"}
    assert links == {"0": "A:11->R1:r1a", "1": "R1:unknown->R2:r2a", "2": "R2:r2b->B:ifindex-5"}
    assert agg.counters.hop_from_if_unresolved == 1


def test_a_sid_node_that_did_not_fill_is_named_and_not_measured():
    """R1 owns the flow's first SID but fills nothing (IOAM off). Its hop limit decrement shows one
    router missing; the path's SID nodes name it."""
    rng = np.random.default_rng(7)
    seq, tx, _, t2, rx = two_transit_flow(60, BASE_S, rng)
    agg = aggregator(book=book_with())
    agg.ingest("B", records(FLOW, seq, tx, rx, A, [(R2, t2)]))
    hops = {dict(t)["hop"]: (dict(t), f) for (m, t, _), f in points(close(agg)).items() if m == "inline_hop_delay"}
    assert hops["0"][0]["link"] == "A:a0->R1:unknown" and hops["0"][1]["measured"] is False
    assert hops["1"][0]["link"] == "R1:unknown->R2:r2a" and hops["1"][1]["measured"] is False
    assert hops["0-1"][0]["link"] == "A:a0->R2:r2a"
    assert_stats(hops["0-1"][1], stats((entry_time_ns(t2) - tx).tolist()))
    assert hops["2"][0]["link"] == "R2:r2b->B:b0" and hops["2"][1]["measured"] is True


def test_a_missing_sid_node_with_hop_limits_that_cannot_tell_is_still_named():
    """The hop limits do not show the missing node (R2 writes 63: as if adjacent to A), the SID list
    does: it is placed before the next SID node that filled, here the egress."""
    rng = np.random.default_rng(8)
    seq, tx, t1, _, rx = two_transit_flow(20, BASE_S, rng)
    agg = aggregator(book=book_with())
    agg.ingest("B", records(FLOW, seq, tx, rx, A, [(R1, t1)]))
    hops = {dict(t)["hop"]: dict(t)["link"] for (m, t, _) in points(close(agg)) if m == "inline_hop_delay"}
    assert hops == {"0": "A:a0->R1:r1a", "1": "R1:unknown->R2:unknown", "2": "R2:unknown->B:b0",
                    "1-2": "R1:unknown->B:b0"}  # fmt: skip
    # R1 shares no subnet with B's ingress device and is an SRv6 endpoint: its departure is unknown


def test_hop_limits_that_rise_are_not_believed():
    rng = np.random.default_rng(9)
    seq, tx, t1, _, rx = two_transit_flow(20, BASE_S, rng)
    odd = Hop(7, 70, 70, 80)  # above what the ingress sent: a node that writes something else
    agg = aggregator()
    agg.ingest("B", records(FLOW, seq, tx, rx, A, [(odd, t1)]))
    hops = {dict(t)["hop"] for (m, t, _) in points(close(agg)) if m == "inline_hop_delay"}
    assert hops == {"0", "1"}
    assert agg.counters.hop_limit_inconsistent_records == 20


def loss_of(pts: dict) -> dict[int, dict]:
    return {s: {k: v for k, v in f.items() if k != "newest_ns"} for s, f in of(pts, "inline_loss").items()}


def send(agg, seq, tx, rx=None, node="B", flow=FLOW, now_ns=None):
    tx = np.asarray(tx, dtype=np.int64)
    rx = tx + 1_000_000 if rx is None else np.asarray(rx, dtype=np.int64)
    if now_ns is None:
        return agg.ingest(node, records(flow, np.asarray(seq), tx, rx, A, []))
    return agg.ingest(node, records(flow, np.asarray(seq), tx, rx, A, []), now_ns)


def test_loss_duplicates_reordering_and_bursts_per_second():
    """Sent: seqs 0..29, 10 per second (seq s at BASE_S + s // 10, + (s % 10) * 0.1 s).
    Lost: 3, 4 (a burst of 2), 9, 10 (one burst over the second boundary: it counts in the second of
    the next seq received, 11), 25. Received per second: 7, 9, 9. Duplicated by the network: 7
    (twice more). Reordered: 6 arrives after 8; 22 after 23 and 24."""
    tx = {s: BASE_S * NS + s * 100_000_000 for s in range(30)}
    arrival = [0, 1, 2, 5, 7, 8, 6, 7, 7, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 23, 24, 22, 26, 27, 28, 29]
    rx = [tx[s] + 1_000_000 + i for i, s in enumerate(arrival)]  # each copy its own receive time
    agg = aggregator()
    for i in range(0, len(arrival), 4):
        send(agg, arrival[i : i + 4], [tx[s] for s in arrival[i : i + 4]], rx[i : i + 4])
    pts = points(close(agg))
    got = loss_of(pts)
    # the one-way delay counts each packet once: a duplicate's first arrival is the one measured
    assert {s: f["count"] for s, f in of(pts, "inline_delay").items()} == {BASE_S: 7, BASE_S + 1: 9, BASE_S + 2: 9}
    # delay of the i-th arrival: 1 ms + i ns; 7's first copy is the 5th (i = 4), not the 8th or 9th
    assert of(pts, "inline_delay")[BASE_S]["sum_us"] == pytest.approx(7000 + (0 + 1 + 2 + 3 + 4 + 5 + 6) / 1000)
    assert got == {
        BASE_S: dict(received=7, lost=2, duplicated=2, reordered=1, loss_bursts=1, loss_burst_max=2, loss_ratio=2 / 9),
        BASE_S + 1: dict(
            received=9, lost=2, duplicated=0, reordered=0, loss_bursts=1, loss_burst_max=2, loss_ratio=2 / 11
        ),  # fmt: skip
        BASE_S + 2: dict(
            received=9, lost=1, duplicated=0, reordered=1, loss_bursts=1, loss_burst_max=1, loss_ratio=1 / 10
        ),  # fmt: skip
    }
    # every seq from the first to the highest received is counted once
    assert sum(f["received"] + f["lost"] for f in got.values()) == 30


def test_a_late_packet_within_the_reorder_window_turns_lost_into_received():
    agg = aggregator(grace_s=0.5, retention_s=10)
    tx = lambda s: BASE_S * NS + s * 100_000_000  # noqa: E731 - 10 per second
    sent = [s for s in range(16) if s != 3]
    send(agg, sent, [tx(s) for s in sent])
    first = loss_of(points(agg.flush(now_tai_ns=tx(15) + 100_000_000)))  # second BASE_S closed, 3 lost
    assert first[BASE_S]["lost"] == 1 and first[BASE_S]["received"] == 9
    send(agg, [3], [tx(3)])  # 3 s later in the egress's time, well inside the window
    lines = agg.flush(now_tai_ns=tx(15) + 200_000_000)
    again = loss_of(points(lines))
    assert again[BASE_S] == dict(received=10, lost=0, duplicated=0, reordered=1, loss_bursts=0, loss_burst_max=0,
                                 loss_ratio=0.0)  # fmt: skip
    assert of(points(lines), "inline_delay")[BASE_S]["count"] == 10  # emitted again, whole
    assert agg.counters.seconds_reemitted == 1


def test_a_late_packet_of_an_earlier_second_moves_the_gap_out_of_the_next():
    """Seq 9 (sent in second 0) arrives after both seconds were published: second 0 had 9 received
    + 0 lost, second 1 counted 9 as lost (the gap before 10). Now second 0 has it and second 1 loses
    the gap: both are emitted again, the total stays exact."""
    agg = aggregator(grace_s=0.5, retention_s=10)
    tx = lambda s: BASE_S * NS + s * 100_000_000  # noqa: E731
    sent = [s for s in range(20) if s != 9]
    send(agg, sent, [tx(s) for s in sent])
    before = loss_of(points(agg.flush(now_tai_ns=tx(40))))
    assert before[BASE_S]["received"] == 9 and before[BASE_S]["lost"] == 0
    assert before[BASE_S + 1]["received"] == 10 and before[BASE_S + 1]["lost"] == 1
    send(agg, [9], [tx(9)])
    after = loss_of(points(agg.flush(now_tai_ns=tx(41))))
    assert after[BASE_S]["received"] == 10 and after[BASE_S]["lost"] == 0
    assert after[BASE_S + 1]["received"] == 10 and after[BASE_S + 1]["lost"] == 0
    assert agg.counters.seconds_reemitted == 2


def test_a_packet_later_than_the_reorder_window_stays_lost():
    agg = aggregator(grace_s=0.5, retention_s=2)
    tx = lambda s: BASE_S * NS + s * 100_000_000  # noqa: E731
    sent = [s for s in range(60) if s != 5]
    send(agg, sent, [tx(s) for s in sent], now_ns=tx(59))
    agg.flush(now_tai_ns=tx(60))  # the newest packet left at 5.9 s: seconds 0..2 are final
    assert agg.flows[("B", FLOW)].base_seq == 29  # seqs up to 29 accounted
    send(agg, [5], [tx(5)], now_ns=tx(60))
    assert agg.counters.late_records_dropped == 1
    assert not [line for line in agg.flush(now_tai_ns=tx(61)) if f" {(BASE_S - TAI_UTC) * NS}" in line]


def test_a_replayed_record_is_dropped_not_a_network_duplicate():
    agg = aggregator()
    tx = [BASE_S * NS + s * 1000 for s in range(10)]
    send(agg, range(10), tx)
    send(agg, range(5), tx[:5])  # the same records again (a replay): same seq, same receive time
    pts = points(close(agg))
    assert of(pts, "inline_delay")[BASE_S]["count"] == 10
    assert loss_of(pts)[BASE_S]["duplicated"] == 0
    assert agg.counters.duplicate_records == 5


def test_two_signatures_in_one_second_measure_their_own_hops():
    """Half the packets find R1 without IOAM (a route change mid-second): hop 0 is measured for the
    others only, the A -> R2 span for the half without R1; unmeasured says how many."""
    rng = np.random.default_rng(10)
    seq, tx, t1, t2, rx = two_transit_flow(40, BASE_S, rng)
    both = records(FLOW, seq[::2], tx[::2], rx[::2], A, [(R1, t1[::2]), (R2, t2[::2])])
    r2_only = records(FLOW, seq[1::2], tx[1::2], rx[1::2], A, [(R2, t2[1::2])])
    mixed = np.concatenate([both, r2_only])[np.argsort(np.concatenate([seq[::2], seq[1::2]]))]
    agg = aggregator()
    agg.ingest("B", mixed)
    pts = points(close(agg))
    hop0 = of(pts, "inline_hop_delay", hop="0", link="node-1:11->node-7:70")[BASE_S]
    assert hop0["count"] == 20 and hop0["unmeasured"] == 0
    missing = of(pts, "inline_hop_delay", hop="0", link="node-1:11->unknown:unknown")[BASE_S]
    assert missing == {"measured": False, "unmeasured": 20, "newest_ns": int(tx.max()) - TAI_UTC * NS}
    # hop 2 (R2 -> B) is the same hop for both: one point over all 40 packets, in seq order
    hop2 = of(pts, "inline_hop_delay", hop="2")[BASE_S]
    assert_stats(hop2, stats((rx - entry_time_ns(t2)).tolist()))
    assert of(pts, "inline_delay")[BASE_S]["count"] == 40


def test_restart_from_progress_counts_every_seq_once():
    """Worker 1 takes the first part of a flow, evicts some seconds (its progress: final_below_s,
    base_seq) and dies; worker 2 is seeded with that progress and takes everything not final,
    including records of final seconds again (a replay). Per second the last point wins (InfluxDB);
    over the flow every seq is counted once."""
    rng = np.random.default_rng(11)
    n = 500  # 50 per second over 10 s
    tx = BASE_S * NS + np.arange(n, dtype=np.int64) * (NS // 50)
    lost = set(rng.choice(n - 1, 40, replace=False).tolist())
    got = np.array([s for s in range(n) if s not in lost])
    one = aggregator(grace_s=0.5, retention_s=2)
    part = got[got < 330]
    send(one, part, tx[part])
    lines = one.flush(now_tai_ns=int(tx[part[-1]]))
    first_worker = points(lines)
    st = one.flows[("B", FLOW)]
    assert st.final_s > BASE_S  # some seconds are final
    two = aggregator(grace_s=0.5, retention_s=2)
    two.seed_final("B", FLOW, st.final_s, st.base_seq)
    replay = got[got >= (st.final_s - BASE_S - 1) * 50]  # from a message before the final boundary
    send(two, replay, tx[replay])
    second_worker = points(close(two))
    # what both published (the seconds open at the kill that worker 1 had closed) is identical
    both = first_worker.keys() & second_worker.keys()
    assert len(both) >= 2 * 4 and all(first_worker[k] == second_worker[k] for k in both)
    loss = loss_of({**first_worker, **second_worker})
    total = sum(f["received"] + f["lost"] for f in loss.values())
    assert total == int(got.max()) + 1
    assert sum(f["lost"] for f in loss.values()) == len([s for s in lost if s < got.max()])
    assert two.counters.replayed_records_skipped == len(replay[replay < (st.final_s - BASE_S) * 50])


def test_a_reinstalled_monitor_is_no_reordering():
    """The monitor is installed again (an agent restart, a changed intent): its E2E seqs start from 0
    once more, all later than the ones accounted. The processor cannot place them in the flow's
    sequence (not accounted, seqs_not_accounted) until they pass the old ones, then accounts again;
    they arrived in order, so they are no reordering either (they were all counted reordered: below
    the highest seq received before them, the old monitor's)."""
    agg = aggregator(grace_s=0.5, retention_s=2)
    tx = lambda s: BASE_S * NS + s * 100_000_000  # noqa: E731 - 10 per second
    send(agg, range(50), [tx(s) for s in range(50)], now_ns=tx(49))  # seconds 0..4, seqs 0..49
    send(agg, range(70), [tx(80 + s) for s in range(70)], now_ns=tx(149))  # seconds 8..14, seqs 0..69
    got = loss_of(points(close(agg, 60)))
    assert [got[BASE_S + s]["received"] for s in range(5)] == [10] * 5
    for s in range(8, 13):  # seqs 0..49 again: nothing the old accounting can say, and no reordering
        assert {k: got[BASE_S + s][k] for k in ("received", "lost", "reordered")} == {
            "received": 0, "lost": 0, "reordered": 0
        }, (s, got[BASE_S + s])  # fmt: skip
    for s in (13, 14):  # 50..69: past the old ones, accounted again
        assert {k: got[BASE_S + s][k] for k in ("received", "lost", "reordered")} == {
            "received": 10, "lost": 0, "reordered": 0
        }, (s, got[BASE_S + s])  # fmt: skip
    assert agg.counters.seqs_not_accounted == 50


def test_a_new_flow_starts_its_accounting_at_its_first_received_seq():
    agg = aggregator()
    send(agg, [1000, 1001, 1003], [BASE_S * NS + i for i in range(3)])
    assert loss_of(points(close(agg)))[BASE_S]["received"] == 3
    assert loss_of(points(close(agg))) == {}  # nothing new


def test_invalid_records_are_refused_with_their_reason_and_the_rest_counted():
    rng = np.random.default_rng(12)
    seq, tx, t1, t2, rx = two_transit_flow(12, BASE_S, rng)
    r = records(FLOW, seq, tx, rx, A, [(R1, t1), (R2, t2)])
    r["trace_type"][0] = 0xF80000
    r["filled"][1] = 9  # more than the 3 slots
    r["rx_tai_ns"][2] = 0
    r["flow_id"][3] = 0
    r["entries"][4, 0]["ts_sec"] = 0
    r["entries"][5, 1]["ts_subsec"] = 1_000_000
    r["flags"][6] = 0x10
    r["filled"][7] = 0
    r["flags"][8] = ir.IOAM_RECORD_F_TRUNCATED
    r["tx_tai_ns"][9] = (BASE_S + 3600) * NS
    agg = aggregator()
    invalid, touched = agg.ingest("B", r, now_tai_ns=BASE_S * NS)
    assert invalid == {
        "bad_trace_type": 1, "filled_exceeds_slots": 1, "zero_timestamp": 1, "zero_flow_id": 1,
        "zero_entry_timestamp": 1, "bad_subseconds": 1, "unknown_flags": 1, "no_entries": 1,
        "truncated_mismatch": 1, "future_timestamp": 1,
    }  # fmt: skip
    assert touched == {("B", FLOW): BASE_S}
    assert agg.counters.invalid_records == 10 and agg.counters.future_records == 1
    assert of(points(close(agg)), "inline_delay")[BASE_S]["count"] == 2


def test_a_truncated_trace_gives_delay_and_loss_but_no_hops():
    rng = np.random.default_rng(13)
    seq, tx, t1, t2, rx = two_transit_flow(5, BASE_S, rng)
    r = records(FLOW, seq, tx, rx, A, [(R1, t1), (R2, t2)])
    r["filled"] = 14
    r["slots"] = 14
    r["flags"] = ir.IOAM_RECORD_F_TRUNCATED
    ts = r["entries"]["ts_sec"]
    ts[ts == 0] = BASE_S  # the 12 copied entries are filled: the two oldest (the ingress too) are not copied
    agg = aggregator()
    assert agg.ingest("B", r)[0] == {}
    pts = points(close(agg))
    assert of(pts, "inline_delay", ingress="unknown")[BASE_S]["count"] == 5
    assert not of(pts, "inline_hop_delay")
    assert agg.counters.truncated_records == 5


@pytest.mark.parametrize("problem", ir.RECORD_PROBLEMS)
def test_each_problem_alone_in_a_good_batch_is_found(problem):
    """One bad record among good ones (the batch a check's fast path would wave through)."""
    rng = np.random.default_rng(14)
    seq, tx, t1, t2, rx = two_transit_flow(8, BASE_S, rng)
    r = records(FLOW, seq, tx, rx, A, [(R1, t1), (R2, t2)])
    spoil = {
        "zero_flow_id": lambda x: x.__setitem__("flow_id", 0),
        "zero_timestamp": lambda x: x.__setitem__("tx_tai_ns", 0),
        "bad_trace_type": lambda x: x.__setitem__("trace_type", 0xF00001),
        "no_entries": lambda x: x.__setitem__("filled", 0),
        "filled_exceeds_slots": lambda x: x.__setitem__("slots", 2),
        "truncated_mismatch": lambda x: x.__setitem__("flags", ir.IOAM_RECORD_F_TRUNCATED),
        "unknown_flags": lambda x: x.__setitem__("flags", 0x4),
        "zero_entry_timestamp": lambda x: x["entries"][0].__setitem__("ts_sec", 0),
        "bad_subseconds": lambda x: x["entries"][2].__setitem__("ts_subsec", 1_000_000),
    }[problem]
    bad = r[5:6].copy()
    spoil(bad[0])
    r[5] = bad[0]
    assert list(ir.check_records(r)) == [""] * 5 + [problem] + [""] * 2
    invalid, _ = aggregator().ingest("B", r)
    assert invalid == {problem: 1}
