"""StampService end to end: A's agent is the Session-Sender (XDP collector on a0, stamp_sender),
B's agent the Session-Reflector (XDP reflector on b0); a session created and started through the
API produces results (GetStampSessionResults and the SubscribeStampResults stream). Forward path
A -> R(End fc00:2::e) -> B, return path B -> R(End fc00:2::e2) -> A: R's per-SID counters prove
each direction's path."""

from __future__ import annotations

import json
import subprocess
import threading
import time

import grpc
import pytest

from segscope_proto.segscope.agent.v1 import srv6_pb2
from segscope_proto.segscope.agent.v1 import stamp_pb2 as pb
from tests.agent.agent_env import REPO
from tests.agent.conftest import PREFIX, drop_counters, expect_error, link_rx_drops, moved

IA, NF, AE, FP = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION,
)
S, RF = pb.STAMP_ROLE_SENDER, pb.STAMP_ROLE_REFLECTOR
SSID = 7


def sender_session(**kw) -> pb.StampSession:
    d = dict(role=S, ssid=SSID, reflector_address="fc00:3::1", segments=["fc00:2::e"], rate_pps=200)
    d.update(kw)
    return pb.StampSession(**d)


def reflector_session(**kw) -> pb.StampSession:
    d = dict(role=RF, ssid=SSID, sender_address="fc00:1::1", return_segments=["fc00:2::e2"])
    d.update(kw)
    return pb.StampSession(**d)


@pytest.fixture(scope="module")
def roles(stubs):
    a, b = stubs["A"].stamp, stubs["B"].stamp
    yield a, b
    a.Reset(pb.ResetRequest())
    b.Reset(pb.ResetRequest())


def test_before_init(roles):
    a, b = roles
    expect_error(a.CreateStampSession, pb.CreateStampSessionRequest(session=sender_session()), FP, "session.role:")
    expect_error(a.StartStampSession, pb.StartStampSessionRequest(role=S, ssid=SSID), NF, "ssid:")
    expect_error(a.Init, pb.InitRequest(), IA, "sender:")
    expect_error(
        a.Init,
        pb.InitRequest(sender=pb.StampSenderConfig(device="a0", source_address="fc00:1::zz")),
        IA,
        "sender.source_address: 'fc00:1::zz' is not an IPv6 address",
    )
    expect_error(
        b.Init, pb.InitRequest(reflector=pb.StampReflectorConfig(device="b0")), IA, "reflector.addresses: required"
    )
    expect_error(
        b.Init,
        pb.InitRequest(reflector=pb.StampReflectorConfig(device="b0", addresses=["x"])),
        IA,
        "reflector.addresses[0]: 'x' is not an IPv6 address",
    )
    msg = expect_error(
        a.Init,
        pb.InitRequest(sender=pb.StampSenderConfig(device="nope0", source_address="fc00:1::1")),
        FP,
        "sender.device:",
    )
    assert "attach failed" in msg
    assert not a.Reset(pb.ResetRequest()).changed


