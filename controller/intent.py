"""The intent file: what the operator wants measured and configured, validated with positions.

    from controller.intent import load_intent, IntentError
    intent = load_intent("controller/examples/demo_line5.yaml")   # raises IntentError

Every problem is reported at once, one per line, as
    FILE:LINE:COLUMN: path: what. Fix: how
e.g.  intent.yaml:14:7: stamp_sessions[0].rate_pps: -5 must be > 0. Fix: ...
Format: controller/README.md.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import ipaddress
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from controller.usid import DEFAULT_LBLEN, DEFAULT_NFLEN, CsidFormat, length_problem
from controller.yamlmarks import MarkedDoc, Problem, load_marked
from segscope_schemas import batch_envelope

NODE_NAME_RE = batch_envelope.NODE_NAME_RE  # Kubernetes' node names (with '-', '.') and the labs'
IFNAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")
ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")

POLICY_MODES = ("encap", "inline", "encap.red")
# action -> parameters it needs; every other action parameter is refused
LOCAL_SID_ACTIONS: dict[str, tuple[str, ...]] = {
    "End": (),
    "End.X": ("nh6",),
    "End.T": ("lookup_table",),
    "End.DX4": ("nh4",),
    "End.DX6": ("nh6",),
    "End.DT4": ("lookup_table",),
    "End.DT6": ("lookup_table",),
    "End.DT46": ("lookup_table",),
    "End.B6": ("segs",),
    "End.B6.Encaps": ("segs",),
}
ACTION_PARAMS = ("lookup_table", "nh6", "nh4", "segs")
# local SID flavours, iproute2's words, in the kernel's order (RFC 8986 PSP/USP/USD, RFC 9800)
FLAVORS = ("psp", "usp", "usd", "next-csid")
STAMP_MODES = ("unauthenticated", "authenticated")  # RFC 8762 mode
STAMP_FORMATS = ("ptp", "ntp")  # timestamp format
FLOW_METHODS = ("dscp", "rfc9343")
MAX_SIDS = 6  # STAMP sessions and monitored flows: the datapaths cap SID lists here
MAX_POLICY_SIDS = 16  # policies and End.B6 SIDs: the agent's limit
MAX_RATE_PPS = 1_000_000
# in-line (IOAM) monitors (agent/inline.py has the same limits)
MAX_TRACE_NODES = 12
MAX_SAMPLE_EVERY = 65535
MAX_SAMPLE_INTERVAL_US = 60_000_000
MAX_IOAM_ID = 0xFFFFFE  # 24 bits; 0xFFFFFF is the kernel's "no id"
PORT_PROTOCOLS = (6, 17)  # TCP, UDP (the ports ioam_tx can match)


def default_ioam_id(node: str) -> int:
    """A node's IOAM node id when the intent gives none: the first 4 bytes of SHA-256 of its name
    (UTF-8), big-endian, modulo 16777214, plus 1 (1..16777214). Stable: the same name always gets
    the same id, whoever applies the intent."""
    return int.from_bytes(hashlib.sha256(node.encode()).digest()[:4], "big") % MAX_IOAM_ID + 1


class IntentError(ValueError):
    """Every problem of a file, formatted FILE:LINE:COLUMN: path: what. Fix: how (one per line)."""

    def __init__(self, file: str, problems: list[Problem]):
        self.file = file
        self.problems = sorted(problems, key=lambda p: (p.line, p.column))
        super().__init__("\n".join(p.format(file) for p in self.problems))

    @property
    def lines(self) -> list[str]:
        return [p.format(self.file) for p in self.problems]


# ---------------------------------------------------------------------------- model


@dataclass(frozen=True)
class TlsFiles:
    ca: str  # CA that signed the agent's server certificate
    cert: str  # the controller's client certificate (mTLS)
    key: str  # its private key
    server_name: str | None = None  # name to check in the agent's certificate (default: host)


@dataclass(frozen=True)
class NodeSpec:
    name: str
    agent: str  # host:port of the node's agent
    tls: TlsFiles
    ioam_id: int | None = None  # IOAM node id from the file (None: default_ioam_id(name))

    @property
    def ioam_node_id(self) -> int:
        return self.ioam_id if self.ioam_id is not None else default_ioam_id(self.name)


MAIN_TABLE = 254


@dataclass(frozen=True)
class LocalSid:
    node: str
    sid: str  # "fc00:3::d6" (the route is sid/128)
    action: str  # End, End.X, End.DT6, ...
    dev: str = ""
    table: int = MAIN_TABLE  # routing table holding the SID route
    lookup_table: int = 0  # End.T / End.DT4 / End.DT6 / End.DT46: table to look the inner packet up in
    nh6: str = ""
    nh4: str = ""
    segs: tuple[str, ...] = ()  # End.B6 / End.B6.Encaps
    count: bool = False  # per-SID counters
    flavors: tuple[str, ...] = ()  # FLAVORS, in that order
    lblen: int = 0  # next-csid: locator-block bits (the sid is then the prefix block + micro-SID)
    nflen: int = 0  # next-csid: micro-SID bits

    @property
    def key(self) -> tuple:
        return (self.node, self.sid, self.table)


@dataclass(frozen=True)
class Policy:
    node: str
    destination: str  # prefix steered into the policy, "fd00:b::/64"
    mode: str  # encap | inline | encap.red
    segs: tuple[str, ...]  # SID list in travel order
    dev: str = ""
    table: int = MAIN_TABLE
    metric: int = 0  # 0: kernel default
    written: tuple[str, ...] = field(default=(), compare=False)  # segs as the operator wrote them

    @property
    def key(self) -> tuple:
        return (self.node, self.destination, self.table)


@dataclass(frozen=True)
class StampEnd:
    node: str
    address: str  # sender: source of test packets; reflector: address it answers on
    dev: str = ""  # sender: where replies arrive (XDP collector); reflector: where tests arrive


@dataclass(frozen=True)
class StampSession:
    ssid: int
    sender: StampEnd
    reflector: StampEnd
    segs: tuple[str, ...]  # forward SID list (travel order)
    return_segs: tuple[str, ...]  # return SID list the reflector puts on the reply
    rate_pps: int = 10
    mode: str = "unauthenticated"
    format: str = "ptp"
    padding_bytes: int = 0
    start: bool = True  # running (true) or configured but not sending (false)
    duration_s: float = 0.0  # > 0: a finite run; once it has run its course it is not restarted
    link: str = ""  # a link probe (`link_probes:`): the name of the one link it measures
    reduced: bool = False  # H.Encaps.Red at the sender: segs[0], a container, in the destination, no SRH
    written: str = ""  # the forward path as the operator wrote it: "usid(200,300,400)", "link:a1"

    @property
    def key(self) -> tuple:
        return (self.sender.node, self.ssid)

    @property
    def sender_port(self) -> int:
        return 50000 + self.ssid


@dataclass(frozen=True)
class Flow:
    flow_id: int
    ingress: StampEnd  # TX (node, dev = the policy's egress device): colours the flow
    egress: StampEnd  # RX (node, dev = ingress device at the egress edge): counts it
    segs: tuple[str, ...]  # the policy's SID list (travel order) that defines the flow
    method: str = "dscp"
    period_ms: int = 1000
    dmark_every: int = 0
    dscp_l_bit: int = 0
    dscp_d_bit: int = 1
    written: str = ""  # segs as the operator wrote them: "usid(200,300,400,d6)"

    @property
    def key(self) -> tuple:
        return (self.flow_id,)


@dataclass(frozen=True)
class InlineMatch:
    """Which inner packets of the flow may be sampled; empty = all."""

    src: str = ""  # canonical IPv6 prefix of the inner packet
    dst: str = ""
    proto: int = 0
    sport: int = 0
    dport: int = 0


@dataclass(frozen=True)
class InlineMonitor:
    flow_id: int
    ingress: StampEnd  # ioam_tx (node, dev = the policy's egress device): inserts the IOAM options
    egress: StampEnd  # ioam_rx (node, dev = where the flow arrives at the egress edge): records
    segs: tuple[str, ...]  # the policy's SID list (travel order) that defines the flow
    sample_every: int = 0  # one of sample_every / sample_interval_us is > 0
    sample_interval_us: int = 0
    namespace: int = 1
    trace_nodes: int = 0  # 1..12 (default len(segs) + 1)
    transit: tuple[str, ...] = ()  # nodes where IOAM is enabled for this flow (`all` resolved)
    match: InlineMatch = InlineMatch()

    @property
    def key(self) -> tuple:
        return (self.flow_id,)


@dataclass
class Intent:
    file: str
    nodes: dict[str, NodeSpec] = field(default_factory=dict)
    local_sids: list[LocalSid] = field(default_factory=list)
    policies: list[Policy] = field(default_factory=list)
    stamp_sessions: list[StampSession] = field(default_factory=list)
    flows: list[Flow] = field(default_factory=list)
    inline_monitors: list[InlineMonitor] = field(default_factory=list)
    usid: CsidFormat | None = None  # the compressed-SID (NEXT-C-SID) domain, when declared
    steering: list = field(default_factory=list)  # controller.steering.Steering


# ---------------------------------------------------------------------------- key sets

TOP_KEYS = (
    "version",
    "nodes",
    "usid",
    "local_sids",
    "policies",
    "stamp_sessions",
    "link_probes",
    "flows",
    "inline_monitors",
    "steering",
)
USID_KEYS = ("block", "nflen")
CONTAINER_KEYS = ("usids", "block")
NODE_KEYS = ("agent", "tls", "ioam_id")
TLS_KEYS = ("ca", "cert", "key", "server_name")
LOCAL_SID_KEYS = (
    "node",
    "sid",
    "action",
    "dev",
    "table",
    "lookup_table",
    "nh6",
    "nh4",
    "segs",
    "count",
    "flavors",
    "lblen",
    "nflen",
)
POLICY_KEYS = ("node", "destination", "mode", "segs", "dev", "table", "metric")
SESSION_KEYS = (
    "ssid",
    "sender",
    "reflector",
    "segs",
    "return_segs",
    "rate_pps",
    "mode",
    "format",
    "padding_bytes",
    "start",
    "duration_s",
    "reduced",
)
STAMP_END_KEYS = ("node", "address", "dev")
LINK_PROBE_KEYS = ("link", "ssid", "from", "to", "rate_pps", "format", "start", "duration_s")
FLOW_KEYS = ("flow_id", "ingress", "egress", "segs", "method", "period_ms", "dmark_every", "dscp_l_bit", "dscp_d_bit")
FLOW_END_KEYS = ("node", "dev")
INLINE_KEYS = (
    "flow_id",
    "ingress",
    "egress",
    "segs",
    "sampling",
    "namespace",
    "trace_nodes",
    "transit",
    "match",
)
SAMPLING_KEYS = ("every", "interval_us")
MATCH_KEYS = ("src", "dst", "proto", "sport", "dport")


class _Checker:
    """Validation helpers that record problems on the doc instead of raising."""

    def __init__(self, doc: MarkedDoc, base_dir: Path, graph=None):
        self.doc = doc
        self.base_dir = base_dir
        self.usid: CsidFormat | None = None  # the `usid:` domain, parsed before every section
        self._graph_reader = graph  # () -> Topology, for `candidates: {k_shortest: K}`
        self._topology = None

    def topology(self):
        """The topology graph, read once per file (every k_shortest entry resolves on the same)."""
        if self._topology is None:
            from controller.steer.resolve import graph_from_env

            self._topology = (self._graph_reader or graph_from_env)()
        return self._topology

    def err(self, where: tuple, what: str, fix: str = "", at_key: bool = False) -> None:
        self.doc.error(where, what, fix, at_key)

    def mapping(self, where: tuple, value: Any, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> bool:
        if not isinstance(value, dict):
            self.err(
                where, f"expected a mapping, got {_show(value)}", f"write a mapping with keys {', '.join(allowed)}"
            )
            return False
        for key in value:
            if key not in allowed:
                close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
                fix = f"did you mean `{close[0]}`?" if close else f"use one of: {', '.join(allowed)}"
                self.err(where + (key,), f"unknown key {key!r}", fix, at_key=True)
        for key in required:
            if key not in value:
                self.err(where, f"missing key `{key}`", f"add `{key}: ...`")
        return True

    def listing(self, where: tuple, value: Any, what: str) -> list:
        if value is None:
            return []
        if not isinstance(value, list):
            self.err(where, f"expected a list of {what}, got {_show(value)}", f"write `- ...` items, one per {what}")
            return []
        return value

    def string(self, where: tuple, value: Any, what: str) -> str:
        if not isinstance(value, str) or not value:
            self.err(where, f"{what} must be a non-empty string, got {_show(value)}", f"write the {what} in quotes")
            return ""
        return value

    def integer(self, where: tuple, value: Any, what: str, lo: int, hi: int, fix: str = "") -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.err(
                where, f"{what} must be an integer, got {_show(value)}", fix or f"write an integer in [{lo}, {hi}]"
            )
            return lo
        if value < lo:
            self.err(
                where,
                f"{value} must be >= {lo}" if lo != 1 else f"{value} must be > 0",
                fix or f"write an integer in [{lo}, {hi}]",
            )
        elif value > hi:
            self.err(where, f"{value} must be <= {hi}", fix or f"write an integer in [{lo}, {hi}]")
        return value

    def number_pos(self, where: tuple, value: Any, what: str, hi: float) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.err(where, f"{what} must be a number, got {_show(value)}", f"write a number in (0, {hi:g}]")
            return 0.0
        if value <= 0:
            self.err(where, f"{value:g} must be > 0", f"write a positive number of packets per second, at most {hi:g}")
        elif value > hi:
            self.err(where, f"{value:g} must be <= {hi:g}", f"write at most {hi:g}")
        return float(value)

    def boolean(self, where: tuple, value: Any) -> bool:
        if not isinstance(value, bool):
            self.err(where, f"expected true or false, got {_show(value)}", "write true or false")
            return False
        return value

    def choice(self, where: tuple, value: Any, choices: tuple[str, ...], what: str) -> str:
        if value not in choices:
            close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.5)
            hint = f"did you mean `{close[0]}`? " if close else ""
            self.err(where, f"{what} {_show(value)} is not known", f"{hint}use one of: {', '.join(choices)}")
            return choices[0]
        return value

    def ipv6(self, where: tuple, value: Any, what: str = "address") -> str:
        if isinstance(value, str):
            try:
                return str(ipaddress.IPv6Address(value))
            except ValueError:
                pass
        self.err(
            where, f"{_show(value)} is not an IPv6 {what}", 'write a plain IPv6 address in quotes, like "fc00:2::e"'
        )
        return ""

    def ipv4(self, where: tuple, value: Any) -> str:
        if isinstance(value, str):
            try:
                return str(ipaddress.IPv4Address(value))
            except ValueError:
                pass
        self.err(where, f"{_show(value)} is not an IPv4 address", 'write it in quotes, like "10.0.0.1"')
        return ""

    def prefix(self, where: tuple, value: Any) -> str:
        if not isinstance(value, str):
            self.err(where, f"{_show(value)} is not an IPv6 prefix", 'write it like "fd00:b::/64", in quotes')
            return ""
        text = value if "/" in value else value + "/128"
        try:
            net = ipaddress.IPv6Network(text, strict=False)
        except ValueError:
            self.err(where, f"{value!r} is not an IPv6 prefix", 'write it like "fd00:b::/64", in quotes')
            return ""
        if net.network_address != ipaddress.IPv6Interface(text).ip:
            self.err(where, f"{value!r} has host bits set", f'write "{net}"')
        return str(net)

    def sid_list(self, where: tuple, value: Any, allow_empty: bool, limit: int = MAX_SIDS) -> tuple[str, ...]:
        if value is None and allow_empty:
            return ()
        if not isinstance(value, list) or (not value and not allow_empty):
            self.err(
                where,
                f"expected a {'' if allow_empty else 'non-empty '}list of SIDs, got {_show(value)}",
                'write ["fc00:2::e", "fc00:3::d6"] (visiting order)',
            )
            return ()
        if len(value) > limit:
            self.err(where, f"{len(value)} SIDs, at most {limit} are supported here", f"use at most {limit} SIDs")
        return tuple(self.segment(where + (i,), sid) for i, sid in enumerate(value))

    def segment(self, where: tuple, value: Any) -> str:
        """One SID of a list: a full SID, a container written as an address (checked when it is
        in the `usid:` block), or a container written as `{usids: [...]}`; the address."""
        if isinstance(value, dict):
            return self.container(where, value)
        addr = self.ipv6(where, value, "SID")
        if addr and self.usid and self.usid.in_block(addr):
            problem = self.usid.container_problem(addr)
            if problem:
                self.err(where, f"container {addr} {problem}", "write the micro-SIDs in travel order, no zero between")
        return addr

    def container(self, where: tuple, raw: dict) -> str:
        """`{usids: ["100", "200"], block: "fcbb:bbbb::/32"}` -> the container address."""
        if not self.mapping(where, raw, CONTAINER_KEYS, required=("usids",)):
            return ""
        fmt = self.usid
        if fmt is None:
            self.err(
                where, "a uSID container needs the `usid:` domain", 'add `usid: {block: "fcbb:bbbb::/32", nflen: 16}`'
            )
            return ""
        if "block" in raw:
            block = self.prefix(where + ("block",), raw["block"])
            if block and block != str(fmt.block):
                self.err(
                    where + ("block",),
                    f"block {block} is not the uSID block {fmt.block}",
                    f'write `block: "{fmt.block}"` or leave it out',
                )
        usids = raw.get("usids")
        if not isinstance(usids, list) or not usids:
            self.err(
                where + ("usids",), f"expected a list of micro-SIDs, got {_show(usids)}", 'write ["100", "200"] (hex)'
            )
            return ""
        if len(usids) > fmt.capacity:
            self.err(
                where + ("usids",),
                f"{len(usids)} micro-SIDs do not fit in one container: block /{fmt.lblen} leaves "
                f"{128 - fmt.lblen} bits = {fmt.capacity} micro-SIDs of {fmt.nflen} bits",
                f"split them into containers of at most {fmt.capacity} micro-SIDs",
            )
            return ""
        values = [self.usid_value(where + ("usids", i), u, fmt.nflen) for i, u in enumerate(usids)]
        return fmt.pack(values) if all(values) else ""

    def usid_value(self, where: tuple, value: Any, nflen: int) -> int:
        """One micro-SID, written in hex as in an address ("100"); 0 when it is not valid."""
        hi = (1 << nflen) - 1
        fix = f'write 1..{hi:x} in hex, in quotes ("100")'
        try:
            number = int(value, 16) if isinstance(value, str) else None
        except ValueError:
            number = None
        if number is None:
            self.err(where, f"micro-SID {_show(value)} is not a hex number", fix)
            return 0
        if number == 0:
            self.err(where, "micro-SID 0 is the end of a container", f"{fix}; end the list instead")
            return 0
        if number > hi:
            self.err(where, f"micro-SID {value} is wider than {nflen} bits", fix)
            return 0
        return number

    def ifname(self, where: tuple, value: Any) -> str:
        if not isinstance(value, str) or not IFNAME_RE.match(value):
            self.err(where, f"{_show(value)} is not an interface name", "write e.g. `dev: a0` (1-15 characters)")
            return ""
        return value

    def node_ref(self, where: tuple, value: Any, nodes: dict) -> str:
        if not isinstance(value, str) or value not in nodes:
            close = difflib.get_close_matches(str(value), list(nodes), n=1, cutoff=0.5)
            hint = f"did you mean `{close[0]}`? " if close else ""
            self.err(
                where,
                f"unknown node {_show(value)}",
                f"{hint}use a node defined under `nodes:` ({', '.join(sorted(nodes)) or 'none defined'})",
            )
            return ""
        return value

    def expand(self, where: tuple, value: str) -> str:
        """${VAR} / ${VAR:-default} from the environment (agent addresses and TLS paths only)."""

        def sub(m: re.Match) -> str:
            if m.group(1) in os.environ:
                return os.environ[m.group(1)]
            if m.group(2) is not None:
                return m.group(2)
            self.err(
                where,
                f"environment variable {m.group(1)} is not set",
                f"export {m.group(1)}=... or write ${{{m.group(1)}:-default}}",
            )
            return ""

        return ENV_RE.sub(sub, value)

    def path(self, where: tuple, value: Any, what: str) -> str:
        text = self.expand(where, self.string(where, value, what))
        if not text:
            return ""
        path = Path(text)
        if not path.is_absolute():
            path = self.base_dir / path
        return str(path)


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing"
    return repr(value) if isinstance(value, str) else str(value)


# ---------------------------------------------------------------------------- sections


def _parse_node(c: _Checker, where: tuple, name: Any, raw: Any) -> NodeSpec | None:
    if not isinstance(name, str) or not NODE_NAME_RE.match(name):
        c.err(where, f"node name {name!r} is not valid", batch_envelope.NODE_NAME_RULE, at_key=True)
    if not c.mapping(where, raw, NODE_KEYS, required=("agent", "tls")):
        return None
    agent = ""
    if "agent" in raw:
        agent = c.expand(where + ("agent",), c.string(where + ("agent",), raw["agent"], "agent address"))
        if agent and not re.match(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):\d{1,5}$", agent):
            c.err(
                where + ("agent",),
                f"agent address {agent!r} is not HOST:PORT",
                'write e.g. "127.0.0.1:50051" or "[fc00:1::1]:50051"',
            )
        elif agent and not 0 < int(agent.rsplit(":", 1)[1]) < 65536:
            c.err(where + ("agent",), f"port of {agent!r} is out of range", "use a port in 1..65535")
    tls = None
    if "tls" in raw and c.mapping(where + ("tls",), raw["tls"], TLS_KEYS, required=("ca", "cert", "key")):
        t = raw["tls"]
        tls = TlsFiles(
            ca=c.path(where + ("tls", "ca"), t.get("ca"), "CA file") if "ca" in t else "",
            cert=c.path(where + ("tls", "cert"), t.get("cert"), "certificate file") if "cert" in t else "",
            key=c.path(where + ("tls", "key"), t.get("key"), "key file") if "key" in t else "",
            server_name=c.expand(
                where + ("tls", "server_name"),
                c.string(where + ("tls", "server_name"), t["server_name"], "server name"),
            )
            if "server_name" in t
            else None,
        )
    ioam_id = None
    if "ioam_id" in raw:
        ioam_id = c.integer(
            where + ("ioam_id",),
            raw["ioam_id"],
            "ioam_id",
            1,
            MAX_IOAM_ID,
            f"write the node's IOAM node id in 1..{MAX_IOAM_ID}, or leave it out for the default "
            "derived from the node name",
        )
    if tls is None:
        return None
    return NodeSpec(name=str(name), agent=agent, tls=tls, ioam_id=ioam_id)


def _parse_local_sid(c: _Checker, where: tuple, raw: Any, nodes: dict) -> LocalSid | None:
    if not c.mapping(where, raw, LOCAL_SID_KEYS, required=("node", "sid", "action", "dev")):
        return None
    node = c.node_ref(where + ("node",), raw.get("node"), nodes) if "node" in raw else ""
    flavors = _parse_flavors(c, where, raw)
    csid = _parse_csid_lengths(c, where, raw) if "next-csid" in flavors else {}
    sid = ""
    if "next-csid" in flavors:
        sid = _parse_csid_locator(c, where + ("sid",), raw.get("sid"), csid) if "sid" in raw else ""
    elif "sid" in raw:
        text = raw["sid"][:-4] if isinstance(raw["sid"], str) and raw["sid"].endswith("/128") else raw["sid"]
        # a prefix is a function in a locator (a uDT6 "fcbb:bbbb:300:d6::/64"), else an address
        sid = (
            c.prefix(where + ("sid",), text)
            if isinstance(text, str) and "/" in text
            else c.ipv6(where + ("sid",), text, "SID")
        )
    action = (
        c.choice(where + ("action",), raw.get("action"), tuple(LOCAL_SID_ACTIONS), "action")
        if "action" in raw
        else "End"
    )
    needs = LOCAL_SID_ACTIONS.get(action, ())
    for param in ACTION_PARAMS:
        if param in raw and param not in needs:
            c.err(
                where + (param,),
                f"action {action} takes no `{param}`",
                f"remove it ({action} takes {', '.join(needs) or 'no parameter'})",
                at_key=True,
            )
    for param in needs:
        if param not in raw:
            c.err(
                where,
                f"action {action} needs `{param}`",
                {
                    "lookup_table": "add `lookup_table: 254` (the main table)",
                    "nh6": 'add `nh6: "<next-hop IPv6>"`',
                    "nh4": 'add `nh4: "<next-hop IPv4>"`',
                    "segs": 'add `segs: ["<SID>", ...]`',
                }[param],
            )
    table = c.integer(where + ("table",), raw["table"], "table", 1, 2**32 - 2) if "table" in raw else MAIN_TABLE
    lookup = (
        c.integer(where + ("lookup_table",), raw["lookup_table"], "lookup_table", 1, 2**32 - 2)
        if "lookup_table" in raw
        else 0
    )
    nh6 = c.ipv6(where + ("nh6",), raw["nh6"], "next hop") if "nh6" in raw else ""
    nh4 = c.ipv4(where + ("nh4",), raw["nh4"]) if "nh4" in raw else ""
    segs = c.sid_list(where + ("segs",), raw["segs"], allow_empty=False, limit=MAX_POLICY_SIDS) if "segs" in raw else ()
    dev = c.ifname(where + ("dev",), raw["dev"]) if "dev" in raw else ""
    count = c.boolean(where + ("count",), raw["count"]) if "count" in raw else False
    return LocalSid(
        node=node,
        sid=sid,
        action=action,
        dev=dev,
        table=table,
        lookup_table=lookup,
        nh6=nh6,
        nh4=nh4,
        segs=segs,
        count=count,
        flavors=flavors,
        **csid,
    )


def _parse_flavors(c: _Checker, where: tuple, raw: dict) -> tuple[str, ...]:
    for name in ("lblen", "nflen"):
        if name in raw and "next-csid" not in (raw.get("flavors") or ()):
            c.err(where + (name,), f"`{name}` is a next-csid length", "add `flavors: [next-csid]` or remove it", True)
    if "flavors" not in raw:
        return ()
    chosen: list[str] = []
    for i, f in enumerate(c.listing(where + ("flavors",), raw["flavors"], "flavour")):
        if f not in FLAVORS:
            c.choice(where + ("flavors", i), f, FLAVORS, "flavour")  # records the problem
            continue
        if f in chosen:
            c.err(where + ("flavors", i), f"flavour {f} is listed twice", "list each flavour once")
        chosen.append(f)
    return tuple(f for f in FLAVORS if f in chosen)


def _parse_csid_lengths(c: _Checker, where: tuple, raw: dict) -> dict:
    """lblen/nflen of a next-csid SID: written, else the `usid:` domain's, else the kernel's."""
    fmt = c.usid
    lblen = raw.get("lblen", fmt.lblen if fmt else DEFAULT_LBLEN)
    nflen = raw.get("nflen", fmt.nflen if fmt else DEFAULT_NFLEN)
    lblen = _csid_bits(c, where + ("lblen",), lblen, "lblen")
    nflen = _csid_bits(c, where + ("nflen",), nflen, "nflen")
    if not (lblen and nflen):
        return {"lblen": 0, "nflen": 0}
    if lblen + nflen > 128:
        c.err(where + ("nflen",), f"lblen {lblen} + nflen {nflen} is more than 128 bits", "make them add up to <= 128")
    if fmt and (lblen, nflen) != (fmt.lblen, fmt.nflen):
        c.err(
            where + ("lblen" if lblen != fmt.lblen else "nflen",),
            f"lblen {lblen} / nflen {nflen} differ from the uSID domain ({fmt.block}, nflen {fmt.nflen})",
            "leave lblen and nflen out (the domain's apply)",
        )
    return {"lblen": lblen, "nflen": nflen}


def _csid_bits(c: _Checker, where: tuple, value: Any, name: str) -> int:
    """A NEXT-C-SID length the kernel takes, or 0 (the problem recorded)."""
    if isinstance(value, bool) or not isinstance(value, int):
        c.err(where, f"{name} must be an integer, got {_show(value)}", "write a multiple of 8 in 8..120")
        return 0
    if length_problem(value, name):
        c.err(where, length_problem(value, name), "write a multiple of 8 in 8..120")
        return 0
    return value


def _parse_csid_locator(c: _Checker, where: tuple, value: Any, csid: dict) -> str:
    """A next-csid SID's prefix: block + the node's micro-SID, length lblen + nflen."""
    want = csid.get("lblen", 0) + csid.get("nflen", 0)
    if isinstance(value, str) and "/" not in value:
        c.err(where, f"a next-csid SID is a locator prefix, not the address {value!r}", f'write "{value}/{want}"')
        return ""
    text = c.prefix(where, value)
    if not text or not want:
        return text
    net = ipaddress.IPv6Network(text)
    if net.prefixlen != want:
        c.err(
            where,
            f"{text} is a /{net.prefixlen}, the next-csid locator is block + micro-SID = /{want}",
            f"write {net.network_address}/{want}",
        )
    elif c.usid and not c.usid.in_block(str(net.network_address)):
        c.err(where, f"{text} is not in the uSID block {c.usid.block}", f"use a micro-SID of block {c.usid.block}")
    elif int(net.network_address) >> (128 - want) & ((1 << csid["nflen"]) - 1) == 0:
        c.err(where, f"{text} has micro-SID 0 (the end of a container)", "give the node a non-zero micro-SID")
    return text


def _parse_usid(c: _Checker, raw: Any) -> CsidFormat | None:
    """The `usid:` domain: the locator block (its length is lblen) and the micro-SID width."""
    where = ("usid",)
    if not c.mapping(where, raw, USID_KEYS, required=("block",)):
        return None
    block = c.prefix(where + ("block",), raw.get("block")) if "block" in raw else ""
    nflen = _csid_bits(c, where + ("nflen",), raw.get("nflen", DEFAULT_NFLEN), "nflen")
    lblen = ipaddress.IPv6Network(block).prefixlen if block else 0
    if lblen and length_problem(lblen, "block length"):
        c.err(
            where + ("block",), length_problem(lblen, "block length"), "write a block whose length is a multiple of 8"
        )
        return None
    if not (lblen and nflen):
        return None
    if lblen + nflen > 128:
        c.err(
            where + ("nflen",), f"block /{lblen} + nflen {nflen} is more than 128 bits", "use a shorter block or nflen"
        )
        return None
    return CsidFormat.parse(block, nflen)


def _parse_policy(c: _Checker, where: tuple, raw: Any, nodes: dict) -> Policy | None:
    if not c.mapping(where, raw, POLICY_KEYS, required=("node", "destination", "segs", "dev")):
        return None
    node = c.node_ref(where + ("node",), raw.get("node"), nodes) if "node" in raw else ""
    destination = c.prefix(where + ("destination",), raw.get("destination")) if "destination" in raw else ""
    mode = c.choice(where + ("mode",), raw.get("mode", "encap"), POLICY_MODES, "mode")
    segs = (
        c.sid_list(where + ("segs",), raw.get("segs"), allow_empty=False, limit=MAX_POLICY_SIDS)
        if "segs" in raw
        else ()
    )
    dev = c.ifname(where + ("dev",), raw["dev"]) if "dev" in raw else ""
    table = c.integer(where + ("table",), raw["table"], "table", 1, 2**32 - 2) if "table" in raw else MAIN_TABLE
    metric = c.integer(where + ("metric",), raw["metric"], "metric", 0, 2**32 - 1) if "metric" in raw else 0
    written = tuple(written_segment(s) for s in raw.get("segs") or ()) if isinstance(raw.get("segs"), list) else ()
    return Policy(
        node=node, destination=destination, mode=mode, segs=segs, dev=dev, table=table, metric=metric, written=written
    )


def written_segment(raw: Any) -> str:
    """A segment as the operator wrote it: the address, or usid(100,200,300) for a container."""
    if isinstance(raw, dict):
        return f"usid({','.join(str(u) for u in raw.get('usids') or ())})"
    return str(raw)


def _parse_stamp_end(c: _Checker, where: tuple, raw: Any, nodes: dict) -> StampEnd | None:
    if not c.mapping(where, raw, STAMP_END_KEYS, required=("node", "address", "dev")):
        return None
    node = c.node_ref(where + ("node",), raw.get("node"), nodes) if "node" in raw else ""
    address = c.ipv6(where + ("address",), raw.get("address")) if "address" in raw else ""
    dev = c.ifname(where + ("dev",), raw["dev"]) if "dev" in raw else ""
    return StampEnd(node=node, address=address, dev=dev)


def _parse_session(c: _Checker, where: tuple, raw: Any, nodes: dict) -> StampSession | None:
    if not c.mapping(where, raw, SESSION_KEYS, required=("ssid", "sender", "reflector")):
        return None
    ssid = (
        c.integer(
            where + ("ssid",),
            raw.get("ssid"),
            "ssid",
            1,
            65535,
            "write a STAMP Session Identifier in 1..65535 (RFC 8972)",
        )
        if "ssid" in raw
        else 0
    )
    sender = _parse_stamp_end(c, where + ("sender",), raw["sender"], nodes) if "sender" in raw else None
    reflector = _parse_stamp_end(c, where + ("reflector",), raw["reflector"], nodes) if "reflector" in raw else None
    segs = c.sid_list(where + ("segs",), raw.get("segs"), allow_empty=True)
    return_segs = c.sid_list(where + ("return_segs",), raw.get("return_segs"), allow_empty=True)
    rate = (
        c.integer(
            where + ("rate_pps",),
            raw["rate_pps"],
            "rate_pps",
            1,
            MAX_RATE_PPS,
            f"write a whole number of test packets per second in 1..{MAX_RATE_PPS}",
        )
        if "rate_pps" in raw
        else 10
    )
    mode = c.choice(where + ("mode",), raw.get("mode", "unauthenticated"), STAMP_MODES, "mode")
    fmt = c.choice(where + ("format",), raw.get("format", "ptp"), STAMP_FORMATS, "format")
    padding = (
        c.integer(where + ("padding_bytes",), raw["padding_bytes"], "padding_bytes", 0, 1400)
        if "padding_bytes" in raw
        else 0
    )
    start = c.boolean(where + ("start",), raw["start"]) if "start" in raw else True
    reduced = c.boolean(where + ("reduced",), raw["reduced"]) if "reduced" in raw else False
    duration = 0.0
    if "duration_s" in raw:
        d = raw["duration_s"]
        if isinstance(d, bool) or not isinstance(d, (int, float)) or d < 0:
            c.err(
                where + ("duration_s",),
                f"{_show(d)} must be a number >= 0",
                "write the seconds of one finite run, or 0 to send until stopped",
            )
        else:
            duration = float(d)
    if sender and reflector and sender.node and sender.node == reflector.node:
        c.err(
            where + ("reflector", "node"),
            f"sender and reflector are both node {sender.node}",
            "put the reflector on another node",
        )
    if sender is None or reflector is None:
        return None
    if reduced:
        _check_reduced(c, where, segs, reflector.address)
    return StampSession(
        ssid=ssid,
        sender=sender,
        reflector=reflector,
        segs=segs,
        return_segs=return_segs,
        rate_pps=rate,
        mode=mode,
        format=fmt,
        padding_bytes=padding,
        start=start,
        duration_s=duration,
        reduced=reduced,
        written=",".join(written_segment(x) for x in raw["segs"]) if isinstance(raw.get("segs"), list) else "",
    )


def _check_reduced(c: _Checker, where: tuple, segs: tuple[str, ...], reflector_address: str) -> None:
    """A reduced session sends to one uSID container with no SRH; the reflector answers at the
    address the container has after its last shift (the UDP checksum is computed for it)."""
    if c.usid is None:
        c.err(
            where + ("reduced",), "a reduced session needs the usid: domain", "declare `usid: {block: ..., nflen: 16}`"
        )
        return
    if len(segs) != 1:
        c.err(
            where + ("segs",),
            f"{len(segs)} SIDs with reduced: true",
            "give exactly one, the uSID container the destination holds",
        )
        return
    if not c.usid.in_block(segs[0]) or c.usid.container_problem(segs[0]):
        c.err(
            where + ("segs", 0),
            f"{segs[0]} is not a uSID container of block {c.usid.block}",
            "write the container as {usids: [...]} or its address in the block",
        )
        return
    last = c.usid.shifts(segs[0])[-1]
    if _same_ip(last, reflector_address) is False:
        c.err(
            where + ("reflector", "address"),
            f"{reflector_address} is not where container {segs[0]} ends: after its last shift it is {last}",
            f"write address: \"{last}\" (the reflector's micro-SID address)",
        )


def _renamed(c: _Checker, names: dict[str, str]) -> _Checker:
    """A checker that reports a problem under the key the operator wrote: a link probe is parsed
    as a STAMP session whose `from`/`to` are the session's sender/reflector."""
    out = copy.copy(c)

    def err(where: tuple, what: str, fix: str = "", at_key: bool = False) -> None:
        c.err(tuple(names.get(k, k) if isinstance(k, str) else k for k in where), what, fix, at_key)

    out.err = err
    return out


