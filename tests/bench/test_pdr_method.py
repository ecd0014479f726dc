"""The PDR@0.5 % method of bench/pdr.py: statistics, search and PASTRAMI check on known inputs, and one
search against a deterministic nftables rate limiter in a real netlab lab (a known capacity).

No assertion depends on how fast this machine is: the real test offers at most 16 kpps against a
limiter of 8 kpps, far below what the lab forwards (> 100 kpps measured).
"""

from __future__ import annotations

import json
import math
import subprocess

import pytest

from bench.pdr import (
    PKTGEN,
    Line5Bench,
    PathSpec,
    Trial,
    bootstrap_ratio_ci95,
    ci95,
    find_pdr,
    find_pdr_lockstep,
    pastrami_check,
    ratio_ci95,
    sweep_points,
    t975,
)
from tests.isolation import own_name, wait_until_alone

# ---------------------------------------------------------------- statistics


def test_t975_table_values_and_conservative_lookup():
    assert t975(1) == pytest.approx(12.706)
    assert t975(9) == pytest.approx(2.262)
    assert t975(35) == pytest.approx(2.042)  # between tabulated df 30 and 40: the larger value
    assert t975(1000) == pytest.approx(1.960)
    with pytest.raises(ValueError):
        t975(0)


def test_ci95_on_fixed_numbers():
    c = ci95([10.0, 12.0, 14.0])  # mean 12, s = 2, t(2) = 4.303
    assert c.mean == pytest.approx(12.0)
    assert c.stdev == pytest.approx(2.0)
    assert c.half_width == pytest.approx(4.303 * 2 / math.sqrt(3))
    assert (c.low, c.high) == pytest.approx((12 - c.half_width, 12 + c.half_width))
    assert c.rel_upper == pytest.approx(c.half_width / 12)
    same = ci95([5.0, 5.0, 5.0, 5.0])
    assert same.half_width == 0 and same.low == same.high == 5.0
    assert math.isnan(ci95([7.0]).half_width)  # one sample: no interval, not a fake zero


# ---------------------------------------------------------------- search on a synthetic DUT


def synthetic(capacity: float, generator_max: float = 1e9, low_load_loss: float = 0.0):
    """An ideal DUT of the given capacity: delivers min(O, capacity), minus a constant loss share."""

    def trial(rate: float) -> Trial:
        offered = min(rate, generator_max)
        sent = round(offered)
        received = round(min(offered, capacity) * (1 - low_load_loss))
        return Trial(target_pps=rate, offered_pps=offered, seconds=1.0, sent=sent, received=received)

    return trial


def test_search_converges_to_known_capacity():
    capacity = 73_000.0  # PDR@0.5 % of this ideal DUT: capacity / 0.995
    res = find_pdr(synthetic(capacity), lo=10_000, hi=200_000, steps=12)
    true_pdr = capacity / 0.995
    resolution = (200_000 - 10_000) / 2**10
    assert true_pdr - resolution <= res.pdr_pps <= true_pdr
    assert len(res.trials) == 12
    assert not res.at_upper_bound and not res.below_lower_bound and not res.generator_bound
    assert res.loss_failures > 0


def test_search_reports_bounds():
    assert find_pdr(synthetic(5_000), lo=10_000, hi=20_000, steps=4).below_lower_bound
    top = find_pdr(synthetic(1e6), lo=10_000, hi=20_000, steps=4)
    assert top.at_upper_bound and top.pdr_pps == 20_000 and len(top.trials) == 2


def test_generator_short_of_the_rate_fails_the_trial_and_marks_the_search():
    res = find_pdr(synthetic(capacity=1e6, generator_max=50_000), lo=10_000, hi=200_000, steps=10)
    assert res.pdr_pps <= 50_000 / 0.99 and res.pdr_pps > 40_000
    assert res.generator_bound and res.loss_failures == 0


def test_search_rejects_bad_ranges():
    with pytest.raises(ValueError):
        find_pdr(synthetic(1), lo=10, hi=5)
    with pytest.raises(ValueError):
        find_pdr(synthetic(1), lo=1, hi=5, steps=1)


# ---------------------------------------------------------------- PASTRAMI check


def test_pastrami_good_on_ideal_saturation():
    pts = [(o, min(o, 100_000.0)) for o in (60_000, 90_000, 100_000, 110_000, 125_000, 150_000)]
    v = pastrami_check(pts)
    assert v.verdict == "GOOD"
    assert v.potential_index == 3  # 110k: first PLR > 0.5 %
    assert all(t == pytest.approx(0.0) for t in v.tirs)


def test_pastrami_bad_when_loss_grows_slowly():
    # Unstable series (PASTRAMI Fig. 6b): 1 % loss already at low load, throughput keeps rising
    # with the load, so PDR@0.5 % does not mark saturation.
    pts = [(o, o * (1 - 0.01 - 0.02 * o / 150_000)) for o in (60_000, 90_000, 100_000, 110_000, 125_000, 150_000)]
    v = pastrami_check(pts)
    assert v.verdict == "BAD"
    assert v.potential_index == 0
    assert v.max_plr_below == 0.0
    assert v.tirs[0] > 0.1


