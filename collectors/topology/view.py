"""Build one node's topology view from netlink (pyroute2): the JSON document of schemas/topology.md.

What is read, all IPv6 (segscope is SRv6-only):
  interfaces  links with MAC, MTU, admin/oper state, kind and their addresses
  neighbours  the IPv6 neighbour table (unicast entries with a link-layer address)
  local_sids  routes with a seg6local encap (any table): SID, behaviour and its parameters
  policies    routes with a seg6 encap (any table): prefix, mode, SID list in visiting order
  loopbacks   global addresses on `lo` and on dummy devices (router id / reflector addresses)
  locators    the /64 each local SID sits in (a kernel has no locator object; see topology.md)

Everything is sorted so that two views of an unchanged node are equal (the publisher diffs
them). Volatile facts (neighbour reachability state, seg6local packet counters) are kept out of
the change fingerprint: see view_fingerprint().
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import socket
import struct
import time
from typing import Any

SCHEMA = "segscope.topology.node_view"
SCHEMA_VERSION = 1

# linux/seg6_local.h SEG6_LOCAL_ACTION_* -> iproute2 names
SEG6LOCAL_ACTIONS = {
    1: "End",
    2: "End.X",
    3: "End.T",
    4: "End.DX2",
    5: "End.DX6",
    6: "End.DX4",
    7: "End.DT6",
    8: "End.DT4",
    9: "End.B6",
    10: "End.B6.Encaps",
    11: "End.BM",
    12: "End.S",
    13: "End.AS",
    14: "End.AM",
    15: "End.BPF",
    16: "End.DT46",
}
# pyroute2 attribute name -> key in the local SID's "params"
SEG6LOCAL_PARAMS = {
    "SEG6_LOCAL_TABLE": "table",
    "SEG6_LOCAL_VRFTABLE": "vrftable",
    "SEG6_LOCAL_NH4": "nh4",
    "SEG6_LOCAL_NH6": "nh6",
    "SEG6_LOCAL_IIF": "iif",
    "SEG6_LOCAL_OIF": "oif",
}
ENCAP_SEG6, ENCAP_BPF, ENCAP_SEG6LOCAL = 5, 6, 7  # linux/lwtunnel.h LWTUNNEL_ENCAP_*
# datapath/ioam_lwt.c COPY_TABLE: where the in-line route program keeps a copy of the seg6 route it
# took over (for the packets it re-routes to the kernel's seg6 encapsulation)
LWT_COPY_TABLE = 3355
# datapath/ioam_lwt.c LOCAL_TABLE: the program's copy of the route for the packets the node sends
# itself (a bpf route standing for no policy of its own)
LWT_LOCAL_TABLE = 3356
# linux/seg6_local.h SEG6_LOCAL_FLAVORS (pyroute2 0.8 does not decode it: read from its bytes)
SEG6_LOCAL_FLAVORS = 11
FLV_OPERATION, FLV_LCBLOCK_BITS, FLV_LCNODE_FN_BITS = 1, 2, 3
FLAVOR_OPS = {1: "psp", 2: "usp", 3: "usd", 4: "next-csid"}  # SEG6_LOCAL_FLV_OP_* -> iproute2 names
IFF_UP = 0x1
NUD_STATES = {
    0x01: "incomplete",
    0x02: "reachable",
    0x04: "stale",
    0x08: "delay",
    0x10: "probe",
    0x20: "failed",
    0x40: "noarp",
    0x80: "permanent",
}
RT_SCOPES = {0: "global", 200: "site", 253: "link", 254: "host", 255: "nowhere"}


class NodeViewError(RuntimeError):
    """The node's netlink state could not be read (missing netns, permission ...)."""


def _open(netns: str | None):
    from pyroute2 import IPRoute, NetNS

    if netns and "/" not in netns and not os.path.exists(f"/run/netns/{netns}"):
        # pyroute2's NetNS would create a missing namespace (O_CREAT): a typo must not do that
        raise NodeViewError(f"network namespace {netns!r} does not exist (/run/netns/{netns})")
    try:
        return NetNS(netns, flags=0) if netns else IPRoute()
    except Exception as e:  # pyroute2 raises several kinds; say which netns failed
        raise NodeViewError(f"cannot open netlink in netns {netns or '(own)'}: {e!r}") from e


def _interfaces(ipr) -> tuple[list[dict], dict[int, str]]:
    names: dict[int, str] = {}
    out = []
    for link in ipr.get_links():
        info = link.get_attr("IFLA_LINKINFO")
        kind = info.get_attr("IFLA_INFO_KIND") if info is not None else None
        name = link.get_attr("IFLA_IFNAME")
        names[link["index"]] = name
        out.append(
            {
                "name": name,
                "ifindex": link["index"],
                "kind": kind or ("loopback" if name == "lo" else None),
                "mac": link.get_attr("IFLA_ADDRESS"),
                "mtu": link.get_attr("IFLA_MTU"),
                "admin_up": bool(link["flags"] & IFF_UP),
                "oper_state": (link.get_attr("IFLA_OPERSTATE") or "UNKNOWN").lower(),
                "addresses": [],
            }
        )
    return out, names


