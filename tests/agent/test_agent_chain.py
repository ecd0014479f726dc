"""The agent's XDP programs share a node's devices through the node's XDP chain (datapath/README.md,
"Chaining"): any combination of a STAMP reflector, a STAMP collector and a flow monitor's RX side
(altmark_rx) on any device, applied in any order, through the usual RPCs.

- B's b0: the RX monitor and the reflector, in both orders; while both run, STAMP results arrive on
  A AND the flow's TX and RX counters equal what H1 sent; stopping either one leaves the other
  working.
- The multi-homed B (b0 towards R, bh towards H2): a reflector and an RX monitor on BOTH devices,
  reflector first and monitors first (what used to fail with `monitor.device: bh runs
  stamp_reflector; altmark_rx can chain a STAMP program only on its first device`).
- B's bh: collector, reflector and RX monitor at once, against H2's own collector and reflector
  on h2 (an agent of its own): STAMP both ways over one link, the flow counted.

A is the Session-Sender of ssid 31 (XDP collector on a0) and the flow's TX side (altmark_tx, TC on
a0); the STAMP test packets carry other SIDs than the monitored policy, so they are never in a flow.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from collectors.ustamp.netutil import srh_option
from segscope_proto.segscope.agent.v1 import flowmon_pb2 as fpb
from segscope_proto.segscope.agent.v1 import stamp_pb2 as spb
from segscope_proto.segscope.agent.v1 import stamp_pb2_grpc
from tests.agent.agent_env import REPO, start_agent
from tests.agent.conftest import PREFIX
from tests.datapath.dp_env import in_netns

S, RF = spb.STAMP_ROLE_SENDER, spb.STAMP_ROLE_REFLECTOR
TX, RX = fpb.FLOW_MONITOR_SIDE_TX, fpb.FLOW_MONITOR_SIDE_RX
SSID, FLOW_ID = 31, 41  # A -> B over b0; the policy H1 -> H2 (A's a0 -> B's b0)
H2_SSID, B_SSID, BH_FLOW_ID = 33, 34, 42
H2_INSTANCE = f"{PREFIX}-H2c"  # H2 -> B and B -> H2 over bh; H2's SRv6 packets to B on bh
SIDS = ["fc00:2::e", "fc00:3::d6"]
BH_SIDS = ["fc00:3::1"]  # the SRH H2's flow packets carry (B's loopback, reached over bh)
COUNT = 400
CHAIN = REPO / "build" / "datapath" / "stamp_reflector"  # any member's loader prints the chain

SENDER = r"""
import socket, sys, time
n = int(sys.argv[1]); s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
for i in range(n):
    s.sendto(b"z" * 100, ("fd00:b::1", 40002))
    if i % 50 == 49: time.sleep(0.01)
print(n)
"""


def flow(side: int) -> fpb.FlowMonitor:
    return fpb.FlowMonitor(
        side=side,
        flow_id=FLOW_ID,
        device="a0" if side == TX else "b0",
        method=fpb.MARKING_METHOD_DSCP,
        segments=SIDS,
        period_ms=200,
    )


BH_FLOW = fpb.FlowMonitor(
    side=RX, flow_id=BH_FLOW_ID, device="bh", method=fpb.MARKING_METHOD_DSCP, segments=BH_SIDS, period_ms=200
)
REFLECTOR_INIT = spb.InitRequest(reflector=spb.StampReflectorConfig(device="b0", addresses=["fc00:3::1"]))
REFLECTOR_INIT_BH = spb.InitRequest(reflector=spb.StampReflectorConfig(device="bh", addresses=["fd00:b::2"]))
REFLECTOR_SESSION = spb.StampSession(role=RF, ssid=SSID, sender_address="fc00:1::1", return_segments=["fc00:2::e2"])
H2_REFLECTOR_SESSION = spb.StampSession(role=RF, ssid=H2_SSID, sender_address="fd00:b::1")


@pytest.fixture(scope="module")
def nodes(stubs):
    a, b = stubs["A"], stubs["B"]
    assert a.stamp.Init(spb.InitRequest(sender=spb.StampSenderConfig(device="a0", source_address="fc00:1::1")))
    a.stamp.CreateStampSession(
        spb.CreateStampSessionRequest(
            session=spb.StampSession(
                role=S, ssid=SSID, reflector_address="fc00:3::1", segments=["fc00:2::e"], rate_pps=200
            )
        )
    )
    try:
        yield a, b
    finally:
        for side, fid in ((RX, FLOW_ID), (RX, BH_FLOW_ID)):
            b.flowmon.StopFlowMonitor(fpb.StopFlowMonitorRequest(side=side, flow_id=fid, allow_missing=True))
        a.flowmon.StopFlowMonitor(fpb.StopFlowMonitorRequest(side=TX, flow_id=FLOW_ID, allow_missing=True))
        b.stamp.Reset(spb.ResetRequest())
        a.stamp.Reset(spb.ResetRequest())


@pytest.fixture(scope="module")
def h2(lab, pki, tmp_path_factory):
    """H2's own agent (its STAMP roles on h2, the other end of B's bh)."""
    agent = start_agent(lab.ns("H2"), "H2", tmp_path_factory.mktemp("chain-h2"), pki=pki, instance=H2_INSTANCE)
    channel = agent.channel()
    try:
        yield stamp_pb2_grpc.StampServiceStub(channel)
    finally:
        stamp_pb2_grpc.StampServiceStub(channel).Reset(spb.ResetRequest())
        channel.close()
        assert agent.stop() == 0


def chain(lab, node: str = "B", instance: str | None = None) -> dict[str, list[str]]:
    """The node's XDP chain as its loaders report it: {device: [roles in the order they run]}.
    (From the root namespace with --netns: `ip netns exec` would hide bpffs.)"""
    pin = f"/sys/fs/bpf/segscope/{instance or f'{PREFIX}-{node}'}/stamp_reflector"
    out = subprocess.run(
        [str(CHAIN), "chain", "--netns", lab.ns(node), "--pin-dir", pin], capture_output=True, text=True, check=True
    )
    return {dev: [m["role"] for m in members] for dev, members in json.loads(out.stdout).items()}


def b_program(lab, dev: str = "b0") -> str | None:
    """Name of the XDP program attached to B's dev (None: none)."""
    link = json.loads(lab.run("B", ["ip", "-j", "link", "show", "dev", dev], check=True).stdout)[0]
    return link.get("xdp", {}).get("prog", {}).get("name")