def _parse_link_probe(c: _Checker, where: tuple, raw: Any, nodes: dict) -> StampSession | None:
    """A STAMP session over one link: from one end's address on the link to the other end's
    address on it (a connected route, so the probe cannot take another link). Its dev on both
    ends is the link's interface: the reflector answers out of the interface the probe came in
    on, so the reply crosses the same link back."""
    if not c.mapping(where, raw, LINK_PROBE_KEYS, required=("link", "ssid", "from", "to")):
        return None
    link = raw.get("link")
    if "link" in raw and (not isinstance(link, str) or not link.strip()):
        c.err(where + ("link",), f"{_show(link)} is not a link name", "write the link's name, e.g. `link: a1`")
        return None
    if not all(k in raw for k in ("link", "ssid", "from", "to")):
        return None  # reported by mapping()
    session_raw = {k: v for k, v in raw.items() if k not in ("link", "from", "to")}
    session_raw.update(sender=raw["from"], reflector=raw["to"])
    session = _parse_session(_renamed(c, {"sender": "from", "reflector": "to"}), where, session_raw, nodes)
    if session is None:
        return None
    if _same_ip(session.sender.address, session.reflector.address):
        c.err(
            where + ("to", "address"),
            f"both ends of link {link} have address {session.sender.address}",
            "write each end's own address on the link",
        )
    return replace(session, link=link.strip(), written=f"link:{link.strip()}")


