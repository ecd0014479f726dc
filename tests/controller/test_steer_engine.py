"""The steering decision (controller/steer/engine.py) on replayed, real-shaped measurements.

The engine takes its time from the caller, so minutes of per-second stamp_delay points replay in
milliseconds: each second is built like the delay processor builds it (the mean of `rate`
packets, each delayed by the path's delay times a random factor, minus the packets lost).
"""

from __future__ import annotations

import random

from controller.intent import parse_intent
from controller.steer.engine import Engine

T0 = 1_800_000_000  # a UTC second; the engine only compares seconds with `now`
RATE = 20

INTENT = """\
version: 1
nodes:
  A: {agent: "127.0.0.1:1", tls: {ca: ca.pem, cert: c.pem, key: c.key}}
  B: {agent: "127.0.0.1:2", tls: {ca: ca.pem, cert: c.pem, key: c.key}}
policies:
  - {node: A, destination: "fd00:b::/64", segs: ["fc00:11::e", "fc00:3::d6"], dev: a1}
steering:
  - node: A
    destination: "fd00:b::/64"
    candidates:
      - {name: p1, segs: ["fc00:11::e", "fc00:3::d6"], return_segs: ["fc00:11::e"], sender_dev: a1, reflector_dev: b1}
      - {name: p2, segs: ["fc00:12::e", "fc00:3::d6"], return_segs: ["fc00:12::e"], sender_dev: a2, reflector_dev: b2}
      - {name: p3, segs: ["fc00:13::e", "fc00:3::d6"], return_segs: ["fc00:13::e"], sender_dev: a3, reflector_dev: b3}
    probe: {ssid: 101, rate_pps: 20, source: "fc00:1::1", reflector: {node: B, address: "fc00:3::1"}}
    objective: OBJECTIVE
    hysteresis: {pct: 10, us: 200, seconds: 5}
    hold_down_s: 20
    max_switches_per_hour: 3
    verify_s: 4
"""


def steering(objective: str = "lowest_delay"):
    return parse_intent(INTENT.replace("OBJECTIVE", objective), "t.yaml").steering[0]


def second(delay_us: float, rng: random.Random, noise: float = 0.0, lost: int = 0) -> tuple[float, int]:
    """One second as the delay processor reports it: mean of the packets received, their count."""
    count = RATE - lost
    delays = [delay_us * (1 + rng.uniform(-noise, noise)) for _ in range(count)]
    return sum(delays) / count, count


class Replay:
    """Feeds seconds to an engine and evaluates after each, as the service does."""

    def __init__(self, objective: str = "lowest_delay", seed: int = 1):
        self.spec = steering(objective)
        self.engine = Engine([self.spec])
        self.key = self.spec.key
        self.rng = random.Random(seed)
        self.t = T0
        self.decisions = []
        self.outcomes = []

    def run(self, seconds: int, delays: dict[str, float], noise: float = 0.0, lost: dict | None = None, carry_out=True):
        for _ in range(seconds):
            for cand in self.spec.candidates:
                if cand.name in delays:
                    mean, count = second(delays[cand.name], self.rng, noise, (lost or {}).get(cand.name, 0))
                    self.engine.observe("A", cand.ssid, self.t, mean, count)
            now = self.t + 1.6  # the second is closed and published ~0.5-1 s after its end
            out = self.engine.evaluate(self.key, now)
            self.outcomes.append(out)
            if out.decision is not None:
                self.decisions.append((self.t, out.decision))
                if carry_out:
                    self.engine.switched(self.key, out.decision, now)
            self.t += 1

    @property
    def active(self) -> str:
        return self.engine.policies[self.key].active.name


BASE = {"p1": 1300.0, "p2": 2000.0, "p3": 2500.0}


def test_delay_on_the_active_path_moves_it_after_n_seconds_with_the_numbers():
    r = Replay()
    r.run(20, BASE)
    assert r.active == "p1" and not r.decisions
    r.run(4, {**BASE, "p1": 6300.0})  # +5 ms: 4 seconds are not yet the 5 the hysteresis asks for
    assert not r.decisions
    r.run(1, {**BASE, "p1": 6300.0})
    assert len(r.decisions) == 1
    t, d = r.decisions[0]
    assert (d.kind, d.from_.name, d.to.name) == ("switch", "p1", "p2")  # p2 is the best candidate
    assert d.from_numbers.delay_us == 6300.0 and d.to_numbers.delay_us == 2000.0
    assert d.from_numbers.loss_pct == 0 and d.from_numbers.seconds == 5
    assert "lowest_delay" in d.rule and "5 s" in d.rule
    assert r.active == "p2"


