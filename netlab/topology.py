"""Topology files: load, validate, and report errors as FILE:LINE: what: how to fix.

A topology is data (YAML). The loader composes the YAML node tree itself so every
value keeps its position (yaml node marks); validation errors point at the line
that needs changing. See netlab/README.md for the format.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

NAME_RE = re.compile(r"^[A-Za-z0-9_]{1,12}$")
IFNAME_RE = re.compile(r"^[A-Za-z0-9_]{1,15}$")
LINK_NAME_RE = re.compile(r"^[a-z0-9_]{1,8}$")
SYSCTL_KEY_RE = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)+$")
DEVICE_SYSCTL_KEY_RE = re.compile(r"^[a-z0-9_]+$")
SEG6_MODES = ("encap", "inline", "l2encap", "encap.red", "l2encap.red")
SEG6LOCAL_ACTIONS = {  # action -> required parameter (or None)
    "End": None,
    "End.X": "nh6",
    "End.T": "table",
    "End.DX2": "oif",
    "End.DX6": "nh6",
    "End.DX4": "nh4",
    "End.DT6": "table",
    "End.DT4": "table",
    "End.DT46": "table",
    "End.B6": "srh",
    "End.B6.Encaps": "srh",
    "End.BM": "srh",
    "End.S": "srh",
    "End.AS": "srh",
    "End.AM": "srh",
    "End.BPF": "endpoint",
}
SUPPORTED_SEG6LOCAL = ("End", "End.X", "End.T", "End.DX6", "End.DT6")
RELAY_MAX_MTU = 2048 - 14  # the relay's frame slot (2048 B) minus the Ethernet header
REORDER_SPEC_RE = re.compile(r"^(off|every:\d+:[0-9.]+|random:[0-9.]+:[0-9.]+)$")


@dataclass
class Reorder:
    """What the delay relay holds back in one direction of a link, so that later frames overtake it.

    every=K: the K-th, 2K-th, ... frame of each flow; pct=P: each frame with probability P %.
    A held frame leaves hold_us after the link's delay. Spec string (relay option, control socket,
    CLI): "off", "every:K:HOLD_US" or "random:PCT:HOLD_US"."""

    every: int = 0
    pct: float = 0.0
    hold_us: float = 0.0

    @property
    def on(self) -> bool:
        return self.hold_us > 0 and (self.every > 0 or self.pct > 0)

    def spec(self) -> str:
        if not self.on:
            return "off"
        if self.every:
            return f"every:{self.every}:{self.hold_us:g}"
        return f"random:{self.pct:g}:{self.hold_us:g}"

    @classmethod
    def parse(cls, value: "Reorder | str | None") -> "Reorder":
        """A Reorder from itself, None ("off") or a spec string; ValueError says what is wrong."""
        if value is None:
            return cls()
        if isinstance(value, Reorder):
            out = value
        else:
            text = str(value).strip()
            if not REORDER_SPEC_RE.match(text):
                raise ValueError(f"reorder spec {text!r}: write off, every:K:HOLD_US or random:PCT:HOLD_US")
            if text == "off":
                return cls()
            mode, amount, hold = text.split(":")
            if mode == "every" and int(amount) < 1:
                raise ValueError(f"reorder spec {text!r}: every:K needs K >= 1")
            out = (
                cls(every=int(amount), hold_us=float(hold))
                if mode == "every"
                else cls(pct=float(amount), hold_us=float(hold))
            )
        if out.every and out.pct:
            raise ValueError("reorder: give every or pct, not both")
        if out.every < 0 or not 0 <= out.pct <= 100 or not 0 <= out.hold_us < 1e7:
            raise ValueError("reorder: every >= 1, 0 <= pct <= 100, 0 < hold_us < 1e7")
        if (out.every or out.pct) and out.hold_us <= 0:
            raise ValueError("reorder: hold_us must be > 0 (the extra delay of a held frame)")
        return out


class TopologyError(ValueError):
    """Raised with every problem found, one per line: FILE:LINE: where: what. Fix: how."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


@dataclass
class Endpoint:
    node: str
    ifname: str
    addrs: list[str] = field(default_factory=list)
    xdp_pass: bool = False
    mac: str | None = None
    ioam_enabled: bool | None = None  # None: on when the node has `ioam:`
    ioam_id: int | None = None  # net.ipv6.conf.<dev>.ioam6_id (short interface id)
    ioam_id_wide: int | None = None


