"""The agent with --kafka: the STAMP results it collects are published as stamp_batch to
segscope.stamp.records (key "<node>/<ssid>", what the delay processor consumes), its node view
(collectors/topology's NodeViewPublisher) reaches segscope.topology with the agent's
`stamp_sessions` section, and the session's SID list reaches segscope.paths (schemas/paths.md:
a record on create, a tombstone on Reset). tests/e2e/test_stamp_pipeline.py reads the `path` it
gives stamp_delay back from InfluxDB."""

from __future__ import annotations

import json
import time
import uuid

import grpc
import pytest

from segscope_proto.segscope.agent.v1 import stamp_pb2 as pb
from segscope_proto.segscope.agent.v1 import stamp_pb2_grpc
from segscope_schemas import path_record
from segscope_schemas.stamp_record import decode_batch
from tests.agent.agent_env import start_agent
from tests.isolation import own_name

AGM = own_name("agm")  # the agents' instances (pin dirs) of the Kafka test

SSID = 4711
pytestmark = pytest.mark.e2e


def consume(bootstrap: str, topic: str, keep, until, timeout_s: float = 30.0) -> list:
    from confluent_kafka import Consumer

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"agt-test-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
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


def check_health_endpoint(agent, delivered: int) -> None:
    """--health: /healthz and /readyz answer 200 (the counters reach Kafka), /metrics carries the
    segscope.metrics lines: the streamer delivered what the sender's session collected."""
    import re
    import urllib.request

    port = re.search(r"agent health on http://127.0.0.1:(\d+)/healthz", agent.log()).group(1)
    base = f"http://127.0.0.1:{port}"
    for path, want in (("/healthz", "ok\n"), ("/readyz", "ready\n")):
        with urllib.request.urlopen(base + path, timeout=3) as r:
            assert (r.status, r.read().decode()) == (200, want)
    deadline, text = time.monotonic() + 15, ""
    while time.monotonic() < deadline:
        with urllib.request.urlopen(base + "/metrics", timeout=3) as r:
            text = r.read().decode()
        got = re.search(r'^segscope_streamer_records_delivered\{node="A",records="stamp"\} (\d+)$', text, re.M)
        rpcs = re.search(r'^segscope_agent_rpcs\{node="A"\} (\d+)$', text, re.M)
        # both come from the agent's stats tick (1 s): the last RPC can be one tick behind the records
        if got and int(got.group(1)) >= delivered and rpcs and int(rpcs.group(1)) >= 4:
            break
        time.sleep(0.3)
    assert got and int(got.group(1)) == delivered, text
    assert re.search(r'^segscope_streamer_records_failed\{node="A",records="stamp"\} 0$', text, re.M), text
    assert rpcs and int(rpcs.group(1)) >= 4, text  # Init, Create, Start, Get at least
    assert re.search(r'^segscope_datapath_\w+\{node="A",program="stamp_collector"\} \d+$', text, re.M), text
    assert 'segscope_up{process="agent-A"} 1' in text


