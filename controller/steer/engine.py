"""The steering decision: which candidate SID list a policy should use, from per-second measurements.

Pure: no I/O and no clock of its own. Every call takes `now` (seconds, the same time base as the
measurements' seconds: UTC Unix time in production), so a test replays minutes of measurements in
milliseconds (tests/controller/test_steer_engine.py) and the service passes time.time().

    engine = Engine([steering, ...])
    engine.observe(node, ssid, second, delay_us, count)      # one stamp_delay point
    outcome = engine.evaluate(policy_key, now)               # Outcome: a decision or a report
    engine.switched(policy_key, outcome.decision, now)       # the agent replaced the SID list

The model (docs/steering.md):
- a candidate counts only with a sample in each of the last `hysteresis.seconds` seconds and a
  newest second at most `stale_after_s` old: stale, missing or incomplete measurements never cause
  a switch (the outcome says which);
- hysteresis: a candidate must be better than the active one in EACH of those seconds, by at least
  `pct` % and `us` microseconds (lowest_delay) or `loss_pp` points (lowest_loss); bounded: the
  active one broke a limit in each of them, or a more preferred candidate met the limits in each;
- after the first evaluation (a start or restart), no switch for one window plus `stale_after_s`
  while some candidate is still not measured: it would move to the first better one, then again;
- hold-down after a switch, at most `max_switches_per_hour`;
- after a switch the new path is measured for `verify_s` seconds: worse than the old path was
  (by the same margins) -> rolled back, counted;
- no candidate meets the objective's limits, or none is measured at all -> alert.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import NamedTuple

from controller.steering import Candidate, Steering

KEEP_SECONDS = 120  # per candidate; longer than any window the intent allows at default settings


class Sample(NamedTuple):  # one candidate's one second; a tuple: made 3 000 times a second per 1 000 policies
    delay_us: float
    loss_pct: float


@dataclass(frozen=True)
class Numbers:
    """A candidate's mean over the seconds a rule looked at."""

    delay_us: float
    loss_pct: float
    seconds: int
    last_second: int = 0  # the newest second of the window (UTC, s)

    def as_fields(self, side: str) -> dict[str, float]:
        return {f"{side}_delay_us": round(self.delay_us, 1), f"{side}_loss_pct": round(self.loss_pct, 3)}


@dataclass(frozen=True)
class Decision:
    kind: str  # switch | rollback
    policy: Steering
    from_: Candidate
    to: Candidate
    from_numbers: Numbers
    to_numbers: Numbers
    rule: str  # what fired, in words with the numbers


@dataclass(frozen=True)
class Outcome:
    """What one evaluation found: a decision, or why there is none (state), and the alert."""

    state: str  # decide | hold_down | rate_limited | stale | incomplete | warming_up | no_better | verifying | backoff
    decision: Decision | None = None
    alert: str = ""  # "" or why no candidate meets the objective / none is measured
    detail: str = ""


@dataclass
class Verify:
    """A switch being judged: the old path's numbers at decision time, the new path's after it."""

    from_: Candidate
    to: Candidate
    before: Numbers
    from_second: int  # first second measured on the new path


@dataclass
class PolicyState:
    spec: Steering
    active: Candidate
    switches: collections.deque = field(default_factory=collections.deque)  # times of the last hour
    held_until: float = 0.0
    backoff_until: float = 0.0
    verify: Verify | None = None
    counts: collections.Counter = field(default_factory=collections.Counter)
    owners: tuple = ()  # (candidate name, (policy key, candidate name)) of each candidate, in order
    warm_until: float | None = None  # set at the first evaluation: see Engine.evaluate