def _parse_flow(c: _Checker, where: tuple, raw: Any, nodes: dict) -> Flow | None:
    if not c.mapping(where, raw, FLOW_KEYS, required=("flow_id", "ingress", "egress", "segs")):
        return None
    method = c.choice(where + ("method",), raw.get("method", "dscp"), FLOW_METHODS, "method")
    hi = 0xFFFFF if method == "rfc9343" else 2**32 - 1
    flow_id = (
        c.integer(
            where + ("flow_id",),
            raw.get("flow_id"),
            "flow_id",
            1,
            hi,
            "an rfc9343 flow id is its FlowMonID: 1..1048575" if method == "rfc9343" else "",
        )
        if "flow_id" in raw
        else 0
    )
    ends = []
    for side in ("ingress", "egress"):
        end = None
        if side in raw and c.mapping(where + (side,), raw[side], FLOW_END_KEYS, required=("node", "dev")):
            r = raw[side]
            end = StampEnd(
                node=c.node_ref(where + (side, "node"), r.get("node"), nodes) if "node" in r else "",
                address="",
                dev=c.ifname(where + (side, "dev"), r["dev"]) if "dev" in r else "",
            )
        ends.append(end)
    segs = c.sid_list(where + ("segs",), raw.get("segs"), allow_empty=False) if "segs" in raw else ()
    period = c.integer(where + ("period_ms",), raw.get("period_ms", 1000), "period_ms", 1, 3_600_000)
    dmark = c.integer(where + ("dmark_every",), raw.get("dmark_every", 0), "dmark_every", 0, 1 << 20)
    bits = []
    for name, default in (("dscp_l_bit", 0), ("dscp_d_bit", 1)):
        if name in raw and method != "dscp":
            c.err(where + (name,), f"{name} only applies to method dscp", "remove it", at_key=True)
        bits.append(c.integer(where + (name,), raw.get(name, default), name, 0, 5))
    if bits[0] == bits[1] and method == "dscp":
        c.err(
            where + ("dscp_d_bit",),
            f"the colour bit and the delay bit are both DSCP bit {bits[0]}",
            "use two different DSCP bits (defaults: L=0, D=1)",
        )
    if ends[0] and ends[1] and ends[0].node and ends[0].node == ends[1].node:
        c.err(
            where + ("egress", "node"),
            f"ingress and egress are both node {ends[0].node}",
            "the egress is the node at the other end of the SID list",
        )
    if ends[0] is None or ends[1] is None:
        return None
    return Flow(
        flow_id=flow_id,
        ingress=ends[0],
        egress=ends[1],
        segs=segs,
        method=method,
        period_ms=period,
        dmark_every=dmark,
        dscp_l_bit=bits[0],
        dscp_d_bit=bits[1],
        written=",".join(written_segment(x) for x in raw["segs"]) if isinstance(raw.get("segs"), list) else "",
    )


