"""The difference between what the intent wants and what the agents report: a minimal, ordered plan.

`plan(desired, actual)` is pure (no I/O) and deterministic:
- create: in the intent, not on the node;
- update: same key, different content, and the agent can change it in place (local SIDs and
  policies: one hitless netlink replace);
- replace: same key, different content, no in-place update (STAMP sessions, flow monitors):
  destroy/stop then create (and start); an in-line monitor is stopped in the teardown phase and
  started in the second (a new IOAM node id of its node can only be set once it is stopped);
- start / stop: a STAMP session whose configuration is right but whose run state is not;
- init: a STAMP role must be initialised on a node before its first session is created;
- remove: on a node the intent names, of a kind the controller manages, not in the intent;
- reset: a node that keeps no STAMP session at all is Reset instead of destroying its sessions one
  by one (Reset also detaches the STAMP XDP programs from the node's devices);
- the node's IOAM configuration (ioam_node) is created/updated with EnableIoam before the in-line
  monitors are started, and removed (DisableIoam: the agent restores what it changed) after the
  last of the node's in-line monitors is stopped.

Order, in three phases:
1. measurement teardown: in-line monitors, flow monitors and STAMP sessions that go away (ingress
   before egress, TX before RX, sender before reflector), resets, then IOAM configurations that
   go away, before anything new is created;
2. every create/update/replace/start/stop/init in dependency order: local SIDs, policies,
   reflector sessions, sender sessions, RX flow monitors, TX flow monitors (inside a kind by
   node, then key);
3. SRv6 removals, policies before local SIDs. Routing is made before it is broken, so a policy
   moving to a new SID keeps forwarding.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.model import KIND_RANK, STAMP_ROLE_OF, UPDATABLE, DesiredState, Resource, StampInit

ACTIONS = ("init", "create", "update", "replace", "start", "stop", "remove", "reset")
MEASUREMENT = ("ioam_node", "stamp_reflector", "stamp_sender", "flow_rx", "flow_tx", "inline_egress", "inline_ingress")
# replaced by a stop in the teardown phase and a start in the second (not one op in the second)
REPLACE_BY_TEARDOWN = {"inline_egress", "inline_ingress"}


@dataclass(frozen=True)
class Op:
    action: str  # one of ACTIONS
    kind: str  # model.KINDS, or "stamp_init"
    node: str
    key: tuple
    desired: Resource | None = None  # create/update/replace/start/stop
    actual: Resource | None = None  # update/replace/stop/remove
    init: StampInit | None = None  # init

    def describe(self) -> str:
        what = {
            "local_sid": "local SID",
            "policy": "policy",
            "stamp_reflector": "STAMP reflector session",
            "stamp_sender": "STAMP sender session",
            "flow_rx": "flow monitor RX",
            "flow_tx": "flow monitor TX",
            "ioam_node": "IOAM configuration",
            "inline_egress": "in-line monitor EGRESS",
            "inline_ingress": "in-line monitor INGRESS",
            "stamp_init": "STAMP init",
            "stamp_reset": "STAMP reset (every session, datapath detached)",
        }[self.kind]
        key = " ".join(str(k) for k in self.key)
        text = f"{self.action:<7} {self.node:<6} {what} {key}"
        if self.action in ("update", "replace") and self.desired and self.actual:
            old, new = self.actual.fields, self.desired.fields
            changed = [f"{k}: {_short(old.get(k))} -> {_short(new.get(k))}" for k in new if old.get(k) != new.get(k)]
            text += " (" + "; ".join(changed) + ")"
        if self.action == "init" and self.init:
            i = self.init
            text += f" dev {i.device}" + (
                f" source {i.source_address}" if i.role == "sender" else f" addresses {','.join(i.addresses)}"
            )
        return text

    def to_json(self) -> dict:
        out = {"action": self.action, "kind": self.kind, "node": self.node, "key": list(self.key)}
        if self.desired is not None:
            out["spec"] = _jsonable(self.desired.fields)
        if self.actual is not None and self.action in ("update", "replace"):
            out["previous"] = _jsonable(self.actual.fields)
        return out


def _short(value) -> str:
    return ",".join(value) if isinstance(value, tuple) and all(isinstance(v, str) for v in value) else str(value)


def _jsonable(fields: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}


def _needs_start(want: Resource, have: Resource) -> bool:
    if not want.running or have.running:
        return False
    # a finite run that has run its course is done: the intent is satisfied, do not repeat it
    return not (want.finite and have.finished)


def plan(desired: DesiredState, actual: dict[tuple, Resource]) -> list[Op]:
    """Operations that turn `actual` (what the agents of desired.nodes report) into `desired`."""
    forward: list[tuple[tuple, Op]] = []
    replaced_by_teardown: list[Resource] = []
    for ident, want in desired.resources.items():
        have = actual.get(ident)
        if have is None:
            forward.append((_rank(want, 1), Op("create", want.kind, want.node, want.key, desired=want)))
            if want.running:
                forward.append((_rank(want, 3), Op("start", want.kind, want.node, want.key, desired=want)))
        elif have.spec in desired.steered.get(ident, ()):
            continue  # a steered policy on one of its candidates: segscope-steer's choice stands
        elif have.spec != want.spec and want.kind in REPLACE_BY_TEARDOWN:
            forward.append((_rank(want, 1), Op("create", want.kind, want.node, want.key, desired=want)))
            replaced_by_teardown.append(have)
        elif have.spec != want.spec:
            action = "update" if want.kind in UPDATABLE else "replace"
            forward.append((_rank(want, 1), Op(action, want.kind, want.node, want.key, desired=want, actual=have)))
            if action == "replace" and want.running:
                forward.append((_rank(want, 3), Op("start", want.kind, want.node, want.key, desired=want)))
        elif want.running is not None:
            if _needs_start(want, have):
                forward.append((_rank(want, 3), Op("start", want.kind, want.node, want.key, desired=want, actual=have)))
            elif not want.running and have.running:
                forward.append((_rank(want, 3), Op("stop", want.kind, want.node, want.key, desired=want, actual=have)))
    # Init where a role gets a new or replaced session. Init is idempotent on the agent and is the
    # only way to learn whether the node's role was initialised with the same device and addresses
    # (a different configuration is refused: FAILED_PRECONDITION "Reset first"), so it is called
    # even when the node already has sessions of that role; a plan with nothing to create makes
    # no call at all.
    roles_needed = {
        (op.node, STAMP_ROLE_OF[op.kind])
        for _, op in forward
        if op.kind in STAMP_ROLE_OF and op.action in ("create", "replace")
    }
    for node, role in sorted(roles_needed):
        kind = "stamp_reflector" if role == "reflector" else "stamp_sender"
        for (n, r, dev), init in sorted(desired.inits.items()):
            if (n, r) == (node, role):  # every device of the role (a multi-homed node has several)
                rank = (0, KIND_RANK[kind], node, 0, (dev,), 0)
                forward.append((rank, Op("init", "stamp_init", node, (role, dev), init=init)))
    managed = set(desired.nodes)
    stamp_nodes_wanted = {r.node for r in desired.resources.values() if r.kind in STAMP_ROLE_OF}
    removals = [have for ident, have in actual.items() if ident not in desired.resources and have.node in managed]
    removals += replaced_by_teardown
    reset_nodes = sorted({r.node for r in removals if r.kind in STAMP_ROLE_OF} - stamp_nodes_wanted)
    backward: list[tuple[tuple, Op]] = []
    for node in reset_nodes:
        backward.append(((-1, -KIND_RANK["stamp_sender"], node, 0, (), 0), Op("reset", "stamp_reset", node, ())))
    for have in removals:
        if have.kind in STAMP_ROLE_OF and have.node in reset_nodes:
            continue  # the node's Reset destroys it
        phase = -1 if have.kind in MEASUREMENT else 1
        backward.append(
            (
                (phase, -KIND_RANK[have.kind], have.node, 1, have.key, 0),
                Op("remove", have.kind, have.node, have.key, actual=have),
            )
        )
    return [op for _, op in sorted(forward + backward, key=lambda item: item[0])]


def _rank(r: Resource, step: int) -> tuple:
    return (0, KIND_RANK[r.kind], r.node, 1, r.key, step)
