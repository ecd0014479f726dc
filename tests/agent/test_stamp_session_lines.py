"""segscope_stamp_session lines (schemas/metrics.md): the path as the operator wrote it rides in
tag `written` when the session has one, and no such tag otherwise."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from agent.stamp import Session, StampAgent
from segscope_proto.segscope.agent.v1 import stamp_pb2 as pb


def lines(*specs: pb.StampSession) -> list[str]:
    sessions = {(s.role, s.ssid): Session(spec=s) for s in specs}
    return StampAgent.session_lines(SimpleNamespace(lock=threading.Lock(), sessions=sessions), "A", 7)


def test_the_written_path_is_a_tag_of_the_session_line():
    usid = pb.StampSession(
        role=pb.STAMP_ROLE_SENDER, ssid=1, segments=["fcbb:bbbb:200:300:400::"], written="usid(200,300,400)", rate_pps=5
    )
    link = pb.StampSession(role=pb.STAMP_ROLE_SENDER, ssid=2, written="link:a1", rate_pps=5)
    plain = pb.StampSession(role=pb.STAMP_ROLE_SENDER, ssid=3, segments=["fc00:2::e"], rate_pps=5)
    got = lines(usid, link, plain)
    assert got[0].startswith(
        "segscope_stamp_session,node=A,ssid=1,role=sender,path=fcbb:bbbb:200:300:400::,return_path=direct,"
        "written=usid(200\\,300\\,400) "
    ), got[0]
    assert ",path=direct,return_path=direct,written=link:a1 " in got[1], got[1]
    assert "written" not in got[2], got[2]


def test_the_written_path_is_a_tag_of_the_flow_line():
    from agent.flowmon import RX, TX, FlowMonAgent, Side
    from segscope_proto.segscope.agent.v1 import flowmon_pb2 as fm

    container = "fcbb:bbbb:200:300:400:d6::"
    tx = fm.FlowMonitor(
        side=TX, flow_id=21, device="a0", segments=[container], period_ms=1000, written="usid(200,300,400,d6)"
    )
    rx = fm.FlowMonitor(side=RX, flow_id=21, device="b0", period_ms=1000)
    sides = {TX: Side("a0", {21: tx}), RX: Side("b0", {21: rx})}
    got = FlowMonAgent.flow_lines(SimpleNamespace(lock=threading.Lock(), sides=sides), "A", 7)
    assert ",device=a0,written=usid(200\\,300\\,400\\,d6) " in got[0], got
    assert "written" not in got[1], got
