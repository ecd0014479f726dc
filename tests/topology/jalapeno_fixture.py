"""A Jalapeno database for the topology tests, built the way Jalapeno's own code builds one.

Not from the writer's constants: every field name and type below is read off Jalapeno's Go code
(cisco-open/jalapeno at e983b1fc6705b4cc6428e69b3c6eb606916c8954, 2026-02-02) and gobmp's
(sbezverk/gobmp pkg/message/types.go LSLink), so the tests catch a writer that expects a shape
Jalapeno does not produce:

- ls_link documents as gobmp publishes them (json tags of gobmp's `LSLink`; `mt_id_tlv` is a
  `base.MultiTopologyIdentifier`) and keyed as gobmp-arango's lslink-handler.go MakeKey does:
  `{protocol_id}_{domain_id}_{mt_id}_{area_id}_{igp_router_id}_{local_link_ip}_{remote_igp_router_id}_{remote_link_ip}`;
- igp_node documents (igp-graph arangodb/types.go `IGPNode`): `_key` = the ls_node key
  `{protocol_id}_{domain_id}_{area_id}_{igp_router_id}` (area "0" for IS-IS), `name` = the
  BGP-LS node name (TLV 1026, the router's hostname);
- igpv6_graph edges as igp-graph's createIGPv6EdgeObject makes them from an ls_link
  (graph-edge-processor.go `IGPGraphObject`: `_key` = `link` = the ls_link key, `_from`/`_to` =
  the igp_node `_id`s, the TE fields uint32 with 0 for absent ones, `unidir_link_delay_min_max`
  null when BGP-LS has none, `omitempty` fields left out when zero);
- ls_srv6_sid documents as gobmp publishes them (json tags of gobmp's `LSSRv6SID`,
  pkg/message/types.go; `srv6_sid_structure` is pkg/srv6 `SIDStructure`, `srv6_endpoint_behavior`
  is `EndpointBehavior`) keyed as gobmp-arango's srv6sid handler does:
  `{domain_id}_{igp_router_id}_{srv6_sid}`; igp-graph finds a SID's node by `igp_router_id` and
  `domain_id` (srv6-processor.go addSRv6SIDToIGPNode);
- ipv6_graph edges as ip-graph copies them (igp-sync-processor.go syncAllIGPEdges:
  `INSERT UNSET(edge, "_id", "_rev") INTO ipv6_graph OPTIONS { overwriteMode: "update" }`:
  the same `_key` and every field). ip-graph's older igp-copy-processor.go re-keys the copy
  `igp_<key>` and drops the delay fields; it is not called by ip-graph's Start/UpdateCoordinator
  any more, but `COPY_REKEYED` builds that shape too: the writer matches on link addresses,
  which both shapes carry.
"""

from __future__ import annotations

from arango import ArangoClient

# IS-IS level 2 over IPv6 (gobmp base.ProtoID 2, MT-ID 2), domain 0, as a router would report
PROTOCOL_ID, PROTOCOL, DOMAIN_ID, AREA_ID, MT_ID = 2, "IS-IS Level 2", 0, "0", 2
# netlab line5's routers with IS-IS system ids; names as the hostname TLV carries them
ROUTERS = {"A": "0000.0000.000a", "R": "0000.0000.0002", "B": "0000.0000.000b"}
# routers that run no segscope agent: Jalapeno knows them (BGP-LS), segscope has no view of them
AGENTLESS = {"P1": "0000.0000.0101", "P2": "0000.0000.0102"}
SYSTEM_IDS = {**ROUTERS, **AGENTLESS}
# line5's router links (netlab/topologies/line5.yaml): (local, local ip, remote, remote ip)
LINKS = [
    ("A", "fc00:12::1", "R", "fc00:12::2"),
    ("R", "fc00:12::2", "A", "fc00:12::1"),
    ("R", "fc00:23::1", "B", "fc00:23::2"),
    ("B", "fc00:23::2", "R", "fc00:23::1"),
]
# json tags of igp-graph's IGPGraphObject that carry `omitempty` (dropped when zero/nil)
OMITEMPTY = {
    "peer_node_sid",
    "peer_adj_sid",
    "peer_set_sid",
    "srv6_bgp_peer_node_sid",
    "srv6_endx_sid",
    "ls_adjacency_sid",
    "unidir_delay_variation",
    "unidir_packet_loss",
    "unidir_residual_bw",
    "unidir_available_bw",
    "unidir_bw_utilization",
}


def node_key(router: str) -> str:
    return f"{PROTOCOL_ID}_{DOMAIN_ID}_{AREA_ID}_{SYSTEM_IDS[router]}"


def sid_structure(block: int, node: int, function: int, argument: int) -> dict:
    """gobmp's SIDStructure as JSON (Type/Length are omitempty and 0 when parsed from BGP-LS)."""
    return {
        "locator_block_length": block,
        "locator_node_length": node,
        "function_length": function,
        "argument_length": argument,
    }


