"""`segscope-controller run FILE`: keep every node at the intent, for as long as it runs.

What it does (controller/README.md, "run"):

- one replica leads (controller/leader.py: Kafka group election, or `--leader-election none`);
  the others make no call to any agent until they lead;
- the leader watches every agent of the intent over its persistent mTLS channel with the standard
  health stream (grpc.health.v1 Health/Watch): an agent that restarts breaks the stream, and the
  first SERVING of the new agent marks its node for a reconcile at once (the channels reconnect
  within a second: backoff 0.2..1 s); every node is also reconciled every `--interval` s (drift
  without a restart) and at a take-over;
- a reconcile of a node is `apply`'s read, plan and calls restricted to that node, with one
  difference: it never touches what it does not own. It creates, updates, starts and stops what
  the intent declares; it removes only what an intent it applied itself declared and the file no
  longer does (a key dropped from the file while it runs). Whatever else it finds on a node
  (another tool's policy, a session someone added) is left alone and counted (`left_alone`);
  `apply` is the command that removes;
- every change it makes is a repair: one log line, one `segscope_controller_repair` point on
  segscope.metrics (-> InfluxDB, where `status` reads them), and the `repairs` counter of its
  `segscope_controller` line (also /metrics with --health);
- the file is read again when it changes (a ConfigMap update); an invalid version is refused with
  its errors and the last valid one kept.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controller.agents import READ_METHODS, AgentClient, AgentError
from controller.diff import Op, plan
from controller.intent import Intent, IntentError, load_intent
from controller.model import STAMP_ROLE_OF, Resource, desired_state
from segscope_schemas import names

log = logging.getLogger("segscope.controller.run")

REPAIR_MEASUREMENT = "segscope_controller_repair"
STATS_MEASUREMENT = "segscope_controller"
# a restarted agent is back on the channel within this (gRPC's reconnect backoff; its default grows
# to 120 s, far too slow to repair within seconds of an agent's start)
FAST_RECONNECT = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
RETRY_S = 2.0  # a node whose reconcile failed (agent unreachable, a call refused) is tried again after this


def _lp_tag(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=").replace(" ", "\\ ")


def _lp_str(value: str) -> str:
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass
class Repair:
    """One change the running controller made to bring a node back to the intent."""

    ts_ns: int
    node: str
    action: str
    kind: str
    key: str
    what: str  # Op.describe()
    rpcs: list[str]
    reason: str  # why the node was reconciled: agent_back, periodic, take_over, intent_changed, retry
    after_agent_s: float | None  # seconds from the agent's first SERVING on a new stream to this change
    error: str = ""

    def line(self, replica: str) -> str:
        tags = (
            f"{REPAIR_MEASUREMENT},node={_lp_tag(self.node)},kind={_lp_tag(self.kind)},"
            f"action={_lp_tag(self.action)},replica={_lp_tag(replica)}"
        )
        fields = [
            f"key={_lp_str(self.key)}",
            f"what={_lp_str(self.what)}",
            f"rpcs={_lp_str(','.join(self.rpcs))}",
            f"reason={_lp_str(self.reason)}",
            f"ok={0 if self.error else 1}i",
        ]
        if self.after_agent_s is not None:
            fields.append(f"after_agent_s={self.after_agent_s:.3f}")
        if self.error:
            fields.append(f"error={_lp_str(self.error[:300])}")
        return f"{tags} {','.join(fields)} {self.ts_ns}"

    def to_json(self) -> dict:
        return {
            "time_ns": self.ts_ns,
            "node": self.node,
            "action": self.action,
            "kind": self.kind,
            "key": self.key,
            "what": self.what,
            "rpcs": self.rpcs,
            "reason": self.reason,
            "after_agent_s": self.after_agent_s,
            "error": self.error,
        }


class NodeWatch:
    """One agent's health stream: calls `mark(node, reason, back_at)` at each SERVING it gets."""

    def __init__(self, node: str, client: AgentClient, mark) -> None:
        self.node, self.client, self.mark = node, client, mark
        self.up = False
        self._stop = threading.Event()
        self._call = None
        self._thread = threading.Thread(target=self._run, name=f"watch-{node}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        stub = health_pb2_grpc.HealthStub(self.client.channel)
        broken = False
        while not self._stop.is_set():
            try:
                self._call = stub.Watch(health_pb2.HealthCheckRequest(service=""), wait_for_ready=True)
                for resp in self._call:
                    if resp.status == health_pb2.HealthCheckResponse.SERVING:
                        if not self.up:
                            self.up = True
                            if broken:
                                log.warning("agent %s is back (%s)", self.node, self.client.node.agent)
                            self.mark(self.node, "agent_back" if broken else "agent_watched", time.monotonic())
                    else:
                        self.up = False
                broken = True
            except grpc.RpcError as e:
                if self._stop.is_set():
                    break
                if self.up:
                    log.warning("agent %s went away: %s", self.node, e.code().name)
                self.up = False
                broken = True
            self._stop.wait(0.1)

    def stop(self) -> None:
        self._stop.set()
        if self._call is not None:
            self._call.cancel()
        self._thread.join(timeout=5)


@dataclass
class _Dirty:
    reason: str
    back_at: float | None = None  # monotonic time the agent came back (agent_back)
    not_before: float = 0.0


class Reconciler:
    def __init__(
        self,
        intent_path: str | Path,
        leadership,
        *,
        replica: str,
        interval_s: float = 30.0,
        kafka: str | None = None,
        stats_interval_s: float = 2.0,
        health: str | None = None,
        kafka_config: dict | None = None,
        kafka_error_cb=None,
    ) -> None:
        self.path = Path(intent_path)
        self.leadership = leadership
        self.replica = replica
        self.interval_s = interval_s
        self.kafka = kafka
        self.kafka_config = kafka_config or {}
        self.kafka_error_cb = kafka_error_cb  # a segscope_kafka.RefusalWatch (refusals stop `run`)
        self.stats_interval_s = stats_interval_s
        self.health_addr = health
        self.intent: Intent = load_intent(self.path)  # IntentError at start: exit 2
        self._file_sig = self._signature()
        self.owned: set[tuple] = set()  # idents of every resource an intent this process applied declared
        self.clients: dict[str, AgentClient] = {}
        self.watches: dict[str, NodeWatch] = {}
        self._dirty: dict[str, _Dirty] = {}
        self._cond = threading.Condition()
        self._leading = False
        self._next_full = 0.0
        self._left_alone_seen: set[tuple] = set()
        self.repairs: list[Repair] = []  # the newest 200
        self.counts = {
            "reconciles": 0,
            "repairs": 0,
            "repair_errors": 0,
            "left_alone": 0,
            "intent_reloads": 0,
            "intent_rejected": 0,
            "metrics_failed": 0,
        }
        self._rpcs_before = 0  # RPCs of clients closed since (the counter survives a stand-down)
        self._producer = None
        self._health = None

    # -- the file ----------------------------------------------------------------------------------
    def _signature(self) -> tuple:
        try:
            st = os.stat(self.path)  # follows a ConfigMap's symlink swap
            return (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            return ()

    def _maybe_reload(self) -> None:
        sig = self._signature()
        if sig == self._file_sig:
            return
        self._file_sig = sig
        try:
            new = load_intent(self.path)
        except IntentError as exc:
            self.counts["intent_rejected"] += 1
            log.error(
                "%s changed but is invalid; keeping the last valid intent:\n  %s", self.path, "\n  ".join(exc.lines)
            )
            return
        self.counts["intent_reloads"] += 1
        old_nodes = self.intent.nodes
        self.intent = new
        log.warning("%s changed: reloaded (%d nodes)", self.path, len(new.nodes))
        for name in list(self.clients):  # nodes gone or moved: drop their channel
            if name not in new.nodes or new.nodes[name] != old_nodes.get(name):
                self._drop_client(name)
        if self._leading:
            self._open_clients()
            self._mark_all("intent_changed")

    # -- dirty nodes -------------------------------------------------------------------------------
    def mark(self, node: str, reason: str, back_at: float | None = None, delay_s: float = 0.0) -> None:
        with self._cond:
            d = self._dirty.get(node)
            if d is None or reason == "agent_back":
                self._dirty[node] = _Dirty(reason, back_at, time.monotonic() + delay_s)
            self._cond.notify_all()

    def _mark_all(self, reason: str) -> None:
        for node in self.intent.nodes:
            self.mark(node, reason)

    def _take_dirty(self, timeout: float) -> dict[str, _Dirty]:
        with self._cond:
            now = time.monotonic()
            ready = {n: d for n, d in self._dirty.items() if d.not_before <= now}
            if not ready:
                self._cond.wait(timeout)
                now = time.monotonic()
                ready = {n: d for n, d in self._dirty.items() if d.not_before <= now}
            for n in ready:
                del self._dirty[n]
            return ready

    # -- leading / standing by ---------------------------------------------------------------------
    def _open_clients(self) -> None:
        for name, spec in sorted(self.intent.nodes.items()):
            if name in self.clients:
                continue
            client = AgentClient(spec, channel_options=FAST_RECONNECT)
            self.clients[name] = client
            watch = NodeWatch(name, client, self.mark)
            self.watches[name] = watch
            watch.start()

    def _drop_client(self, name: str) -> None:
        watch = self.watches.pop(name, None)
        if watch is not None:
            watch.stop()
        client = self.clients.pop(name, None)
        if client is not None:
            self._rpcs_before += sum(client.counter.calls.values())
            client.close()

    def _take_over(self) -> None:
        log.warning(
            "replica %s leads: watching %d agents, reconciling every node", self.replica, len(self.intent.nodes)
        )
        self._open_clients()
        self._mark_all("take_over")
        self._next_full = time.monotonic() + self.interval_s

    def _stand_down(self) -> None:
        for name in list(self.clients):
            self._drop_client(name)
        with self._cond:
            self._dirty.clear()

    # -- one reconcile -----------------------------------------------------------------------------
    def _reconcile(self, batch: dict[str, _Dirty]) -> None:
        self.counts["reconciles"] += 1
        intent = self.intent
        desired = desired_state(intent)
        self.owned |= set(desired.resources)
        nodes = sorted(n for n in batch if n in self.clients)
        actual: dict[tuple, Resource] = {}
        readable: set[str] = set()

        def read(name: str):
            try:
                return name, self.clients[name].read_state(), None
            except AgentError as exc:
                return name, None, exc

        with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
            for name, state, exc in pool.map(read, nodes):
                if exc is not None:
                    log.info("reconcile %s: agent not readable (%s); again in %.0f s", name, exc.code, RETRY_S)
                    self.mark(name, "retry", batch[name].back_at, delay_s=RETRY_S)
                    continue
                actual.update(state)
                readable.add(name)
        ops = [op for op in plan(desired, actual) if op.node in readable]
        ops = self._only_owned(ops, actual)
        failed: set[str] = set()
        for op in ops:
            if op.node in failed:
                continue
            d = batch[op.node]
            with self.leadership.acting() as ok:
                if not ok:  # the lead went to another replica meanwhile: nothing more from this one
                    log.warning("replica %s lost the lead in a reconcile: %d changes left to the new leader",
                                self.replica, len(ops))  # fmt: skip
                    return
                t0 = time.monotonic()
                try:
                    rpcs = self.clients[op.node].execute(op)
                    error = ""
                except AgentError as exc:
                    rpcs, error = [exc.call], str(exc)
            after = round(time.monotonic() - d.back_at, 3) if d.back_at is not None else None
            repair = Repair(
                time.time_ns(),
                op.node,
                op.action,
                op.kind,
                " ".join(str(k) for k in op.key),
                op.describe(),
                rpcs,
                d.reason,
                after,
                error,
            )
            self._report(repair, time.monotonic() - t0)
            if error:
                failed.add(op.node)
                self.mark(op.node, "retry", d.back_at, delay_s=RETRY_S)

    def _only_owned(self, ops: list[Op], actual: dict[tuple, Resource]) -> list[Op]:
        """Removals only of what an intent this process applied declared; a STAMP reset (the node keeps
        no session) becomes the removal of the owned sessions only."""
        out = []
        for op in ops:
            if op.action == "remove" and (op.kind, op.node, op.key) not in self.owned:
                self._left_alone(op.kind, op.node, op.key)
                continue
            if op.action == "reset":
                for ident, have in sorted(actual.items()):
                    if have.node != op.node or have.kind not in STAMP_ROLE_OF:
                        continue
                    if ident in self.owned:
                        out.append(Op("remove", have.kind, have.node, have.key, actual=have))
                    else:
                        self._left_alone(have.kind, have.node, have.key)
                continue
            out.append(op)
        return out

    def _left_alone(self, kind: str, node: str, key: tuple) -> None:
        ident = (kind, node, key)
        if ident not in self._left_alone_seen:
            self._left_alone_seen.add(ident)
            self.counts["left_alone"] += 1
            log.info("left alone on %s: %s %s (not in the intent, not created by this controller)", node, kind, key)

    def _report(self, r: Repair, seconds: float) -> None:
        self.repairs = (self.repairs + [r])[-200:]
        if r.error:
            self.counts["repair_errors"] += 1
            log.error("repair FAILED on %s: %s: %s", r.node, r.what, r.error)
        else:
            self.counts["repairs"] += 1
            log.warning(
                "repair on %s: %s [%s] (%s%s, %.0f ms)",
                r.node,
                r.what.strip(),
                ", ".join(r.rpcs),
                r.reason,
                f", {r.after_agent_s:.2f} s after the agent came back" if r.after_agent_s is not None else "",
                seconds * 1e3,
            )
        self._produce(r.line(self.replica))

    # -- counters ----------------------------------------------------------------------------------
    def rpc_counts(self) -> tuple[int, int]:
        """(every RPC, the changing ones) this replica made to agents since it started."""
        total, changing = self._rpcs_before, 0
        for client in list(self.clients.values()):
            calls = dict(client.counter.calls)
            total += sum(calls.values())
            changing += sum(n for m, n in calls.items() if m not in READ_METHODS and m != "Watch")
        return total, changing

    def stats_line(self) -> str:
        lead = self.leadership
        total, _ = self.rpc_counts()
        up = sum(1 for w in self.watches.values() if w.up)
        fields = {
            "leader": int(self._leading),
            **self.counts,
            "take_overs": lead.counts.get("take_overs", 0),
            "hand_overs": lead.counts.get("hand_overs", 0),
            "stalls_fenced": lead.counts.get("stalls_fenced", 0),
            "agents": len(self.intent.nodes),
            "agents_up": up,
            "rpcs": total,
        }
        body = ",".join(f"{k}={int(v)}i" for k, v in fields.items())
        return f"{STATS_MEASUREMENT},replica={_lp_tag(self.replica)} {body} {time.time_ns()}"

    def _produce(self, line: str) -> None:
        if self._producer is None:
            return
        try:
            self._producer.produce(names.TOPIC_METRICS, line.encode(), key=b"controller", on_delivery=self._delivered)
            self._producer.poll(0)
        except Exception as e:  # noqa: BLE001 - BufferError, KafkaException: counted, never fatal
            self.counts["metrics_failed"] += 1
            log.warning("metrics line not queued: %s", e)

    def _delivered(self, err, msg) -> None:
        if err is not None:
            self.counts["metrics_failed"] += 1

    # -- the loop ----------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        if self.kafka:
            from confluent_kafka import Producer

            from segscope_kafka import kafka_config

            self._producer = Producer(
                kafka_config(  # TLS / SASL from SEGSCOPE_KAFKA_* (segscope_kafka)
                    {
                        "bootstrap.servers": self.kafka,
                        "linger.ms": 5,
                        "enable.idempotence": True,
                        "acks": "all",
                        "message.timeout.ms": 600000,
                        **self.kafka_config,
                    },
                    error_cb=self.kafka_error_cb,
                )
            )
        if self.health_addr:
            from segscope_schemas.health import Health, parse_address

            self._health = Health(f"controller-{self.replica}")
            host, port = self._health.serve(parse_address(self.health_addr, "--health"), "--health")
            log.info("controller health on http://%s:%d/healthz (/readyz /metrics /status)", host, port)
        self.leadership.start()
        next_stats = 0.0
        try:
            while not stop.is_set():
                self._maybe_reload()
                leading = self.leadership.leading()
                if leading and not self._leading:
                    self._leading = True
                    self._take_over()
                elif not leading and self._leading:
                    self._leading = False
                    log.warning("replica %s stands by: no more calls to the agents", self.replica)
                    self._stand_down()
                now = time.monotonic()
                if now >= next_stats:
                    next_stats = now + self.stats_interval_s
                    line = self.stats_line()
                    self._produce(line)
                    if self._health is not None:
                        self._health.tick()
                        self._health.set_lines("controller", [line])
                        err = getattr(self.leadership, "error", None)
                        if err:
                            self._health.not_ready(f"leader election: {err}")
                        else:
                            self._health.ok()
                if not self._leading:
                    stop.wait(0.2)
                    continue
                if now >= self._next_full:
                    self._next_full = now + self.interval_s
                    self._mark_all("periodic")
                batch = self._take_dirty(0.2)
                if batch:
                    self._reconcile(batch)
        finally:
            self._stand_down()
            self.leadership.stop()
            if self._producer is not None:
                self._producer.produce(names.TOPIC_METRICS, self.stats_line().encode(), key=b"controller")
                self._producer.flush(5)
                # What Kafka did not take (a refused login) is purged and its delivery callbacks run
                # now, and the client is destroyed here: left with pending callbacks to the garbage
                # collection at the interpreter's exit, a client can crash the process (a `run` that
                # Kafka refused once exited on SIGSEGV instead of 4; confluent-kafka-python's tracker
                # has the same crash: github.com/confluentinc/confluent-kafka-python/issues/1761).
                self._producer.purge()
                self._producer.poll(0)
                self._producer = None
            if self._health is not None:
                self._health.close()
