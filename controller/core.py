"""The controller as a library: read every agent, plan, apply, and keep the channels open.

    from controller.core import Controller
    with Controller.from_file("controller/examples/demo_line5.yaml") as ctl:
        result = ctl.apply()            # ApplyResult: ops done, RPCs made per node
        ctl.apply().mutating_calls      # {} : nothing left to do

scripts/demo.py, the e2e test and bench/config_ops.py use it; `python -m controller` wraps it.
"""

from __future__ import annotations

import collections
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from controller.agents import READ_METHODS, AgentClient, AgentError
from controller.diff import Op, plan
from controller.intent import Intent, load_intent
from controller.model import DesiredState, Resource, desired_state
from segscope_proto.segscope.agent.v1 import stamp_pb2

# a sender that cannot start (its UDP port taken, a device gone) exits well within this
SENDER_SETTLE_S = 1.0


@dataclass
class ApplyResult:
    ops: list[Op] = field(default_factory=list)  # planned, in order
    done: list[tuple[Op, list[str]]] = field(default_factory=list)  # executed: op + RPCs it made
    failed: tuple[Op, AgentError] | None = None
    # programs the applied calls started that exited with an error at once ("node: what: why")
    program_errors: list[str] = field(default_factory=list)
    calls: dict[str, dict[str, int]] = field(default_factory=dict)  # node -> RPC name -> count (reads too)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.failed is None and not self.program_errors

    @property
    def mutating_calls(self) -> dict[str, dict[str, int]]:
        out = {}
        for node, calls in self.calls.items():
            changed = {m: n for m, n in calls.items() if m not in READ_METHODS}
            if changed:
                out[node] = changed
        return out

    def to_json(self) -> dict:
        return {
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "planned": [op.to_json() for op in self.ops],
            "done": [{**op.to_json(), "rpcs": rpcs} for op, rpcs in self.done],
            "failed": None
            if self.failed is None
            else {**self.failed[0].to_json(), "error": str(self.failed[1]), "code": self.failed[1].code},
            "program_errors": self.program_errors,
            "calls": self.calls,
            "mutating_calls": self.mutating_calls,
        }


def _groups(ops: list[Op], batch: bool) -> list[list[Op]]:
    """Consecutive SRv6 ops with the same node and kind form one group when batching."""
    groups: list[list[Op]] = []
    for op in ops:
        if (
            batch
            and groups
            and op.kind in ("local_sid", "policy")
            and groups[-1][0].kind == op.kind
            and groups[-1][0].node == op.node
        ):
            groups[-1].append(op)
        else:
            groups.append([op])
    return groups


class Controller:
    """Owns one AgentClient (one persistent mTLS channel) per node of the intent."""

    def __init__(self, intent: Intent, connect_timeout_s: float = 10.0):
        self.intent = intent
        self.connect_timeout_s = connect_timeout_s
        self.clients: dict[str, AgentClient] = {}

    @classmethod
    def from_file(cls, path: str | Path, **kw) -> "Controller":
        return cls(load_intent(path), **kw)

    def __enter__(self) -> "Controller":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
        self.clients.clear()

    def set_intent(self, intent: Intent) -> None:
        """Switch to another intent, keeping the channels of nodes both have."""
        for name in list(self.clients):
            if name not in intent.nodes or intent.nodes[name] != self.clients[name].node:
                self.clients.pop(name).close()
        self.intent = intent

    def client(self, node: str) -> AgentClient:
        if node not in self.clients:
            client = AgentClient(self.intent.nodes[node])
            client.wait_ready(self.connect_timeout_s)
            self.clients[node] = client
        return self.clients[node]

    def calls_snapshot(self) -> dict[str, collections.Counter]:
        return {n: collections.Counter(c.counter.calls) for n, c in self.clients.items()}

    # ------------------------------------------------------------------ read / plan / apply
    def read(self) -> dict[tuple, Resource]:
        """What every node of the intent reports (read in parallel: one thread per agent)."""
        nodes = sorted(self.intent.nodes)
        for node in nodes:
            self.client(node)
        with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
            states = list(pool.map(lambda n: self.clients[n].read_state(), nodes))
        actual: dict[tuple, Resource] = {}
        for state in states:
            actual.update(state)
        return actual

    def desired(self) -> DesiredState:
        return desired_state(self.intent)

    def plan(self) -> list[Op]:
        return plan(self.desired(), self.read())

    def _started_programs_failed(self, done: list[Op]) -> list[str]:
        """A started STAMP sender whose program exits at once (a port in use, a bad device) is an
        apply that did not work: look at the senders this apply started after SENDER_SETTLE_S."""
        started = {(op.node, op.key[-1]) for op in done if op.kind == "stamp_sender" and op.desired is not None}
        if not started:
            return []
        time.sleep(SENDER_SETTLE_S)
        errors = []
        for node in sorted({n for n, _ in started}):
            client = self.clients[node]
            for st in client.call(client.stamp, "ListStampSessions", stamp_pb2.ListStampSessionsRequest()).sessions:
                if (node, st.session.ssid) in started and st.state == stamp_pb2.STAMP_SESSION_STATE_FAILED:
                    errors.append(f"{node}: STAMP sender ssid {st.session.ssid} failed: {st.error}")
        return errors

    def apply(self, batch: bool = False) -> ApplyResult:
        """Carry out the plan, one RPC per call; batch=True sends each run of SRv6 operations of
        one kind on one node (e.g. 50 local SIDs on R) as ONE ApplyBatch call, in the same order."""
        t0 = time.monotonic()
        before = self.calls_snapshot()
        result = ApplyResult()
        try:
            result.ops = self.plan()
            for group in _groups(result.ops, batch):
                client = self.clients[group[0].node]
                if len(group) > 1:
                    ok, exc = client.execute_batch(group)
                    result.done += [(op, ["ApplyBatch"]) for op in group[:ok]]
                    if exc is not None:
                        result.failed = (group[ok], exc)
                        break
                    continue
                op = group[0]
                try:
                    rpcs = client.execute(op)
                except AgentError as exc:
                    result.failed = (op, exc)
                    break
                result.done.append((op, rpcs))
            if result.failed is None:
                result.program_errors = self._started_programs_failed([op for op, _ in result.done])
        finally:
            after = self.calls_snapshot()
            for node, calls in after.items():
                diff = calls - before.get(node, collections.Counter())
                if diff:
                    result.calls[node] = dict(sorted(diff.items()))
            result.seconds = time.monotonic() - t0
        return result