def _attach_addresses(ipr, interfaces: list[dict]) -> None:
    by_index = {i["ifindex"]: i for i in interfaces}
    for a in ipr.get_addr(family=socket.AF_INET6):
        iface = by_index.get(a["index"])
        if iface is None:
            continue
        iface["addresses"].append(
            {
                "address": a.get_attr("IFA_ADDRESS"),
                "prefixlen": a["prefixlen"],
                "scope": RT_SCOPES.get(a["scope"], str(a["scope"])),
            }
        )
    for iface in interfaces:
        iface["addresses"].sort(key=lambda x: (ipaddress.IPv6Address(x["address"]), x["prefixlen"]))


def _neighbours(ipr, names: dict[int, str]) -> list[dict]:
    out = []
    for n in ipr.get_neighbours(family=socket.AF_INET6):
        dst, lladdr = n.get_attr("NDA_DST"), n.get_attr("NDA_LLADDR")
        if dst is None or lladdr is None or ipaddress.IPv6Address(dst).is_multicast:
            continue
        state = [name for bit, name in NUD_STATES.items() if n["state"] & bit]
        out.append(
            {
                "interface": names.get(n["ifindex"], str(n["ifindex"])),
                "address": dst,
                "mac": lladdr,
                "state": ",".join(state) or "none",
            }
        )
    return sorted(out, key=lambda x: (x["interface"], ipaddress.IPv6Address(x["address"])))


def _srh_segments_visiting_order(srh: dict) -> list[str]:
    # the SRH stores the last segment first; operators (and iproute2) list them in visiting order
    return list(reversed(srh.get("segs") or []))


def _nested(raw: bytes) -> dict[int, bytes]:
    """type -> payload of the netlink attributes in raw."""
    out, off = {}, 0
    while off + 4 <= len(raw):
        length, kind = struct.unpack_from("=HH", raw, off)
        if length < 4:
            break
        out[kind & 0x3FFF] = raw[off + 4 : off + length]
        off += (length + 3) & ~3
    return out


def _flavors(nla) -> dict[str, Any] | None:
    """A SEG6_LOCAL_FLAVORS attribute pyroute2 left undecoded: {"operations": [...], "lblen",
    "nflen"} (the lengths with next-csid only), or None when the attribute is another one."""
    raw = bytes(nla.data[nla.offset : nla.offset + nla.length])
    if len(raw) < 4 or struct.unpack_from("=H", raw, 2)[0] & 0x3FFF != SEG6_LOCAL_FLAVORS:
        return None
    attrs = _nested(raw[4:])
    ops = struct.unpack("=I", attrs[FLV_OPERATION][:4])[0] if FLV_OPERATION in attrs else 0
    out: dict[str, Any] = {"operations": [name for bit, name in sorted(FLAVOR_OPS.items()) if ops & (1 << bit)]}
    if FLV_LCBLOCK_BITS in attrs and FLV_LCNODE_FN_BITS in attrs:
        out["lblen"], out["nflen"] = attrs[FLV_LCBLOCK_BITS][0], attrs[FLV_LCNODE_FN_BITS][0]
    return out


def _local_sid(route, names: dict[int, str]) -> dict:
    params: dict[str, Any] = {}
    action = None
    for name, value in route.get_attr("RTA_ENCAP")["attrs"]:
        if name == "UNKNOWN" and _flavors(value) is not None:
            params["flavors"] = _flavors(value)
        elif name == "SEG6_LOCAL_ACTION":
            action = SEG6LOCAL_ACTIONS.get(value, f"action-{value}")
        elif name in SEG6LOCAL_PARAMS:
            key = SEG6LOCAL_PARAMS[name]
            params[key] = names.get(value, value) if key in ("iif", "oif") else value
        elif name == "SEG6_LOCAL_SRH":
            params["segments"] = _srh_segments_visiting_order(value)
    oif = route.get_attr("RTA_OIF")
    return {
        "sid": route.get_attr("RTA_DST") or "::",
        "prefixlen": route["dst_len"],
        "action": action or "unknown",
        "params": params,
        "interface": names.get(oif) if oif else None,
        "table": route.get_attr("RTA_TABLE"),
    }


def _policy(route, names: dict[int, str]) -> dict:
    srh = {}
    for name, value in route.get_attr("RTA_ENCAP")["attrs"]:
        if name == "SEG6_IPTUNNEL_SRH":
            srh = value
    oif = route.get_attr("RTA_OIF")
    dst = route.get_attr("RTA_DST")
    return {
        "prefix": f"{dst}/{route['dst_len']}" if dst else "default",
        "mode": srh.get("mode", "unknown"),
        "segments": _srh_segments_visiting_order(srh),
        "interface": names.get(oif) if oif else None,
        "table": route.get_attr("RTA_TABLE"),
    }


