"""validate: good files pass; every bad file names the right LINE:COLUMN, the field and the fix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from controller.intent import IntentError, load_intent, parse_intent

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "controller" / "examples").glob("*.yaml"))
BAD = sorted((Path(__file__).parent / "bad").glob("*.yaml"))


def expectation(path: Path) -> tuple[str, str]:
    """First line of a bad file: `# expect: LINE:COL text that the message must contain`."""
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), path
    pos, text = first[len("# expect: ") :].split(" ", 1)
    return pos, text


def test_there_are_enough_bad_files():
    assert len(BAD) >= 10


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_valid(path):
    from tests.controller.test_steer_k_shortest import tri3

    intent = load_intent(path, graph=tri3)  # the graph k_shortest candidates are resolved from
    assert {"A", "B"} <= set(intent.nodes)
    assert (intent.stamp_sessions or intent.flows or intent.inline_monitors) and intent.local_sids
    if path.name.startswith(("demo_line5", "line5")):  # the line5 examples steer H1 -> H2 as well
        assert set(intent.nodes) == {"A", "R", "B"} and intent.policies


def test_demo_intent_content():
    intent = load_intent(REPO / "controller" / "examples" / "demo_line5.yaml")
    pol = {p.node: p for p in intent.policies}
    assert pol["A"].destination == "fd00:b::/64" and pol["A"].segs == ("fc00:2::e", "fc00:3::d6")
    assert pol["B"].segs == ("fc00:2::e", "fc00:1::d6")
    sids = {(s.node, s.sid): s for s in intent.local_sids}
    assert sids[("R", "fc00:2::e")].action == "End"
    assert sids[("B", "fc00:3::d6")].lookup_table == 254
    s = intent.stamp_sessions[0]
    assert (s.sender.node, s.reflector.node, s.rate_pps, s.segs) == ("A", "B", 100, ("fc00:2::e",))
    # TLS paths are resolved relative to the file, through the ${VAR:-default} default
    assert intent.nodes["A"].tls.ca == str(REPO / "controller" / "examples" / "../../.run/demo/certs/ca.pem")


def test_env_expansion(monkeypatch):
    monkeypatch.setenv("SEGSCOPE_AGENT_A", "127.0.0.1:1234")
    monkeypatch.setenv("SEGSCOPE_CERTS", "/tmp/ctl-certs")
    intent = load_intent(REPO / "controller" / "examples" / "demo_line5.yaml")
    assert intent.nodes["A"].agent == "127.0.0.1:1234"
    assert intent.nodes["R"].agent == "127.0.0.1:50062"
    assert intent.nodes["B"].tls.key == "/tmp/ctl-certs/controller.key"


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.name)
def test_bad_file_names_its_line(path):
    pos, text = expectation(path)
    with pytest.raises(IntentError) as info:
        load_intent(path)
    lines = info.value.lines
    want = f"{path}:{pos}: "
    assert any(line.startswith(want) and text in line for line in lines), (want, text, lines)
    assert all(". Fix: " in line for line in lines), lines  # every error says how to fix it


def test_every_problem_is_reported_in_file_order():
    text = (Path(__file__).parent / "bad" / "negative_rate.yaml").read_text()
    text = text.replace("segs: [\"fc00:2::e\"]", "segs: [\"nope\"]").replace("ssid: 1", "ssid: 0")
    with pytest.raises(IntentError) as info:
        parse_intent(text, "x.yaml")
    lines = info.value.lines
    assert [l.split(":")[1] for l in lines] == ["11", "14", "15", "16"], lines  # segs and return_segs
    assert "ssid: 0 must be > 0" in lines[0] and "segs[0]: 'nope' is not an IPv6 SID" in lines[1]
    assert "return_segs[0]: 'nope'" in lines[2] and "rate_pps: -5 must be > 0" in lines[3]


def test_duplicate_key_and_reflector_ssid_clash():
    text = """version: 1
nodes:
  A: {agent: "127.0.0.1:1", tls: {ca: a, cert: b, key: c}}
  B: {agent: "127.0.0.1:2", tls: {ca: a, cert: b, key: c}}
  C: {agent: "127.0.0.1:3", tls: {ca: a, cert: b, key: c}}
stamp_sessions:
  - {ssid: 5, sender: {node: A, address: "fc00:1::1", dev: a0}, reflector: {node: B, address: "fc00:3::1", dev: b0}}
  - {ssid: 5, sender: {node: C, address: "fc00:4::1", dev: c0}, reflector: {node: B, address: "fc00:3::1", dev: b0}}
  - {ssid: 6, ssid: 7, sender: {node: C, address: "fc00:4::1", dev: c0},
     reflector: {node: A, address: "fc00:1::1", dev: a1}}
