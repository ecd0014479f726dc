"""A multi-homed node: STAMP senders and reflectors on several devices of one node at once.

On line5_two_paths, A is a sender on a0 (to B over R) and on ah (to H1, one hop), and B is a
reflector on b0 (for A) and on bh (for H2): one collector program on two devices of A, one
reflector program on two devices of B, each sharing its maps (sessions, ring buffer, counters).
H1 (reflector on h1) and H2 (sender on h2) get agents of their own. Every session's results
come back complete; Reset detaches the program from every device.
"""

from __future__ import annotations

import time

import grpc

from segscope_proto.segscope.agent.v1 import stamp_pb2 as pb
from segscope_proto.segscope.agent.v1 import stamp_pb2_grpc
from tests.agent.agent_env import start_agent
from tests.agent.conftest import expect_error

S, RF = pb.STAMP_ROLE_SENDER, pb.STAMP_ROLE_REFLECTOR
RATE, RUN_S = 50, 2.0


def sender(dev: str, source: str) -> pb.InitRequest:
    return pb.InitRequest(sender=pb.StampSenderConfig(device=dev, source_address=source))


def reflector(dev: str, address: str, port: int = 0) -> pb.InitRequest:
    return pb.InitRequest(reflector=pb.StampReflectorConfig(device=dev, addresses=[address], udp_port=port))


def xdp_on(lab, node: str, dev: str) -> bool:
    return "xdp" in lab.run(node, ["ip", "link", "show", dev], check=True).stdout


def test_senders_and_reflectors_on_two_devices_of_one_node(lab, stubs, pki, tmp_path):
    a, b = stubs["A"].stamp, stubs["B"].stamp
    h1 = start_agent(lab.ns("H1"), "H1", tmp_path, pki=pki, instance=f"{lab.prefix}-H1")
    h2 = start_agent(lab.ns("H2"), "H2", tmp_path, pki=pki, instance=f"{lab.prefix}-H2")
    try:
        with h1.channel() as c1, h2.channel() as c2:
            r1, s2 = stamp_pb2_grpc.StampServiceStub(c1), stamp_pb2_grpc.StampServiceStub(c2)
            # A: the collector on a0, then on ah as well; B: the reflector on b0, then on bh
            assert a.Init(sender("a0", "fc00:1::1")).changed
            assert a.Init(sender("ah", "fd00:a::2")).changed
            assert not a.Init(sender("ah", "fd00:a::2")).changed
            assert b.Init(
                pb.InitRequest(reflector=pb.StampReflectorConfig(device="b0", addresses=["fc00:3::1"]))
            ).changed
            assert b.Init(
                pb.InitRequest(reflector=pb.StampReflectorConfig(device="bh", addresses=["fd00:b::2"]))
            ).changed
            expect_error(  # one reflector port per node
                b.Init,
                reflector("bh", "fd00:b::2", 863),
                grpc.StatusCode.FAILED_PRECONDITION,
                "reflector.udp_port:",
            )
            assert all(xdp_on(lab, n, d) for n, d in (("A", "a0"), ("A", "ah"), ("B", "b0"), ("B", "bh")))
            assert r1.Init(
                pb.InitRequest(reflector=pb.StampReflectorConfig(device="h1", addresses=["fd00:a::1"]))
            ).changed
            assert s2.Init(sender("h2", "fd00:b::1")).changed

            sessions = {  # ssid: (sender stub, sender session, reflector stub, reflector session)
                81: (a, dict(reflector_address="fc00:3::1", segments=["fc00:2::e"]), b,
                     dict(sender_address="fc00:1::1", return_segments=["fc00:2::e2"])),
                82: (a, dict(sender_address="fd00:a::2", reflector_address="fd00:a::1"), r1,
                     dict(sender_address="fd00:a::2")),
                83: (s2, dict(reflector_address="fd00:b::2"), b, dict(sender_address="fd00:b::1")),
            }  # fmt: skip
            for ssid, (snd, sspec, rfl, rspec) in sessions.items():
                rfl.CreateStampSession(
                    pb.CreateStampSessionRequest(session=pb.StampSession(role=RF, ssid=ssid, **rspec))
                )
                rfl.StartStampSession(pb.StartStampSessionRequest(role=RF, ssid=ssid))
                snd.CreateStampSession(
                    pb.CreateStampSessionRequest(session=pb.StampSession(role=S, ssid=ssid, rate_pps=RATE, **sspec))
                )
            for ssid, (snd, *_rest) in sessions.items():
                snd.StartStampSession(pb.StartStampSessionRequest(role=S, ssid=ssid, duration_s=RUN_S))

            def status(snd, ssid):
                return {x.session.ssid: x for x in snd.ListStampSessions(pb.ListStampSessionsRequest()).sessions}[ssid]

            time.sleep(1.3)  # the senders rewrite their live counters every second
            for ssid, (snd, *_rest) in sessions.items():
                st = status(snd, ssid)  # live while running, not only after the run
                assert st.state == pb.STAMP_SESSION_STATE_RUNNING, (ssid, st)
                assert RATE * 0.9 <= st.packets_sent < RATE * RUN_S, (ssid, st.packets_sent)
            time.sleep(RUN_S + 0.2)
            for ssid, (snd, *_rest) in sessions.items():
                st = status(snd, ssid)
                assert st.state == pb.STAMP_SESSION_STATE_STOPPED, (ssid, st)
                assert st.packets_sent == RATE * RUN_S == st.results_collected, (ssid, st)
                res = snd.GetStampSessionResults(pb.GetStampSessionResultsRequest(ssid=ssid, max_results=10000))
                seqs = [x.sequence for x in res.results]
                # every packet of the run came back, through the device its path ends on
                assert seqs == list(range(int(RATE * RUN_S))), (ssid, len(seqs))
                assert all(0 < x.round_trip_delay_ns < 50_000_000 for x in res.results), ssid
            assert a.Reset(pb.ResetRequest()).changed and b.Reset(pb.ResetRequest()).changed
            assert not any(xdp_on(lab, n, d) for n, d in (("A", "a0"), ("A", "ah"), ("B", "b0"), ("B", "bh")))
            r1.Reset(pb.ResetRequest())
            s2.Reset(pb.ResetRequest())
    finally:
        a.Reset(pb.ResetRequest())
        b.Reset(pb.ResetRequest())
        assert h1.stop() == 0 and h2.stop() == 0