def test_session_produces_results(roles, stubs, lab):
    a, b = roles
    assert a.Init(pb.InitRequest(sender=pb.StampSenderConfig(device="a0", source_address="fc00:1::1"))).changed
    assert not a.Init(pb.InitRequest(sender=pb.StampSenderConfig(device="a0", source_address="fc00:1::1"))).changed
    expect_error(  # another device is fine (tests/agent/test_agent_multihomed.py); another source here is not
        a.Init,
        pb.InitRequest(sender=pb.StampSenderConfig(device="a0", source_address="fc00:1::2")),
        FP,
        "sender: device a0 already initialised with source fc00:1::1",
    )
    assert b.Init(pb.InitRequest(reflector=pb.StampReflectorConfig(device="b0", addresses=["fc00:3::1"]))).changed
    assert "xdp" in lab.run("A", ["ip", "link", "show", "a0"], check=True).stdout
    assert "xdp" in lab.run("B", ["ip", "link", "show", "b0"], check=True).stdout

    r = a.CreateStampSession(pb.CreateStampSessionRequest(session=sender_session()))
    assert r.changed and r.status.state == pb.STAMP_SESSION_STATE_CREATED
    assert not a.CreateStampSession(pb.CreateStampSessionRequest(session=sender_session())).changed
    expect_error(
        a.CreateStampSession, pb.CreateStampSessionRequest(session=sender_session(rate_pps=10)), AE, "session.ssid:"
    )
    assert b.CreateStampSession(pb.CreateStampSessionRequest(session=reflector_session())).changed

    counters = lambda: {  # noqa: E731
        s.local_sid.sid: s.counters.packets
        for s in stubs["R"]
        .srv6.ListLocalSids(  # noqa: E731
            srv6_pb2.ListLocalSidsRequest()
        )
        .local_sids
    }
    before = counters()
    drops_before = drop_counters(lab)
    # subscribe first: the stream pushes results as they arrive
    stream = a.SubscribeStampResults(pb.SubscribeStampResultsRequest(ssids=[SSID], max_delay_ms=100))
    pushed: list[pb.StampResult] = []
    cancelled: list[grpc.StatusCode] = []

    def read_stream() -> None:
        try:
            for batch in stream:
                pushed.extend(batch.results)
        except grpc.RpcError as e:  # our cancel() below ends it
            cancelled.append(e.code())

    reader = threading.Thread(target=read_stream, daemon=True)
    reader.start()
    assert b.StartStampSession(pb.StartStampSessionRequest(role=RF, ssid=SSID)).changed
    st = a.StartStampSession(pb.StartStampSessionRequest(role=S, ssid=SSID)).status
    assert st.state == pb.STAMP_SESSION_STATE_RUNNING
    assert not a.StartStampSession(pb.StartStampSessionRequest(role=S, ssid=SSID)).changed
    time.sleep(2.5)
    assert a.StopStampSession(pb.StopStampSessionRequest(role=S, ssid=SSID)).changed
    assert not a.StopStampSession(pb.StopStampSessionRequest(role=S, ssid=SSID)).changed
    time.sleep(0.5)
    stream.cancel()
    reader.join(timeout=5)
    assert cancelled == [grpc.StatusCode.CANCELLED]

    res = a.GetStampSessionResults(pb.GetStampSessionResultsRequest(ssid=SSID, max_results=100000))
    n = len(res.results)
    assert 200 <= n <= 200 * 3.5, n  # 200 pps for ~2.5 s
    assert res.next_index == n and res.round_trip.count == n
    seqs = [x.sequence for x in res.results]
    assert seqs == sorted(seqs) and len(set(seqs)) == n
    for x in res.results:
        assert x.ssid == SSID and x.t1_ns < x.t4_ns and x.t2_ns <= x.t3_ns
        assert 0 < x.round_trip_delay_ns < 50_000_000
        assert x.forward_delay_ns == x.t2_ns - x.t1_ns and x.reverse_delay_ns == x.t4_ns - x.t3_ns
    assert 0 < res.round_trip.min_us <= res.round_trip.mean_us <= res.round_trip.max_us
    # the push stream carried the same results (every one, in order)
    assert [x.index for x in pushed] == list(range(len(pushed))) and len(pushed) >= n - 5
    assert [x.sequence for x in pushed] == seqs[: len(pushed)]
    # paging
    page = a.GetStampSessionResults(pb.GetStampSessionResultsRequest(ssid=SSID, from_index=n - 10, max_results=4))
    assert [x.index for x in page.results] == list(range(n - 10, n - 6)) and page.next_index == n - 6
    # packets sent by stamp_sender (its summary) vs replies collected
    status = {(s.session.role, s.session.ssid): s for s in a.ListStampSessions(pb.ListStampSessionsRequest()).sessions}
    snd = status[(S, SSID)]
    assert snd.state == pb.STAMP_SESSION_STATE_STOPPED and snd.results_collected == n
    # the agent holds exactly what the XDP collector collected; every test packet sent came back
    # unless the lab's veths counted backlog drops (machine load), which must explain the gap exactly
    coll = json.loads(
        subprocess.run(
            [
                str(REPO / "build" / "datapath" / "stamp_collector"),
                "stats",
                "--pin-dir",
                f"/sys/fs/bpf/segscope/{PREFIX}-A/stamp_collector",
                "--json",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert coll["collected"] == n, coll
    drops = moved(drops_before, drop_counters(lab))
    print(f"\nstamp: sent {snd.packets_sent}, collected {n}, drops that moved {drops}")
    assert snd.packets_sent - n == link_rx_drops(drops), (snd.packets_sent, n, drops)
    # forward over fc00:2::e, return over fc00:2::e2: each SID saw one packet per test packet
    after = counters()
    assert after["fc00:2::e"] - before["fc00:2::e"] >= n
    assert after["fc00:2::e2"] - before["fc00:2::e2"] >= n

    # reflector stop/destroy, then the session no longer exists
    assert b.StopStampSession(pb.StopStampSessionRequest(role=RF, ssid=SSID)).changed
    assert b.DestroyStampSession(pb.DestroyStampSessionRequest(role=RF, ssid=SSID)).changed
    expect_error(b.DestroyStampSession, pb.DestroyStampSessionRequest(role=RF, ssid=SSID), NF, "ssid:")
    assert not b.DestroyStampSession(pb.DestroyStampSessionRequest(role=RF, ssid=SSID, allow_missing=True)).changed
    assert a.DestroyStampSession(pb.DestroyStampSessionRequest(role=S, ssid=SSID)).changed
    expect_error(a.GetStampSessionResults, pb.GetStampSessionResultsRequest(ssid=SSID), NF, "ssid:")
    r = a.Reset(pb.ResetRequest())
    assert r.changed and r.sessions_destroyed == 0
    assert "xdp" not in lab.run("A", ["ip", "link", "show", "a0"], check=True).stdout


BAD_SESSIONS = [
    (sender_session(role=0), "session.role: required"),
    (sender_session(ssid=0), "session.ssid: required"),
    (sender_session(ssid=70000), "session.ssid: 70000 out of range"),
    (sender_session(reflector_address=""), "session.reflector_address: required"),
    (sender_session(segments=["fc00:2::e", "q"]), "session.segments[1]: 'q' is not an IPv6 address"),
    (sender_session(return_segments=["fc00:2::e"]), "session.return_segments: not allowed with STAMP_ROLE_SENDER"),
    (sender_session(rate_pps=0), "session.rate_pps: required"),
    (sender_session(rate_pps=2_000_000), "session.rate_pps: 2000000 out of range"),
    (sender_session(timestamp_format=9), "session.timestamp_format: 9 is not"),
    (sender_session(mode=pb.STAMP_MODE_AUTHENTICATED), "session.mode: not allowed with STAMP_ROLE_SENDER"),
    (sender_session(sender_port=70000), "session.sender_port: 70000 out of range"),
    (sender_session(padding_bytes=5000), "session.padding_bytes: 5000 out of range"),
    (reflector_session(sender_address=""), "session.sender_address: required"),
    (reflector_session(segments=["fc00:2::e"]), "session.segments: not allowed with STAMP_ROLE_REFLECTOR"),
    (reflector_session(rate_pps=5), "session.rate_pps: not allowed with STAMP_ROLE_REFLECTOR"),
    (reflector_session(return_segments=["zz"]), "session.return_segments[0]: 'zz' is not"),
    (sender_session(segments=[], reduced=True), "session.segments: 0 SIDs with reduced: give exactly one"),
    (sender_session(segments=["fc00:2::e", "fc00:3::e"], reduced=True), "session.segments: 2 SIDs with reduced"),
    (reflector_session(reduced=True), "session.reduced: not allowed with STAMP_ROLE_REFLECTOR"),
]


@pytest.mark.parametrize(
    "session,msg", BAD_SESSIONS, ids=[m.split(":")[0] + "-" + str(i) for i, (_, m) in enumerate(BAD_SESSIONS)]
)
def test_bad_session_names_the_field(roles, session, msg):
    got = expect_error(
        roles[0].CreateStampSession, pb.CreateStampSessionRequest(session=session), IA, msg.split(":")[0] + ":"
    )
    assert got.startswith(msg), got


def test_bad_requests_name_the_field(roles):
    a, _ = roles
    expect_error(a.StartStampSession, pb.StartStampSessionRequest(role=S, ssid=0), IA, "ssid: required")
    expect_error(a.StartStampSession, pb.StartStampSessionRequest(ssid=1), IA, "role: required")
    expect_error(a.StartStampSession, pb.StartStampSessionRequest(role=S, ssid=1, duration_s=-1), IA, "duration_s:")
    expect_error(a.StopStampSession, pb.StopStampSessionRequest(role=S, ssid=99), NF, "ssid: no sender session 99")
    expect_error(
        a.GetStampSessionResults, pb.GetStampSessionResultsRequest(ssid=1, max_results=200000), IA, "max_results:"
    )
    with pytest.raises(grpc.RpcError) as e:
        next(iter(a.SubscribeStampResults(pb.SubscribeStampResultsRequest(ssids=[0]))))
    assert e.value.code() == IA and e.value.details().startswith("ssids[0]: required")


def _children_of_instance(instance: str, netns: str) -> list[str]:
    """Command lines of running processes that belong to an agent instance (pin dir, or our sender ports
    in its namespace: another checkout's senders on this machine use the same ports in theirs)."""
    import pathlib

    found = []
    for proc in pathlib.Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"/{instance}/" in cmd or ("stamp_sender" in cmd and f"--netns {netns} " in cmd and "--sport 5009" in cmd):
            found.append(cmd.strip())
    return found


def test_a_killed_agent_is_replaced_cleanly(lab, pki, tmp_path):
    """With --adopt-timeout 0 (no hitless restarts: test_agent_adoption.py has those) SIGKILL leaves
    the XDP collector attached and pinned; the next agent's Init clears it. The agent's children
    (ring-buffer reader, stamp_sender) die with it (PDEATHSIG), so the next agent's sender gets its
    UDP port; a sender that cannot start is FAILED with its error."""
    import os
    import signal as sig
    import socket
    import time

    from segscope_proto.segscope.agent.v1 import stamp_pb2_grpc
    from tests.agent.agent_env import start_agent
    from tests.datapath.dp_env import in_netns

    def _status(stub, ssid: int) -> pb.StampSessionStatus:
        sessions = stub.ListStampSessions(pb.ListStampSessionsRequest()).sessions
        return next(st for st in sessions if st.session.role == S and st.session.ssid == ssid)

    init = pb.InitRequest(sender=pb.StampSenderConfig(device="ah", source_address="fd00:a::2"))
    session = sender_session(ssid=91, sender_port=50091, rate_pps=50, segments=[])
    no_adoption = ["--adopt-timeout", "0"]
    first = start_agent(
        lab.ns("A"), "A", tmp_path / "first", pki=pki, instance=f"{lab.prefix}-A-kill", extra_args=no_adoption
    )
    with first.channel() as ch:
        a = stamp_pb2_grpc.StampServiceStub(ch)
        assert a.Init(init).changed
        a.CreateStampSession(pb.CreateStampSessionRequest(session=session))
        a.StartStampSession(pb.StartStampSessionRequest(role=S, ssid=91))
    time.sleep(0.5)
    assert any("stamp_sender" in c for c in _children_of_instance(f"{lab.prefix}-A-kill", lab.ns("A"))), (
        "the sender did not start"
    )
    os.killpg(first.proc.pid, sig.SIGKILL)
    first.proc.wait()
    deadline = time.monotonic() + 5
    while _children_of_instance(f"{lab.prefix}-A-kill", lab.ns("A")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _children_of_instance(f"{lab.prefix}-A-kill", lab.ns("A")) == []  # reader and sender went with the agent
    assert "xdp" in lab.run("A", ["ip", "link", "show", "ah"], check=True).stdout  # left behind
    second = start_agent(
        lab.ns("A"), "A", tmp_path / "second", pki=pki, instance=f"{lab.prefix}-A-kill", extra_args=no_adoption
    )
    blocker = None
    try:
        with second.channel() as ch:
            s = stamp_pb2_grpc.StampServiceStub(ch)
            assert s.Init(init).changed
            s.CreateStampSession(pb.CreateStampSessionRequest(session=session))
            s.StartStampSession(pb.StartStampSessionRequest(role=S, ssid=91))
            time.sleep(1.0)
            st = _status(s, 91)
            assert (st.state, st.error) == (pb.STAMP_SESSION_STATE_RUNNING, "")  # the port was free
            # a port someone else holds: the sender exits at once, the session says FAILED and why
            with in_netns(lab.ns("A")):
                blocker = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
                blocker.bind(("fd00:a::2", 50092))
            s.CreateStampSession(pb.CreateStampSessionRequest(session=sender_session(ssid=92, sender_port=50092)))
            s.StartStampSession(pb.StartStampSessionRequest(role=S, ssid=92))
            time.sleep(1.0)
            st = _status(s, 92)
            assert st.state == pb.STAMP_SESSION_STATE_FAILED
            assert "stamp_sender exited" in st.error and "in use" in st.error, st.error
            assert s.Reset(pb.ResetRequest()).changed
        assert "xdp" not in lab.run("A", ["ip", "link", "show", "ah"], check=True).stdout
        assert "from a previous agent; detaching it first" in second.log()
    finally:
        if blocker is not None:
            blocker.close()
        assert second.stop() == 0
    assert _children_of_instance(f"{lab.prefix}-A-kill", lab.ns("A")) == []
