"""Hitless agent restarts of the user-space STAMP reflector and of the in-line monitors' IOAM record
streamer (agent/README.md, "Restarts and adoption"): both outlive their agent, the next agent of
the node adopts them, and one that no agent adopts stops itself and says so.

Own lab (netlab line5_two_paths, prefix `hla`) and own agents per test (bpffs instances `hla-*`,
state directories under /run/segscope/hla-*). H1 -> A -> R -> B -> H2; A's policy fd00:b::/64 goes
over R's End fc00:2::e and B's End.DX6 fc00:3::d6.

- the user-space reflector on B answers A's sender (100 packets/s, 20 s) while B's agent is killed
  (kill -9) 5 s into the run and a new agent starts 5 s later, nothing applied again: the same
  reflector process answers throughout (adopted), sent = reflected (its own counters, which span
  the adoption) = collected by A, sequence numbers 0..N-1.
- the in-line monitor A (ingress) -> B (egress, --kafka): B's agent is killed while H1 sends 100
  packets/s for 15 s and restarted 5 s later, nothing applied again: B's IOAM identity stays, the
  same streamer delivers throughout (adopted), every sampled packet's record is in Kafka once
  (sequence numbers 0..N-1, N = what A's ingress sampled and instrumented).
- orphans: B's agent (--adopt-timeout 3) with a user-space reflector and an egress monitor is
  killed and not restarted: the reflector and the streamer outlive it, stop themselves 3 s later
  saying so (their logs, orphans.jsonl), and the next agent counts them.

Without the adoption of these two (they died with the agent, pdeathsig) the first assertion after
each kill fails."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from agent.keeper import ProcRef
from segscope_proto.segscope.agent.v1 import inline_pb2 as ipb
from segscope_proto.segscope.agent.v1 import inline_pb2_grpc, stamp_pb2_grpc
from segscope_proto.segscope.agent.v1 import stamp_pb2 as pb
from tests.agent.agent_env import start_agent
from tests.agent.conftest import drop_counters, moved
from tests.isolation import own_name

pytestmark = [pytest.mark.e2e, pytest.mark.datapath]

PREFIX = own_name("hla")
TOPOLOGY = "netlab/topologies/line5_two_paths.yaml"
REPO = Path(__file__).resolve().parents[2]
SID_FWD, SID_RET = "fc00:2::e", "fc00:2::e2"
SIDS = ["fc00:2::e", "fc00:3::d6"]
S, RF = pb.STAMP_ROLE_SENDER, pb.STAMP_ROLE_REFLECTOR
INGRESS, EGRESS = ipb.INLINE_SIDE_INGRESS, ipb.INLINE_SIDE_EGRESS
ADOPT_S, DOWN_S = 15, 5.0

# H1's traffic into A's policy: `rate` UDP datagrams a second for `n` datagrams, to one port
PACED_SENDER = r"""
import socket, sys, time
n, rate, port = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
t0 = time.monotonic()
for i in range(n):
    s.sendto(b"y" * 100, ("fd00:b::1", port))
    time.sleep(max(0.0, t0 + (i + 1) / rate - time.monotonic()))
