"""altmark_collector on real traffic: altmark_tx (TC egress on A's a0) and altmark_rx (XDP on
B's b0) in the netlab line5 network, flows installed with the loaders, UDP from H1 to H2.

Two flows with period 500 ms: a dscp flow on the policy A -> [fc00:2::e, fc00:3::d6] and an
rfc9343 flow (FlowMonID 0x4242, DOH) on a second policy A -> [fc00:3::d6], both D-marking. Every
packet's block is known from its send time; the collector's records must equal, block by
block, what was sent (tx) and what H2 received (rx), 0-packet blocks included; D-marked counts
agree on both edges and give a small positive one-way delay.
"""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from test_altmark_collector import Collector

from tests.datapath.altmark_env import POLICY, RX, TX, Receiver, run, send_udp, tai_ns
from tests.isolation import own_name

pytestmark = pytest.mark.datapath

PREFIX = own_name("amcol")
PERIOD_MS = 500
T = PERIOD_MS * 1_000_000
PIN_ROOT = Path("/sys/fs/bpf/segscope")
DOH_SIDS = ["fc00:3::d6"]
DOH_DST = "fd00:b::200"
FLOWMON = 0x4242
DSCP_FLOW = 41
PAYLOAD = 64
# outer IPv6 as the programs count it: 40 + SRH (8 + 16 per SID) [+ 8 DOH] + inner IPv6 40 + UDP 8 + payload
LEN_DSCP = 40 + 8 + 16 * 2 + 40 + 8 + PAYLOAD
LEN_DOH = 40 + 8 + 8 + 16 * 1 + 40 + 8 + PAYLOAD


@pytest.fixture(scope="module")
def lab(bpffs):
    from netlab import Lab

    subprocess.run(["make", "-s", "-C", str(Path(__file__).resolve().parents[2] / "datapath")], check=True)
    with Lab.up("netlab/topologies/line5.yaml", prefix=PREFIX) as lab:
        lab.run(
            "A",
            [
                "ip",
                "-6",
                "route",
                "replace",
                f"{DOH_DST}/128",
                "encap",
                "seg6",
                "mode",
                "encap",
                "segs",
                ",".join(DOH_SIDS),
                "dev",
                "a0",
            ],
            check=True,
        )
        lab.run("H2", ["ip", "-6", "addr", "add", f"{DOH_DST}/64", "dev", "h2", "nodad"], check=True)
        tx_inst, rx_inst = f"{PREFIX}-A", f"{PREFIX}-B"
        run(TX, "attach", "--netns", lab.ns("A"), "--dev", "a0", "--instance", tx_inst)
        run(RX, "attach", "--netns", lab.ns("B"), "--dev", "b0", "--instance", rx_inst)
        lab.run("H1", ["ping", "-6", "-c", "1", "-W", "2", DOH_DST])  # neighbour entries warm
        lab.run("H1", ["ping", "-6", "-c", "1", "-W", "2", "fd00:b::1"])
        try:
            yield lab, tx_inst, rx_inst
        finally:
            run(TX, "detach", "--netns", lab.ns("A"), "--dev", "a0", "--instance", tx_inst, check=False)
            run(RX, "detach", "--netns", lab.ns("B"), "--dev", "b0", "--instance", rx_inst, check=False)


