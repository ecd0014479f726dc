"""Hitless agent restarts: the data path outlives its agent and the next agent adopts it.

One lab (netlab line5_bare, prefix `hlx`, SEGSCOPE_HITLESS_TEST_PREFIX) for the module: agents on A,
R and B with Kafka (--on-stop handover, --adopt-timeout 15), the Faust delay processor, Telegraf
and InfluxDB (the `stack` fixture). controller/examples/demo_line5.yaml's SRv6 objects and one
STAMP session A -> B (100 packets/s, a 30 s run) per test, applied once through the controller;
never again during the run.

- kill -9 of A's agent 8 s into the run, a new agent 5 s later; and a rolling upgrade: SIGTERM
  (--on-stop handover) of A's agent and at once a new agent calling itself another version
  (SEGSCOPE_AGENT_VERSION: the same code), then the same for B (the reflector's node). Asserted,
  each: the sender outlived its agent and is the one that ends the run (same pid, adopted); every
  record A's collector made is in Kafka once (no duplicate) and in InfluxDB (forward, reverse and
  round trip: exactly as many); the sender's sequence numbers missing from Kafka are no more than
  the test packets and replies the lab's veths dropped (the kernel's counters; on a quiet machine
  none: reflected = collected = sent and the sequence numbers are exactly 0..N-1) and never a run
  of more than 3 (a restart's gap would be hundreds); the new agent said what it adopted and
  counts nothing lost (segscope_agent in InfluxDB).
- orphans: an agent on H1 (its own bpffs instance, --adopt-timeout 3) with a sender, its streamer
  and an altmark collector is killed and not restarted: the three outlive it, then stop themselves
  3 s later saying so (stderr, orphans.jsonl); the next agent there counts them (orphans_stopped)
  and reports the cut run FAILED (senders_ended_unadopted), which the controller would restart.

Without hitless restarts (--adopt-timeout 0) the first assertion after the kill fails: the sender
died with its agent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from agent.keeper import ProcRef
from controller.intent import load_intent
from controller.pipeline import ControlledPipeline
from controller.status import session_loss
from netlab import Lab, teardown
from scripts.results import StampSessionSpec, records_in_influx
from segscope_proto.segscope.agent.v1 import flowmon_pb2, flowmon_pb2_grpc, stamp_pb2, stamp_pb2_grpc
from segscope_schemas import names
from segscope_schemas.stamp_record import decode_batch
from tests.agent.agent_env import start_agent
from tests.agent.conftest import drop_counters, moved
from tests.isolation import own_name

REPO = Path(__file__).resolve().parents[2]
PREFIX = os.environ.get("SEGSCOPE_HITLESS_TEST_PREFIX") or own_name("hlx")  # tagged per test group (tests/isolation.py)
TOPOLOGY = REPO / "netlab" / "topologies" / "line5_bare.yaml"
INTENT = REPO / "controller" / "examples" / "demo_line5.yaml"
ADOPT_S = 15
RATE, DURATION_S, STOP_AFTER_S, DOWN_S = 100, 30, 8.0, 5.0

pytestmark = [pytest.mark.e2e, pytest.mark.datapath]


def intent(ssid: int | None):
    it = load_intent(INTENT)
    if ssid is None:
        it.stamp_sessions = []
    else:
        it.stamp_sessions = [dataclasses.replace(it.stamp_sessions[0], ssid=ssid, rate_pps=RATE, duration_s=DURATION_S)]
    return it


def project_processes(marks: tuple[str, ...]) -> list[str]:
    """Running (not zombie) processes of segscope whose command line names one of `marks`."""
    out = subprocess.run(["ps", "-eo", "pid,stat,args"], capture_output=True, text=True).stdout
    progs = ("stamp_sender", "stamp_streamer", "altmark_collector", "-m agent")
    return [
        line
        for line in out.splitlines()[1:]
        if "Z" not in line.split()[1] and any(p in line for p in progs) and any(m in line for m in marks)
    ]


def counted_so_far(pipe) -> tuple[int, int]:
    """B's reflector's `reflected` and A's collector's `collected` now (0 before they are attached)."""
    root = Path(names.BPFFS_PIN_ROOT)
    if not (root / pipe.lab.ns("B") / "stamp_reflector").exists() or not (root / pipe.lab.ns("A")).exists():
        return 0, 0
    st = pipe.datapath_stats("A", "B")
    return st["stamp_reflector"]["reflected"], collected(st["stamp_collector"])


def collected(coll: dict) -> int:
    return coll["collected"] + coll.get("collected_partial_csum", 0)


def longest_run(missing: list[int]) -> int:
    """The longest run of consecutive sequence numbers in `missing` (sorted)."""
    best = run = 0
    for i, q in enumerate(missing):
        run = run + 1 if i and q == missing[i - 1] + 1 else 1
        best = max(best, run)
    return best


def datapath_doc(instance: str) -> dict:
    return json.loads((Path("/run/segscope") / instance / "datapath.json").read_text())


def sender_ref(instance: str, ssid: int) -> ProcRef:
    for sd in datapath_doc(instance)["stamp"]["sessions"]:
        if sd["spec"]["ssid"] == ssid and sd["spec"]["role"] == "STAMP_ROLE_SENDER":
            return ProcRef.from_json(sd["sender"])
    raise AssertionError(f"no sender session {ssid} in {instance}'s datapath.json")


def kafka_seqs(bootstrap: str, node: str, ssid: int, expect: int, timeout_s: float = 60.0) -> list[int]:
    """Every sequence number of `ssid` in node's stamp_batch messages on segscope.stamp.records."""
    from confluent_kafka import Consumer

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"hlx-test-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([names.TOPIC_STAMP_RECORDS])
    seqs: list[int] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and len(seqs) < expect:
            msg = c.poll(0.5)
            if msg is None or msg.error() or msg.key() != node.encode():
                continue
            _, recs = decode_batch(msg.value())
            seqs += [int(q) for q in recs["sender_seq"][recs["ssid"] == ssid]]
        # a little longer: anything sent twice would show up right behind
        end = time.monotonic() + 2
        while time.monotonic() < end:
            msg = c.poll(0.2)
            if msg is not None and not msg.error() and msg.key() == node.encode():
                _, recs = decode_batch(msg.value())
                seqs += [int(q) for q in recs["sender_seq"][recs["ssid"] == ssid]]
    finally:
        c.close()
    return seqs