# RFC 8986 / IANA codes gobmp reports in srv6_endpoint_behavior.endpoint_behavior
UN_NEXT_CSID, UDT6 = 43, 18  # End with NEXT-C-SID (uN), End.DT6


def ls_srv6_sid(router: str, sid: str, structure: dict | None, behavior: int = UN_NEXT_CSID) -> dict:
    """An ls_srv6_sid document as gobmp sends it (LSSRv6SID json tags) with gobmp-arango's key;
    structure None: the message had no SRv6 SID Structure TLV (omitempty: no field)."""
    doc = {
        "action": "add",
        "router_ip": "192.0.2.1",
        "domain_id": DOMAIN_ID,
        "peer_ip": "192.0.2.254",
        "peer_type": 0,
        "igp_router_id": SYSTEM_IDS[router],
        "protocol_id": PROTOCOL_ID,
        "protocol": PROTOCOL,
        "mt_id_tlv": {"o_flag": False, "a_flag": False, "mt_id": MT_ID},
        "igp_flags": 0,
        "srv6_sid": sid,
        "srv6_endpoint_behavior": {"endpoint_behavior": behavior, "flag": 0, "algo": 0},
        "is_adj_rib_in_post_policy": False,
        "is_adj_rib_out_post_policy": False,
        "is_adj_rib_out": False,
        "is_loc_rib": False,
        "is_loc_rib_filtered": False,
    }
    if structure is not None:
        doc["srv6_sid_structure"] = structure
    doc["_key"] = f"{DOMAIN_ID}_{SYSTEM_IDS[router]}_{sid}"
    return doc


def ls_link(local: str, local_ip: str, remote: str, remote_ip: str, te: dict | None = None) -> dict:
    """An ls_link document as gobmp sends it (LSLink json tags) with gobmp-arango's key."""
    doc = {
        "action": "add",
        "router_ip": "192.0.2.1",
        "domain_id": DOMAIN_ID,
        "peer_ip": "192.0.2.254",
        "peer_type": 0,
        "igp_router_id": ROUTERS[local],
        "protocol": PROTOCOL,
        "protocol_id": PROTOCOL_ID,
        "area_id": AREA_ID,
        "mt_id_tlv": {"o_flag": False, "a_flag": False, "mt_id": MT_ID},
        "local_link_ip": local_ip,
        "remote_link_ip": remote_ip,
        "igp_metric": 10,
        "remote_igp_router_id": ROUTERS[remote],
        "srv6_endx_sid": [{"endpoint_behavior": 6, "flag": 0, "algo": 0, "weight": 0, "sid": "fc00:0:1:e001::"}],
        **(te or {}),
    }
    doc["_key"] = (
        f"{PROTOCOL_ID}_{DOMAIN_ID}_{MT_ID}_{AREA_ID}_{ROUTERS[local]}_{local_ip}_{ROUTERS[remote]}_{remote_ip}"
    )
    return doc


def _u32(v) -> int:
    """igp-graph's getUint32: a JSON number truncated to uint32, anything else 0."""
    return int(v) & 0xFFFFFFFF if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


def igp_edge(link: dict) -> dict:
    """igp-graph's createIGPv6EdgeObject(link, localNode, remoteNode) as the JSON it stores."""
    local = next(r for r, sysid in ROUTERS.items() if sysid == link["igp_router_id"])
    remote = next(r for r, sysid in ROUTERS.items() if sysid == link["remote_igp_router_id"])
    min_max = link.get("unidir_link_delay_min_max")
    edge = {
        "_key": link["_key"],
        "_from": f"igp_node/{node_key(local)}",
        "_to": f"igp_node/{node_key(remote)}",
        "link": link["_key"],
        "protocol_id": link["protocol_id"],
        "domain_id": link["domain_id"],
        "mt_id": link["mt_id_tlv"]["mt_id"],
        "area_id": link["area_id"],
        "protocol": PROTOCOL,  # getString(remoteNode, "protocol")
        "local_link_id": _u32(link.get("local_link_id")),
        "remote_link_id": _u32(link.get("remote_link_id")),
        "local_link_ip": link["local_link_ip"],
        "remote_link_ip": link["remote_link_ip"],
        "local_node_asn": _u32(link.get("local_node_asn")),
        "remote_node_asn": _u32(link.get("remote_node_asn")),
        "srv6_endx_sid": link.get("srv6_endx_sid"),
        "ls_adjacency_sid": link.get("ls_adjacency_sid"),
        "unidir_link_delay": _u32(link.get("unidir_link_delay")),
        "unidir_link_delay_min_max": [_u32(v) for v in min_max] if isinstance(min_max, list) else None,
        "unidir_delay_variation": _u32(link.get("unidir_delay_variation")),
        "unidir_packet_loss": _u32(link.get("unidir_packet_loss")),
        "unidir_residual_bw": _u32(link.get("unidir_residual_bw")),
        "unidir_available_bw": _u32(link.get("unidir_available_bw")),
        "unidir_bw_utilization": _u32(link.get("unidir_bw_utilization")),
        "prefix": "",
        "prefix_len": 0,
        "prefix_metric": 0,
        "prefix_attr_tlvs": None,
    }
    return {k: v for k, v in edge.items() if not (k in OMITEMPTY and v in (0, None))}