def start_reflector(b, init=REFLECTOR_INIT, session=REFLECTOR_SESSION) -> None:
    assert b.stamp.Init(init).changed
    assert b.stamp.CreateStampSession(spb.CreateStampSessionRequest(session=session)).changed
    assert b.stamp.StartStampSession(spb.StartStampSessionRequest(role=RF, ssid=session.ssid)).changed


def stamp_round(stamp, ssid: int = SSID, seconds: float = 1.5) -> int:
    """Run a sender's session for `seconds` at 200 pps; return how many new results arrived."""
    before = next(
        s.results_collected
        for s in stamp.ListStampSessions(spb.ListStampSessionsRequest()).sessions
        if s.session.role == S and s.session.ssid == ssid
    )
    stamp.StartStampSession(spb.StartStampSessionRequest(role=S, ssid=ssid))
    time.sleep(seconds)
    stamp.StopStampSession(spb.StopStampSessionRequest(role=S, ssid=ssid))
    time.sleep(0.5)
    res = stamp.GetStampSessionResults(
        spb.GetStampSessionResultsRequest(ssid=ssid, from_index=before, max_results=100000)
    )
    for r in res.results:
        assert r.ssid == ssid and 0 < r.round_trip_delay_ns < 50_000_000
    return len(res.results)


def flow_total(stub, side: int, flow_id: int) -> int:
    return stub.flowmon.GetFlowMonitorResults(
        fpb.GetFlowMonitorResultsRequest(side=side, flow_id=flow_id)
    ).total_packets


def flow_round(lab, a, b) -> tuple[int, int]:
    """Send COUNT packets H1 -> H2 through the monitored policy; return the (tx, rx) packets the
    round added to the flow's counters."""
    tx0, rx0 = flow_total(a, TX, FLOW_ID), flow_total(b, RX, FLOW_ID)
    assert int(lab.run("H1", [sys.executable, "-c", SENDER, str(COUNT)], check=True).stdout) == COUNT
    time.sleep(0.3)
    return flow_total(a, TX, FLOW_ID) - tx0, flow_total(b, RX, FLOW_ID) - rx0


def bh_flow_round(lab, b) -> int:
    """COUNT UDP packets from H2 to B over bh with an SRH [fc00:3::1]: what B's RX monitor on bh adds."""
    rx0 = flow_total(b, RX, BH_FLOW_ID)
    with in_netns(lab.ns("H2")):
        s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RTHDR, srh_option(BH_SIDS[-1], BH_SIDS[:-1]))
        for i in range(COUNT):
            s.sendto(b"y" * 80, (BH_SIDS[-1], 40003))
            if i % 50 == 49:
                time.sleep(0.01)
    finally:
        s.close()
    time.sleep(0.3)
    return flow_total(b, RX, BH_FLOW_ID) - rx0


