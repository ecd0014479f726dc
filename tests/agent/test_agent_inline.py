"""InlineMonitorService over mutual TLS: the node's IOAM identity set in a netlab node's kernel and
restored exactly (sysctls and namespaces read back with sysctl(8) and `ip ioam`, independent of the
agent's own netlink code), also after the agent was killed; every RPC's bad input named by field;
and, once build/datapath/ioam_tx and ioam_rx exist, in-line monitors on real traffic
H1 -> A -> R -> B -> H2 (ingress on A, IOAM transit on R, egress on B).

Own lab (prefix `inla`, netlab/topologies/line5_two_paths.yaml) and bpffs instances (`inla-*`)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import grpc
import pytest

from netlab import Lab
from netlab.lab import teardown
from segscope_proto.segscope.agent.v1 import inline_pb2 as pb
from segscope_proto.segscope.agent.v1 import inline_pb2_grpc
from tests.agent.agent_env import make_test_pki, start_agent
from tests.agent.conftest import expect_error
from tests.built import require
from tests.isolation import own_name

PREFIX = own_name("inla")
TOPOLOGY = "netlab/topologies/line5_two_paths.yaml"
REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("SEGSCOPE_BUILD_DIR") or REPO / "build")
DATAPATH = (BUILD / "datapath" / "ioam_tx").exists() and (BUILD / "datapath" / "ioam_rx").exists()
needs_datapath = pytest.mark.usefixtures("datapath_built")


@pytest.fixture
def datapath_built() -> None:
    require("datapath/ioam_tx", "datapath/ioam_rx")


IA, NF, AE, FP = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION,
)
INGRESS, EGRESS = pb.INLINE_SIDE_INGRESS, pb.INLINE_SIDE_EGRESS
SIDS = ["fc00:2::e", "fc00:3::d6"]  # A's policy fd00:b::/64 in line5_two_paths


@pytest.fixture(scope="module")
def ilab(bpffs):
    teardown(PREFIX)
    lab = Lab.up(TOPOLOGY, prefix=PREFIX)
    try:
        yield lab
    finally:
        lab.down()


@pytest.fixture(scope="module")
def ipki(tmp_path_factory):
    return make_test_pki(tmp_path_factory.mktemp("inla-pki"))


@pytest.fixture(scope="module")
def iagents(ilab, ipki, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("inla-agents")
    out = {}
    try:
        for node in ("A", "R", "B"):
            out[node] = start_agent(
                ilab.ns(node),
                node,
                run_dir,
                pki=ipki,
                instance=f"{PREFIX}-{node}",
                extra_args=["--state-dir", str(run_dir / f"state-{node}")],
            )
        yield out
    finally:
        codes = {n: a.stop() for n, a in out.items()}
        sys.stderr.write(f"\n[inline agents] exit codes {codes}, logs in {run_dir}\n")


@pytest.fixture(scope="module")
def stubs(iagents):
    chans = {n: a.channel() for n, a in iagents.items()}
    yield {n: inline_pb2_grpc.InlineMonitorServiceStub(c) for n, c in chans.items()}
    for c in chans.values():
        inline_pb2_grpc.InlineMonitorServiceStub(c).Reset(pb.ResetInlineRequest(), timeout=30)
        c.close()


def sysctls(lab, node: str, *keys: str) -> dict[str, str]:
    out = lab.run(node, ["sysctl", *keys], check=True).stdout
    return dict(line.split(" = ", 1) for line in out.strip().splitlines())


def namespaces(lab, node: str) -> set[int]:
    out = lab.run(node, ["ip", "ioam", "namespace", "show"], check=True).stdout
    return {int(line.split()[1]) for line in out.splitlines() if line.strip().startswith("namespace")}


def ifindex(lab, node: str, dev: str) -> int:
    return int(lab.run(node, ["cat", f"/sys/class/net/{dev}/ifindex"], check=True).stdout)


def dev_keys(*devs: str) -> list[str]:
    return [f"net.ipv6.conf.{d}.ioam6_{k}" for d in devs for k in ("enabled", "id")]


def enable(stub, node_id=1234, ns=(1,), interfaces=(), all_devices=False):
    cfg = pb.IoamConfig(
        node_id=node_id,
        namespace_ids=list(ns),
        interfaces=[pb.IoamInterface(device=d, if_id=i) for d, i in interfaces],
        all_devices=all_devices,
    )
    return stub.EnableIoam(pb.EnableIoamRequest(config=cfg), timeout=30)


def test_enable_sets_the_kernel_and_disable_restores_it_exactly(ilab, stubs):
    r = stubs["R"]
    keys = ["net.ipv6.ioam6_id", *dev_keys("r0", "r1", "lo")]
    # a value that is not the kernel default, and a namespace somebody else added: both must survive
    ilab.run("R", ["sysctl", "-w", "net.ipv6.conf.r0.ioam6_id=33"], check=True)
    ilab.run("R", ["ip", "ioam", "namespace", "add", "5"], check=True)
    try:
        before, ns_before = sysctls(ilab, "R", *keys), namespaces(ilab, "R")
        assert before["net.ipv6.conf.r0.ioam6_id"] == "33" and 5 in ns_before and 42 not in ns_before
        r1 = ifindex(ilab, "R", "r1")

        resp = enable(r, 1234, (42, 5), [("r0", 100)], all_devices=True)
        assert resp.changed
        assert [(i.device, i.if_id) for i in resp.interfaces] == [("r0", 100), ("r1", r1)]  # lo never
        assert list(resp.config.namespace_ids) == [5, 42]  # normalised
        now = sysctls(ilab, "R", *keys)
        assert now["net.ipv6.ioam6_id"] == "1234"
        assert (now["net.ipv6.conf.r0.ioam6_enabled"], now["net.ipv6.conf.r0.ioam6_id"]) == ("1", "100")
        assert (now["net.ipv6.conf.r1.ioam6_enabled"], now["net.ipv6.conf.r1.ioam6_id"]) == ("1", str(r1))
        assert now["net.ipv6.conf.lo.ioam6_enabled"] == before["net.ipv6.conf.lo.ioam6_enabled"]
        assert namespaces(ilab, "R") == ns_before | {42}

        assert not enable(r, 1234, (5, 42), [("r0", 100)], all_devices=True).changed  # same again
        got = r.GetIoamConfig(pb.GetIoamConfigRequest(), timeout=10)
        assert got.enabled and got.config.node_id == 1234 and got.config.all_devices
        assert [(i.device, i.if_id) for i in got.interfaces] == [("r0", 100), ("r1", r1)]

        # another configuration: r0 dropped (back to what it had), namespace 42 kept, id changed
        resp = enable(r, 99, (42,), [("r1", 7)])
        assert resp.changed and [(i.device, i.if_id) for i in resp.interfaces] == [("r1", 7)]
        now = sysctls(ilab, "R", *keys)
        assert now["net.ipv6.ioam6_id"] == "99" and now["net.ipv6.conf.r1.ioam6_id"] == "7"
        assert (now["net.ipv6.conf.r0.ioam6_enabled"], now["net.ipv6.conf.r0.ioam6_id"]) == (
            before["net.ipv6.conf.r0.ioam6_enabled"],
            "33",
        )
        assert namespaces(ilab, "R") == ns_before | {42}  # 5 was not the agent's: still there

        assert r.DisableIoam(pb.DisableIoamRequest(), timeout=30).changed
        assert sysctls(ilab, "R", *keys) == before
        assert namespaces(ilab, "R") == ns_before
        assert not r.DisableIoam(pb.DisableIoamRequest(), timeout=30).changed
        assert not r.GetIoamConfig(pb.GetIoamConfigRequest(), timeout=10).enabled
    finally:
        ilab.run("R", ["ip", "ioam", "namespace", "del", "5"])
        ilab.run("R", ["sysctl", "-w", "net.ipv6.conf.r0.ioam6_id=65535"])


def test_enable_refusals_name_the_field(ilab, stubs):
    r = stubs["R"]
    msg = expect_error(
        r.EnableIoam,
        pb.EnableIoamRequest(
            config=pb.IoamConfig(node_id=1, namespace_ids=[1], interfaces=[{"device": "nope0", "if_id": 3}])
        ),
        FP,
        "config.interfaces[0].device:",
    )
    assert "no device 'nope0'" in msg
    clash = ifindex(ilab, "R", "r1")  # r0 gets r1's ifindex as its id: all_devices cannot give r1 its own
    msg = expect_error(
        r.EnableIoam,
        pb.EnableIoamRequest(
            config=pb.IoamConfig(
                node_id=1, namespace_ids=[1], interfaces=[{"device": "r0", "if_id": clash}], all_devices=True
            )
        ),
        FP,
        "config.all_devices:",
    )
    assert "r1" in msg and "r0" in msg
    assert not r.GetIoamConfig(pb.GetIoamConfigRequest(), timeout=10).enabled  # nothing half-done
    assert sysctls(ilab, "R", "net.ipv6.ioam6_id")["net.ipv6.ioam6_id"] == "16777215"


def mon(side=INGRESS, flow_id=7, **kw) -> pb.InlineMonitor:
    d = dict(side=side, flow_id=flow_id, device="a0" if side == INGRESS else "b0", segments=SIDS, namespace_id=1)
    if side == INGRESS:
        d["sample_every"] = 1
    d.update(kw)
    return pb.InlineMonitor(**d)


BAD_MONITORS = [
    (mon(side=0), "monitor.side: required"),
    (mon(side=9), "monitor.side: 9 is not a InlineSide value"),
    (mon(flow_id=0), "monitor.flow_id: required"),
    (mon(device=""), "monitor.device: required"),
    (mon(device="a b"), "monitor.device: 'a b' is not a device name"),
    (mon(segments=[]), "monitor.segments: required"),
    (mon(segments=["fc00::1"] * 7), "monitor.segments: 7 SIDs, at most 6"),
    (mon(segments=["fc00:2::e", "x"]), "monitor.segments[1]: 'x' is not an IPv6 address"),
    (mon(namespace_id=0), "monitor.namespace_id: required"),
    (mon(namespace_id=70000), "monitor.namespace_id: 70000 out of range 1..65535"),
    (mon(trace_nodes=13), "monitor.trace_nodes: 13 out of range 1..12"),
    (
        pb.InlineMonitor(side=INGRESS, flow_id=7, device="a0", segments=SIDS, namespace_id=1),
        "monitor.sampling: required",
    ),
    (mon(sample_every=0), "monitor.sample_every: 0 out of range 1..65535"),
    (mon(sample_interval_us=60_000_001), "monitor.sample_interval_us: 60000001 out of range 1..60000000"),
    (mon(match=pb.InlineMatch(src_prefix="fd00:a::1/64")), "monitor.match.src_prefix: 'fd00:a::1/64' has host bits"),
    (mon(match=pb.InlineMatch(dst_prefix="nope")), "monitor.match.dst_prefix: 'nope' is not an IPv6 or IPv4 prefix"),
    (
        mon(match=pb.InlineMatch(src_prefix="fd00:a::/64", dst_prefix="10.0.0.0/8")),
        "monitor.match.dst_prefix: '10.0.0.0/8' is not an IPv6 prefix",
    ),
    (mon(match=pb.InlineMatch(protocol=256)), "monitor.match.protocol: 256 out of range 0..255"),
    (mon(match=pb.InlineMatch(dst_port=53)), "monitor.match.dst_port: needs match.protocol 6"),
    (mon(match=pb.InlineMatch(protocol=17, src_port=70000)), "monitor.match.src_port: 70000 out of range"),
    (mon(EGRESS, trace_nodes=3), "monitor.trace_nodes: not allowed with INLINE_SIDE_EGRESS"),
    (mon(EGRESS, sample_every=5), "monitor.sampling: not allowed with INLINE_SIDE_EGRESS"),
    (mon(EGRESS, match=pb.InlineMatch(protocol=17)), "monitor.match: not allowed with INLINE_SIDE_EGRESS"),
]


@pytest.mark.parametrize("m,msg", BAD_MONITORS, ids=[f"{i}-{m.split(':')[0]}" for i, (_, m) in enumerate(BAD_MONITORS)])
def test_bad_monitor_names_the_field(stubs, m, msg):
    got = expect_error(
        stubs["A"].StartInlineMonitor, pb.StartInlineMonitorRequest(monitor=m), IA, msg.split(":")[0] + ":"
    )
    assert got.startswith(msg), got


def cfg(**kw) -> pb.IoamConfig:
    d = dict(node_id=5, namespace_ids=[1])
    d.update(kw)
    return pb.IoamConfig(**d)


BAD_CONFIGS = [
    (cfg(node_id=0), "config.node_id: required"),
    (cfg(node_id=0xFFFFFF), "config.node_id: 16777215 out of range 1..16777214"),
    (cfg(namespace_ids=[]), "config.namespace_ids: required"),
    (cfg(namespace_ids=[0]), "config.namespace_ids[0]: 0 out of range 1..65535"),
    (cfg(namespace_ids=[3, 3]), "config.namespace_ids[1]: 3 appears twice"),
    (cfg(namespace_ids=list(range(1, 66))), "config.namespace_ids: 65 namespaces, at most 64"),
    (cfg(interfaces=[pb.IoamInterface(if_id=3)]), "config.interfaces[0].device: required"),
    (cfg(interfaces=[pb.IoamInterface(device="r0")]), "config.interfaces[0].if_id: required"),
    (cfg(interfaces=[pb.IoamInterface(device="r0", if_id=65535)]), "config.interfaces[0].if_id: 65535 out of range"),
    (
        cfg(interfaces=[pb.IoamInterface(device="r0", if_id=3), pb.IoamInterface(device="r0", if_id=4)]),
        "config.interfaces[1].device: r0 appears twice",
    ),
    (
        cfg(interfaces=[pb.IoamInterface(device="r0", if_id=3), pb.IoamInterface(device="r1", if_id=3)]),
        "config.interfaces[1].if_id: 3 is also r0's interface id",
    ),
]


@pytest.mark.parametrize("c,msg", BAD_CONFIGS, ids=[f"{i}-{m.split(':')[0]}" for i, (_, m) in enumerate(BAD_CONFIGS)])
def test_bad_ioam_config_names_the_field(stubs, c, msg):
    got = expect_error(stubs["R"].EnableIoam, pb.EnableIoamRequest(config=c), IA, msg.split(":")[0] + ":")
    assert got.startswith(msg), got


def test_bad_keys_and_absent_monitors(stubs):
    a = stubs["A"]
    expect_error(a.StopInlineMonitor, pb.StopInlineMonitorRequest(flow_id=1), IA, "side: required")
    expect_error(a.StopInlineMonitor, pb.StopInlineMonitorRequest(side=INGRESS), IA, "flow_id: required")
    expect_error(a.GetInlineMonitorResults, pb.GetInlineMonitorResultsRequest(side=5, flow_id=1), IA, "side: 5 is not")
    expect_error(a.ListInlineMonitors, pb.ListInlineMonitorsRequest(side=4), IA, "side: 4 is not")
    expect_error(
        a.StopInlineMonitor, pb.StopInlineMonitorRequest(side=INGRESS, flow_id=99), NF, "flow_id: no ioam_tx flow 99"
    )
    assert not a.StopInlineMonitor(
        pb.StopInlineMonitorRequest(side=EGRESS, flow_id=99, allow_missing=True), timeout=10
    ).changed
    expect_error(a.GetInlineMonitorResults, pb.GetInlineMonitorResultsRequest(side=EGRESS, flow_id=99), NF, "flow_id:")
    assert list(a.ListInlineMonitors(pb.ListInlineMonitorsRequest(), timeout=10).monitors) == []


def test_a_monitor_needs_the_node_ioam_identity(stubs):
    a = stubs["A"]
    assert not a.GetIoamConfig(pb.GetIoamConfigRequest(), timeout=10).enabled
    msg = expect_error(a.StartInlineMonitor, pb.StartInlineMonitorRequest(monitor=mon()), FP, "monitor:")
    assert "EnableIoam first" in msg
    if not DATAPATH:  # until the datapath is built, the agent says so instead of failing obscurely
        enable(a, 11, (1,), [("a0", 1)])
        try:
            msg = expect_error(a.StartInlineMonitor, pb.StartInlineMonitorRequest(monitor=mon()), FP, "monitor.device:")
            assert "ioam_tx is not built" in msg
            assert list(a.ListInlineMonitors(pb.ListInlineMonitorsRequest(), timeout=10).monitors) == []
        finally:
            a.DisableIoam(pb.DisableIoamRequest(), timeout=30)


def test_killed_agent_leftovers_are_restored_by_the_next_one(ilab, ipki, tmp_path):
    """SIGKILL: the agent restores nothing, its state file stays; the next agent of the node (same
    state dir) restores the saved values before it serves. SIGTERM: the agent restores itself.
    With --adopt-timeout 0 (no hitless restarts): an adopting agent keeps the identity instead
    (test_agent_adoption_ustamp_inline.py)."""
    keys = ["net.ipv6.ioam6_id", *dev_keys("bh", "b0")]
    before, ns_before = sysctls(ilab, "B", *keys), namespaces(ilab, "B")
    state = tmp_path / "state"
    args = ["--state-dir", str(state), "--adopt-timeout", "0"]
    agent = start_agent(ilab.ns("B"), "B", tmp_path, pki=ipki, instance=f"{PREFIX}-Bk", extra_args=args)
    with agent.channel() as ch:
        enable(inline_pb2_grpc.InlineMonitorServiceStub(ch), 4242, (77,), [("bh", 9)], all_devices=True)
    os.killpg(agent.proc.pid, signal.SIGKILL)
    agent.proc.wait()
    assert sysctls(ilab, "B", "net.ipv6.ioam6_id")["net.ipv6.ioam6_id"] == "4242"  # left behind
    assert 77 in namespaces(ilab, "B") and (state / "ioam.json").exists()
    saved = json.loads((state / "ioam.json").read_text())
    assert saved["saved"]["net/ipv6/ioam6_id"] == before["net.ipv6.ioam6_id"]

    agent = start_agent(ilab.ns("B"), "B", tmp_path, pki=ipki, instance=f"{PREFIX}-Bk", extra_args=args)
    try:
        assert sysctls(ilab, "B", *keys) == before and namespaces(ilab, "B") == ns_before
        assert not (state / "ioam.json").exists()
        assert "IOAM configuration left by a previous agent" in agent.log()
        with agent.channel() as ch:
            stub = inline_pb2_grpc.InlineMonitorServiceStub(ch)
            assert not stub.GetIoamConfig(pb.GetIoamConfigRequest(), timeout=10).enabled
            enable(stub, 4243, (78,), [("b0", 8)])
        assert sysctls(ilab, "B", "net.ipv6.conf.b0.ioam6_id")["net.ipv6.conf.b0.ioam6_id"] == "8"
    finally:
        assert agent.stop() == 0
    assert sysctls(ilab, "B", *keys) == before and namespaces(ilab, "B") == ns_before  # SIGTERM: restored
    assert not (state / "ioam.json").exists()


def test_ioam_identity_and_monitors_on_segscope_paths(ilab, ipki, stack, tmp_path):
    """With --kafka EnableIoam publishes the node's `ioam/<node>` record on segscope.paths (node id,
    device -> interface id, namespaces) and DisableIoam its tombstone."""
    from segscope_schemas import names
    from segscope_schemas import path_record as pr
    from tests.agent.test_agent_kafka import consume

    node = f"inla_R_{int(time.time())}"  # a key of this run only
    agent = start_agent(
        ilab.ns("R"), node, tmp_path, pki=ipki, instance=f"{PREFIX}-Rk", kafka=stack.kafka_bootstrap,
        extra_args=["--state-dir", str(tmp_path / "state")],
    )  # fmt: skip
    try:
        with agent.channel() as ch:
            stub = inline_pb2_grpc.InlineMonitorServiceStub(ch)
            enable(stub, 321, (9, 3), [("r0", 11), ("r1", 12)])
            if DATAPATH:  # an egress side on r0: its path record, then its tombstone
                m = mon(EGRESS, flow_id=41, device="r0", namespace_id=9)
                stub.StartInlineMonitor(pb.StartInlineMonitorRequest(monitor=m), timeout=30)
                time.sleep(0.5)
                stub.StopInlineMonitor(pb.StopInlineMonitorRequest(side=EGRESS, flow_id=41), timeout=30)
            time.sleep(0.5)
            stub.DisableIoam(pb.DisableIoamRequest(), timeout=30)
        keys = {f"ioam/{node}".encode(), f"inline/{node}/41/rx".encode()}
        msgs = consume(
            stack.kafka_bootstrap,
            names.TOPIC_PATHS,
            lambda m: (m.key(), m.value()) if m.key() in keys else None,
            lambda out: sum(v is None for _, v in out) >= (2 if DATAPATH else 1),
        )
    finally:
        assert agent.stop() == 0
    ioam = [v for k, v in msgs if k.startswith(b"ioam/")]
    assert ioam and ioam[-1] is None, ioam  # the tombstone after the record
    rec = pr.decode(f"ioam/{node}".encode(), ioam[0])
    assert isinstance(rec, pr.IoamNode) and (rec.node_id, rec.namespaces) == (321, (3, 9))
    # each device with its IOAM id, its ifindex and its global prefix (the lab's addresses)
    assert [(i.device, i.if_id, i.ifindex, i.prefixes) for i in rec.interfaces] == [
        ("r0", 11, ifindex(ilab, "R", "r0"), ("fc00:12::/64",)),
        ("r1", 12, ifindex(ilab, "R", "r1"), ("fc00:23::/64",)),
    ]
    sids = {
        line.split()[0]
        for line in ilab.run("R", ["ip", "-6", "route", "show", "type", "unicast"], check=True).stdout.splitlines()
        if "seg6local" in line
    }
    assert set(rec.sids) == sids and sids, (rec.sids, sids)  # R's local SIDs (an SRv6 endpoint)
    if DATAPATH:
        side = [v for k, v in msgs if k.startswith(b"inline/")]
        assert len(side) == 2 and side[-1] is None, side
        rec = pr.decode(f"inline/{node}/41/rx".encode(), side[0])
        assert (rec.path, rec.namespace, rec.trace_nodes, rec.sampling) == (tuple(SIDS), 9, 0, 0)


# --------------------------------------------------------------------------- with the datapath

SENDER = r"""
import socket, sys, time
n = int(sys.argv[1]); s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
for i in range(n):
    s.sendto(b"y" * 100, ("fd00:b::1", int(sys.argv[2])))
    if i % 50 == 49: time.sleep(0.01)
