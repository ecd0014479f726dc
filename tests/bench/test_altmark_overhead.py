"""bench/altmark_overhead.py: the harness on its smallest configuration produces sane numbers, and the
filler flows it writes straight into the maps are flows the loader itself reads back.

No assertion depends on how fast this machine is (no timing assertion): the searches run far below
what the lab forwards, and what is checked is the harness's bookkeeping (every configuration searched
and swept, PDRs inside the search range, the programs coloured/counted the data packets, each on the
flows the traffic was sent to).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from bench.altmark_overhead import (
    RX_LOADER,
    SPREAD,
    TX_LOADER,
    Config,
    ProgramSet,
    check_monitored,
    flow_id,
    flow_sids,
    sidlist_key,
)
from bench.pdr import PKTGEN, REPO, Line5Bench, PathSpec
from tests.isolation import own_name

LO, HI = 4_000.0, 24_000.0


def _need_tools() -> None:
    for f in (PKTGEN, TX_LOADER, RX_LOADER):
        if not f.exists():
            pytest.fail(f"{f.relative_to(REPO)} missing: run `make -C datapath` and `make -C bench`")


def test_sidlist_key_layout_is_the_srh_wire_order():
    key = sidlist_key(["fc00:2::e", "fc00:3::d600"])  # travel order, as `encap seg6 segs`
    assert len(key) == 8 + 16 * 6  # struct altmark_sidlist_key (datapath/altmark.h)
    assert key[:8] == (2).to_bytes(4, "little") + bytes(4)  # nsids, pad
    assert key[8:24].hex() == "fc00000300000000000000000000d600"  # sids[0] = final segment
    assert key[24:40].hex() == "fc00000200000000000000000000000e"
    assert key[40:] == bytes(16 * 4)  # unused SIDs are zero


class _Prog:
    """Stand-in for a ProgramSet in the monitoring check (it only reads .kind)."""

    def __init__(self, kind: str):
        self.kind = kind


def test_monitoring_check_rejects_unmarked_or_unspread_traffic():
    ok = Config(
        "tx+rx N=100",
        dsts=SPREAD,
        tx=_Prog("tx"),
        rx=_Prog("rx"),
        data_sent=1000,  # type: ignore[arg-type]
        data_received=990,
        marked={"tx": 995, "rx": 990},
        flow_packets={"tx": [124] * SPREAD, "rx": [123] * SPREAD},
    )
    assert check_monitored(ok) == []
    silent = Config(
        "tx N=1",
        dsts=1,
        tx=_Prog("tx"),
        data_sent=1000,
        data_received=990,  # type: ignore[arg-type]
        marked={"tx": 0},
        flow_packets={"tx": [0]},
    )
    problems = check_monitored(silent)
    assert len(problems) == 2 and "marked 0 packets" in problems[0]
    unspread = Config(
        "tx N=100",
        dsts=SPREAD,
        tx=_Prog("tx"),
        data_sent=1000,  # type: ignore[arg-type]
        data_received=990,
        marked={"tx": 990},
        flow_packets={"tx": [990] + [0] * (SPREAD - 1)},
    )
    assert [p for p in check_monitored(unspread) if "not every one" in p]
    too_many = Config(
        "tx N=1",
        dsts=1,
        tx=_Prog("tx"),
        data_sent=1000,
        data_received=990,  # type: ignore[arg-type]
        marked={"tx": 1500},
        flow_packets={"tx": [1500]},
    )
    assert check_monitored(too_many)  # more marked than sent: counted something else


def test_smallest_run_produces_sane_numbers(tmp_path):
    """1 flow, 2 repetitions of 3-trial searches in a fixed low range, no doc update."""
    _need_tools()
    out = tmp_path / "altmark.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "altmark_overhead.py"),
            "--prefix",
            own_name("ambtest"),
            "--flows",
            "1",
            "--reps",
            "2",
            "--steps",
            "3",
            "--seconds",
            "0.3",
            "--lo",
            str(LO),
            "--hi",
            str(HI),
            "--no-doc",
            "--json-out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["problems"] == []
    configs = result["configs"]
    assert set(configs) == {"base K=1", "tx N=1", "tx+rx N=1"}
    for name, c in configs.items():
        assert len(c["pdrs"]) == 2 and len(c["search_trials"]) == 2
        for trials, pdr in zip(c["search_trials"], c["pdrs"]):
            # lo failed: PDR 0 after 1 trial; hi passed: PDR = hi after 2; else 3 trials, PDR a passing rate
            assert (len(trials), pdr == 0, pdr == HI) in {(1, True, False), (2, False, True), (3, False, False)}, (
                name,
                pdr,
                trials,
            )
            assert pdr == 0 or pdr in [t["target_pps"] for t in trials if t["passed"]]
            assert pdr == 0 or LO <= pdr <= HI
        ci = c["ci95"]
        assert ci["n"] == 2 and math.isclose(ci["mean"], sum(c["pdrs"]) / 2)
        assert c["pastrami"]["verdict"] in {"GOOD", "BAD", "NO_SATURATION"}
        assert len(c["sweep"]) == 6 or max(c["pdrs"]) == 0
        for t in c["sweep"]:
            assert 0 <= t["data_received"] <= t["data_sent"] + 5  # a few strays may reach H2's counter
        assert c["data_received"] <= c["data_sent"] + 50
    # the programs really saw the traffic: every delivered data packet was coloured at A and counted at B
    tx, txrx = configs["tx N=1"], configs["tx+rx N=1"]
    assert "tx" in tx["marked"] and "rx" not in tx["marked"]
    assert tx["data_received"] <= tx["marked"]["tx"] <= tx["data_sent"]
    assert txrx["data_received"] <= txrx["marked"]["rx"] <= txrx["marked"]["tx"] <= txrx["data_sent"]
    assert tx["flow_packets"]["tx"][0] >= tx["marked"]["tx"] + txrx["marked"]["tx"]  # one instance, both configs
    assert txrx["flow_packets"]["rx"][0] >= txrx["marked"]["rx"]
    assert configs["base K=1"]["marked"] == {}
    # the programs' own per-packet time (BPF_PROG_TEST_RUN) is reported for both instances
    costs = result["program_cost_ns"]
    assert set(costs) == {f"{own_name('ambtest')}-A-n1/tx", f"{own_name('ambtest')}-B-n1/rx"} and all(
        0 < v < 100_000 for v in costs.values()
    )
    report = proc.stdout
    assert "| tx N=1 / base K=1 |" in report and "| tx+rx N=1 / tx N=1 |" in report
    assert "PASTRAMI verdict for this run" in report


def test_filler_flows_written_to_the_maps_are_read_back_by_the_loader():
    """10 flows: 8 through the loader's add-flow, 2 written in bulk; the loader lists all 10, with
    their SID lists and distinct slots (the layout of sidlist_key/flow_value matches datapath/altmark.h)."""
    _need_tools()
    bench = Line5Bench(own_name("ambtest2"), dut="none", spec=PathSpec())
    bench.up()
    progs = [ProgramSet("tx", 10, "dscp", bench), ProgramSet("rx", 10, "rfc9343", bench)]
    try:
        for p in progs:
            p.load()
            flows = {f["flow_id"]: f for f in p.list_flows()}
            assert sorted(flows) == [flow_id(i) for i in range(10)]
            assert len({f["slot"] for f in flows.values()}) == 10
            assert p.loader_flows == SPREAD
            for i in range(10):
                f = flows[flow_id(i)]
                if p.kind == "tx":
                    assert f["method"] == "dscp" and f["sids"] == flow_sids(i)
                else:
                    assert f["method"] == "rfc9343" and f["flowmon_id"] == flow_id(i)
                assert f["period_ms"] == 1000
            assert p.flow_packets() == [0] * SPREAD
            assert not p.attached
    finally:
        for p in progs:
            p.unload()
        bench.down()
