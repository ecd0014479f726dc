"""A STAMP reflector and a flow monitor's RX side (altmark_rx) on the same device (B's b0), both
through the API, in either order: the agent chains the reflector behind altmark_rx (reflector
Init with altmark_rx on b0: `--behind altmark_rx`; RX monitor start with the reflector on b0:
`altmark_rx attach --chain`). While both run, STAMP results arrive on A AND the flow's TX and RX
counters equal what H1 sent; stopping either one leaves the other working.

A is the Session-Sender (XDP collector on a0) and the flow's TX side (altmark_tx, TC on a0); the
STAMP test packets carry other SIDs than the monitored policy, so they are never in the flow."""

from __future__ import annotations

import json
import sys
import time

import pytest

from segscope_proto.segscope.agent.v1 import flowmon_pb2 as fpb
from segscope_proto.segscope.agent.v1 import stamp_pb2 as spb

S, RF = spb.STAMP_ROLE_SENDER, spb.STAMP_ROLE_REFLECTOR
TX, RX = fpb.FLOW_MONITOR_SIDE_TX, fpb.FLOW_MONITOR_SIDE_RX
SSID, FLOW_ID = 31, 41
SIDS = ["fc00:2::e", "fc00:3::d6"]
COUNT = 400

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


REFLECTOR_INIT = spb.InitRequest(reflector=spb.StampReflectorConfig(device="b0", addresses=["fc00:3::1"]))
REFLECTOR_SESSION = spb.StampSession(role=RF, ssid=SSID, sender_address="fc00:1::1", return_segments=["fc00:2::e2"])


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
        b.flowmon.StopFlowMonitor(fpb.StopFlowMonitorRequest(side=RX, flow_id=FLOW_ID, allow_missing=True))
        a.flowmon.StopFlowMonitor(fpb.StopFlowMonitorRequest(side=TX, flow_id=FLOW_ID, allow_missing=True))
        b.stamp.Reset(spb.ResetRequest())
        a.stamp.Reset(spb.ResetRequest())


def b0_program(lab) -> str | None:
    """Name of the XDP program attached to b0 (None: none)."""
    out = json.loads(lab.run("B", ["bpftool", "-j", "net", "show", "dev", "b0"], check=True).stdout)
    xdp = [p for entry in out for p in entry.get("xdp", [])]
    if not xdp:
        return None
    prog = json.loads(lab.run("B", ["bpftool", "-j", "prog", "show", "id", str(xdp[0]["id"])], check=True).stdout)
    return prog["name"]


def start_reflector(b) -> None:
    assert b.stamp.Init(REFLECTOR_INIT).changed
    assert b.stamp.CreateStampSession(spb.CreateStampSessionRequest(session=REFLECTOR_SESSION)).changed
    assert b.stamp.StartStampSession(spb.StartStampSessionRequest(role=RF, ssid=SSID)).changed


def stamp_round(a, seconds: float = 1.5) -> int:
    """Run the sender for `seconds` at 200 pps; return how many new results arrived on A."""
    before = next(
        s.results_collected
        for s in a.stamp.ListStampSessions(spb.ListStampSessionsRequest()).sessions
        if s.session.role == S and s.session.ssid == SSID
    )
    a.stamp.StartStampSession(spb.StartStampSessionRequest(role=S, ssid=SSID))
    time.sleep(seconds)
    a.stamp.StopStampSession(spb.StopStampSessionRequest(role=S, ssid=SSID))
    time.sleep(0.5)
    res = a.stamp.GetStampSessionResults(
        spb.GetStampSessionResultsRequest(ssid=SSID, from_index=before, max_results=100000)
    )
    for r in res.results:
        assert r.ssid == SSID and 0 < r.round_trip_delay_ns < 50_000_000
    return len(res.results)


def flow_round(lab, a, b) -> tuple[int, int]:
    """Send COUNT packets H1 -> H2 through the monitored policy; return the (tx, rx) packets the
    round added to the flow's counters."""
    get = lambda stub, side: stub.GetFlowMonitorResults(  # noqa: E731
        fpb.GetFlowMonitorResultsRequest(side=side, flow_id=FLOW_ID)
    ).total_packets
    tx0, rx0 = get(a.flowmon, TX), get(b.flowmon, RX)
    assert int(lab.run("H1", [sys.executable, "-c", SENDER, str(COUNT)], check=True).stdout) == COUNT
    time.sleep(0.3)
    return get(a.flowmon, TX) - tx0, get(b.flowmon, RX) - rx0


