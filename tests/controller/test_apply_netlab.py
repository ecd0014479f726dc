"""apply against real agents on netlab line5 (no SRv6 routes: the intent owns them).

The intent is controller/examples/demo_line5.yaml itself; agents (python -m agent, one per
node, started by the agent tests' helper tests/agent/agent_env.py with one shared test PKI, mutual
TLS) listen on 127.0.0.1 ports the kernel picks; the intent reads them from the environment.
Every RPC the controller makes is counted by its channel interceptor, so "applying twice makes no
calls" is asserted on real counts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controller.core import Controller
from controller.intent import load_intent, parse_intent
from netlab import Lab, teardown
from segscope_proto.segscope.agent.v1 import flowmon_pb2, stamp_pb2
from tests.agent.agent_env import make_test_pki, start_agent
from tests.isolation import own_name

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "controller" / "examples" / "demo_line5.yaml"
TOPOLOGY = REPO / "netlab" / "topologies" / "line5_bare.yaml"
PREFIX = own_name("ctla")
READS = {
    "ListLocalSids": 1,
    "ListPolicies": 1,
    "ListStampSessions": 1,
    "ListFlowMonitors": 1,
    "GetIoamConfig": 1,
    "ListInlineMonitors": 1,
}

pytestmark = pytest.mark.datapath


@pytest.fixture(scope="module")
def env(bpffs, tmp_path_factory):
    teardown(PREFIX)
    run_dir = tmp_path_factory.mktemp("ctl-agents")
    pki = make_test_pki(run_dir / "certs")
    # the intent names the controller's client files controller.pem/.key
    (pki.dir / "controller.pem").write_bytes(pki.client_pem.read_bytes())
    (pki.dir / "controller.key").write_bytes(pki.client_key.read_bytes())
    lab = Lab.up(TOPOLOGY, prefix=PREFIX)
    agents = {}
    old = dict(os.environ)
    try:
        for node in ("A", "R", "B"):
            agents[node] = start_agent(lab.ns(node), node, run_dir, pki=pki)
            os.environ[f"SEGSCOPE_AGENT_{node}"] = agents[node].address
        os.environ["SEGSCOPE_CERTS"] = str(pki.dir)
        yield lab, agents
    finally:
        os.environ.clear()
        os.environ.update(old)
        for agent in agents.values():
            agent.stop()
        lab.down()


@pytest.fixture(scope="module")
def first_apply(env):
    """The demo intent applied once on a fresh lab (the result, and the open controller)."""
    ctl = Controller(load_intent(DEMO))
    result = ctl.apply()
    yield ctl, result
    ctl.close()


def ping(lab, count: int = 3) -> subprocess.CompletedProcess:
    return lab.run("H1", ["ping", "-6", "-c", str(count), "-i", "0.2", "-W", "1", "fd00:b::1"])


def test_fresh_lab_has_no_srv6_and_no_path(env):
    lab, _ = env
    assert "seg6" not in lab.run("A", ["ip", "-6", "route"]).stdout
    assert ping(lab, 1).returncode != 0


def test_apply_sets_up_the_demo(env, first_apply):
    lab, _ = env
    ctl, result = first_apply
    assert result.ok, result.failed
    assert [(op.action, op.kind, op.node) for op in result.ops] == [
        ("create", "local_sid", "A"),
        ("create", "local_sid", "B"),
        ("create", "local_sid", "R"),
        ("create", "policy", "A"),
        ("create", "policy", "B"),
        ("init", "stamp_init", "B"),
        ("create", "stamp_reflector", "B"),
        ("start", "stamp_reflector", "B"),
        ("init", "stamp_init", "A"),
        ("create", "stamp_sender", "A"),
        ("start", "stamp_sender", "A"),
    ]
    assert result.mutating_calls == {
        "A": {"CreateLocalSid": 1, "CreatePolicy": 1, "CreateStampSession": 1, "Init": 1, "StartStampSession": 1},
        "B": {"CreateLocalSid": 1, "CreatePolicy": 1, "CreateStampSession": 1, "Init": 1, "StartStampSession": 1},
        "R": {"CreateLocalSid": 1},
    }
    # the kernel has what the intent says
    a_routes = lab.run("A", ["ip", "-6", "route"]).stdout
    assert "fd00:b::/64" in a_routes and "segs 2 [ fc00:2::e fc00:3::d6 ]" in a_routes
    assert "fc00:2::e" in lab.run("R", ["ip", "-6", "route", "show", "fc00:2::e"]).stdout
    assert "seg6local action End" in lab.run("R", ["ip", "-6", "route", "show", "fc00:2::e"]).stdout
    # H1 reaches H2 through the policies and SIDs the controller installed
    assert ping(lab).returncode == 0
    # STAMP runs: the sender's agent collects reflected replies
    client = ctl.client("A")
    deadline = time.monotonic() + 10
    n = 0
    while time.monotonic() < deadline and n < 50:
        n = client.stamp.GetStampSessionResults(stamp_pb2.GetStampSessionResultsRequest(ssid=1)).forward.count
        time.sleep(0.5)
    assert n >= 50


def test_applying_twice_makes_no_calls(first_apply):
    ctl, _ = first_apply
    again = ctl.apply()
    assert again.ok and again.ops == []
    assert again.mutating_calls == {}
    # only the six reads per node, over the channels opened by the first apply
    assert again.calls == {"A": READS, "B": READS, "R": READS}


def test_changed_intent_makes_exactly_the_expected_calls(first_apply):
    ctl, _ = first_apply
    text = DEMO.read_text()
    # rate 100 -> 50 (a STAMP session cannot change in place: replace), a metric on A's policy
    # (hitless update), one more SID on R (create)
    changed = (
        text.replace("rate_pps: 100", "rate_pps: 50")
        .replace(
            '  - {node: R, sid: "fc00:2::e", action: End, dev: r0, count: true}\n',
            '  - {node: R, sid: "fc00:2::e", action: End, dev: r0, count: true}\n'
            '  - {node: R, sid: "fc00:2::99", action: End, dev: r1}\n',
        )
        .replace(
            'segs: ["fc00:2::e", "fc00:3::d6"], dev: a0}', 'segs: ["fc00:2::e", "fc00:3::d6"], dev: a0, metric: 100}'
        )
    )
    ctl.set_intent(parse_intent(changed, str(DEMO)))
    result = ctl.apply()
    assert result.ok, result.failed
    assert [(op.action, op.kind, op.node) for op in result.ops] == [
        ("create", "local_sid", "R"),
        ("update", "policy", "A"),
        ("init", "stamp_init", "A"),
        ("replace", "stamp_sender", "A"),
        ("start", "stamp_sender", "A"),
    ]
    assert result.mutating_calls == {
        "A": {"UpdatePolicy": 1, "Init": 1, "DestroyStampSession": 1, "CreateStampSession": 1, "StartStampSession": 1},
        "R": {"CreateLocalSid": 1},
    }
    assert ctl.apply().mutating_calls == {}
    # and back: the extra SID is removed (last), the rest changes back
    ctl.set_intent(load_intent(DEMO))
    back = ctl.apply()
    assert [(op.action, op.kind, op.node) for op in back.ops] == [
        ("update", "policy", "A"),
        ("init", "stamp_init", "A"),
        ("replace", "stamp_sender", "A"),
        ("start", "stamp_sender", "A"),
        ("remove", "local_sid", "R"),
    ]
    assert back.mutating_calls["R"] == {"RemoveLocalSid": 1}
    assert ctl.apply().mutating_calls == {}


# uSID (RFC 9800 NEXT-C-SID) version of the demo: one 3-micro-SID container per direction, F3216
# block fcbb:bbbb::/32; A, R, B are micro-SIDs 100, 200, 300, and d6 after a node's micro-SID is
# its End.DT6 (a function in the node's locator). The underlay routes to the locators are what an
# IGP would announce; the test adds them.
USID_INTENT = """
usid: {block: "fcbb:bbbb::/32", nflen: 16}
"""
USID_SIDS = """  - {node: A, sid: "fcbb:bbbb:100:d6::/64", action: End.DT6, lookup_table: 254, dev: a0}
  - {node: R, sid: "fcbb:bbbb:200::/48", action: End, flavors: [next-csid], dev: r0}
  - {node: B, sid: "fcbb:bbbb:300:d6::/64", action: End.DT6, lookup_table: 254, dev: b0}