def _parse_inline_end(c: _Checker, where: tuple, raw: Any, nodes: dict) -> StampEnd | None:
    if not c.mapping(where, raw, FLOW_END_KEYS, required=("node", "dev")):
        return None
    return StampEnd(
        node=c.node_ref(where + ("node",), raw.get("node"), nodes) if "node" in raw else "",
        address="",
        dev=c.ifname(where + ("dev",), raw["dev"]) if "dev" in raw else "",
    )


def _parse_match(c: _Checker, where: tuple, raw: Any) -> InlineMatch:
    if not c.mapping(where, raw, MATCH_KEYS):
        return InlineMatch()
    nets = {}
    for name in ("src", "dst"):
        if name in raw:
            nets[name] = c.prefix(where + (name,), raw[name])  # the inner IPv6 packet (ioam_tx's filter)
    proto = (
        c.integer(where + ("proto",), raw["proto"], "proto", 1, 255, "write an IP protocol number, e.g. 17 for UDP")
        if "proto" in raw
        else 0
    )
    ports = []
    for name in ("sport", "dport"):
        port = c.integer(where + (name,), raw[name], name, 1, 65535) if name in raw else 0
        if name in raw and proto not in PORT_PROTOCOLS:
            c.err(
                where + (name,),
                f"{name} needs `proto` 6 (TCP) or 17 (UDP)",
                "add `proto: 17` (or 6), or remove the port",
                at_key=True,
            )
        ports.append(port)
    return InlineMatch(src=nets.get("src", ""), dst=nets.get("dst", ""), proto=proto, sport=ports[0], dport=ports[1])