def test_five_minutes_of_20_percent_noise_on_two_equal_candidates_never_switch():
    # the packets of each second vary by +-20 % around the same 2000 us on p1 and p2; p3 is worse
    for seed in range(5):
        r = Replay(seed=seed)
        r.run(300, {"p1": 2000.0, "p2": 2000.0, "p3": 2600.0}, noise=0.2)
        assert not r.decisions, (seed, r.decisions)
        assert {o.state for o in r.outcomes[4:]} == {"no_better"}  # the first 4 s: incomplete
    # the same noise with p2 truly 30 % better does switch: the test above could fail
    r = Replay()
    r.run(60, {"p1": 2000.0, "p2": 1400.0, "p3": 2600.0}, noise=0.2)
    assert [d.to.name for _, d in r.decisions] == ["p2"]


def wandering_switches(pct: float, runs: int = 20) -> int:
    """Switches in `runs` replays of 5 minutes where each path's delay wanders +-20 % second by
    second (the whole second moves, not its packets), p1 and p2 equal on average."""
    switches = 0
    for seed in range(runs):
        r = Replay(seed=seed)
        r.engine.policies[r.key].spec = r.spec = _with_pct(r.spec, pct)
        rng = random.Random(seed + 100)
        for _ in range(300):
            noisy = {p: 2000.0 * (1 + rng.uniform(-0.2, 0.2)) for p in ("p1", "p2")}
            r.run(1, {**noisy, "p3": 9000.0})
        switches += len(r.decisions)
    return switches


def _with_pct(spec, pct: float):
    import dataclasses

    return dataclasses.replace(spec, hysteresis=dataclasses.replace(spec.hysteresis, pct=pct))


def test_per_second_noise_of_20_percent_needs_a_wider_margin():
    """With the whole second moving +-20 %, 10 % in each of 5 s is crossed by chance now and then
    (docs/steering.md gives the count); 25 % never is."""
    assert wandering_switches(10.0) > 0  # measured: 7 in 100 minutes
    assert wandering_switches(25.0) == 0


def test_stopped_measurements_never_switch_and_alert():
    r = Replay()
    r.run(10, BASE)
    spec = r.spec
    # measurements stop (the processor died): nothing arrives, the clock goes on
    for i in range(10):
        out = r.engine.evaluate(r.key, r.t + i + 1.6)
    assert out.decision is None and out.state == "stale"
    assert out.alert.startswith("no candidate is measured")
    # only the active one's probe stops: a better candidate is not taken either
    r2 = Replay()
    r2.run(10, BASE)
    r2.run(10, {"p2": 500.0, "p3": 2500.0})
    assert not r2.decisions and r2.outcomes[-1].state == "stale"
    assert spec.candidates[0].name == "p1"


def test_a_missing_second_in_the_window_is_incomplete():
    r = Replay()
    r.run(10, BASE)
    bad = {**BASE, "p1": 9000.0}
    r.run(3, bad)
    r.run(1, {"p2": 2000.0, "p3": 2500.0}, carry_out=False)  # p1's probe misses a second
    r.run(2, bad)
    assert not r.decisions and r.outcomes[-1].state == "incomplete"
    r.run(3, bad)  # five complete seconds again
    assert len(r.decisions) == 1


def test_hold_down_and_switches_per_hour():
    r = Replay()
    r.run(10, BASE)
    r.run(5, {**BASE, "p1": 9000.0})
    assert [d.to.name for _, d in r.decisions] == ["p2"]
    r.run(15, {**BASE, "p1": 9000.0, "p2": 9000.0})  # p3 is now better, but the hold-down holds
    assert len(r.decisions) == 1 and {o.state for o in r.outcomes[-10:]} == {"hold_down"}
    r.run(10, {**BASE, "p1": 9000.0, "p2": 9000.0})
    assert [d.to.name for _, d in r.decisions] == ["p2", "p3"]
    r.run(25, {**BASE, "p1": 600.0, "p2": 9000.0, "p3": 9000.0})
    assert [d.to.name for _, d in r.decisions] == ["p2", "p3", "p1"]
    r.run(25, {**BASE, "p1": 9000.0, "p2": 600.0, "p3": 9000.0})  # a 4th switch within the hour
    assert len(r.decisions) == 3 and r.outcomes[-1].state == "rate_limited"