def agent_line(pipe, node: str) -> dict:
    """The newest segscope_agent counters of an agent, from its log-free source: segscope.metrics
    is read by Telegraf into InfluxDB; here straight from InfluxDB's newest point."""
    rows = pipe.stack.influx_query(
        f"SELECT * FROM \"segscope_agent\" WHERE \"node\" = '{node}' ORDER BY time DESC LIMIT 1"
    )
    return rows[0] if rows else {}


@contextlib.contextmanager
def handover_pipeline(stack, prefix: str, run_dir, adopt_s: int, before_down=lambda pipe: None):
    """The line5 lab with agents that hand over on SIGTERM and adopt within adopt_s, the stack's
    processors; afterwards no process of the lab outlives it and the delay processor exited 0.
    before_down(pipe) runs after the pipeline stopped, before the lab goes."""
    teardown(prefix)
    lab = Lab.up(TOPOLOGY, prefix=prefix)
    pipe = ControlledPipeline(
        lab, stack, run_dir, agent_args=["--on-stop", "handover", "--adopt-timeout", str(adopt_s)]
    )
    marks = tuple(f"/{lab.ns(n)}/" for n in ("A", "R", "B")) + tuple(f"--netns {lab.ns(n)} " for n in ("A", "R", "B"))
    try:
        pipe.start()
        yield pipe
    finally:
        try:  # the measurement down through the API, so the agents' SIGTERM hands over nothing
            if pipe.agents is not None and all(p.poll() is None for p in pipe.agents.procs.values()):
                pipe.apply(intent(None))
        finally:
            codes = pipe.stop()
            before_down(pipe)
            lab.down()
        left = project_processes(marks)
        for line in left:
            os.kill(int(line.split()[0]), 9)
        assert left == [], f"processes outlived the test: {left}"
        assert codes.get("delay-processor") == 0, codes


