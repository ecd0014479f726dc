"""The agent's user-space reflector: StampReflectorMode USERSPACE, and AUTO falling back to it where
the driver refuses XDP (agent/README.md, "Reflector modes").

Own lab (netlab line5_two_paths, prefix `agu`) and own agents on A and B, so these tests share
nothing with the other agent tests. A is the Session-Sender (XDP collector on a0, stamp_sender), B
the Session-Reflector; forward A -> R (End fc00:2::e) -> B, return B -> R (End fc00:2::e2) -> A:
R's per-SID counters prove every reply took the return SID list the reflector session asked for.
The refusal is real: a veth refuses native XDP while its peer's MTU is above what XDP takes
("veth: Peer MTU is too large to set XDP"), so raising R's r1 to 9000 makes B's b0 refuse.
"""

from __future__ import annotations

import time

import grpc
import pytest

from segscope_proto.segscope.agent.v1 import stamp_pb2 as pb
from tests.agent.agent_env import start_agent
from tests.agent.conftest import Stubs, expect_error
from tests.isolation import own_name
from tests.ustamp.ustamp_env import sid_packets

pytestmark = pytest.mark.datapath

PREFIX = own_name("agu")
TOPOLOGY = "netlab/topologies/line5_two_paths.yaml"
IA, FP = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION
S, RF = pb.STAMP_ROLE_SENDER, pb.STAMP_ROLE_REFLECTOR
AUTO, XDP, USER = pb.STAMP_REFLECTOR_MODE_AUTO, pb.STAMP_REFLECTOR_MODE_XDP, pb.STAMP_REFLECTOR_MODE_USERSPACE
SID_FWD, SID_RET = "fc00:2::e", "fc00:2::e2"


@pytest.fixture(scope="module")
def lab(bpffs):
    from netlab import Lab
    from netlab.lab import teardown

    teardown(PREFIX)
    lab = Lab.up(TOPOLOGY, prefix=PREFIX)
    try:
        yield lab
    finally:
        lab.down()