def _parse_inline(c: _Checker, where: tuple, raw: Any, nodes: dict) -> InlineMonitor | None:
    if not c.mapping(where, raw, INLINE_KEYS, required=("flow_id", "ingress", "egress", "segs", "sampling")):
        return None
    flow_id = c.integer(where + ("flow_id",), raw.get("flow_id"), "flow_id", 1, 2**32 - 1) if "flow_id" in raw else 0
    ingress = _parse_inline_end(c, where + ("ingress",), raw["ingress"], nodes) if "ingress" in raw else None
    egress = _parse_inline_end(c, where + ("egress",), raw["egress"], nodes) if "egress" in raw else None
    segs = c.sid_list(where + ("segs",), raw.get("segs"), allow_empty=False) if "segs" in raw else ()
    every = interval = 0
    if "sampling" in raw and c.mapping(where + ("sampling",), raw["sampling"], SAMPLING_KEYS):
        smp = raw["sampling"]
        known = [k for k in smp if k in SAMPLING_KEYS]
        if len(known) == 2 or not smp:
            c.err(
                where + ("sampling",),
                "sampling needs exactly one of `every` and `interval_us`" if smp else "sampling is empty",
                "write `sampling: {every: 100}` (one packet in 100) or `sampling: {interval_us: 1000}` "
                "(at most one packet per 1000 us)",
            )
        elif not known:
            pass  # only unknown keys: reported by mapping() with a did-you-mean
        elif "every" in smp:
            every = c.integer(
                where + ("sampling", "every"),
                smp["every"],
                "sampling.every",
                1,
                MAX_SAMPLE_EVERY,
                f"write N in 1..{MAX_SAMPLE_EVERY}: one packet in N carries the IOAM options (1 = every packet)",
            )
        else:
            interval = c.integer(
                where + ("sampling", "interval_us"),
                smp["interval_us"],
                "sampling.interval_us",
                1,
                MAX_SAMPLE_INTERVAL_US,
                f"write M in 1..{MAX_SAMPLE_INTERVAL_US}: at most one packet per M microseconds",
            )
    namespace = (
        c.integer(
            where + ("namespace",),
            raw["namespace"],
            "namespace",
            1,
            0xFFFF,
            "write an IOAM Namespace-ID in 1..65535 (default 1)",
        )
        if "namespace" in raw
        else 1
    )
    default_slots = min(len(segs) + 1, MAX_TRACE_NODES)
    trace_nodes = (
        c.integer(
            where + ("trace_nodes",),
            raw["trace_nodes"],
            "trace_nodes",
            1,
            MAX_TRACE_NODES,
            f"write the trace's capacity in nodes, the ingress included, in 1..{MAX_TRACE_NODES} "
            f"(default len(segs) + 1 = {default_slots})",
        )
        if "trace_nodes" in raw
        else default_slots
    )
    transit: tuple[str, ...] = ()
    if "transit" in raw:
        t = raw["transit"]
        if t == "all":
            transit = tuple(sorted(nodes))
        elif isinstance(t, list):
            seen: set[str] = set()
            for i, name in enumerate(t):
                node = c.node_ref(where + ("transit", i), name, nodes)
                if node in seen:
                    c.err(where + ("transit", i), f"node {node} is listed twice", "list each transit node once")
                seen.add(node)
            transit = tuple(sorted(n for n in seen if n))
        else:
            c.err(
                where + ("transit",),
                f"expected `all` or a list of nodes, got {_show(t)}",
                "write `transit: [R1, R2]` (the nodes that fill the trace) or `transit: all`",
            )
    match = _parse_match(c, where + ("match",), raw["match"]) if "match" in raw else InlineMatch()
    if ingress and egress and ingress.node and ingress.node == egress.node:
        c.err(
            where + ("egress", "node"),
            f"ingress and egress are both node {ingress.node}",
            "the egress is the node at the other end of the SID list",
        )
    if ingress is None or egress is None:
        return None
    return InlineMonitor(
        flow_id=flow_id,
        ingress=ingress,
        egress=egress,
        segs=segs,
        sample_every=every,
        sample_interval_us=interval,
        namespace=namespace,
        trace_nodes=trace_nodes,
        transit=transit,
        match=match,
    )


