"""segscope-steer: reads the candidates' measurements from Kafka, decides, replaces SID lists.

    SteerService(intent, kafka, leadership).run(stop_event)

- input: `stamp_delay` lines on `segscope.metrics` (the delay processor's per-second points), every
  partition from its end (a decision is about now); the probe sessions of the intent's `steering:`
  entries are picked by (node, ssid, direction);
- one leader per policy set: the replicas of one set join the consumer group `segscope-steer.<set>`
  on the controller's leader topic (controller/leader.py, the same lease); every replica reads and
  evaluates, only the leader calls agents and publishes;
- a decision: UpdatePolicy on the policy's node (one netlink replace, hitless: agent/srv6.py),
  inside the lease (a revoke waits for the call); the leader reads each steered policy from its
  agent when it takes over, so a decision its predecessor carried out is not made twice;
- output on `segscope.metrics` (Telegraf -> InfluxDB): one `steering_decision` line per decision
  or failed call, one `steering_policy` line per policy and second (active candidate, state, alert).
"""

from __future__ import annotations

import collections
import logging
import os
import re
import threading
import time

from controller.agents import AgentClient, AgentError, policy_msg
from controller.intent import Intent
from controller.model import Resource, canon_prefix, policy_spec
from controller.steer.engine import Decision, Engine, Outcome
from controller.steering import Steering
from segscope_proto.segscope.agent.v1 import srv6_pb2
from segscope_schemas import names
from segscope_schemas.line_protocol import LineError, parse_line

log = logging.getLogger("segscope.steer")

DECISION_MEASUREMENT = "steering_decision"
POLICY_MEASUREMENT = "steering_policy"
UNREACHABLE = {"UNAVAILABLE", "DEADLINE_EXCEEDED"}
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)  # an unreachable agent is tried again after these
CALL_TIMEOUT_S = 5.0
STAMP_PREFIX = b"stamp_delay,"
# the counter of each evaluation state, named once rather than formatted per evaluation
STATE_COUNTER = {
    state: f"state_{state}"
    for state in (
        "decide",
        "hold_down",
        "rate_limited",
        "stale",
        "incomplete",
        "warming_up",
        "no_better",
        "verifying",
        "backoff",
    )
}
COUNT_RE = re.compile(rb"(?:^|,)count=(\d+)i")
MEAN_RE = re.compile(rb"(?:^|,)mean_us=([-+0-9.eE]+)")


