"""The route program's fixed next hop follows the route to the first SID. On netlab tri3_steer A has
three neighbours (R1 on a1, R2 on a2, R3 on a3) that all reach B; A's policy fd00:b::/64 sends to
B's End.DT6 SID fc00:3::d6, first via R1. A real agent on A runs an INGRESS in-line monitor on the
policy's route with the fixed next hop (`via fc00:a1::2 dev a1 encap bpf in`); the test moves A's
route to B's locator to R2 while H1 sends, then removes it and puts it back. Packets are read in
captures on R1's and R2's devices toward A (ioam_pcap: SRH, trace size, E2E sequence number).

Own lab (prefix `inlnh`) and bpffs instance."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from netlab import Lab
from netlab.lab import teardown
from segscope_proto.segscope.agent.v1 import inline_pb2 as pb
from segscope_proto.segscope.agent.v1 import inline_pb2_grpc
from tests.agent.agent_env import make_test_pki, start_agent
from tests.agent.ioam_pcap import e2e_packets
from tests.built import required
from tests.collectors.collectors_pcap import capture
from tests.isolation import own_name

PREFIX = own_name("inlnh")
TOPOLOGY = "netlab/topologies/tri3_steer.yaml"
REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("SEGSCOPE_BUILD_DIR") or REPO / "build")
_built = required("datapath/ioam_lwt")
INGRESS = pb.INLINE_SIDE_INGRESS
SID = "fc00:3::d6"  # B's End.DT6, added by the fixture
POLICY = "fd00:b::/64"
CHECK_S = 1.0  # agent/inline.py NEXT_HOP_CHECK_S
BOUND_S = CHECK_S + 0.5  # the check's period, one attach-route and a loaded runner's scheduling
SENDER = r"""
import socket, sys, time
n = int(sys.argv[1]); s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
for i in range(n):
    s.sendto(b"y" * 100, ("fd00:b::1", 40007))
    if i % 10 == 9: time.sleep(0.005)
print(n)
"""


@pytest.fixture(scope="module")
def lab(bpffs):
    teardown(PREFIX)
    lab = Lab.up(TOPOLOGY, prefix=PREFIX)
    try:
        lab.run("B", ["ip", "-6", "route", "add", f"{SID}/128", "encap", "seg6local", "action", "End.DT6",
                      "table", "254", "dev", "b1"], check=True)  # fmt: skip
        lab.run("A", ["ip", "-6", "route", "add", POLICY, "encap", "seg6", "mode", "encap", "segs", SID,
                      "dev", "a1"], check=True)  # fmt: skip
        yield lab
    finally:
        lab.down()


@pytest.fixture
def agent(lab, tmp_path):
    a = start_agent(
        lab.ns("A"),
        "A",
        tmp_path,
        pki=make_test_pki(tmp_path / "pki"),
        instance=f"{PREFIX}-A",
        extra_args=["--adopt-timeout", "0", "--health", "127.0.0.1:0"],
    )
    try:
        yield a
    finally:
        assert a.stop() == 0
        r = lab.run("A", ["ip", "-6", "route", "show", POLICY], check=True).stdout
        assert "encap seg6 mode encap segs 1" in r and "bpf" not in r, r  # given back


def route(lab) -> str:
    return lab.run("A", ["ip", "-6", "route", "show", POLICY], check=True).stdout.strip()


def locator_via(lab, gw: str | None) -> None:
    """A's route to B's locator: via R1 (fc00:a1::2), R2 (fc00:a2::2) or none."""
    if gw is None:
        lab.run("A", ["ip", "-6", "route", "del", "fc00:3::/64"], check=True)
    else:
        lab.run("A", ["ip", "-6", "route", "replace", "fc00:3::/64", "via", gw], check=True)


def status(stub) -> pb.InlineMonitorStatus:
    (st,) = stub.ListInlineMonitors(pb.ListInlineMonitorsRequest(), timeout=10).monitors
    return st


def wait_status(stub, ok, timeout_s: float = 5.0) -> pb.InlineMonitorStatus:
    deadline = time.monotonic() + timeout_s
    st = status(stub)
    while not ok(st) and time.monotonic() < deadline:
        time.sleep(0.1)
        st = status(stub)
    return st


def next_seq(stub) -> int:
    req = pb.GetInlineMonitorResultsRequest(side=INGRESS, flow_id=7)
    return stub.GetInlineMonitorResults(req, timeout=10).ingress.next_sequence


def metrics(agent, want: str) -> str:
    """The agent's /metrics once `want` matches (its stats tick is 1 s), or after 15 s."""
    port = re.search(r"agent health on http://127.0.0.1:(\d+)/healthz", agent.log()).group(1)
    deadline, text = time.monotonic() + 15, ""
    while time.monotonic() < deadline and not re.search(want, text):
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        time.sleep(0.5)
    return text