@dataclass
class Link:
    name: str
    a: Endpoint
    b: Endpoint
    delay_a_to_b_us: float = 0.0
    delay_b_to_a_us: float = 0.0
    has_delay_key: bool = False
    relay: str = "auto"  # auto: relay iff a delay or a loss is non-zero; always; never
    queue_frames: int = 4096
    loss_a_to_b_pct: float = 0.0  # injected by the relay, counted per direction and Traffic Class
    loss_b_to_a_pct: float = 0.0
    reorder_a_to_b: Reorder = field(default_factory=Reorder)  # held back by the relay, counted per flow
    reorder_b_to_a: Reorder = field(default_factory=Reorder)
    mtu: int | None = None  # on both ends (and the relay's veths); None: the kernel's 1500

    @property
    def wants_relay(self) -> bool:
        if self.relay == "always":
            return True
        if self.relay == "never":
            return False
        delay = self.delay_a_to_b_us > 0 or self.delay_b_to_a_us > 0
        reorder = self.reorder_a_to_b.on or self.reorder_b_to_a.on
        return delay or reorder or self.loss_a_to_b_pct > 0 or self.loss_b_to_a_pct > 0


@dataclass
class Route:
    dst: str
    via: str | None = None
    dev: str | None = None
    seg6: dict[str, Any] | None = None
    seg6local: dict[str, Any] | None = None
    count: bool = False
    metric: int | None = None

    def ip_args(self) -> list[str]:
        """Arguments after `ip -6 route replace`."""
        args = [self.dst]
        if self.seg6:
            args += ["encap", "seg6", "mode", self.seg6["mode"], "segs", ",".join(self.seg6["segs"])]
        if self.seg6local:
            args += ["encap", "seg6local", "action", self.seg6local["action"]]
            for key in ("table", "nh6"):
                if key in self.seg6local:
                    args += [key, str(self.seg6local[key])]
            if "flavors" in self.seg6local:  # e.g. "next-csid" (RFC 9800), lengths default 32/16
                args += ["flavors", self.seg6local["flavors"]]
                for key in ("lblen", "nflen"):
                    if key in self.seg6local:
                        args += [key, str(self.seg6local[key])]
            if self.count:
                args.append("count")
        if self.via:
            args += ["via", self.via]
        if self.dev:
            args += ["dev", self.dev]
        if self.metric is not None:
            args += ["metric", str(self.metric)]
        return args


@dataclass
class IoamNamespace:
    id: int
    data: int | None = None  # namespace data (32 bit), what `ip ioam namespace add ID data D` sets
    data_wide: int | None = None  # 64 bit


@dataclass
class Ioam:
    """A node's IOAM (RFC 9197) settings: the kernel fills trace entries for known namespaces on
    the devices with ioam6_enabled (every link device of the node unless an end says otherwise)."""

    node_id: int  # net.ipv6.ioam6_id (24 bit in the short format)
    node_id_wide: int | None = None  # net.ipv6.ioam6_id_wide (56 bit)
    namespaces: list[IoamNamespace] = field(default_factory=list)


@dataclass
class Node:
    name: str
    loopback: list[str] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)
    sysctl: dict[str, str] = field(default_factory=dict)
    ioam: Ioam | None = None


@dataclass
class Topology:
    path: str
    name: str
    nodes: dict[str, Node]
    links: list[Link]
    sysctl: dict[str, str]
    device_sysctl: dict[str, str]

    def link(self, name: str) -> Link:
        for link in self.links:
            if link.name == name:
                return link
        raise KeyError(f"no link {name!r} in {self.path} (links: {', '.join(l.name for l in self.links)})")

    def endpoints_of(self, node: str) -> list[tuple[Link, Endpoint, Endpoint]]:
        """(link, this end, far end) for every link end on `node`."""
        ends = []
        for link in self.links:
            if link.a.node == node:
                ends.append((link, link.a, link.b))
            if link.b.node == node:
                ends.append((link, link.b, link.a))
        return ends


# ---------------------------------------------------------------- YAML with marks


