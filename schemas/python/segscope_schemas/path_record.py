"""Path records on `segscope.paths`: which SID list a STAMP session, flow monitor side or in-line
monitor side travels, and what a node's IOAM identity is (schemas/paths.md). Key
`stamp/<node>/<ssid>/<role>`, `flow/<node>/<flow_id>/<side>`, `inline/<node>/<flow_id>/<side>` or
`ioam/<node>`, value one JSON object, or null (a tombstone: deleted).

    key, value = encode(PathRecord.stamp("A", 1, "sender", ["fc00:2::e"], [], ts_ns))
    record = decode(key, value)          # None for a tombstone; MalformedPathRecord if bad
    path_tag(record)                     # "fc00:2::e": the `path` tag of stamp_delay / altmark_loss
    encode(IoamNode("R", 7, (IoamInterface("r0", 70),), (1,), ("fc00:2::e",), ts_ns))
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

VERSION = 1
STAMP, FLOW, INLINE, IOAM = "stamp", "flow", "inline", "ioam"
ROLES = ("sender", "reflector")
SIDES = ("tx", "rx")
METHODS = ("dscp", "rfc9343")
# tag values for an empty SID list, as the agent's inventory lines write them
NO_SIDS = {STAMP: "direct", FLOW: "flowmonid", INLINE: "direct"}
IOAM_NODE_ID_MAX = 0xFFFFFF  # 24-bit IOAM node id (RFC 9197 short format)
IOAM_IF_ID_MAX = 0xFFFE  # 16-bit interface id; 0xffff means "unavailable" on the wire
IOAM_TRACE_NODES_MAX = 12  # schemas/IOAM.md: the ingress reserves 1..12 node entries


class MalformedPathRecord(ValueError):
    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


@dataclass(frozen=True)
class PathRecord:
    kind: str  # "stamp" | "flow"
    node: str
    ident: int  # ssid (stamp) or flow_id (flow)
    role: str  # "sender" | "reflector" (stamp) or "tx" | "rx" (flow)
    path: tuple[str, ...]
    ts_ns: int
    return_path: tuple[str, ...] = ()  # stamp only
    method: str = ""  # flow only
    period_ms: int = 0  # flow only
    namespace: int = 0  # inline only: IOAM Namespace-ID of the trace and E2E options
    trace_nodes: int = 0  # inline only: node entries the ingress reserves (ingress included)
    sampling: int = 0  # inline only: 1 in `sampling` packets of the flow carries the options
    # inline only: at most one packet per `sample_interval_us` carries them (then sampling is 0);
    # written only when set, so records of "1 in N" monitors are as before
    sample_interval_us: int = 0

    @classmethod
    def stamp(cls, node: str, ssid: int, role: str, path, return_path, ts_ns: int) -> PathRecord:
        return cls(STAMP, node, int(ssid), role, tuple(path), int(ts_ns), return_path=tuple(return_path))

    @classmethod
    def flow(cls, node: str, flow_id: int, side: str, path, method: str, period_ms: int, ts_ns: int) -> PathRecord:
        return cls(FLOW, node, int(flow_id), side, tuple(path), int(ts_ns), method=method, period_ms=int(period_ms))

    @classmethod
    def inline(
        cls,
        node: str,
        flow_id: int,
        side: str,
        path,
        namespace: int,
        trace_nodes: int,
        sampling: int,
        ts_ns: int,
        sample_interval_us: int = 0,
    ) -> PathRecord:
        """side "tx" = the ingress (ioam_tx, the monitor's parameters), "rx" = the egress (ioam_rx:
        trace_nodes and the sampling are the ingress's, 0 when the egress does not know them)."""
        return cls(
            INLINE, node, int(flow_id), side, tuple(path), int(ts_ns),
            namespace=int(namespace), trace_nodes=int(trace_nodes), sampling=int(sampling),
            sample_interval_us=int(sample_interval_us),
        )  # fmt: skip

    @property
    def key(self) -> str:
        return record_key(self.kind, self.node, self.ident, self.role)

    def same_route(self, other: PathRecord | None) -> bool:
        """Equal but for the publication time (the agent republishes only what changed)."""
        return other is not None and self == dataclasses.replace(other, ts_ns=self.ts_ns)


@dataclass(frozen=True)
class IoamInterface:
    """One device of an IOAM node: its IOAM interface id (net.ipv6.conf.<dev>.ioam6_id) and,
    when the agent says them, its ifindex and its global IPv6 prefixes ("fc00:12::/64")."""

    device: str
    if_id: int
    ifindex: int | None = None
    prefixes: tuple[str, ...] = ()


@dataclass(frozen=True)
class IoamNode:
    """`ioam/<node>`: a node's IOAM identity, so that the in-line processor can name the node ids
    and interface ids of a trace (processors/inline/hops.py): node id (net.ipv6.ioam6_id), its
    IOAM devices, the namespaces it fills, its local SIDs (the SRv6 endpoints it is)."""

    node: str
    node_id: int
    interfaces: tuple[IoamInterface, ...]
    namespaces: tuple[int, ...]
    sids: tuple[str, ...]
    ts_ns: int
    kind: str = IOAM

    @property
    def key(self) -> str:
        return f"{IOAM}/{self.node}"

    def same_route(self, other) -> bool:
        """Equal but for the publication time (the agent republishes only what changed)."""
        return other is not None and self == dataclasses.replace(other, ts_ns=self.ts_ns)


def record_key(kind: str, node: str, ident: int = 0, role: str = "") -> str:
    if kind == IOAM:
        return f"{IOAM}/{node}"
    return f"{kind}/{node}/{ident}/{role}"


def path_tag(record: PathRecord) -> str:
    """The `path` tag value (unescaped): SIDs joined by ',', or `direct` / `flowmonid` without SIDs."""
    return sids_tag(record.kind, record.path)


def sids_tag(kind: str, sids) -> str:
    """path_tag of a SID list of a `stamp` or `flow` record (the agent's inventory lines use it)."""
    return ",".join(sids) or NO_SIDS[kind]


def encode(record: PathRecord | IoamNode) -> tuple[bytes, bytes]:
    """(key, value) of the Kafka message; checks the record as decode() would."""
    if isinstance(record, IoamNode):
        _check_ioam(record)
        interfaces = {}
        for i in record.interfaces:
            interfaces[i.device] = {"id": i.if_id}
            if i.ifindex is not None:
                interfaces[i.device]["ifindex"] = i.ifindex
            if i.prefixes:
                interfaces[i.device]["prefixes"] = list(i.prefixes)
        value = {
            "v": VERSION, "kind": IOAM, "node": record.node, "node_id": record.node_id, "interfaces": interfaces,
            "namespaces": list(record.namespaces), "sids": list(record.sids), "ts_ns": record.ts_ns,
        }  # fmt: skip
        return record.key.encode(), json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    _check(record)
    value = {"v": VERSION, "kind": record.kind, "node": record.node, "path": list(record.path), "ts_ns": record.ts_ns}
    if record.kind == STAMP:
        value.update(ssid=record.ident, role=record.role, return_path=list(record.return_path))
    elif record.kind == INLINE:
        value.update(
            flow_id=record.ident, side=record.role, namespace=record.namespace, trace_nodes=record.trace_nodes,
            sampling=record.sampling,
        )  # fmt: skip
        if record.sample_interval_us:
            value["sample_interval_us"] = record.sample_interval_us
    else:
        value.update(flow_id=record.ident, side=record.role, method=record.method, period_ms=record.period_ms)
    return record.key.encode(), json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def tombstone(kind: str, node: str, ident: int = 0, role: str = "") -> tuple[bytes, None]:
    return record_key(kind, node, ident, role).encode(), None


def decode(key: bytes | None, value: bytes | None) -> PathRecord | IoamNode | None:
    """The record of one message, None for a tombstone (the key must still be well-formed: the
    reader needs it to forget the right entry). MalformedPathRecord(reason, detail) otherwise."""
    if key is None:
        raise MalformedPathRecord("no_key", "a path record needs its key")
    try:
        k = key.decode()
    except UnicodeDecodeError:
        raise MalformedPathRecord("bad_key", f"key is not UTF-8: {key[:80]!r}") from None
    parts = k.split("/")
    ioam_key = len(parts) == 2 and parts[0] == IOAM and bool(parts[1])
    if not ioam_key and (
        len(parts) != 4 or parts[0] not in (STAMP, FLOW, INLINE) or not parts[1] or not parts[2].isdigit()
    ):
        raise MalformedPathRecord(
            "bad_key",
            f"expected stamp/<node>/<ssid>/<role>, flow/<node>/<flow_id>/<side>, inline/<node>/<flow_id>/<side> "
            f"or ioam/<node>: {k!r}",
        )
    if value is None:
        return None
    try:
        v = json.loads(value)
    except (UnicodeDecodeError, ValueError) as e:
        raise MalformedPathRecord("bad_json", str(e)) from None
    if not isinstance(v, dict):
        raise MalformedPathRecord("not_an_object", type(v).__name__)
    if v.get("v") != VERSION:
        raise MalformedPathRecord("unsupported_version", f"v={v.get('v')!r}, this reader knows {VERSION}")
    try:
        kind = v["kind"]
        if ioam_key or kind == IOAM:
            rec = _ioam_node(v)
            if rec.key != k:
                raise MalformedPathRecord("key_mismatch", f"key {k!r} but value says {rec.key!r}")
            return rec
        if kind == INLINE:
            rec = PathRecord.inline(
                v["node"], _int(v, "flow_id"), v["side"], _sids(v, "path"), _int(v, "namespace"),
                _int(v, "trace_nodes"), _int(v, "sampling"), _int(v, "ts_ns"),
                _int(v, "sample_interval_us") if "sample_interval_us" in v else 0,
            )  # fmt: skip
        elif kind == STAMP:
            rec = PathRecord.stamp(
                v["node"], _int(v, "ssid"), v["role"], _sids(v, "path"), _sids(v, "return_path"), _int(v, "ts_ns")
            )
        elif kind == FLOW:
            rec = PathRecord.flow(
                v["node"], _int(v, "flow_id"), v["side"], _sids(v, "path"), v["method"], _int(v, "period_ms"),
                _int(v, "ts_ns"),
            )  # fmt: skip
        else:
            raise MalformedPathRecord("bad_field", f"kind={kind!r}")
    except KeyError as e:
        raise MalformedPathRecord("missing_field", str(e)) from None
    _check(rec)
    if rec.key != k:
        raise MalformedPathRecord("key_mismatch", f"key {k!r} but value says {rec.key!r}")
    return rec


def _ioam_node(v: dict) -> IoamNode:
    """The IoamNode of a decoded `ioam` value; an interface is {"id": n[, "ifindex": i][, "prefixes":
    [...]]} or just its id (n)."""
    if v.get("kind") != IOAM:
        raise MalformedPathRecord("bad_field", f"kind={v.get('kind')!r} under an ioam/ key")
    raw = v["interfaces"]
    if not isinstance(raw, dict):
        raise MalformedPathRecord("bad_field", f"interfaces={raw!r} is not an object")
    interfaces = []
    for device, spec in sorted(raw.items()):
        spec = {"id": spec} if isinstance(spec, int) and not isinstance(spec, bool) else spec
        if not isinstance(spec, dict):
            raise MalformedPathRecord("bad_field", f"interface {device!r}: {spec!r}")
        ifindex = _int(spec, "ifindex") if "ifindex" in spec else None
        prefixes = _sids(spec, "prefixes") if "prefixes" in spec else []
        interfaces.append(IoamInterface(device, _int(spec, "id"), ifindex, tuple(prefixes)))
    namespaces = v["namespaces"]
    if not isinstance(namespaces, list) or not all(isinstance(n, int) and not isinstance(n, bool) for n in namespaces):
        raise MalformedPathRecord("bad_field", f"namespaces={namespaces!r} is not a list of integers")
    rec = IoamNode(v["node"], _int(v, "node_id"), tuple(interfaces), tuple(namespaces), tuple(_sids(v, "sids")),
                   _int(v, "ts_ns"))  # fmt: skip
    _check_ioam(rec)
    return rec


def _check_ioam(r: IoamNode) -> None:
    if not isinstance(r.node, str) or not r.node or "/" in r.node:
        raise MalformedPathRecord("bad_field", f"node={r.node!r} (non-empty, no '/')")
    if not 0 <= r.node_id <= IOAM_NODE_ID_MAX:
        raise MalformedPathRecord("bad_field", f"node_id={r.node_id} (0..2^24-1)")
    for i in r.interfaces:
        if not i.device or not 0 <= i.if_id <= IOAM_IF_ID_MAX or (i.ifindex is not None and i.ifindex < 1):
            raise MalformedPathRecord(
                "bad_field", f"interface {i.device!r}: id {i.if_id} (0..65534), ifindex {i.ifindex} (>= 1)"
            )
    if len({i.if_id for i in r.interfaces}) != len(r.interfaces):
        raise MalformedPathRecord("bad_field", "two devices with one IOAM interface id")
    if not all(0 <= n <= 0xFFFF for n in r.namespaces):
        raise MalformedPathRecord("bad_field", f"namespaces={list(r.namespaces)} (0..65535)")


def _int(v: dict, name: str) -> int:
    x = v[name]
    if not isinstance(x, int) or isinstance(x, bool):
        raise MalformedPathRecord("bad_field", f"{name}={x!r} is not an integer")
    return x


def _sids(v: dict, name: str) -> list[str]:
    x = v[name]
    if not isinstance(x, list) or not all(isinstance(s, str) and s for s in x):
        raise MalformedPathRecord("bad_field", f"{name}={x!r} is not a list of SIDs")
    return x


def _check(r: PathRecord) -> None:
    if not isinstance(r.node, str) or not r.node or "/" in r.node:
        raise MalformedPathRecord("bad_field", f"node={r.node!r} (non-empty, no '/')")
    if r.kind == STAMP:
        if not 0 <= r.ident <= 0xFFFF or r.role not in ROLES:
            raise MalformedPathRecord("bad_field", f"ssid={r.ident} (0..65535), role={r.role!r} (one of {ROLES})")
    elif r.kind == INLINE:
        if not 1 <= r.ident <= 0xFFFFFFFF or r.role not in SIDES:
            raise MalformedPathRecord("bad_field", f"flow_id={r.ident} (1..2^32-1), side={r.role!r} {SIDES}")
        # tx (the ingress): its trace size and exactly one sampling rule; rx (the egress) does not
        # know them: 0, or the ingress's values
        tx = r.role == "tx"
        modes = (r.sampling > 0) + (r.sample_interval_us > 0)
        if (
            not 0 <= r.namespace <= 0xFFFF
            or not (1 if tx else 0) <= r.trace_nodes <= IOAM_TRACE_NODES_MAX
            or r.sampling < 0
            or r.sample_interval_us < 0
            or (tx and modes != 1)
        ):
            raise MalformedPathRecord(
                "bad_field",
                f"namespace={r.namespace} (0..65535), trace_nodes={r.trace_nodes} ({1 if tx else 0}.."
                f"{IOAM_TRACE_NODES_MAX}), sampling={r.sampling} / sample_interval_us={r.sample_interval_us} "
                f"({'exactly one >= 1' if tx else '>= 0'})",
            )
    elif r.kind == FLOW:
        if not 1 <= r.ident <= 0xFFFFFFFF or r.role not in SIDES or r.method not in METHODS:
            raise MalformedPathRecord(
                "bad_field", f"flow_id={r.ident} (1..2^32-1), side={r.role!r} {SIDES}, method={r.method!r} {METHODS}"
            )
        if r.period_ms < 1:
            raise MalformedPathRecord("bad_field", f"period_ms={r.period_ms} (>= 1)")
    else:
        raise MalformedPathRecord("bad_field", f"kind={r.kind!r}")
    if any("," in s for s in r.path + r.return_path):
        raise MalformedPathRecord("bad_field", "a SID holds ',' (the tag joins SIDs with ',')")


# (key, value, the decoded record or None for a tombstone). tests/schemas/test_path_record.py checks
# decode(key, value) == record and encode(record) == (key, value) byte for byte.
VECTORS = [
    (
        b"stamp/A/1/sender",
        b'{"kind":"stamp","node":"A","path":["fc00:2::e"],"return_path":[],"role":"sender","ssid":1,'
        b'"ts_ns":1795306905000000000,"v":1}',
        PathRecord.stamp("A", 1, "sender", ["fc00:2::e"], [], 1795306905000000000),
    ),
    (
        b"stamp/edge router 1/65535/reflector",
        b'{"kind":"stamp","node":"edge router 1","path":[],"return_path":["fc00:1::e","fc00:9::1"],'
        b'"role":"reflector","ssid":65535,"ts_ns":1,"v":1}',
        PathRecord.stamp("edge router 1", 65535, "reflector", [], ["fc00:1::e", "fc00:9::1"], 1),
    ),
    (
        b"flow/A/7/tx",
        b'{"flow_id":7,"kind":"flow","method":"dscp","node":"A","path":["fc00:2::e","fc00:3::d6"],'
        b'"period_ms":1000,"side":"tx","ts_ns":1795306905000000000,"v":1}',
        PathRecord.flow("A", 7, "tx", ["fc00:2::e", "fc00:3::d6"], "dscp", 1000, 1795306905000000000),
    ),
    (b"flow/B/7/rx", None, None),
    (
        b"inline/A/7/tx",
        b'{"flow_id":7,"kind":"inline","namespace":1,"node":"A","path":["fc00:2::e","fc00:3::d6"],"sampling":100,'
        b'"side":"tx","trace_nodes":4,"ts_ns":1795306905000000000,"v":1}',
        PathRecord.inline("A", 7, "tx", ["fc00:2::e", "fc00:3::d6"], 1, 4, 100, 1795306905000000000),
    ),
    (
        b"ioam/R",
        b'{"interfaces":{"r0":{"id":70,"ifindex":2697,"prefixes":["fc00:12::/64"]},"r1":{"id":71}},"kind":"ioam",'
        b'"namespaces":[1],"node":"R","node_id":7,"sids":["fc00:2::e"],"ts_ns":1795306905000000000,"v":1}',
        IoamNode(
            "R",
            7,
            (IoamInterface("r0", 70, 2697, ("fc00:12::/64",)), IoamInterface("r1", 71)),
            (1,),
            ("fc00:2::e",),
            1795306905000000000,
        ),  # fmt: skip
    ),
    (b"ioam/R", None, None),
    (
        b"inline/A/8/tx",
        b'{"flow_id":8,"kind":"inline","namespace":7,"node":"A","path":["fc00:13::e","fc00:3::d6"],'
        b'"sample_interval_us":1000,"sampling":0,"side":"tx","trace_nodes":3,"ts_ns":1795306905000000000,"v":1}',
        PathRecord.inline("A", 8, "tx", ["fc00:13::e", "fc00:3::d6"], 7, 3, 0, 1795306905000000000, 1000),
    ),
    (
        b"inline/B/8/rx",
        b'{"flow_id":8,"kind":"inline","namespace":7,"node":"B","path":["fc00:13::e","fc00:3::d6"],"sampling":0,'
        b'"side":"rx","trace_nodes":0,"ts_ns":1795306905000000000,"v":1}',
        PathRecord.inline("B", 8, "rx", ["fc00:13::e", "fc00:3::d6"], 7, 0, 0, 1795306905000000000),
    ),
]
