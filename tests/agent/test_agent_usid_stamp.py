"""STAMP over compressed SIDs (RFC 9800 NEXT-C-SID, "uSID") on netlab usid_line4.

A (micro-SID 100) measures B (micro-SID 400) across R1 (200) and R2 (300), which run NEXT-C-SID
End: one 3-micro-SID container each way, A -> B fcbb:bbbb:200:300:400:: and the RFC 9503 return
path B -> A fcbb:bbbb:300:200:100::. Sender and reflector use their micro-SID addresses (block +
micro-SID: what the destination is after the last shift), which are also the SRH's segments[0].
Delay relays on links ar and rb inject a different delay per link and direction; from a base
phase to the main one, the one-way delays STAMP measures must change by the change of the injected
sums, after the relays' own lateness, within 100 us (as tests/e2e/test_stamp_pipeline.py: the
sender's own time to the wire, tens of us, is in both phases), with the XDP reflector and with the
user-space one.
"""

from __future__ import annotations

import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from netlab import Lab, relay_ground_truth, teardown
from segscope_proto.segscope.agent.v1 import stamp_pb2 as pb
from segscope_proto.segscope.agent.v1 import stamp_pb2_grpc
from tests.agent.agent_env import start_agent
from tests.isolation import own_name

S, RF = pb.STAMP_ROLE_SENDER, pb.STAMP_ROLE_REFLECTOR
SENDER, REFLECTOR = "fcbb:bbbb:100::", "fcbb:bbbb:400::"
TO_B, TO_A = "fcbb:bbbb:200:300:400::", "fcbb:bbbb:300:200:100::"
DELAY_US = {"ar": (700, 300), "rb": (500, 900)}  # (a_to_b, b_to_a) per relay link, main phase
BASE_US = {"ar": (100, 100), "rb": (100, 100)}  # the base phase: what the path costs besides
RATE, RUN_S, TOLERANCE_US = 100, 1.5, 100
PREFIX = own_name("usd")
TOPOLOGY = Path(__file__).resolve().parents[2] / "netlab" / "topologies" / "usid_line4.yaml"


@pytest.fixture(scope="module")
def usid_lab(bpffs):
    teardown(PREFIX)
    lab = Lab.up(TOPOLOGY, prefix=PREFIX, delay_us=DELAY_US)
    try:
        yield lab
    finally:
        lab.down()


