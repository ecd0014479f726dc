"""Path records on `segscope.paths`: which SID list a STAMP session or flow monitor side travels
(schemas/paths.md). Key `stamp/<node>/<ssid>/<role>` or `flow/<node>/<flow_id>/<side>`, value one
JSON object, or null (a tombstone: deleted).

    key, value = encode(PathRecord.stamp("A", 1, "sender", ["fc00:2::e"], [], ts_ns))
    record = decode(key, value)          # None for a tombstone; MalformedPathRecord if bad
    path_tag(record)                     # "fc00:2::e": the `path` tag of stamp_delay / altmark_loss
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

VERSION = 1
STAMP, FLOW = "stamp", "flow"
ROLES = ("sender", "reflector")
SIDES = ("tx", "rx")
METHODS = ("dscp", "rfc9343")
# tag values for an empty SID list, as the agent's inventory lines write them
NO_SIDS = {STAMP: "direct", FLOW: "flowmonid"}


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

    @classmethod
    def stamp(cls, node: str, ssid: int, role: str, path, return_path, ts_ns: int) -> PathRecord:
        return cls(STAMP, node, int(ssid), role, tuple(path), int(ts_ns), return_path=tuple(return_path))

    @classmethod
    def flow(cls, node: str, flow_id: int, side: str, path, method: str, period_ms: int, ts_ns: int) -> PathRecord:
        return cls(FLOW, node, int(flow_id), side, tuple(path), int(ts_ns), method=method, period_ms=int(period_ms))

    @property
    def key(self) -> str:
        return record_key(self.kind, self.node, self.ident, self.role)

    def same_route(self, other: PathRecord | None) -> bool:
        """Equal but for the publication time (the agent republishes only what changed)."""
        return other is not None and self == dataclasses.replace(other, ts_ns=self.ts_ns)


def record_key(kind: str, node: str, ident: int, role: str) -> str:
    return f"{kind}/{node}/{ident}/{role}"


def path_tag(record: PathRecord) -> str:
    """The `path` tag value (unescaped): SIDs joined by ',', or `direct` / `flowmonid` without SIDs."""
    return sids_tag(record.kind, record.path)


def sids_tag(kind: str, sids) -> str:
    """path_tag of a SID list of a `stamp` or `flow` record (the agent's inventory lines use it)."""
    return ",".join(sids) or NO_SIDS[kind]


def encode(record: PathRecord) -> tuple[bytes, bytes]:
    """(key, value) of the Kafka message; checks the record as decode() would."""
    _check(record)
    value = {"v": VERSION, "kind": record.kind, "node": record.node, "path": list(record.path), "ts_ns": record.ts_ns}
    if record.kind == STAMP:
        value.update(ssid=record.ident, role=record.role, return_path=list(record.return_path))
    else:
        value.update(flow_id=record.ident, side=record.role, method=record.method, period_ms=record.period_ms)
    return record.key.encode(), json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def tombstone(kind: str, node: str, ident: int, role: str) -> tuple[bytes, None]:
    return record_key(kind, node, ident, role).encode(), None


def decode(key: bytes | None, value: bytes | None) -> PathRecord | None:
    """The record of one message, None for a tombstone (the key must still be well-formed: the
    reader needs it to forget the right entry). MalformedPathRecord(reason, detail) otherwise."""
    if key is None:
        raise MalformedPathRecord("no_key", "a path record needs its key")
    try:
        k = key.decode()
    except UnicodeDecodeError:
        raise MalformedPathRecord("bad_key", f"key is not UTF-8: {key[:80]!r}") from None
    parts = k.split("/")
    if len(parts) != 4 or parts[0] not in (STAMP, FLOW) or not parts[1] or not parts[2].isdigit():
        raise MalformedPathRecord(
            "bad_key", f"expected stamp/<node>/<ssid>/<role> or flow/<node>/<flow_id>/<side>: {k!r}"
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
        else:
            raise MalformedPathRecord("bad_field", f"kind={kind!r}")
    except KeyError as e:
        raise MalformedPathRecord("missing_field", str(e)) from None
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
]
