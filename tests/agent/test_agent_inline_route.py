"""The agent runs an INGRESS in-line monitor on its policy's route (ioam_lwt, `encap bpf in`) where the
node has the policy, and gives the plain seg6 route back on StopInlineMonitor, on agent stop and,
after kill -9, through the next agent (adopted with its state, given back without). Srv6Service sees
the monitored policy with its SID list and never the route program's copy in table 3355. Real agents
on netlab line5_two_paths: H1 -> A -> R -> B -> H2, ingress on A (policy fd00:b::/64 via SIDS), IOAM
transit on R, egress on B; routes read back with ip(8), independent of the agent's netlink code.

Own lab (prefix `inlr`) and bpffs instances (`inlr-*`)."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest

from collectors.topology.view import build_node_view
from controller.intent import parse_intent
from controller.leader import NoElection
from controller.steer.service import SteerService
from netlab import Lab
from netlab.lab import teardown
from processors.inline.aggregate import InlineAggregator
from segscope_proto.segscope.agent.v1 import inline_pb2 as pb
from segscope_proto.segscope.agent.v1 import inline_pb2_grpc, srv6_pb2_grpc
from segscope_proto.segscope.agent.v1 import srv6_pb2 as spb
from segscope_schemas import ioam_record as ir
from segscope_schemas import names
from tests.agent.agent_env import make_test_pki, start_agent
from tests.agent.ioam_pcap import e2e_packets, srv6_frames
from tests.built import required
from tests.collectors.collectors_pcap import capture
from tests.isolation import own_name

PREFIX = own_name("inlr")
TOPOLOGY = "netlab/topologies/line5_two_paths.yaml"
REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("SEGSCOPE_BUILD_DIR") or REPO / "build")
_built = required("datapath/ioam_tx", "datapath/ioam_rx", "datapath/ioam_lwt")
INGRESS, EGRESS = pb.INLINE_SIDE_INGRESS, pb.INLINE_SIDE_EGRESS
SIDS = ["fc00:2::e", "fc00:3::d6"]  # A's policy fd00:b::/64 in line5_two_paths
POLICY = "fd00:b::/64"
SENDER = r"""
import socket, sys, time
n = int(sys.argv[1]); s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
for i in range(n):
    s.sendto(b"y" * 100, ("fd00:b::1", 40007))
    if i % 50 == 49: time.sleep(0.01)
print(n)
"""


@pytest.fixture(scope="module")
def rlab(bpffs):
    teardown(PREFIX)
    lab = Lab.up(TOPOLOGY, prefix=PREFIX)
    try:
        yield lab
    finally:
        lab.down()


@pytest.fixture(scope="module")
def rpki(tmp_path_factory):
    return make_test_pki(tmp_path_factory.mktemp("inlr-pki"))


@pytest.fixture(scope="module")
def transit(rlab, rpki, tmp_path_factory):
    """R (IOAM transit) and B (egress monitor) for the whole module; A's agent is per test."""
    run_dir = tmp_path_factory.mktemp("inlr-agents")
    agents = {n: start_agent(rlab.ns(n), n, run_dir, pki=rpki, instance=f"{PREFIX}-{n}") for n in ("R", "B")}
    chans = {n: a.channel() for n, a in agents.items()}
    stubs = {n: inline_pb2_grpc.InlineMonitorServiceStub(c) for n, c in chans.items()}
    try:
        enable(stubs["R"], 2)
        enable(stubs["B"], 3)
        stubs["B"].StartInlineMonitor(pb.StartInlineMonitorRequest(monitor=mon(EGRESS)), timeout=30)
        yield stubs
    finally:
        for c in chans.values():
            c.close()
        codes = {n: a.stop() for n, a in agents.items()}
        sys.stderr.write(f"\n[inlr agents] exit codes {codes}, logs in {run_dir}\n")


def enable(stub, node_id: int) -> None:
    cfg = pb.IoamConfig(node_id=node_id, namespace_ids=[1], all_devices=True)
    stub.EnableIoam(pb.EnableIoamRequest(config=cfg), timeout=30)


def mon(side=INGRESS, flow_id=7, **kw) -> pb.InlineMonitor:
    d = dict(side=side, flow_id=flow_id, device="a0" if side == INGRESS else "b0", segments=SIDS, namespace_id=1)
    if side == INGRESS:
        d["sample_every"] = 1
    d.update(kw)
    return pb.InlineMonitor(**d)


def a_agent(lab, pki, tmp_path, state: bool = True):
    args = ["--state-dir", str(tmp_path / "state-A")] if state else ["--adopt-timeout", "0"]
    args += ["--health", "127.0.0.1:0"]
    return start_agent(lab.ns("A"), "A", tmp_path, pki=pki, instance=f"{PREFIX}-A", extra_args=args)


def route(lab, table: str = "main") -> str:
    return lab.run("A", ["ip", "-6", "route", "show", POLICY, "table", table], check=True).stdout.strip()


