"""FlowMonitorService end to end: TX side on A (altmark_tx on a0), RX side on B (altmark_rx on
b0), both started through the agents for the policy fd00:b::/64 (SIDs fc00:2::e, fc00:3::d6);
UDP packets H1 -> H2 are counted on both sides, equal to what the sender sent (no loss here)."""

from __future__ import annotations

import sys

import grpc
import pytest

from segscope_proto.segscope.agent.v1 import flowmon_pb2 as pb
from tests.agent.conftest import expect_error

IA, NF, AE, FP = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION,
)
TX, RX = pb.FLOW_MONITOR_SIDE_TX, pb.FLOW_MONITOR_SIDE_RX
SIDS = ["fc00:2::e", "fc00:3::d6"]
COUNT = 600

SENDER = r"""
import socket, sys, time
n = int(sys.argv[1]); s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
for i in range(n):
    s.sendto(b"y" * 100, ("fd00:b::1", 40001))
    if i % 50 == 49: time.sleep(0.01)
print(n)
"""


def monitor(side, method=pb.MARKING_METHOD_DSCP, flow_id=11, **kw) -> pb.FlowMonitor:
    d = dict(
        side=side, flow_id=flow_id, device="a0" if side == TX else "b0", method=method, segments=SIDS, period_ms=200
    )
    if side == RX and method == pb.MARKING_METHOD_RFC9343:
        d["segments"] = []
    d.update(kw)
    return pb.FlowMonitor(**d)


@pytest.fixture(scope="module")
def sides(stubs):
    a, b = stubs["A"].flowmon, stubs["B"].flowmon
    yield a, b
    for stub, side in ((a, TX), (b, RX)):
        for m in stub.ListFlowMonitors(pb.ListFlowMonitorsRequest()).monitors:
            stub.StopFlowMonitor(pb.StopFlowMonitorRequest(side=side, flow_id=m.monitor.flow_id))


@pytest.mark.parametrize("method", [pb.MARKING_METHOD_DSCP, pb.MARKING_METHOD_RFC9343], ids=["dscp", "rfc9343"])
def test_tx_and_rx_count_every_packet(sides, lab, method):
    a, b = sides
    fid = 11 if method == pb.MARKING_METHOD_DSCP else 12
    r = a.StartFlowMonitor(pb.StartFlowMonitorRequest(monitor=monitor(TX, method, fid)))
    assert r.changed and r.status.installed_tai_ns > 0
    assert not a.StartFlowMonitor(pb.StartFlowMonitorRequest(monitor=monitor(TX, method, fid))).changed
    expect_error(
        a.StartFlowMonitor,
        pb.StartFlowMonitorRequest(monitor=monitor(TX, method, fid, period_ms=500)),
        AE,
        "monitor.flow_id:",
    )
    assert b.StartFlowMonitor(pb.StartFlowMonitorRequest(monitor=monitor(RX, method, fid))).changed
    listed = a.ListFlowMonitors(pb.ListFlowMonitorsRequest(side=TX)).monitors
    assert [m.monitor.flow_id for m in listed] == [fid] and listed[0].monitor.dscp_d_bit == (
        1 if method == pb.MARKING_METHOD_DSCP else 0
    )
    assert "clsact" in lab.run("A", ["tc", "qdisc", "show", "dev", "a0"], check=True).stdout
    assert "xdp" in lab.run("B", ["ip", "link", "show", "b0"], check=True).stdout

    out = lab.run("H1", [sys.executable, "-c", SENDER, str(COUNT)], check=True).stdout
    assert int(out) == COUNT
    import time

    time.sleep(0.3)
    tx = a.GetFlowMonitorResults(pb.GetFlowMonitorResultsRequest(side=TX, flow_id=fid))
    rx = b.GetFlowMonitorResults(pb.GetFlowMonitorResultsRequest(side=RX, flow_id=fid))
    print(
        f"\nflowmon {pb.MarkingMethod.Name(method)}: sent {COUNT}, tx {tx.total_packets} pkts "
        f"{tx.total_bytes} B, rx {rx.total_packets} pkts {rx.total_bytes} B, colours tx "
        f"{[c.packets for c in tx.colours]} rx {[c.packets for c in rx.colours]}"
    )
    assert tx.total_packets == COUNT and rx.total_packets == COUNT
    assert tx.total_bytes == rx.total_bytes > COUNT * 100
    assert [c.packets for c in tx.colours] == [c.packets for c in rx.colours]
    assert len(tx.colours) == 2

    assert a.StopFlowMonitor(pb.StopFlowMonitorRequest(side=TX, flow_id=fid)).changed
    assert b.StopFlowMonitor(pb.StopFlowMonitorRequest(side=RX, flow_id=fid)).changed
    expect_error(a.StopFlowMonitor, pb.StopFlowMonitorRequest(side=TX, flow_id=fid), NF, "flow_id:")
    assert not a.StopFlowMonitor(pb.StopFlowMonitorRequest(side=TX, flow_id=fid, allow_missing=True)).changed
    expect_error(a.GetFlowMonitorResults, pb.GetFlowMonitorResultsRequest(side=TX, flow_id=fid), NF, "flow_id:")
    # the last flow of a side detaches its program
    assert "xdp" not in lab.run("B", ["ip", "link", "show", "b0"], check=True).stdout


