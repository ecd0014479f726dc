"""Document model: node views + measurements -> ArangoDB documents shaped like Jalapeno's.

Pure Python (no I/O): the Faust app feeds it node views (segscope.topology) and measurement
points (stamp_delay / altmark_loss from segscope.metrics), and asks for documents(); the writer
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
DELAY_FIELDS = (
    "latency",
    "unidir_link_delay",
    "unidir_link_delay_min_max",
    "unidir_delay_variation",
    "delay_mean_us",
    "delay_measured_at_ns",
    "delay_source",
)
LOSS_FIELDS = ("unidir_packet_loss", "unidir_packet_loss_percentage", "loss_measured_at_ns", "loss_source")
ARANGO_KEY_RE = re.compile(r"^[A-Za-z0-9_\-:.@()+,=;$!*'%]{1,254}$")


# the measurements the model reads (a line of them starts with the name and its first tag's comma)
MEASURED_PREFIXES = ("stamp_delay,", "altmark_loss,")
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


@dataclass
class TopologyModel:
    identity: Identity = field(default_factory=Identity)
    names: Names = field(default_factory=Names)
    views: dict[str, dict] = field(default_factory=dict)
    stamp: dict[tuple[str, int, str], _Measure] = field(default_factory=dict)  # (node, ssid, dir)
    loss: dict[tuple[int, str], _Measure] = field(default_factory=dict)  # (flow, tx_node)
    counters: Counters = field(default_factory=Counters)
    unparsed: set = field(default_factory=set)  # (is loss, key) of the measures whose fields are not parsed yet
    _series: dict = field(default_factory=dict, repr=False)  # measurement and tags text -> _series_of(...)

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

        Only `stamp_delay` and `altmark_loss` lines are read: the topic also carries every
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
        series, unparsed, stamp_store, loss_store = self._series, self.unparsed, self.stamp, self.loss
        if len(series) > 4 * (len(self.stamp) + len(self.loss)) + 10_000:
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
            if known is False or (known[0] and not complete_is_true(raw_fields)):
                self._apply_line(line)
                continue
            is_loss, key, tags = known
            store = loss_store if is_loss else stamp_store
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
            unparsed.add((is_loss, key))
        c.points_in += taken
        c.points_stale += stale
        c.points_ignored += ignored

    def _series_of(self, head: str):
        """(is loss, key, tags) of a measured line's head (measurement and tags, no escapes); False
        when its tags cannot key a measure (a tag without a value, a '=' in a value, no node, ssid and
        direction or flow and tx_node tag): the full parser then reads the line. apply_metrics_text
        caches it per series: the tags dict is shared by every measure of the series, and nothing
        changes a held measure's tags."""
        measurement, *items = head.split(",")
        tags = {}
        for item in items:
            key, _, value = item.partition("=")
            if not key or not value or "=" in value:
                return False
            tags[key] = value
        try:
            if measurement == "stamp_delay":
                return False, (tags["node"], int(tags["ssid"]), tags["direction"]), tags
            return True, (int(tags["flow"]), tags["tx_node"]), tags
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
        """One stamp_delay / altmark_loss line: taken unparsed when plain, else parsed in full."""
        if self._take_plain_line(line):
            return
        try:
            point = parse_line(line)
        except LineError:
            self.counters.malformed_lines += 1
            return
        self.apply_point(point)

    def _take_plain_line(self, line: str) -> bool:
        """A stamp_delay or complete altmark_loss line without escapes (all of segscope's): its tags
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
        is_loss, key, tags = known
        try:
            if is_loss and plain_field(raw_fields, "complete") is not True:
                return False  # an incomplete block is ignored, a broken line malformed: the full parser says which
            ts = int(ts_text)
        except ValueError:  # LineError is a ValueError
            return False
        store = self.loss if is_loss else self.stamp
        self.counters.points_in += 1
        held = store.get(key)
        if held is not None and held.timestamp_ns > ts:
            self.counters.points_stale += 1
            return True
        store[key] = _Measure(ts, None, tags, raw_fields, held)
        self.unparsed.add((is_loss, key))
        return True

    def settle(self) -> None:
        """Parse the fields of the points taken unparsed (every reader calls this first,
        and the app every flush, also on standbys: the chains below stay one flush long). One whose
        fields are malformed is undone: counted in malformed_lines (it stays counted in points_in:
        counters never go back), and the measure it replaced is held again (checked the same way),
        as if the full parser had refused the line."""
        for is_loss, key in self.unparsed:
            store = self.loss if is_loss else self.stamp
            m = store.get(key)
            while m is not None and m.raw_fields is not None:
                try:
                    m.fields, m.raw_fields = parse_fields(m.raw_fields), None
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
        """Take one stamp_delay / altmark_loss point (others are ignored); keeps the newest."""
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

    def resolve_path(self, src: str, sids: list[str]) -> dict:
        """Nodes visited (src, then the owner of each SID, repeats collapsed) and, when every
        consecutive pair is adjacent, the links between them. A hop is matched to the link whose
        remote address is the next SID if there is one, else to the only link between the pair."""
        hops, unresolved = [src], []
        for sid in sids:
            owner = self.owner_of(sid)
            if owner is None:
                unresolved.append(sid)
            elif owner != hops[-1]:
                hops.append(owner)
        if unresolved:
            return {"hops": hops, "links": None, "unresolved_sids": unresolved}
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
        """{link key: fields} from single-link STAMP directions and single-link altmark flows.
        When several sessions (flows) cross the same link, the newest point wins. Points older
        than min_measured_at_ns (expired: the session/flow stopped reporting) are left out.
        A delay field the newest point has no value for (no ipdv_mean_us, no min/max) is None:
        to be removed from the edge, never left there from an older point."""
        self.settle()
        fresh = (lambda m: True) if min_measured_at_ns is None else (lambda m: m.timestamp_ns >= min_measured_at_ns)
        delay: dict[str, tuple] = {}
        for sp in self.stamp_paths():
            m = self.stamp.get((sp["node"], sp["ssid"], sp["direction"]))
            if m is None or sp["dst"] is None or not fresh(m):
                continue
            res = self.resolve_path(sp["src"], sp["sids"])
            if res["links"] is None or len(res["links"]) != 1:
                continue
            key = self.link_key(res["links"][0])
            rank = (m.timestamp_ns, sp["node"], sp["ssid"])
            if key in delay and delay[key][0] >= rank:
                continue
            f = m.fields
            min_max = [_round(f.get("min_us")), _round(f.get("max_us"))]
            fields = {
                "latency": _round(f.get("mean_us")),
                "unidir_link_delay": _round(f.get("mean_us")),
                "unidir_link_delay_min_max": None if None in min_max else min_max,
                "unidir_delay_variation": _round(f.get("ipdv_mean_us")),
                "delay_measured_at_ns": m.timestamp_ns,
                "delay_source": {
                    "kind": "stamp",
                    "node": sp["node"],
                    "ssid": sp["ssid"],
                    "direction": sp["direction"],
                    "count": f.get("count"),
                },
            }
            # a field this second has no value for is None, not absent: the writer removes it from the
            # edge (an update would keep the previous second's value beside this second's timestamp)
            delay[key] = (rank, fields)
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
        return {k: {kk: vv for kk, vv in d.items() if vv is not None or kk == "links"} for k, d in docs.items()}

    def unmapped_measurements(self) -> list[tuple]:
        """Measurement keys no declared session/flow explains (visible in counters)."""
        self.settle()
        known_stamp = {(sp["node"], sp["ssid"]) for sp in self.stamp_paths()}
        known_flow = {(fp["flow"], fp["node"]) for fp in self.flow_paths()}
        return [k for k in self.stamp if (k[0], k[1]) not in known_stamp] + [
            k for k in self.loss if k not in known_flow
        ]

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
            {"local_ip": by_key[k].local_ip, "remote_ip": by_key[k].remote_ip, "fields": bgp_ls_fields(f)}
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
