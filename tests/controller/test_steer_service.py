"""segscope-steer's Kafka side without Kafka: which stamp_delay lines it takes, and what a decision
record holds (controller/steer/service.py)."""

from __future__ import annotations

from controller.intent import parse_intent
from controller.leader import NoElection
from controller.steer.service import SteerService, decision_line
from segscope_schemas.line_protocol import parse_line
from tests.controller.test_steer_engine import INTENT, T0


def service(objective: str = "lowest_delay") -> SteerService:
    intent = parse_intent(INTENT.replace("OBJECTIVE", objective), "t.yaml")
    return SteerService(intent, "unused:9092", NoElection(), "t1")


def point(node: str, ssid: int, direction: str, second: int, mean: float, count: int = 20) -> bytes:
    path = "fc00:11::e\\,fc00:3::d6"
    return (
        f"stamp_delay,node={node},ssid={ssid},path={path},direction={direction} count={count}i,sum_us={mean * count},"
        f"min_us={mean},mean_us={mean},max_us={mean} {second * 1_000_000_000}"
    ).encode()


def test_only_the_probes_forward_points_are_taken():
    s = service()
    msg = b"\n".join(
        [
            point("A", 101, "forward", T0, 1300.0),
            point("A", 101, "reverse", T0, 9999.0),  # another direction
            point("A", 7, "forward", T0, 9999.0),  # not a probe of ours
            point("B", 101, "forward", T0, 9999.0),  # the same ssid from another sender
            b"segscope_processor,instance=x records=1i 1",
            point("A", 102, "forward", T0, 2000.0, count=15),
        ]
    )
    assert s.handle_message(msg, kafka_ts_s=T0 + 1.2) == 2
    key = s.intent.steering[0].key
    assert s.engine.series[(key, "p1")][T0].delay_us == 1300.0
    assert s.engine.series[(key, "p2")][T0].loss_pct == 25.0  # 15 of 20 probes a second
    assert s._pending == {key: T0 + 1.2}  # the Kafka time the decision latency is measured from


def test_decision_record_holds_both_sides_and_the_rule():
    s = service()
    key = s.intent.steering[0].key
    for i in range(5):
        s.handle_message(
            b"\n".join(
                [
                    point("A", 101, "forward", T0 + i, 6300.0),
                    point("A", 102, "forward", T0 + i, 2000.0),
                    point("A", 103, "forward", T0 + i, 2500.0),
                ]
            ),
            T0 + i + 1,
        )
    out = s.engine.evaluate(key, T0 + 5.6)
    line = decision_line(out.decision, "t1", 123, dry_run=False, ok=True, call_ms=3.2, latency_ms=41.0)
    p = parse_line(line)
    assert p.measurement == "steering_decision" and p.tags == {
        "node": "A",
        "policy": "fd00:b::/64",
        "kind": "switch",
        "replica": "t1",
    }
    f = p.fields
    assert (f["from"], f["to"], f["from_delay_us"], f["to_delay_us"], f["seconds"]) == ("p1", "p2", 6300.0, 2000.0, 5)
    assert f["to_segs"] == "fc00:12::e,fc00:3::d6" and f["ok"] == 1 and f["latency_ms"] == 41.0
    assert f["rule"].startswith("lowest_delay: better by >= 10 % and >= 200 us in each of 5 s")
    # a failed call is tagged by what failed, whatever its message says ("Connection refused")
    err = "UNAVAILABLE: failed to connect: Connection refused (retry in 1 s)"
    down = decision_line(
        out.decision,
        "t1",
        124,
        dry_run=False,
        ok=False,
        call_ms=0.4,
        latency_ms=None,
        error=err,
        failure="agent_unreachable",
    )
    assert parse_line(down).tags["kind"] == "agent_unreachable" and parse_line(down).fields["ok"] == 0


def test_a_message_with_an_escaped_tag_is_read_by_the_full_parser():
    s = service()
    other = point("edge\\ router", 101, "forward", T0, 9999.0)  # a node name with a space: escaped
    msg = b"\n".join([other, point("A", 101, "forward", T0, 1300.0), point("A", 102, "forward", T0, 2000.0)])
    assert s.handle_message(msg, T0 + 1) == 2
    key = s.intent.steering[0].key
    assert s.engine.series[(key, "p1")][T0].delay_us == 1300.0 and s.counts["bad_lines"] == 0


def test_the_command_refuses_an_invalid_intent_with_its_line():
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {"PYTHONPATH": f"{repo}:{repo / 'schemas' / 'python'}", "PATH": "/usr/bin:/bin"}
    bad = repo / "tests" / "controller" / "bad" / "steering_no_policy.yaml"
    r = subprocess.run([sys.executable, "-m", "controller.steer", str(bad)], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and f"{bad}:13:18: steering[0].destination: no policy for fd00:c::/64" in r.stderr
    plain = repo / "controller" / "examples" / "demo_line5.yaml"
    r = subprocess.run([sys.executable, "-m", "controller.steer", str(plain)], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "no `steering:` entry" in r.stderr