def test_records_equal_sent_and_received_packets_per_block(lab, collectors_build, work_dir):
    netlab, tx_inst, rx_inst = lab
    period = ["--period-ms", str(PERIOD_MS)]
    installs = [
        (
            TX,
            tx_inst,
            [
                "--sids",
                ",".join(POLICY),
                "--flow-id",
                str(DSCP_FLOW),
                "--method",
                "dscp",
                "--dmark-every",
                "4",
                *period,
            ],
        ),
        (RX, rx_inst, ["--sids", ",".join(POLICY), "--flow-id", str(DSCP_FLOW), "--method", "dscp", *period]),
        (
            TX,
            tx_inst,
            [
                "--sids",
                ",".join(DOH_SIDS),
                "--flow-id",
                str(FLOWMON),
                "--method",
                "rfc9343",
                "--dmark-every",
                "3",
                *period,
            ],
        ),
        (RX, rx_inst, ["--flowmon-id", str(FLOWMON), "--method", "rfc9343", *period]),
    ]
    recv = {dst: Receiver(netlab.ns("H2"), dst) for dst in ("fd00:b::1", DOH_DST)}
    sent = {DSCP_FLOW: Counter(), FLOWMON: Counter()}
    seq_block: dict[tuple[int, int], int] = {}
    args = [
        "--node",
        "amcol-c",
        "--tx-pin-dir",
        f"{PIN_ROOT / tx_inst / 'altmark_tx'}@amcol-A",
        "--rx-pin-dir",
        f"{PIN_ROOT / rx_inst / 'altmark_rx'}@amcol-B",
        "--stdout",
        "--scan-interval-ms",
        "50",
        "--stats-interval",
        "60",
    ]
    try:
        with Collector(collectors_build / "altmark_collector", work_dir, *args) as col:
            for tool, inst, a in installs:
                run(tool, "add-flow", "--instance", inst, *a)
            install_block = tai_ns() // T
            seq, last_block = 0, install_block
            for i, n in enumerate([25, 0, 40, 13, 0, 31]):
                k = tai_ns() // T + 1
                time.sleep(max(0.0, (k * T + T // 4 - tai_ns()) / 1e9))
                for flow, dst in ((DSCP_FLOW, "fd00:b::1"), (FLOWMON, DOH_DST)):
                    if not n:
                        continue
                    # a loaded runner can wake us late: a send starts in the first half of a block
                    # or waits for the next one (the truth is per block, whichever it is)
                    while tai_ns() // T != k or tai_ns() % T > T // 2:
                        k = tai_ns() // T + 1
                        time.sleep(max(0.0, (k * T + T // 4 - tai_ns()) / 1e9))
                    out = send_udp(netlab.ns("H1"), dst, n, cpus=[i % 2, 1 - i % 2], payload_len=PAYLOAD, seq0=seq)
                    for s in out:
                        kb = s.t_before // T
                        assert kb == s.t_after // T == k, "send straddled a block boundary"
                        seq_block[(flow, s.seq)] = kb
                    sent[flow][k] += n
                    seq += n
                last_block = max(last_block, k)
            time.sleep(max(0.0, ((last_block + 2) * T + T // 2 + 50_000_000 - tai_ns()) / 1e9))
            records, counters = col.stop()
        received = {DSCP_FLOW: Counter(), FLOWMON: Counter()}
        for flow, dst in ((DSCP_FLOW, "fd00:b::1"), (FLOWMON, DOH_DST)):
            for data, _tc in recv[dst].drain(sum(sent[flow].values()), timeout_s=2):
                received[flow][seq_block[(flow, int.from_bytes(data[:8], "big"))]] += 1
    finally:
        for r in recv.values():
            r.close()
        for tool, inst, a in installs:
            key = ["--flowmon-id", str(FLOWMON)] if "--flowmon-id" in a else ["--sids", a[a.index("--sids") + 1]]
            run(tool, "del-flow", "--instance", inst, *key, check=False)

    assert counters["records_out"] == len(records) and counters["read_errors"] == 0
    for flow, length in ((DSCP_FLOW, LEN_DSCP), (FLOWMON, LEN_DOH)):
        for direction, node, truth in (("tx", "amcol-A", sent[flow]), ("rx", "amcol-B", received[flow])):
            recs = sorted(
                (r for r in records if r["flow_id"] == flow and r["direction"] == direction),
                key=lambda r: r["block_index"],
            )
            assert recs and {r["node"] for r in recs} == {node}
            idx = [r["block_index"] for r in recs]
            assert idx == list(range(idx[0], idx[0] + len(idx)))
            assert idx[0] <= install_block and recs[0]["partial"]  # the install block
            full = [r for r in recs if not r["partial"]]
            assert [r["block_index"] for r in full] == idx[len(idx) - len(full) :]
            assert full[0]["block_index"] <= min(truth) and full[-1]["block_index"] >= last_block
            for r in full:
                assert r["packets"] == truth.get(r["block_index"], 0), (flow, direction, r, truth)
                assert r["bytes"] == r["packets"] * length, (flow, direction, r)
            assert sum(1 for r in full if r["packets"] == 0) >= 2  # blocks without traffic
        # double marking: same D-marked packets on both edges (nothing lost), small positive delay
        tx = {r["block_index"]: r for r in records if r["flow_id"] == flow and r["direction"] == "tx"}
        rx = {r["block_index"]: r for r in records if r["flow_id"] == flow and r["direction"] == "rx"}
        for k, n in sent[flow].items():
            if received[flow][k] != n or tx[k]["partial"] or rx[k]["partial"]:
                continue
            assert tx[k]["dmark_packets"] == rx[k]["dmark_packets"] > 0, (flow, k, tx[k], rx[k])
            diff = (rx[k]["dmark_ts_sum_ns"] - tx[k]["dmark_ts_sum_ns"]) % 2**64
            assert 0 < diff / tx[k]["dmark_packets"] < 50_000_000, (flow, k, diff)