def test_pastrami_bad_when_throughput_recovers_after_the_potential_point():
    pts = [(50_000, 50_000), (60_000, 59_000), (70_000, 69_800), (80_000, 79_900)]
    v = pastrami_check(pts)  # one loss burst at 60k, then clean again
    assert v.verdict == "BAD" and v.potential_index == 1


def test_pastrami_no_saturation_and_input_order():
    assert pastrami_check([(1e4, 1e4), (2e4, 2e4), (3e4, 3e4)]).verdict == "NO_SATURATION"
    assert pastrami_check([(1e4, 1e4), (2e4, 1e4)]).verdict == "NO_SATURATION"  # nothing after the point
    shuffled = [(150_000, 100_000), (60_000, 60_000), (110_000, 100_000), (125_000, 100_000)]
    assert pastrami_check(shuffled).verdict == "GOOD"
    with pytest.raises(ValueError):
        pastrami_check([(1.0, 1.0)])


# ---------------------------------------------------------------- real lab, known capacity

LIMIT_PPS = 8_000
# The limiter's bucket: large enough that the generator's pacing jitter on a loaded 2-core VM
# (batches sent late, then back to back) is not mistaken for overload — burst 40 made the search
# fail at 7.2 kpps in a loaded CI-like run — and small against a trial's packets.
LIMIT_BURST = 400
TRIAL_S = 0.5


@pytest.fixture(scope="module")
def bench():
    if not PKTGEN.exists():
        pytest.fail("build/bench/pktgen_udp missing: run `make -C bench`")
    b = Line5Bench(own_name("pdtest"), dut="xdp", spec=PathSpec())
    b.up()
    try:
        # A deterministic rate limiter on R (after A's encap and R's End, daddr is B's End.DT6 SID):
        # above LIMIT_PPS every packet is dropped and counted.
        _nft(b)
        # prepared beside the last parallel groups; the searches run alone, the builds stopped
        wait_until_alone(builds_stopped=True)
        yield b
    finally:
        b.down()


def _nft(b: Line5Bench) -> None:
    rules = f"""table inet pdtest {{
  chain fwd_limit {{
    type filter hook forward priority 0; policy accept;
    ip6 daddr fc00:3::d6 limit rate over {LIMIT_PPS}/second burst {LIMIT_BURST} packets counter drop
  }}
}}
"""
    subprocess.run(["ip", "netns", "exec", b.lab.ns("R"), "nft", "-f", "-"], input=rules, text=True, check=True)