def assert_plain_seg6(lab) -> None:
    """The policy's own seg6 route, no copies in tables 3355 and 3356, no rules, no pins of the route program."""
    r = route(lab)
    assert "encap seg6 mode encap segs 2 [ fc00:2::e fc00:3::d6 ]" in r and "bpf" not in r, r
    for table in ("3355", "3356"):
        assert lab.run("A", ["ip", "-6", "route", "show", "table", table]).stdout.strip() == ""
        assert f"lookup {table}" not in lab.run("A", ["ip", "-6", "rule", "show"], check=True).stdout
    assert not (Path(names.BPFFS_PIN_ROOT) / f"{PREFIX}-A" / "ioam_lwt").exists()


def send(lab, n: int) -> None:
    assert int(lab.run("H1", [sys.executable, "-c", SENDER, str(n)], check=True).stdout) == n
    time.sleep(0.5)


def ingress(stub) -> pb.InlineIngressCounters:
    return stub.GetInlineMonitorResults(pb.GetInlineMonitorResultsRequest(side=INGRESS, flow_id=7), timeout=10).ingress


def records(transit) -> int:
    req = pb.GetInlineMonitorResultsRequest(side=EGRESS, flow_id=7)
    return transit["B"].GetInlineMonitorResults(req, timeout=10).egress.records


def metrics(agent, *want: str) -> str:
    """The agent's /metrics once every regex of `want` matches (its stats tick is 1 s), or after 15 s."""
    port = re.search(r"agent health on http://127.0.0.1:(\d+)/healthz", agent.log()).group(1)
    deadline, text = time.monotonic() + 15, ""
    while time.monotonic() < deadline and not all(re.search(w, text) for w in want):
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        time.sleep(0.5)
    return text


def policies(ch) -> list:
    return list(srv6_pb2_grpc.Srv6ServiceStub(ch).ListPolicies(spb.ListPoliciesRequest(), timeout=10).policies)


def test_monitor_runs_on_the_policy_route_and_gives_it_back(rlab, rpki, transit, tmp_path):
    assert_plain_seg6(rlab)
    enable_a, agent = None, a_agent(rlab, rpki, tmp_path)
    try:
        with agent.channel() as ch:
            a = inline_pb2_grpc.InlineMonitorServiceStub(ch)
            enable(a, 1)
            before = [p for p in policies(ch) if p.destination == POLICY]
            st = a.StartInlineMonitor(pb.StartInlineMonitorRequest(monitor=mon()), timeout=30).status
            assert st.program == "ioam_lwt" and st.routes == [f"{POLICY} table 254"] and st.fixed_next_hop
            assert "encap bpf" in route(rlab) and POLICY in route(rlab, "3355")
            assert "encap bpf xmit" in route(rlab, "3356"), "the program's copy for A's own packets"
            # ListPolicies: the same policy, SID list included, and no policy of the copies' tables
            now = policies(ch)
            assert [p for p in now if p.destination == POLICY] == before and list(before[0].segments) == SIDS
            assert not [p for p in now if p.table in (3355, 3356)]
            # the topology view reads it the same way (its own pyroute2 dump)
            view = [p for p in build_node_view("A", rlab.ns("A"))["policies"] if p["prefix"] == POLICY]
            assert [(p["table"], p["segments"], p["interface"]) for p in view] == [(254, SIDS, "a0")]
            listed = a.ListInlineMonitors(pb.ListInlineMonitorsRequest(), timeout=10).monitors
            assert [(m.monitor.flow_id, m.program) for m in listed] == [(7, "ioam_lwt")]
            sent = 300
            send(rlab, sent)
            tx = ingress(a)
            assert tx.packets == tx.sampled == tx.instrumented == tx.next_sequence == sent
            assert records(transit) == sent  # every sequence number 0..299 once at B
            want = (
                r'segscope_inline_\w+\{[^}]*flow="7"[^}]*program="ioam_lwt"',
                r"segscope_agent_inline_monitors_on_route\{[^}]*\} 1\b",
                r'segscope_datapath_instrumented\{[^}]*program="ioam_lwt"[^}]*\} 300\b',
            )
            text = metrics(agent, *want)
            assert [w for w in want if not re.search(w, text)] == [], text[-3000:]
            a.StopInlineMonitor(pb.StopInlineMonitorRequest(side=INGRESS, flow_id=7), timeout=30)
            assert_plain_seg6(rlab)
            assert [p for p in policies(ch) if p.destination == POLICY] == before
            enable_a = a
    finally:
        assert agent.stop() == 0
    assert enable_a is not None
    assert_plain_seg6(rlab)