class _Doc:
    """Plain Python values plus the line of every value and key (by path)."""

    def __init__(self, path: str):
        self.path = path
        self.value_line: dict[tuple, int] = {}
        self.key_line: dict[tuple, int] = {}
        self.problems: list[str] = []

    def line(self, where: tuple) -> int:
        while where:
            if where in self.value_line:
                return self.value_line[where]
            where = where[:-1]
        return self.value_line.get((), 1)

    def error(self, where: tuple, what: str, fix: str, at_key: bool = False) -> None:
        line = self.key_line.get(where) if at_key else None
        line = line or self.line(where)
        self.problems.append(f"{self.path}:{line}: {_fmt_path(where)}: {what}. Fix: {fix}")

    def convert(self, node: yaml.Node, where: tuple = ()) -> Any:
        self.value_line[where] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = yaml.constructor.SafeConstructor().construct_object(key_node)
                sub = where + (key,)
                if key in out:
                    self.key_line[sub] = key_node.start_mark.line + 1
                    self.error(sub, f"key {key!r} appears twice", "keep only one of them", at_key=True)
                    continue
                self.key_line[sub] = key_node.start_mark.line + 1
                out[key] = self.convert(value_node, sub)
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.convert(item, where + (i,)) for i, item in enumerate(node.value)]
        return yaml.constructor.SafeConstructor().construct_object(node)


def _fmt_path(where: tuple) -> str:
    text = ""
    for part in where:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


# ---------------------------------------------------------------- validation helpers


def _check_keys(doc: _Doc, where: tuple, value: Any, allowed: dict[str, str], required: tuple = ()) -> bool:
    if not isinstance(value, dict):
        doc.error(
            where,
            f"expected a mapping, got {type(value).__name__} {value!r}",
            f"write a mapping with keys: {', '.join(allowed)}",
        )
        return False
    for key in value:
        if key not in allowed:
            doc.error(
                where + (key,),
                f"unknown key {key!r}",
                f"use one of: {', '.join(allowed)} (check the spelling)",
                at_key=True,
            )
    for key in required:
        if key not in value:
            doc.error(where, f"missing key {key!r}", f"add `{key}: ...` ({allowed[key]})")
    return True


def _check_cidr(doc: _Doc, where: tuple, value: Any, host_bits_ok: bool = True) -> str | None:
    if not isinstance(value, str):
        doc.error(
            where,
            f"expected an IPv6 prefix string like \"fc00:12::1/64\", got {value!r}",
            "write the address with its prefix length, in quotes",
        )
        return None
    try:
        iface = ipaddress.IPv6Interface(value)
    except ValueError:
        doc.error(where, f"{value!r} is not an IPv6 address/prefix", "write it like \"fc00:12::1/64\" (IPv6 only)")
        return None
    if "/" not in value:
        doc.error(where, f"{value!r} has no prefix length", f"write \"{value}/64\" or \"{value}/128\"")
        return None
    if not host_bits_ok and iface.ip != iface.network.network_address:
        doc.error(where, f"{value!r} has host bits set", f"write \"{iface.network}\"")
        return None
    return value


def _check_ip(doc: _Doc, where: tuple, value: Any) -> str | None:
    if isinstance(value, str):
        try:
            ipaddress.IPv6Address(value)
            return value
        except ValueError:
            pass
    doc.error(where, f"{value!r} is not an IPv6 address", "write a plain address in quotes, like \"fc00:12::2\"")
    return None


def _check_str_list(doc: _Doc, where: tuple, value: Any, what: str) -> list:
    if value is None:
        return []
    if not isinstance(value, list):
        doc.error(where, f"expected a list of {what}, got {value!r}", "write [\"...\", ...]")
        return []
    return value


