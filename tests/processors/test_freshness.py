"""segscope-freshness's bookkeeping (processors/freshness.py Tracker): a point is a sample only when
it is newer than what the previous poll saw; its packet-to-InfluxDB delay is taken from its
newest_ns field, or, for points without it, from the end of what it measured."""

from __future__ import annotations

import pytest

from processors.freshness import Tracker

S, MS = 10**9, 10**6


def series(time_ns: int, newest_ns: int | None = None, **tags) -> dict:
    """One series as influxql.series returns it for SELECT last(..), "newest_ns"."""
    return {"tags": tags, "values": [[time_ns, 1, newest_ns]]}


def test_first_poll_sets_the_baseline_then_new_points_are_samples():
    t = Tracker()
    base = 1_800_000_000 * S
    assert t.observe("stamp_delay", [series(base, node="A", ssid="1")], base + 5 * S, first_poll=True) == 0
    # the same point again: not new
    assert t.observe("stamp_delay", [series(base, node="A", ssid="1")], base + 6 * S) == 0
    # the next second appears at +3.5 s: it ended at +2 s (its time + 1 s) -> 1500 ms old
    assert t.observe("stamp_delay", [series(base + 1 * S, node="A", ssid="1")], base + 3500 * MS) == 1
    # an older point showing up late (re-emitted second) is not a sample
    assert t.observe("stamp_delay", [series(base, node="A", ssid="1")], base + 4 * S) == 0
    (line,) = t.report_lines(base + 10 * S)
    assert line.startswith(
        "segscope_freshness,measurement=stamp_delay samples=1i,estimated=1i,p50_ms=1500.0,p99_ms=1500.0"
    )
    assert t.report_lines(base + 20 * S) == []  # samples reset after each report


def test_a_series_seen_after_the_first_poll_counts_and_blocks_end_after_their_period():
    t = Tracker()
    base = 1_800_000_000 * S
    t.observe("altmark_loss", [], base, first_poll=True)
    # a flow that starts later: its first block (period 1000 ms) seen 1.8 s after it ended
    assert t.observe("altmark_loss", [series(base, flow="7", period_ms="1000")], base + 2800 * MS) == 1
    assert t.samples["altmark_loss"] == [pytest.approx(1800.0)]


def test_percentiles_over_many_series():
    t = Tracker()
    base = 1_800_000_000 * S
    keys = [str(i) for i in range(100)]
    t.observe("stamp_delay", [series(base, ssid=k) for k in keys], base, first_poll=True)
    # each series' next point becomes visible i ms later than the previous one
    for i, k in enumerate(keys):
        t.observe("stamp_delay", [series(base + S, ssid=k)], base + 2 * S + i * MS)
    (line,) = t.report_lines(base)
    fields = dict(kv.split("=") for kv in line.split(" ")[1].split(","))
    assert fields["samples"] == "100i" and float(fields["p50_ms"]) == pytest.approx(49.5)
    assert float(fields["max_ms"]) == 99.0


def test_newest_ns_gives_the_delay_and_points_without_it_are_estimated_and_counted():
    t = Tracker()
    base = 1_800_000_000 * S
    t.observe("stamp_delay", [series(base, node="A", ssid="1"), series(base, node="B", ssid="1")], base, True)
    # A's next second: its newest packet (T1) was at +1.95 s, visible at +3.2 s -> 1250 ms
    # B's next second (old data, no newest_ns): estimated from the second's end (+2 s) -> 1200 ms
    new = [series(base + S, base + 1950 * MS, node="A", ssid="1"), series(base + S, node="B", ssid="1")]
    assert t.observe("stamp_delay", new, base + 3200 * MS) == 2
    assert sorted(t.samples["stamp_delay"]) == [pytest.approx(1200.0), pytest.approx(1250.0)]
    # a loss block: newest_ns is the block end, the same rule
    t.observe("altmark_loss", [], base, first_poll=True)
    t.observe("altmark_loss", [series(base, base + 500 * MS, flow="7", period_ms="500")], base + 2900 * MS)
    lines = t.report_lines(base + 10 * S)
    fields = {ln.split(" ")[0]: dict(kv.split("=") for kv in ln.split(" ")[1].split(",")) for ln in lines}
    assert fields["segscope_freshness,measurement=stamp_delay"]["estimated"] == "1i"
    assert fields["segscope_freshness,measurement=stamp_delay"]["max_ms"] == "1250.0"
    assert fields["segscope_freshness,measurement=altmark_loss"] == {
        "samples": "1i",
        "estimated": "0i",
        "p50_ms": "2400.0",
        "p99_ms": "2400.0",
        "max_ms": "2400.0",
    }
    # the next report starts from zero
    t.observe("stamp_delay", [series(base + 2 * S, base + 2900 * MS, node="A", ssid="1")], base + 3 * S)
    (line,) = t.report_lines(base + 20 * S)
    assert "samples=1i,estimated=0i,p50_ms=100.0" in line
