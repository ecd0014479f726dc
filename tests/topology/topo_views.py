"""Node views as a netlab topology file says they must look (test helper).

`expected_views(topology)` derives, from the YAML alone, the parts of every node's view that the
file determines: interface names and global addresses, loopbacks, local SIDs, SRv6 policies and
static neighbours (netlab installs the far end's addresses as permanent neighbours). The netlab
test compares real build_node_view() output with it; the model tests use it (plus MACs and
ifindexes made up here) as realistic input without needing namespaces.
"""

from __future__ import annotations

import hashlib
import ipaddress

from collectors.topology.view import SCHEMA, SCHEMA_VERSION, locators_of
from netlab import topology as topo_mod


def _mac(*parts: str) -> str:
    d = hashlib.sha1("/".join(parts).encode()).digest()
    return ":".join(f"{b:02x}" for b in (0x02,) + tuple(d[:5]))


def _addr(cidr: str) -> dict:
    a, plen = cidr.split("/")
    return {"address": str(ipaddress.IPv6Address(a)), "prefixlen": int(plen), "scope": "global"}


def expected_views(topology_path, generated_at_ns: int = 1_000_000_000) -> dict[str, dict]:
    topo = topo_mod.load(topology_path)
    views: dict[str, dict] = {}
    ifindex = 10
    for name, node in topo.nodes.items():
        lo_addrs = [_addr(a) for a in node.loopback]
        interfaces = [
            {
                "name": "lo",
                "ifindex": 1,
                "kind": "loopback",
                "mac": "00:00:00:00:00:00",
                "mtu": 65536,
                "admin_up": True,
                "oper_state": "unknown",
                "addresses": lo_addrs,
            }
        ]
        neighbours = []
        for link, end, far in topo.endpoints_of(name):
            ifindex += 1
            interfaces.append(
                {
                    "name": end.ifname,
                    "ifindex": ifindex,
                    "kind": "veth",
                    "mac": _mac(link.name, end.node),
                    "mtu": 1500,
                    "admin_up": True,
                    "oper_state": "up",
                    "addresses": [_addr(a) for a in end.addrs],
                }
            )
            for a in far.addrs:
                neighbours.append(
                    {
                        "interface": end.ifname,
                        "address": a.split("/")[0],
                        "mac": _mac(link.name, far.node),
                        "state": "permanent",
                    }
                )
        sids, policies = [], []
        for r in node.routes:
            if r.seg6local:
                params = {k: r.seg6local[k] for k in ("table", "nh6") if k in r.seg6local}
                if "flavors" in r.seg6local:  # as the kernel reports it: next-csid lengths filled in
                    ops = r.seg6local["flavors"].split(",")
                    params["flavors"] = {"operations": [o for o in ("psp", "usp", "usd", "next-csid") if o in ops]}
                    if "next-csid" in ops:
                        params["flavors"]["lblen"] = r.seg6local.get("lblen", 32)
                        params["flavors"]["nflen"] = r.seg6local.get("nflen", 16)
                sids.append(
                    {
                        "sid": r.dst.split("/")[0],
                        "prefixlen": int(r.dst.split("/")[1]),
                        "action": r.seg6local["action"],
                        "params": params,
                        "interface": r.dev,
                        "table": 254,
                    }
                )
            if r.seg6:
                policies.append(
                    {
                        "prefix": r.dst,
                        "mode": r.seg6["mode"],
                        "segments": list(r.seg6["segs"]),
                        "interface": r.dev,
                        "table": 254,
                    }
                )
        views[name] = {
            "schema": SCHEMA,
            "version": SCHEMA_VERSION,
            "node": name,
            "netns": None,
            "generated_at_ns": generated_at_ns,
            "interfaces": sorted(interfaces, key=lambda i: i["name"]),
            "neighbours": neighbours,
            "local_sids": sids,
            "policies": policies,
            "loopbacks": [{"interface": "lo", "address": a["address"], "prefixlen": a["prefixlen"]} for a in lo_addrs],
            "locators": locators_of(sids),
            "stamp_sessions": [],
            "flows": [],
        }
    return views