BAD = [
    (monitor(0), "monitor.side: required"),
    (monitor(TX, flow_id=0), "monitor.flow_id: required"),
    (monitor(TX, method=0), "monitor.method: required"),
    (monitor(TX, pb.MARKING_METHOD_RFC9343, flow_id=0x100000), "monitor.flow_id: 1048576 is not a FlowMonID"),
    (monitor(TX, device=""), "monitor.device: required"),
    (monitor(TX, segments=[]), "monitor.segments: required"),
    (monitor(TX, segments=["fc00::1"] * 7), "monitor.segments: 7 SIDs, at most 6"),
    (monitor(TX, segments=["fc00:2::e", "bad"]), "monitor.segments[1]: 'bad' is not an IPv6 address"),
    (monitor(RX, pb.MARKING_METHOD_RFC9343, segments=SIDS), "monitor.segments: not allowed with FLOW_MONITOR_SIDE_RX"),
    (monitor(TX, period_ms=0), "monitor.period_ms: required"),
    (monitor(TX, period_ms=4_000_000), "monitor.period_ms: 4000000 out of range"),
    (monitor(RX, dmark_every=10), "monitor.dmark_every: not allowed with FLOW_MONITOR_SIDE_RX"),
    (monitor(TX, dscp_l_bit=2, dscp_d_bit=2), "monitor.dscp_d_bit: must differ"),
    (monitor(TX, dscp_l_bit=7, dscp_d_bit=1), "monitor.dscp_l_bit: 7 out of range"),
    (
        monitor(TX, pb.MARKING_METHOD_RFC9343, dscp_l_bit=1),
        "monitor.dscp_l_bit: not allowed with MARKING_METHOD_RFC9343",
    ),
]


@pytest.mark.parametrize("m,msg", BAD, ids=[m.split(":")[0] + "-" + str(i) for i, (_, m) in enumerate(BAD)])
def test_bad_monitor_names_the_field(sides, m, msg):
    got = expect_error(sides[0].StartFlowMonitor, pb.StartFlowMonitorRequest(monitor=m), IA, msg.split(":")[0] + ":")
    assert got.startswith(msg), got


def test_bad_requests_and_device_errors(sides, lab):
    a, _ = sides
    expect_error(a.StopFlowMonitor, pb.StopFlowMonitorRequest(flow_id=1), IA, "side: required")
    expect_error(a.StopFlowMonitor, pb.StopFlowMonitorRequest(side=TX), IA, "flow_id: required")
    expect_error(a.GetFlowMonitorResults, pb.GetFlowMonitorResultsRequest(side=7, flow_id=1), IA, "side: 7 is not")
    expect_error(a.ListFlowMonitors, pb.ListFlowMonitorsRequest(side=9), IA, "side: 9 is not")
    msg = expect_error(
        a.StartFlowMonitor, pb.StartFlowMonitorRequest(monitor=monitor(TX, device="nope0")), FP, "monitor.device:"
    )
    assert "attach failed" in msg

    # a multi-homed node: flows on two devices of one side share the side's program
    def tc_on(dev: str) -> bool:
        return "altmark_tx" in lab.run("A", ["tc", "filter", "show", "dev", dev, "egress"], check=True).stdout

    assert a.StartFlowMonitor(pb.StartFlowMonitorRequest(monitor=monitor(TX, flow_id=21))).changed
    assert a.StartFlowMonitor(
        pb.StartFlowMonitorRequest(monitor=monitor(TX, flow_id=22, device="ah", segments=["fc00:2::e2"]))
    ).changed
    assert tc_on("a0") and tc_on("ah")
    listed = a.ListFlowMonitors(pb.ListFlowMonitorsRequest(side=TX)).monitors
    assert sorted((m.monitor.flow_id, m.monitor.device) for m in listed) == [(21, "a0"), (22, "ah")]
    msg = expect_error(  # a third device that does not exist: refused, the others untouched
        a.StartFlowMonitor,
        pb.StartFlowMonitorRequest(monitor=monitor(TX, flow_id=23, device="nope0", segments=["fc00:2::e9"])),
        FP,
        "monitor.device:",
    )
    assert tc_on("a0") and tc_on("ah"), msg
    assert a.StopFlowMonitor(pb.StopFlowMonitorRequest(side=TX, flow_id=22)).changed  # ah's last flow
    assert tc_on("a0") and not tc_on("ah")
    assert a.StopFlowMonitor(pb.StopFlowMonitorRequest(side=TX, flow_id=21)).changed
    assert not tc_on("a0")
    # the RX side (XDP) likewise on b0 and bh of B
    b = sides[1]

    def xdp_on(dev: str) -> bool:
        return "xdp" in lab.run("B", ["ip", "link", "show", "dev", dev], check=True).stdout

    assert b.StartFlowMonitor(pb.StartFlowMonitorRequest(monitor=monitor(RX, flow_id=31))).changed
    expect_error(  # the same SID list again (another device too) would replace flow 31 in the datapath
        b.StartFlowMonitor,
        pb.StartFlowMonitorRequest(monitor=monitor(RX, flow_id=33, device="bh")),
        AE,
        "monitor.segments: altmark_rx flow 31 already monitors",
    )
    assert b.StartFlowMonitor(
        pb.StartFlowMonitorRequest(monitor=monitor(RX, flow_id=32, device="bh", segments=["fc00:2::e2", "fc00:3::d6"]))
    ).changed
    assert xdp_on("b0") and xdp_on("bh")
    assert b.StopFlowMonitor(pb.StopFlowMonitorRequest(side=RX, flow_id=31)).changed  # b0's last flow
    assert not xdp_on("b0") and xdp_on("bh")
    assert b.StopFlowMonitor(pb.StopFlowMonitorRequest(side=RX, flow_id=32)).changed
    assert not xdp_on("bh")