def _with_route_programs(policies: list[dict], bpf: list[tuple[str, int]]) -> list[dict]:
    """A policy the in-line route program (ioam_lwt) runs is an `encap bpf` route; its SID list is in
    the program's copy in LWT_COPY_TABLE: the policy as the copy has it, in the bpf route's table,
    and the copy is no policy of its own."""
    copies = {p["prefix"]: p for p in policies if p["table"] == LWT_COPY_TABLE}
    taken = [(prefix, table) for prefix, table in bpf if prefix in copies]
    out = [p for p in policies if not (p["table"] == LWT_COPY_TABLE and p["prefix"] in {t[0] for t in taken})]
    return out + [{**copies[prefix], "table": table} for prefix, table in taken]


def _srv6_routes(ipr, names: dict[int, str]) -> tuple[list[dict], list[dict]]:
    sids, policies, bpf = [], [], []
    for r in ipr.route("dump", family=socket.AF_INET6):  # every table
        kind = r.get_attr("RTA_ENCAP_TYPE")
        if kind == ENCAP_SEG6LOCAL:
            sids.append(_local_sid(r, names))
        elif kind == ENCAP_SEG6:
            policies.append(_policy(r, names))
        elif kind == ENCAP_BPF and r.get_attr("RTA_TABLE") != LWT_LOCAL_TABLE:
            dst = r.get_attr("RTA_DST")
            bpf.append((f"{dst}/{r['dst_len']}" if dst else "default", r.get_attr("RTA_TABLE")))
    policies = _with_route_programs(policies, bpf)
    sids.sort(key=lambda s: (ipaddress.IPv6Address(s["sid"]), s["prefixlen"], s["table"] or 0))
    policies.sort(key=lambda p: (p["table"] or 0, p["prefix"]))
    return sids, policies


def _loopbacks(interfaces: list[dict]) -> list[dict]:
    out = []
    for iface in interfaces:
        if iface["name"] == "lo" or iface["kind"] == "dummy":
            out += [
                {"interface": iface["name"], "address": a["address"], "prefixlen": a["prefixlen"]}
                for a in iface["addresses"]
                if a["scope"] == "global"
            ]
    return out


def locators_of(local_sids: list[dict], prefixlen: int = 64) -> list[str]:
    """The /64 (by default) of every local SID: the kernel has no locator object, and a /64
    locator with a function in the low bits is the common SRv6 plan (RFC 8986 §3.1)."""
    nets = {str(ipaddress.IPv6Network(f"{s['sid']}/{prefixlen}", strict=False)) for s in local_sids}
    return sorted(nets, key=lambda n: ipaddress.IPv6Network(n))


def build_node_view(node: str, netns: str | None, extra: dict[str, Any] | None = None) -> dict:
    """Read the node's netlink state (inside `netns`, or the caller's own namespace if None).

    `extra` adds sections the caller knows and netlink does not (e.g. the agent's STAMP sessions,
    see topology.md "stamp_sessions" / "flows"). Raises NodeViewError if netlink can't be read."""
    ipr = _open(netns)
    try:
        interfaces, names = _interfaces(ipr)
        _attach_addresses(ipr, interfaces)
        neighbours = _neighbours(ipr, names)
        local_sids, policies = _srv6_routes(ipr, names)
    except NodeViewError:
        raise
    except Exception as e:
        raise NodeViewError(f"reading netlink of node {node} ({netns or 'own netns'}) failed: {e!r}") from e
    finally:
        ipr.close()
    interfaces.sort(key=lambda i: i["name"])
    view = {
        "schema": SCHEMA,
        "version": SCHEMA_VERSION,
        "node": node,
        "netns": netns,
        "generated_at_ns": time.time_ns(),
        "interfaces": interfaces,
        "neighbours": neighbours,
        "local_sids": local_sids,
        "policies": policies,
        "loopbacks": _loopbacks(interfaces),
        "locators": locators_of(local_sids),
        "stamp_sessions": [],
        "flows": [],
    }
    for key, value in (extra or {}).items():
        view[key] = value
    return view


def view_fingerprint(view: dict) -> str:
    """Hash of what makes a view different for consumers: everything but the generation time,
    the publish sequence number and reason, and the neighbours' reachability state (which flips between
    reachable/stale/delay all the time without the topology changing)."""
    stable = {k: v for k, v in view.items() if k not in ("generated_at_ns", "seq", "reason")}
    stable["neighbours"] = [{k: v for k, v in n.items() if k != "state"} for n in view.get("neighbours", [])]
    return hashlib.sha256(json.dumps(stable, sort_keys=True).encode()).hexdigest()
