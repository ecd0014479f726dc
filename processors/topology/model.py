"""Document model: node views + measurements -> ArangoDB documents shaped like Jalapeno's.

Pure Python (no I/O): the Faust app feeds it node views (segscope.topology) and measurement
points (stamp_delay / altmark_loss / inline_hop_delay from segscope.metrics), and asks for
documents(); the writer
upserts them by _key. The same inputs always give the same documents (no wall-clock values),
so a replay rewrites identical documents and never duplicates one. Shapes, keys and units:
schemas/topology.md.

Identity of what we learn from agents (no IGP, so no BGP-LS protocol id applies):
  protocol_id 200  "segscope" pseudo-protocol: outside the IANA BGP-LS Protocol-IDs in use (1-9),
                   so keys can never collide with the ones gobmp writes for a real IGP
  domain_id   0    (configurable), area_id "0", mt_id 2 (IPv6 unicast, as IS-IS MT-ID 2)
  router_id        the node name (stable across address changes; the loopback is `router_ip`)
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any

from processors.topology.jalapeno_sids import NOT_EXPANDED_REASONS, SidTable
from segscope_schemas.line_protocol import LineError, Point, parse_fields, parse_line, plain_field

VIEW_SCHEMA = "segscope.topology.node_view"
SUPPORTED_VIEW_VERSIONS = (1,)
PROTOCOL_NAME = "segscope"
# the agent writes proto enum names (agent/server.py); short forms are accepted too
SENDER_ROLES = {"STAMP_ROLE_SENDER", "sender"}
REFLECTOR_ROLES = {"STAMP_ROLE_REFLECTOR", "reflector"}
TX_SIDES = {"FLOW_MONITOR_SIDE_TX", "tx"}

# RFC 8986 / IANA "SRv6 Endpoint Behaviors" codes (as Jalapeno's ls_srv6_sid endpoint_behavior)
ENDPOINT_BEHAVIOR_CODES = {
    "End": 1,
    "End.X": 5,
    "End.T": 9,
    "End.DX6": 16,
    "End.DX4": 17,
    "End.DT6": 18,
    "End.DT4": 19,
    "End.DT46": 20,
    "End.DX2": 21,
}
# Every edge field segscope writes, by the timestamp that dates it: what expiry removes.
# The link's delay (from the source the precedence rule picks: schemas/topology.md) ...
DELAY_FIELDS = (
    "latency",
    "unidir_link_delay",
    "unidir_link_delay_min_max",
    "unidir_delay_variation",
    "delay_mean_us",
    "delay_measured_at_ns",
    "delay_source",
    "link_delay_source",
    "stamp_minus_inline_us",
)
# ... and each source's own value beside it, dated by its own point (one source may be stale while
# the other gives the delay)
STAMP_LINK_DELAY_FIELDS = ("stamp_link_delay", "stamp_link_delay_measured_at_ns")
INLINE_LINK_DELAY_FIELDS = ("inline_link_delay", "inline_link_delay_measured_at_ns")
LOSS_FIELDS = ("unidir_packet_loss", "unidir_packet_loss_percentage", "loss_measured_at_ns", "loss_source")
# the sources of a link's delay (link_delay_source, delay_source.kind)
STAMP_SOURCE, INLINE_SOURCE = "stamp", "inline"
# a single-hop STAMP delay gives the link's delay unless the link's in-line delay is newer by more
# than this (the session stopped): TopologyModel.stamp_precedence_ns, SEGSCOPE_TOPOLOGY_STAMP_PRECEDENCE_S
STAMP_PRECEDENCE_S = 30.0
ARANGO_KEY_RE = re.compile(r"^[A-Za-z0-9_\-:.@()+,=;$!*'%]{1,254}$")


# the measurements the model reads (a line of them starts with the name and its first tag's comma)
MEASURED_PREFIXES = ("stamp_delay,", "altmark_loss,", "inline_hop_delay,")
# which store a measured line goes to (TopologyModel.stamp, .loss, .inline)
STAMP, LOSS, INLINE = 0, 1, 2
# inline_hop_delay's tags that identify a hop of a flow (the model's key, with the flow as an int)
INLINE_KEY_TAGS = ("flow", "hop", "from_node", "from_if", "to_node", "to_if")
# What makes apply_metrics_text read a message line by line: an escape, or a line break other than
# \n (str.splitlines, the line loop's split, breaks lines on these too). Each is a one-character
# test over the message, in C; non-ASCII text (more line breaks) is always read line by line.
_LINE_LOOP_CHARS = ("\\", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e")
# a line starting with one of these (or empty) is stripped and looked at again, as the line loop does
_ODD_LINE_STARTS = " \t\x1f#"


def _plain_message(text: str) -> bool:
    if not text.isascii():
        return False
    for char in _LINE_LOOP_CHARS:
        if char in text:
            return False
    return True


def complete_is_true(raw_fields: str) -> bool:
    """plain_field(raw_fields, "complete") is True, for a field set without backslashes; False
    for anything else (an incomplete block, a broken field set: the line goes to the full path).
    String values cannot hold a field: they are emptied before splitting."""
    if '"' in raw_fields:
        pieces = raw_fields.split('"')
        if len(pieces) % 2 == 0:
            return False  # an unterminated string
        raw_fields = '""'.join(pieces[0::2])
    value = None
    for item in raw_fields.split(","):
        if item.startswith("complete="):
            value = item[9:]  # the last one counts, as in parse_fields
    return value is not None and value.lower() in ("t", "true")


def inline_key(tags: dict) -> tuple[int, str, str, str, str, str]:
    """The model's key of an inline_hop_delay point: (flow, hop, from_node, from_if, to_node, to_if).
    KeyError / ValueError when a tag is missing or the flow is not an integer (a malformed line)."""
    flow, *rest = (tags[t] for t in INLINE_KEY_TAGS)
    return (int(flow), *rest)


def is_span(key: tuple) -> bool:
    """A hop tag that is not a hop number ("1-2": a span over nodes that did not fill the trace)."""
    hop = key[1]
    return not (hop.isascii() and hop.isdigit())


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def inline_fields_valid(fields: dict) -> bool:
    """An inline_hop_delay field set as schemas/metrics.md has it: `measured` a boolean; when true, a
    packet count (integer > 0), their delay sum, and any of the other delay fields numbers. A point
    that fails is malformed (counted, never written)."""
    measured = fields.get("measured")
    if not isinstance(measured, bool):
        return False
    if not measured:
        return True
    count = fields.get("count")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1 or not _number(fields.get("sum_us")):
        return False
    return all(_number(fields[f]) for f in ("min_us", "max_us", "ipdv_mean_us") if f in fields)


class MalformedView(ValueError):
    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


@dataclass(frozen=True)
class Names:
    """Collection and graph names. Own mode creates them; jalapeno mode uses `jalapeno_*`."""

    nodes: str = "segscope_node"
    links: str = "segscope_link"
    sids: str = "segscope_srv6_sid"
    edges: str = "segscope_graph_edge"
    paths: str = "segscope_path"
    graph: str = "segscope_graph"
    jalapeno_nodes: str = "igp_node"
    # igp-graph names the edge collection like its graph (arangodb/arangodb.go, ensureGraph:
    # edgeCollectionName := graphName); "igpv6_graph_edge" exists only in its README
    jalapeno_edges: str = "igpv6_graph"
    # ip-graph's full IPv6 topology (cmd/ip-graph/main.go, --ipv6-graph); its IGP edges are copies
    # of igpv6_graph's (arangodb/igp-sync-processor.go) with the same local/remote_link_ip.
    # Empty: do not annotate it.
    jalapeno_ip_edges: str = "ipv6_graph"
    # gobmp-arango's SRv6 SID documents (gobmp LSSRv6SID, with srv6_sid_structure); empty: not read
    jalapeno_sids: str = "ls_srv6_sid"


@dataclass(frozen=True)
class Identity:
    protocol_id: int = 200
    domain_id: int = 0
    area_id: str = "0"
    mt_id: int = 2


@dataclass
class Counters:
    views_in: int = 0
    views_stale: int = 0
    malformed_views: int = 0
    points_in: int = 0
    points_stale: int = 0
    points_ignored: int = 0
    malformed_lines: int = 0
    measurements_unmapped: int = 0
    invalid_entries: int = 0
    # inline_hop_delay points of a span (hop "<first>-<last>": from a node before nodes that did not
    # fill the trace to the node after them): not one link, so on no edge
    inline_span_points: int = 0
    # held in-line hops whose newest point says measured=false (a gauge, like measurements_unmapped)
    inline_hops_not_measured: int = 0
    # jalapeno mode: SIDs of path documents that Jalapeno's SRv6 SIDs could not expand, by reason
    # (jalapeno_sids.NOT_EXPANDED_REASONS; gauges, counted at each documents())
    not_expanded_no_sid_structure: int = 0
    not_expanded_sid_structure_inconsistent: int = 0
    not_expanded_no_locator: int = 0
    not_expanded_ambiguous_locator: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def _ip(addr: str) -> ipaddress.IPv6Address:
    return ipaddress.IPv6Address(addr)


def safe_key(raw: str) -> str:
    """raw if it is a valid ArangoDB _key, else a readable prefix + hash (keys are <= 254 bytes of
    a restricted set: '/' and spaces can't appear)."""
    if ARANGO_KEY_RE.match(raw):
        return raw
    clean = re.sub(r"[^A-Za-z0-9_\-:.@()+,=;$!*'%]", "_", raw)[:200]
    return f"{clean}_{hashlib.sha1(raw.encode()).hexdigest()[:16]}"


def validate_view(view: Any) -> dict:
    """Check a node view's header and shape; raise MalformedView(reason, detail)."""
    if not isinstance(view, dict):
        raise MalformedView("not_an_object", f"view is {type(view).__name__}, expected a JSON object")
    if view.get("schema") != VIEW_SCHEMA:
        raise MalformedView("bad_schema", f"schema is {view.get('schema')!r}, expected {VIEW_SCHEMA!r}")
    if view.get("version") not in SUPPORTED_VIEW_VERSIONS:
        raise MalformedView(
            "unsupported_version", f"version {view.get('version')!r}, supported {SUPPORTED_VIEW_VERSIONS}"
        )
    node = view.get("node")
    if not isinstance(node, str) or not node or "/" in node:
        raise MalformedView("bad_node", f"node {node!r} must be a non-empty string without '/'")
    if not isinstance(view.get("generated_at_ns"), int):
        raise MalformedView("bad_field", "generated_at_ns must be an integer")
    for section in ("interfaces", "neighbours", "local_sids", "policies", "loopbacks"):
        if not isinstance(view.get(section), list):
            raise MalformedView("bad_field", f"{section} must be a list")
    try:
        for iface in view["interfaces"]:
            for a in iface["addresses"]:
                _ip(a["address"]), int(a["prefixlen"])
        for sid in view["local_sids"]:
            _ip(sid["sid"]), str(sid["action"])
        for lo in view["loopbacks"]:
            _ip(lo["address"])
        for pol in view["policies"]:
            [_ip(s) for s in pol["segments"]]
    except (KeyError, TypeError, ValueError) as e:
        raise MalformedView("bad_field", f"{type(e).__name__}: {e}") from None
    for section in ("stamp_sessions", "flows"):
        if not isinstance(view.get(section, []), list):
            raise MalformedView("bad_field", f"{section} must be a list")
    return view


def _valid_session(s) -> bool:
    try:
        int(s["ssid"])
        if s.get("role", "sender") not in SENDER_ROLES:
            return True  # a reflector's entry names no path: only its ssid matters
        _ip(s["sender_address"]), _ip(s["reflector_address"])
        [_ip(x) for x in s.get("segments") or []] + [_ip(x) for x in s.get("return_segments") or []]
        return True
    except (KeyError, TypeError, ValueError):
        return False


def _valid_flow(f) -> bool:
    try:
        int(f["flow_id"]), [_ip(x) for x in f["segments"]]
        return True
    except (KeyError, TypeError, ValueError):
        return False


@dataclass
class _Link:
    local_node: str
    local_if: dict
    local_ip: str
    remote_node: str
    remote_if: dict
    remote_ip: str
    prefix: str


@dataclass
class _Measure:
    timestamp_ns: int
    fields: dict | None  # None while raw_fields is not parsed yet (TopologyModel.settle)
    tags: dict
    raw_fields: str | None = None  # the field set as the line had it, parsed when a reader needs it
    previous: _Measure | None = None  # the measure it replaced while unparsed: held again if it is malformed


def sid_structure(lblen: int, nflen: int) -> dict:
    """A NEXT-C-SID SID's structure as Jalapeno's ls_srv6_sid holds it (gobmp's SIDStructure, the
    BGP-LS SRv6 SID Structure TLV): block, the micro-SID as the node, no function, and the rest of
    the container as the argument (the micro-SIDs that follow)."""
    return {
        "locator_block_length": lblen,
        "locator_node_length": nflen,
        "function_length": 0,
        "argument_length": 128 - lblen - nflen,
    }


@dataclass
class TopologyModel:
    identity: Identity = field(default_factory=Identity)
    names: Names = field(default_factory=Names)
    views: dict[str, dict] = field(default_factory=dict)
    stamp: dict[tuple[str, int, str], _Measure] = field(default_factory=dict)  # (node, ssid, dir)
    loss: dict[tuple[int, str], _Measure] = field(default_factory=dict)  # (flow, tx_node)
    # (flow, hop, from_node, from_if, to_node, to_if): the newest inline_hop_delay point of each hop of a flow
    inline: dict[tuple[int, str, str, str, str, str], _Measure] = field(default_factory=dict)
    # schemas/topology.md, "Link delay: STAMP and in-line": STAMP_PRECEDENCE_S in ns
    stamp_precedence_ns: int = int(STAMP_PRECEDENCE_S * 1e9)
    counters: Counters = field(default_factory=Counters)
    unparsed: set = field(default_factory=set)  # (store, key) of the measures whose fields are not parsed yet
    _series: dict = field(default_factory=dict, repr=False)  # measurement and tags text -> _series_of(...)
    # jalapeno mode: the routers' SIDs in Jalapeno's ls_srv6_sid (TopologySink.load_jalapeno_sids);
    # SIDs no node view explains are expanded from them (resolve_path)
    jalapeno_sids: SidTable | None = None

    # -- inputs -----------------------------------------------------------------------
    def apply_view(self, view: Any) -> bool:
        """Take a node view; returns False for an older view than the one held (a replay)."""
        try:
            validate_view(view)
        except MalformedView:
            self.counters.malformed_views += 1
            raise
        self.counters.views_in += 1
        # a bad session/flow entry must not cost the node its topology: drop the entry, count it
        view = dict(view)
        for section, ok in (("stamp_sessions", _valid_session), ("flows", _valid_flow)):
            entries = view.get(section) or []
            view[section] = [e for e in entries if isinstance(e, dict) and ok(e)]
            self.counters.invalid_entries += len(entries) - len(view[section])
        held = self.views.get(view["node"])
        if held is not None and held["generated_at_ns"] > view["generated_at_ns"]:
            self.counters.views_stale += 1
            return False
        self.views[view["node"]] = view
        return True

    def apply_metrics_text(self, text: str) -> None:
        """Take one segscope.metrics message (line protocol, any producer's lines).

        Only `stamp_delay`, `altmark_loss` and `inline_hop_delay` lines are read: the topic also carries every
        process's counters and `stamp_delay_histogram` (as many lines as `stamp_delay`), which
        count as points_ignored, unparsed. A message as segscope's processors write it (ASCII, no
        escapes, \\n line breaks) is split once on \\n and each measured line on its blanks; each
        series' tags are parsed once (the `_series` cache, keyed by the line's measurement and
        tags) and its fields at settle: at 1 000 routers this topic carries 50 k measured points/s,
        and reading them was this processor's limit (docs/capacity.md, bench/topology_points.py).
        Any other message is read line by line (_apply_lines), with the same outcome: a test holds
        the two equal."""
        if not text or not _plain_message(text):
            self._apply_lines(text)
            return
        lines = text.split("\n")
        c = self.counters
        series, unparsed, stores = self._series, self.unparsed, (self.stamp, self.loss, self.inline)
        if len(series) > 4 * (len(self.stamp) + len(self.loss) + len(self.inline)) + 10_000:
            series.clear()  # tag sets no longer seen (a path changed): parsed again when they come back
        taken = stale = ignored = 0
        for line in lines:
            if not line.startswith(MEASURED_PREFIXES):
                if line[:1] in _ODD_LINE_STARTS:  # blank, comment or indented ('' is in any string)
                    self._apply_lines(line)
                else:
                    ignored += 1
                continue
            parts = line.split(" ")
            if len(parts) != 3 or not parts[1] or not parts[2]:
                self._apply_line(line)  # blanks in a string field, no timestamp: the full parser
                continue
            head, raw_fields, ts_text = parts
            known = series.get(head)
            if known is None:
                known = series[head] = self._series_of(head)
            if known is False or (known[0] == LOSS and not complete_is_true(raw_fields)):
                self._apply_line(line)
                continue
            kind, key, tags = known
            store = stores[kind]
            try:
                ts = int(ts_text)
            except ValueError:
                self._apply_line(line)
                continue
            taken += 1
            held = store.get(key)
            if held is not None and held.timestamp_ns > ts:
                stale += 1
                continue
            store[key] = _Measure(ts, None, tags, raw_fields, held)
            unparsed.add((kind, key))
        c.points_in += taken
        c.points_stale += stale
        c.points_ignored += ignored

    def _series_of(self, head: str):
        """(store, key, tags) of a measured line's head (measurement and tags, no escapes); False
        when its tags cannot key a measure (a tag without a value, a '=' in a value, no node, ssid and
        direction, flow and tx_node, or hop tags), or it is an in-line span: the full parser then
        reads the line (and counts it). apply_metrics_text caches it per series: the tags dict is
        shared by every measure of the series, and nothing changes a held measure's tags."""
        measurement, *items = head.split(",")
        tags = {}
        for item in items:
            key, _, value = item.partition("=")
            if not key or not value or "=" in value:
                return False
            tags[key] = value
        try:
            if measurement == "stamp_delay":
                return STAMP, (tags["node"], int(tags["ssid"]), tags["direction"]), tags
            if measurement == "altmark_loss":
                return LOSS, (int(tags["flow"]), tags["tx_node"]), tags
            key = inline_key(tags)
            return False if is_span(key) else (INLINE, key, tags)
        except (KeyError, ValueError):
            return False

    def _apply_lines(self, text: str) -> None:
        """apply_metrics_text of a message in any shape: line by line."""
        for line in text.splitlines():
            if not line.startswith(MEASURED_PREFIXES):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                if not line.startswith(MEASURED_PREFIXES):
                    self.counters.points_ignored += 1
                    continue
            self._apply_line(line)

    def _apply_line(self, line: str) -> None:
        """One measured line: taken unparsed when plain, else parsed in full."""
        if self._take_plain_line(line):
            return
        try:
            point = parse_line(line)
        except LineError:
            self.counters.malformed_lines += 1
            return
        self.apply_point(point)

    def _take_plain_line(self, line: str) -> bool:
        """A stamp_delay, complete altmark_loss or inline_hop_delay line without escapes (all of segscope's): its tags
        and timestamp are read here, its fields only when a reader needs the newest of its
        series (settle): of a busy session's lines, a flush parses one per direction, not one per
        second. The outcome equals parse_line + apply_point for a well-formed line; False for
        anything else, which the full parser then reads (and counts if it is malformed)."""
        if "\\" in line:
            return False
        parts = line.split(" ")
        if len(parts) != 3 or not parts[1] or not parts[2]:
            return False  # blanks in a string field, no timestamp, doubled blanks: the full parser
        head, raw_fields, ts_text = parts
        known = self._series_of(head)
        if known is False:
            return False
        kind, key, tags = known
        try:
            if kind == LOSS and plain_field(raw_fields, "complete") is not True:
                return False  # an incomplete block is ignored, a broken line malformed: the full parser says which
            ts = int(ts_text)
        except ValueError:  # LineError is a ValueError
            return False
        store = self._store(kind)
        self.counters.points_in += 1
        held = store.get(key)
        if held is not None and held.timestamp_ns > ts:
            self.counters.points_stale += 1
            return True
        store[key] = _Measure(ts, None, tags, raw_fields, held)
        self.unparsed.add((kind, key))
        return True

    def _store(self, kind: int) -> dict:
        return (self.stamp, self.loss, self.inline)[kind]

    def settle(self) -> None:
        """Parse the fields of the points taken unparsed (every reader calls this first,
        and the app every flush, also on standbys: the chains below stay one flush long). One whose
        fields are malformed is undone: counted in malformed_lines (it stays counted in points_in:
        counters never go back), and the measure it replaced is held again (checked the same way),
        as if the full parser had refused the line."""
        for kind, key in self.unparsed:
            store = self._store(kind)
            m = store.get(key)
            while m is not None and m.raw_fields is not None:
                try:
                    fields = parse_fields(m.raw_fields)
                    if kind == INLINE and not inline_fields_valid(fields):
                        raise LineError("inline_hop_delay fields do not match schemas/metrics.md")
                    m.fields, m.raw_fields = fields, None
                except LineError:
                    self.counters.malformed_lines += 1
                    m = m.previous
            if m is None:
                store.pop(key, None)
            else:
                m.previous = None
                store[key] = m
        self.unparsed.clear()

    def apply_point(self, p: Point) -> bool:
        """Take one stamp_delay / altmark_loss / inline_hop_delay point (others are ignored); keeps
        the newest of its series."""
        if p.measurement == "stamp_delay":
            try:
                key = (p.tags["node"], int(p.tags["ssid"]), p.tags["direction"])
            except (KeyError, ValueError):
                self.counters.malformed_lines += 1
                return False
            store = self.stamp
        elif p.measurement == "altmark_loss":
            if p.fields.get("complete") is not True:
                self.counters.points_ignored += 1  # metrics.md: loss numbers only from complete blocks
                return False
            try:
                key = (int(p.tags["flow"]), p.tags["tx_node"])
            except (KeyError, ValueError):
                self.counters.malformed_lines += 1
                return False
            store = self.loss
        elif p.measurement == "inline_hop_delay":
            try:
                key = inline_key(p.tags)
            except (KeyError, ValueError):
                self.counters.malformed_lines += 1
                return False
            if is_span(key):
                self.counters.inline_span_points += 1
                return False
            if not inline_fields_valid(p.fields):
                self.counters.malformed_lines += 1
                return False
            store = self.inline
        else:
            self.counters.points_ignored += 1
            return False
        if p.timestamp_ns is None:
            self.counters.malformed_lines += 1
            return False
        self.counters.points_in += 1
        held = store.get(key)
        if held is not None and held.timestamp_ns > p.timestamp_ns:
            self.counters.points_stale += 1
            return False
        store[key] = _Measure(p.timestamp_ns, dict(p.fields), dict(p.tags))
        return True

    # -- identity helpers ---------------------------------------------------------------
    def node_key(self, node: str) -> str:
        i = self.identity
        return safe_key(f"{i.protocol_id}_{i.domain_id}_{i.area_id}_{node}")

    def node_id(self, node: str) -> str:
        return f"{self.names.nodes}/{self.node_key(node)}"

    def link_key(self, link: _Link) -> str:
        i = self.identity
        return safe_key(
            f"{i.protocol_id}_{i.domain_id}_{i.mt_id}_{i.area_id}_{link.local_node}_"
            f"{link.local_ip}_{link.remote_node}_{link.remote_ip}"
        )

    def sid_key(self, node: str, sid: str) -> str:
        return safe_key(f"{self.identity.domain_id}_{node}_{sid}")

    def path_key(self, src: str, dst: str, sids: list[str]) -> str:
        return safe_key(f"{self.node_key(src)}_{self.node_key(dst)}_{','.join(sids) or '-'}")

    # -- derived topology ---------------------------------------------------------------
    def links(self) -> list[_Link]:
        """One link per direction between interfaces of two nodes with global addresses in the
        same subnet (prefix length < 128). Every pair of nodes on a shared subnet gets one."""
        ends: dict[str, list[tuple[str, dict, str]]] = {}
        for node, view in self.views.items():
            for iface in view["interfaces"]:
                for a in iface["addresses"]:
                    if a.get("scope", "global") != "global" or int(a["prefixlen"]) >= 128:
                        continue
                    net = str(ipaddress.IPv6Network(f"{a['address']}/{a['prefixlen']}", strict=False))
                    ends.setdefault(net, []).append((node, iface, str(_ip(a["address"]))))
        out = []
        for net, members in sorted(ends.items()):
            for ln, lif, lip in members:
                for rn, rif, rip in members:
                    if ln != rn:
                        out.append(_Link(ln, lif, lip, rn, rif, rip, net))
        return sorted(out, key=lambda l: (l.local_node, l.remote_node, _ip(l.local_ip), _ip(l.remote_ip)))

    def owner_of(self, addr: str) -> str | None:
        """The node an address belongs to: an interface/loopback address or a local SID first,
        then the locator (/64 of a local SID) containing it."""
        a = _ip(addr)
        for node, view in sorted(self.views.items()):
            if any(_ip(x["address"]) == a for i in view["interfaces"] for x in i["addresses"]):
                return node
            if any(_ip(s["sid"]) == a for s in view["local_sids"]):
                return node
        owners = [  # prefix SIDs (a NEXT-C-SID locator, a uDT6 in one): the longest one containing a
            (int(s.get("prefixlen") or 128), node)
            for node, view in sorted(self.views.items())
            for s in view["local_sids"]
            if int(s.get("prefixlen") or 128) < 128 and a in ipaddress.IPv6Network(f"{s['sid']}/{s['prefixlen']}")
        ]
        if owners:
            return max(owners, key=lambda o: o[0])[1]
        for node, view in sorted(self.views.items()):
            for loc in view.get("locators") or []:
                if a in ipaddress.IPv6Network(loc):
                    return node
        return None

    def _neighbour_confirmed(self, link: _Link) -> bool:
        view = self.views[link.local_node]
        mac = (link.remote_if.get("mac") or "").lower()
        return any(
            n["interface"] == link.local_if["name"]
            and _ip(n["address"]) == _ip(link.remote_ip)
            and (n.get("mac") or "").lower() == mac
            for n in view["neighbours"]
        )

    def _endx_sids(self, link: _Link) -> list[str]:
        return [
            s["sid"]
            for s in self.views[link.local_node]["local_sids"]
            if s["action"] == "End.X"
            and s.get("params", {}).get("nh6")
            and _ip(s["params"]["nh6"]) == _ip(link.remote_ip)
        ]

    def csid_format(self, addr: str) -> tuple[int, int] | None:
        """(lblen, nflen) when addr is a NEXT-C-SID container: it lies in the block of a node's
        next-csid SID (the view's params.flavors), else None."""
        a = _ip(addr)
        for view in self.views.values():
            for s in view["local_sids"]:
                flv = (s.get("params") or {}).get("flavors") or {}
                if "next-csid" in flv.get("operations", ()) and flv.get("lblen"):
                    block = ipaddress.IPv6Network(f"{s['sid']}/{flv['lblen']}", strict=False)
                    if a in block:
                        return flv["lblen"], flv["nflen"]
        return None

    def expand_sid(self, sid: str) -> list[str]:
        """A SID as the addresses the packet carries on its way: a container gives one address
        per micro-SID (the destination after each shift: block + the micro-SIDs left), any
        other SID itself."""
        fmt = self.csid_format(sid)
        if fmt is None:
            return [sid]
        lblen, nflen = fmt
        value, slots = int(_ip(sid)), (128 - lblen) // nflen
        block = value >> (128 - lblen) << (128 - lblen)
        mask = (1 << nflen) - 1
        usids = [(value >> (128 - lblen - (i + 1) * nflen)) & mask for i in range(slots)]
        usids = usids[: usids.index(0)] if 0 in usids else usids
        out = []
        for i in range(len(usids)):
            rest = sum(u << (128 - lblen - (j + 1) * nflen) for j, u in enumerate(usids[i:]))
            out.append(str(ipaddress.IPv6Address(block | rest)))
        return out or [sid]

    def resolve_path(self, src: str, sids: list[str]) -> dict:
        """Nodes visited (src, then the owner of each SID, repeats collapsed) and, when every
        consecutive pair is adjacent, the links between them. A hop is matched to the link whose
        remote address is the next SID if there is one, else to the only link between the pair.
        A NEXT-C-SID container stands for every node of its micro-SIDs (expand_sid)."""
        hops, unresolved, unexpanded = [src], [], []
        for sid in sids:
            for addr in self.expand_sid(sid):
                owner = self.owner_of(addr)
                if owner is None and self.jalapeno_sids is not None and addr == sid:
                    got = self.jalapeno_sids.expand(sid, previous=hops[-1])
                    if got.reason is None:
                        # the expansion collapses its own repeats; the node before may be its first
                        hops += got.nodes[1:] if got.nodes[:1] == hops[-1:] else got.nodes
                        continue
                    unexpanded.append({"sid": sid, "reason": got.reason, "detail": got.detail})
                if owner is None:
                    unresolved.append(addr)
                elif owner != hops[-1]:
                    hops.append(owner)
        if unresolved:
            return {"hops": hops, "links": None, "unresolved_sids": unresolved, "unexpanded": unexpanded}
        all_links = self.links()
        links = []
        for a, b in zip(hops, hops[1:]):
            cands = [l for l in all_links if l.local_node == a and l.remote_node == b]
            exact = [l for l in cands if any(_ip(l.remote_ip) == _ip(s) for s in sids)]
            chosen = exact if len(exact) == 1 else cands
            if len(chosen) != 1:
                return {"hops": hops, "links": None, "unresolved_sids": []}
            links.append(chosen[0])
        return {"hops": hops, "links": links, "unresolved_sids": []}

    # -- sessions and flows from the views ----------------------------------------------
    def stamp_paths(self) -> list[dict]:
        """One entry per direction of every STAMP session a node's view declares as its sender
        (measurements are tagged with the sender node).

        The reverse path's SID list is the reflector's to know (a sender entry carries
        `return_segments: []`): it comes from the reflector node's entry for the same ssid and
        sender address when its view has one, else from the sender's entry; `return_sids_from`
        says which."""
        reflected: dict[tuple[str, int], list[dict]] = {}
        for node, view in self.views.items():
            for s in view.get("stamp_sessions") or []:
                if s.get("role") in REFLECTOR_ROLES:
                    reflected.setdefault((node, int(s["ssid"])), []).append(s)
        out = []
        for node, view in sorted(self.views.items()):
            for s in view.get("stamp_sessions") or []:
                if s.get("role", "sender") not in SENDER_ROLES:
                    continue
                ssid = int(s["ssid"])
                reflector = self.owner_of(s["reflector_address"])
                fwd = list(s.get("segments") or []) + [s["reflector_address"]]
                forward = {"node": node, "ssid": ssid, "direction": "forward", "src": node, "dst": reflector}
                out.append({**forward, "sids": fwd})
                if reflector is None:
                    continue
                mine = s.get("sender_address") or ""
                match = next(
                    (
                        r
                        for r in reflected.get((reflector, ssid), [])
                        if not r.get("sender_address") or not mine or _ip(r["sender_address"]) == _ip(mine)
                    ),
                    None,
                )
                if match is not None:
                    return_sids, source = list(match.get("return_segments") or []), "reflector"
                    mine = mine or match.get("sender_address") or ""
                else:
                    return_sids, source = list(s.get("return_segments") or []), "sender"
                rev = return_sids + ([mine] if mine else [])
                out.append(
                    {
                        "node": node,
                        "ssid": ssid,
                        "direction": "reverse",
                        "src": reflector,
                        "dst": node,
                        "sids": rev,
                        "return_sids_from": source,
                    }
                )
        return out

    def flow_paths(self) -> list[dict]:
        out = []
        for node, view in sorted(self.views.items()):
            for f in view.get("flows") or []:
                if f.get("side", "tx") not in TX_SIDES:
                    continue
                sids = list(f["segments"])
                out.append(
                    {
                        "node": node,
                        "flow": int(f["flow_id"]),
                        "src": node,
                        "dst": self.owner_of(sids[-1]) if sids else None,
                        "sids": sids,
                    }
                )
        return out

    # -- documents ----------------------------------------------------------------------
    def _node_doc(self, node: str, view: dict) -> dict:
        i = self.identity
        return {
            "_key": self.node_key(node),
            "name": node,
            "router_id": node,
            "igp_router_id": node,
            "router_ip": view["loopbacks"][0]["address"] if view["loopbacks"] else None,
            "protocol": PROTOCOL_NAME,
            "protocol_id": i.protocol_id,
            "domain_id": i.domain_id,
            "area_id": i.area_id,
            "loopbacks": [lo["address"] for lo in view["loopbacks"]],
            "locators": list(view.get("locators") or []),
            "srv6_sids": [s["sid"] for s in view["local_sids"]],
            "srv6_policies": [
                {"prefix": p["prefix"], "mode": p["mode"], "segments": p["segments"]} for p in view["policies"]
            ],
            "interfaces": [
                {
                    "name": f["name"],
                    "mac": f.get("mac"),
                    "mtu": f.get("mtu"),
                    "oper_state": f.get("oper_state"),
                    "admin_up": f.get("admin_up"),
                    "addresses": [
                        f"{a['address']}/{a['prefixlen']}"
                        for a in f["addresses"]
                        if a.get("scope", "global") == "global"
                    ],
                }
                for f in view["interfaces"]
            ],
            "schema_version": view["version"],
        }

    def _link_doc(self, link: _Link) -> dict:
        i = self.identity
        return {
            "_key": self.link_key(link),
            "protocol": PROTOCOL_NAME,
            "protocol_id": i.protocol_id,
            "domain_id": i.domain_id,
            "mt_id": i.mt_id,
            "area_id": i.area_id,
            "router_id": link.local_node,
            "igp_router_id": link.local_node,
            "remote_router_id": link.remote_node,
            "remote_igp_router_id": link.remote_node,
            "local_link_ip": link.local_ip,
            "remote_link_ip": link.remote_ip,
            "local_link_id": link.local_if.get("ifindex"),
            "remote_link_id": link.remote_if.get("ifindex"),
            "local_interface": link.local_if["name"],
            "remote_interface": link.remote_if["name"],
            "local_mac": link.local_if.get("mac"),
            "remote_mac": link.remote_if.get("mac"),
            "mtu": link.local_if.get("mtu"),
            "prefix": link.prefix,
            "srv6_endx_sid": self._endx_sids(link),
            "neighbour_confirmed": self._neighbour_confirmed(link),
        }

    def _sid_doc(self, node: str, sid: dict) -> dict:
        doc = self._sid_doc_base(node, sid)
        flv = (sid.get("params") or {}).get("flavors") or {}
        if "next-csid" in flv.get("operations", ()) and flv.get("lblen"):
            doc["srv6_sid_structure"] = sid_structure(flv["lblen"], flv["nflen"])
        return doc

    def _sid_doc_base(self, node: str, sid: dict) -> dict:
        return {
            "_key": self.sid_key(node, sid["sid"]),
            "srv6_sid": sid["sid"],
            "prefixlen": sid.get("prefixlen"),
            "igp_router_id": node,
            "router_id": node,
            "node": self.node_id(node),
            "protocol_id": self.identity.protocol_id,
            "domain_id": self.identity.domain_id,
            "srv6_endpoint_behavior": {
                "endpoint_behavior": ENDPOINT_BEHAVIOR_CODES.get(sid["action"]),
                "name": sid["action"],
            },
            "params": sid.get("params") or {},
            "interface": sid.get("interface"),
            "table": sid.get("table"),
        }

    def edge_measurements(self, min_measured_at_ns: int | None = None) -> dict[str, dict]:
        """{link key: fields} from single-link STAMP directions, the in-line hops of the flows
        (inline_hop_delay) and single-link altmark flows. When several sessions (flows) cross the
        same link, the newest point wins; the in-line delay is the newest second of the link over
        all flows crossing it; which of the two gives the link's delay: link_delay (the precedence
        rule). Points older than min_measured_at_ns (expired: the session/flow stopped reporting)
        are left out. A delay field the newest point has no value for (no ipdv_mean_us, no
        min/max) is None: to be removed from the edge, never left there from an older point."""
        self.settle()
        fresh = (lambda m: True) if min_measured_at_ns is None else (lambda m: m.timestamp_ns >= min_measured_at_ns)
        stamp_delay: dict[str, tuple] = {}  # link key -> (rank, measure, stamp path)
        for sp in self.stamp_paths():
            m = self.stamp.get((sp["node"], sp["ssid"], sp["direction"]))
            if m is None or sp["dst"] is None or not fresh(m):
                continue
            res = self.resolve_path(sp["src"], sp["sids"])
            if res["links"] is None or len(res["links"]) != 1:
                continue
            key = self.link_key(res["links"][0])
            rank = (m.timestamp_ns, sp["node"], sp["ssid"])
            if key in stamp_delay and stamp_delay[key][0] >= rank:
                continue
            stamp_delay[key] = (rank, m, sp)
        inline_delay = self.inline_link_delays(min_measured_at_ns)
        delay = {
            key: (None, self.link_delay(stamp_delay.get(key), inline_delay.get(key)))
            for key in sorted(stamp_delay.keys() | inline_delay.keys())
        }
        loss: dict[str, tuple] = {}
        for fp in self.flow_paths():
            m = self.loss.get((fp["flow"], fp["node"]))
            if m is None or fp["dst"] is None or "loss_ratio" not in m.fields or not fresh(m):
                continue
            res = self.resolve_path(fp["src"], fp["sids"])
            if res["links"] is None or len(res["links"]) != 1:
                continue
            key = self.link_key(res["links"][0])
            rank = (m.timestamp_ns, fp["node"], fp["flow"])
            if key in loss and loss[key][0] >= rank:
                continue
            loss[key] = (
                rank,
                {
                    "unidir_packet_loss": _round(100.0 * m.fields["loss_ratio"], 6),
                    "loss_measured_at_ns": m.timestamp_ns,
                    "loss_source": {
                        "kind": "altmark",
                        "flow": fp["flow"],
                        "tx_node": fp["node"],
                        "tx_packets": m.fields.get("tx_packets"),
                        "lost": m.fields.get("lost"),
                    },
                },
            )
        by_key: dict[str, dict] = {}
        for source in (delay, loss):
            for key, (_, fields) in source.items():
                by_key.setdefault(key, {}).update(fields)
        return by_key

    def link_delay(self, stamp: tuple | None, inline: tuple | None) -> dict:
        """The delay fields of one directed link from its single-hop STAMP measure (rank, measure,
        stamp path) and its in-line delay (timestamp, aggregate), either may be None.

        Precedence (schemas/topology.md, "Link delay: STAMP and in-line"): the STAMP delay gives the
        link's delay (latency, unidir_link_delay, ...) unless the in-line delay is newer than it by
        more than stamp_precedence_ns; else the in-line delay does. Both are decided on the points'
        own timestamps, never on the wall clock, so the same inputs give the same documents. Each
        source's value is kept beside it (stamp_link_delay, inline_link_delay) while it is fresh."""
        stamp_ns = None if stamp is None else stamp[1].timestamp_ns
        inline_ns = None if inline is None else inline[0]
        stamp_wins = stamp is not None and (inline is None or stamp_ns >= inline_ns - self.stamp_precedence_ns)
        stamp_value = None
        if stamp is not None:
            _, m, sp = stamp
            f = m.fields
            stamp_value = {
                "mean_us": _round(f.get("mean_us")),
                "min_us": _round(f.get("min_us")),
                "max_us": _round(f.get("max_us")),
                "variation_us": _round(f.get("ipdv_mean_us")),
                "count": f.get("count"),
                "node": sp["node"],
                "ssid": sp["ssid"],
                "direction": sp["direction"],
            }
        inline_value = None if inline is None else inline[1]
        if stamp_wins:
            value, measured_at_ns = stamp_value, stamp_ns
            source = {
                "kind": STAMP_SOURCE,
                "node": sp["node"],
                "ssid": sp["ssid"],
                "direction": sp["direction"],
                "count": stamp_value["count"],
            }
        else:
            value, measured_at_ns = inline_value, inline_ns
            source = {"kind": INLINE_SOURCE, "flows": inline_value["flows"], "count": inline_value["count"]}
        min_max = [value["min_us"], value["max_us"]]
        # a field this second has no value for is None, not absent: the writer removes it from the
        # edge (an update would keep the previous second's value beside this second's timestamp)
        return {
            "latency": value["mean_us"],
            "unidir_link_delay": value["mean_us"],
            "unidir_link_delay_min_max": None if None in min_max else min_max,
            "unidir_delay_variation": value["variation_us"],
            "delay_measured_at_ns": measured_at_ns,
            "delay_source": _without_none(source),
            "link_delay_source": STAMP_SOURCE if stamp_wins else INLINE_SOURCE,
            "stamp_link_delay": _without_none(stamp_value),
            "stamp_link_delay_measured_at_ns": stamp_ns,
            "inline_link_delay": _without_none(inline_value),
            "inline_link_delay_measured_at_ns": inline_ns,
            "stamp_minus_inline_us": _stamp_minus_inline(stamp_value, inline_value),
        }

    def inline_link_delays(self, min_measured_at_ns: int | None = None) -> dict[str, tuple[int, dict]]:
        """{link key: (timestamp ns, in-line delay)} of every link some flow's hop measured: the
        newest second of the link over all flows crossing it (each flow's newest point per hop; a
        hop whose newest point says measured=false gives nothing; points older than
        min_measured_at_ns are left out), aggregated over the flows' points of that second: the
        packet-weighted mean (sum of sum_us / sum of count), the smallest min, the largest max, and
        the variation as the pair-weighted mean of the flows' IPDV (ipdv_mean_us weighted by
        count - 1: the mean |D(i) - D(i-1)| over consecutive sampled packets of each flow; two
        flows' packets form no sequence). Sets the inline_hops_not_measured gauge."""
        self.settle()
        by_pair = self._links_by_pair()
        link_keys: dict[tuple, list[str]] = {}  # (from_node, from_if, to_node, to_if) -> link keys: flows share links
        newest: dict[str, tuple[int, list]] = {}  # link key -> (timestamp, [(hop key, fields)])
        not_measured = 0
        for key, m in self.inline.items():
            if not m.fields["measured"]:
                not_measured += 1
                continue
            if min_measured_at_ns is not None and m.timestamp_ns < min_measured_at_ns:
                continue
            ends = key[2:]
            if ends not in link_keys:
                link_keys[ends] = [self.link_key(link) for link in self._hop_links(by_pair, key)]
            for lk in link_keys[ends]:
                held = newest.get(lk)
                if held is None or m.timestamp_ns > held[0]:
                    newest[lk] = (m.timestamp_ns, [(key, m.fields)])
                elif m.timestamp_ns == held[0]:
                    held[1].append((key, m.fields))
        self.counters.inline_hops_not_measured = not_measured
        # the points in key order: the float sums do not depend on the order the lines came in
        return {lk: (ts, _inline_aggregate(sorted(points))) for lk, (ts, points) in sorted(newest.items())}

    def _links_by_pair(self) -> dict[tuple[str, str], list[_Link]]:
        by_pair: dict[tuple[str, str], list[_Link]] = {}
        for link in self.links():
            by_pair.setdefault((link.local_node, link.remote_node), []).append(link)
        return by_pair

    def _hop_links(self, by_pair: dict, key: tuple) -> list[_Link]:
        """The link (directed) an in-line hop crossed: from from_node to to_node, arriving on to_if
        and leaving from_if when they name an interface of their node (the device name, or
        `ifindex-<n>`: the in-line processor names the egress device so without a record). An
        interface it cannot name (`unknown`, a bare IOAM id) does not narrow the choice: the hop is
        on a link only when one remains, or when several remain between the same two named
        interfaces (one wire, addresses in several subnets: each of its edges). [] otherwise."""
        _, _, from_node, from_if, to_node, to_if = key
        cands = by_pair.get((from_node, to_node), [])
        if not cands:
            return []
        to_named = any(_names(i, to_if) for i in self.views[to_node]["interfaces"])
        from_named = any(_names(i, from_if) for i in self.views[from_node]["interfaces"])
        if to_named:
            cands = [l for l in cands if _names(l.remote_if, to_if)]
        if from_named:
            cands = [l for l in cands if _names(l.local_if, from_if)]
        return cands if len(cands) == 1 or (to_named and from_named) else []

    def _path_base(self, src: str, dst: str, sids: list[str]) -> dict:
        res = self.resolve_path(src, sids)
        return {
            "_key": self.path_key(src, dst, sids),
            "src": self.node_id(src),
            "dst": self.node_id(dst),
            "src_node": src,
            "dst_node": dst,
            "sid_list": sids,
            "hops": res["hops"],
            "links": [self.link_key(l) for l in res["links"]] if res["links"] is not None else None,
            "unresolved_sids": res["unresolved_sids"],
            # jalapeno mode: [{sid, reason, detail}] of the SIDs Jalapeno's SIDs could not expand
            "unexpanded": res.get("unexpanded") or [],
        }

    def path_docs(self) -> dict[str, dict]:
        """One document per (src, dst, SID list); several sessions/flows on the same path share
        it and the newest point gives its delay (loss) fields."""
        self.settle()
        docs: dict[str, dict] = {}
        ranks: dict[tuple[str, str], tuple] = {}
        for sp in self.stamp_paths():
            if sp["dst"] is None:
                continue
            base = self._path_base(sp["src"], sp["dst"], sp["sids"])
            doc = docs.setdefault(base["_key"], base)
            doc.setdefault("stamp_sessions", []).append(
                {"node": sp["node"], "ssid": sp["ssid"], "direction": sp["direction"]}
            )
            m = self.stamp.get((sp["node"], sp["ssid"], sp["direction"]))
            rank = None if m is None else (m.timestamp_ns, sp["node"], sp["ssid"])
            if rank is None or ranks.get((doc["_key"], "delay"), rank) > rank:
                continue
            ranks[(doc["_key"], "delay")] = rank
            f = m.fields
            doc.update(
                {
                    "delay_us": _round(f.get("mean_us")),
                    "delay_min_us": _round(f.get("min_us")),
                    "delay_max_us": _round(f.get("max_us")),
                    "delay_p99_us": _round(f.get("p99_us")),
                    "jitter_us": _round(f.get("ipdv_mean_us")),
                    "delay_count": f.get("count"),
                    "delay_measured_at_ns": m.timestamp_ns,
                    "delay_source": {"node": sp["node"], "ssid": sp["ssid"], "direction": sp["direction"]},
                }
            )
            rtt = self.stamp.get((sp["node"], sp["ssid"], "round_trip"))
            doc["round_trip_delay_us"] = (
                _round(rtt.fields.get("mean_us")) if rtt is not None and sp["direction"] == "forward" else None
            )
        for fp in self.flow_paths():
            if fp["dst"] is None:
                continue
            base = self._path_base(fp["src"], fp["dst"], fp["sids"])
            doc = docs.setdefault(base["_key"], base)
            doc.setdefault("flows", []).append(fp["flow"])
            m = self.loss.get((fp["flow"], fp["node"]))
            if m is None or "loss_ratio" not in m.fields:
                continue
            rank = (m.timestamp_ns, fp["node"], fp["flow"])
            if ranks.get((doc["_key"], "loss"), rank) > rank:
                continue
            ranks[(doc["_key"], "loss")] = rank
            doc.update(
                {
                    "loss_percent": _round(100.0 * m.fields["loss_ratio"], 6),
                    "loss_tx_packets": m.fields.get("tx_packets"),
                    "loss_lost": m.fields.get("lost"),
                    "loss_measured_at_ns": m.timestamp_ns,
                    "loss_flow": fp["flow"],
                }
            )
        # absent rather than null when a value is unknown (an `update` upsert then keeps the last one)
        self._count_not_expanded(docs.values())
        return {k: {kk: vv for kk, vv in d.items() if vv is not None or kk == "links"} for k, d in docs.items()}

    def _count_not_expanded(self, docs) -> None:
        """The not_expanded_* gauges: SIDs of the path documents left unexpanded, by reason."""
        by_reason = dict.fromkeys(NOT_EXPANDED_REASONS, 0)
        for doc in docs:
            for u in doc["unexpanded"]:
                by_reason[u["reason"]] += 1
        for reason, count in by_reason.items():
            setattr(self.counters, f"not_expanded_{reason}", count)

    def unmapped_measurements(self) -> list[tuple]:
        """Measurement keys no declared session/flow explains, and in-line hops on no known link
        (visible in counters)."""
        self.settle()
        known_stamp = {(sp["node"], sp["ssid"]) for sp in self.stamp_paths()}
        known_flow = {(fp["flow"], fp["node"]) for fp in self.flow_paths()}
        by_pair = self._links_by_pair()
        return (
            [k for k in self.stamp if (k[0], k[1]) not in known_stamp]
            + [k for k in self.loss if k not in known_flow]
            + [k for k in self.inline if not self._hop_links(by_pair, k)]
        )

    def documents(self, min_measured_at_ns: int | None = None) -> dict[str, dict[str, dict]]:
        """{collection: {_key: document}} of everything the model knows (own mode); edge
        measurements older than min_measured_at_ns are left out (path documents keep theirs:
        they are segscope's own record of the path, dated by *_measured_at_ns)."""
        n = self.names
        nodes, sids = {}, {}
        for node, view in sorted(self.views.items()):
            doc = self._node_doc(node, view)
            nodes[doc["_key"]] = doc
            for sid in view["local_sids"]:
                sdoc = self._sid_doc(node, sid)
                sids[sdoc["_key"]] = sdoc
        links, edges = {}, {}
        measured = self.edge_measurements(min_measured_at_ns)
        for link in self.links():
            ldoc = self._link_doc(link)
            links[ldoc["_key"]] = ldoc
            edges[ldoc["_key"]] = {
                **ldoc,
                "_from": self.node_id(link.local_node),
                "_to": self.node_id(link.remote_node),
                # absent, not null, when unknown: the sink replaces edge documents whole
                **{k: v for k, v in measured.get(ldoc["_key"], {}).items() if v is not None},
            }
        self.counters.measurements_unmapped = len(self.unmapped_measurements())
        return {n.nodes: nodes, n.links: links, n.sids: sids, n.edges: edges, n.paths: self.path_docs()}

    def jalapeno_annotations(self, min_measured_at_ns: int | None = None) -> list[dict]:
        """For jalapeno mode: [{local_ip, remote_ip, fields}] to apply to existing igpv6_graph
        edge documents matched by local_link_ip/remote_link_ip (our link keys are not Jalapeno's),
        with the TE fields typed as igp-graph types them (bgp_ls_fields)."""
        by_key = {self.link_key(l): l for l in self.links()}
        return [
            {
                "local_ip": by_key[k].local_ip,
                "remote_ip": by_key[k].remote_ip,
                "fields": bgp_ls_fields(f),
            }
            for k, f in sorted(self.edge_measurements(min_measured_at_ns).items())
        ]


# RFC 8570: delays are 24-bit microseconds, loss a 24-bit count of 0.000003 % units (max 50.331642 %)
RFC8570_MAX = (1 << 24) - 1
RFC8570_LOSS_UNIT_PCT = 0.000003


def _rfc8570_us(value: float) -> int:
    return min(max(int(round(value)), 0), RFC8570_MAX)


def _rfc8570_us_or_none(value: float | None) -> int | None:
    return None if value is None else _rfc8570_us(value)


def bgp_ls_fields(fields: dict) -> dict:
    """Our edge fields as igp-graph's IGPGraphObject types them (uint32; Go fails to decode a float
    into one): delays in whole µs, the loss in RFC 8570 units; the exact values stay beside them
    (`delay_mean_us`, `unidir_packet_loss_percentage`) for whoever reads floats."""
    out = dict(fields)  # None stays None: the writer removes that field from the edge
    if "unidir_link_delay" in fields:
        out["delay_mean_us"] = fields["unidir_link_delay"]
        out["latency"] = out["unidir_link_delay"] = _rfc8570_us_or_none(fields["unidir_link_delay"])
    if fields.get("unidir_link_delay_min_max") is not None:
        out["unidir_link_delay_min_max"] = [_rfc8570_us(v) for v in fields["unidir_link_delay_min_max"]]
    if "unidir_delay_variation" in fields:
        out["unidir_delay_variation"] = _rfc8570_us_or_none(fields["unidir_delay_variation"])
    if "unidir_packet_loss" in fields:  # our edge field is percent
        pct = fields["unidir_packet_loss"]
        out["unidir_packet_loss_percentage"] = pct
        out["unidir_packet_loss"] = min(max(int(round(pct / RFC8570_LOSS_UNIT_PCT)), 0), RFC8570_MAX)
    return out


def _round(value, digits: int = 3):
    return None if value is None else round(float(value), digits)


def _stamp_minus_inline(stamp_value: dict | None, inline_value: dict | None) -> float | None:
    """The link's STAMP mean minus its in-line mean, when both measure it: the in-line hop also
    holds the upstream node's forwarding of real traffic (schemas/topology.md), so a difference
    that grows says where a link's delay comes from."""
    if not stamp_value or not inline_value:
        return None
    if stamp_value.get("mean_us") is None or inline_value.get("mean_us") is None:
        return None
    return _round(stamp_value["mean_us"] - inline_value["mean_us"])


def _without_none(obj: dict | None) -> dict | None:
    """An object field's value with its unknown keys absent (own mode's rule: absent, never null)."""
    return None if obj is None else {k: v for k, v in obj.items() if v is not None}


def _names(iface: dict, name: str) -> bool:
    """Does an interface name (as inline_hop_delay's from_if / to_if carry it) name this interface?"""
    return iface["name"] == name or (iface.get("ifindex") is not None and name == f"ifindex-{iface['ifindex']}")


def _inline_aggregate(points: list[tuple[tuple, dict]]) -> dict:
    """One link's in-line delay from the flows' points of one second (TopologyModel.inline_link_delays)."""
    count = sum(f["count"] for _, f in points)
    total_us = sum(f["sum_us"] for _, f in points)
    mins = [f.get("min_us") for _, f in points]
    maxes = [f.get("max_us") for _, f in points]
    pairs = [(f["ipdv_mean_us"], f["count"] - 1) for _, f in points if "ipdv_mean_us" in f and f["count"] >= 2]
    pair_count = sum(w for _, w in pairs)
    return {
        "mean_us": _round(total_us / count),
        "min_us": None if None in mins else _round(min(mins)),
        "max_us": None if None in maxes else _round(max(maxes)),
        "variation_us": _round(sum(v * w for v, w in pairs) / pair_count) if pair_count else None,
        "count": count,
        "flows": sorted({key[0] for key, _ in points}),
    }


def diff_documents(
    old: dict[str, dict[str, dict]], new: dict[str, dict[str, dict]]
) -> tuple[dict[str, list[dict]], dict[str, list[str]]]:
    """(upserts, deletes) per collection between two documents() results."""
    upserts, deletes = {}, {}
    for coll in sorted(set(old) | set(new)):
        o, n = old.get(coll, {}), new.get(coll, {})
        changed = [doc for key, doc in sorted(n.items()) if o.get(key) != doc]
        gone = sorted(k for k in o if k not in n)
        if changed:
            upserts[coll] = changed
        if gone:
            deletes[coll] = gone
    return upserts, deletes