print(n)
"""


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


def instance(node: str, what: str) -> str:
    return f"{PREFIX}-{node}-{what}"


def fresh_state(inst: str) -> Path:
    """The instance's state directory, emptied: this test's counters start at 0."""
    state = Path("/run/segscope") / inst
    shutil.rmtree(state, ignore_errors=True)
    return state


def datapath_doc(inst: str) -> dict:
    return json.loads((Path("/run/segscope") / inst / "datapath.json").read_text())


def kill9(agent) -> float:
    """SIGKILL the agent (its process group: the data-path processes have sessions of their own)."""
    os.killpg(agent.proc.pid, signal.SIGKILL)
    agent.proc.wait()
    return time.monotonic()


def adopted_notes(agent) -> str:
    found = re.findall(r"adopted the data path of the previous agent .* in (\d+) ms: (.*)", agent.log())
    assert found, agent.log()[-3000:]
    return found[-1][1]


def leftover_processes(inst: str, netns: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,stat,args"], capture_output=True, text=True).stdout
    return [
        line
        for line in out.splitlines()[1:]
        if "Z" not in line.split()[1] and (f"/{inst}/" in line or (f"--netns {netns} " in line and "-m agent" in line))
    ]


def stop_all(agents, inst_netns: list[tuple[str, str]]) -> None:
    for a in agents:
        if a is not None and a.proc.poll() is None:
            a.stop()
    left = [line for inst, ns in inst_netns for line in leftover_processes(inst, ns)]
    for line in left:
        os.kill(int(line.split()[0]), signal.SIGKILL)
    assert left == [], f"processes outlived the test: {left}"


# --------------------------------------------------------------------------- user-space reflector


def listed(stub) -> dict:
    return {(x.session.role, x.session.ssid): x for x in stub.ListStampSessions(pb.ListStampSessionsRequest()).sessions}


def test_userspace_reflector_outlives_its_agent_and_is_adopted(lab, tmp_path):
    rate, duration_s, ssid = 100, 20, 91
    a_inst, b_inst = instance("A", "us"), instance("B", "us")
    fresh_state(a_inst), fresh_state(b_inst)
    b_args = ["--adopt-timeout", str(ADOPT_S)]
    a = start_agent(lab.ns("A"), "A", tmp_path / "a", instance=a_inst)
    b = start_agent(lab.ns("B"), "B", tmp_path / "b1", instance=b_inst, extra_args=b_args)
    b2 = None
    try:
        with a.channel() as cha, b.channel() as chb:
            sa, sb = stamp_pb2_grpc.StampServiceStub(cha), stamp_pb2_grpc.StampServiceStub(chb)
            refl_cfg = pb.StampReflectorConfig(
                device="b0", addresses=["fc00:3::1"], mode=pb.STAMP_REFLECTOR_MODE_USERSPACE
            )
            assert sb.Init(pb.InitRequest(reflector=refl_cfg)).reflector_running == pb.STAMP_REFLECTOR_MODE_USERSPACE
            rs = pb.StampSession(role=RF, ssid=ssid, sender_address="fc00:1::1", return_segments=[SID_RET])
            sb.CreateStampSession(pb.CreateStampSessionRequest(session=rs))
            sb.StartStampSession(pb.StartStampSessionRequest(role=RF, ssid=ssid))
            sa.Init(pb.InitRequest(sender=pb.StampSenderConfig(device="a0", source_address="fc00:1::1")))
            ss = pb.StampSession(role=S, ssid=ssid, reflector_address="fc00:3::1", segments=[SID_FWD], rate_pps=rate)
            sa.CreateStampSession(pb.CreateStampSessionRequest(session=ss))
            net_before = drop_counters(lab)
            sa.StartStampSession(pb.StartStampSessionRequest(role=S, ssid=ssid, duration_s=duration_s))
        reflector = ProcRef.from_json(datapath_doc(b_inst)["stamp"]["reflector"]["userspace"])
        assert reflector is not None and reflector.alive()
        time.sleep(5.0)

        t_kill = kill9(b)
        time.sleep(0.5)
        assert reflector.alive(), "the user-space reflector died with its agent"
        time.sleep(max(0.0, DOWN_S - (time.monotonic() - t_kill)))
        b2 = start_agent(lab.ns("B"), "B", tmp_path / "b2", instance=b_inst, extra_args=b_args)
        down_s = time.monotonic() - t_kill
        notes = adopted_notes(b2)
        print(f"\n[ustamp] agent down {down_s:.1f} s; adopted: {notes}")
        assert f"user-space reflector pid {reflector.pid} on port 862 adopted" in notes, notes
        assert "1 sessions" in notes, notes

        with a.channel() as cha, b2.channel() as chb:
            sa, sb = stamp_pb2_grpc.StampServiceStub(cha), stamp_pb2_grpc.StampServiceStub(chb)
            refl = {
                (x.session.role, x.session.ssid): x
                for x in sb.ListStampSessions(pb.ListStampSessionsRequest()).sessions
            }
            assert refl[(RF, ssid)].state == pb.STAMP_SESSION_STATE_RUNNING, refl
            deadline = time.monotonic() + duration_s + 20
            st = None
            while time.monotonic() < deadline:
                st = {
                    (x.session.role, x.session.ssid): x
                    for x in sa.ListStampSessions(pb.ListStampSessionsRequest()).sessions
                }
                if st[(S, ssid)].state == pb.STAMP_SESSION_STATE_STOPPED:
                    break
                time.sleep(0.5)
            assert st[(S, ssid)].state == pb.STAMP_SESSION_STATE_STOPPED, st
            time.sleep(1.0)  # the last replies
            res = sa.GetStampSessionResults(pb.GetStampSessionResultsRequest(ssid=ssid, max_results=100000)).results
            sent = st[(S, ssid)].packets_sent
            # the adopted reflector is driven by the new agent: a session change still reaches it
            assert sb.StopStampSession(pb.StopStampSessionRequest(role=RF, ssid=ssid)).changed
            assert sb.Reset(pb.ResetRequest()).changed
        final = re.findall(r"Reset: user-space reflector stopped, counters (\{.*\})", b2.log())
        assert final, b2.log()[-2000:]
        counters = json.loads(final[-1])
        assert not reflector.alive(), "Reset did not stop the adopted reflector"
        net = moved(net_before, drop_counters(lab))
        net_lost = sum(v for k, v in net.items() if k.endswith(("rx_dropped", "tx_dropped")))
        seqs = sorted(r.sequence for r in res)
        missing = sorted(set(range(sent)) - set(seqs))
        print(f"[ustamp] sent {sent}, reflected {counters['reflected']} (received {counters['received']}), "
              f"collected by A {len(res)}; missing {missing[:10]}; lab veth drops {net_lost}")  # fmt: skip
        assert sent == rate * duration_s
        assert len(seqs) == len(set(seqs)), "a reply collected twice"
        assert sent - len(res) <= net_lost, (sent, counters, len(res), net)
        if net_lost == 0:  # the quiet case: nothing missing at all, no gap while no agent ran
            assert counters["reflected"] == len(res) == sent and seqs == list(range(sent))
    finally:
        stop_all([a, b, b2], [(a_inst, lab.ns("A")), (b_inst, lab.ns("B"))])


# --------------------------------------------------------------------------- in-line monitors


def enable(stub, node_id: int) -> None:
    cfg = ipb.IoamConfig(node_id=node_id, namespace_ids=[1], all_devices=True)
    stub.EnableIoam(ipb.EnableIoamRequest(config=cfg), timeout=30)


def monitor(side: int, flow_id: int) -> ipb.InlineMonitor:
    if side == INGRESS:
        return ipb.InlineMonitor(side=side, flow_id=flow_id, device="a0", segments=SIDS, namespace_id=1, sample_every=1)
    return ipb.InlineMonitor(side=side, flow_id=flow_id, device="b0", segments=SIDS, namespace_id=1)


def ioam_id(lab, node: str) -> str:
    return lab.run(node, ["sysctl", "-n", "net.ipv6.ioam6_id"], check=True).stdout.strip()


def test_ioam_streamer_outlives_its_agent_and_is_adopted(lab, stack, tmp_path):
    from segscope_schemas import ioam_record as ir
    from segscope_schemas import names
    from tests.agent.test_agent_kafka import consume

    flow, rate, n = 61, 100, 1500
    insts = {x: instance(x, "io") for x in ("A", "R", "B")}
    for inst in insts.values():
        fresh_state(inst)
    node_b = f"hlaB{int(time.time()) % 100000}"  # a Kafka key of this run only
    b_args = ["--adopt-timeout", str(ADOPT_S)]
    agents = {x: start_agent(lab.ns(x), x, tmp_path / x, instance=insts[x]) for x in ("A", "R")}
    b = start_agent(lab.ns("B"), node_b, tmp_path / "b1", instance=insts["B"], kafka=stack.kafka_bootstrap,
                    extra_args=b_args)  # fmt: skip
    b2 = sender = None
    try:
        for x, node_id in (("A", 1), ("R", 2)):
            with agents[x].channel() as ch:
                enable(inline_pb2_grpc.InlineMonitorServiceStub(ch), node_id)
        with b.channel() as ch:
            stub = inline_pb2_grpc.InlineMonitorServiceStub(ch)
            enable(stub, 3)
            stub.StartInlineMonitor(ipb.StartInlineMonitorRequest(monitor=monitor(EGRESS, flow)), timeout=60)
        with agents["A"].channel() as ch:
            inline_pb2_grpc.InlineMonitorServiceStub(ch).StartInlineMonitor(
                ipb.StartInlineMonitorRequest(monitor=monitor(INGRESS, flow)), timeout=60
            )
        streamer = ProcRef.from_json(datapath_doc(insts["B"])["inline"]["streamer"])
        assert streamer is not None and streamer.alive()
        sender = subprocess.Popen(
            ["ip", "netns", "exec", lab.ns("H1"), sys.executable, "-c", PACED_SENDER, str(n), str(rate), "40061"],
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(4.0)

        t_kill = kill9(b)
        time.sleep(0.5)
        assert streamer.alive(), "the ioam streamer died with its agent"
        assert ioam_id(lab, "B") == "3"
        time.sleep(max(0.0, DOWN_S - (time.monotonic() - t_kill)))
        b2 = start_agent(lab.ns("B"), node_b, tmp_path / "b2", instance=insts["B"], kafka=stack.kafka_bootstrap,
                         extra_args=b_args)  # fmt: skip
        down_s = time.monotonic() - t_kill
        notes = adopted_notes(b2)
        print(f"\n[ioam] agent down {down_s:.1f} s; adopted: {notes}")
        assert f"ioam streamer pid {streamer.pid} adopted" in notes, notes
        assert f"ioam_rx on b0 with monitors [{flow}]" in notes and "IOAM identity (node id 3) kept" in notes, notes
        assert ioam_id(lab, "B") == "3", "the new agent restored the IOAM identity under a running monitor"
        assert "IOAM configuration left by a previous agent" not in b2.log()

        out, _ = sender.communicate(timeout=60)
        assert int(out) == n
        time.sleep(1.0)
        with agents["A"].channel() as ch:
            tx = (
                inline_pb2_grpc.InlineMonitorServiceStub(ch)
                .GetInlineMonitorResults(ipb.GetInlineMonitorResultsRequest(side=INGRESS, flow_id=flow), timeout=10)
                .ingress
            )
        with b2.channel() as ch:
            stub = inline_pb2_grpc.InlineMonitorServiceStub(ch)
            listed = stub.ListInlineMonitors(ipb.ListInlineMonitorsRequest(), timeout=10).monitors
            rx = stub.GetInlineMonitorResults(
                ipb.GetInlineMonitorResultsRequest(side=EGRESS, flow_id=flow), timeout=10
            ).egress
        assert [(m.monitor.side, m.monitor.flow_id) for m in listed] == [(EGRESS, flow)]
        key = f"{node_b}/{flow}".encode()
        batches = consume(
            stack.kafka_bootstrap,
            names.TOPIC_IOAM_RECORDS,
            lambda m: [int(s) for s in ir.decode_batch(m.value())[1]["seq"]] if m.key() == key else None,
            lambda got: sum(map(len, got)) >= tx.instrumented,
            timeout_s=60,
        )
        time.sleep(2)  # anything sent twice would be right behind
        seqs = [s for batch in batches for s in batch]
        print(f"[ioam] H1 sent {n}, A sampled {tx.sampled} instrumented {tx.instrumented}, B recorded "
              f"{rx.records}, in Kafka {len(seqs)} (distinct {len(set(seqs))})")  # fmt: skip
        assert tx.sampled == tx.instrumented == n
        assert rx.records == n
        assert len(seqs) == len(set(seqs)) == n and sorted(seqs) == list(range(n)), (
            len(seqs),
            sorted(set(range(n)) - set(seqs))[:10],
        )
        assert streamer.alive(), "the adopted streamer was replaced"
    finally:
        if sender is not None and sender.poll() is None:
            sender.kill()
        for ag in (agents.get("A"), agents.get("R"), b2):
            if ag is not None and ag.proc.poll() is None:
                with ag.channel() as ch:
                    inline_pb2_grpc.InlineMonitorServiceStub(ch).Reset(ipb.ResetInlineRequest(), timeout=30)
        stop_all([*agents.values(), b, b2], [(insts[x], lab.ns(x)) for x in insts])


# --------------------------------------------------------------------------- orphans


def test_unadopted_reflector_and_ioam_streamer_stop_themselves(lab, stack, tmp_path):
    timeout = 3.0
    inst = instance("B", "orph")
    state = fresh_state(inst)
    args = ["--adopt-timeout", str(timeout), "--health", "127.0.0.1:0"]
    kafka = stack.kafka_bootstrap
    agent = start_agent(lab.ns("B"), "B", tmp_path / "first", kafka=kafka, instance=inst, extra_args=args)
    second = None
    try:
        with agent.channel() as ch:
            st = stamp_pb2_grpc.StampServiceStub(ch)
            cfg = pb.StampReflectorConfig(device="b0", addresses=["fc00:3::1"], mode=pb.STAMP_REFLECTOR_MODE_USERSPACE)
            st.Init(pb.InitRequest(reflector=cfg))
            inl = inline_pb2_grpc.InlineMonitorServiceStub(ch)
            enable(inl, 3)
            inl.StartInlineMonitor(ipb.StartInlineMonitorRequest(monitor=monitor(EGRESS, 62)), timeout=60)
        deadline = time.monotonic() + 15
        doc = datapath_doc(inst)
        while "streamer" not in doc["inline"] and time.monotonic() < deadline:  # its thread starts it
            time.sleep(0.1)
            doc = datapath_doc(inst)
        refs = {
            "ustamp_reflector": ProcRef.from_json(doc["stamp"]["reflector"]["userspace"]),
            "stamp_streamer": ProcRef.from_json(doc["inline"]["streamer"]),
        }
        assert all(r is not None and r.alive() for r in refs.values()), refs
        t_kill = kill9(agent)
        time.sleep(1.0)
        assert {x: r.alive() for x, r in refs.items()} == dict.fromkeys(refs, True), "died with the agent"
        ended: dict[str, float] = {}
        while len(ended) < len(refs) and time.monotonic() - t_kill < timeout + 8:
            for x, r in refs.items():
                if x not in ended and not r.alive():
                    ended[x] = round(time.monotonic() - t_kill, 2)
            time.sleep(0.05)
        print(f"\n[orphans] stopped themselves after (s since the kill): {ended}")
        assert set(ended) == set(refs), f"still running {set(refs) - set(ended)} {timeout + 8} s after the kill"
        assert all(timeout <= t <= timeout + 4 for t in ended.values()), ended
        reports = [json.loads(x) for x in (state / "orphans.jsonl").read_text().splitlines()]
        assert sorted(r["program"] for r in reports) == sorted(refs), reports
        assert {r["pid"] for r in reports} == {r.pid for r in refs.values()}
        said = (state / "stamp" / "ustamp_reflector.log").read_text()
        assert "ustamp_reflector: port 862: no agent adopted this process within 3 s" in said, said
        assert '"orphaned": true' in (state / "stamp" / "ustamp_reflector.out").read_text()
        assert "no agent adopted this process within 3 s" in (state / "inline" / "ioam_streamer.log").read_text()

        second = start_agent(lab.ns("B"), "B", tmp_path / "second", kafka=kafka, instance=inst, extra_args=args)
        log = second.log()
        assert len(re.findall(r"stopped itself after [\d.]+ s without an agent", log)) == 2, log[-3000:]
        notes = adopted_notes(second)
        assert "the user-space reflector ended while no agent ran" in notes, notes
        assert "ioam streamer started" in notes, notes  # the side is adopted, its streamer started afresh
        port = re.search(r"agent health on http://127.0.0.1:(\d+)/healthz", log).group(1)
        deadline, metrics = time.monotonic() + 15, ""
        while time.monotonic() < deadline and "segscope_agent_orphans_stopped" not in metrics:
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            time.sleep(0.5)
        assert re.search(r"segscope_agent_orphans_stopped\{[^}]*\} 2\b", metrics), metrics
        with second.channel() as ch:
            inline_pb2_grpc.InlineMonitorServiceStub(ch).Reset(ipb.ResetInlineRequest(), timeout=30)
            stamp_pb2_grpc.StampServiceStub(ch).Reset(pb.ResetRequest(), timeout=30)
    finally:
        stop_all([agent, second], [(inst, lab.ns("B"))])