def test_next_hop_followed_then_lost_then_back(lab, agent, tmp_path):
    """Moved mid-traffic from R1 to R2: the first packet on R2 within BOUND_S of the move, every
    packet instrumented, the sequence numbers exactly 0..N-1 with R1's all before R2's (no reset,
    no gap). Removed: within the bound the route uses the kernel's seg6 encap (no fixed next hop),
    said in the status and counted. Back via R1: fixed again, the numbers go on. Without the watch
    the packets stay on R1 (nothing on R2) and the route keeps its old gateway."""
    locator_via(lab, "fc00:a1::2")
    with agent.channel() as ch:
        a = inline_pb2_grpc.InlineMonitorServiceStub(ch)
        a.EnableIoam(pb.EnableIoamRequest(config=pb.IoamConfig(node_id=1, namespace_ids=[1], all_devices=True)))
        m = pb.InlineMonitor(side=INGRESS, flow_id=7, device="a1", segments=[SID], namespace_id=1, sample_every=1)
        st = a.StartInlineMonitor(pb.StartInlineMonitorRequest(monitor=m), timeout=30).status
        assert st.program == "ioam_lwt" and st.fixed_next_hop and "via fc00:a1::2 dev a1" in route(lab)

        sent, r1, r2 = 5000, tmp_path / "r1.pcap", tmp_path / "r2.pcap"
        with capture(lab.ns("R1"), "r1a", r1), capture(lab.ns("R2"), "r2a", r2):
            sender = lab.popen("H1", [sys.executable, "-c", SENDER, str(sent)], stdout=subprocess.PIPE)
            time.sleep(1.0)
            moved_at = time.time()
            locator_via(lab, "fc00:a2::2")
            assert int(sender.communicate(timeout=60)[0]) == sent
            time.sleep(0.5)
        st = status(a)
        assert (st.fixed_next_hop, st.next_hop_reattachments) == (True, 1), st
        assert "moved from via fc00:a1::2 dev a1 to via fc00:a2::2 dev a2" in st.note, st.note
        assert "via fc00:a2::2 dev a2" in route(lab) and "encap bpf" in route(lab)
        on_r1, on_r2 = e2e_packets(r1), e2e_packets(r2)
        assert sorted(p.seq for p in on_r1 + on_r2) == list(range(sent))  # all instrumented, each once
        assert on_r1 and on_r2 and max(p.seq for p in on_r1) < min(p.seq for p in on_r2)
        lag = on_r2[0].ts - moved_at
        sys.stderr.write(f"\n[next hop] first packet on R2 {lag * 1e3:.0f} ms after the move ({len(on_r1)} on R1)\n")
        assert 0 < lag <= BOUND_S, lag
        assert next_seq(a) == sent

        locator_via(lab, None)  # the first SID unreachable
        st = wait_status(a, lambda s: not s.fixed_next_hop)
        assert not st.fixed_next_hop and st.next_hop_reattachments == 2, st
        assert f"the first SID {SID} has no route with a gateway" in st.note, st.note
        assert "via" not in route(lab) and "encap bpf" in route(lab), route(lab)
        lost = r"segscope_agent_inline_route_next_hop_lost\{[^}]*\} 1\b"
        assert re.search(lost, metrics(agent, lost))

        locator_via(lab, "fc00:a1::2")
        st = wait_status(a, lambda s: s.fixed_next_hop)
        assert st.fixed_next_hop and st.next_hop_reattachments == 3, st
        first = next_seq(a)
        with capture(lab.ns("R1"), "r1a", r1):
            assert int(lab.run("H1", [sys.executable, "-c", SENDER, "200"], check=True).stdout) == 200
            time.sleep(0.5)
        assert [p.seq for p in e2e_packets(r1)] == list(range(first, first + 200))
        again = r"segscope_agent_inline_route_next_hop_reattachments\{[^}]*\} 3\b"
        text = metrics(agent, again)
        assert re.search(again, text), text[-2000:]
        a.StopInlineMonitor(pb.StopInlineMonitorRequest(side=INGRESS, flow_id=7), timeout=30)
