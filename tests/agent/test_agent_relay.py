"""A STAMP reflector whose device faces a netlab delay relay, and a reflector whose replies are lost
on the way out.

On line5_two_paths with a relay on link rb (R - relay - B), B's reflector on b0 answers with XDP_TX
into the relay's veth end. netlab puts xdp_pass on both relay ends (veth drops XDP_TX frames when
the peer has no XDP program), so every reply comes back. Then the relay end facing B loses its
program, as relays had none before: every reply is dropped by the kernel, and the loss must show
where an operator looks: B's reflector sessions (`reflector_tx_dropped` in ListStampSessions,
what `controller status` prints) and the agent's `segscope_device` line (tx_dropped).
"""

from __future__ import annotations

import re
import subprocess
import time
import urllib.request

import pytest

from netlab import Lab
from netlab.lab import teardown
from segscope_proto.segscope.agent.v1 import stamp_pb2 as pb
from segscope_proto.segscope.agent.v1 import stamp_pb2_grpc
from tests.agent.agent_env import start_agent
from tests.isolation import own_name

S, RF = pb.STAMP_ROLE_SENDER, pb.STAMP_ROLE_REFLECTOR
SSID, RATE, RUN_S = 91, 100, 1.5


@pytest.fixture
def relay_lab(bpffs):
    teardown(own_name("agr"))
    lab = Lab.up("netlab/topologies/line5_two_paths.yaml", prefix=own_name("agr"), delay_us={"rb": (300, 300)})
    try:
        yield lab
    finally:
        lab.down()


def run_once(a, b, duration_s: float) -> int:
    """One finite run of the session; the results the sender got from it."""
    before = len(a.GetStampSessionResults(pb.GetStampSessionResultsRequest(ssid=SSID, max_results=100000)).results)
    a.StartStampSession(pb.StartStampSessionRequest(role=S, ssid=SSID, duration_s=duration_s))
    # until the sender has sent its last packet (its process ended: the session is STOPPED), not a
    # fixed time: on a busy machine the sender starts late and catches up after its duration
    deadline = time.monotonic() + duration_s + 30
    while time.monotonic() < deadline and sender_state(a) == pb.STAMP_SESSION_STATE_RUNNING:
        time.sleep(0.1)
    time.sleep(1.0)  # the last replies: 300 us through the relay
    res = a.GetStampSessionResults(pb.GetStampSessionResultsRequest(ssid=SSID, max_results=100000))
    return len(res.results) - before


def sender_state(a) -> int:
    sessions = a.ListStampSessions(pb.ListStampSessionsRequest()).sessions
    return {x.session.ssid: x for x in sessions if x.session.role == S}[SSID].state


def test_reflector_behind_a_relay_answers_and_lost_replies_are_reported(relay_lab, pki, tmp_path):
    lab = relay_lab
    relay_ns = lab.relay_ns("rb")
    for end in ("ra", "rb"):  # both relay ends run xdp_pass
        shown = subprocess.run(["ip", "-n", relay_ns, "link", "show", end], capture_output=True, text=True, check=True)
        assert "xdp" in shown.stdout, shown.stdout
    a_agent = start_agent(lab.ns("A"), "A", tmp_path, pki=pki, instance=f"{lab.prefix}-A")
    b_agent = start_agent(
        lab.ns("B"), "B", tmp_path, pki=pki, instance=f"{lab.prefix}-B", extra_args=["--health", "127.0.0.1:0"]
    )
    try:
        with a_agent.channel() as ca, b_agent.channel() as cb:
            a, b = stamp_pb2_grpc.StampServiceStub(ca), stamp_pb2_grpc.StampServiceStub(cb)
            a.Init(pb.InitRequest(sender=pb.StampSenderConfig(device="a0", source_address="fc00:1::1")))
            b.Init(pb.InitRequest(reflector=pb.StampReflectorConfig(device="b0", addresses=["fc00:3::1"])))
            b.CreateStampSession(
                pb.CreateStampSessionRequest(
                    session=pb.StampSession(
                        role=RF, ssid=SSID, sender_address="fc00:1::1", return_segments=["fc00:2::e2"]
                    )
                )
            )
            b.StartStampSession(pb.StartStampSessionRequest(role=RF, ssid=SSID))
            a.CreateStampSession(
                pb.CreateStampSessionRequest(
                    session=pb.StampSession(
                        role=S, ssid=SSID, reflector_address="fc00:3::1", segments=["fc00:2::e"], rate_pps=RATE
                    )
                )
            )
            # 1. through the relay: every reply comes back, nothing dropped at B
            assert run_once(a, b, RUN_S) == int(RATE * RUN_S)
            refl = {s.session.ssid: s for s in b.ListStampSessions(pb.ListStampSessionsRequest()).sessions}[SSID]
            assert refl.reflector_tx_dropped == 0

            # 2. the relay end facing B without its XDP program: XDP_TX replies are dropped
            subprocess.run(["ip", "-n", relay_ns, "link", "set", "dev", "rb", "xdp", "off"], check=True)
            assert run_once(a, b, RUN_S) == 0
            refl = {s.session.ssid: s for s in b.ListStampSessions(pb.ListStampSessionsRequest()).sessions}[SSID]
            assert refl.reflector_tx_dropped == int(RATE * RUN_S), refl
            port = re.search(r"agent health on http://127.0.0.1:(\d+)/healthz", b_agent.log()).group(1)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as r:
                text = r.read().decode()
            want = r'^segscope_device_tx_dropped\{node="B",device="b0",programs="stamp_reflector"\} (\d+)$'
            m = re.search(want, text, re.M)
            assert m and int(m.group(1)) >= int(RATE * RUN_S), text
            a.Reset(pb.ResetRequest())
            b.Reset(pb.ResetRequest())
    finally:
        assert a_agent.stop() == 0 and b_agent.stop() == 0