def test_agent_stop_gives_the_route_back(rlab, rpki, transit, tmp_path):
    agent = a_agent(rlab, rpki, tmp_path)
    try:
        with agent.channel() as ch:
            a = inline_pb2_grpc.InlineMonitorServiceStub(ch)
            enable(a, 1)
            a.StartInlineMonitor(pb.StartInlineMonitorRequest(monitor=mon()), timeout=30)
            assert "encap bpf" in route(rlab)
    finally:
        assert agent.stop() == 0
    assert_plain_seg6(rlab)


def test_a_sid_list_without_policy_route_runs_on_tc(rlab, rpki, transit, tmp_path):
    agent = a_agent(rlab, rpki, tmp_path)
    try:
        with agent.channel() as ch:
            a = inline_pb2_grpc.InlineMonitorServiceStub(ch)
            enable(a, 1)
            m = mon(flow_id=9, segments=["fc00:2::e", "fc00:3::99"])
            st = a.StartInlineMonitor(pb.StartInlineMonitorRequest(monitor=m), timeout=30).status
            assert st.program == "ioam_tx" and not st.routes
            assert "encap bpf" not in route(rlab)
            a.Reset(pb.ResetInlineRequest(), timeout=30)
    finally:
        assert agent.stop() == 0
    assert_plain_seg6(rlab)


STEERED = ["fc00:2::e", "fc00:2::e2", "fc00:3::d6"]  # R twice (End e, then End e2): another path, 3 SIDs
PACED_SENDER = r"""
import socket, sys, time
n = int(sys.argv[1]); s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
for i in range(n):
    s.sendto(b"y" * 100, ("fd00:b::1", 40007))
    if i % 10 == 9: time.sleep(0.005)
print(n)
"""


def end_counter(lab, sid: str) -> int:
    """Packets R's End SID has processed (`ip -s -6 route show`, `count` on the route)."""
    out = lab.run("R", ["ip", "-s", "-6", "route", "show", f"{sid}/128"], check=True).stdout
    return int(re.search(r"packets (\d+)", out).group(1))


def steer(s, pol, segments: list[str]):
    moved = spb.Policy()
    moved.CopyFrom(pol)
    moved.segments[:] = segments
    return s.UpdatePolicy(spb.UpdatePolicyRequest(policy=moved), timeout=30)