def _tag(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=").replace(" ", "\\ ")


def _str(value: str) -> str:
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def decision_line(
    d: Decision,
    replica: str,
    ts_ns: int,
    *,
    dry_run: bool,
    ok: bool,
    call_ms: float | None,
    latency_ms: float | None,
    error: str = "",
    failure: str = "",
) -> str:
    """One steering_decision point: the policy, from, to, both sides' numbers, the rule that fired."""
    p = d.policy
    fields = {
        "from": _str(d.from_.name),
        "to": _str(d.to.name),
        "from_segs": _str(",".join(d.from_.segs)),
        "to_segs": _str(",".join(d.to.segs)),
        **{k: f"{v}" for k, v in d.from_numbers.as_fields("from").items()},
        **{k: f"{v}" for k, v in d.to_numbers.as_fields("to").items()},
        "seconds": f"{d.from_numbers.seconds}i",
        "from_last_second": f"{d.from_numbers.last_second}i",
        "to_last_second": f"{d.to_numbers.last_second}i",
        "rule": _str(d.rule),
        "dry_run": f"{int(dry_run)}i",
        "ok": f"{int(ok)}i",
    }
    if call_ms is not None:
        fields["agent_call_ms"] = f"{call_ms:.2f}"
    if latency_ms is not None:
        fields["latency_ms"] = f"{latency_ms:.2f}"
    if error:
        fields["error"] = _str(error[:300])
    kind = failure or d.kind
    tags = (
        f"{DECISION_MEASUREMENT},node={_tag(p.node)},policy={_tag(p.destination)},kind={kind},replica={_tag(replica)}"
    )
    return f"{tags} {','.join(f'{k}={v}' for k, v in fields.items())} {ts_ns}"


class SteerService:
    def __init__(
        self,
        intent: Intent,
        kafka: str,
        leadership,
        replica: str,
        *,
        dry_run: bool = False,
        clock=time.time,
        kafka_config: dict | None = None,
        health: tuple[str, int] | None = None,
        kafka_error_cb=None,
    ):
        self.intent, self.kafka, self.leadership, self.replica = intent, kafka, leadership, replica
        self.policies: dict[tuple, Steering] = {s.key: s for s in intent.steering}
        self.dry_run_all = dry_run
        self.clock = clock  # UTC seconds: the time base of the measurements' seconds
        self.kafka_config = kafka_config or {}
        self.health_addr = health  # (host, port) of /healthz /readyz /metrics /status, or None
        self.kafka_error_cb = kafka_error_cb  # a segscope_kafka.RefusalWatch: a refused login stops the replica
        self._health = None
        self.engine = Engine(list(intent.steering))
        self._wanted_directions = tuple({f"direction={s.probe.direction}".encode() for s in intent.steering})
        # a stamp_delay line of a wanted direction, tags in the delay processor's order (schemas/metrics.md)
        wanted = b"|".join(d.split(b"=")[1] for d in self._wanted_directions)
        self._line_re = re.compile(
            rb"^stamp_delay,node=([^,\\\n ]*),ssid=(\d+),path=[^ \n]*,direction=(" + wanted + rb") ([^ \n]*) (\d+)$",
            re.M,
        )
        # (node, ssid, direction) as the line's bytes -> the engine's owner of our probes' points:
        # the message loop looks a line up without decoding it
        self._owner_by_raw = {
            (s.node.encode(), str(c.ssid).encode(), s.probe.direction.encode()): (s.key, c.name)
            for s in intent.steering
            for c in s.candidates
        }
        self.clients: dict[str, AgentClient] = {}
        self.counts: collections.Counter = collections.Counter()
        self.latencies_ms: list[float] = []  # Kafka arrival -> agent call, per carried-out decision
        self.decisions: list[dict] = []  # what this replica decided (for tests and the status)
        self._leading = False
        self._synced: set[tuple] = set()  # policies read from their node since this replica leads
        self._unreachable: dict[tuple, int] = {}  # policy -> consecutive failed calls
        self._pending: dict[tuple, float] = {}  # policy -> Kafka time (s) of the data that woke it
        self._producer = None
        # a pause between the decision and the agent call, for the leader-kill test only
        self._pause_before_call_s = float(os.environ.get("SEGSCOPE_STEER_TEST_PAUSE_S", "0") or 0)

    # ------------------------------------------------------------------ input
    def handle_message(self, value: bytes, kafka_ts_s: float) -> int:
        """Feeds a segscope.metrics message's stamp_delay lines of our probes to the engine.

        Fast path (bench/steer_evaluate.py): one regex pass over the whole message finds the lines
        of the wanted directions and their tags; only the lines of our probes have their fields
        read. A message where that pass finds fewer such lines than the message has (a tag with an
        escape, e.g. a node name with a space) goes line by line through the full parser."""
        if STAMP_PREFIX not in value:
            return 0
        expected = sum(value.count(d + b" ") for d in self._wanted_directions)
        found = self._line_re.findall(value)
        if len(found) != expected:
            return sum(
                self._observe_parsed(raw, kafka_ts_s) for raw in value.split(b"\n") if raw.startswith(STAMP_PREFIX)
            )
        used = 0
        owners = self._owner_by_raw
        observe = self.engine.observe_owner
        pending = self._pending
        for node_b, ssid_b, direction, fields, ts in found:
            owner = owners.get((node_b, ssid_b, direction))
            if owner is None:
                continue  # not our probe, or not the direction its policy is judged on
            count, mean = COUNT_RE.search(fields), MEAN_RE.search(fields)
            if count is None or mean is None or int(count.group(1)) <= 0:
                self.counts["incomplete_points"] += 1  # a point still mid-write, or no packet
                continue
            observe(owner, int(ts) // 1_000_000_000, float(mean.group(1)), int(count.group(1)))
            pending.setdefault(owner[0], kafka_ts_s)
            used += 1
        self.counts["points"] += used
        return used

    def _observe_parsed(self, raw: bytes, kafka_ts_s: float) -> int:
        try:
            point = parse_line(raw.decode())
        except (LineError, UnicodeDecodeError, ValueError):
            self.counts["bad_lines"] += 1
            return 0
        return self.observe_point(point, kafka_ts_s)

    def observe_point(self, point, kafka_ts_s: float) -> int:
        tags, fields = point.tags, point.fields
        try:
            ssid = int(tags.get("ssid", ""))
        except ValueError:
            return 0
        count = int(fields.get("count", 0))
        return self._observe(
            tags.get("node", ""),
            ssid,
            tags.get("direction", ""),
            point.timestamp_ns,
            count,
            fields.get("mean_us"),
            kafka_ts_s,
        )

    def _observe(
        self, node: str, ssid: int, direction: str, ts_ns: int | None, count: int, delay, kafka_ts_s: float
    ) -> int:
        owner = self.engine.by_session.get((node, ssid))
        if owner is None:
            return 0
        spec = self.policies[owner[0]]
        if direction != spec.probe.direction or ts_ns is None:
            return 0
        if count <= 0 or delay is None:
            self.counts["incomplete_points"] += 1  # a point still mid-write, or no packet
            return 0
        key = self.engine.observe(node, ssid, ts_ns // 1_000_000_000, float(delay), count)
        self.counts["points"] += 1
        self._pending.setdefault(key, kafka_ts_s)
        return 1

    # ------------------------------------------------------------------ deciding
    def evaluate(self, keys, now: float) -> list[tuple[tuple, Outcome]]:
        out = []
        evaluate, counts = self.engine.evaluate, self.counts
        for key in keys:
            outcome = evaluate(key, now)
            counts[STATE_COUNTER.get(outcome.state) or f"state_{outcome.state}"] += 1
            out.append((key, outcome))
        return out

    def act(self, key: tuple, outcome: Outcome, now: float, woke_at: float | None) -> None:
        """Carries a decision out (leader only), or reports it (dry-run)."""
        d = outcome.decision
        spec = self.policies[key]
        dry = spec.dry_run or self.dry_run_all
        if dry:
            self.engine.switched(key, d, now, dry_run=True)
            self._record(d, dry_run=True, ok=True, call_ms=None, latency_ms=None)
            log.warning("dry-run %s %s: %s -> %s (%s)", d.kind, spec.label, d.from_.name, d.to.name, d.rule)
            return
        with self.leadership.acting() as ok:
            if not ok:
                return
            error = None if key in self._synced else self._sync_one(key)
            if error is None and self.engine.policies[key].active != d.from_:
                return  # the node already has another candidate (a predecessor's switch): decide again
            if self._pause_before_call_s and error is None:
                log.warning(
                    "decided %s -> %s for %s; pausing %.1f s before the call (test)",
                    d.from_.name,
                    d.to.name,
                    spec.label,
                    self._pause_before_call_s,
                )
                time.sleep(self._pause_before_call_s)
            t_call = time.time()
            latency_ms = (t_call - woke_at) * 1000 if woke_at else None
            if error is None:
                error = self._update_policy(spec, d.to.segs)
            call_ms = (time.time() - t_call) * 1000
        if error is None:
            self.engine.switched(key, d, now)
            self._unreachable.pop(key, None)
            if latency_ms is not None:
                self.latencies_ms.append(latency_ms)
            self._record(d, dry_run=False, ok=True, call_ms=call_ms, latency_ms=latency_ms)
            log.warning("%s %s: %s -> %s in %.1f ms (%s)", d.kind, spec.label, d.from_.name, d.to.name, call_ms, d.rule)
            return
        refused = not error.startswith(tuple(UNREACHABLE))
        tries = self._unreachable.get(key, 0)
        if not refused:
            self._unreachable[key] = tries + 1
        retry = BACKOFF_S[min(tries, len(BACKOFF_S) - 1)]
        self.engine.failed(key, now, retry_in_s=retry, refused=refused)
        text = f"refused: {error}" if refused else f"{error} (retry in {retry:g} s)"
        failure = "refused" if refused else "agent_unreachable"
        self._record(d, dry_run=False, ok=False, call_ms=call_ms, latency_ms=latency_ms, error=text, failure=failure)
        log.error("%s %s: %s -> %s not done: %s", d.kind, spec.label, d.from_.name, d.to.name, text)

    def _client(self, node: str) -> AgentClient:
        if node not in self.clients:
            self.clients[node] = AgentClient(
                self.intent.nodes[node], channel_options=[("grpc.max_reconnect_backoff_ms", 1000)]
            )
        return self.clients[node]

    def _update_policy(self, spec: Steering, segs) -> str | None:
        """UpdatePolicy with the candidate's SID list; None, or the error ('CODE: detail')."""
        policy = next(p for p in self.intent.policies if (p.node, canon_prefix(p.destination), p.table) == spec.key)
        resource = Resource(
            "policy", spec.node, spec.key[1:], policy_spec(policy.mode, segs, policy.dev, policy.metric)
        )
        client = self._client(spec.node)
        try:
            client.call(
                client.srv6,
                "UpdatePolicy",
                srv6_pb2.UpdatePolicyRequest(policy=policy_msg(resource)),
                timeout=CALL_TIMEOUT_S,
            )
        except AgentError as e:
            return f"{e.code}: {e.detail}" if hasattr(e, "code") else str(e)
        return None

    def _sync_active(self) -> None:
        """What every steered policy's node really has: the engine follows it (take-over). A node
        that cannot be read is read again before its policy's next decision."""
        for key in self.policies:
            if key not in self._synced:
                error = self._sync_one(key)
                if error:
                    log.error("take-over: %s: %s", self.policies[key].label, error)

    def _sync_one(self, key: tuple) -> str | None:
        """Reads one steered policy from its node; None, or why it cannot be steered now."""
        spec = self.policies[key]
        client = self._client(spec.node)
        try:
            got = client.call(
                client.srv6,
                "GetPolicy",
                srv6_pb2.GetPolicyRequest(destination=spec.destination, table=spec.table),
                timeout=CALL_TIMEOUT_S,
            )
        except AgentError as e:
            return f"{e.code}: reading the policy: {e.detail}"
        segs = ",".join(got.policy.segments)
        if self.engine.set_active(key, tuple(got.policy.segments)) is None:
            # someone else's SID list: not ours to replace (FAILED_PRECONDITION counts as refused)
            return f"FAILED_PRECONDITION: the node has {segs}, no candidate of this policy: left alone"
        self._synced.add(key)
        return None

    # ------------------------------------------------------------------ output
    def _record(self, d: Decision, **kw) -> None:
        line = decision_line(d, self.replica, time.time_ns(), **kw)
        self.decisions.append({"kind": d.kind, "from": d.from_.name, "to": d.to.name, "line": line, **kw})
        self._produce(line)

    def policy_line(self, key: tuple, outcome: Outcome, ts_ns: int) -> str:
        st = self.engine.policies[key]
        spec = st.spec
        fields = [
            f"active={_str(st.active.name)}",
            f"active_segs={_str(','.join(st.active.segs))}",
            f"state={_str(outcome.state)}",
            f"alert={int(bool(outcome.alert))}i",
            f"dry_run={int(spec.dry_run or self.dry_run_all)}i",
            *(
                f"{k}={st.counts[k]}i"
                for k in ("switch", "rollback", "dry_run", "refused", "agent_unreachable", "rate_limited")
            ),
        ]
        if outcome.alert:
            fields.append(f"alert_text={_str(outcome.alert)}")
        if outcome.detail:
            fields.append(f"detail={_str(outcome.detail[:300])}")
        tags = f"{POLICY_MEASUREMENT},node={_tag(spec.node)},policy={_tag(spec.destination)}"
        tags += f",replica={_tag(self.replica)}"
        return f"{tags} {','.join(fields)} {ts_ns}"

    def _produce(self, line: str) -> None:
        if self._producer is None:
            return
        try:
            self._producer.produce(names.TOPIC_METRICS, line.encode(), key=b"steer")
            self._producer.poll(0)
        except Exception as e:  # noqa: BLE001 - BufferError, KafkaException: counted, never fatal
            self.counts["metrics_failed"] += 1
            log.warning("metrics line not queued: %s", e)

    # ------------------------------------------------------------------ the loop
    def _consumer(self, stop: threading.Event):
        from confluent_kafka import OFFSET_END, Consumer, TopicPartition

        from segscope_kafka import kafka_config

        conf = kafka_config(
            {
                "bootstrap.servers": self.kafka,
                "group.id": f"segscope-steer-reader-{self.replica}",  # offsets never committed; the ACLs' group prefix
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
                **self.kafka_config,
            },
            error_cb=self.kafka_error_cb,
        )
        consumer = Consumer(conf)
        parts = self._metrics_partitions(consumer, stop)
        if parts is None:
            consumer.close()
            return None
        consumer.assign([TopicPartition(names.TOPIC_METRICS, p, OFFSET_END) for p in parts])
        return consumer

    def _metrics_partitions(self, consumer, stop: threading.Event):
        """The partitions of segscope.metrics; None when stopped first or Kafka refused this replica
        (a wrong password or ACL is not retried: the caller says why and exits)."""
        from confluent_kafka import KafkaException

        while not stop.is_set():
            try:
                meta = consumer.list_topics(names.TOPIC_METRICS, timeout=10)
                return list(meta.topics[names.TOPIC_METRICS].partitions)
            except KafkaException as e:
                consumer.poll(0.5)  # error callbacks (a refused login) are served by poll(), not list_topics()
                if getattr(self.kafka_error_cb, "refused", None):
                    return None
                log.warning("reading the partitions of %s: %s; trying again", names.TOPIC_METRICS, e)
                stop.wait(1.0)
        return None

    def run(self, stop: threading.Event) -> None:
        from confluent_kafka import Producer

        from segscope_kafka import kafka_config

        conf = kafka_config(
            {"bootstrap.servers": self.kafka, "linger.ms": 5, **self.kafka_config}, error_cb=self.kafka_error_cb
        )
        self._producer = Producer(conf)
        self._start_health()
        consumer = self._consumer(stop)
        if consumer is None:
            self._producer.flush(1)
            if self._health is not None:
                self._health.close()
            return
        self.leadership.start()
        next_tick = 0.0
        try:
            while not stop.is_set():
                self._follow_leadership()
                first = consumer.poll(0.1)  # wakes at the first message: the decision latency starts there
                batch = [first, *consumer.consume(500, 0)] if first is not None else []
                for msg in batch:
                    if msg.error() is None:
                        self.handle_message(msg.value() or b"", msg.timestamp()[1] / 1000.0)
                now = self.clock()
                woke = dict(self._pending)
                self._pending.clear()
                tick = time.monotonic() >= next_tick
                keys = list(self.policies) if tick else list(woke)
                keys_outcomes = self.evaluate(keys, now)
                for key, outcome in keys_outcomes:
                    if outcome.decision is not None and self._leading:
                        self.act(key, outcome, now, woke.get(key))
                    if tick and self._leading:
                        self._produce(self.policy_line(key, outcome, time.time_ns()))
                if tick:
                    next_tick = time.monotonic() + 1.0
                    self._report_health(keys_outcomes)
                    self._log_progress()
                    if self._leading and len(self._synced) < len(self.policies):
                        with self.leadership.acting() as ok:
                            if ok:
                                self._sync_active()
        finally:
            self.leadership.stop()
            consumer.close()
            self._producer.flush(5)
            for client in self.clients.values():
                client.close()
            if self._health is not None:
                self._health.close()

    def _start_health(self) -> None:
        if self.health_addr is None:
            return
        from segscope_schemas.health import Health

        self._health = Health(f"steer-{self.replica}")
        host, port = self._health.serve(self.health_addr, "--health")
        log.info("steer health on http://%s:%d/healthz (/readyz /metrics /status)", host, port)

    def _report_health(self, outcomes: list[tuple[tuple, Outcome]]) -> None:
        """Once a second: alive (the loop turns), ready (the leader election talks to Kafka: a
        standby is ready too), /metrics = this replica's steering_policy lines, the leader's included."""
        if self._health is None:
            return
        self._health.tick()
        now_ns = time.time_ns()
        self._health.set_lines("steer", [self.policy_line(key, outcome, now_ns) for key, outcome in outcomes])
        error = getattr(self.leadership, "error", None)
        if error:
            self._health.not_ready(f"leader election: {error}")
        elif getattr(self.leadership, "joined_at", 0.0) is None:
            self._health.not_ready("joining the leader election (its Kafka group)")
        else:
            self._health.ok()

    def _log_progress(self) -> None:
        """Every 10 s: what was read and what the evaluations found (the log says why nothing moves)."""
        now = time.monotonic()
        if now < getattr(self, "_next_progress", 0.0):
            return
        self._next_progress = now + 10.0
        states = {k[6:]: v for k, v in sorted(self.counts.items()) if k.startswith("state_")}
        log.info(
            "points used %d, incomplete %d, bad lines %d; evaluations %s",
            self.counts["points"],
            self.counts["incomplete_points"],
            self.counts["bad_lines"],
            states,
        )

    def _follow_leadership(self) -> None:
        leading = self.leadership.leading()
        if leading and not self._leading:
            log.warning("replica %s leads the policy set: reading the steered policies from their agents", self.replica)
            self._synced.clear()
        elif not leading and self._leading:
            log.warning("replica %s stands by", self.replica)
        self._leading = leading
