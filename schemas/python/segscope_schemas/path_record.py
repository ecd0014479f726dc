"""Path records on `segscope.paths`: which SID list a STAMP session, flow monitor side or in-line
monitor side travels, and each node's IOAM identity (schemas/paths.md). Key
`stamp/<node>/<ssid>/<role>`, `flow/<node>/<flow_id>/<side>`, `inline/<node>/<flow_id>/<side>` or
`ioam/<node>`, value one JSON object, or null (a tombstone: deleted).

    key, value = encode(PathRecord.stamp("A", 1, "sender", ["fc00:2::e"], [], ts_ns))
    record = decode(key, value)          # None for a tombstone; MalformedPathRecord if bad
    path_tag(record)                     # "fc00:2::e": the `path` tag of stamp_delay / altmark_loss
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

VERSION = 1
STAMP, FLOW, INLINE, IOAM = "stamp", "flow", "inline", "ioam"
ROLES = ("sender", "reflector")
SIDES = ("tx", "rx")
INLINE_SIDES = ("ingress", "egress")
METHODS = ("dscp", "rfc9343")
# tag values for an empty SID list, as the agent's inventory lines write them (an in-line monitor
# always has SIDs)
NO_SIDS = {STAMP: "direct", FLOW: "flowmonid", INLINE: "unknown"}
MAX_IOAM_NODE_ID = 0xFFFFFE  # 24 bits; 0xFFFFFF is the kernel's "no id"


class MalformedPathRecord(ValueError):
    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


@dataclass(frozen=True)
class PathRecord:
    kind: str  # "stamp" | "flow" | "inline"
    node: str
    ident: int  # ssid (stamp) or flow_id (flow, inline)
    role: str  # "sender" | "reflector" (stamp), "tx" | "rx" (flow), "ingress" | "egress" (inline)
    path: tuple[str, ...]
    ts_ns: int
    return_path: tuple[str, ...] = ()  # stamp only
    method: str = ""  # flow only
    period_ms: int = 0  # flow only
    namespace: int = 0  # inline only: IOAM Namespace-ID
    trace_nodes: int = 0  # inline ingress: trace capacity in nodes (0 at the egress: not its parameter)
    sample_every: int = 0  # inline ingress: one packet in N (0: not this sampling mode, or egress)
    sample_interval_us: int = 0  # inline ingress: one packet per M us (0: likewise)

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
        sample_every: int,
        sample_interval_us: int,
        ts_ns: int,
    ) -> PathRecord:
        return cls(
            INLINE,
            node,
            int(flow_id),
            side,
            tuple(path),
            int(ts_ns),
            namespace=int(namespace),
            trace_nodes=int(trace_nodes),
            sample_every=int(sample_every),
            sample_interval_us=int(sample_interval_us),
        )

    @property
    def key(self) -> str:
        return record_key(self.kind, self.node, self.ident, self.role)

    def same_route(self, other) -> bool:
        """Equal but for the publication time (the agent republishes only what changed)."""
        return isinstance(other, PathRecord) and self == dataclasses.replace(other, ts_ns=self.ts_ns)


@dataclass(frozen=True)
class IoamIdentity:
    """A node's IOAM identity (key `ioam/<node>`): how an in-line processor names the nodes and
    links of an IOAM trace (node id -> node, (node, interface id) -> device)."""

    node: str
    node_id: int  # IOAM node id, 1..0xFFFFFE
    interfaces: tuple[tuple[str, int], ...]  # (device, IOAM interface id), sorted by device
    namespaces: tuple[int, ...]  # IOAM Namespace-IDs the node knows, sorted
    ts_ns: int
    kind: str = IOAM

    @classmethod
    def of(cls, node: str, node_id: int, interfaces, namespaces, ts_ns: int) -> IoamIdentity:
        items = interfaces.items() if isinstance(interfaces, dict) else interfaces
        return cls(
            node,
            int(node_id),
            tuple(sorted((str(d), int(i)) for d, i in items)),
            tuple(sorted(int(n) for n in namespaces)),
            int(ts_ns),
        )

    @property
    def key(self) -> str:
        return f"{IOAM}/{self.node}"

    def same_route(self, other) -> bool:
        return isinstance(other, IoamIdentity) and self == dataclasses.replace(other, ts_ns=self.ts_ns)


def record_key(kind: str, node: str, ident: int, role: str) -> str:
    return f"{kind}/{node}/{ident}/{role}"


def path_tag(record: PathRecord) -> str:
    """The `path` tag value (unescaped): SIDs joined by ',', or `direct` / `flowmonid` without SIDs."""
    return sids_tag(record.kind, record.path)


def sids_tag(kind: str, sids) -> str:
    """path_tag of a SID list of a `stamp` or `flow` record (the agent's inventory lines use it)."""
    return ",".join(sids) or NO_SIDS[kind]


def encode(record: PathRecord | IoamIdentity) -> tuple[bytes, bytes]:
    """(key, value) of the Kafka message; checks the record as decode() would."""
    if isinstance(record, IoamIdentity):
        _check_ioam(record)
        value = {
            "v": VERSION,
            "kind": IOAM,
            "node": record.node,
            "node_id": record.node_id,
            "interfaces": dict(record.interfaces),
            "namespaces": list(record.namespaces),
            "ts_ns": record.ts_ns,
        }
        return record.key.encode(), json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    _check(record)
    value = {"v": VERSION, "kind": record.kind, "node": record.node, "path": list(record.path), "ts_ns": record.ts_ns}
    if record.kind == STAMP:
        value.update(ssid=record.ident, role=record.role, return_path=list(record.return_path))
    elif record.kind == FLOW:
        value.update(flow_id=record.ident, side=record.role, method=record.method, period_ms=record.period_ms)
    else:
        value.update(
            flow_id=record.ident,
            side=record.role,
            namespace=record.namespace,
            trace_nodes=record.trace_nodes,
            sample_every=record.sample_every,
            sample_interval_us=record.sample_interval_us,
        )
    return record.key.encode(), json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def tombstone(kind: str, node: str, ident: int | None = None, role: str | None = None) -> tuple[bytes, None]:
    """The tombstone of a record; `ioam` records have no ident or role (key ioam/<node>)."""
    if kind == IOAM:
        return f"{IOAM}/{node}".encode(), None
    return record_key(kind, node, ident, role).encode(), None


def decode(key: bytes | None, value: bytes | None) -> PathRecord | IoamIdentity | None:
    """The record of one message, None for a tombstone (the key must still be well-formed: the
    reader needs it to forget the right entry). MalformedPathRecord(reason, detail) otherwise.
    A reader that only wants paths checks `isinstance(rec, PathRecord)` (or the key's kind)."""
    if key is None:
        raise MalformedPathRecord("no_key", "a path record needs its key")
    try:
        k = key.decode()
    except UnicodeDecodeError:
        raise MalformedPathRecord("bad_key", f"key is not UTF-8: {key[:80]!r}") from None
    parts = k.split("/")
    ioam_key = len(parts) == 2 and parts[0] == IOAM and parts[1]
    if not ioam_key and (
        len(parts) != 4 or parts[0] not in (STAMP, FLOW, INLINE) or not parts[1] or not parts[2].isdigit()
    ):
        raise MalformedPathRecord(
            "bad_key",
            f"expected stamp/<node>/<ssid>/<role>, flow/<node>/<flow_id>/<side>, "
            f"inline/<node>/<flow_id>/<side> or ioam/<node>: {k!r}",
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
        if kind == STAMP:
            rec = PathRecord.stamp(
                v["node"], _int(v, "ssid"), v["role"], _sids(v, "path"), _sids(v, "return_path"), _int(v, "ts_ns")
            )
        elif kind == FLOW:
            rec = PathRecord.flow(
                v["node"], _int(v, "flow_id"), v["side"], _sids(v, "path"), v["method"], _int(v, "period_ms"),
                _int(v, "ts_ns"),
            )  # fmt: skip
        elif kind == INLINE:
            rec = PathRecord.inline(
                v["node"], _int(v, "flow_id"), v["side"], _sids(v, "path"), _int(v, "namespace"),
                _int(v, "trace_nodes"), _int(v, "sample_every"), _int(v, "sample_interval_us"), _int(v, "ts_ns"),
            )  # fmt: skip
        elif kind == IOAM:
            ifs = v["interfaces"]
            if not isinstance(ifs, dict) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in ifs.values()
            ):
                raise MalformedPathRecord("bad_field", f"interfaces={ifs!r} is not a device -> interface id object")
            ns = v["namespaces"]
            if not isinstance(ns, list) or not all(isinstance(n, int) and not isinstance(n, bool) for n in ns):
                raise MalformedPathRecord("bad_field", f"namespaces={ns!r} is not a list of namespace ids")
            rec = IoamIdentity.of(v["node"], _int(v, "node_id"), ifs, ns, _int(v, "ts_ns"))
        else:
            raise MalformedPathRecord("bad_field", f"kind={kind!r}")
    except KeyError as e:
        raise MalformedPathRecord("missing_field", str(e)) from None
    if isinstance(rec, IoamIdentity):
        _check_ioam(rec)
    else:
        _check(rec)
    if rec.key != k:
        raise MalformedPathRecord("key_mismatch", f"key {k!r} but value says {rec.key!r}")
    return rec


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
    elif r.kind == FLOW:
        if not 1 <= r.ident <= 0xFFFFFFFF or r.role not in SIDES or r.method not in METHODS:
            raise MalformedPathRecord(
                "bad_field", f"flow_id={r.ident} (1..2^32-1), side={r.role!r} {SIDES}, method={r.method!r} {METHODS}"
            )
        if r.period_ms < 1:
            raise MalformedPathRecord("bad_field", f"period_ms={r.period_ms} (>= 1)")
    elif r.kind == INLINE:
        if not 1 <= r.ident <= 0xFFFFFFFF or r.role not in INLINE_SIDES or not 1 <= r.namespace <= 0xFFFF:
            raise MalformedPathRecord(
                "bad_field",
                f"flow_id={r.ident} (1..2^32-1), side={r.role!r} {INLINE_SIDES}, namespace={r.namespace} (1..65535)",
            )
        if not r.path:
            raise MalformedPathRecord("bad_field", "an in-line monitor's path has at least one SID")
        ingress = r.role == "ingress"
        modes = (r.sample_every > 0) + (r.sample_interval_us > 0)
        if ingress and (not 1 <= r.trace_nodes <= 12 or modes != 1 or r.sample_every < 0 or r.sample_interval_us < 0):
            raise MalformedPathRecord(
                "bad_field",
                f"ingress: trace_nodes={r.trace_nodes} (1..12) and exactly one of sample_every="
                f"{r.sample_every} / sample_interval_us={r.sample_interval_us} (> 0)",
            )
        if not ingress and (r.trace_nodes or r.sample_every or r.sample_interval_us):
            raise MalformedPathRecord("bad_field", "egress: trace_nodes, sample_every, sample_interval_us are 0")
    else:
        raise MalformedPathRecord("bad_field", f"kind={r.kind!r}")
    if any("," in s for s in r.path + r.return_path):
        raise MalformedPathRecord("bad_field", "a SID holds ',' (the tag joins SIDs with ',')")


def _check_ioam(r: IoamIdentity) -> None:
    if not isinstance(r.node, str) or not r.node or "/" in r.node:
        raise MalformedPathRecord("bad_field", f"node={r.node!r} (non-empty, no '/')")
    if not 1 <= r.node_id <= MAX_IOAM_NODE_ID:
        raise MalformedPathRecord("bad_field", f"node_id={r.node_id} (1..{MAX_IOAM_NODE_ID})")
    if any(not d or not 1 <= i <= 0xFFFE for d, i in r.interfaces):
        raise MalformedPathRecord("bad_field", f"interfaces={dict(r.interfaces)!r} (device -> 1..65534)")
    if len({i for _, i in r.interfaces}) != len(r.interfaces):
        raise MalformedPathRecord("bad_field", f"interfaces={dict(r.interfaces)!r}: an interface id twice")
    if any(not 1 <= n <= 0xFFFF for n in r.namespaces):
        raise MalformedPathRecord("bad_field", f"namespaces={list(r.namespaces)!r} (1..65535)")


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
        b"inline/A/101/ingress",
        b'{"flow_id":101,"kind":"inline","namespace":1,"node":"A","path":["fc00:11::e","fc00:12::e","fc00:3::d6"],'
        b'"sample_every":100,"sample_interval_us":0,"side":"ingress","trace_nodes":4,"ts_ns":1795306905000000000,"v":1}',
        PathRecord.inline(
            "A", 101, "ingress", ["fc00:11::e", "fc00:12::e", "fc00:3::d6"], 1, 4, 100, 0, 1795306905000000000
        ),
    ),
    (
        b"inline/B/101/egress",
        b'{"flow_id":101,"kind":"inline","namespace":1,"node":"B","path":["fc00:11::e","fc00:12::e","fc00:3::d6"],'
        b'"sample_every":0,"sample_interval_us":0,"side":"egress","trace_nodes":0,"ts_ns":1795306905000000000,"v":1}',
        PathRecord.inline(
            "B", 101, "egress", ["fc00:11::e", "fc00:12::e", "fc00:3::d6"], 1, 0, 0, 0, 1795306905000000000
        ),
    ),
    (
        b"ioam/R1",
        b'{"interfaces":{"r1b":12,"r1c":13},"kind":"ioam","namespaces":[1,7],"node":"R1","node_id":11259375,'
        b'"ts_ns":1795306905000000000,"v":1}',
        IoamIdentity.of("R1", 0xABCDEF, {"r1c": 13, "r1b": 12}, [7, 1], 1795306905000000000),
    ),
    (b"inline/A/101/ingress", None, None),
    (b"ioam/R1", None, None),
]
