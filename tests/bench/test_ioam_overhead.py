"""bench/ioam_overhead.py: the bookkeeping of the on/off capacity benchmark on fabricated numbers (the
order of the fixed-rate trials, which trials count for the CPU cost, the per-repetition pairs, the check
that every configuration's programs did their work and only theirs), and the smallest real run.

No assertion depends on how fast this machine is: the real run offers at most 24 kpps, far below what
the lab forwards, and what is checked is the harness's bookkeeping.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.ioam_overhead import (
    DUT_CPU,
    HOOK_FLOOR,
    RX_LOADER,
    STRAYS,
    TX_LOADER,
    Config,
    Sample,
    build_configs,
    check_worked,
    cost_order,
    cost_pairs,
    cost_valid,
    section_of,
)
from bench.pdr import PKTGEN, REPO, Trial
from bench.softirq_time import OBJ as SOFTIRQ_OBJ
from tests.isolation import own_name


def trial(sent: int = 1000, received: int = 1000, ingress_drops: int = 0, offered: float = 1000.0) -> Trial:
    return Trial(
        target_pps=1000.0,
        offered_pps=offered,
        seconds=1.0,
        sent=sent,
        received=received,
        data_sent=sent,
        data_received=received,
        ingress_drops=ingress_drops,
    )


def test_cost_order_is_abba_rotated_per_repetition():
    assert cost_order(2, 2, 0) == [0, 1, 1, 0]
    assert cost_order(2, 2, 1) == [1, 0, 0, 1]
    assert cost_order(4, 2, 1) == [1, 2, 3, 0, 0, 3, 2, 1]
    assert cost_order(2, 3, 0) == [0, 1, 1, 0, 0, 1]
    for rep in range(4):  # every configuration the same number of times
        order = cost_order(4, 2, rep)
        assert sorted(order) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_cost_valid_ignores_drops_entering_a_but_not_losses_further_on():
    assert cost_valid(trial())
    assert cost_valid(trial(received=900, ingress_drops=100))  # dropped in the RPS enqueue: cost CPU 1 nothing
    assert cost_valid(trial(received=996))  # 0.4 % lost past the ingress
    assert not cost_valid(trial(received=990))  # 1 % lost after CPU 1 worked on them
    assert not cost_valid(trial(offered=900.0))  # the generator fell short of the rate


def sample(cfg: str, rep: int, ns: int, t: Trial | None = None) -> Sample:
    netrx = [0, 0]
    netrx[DUT_CPU] = ns
    return Sample(cfg, "cost", rep, t or trial(), 1.0, netrx, [0, 0], [0, 0])


def test_cost_pairs_per_repetition_over_the_counting_trials():
    samples = [
        sample("off", 0, 5_000_000),
        sample("on", 0, 6_000_000),
        sample("on", 0, 6_200_000),
        sample("off", 0, 5_200_000),
        # repetition 1: the only "on" trial lost packets past A: no pair
        sample("off", 1, 5_000_000),
        sample("on", 1, 9_000_000, trial(received=900)),
        # repetition 2: one "off" trial does not count, the other does
        sample("off", 2, 9_000_000, trial(received=900)),
        sample("off", 2, 5_500_000),
        sample("on", 2, 6_600_000),
        sample("search-only", 2, 1),
    ]
    pairs, used, dropped = cost_pairs(samples, "off", "on", 3)
    assert used == [1, 3] and dropped == [2]
    assert pairs[0] == pytest.approx((5_100.0, 6_100.0))  # ns per delivered packet over both trials
    assert pairs[1] == pytest.approx((5_500.0, 6_600.0))


def done(**kw) -> dict[str, int]:
    base = dict(seen=0, sampled=0, instrumented=0, skipped=0, rx_seen=0, recorded=0, ringbuf_full=0, rx_bad=0)
    return base | kw


def config(name: str, tx: bool, rx: bool, d: dict[str, int], sent: int = 100_000, delivered: int = 99_000) -> Config:
    return Config(name, tx, rx, data_sent=sent, data_received=delivered, done=d, periods=10)


def test_work_check_accepts_each_configuration_doing_exactly_its_work():
    ok = [
        config("off", False, False, done(rx_seen=3)),  # a few strays at the anchor device
        config("on", True, True, done(seen=99_500, sampled=995, instrumented=995, rx_seen=99_000, recorded=990)),
        config("ioam_tx only", True, False, done(seen=99_500, sampled=995, instrumented=995)),
        config("ioam_rx only", False, True, done(rx_seen=99_000)),
    ]
    for c in ok:
        assert check_worked(c, 100) == [], c.name


@pytest.mark.parametrize(
    "c",
    [
        config("off", False, False, done(seen=10, instrumented=1)),  # ioam_tx was not off
        config("off", False, False, done(rx_seen=5_000)),  # ioam_rx was not off
        config("on", True, True, done(seen=50_000, instrumented=500, rx_seen=99_000, recorded=500)),  # missed some
        config("on", True, True, done(seen=99_500, instrumented=500, rx_seen=99_000, recorded=500)),  # 1 in 200
        config(  # records lost: none of the packets was lost
            "on", True, True, done(seen=99_000, instrumented=990, rx_seen=99_000, recorded=900), sent=99_000
        ),
        config("on", True, True, done(seen=99_500, instrumented=995, rx_seen=99_000, recorded=995, ringbuf_full=1)),
        config("on", True, True, done(seen=99_500, instrumented=995, rx_seen=99_000, recorded=995, skipped=1)),
        config("ioam_tx only", True, False, done(seen=99_500, instrumented=995, rx_seen=99_000)),  # rx not off
        config("ioam_rx only", False, True, done(rx_seen=99_000, recorded=3)),  # recorded without ioam_tx
        config("ioam_rx only", False, True, done()),  # ioam_rx saw nothing
        config("on", True, True, {}),  # never run
    ],
)
def test_work_check_rejects_missing_or_stray_work(c):
    assert check_worked(c, 100), c


def test_the_agents_default_path_is_on_searched_and_recorded_apart():
    """--ingress route_fixed --egress-hook tc: "on" is the fixed-next-hop route program with ioam_rx on
    TC ingress, in the PDR searches, each part alone beside it; its figures go to a section of their
    own, so the TC path's and the route program's sections are never overwritten by it."""
    configs = {c.name: c for c in build_configs(True, "route_fixed", "tc")}
    on = configs["on"]
    assert (on.tx, on.rx, on.search, on.named_only) == ("route_fixed", "tc", True, False)
    run_by_default = {n for n, c in configs.items() if not c.named_only}
    assert run_by_default == {"off", "on", "ioam_lwt fixed next hop only", "ioam_rx on TC only", "ioam_tx only"}
    assert [n for n, c in configs.items() if c.search] == ["off", "on"]
    # the TC path's "on" is unchanged
    assert (lambda c: (c.tx, c.rx))(build_configs(True, "tc")[1]) == ("tc", "xdp")

    def args(ingress, hook, cost_only):
        return type("A", (), {"ingress": ingress, "egress_hook": hook, "cost_only": cost_only})

    sections = {
        (i, h, c): section_of(args(i, h, c), "ioam_overhead_cost" if c else "ioam_overhead")
        for i in ("tc", "route", "route_fixed")
        for h in ("xdp", "tc")
        for c in (False, True)
    }
    assert sections[("tc", "xdp", False)] == "ioam_overhead" and sections[("tc", "xdp", True)] == "ioam_overhead_cost"
    assert sections[("route", "xdp", True)] == "ioam_overhead_route"
    assert sections[("route_fixed", "tc", False)] == "ioam_overhead_route_fixed_tc"
    assert len(set(sections.values())) == len(sections), "every run writes its own section"


def test_smallest_run_produces_sane_numbers(tmp_path):
    """3 repetitions of 3-trial searches and 0.3 s fixed-rate trials in a low range, no doc update."""
    for f in (PKTGEN, TX_LOADER, RX_LOADER, SOFTIRQ_OBJ, HOOK_FLOOR):
        if not f.exists():
            pytest.fail(f"{f.relative_to(REPO)} missing: run `make build`")
    out = tmp_path / "ioam.json"
    args = ["--prefix", own_name("iobtest"), "--reps", "3", "--steps", "3", "--seconds", "0.3"]
    args += ["--lo", "4000", "--hi", "24000"]
    args += ["--cost-rate", "8000", "--cost-seconds", "0.3", "--no-doc", "--json-out", str(out)]
    args += ["--ingress", "tc"]  # TC and its decomposition (empty hooks); the route program: test_ioam_lwt.py
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "ioam_overhead.py"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["problems"] == []
    assert set(result) >= {"off", "on", "ioam_tx only", "ioam_rx only", "empty hooks", "samples"}
    assert len(result["off"]["pdrs"]) == len(result["on"]["pdrs"]) == 3
    assert result["ioam_tx only"]["pdrs"] == []  # fixed-rate trials only
    cost = [s for s in result["samples"] if s["phase"] == "cost"]
    assert len(cost) == 3 * 5 * 2  # repetitions x configurations x trials each
    # the hook floor ran with the hooks taken and neither program on them
    assert result["empty hooks"]["periods"] >= 3 and result["empty hooks"]["done"]["seen"] == 0
    assert result["empty hooks"]["done"]["rx_seen"] <= STRAYS
    assert all(s["netrx_ns"][DUT_CPU] > 0 for s in cost if s["data_received"])  # the softirq clock ran
    on = result["on"]["done"]
    assert on["instrumented"] > 0 and on["recorded"] > 0
    assert result["off"]["done"]["seen"] == 0 and result["off"]["done"]["instrumented"] == 0
    assert "| CPU 1 NET_RX time per forwarded packet at 8 kpps, off / on |" in proc.stdout
    assert "PASTRAMI verdict for this run" in proc.stdout
