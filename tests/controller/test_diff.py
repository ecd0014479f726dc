"""The plan (controller/diff.py) as a pure function: minimal, deterministic, dependency-ordered."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

from controller.agents import (
    flow_msg,
    flow_resource,
    local_sid_msg,
    local_sid_resource,
    policy_msg,
    policy_resource,
    stamp_resource,
    stamp_session_msg,
)
from controller.diff import plan
from controller.intent import load_intent, parse_intent
from controller.model import Resource, desired_state, policy_spec
from segscope_proto.segscope.agent.v1 import flowmon_pb2, srv6_pb2, stamp_pb2

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "controller" / "examples" / "demo_line5.yaml"
LOSS = REPO / "controller" / "examples" / "line5_loss.yaml"


def reported(desired, finished: set = frozenset(), stopped: set = frozenset()) -> dict:
    """What agents report once `desired` is in place (running sessions), built by hand."""
    out = {}
    for ident, r in desired.resources.items():
        running = r.running
        if ident in finished or ident in stopped:
            running = False
        out[ident] = dataclasses.replace(r, running=running, finished=ident in finished, finite=False, duration_s=0.0)
    return out


def summary(ops) -> list[tuple]:
    return [(op.action, op.kind, op.node, op.key) for op in ops]


def test_from_nothing_creates_everything_in_dependency_order():
    d = desired_state(load_intent(DEMO))
    ops = plan(d, {})
    assert summary(ops) == [
        ("create", "local_sid", "A", ("fc00:1::d6", 254)),
        ("create", "local_sid", "B", ("fc00:3::d6", 254)),
        ("create", "local_sid", "R", ("fc00:2::e", 254)),
        ("create", "policy", "A", ("fd00:b::/64", 254)),
        ("create", "policy", "B", ("fd00:a::/64", 254)),
        ("init", "stamp_init", "B", ("reflector", "b0")),
        ("create", "stamp_reflector", "B", ("reflector", 1)),
        ("start", "stamp_reflector", "B", ("reflector", 1)),
        ("init", "stamp_init", "A", ("sender", "a0")),
        ("create", "stamp_sender", "A", ("sender", 1)),
        ("start", "stamp_sender", "A", ("sender", 1)),
    ]
    init_b = ops[5].init
    assert (init_b.device, init_b.addresses) == ("b0", ("fc00:3::1",))
    assert (ops[8].init.device, ops[8].init.source_address) == ("a0", "fc00:1::1")


def test_in_place_state_needs_nothing():
    d = desired_state(load_intent(LOSS))
    assert plan(d, reported(d)) == []


def test_policy_change_is_one_hitless_update():
    d = desired_state(load_intent(DEMO))
    actual = reported(d)
    ident = ("policy", "A", ("fd00:b::/64", 254))
    actual[ident] = dataclasses.replace(actual[ident], spec=policy_spec("encap", ["fc00:2::e"], "a0", 0))
    ops = plan(d, actual)
    assert summary(ops) == [("update", "policy", "A", ("fd00:b::/64", 254))]
    assert "segs: fc00:2::e -> fc00:2::e,fc00:3::d6" in ops[0].describe()


def test_extra_measurement_goes_first_extra_routing_last():
    d = desired_state(load_intent(DEMO))
    actual = reported(d)
    extra = [
        Resource("local_sid", "R", ("fc00:2::99", 254), ()),
        Resource("policy", "R", ("fd00:c::/64", 254), ()),
        Resource("stamp_sender", "A", ("sender", 9), (), running=True),
        Resource("policy", "H1", ("fd00:b::/64", 254), ()),
    ]  # H1 is not in the intent
    for r in extra:
        actual[r.ident] = r
    # and one thing missing: a create comes first
    del actual[("local_sid", "B", ("fc00:3::d6", 254))]
    assert summary(plan(d, actual)) == [
        ("remove", "stamp_sender", "A", ("sender", 9)),  # measurement teardown first
        ("create", "local_sid", "B", ("fc00:3::d6", 254)),
        ("remove", "policy", "R", ("fd00:c::/64", 254)),  # routing: made before broken
        ("remove", "local_sid", "R", ("fc00:2::99", 254)),
    ]


def test_session_change_is_replace_then_start_with_init():
    text = DEMO.read_text().replace("rate_pps: 100", "rate_pps: 50")
    d_new = desired_state(parse_intent(text, str(DEMO)))
    actual = reported(desired_state(load_intent(DEMO)))
    ops = plan(d_new, actual)
    assert summary(ops) == [
        ("init", "stamp_init", "A", ("sender", "a0")),
        ("replace", "stamp_sender", "A", ("sender", 1)),
        ("start", "stamp_sender", "A", ("sender", 1)),
    ]
    assert "rate_pps: 100 -> 50" in ops[1].describe()


def test_run_state():
    d = desired_state(load_intent(DEMO))
    sender = ("stamp_sender", "A", ("sender", 1))
    # stopped, wanted running -> start only
    assert summary(plan(d, reported(d, stopped={sender}))) == [("start", "stamp_sender", "A", ("sender", 1))]
    # wanted stopped, running -> stop only
    text = DEMO.read_text().replace("format: ptp", "format: ptp\n    start: false")
    d_stopped = desired_state(parse_intent(text, str(DEMO)))
    assert summary(plan(d_stopped, reported(d))) == [("stop", "stamp_sender", "A", ("sender", 1))]
    # a finite run that has run its course is not repeated
    text = DEMO.read_text().replace("format: ptp", "format: ptp\n    duration_s: 10")
    d_finite = desired_state(parse_intent(text, str(DEMO)))
    assert plan(d_finite, reported(d_finite, finished={sender})) == []
    # ... but one that never ran is started with its duration
    ops = plan(d_finite, reported(d_finite, stopped={sender}))
    assert summary(ops) == [("start", "stamp_sender", "A", ("sender", 1))] and ops[0].desired.duration_s == 10


def test_flows_rx_before_tx_and_removed_tx_first():
    d = desired_state(load_intent(LOSS))
    actual = {k: v for k, v in reported(d).items() if not k[0].startswith("flow")}
    assert summary(plan(d, actual)) == [("create", "flow_rx", "B", ("rx", 7)), ("create", "flow_tx", "A", ("tx", 7))]
    # back to the demo: the flows go first (B's XDP hook is needed by the STAMP reflector), then
    # the SIDs get their counters (count: true in demo_line5), then STAMP is set up
    d_demo = desired_state(load_intent(DEMO))
    assert summary(plan(d_demo, reported(d))) == [
        ("remove", "flow_tx", "A", ("tx", 7)),
        ("remove", "flow_rx", "B", ("rx", 7)),
        ("update", "local_sid", "A", ("fc00:1::d6", 254)),
        ("update", "local_sid", "B", ("fc00:3::d6", 254)),
        ("update", "local_sid", "R", ("fc00:2::e", 254)),
        ("init", "stamp_init", "B", ("reflector", "b0")),
        ("create", "stamp_reflector", "B", ("reflector", 1)),
        ("start", "stamp_reflector", "B", ("reflector", 1)),
        ("init", "stamp_init", "A", ("sender", "a0")),
        ("create", "stamp_sender", "A", ("sender", 1)),
        ("start", "stamp_sender", "A", ("sender", 1)),
    ]


def test_a_node_left_without_stamp_sessions_is_reset_first():
    d_loss = desired_state(load_intent(LOSS))
    ops = plan(d_loss, reported(desired_state(load_intent(DEMO))))
    assert summary(ops) == [
        ("reset", "stamp_reset", "A", ()),
        ("reset", "stamp_reset", "B", ()),
        ("update", "local_sid", "A", ("fc00:1::d6", 254)),
        ("update", "local_sid", "B", ("fc00:3::d6", 254)),
        ("update", "local_sid", "R", ("fc00:2::e", 254)),
        ("create", "flow_rx", "B", ("rx", 7)),
        ("create", "flow_tx", "A", ("tx", 7)),
    ]
    # a node that keeps one of its sessions is not reset: only the other one is destroyed
    text = DEMO.read_text().replace(
        "stamp_sessions:\n",
        "stamp_sessions:\n  - {ssid: 2, sender: {node: A, address: "
        "\"fc00:1::1\", dev: a0}, reflector: {node: B, address: \"fc00:3::1\", dev: b0}}\n",
    )
    two = desired_state(parse_intent(text, str(DEMO)))
    assert summary(plan(desired_state(load_intent(DEMO)), reported(two))) == [
        ("remove", "stamp_sender", "A", ("sender", 2)),
        ("remove", "stamp_reflector", "B", ("reflector", 2)),
    ]


def test_plan_is_deterministic_whatever_the_order_of_reports():
    d = desired_state(load_intent(LOSS))
    actual = reported(d)
    for ident in list(actual)[::3]:
        del actual[ident]
    actual[("policy", "R", ("fd00:c::/64", 254))] = Resource("policy", "R", ("fd00:c::/64", 254), ())
    expected = summary(plan(d, actual))
    items = list(actual.items())
    for seed in range(5):
        random.Random(seed).shuffle(items)
        assert summary(plan(d, dict(items))) == expected


def test_agent_messages_read_back_equal():
    """What the controller sends, answered the way the agent canonicalises it, compares equal."""
    resources = list(desired_state(load_intent(LOSS)).resources.values())
    resources += list(desired_state(load_intent(DEMO)).resources.values())
    for r in resources:
        if r.kind == "local_sid":
            back = local_sid_resource(r.node, srv6_pb2.LocalSidState(local_sid=local_sid_msg(r)))
        elif r.kind == "policy":
            msg = policy_msg(r)
            msg.metric = msg.metric or 1024  # the kernel's default metric, as the agent reports it
            back = policy_resource(r.node, msg)
        elif r.kind.startswith("stamp"):
            state = stamp_pb2.STAMP_SESSION_STATE_RUNNING
            back = stamp_resource(r.node, stamp_pb2.StampSessionStatus(session=stamp_session_msg(r), state=state))
        else:
            back = flow_resource(r.node, flowmon_pb2.FlowMonitorStatus(monitor=flow_msg(r)))
        assert back.ident == r.ident and back.spec == r.spec, (r, back)


def test_non_canonical_reports_compare_equal():
    d = desired_state(load_intent(DEMO))
    actual = reported(d)
    ident = ("policy", "A", ("fd00:b::/64", 254))
    p = srv6_pb2.Policy(
        destination="fd00:000b:0::/64",
        table=254,
        mode=srv6_pb2.ENCAP_MODE_ENCAP,
        segments=["FC00:2:0::E", "fc00:3::d6"],
        device="a0",
        metric=1024,
    )
    actual[ident] = policy_resource("A", p)
    assert plan(d, actual) == []


INLINE = REPO / "controller" / "examples" / "mesh8_inline.yaml"


def test_inline_from_nothing_ioam_before_monitors_egress_before_ingress():
    intent = load_intent(INLINE)
    ops = plan(desired_state(intent), {})
    inline = [s for s in summary(ops) if s[1] in ("ioam_node", "inline_egress", "inline_ingress")]
    assert inline == [
        ("create", "ioam_node", "A", ("ioam",)),
        ("create", "ioam_node", "B", ("ioam",)),
        ("create", "ioam_node", "R1", ("ioam",)),
        ("create", "ioam_node", "R2", ("ioam",)),
        ("create", "ioam_node", "R3", ("ioam",)),
        ("create", "ioam_node", "R4", ("ioam",)),
        ("create", "inline_egress", "B", ("egress", 201)),
        ("create", "inline_egress", "B", ("egress", 202)),
        ("create", "inline_ingress", "A", ("ingress", 201)),
        ("create", "inline_ingress", "A", ("ingress", 202)),
    ]
    # SRv6 first (the monitored flows travel the policies), then IOAM
    assert [s[1] for s in summary(ops)].index("ioam_node") > [s[1] for s in summary(ops)].index("policy")
    by = {(op.kind, op.node): op.desired.fields for op in ops if op.kind == "ioam_node"}
    # flow 201 crosses R1, R2 (namespace 1); flow 202 names every node (namespace 7)
    assert by[("ioam_node", "R1")]["namespaces"] == (1, 7) and by[("ioam_node", "R3")]["namespaces"] == (7,)
    assert (
        by[("ioam_node", "B")]["node_id"] == 3 and by[("ioam_node", "A")]["node_id"] == intent.nodes["A"].ioam_node_id
    )
    assert all(f["all_devices"] for f in by.values())


def test_inline_in_place_needs_nothing_and_reads_back_equal():
    from controller.agents import inline_msg, inline_resource, ioam_config_msg, ioam_resource
    from segscope_proto.segscope.agent.v1 import inline_pb2

    d = desired_state(load_intent(INLINE))
    assert plan(d, reported(d)) == []
    for r in d.resources.values():
        if r.kind == "ioam_node":
            back = ioam_resource(r.node, inline_pb2.GetIoamConfigResponse(enabled=True, config=ioam_config_msg(r)))
        elif r.kind.startswith("inline"):
            back = inline_resource(
                r.node, inline_pb2.InlineMonitorStatus(monitor=inline_msg(r), node_id=r.fields["node_id"])
            )
        else:
            continue
        assert back.ident == r.ident and back.spec == r.spec, (r, back)
    assert ioam_resource("A", inline_pb2.GetIoamConfigResponse(enabled=False)) is None


def test_inline_change_is_stop_in_teardown_then_start():
    """Another sampling: the monitor is stopped with the teardown and started after the IOAM
    configurations; a node's new IOAM id also restarts its monitors (their records carry it), after
    EnableIoam could not have been given it while they ran."""
    text = INLINE.read_text()
    d_old = desired_state(load_intent(INLINE))
    new = parse_intent(
        text.replace("sampling: {every: 10}", "sampling: {every: 20}").replace("ioam_id: 3", "ioam_id: 4"),
        "x.yaml",
        INLINE.parent,
    )
    ops = plan(desired_state(new), reported(d_old))
    assert summary(ops) == [
        ("remove", "inline_ingress", "A", ("ingress", 201)),
        ("remove", "inline_egress", "B", ("egress", 201)),
        ("remove", "inline_egress", "B", ("egress", 202)),
        ("update", "ioam_node", "B", ("ioam",)),
        ("create", "inline_egress", "B", ("egress", 201)),
        ("create", "inline_egress", "B", ("egress", 202)),
        ("create", "inline_ingress", "A", ("ingress", 201)),
    ]
    assert "node_id: 3 -> 4" in ops[3].describe()


def test_inline_removed_monitors_go_before_the_ioam_configuration():
    d_old = desired_state(load_intent(INLINE))
    text = INLINE.read_text()
    cut = text.index("  # path 2")
    new = parse_intent(text[:cut], "x.yaml", INLINE.parent)  # flow 202 gone: R3, R4 lose IOAM
    ops = plan(desired_state(new), reported(d_old))
    assert summary(ops) == [
        ("remove", "inline_ingress", "A", ("ingress", 202)),
        ("remove", "inline_egress", "B", ("egress", 202)),
        ("remove", "ioam_node", "R3", ("ioam",)),
        ("remove", "ioam_node", "R4", ("ioam",)),
        ("update", "ioam_node", "A", ("ioam",)),
        ("update", "ioam_node", "B", ("ioam",)),
        ("update", "ioam_node", "R1", ("ioam",)),
        ("update", "ioam_node", "R2", ("ioam",)),
    ]
    assert "namespaces: (1, 7) -> (1,)" in ops[4].describe()


def test_a_steered_policy_on_any_of_its_candidates_is_left_alone():
    """segscope-steer moves the policy between its candidates; the controller's plan (apply, run)
    must not move it back to the file's segs, but still repairs a SID list that is no candidate."""
    from controller.intent import load_intent
    from controller.model import desired_state, policy_spec

    intent = load_intent(Path(__file__).resolve().parents[2] / "controller" / "examples" / "tri3_steering.yaml")
    desired = desired_state(intent)
    ident = ("policy", "A", ("fd00:b::/64", 254))
    want = desired.resources[ident]
    on_p3 = dataclasses.replace(want, spec=policy_spec("encap", ("fc00:13::e", "fc00:3::d6"), "a1", 0))
    assert [op for op in plan(desired, {ident: on_p3}) if op.kind == "policy" and op.node == "A"] == []
    elsewhere = dataclasses.replace(want, spec=policy_spec("encap", ("fc00:99::e",), "a1", 0))
    ops = [op for op in plan(desired, {ident: elsewhere}) if op.kind == "policy" and op.node == "A"]
    assert [(op.action, op.desired.fields["segs"]) for op in ops] == [("update", ("fc00:11::e", "fc00:3::d6"))]