@pytest.fixture(scope="module")
def pipe(stack, bpffs, tmp_path_factory):
    with handover_pipeline(stack, PREFIX, tmp_path_factory.mktemp("hlx"), ADOPT_S) as pipe:
        yield pipe


@pytest.mark.parametrize("how", ["kill9", "upgrade"])
def test_restart_mid_run_leaves_no_gap_and_loses_nothing(pipe, stack, how):
    ssid = {"kill9": 71, "upgrade": 72}[how]
    spec = StampSessionSpec(ssid=ssid, rate_pps=RATE)
    a_inst = pipe.lab.ns("A")
    before_refl, before_coll = counted_so_far(pipe)
    net_before = drop_counters(pipe.lab)
    since = time.time_ns()
    pipe.apply(intent(ssid))
    time.sleep(1.0)
    sender = sender_ref(a_inst, ssid)
    assert sender is not None and sender.alive()
    old_pid = pipe.agents.procs["A"].pid
    time.sleep(STOP_AFTER_S - 1.0)

    if how == "kill9":
        pipe.agents.kill("A")
    else:
        assert pipe.agents.stop_node("A") == 0  # --on-stop handover: exit 0, the data path stays
    t_down = time.monotonic()
    time.sleep(0.5)
    assert sender.alive(), "the sender died with its agent"
    streamer = ProcRef.from_json(datapath_doc(a_inst)["stamp"]["streamer"])
    assert streamer is not None and streamer.alive(), "the streamer died with its agent"
    if how == "kill9":  # restarted 5 s later; an upgrade starts the new version at once
        time.sleep(max(0.0, DOWN_S - (time.monotonic() - t_down)))
    env = {"SEGSCOPE_AGENT_VERSION": "0.0.0+upgrade-test"} if how == "upgrade" else None
    pipe.agents.respawn("A", env=env)
    down_s = time.monotonic() - t_down
    log = pipe.agents.logs["A"].read_text(errors="replace")
    adopted = re.findall(r"adopted the data path of the previous agent \(pid (\d+), version (\S+); this is version "
                         r"(\S+)\) in (\d+) ms: (.*)", log)  # fmt: skip
    assert adopted, log[-3000:]
    pid, version, now_version, adopt_ms, notes = adopted[-1]
    print(f"\n[{how}] agent down {down_s:.1f} s, re-adopted in {adopt_ms} ms: {notes}")
    assert int(pid) == old_pid
    assert "1 senders running and adopted" in notes and "streamer pid" in notes, notes
    if how == "upgrade":
        assert now_version == "0.0.0+upgrade-test" and version != now_version
    if how == "upgrade":  # a rolling upgrade: the reflector's node next, the same way
        assert pipe.agents.stop_node("B") == 0
        pipe.agents.respawn("B", env=env)
        found = re.findall(r"adopted the data path of the previous agent .* in (\d+) ms: (.*)",
                           pipe.agents.logs["B"].read_text(errors="replace"))  # fmt: skip
        assert found and "XDP reflector on b0" in found[-1][1] and "1 sessions" in found[-1][1], found
        print(f"[{how}] B re-adopted in {found[-1][0]} ms: {found[-1][1]}")

    pipe.wait_stopped("A", ssid, timeout_s=DURATION_S + 30)
    # the sender that ended the run is the one that started it, adopted by the new agent
    ended = re.findall(rf"stamp_sender ssid {ssid} ended \(pid (\d+), adopted\)", pipe.agents.logs["A"].read_text())
    assert ended == [str(sender.pid)], (ended, sender)
    summary = pipe.sender_summary("A", ssid)
    sent = summary["sent"]
    assert sent == RATE * DURATION_S and summary["send_errors"] == 0, summary
    stats = pipe.datapath_stats("A", "B")
    refl, coll = stats["stamp_reflector"], stats["stamp_collector"]
    reflected, got_back = refl["reflected"] - before_refl, collected(coll) - before_coll
    assert sum(v for k, v in coll.items() if k.startswith("drop_")) == 0, coll
    # what the lab's veths dropped (a loaded machine's backlogs): the only loss allowed, the network's
    net = moved(net_before, drop_counters(pipe.lab))
    net_lost = sum(v for k, v in net.items() if k.endswith(("rx_dropped", "tx_dropped")))

    seqs = kafka_seqs(stack.kafka_bootstrap, "A", ssid, got_back)
    missing = sorted(set(range(sent)) - set(seqs))
    print(f"[{how}] sent {sent}, reflected by B {reflected}, collected by A {got_back}, in Kafka {len(seqs)} "
          f"(distinct {len(set(seqs))}); missing {len(missing)} {missing[:10]}; lab veth drops {net_lost}")  # fmt: skip
    assert len(seqs) == len(set(seqs)) == got_back, "a record lost or sent twice between A's collector and Kafka"
    assert sent - got_back <= net_lost, (sent, reflected, got_back, net)  # test packets and replies the lab lost
    assert longest_run(missing) <= 3, f"a gap: {missing}"  # a restart's gap would be hundreds at 100/s
    if net_lost == 0:
        assert reflected == got_back == sent and seqs and sorted(seqs) == list(range(sent))

    # `controller status`: the session's received and lost across the adoption are what A's
    # collector counted (the new agent goes on from the streamers' counts, not from 0)
    row = session_loss(pipe.session_status("A", ssid))
    print(f"[{how}] controller status: received {row['packets_received']}, lost {row['packets_lost']}")
    assert row["packets_received"] == got_back and row["packets_lost"] == sent - got_back, (row, sent, got_back)

    got = {}
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        got = {d: records_in_influx(stack, spec, since, d) for d in ("forward", "reverse", "round_trip")}
        if min(got.values()) >= got_back:
            break
        time.sleep(1)
    print(f"[{how}] records in InfluxDB {got}")
    assert got == dict.fromkeys(got, got_back), (got, got_back, reflected)

    # nothing counted lost by the new agent (segscope_agent on segscope.metrics -> InfluxDB)
    deadline = time.monotonic() + 30
    line = {}
    while time.monotonic() < deadline:
        line = agent_line(pipe, "A")
        if line.get("senders_adopted") == 1:
            break
        time.sleep(1)
    assert line.get("senders_adopted") == 1, line
    assert line.get("handover_records_lost") == 0 and line.get("senders_ended_unadopted") == 0, line