def _check_unique(c: _Checker, section: str, items: list[tuple[int, Any]], label) -> None:
    seen: dict[Any, int] = {}
    for index, item in items:
        key = item.key
        if key in seen:
            c.err(
                (section, index),
                f"duplicate {label(item)} (also {section}[{seen[key]}])",
                "keep one entry per key, or change one of them",
            )
        else:
            seen[key] = index


def _cross_checks(c: _Checker, intent: Intent, indexed: dict[str, list[tuple[int, Any]]]) -> None:
    _check_unique(
        c,
        "local_sids",
        indexed["local_sids"],
        lambda s: f"local SID {s.sid} on node {s.node}" + (f" table {s.table}" if s.table != MAIN_TABLE else ""),
    )
    _check_unique(
        c,
        "policies",
        indexed["policies"],
        lambda p: f"policy for {p.destination} on node {p.node}"
        + (f" table {p.table}" if p.table != MAIN_TABLE else ""),
    )
    sessions_seen: dict[tuple, tuple] = {}
    for where, s in _sessions(indexed):
        if s.key in sessions_seen:
            first = sessions_seen[s.key]
            c.err(
                where,
                f"duplicate STAMP session ssid {s.ssid} from node {s.sender.node} (also {first[0]}[{first[1]}])",
                "keep one entry per key, or change one of them",
            )
        sessions_seen.setdefault(s.key, where)
    _check_unique(c, "flows", indexed["flows"], lambda f: f"flow_id {f.flow_id}")
    # the datapath keys a flow by its SID list (and method) on each side: a second flow with the
    # same list on the same node would replace the first one there (the agent refuses it)
    seen_flows: dict[tuple, tuple[int, int]] = {}
    for index, f in indexed["flows"]:
        for end in (f.ingress, f.egress):
            k = (end.node, f.method, tuple(f.segs))
            if k in seen_flows and seen_flows[k][0] != f.flow_id:
                c.err(
                    ("flows", index, "segs"),
                    f"node {end.node} already monitors {','.join(f.segs)} ({f.method}) as flow_id "
                    f"{seen_flows[k][0]} (flows[{seen_flows[k][1]}])",
                    "monitor each SID list once per node (one flow per path)",
                )
                break
            seen_flows.setdefault(k, (f.flow_id, index))
    # an agent keys STAMP sessions by (role, ssid): one ssid per reflector node too
    refl_seen: dict[tuple, tuple] = {}
    for where, s in _sessions(indexed):
        k = (s.reflector.node, s.ssid)
        if k in refl_seen:
            first = refl_seen[k]
            c.err(
                where + ("ssid",),
                f"reflector node {s.reflector.node} already reflects ssid {s.ssid} ({first[0]}[{first[1]}])",
                "use another ssid",
            )
        refl_seen.setdefault(k, where)
    # a node may send and reflect on several devices (one program per role, attached to each of
    # them); one source address per sender device, since the agent's Init keys the role by device
    srcs: dict[tuple[str, str], tuple[str, tuple]] = {}
    for where, s in _sessions(indexed):
        k = (s.sender.node, s.sender.dev)
        if k in srcs and _same_ip(srcs[k][0], s.sender.address) is False:
            first = srcs[k][1]
            c.err(
                _role_key(where, "sender") + ("address",),
                f"{s.sender.node}:{s.sender.dev} already sends from {srcs[k][0]} ({first[0]}[{first[1]}])",
                f"use address {srcs[k][0]} for sessions whose replies arrive on {s.sender.dev}",
            )
        srcs.setdefault(k, (s.sender.address, where))
    # no check of XDP devices: the STAMP collector (sender dev), the STAMP reflector (reflector
    # dev) and a flow's RX side (egress dev) may share any device of a node in any combination;
    # the agent's programs run there through the node's XDP chain (datapath/README.md, "Chaining")


