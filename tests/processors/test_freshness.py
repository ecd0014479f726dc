"""segscope-freshness's bookkeeping (processors/freshness.py Tracker): a point is a sample only when
it is newer than what the previous poll saw, its age is taken from the end of what it measured."""

from __future__ import annotations

import pytest

from processors.freshness import Tracker

S, MS = 10**9, 10**6


def series(time_ns: int, **tags) -> dict:
    return {"tags": tags, "values": [[time_ns, 1]]}


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
    assert line.startswith("segscope_freshness,measurement=stamp_delay samples=1i,p50_ms=1500.0,p99_ms=1500.0")
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