def igp_node(router: str) -> dict:
    return {
        "_key": node_key(router),
        "domain_id": DOMAIN_ID,
        "igp_router_id": SYSTEM_IDS[router],
        "router_id": f"10.0.0.{list(SYSTEM_IDS).index(router) + 1}",
        "protocol": PROTOCOL,
        "protocol_id": PROTOCOL_ID,
        "name": router,
        "is_prepolicy": False,
        "is_adj_rib_in": False,
    }


def copy_same_key(edge: dict) -> dict:
    """ip-graph's syncAllIGPEdges / reconcileIPv6Edges copy (UNSET _id, _rev; same _key)."""
    return {k: v for k, v in edge.items() if k not in ("_id", "_rev")}


def copy_rekeyed(edge: dict) -> dict:
    """ip-graph's igp-copy-processor.go createIPEdgeFromIGP (IPGraphObject; key igp_<key>)."""
    return {
        "_key": f"igp_{edge['_key']}",
        "_from": edge["_from"],
        "_to": edge["_to"],
        "link": edge["link"],
        "protocol_id": edge["protocol_id"],
        "domain_id": edge["domain_id"],
        "mt_id": edge["mt_id"],
        "area_id": edge["area_id"],
        "protocol": edge["protocol"],
        "local_node_asn": edge["local_node_asn"],
        "remote_node_asn": edge["remote_node_asn"],
        "local_link_id": edge["local_link_id"],
        "remote_link_id": edge["remote_link_id"],
        "local_link_ip": edge["local_link_ip"],
        "remote_link_ip": edge["remote_link_ip"],
        "igp_metric": edge.get("prefix_metric", 0),
        "max_link_bw_kbps": 0,
        "srv6_endx_sid": edge.get("srv6_endx_sid"),
        "ls_adjacency_sid": edge.get("ls_adjacency_sid"),
        "unidir_link_delay_min_max": edge.get("unidir_link_delay_min_max"),
        "app_spec_link_attr": None,
    }


def build(
    target,
    links=LINKS,
    ip_graph: str | None = "same_key",
    te: dict | None = None,
    srv6_sids: list[dict] | None = None,
    routers=tuple(ROUTERS),
) -> dict[str, dict]:
    """Create database `target.db_name` with igp_node (of `routers`), igpv6_graph (+ ipv6_graph
    unless ip_graph is None; "same_key" or "rekeyed" copies) as igp-graph/ip-graph would, and
    ls_srv6_sid with `srv6_sids` (ls_srv6_sid documents) unless None; returns {collection: {_key:
    doc}} of what it stored."""
    client = ArangoClient(hosts=target.url)
    client.db("_system", username=target.user, password=target.password).create_database(target.db_name)
    db = client.db(target.db_name, username=target.user, password=target.password)
    db.create_collection("igp_node")
    db.create_collection("igpv6_graph", edge=True)
    nodes = {r: igp_node(r) for r in routers}
    edges = [igp_edge(ls_link(*link, te=te)) for link in links]
    db.collection("igp_node").insert_many(list(nodes.values()))
    db.collection("igpv6_graph").insert_many(edges)
    out = {"igp_node": {n["_key"]: n for n in nodes.values()}, "igpv6_graph": {e["_key"]: e for e in edges}}
    if srv6_sids is not None:
        db.create_collection("ls_srv6_sid")
        if srv6_sids:
            db.collection("ls_srv6_sid").insert_many(srv6_sids)
        out["ls_srv6_sid"] = {d["_key"]: d for d in srv6_sids}
    if ip_graph is not None:
        copy = copy_same_key if ip_graph == "same_key" else copy_rekeyed
        copies = [copy(e) for e in edges]
        db.create_collection("ipv6_graph", edge=True)
        db.collection("ipv6_graph").insert_many(copies)
        out["ipv6_graph"] = {c["_key"]: c for c in copies}
    return out


def bgp_ls_update(target, local: str, local_ip: str, remote: str, remote_ip: str, te: dict | None = None) -> None:
    """What igp-graph does on a BGP-LS ls_link update: UpdateDocument(key, IGPGraphObject),
    a PATCH with every non-omitempty field (unidir_link_delay 0 when BGP-LS has none)."""
    db = ArangoClient(hosts=target.url).db(target.db_name, username=target.user, password=target.password)
    edge = igp_edge(ls_link(local, local_ip, remote, remote_ip, te=te))
    # UpdateDocument = PATCH by _key, keepNull and mergeObjects true: the same as an insert with
    # overwriteMode=update on an existing key (the one the stand-in implements)
    db.collection("igpv6_graph").insert(edge, overwrite_mode="update", keep_none=True, merge=True)