def steered_sid_lists(intent: Intent) -> dict[tuple, tuple[tuple[str, ...], ...]]:
    """(node, SID list) -> every SID list segscope-steer can give that node's steered policy: the
    policy's own and each candidate's, for each of those lists. An in-line monitor of one of them
    is one flow over all of them (its egress records the others as alternate paths)."""
    out: dict[tuple, tuple[tuple[str, ...], ...]] = {}
    for s in intent.steering:
        policy = next((p for p in intent.policies if p.key == s.key), None)
        own = [tuple(policy.segs)] if policy is not None else []
        paths = tuple(dict.fromkeys([*own, *(tuple(c.segs) for c in s.candidates)]))
        out.update({(s.node, p): paths for p in paths})
    return out


def _inline_checks(c: _Checker, intent: Intent, indexed: dict[str, list[tuple[int, Any]]]) -> None:
    _check_unique(c, "inline_monitors", indexed["inline_monitors"], lambda m: f"in-line monitor flow_id {m.flow_id}")
    # each side's datapath finds a flow by its SID list: a second monitor with the same list on the
    # same node would take the first one over (the agent refuses it)
    seen: dict[tuple, tuple[int, int]] = {}
    reported: set[int] = set()
    for index, m in indexed["inline_monitors"]:
        for side, end in (("egress", m.egress), ("ingress", m.ingress)):
            k = (side, end.node, tuple(m.segs))
            if k in seen and seen[k][0] != m.flow_id:
                c.err(
                    ("inline_monitors", index, "segs"),
                    f"the in-line monitor flow_id {seen[k][0]} (inline_monitors[{seen[k][1]}]) already has "
                    f"{','.join(m.segs)} at its {side} node {end.node}",
                    "monitor each SID list once (one in-line monitor per path); to sample differently, "
                    "change that monitor",
                )
                reported.add(index)
                break
            seen.setdefault(k, (m.flow_id, index))
    _steered_inline_checks(c, intent, indexed, reported)
    # one IOAM node id per node: a trace names its nodes by id
    if indexed["inline_monitors"]:
        ids: dict[int, str] = {}
        for name, node in sorted(intent.nodes.items()):
            nid = node.ioam_node_id
            if nid in ids:
                where = ("nodes", name, "ioam_id") if node.ioam_id is not None else ("nodes", name)
                c.err(
                    where,
                    f"IOAM node id {nid} is also node {ids[nid]}'s"
                    + ("" if node.ioam_id is not None else " (the default derived from the name)"),
                    f"set `ioam_id:` on node {name} to an id no other node has",
                )
            ids.setdefault(nid, name)