"""
    with pytest.raises(IntentError) as info:
        parse_intent(text, "x.yaml")
    lines = info.value.lines
    assert any(l.startswith("x.yaml:8:") and "reflector node B already reflects ssid 5" in l for l in lines), lines
    assert any(l.startswith("x.yaml:9:") and "key 'ssid' appears twice" in l for l in lines), lines
    # C sends from dev c0 in both sessions: no clash there; A reflects on a1 and sends on a0: fine too
    assert not any("already a STAMP" in l for l in lines), lines


def test_empty_file():
    with pytest.raises(IntentError) as info:
        parse_intent("", "e.yaml")
    assert info.value.lines[0].startswith("e.yaml:1:1: the file is empty")


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "controller", *args], cwd=REPO, capture_output=True, text=True)


def test_cli_validate_exit_codes():
    ok = _cli("validate", "controller/examples/demo_line5.yaml")
    assert ok.returncode == 0 and "valid" in ok.stdout
    bad = _cli("validate", "tests/controller/bad/negative_rate.yaml")
    assert bad.returncode == 2
    assert "tests/controller/bad/negative_rate.yaml:16:15: stamp_sessions[0].rate_pps: -5 must be > 0" in bad.stderr
    js = _cli("validate", "--json", "tests/controller/bad/unknown_node.yaml")
    assert js.returncode == 2
    body = json.loads(js.stdout)
    assert body["valid"] is False and body["errors"][0].startswith("tests/controller/bad/unknown_node.yaml:13:23:")
    missing = _cli("validate", "no/such/file.yaml")
    assert missing.returncode == 2 and "cannot read the file" in missing.stderr


STAMP_AND_RX_ON_B0 = """\
version: 1
nodes:
  A: {agent: "127.0.0.1:50061", tls: {ca: ca.pem, cert: c.pem, key: c.key}}
  B: {agent: "127.0.0.1:50063", tls: {ca: ca.pem, cert: c.pem, key: c.key}}
stamp_sessions:
  - ssid: 1
    sender: {node: A, address: "fc00:1::1", dev: a0}
    reflector: {node: B, address: "fc00:3::1", dev: b0}
flows:
  - flow_id: 7
    ingress: {node: A, dev: a0}
    egress: {node: B, dev: b0}
    segs: ["fc00:2::e", "fc00:3::d6"]
"""


def test_stamp_programs_and_altmark_rx_may_share_a_device():
    """The agent's XDP programs share a node's devices through the XDP chain: a flow whose RX side
    is the reflector's device, or the collector's, is valid, and so is a STAMP collector AND a
    reflector on one device (sessions in both directions over b0 and a0), with a flow there or not."""
    intent = parse_intent(STAMP_AND_RX_ON_B0, "chain.yaml", REPO)
    assert (intent.flows[0].egress.node, intent.flows[0].egress.dev) == ("B", "b0")
    assert (intent.stamp_sessions[0].reflector.node, intent.stamp_sessions[0].reflector.dev) == ("B", "b0")
    reverse = STAMP_AND_RX_ON_B0.replace("ingress: {node: A, dev: a0}", "ingress: {node: B, dev: b0}").replace(
        "egress: {node: B, dev: b0}", "egress: {node: A, dev: a0}"
    )
    assert parse_intent(reverse, "chain_collector.yaml", REPO).flows[0].egress.dev == "a0"
    both = (
        STAMP_AND_RX_ON_B0
        + """\
  - flow_id: 8
    ingress: {node: B, dev: b0}
    egress: {node: A, dev: a0}
    segs: ["fc00:2::e", "fc00:1::d6"]
"""
    ).replace(
        "flows:\n",
        """\
  - ssid: 2
    sender: {node: B, address: "fc00:3::1", dev: b0}
    reflector: {node: A, address: "fc00:1::1", dev: a0}
flows:
""",
    )
    intent = parse_intent(both, "both.yaml", REPO)
    on_b0 = {(s.sender.node, s.sender.dev) for s in intent.stamp_sessions} & {
        (s.reflector.node, s.reflector.dev) for s in intent.stamp_sessions
    }
    assert on_b0 == {("B", "b0"), ("A", "a0")}  # each device: a collector and a reflector
    assert {(f.egress.node, f.egress.dev) for f in intent.flows} == {("B", "b0"), ("A", "a0")}


MULTIHOMED = """version: 1
nodes:
  A: {agent: "127.0.0.1:1", tls: {ca: a, cert: b, key: c}}
  B: {agent: "127.0.0.1:2", tls: {ca: a, cert: b, key: c}}
  H: {agent: "127.0.0.1:3", tls: {ca: a, cert: b, key: c}}