@pytest.fixture(scope="module")
def stubs(lab, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("agu-agents")
    agents = {}
    try:
        for node in ("A", "B"):
            agents[node] = start_agent(lab.ns(node), node, run_dir, instance=f"{PREFIX}-{node}")
        chans = {n: a.channel() for n, a in agents.items()}
        yield {n: Stubs(c).stamp for n, c in chans.items()}
        for c in chans.values():
            c.close()
    finally:
        for a in agents.values():
            a.stop()


@pytest.fixture
def roles(stubs):
    a, b = stubs["A"], stubs["B"]
    a.Init(pb.InitRequest(sender=pb.StampSenderConfig(device="a0", source_address="fc00:1::1")))
    try:
        yield a, b
    finally:
        a.Reset(pb.ResetRequest())
        b.Reset(pb.ResetRequest())


def reflector_init(mode: int, **kw) -> pb.InitRequest:
    return pb.InitRequest(reflector=pb.StampReflectorConfig(device="b0", addresses=["fc00:3::1"], mode=mode, **kw))


def udp_862_bound(lab) -> bool:
    return ":862 " in lab.run("B", ["ss", "-Hlun"], check=True).stdout


def run_session(lab, a, b, ssid: int, fmt: int = pb.TIMESTAMP_FORMAT_PTP) -> list[pb.StampResult]:
    """A sender and a reflector session, 2 s at 200 pps through the API; the results A collected."""
    rs = pb.StampSession(role=RF, ssid=ssid, sender_address="fc00:1::1", return_segments=[SID_RET])
    rs.timestamp_format = fmt
    ss = pb.StampSession(role=S, ssid=ssid, reflector_address="fc00:3::1", segments=[SID_FWD], rate_pps=200)
    ss.timestamp_format = fmt
    assert b.CreateStampSession(pb.CreateStampSessionRequest(session=rs)).changed
    assert a.CreateStampSession(pb.CreateStampSessionRequest(session=ss)).changed
    assert b.StartStampSession(pb.StartStampSessionRequest(role=RF, ssid=ssid)).changed
    sids0 = sid_packets(lab)
    a.StartStampSession(pb.StartStampSessionRequest(role=S, ssid=ssid, duration_s=2))
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        st = {(x.session.role, x.session.ssid): x for x in a.ListStampSessions(pb.ListStampSessionsRequest()).sessions}
        if st[(S, ssid)].state == pb.STAMP_SESSION_STATE_STOPPED:
            break
        time.sleep(0.2)
    time.sleep(0.5)  # the last replies
    res = a.GetStampSessionResults(pb.GetStampSessionResultsRequest(ssid=ssid, max_results=100000)).results
    sent = st[(S, ssid)].packets_sent
    sids1 = sid_packets(lab)
    assert 300 <= sent <= 500, sent
    assert len(res) == sent, (len(res), sent)  # every test packet answered
    assert sids1[SID_RET] - sids0[SID_RET] >= sent  # the replies took the session's return SID list
    for r in res:
        assert r.ssid == ssid and r.t1_ns <= r.t2_ns <= r.t3_ns <= r.t4_ns, r
        assert 0 < r.round_trip_delay_ns < 50_000_000
    return list(res)


def test_userspace_mode_answers_through_the_api(lab, roles):
    a, b = roles
    r = b.Init(reflector_init(USER))
    assert r.changed and r.reflector_running == USER and r.reflector_fallback_reason == ""
    again = b.Init(reflector_init(USER))
    assert not again.changed and again.reflector_running == USER
    assert "xdp" not in lab.run("B", ["ip", "link", "show", "b0"], check=True).stdout  # no XDP on b0
    assert udp_862_bound(lab)  # the user-space reflector's socket
    expect_error(b.Init, reflector_init(XDP), FP, "reflector.mode: the reflector was initialised with")
    auth = pb.StampSession(role=RF, ssid=9, sender_address="fc00:1::1", mode=pb.STAMP_MODE_AUTHENTICATED)
    expect_error(b.CreateStampSession, pb.CreateStampSessionRequest(session=auth), FP, "session.mode:")

    res = run_session(lab, a, b, 21, pb.TIMESTAMP_FORMAT_NTP)
    assert [r.sequence for r in res] == list(range(len(res)))
    refl = {(x.session.role, x.session.ssid): x for x in b.ListStampSessions(pb.ListStampSessionsRequest()).sessions}
    assert refl[(RF, 21)].reflector_socket_drops == 0 and refl[(RF, 21)].reflector_tx_dropped == 0

    # stopped: the session leaves the reflector's table, its test packets are no longer answered
    assert b.StopStampSession(pb.StopStampSessionRequest(role=RF, ssid=21)).changed
    before = len(a.GetStampSessionResults(pb.GetStampSessionResultsRequest(ssid=21, max_results=100000)).results)
    a.StartStampSession(pb.StartStampSessionRequest(role=S, ssid=21, duration_s=1))
    time.sleep(2)
    after = len(a.GetStampSessionResults(pb.GetStampSessionResultsRequest(ssid=21, max_results=100000)).results)
    assert after == before
    assert b.Reset(pb.ResetRequest()).changed
    assert not udp_862_bound(lab)  # Reset stops it


def test_auto_falls_back_to_userspace_when_the_driver_refuses_xdp(lab, roles):
    a, b = roles
    lab.run("R", ["ip", "link", "set", "r1", "mtu", "9000"], check=True)
    try:
        expect_error(b.Init, reflector_init(XDP), FP, "reflector.device:")  # XDP only: refused, nothing left
        assert not udp_862_bound(lab)
        r = b.Init(reflector_init(AUTO))
        assert r.changed and r.reflector_running == USER
        assert "native XDP attach" in r.reflector_fallback_reason and "MTU" in r.reflector_fallback_reason
        assert udp_862_bound(lab)
        run_session(lab, a, b, 22)
    finally:
        b.Reset(pb.ResetRequest())
        lab.run("R", ["ip", "link", "set", "r1", "mtu", "1500"], check=True)


def test_auto_uses_xdp_where_it_attaches(lab, roles):
    a, b = roles
    r = b.Init(reflector_init(pb.STAMP_REFLECTOR_MODE_UNSPECIFIED))  # UNSPECIFIED = AUTO
    assert r.changed and r.reflector_running == XDP and r.reflector_fallback_reason == ""
    assert "xdp" in lab.run("B", ["ip", "link", "show", "b0"], check=True).stdout
    assert not udp_862_bound(lab)
    run_session(lab, a, b, 23)


def test_bad_mode_is_refused(stubs):
    expect_error(stubs["B"].Init, reflector_init(99), IA, "reflector.mode: 99 is not a StampReflectorMode value")


@pytest.mark.e2e
def test_userspace_reflector_counters_reach_kafka(lab, stubs, stack, tmp_path):
    """With the agent's --kafka the user-space reflector publishes its counter line
    (segscope_datapath, program=ustamp_reflector, schemas/metrics.md) under the agent's node."""
    from segscope_proto.segscope.agent.v1 import stamp_pb2_grpc
    from segscope_schemas import names
    from tests.agent.test_agent_kafka import consume

    a = stubs["A"]
    a.Init(pb.InitRequest(sender=pb.StampSenderConfig(device="a0", source_address="fc00:1::1")))
    agent = start_agent(lab.ns("B"), "aguK", tmp_path, kafka=stack.kafka_bootstrap, instance=f"{PREFIX}-Bk")
    try:
        with agent.channel() as ch:
            b = stamp_pb2_grpc.StampServiceStub(ch)
            assert b.Init(reflector_init(USER)).reflector_running == USER
            n = len(run_session(lab, a, b, 24))
            prefix = "segscope_datapath,node=aguK,program=ustamp_reflector "

            def keep(msg):
                line = msg.value().decode()
                if not line.startswith(prefix):
                    return None
                return dict(kv.split("=") for kv in line.split(" ")[1].split(","))

            got = consume(stack.kafka_bootstrap, names.TOPIC_METRICS, keep, lambda g: any(
                int(f["reflected"][:-1]) >= n for f in g))  # fmt: skip
            last = got[-1]
            assert int(last["reflected"][:-1]) >= n and last["socket_drops"] == "0i", last
            assert last["received"] == last["reflected"]
            b.Reset(pb.ResetRequest())
    finally:
        a.Reset(pb.ResetRequest())
        assert agent.stop() == 0