def _steered_inline_checks(
    c: _Checker, intent: Intent, indexed: dict[str, list[tuple[int, Any]]], reported: set[int]
) -> None:
    """A monitor of a steered policy's SID list records every candidate's list at its egress: no
    other monitor of that egress node may have one of them (ioam_rx finds a flow by its SID list)."""
    paths = steered_sid_lists(intent)
    held: dict[tuple, tuple[int, int]] = {}  # (egress node, SID list) -> (flow_id, index)
    for index, m in indexed["inline_monitors"]:
        mine = paths.get((m.ingress.node, tuple(m.segs)), (tuple(m.segs),))
        keys = [(m.egress.node, p) for p in dict.fromkeys([tuple(m.segs), *mine])]  # its own list first
        clash = next((k for k in keys if k in held and held[k][0] != m.flow_id), None)
        if clash is not None and index not in reported:
            flow_id, at = held[clash]
            c.err(
                ("inline_monitors", index, "segs"),
                f"{','.join(clash[1])} is recorded at {m.egress.node} by the in-line monitor flow_id {flow_id} "
                f"(inline_monitors[{at}]): a monitor of a steered policy records every candidate's SID list",
                "monitor a steered policy once (its monitor follows the policy over its candidates), or give "
                "this monitor a SID list that is no candidate",
            )
            continue
        for k in keys:
            held.setdefault(k, (m.flow_id, index))


SECTION_FIELD = {"link_probes": "stamp_sessions"}  # a link probe is a STAMP session of the Intent


def _sessions(indexed: dict[str, list[tuple[int, Any]]]) -> list[tuple[tuple, StampSession]]:
    """Every STAMP session with where it was written: stamp_sessions[i] or link_probes[i]."""
    return [((section, index), s) for section in ("stamp_sessions", "link_probes") for index, s in indexed[section]]


def _role_key(where: tuple, role: str) -> tuple:
    """The key of a session's sender/reflector end as written (`from`/`to` in a link probe)."""
    return where + ({"sender": "from", "reflector": "to"}[role] if where[0] == "link_probes" else role,)


def parse_intent(text: str, file: str = "intent.yaml", base_dir: Path | None = None, graph=None) -> Intent:
    """Validate text; returns the Intent or raises IntentError with every problem. `graph`: a
    callable giving the topology graph for k_shortest candidates (default: ArangoDB, the
    SEGSCOPE_ARANGO_* settings; read only when an entry has k_shortest)."""
    raw, doc = load_marked(text, file)
    c = _Checker(doc, base_dir or Path(file).resolve().parent, graph)
    intent = Intent(file=file)
    indexed: dict[str, list[tuple[int, Any]]] = {
        k: [] for k in ("local_sids", "policies", "stamp_sessions", "link_probes", "flows", "inline_monitors")
    }
    if doc.problems and raw is None:  # YAML syntax: nothing to validate
        raise IntentError(file, doc.problems)
    if raw is None:
        raise IntentError(
            file, [Problem(1, 1, "", "the file is empty", "start from controller/examples/demo_line5.yaml")]
        )
    if c.mapping((), raw, TOP_KEYS, required=("version", "nodes")):
        if "version" in raw and raw["version"] != 1:
            c.err(("version",), f"version {_show(raw['version'])} is not supported", "write `version: 1`")
        nodes_raw = raw.get("nodes")
        if "nodes" in raw:
            if not isinstance(nodes_raw, dict) or not nodes_raw:
                c.err(
                    ("nodes",),
                    f"expected a mapping of node name -> agent, got {_show(nodes_raw)}",
                    "write `nodes:` with `A: {agent: \"127.0.0.1:50051\", tls: {...}}` entries",
                )
            else:
                for name, node_raw in nodes_raw.items():
                    node = _parse_node(c, ("nodes", name), name, node_raw)
                    if node:
                        intent.nodes[node.name] = node
                agents: dict[str, str] = {}
                for node in intent.nodes.values():
                    if node.agent in agents:
                        c.err(
                            ("nodes", node.name, "agent"),
                            f"agent {node.agent} is also node {agents[node.agent]}'s",
                            "give every node its own agent address",
                        )
                    agents.setdefault(node.agent, node.name)
        known = nodes_raw if isinstance(nodes_raw, dict) else {}
        if "usid" in raw:
            intent.usid = c.usid = _parse_usid(c, raw["usid"])
        parsers = {
            "local_sids": _parse_local_sid,
            "policies": _parse_policy,
            "stamp_sessions": _parse_session,
            "link_probes": _parse_link_probe,
            "flows": _parse_flow,
            "inline_monitors": _parse_inline,
        }
        for section, parse in parsers.items():
            what = section.rstrip("s").replace("_", " ")
            for index, item_raw in enumerate(c.listing((section,), raw.get(section), what)):
                item = parse(c, (section, index), item_raw, known)
                if item is not None:
                    getattr(intent, SECTION_FIELD.get(section, section)).append(item)
                    indexed[section].append((index, item))
        _parse_steering_section(c, intent, raw.get("steering"), known)
        _cross_checks(c, intent, indexed)
        _inline_checks(c, intent, indexed)
    if doc.problems:
        raise IntentError(file, doc.problems)
    return intent


def _parse_steering_section(c: _Checker, intent: Intent, raw: Any, nodes: dict) -> None:
    """`steering:` entries; each candidate's STAMP session joins intent.stamp_sessions (checked
    here against the listed sessions: the same sender ssid twice is refused at the entry)."""
    from controller.steering import parse_steering, probe_sessions

    policies = {p.key: p for p in intent.policies}
    taken = {s.key: f"stamp_sessions[{i}]" for i, s in enumerate(intent.stamp_sessions)}
    steered: dict[tuple, int] = {}
    for index, item_raw in enumerate(c.listing(("steering",), raw, "steering entry")):
        s = parse_steering(c, ("steering", index), item_raw, nodes, policies)
        if s is None:
            continue
        if s.key in steered:
            c.err(
                ("steering", index),
                f"policy {s.label} is steered by steering[{steered[s.key]}] too",
                "keep one entry per policy",
            )
        steered.setdefault(s.key, index)
        for session in probe_sessions(s, StampSession, StampEnd):
            if session.key in taken:
                c.err(
                    ("steering", index, "probe", "ssid"),
                    f"ssid {session.ssid} from node {session.sender.node} is also {taken[session.key]}'s",
                    f"choose a probe ssid whose {len(s.candidates)} consecutive values are free",
                )
            taken.setdefault(session.key, f"steering[{index}]")
            intent.stamp_sessions.append(session)
        intent.steering.append(s)


def load_intent(path: str | Path, graph=None) -> Intent:
    """Read and validate an intent file (paths in it are relative to the file's directory)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise IntentError(
            str(path), [Problem(1, 1, "", f"cannot read the file: {exc.strerror}", "check the path")]
        ) from None
    return parse_intent(text, str(path), path.resolve().parent, graph)


def _same_ip(a: str, b: str) -> bool | None:
    """Whether two address texts are the same address (None if either is not an address: that
    is reported by the address check itself)."""
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return None