def test_orphans_stop_themselves_and_are_counted(pipe, tmp_path):
    """H1's agent (own instance, --adopt-timeout 3) is killed and not restarted."""
    lab, timeout = pipe.lab, 3.0
    inst = f"{PREFIX}-H1-orphans"
    state = Path("/run/segscope") / inst
    shutil.rmtree(state, ignore_errors=True)  # this test's own instance: its counters start at 0
    args = ["--adopt-timeout", str(timeout), "--health", "127.0.0.1:0"]
    kafka = pipe.stack.kafka_bootstrap
    agent = start_agent(lab.ns("H1"), "H1", tmp_path / "first", kafka=kafka, instance=inst, extra_args=args)
    second = None
    try:
        with agent.channel() as ch:
            st, fm = stamp_pb2_grpc.StampServiceStub(ch), flowmon_pb2_grpc.FlowMonitorServiceStub(ch)
            st.Init(stamp_pb2.InitRequest(sender=stamp_pb2.StampSenderConfig(device="h1", source_address="fd00:a::1")))
            session = stamp_pb2.StampSession(
                role=stamp_pb2.STAMP_ROLE_SENDER, ssid=81, reflector_address="fc00:3::1", rate_pps=20
            )
            st.CreateStampSession(stamp_pb2.CreateStampSessionRequest(session=session))
            st.StartStampSession(stamp_pb2.StartStampSessionRequest(role=stamp_pb2.STAMP_ROLE_SENDER, ssid=81))
            monitor = flowmon_pb2.FlowMonitor(
                side=flowmon_pb2.FLOW_MONITOR_SIDE_TX,
                flow_id=81,
                device="h1",
                method=flowmon_pb2.MARKING_METHOD_DSCP,
                segments=["fc00:2::e", "fc00:3::d6"],
                period_ms=500,
            )
            fm.StartFlowMonitor(flowmon_pb2.StartFlowMonitorRequest(monitor=monitor), timeout=30)
        doc = datapath_doc(inst)
        refs = {
            "stamp_sender": ProcRef.from_json(doc["stamp"]["sessions"][0]["sender"]),
            "stamp_streamer": ProcRef.from_json(doc["stamp"]["streamer"]),
            "altmark_collector": ProcRef.from_json(doc["flowmon"]["collector"]),
        }
        assert all(r is not None and r.alive() for r in refs.values()), refs
        os.killpg(agent.proc.pid, 9)
        agent.proc.wait()
        t_kill = time.monotonic()
        time.sleep(1.0)
        assert {n: r.alive() for n, r in refs.items()} == dict.fromkeys(refs, True), "died with the agent"
        ended: dict[str, float] = {}
        while len(ended) < len(refs) and time.monotonic() - t_kill < timeout + 8:
            for n, r in refs.items():
                if n not in ended and not r.alive():
                    ended[n] = round(time.monotonic() - t_kill, 2)
            time.sleep(0.05)
        print(f"\n[orphans] stopped themselves after (s since the kill): {ended}")
        assert set(ended) == set(refs), f"still running {set(refs) - set(ended)} {timeout + 8} s after the kill"
        # not before the adoption timeout (+ up to 1 s until they notice), not long after it
        assert all(timeout <= t <= timeout + 4 for t in ended.values()), ended
        reports = [json.loads(x) for x in (state / "orphans.jsonl").read_text().splitlines()]
        assert sorted(r["program"] for r in reports) == sorted(refs), reports
        assert {r["pid"] for r in reports} == {r.pid for r in refs.values()}
        said = (state / "stamp" / "sender-81.err").read_text()
        assert "ssid 81: no agent adopted this process within 3 s" in said, said
        assert "no agent adopted this process within 3 s" in (state / "stamp" / "stamp_streamer.log").read_text()
        assert "no agent adopted" in (state / "flowmon" / "altmark_collector.log").read_text()

        # the next agent there: counts them, says the run was cut (the controller restarts it)
        second = start_agent(lab.ns("H1"), "H1", tmp_path / "second", kafka=kafka, instance=inst, extra_args=args)
        log = second.log()
        assert len(re.findall(r"stopped itself after [\d.]+ s without an agent", log)) == 3, log[-3000:]
        port = re.search(r"agent health on http://127.0.0.1:(\d+)/healthz", log).group(1)
        deadline, metrics = time.monotonic() + 15, ""
        while time.monotonic() < deadline and "segscope_agent_orphans_stopped" not in metrics:
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            time.sleep(0.5)
        assert re.search(r"segscope_agent_orphans_stopped\{[^}]*\} 3\b", metrics), metrics
        assert re.search(r"segscope_agent_senders_ended_unadopted\{[^}]*\} 1\b", metrics), metrics
        with second.channel() as ch:
            st = stamp_pb2_grpc.StampServiceStub(ch)
            s81 = next(s for s in st.ListStampSessions(stamp_pb2.ListStampSessionsRequest()).sessions
                       if s.session.ssid == 81)  # fmt: skip
            assert s81.state == stamp_pb2.STAMP_SESSION_STATE_FAILED, s81
            assert "stopped itself: no agent adopted it in time" in s81.error, s81.error
            st.Reset(stamp_pb2.ResetRequest(), timeout=30)
            fm = flowmon_pb2_grpc.FlowMonitorServiceStub(ch)
            fm.StopFlowMonitor(
                flowmon_pb2.StopFlowMonitorRequest(side=flowmon_pb2.FLOW_MONITOR_SIDE_TX, flow_id=81), timeout=30
            )
    finally:
        if second is not None:
            assert second.stop() == 0
        if agent.proc.poll() is None:
            agent.stop()
        left = project_processes((f"/{inst}/", f"--netns {lab.ns('H1')} "))
        for line in left:
            os.kill(int(line.split()[0]), 9)
        assert left == [], left