def both_work(lab, a, b, what: str) -> None:
    n = stamp_round(a)
    tx, rx = flow_round(lab, a, b)
    print(f"\n{what}: b0 runs {b0_program(lab)}; STAMP results {n}; flow sent {COUNT} tx {tx} rx {rx}")
    assert 150 <= n <= 400, f"{what}: {n} STAMP results in 1.5 s at 200 pps"
    assert tx == rx == COUNT, f"{what}: sent {COUNT}, tx {tx}, rx {rx}"


def test_rx_monitor_first_then_reflector(nodes, lab):
    a, b = nodes
    assert b.flowmon.StartFlowMonitor(fpb.StartFlowMonitorRequest(monitor=flow(RX))).changed
    assert a.flowmon.StartFlowMonitor(fpb.StartFlowMonitorRequest(monitor=flow(TX))).changed
    assert b0_program(lab) == "altmark_rx"
    start_reflector(b)  # chained behind altmark_rx
    assert b0_program(lab) == "altmark_rx"
    both_work(lab, a, b, "RX first, reflector chained")

    # stopping the RX monitor hands b0 back to the reflector: STAMP keeps working
    assert b.flowmon.StopFlowMonitor(fpb.StopFlowMonitorRequest(side=RX, flow_id=FLOW_ID)).changed
    assert b0_program(lab) is not None and b0_program(lab).startswith("stamp_refl")
    n = stamp_round(a)
    print(f"RX monitor stopped: STAMP results {n}")
    assert 150 <= n <= 400
    assert a.flowmon.StopFlowMonitor(fpb.StopFlowMonitorRequest(side=TX, flow_id=FLOW_ID)).changed
    assert b.stamp.Reset(spb.ResetRequest()).changed
    assert b0_program(lab) is None


def test_reflector_first_then_rx_monitor(nodes, lab):
    a, b = nodes
    start_reflector(b)
    assert b0_program(lab).startswith("stamp_refl")
    assert b.flowmon.StartFlowMonitor(fpb.StartFlowMonitorRequest(monitor=flow(RX))).changed  # --chain
    assert a.flowmon.StartFlowMonitor(fpb.StartFlowMonitorRequest(monitor=flow(TX))).changed
    assert b0_program(lab) == "altmark_rx"
    both_work(lab, a, b, "reflector first, RX chained")

    # destroying the reflector (Reset) empties the chain slot: the flow keeps being counted, and
    # STAMP test packets are no longer answered
    assert b.stamp.Reset(spb.ResetRequest()).changed
    assert b0_program(lab) == "altmark_rx"
    tx, rx = flow_round(lab, a, b)
    n = stamp_round(a, 1.0)
    print(f"reflector reset: flow sent {COUNT} tx {tx} rx {rx}; STAMP results {n}")
    assert tx == rx == COUNT
    assert n == 0

    # and back: the reflector chained again behind the running monitor, both work
    start_reflector(b)
    both_work(lab, a, b, "reflector re-added behind RX")
    assert b.flowmon.StopFlowMonitor(fpb.StopFlowMonitorRequest(side=RX, flow_id=FLOW_ID)).changed
    assert a.flowmon.StopFlowMonitor(fpb.StopFlowMonitorRequest(side=TX, flow_id=FLOW_ID)).changed
    assert b0_program(lab).startswith("stamp_refl")
    assert b.stamp.Reset(spb.ResetRequest()).changed
    assert b0_program(lab) is None


def test_collector_and_reflector_cannot_share_the_chain(nodes, lab):
    """One program runs behind altmark_rx: with the reflector chained on b0, a STAMP sender Init
    on b0 (B's collector) is refused with the loader's reason, and nothing of it stays."""
    import grpc

    from tests.agent.conftest import expect_error

    a, b = nodes
    assert b.flowmon.StartFlowMonitor(fpb.StartFlowMonitorRequest(monitor=flow(RX))).changed
    start_reflector(b)
    msg = expect_error(
        b.stamp.Init,
        spb.InitRequest(sender=spb.StampSenderConfig(device="b0", source_address="fc00:3::1")),
        grpc.StatusCode.FAILED_PRECONDITION,
        "sender.device:",
    )
    assert "altmark_rx_next already holds" in msg, msg
    assert b0_program(lab) == "altmark_rx"
    assert b.stamp.Reset(spb.ResetRequest()).changed
    assert b.flowmon.StopFlowMonitor(fpb.StopFlowMonitorRequest(side=RX, flow_id=FLOW_ID)).changed
    assert b0_program(lab) is None