"""
USID_LOCATOR_ROUTES = {
    "A": [("fcbb:bbbb:200::/48", "fc00:12::2")],
    "R": [("fcbb:bbbb:100::/48", "fc00:12::1"), ("fcbb:bbbb:300::/48", "fc00:23::2")],
    "B": [("fcbb:bbbb:200::/48", "fc00:23::1")],
}


def usid_demo_text() -> str:
    text = DEMO.read_text().replace("\nlocal_sids:\n", USID_INTENT + "\nlocal_sids:\n" + USID_SIDS, 1)
    return text.replace(
        'segs: ["fc00:2::e", "fc00:3::d6"], dev: a0', 'segs: [{usids: ["200", "300", "d6"]}], dev: a0'
    ).replace('segs: ["fc00:2::e", "fc00:1::d6"], dev: b0', 'segs: [{usids: ["200", "100", "d6"]}], dev: b0')


def test_usid_intent_applies_and_carries_traffic(env, first_apply):
    lab, _ = env
    ctl, _ = first_apply
    for node, routes in USID_LOCATOR_ROUTES.items():
        for dst, via in routes:
            lab.run(node, ["ip", "-6", "route", "replace", dst, "via", via], check=True)
    try:
        ctl.set_intent(parse_intent(usid_demo_text(), str(DEMO)))
        result = ctl.apply()
        assert result.ok, result.failed
        r_line = lab.run("R", ["ip", "-6", "route", "show", "fcbb:bbbb:200::/48"]).stdout
        assert "seg6local action End flavors next-csid lblen 32 nflen 16 dev r0" in r_line, r_line
        a_line = lab.run("A", ["ip", "-6", "route", "show", "fd00:b::/64"]).stdout
        assert "segs 1 [ fcbb:bbbb:200:300:d6:: ]" in a_line, a_line
        # what the agents read back equals the intent (flavour, lengths, prefix keys): no calls
        assert ctl.apply().mutating_calls == {}
        # H1 -> H2 and back over one container each way: R shifts, B / A decapsulate
        assert ping(lab).returncode == 0
    finally:
        ctl.set_intent(load_intent(DEMO))
        back = ctl.apply()
        for node, routes in USID_LOCATOR_ROUTES.items():
            for dst, _ in routes:
                lab.run(node, ["ip", "-6", "route", "del", dst])
    assert back.ok and ctl.apply().mutating_calls == {}
    assert "fcbb" not in lab.run("R", ["ip", "-6", "route"]).stdout


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "controller", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_cli_diff_apply_status(env, first_apply):
    lab, _ = env
    ctl, _ = first_apply
    ctl.set_intent(load_intent(DEMO))
    ctl.apply()
    diff = _cli("diff", str(DEMO))
    assert diff.returncode == 0 and "no changes" in diff.stdout
    # someone removes B's policy by hand: diff says so (exit 3), apply puts it back
    lab.run("B", ["ip", "-6", "route", "del", "fd00:a::/64"], check=True)
    diff = _cli("diff", "--json", str(DEMO))
    assert diff.returncode == 3
    assert [(o["action"], o["kind"], o["node"]) for o in json.loads(diff.stdout)["ops"]] == [("create", "policy", "B")]
    applied = _cli("apply", "--json", str(DEMO))
    assert applied.returncode == 0, applied.stderr
    body = json.loads(applied.stdout)
    assert body["mutating_calls"] == {"B": {"CreatePolicy": 1}}
    again = _cli("apply", str(DEMO))
    assert again.returncode == 0 and "no changes" in again.stdout and "0 changing RPC(s)" in again.stdout
    status = _cli("status", "--json", str(DEMO))
    assert status.returncode == 0, status.stderr
    st = json.loads(status.stdout)
    s0 = st["sessions"][0]
    assert s0["sender_state"] == "running" and s0["reflector_state"] == "running"
    # live counts while the sender runs (not 0 until it stops)
    assert s0["packets_sent"] > 0 and s0["packets_received"] > 0, s0
    assert s0["packets_lost"] is None and s0["reflector_tx_dropped"] == 0, s0
    table = _cli("status", str(DEMO))
    assert table.returncode == 0 and "STAMP sessions" in table.stdout and "running/running" in table.stdout


def test_unreachable_agent_is_exit_1(env, tmp_path):
    text = DEMO.read_text().replace("${SEGSCOPE_AGENT_R:-127.0.0.1:50062}", "127.0.0.1:1")
    bad = tmp_path / "unreachable.yaml"
    bad.write_text(text.replace("../../.run/demo/certs", os.environ["SEGSCOPE_CERTS"]))
    r = _cli("diff", "--timeout", "1", str(bad))
    assert r.returncode == 1 and "node R" in r.stderr and "not reachable" in r.stderr


def test_switch_to_loss_monitoring_and_back(env, first_apply):
    """line5_loss.yaml: the demo's SRv6 with an alternate-marking flow instead of STAMP. The
    controller Resets STAMP on A and B first (the intent has no session: the reflector leaves b0),
    then starts the RX monitor on B before the TX colourer on A; H1 -> H2 traffic is counted on both
    sides; a second apply makes no call; back to the demo, the flows go before STAMP returns."""
    lab, _ = env
    ctl, _ = first_apply
    ctl.set_intent(load_intent(REPO / "controller" / "examples" / "line5_loss.yaml"))
    result = ctl.apply()
    assert result.ok, result.failed
    assert [(op.action, op.kind, op.node) for op in result.ops] == [
        ("reset", "stamp_reset", "A"),
        ("reset", "stamp_reset", "B"),
        ("update", "local_sid", "A"),
        ("update", "local_sid", "B"),
        ("update", "local_sid", "R"),
        ("create", "flow_rx", "B"),
        ("create", "flow_tx", "A"),
    ]
    assert result.mutating_calls == {
        "A": {"Reset": 1, "UpdateLocalSid": 1, "StartFlowMonitor": 1},
        "B": {"Reset": 1, "UpdateLocalSid": 1, "StartFlowMonitor": 1},
        "R": {"UpdateLocalSid": 1},
    }
    assert ctl.apply().mutating_calls == {}
    assert ping(lab, 20).returncode == 0
    tx = ctl.client("A").flowmon.GetFlowMonitorResults(
        flowmon_pb2.GetFlowMonitorResultsRequest(side=flowmon_pb2.FLOW_MONITOR_SIDE_TX, flow_id=7)
    )
    rx = ctl.client("B").flowmon.GetFlowMonitorResults(
        flowmon_pb2.GetFlowMonitorResultsRequest(side=flowmon_pb2.FLOW_MONITOR_SIDE_RX, flow_id=7)
    )
    assert tx.total_packets >= 20 and rx.total_packets == tx.total_packets  # no loss injected
    ctl.set_intent(load_intent(DEMO))
    back = ctl.apply()
    assert back.ok, back.failed
    assert [(op.action, op.kind, op.node) for op in back.ops][:2] == [
        ("remove", "flow_tx", "A"),
        ("remove", "flow_rx", "B"),
    ]
    assert back.mutating_calls["B"]["Init"] == 1 and back.mutating_calls["A"]["Init"] == 1
    assert ctl.apply().mutating_calls == {}


def test_batched_apply_is_one_call_per_node_and_kind(first_apply):
    """apply(batch=True): 40 more SIDs on R and 40 more policies on A go as one ApplyBatch each."""
    ctl, _ = first_apply
    ctl.set_intent(load_intent(DEMO))
    ctl.apply()
    extra_sids = "".join(f'  - {{node: R, sid: "fc00:2::1:{i:x}", action: End, dev: r1}}\n' for i in range(40))
    extra_pols = "".join(
        f'  - {{node: A, destination: "fd00:77:{i:x}::/64", segs: ["fc00:2::e"], dev: a0}}\n' for i in range(40)
    )
    text = (
        DEMO.read_text()
        .replace("\n# H1 -> H2 traffic", extra_sids + "\n# H1 -> H2 traffic")
        .replace("\n# One STAMP session", extra_pols + "\n# One STAMP session")
    )
    ctl.set_intent(parse_intent(text, str(DEMO)))
    result = ctl.apply(batch=True)
    assert result.ok, result.failed
    assert len(result.ops) == 80
    assert result.mutating_calls == {"A": {"ApplyBatch": 1}, "R": {"ApplyBatch": 1}}
    assert ctl.apply(batch=True).mutating_calls == {}
    routes = ctl.client("R").read_state()
    assert sum(1 for ident in routes if ident[0] == "local_sid") == 41
    ctl.set_intent(load_intent(DEMO))
    back = ctl.apply(batch=True)
    assert [op.action for op in back.ops] == ["remove"] * 80
    assert back.mutating_calls == {"A": {"ApplyBatch": 1}, "R": {"ApplyBatch": 1}}
    assert ctl.apply().mutating_calls == {}


def test_a_refused_call_stops_apply_with_exit_1(env, first_apply, tmp_path):
    """The agent refuses a policy on a device the node does not have: apply stops there, says which
    node, RPC and gRPC code, exits 1; what was applied before stays; fixing the file and applying
    again continues from what the agents then report."""
    ctl, _ = first_apply
    ctl.set_intent(load_intent(DEMO))
    ctl.apply()
    certs = os.environ["SEGSCOPE_CERTS"]
    text = (
        DEMO.read_text()
        .replace("../../.run/demo/certs", certs)
        .replace(
            '  - {node: R, sid: "fc00:2::e", action: End, dev: r0, count: true}\n',
            '  - {node: R, sid: "fc00:2::e", action: End, dev: r0, count: true}\n'
            '  - {node: R, sid: "fc00:2::77", action: End, dev: r1}\n',
        )
        .replace(
            "policies:\n", 'policies:\n  - {node: R, destination: "fd00:66::/64", segs: ["fc00:3::d6"], dev: nope0}\n'
        )
    )
    bad = tmp_path / "bad_dev.yaml"
    bad.write_text(text)
    r = _cli("apply", str(bad))
    assert r.returncode == 1
    assert "FAILED" in r.stderr and "node R" in r.stderr and "CreatePolicy" in r.stderr, r.stderr
    assert "1/2 operation(s) applied" in r.stdout, r.stdout  # the SID went in before
    ok = bad.read_text().replace("dev: nope0", "dev: r1")
    bad.write_text(ok)
    r = _cli("apply", "--json", str(bad))
    assert r.returncode == 0 and json.loads(r.stdout)["mutating_calls"] == {"R": {"CreatePolicy": 1}}
    back = ctl.apply()
    assert back.mutating_calls == {"R": {"RemovePolicy": 1, "RemoveLocalSid": 1}}


def test_apply_fails_when_a_started_sender_exits(env, first_apply, tmp_path):
    """A sender whose UDP port is taken exits at once: the agent reports the session FAILED with the
    program's message and `apply` exits 1 saying so (it used to print "applied", rc 0). Once the
    port is free, the next apply starts the session again."""
    import socket

    from tests.datapath.dp_env import in_netns

    lab, _agents = env
    ctl, _ = first_apply
    ctl.set_intent(load_intent(DEMO))
    ctl.apply()
    extra = (
        "  - ssid: 5\n"
        '    sender: {node: A, address: "fc00:1::1", dev: a0}\n'
        '    reflector: {node: B, address: "fc00:3::1", dev: b0}\n'
        '    segs: ["fc00:2::e"]\n'
        "    rate_pps: 10\n"
    )
    text = DEMO.read_text().replace("../../.run/demo/certs", os.environ["SEGSCOPE_CERTS"])
    text = text.replace("stamp_sessions:\n", "stamp_sessions:\n" + extra)
    f = tmp_path / "two_sessions.yaml"
    f.write_text(text)
    with in_netns(lab.ns("A")):
        blocker = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        blocker.bind(("fc00:1::1", 50005))  # the agent's default sender port for SSID 5
    try:
        r = _cli("apply", str(f))
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert "A: STAMP sender ssid 5 failed: stamp_sender exited" in r.stderr and "in use" in r.stderr, r.stderr
    finally:
        blocker.close()
    r = _cli("apply", "--json", str(f))
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert json.loads(r.stdout)["program_errors"] == []
    ctl.set_intent(load_intent(DEMO))
    assert ctl.apply().ok  # back to the demo: session 5 removed
