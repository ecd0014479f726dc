"""Desired state: the intent flattened into per-node resources, in the agents' own terms.

A Resource is one object an agent keeps, under the key the agent uses for it (srv6.proto,
stamp.proto, flowmon.proto, inline.proto): a local SID (sid, table), a policy (destination,
table), a STAMP session (role, ssid), a flow monitor (side, flow_id), the node's IOAM
configuration (one per node), an in-line monitor (side, flow_id). `spec` holds every field the controller
sets, normalised (canonical addresses, defaults filled in) so that a Resource built from the
intent and one built from what an agent reports compare equal exactly when nothing needs doing.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from controller.intent import MAX_TRACE_NODES as MAX_INLINE_TRACE_NODES
from controller.intent import Intent, steered_sid_lists

# Kinds in dependency order: SIDs before the policies that steer onto them, policies before the
# sessions and flows that travel over them; a reflector before its sender, an RX side (egress,
# counting) before its TX side (ingress, colouring); a node's IOAM configuration (its node id goes
# into the in-line monitors' records) before the in-line monitors, the egress side (recording)
# before the ingress side (instrumenting). Removals go in the reverse order.
KINDS = (
    "local_sid",
    "policy",
    "ioam_node",
    "stamp_reflector",
    "stamp_sender",
    "flow_rx",
    "flow_tx",
    "inline_egress",
    "inline_ingress",
)
KIND_RANK = {k: i for i, k in enumerate(KINDS)}
# the agent changes these in place (hitless netlink replace; EnableIoam makes the node's IOAM
# state exactly the new one)
UPDATABLE = {"local_sid", "policy", "ioam_node"}
IOAM_KEY = ("ioam",)
STAMP_ROLE_OF = {"stamp_reflector": "reflector", "stamp_sender": "sender"}
MAIN_TABLE = 254
DEFAULT_METRIC = 1024  # what the kernel gives an IPv6 route with metric 0
STAMP_PORT = 862


@dataclass(frozen=True)
class Resource:
    kind: str
    node: str
    key: tuple
    spec: tuple  # sorted (field, value) pairs, comparable
    running: bool | None = None  # STAMP sessions: desired / reported running
    finished: bool = False  # reported: a finite run that has stopped
    finite: bool = False  # desired: a finite run (duration_s > 0)
    duration_s: float = 0.0

    @property
    def ident(self) -> tuple:
        return (self.kind, self.node, self.key)

    @property
    def fields(self) -> dict[str, Any]:
        return dict(self.spec)


@dataclass(frozen=True)
class StampInit:
    """What Init must be given on one node for one role (stamp.proto InitRequest)."""

    node: str
    role: str  # sender | reflector
    device: str
    source_address: str = ""  # sender
    addresses: tuple[str, ...] = ()  # reflector
    udp_port: int = STAMP_PORT


@dataclass
class DesiredState:
    nodes: list[str]
    resources: dict[tuple, Resource] = field(default_factory=dict)
    inits: dict[tuple[str, str, str], StampInit] = field(default_factory=dict)  # (node, role, device)
    # steered policies (ident -> every spec it may have: one per candidate SID list): segscope-steer
    # moves them between candidates, the plan leaves any of those alone
    steered: dict[tuple, set[tuple]] = field(default_factory=dict)

    def add(self, r: Resource) -> None:
        self.resources[r.ident] = r


def canon_ip(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return text


def canon_prefix(text: str) -> str:
    try:
        return str(ipaddress.ip_network(text, strict=False))
    except ValueError:
        return text


def spec(**fields: Any) -> tuple:
    return tuple(sorted(fields.items()))


def segs(values) -> tuple[str, ...]:
    return tuple(canon_ip(v) for v in values)


# ------------------------------------------------------------------ normalised specs
# Each takes plain values, so the intent side and the agent side share one definition.


def local_sid_spec(
    action: str, dev: str, lookup_table: int, nh6: str, nh4: str, sids, count: bool, flavors=(), lblen=0, nflen=0
) -> tuple:
    return spec(
        action=action,
        dev=dev,
        lookup_table=int(lookup_table),
        nh6=canon_ip(nh6) if nh6 else "",
        nh4=nh4 or "",
        segs=segs(sids),
        count=bool(count),
        flavors=tuple(flavors),
        lblen=int(lblen),
        nflen=int(nflen),
    )


def canon_sid(text: str) -> str:
    """A local SID key: the address, or the locator prefix of a NEXT-C-SID SID."""
    return canon_prefix(text) if "/" in text else canon_ip(text)


def policy_spec(mode: str, sids, dev: str, metric: int) -> tuple:
    return spec(mode=mode, segs=segs(sids), dev=dev, metric=int(metric) or DEFAULT_METRIC)


def sender_spec(
    ssid: int,
    sender_address: str,
    reflector_address: str,
    sender_port: int,
    reflector_port: int,
    sids,
    rate_pps: int,
    fmt: str,
    mode: str,
    padding: int,
    reduced: bool = False,
    written: str = "",
) -> tuple:
    return spec(
        sender_address=canon_ip(sender_address),
        reflector_address=canon_ip(reflector_address),
        sender_port=int(sender_port) or 50000 + ssid,
        reflector_port=int(reflector_port) or STAMP_PORT,
        segs=segs(sids),
        rate_pps=int(rate_pps),
        format=fmt or "ptp",
        mode=mode or "unauthenticated",
        padding_bytes=int(padding),
        reduced=bool(reduced),
        written=written,
    )


def reflector_spec(sender_address: str, return_sids, mode: str, fmt: str) -> tuple:
    return spec(
        sender_address=canon_ip(sender_address),
        return_segs=segs(return_sids),
        mode=mode or "unauthenticated",
        format=fmt or "ptp",
    )


def flow_spec(
    side: str,
    dev: str,
    method: str,
    sids,
    period_ms: int,
    dmark_every: int,
    l_bit: int,
    d_bit: int,
    written: str = "",
) -> tuple:
    if method == "dscp":
        if l_bit == 0 and d_bit == 0:
            l_bit, d_bit = 0, 1  # flowmon.proto: both unset = defaults 0 and 1
        bits = (int(l_bit), int(d_bit))
    else:
        bits = ()
    if side == "rx" and method == "rfc9343":
        sids = ()  # RX rfc9343 finds the flow by FlowMonID
    return spec(
        dev=dev,
        method=method,
        segs=segs(sids),
        period_ms=int(period_ms),
        dmark_every=int(dmark_every) if side == "tx" else 0,
        dscp_bits=bits,
        written=written,
    )


def ioam_spec(node_id: int, namespaces, all_devices: bool, interfaces=()) -> tuple:
    """The node's EnableIoam configuration. The controller enables every device of a node
    (all_devices: interface id = ifindex; the agent publishes device -> id on segscope.paths)."""
    return spec(
        node_id=int(node_id),
        namespaces=tuple(sorted(int(n) for n in namespaces)),
        all_devices=bool(all_devices),
        interfaces=tuple(sorted((str(d), int(i)) for d, i in interfaces)),
    )


def inline_match(src: str, dst: str, proto: int, sport: int, dport: int) -> tuple:
    return (canon_prefix(src) if src else "", canon_prefix(dst) if dst else "", int(proto), int(sport), int(dport))


NO_MATCH = ("", "", 0, 0, 0)


def inline_spec(
    side: str,
    dev: str,
    sids,
    namespace: int,
    node_id: int,
    trace_nodes: int = 0,
    sample_every: int = 0,
    sample_interval_us: int = 0,
    match: tuple = NO_MATCH,
    alternates: tuple = (),
) -> tuple:
    """An in-line monitor side; node_id is the node's IOAM id the datapath writes (a new id means
    the monitor must be started again: its records carry it). alternates (egress only): the other
    SID lists of the flow's steered policy, recorded as the same flow."""
    ingress = side == "ingress"
    return spec(
        dev=dev,
        segs=segs(sids),
        alternates=() if ingress else tuple(segs(a) for a in alternates),
        namespace=int(namespace),
        node_id=int(node_id),
        trace_nodes=int(trace_nodes) if ingress else 0,
        sample_every=int(sample_every) if ingress else 0,
        sample_interval_us=int(sample_interval_us) if ingress else 0,
        match=tuple(match) if ingress else NO_MATCH,
    )


