"""The alternate-marking test's ground truth, checked on its own (no segscope datapath loaded).

tests/e2e/test_altmark_loss.py judges segscope's loss numbers against nftables counters on R;
this module checks those counters first: every packet H1 sends is either delivered to H2 or
counted by exactly one drop rule on R (or by a counter of a place that lost it on the way),
drops happen at the configured rates, the colour match reads the L bit of the outer Traffic
Class (without marking, the inner Traffic Class the seg6 encap copies into the outer header),
the per-block snapshots add up, and the committed topology is the generated one.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

import pytest

from netlab import Lab, teardown
from tests.groundtruth import altmark_lab as al
from tests.groundtruth.altmark_flows import FLOWS, topology_yaml
from tests.isolation import own_name

REPO = Path(__file__).resolve().parents[2]
TOPOLOGY = REPO / "netlab" / "topologies" / "line5_flows.yaml"
PREFIX = own_name("amlab_gt")
RATE_PPS, SECONDS = 300, 4
PERIOD_NS, MARGIN_NS = 1_000_000_000, 500_000_000

pytestmark = [pytest.mark.datapath]


def test_committed_topology_is_generated():
    assert TOPOLOGY.read_text() == topology_yaml(), (
        "regenerate: .local/venv/bin/python -m tests.groundtruth.altmark_flows > netlab/topologies/line5_flows.yaml"
    )


def test_flow_table_is_what_the_issue_asks():
    monitored = [f for f in FLOWS if f.has_rx]
    assert len({f.sids for f in FLOWS}) == len(FLOWS)  # every flow its own SID list
    assert len({f.first_sid for f in FLOWS}) == len(FLOWS)  # nft tells them apart by it
    for method in ("dscp", "rfc9343"):
        mine = [f for f in monitored if f.method == method]
        assert len(mine) >= 12
        assert sorted({f.loss_pct for f in mine}) == [0.0, 0.1, 1.0, 10.0]


def test_nft_offsets_follow_the_datapath_contract():
    """The raw offsets nft reads are the ones datapath/altmark.h writes (a changed layout there
    must fail here, not silently turn the ground truth into nonsense)."""
    header = (REPO / "datapath" / "altmark.h").read_text()

    def define(name: str) -> int:
        m = re.search(rf"#define\s+{name}\s+(0x[0-9a-fA-F]+|\d+)", header)
        assert m, name
        return int(m.group(1), 0)

    data_bits = 40 * 8 + 32  # option data after IPv6 (40) + DOH head (4)
    assert define("ALTMARK_DOH_LEN") == 8 and define("ALTMARK_OPT_TYPE") == 0x12
    assert al.DOH_OPT_TYPE_BITS == 40 * 8 + 16
    assert al.DOH_FLOWMON_BITS == data_bits and define("ALTMARK_OPT_FLOWMON_SHIFT") == 12  # 20 bits on top
    assert al.DOH_L_BITS == data_bits + 31 - define("ALTMARK_OPT_L_FLAG").bit_length() + 1
    # dscp: DSCP bit b is Traffic Class bit b + 2; TC starts 4 bits into the header
    l_bit = define("ALTMARK_DSCP_L_BIT_DEFAULT")
    assert al.DSCP_L_BITS == 4 + (7 - (l_bit + 2))


@pytest.fixture(scope="module")
def gt_run(bpffs):
    al.ensure_tools()
    teardown(PREFIX)
    lab = Lab.up(TOPOLOGY, prefix=PREFIX)
    try:
        flowmon = {f.name: 0x1000 + i for i, f in enumerate(FLOWS)}
        truth = al.GroundTruth(lab, FLOWS, flowmon)
        truth.install()
        snaps = al.BlockSnapshots(truth, PERIOD_NS, MARGIN_NS)
        snaps.start()
        drops0 = al.path_drops(lab)
        traffic = al.Traffic(lab, FLOWS, RATE_PPS, SECONDS)
        traffic.start()
        sent = traffic.wait()
        time.sleep(0.3)  # the last packets reach H2
        r, h2 = truth.r_counters(), truth.h2_counters()
        other = al.drops_between(drops0, al.path_drops(lab))
        # two more snapshots, so the last block with traffic is closed for both colours
        time.sleep(2 * PERIOD_NS / 1e9)
        snaps.stop()
        yield {"sent": sent, "r": r, "h2": h2, "other": other, "snaps": snaps}
    finally:
        lab.down()


def _dropped(r: dict[str, int], name: str) -> int:
    return r[f"{name} drop 0"] + r[f"{name} drop 1"]


def test_every_packet_is_delivered_or_counted(gt_run):
    sent, r, h2, other = gt_run["sent"], gt_run["r"], gt_run["h2"], gt_run["other"]
    assert sent["send_errors"] == 0
    names = [f.name for f in FLOWS] + [al.UNMON]
    assert all(sent["per_flow"][n] == RATE_PPS * SECONDS for n in names)
    unexplained = {n: sent["per_flow"][n] - h2[f"{n} rx"] - (_dropped(r, n) if n != al.UNMON else 0) for n in names}
    print("\nnft dropped:", {f.name: _dropped(r, f.name) for f in FLOWS}, "\nlost elsewhere:", other)
    # exact per flow when nothing else lost a packet; otherwise what is missing is at most what
    # the kernel counted as dropped on the path (which also counts packets that are not ours)
    assert all(v >= 0 for v in unexplained.values()), unexplained
    assert sum(unexplained.values()) <= sum(other.values()), (unexplained, other)
    if sum(other.values()) == 0:
        assert all(v == 0 for v in unexplained.values()), unexplained


def test_drop_rates_are_the_configured_ones(gt_run):
    r = gt_run["r"]
    for f in FLOWS:
        if f.method != "dscp":
            continue  # unmarked rfc9343 packets carry no option: never dropped (below)
        n = RATE_PPS * SECONDS
        d = _dropped(r, f.name)
        if f.loss_pct == 0:
            assert d == 0, f.name
        else:
            p = f.loss_pct / 100
            assert abs(d - n * p) <= 5 * math.sqrt(n * p * (1 - p)) + 1, (f.name, d, n * p)


def test_colour_match_reads_the_outer_l_bit(gt_run):
    """No marking: the outer Traffic Class is the inner one, so every packet of a dscp flow has
    the colour of its inner TC bit 0x04; rfc9343 flows carry no option and are never dropped."""
    r = gt_run["r"]
    for f in FLOWS:
        if f.method == "dscp":
            c = (f.tclass >> 2) & 1
            assert r[f"{f.name} seen {c}"] > 0 and r[f"{f.name} seen {1 - c}"] == 0, f.name
        else:
            assert r[f"{f.name} seen 0"] == r[f"{f.name} seen 1"] == 0, f.name
            assert r[f"{f.name} nodoh"] > 0, f.name
            if not any(gt_run["other"].values()):
                assert r[f"{f.name} nodoh"] == gt_run["h2"][f"{f.name} rx"], f.name
            assert _dropped(r, f.name) == 0
    assert r[f"{al.UNMON} tc_changed"] == 0 and r[f"{al.UNMON} doh"] == 0


def test_h2_sees_inner_packets_unchanged(gt_run):
    h2 = gt_run["h2"]
    for n in [f.name for f in FLOWS] + [al.UNMON]:
        assert h2[f"{n} rx"] > 0 and h2[f"{n} tc_changed"] == 0 and h2[f"{n} not_udp"] == 0, n


def test_block_snapshots_add_up(gt_run):
    """Per-block deltas of each colour sum to the counters' growth between the snapshots."""
    snaps = gt_run["snaps"]
    assert snaps.error is None
    blocks = sorted(snaps.snaps)
    assert len(blocks) >= SECONDS + 2 and blocks == list(range(blocks[0], blocks[-1] + 1)), blocks
    assert max(snaps.read_lateness_ms) < PERIOD_NS / 2e6
    for f in FLOWS:
        if f.method != "dscp":
            continue
        per_block = snaps.per_block(f.name)
        for key, k2 in (("seen", "seen"), ("dropped", "drop")):
            for c in (0, 1):
                mine = [k for k in blocks if k & 1 == c]  # snapshots of colour c's blocks
                total = sum(v[key] for k, v in per_block.items() if k & 1 == c)
                grown = snaps.snaps[mine[-1]][f"{f.name} {k2} {c}"] - snaps.snaps[mine[0]][f"{f.name} {k2} {c}"]
                assert total == grown, (f.name, key, c)
        # traffic sits only in blocks of the flow's colour (no marking)
        c = (f.tclass >> 2) & 1
        assert all(v["seen"] == 0 for k, v in per_block.items() if k & 1 != c), f.name