print(n)
"""


@needs_datapath
def test_monitors_on_real_traffic(ilab, stubs):
    """Ingress on A (a0), IOAM transit on R, egress on B (b0): every sampled packet instrumented and
    recorded once; a second identical Start changes nothing; stopping detaches."""
    a, r, b = stubs["A"], stubs["R"], stubs["B"]
    for stub, node_id in ((a, 1), (r, 2), (b, 3)):
        enable(stub, node_id, (1,), all_devices=True)
    try:
        assert b.StartInlineMonitor(pb.StartInlineMonitorRequest(monitor=mon(EGRESS)), timeout=30).changed
        # the node id cannot change under a running monitor (its records carry it)
        expect_error(b.EnableIoam, pb.EnableIoamRequest(config=cfg(node_id=4)), FP, "config.node_id:")
        st = a.StartInlineMonitor(pb.StartInlineMonitorRequest(monitor=mon()), timeout=30)
        assert st.changed and st.status.monitor.trace_nodes == 3 and st.status.node_id == 1
        assert not a.StartInlineMonitor(pb.StartInlineMonitorRequest(monitor=mon()), timeout=30).changed
        expect_error(
            a.StartInlineMonitor, pb.StartInlineMonitorRequest(monitor=mon(sample_every=2)), AE, "monitor.flow_id:"
        )
        expect_error(
            a.StartInlineMonitor, pb.StartInlineMonitorRequest(monitor=mon(flow_id=8)), AE, "monitor.segments:"
        )
        expect_error(b.DisableIoam, pb.DisableIoamRequest(), FP, "in-line monitors run")
        sent = 300
        assert int(ilab.run("H1", [sys.executable, "-c", SENDER, str(sent), "40007"], check=True).stdout) == sent
        time.sleep(0.5)
        tx = a.GetInlineMonitorResults(pb.GetInlineMonitorResultsRequest(side=INGRESS, flow_id=7), timeout=10).ingress
        rx = b.GetInlineMonitorResults(pb.GetInlineMonitorResultsRequest(side=EGRESS, flow_id=7), timeout=10).egress
        print(f"\ninline: sent {sent}, ingress {tx}, egress records {rx.records}")
        assert tx.packets == tx.sampled == sent  # 1 in 1
        assert tx.instrumented + tx.skipped_mtu + tx.skipped_gso + tx.skipped_other == tx.sampled
        assert tx.instrumented == sent and tx.next_sequence == sent
        assert rx.records == tx.instrumented
    finally:
        for stub in (a, r, b):
            stub.Reset(pb.ResetInlineRequest(), timeout=30)
    assert "xdp" not in ilab.run("B", ["ip", "link", "show", "b0"], check=True).stdout


def test_enable_without_a_writable_state_dir_changes_nothing(ilab, ipki, tmp_path):
    """The values to restore cannot be kept: EnableIoam refuses before it touches the kernel."""
    before = sysctls(ilab, "R", "net.ipv6.ioam6_id", *dev_keys("r0"))
    agent = start_agent(
        ilab.ns("R"),
        "R",
        tmp_path,
        pki=ipki,
        instance=f"{PREFIX}-Rs",
        extra_args=["--state-dir", "/proc/inla-no-such-dir"],
    )
    try:
        with agent.channel() as ch:
            stub = inline_pb2_grpc.InlineMonitorServiceStub(ch)
            msg = expect_error(
                stub.EnableIoam,
                pb.EnableIoamRequest(config=cfg(interfaces=[pb.IoamInterface(device="r0", if_id=3)])),
                FP,
                "config:",
            )
            assert "cannot change or remember" in msg and "/proc/inla-no-such-dir" in msg
            assert not stub.GetIoamConfig(pb.GetIoamConfigRequest(), timeout=10).enabled
        assert sysctls(ilab, "R", "net.ipv6.ioam6_id", *dev_keys("r0")) == before
    finally:
        assert agent.stop() == 0


@needs_datapath
@pytest.mark.parametrize("hook", ["default", "xdp"])
def test_egress_hook_by_the_agent_option(ilab, ipki, stubs, tmp_path, hook):
    """The agent's default (--inline-egress-hook auto) runs ioam_rx on B's veth b0 as a TC ingress
    filter (no XDP program there); --inline-egress-hook xdp puts it in b0's XDP chain (no filter).
    Either way every sampled packet is recorded once, and Reset removes what was attached."""
    a = stubs["A"]
    extra = [] if hook == "default" else ["--inline-egress-hook", hook]
    b = start_agent(ilab.ns("B"), "B", tmp_path, pki=ipki, instance=f"{PREFIX}-Bt", extra_args=extra)
    try:
        with b.channel() as ch:
            bs = inline_pb2_grpc.InlineMonitorServiceStub(ch)
            for stub, node_id in ((a, 1), (bs, 3)):
                enable(stub, node_id, (1,), all_devices=True)
            bs.StartInlineMonitor(pb.StartInlineMonitorRequest(monitor=mon(EGRESS, flow_id=41)), timeout=30)
            a.StartInlineMonitor(pb.StartInlineMonitorRequest(monitor=mon(flow_id=41)), timeout=30)
            filters = ilab.run("B", ["tc", "filter", "show", "dev", "b0", "ingress"], check=True).stdout
            xdp = "xdp" in ilab.run("B", ["ip", "link", "show", "b0"], check=True).stdout
            assert ("ioam_rx_tc" in filters, xdp) == ((True, False) if hook == "default" else (False, True)), filters
            sent = 300
            assert int(ilab.run("H1", [sys.executable, "-c", SENDER, str(sent), "40041"], check=True).stdout) == sent
            time.sleep(0.5)
            tx = a.GetInlineMonitorResults(pb.GetInlineMonitorResultsRequest(side=INGRESS, flow_id=41), timeout=10)
            rx = bs.GetInlineMonitorResults(pb.GetInlineMonitorResultsRequest(side=EGRESS, flow_id=41), timeout=10)
            print(f"\ninline, egress hook {hook}: sent {sent}, ingress {tx.ingress}, records {rx.egress.records}")
            assert tx.ingress.instrumented == sent and rx.egress.records == sent
            bs.Reset(pb.ResetInlineRequest(), timeout=30)
        filters = ilab.run("B", ["tc", "filter", "show", "dev", "b0", "ingress"], check=True).stdout
        assert "ioam_rx_tc" not in filters, filters
        assert "xdp" not in ilab.run("B", ["ip", "link", "show", "b0"], check=True).stdout
    finally:
        a.Reset(pb.ResetInlineRequest(), timeout=30)
        assert b.stop() == 0


def test_killed_egress_agent_records_reach_kafka_through_the_next_one(ilab, ipki, stubs, stack, tmp_path):
    """The egress agent (--adopt-timeout 0: no hitless restarts) is killed while traffic flows: its
    streamer dies with it, ioam_rx keeps recording into a ring nobody reads. The next agent of the
    node drains that ring to Kafka before it replaces the program: every sampled packet's record is
    in Kafka exactly once (the ingress, untouched, numbers them 0..N-1)."""
    from segscope_schemas import ioam_record as ir
    from segscope_schemas import names
    from tests.agent.test_agent_kafka import consume

    a = stubs["A"]
    node = f"inlaB{int(time.time()) % 100000}"  # a Kafka key of this run only
    args = ["--state-dir", str(tmp_path / "state"), "--adopt-timeout", "0"]

    def b_agent():
        return start_agent(
            ilab.ns("B"),
            node,
            tmp_path,
            pki=ipki,
            instance=f"{PREFIX}-Bl",
            kafka=stack.kafka_bootstrap,
            extra_args=args,
        )

    def b_start(agent):
        with agent.channel() as ch:
            stub = inline_pb2_grpc.InlineMonitorServiceStub(ch)
            enable(stub, 3, (1,), all_devices=True)
            stub.StartInlineMonitor(pb.StartInlineMonitorRequest(monitor=mon(EGRESS, flow_id=31)), timeout=60)

    def send(n: int) -> None:
        assert int(ilab.run("H1", [sys.executable, "-c", SENDER, str(n), "40031"], check=True).stdout) == n

    enable(a, 1, (1,), all_devices=True)
    a.StartInlineMonitor(pb.StartInlineMonitorRequest(monitor=mon(flow_id=31)), timeout=30)
    agent = b_agent()
    try:
        b_start(agent)
        send(50)
        time.sleep(0.5)
        os.killpg(agent.proc.pid, signal.SIGKILL)  # its children have their own sessions: pdeathsig
        agent.proc.wait()
        time.sleep(0.5)
        send(40)  # recorded into the ring, read by nobody
        agent = b_agent()
        b_start(agent)  # drains the leftover ring, then attaches afresh
        assert "ioam_records a previous agent left: 40 to Kafka, 0 lost" in agent.log(), agent.log()[-2000:]
        send(30)
        key = f"{node}/31".encode()
        seqs = consume(
            stack.kafka_bootstrap,
            names.TOPIC_IOAM_RECORDS,
            lambda m: [int(s) for s in ir.decode_batch(m.value())[1]["seq"]] if m.key() == key else None,
            lambda out: sum(map(len, out)) >= 120,
            timeout_s=60,
        )
        got = [s for batch in seqs for s in batch]
        assert sorted(got) == list(range(120)), (len(got), sorted(set(range(120)) - set(got))[:10])
        tx = a.GetInlineMonitorResults(pb.GetInlineMonitorResultsRequest(side=INGRESS, flow_id=31), timeout=10)
        assert tx.ingress.instrumented == 120
    finally:
        a.Reset(pb.ResetInlineRequest(), timeout=30)
        with agent.channel() as ch:
            inline_pb2_grpc.InlineMonitorServiceStub(ch).Reset(pb.ResetInlineRequest(), timeout=30)
        assert agent.stop() == 0


@needs_datapath
def test_inline_counters_reach_influx(ilab, ipki, stubs, stack, tmp_path):
    """With --kafka the egress agent's lines reach InfluxDB: segscope_datapath program=ioam_rx (the
    pinned ioam_rx_stats), segscope_streamer records=ioam (its streamer), segscope_inline (the
    side), and they agree with what was sent: every packet sampled (1 in 1), recorded, delivered."""
    from tests.agent.test_agent_kafka import _influx_rows

    a = stubs["A"]
    node = f"inlaC{int(time.time()) % 100000}"
    since = time.time_ns()
    agent = start_agent(
        ilab.ns("B"), node, tmp_path, pki=ipki, instance=f"{PREFIX}-Bc", kafka=stack.kafka_bootstrap,
        extra_args=["--state-dir", str(tmp_path / "state"), "--stats-interval", "0.5"],
    )  # fmt: skip
    sent = 60
    try:
        enable(a, 1, (1,), all_devices=True)
        a.StartInlineMonitor(pb.StartInlineMonitorRequest(monitor=mon(flow_id=51)), timeout=30)
        with agent.channel() as ch:
            stub = inline_pb2_grpc.InlineMonitorServiceStub(ch)
            enable(stub, 3, (1,), all_devices=True)
            stub.StartInlineMonitor(pb.StartInlineMonitorRequest(monitor=mon(EGRESS, flow_id=51)), timeout=60)
            assert int(ilab.run("H1", [sys.executable, "-c", SENDER, str(sent), "40051"], check=True).stdout) == sent
            deadline, dp, st = time.monotonic() + 30, [], []
            while time.monotonic() < deadline:
                dp = _influx_rows(stack, "segscope_datapath", node, since, program="ioam_rx", settled=True)
                st = [
                    r
                    for r in _influx_rows(stack, "segscope_streamer", node, since, settled=True)
                    if r["records"] == "ioam"
                ]
                if dp and st and dp[-1]["recorded"] == sent and st[-1]["records_delivered"] == sent:
                    break
                time.sleep(0.5)
            eg = stub.GetInlineMonitorResults(pb.GetInlineMonitorResultsRequest(side=EGRESS, flow_id=51), timeout=10)
            stub.Reset(pb.ResetInlineRequest(), timeout=30)
        assert eg.egress.records == sent and eg.egress.ringbuf_full == 0
        assert dp and dp[-1]["recorded"] == sent and dp[-1]["pass_ringbuf_full"] == 0, dp[-1:]
        assert st and st[-1]["records_in"] == st[-1]["records_delivered"] == sent, st[-1:]
        assert st[-1]["records_failed"] == 0
        inv = _influx_rows(stack, "segscope_inline", node, since)
        assert inv and inv[-1]["flow"] == "51" and inv[-1]["side"] == "rx" and inv[-1]["namespace"] == 1
        assert inv[-1]["path"] == ",".join(SIDS) and inv[-1]["device"] == "b0"
    finally:
        a.Reset(pb.ResetInlineRequest(), timeout=30)
        assert agent.stop() == 0
