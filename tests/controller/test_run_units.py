"""`controller run`'s parts without agents: what it may remove, the repair points, the reload of
the file, and the leader election's fence after a stall (a fake consumer in place of Kafka's)."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

from controller.diff import plan
from controller.leader import KafkaLeadership
from controller.model import Resource, desired_state, policy_spec, reflector_spec
from controller.reconcile import Reconciler, Repair
from segscope_schemas.line_protocol import parse_lines


def write_intent(d: Path, sessions: bool = True) -> Path:
    for f in ("ca.pem", "c.pem", "c.key"):
        (d / f).write_text("x")
    text = """version: 1
nodes:
  A: {agent: "127.0.0.1:1", tls: {ca: ca.pem, cert: c.pem, key: c.key}}
  B: {agent: "127.0.0.1:2", tls: {ca: ca.pem, cert: c.pem, key: c.key}}
policies:
  - {node: A, destination: "fd00:b::/64", mode: encap, segs: ["fc00:2::e"], dev: a0}
"""
    if sessions:
        text += """stamp_sessions:
  - ssid: 1
    sender: {node: A, address: "fc00:1::1", dev: a0}
    reflector: {node: B, address: "fc00:3::1", dev: b0}
    segs: ["fc00:2::e"]
    return_segs: ["fc00:2::e"]
    rate_pps: 10
"""
    p = d / "intent.yaml"
    p.write_text(text)
    return p


class Always:
    counts: dict = {}

    def leading(self) -> bool:
        return True


def test_run_removes_only_what_it_owns(tmp_path):
    rec = Reconciler(write_intent(tmp_path), Always(), replica="t")
    desired = desired_state(rec.intent)
    rec.owned |= set(desired.resources)
    mine = desired.resources[("policy", "A", ("fd00:b::/64", 254))]
    foreign = Resource("policy", "A", ("fd00:99::/64", 254), policy_spec("encap", ("fc00:2::e",), "a0", 0))
    refl = desired.resources[("stamp_reflector", "B", ("reflector", 1))]
    other_refl = Resource(
        "stamp_reflector", "B", ("reflector", 9), reflector_spec("fc00:1::9", (), "unauthenticated", "ptp")
    )
    # the intent drops the sessions: apply would Reset B; run removes its own session only
    rec.intent = dataclasses.replace(rec.intent, stamp_sessions=[])
    actual = {r.ident: r for r in (mine, foreign, refl, other_refl)}
    ops = plan(desired_state(rec.intent), actual)
    assert ("reset", "B") in {(op.action, op.node) for op in ops}  # what apply would do
    kept = rec._only_owned(ops, actual)
    assert [(op.action, op.kind, op.node, op.key) for op in kept] == [
        ("remove", "stamp_reflector", "B", ("reflector", 1))
    ]
    assert rec.counts["left_alone"] == 2  # the foreign policy and the foreign session, once each
    rec._only_owned(ops, actual)
    assert rec.counts["left_alone"] == 2


def test_repair_point_is_line_protocol(tmp_path):
    what = 'start  A "x", y=z'
    r = Repair(
        1795306905000000000, "A", "start", "stamp_sender", "sender 1", what, ["StartStampSession"], "agent_back", 0.581
    )
    points, errors = parse_lines(r.line("r 1"))
    assert not errors and len(points) == 1
    p = points[0]
    assert p.measurement == "segscope_controller_repair"
    assert p.tags == {"node": "A", "kind": "stamp_sender", "action": "start", "replica": "r 1"}
    assert p.fields["what"] == 'start  A "x", y=z' and p.fields["ok"] == 1 and p.fields["after_agent_s"] == 0.581
    failed = Repair(1, "A", "create", "policy", "k", "w", ["CreatePolicy"], "periodic", None, error="node A: no")
    p = parse_lines(failed.line("r"))[0][0]
    assert p.fields["ok"] == 0 and p.fields["error"] == "node A: no" and "after_agent_s" not in p.fields


def test_an_invalid_file_keeps_the_last_valid_intent(tmp_path):
    path = write_intent(tmp_path)
    rec = Reconciler(path, Always(), replica="t")
    good = rec.intent
    time.sleep(0.01)
    path.write_text(path.read_text().replace("rate_pps: 10", "rate_pps: -5"))
    rec._maybe_reload()
    assert rec.intent is good and rec.counts["intent_rejected"] == 1
    path.write_text(path.read_text().replace("rate_pps: -5", "rate_pps: 20"))
    rec._maybe_reload()
    assert rec.intent.stamp_sessions[0].rate_pps == 20 and rec.counts["intent_reloads"] == 1


class FakeConsumer:
    """Assigns the leader partition at the first poll; one poll (set stall_s) takes that long."""

    def __init__(self, lead: KafkaLeadership):
        self.lead, self.stall_s, self.polls = lead, 0.0, 0
        self.stall_ended = 0.0  # monotonic time the last stall's poll returned

    def poll(self, timeout):
        from confluent_kafka import TopicPartition

        self.polls += 1
        if self.polls == 1:
            self.lead._on_assign(self, [TopicPartition(self.lead.topic, 0)])
        if self.stall_s:
            stall, self.stall_s = self.stall_s, 0.0
            time.sleep(stall)
            self.stall_ended = time.monotonic()
        else:
            time.sleep(min(timeout, 0.05))
        return None

    def close(self):
        pass


def test_leader_makes_no_change_after_a_stall_until_the_group_was_steady():
    lead = KafkaLeadership("unused:1", "t", session_timeout_ms=3000, heartbeat_ms=300)
    fake = lead._consumer = FakeConsumer(lead)
    t = threading.Thread(target=lead._loop, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 5
        while not lead.leading():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with lead.acting() as ok:
            assert ok
        fake.stall_s = 1.6  # > session timeout - 2 s = 1 s: it may have been dropped meanwhile
        deadline = time.monotonic() + 5
        while lead.counts["stalls_fenced"] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not lead.leading() and lead.counts["stalls_fenced"] == 1
        while not lead.leading():
            assert time.monotonic() - fake.stall_ended < 3
            time.sleep(0.01)
        # 3 heartbeats (0.9 s) after the stall ended, not before: from the stall's own end (the test's
        # clock woke up to 0.1 s late on a loaded machine, which made a measured 0.79 s of a true 0.9 s)
        assert time.monotonic() - fake.stall_ended >= 0.9
        # a revoke waits for a change in progress, and then no change is allowed
        entered, done = threading.Event(), threading.Event()

        def change():
            with lead.acting() as ok:
                assert ok
                entered.set()
                time.sleep(0.3)
            done.set()

        threading.Thread(target=change).start()
        entered.wait(2)
        lead._on_revoke(fake, [])
        assert done.is_set() and not lead.leading() and lead.counts["hand_overs"] == 1
        with lead.acting() as ok:
            assert not ok
    finally:
        lead._stop.set()
        t.join(5)