def _check_sysctl_map(doc: _Doc, where: tuple, value: Any, key_re: re.Pattern, example: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        doc.error(where, f"expected a mapping of sysctl keys to values, got {value!r}", f"write e.g. `{example}: 1`")
        return {}
    out = {}
    for key, val in value.items():
        if not isinstance(key, str) or not key_re.match(key):
            doc.error(where + (key,), f"{key!r} is not a valid key here", f"write it like `{example}`", at_key=True)
        elif isinstance(val, (dict, list)) or val is None:
            doc.error(where + (key,), f"value {val!r} is not a scalar", "write a number or a string")
        else:
            out[key] = str(int(val)) if isinstance(val, bool) else str(val)
    return out


def _number(doc: _Doc, where: tuple, value: Any, what: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        doc.error(
            where,
            f"{what} must be a number in [{lo:g}, {hi:g}], got {value!r}",
            f"write a number between {lo:g} and {hi:g}",
        )
        return 0.0
    return float(value)


def _bool(doc: _Doc, where: tuple, value: Any) -> bool:
    if not isinstance(value, bool):
        doc.error(where, f"expected true or false, got {value!r}", "write true or false")
        return False
    return value


# ---------------------------------------------------------------- sections

TOP_KEYS = {
    "name": "topology name",
    "sysctl": "sysctls for every node namespace",
    "device_sysctl": "net.ipv6.conf.<dev>.<key> for every device",
    "nodes": "mapping of node name -> node",
    "links": "list of links",
}
NODE_KEYS = {
    "loopback": "addresses on lo",
    "routes": "list of IPv6 routes",
    "sysctl": "extra sysctls for this node",
    "ioam": "{node_id, node_id_wide, namespaces}: IOAM transit/egress filling by the kernel",
}
IOAM_KEYS = {
    "node_id": "net.ipv6.ioam6_id, 0..16777215",
    "node_id_wide": "net.ipv6.ioam6_id_wide, 0..2**56-1",
    "namespaces": "list of namespace ids (0..65534) or {id, data, data_wide}",
}
IOAM_NS_KEYS = {"id": "namespace id 0..65534", "data": "32-bit namespace data", "data_wide": "64-bit namespace data"}
END_IOAM_KEYS = {
    "enabled": "net.ipv6.conf.<dev>.ioam6_enabled (default: true on a node with ioam)",
    "id": "net.ipv6.conf.<dev>.ioam6_id, 0..65535",
    "id_wide": "net.ipv6.conf.<dev>.ioam6_id_wide, 0..2**32-1",
}
ROUTE_KEYS = {
    "dst": "prefix or default",
    "via": "next-hop address",
    "dev": "device",
    "seg6": "{mode, segs}",
    "seg6local": "{action, table|nh6, flavors, lblen, nflen}",
    "count": "per-route seg6local counters",
    "metric": "route metric",
}
LINK_KEYS = {
    "name": "short link name [a-z0-9_]{1,8}",
    "a": "first endpoint",
    "b": "second endpoint",
    "delay_us": "{a_to_b, b_to_a} in microseconds",
    "loss_pct": "{a_to_b, b_to_a} in percent (the relay drops and counts them)",
    "reorder": "{a_to_b, b_to_a}: each {every: K | pct: P, hold_us: H} (the relay holds frames back)",
    "relay": "auto|always|never",
    "queue_frames": "relay queue length per direction",
    "mtu": "MTU of both ends (and the relay's veths), 1280..65535",
}
END_KEYS = {
    "node": "node name",
    "ifname": "interface name in the node",
    "addrs": "IPv6 address/prefix list",
    "xdp_pass": "attach xdp_pass natively (peer runs XDP_TX)",
    "mac": "fixed MAC address",
    "ioam": "{enabled, id, id_wide} of this device",
}


def _parse_route(doc: _Doc, where: tuple, raw: Any) -> Route | None:
    if not _check_keys(doc, where, raw, ROUTE_KEYS, required=("dst",)):
        return None
    dst = raw.get("dst")
    if dst is not None and dst != "default":
        _check_cidr(doc, where + ("dst",), dst, host_bits_ok=False)
    route = Route(dst=str(dst))
    if "via" in raw:
        route.via = _check_ip(doc, where + ("via",), raw["via"])
    if "dev" in raw:
        if not isinstance(raw["dev"], str) or not IFNAME_RE.match(raw["dev"]):
            doc.error(where + ("dev",), f"{raw['dev']!r} is not an interface name", "write e.g. `dev: a0`")
        else:
            route.dev = raw["dev"]
    if "seg6" in raw and "seg6local" in raw:
        doc.error(where, "a route cannot have both seg6 and seg6local", "split it into two routes")
    if "seg6" in raw:
        seg6 = raw["seg6"]
        if _check_keys(
            doc, where + ("seg6",), seg6, {"mode": "|".join(SEG6_MODES), "segs": "SID list"}, required=("mode", "segs")
        ):
            if seg6.get("mode") not in SEG6_MODES:
                doc.error(
                    where + ("seg6", "mode"),
                    f"unknown seg6 mode {seg6.get('mode')!r}",
                    f"use one of {', '.join(SEG6_MODES)}",
                )
            segs = seg6.get("segs")
            if not isinstance(segs, list) or not segs:
                doc.error(
                    where + ("seg6", "segs"),
                    f"segs must be a non-empty list, got {segs!r}",
                    "write segs: [\"fc00:2::e\", \"fc00:3::d6\"]",
                )
            else:
                for i, sid in enumerate(segs):
                    _check_ip(doc, where + ("seg6", "segs", i), sid)
            route.seg6 = dict(seg6)
        if not route.dev:
            doc.error(where, "a seg6 encap route needs a device", "add `dev: <ifname>`")
    if "seg6local" in raw:
        local = raw["seg6local"]
        if _check_keys(
            doc,
            where + ("seg6local",),
            local,
            {
                "action": "|".join(SUPPORTED_SEG6LOCAL),
                "table": "table id",
                "nh6": "next hop",
                "flavors": "iproute2 flavors, e.g. next-csid",
                "lblen": "next-csid locator-block bits",
                "nflen": "next-csid micro-SID bits",
            },
            required=("action",),
        ):
            action = local.get("action")
            if action not in SUPPORTED_SEG6LOCAL:
                doc.error(
                    where + ("seg6local", "action"),
                    f"seg6local action {action!r} is not supported",
                    f"use one of {', '.join(SUPPORTED_SEG6LOCAL)}",
                )
            else:
                need = SEG6LOCAL_ACTIONS[action]
                if need and need not in local:
                    doc.error(where + ("seg6local",), f"action {action} needs `{need}`", f"add `{need}: ...`")
            if "table" in local and (isinstance(local["table"], bool) or not isinstance(local["table"], int)):
                doc.error(
                    where + ("seg6local", "table"),
                    f"table must be an integer, got {local['table']!r}",
                    "write e.g. table: 254 (the main table)",
                )
            if "nh6" in local:
                _check_ip(doc, where + ("seg6local", "nh6"), local["nh6"])
            route.seg6local = dict(local)
        if not route.dev:
            doc.error(where, "a seg6local route needs a device", "add `dev: <ifname>` (the ingress side)")
    if "count" in raw:
        route.count = _bool(doc, where + ("count",), raw["count"])
        if route.count and "seg6local" not in raw:
            doc.error(where + ("count",), "count only applies to seg6local routes", "remove `count`")
    if "metric" in raw:
        route.metric = int(_number(doc, where + ("metric",), raw["metric"], "metric", 0, 2**32 - 1))
    if not (route.via or route.dev):
        doc.error(where, f"route to {dst} has neither via nor dev", "add `via: <address>` or `dev: <ifname>`")
    return route


def _parse_endpoint(doc: _Doc, where: tuple, raw: Any, node_names: set[str]) -> Endpoint | None:
    if not _check_keys(doc, where, raw, END_KEYS, required=("node", "ifname")):
        return None
    node, ifname = raw.get("node"), raw.get("ifname")
    if "node" in raw and node not in node_names:
        doc.error(
            where + ("node",),
            f"unknown node {node!r}",
            f"use one of the nodes defined under `nodes:` ({', '.join(sorted(node_names))})",
        )
    if "ifname" in raw and (not isinstance(ifname, str) or not IFNAME_RE.match(ifname) or ifname == "lo"):
        doc.error(
            where + ("ifname",),
            f"{ifname!r} is not a usable interface name",
            "use 1-15 characters [A-Za-z0-9_], not `lo`",
        )
    addrs = []
    for i, addr in enumerate(_check_str_list(doc, where + ("addrs",), raw.get("addrs"), "addresses")):
        if _check_cidr(doc, where + ("addrs", i), addr):
            addrs.append(addr)
    end = Endpoint(node=str(node), ifname=str(ifname), addrs=addrs)
    if "xdp_pass" in raw:
        end.xdp_pass = _bool(doc, where + ("xdp_pass",), raw["xdp_pass"])
    if "mac" in raw:
        mac = raw["mac"]
        if not isinstance(mac, str) or not re.match(r"^([0-9a-f]{2}:){5}[0-9a-f]{2}$", mac) or int(mac[:2], 16) & 1:
            doc.error(where + ("mac",), f"{mac!r} is not a unicast MAC", "write e.g. \"02:00:00:00:00:01\"")
        else:
            end.mac = mac
    if "ioam" in raw:
        io = raw["ioam"]
        if _check_keys(doc, where + ("ioam",), io, END_IOAM_KEYS):
            if "enabled" in io:
                end.ioam_enabled = _bool(doc, where + ("ioam", "enabled"), io["enabled"])
            if "id" in io:
                end.ioam_id = _integer(doc, where + ("ioam", "id"), io["id"], "ioam.id", 0, 0xFFFF)
            if "id_wide" in io:
                wide = io["id_wide"]
                end.ioam_id_wide = _integer(doc, where + ("ioam", "id_wide"), wide, "ioam.id_wide", 0, 2**32 - 1)
    return end


def _parse_link(doc: _Doc, where: tuple, raw: Any, node_names: set[str]) -> Link | None:
    if not _check_keys(doc, where, raw, LINK_KEYS, required=("name", "a", "b")):
        return None
    name = raw.get("name")
    if "name" in raw and (not isinstance(name, str) or not LINK_NAME_RE.match(name)):
        doc.error(where + ("name",), f"link name {name!r} is not valid", "use 1-8 characters [a-z0-9_]")
    a = _parse_endpoint(doc, where + ("a",), raw.get("a"), node_names) if "a" in raw else None
    b = _parse_endpoint(doc, where + ("b",), raw.get("b"), node_names) if "b" in raw else None
    if a is None or b is None:
        return None
    if a.node == b.node:
        doc.error(
            where + ("b", "node"), f"both ends of link {name!r} are on node {a.node}", "connect two different nodes"
        )
    link = Link(name=str(name), a=a, b=b)
    if "delay_us" in raw:
        link.has_delay_key = True
        both = _per_direction(doc, where, raw, "delay_us", "microseconds", 1e7)
        if both:
            link.delay_a_to_b_us, link.delay_b_to_a_us = both
    if "loss_pct" in raw:
        both = _per_direction(doc, where, raw, "loss_pct", "percent of frames", 100)
        if both:
            link.loss_a_to_b_pct, link.loss_b_to_a_pct = both
    if "relay" in raw:
        if raw["relay"] not in ("auto", "always", "never"):
            doc.error(
                where + ("relay",),
                f"relay must be auto, always or never, got {raw['relay']!r}",
                "write relay: auto (a relay only when a delay is set)",
            )
        else:
            link.relay = raw["relay"]
    if "queue_frames" in raw:
        link.queue_frames = int(
            _number(doc, where + ("queue_frames",), raw["queue_frames"], "queue_frames", 1, 1 << 20)
        )
    if "reorder" in raw:
        value = raw["reorder"]
        directions = {"a_to_b": "frames from a to b", "b_to_a": "frames from b to a"}
        if _check_keys(doc, where + ("reorder",), value, directions):
            for d in directions:
                if d in value:
                    setattr(link, f"reorder_{d}", _parse_reorder(doc, where + ("reorder", d), value[d]))
    if "mtu" in raw:
        link.mtu = _integer(doc, where + ("mtu",), raw["mtu"], "mtu", 1280, 65535)
        if link.mtu > RELAY_MAX_MTU and link.wants_relay:
            doc.error(
                where + ("mtu",),
                f"mtu {link.mtu} is larger than a delay relay relays ({RELAY_MAX_MTU} + 14 B Ethernet header)",
                f"use an mtu <= {RELAY_MAX_MTU} on a link with a delay, loss or reorder",
            )
    return link


REORDER_KEYS = {
    "every": "hold the K-th, 2K-th, ... frame of each flow",
    "pct": "hold each frame with this probability (percent)",
    "hold_us": "extra delay of a held frame, microseconds (> 0)",
}


def _parse_reorder(doc: _Doc, where: tuple, raw: Any) -> Reorder:
    if not _check_keys(doc, where, raw, REORDER_KEYS, required=("hold_us",)):
        return Reorder()
    if ("every" in raw) == ("pct" in raw):
        doc.error(where, "give exactly one of `every` and `pct`", "write e.g. {every: 10, hold_us: 500}")
        return Reorder()
    hold = _number(doc, where + ("hold_us",), raw.get("hold_us", 0), "hold_us", 0, 1e7)
    if "hold_us" in raw and hold <= 0:
        doc.error(where + ("hold_us",), "hold_us must be > 0", "write the extra delay of a held frame, e.g. 500")
    if "every" in raw:
        return Reorder(every=_integer(doc, where + ("every",), raw["every"], "every", 1, 10**9), hold_us=hold)
    return Reorder(pct=_number(doc, where + ("pct",), raw["pct"], "pct", 0, 100), hold_us=hold)


def _integer(doc: _Doc, where: tuple, value: Any, what: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        doc.error(where, f"{what} must be an integer in [{lo}, {hi}], got {value!r}", f"write an integer {lo}..{hi}")
        return lo
    return value


def _parse_ioam(doc: _Doc, where: tuple, raw: Any) -> Ioam | None:
    if not _check_keys(doc, where, raw, IOAM_KEYS, required=("node_id",)):
        return None
    ioam = Ioam(node_id=_integer(doc, where + ("node_id",), raw.get("node_id", 0), "node_id", 0, 2**24 - 1))
    if "node_id_wide" in raw:
        ioam.node_id_wide = _integer(doc, where + ("node_id_wide",), raw["node_id_wide"], "node_id_wide", 0, 2**56 - 1)
    seen: set[int] = set()
    for i, item in enumerate(_check_str_list(doc, where + ("namespaces",), raw.get("namespaces"), "namespaces")):
        at = where + ("namespaces", i)
        if isinstance(item, dict):
            if not _check_keys(doc, at, item, IOAM_NS_KEYS, required=("id",)):
                continue
            ns = IoamNamespace(id=_integer(doc, at + ("id",), item.get("id", 0), "namespace id", 0, 65534))
            if "data" in item:
                ns.data = _integer(doc, at + ("data",), item["data"], "data", 0, 2**32 - 2)
            if "data_wide" in item:
                ns.data_wide = _integer(doc, at + ("data_wide",), item["data_wide"], "data_wide", 0, 2**64 - 2)
        else:
            ns = IoamNamespace(id=_integer(doc, at, item, "namespace id", 0, 65534))
        if ns.id in seen:
            doc.error(at, f"namespace {ns.id} is listed twice", "list each namespace once")
        seen.add(ns.id)
        ioam.namespaces.append(ns)
    return ioam


def _per_direction(doc: _Doc, where: tuple, raw: dict, key: str, unit: str, hi: float) -> tuple | None:
    """raw[key] = {a_to_b, b_to_a} (each 0..hi, default 0) -> (a_to_b, b_to_a); None if its keys are bad."""
    value = raw[key]
    if not _check_keys(doc, where + (key,), value, {"a_to_b": f"{unit} from a to b", "b_to_a": f"{unit} from b to a"}):
        return None
    return tuple(_number(doc, where + (key, d), value.get(d, 0), f"{key}.{d}", 0, hi) for d in ("a_to_b", "b_to_a"))


def load(path: str | Path) -> Topology:
    """Load and validate a topology file; raises TopologyError listing every problem."""
    path = Path(path)
    if not path.is_absolute() and not path.exists():
        # "netlab/topologies/line5.yaml" works from any working directory
        repo_relative = Path(__file__).resolve().parent.parent / path
        if repo_relative.exists():
            path = repo_relative
    path_str = str(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise TopologyError(
            [
                f"{path_str}:0: cannot read the topology file: {exc.strerror}. "
                "Fix: pass the path of an existing YAML file"
            ]
        ) from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else 0
        context = getattr(exc, "context_mark", None)
        started = f" ({exc.context} at line {context.line + 1})" if context and exc.context else ""
        raise TopologyError(
            [
                f"{path_str}:{line}: YAML syntax error: {getattr(exc, 'problem', exc)}{started}. "
                "Fix: correct the YAML syntax (indentation, quotes, brackets)"
            ]
        ) from None
    doc = _Doc(path_str)
    if root is None:
        raise TopologyError([f"{path_str}:1: the file is empty. Fix: write `nodes:` and `links:`"])
    raw = doc.convert(root)
    topo = _validate(doc, raw)
    if doc.problems:

        def line_of(problem: str) -> int:
            return int(problem[len(path_str) + 1 :].split(":", 1)[0])

        raise TopologyError(sorted(doc.problems, key=line_of))
    return topo


def _validate(doc: _Doc, raw: Any) -> Topology | None:
    if not _check_keys(doc, (), raw, TOP_KEYS, required=("nodes", "links")):
        return None
    name = raw.get("name", Path(doc.path).stem)
    nodes_raw = raw.get("nodes") or {}
    nodes: dict[str, Node] = {}
    if not isinstance(nodes_raw, dict) or not nodes_raw:
        doc.error(("nodes",), "nodes must be a non-empty mapping", "write `nodes:` with `NAME: {...}` entries")
        nodes_raw = {}
    for node_name, node_raw in nodes_raw.items():
        where = ("nodes", node_name)
        if not isinstance(node_name, str) or not NAME_RE.match(node_name):
            doc.error(where, f"node name {node_name!r} is not valid", "use 1-12 characters [A-Za-z0-9_]", at_key=True)
            continue
        node = Node(name=node_name)
        node_raw = {} if node_raw is None else node_raw
        if not _check_keys(doc, where, node_raw, NODE_KEYS):
            continue
        for i, addr in enumerate(_check_str_list(doc, where + ("loopback",), node_raw.get("loopback"), "addresses")):
            if _check_cidr(doc, where + ("loopback", i), addr):
                node.loopback.append(addr)
        node.sysctl = _check_sysctl_map(
            doc, where + ("sysctl",), node_raw.get("sysctl"), SYSCTL_KEY_RE, "net.ipv6.conf.all.forwarding"
        )
        for i, route_raw in enumerate(_check_str_list(doc, where + ("routes",), node_raw.get("routes"), "routes")):
            route = _parse_route(doc, where + ("routes", i), route_raw)
            if route:
                node.routes.append(route)
        if "ioam" in node_raw:
            node.ioam = _parse_ioam(doc, where + ("ioam",), node_raw["ioam"])
        nodes[node_name] = node

    links: list[Link] = []
    links_raw = raw.get("links")
    if not isinstance(links_raw, list):
        doc.error(("links",), f"links must be a list, got {links_raw!r}", "write `links:` with `- name: ...` items")
        links_raw = []
    for i, link_raw in enumerate(links_raw):
        link = _parse_link(doc, ("links", i), link_raw, set(nodes))
        if link:
            links.append(link)

    _cross_check(doc, nodes, links)
    topo = Topology(
        path=doc.path,
        name=str(name),
        nodes=nodes,
        links=links,
        sysctl=_check_sysctl_map(doc, ("sysctl",), raw.get("sysctl"), SYSCTL_KEY_RE, "net.ipv6.conf.all.forwarding"),
        device_sysctl=_check_sysctl_map(
            doc, ("device_sysctl",), raw.get("device_sysctl"), DEVICE_SYSCTL_KEY_RE, "seg6_enabled"
        ),
    )
    return topo


def _cross_check(doc: _Doc, nodes: dict[str, Node], links: list[Link]) -> None:
    """Things that span several entries: unique names, route devices that exist."""
    seen_links: dict[str, int] = {}
    seen_ifnames: dict[tuple[str, str], int] = {}
    for i, link in enumerate(links):
        if link.name in seen_links:
            doc.error(
                ("links", i, "name"),
                f"link name {link.name!r} is also used by links[{seen_links[link.name]}]",
                "give every link its own name",
            )
        seen_links[link.name] = i
        for side, end in (("a", link.a), ("b", link.b)):
            key = (end.node, end.ifname)
            if key in seen_ifnames:
                doc.error(
                    ("links", i, side, "ifname"),
                    f"interface {end.ifname!r} on node {end.node} is also defined by links[{seen_ifnames[key]}]",
                    "use a different ifname for this link end",
                )
            seen_ifnames[key] = i
    for i, link in enumerate(links):
        for side, end in (("a", link.a), ("b", link.b)):
            node = nodes.get(end.node)
            if end.ioam_enabled and node is not None and node.ioam is None:
                doc.error(
                    ("links", i, side, "ioam", "enabled"),
                    f"node {end.node} has no `ioam:` (node id, namespaces)",
                    f"add `ioam: {{node_id: N, namespaces: [1]}}` to node {end.node}",
                )
    for node in nodes.values():
        devices = {"lo"} | {ifname for (n, ifname) in seen_ifnames if n == node.name}
        for i, route in enumerate(node.routes):
            if route.dev and route.dev not in devices:
                doc.error(
                    ("nodes", node.name, "routes", i, "dev"),
                    f"node {node.name} has no interface {route.dev!r}",
                    f"use one of {', '.join(sorted(devices))} or add a link end with that ifname",
                )