stamp_sessions:
  - {ssid: 1, sender: {node: A, address: "fc00:1::1", dev: a0}, reflector: {node: B, address: "fc00:3::1", dev: b0}}
  - {ssid: 2, sender: {node: A, address: "fd00:a::2", dev: ah}, reflector: {node: H, address: "fd00:a::1", dev: h1}}
  - {ssid: 3, sender: {node: H, address: "fd00:b::1", dev: h2}, reflector: {node: B, address: "fd00:b::2", dev: bh}}
"""


def test_a_node_sends_and_reflects_on_several_devices():
    """Multi-homed nodes: A collects replies on a0 and on ah, B reflects on b0 and on bh. The plan
    has one Init per device, each with that device's source or addresses."""
    from controller.diff import plan
    from controller.model import desired_state

    intent = parse_intent(MULTIHOMED, "x.yaml")
    inits = [(op.node, op.key, op.init) for op in plan(desired_state(intent), {}) if op.action == "init"]
    # reflectors first (a sender's first packet must find its reflector), then senders
    assert [(n, k) for n, k, _ in inits] == [
        ("B", ("reflector", "b0")),
        ("B", ("reflector", "bh")),
        ("H", ("reflector", "h1")),
        ("A", ("sender", "a0")),
        ("A", ("sender", "ah")),
        ("H", ("sender", "h2")),
    ]
    by_key = {(n, k): i for n, k, i in inits}
    assert by_key[("A", ("sender", "ah"))].source_address == "fd00:a::2"
    assert by_key[("B", ("reflector", "bh"))].addresses == ("fd00:b::2",)
    assert by_key[("B", ("reflector", "b0"))].addresses == ("fc00:3::1",)


def test_one_source_address_per_sender_device():
    text = MULTIHOMED.replace('address: "fd00:a::2", dev: ah', 'address: "fd00:a::9", dev: a0')
    with pytest.raises(IntentError) as info:
        parse_intent(text, "x.yaml")
    lines = info.value.lines
    assert len(lines) == 1 and lines[0].startswith("x.yaml:8:"), lines
    assert "A:a0 already sends from fc00:1::1 (stamp_sessions[0])" in lines[0], lines
    assert "fix: use address fc00:1::1 for sessions whose replies arrive on a0" in lines[0].lower(), lines


def test_two_flows_with_one_sid_list_on_a_node_are_refused():
    text = """version: 1
nodes:
  A: {agent: "127.0.0.1:1", tls: {ca: a, cert: b, key: c}}
  B: {agent: "127.0.0.1:2", tls: {ca: a, cert: b, key: c}}
flows:
  - {flow_id: 7, ingress: {node: A, dev: a0}, egress: {node: B, dev: b0}, segs: ["fc00:2::e", "fc00:3::d6"]}
  - {flow_id: 8, ingress: {node: A, dev: a1}, egress: {node: B, dev: b1}, segs: ["fc00:2::e", "fc00:3::d6"]}
  - {flow_id: 9, ingress: {node: A, dev: a1}, egress: {node: B, dev: b1}, segs: ["fc00:2::e2", "fc00:3::d6"]}
"""
    with pytest.raises(IntentError) as info:
        parse_intent(text, "x.yaml")
    lines = info.value.lines
    assert len(lines) == 1 and lines[0].startswith("x.yaml:7:"), lines
    assert "node A already monitors fc00:2::e,fc00:3::d6 (dscp) as flow_id 7 (flows[0])" in lines[0], lines


def test_steering_entry_adds_one_probe_session_per_candidate():
    intent = load_intent(REPO / "controller" / "examples" / "tri3_steering.yaml")
    (s,) = intent.steering
    assert s.key == ("A", "fd00:b::/64", 254) and [c.ssid for c in s.candidates] == [101, 102, 103]
    assert (s.objective.kind, s.objective.max_delay_us, s.hysteresis.seconds, s.hold_down_s) == (
        "lowest_delay",
        20000,
        3,
        10,
    )
    probes = {x.ssid: x for x in intent.stamp_sessions}
    assert sorted(probes) == [101, 102, 103]
    p2 = probes[102]
    assert (p2.sender.node, p2.sender.dev, p2.reflector.node, p2.reflector.dev) == ("A", "a2", "B", "b2")
    assert p2.segs == ("fc00:12::e",) and p2.return_segs == ("fc00:12::e",) and p2.rate_pps == 20