class Engine:
    def __init__(self, policies: list[Steering], initial: dict[tuple, tuple[str, ...]] | None = None):
        """initial: policy key -> the SID list it has now (else its first candidate)."""
        self.policies: dict[tuple, PolicyState] = {}
        self.by_session: dict[tuple[str, int], tuple[tuple, str]] = {}  # (node, ssid) -> (policy, candidate)
        self.series: dict[tuple[tuple, str], dict[int, Sample]] = {}
        self.newest: dict[tuple[tuple, str], int] = {}
        self.rate: dict[tuple[tuple, str], int] = {}  # the probe's packets per second
        for s in policies:
            segs = (initial or {}).get(s.key)
            active = (s.candidate_for_segs(segs) if segs else None) or s.candidates[0]
            self.policies[s.key] = PolicyState(s, active, owners=tuple((c.name, (s.key, c.name)) for c in s.candidates))
            for cand in s.candidates:
                self.by_session[(s.node, cand.ssid)] = (s.key, cand.name)
                self.series[(s.key, cand.name)] = {}
                self.rate[(s.key, cand.name)] = s.probe.rate_pps

    # ------------------------------------------------------------------ input
    def observe(self, node: str, ssid: int, second: int, delay_us: float, count: int) -> tuple | None:
        """One second of one probe session; returns the policy key it belongs to (None: not ours)."""
        owner = self.by_session.get((node, ssid))
        if owner is None:
            return None
        return self.observe_owner(owner, second, delay_us, count)

    def observe_owner(self, owner: tuple, second: int, delay_us: float, count: int) -> tuple:
        """observe() for a caller that knows the (policy, candidate) the session measures."""
        series = self.series[owner]
        series[second] = Sample(delay_us, max(0.0, 100.0 * (1 - count / self.rate[owner])))
        key = owner[0]
        if second > self.newest.get(owner, -1):
            self.newest[owner] = second
            if len(series) > KEEP_SECONDS + 10:  # trimmed in batches: a scan per point costs
                for old in [s for s in series if s <= second - KEEP_SECONDS]:
                    del series[old]
        return key

    def set_active(self, key: tuple, segs) -> Candidate | None:
        """What the node really has (read from its agent at take-over): the engine follows it."""
        st = self.policies[key]
        cand = st.spec.candidate_for_segs(segs)
        if cand is not None and cand != st.active:
            st.active, st.verify = cand, None
        return cand

    # ------------------------------------------------------------------ decision
    def evaluate(self, key: tuple, now: float) -> Outcome:
        st = self.policies[key]
        spec = st.spec
        n = spec.hysteresis.seconds
        windows = self._windows(st, now, n)
        measured = {name: w for name, w in windows.items() if isinstance(w, list)}
        alert = self._alert(spec, measured)
        if st.verify is not None:
            judged = self._judge_switch(st, now)
            if judged is not None:
                return Outcome(judged.state, judged.decision, alert, judged.detail)
        if now < st.backoff_until:
            return Outcome("backoff", alert=alert, detail=f"agent retry in {st.backoff_until - now:.1f} s")
        if now < st.held_until:
            return Outcome("hold_down", alert=alert, detail=f"{st.held_until - now:.1f} s left")
        active_window = windows[st.active.name]
        if not isinstance(active_window, list):
            return Outcome(active_window, alert=alert, detail=f"active {st.active.name}: {active_window}")
        if st.warm_until is None:
            # a steer that starts (or restarts) reads from now: its candidates' first full windows
            # come in one by one, as the delay processor closes each probe's seconds. Choosing before
            # all are in would switch to the first better one, then again to the best one; so for
            # one window plus the staleness limit it waits for every candidate
            st.warm_until = now + spec.hysteresis.seconds + spec.stale_after_s
        if now < st.warm_until and len(measured) < len(windows):
            return Outcome("warming_up", alert=alert, detail=self._skipped(windows))
        decision = self._choose(st, measured)
        if decision is None:
            skipped = self._skipped(windows) if len(measured) < len(windows) else ""  # the usual case: none
            return Outcome("no_better", alert=alert, detail=skipped)
        while st.switches and st.switches[0] <= now - 3600:
            st.switches.popleft()
        if len(st.switches) >= spec.max_switches_per_hour:
            st.counts["rate_limited"] += 1
            return Outcome("rate_limited", alert=alert, detail=f"{len(st.switches)} switches in the last hour")
        return Outcome("decide", decision, alert)

    def _windows(self, st: PolicyState, now: float, n: int) -> dict[str, list[Sample] | str]:
        """Each candidate's last n seconds, or why they cannot be judged: stale / incomplete."""
        out: dict[str, list[Sample] | str] = {}
        newest_of, series_of = self.newest, self.series
        oldest_fresh = now - 1 - st.spec.stale_after_s  # an older newest second is stale
        for name, owner in st.owners:
            newest = newest_of.get(owner)
            if newest is None or newest < oldest_fresh:
                out[name] = "stale"
                continue
            get = series_of[owner].get
            got = [get(s) for s in range(newest - n + 1, newest + 1)]
            out[name] = "incomplete" if None in got else got
        return out

    def _choose(self, st: PolicyState, measured: dict[str, list[Sample]]) -> Decision | None:
        spec, active = st.spec, st.active
        a = measured[active.name]
        kind = spec.objective.kind
        if kind == "bounded":
            return self._choose_bounded(st, measured)
        best: tuple[float, Candidate, str] | None = None
        for cand in spec.candidates:
            c = measured.get(cand.name)
            if cand == active or c is None or not self._within_limits(spec, c):
                continue
            rule = self._better(spec, kind, a, c)
            if rule:
                value = _mean(c, kind)
                if best is None or value < best[0]:
                    best = (value, cand, rule)
        if best is None:
            return None
        return Decision("switch", spec, active, best[1], self._numbers(st, active), self._numbers(st, best[1]), best[2])

    @staticmethod
    def _better(spec: Steering, kind: str, a: list[Sample], c: list[Sample]) -> str:
        """The rule text when c beats a in every second of the window by the margins, else ''."""
        h = spec.hysteresis
        if kind == "lowest_delay":
            factor = 1 - h.pct / 100
            for x, y in zip(a, c):  # most evaluations fail at the first second: stop there
                if x.delay_us - y.delay_us < h.us or y.delay_us > x.delay_us * factor:
                    return ""
            gain = min(x.delay_us - y.delay_us for x, y in zip(a, c))
            return (
                f"lowest_delay: better by >= {h.pct:g} % and >= {h.us:g} us in each of {h.seconds} s "
                f"(least gain {gain:.0f} us)"
            )
        ok = all(x.loss_pct - y.loss_pct >= h.loss_pp for x, y in zip(a, c))
        return f"lowest_loss: loss lower by >= {h.loss_pp:g} points in each of {h.seconds} s" if ok else ""

    def _choose_bounded(self, st: PolicyState, measured: dict[str, list[Sample]]) -> Decision | None:
        spec, active = st.spec, st.active
        a = measured[active.name]
        active_meets = self._within_limits(spec, a)
        active_rank = spec.objective.prefer.index(active.name)
        active_breaks = all(not self._within_limits(spec, [x]) for x in a)
        for rank, name in enumerate(spec.objective.prefer):
            cand = spec.candidate(name)
            c = measured.get(name)
            if cand == active or c is None or not self._within_limits(spec, c):
                continue
            if active_meets and rank > active_rank:
                return None  # the active one meets the limits and is preferred to what is left
            if not active_meets and not active_breaks:
                return None  # the active one broke a limit in some seconds only: not N consecutive
            why = "more preferred candidate meets the limits" if active_meets else "active broke the limits"
            rule = f"bounded: {why} in each of {spec.hysteresis.seconds} s ({_limits(spec)})"
            return Decision("switch", spec, active, cand, self._numbers(st, active), self._numbers(st, cand), rule)
        return None

    def _numbers(self, st: PolicyState, cand: Candidate) -> Numbers:
        """The candidate's numbers over the window just judged (its newest n seconds)."""
        owner = (st.spec.key, cand.name)
        newest, n = self.newest[owner], st.spec.hysteresis.seconds
        window = [self.series[owner][s] for s in range(newest - n + 1, newest + 1)]
        return _numbers(window, newest)

    @staticmethod
    def _within_limits(spec: Steering, window: list[Sample]) -> bool:
        o = spec.objective
        if o.max_delay_us is None and o.max_loss_pct is None:
            return True
        return all(
            (o.max_delay_us is None or s.delay_us <= o.max_delay_us)
            and (o.max_loss_pct is None or s.loss_pct <= o.max_loss_pct)
            for s in window
        )

    def _alert(self, spec: Steering, measured: dict[str, list[Sample]]) -> str:
        if not measured:
            return "no candidate is measured (every probe stale or incomplete)"
        o = spec.objective
        if o.max_delay_us is None and o.max_loss_pct is None:
            return ""
        if not any(self._within_limits(spec, w[-1:]) for w in measured.values()):
            return f"no candidate meets the objective ({_limits(spec)})"
        return ""

    @staticmethod
    def _skipped(windows: dict) -> str:
        bad = [f"{name} {w}" for name, w in windows.items() if not isinstance(w, list)]
        return "not judged: " + ", ".join(bad) if bad else ""

    # ------------------------------------------------------------------ after a switch
    def _judge_switch(self, st: PolicyState, now: float) -> Outcome | None:
        v = st.verify
        key = st.spec.key
        series = self.series[(key, v.to.name)]
        after = [series[s] for s in sorted(series) if s >= v.from_second]
        if len(after) < st.spec.verify_s:
            if now > v.from_second + st.spec.verify_s + st.spec.stale_after_s + 5:
                st.verify = None
                st.counts["unverified"] += 1
                return Outcome("unverified", detail=f"{v.to.name}: {len(after)} s measured after the switch")
            return Outcome("verifying", detail=f"{v.to.name}: {len(after)}/{st.spec.verify_s} s measured")
        st.verify = None
        seconds = [s for s in sorted(series) if s >= v.from_second][: st.spec.verify_s]
        window = [series[s] for s in seconds]
        now_numbers = _numbers(window, seconds[-1])
        # the old path over the same seconds: when everything got worse, going back helps nothing
        old_series = self.series[(key, v.from_.name)]
        old_now = [old_series[s] for s in seconds if s in old_series]
        old_numbers = _numbers(old_now, seconds[-1]) if len(old_now) == len(seconds) else v.before
        if not (self._worse(st.spec, v.before, now_numbers) and self._worse(st.spec, old_numbers, now_numbers)):
            st.counts["verified"] += 1
            return None
        rule = (
            f"rollback: {v.to.name} measured {now_numbers.delay_us:.0f} us / {now_numbers.loss_pct:.2f} % over "
            f"{len(window)} s after the switch, worse than {v.from_.name} before it "
            f"({v.before.delay_us:.0f} us / {v.before.loss_pct:.2f} %) and meanwhile "
            f"({old_numbers.delay_us:.0f} us / {old_numbers.loss_pct:.2f} %)"
        )
        return Outcome("decide", Decision("rollback", st.spec, v.to, v.from_, now_numbers, old_numbers, rule))

    @staticmethod
    def _worse(spec: Steering, before: Numbers, after: Numbers) -> bool:
        h = spec.hysteresis
        if spec.objective.kind == "lowest_loss":
            return after.loss_pct - before.loss_pct >= h.loss_pp
        if spec.objective.kind == "bounded" and Engine._within_limits(spec, [Sample(after.delay_us, after.loss_pct)]):
            return False  # the new path meets the limits it was chosen for
        return after.delay_us - before.delay_us >= h.us and after.delay_us >= before.delay_us * (1 + h.pct / 100)

    # ------------------------------------------------------------------ what was done
    def switched(self, key: tuple, decision: Decision, now: float, dry_run: bool = False) -> None:
        """The decision was carried out (or, dry-run, reported): hold-down starts either way, so a
        dry-run reports a decision once per hold-down rather than every second."""
        st = self.policies[key]
        st.held_until = now + st.spec.hold_down_s
        st.counts["dry_run" if dry_run else decision.kind] += 1
        if dry_run:
            return
        st.switches.append(now)
        st.active = decision.to
        newest = self.newest.get((key, decision.to.name), int(now))
        if decision.kind == "switch":
            st.verify = Verify(decision.from_, decision.to, decision.from_numbers, max(newest, int(now)) + 1)

    def failed(self, key: tuple, now: float, retry_in_s: float, refused: bool) -> None:
        """The agent call failed: nothing changed on the node. Refused: the target is held off for
        the hold-down; unreachable: retried after retry_in_s (the caller's backoff)."""
        st = self.policies[key]
        st.counts["refused" if refused else "agent_unreachable"] += 1
        st.backoff_until = now + (st.spec.hold_down_s if refused else retry_in_s)


def _mean(window: list[Sample], kind: str) -> float:
    values = [s.loss_pct if kind == "lowest_loss" else s.delay_us for s in window]
    return sum(values) / len(values)


def _numbers(window: list[Sample], last_second: int = 0) -> Numbers:
    return Numbers(
        sum(s.delay_us for s in window) / len(window),
        sum(s.loss_pct for s in window) / len(window),
        len(window),
        last_second,
    )


def _limits(spec: Steering) -> str:
    o = spec.objective
    parts = []
    if o.max_delay_us is not None:
        parts.append(f"delay <= {o.max_delay_us:g} us")
    if o.max_loss_pct is not None:
        parts.append(f"loss <= {o.max_loss_pct:g} %")
    return " and ".join(parts)