def egress_ring() -> list[dict]:
    """Every record in B's ioam_rx ring, in ring order (consumed: `ioam_rx dump` until 1.5 s of quiet
    ends it; without --kafka nothing else reads the ring)."""
    out = subprocess.run(
        [str(BUILD / "datapath" / "ioam_rx"), "dump", "--instance", f"{PREFIX}-B", "--timeout-ms", "1500"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def sequence_accounting(seqs: list[int]) -> tuple[int, int, int]:
    """(lost, duplicated, reordered) of one flow's sequence numbers 0.., in arrival order."""
    highest, reordered = -1, 0
    for seq in seqs:
        reordered += seq < highest
        highest = max(highest, seq)
    return highest + 1 - len(set(seqs)), len(seqs) - len(set(seqs)), reordered


def as_records(ring: list[dict]) -> np.ndarray:
    """`ioam_rx dump`'s JSON lines back into ioam_records (entries big-endian, as on the wire)."""
    out = np.zeros(len(ring), dtype=ir.IOAM_RECORD_DTYPE)
    for i, r in enumerate(ring):
        for name in ir.IOAM_RECORD_DTYPE.names:
            if name in r and name != "entries":
                out[i][name] = r[name]
        for k, e in enumerate(r["entries"]):
            out[i]["entries"][k] = (
                e["hop_limit"] << 24 | e["node_id"],
                e["ingress_if_id"],
                e["egress_if_id"],
                e["ts_sec"],
                e["ts_subsec"],
            )
    return out


def processor_loss(ring: list[dict]) -> dict:
    """The in-line processor's core on the egress records: its inline_loss lines summed per flow tag."""
    agg = InlineAggregator(grace_s=0, retention_s=60)
    invalid, _ = agg.ingest("B", as_records(ring))
    assert invalid == {}
    totals: dict = {}
    for line in agg.flush_all():
        if line.startswith("inline_loss,"):
            tags, fields, _ = line.split(" ")
            flow = next(t for t in tags.split(",") if t.startswith("flow="))
            into = totals.setdefault(flow, dict.fromkeys(("received", "lost", "duplicated", "reordered"), 0))
            for kv in fields.split(","):
                key, value = kv.split("=")
                if key in into:
                    into[key] += int(value.rstrip("i"))
    return totals


def restart_egress(b, **kw) -> None:
    """B's egress monitor of flow 7 started again (its counters from 0) with `kw`."""
    b.StopInlineMonitor(pb.StopInlineMonitorRequest(side=EGRESS, flow_id=7), timeout=30)
    b.StartInlineMonitor(pb.StartInlineMonitorRequest(monitor=mon(EGRESS, **kw)), timeout=30)


FIVE = ["fc00:2::e", "fc00:2::e2", "fc00:2::e", "fc00:2::e2", "fc00:3::d6"]  # over 256 bytes with a trace of 6


@contextlib.contextmanager
def monitored_policy(rlab, rpki, transit, tmp_path, alternate: list[str]):
    """A's agent running flow 7 (every packet) on its policy route, B's egress with `alternate` as an
    alternate path of the flow; yields the agent, its in-line and Srv6 clients, its channel and the
    policy. After: B's egress as before, the agent stopped (exit 0), the plain seg6 route back."""
    agent, b = a_agent(rlab, rpki, tmp_path), transit["B"]
    restart_egress(b, alternate_paths=[pb.InlinePath(segments=alternate)])
    egress_ring()  # the records of the tests before
    try:
        with agent.channel() as ch:
            a, s = inline_pb2_grpc.InlineMonitorServiceStub(ch), srv6_pb2_grpc.Srv6ServiceStub(ch)
            enable(a, 1)
            a.StartInlineMonitor(pb.StartInlineMonitorRequest(monitor=mon()), timeout=30)
            yield agent, a, s, ch, next(p for p in policies(ch) if p.destination == POLICY)
    finally:
        restart_egress(b)
        assert agent.stop() == 0
    assert_plain_seg6(rlab)


def test_egress_alternate_paths_are_validated(transit):
    """alternate_paths: EGRESS only, each SID list once, none another monitor's: errors name the field."""
    b, steered = transit["B"], [pb.InlinePath(segments=STEERED)]
    cases = [
        (mon(flow_id=11, alternate_paths=steered), "monitor.alternate_paths: not allowed with INLINE_SIDE_INGRESS"),
        (mon(EGRESS, flow_id=11, alternate_paths=[pb.InlinePath(segments=SIDS)]), "monitor.alternate_paths[0]"),
        (mon(EGRESS, flow_id=11, segments=STEERED, alternate_paths=steered), "monitor.alternate_paths[0]"),
        (mon(EGRESS, flow_id=11, segments=STEERED, alternate_paths=[pb.InlinePath()]), "alternate_paths[0].segments"),
    ]
    for m, want in cases:
        with pytest.raises(grpc.RpcError) as e:
            b.StartInlineMonitor(pb.StartInlineMonitorRequest(monitor=m), timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and want in e.value.details(), e.value.details()
    # flow 7 (SIDS) runs on B: another flow may not take SIDS as an alternate path
    taken = mon(EGRESS, flow_id=11, segments=STEERED, alternate_paths=[pb.InlinePath(segments=SIDS)])
    with pytest.raises(grpc.RpcError) as e:
        b.StartInlineMonitor(pb.StartInlineMonitorRequest(monitor=taken), timeout=30)
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS, e.value.details()
    assert "monitor.alternate_paths[0].segments: ioam_rx flow 7 already monitors" in e.value.details()
    listed = b.ListInlineMonitors(pb.ListInlineMonitorsRequest(side=EGRESS), timeout=10).monitors
    assert [m.monitor.flow_id for m in listed] == [7]


def test_steer_keeps_one_flow_end_to_end_mid_traffic(rlab, rpki, transit, tmp_path):
    """UpdatePolicy (what segscope-steer calls) on the monitored policy, while H1 sends: the route
    program stays (entry rewritten: one map update), the packets after it go the new path (R's End
    e2 counts them) still instrumented, with a trace of 4 slots for the 3-SID path, and the E2E
    sequence numbers captured on R's egress are exactly 0..N-1, old SID list first, then the new one
    (no reset, no gap). The egress monitor of flow 7 has the new SID list as an alternate path: B's
    ring holds one record per packet, all of flow 7, the sequence numbers in the order R sent them
    (lost 0, duplicated 0, reordered as on the wire: 0). ListPolicies and the copy in table 3355 show
    the new SID list; Stop gives the new route back. Without alternate paths the egress recorded the
    new path's packets only under a second flow started by hand."""
    e2_before = end_counter(rlab, "fc00:2::e2")
    with monitored_policy(rlab, rpki, transit, tmp_path, STEERED) as (agent, a, s, ch, pol):
        sent, pcap = 3000, tmp_path / "r1.pcap"
        with capture(rlab.ns("R"), "r1", pcap):
            sender = rlab.popen("H1", [sys.executable, "-c", PACED_SENDER, str(sent)], stdout=subprocess.PIPE)
            time.sleep(0.6)
            r = steer(s, pol, STEERED)
            assert int(sender.communicate(timeout=60)[0]) == sent
            time.sleep(0.5)
        assert r.changed and list(r.policy.segments) == STEERED and list(r.previous.segments) == SIDS
        # the route program still runs the policy; the kernel's copy and ListPolicies have the new list
        assert "encap bpf" in route(rlab)
        assert "segs 3 [ fc00:2::e fc00:2::e2 fc00:3::d6 ]" in route(rlab, "3355")
        assert [list(p.segments) for p in policies(ch) if p.destination == POLICY] == [STEERED]
        st = a.ListInlineMonitors(pb.ListInlineMonitorsRequest(), timeout=10).monitors
        assert [(m.monitor.flow_id, m.program, list(m.monitor.segments), m.monitor.trace_nodes) for m in st] == [
            (7, "ioam_lwt", STEERED, 4)
        ]
        assert "steered from fc00:2::e,fc00:3::d6 to" in st[0].note
        tx = ingress(a)
        assert tx.packets == tx.sampled == tx.instrumented == tx.next_sequence == sent
        seen = e2e_packets(pcap)
        assert sorted(p.seq for p in seen) == list(range(sent))  # every number once: no reset, no gap
        old = [p.seq for p in seen if p.sids == SIDS and p.hbh_len == 16 + 16 * 3]
        new = [p.seq for p in seen if p.sids == STEERED and p.hbh_len == 16 + 16 * 4]
        assert len(old) + len(new) == sent and old and new, (len(old), len(new))
        assert max(old) < min(new) and old == sorted(old) and new == sorted(new)  # one switch, in order
        assert end_counter(rlab, "fc00:2::e2") - e2_before == len(new)
        # the egress: one flow across the switch, every packet once, in the order R sent them
        ring = egress_ring()
        assert [r["flow_id"] for r in ring] == [7] * sent
        assert [r["seq"] for r in ring] == [p.seq for p in seen]
        assert [r["slots"] for r in ring] == [3] * len(old) + [4] * len(new)
        truth = sequence_accounting([p.seq for p in seen])
        assert sequence_accounting([r["seq"] for r in ring]) == truth == (0, 0, 0)
        # the in-line processor: one flow, every packet received once across the switch
        assert processor_loss(ring) == {"flow=7": {"received": sent, "lost": 0, "duplicated": 0, "reordered": 0}}
        assert records(transit) == sent  # flow 7's counters: its two SID lists' together
        text = metrics(agent, r"segscope_agent_inline_route_steers\{[^}]*\} 1\b")
        assert re.search(r"segscope_agent_inline_route_steers\{[^}]*\} 1\b", text), text[-2000:]
        a.StopInlineMonitor(pb.StopInlineMonitorRequest(side=INGRESS, flow_id=7), timeout=30)
        assert "encap seg6 mode encap segs 3 [ fc00:2::e fc00:2::e2 fc00:3::d6 ]" in route(rlab)
        assert steer(s, pol, SIDS).changed


STEER_INTENT = """
version: 1
nodes:
  A: {{agent: "{address}", tls: {tls}}}
  B: {{agent: "127.0.0.1:1", tls: {tls}}}
policies:
  - {{node: A, destination: "{policy}", mode: encap, segs: {sids}, dev: a0}}
steering:
  - node: A
    destination: "{policy}"
    candidates:
      - {{name: direct, segs: {sids}, return_segs: ["fc00:2::e2"], sender_dev: a0, reflector_dev: b0}}
      - {{name: via_e2, segs: {steered}, return_segs: ["fc00:2::e2"], sender_dev: a0, reflector_dev: b0}}
    probe: {{ssid: 301, rate_pps: 10, source: "fc00:12::1", reflector: {{node: B, address: "fc00:23::2"}}}}
    objective: lowest_delay
"""


def steer_service(agent, pki) -> SteerService:
    """segscope-steer for A's policy, its agent client on A's test agent (no Kafka: only its calls)."""
    tls = json.dumps({"ca": str(pki.ca_pem), "cert": str(pki.client_pem), "key": str(pki.client_key)})
    text = STEER_INTENT.format(
        address=agent.address, tls=tls, policy=POLICY, sids=json.dumps(SIDS), steered=json.dumps(STEERED)
    )
    return SteerService(parse_intent(text, "steer.yaml"), "unused:9092", NoElection(), "t1")


def test_segscope_steer_and_apply_batch_keep_one_flow(rlab, rpki, transit, tmp_path):
    """The calls that move a monitored policy, mid-traffic: segscope-steer's own (SteerService:
    UpdatePolicy built from the intent's policy and the candidate) to the 3-SID path, then
    ApplyBatch (controller apply --batch: the update among other operations, pipelined) back to the
    2-SID list. The monitor stays on the route both times; captured on R's egress the sequence
    numbers are exactly 0..N-1 in three runs (old, new, old list, the trace sized for each); B's ring
    has every one of them in flow 7 in that order and the in-line processor's core counts one flow:
    received N, lost 0, duplicated 0, reordered 0."""
    with monitored_policy(rlab, rpki, transit, tmp_path, STEERED) as (agent, a, s, ch, back):
        svc = steer_service(agent, rpki)
        spec = svc.policies[("A", POLICY, 254)]
        other = spb.Policy()  # another policy on the same path, created in the same batch
        other.CopyFrom(back)
        other.destination = "fd00:b:9::/64"
        batch = spb.ApplyBatchRequest(
            operations=[
                spb.Srv6Operation(create_policy=spb.CreatePolicyRequest(policy=other)),
                spb.Srv6Operation(update_policy=spb.UpdatePolicyRequest(policy=back)),
            ]
        )
        sent, pcap = 4500, tmp_path / "r1.pcap"
        with capture(rlab.ns("R"), "r1", pcap):
            sender = rlab.popen("H1", [sys.executable, "-c", PACED_SENDER, str(sent)], stdout=subprocess.PIPE)
            time.sleep(0.6)
            assert svc._update_policy(spec, tuple(STEERED)) is None
            time.sleep(0.8)
            done = s.ApplyBatch(batch, timeout=30)
            assert int(sender.communicate(timeout=60)[0]) == sent
            time.sleep(0.5)
        assert [(r.code, r.changed) for r in done.results] == [(0, True), (0, True)], done
        assert [list(p.segments) for p in policies(ch) if p.destination == POLICY] == [SIDS]
        st = a.ListInlineMonitors(pb.ListInlineMonitorsRequest(), timeout=10).monitors
        assert [(m.monitor.flow_id, m.program, list(m.monitor.segments), m.monitor.trace_nodes) for m in st] == [
            (7, "ioam_lwt", SIDS, 3)
        ]
        tx = ingress(a)
        assert tx.packets == tx.instrumented == tx.next_sequence == sent
        seen = e2e_packets(pcap)
        assert [p.seq for p in seen] == list(range(sent))  # in order, no reset, no gap
        runs = [(p.sids, p.hbh_len) for p in seen]
        switches = [k for k in range(1, sent) if runs[k] != runs[k - 1]]
        assert len(switches) == 2, switches
        first, second = switches
        assert runs[0] == runs[-1] == (SIDS, 16 + 16 * 3) and runs[first] == (STEERED, 16 + 16 * 4)
        ring = egress_ring()
        assert [(r["flow_id"], r["seq"]) for r in ring] == [(7, p.seq) for p in seen]
        assert processor_loss(ring) == {"flow=7": {"received": sent, "lost": 0, "duplicated": 0, "reordered": 0}}
        text = metrics(agent, r"segscope_agent_inline_route_steers\{[^}]*\} 2\b")
        assert re.search(r"segscope_agent_inline_route_steers\{[^}]*\} 2\b", text), text[-2000:]
        assert s.RemovePolicy(spb.RemovePolicyRequest(destination=other.destination, table=254), timeout=30).changed
        a.StopInlineMonitor(pb.StopInlineMonitorRequest(side=INGRESS, flow_id=7), timeout=30)


def test_steer_to_a_list_too_long_falls_back_remove_gives_state_back(rlab, rpki, transit, tmp_path):
    """A new SID list whose header would exceed the route program's 256 bytes (5 SIDs and a trace of
    6): the update happens, the monitor goes on with ioam_tx on TC on the new list, said in its status
    and counted. 100 packets on the route, then 100 after the fallback: captured at the next hop (R's
    r0) these carry the trace of 6 slots and the E2E option with the sequence numbers 100..199 in
    order (the route paused, its next number read, the TC flow started there). Steered back, the
    monitor follows its policy onto the route again: the next 100 carry 200..299. B's egress (the
    five SIDs an alternate path) has 300 records of flow 7, numbers 0..299, one flow for the
    processor. Before, the TC flow started again at 0 and stayed on the five SIDs. RemovePolicy on
    a monitored policy gives the route program's state back."""
    with monitored_policy(rlab, rpki, transit, tmp_path, FIVE) as (agent, a, s, ch, pol):
        assert not s.UpdatePolicy(spb.UpdatePolicyRequest(policy=pol), timeout=10).changed  # same: fine
        send(rlab, 100)
        assert ingress(a).next_sequence == 100  # on the route
        assert steer(s, pol, FIVE).changed
        assert "encap seg6 mode encap segs 5" in route(rlab) and route(rlab, "3355") == route(rlab, "3356") == ""
        st = a.ListInlineMonitors(pb.ListInlineMonitorsRequest(), timeout=10).monitors
        assert [(m.monitor.flow_id, m.program, list(m.monitor.segments)) for m in st] == [(7, "ioam_tx", FIVE)]
        note = st[0].note
        assert "fell back to ioam_tx on TC" in note and "272-byte header" in note and "go on from 100" in note, note
        with capture(rlab.ns("R"), "r0", tmp_path / "r0.pcap"):  # the next hop: what A sends
            send(rlab, 100)
        tx = ingress(a)  # the new list's packets, instrumented by ioam_tx on TC
        assert tx.packets == tx.sampled == tx.instrumented == 100 and tx.next_sequence == 200
        seen = e2e_packets(tmp_path / "r0.pcap")
        # every packet with the trace (6 slots: 5 SIDs + 1) and the E2E option, numbered on
        assert [(p.seq, p.sids, p.hbh_len) for p in seen] == [(i, FIVE, 16 + 16 * 6) for i in range(100, 200)]
        text = metrics(agent, r"segscope_agent_inline_route_fallbacks\{[^}]*\} 1\b")
        assert re.search(r"segscope_agent_inline_route_fallbacks\{[^}]*\} 1\b", text), text[-2000:]
        # steered back (ApplyBatch, pipelined, after another operation): the monitor follows its
        # policy onto the route again once the kernel has it, numbering on from 200
        other = spb.Policy()
        other.CopyFrom(pol)
        other.destination, other.segments[:] = "fd00:b:9::/64", FIVE
        batch = spb.ApplyBatchRequest(
            operations=[
                spb.Srv6Operation(create_policy=spb.CreatePolicyRequest(policy=other)),
                spb.Srv6Operation(update_policy=spb.UpdatePolicyRequest(policy=pol)),
            ]
        )
        done = s.ApplyBatch(batch, timeout=30)
        assert [(r.code, r.changed) for r in done.results] == [(0, True), (0, True)], done
        assert s.RemovePolicy(spb.RemovePolicyRequest(destination=other.destination, table=254), timeout=30).changed
        st = a.ListInlineMonitors(pb.ListInlineMonitorsRequest(), timeout=10).monitors
        assert [(m.monitor.flow_id, m.program, list(m.monitor.segments), m.monitor.trace_nodes) for m in st] == [
            (7, "ioam_lwt", SIDS, 3)
        ]
        assert "followed its policy" in st[0].note and "go on from 200" in st[0].note, st[0].note
        text = metrics(agent, r"segscope_agent_inline_tc_follows\{[^}]*\} 1\b")
        assert re.search(r"segscope_agent_inline_tc_follows\{[^}]*\} 1\b", text), text[-2000:]
        assert "encap bpf" in route(rlab)
        with capture(rlab.ns("R"), "r0", tmp_path / "r0-back.pcap"):
            send(rlab, 100)
        seen = e2e_packets(tmp_path / "r0-back.pcap")
        assert [(p.seq, p.sids, p.hbh_len) for p in seen] == [(i, SIDS, 16 + 16 * 3) for i in range(200, 300)]
        ring = egress_ring()
        assert [(r["flow_id"], r["seq"]) for r in ring] == [(7, i) for i in range(300)]
        assert processor_loss(ring) == {"flow=7": {"received": 300, "lost": 0, "duplicated": 0, "reordered": 0}}
        a.Reset(pb.ResetInlineRequest(), timeout=30)
        assert_plain_seg6(rlab)
        # RemovePolicy of a monitored policy: route entry, copy and rule go first
        enable(a, 1)  # Reset cleared the IOAM identity
        a.StartInlineMonitor(pb.StartInlineMonitorRequest(monitor=mon()), timeout=30)
        assert "encap bpf" in route(rlab)
        send(rlab, 50)
        assert s.RemovePolicy(spb.RemovePolicyRequest(destination=POLICY, table=254), timeout=30).changed
        assert route(rlab) == "" and route(rlab, "3355") == route(rlab, "3356") == ""
        rules = rlab.run("A", ["ip", "-6", "rule", "show"], check=True).stdout
        assert "lookup 3355" not in rules and "lookup 3356" not in rules
        st = a.ListInlineMonitors(pb.ListInlineMonitorsRequest(), timeout=10).monitors
        assert [(m.monitor.flow_id, m.program) for m in st] == [(7, "ioam_tx")]
        assert ingress(a).next_sequence == 50  # TC numbers on from the route's (before: from 0)
        a.Reset(pb.ResetInlineRequest(), timeout=30)
        assert s.CreatePolicy(spb.CreatePolicyRequest(policy=pol), timeout=10).changed


def test_the_move_to_tc_mid_traffic_leaves_one_window_uninstrumented_and_no_number_lost(rlab, rpki, transit, tmp_path):
    """The fallback of the test above while H1 sends 3 000 packets (every one sampled): captured at
    A's next hop (R's r0), every packet leaves A once; the instrumented ones carry 0..k-1 in order,
    the route's (3-slot trace) before ioam_tx's (6 slots, five SIDs); the packets without IOAM are
    one window between the two, the move's: ioam_tx attached first, then the route paused, its next
    number read 50 ms later, the route given back, the TC flow added. B records each instrumented
    packet once: nothing lost, duplicated or reordered for the processor. The window's packets and
    duration are printed."""
    with monitored_policy(rlab, rpki, transit, tmp_path, FIVE) as (agent, a, s, ch, pol):
        sent, pcap = 3000, tmp_path / "r0.pcap"
        with capture(rlab.ns("R"), "r0", pcap, "ip6 src fc00:12::1"):  # what A sends (not H2's replies)
            sender = rlab.popen("H1", [sys.executable, "-c", PACED_SENDER, str(sent)], stdout=subprocess.PIPE)
            time.sleep(0.5)
            t0 = time.monotonic()
            assert steer(s, pol, FIVE).changed
            move_s = time.monotonic() - t0
            assert int(sender.communicate(timeout=60)[0]) == sent
            time.sleep(0.5)
        st = a.ListInlineMonitors(pb.ListInlineMonitorsRequest(), timeout=10).monitors
        assert [(m.monitor.flow_id, m.program) for m in st] == [(7, "ioam_tx")]
        frames = srv6_frames(pcap)
        tx = ingress(a)
        ring = egress_ring()
        a.Reset(pb.ResetInlineRequest(), timeout=30)
        assert steer(s, pol, SIDS).changed
    assert len(frames) == sent, "every packet left A once"
    marks = "".join("-" if p is None else ("r" if p.sids == SIDS else "t") for _, p in frames)
    runs = " ".join(f"{k}x{len(list(g))}" for k, g in itertools.groupby(marks))  # r: route, -: none, t: TC
    assert re.fullmatch(r"r+-*t+", marks), "route, one window without IOAM, then TC: " + runs
    seen = [p for _, p in frames if p is not None]
    assert [p.seq for p in seen] == list(range(len(seen))), "one series of numbers, in order, no gap"
    assert all(p.hbh_len == 16 + 16 * 3 for p in seen if p.sids == SIDS)
    assert all(p.hbh_len == 16 + 16 * 6 for p in seen if p.sids == FIVE)
    assert tx.next_sequence == len(seen)
    assert [(r["flow_id"], r["seq"]) for r in ring] == [(7, p.seq) for p in seen]
    assert processor_loss(ring) == {"flow=7": {"received": len(seen), "lost": 0, "duplicated": 0, "reordered": 0}}
    gap = marks.count("-")
    last_route = max(ts for ts, p in frames if p is not None and p.sids == SIDS)
    first_tc = min(ts for ts, p in frames if p is not None and p.sids == FIVE)
    sys.stderr.write(
        f"\n[route -> TC] {gap} of {sent} packets without IOAM, {(first_tc - last_route) * 1e3:.0f} ms between the "
        f"route's last instrumented packet and ioam_tx's first; UpdatePolicy took {move_s * 1e3:.0f} ms\n"
    )


def kill9(agent) -> None:
    os.killpg(agent.proc.pid, signal.SIGKILL)
    agent.proc.wait()


def test_kill9_then_the_next_agent_adopts_the_route(rlab, rpki, transit, tmp_path):
    """With its state: the route forwards and instruments while no agent runs, the next agent adopts
    the monitor on the route, sequence numbers go on without a gap, and Stop gives the route back."""
    agent = a_agent(rlab, rpki, tmp_path)
    with agent.channel() as ch:
        a = inline_pb2_grpc.InlineMonitorServiceStub(ch)
        enable(a, 1)
        a.StartInlineMonitor(pb.StartInlineMonitorRequest(monitor=mon()), timeout=30)
    base = records(transit)
    send(rlab, 100)
    kill9(agent)
    send(rlab, 100)  # no agent: the route still forwards and instruments
    assert "encap bpf" in route(rlab)
    agent = a_agent(rlab, rpki, tmp_path)
    try:
        with agent.channel() as ch:
            a = inline_pb2_grpc.InlineMonitorServiceStub(ch)
            listed = a.ListInlineMonitors(pb.ListInlineMonitorsRequest(), timeout=10).monitors
            assert [(m.monitor.flow_id, m.program) for m in listed] == [(7, "ioam_lwt")]
            assert [p.segments for p in policies(ch) if p.destination == POLICY] == [SIDS]
            send(rlab, 100)
            tx = ingress(a)
            assert tx.instrumented == tx.next_sequence == 300 and records(transit) - base == 300
            a.StopInlineMonitor(pb.StopInlineMonitorRequest(side=INGRESS, flow_id=7), timeout=30)
            assert_plain_seg6(rlab)
    finally:
        assert agent.stop() == 0


def test_kill9_then_an_agent_without_its_state_gives_the_route_back(rlab, rpki, transit, tmp_path):
    agent = a_agent(rlab, rpki, tmp_path, state=False)
    with agent.channel() as ch:
        a = inline_pb2_grpc.InlineMonitorServiceStub(ch)
        enable(a, 1)
        a.StartInlineMonitor(pb.StartInlineMonitorRequest(monitor=mon()), timeout=30)
    kill9(agent)
    assert "encap bpf" in route(rlab)
    agent = a_agent(rlab, rpki, tmp_path, state=False)
    try:
        assert_plain_seg6(rlab)  # before the first RPC
        assert "given back (no monitor owns it)" in agent.log()
    finally:
        assert agent.stop() == 0
    assert_plain_seg6(rlab)