def both_work(lab, a, b, what: str) -> None:
    n = stamp_round(a.stamp)
    tx, rx = flow_round(lab, a, b)
    print(f"\n{what}: b0 runs {chain(lab).get('b0')}; STAMP results {n}; flow sent {COUNT} tx {tx} rx {rx}")
    assert 150 <= n <= 400, f"{what}: {n} STAMP results in 1.5 s at 200 pps"
    assert tx == rx == COUNT, f"{what}: sent {COUNT}, tx {tx}, rx {rx}"


def test_rx_monitor_first_then_reflector(nodes, lab):
    a, b = nodes
    assert b.flowmon.StartFlowMonitor(fpb.StartFlowMonitorRequest(monitor=flow(RX))).changed
    assert a.flowmon.StartFlowMonitor(fpb.StartFlowMonitorRequest(monitor=flow(TX))).changed
    assert chain(lab) == {"b0": ["altmark_rx"]} and b_program(lab) == "xdp_chain"
    start_reflector(b)  # joins b0's chain behind altmark_rx
    assert chain(lab) == {"b0": ["altmark_rx", "stamp_reflector"]}
    both_work(lab, a, b, "RX first, then the reflector")

    # stopping the RX monitor leaves the reflector alone on b0: STAMP keeps working
    assert b.flowmon.StopFlowMonitor(fpb.StopFlowMonitorRequest(side=RX, flow_id=FLOW_ID)).changed
    assert chain(lab) == {"b0": ["stamp_reflector"]}
    n = stamp_round(a.stamp)
    print(f"RX monitor stopped: STAMP results {n}")
    assert 150 <= n <= 400
    assert a.flowmon.StopFlowMonitor(fpb.StopFlowMonitorRequest(side=TX, flow_id=FLOW_ID)).changed
    assert b.stamp.Reset(spb.ResetRequest()).changed
    assert chain(lab) == {} and b_program(lab) is None


def test_reflector_first_then_rx_monitor(nodes, lab):
    a, b = nodes
    start_reflector(b)
    assert chain(lab) == {"b0": ["stamp_reflector"]}
    assert b.flowmon.StartFlowMonitor(fpb.StartFlowMonitorRequest(monitor=flow(RX))).changed
    assert a.flowmon.StartFlowMonitor(fpb.StartFlowMonitorRequest(monitor=flow(TX))).changed
    assert chain(lab) == {"b0": ["altmark_rx", "stamp_reflector"]}
    both_work(lab, a, b, "reflector first, then RX")

    # destroying the reflector (Reset) takes it out of the chain: the flow keeps being counted,
    # and STAMP test packets are no longer answered
    assert b.stamp.Reset(spb.ResetRequest()).changed
    assert chain(lab) == {"b0": ["altmark_rx"]}
    tx, rx = flow_round(lab, a, b)
    n = stamp_round(a.stamp, seconds=1.0)
    print(f"reflector reset: flow sent {COUNT} tx {tx} rx {rx}; STAMP results {n}")
    assert tx == rx == COUNT
    assert n == 0

    # and back: the reflector joins again behind the running monitor, both work
    start_reflector(b)
    both_work(lab, a, b, "reflector re-added behind RX")
    assert b.flowmon.StopFlowMonitor(fpb.StopFlowMonitorRequest(side=RX, flow_id=FLOW_ID)).changed
    assert a.flowmon.StopFlowMonitor(fpb.StopFlowMonitorRequest(side=TX, flow_id=FLOW_ID)).changed
    assert chain(lab) == {"b0": ["stamp_reflector"]}
    assert b.stamp.Reset(spb.ResetRequest()).changed
    assert chain(lab) == {} and b_program(lab) is None


def _h2_sender(h2) -> None:
    """H2 sends STAMP to B's reflector on bh (its collector on h2 also lets B's XDP_TX reach it)."""
    h2.Init(spb.InitRequest(sender=spb.StampSenderConfig(device="h2", source_address="fd00:b::1")))
    h2.CreateStampSession(
        spb.CreateStampSessionRequest(
            session=spb.StampSession(role=S, ssid=H2_SSID, reflector_address="fd00:b::2", rate_pps=200)
        )
    )


