"""The agent with --kafka: the STAMP results it collects are published as stamp_batch to
segscope.stamp.records (key "<node>/<ssid>", what the delay processor consumes), and its node view
(collectors/topology's NodeViewPublisher) reaches segscope.topology with the agent's
`stamp_sessions` section."""
from __future__ import annotations

import json
import time
import uuid

import pytest

from segscope_proto.segscope.agent.v1 import stamp_pb2 as pb
from segscope_proto.segscope.agent.v1 import stamp_pb2_grpc
from segscope_schemas.stamp_record import decode_batch
from tests.agent.agent_env import start_agent

SSID = 4711
pytestmark = pytest.mark.e2e


def consume(bootstrap: str, topic: str, keep, until, timeout_s: float = 30.0) -> list:
    from confluent_kafka import Consumer
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"agt-test-{uuid.uuid4().hex[:8]}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    out, deadline = [], time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and not until(out):
            msg = c.poll(0.2)
            if msg is None or msg.error():
                continue
            item = keep(msg)
            if item is not None:
                out.append(item)
    finally:
        c.close()
    return out


def test_stamp_records_and_node_view_reach_kafka(lab, stack, stubs, tmp_path):
    bootstrap = stack.kafka_bootstrap
    agent = start_agent(lab.ns("A"), "A", tmp_path, kafka=bootstrap, instance="agt-A-kafka",
                        extra_args=["--topology-interval", "5"])
    b = stubs["B"].stamp
    t0_tai = time.clock_gettime_ns(time.CLOCK_TAI) - 1_000_000_000
    try:
        with agent.channel() as ch:
            a = stamp_pb2_grpc.StampServiceStub(ch)
            a.Init(pb.InitRequest(sender=pb.StampSenderConfig(device="a0", source_address="fc00:1::1")))
            b.Init(pb.InitRequest(reflector=pb.StampReflectorConfig(device="b0", addresses=["fc00:3::1"])))
            b.CreateStampSession(pb.CreateStampSessionRequest(session=pb.StampSession(
                role=pb.STAMP_ROLE_REFLECTOR, ssid=SSID, sender_address="fc00:1::1", return_segments=["fc00:2::e"])))
            b.StartStampSession(pb.StartStampSessionRequest(role=pb.STAMP_ROLE_REFLECTOR, ssid=SSID))
            a.CreateStampSession(pb.CreateStampSessionRequest(session=pb.StampSession(
                role=pb.STAMP_ROLE_SENDER, ssid=SSID, reflector_address="fc00:3::1", segments=["fc00:2::e"],
                rate_pps=100)))
            a.StartStampSession(pb.StartStampSessionRequest(role=pb.STAMP_ROLE_SENDER, ssid=SSID, duration_s=1.5))
            time.sleep(2.5)
            held = a.GetStampSessionResults(pb.GetStampSessionResultsRequest(ssid=SSID, max_results=10000)).results

            def keep_records(msg):
                if msg.key() != f"A/{SSID}".encode():
                    return None
                hdr, recs = decode_batch(msg.value())
                return [r for r in recs if r["t1_ns"] >= t0_tai]
            batches = consume(bootstrap, "segscope.stamp.records", keep_records,
                              lambda got: sum(len(x) for x in got) >= len(held))
            recs = [r for batch in batches for r in batch]
            assert len(held) >= 100 and len(recs) == len(held)
            assert sorted(int(r["sender_seq"]) for r in recs) == [x.sequence for x in held]
            assert all(int(r["ssid"]) == SSID for r in recs)

            def keep_views(msg):
                if msg.key() != b"A":
                    return None
                view = json.loads(msg.value())
                return view if any(s.get("ssid") == SSID for s in view.get("stamp_sessions", [])) else None
            views = consume(bootstrap, "segscope.topology", keep_views, lambda got: bool(got))
            assert views, "no node view of A with the STAMP session on segscope.topology"
            sess = [s for s in views[-1]["stamp_sessions"] if s["ssid"] == SSID][0]
            assert sess["role"] == "STAMP_ROLE_SENDER" and sess["segments"] == ["fc00:2::e"]
            a.Reset(pb.ResetRequest())
    finally:
        b.Reset(pb.ResetRequest())
        assert agent.stop() == 0


def test_altmark_blocks_reach_kafka(lab, stack, tmp_path):
    """A TX flow monitor started through an agent with --kafka: altmark_collector (run by the agent)
    emits one block record per closed block; the blocks' packets add up to what was sent."""
    from segscope_proto.segscope.agent.v1 import flowmon_pb2 as fm, flowmon_pb2_grpc
    from segscope_schemas.altmark_block import decode_batch as decode_blocks
    import sys
    fid = 4712
    t0_tai = time.clock_gettime_ns(time.CLOCK_TAI)
    agent = start_agent(lab.ns("A"), "A", tmp_path, kafka=stack.kafka_bootstrap, instance="agt-A-kafka2")
    try:
        with agent.channel() as ch:
            f = flowmon_pb2_grpc.FlowMonitorServiceStub(ch)
            f.StartFlowMonitor(fm.StartFlowMonitorRequest(monitor=fm.FlowMonitor(
                side=fm.FLOW_MONITOR_SIDE_TX, flow_id=fid, device="a0", method=fm.MARKING_METHOD_DSCP,
                segments=["fc00:2::e", "fc00:3::d6"], period_ms=200)))
            time.sleep(0.5)
            sent = int(lab.run("H1", [sys.executable, "-c",
                                      "import socket,time\ns=socket.socket(socket.AF_INET6,socket.SOCK_DGRAM)\n"
                                      "for i in range(300):\n s.sendto(b'z'*80,('fd00:b::1',40002)); time.sleep(0.002)\n"
                                      "print(300)"], check=True).stdout)
            time.sleep(1.0)   # the blocks of the traffic close (T = 200 ms) and are collected (+T/2)
            total = f.GetFlowMonitorResults(fm.GetFlowMonitorResultsRequest(
                side=fm.FLOW_MONITOR_SIDE_TX, flow_id=fid)).total_packets
            assert total == sent

            def keep(msg):
                if msg.key() != f"A/{fid}".encode():
                    return None
                _, recs = decode_blocks(msg.value())
                return [(int(r["block_index"]), int(r["packets"])) for r in recs
                        if int(r["direction"]) == 1 and int(r["block_start_ns"]) >= t0_tai - 200_000_000]
            got = consume(stack.kafka_bootstrap, "segscope.altmark.blocks", keep,
                          lambda g: sum(p for batch in g for _, p in batch) >= sent, timeout_s=20)
            blocks = dict(b for batch in got for b in batch)
            assert sum(blocks.values()) == sent, blocks
            f.StopFlowMonitor(fm.StopFlowMonitorRequest(side=fm.FLOW_MONITOR_SIDE_TX, flow_id=fid))
    finally:
        assert agent.stop() == 0