TRI3_STEERING = REPO / "controller" / "examples" / "tri3_steering.yaml"
MONITOR_OF_STEERED_POLICY = """
inline_monitors:
  - {flow_id: 31, ingress: {node: A, dev: a1}, egress: {node: B, dev: b1}, segs: ["fc00:11::e", "fc00:3::d6"],
     sampling: {every: 1}}
"""


def test_a_steered_policy_monitor_is_one_flow_over_every_candidate():
    """An in-line monitor of a steered policy's SID list: its egress side records the other
    candidates' SID lists as the same flow (alternate_paths, read back equal from the agent's
    message); its ingress side, which follows the policy on the agent (the SID list segscope-steer
    chose, a trace sized for it), is left alone, so its sequence numbers go on; an ingress on a SID
    list that is no candidate is still replaced. Without steering, no alternate paths."""
    from controller.agents import inline_msg, inline_resource
    from controller.model import inline_spec
    from segscope_proto.segscope.agent.v1 import inline_pb2

    text = TRI3_STEERING.read_text() + MONITOR_OF_STEERED_POLICY
    desired = desired_state(parse_intent(text, "x.yaml", TRI3_STEERING.parent))
    egress = desired.resources[("inline_egress", "B", ("egress", 31))]
    assert egress.fields["alternates"] == (("fc00:12::e", "fc00:3::d6"), ("fc00:13::e", "fc00:3::d6"))
    msg = inline_msg(egress)
    assert [tuple(p.segments) for p in msg.alternate_paths] == list(egress.fields["alternates"])
    back = inline_resource("B", inline_pb2.InlineMonitorStatus(monitor=msg, node_id=egress.fields["node_id"]))
    assert back.spec == egress.spec
    ident = ("inline_ingress", "A", ("ingress", 31))
    want = desired.resources[ident]

    def ingress_on(sids: tuple, trace_nodes: int) -> Resource:
        f = want.fields
        spec = inline_spec("ingress", "a1", sids, f["namespace"], f["node_id"], trace_nodes, sample_every=1)
        return dataclasses.replace(want, spec=spec)

    on_p3 = plan(desired, {ident: ingress_on(("fc00:13::e", "fc00:3::d6"), 3)})
    assert [op for op in on_p3 if op.kind == ident[0]] == []
    ops = [op for op in plan(desired, {ident: ingress_on(("fc00:99::e", "fc00:3::d6"), 3)}) if op.kind == ident[0]]
    assert sorted((op.action, (op.desired or op.actual).fields["segs"]) for op in ops) == [
        ("create", ("fc00:11::e", "fc00:3::d6")),
        ("remove", ("fc00:99::e", "fc00:3::d6")),
    ]
    plain = text[: text.index("steering:")] + MONITOR_OF_STEERED_POLICY
    unsteered = desired_state(parse_intent(plain, "x.yaml", TRI3_STEERING.parent))
    assert unsteered.resources[("inline_egress", "B", ("egress", 31))].fields["alternates"] == ()