def test_stamp_records_and_node_view_reach_kafka(lab, stack, stubs, tmp_path):
    bootstrap = stack.kafka_bootstrap
    agent = start_agent(
        lab.ns("A"),
        "A",
        tmp_path,
        kafka=bootstrap,
        instance=f"{lab.prefix}-A-kafka",
        extra_args=["--topology-interval", "5", "--health", "127.0.0.1:0"],
    )
    b = stubs["B"].stamp
    t0_tai = time.clock_gettime_ns(time.CLOCK_TAI) - 1_000_000_000
    t0_utc = time.time_ns() - 1_000_000_000
    try:
        with agent.channel() as ch:
            a = stamp_pb2_grpc.StampServiceStub(ch)
            a.Init(pb.InitRequest(sender=pb.StampSenderConfig(device="a0", source_address="fc00:1::1")))
            b.Init(pb.InitRequest(reflector=pb.StampReflectorConfig(device="b0", addresses=["fc00:3::1"])))
            b.CreateStampSession(
                pb.CreateStampSessionRequest(
                    session=pb.StampSession(
                        role=pb.STAMP_ROLE_REFLECTOR,
                        ssid=SSID,
                        sender_address="fc00:1::1",
                        return_segments=["fc00:2::e"],
                    )
                )
            )
            b.StartStampSession(pb.StartStampSessionRequest(role=pb.STAMP_ROLE_REFLECTOR, ssid=SSID))
            a.CreateStampSession(
                pb.CreateStampSessionRequest(
                    session=pb.StampSession(
                        role=pb.STAMP_ROLE_SENDER,
                        ssid=SSID,
                        reflector_address="fc00:3::1",
                        segments=["fc00:2::e"],
                        rate_pps=100,
                    )
                )
            )
            a.StartStampSession(pb.StartStampSessionRequest(role=pb.STAMP_ROLE_SENDER, ssid=SSID, duration_s=1.5))
            time.sleep(2.5)
            held = a.GetStampSessionResults(pb.GetStampSessionResultsRequest(ssid=SSID, max_results=10000)).results

            def keep_records(msg):
                if msg.key() != b"A":  # the streamer keys by node (--key node, its default)
                    return None
                hdr, recs = decode_batch(msg.value())
                return [r for r in recs if r["ssid"] == SSID and r["t1_ns"] >= t0_tai]

            batches = consume(
                bootstrap, "segscope.stamp.records", keep_records, lambda got: sum(len(x) for x in got) >= len(held)
            )
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
            check_health_endpoint(agent, len(held))
            a.Reset(pb.ResetRequest())

            # segscope.paths: the sender session's record (published at create), then its tombstone
            key = f"stamp/A/{SSID}/sender".encode()

            def keep_paths(msg):
                if msg.key() != key:
                    return None
                rec = path_record.decode(msg.key(), msg.value())
                return "tombstone" if rec is None else rec

            def fresh_then_deleted(got) -> bool:  # the topic may hold earlier runs' records of the key
                fresh = [i for i, r in enumerate(got) if r != "tombstone" and r.ts_ns >= t0_utc]
                return bool(fresh) and "tombstone" in got[fresh[0] :]

            got = consume(bootstrap, "segscope.paths", keep_paths, fresh_then_deleted)
            assert fresh_then_deleted(got), got
            rec = [r for r in got if r != "tombstone" and r.ts_ns >= t0_utc][0]
            assert rec.path == ("fc00:2::e",) and rec.role == "sender" and rec.node == "A"
            assert path_record.path_tag(rec) == "fc00:2::e"
    finally:
        b.Reset(pb.ResetRequest())
        assert agent.stop() == 0


def test_altmark_blocks_reach_kafka(lab, stack, tmp_path):
    """A TX flow monitor started through an agent with --kafka: altmark_collector (run by the agent)
    emits one block record per closed block; the blocks' packets add up to what was sent."""
    import sys

    from segscope_proto.segscope.agent.v1 import flowmon_pb2 as fm
    from segscope_proto.segscope.agent.v1 import flowmon_pb2_grpc
    from segscope_schemas.altmark_block import decode_batch as decode_blocks

    fid = 4712
    t0_tai = time.clock_gettime_ns(time.CLOCK_TAI)
    agent = start_agent(lab.ns("A"), "A", tmp_path, kafka=stack.kafka_bootstrap, instance=f"{lab.prefix}-A-kafka2")
    try:
        with agent.channel() as ch:
            f = flowmon_pb2_grpc.FlowMonitorServiceStub(ch)
            f.StartFlowMonitor(
                fm.StartFlowMonitorRequest(
                    monitor=fm.FlowMonitor(
                        side=fm.FLOW_MONITOR_SIDE_TX,
                        flow_id=fid,
                        device="a0",
                        method=fm.MARKING_METHOD_DSCP,
                        segments=["fc00:2::e", "fc00:3::d6"],
                        period_ms=200,
                    )
                )
            )
            time.sleep(0.5)
            sent = int(
                lab.run(
                    "H1",
                    [
                        sys.executable,
                        "-c",
                        "import socket,time\ns=socket.socket(socket.AF_INET6,socket.SOCK_DGRAM)\n"
                        "for i in range(300):\n s.sendto(b'z'*80,('fd00:b::1',40002)); time.sleep(0.002)\n"
                        "print(300)",
                    ],
                    check=True,
                ).stdout
            )
            time.sleep(1.0)  # the blocks of the traffic close (T = 200 ms) and are collected (+T/2)
            total = f.GetFlowMonitorResults(
                fm.GetFlowMonitorResultsRequest(side=fm.FLOW_MONITOR_SIDE_TX, flow_id=fid)
            ).total_packets
            assert total == sent

            def keep(msg):
                if msg.key() != f"A/{fid}".encode():
                    return None
                _, recs = decode_blocks(msg.value())
                return [
                    (int(r["block_index"]), int(r["packets"]))
                    for r in recs
                    if int(r["direction"]) == 1 and int(r["block_start_ns"]) >= t0_tai - 200_000_000
                ]

            got = consume(
                stack.kafka_bootstrap,
                "segscope.altmark.blocks",
                keep,
                lambda g: sum(p for batch in g for _, p in batch) >= sent,
                timeout_s=20,
            )
            blocks = dict(b for batch in got for b in batch)
            assert sum(blocks.values()) == sent, blocks
            f.StopFlowMonitor(fm.StopFlowMonitorRequest(side=fm.FLOW_MONITOR_SIDE_TX, flow_id=fid))
    finally:
        assert agent.stop() == 0