@pytest.fixture(scope="module")
def agents(usid_lab, pki, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("usid-agents")
    started = {n: start_agent(usid_lab.ns(n), n, run_dir, pki=pki, instance=f"{PREFIX}-{n}") for n in ("A", "B")}
    try:
        yield started
    finally:
        assert all(a.stop() == 0 for a in started.values())


def run_session(a, b, ssid: int, mode: int, segments: tuple[str, ...] = (TO_B,), reduced: bool = False) -> list:
    """One finite run with B's reflector in `mode`: the results the sender got."""
    a.Init(pb.InitRequest(sender=pb.StampSenderConfig(device="a0", source_address=SENDER)))
    init = b.Init(pb.InitRequest(reflector=pb.StampReflectorConfig(device="b0", addresses=[REFLECTOR], mode=mode)))
    assert init.reflector_running == mode, init
    reflector = pb.StampSession(role=RF, ssid=ssid, sender_address=SENDER, return_segments=[TO_A])
    b.CreateStampSession(pb.CreateStampSessionRequest(session=reflector))
    b.StartStampSession(pb.StartStampSessionRequest(role=RF, ssid=ssid))
    sender = pb.StampSession(
        role=S, ssid=ssid, reflector_address=REFLECTOR, segments=list(segments), rate_pps=RATE, reduced=reduced
    )
    a.CreateStampSession(pb.CreateStampSessionRequest(session=sender))
    a.StartStampSession(pb.StartStampSessionRequest(role=S, ssid=ssid, duration_s=RUN_S))
    deadline = time.monotonic() + RUN_S + 30
    while time.monotonic() < deadline and sender_running(a, ssid):
        time.sleep(0.1)
    time.sleep(0.5)  # the last replies: 1.2 ms through the relays
    return list(a.GetStampSessionResults(pb.GetStampSessionResultsRequest(ssid=ssid, max_results=100000)).results)


SHIFTERS = {"R1": "fcbb:bbbb:200::/48", "R2": "fcbb:bbbb:300::/48"}


def shifted(lab, node: str) -> int:
    """Packets the node's NEXT-C-SID SID processed (its seg6local counter)."""
    line = lab.run(node, ["ip", "-6", "-s", "route", "show", SHIFTERS[node]], check=True).stdout
    assert "flavors next-csid lblen 32 nflen 16" in line, line
    return int(re.search(r"packets (\d+)", line).group(1))


def sender_running(a, ssid: int) -> bool:
    sessions = a.ListStampSessions(pb.ListStampSessionsRequest()).sessions
    state = {x.session.ssid: x.state for x in sessions if x.session.role == S}[ssid]
    return state == pb.STAMP_SESSION_STATE_RUNNING


def relay_lateness_p50_us(before: dict, after: dict) -> dict[str, float]:
    """Per direction, the median of how late the relay released its frames between two snapshots."""
    window = relay_ground_truth(before, after)
    return {d: window[d]["lateness_us"]["p50"] for d in ("a_to_b", "b_to_a")}


def measured_phase(lab, agents, mode: int, ssid: int, delays: dict, segments=(TO_B,), reduced=False) -> dict:
    """One run with the relays at `delays`: median one-way delays and the injected sums with each relay's
    median lateness over the same frames (us). Medians on both sides: a frame a relay released late
    counts on both, and a reply held up outside the relays (a user-space reflector preempted between
    T3 and its send on a loaded runner) moves neither, where it moved a mean by milliseconds."""
    for link, (a_to_b, b_to_a) in delays.items():
        lab.set_delay(link, a_to_b, b_to_a)
    before = {link: lab.relay_stats(link) for link in delays}
    shifts_before = {node: shifted(lab, node) for node in SHIFTERS}
    with agents["A"].channel() as ca, agents["B"].channel() as cb:
        a, b = stamp_pb2_grpc.StampServiceStub(ca), stamp_pb2_grpc.StampServiceStub(cb)
        try:
            results = run_session(a, b, ssid, mode, segments, reduced)
        finally:
            a.Reset(pb.ResetRequest())
            b.Reset(pb.ResetRequest())
    late = {link: relay_lateness_p50_us(before[link], lab.relay_stats(link)) for link in delays}
    assert len(results) == int(RATE * RUN_S), len(results)  # every test packet answered
    # the shifts happened where the containers say: R1 and R2 each shifted every test packet
    # and every reply (both containers carry both micro-SIDs)
    for node in SHIFTERS:
        assert shifted(lab, node) - shifts_before[node] == 2 * len(results), node
    return {
        "fwd": statistics.median(r.forward_delay_ns for r in results) / 1000,
        "rev": statistics.median(r.reverse_delay_ns for r in results) / 1000,
        "want_fwd": sum(delays[k][0] + late[k]["a_to_b"] for k in delays),
        "want_rev": sum(delays[k][1] + late[k]["b_to_a"] for k in delays),
    }


@pytest.mark.parametrize(
    "mode,ssid", [(pb.STAMP_REFLECTOR_MODE_XDP, 41), (pb.STAMP_REFLECTOR_MODE_USERSPACE, 42)], ids=["xdp", "userspace"]
)
def test_one_way_delays_over_containers(usid_lab, agents, mode, ssid):
    base = measured_phase(usid_lab, agents, mode, ssid, BASE_US)
    main = measured_phase(usid_lab, agents, mode, ssid + 10, DELAY_US)
    name = pb.StampReflectorMode.Name(mode)
    for d in ("fwd", "rev"):
        got, want = main[d] - base[d], main[f"want_{d}"] - base[f"want_{d}"]
        print(
            f"usid STAMP {name} {d}: measured change {got:.1f} us, injected change {want:.1f} us, "
            f"main {main[d]:.1f} us (injected {main[f'want_{d}']:.1f})"
        )
        assert abs(got - want) <= TOLERANCE_US, (d, got, want, base, main)


PLAIN_REFLECTOR = Path(__file__).with_name("plain_stamp_reflector.py")
STALL_S = 0.8  # the plain peer stands still this long mid-session


def test_plain_stamp_peer_over_a_container(usid_lab, agents):
    """A STAMP reflector that is not segscope (RFC 8762 + the RFC 8972 SSID, NTP timestamps, a
    plain socket on B, answering straight back) is reached over the A -> B container; segscope's
    sender measures it: the delays are the injected ones plus at most 1 ms. The peer stands still
    for 0.8 s mid-session (SIGSTOP), as a reflector on a loaded host does: its receive timestamp is
    the kernel's, so the forward delays stay the injected ones, and segscope takes the time it
    stood as the reflector's residence (T3 - T2), in no one-way delay."""
    lab, ssid = usid_lab, 43
    for link, (a_to_b, b_to_a) in DELAY_US.items():
        lab.set_delay(link, a_to_b, b_to_a)
    peer = lab.popen("B", [sys.executable, str(PLAIN_REFLECTOR), REFLECTOR, "862"], stdout=subprocess.PIPE, text=True)
    try:
        assert peer.stdout.readline().strip() == "ready"
        with agents["A"].channel() as ca:
            a = stamp_pb2_grpc.StampServiceStub(ca)
            try:
                a.Init(pb.InitRequest(sender=pb.StampSenderConfig(device="a0", source_address=SENDER)))
                sender = pb.StampSession(role=S, ssid=ssid, reflector_address=REFLECTOR, segments=[TO_B], rate_pps=RATE)
                a.CreateStampSession(pb.CreateStampSessionRequest(session=sender))
                a.StartStampSession(pb.StartStampSessionRequest(role=S, ssid=ssid, duration_s=RUN_S))
                time.sleep(0.2)
                peer.send_signal(signal.SIGSTOP)  # ~80 of the 150 packets wait in its socket
                time.sleep(STALL_S)
                peer.send_signal(signal.SIGCONT)
                deadline = time.monotonic() + RUN_S + 30
                while time.monotonic() < deadline and sender_running(a, ssid):
                    time.sleep(0.1)
                time.sleep(0.5)
                res = a.GetStampSessionResults(pb.GetStampSessionResultsRequest(ssid=ssid, max_results=100000))
            finally:
                a.Reset(pb.ResetRequest())
    finally:
        peer.kill()
        peer.wait()
    results = list(res.results)
    assert len(results) == int(RATE * RUN_S), len(results)
    fwd = statistics.median(r.forward_delay_ns for r in results) / 1000
    rev = statistics.median(r.reverse_delay_ns for r in results) / 1000
    injected_fwd, injected_rev = (sum(d[i] for d in DELAY_US.values()) for i in (0, 1))
    print(
        f"plain STAMP peer over uSID: forward {fwd:.1f} us (injected {injected_fwd}), reverse {rev:.1f} us "
        f"(injected {injected_rev})"
    )
    assert injected_fwd <= fwd <= injected_fwd + 1000, fwd
    assert injected_rev <= rev <= injected_rev + 1000, rev
    stood = [r.t3_ns - r.t2_ns for r in results if r.t3_ns - r.t2_ns > 0.2 * STALL_S * 1e9]
    assert len(stood) >= 0.3 * len(results), f"{len(stood)} replies held by the stall: it did not happen"


def test_node_views_read_the_flavours_from_the_kernel(usid_lab):
    """The topology view (pyroute2 does not decode SEG6_LOCAL_FLAVORS; the view reads its bytes)
    reports each NEXT-C-SID SID with its lengths, as the topology file installed it; the topology
    model then expands the containers into the nodes they visit."""
    from collectors.topology.view import build_node_view
    from processors.topology.model import TopologyModel
    from tests.topology.topo_views import expected_views

    want = expected_views(TOPOLOGY)
    model = TopologyModel()
    for node in ("A", "R1", "R2", "B"):
        view = build_node_view(node, usid_lab.ns(node))
        got = [(s["sid"], s["prefixlen"], s["action"], s["params"]) for s in view["local_sids"]]
        assert got == [(s["sid"], s["prefixlen"], s["action"], s["params"]) for s in want[node]["local_sids"]], node
        model.apply_view(view)
    assert model.resolve_path("A", [TO_B, REFLECTOR])["hops"] == ["A", "R1", "R2", "B"]


# H.Encaps.Red on A: probes to H2 (behind B) are encapsulated, the outer destination the container
# with B's uDT6 (d6) as a fourth micro-SID, no SRH; B decapsulates toward H2
TO_H2_RED = "fcbb:bbbb:200:300:400:d6::"
H2_ADDRESS = "fd00:b::1"


@pytest.mark.parametrize(
    "mode,ssid", [(pb.STAMP_REFLECTOR_MODE_XDP, 44), (pb.STAMP_REFLECTOR_MODE_USERSPACE, 45)], ids=["xdp", "userspace"]
)
def test_one_way_delays_over_h_encaps_red(usid_lab, agents, pki, tmp_path, mode, ssid):
    """The sender's own SID list is empty: A's encap.red policy for H2's prefix carries the probe
    (outer header to the container, no SRH), B's uDT6 decapsulates, H2's reflector answers over
    the return container. The delays change with the injected ones as over an SRH."""
    lab = usid_lab
    policy = ["fd00:b::/64", "encap", "seg6", "mode", "encap.red", "segs", TO_H2_RED, "dev", "a0"]
    lab.run("A", ["ip", "-6", "route", "replace", *policy], check=True)
    h2 = start_agent(lab.ns("H2"), "H2", tmp_path, pki=pki, instance=f"{PREFIX}-H2")
    try:
        phases = {
            name: measured_h2_phase(lab, agents["A"], h2, mode, ssid + offset, delays)
            for name, offset, delays in (("base", 0, BASE_US), ("main", 10, DELAY_US))
        }
    finally:
        assert h2.stop() == 0
        lab.run("A", ["ip", "-6", "route", "del", "fd00:b::/64"], check=True)
    base, main = phases["base"], phases["main"]
    for d in ("fwd", "rev"):
        got, want = main[d] - base[d], main[f"want_{d}"] - base[f"want_{d}"]
        print(
            f"usid STAMP encap.red {pb.StampReflectorMode.Name(mode)} {d}: measured change {got:.1f} us, "
            f"injected change {want:.1f} us"
        )
        assert abs(got - want) <= TOLERANCE_US, (d, got, want, base, main)


def measured_h2_phase(lab, a_agent, h2_agent, mode: int, ssid: int, delays: dict) -> dict:
    for link, (a_to_b, b_to_a) in delays.items():
        lab.set_delay(link, a_to_b, b_to_a)
    before = {link: lab.relay_stats(link) for link in delays}
    shifts_before = {node: shifted(lab, node) for node in SHIFTERS}
    with a_agent.channel() as ca, h2_agent.channel() as ch:
        a, h = stamp_pb2_grpc.StampServiceStub(ca), stamp_pb2_grpc.StampServiceStub(ch)
        try:
            a.Init(pb.InitRequest(sender=pb.StampSenderConfig(device="a0", source_address=SENDER)))
            init = h.Init(
                pb.InitRequest(reflector=pb.StampReflectorConfig(device="h2", addresses=[H2_ADDRESS], mode=mode))
            )
            assert init.reflector_running == mode, init
            refl = pb.StampSession(role=RF, ssid=ssid, sender_address=SENDER, return_segments=[TO_A])
            h.CreateStampSession(pb.CreateStampSessionRequest(session=refl))
            h.StartStampSession(pb.StartStampSessionRequest(role=RF, ssid=ssid))
            sender = pb.StampSession(role=S, ssid=ssid, reflector_address=H2_ADDRESS, rate_pps=RATE)
            a.CreateStampSession(pb.CreateStampSessionRequest(session=sender))
            a.StartStampSession(pb.StartStampSessionRequest(role=S, ssid=ssid, duration_s=RUN_S))
            deadline = time.monotonic() + RUN_S + 30
            while time.monotonic() < deadline and sender_running(a, ssid):
                time.sleep(0.1)
            time.sleep(0.5)
            res = a.GetStampSessionResults(pb.GetStampSessionResultsRequest(ssid=ssid, max_results=100000))
        finally:
            a.Reset(pb.ResetRequest())
            h.Reset(pb.ResetRequest())
    results = list(res.results)
    assert len(results) == int(RATE * RUN_S), len(results)
    for node in SHIFTERS:  # out in the encap.red container, back in the return container
        assert shifted(lab, node) - shifts_before[node] == 2 * len(results), node
    late = {link: relay_lateness_p50_us(before[link], lab.relay_stats(link)) for link in delays}
    return {
        "fwd": statistics.median(r.forward_delay_ns for r in results) / 1000,
        "rev": statistics.median(r.reverse_delay_ns for r in results) / 1000,
        "want_fwd": sum(delays[k][0] + late[k]["a_to_b"] for k in delays),
        "want_rev": sum(delays[k][1] + late[k]["b_to_a"] for k in delays),
    }


# Alternate marking (RFC 9343 FlowMonID) over the container: A steers fd00:b::/64 with H.Encaps
# into [fcbb:bbbb:200:300:400:d6::] (an SRH holding the container); the TX side keys the flow by
# that SID list, the RX side on B by the FlowMonID, although the destination has shifted twice.
FLOW_SENDER = r"""
import socket, sys, time
n = int(sys.argv[1]); s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
for i in range(n):
    s.sendto(b"y" * 100, ("fd00:b::1", 40001))
    if i % 50 == 49: time.sleep(0.01)
print(n)
"""
FLOW_COUNT, FLOW_ID, LOSS_PCT = 1200, 21, 10


@pytest.mark.parametrize("encap", ["encap", "encap.red"], ids=["srh", "reduced"])
def test_altmark_loss_over_a_container_is_the_drops(usid_lab, agents, encap):
    """`encap`: an SRH holds the container, the TX side keys the flow by that SID list. `encap.red`:
    no SRH, the container is the outer destination; the TX side keys the flow by it, as the SID
    list [container]: the same flow spec. RX finds the flow by FlowMonID after the shifts."""
    from segscope_proto.segscope.agent.v1 import flowmon_pb2 as fm
    from segscope_proto.segscope.agent.v1 import flowmon_pb2_grpc

    lab = usid_lab
    policy = ["fd00:b::/64", "encap", "seg6", "mode", encap, "segs", TO_H2_RED, "dev", "a0"]
    lab.run("A", ["ip", "-6", "route", "replace", *policy], check=True)
    # R1 drops 10 % of what it forwards toward R2 after its shift (nft counts each drop)
    loss = lab.add_loss("R1", LOSS_PCT, match=f"ip6 daddr {fm_shifted(TO_H2_RED)}")
    tx_mon = fm.FlowMonitor(
        side=fm.FLOW_MONITOR_SIDE_TX,
        flow_id=FLOW_ID,
        device="a0",
        method=fm.MARKING_METHOD_RFC9343,
        segments=[TO_H2_RED],
        period_ms=200,
    )
    rx_mon = fm.FlowMonitor(
        side=fm.FLOW_MONITOR_SIDE_RX, flow_id=FLOW_ID, device="b0", method=fm.MARKING_METHOD_RFC9343, period_ms=200
    )
    with agents["A"].channel() as ca, agents["B"].channel() as cb:
        a, b = flowmon_pb2_grpc.FlowMonitorServiceStub(ca), flowmon_pb2_grpc.FlowMonitorServiceStub(cb)
        try:
            a.StartFlowMonitor(fm.StartFlowMonitorRequest(monitor=tx_mon))
            b.StartFlowMonitor(fm.StartFlowMonitorRequest(monitor=rx_mon))
            out = lab.run("A", [sys.executable, "-c", FLOW_SENDER, str(FLOW_COUNT)], check=True).stdout
            assert int(out) == FLOW_COUNT
            time.sleep(0.5)
            tx = a.GetFlowMonitorResults(fm.GetFlowMonitorResultsRequest(side=fm.FLOW_MONITOR_SIDE_TX, flow_id=FLOW_ID))
            rx = b.GetFlowMonitorResults(fm.GetFlowMonitorResultsRequest(side=fm.FLOW_MONITOR_SIDE_RX, flow_id=FLOW_ID))
        finally:
            for stub, side in ((a, fm.FLOW_MONITOR_SIDE_TX), (b, fm.FLOW_MONITOR_SIDE_RX)):
                stub.StopFlowMonitor(fm.StopFlowMonitorRequest(side=side, flow_id=FLOW_ID, allow_missing=True))
            dropped = lab.loss_counter(loss)
            lab.remove_loss(loss)
            lab.run("A", ["ip", "-6", "route", "del", "fd00:b::/64"], check=True)
    per_colour = [t.packets - r.packets for t, r in zip(tx.colours, rx.colours)]
    print(
        f"altmark over uSID ({encap}): sent {FLOW_COUNT}, tx {tx.total_packets}, rx {rx.total_packets}, "
        f"nft drops {dropped}, lost per colour {per_colour}"
    )
    assert tx.total_packets == FLOW_COUNT and dropped > 0
    assert tx.total_packets - rx.total_packets == dropped  # every drop, and nothing else
    assert len(tx.colours) == len(rx.colours) >= 2 and all(x >= 0 for x in per_colour)


def fm_shifted(container: str) -> str:
    """The container as it leaves R1: its first micro-SID shifted out (F3216)."""
    from controller.usid import CsidFormat

    return CsidFormat.parse("fcbb:bbbb::/32", 16).shifts(container)[1]


SENDER_BIN = Path(__file__).resolve().parents[2] / "build" / "collectors" / "stamp_sender"
NO_SRH_COUNT = 100


def udp6_counters(lab, node: str) -> dict[str, int]:
    text = lab.run(node, ["cat", "/proc/net/snmp6"], check=True).stdout
    return {k: int(v) for k, v in (line.split() for line in text.splitlines()) if k.startswith("Udp6In")}


def send_container_without_srh(lab, ssid: int, final_dst: bool) -> dict[str, int]:
    """segscope's sender on A to the A -> B container as the destination, no SRH (the packet R1
    and R2 shift on the way); a plain STAMP peer listens on B. What B's UDP counted."""
    peer = lab.popen("B", [sys.executable, str(PLAIN_REFLECTOR), REFLECTOR, "862"], stdout=subprocess.PIPE, text=True)
    try:
        assert peer.stdout.readline().strip() == "ready"
        before = udp6_counters(lab, "B")
        cmd = [str(SENDER_BIN), "--src", SENDER, "--dst", TO_B, "--ssid", str(ssid), "--rate", "500"]
        cmd += ["--count", str(NO_SRH_COUNT)] + (["--final-dst", REFLECTOR] if final_dst else [])
        sent = lab.run("A", cmd, check=True)
        assert f'"sent":{NO_SRH_COUNT},' in sent.stdout, sent.stdout
        time.sleep(0.5)  # the last probes cross the relays (1.2 ms)
        after = udp6_counters(lab, "B")
    finally:
        peer.kill()
        peer.wait()
    return {k: after[k] - before.get(k, 0) for k in after}


def test_sender_checksums_a_container_without_srh_for_its_final_destination(usid_lab):
    """RFC 8200 §8.1: the UDP checksum covers the final destination, here the container after its
    last shift (fcbb:bbbb:400::), not the container A sends to. With --final-dst the sender
    computes it (raw socket): B's kernel delivers every probe. Without it (the kernel's UDP socket
    checksums for the container) B's kernel counts every probe as a checksum error."""
    for link, (a_to_b, b_to_a) in BASE_US.items():
        usid_lab.set_delay(link, a_to_b, b_to_a)
    shifts_before = {node: shifted(usid_lab, node) for node in SHIFTERS}
    fixed = send_container_without_srh(usid_lab, 47, final_dst=True)
    assert fixed["Udp6InCsumErrors"] == 0 and fixed["Udp6InDatagrams"] == NO_SRH_COUNT, fixed
    for node in SHIFTERS:  # the probes went through the container's shifts, one each
        assert shifted(usid_lab, node) - shifts_before[node] == NO_SRH_COUNT, node
    kernel_socket = send_container_without_srh(usid_lab, 48, final_dst=False)
    assert kernel_socket["Udp6InCsumErrors"] == NO_SRH_COUNT and kernel_socket["Udp6InDatagrams"] == 0, kernel_socket


@pytest.mark.parametrize(
    "mode,ssid", [(pb.STAMP_REFLECTOR_MODE_XDP, 51), (pb.STAMP_REFLECTOR_MODE_USERSPACE, 52)], ids=["xdp", "userspace"]
)
def test_one_way_delays_with_the_sender_itself_reducing(usid_lab, agents, mode, ssid):
    """`reduced`: the sender puts the container in the destination with no SRH (H.Encaps.Red at
    the sender) and checksums for the address after the last shift; both reflectors answer every
    probe, and the delays change with the injected ones as over an SRH."""
    base = measured_phase(usid_lab, agents, mode, ssid, BASE_US, reduced=True)
    main = measured_phase(usid_lab, agents, mode, ssid + 10, DELAY_US, reduced=True)
    for d in ("fwd", "rev"):
        got, want = main[d] - base[d], main[f"want_{d}"] - base[f"want_{d}"]
        print(
            f"usid STAMP reduced at the sender {pb.StampReflectorMode.Name(mode)} {d}: measured change "
            f"{got:.1f} us, injected change {want:.1f} us"
        )
        assert abs(got - want) <= TOLERANCE_US, (d, got, want, base, main)