def limiter_drops(b: Line5Bench) -> int:
    out = subprocess.run(
        ["ip", "netns", "exec", b.lab.ns("R"), "nft", "-j", "list", "table", "inet", "pdtest"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for item in json.loads(out)["nftables"]:
        for expr in item.get("rule", {}).get("expr", []):
            if "counter" in expr:
                return expr["counter"]["packets"]
    raise AssertionError("limiter counter not found")


def test_every_packet_is_delivered_or_counted_by_the_limiter(bench):
    before, refl_before = limiter_drops(bench), bench.reflector_stats()
    t = bench.trial(2 * LIMIT_PPS, share=0.01, seconds=0.5)
    dropped = limiter_drops(bench) - before
    refl = bench.reflector_stats()
    # the generator's STAMP frames (SRH, checksum computed by pktgen_udp) are valid test packets for the XDP reflector
    assert refl["reflected"] - refl_before["reflected"] == t.stamp_sent
    assert refl["drop_malformed_udp_csum"] == refl_before["drop_malformed_udp_csum"]
    assert t.sent == round(2 * LIMIT_PPS * 0.5) and t.stamp_sent == t.sent // 100
    # STAMP is reflected by A, before R's limiter (a stray frame the namespaces emit may be counted too)
    assert t.stamp_sent <= t.stamp_received <= t.stamp_sent + 3
    assert dropped > 0.3 * t.sent  # ~ half of the data packets are over the limit
    # Exact accounting; a few stray frames (ICMPv6 the namespaces emit) may reach the XDP counters.
    assert 0 <= t.received + dropped - t.sent <= 5


def test_search_finds_the_limiter_rate(bench):
    for _attempt in range(2):
        before = limiter_drops(bench)
        res = find_pdr(lambda r: bench.trial(r, share=0.01, seconds=TRIAL_S), lo=2_000, hi=16_000, steps=6)
        # A search that fails already at 2 000 pps (a quarter of the limit) while the limiter
        # dropped nothing lost its packets to the shared VM (a veth backlog burst), not to the
        # device under test: search once more. Anything else is judged as measured.
        if not (res.below_lower_bound and limiter_drops(bench) == before):
            break
    resolution = (16_000 - 2_000) / 2**4
    # The limiter passes LIMIT_PPS plus its burst per trial; 1 % STAMP is reflected before it and
    # 0.5 % loss is allowed, so the highest passing rate r satisfies
    # 0.99 r T - (LIMIT T + BURST) <= 0.005 r T  ->  r <= (LIMIT T + BURST) / (0.985 T).
    true_pdr = (LIMIT_PPS * TRIAL_S + LIMIT_BURST) / (0.985 * TRIAL_S)
    assert LIMIT_PPS - resolution - 200 <= res.pdr_pps <= true_pdr + resolution
    assert res.loss_failures > 0 and not res.generator_bound
    v = pastrami_check([(t.offered_pps, t.throughput_pps) for t in res.trials])
    assert v.potential_index is not None  # the search's own points do cross 0.5 % loss


def test_sweep_points_average_repetitions_per_load():
    def trial(rate: float, thr: float) -> Trial:
        return Trial(target_pps=rate, offered_pps=rate, seconds=1.0, sent=int(rate), received=int(thr))

    pts = sweep_points([trial(2e4, 2e4), trial(1e4, 1e4), trial(2e4, 1.8e4), trial(1e4, 0.9e4)])
    assert pts == [(1e4, 0.95e4), (2e4, 1.9e4)]


def test_socket_generator_sends_stamp_with_srh_that_the_reflector_answers(bench):
    bench.spec.generator = "socket"  # UDP sockets; the kernel builds the SRH (IPV6_RTHDR)
    try:
        refl_before = bench.reflector_stats()
        t = bench.trial(2_000, share=0.1, seconds=0.5)
    finally:
        bench.spec.generator = "packet"
    assert (t.sent, t.stamp_sent) == (1000, 100)
    assert bench.reflector_stats()["reflected"] - refl_before["reflected"] == 100
    assert t.stamp_sent <= t.stamp_received <= t.stamp_sent + 3
    assert t.data_sent <= t.data_received <= t.data_sent + 3  # under the limiter: all delivered


# ---------------------------------------------------------------- paired comparisons


def test_ratio_ci95_is_the_geometric_mean_with_t_on_the_logs():
    gm, lo, hi = ratio_ci95([0.5, 2.0])  # logs -l, +l: mean 0
    assert gm == pytest.approx(1.0)
    half = t975(1) * math.log(2) * math.sqrt(2) / math.sqrt(2)  # s of (-l, l) = l * sqrt(2)
    assert (lo, hi) == pytest.approx((math.exp(-half), math.exp(half)))
    assert ratio_ci95([0.9, 0.9, 0.9]) == pytest.approx((0.9, 0.9, 0.9))
    with pytest.raises(ValueError):
        ratio_ci95([1.0, 0.0])


def test_bootstrap_ratio_ci95_point_interval_and_seed():
    num, den = [90.0, 100.0, 95.0, 85.0], [100.0, 100.0, 100.0, 100.0]
    point, lo, hi = bootstrap_ratio_ci95(num, den)
    assert point == pytest.approx(sum(num) / sum(den))
    assert 0.85 <= lo <= point <= hi <= 1.0
    assert bootstrap_ratio_ci95(num, den) == (point, lo, hi)  # fixed seed: reproducible
    assert bootstrap_ratio_ci95([2.0, 4.0], [1.0, 2.0]) == pytest.approx((2.0, 2.0, 2.0))  # constant ratio
    with pytest.raises(ValueError):
        bootstrap_ratio_ci95([1.0], [1.0])


def test_lockstep_searches_find_each_pdr_and_alternate_the_order():
    calls: list[int] = []

    def tagged(i: int, capacity: float):
        dut = synthetic(capacity)

        def trial(rate: float) -> Trial:
            calls.append(i)
            return dut(rate)

        return trial

    a, b = find_pdr_lockstep([tagged(0, 73_000), tagged(1, 61_000)], lo=10_000, hi=200_000, steps=12)
    assert a.pdr_pps == find_pdr(synthetic(73_000), 10_000, 200_000, 12).pdr_pps
    assert b.pdr_pps == find_pdr(synthetic(61_000), 10_000, 200_000, 12).pdr_pps
    assert len(a.trials) == len(b.trials) == 12
    assert calls[:6] == [0, 1, 1, 0, 0, 1]  # A B | B A | A B: one switch per step
    calls.clear()
    find_pdr_lockstep([tagged(0, 73_000), tagged(1, 61_000)], lo=10_000, hi=200_000, steps=4, first=1)
    assert calls == [1, 0, 0, 1, 1, 0, 0, 1]


def test_lockstep_search_that_ends_early_leaves_the_other_going():
    low, top, mid = find_pdr_lockstep(
        [synthetic(5_000), synthetic(1e6), synthetic(50_000)], lo=10_000, hi=100_000, steps=6
    )
    assert low.below_lower_bound and len(low.trials) == 1
    assert top.at_upper_bound and top.pdr_pps == 100_000 and len(top.trials) == 2
    assert not mid.at_upper_bound and 40_000 < mid.pdr_pps <= 50_000 / 0.995 and len(mid.trials) == 6