def _stats_json(program: str, pin_dir: str) -> dict[str, int]:
    import subprocess

    from tests.agent.agent_env import REPO

    r = subprocess.run(
        [str(REPO / "build" / "datapath" / program), "stats", "--pin-dir", pin_dir, "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(r.stdout)


def _influx_rows(
    stack, measurement: str, node: str, since_ns: int, program: str | None = None, settled: bool = False
) -> list[dict]:
    """Rows since since_ns; settled: only points written completely (the agents are still writing,
    and InfluxDB 1.x can return a point mid-write with some fields null: Stack.influx_query_settled)."""
    where = f"\"node\" = '{node}' AND time > {since_ns}"
    if program:
        where += f" AND \"program\" = '{program}'"
    query = f'SELECT * FROM "{measurement}" WHERE {where}'
    rows = stack.influx_query_settled(query, settle_s=0.5) if settled else stack.influx_query(query)
    return sorted(rows, key=lambda r: r["time"])


def test_datapath_and_agent_counters_reach_influx(lab, stack, tmp_path):
    """With --kafka every attached datapath program's counters arrive as segscope_datapath lines
    (field names = the loader's `stats --json`), and the agent's own counters as segscope_agent:
    - a line stamped between two `stats --json` reads is bounded by them counter by counter, and
      equal to them when the program was quiet in between (exact, not approximate);
    - each counter is monotonic over the run; the STAMP counters add up to what was sent;
    - segscope_agent counts the calls, the one failed call and the records streamed;
    - the sender's agent reports its streaming as segscope_streamer (stamp_streamer's names)."""
    from segscope_proto.segscope.agent.v1 import flowmon_pb2 as fm
    from segscope_proto.segscope.agent.v1 import flowmon_pb2_grpc

    tag = uuid.uuid4().hex[:6]
    node_a, node_b = f"agmA{tag}", f"agmB{tag}"  # unique tags: other runs write node=A too
    ssid, fid, rate, duration = 4713, 4714, 100, 1.5
    since = time.time_ns()
    a_agent = start_agent(
        lab.ns("A"),
        node_a,
        tmp_path,
        kafka=stack.kafka_bootstrap,
        instance=f"{AGM}-A",
        extra_args=["--stats-interval", "0.5"],
    )
    b_agent = start_agent(
        lab.ns("B"),
        node_b,
        tmp_path,
        kafka=stack.kafka_bootstrap,
        instance=f"{AGM}-B",
        extra_args=["--stats-interval", "0.5"],
    )
    pins = {
        "stamp_collector": f"/sys/fs/bpf/segscope/{AGM}-A/stamp_collector",
        "altmark_tx": f"/sys/fs/bpf/segscope/{AGM}-A/altmark_tx",
        "stamp_reflector": f"/sys/fs/bpf/segscope/{AGM}-B/stamp_reflector",
        "altmark_rx": f"/sys/fs/bpf/segscope/{AGM}-B/altmark_rx",
    }
    node_of = {"stamp_collector": node_a, "altmark_tx": node_a, "stamp_reflector": node_b, "altmark_rx": node_b}
    try:
        with a_agent.channel() as cha, b_agent.channel() as chb:
            a, b = stamp_pb2_grpc.StampServiceStub(cha), stamp_pb2_grpc.StampServiceStub(chb)
            fa, fb = flowmon_pb2_grpc.FlowMonitorServiceStub(cha), flowmon_pb2_grpc.FlowMonitorServiceStub(chb)
            b.Init(pb.InitRequest(reflector=pb.StampReflectorConfig(device="b0", addresses=["fc00:3::1"])))
            b.CreateStampSession(
                pb.CreateStampSessionRequest(
                    session=pb.StampSession(
                        role=pb.STAMP_ROLE_REFLECTOR,
                        ssid=ssid,
                        sender_address="fc00:1::1",
                        return_segments=["fc00:2::e"],
                    )
                )
            )
            b.StartStampSession(pb.StartStampSessionRequest(role=pb.STAMP_ROLE_REFLECTOR, ssid=ssid))
            fb.StartFlowMonitor(
                fm.StartFlowMonitorRequest(
                    monitor=fm.FlowMonitor(
                        side=fm.FLOW_MONITOR_SIDE_RX,
                        flow_id=fid,
                        device="bh",
                        method=fm.MARKING_METHOD_DSCP,
                        segments=["fc00:2::e", "fc00:3::d6"],
                        period_ms=200,
                    )
                )
            )
            a.Init(pb.InitRequest(sender=pb.StampSenderConfig(device="a0", source_address="fc00:1::1")))
            fa.StartFlowMonitor(
                fm.StartFlowMonitorRequest(
                    monitor=fm.FlowMonitor(
                        side=fm.FLOW_MONITOR_SIDE_TX,
                        flow_id=fid,
                        device="a0",
                        method=fm.MARKING_METHOD_DSCP,
                        segments=["fc00:2::e", "fc00:3::d6"],
                        period_ms=200,
                    )
                )
            )
            a.CreateStampSession(
                pb.CreateStampSessionRequest(
                    session=pb.StampSession(
                        role=pb.STAMP_ROLE_SENDER,
                        ssid=ssid,
                        reflector_address="fc00:3::1",
                        segments=["fc00:2::e"],
                        rate_pps=rate,
                    )
                )
            )
            a.StartStampSession(pb.StartStampSessionRequest(role=pb.STAMP_ROLE_SENDER, ssid=ssid, duration_s=duration))
            try:  # one failing call: counted in rpc_errors
                a.StopStampSession(pb.StopStampSessionRequest(role=pb.STAMP_ROLE_SENDER, ssid=ssid + 1))
                raise AssertionError("StopStampSession of an unknown session succeeded")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.NOT_FOUND
            rpcs_a = 6  # Init, StartFlowMonitor, Create, Start, the failed Stop, ListStampSessions below
            time.sleep(duration + 1.0)
            sent = [s for s in a.ListStampSessions(pb.ListStampSessionsRequest()).sessions if s.session.ssid == ssid][
                0
            ].packets_sent
            assert sent == rate * duration

            # two reads of every program 2 s apart (>= 4 ticks of 0.5 s in between)
            before = {p: _stats_json(p, d) for p, d in pins.items()}
            t1 = time.time_ns()
            time.sleep(2.0)
            t2 = time.time_ns()
            after = {p: _stats_json(p, d) for p, d in pins.items()}
            assert before["stamp_reflector"]["reflected"] == sent
            assert before["stamp_collector"]["collected"] == sent
            assert before["stamp_collector"] == after["stamp_collector"], "the collector was not quiet"
            assert before["stamp_reflector"] == after["stamp_reflector"], "the reflector was not quiet"

            deadline = time.monotonic() + 30
            rows: dict[str, list[dict]] = {}
            while time.monotonic() < deadline:
                rows = {p: _influx_rows(stack, "segscope_datapath", node_of[p], since, p) for p in pins}
                agent_rows = _influx_rows(stack, "segscope_agent", node_a, since)
                if all(any(r["time"] > t2 for r in rs) for rs in rows.values()) and any(
                    r["time"] > t2 for r in agent_rows
                ):
                    break
                time.sleep(1)
            rows = {p: _influx_rows(stack, "segscope_datapath", node_of[p], since, p, settled=True) for p in pins}
            agent_rows = _influx_rows(stack, "segscope_agent", node_a, since, settled=True)
            for prog, rs in rows.items():
                window = [r for r in rs if t1 < r["time"] < t2]
                assert len(window) >= 2, f"{prog}: {len(window)} lines between the two reads ({len(rs)} in all)"
                names = list(before[prog])
                for r in rs:  # exactly the loader's field names, all integers
                    assert sorted(
                        k for k, v in r.items() if v is not None and k not in ("time", "node", "program")
                    ) == sorted(names), (prog, r)
                for r in window:
                    for k in names:
                        assert before[prog][k] <= r[k] <= after[prog][k], (
                            prog,
                            k,
                            before[prog][k],
                            r[k],
                            after[prog][k],
                        )
                    if before[prog] == after[prog]:
                        assert {k: r[k] for k in names} == before[prog], prog
                for k in names:  # monotonic since the program was loaded
                    values = [r[k] for r in rs]
                    assert values == sorted(values), (prog, k, values)
            # every packet altmark_tx saw lands in exactly one counter; the STAMP packets left by a0
            assert sum(after["altmark_tx"].values()) >= sent, after["altmark_tx"]

            # the ring buffer -> Kafka counters under stamp_streamer's names (segscope_streamer)
            streamer = _influx_rows(stack, "segscope_streamer", node_a, since, settled=True)
            assert streamer and streamer[-1]["records_in"] == sent and streamer[-1]["records_delivered"] == sent
            assert streamer[-1]["records_failed"] == 0 and streamer[-1]["batches_failed"] == 0, streamer[-1]
            assert {r["records"] for r in streamer} == {"stamp"}, "the collector's ring: tagged records=stamp"
            assert not _influx_rows(stack, "segscope_streamer", node_b, since), "B streams nothing"
            last_a = agent_rows[-1]
            assert last_a["rpcs"] == rpcs_a and last_a["rpc_errors"] == 1, last_a
            assert last_a["records_read"] == sent and last_a["records_streamed"] == sent, last_a
            assert last_a["records_dropped"] == 0 and last_a["records_unmatched"] == 0, last_a
            assert last_a["stats_read_errors"] == 0 and last_a["metrics_failed"] == 0, last_a
            a.Reset(pb.ResetRequest())
            b.Reset(pb.ResetRequest())
            fa.StopFlowMonitor(fm.StopFlowMonitorRequest(side=fm.FLOW_MONITOR_SIDE_TX, flow_id=fid))
            fb.StopFlowMonitor(fm.StopFlowMonitorRequest(side=fm.FLOW_MONITOR_SIDE_RX, flow_id=fid))
    finally:
        assert a_agent.stop() == 0 and b_agent.stop() == 0


def test_a_stop_with_kafka_unreachable_ends_within_the_flush_budget(lab, tmp_path):
    """An agent whose broker never answers (a closed port) has its counters, its node view and its
    records queued; SIGTERM: every flush shares one budget, so the agent stops within it (each waited
    its whole timeout before: counters 5 s, node view 10 s, path records 5 s) and says what it could
    not deliver."""
    from agent.server import STOP_FLUSH_BUDGET_S
    from tests.isolation import closed_port

    agent = start_agent(
        lab.ns("A"), "A", tmp_path, kafka=f"127.0.0.1:{closed_port(29099)}", instance=f"{lab.prefix}-A-nokafka"
    )
    time.sleep(3)  # the node view and the first counters queued for the broker
    t0 = time.monotonic()
    code = agent.stop(timeout_s=60)
    took = time.monotonic() - t0
    print(f"\n[agent] SIGTERM with Kafka unreachable: exit {code} after {took:.1f} s")
    assert code == 0, agent.log()[-3000:]
    assert took < STOP_FLUSH_BUDGET_S + 4, f"{took:.1f} s: {agent.log()[-3000:]}"
    assert "not delivered at stop" in agent.log(), agent.log()[-3000:]