def test_a_switch_that_made_it_worse_is_rolled_back():
    r = Replay()
    r.run(10, BASE)
    r.run(5, {**BASE, "p1": 6300.0})
    assert [d.to.name for _, d in r.decisions] == ["p2"]
    r.run(6, {**BASE, "p1": 6300.0, "p2": 12000.0})  # p2 is worse once it carries the traffic
    kinds = [(d.kind, d.from_.name, d.to.name) for _, d in r.decisions]
    assert kinds == [("switch", "p1", "p2"), ("rollback", "p2", "p1")]
    rb = r.decisions[-1][1]
    assert rb.from_numbers.delay_us == 12000.0 and rb.to_numbers.delay_us == 6300.0
    assert r.active == "p1" and r.engine.policies[r.key].counts["rollback"] == 1
    # a switch that helped is verified, not rolled back
    ok = Replay()
    ok.run(10, BASE)
    ok.run(15, {**BASE, "p1": 6300.0})
    assert [d.kind for _, d in ok.decisions] == ["switch"] and ok.engine.policies[ok.key].counts["verified"] == 1


def test_failed_agent_call_changes_nothing_and_backs_off():
    r = Replay()
    r.run(10, BASE)
    r.run(5, {**BASE, "p1": 6300.0}, carry_out=False)
    assert len(r.decisions) == 1
    r.engine.failed(r.key, r.t + 0.6, retry_in_s=3.0, refused=False)
    r.decisions.clear()
    r.run(2, {**BASE, "p1": 6300.0}, carry_out=False)
    assert not r.decisions and r.outcomes[-1].state == "backoff" and r.active == "p1"
    r.run(1, {**BASE, "p1": 6300.0}, carry_out=False)
    assert len(r.decisions) == 1  # retried once the backoff is over


def test_lowest_loss_objective():
    r = Replay("lowest_loss")
    r.run(10, BASE)
    r.run(5, BASE, lost={"p1": 4})  # 20 % loss on p1 (4 of 20 probes a second)
    assert [(d.from_.name, d.to.name) for _, d in r.decisions] == [("p1", "p2")]
    d = r.decisions[0][1]
    assert round(d.from_numbers.loss_pct, 6) == 20.0 and d.to_numbers.loss_pct == 0.0


def test_bounded_objective_with_preferences_and_the_alert():
    r = Replay("{kind: bounded, max_delay_us: 3000, max_loss_pct: 5, prefer: [p3, p1]}")
    assert r.spec.objective.prefer == ("p3", "p1", "p2")
    r.run(5, BASE)  # p1 is active, p3 (preferred) meets the limits: move to it
    assert [(d.from_.name, d.to.name) for _, d in r.decisions] == [("p1", "p3")]
    r.run(30, {"p1": 1300.0, "p2": 2000.0, "p3": 2900.0})  # p3 still meets: stay, though p1 is faster
    assert len(r.decisions) == 1
    r.run(5, {"p1": 1300.0, "p2": 2000.0, "p3": 3500.0})  # p3 breaks the limit: the next preferred
    assert [d.to.name for _, d in r.decisions] == ["p3", "p1"]
    r.run(25, {"p1": 4000.0, "p2": 4000.0, "p3": 4000.0})
    assert r.outcomes[-1].alert.startswith("no candidate meets the objective (delay <= 3000 us and loss <= 5 %)")
    assert len(r.decisions) == 2


def test_engine_follows_what_the_node_has():
    spec = steering()
    e = Engine([spec], initial={spec.key: spec.candidates[2].segs})
    assert e.policies[spec.key].active.name == "p3"
    assert e.set_active(spec.key, spec.candidates[1].segs).name == "p2"
    assert e.set_active(spec.key, ("fc00:99::e",)) is None and e.policies[spec.key].active.name == "p2"


def test_a_started_steer_waits_for_every_candidate_before_its_first_switch():
    """Started on p3, p2's seconds come in first and p1's (the best) 3 s later, as the delay
    processor closes each probe's seconds: one switch, to p1, not p3 -> p2 -> p1. A candidate
    that never comes does not hold the others back past one window plus stale_after_s."""
    spec = steering()
    for late, expect in ((3, ["p1"]), (None, ["p2"])):
        r = Replay()
        r.engine = Engine([spec], initial={spec.key: spec.candidates[2].segs})
        r.run(3 if late else 0, {"p2": 2000.0, "p3": 2500.0})
        r.run(40, {"p2": 2000.0, "p3": 2500.0, **({"p1": 1300.0} if late else {})})
        assert [d.to.name for _, d in r.decisions] == expect, (late, r.decisions)
        states = [o.state for o in r.outcomes]
        assert "warming_up" in states
        if late is None:  # p2 wins once the warm-up (5 s window + 3 s stale) is over, not before
            first = states.index("decide")
            assert states[first - 1] == "warming_up" and first == 4 + 5 + 3