# ------------------------------------------------------------------ intent -> desired


def _steered_paths(intent: Intent) -> dict[tuple, tuple[tuple[str, ...], ...]]:
    """controller.intent.steered_sid_lists with canonical SIDs (the agents' form)."""
    return {(node, segs(k)): tuple(segs(p) for p in paths) for (node, k), paths in steered_sid_lists(intent).items()}


def _inline_ingress(intent: Intent, m, steered_to: tuple[str, ...] | None = None) -> Resource:
    """The INGRESS side of in-line monitor m; steered_to: as the agent reports it once its policy was
    steered to that SID list (the monitor follows the policy, its trace sized for the new path)."""
    mt = m.match
    sids = steered_to if steered_to is not None else m.segs
    trace_nodes = min(len(sids) + 1, MAX_INLINE_TRACE_NODES) if steered_to is not None else m.trace_nodes
    return Resource(
        "inline_ingress",
        m.ingress.node,
        ("ingress", m.flow_id),
        inline_spec(
            "ingress",
            m.ingress.dev,
            sids,
            m.namespace,
            intent.nodes[m.ingress.node].ioam_node_id,
            trace_nodes,
            m.sample_every,
            m.sample_interval_us,
            inline_match(mt.src, mt.dst, mt.proto, mt.sport, mt.dport),
        ),
    )