@pytest.mark.parametrize("order", ["reflectors_first", "monitors_first"])
def test_reflector_and_rx_monitor_on_both_devices_of_a_multihomed_node(nodes, lab, h2, order):
    """The user's multi-homed egress node: a STAMP reflector and an RX monitor on each of B's two
    devices, applied in both orders; every one of them works, and removing one leaves the rest."""
    a, b = nodes
    _h2_sender(h2)
    try:

        def reflectors() -> None:
            start_reflector(b)  # b0
            start_reflector(b, REFLECTOR_INIT_BH, H2_REFLECTOR_SESSION)  # bh: attach-dev + address

        def monitors() -> None:
            assert b.flowmon.StartFlowMonitor(fpb.StartFlowMonitorRequest(monitor=flow(RX))).changed
            assert b.flowmon.StartFlowMonitor(fpb.StartFlowMonitorRequest(monitor=BH_FLOW)).changed

        for step in (reflectors, monitors) if order == "reflectors_first" else (monitors, reflectors):
            step()
        assert a.flowmon.StartFlowMonitor(fpb.StartFlowMonitorRequest(monitor=flow(TX))).changed
        assert chain(lab) == {"b0": ["altmark_rx", "stamp_reflector"], "bh": ["altmark_rx", "stamp_reflector"]}
        both_work(lab, a, b, f"{order}: b0")
        n, rx = stamp_round(h2, H2_SSID), bh_flow_round(lab, b)
        print(f"{order}: bh runs {chain(lab)['bh']}; STAMP results {n}; flow sent {COUNT} rx {rx}")
        assert 150 <= n <= 400 and rx == COUNT

        # bh's monitor leaves: bh's reflector and all of b0 keep working
        assert b.flowmon.StopFlowMonitor(fpb.StopFlowMonitorRequest(side=RX, flow_id=BH_FLOW_ID)).changed
        assert chain(lab) == {"b0": ["altmark_rx", "stamp_reflector"], "bh": ["stamp_reflector"]}
        assert 150 <= stamp_round(h2, H2_SSID) <= 400
        both_work(lab, a, b, f"{order}: b0 after bh's monitor left")
        # the reflector leaves both devices (Reset): b0's monitor keeps counting
        assert b.stamp.Reset(spb.ResetRequest()).changed
        assert chain(lab) == {"b0": ["altmark_rx"]} and b_program(lab, "bh") is None
        tx, rx = flow_round(lab, a, b)
        assert tx == rx == COUNT and stamp_round(h2, H2_SSID, seconds=1.0) == 0
    finally:
        for side, fid, stub in ((RX, FLOW_ID, b), (RX, BH_FLOW_ID, b), (TX, FLOW_ID, a)):
            stub.flowmon.StopFlowMonitor(fpb.StopFlowMonitorRequest(side=side, flow_id=fid, allow_missing=True))
        b.stamp.Reset(spb.ResetRequest())
        h2.Reset(spb.ResetRequest())
    assert chain(lab) == {}


def test_collector_reflector_and_rx_monitor_on_one_device(nodes, lab, h2):
    """B's bh runs all three (collector, reflector, RX monitor) and H2's h2 both STAMP roles: STAMP
    both ways over the one link and the flow on it, all measured at once."""
    _, b = nodes
    _h2_sender(h2)
    try:
        assert h2.Init(
            spb.InitRequest(reflector=spb.StampReflectorConfig(device="h2", addresses=["fd00:b::1"]))
        ).changed
        h2.CreateStampSession(
            spb.CreateStampSessionRequest(session=spb.StampSession(role=RF, ssid=B_SSID, sender_address="fd00:b::2"))
        )
        h2.StartStampSession(spb.StartStampSessionRequest(role=RF, ssid=B_SSID))
        assert b.flowmon.StartFlowMonitor(fpb.StartFlowMonitorRequest(monitor=BH_FLOW)).changed
        start_reflector(b, REFLECTOR_INIT_BH, H2_REFLECTOR_SESSION)
        assert b.stamp.Init(
            spb.InitRequest(sender=spb.StampSenderConfig(device="bh", source_address="fd00:b::2"))
        ).changed
        b.stamp.CreateStampSession(
            spb.CreateStampSessionRequest(
                session=spb.StampSession(role=S, ssid=B_SSID, reflector_address="fd00:b::1", rate_pps=200)
            )
        )
        assert chain(lab) == {"bh": ["altmark_rx", "stamp_collector", "stamp_reflector"]}
        assert chain(lab, "H2", H2_INSTANCE) == {"h2": ["stamp_collector", "stamp_reflector"]}
        to_b, to_h2, rx = stamp_round(h2, H2_SSID), stamp_round(b.stamp, B_SSID), bh_flow_round(lab, b)
        print(f"\nbh runs {chain(lab)['bh']}: STAMP H2->B {to_b}, B->H2 {to_h2}; flow sent {COUNT} rx {rx}")
        assert 150 <= to_b <= 400 and 150 <= to_h2 <= 400 and rx == COUNT
    finally:
        b.flowmon.StopFlowMonitor(fpb.StopFlowMonitorRequest(side=RX, flow_id=BH_FLOW_ID, allow_missing=True))
        b.stamp.Reset(spb.ResetRequest())
        h2.Reset(spb.ResetRequest())
    assert chain(lab) == {} and chain(lab, "H2", H2_INSTANCE) == {}