def desired_state(intent: Intent) -> DesiredState:
    """Every resource the intent asks for, on every node it names (pure)."""
    d = DesiredState(nodes=sorted(intent.nodes))
    for s in intent.local_sids:
        d.add(
            Resource(
                "local_sid",
                s.node,
                (canon_sid(s.sid), s.table),
                local_sid_spec(
                    s.action, s.dev, s.lookup_table, s.nh6, s.nh4, s.segs, s.count, s.flavors, s.lblen, s.nflen
                ),
            )
        )
    for p in intent.policies:
        d.add(
            Resource(
                "policy", p.node, (canon_prefix(p.destination), p.table), policy_spec(p.mode, p.segs, p.dev, p.metric)
            )
        )
    for s in getattr(intent, "steering", ()):
        policy = next(p for p in intent.policies if (p.node, canon_prefix(p.destination), p.table) == s.key)
        ident = ("policy", s.node, (canon_prefix(s.destination), s.table))
        d.steered[ident] = {policy_spec(policy.mode, c.segs, policy.dev, policy.metric) for c in s.candidates}
    reflector_addrs: dict[str, set[str]] = {}
    for s in intent.stamp_sessions:
        finite = s.duration_s > 0
        d.add(
            Resource(
                "stamp_reflector",
                s.reflector.node,
                ("reflector", s.ssid),
                reflector_spec(s.sender.address, s.return_segs, s.mode, s.format),
                running=True,
            )
        )
        d.add(
            Resource(
                "stamp_sender",
                s.sender.node,
                ("sender", s.ssid),
                sender_spec(
                    s.ssid,
                    s.sender.address,
                    s.reflector.address,
                    0,
                    0,
                    s.segs,
                    s.rate_pps,
                    s.format,
                    "unauthenticated",
                    s.padding_bytes,
                    s.reduced,
                    s.written,
                ),  # the sender sends unauthenticated packets (stamp.proto)
                running=s.start,
                finite=finite,
                duration_s=s.duration_s,
            )
        )
        # one Init per (node, role, device): a node may send or reflect on several devices
        d.inits.setdefault(
            (s.sender.node, "sender", s.sender.dev),
            StampInit(s.sender.node, "sender", s.sender.dev, source_address=canon_ip(s.sender.address)),
        )
        reflector_addrs.setdefault((s.reflector.node, s.reflector.dev), set()).add(canon_ip(s.reflector.address))
    for (node, dev), addrs in reflector_addrs.items():
        d.inits[(node, "reflector", dev)] = StampInit(
            node, "reflector", dev, addresses=tuple(sorted(addrs, key=ipaddress.ip_address))
        )
    for f in intent.flows:
        d.add(
            Resource(
                "flow_rx",
                f.egress.node,
                ("rx", f.flow_id),
                flow_spec("rx", f.egress.dev, f.method, f.segs, f.period_ms, 0, f.dscp_l_bit, f.dscp_d_bit, f.written),
            )
        )
        d.add(
            Resource(
                "flow_tx",
                f.ingress.node,
                ("tx", f.flow_id),
                flow_spec(
                    "tx",
                    f.ingress.dev,
                    f.method,
                    f.segs,
                    f.period_ms,
                    f.dmark_every,
                    f.dscp_l_bit,
                    f.dscp_d_bit,
                    f.written,
                ),
            )
        )
    # in-line monitors: every node a monitored flow crosses with IOAM (its edges and the transit
    # nodes it names) gets its IOAM configuration: node id, the namespaces of those flows, every
    # device enabled
    ioam_namespaces: dict[str, set[int]] = {}
    steered_paths = _steered_paths(intent)
    for m in intent.inline_monitors:
        for node in {m.ingress.node, m.egress.node, *m.transit}:
            ioam_namespaces.setdefault(node, set()).add(m.namespace)
        # a monitor of a steered policy's SID list: one flow over every path the steer can give it
        paths = steered_paths.get((m.ingress.node, segs(m.segs)), ())
        d.add(
            Resource(
                "inline_egress",
                m.egress.node,
                ("egress", m.flow_id),
                inline_spec(
                    "egress",
                    m.egress.dev,
                    m.segs,
                    m.namespace,
                    intent.nodes[m.egress.node].ioam_node_id,
                    alternates=tuple(p for p in paths if p != segs(m.segs)),
                ),
            )
        )
        ingress = _inline_ingress(intent, m)
        d.add(ingress)
        if paths:
            d.steered[ingress.ident] = {_inline_ingress(intent, m, p).spec for p in paths}
    for node, namespaces in sorted(ioam_namespaces.items()):
        d.add(Resource("ioam_node", node, IOAM_KEY, ioam_spec(intent.nodes[node].ioam_node_id, namespaces, True)))
    return d
