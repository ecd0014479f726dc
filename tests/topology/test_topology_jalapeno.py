"""Jalapeno mode against a database shaped by Jalapeno's own code (jalapeno_fixture.py): edges
of igp-graph (igpv6_graph) and their ip-graph copies (ipv6_graph) annotated with delay and loss,
refreshed after a BGP-LS update rewrote them, stale values removed, indexes created. Also
own-mode expiry.

The stand-in by default; a real ArangoDB with SEGSCOPE_ARANGO_URL (conftest.py).
"""

from __future__ import annotations

import copy

import jalapeno_fixture as jf
import pytest
from test_topology_model import ONE_HOP, stamp, views

from processors.topology.jalapeno_sids import NOT_EXPANDED_REASONS
from processors.topology.model import DELAY_FIELDS, LOSS_FIELDS, Names, TopologyModel
from processors.topology.sink import TopologySink
from processors.topology.writer import ArangoWriter
from segscope_schemas.line_protocol import parse_line

T0 = 1795306905000000000  # the stamp points' time (test_topology_model.stamp)
AR = jf.ls_link("A", "fc00:12::1", "R", "fc00:12::2")["_key"]
RA = jf.ls_link("R", "fc00:12::2", "A", "fc00:12::1")["_key"]


class Clocks:
    """The sink's two clocks, moved by the test (refresh period, measurement age)."""

    def __init__(self):
        self.mono, self.wall = 1000.0, T0 + 1_000_000_000

    def advance(self, s: float) -> None:
        self.mono += s
        self.wall += int(s * 1e9)


def model(*points):
    m = TopologyModel()
    for v in views(sessions=[ONE_HOP]):
        m.apply_view(copy.deepcopy(v))
    for p in points:
        m.apply_point(p)
    return m


def jalapeno_sink(t, m, clocks, **kw) -> TopologySink:
    w = ArangoWriter(t.url, t.db_name, t.user, t.password, mode="jalapeno", **kw.pop("writer", {}))
    return TopologySink(m, w, monotonic=lambda: clocks.mono, wall_ns=lambda: clocks.wall, **kw)


def edges(sink, coll="igpv6_graph") -> dict[str, dict]:
    return {d["_key"]: d for d in sink.writer.all_documents(coll)}


def test_both_graphs_are_annotated_with_bgp_ls_types_and_nothing_is_created(arango):
    stored = jf.build(arango)
    clocks = Clocks()
    sink = jalapeno_sink(arango, model(stamp("forward", 2044.9), stamp("reverse", 1033.2)), clocks)
    stats = sink.flush()
    assert stats == {"annotated": 2, "unmatched": 0, "ip_annotated": 2, "ip_unmatched": 0, "upserted": 2, "expired": 0}
    for coll in ("igpv6_graph", "ipv6_graph"):
        got = edges(sink, coll)
        assert set(got) == set(stored[coll])  # no edge added, none lost
        ar, ra = got[AR], got[RA]
        assert (ar["latency"], ar["unidir_link_delay"], ar["delay_mean_us"]) == (2045, 2045, 2044.9)
        assert (ra["latency"], ra["unidir_link_delay"], ra["delay_mean_us"]) == (1033, 1033, 1033.2)
        assert ar["unidir_link_delay_min_max"] == [2035, 2095] and ar["unidir_delay_variation"] == 6
        assert all(type(ar[f]) is int for f in ("latency", "unidir_link_delay", "unidir_delay_variation"))
        # igp-graph's own fields untouched
        for f in ("_from", "_to", "link", "protocol_id", "mt_id", "srv6_endx_sid", "local_link_ip"):
            assert ar[f] == stored[coll][AR][f]
        rb = next(e for e in got.values() if e["local_link_ip"] == "fc00:23::1")
        assert "latency" not in rb and rb["unidir_link_delay"] == 0  # unmeasured: as igp-graph left it
    assert len(sink.writer.all_documents("igp_node")) == 3
    cols = {c["name"] for c in sink.writer.db.collections() if not c["system"]}
    assert cols == {"igp_node", "igpv6_graph", "ipv6_graph", "segscope_path"}
    paths = {d["_key"]: d for d in sink.writer.all_documents("segscope_path")}
    fwd = paths["200_0_0_A_200_0_0_R_fc00:12::2"]
    assert (fwd["src"], fwd["dst"]) == (f"igp_node/{jf.node_key('A')}", f"igp_node/{jf.node_key('R')}")


def test_a_bgp_ls_update_that_erased_the_te_fields_is_overwritten_at_the_next_refresh(arango):
    jf.build(arango)
    clocks = Clocks()
    sink = jalapeno_sink(arango, model(stamp("forward", 2044.9)), clocks, refresh_s=30.0)
    assert sink.flush()["annotated"] == 1
    jf.bgp_ls_update(arango, "A", "fc00:12::1", "R", "fc00:12::2")  # igp-graph's UpdateDocument
    e = edges(sink)[AR]
    assert (e["unidir_link_delay"], e["unidir_link_delay_min_max"]) == (0, None)  # BGP-LS had none
    assert e["latency"] == 2045  # not an IGPGraphObject field: the PATCH kept it
    clocks.advance(29)
    assert sink.flush()["annotated"] == 0  # unchanged model, refresh not due
    assert edges(sink)[AR]["unidir_link_delay"] == 0
    clocks.advance(1)
    assert sink.flush()["annotated"] == 1 and sink.counters.refreshes == 2
    e = edges(sink)[AR]
    assert (e["unidir_link_delay"], e["unidir_link_delay_min_max"], e["latency"]) == (2045, [2035, 2095], 2045)


@pytest.mark.parametrize("shape", ["same_key", "rekeyed"])
def test_ip_graph_copies_are_matched_by_link_addresses_whatever_their_key(arango, shape):
    stored = jf.build(arango, ip_graph=shape)
    sink = jalapeno_sink(arango, model(stamp("forward", 2044.9)), Clocks())
    assert sink.flush()["ip_annotated"] == 1
    key = AR if shape == "same_key" else f"igp_{AR}"
    assert set(edges(sink, "ipv6_graph")) == set(stored["ipv6_graph"])
    assert edges(sink, "ipv6_graph")[key]["latency"] == 2045


def test_without_ip_graph_only_igp_graph_is_written_until_ip_graph_appears(arango):
    jf.build(arango, ip_graph=None)
    clocks = Clocks()
    sink = jalapeno_sink(arango, model(stamp("forward", 2044.9)), clocks, refresh_s=30.0)
    assert sink.flush() == {
        "annotated": 1,
        "unmatched": 0,
        "ip_annotated": 0,
        "ip_unmatched": 0,
        "upserted": 2,
        "expired": 0,
    }
    sink.writer.db.create_collection("ipv6_graph", edge=True)  # ip-graph starts, copies the edges
    sink.writer.db.collection("ipv6_graph").insert_many(
        [jf.copy_same_key(d) for d in sink.writer.all_documents("igpv6_graph")]
    )
    clocks.advance(30)
    assert sink.flush()["ip_annotated"] == 1
    assert edges(sink, "ipv6_graph")[AR]["latency"] == 2045


def test_edges_jalapeno_does_not_have_are_counted_not_created(arango):
    jf.build(arango, links=jf.LINKS[2:])  # only R<->B
    sink = jalapeno_sink(arango, model(stamp("forward", 2044.9), stamp("reverse", 1033.0)), Clocks())
    stats = sink.flush()
    assert (stats["annotated"], stats["unmatched"], stats["ip_unmatched"]) == (0, 2, 2)
    assert sink.writer.counters.edges_unmatched == 2 and len(edges(sink)) == 2


def test_stale_measurements_are_removed_from_both_graphs_and_not_written_back(arango):
    stored = jf.build(arango)
    clocks = Clocks()
    m = model(stamp("forward", 2044.9), stamp("reverse", 1033.2, ts=T0 + 200_000_000_000))
    sink = jalapeno_sink(arango, m, clocks, refresh_s=1.0, stale_after_s=300.0)
    assert sink.flush()["annotated"] == 2
    clocks.advance(299)  # forward point now 300 s old (not yet expired), reverse 100 s
    assert sink.flush()["expired"] == 0
    clocks.advance(2)  # forward 302 s old: expired at this refresh
    stats = sink.flush()
    assert (stats["expired"], stats["annotated"]) == (2, 1)  # A->R in both graphs; R->A refreshed
    for coll in ("igpv6_graph", "ipv6_graph"):
        ar, ra = edges(sink, coll)[AR], edges(sink, coll)[RA]
        assert not set(DELAY_FIELDS) & set(ar), f"{coll}: {sorted(set(DELAY_FIELDS) & set(ar))} left"
        # everything igp-graph wrote is still there
        assert {k: v for k, v in ar.items() if k != "_rev"} == {
            k: v for k, v in stored[coll][AR].items() if k not in DELAY_FIELDS and k != "_rev"
        } | {"_id": f"{coll}/{AR}"}
        assert ra["latency"] == 1033
    clocks.advance(30)
    assert sink.flush() == {**stats, "expired": 0}  # the expired value is not written back
    assert "latency" not in edges(sink)[AR]
    clocks.advance(170)  # R->A (measured at T0 + 200 s) expires too
    assert sink.flush()["expired"] == 2 and "latency" not in edges(sink)[RA]


# altmark flow 5 from A to R over a0: one hop, so its loss annotates the A->R edge
ONE_HOP_FLOW = {
    "side": "FLOW_MONITOR_SIDE_TX",
    "flow_id": 5,
    "method": "MARKING_METHOD_DSCP",
    "segments": ["fc00:2::e"],
    "device": "a0",
    "period_ms": 1000,
}


def test_loss_is_written_in_rfc_8570_units_and_percent_and_expires_from_both_graphs(arango):
    stored = jf.build(arango)
    clocks = Clocks()
    m = TopologyModel()
    for v in views(flows=[ONE_HOP_FLOW]):
        m.apply_view(copy.deepcopy(v))
    # 123 of 10 000 lost: 1.23 %, 410 000 units of 0.000003 % (RFC 8570 section 4.4)
    assert m.apply_point(
        parse_line(
            "altmark_loss,flow=5,method=dscp,period_ms=1000,tx_node=A,rx_node=R tx_packets=10000i,"
            f'rx_packets=9877i,lost=123i,loss_ratio=0.0123,complete=true,reason="ok" {T0}'
        )
    )
    sink = jalapeno_sink(arango, m, clocks, refresh_s=1.0, stale_after_s=300.0)
    stats = sink.flush()
    assert (stats["annotated"], stats["ip_annotated"], stats["unmatched"]) == (1, 1, 0)
    for coll in ("igpv6_graph", "ipv6_graph"):
        ar = edges(sink, coll)[AR]
        assert type(ar["unidir_packet_loss"]) is int and ar["unidir_packet_loss"] == 410_000, coll
        assert ar["unidir_packet_loss_percentage"] == 1.23
        assert ar["loss_measured_at_ns"] == T0
        assert ar["loss_source"] == {"kind": "altmark", "flow": 5, "tx_node": "A", "tx_packets": 10000, "lost": 123}
        assert not set(LOSS_FIELDS) & set(edges(sink, coll)[RA])  # the reverse direction carries no flow
    clocks.advance(300)  # the point is 301 s old: expired at this refresh
    assert sink.flush()["expired"] == 2  # A->R in igpv6_graph and in ipv6_graph
    for coll in ("igpv6_graph", "ipv6_graph"):
        ar = edges(sink, coll)[AR]
        assert not set(LOSS_FIELDS) & set(ar), f"{coll}: {sorted(set(LOSS_FIELDS) & set(ar))} left"
        assert {k: v for k, v in ar.items() if k not in ("_rev", "_id")} == {
            k: v for k, v in stored[coll][AR].items() if k != "_rev"
        }
    clocks.advance(30)
    assert sink.flush()["annotated"] == 0  # the expired loss is not written back
    assert "unidir_packet_loss_percentage" not in edges(sink)[AR]


def test_expiry_removes_the_fields_a_previous_run_wrote(arango):
    jf.build(arango)
    clocks = Clocks()
    first = jalapeno_sink(arango, model(stamp("forward", 2044.9)), clocks)
    first.flush()
    clocks.advance(600)
    # a restarted processor that never saw that point still cleans the edge (found by its timestamp)
    second = jalapeno_sink(arango, model(), clocks, stale_after_s=300.0)
    assert second.flush()["expired"] == 2
    assert "delay_measured_at_ns" not in edges(second)[AR]


def test_own_mode_edges_lose_stale_values_too(arango):
    clocks = Clocks()
    w = ArangoWriter(arango.url, arango.db_name, arango.user, arango.password)
    m = model(stamp("forward", 2044.9))
    sink = TopologySink(
        m, w, refresh_s=0.0, stale_after_s=60.0, monotonic=lambda: clocks.mono, wall_ns=lambda: clocks.wall
    )
    sink.flush()
    key = "200_0_2_0_A_fc00:12::1_R_fc00:12::2"
    assert w.db.collection("segscope_graph_edge").get(key)["latency"] == 2044.9
    clocks.advance(61)
    assert sink.flush()["expired"] == 1
    e = w.db.collection("segscope_graph_edge").get(key)
    assert not set(DELAY_FIELDS) & set(e) and e["local_link_ip"] == "fc00:12::1"
    assert w.db.collection("segscope_path").get("200_0_0_A_200_0_0_R_fc00:12::2")["delay_us"] == 2044.9


def test_a_newer_second_without_jitter_removes_the_older_jitter(arango):
    """Each edge carries the fields of one second: a newer point without ipdv_mean_us must not
    leave the older point's unidir_delay_variation beside its own delay_measured_at_ns."""
    jf.build(arango)
    clocks = Clocks()
    m = model(stamp("forward", 2044.9))
    sink = jalapeno_sink(arango, m, clocks)
    assert sink.flush()["annotated"] == 1
    assert [edges(sink, c)[AR]["unidir_delay_variation"] for c in ("igpv6_graph", "ipv6_graph")] == [6, 6]
    assert m.apply_point(stamp("forward", 2050.0, ts=T0 + 1_000_000_000, ipdv=None))
    assert sink.flush()["annotated"] == 1  # changed: written before the refresh is due
    for coll in ("igpv6_graph", "ipv6_graph"):
        ar = edges(sink, coll)[AR]
        assert "unidir_delay_variation" not in ar, coll
        assert (ar["delay_measured_at_ns"], ar["latency"], ar["delay_mean_us"]) == (T0 + 1_000_000_000, 2050, 2050.0)
    # own mode: the edge document is replaced whole, so the field goes there too
    own = ArangoWriter(arango.url, arango.db_name + "_own", arango.user, arango.password)
    m = model(stamp("forward", 2044.9))
    sink = TopologySink(m, own, monotonic=lambda: clocks.mono, wall_ns=lambda: clocks.wall)
    key = "200_0_2_0_A_fc00:12::1_R_fc00:12::2"
    try:
        sink.flush()
        assert own.db.collection("segscope_graph_edge").get(key)["unidir_delay_variation"] == 6.3
        m.apply_point(stamp("forward", 2050.0, ts=T0 + 1_000_000_000, ipdv=None))
        assert sink.flush()["upserted"] >= 1
        e = own.db.collection("segscope_graph_edge").get(key)
        assert "unidir_delay_variation" not in e and e["delay_measured_at_ns"] == T0 + 1_000_000_000
        assert e["local_link_ip"] == "fc00:12::1" and e["_from"] == "segscope_node/200_0_0_A"
    finally:
        if arango.standin is None:
            own.client.db("_system", username=arango.user, password=arango.password).delete_database(own.db_name)


def test_indexes_on_the_filtered_fields_are_created_once(arango):
    jf.build(arango)
    w = ArangoWriter(arango.url, arango.db_name, arango.user, arango.password, mode="jalapeno")
    w.ensure_schema()
    # literal field lists, from what the writer's AQL filters on (not from its constants): the
    # annotate query e.local_link_ip/e.remote_link_ip, the expiry e.@stamp_field (the four
    # *_measured_at_ns: the link's delay, each delay source's, the loss), the node lookup n.name
    stamps = [
        ("delay_measured_at_ns",),
        ("stamp_link_delay_measured_at_ns",),
        ("inline_link_delay_measured_at_ns",),
        ("loss_measured_at_ns",),
    ]
    for coll in ("igpv6_graph", "ipv6_graph"):
        persistent = {tuple(i["fields"]): i for i in w.db.collection(coll).indexes() if i["type"] == "persistent"}
        assert set(persistent) == {("local_link_ip", "remote_link_ip"), *stamps}
        assert persistent[("local_link_ip", "remote_link_ip")]["sparse"] is False  # every edge has both
        for fields in stamps:
            assert persistent[fields]["sparse"] is True, fields  # most edges are not measured
    nodes = [tuple(i["fields"]) for i in w.db.collection("igp_node").indexes() if i["type"] == "persistent"]
    assert nodes == [("name",)]
    created = w.counters.indexes_created
    assert created == 11  # 5 per edge collection + igp_node.name
    w.ensure_schema()
    assert w.counters.indexes_created == created
    own = ArangoWriter(arango.url, arango.db_name + "_own", arango.user, arango.password)
    try:
        own.ensure_schema()
        fields = {tuple(i["fields"]) for i in own.db.collection("segscope_graph_edge").indexes()}
        assert set(stamps) <= fields
    finally:
        if arango.standin is None:
            own.client.db("_system", username=arango.user, password=arango.password).delete_database(own.db_name)


def test_names_are_configurable(arango):
    jf.build(arango, ip_graph=None)
    w = ArangoWriter(arango.url, arango.db_name, arango.user, arango.password)
    w.db.create_collection("my_ipv6", edge=True)
    w.db.collection("my_ipv6").insert_many([jf.copy_same_key(d) for d in w.all_documents("igpv6_graph")])
    names = Names(jalapeno_ip_edges="my_ipv6")
    sink = jalapeno_sink(arango, model(stamp("forward", 2044.9)), Clocks(), writer={"names": names})
    sink.model.names = names
    assert sink.flush()["ip_annotated"] == 1
    assert edges(sink, "my_ipv6")[AR]["latency"] == 2045
    off = jalapeno_sink(arango, model(stamp("forward", 1.0)), Clocks(), writer={"names": Names(jalapeno_ip_edges="")})
    assert off.flush()["ip_annotated"] == 0 and edges(off, "my_ipv6")[AR]["latency"] == 2045


# -- uSID containers of routers without an agent, expanded from Jalapeno's ls_srv6_sid ---------------
F3216_UN = jf.sid_structure(32, 16, 0, 80)  # a uN SID of an F3216 locator, as BGP-LS reports it
OVERFLOW = jf.sid_structure(96, 32, 16, 0)  # block + node + function = 144 bits
FORWARD = "fcbb:bbbb:200:300:400::"  # A -> P1 -> P2 -> B (B's uN 400), then B's loopback
REVERSE = "fcbb:bbbb:300:200:100::"  # B -> P2 -> P1 -> A
USID_SESSION = dict(ONE_HOP, ssid=21, reflector_address="fc00:3::1", segments=[FORWARD], return_segments=[REVERSE])


def usid_sids(p2_structure=F3216_UN) -> list[dict]:
    """Every router's uN SID as gobmp publishes it; P1 and P2 run no segscope agent."""
    return [
        jf.ls_srv6_sid("A", "fcbb:bbbb:100::", F3216_UN),
        jf.ls_srv6_sid("P1", "fcbb:bbbb:200::", F3216_UN),
        jf.ls_srv6_sid("P2", "fcbb:bbbb:300::", p2_structure),
        jf.ls_srv6_sid("B", "fcbb:bbbb:400::", F3216_UN),
        jf.ls_srv6_sid("B", "fcbb:bbbb:400:d6::", jf.sid_structure(32, 16, 16, 64), behavior=jf.UDT6),
    ]


def usid_paths(arango, session=USID_SESSION, sids=None, clocks=None):
    jf.build(arango, srv6_sids=usid_sids() if sids is None else sids, routers=(*jf.ROUTERS, *jf.AGENTLESS))
    m = TopologyModel()
    for v in views(sessions=[session]):
        m.apply_view(copy.deepcopy(v))
    sink = jalapeno_sink(arango, m, clocks or Clocks())
    assert sink.flush()["upserted"] == 2
    return sink, {d["direction"]: d for d in stored_paths(sink)}


def stored_paths(sink) -> list[dict]:
    """segscope_path documents as the stand-in holds them, one per session direction."""
    return [
        {**d, "direction": s["direction"]}
        for d in sink.writer.all_documents("segscope_path")
        for s in d["stamp_sessions"]
    ]


def test_a_usid_container_of_agentless_routers_is_expanded_from_jalapenos_sid_structure(arango):
    sink, paths = usid_paths(arango)
    fwd, rev = paths["forward"], paths["reverse"]
    assert fwd["sid_list"] == [FORWARD, "fc00:3::1"] and fwd["hops"] == ["A", "P1", "P2", "B"]
    assert rev["sid_list"] == [REVERSE, "fc00:1::1"] and rev["hops"] == ["B", "P2", "P1", "A"]
    for p in (fwd, rev):
        assert (p["unresolved_sids"], p["unexpanded"]) == ([], [])
    # P1/P2 have no agent: no link of segscope's between them, so no link list (never guessed)
    assert fwd["links"] is None and fwd["dst"] == f"igp_node/{jf.node_key('B')}"
    assert sink.model.counters.not_expanded_no_sid_structure == 0
    c = sink.counters
    assert (c.jalapeno_sids_read, c.jalapeno_sids_unusable, c.jalapeno_sids_unnamed) == (5, 0, 0)


def test_a_function_micro_sid_is_executed_by_the_router_that_holds_it(arango):
    """B's uDT6 (block 32, node 16, function 16): 400 then d6 are both B's; nothing after."""
    s = dict(USID_SESSION, segments=["fcbb:bbbb:200:400:d6::"], return_segments=[])
    _, paths = usid_paths(arango, session=s)
    assert paths["forward"]["hops"] == ["A", "P1", "B"] and paths["forward"]["unexpanded"] == []


@pytest.mark.parametrize(
    "case, p2_structure, forward, reason, forward_detail",
    [
        ("missing", None, FORWARD, "no_sid_structure", "P2's SID fcbb:bbbb:300::: no srv6_sid_structure"),
        ("overflow", OVERFLOW, FORWARD, "sid_structure_inconsistent", "function 16 + argument 0 bits > 128"),
        (
            "other_width",
            jf.sid_structure(32, 32, 0, 64),
            FORWARD,
            "sid_structure_inconsistent",
            "disagree on block/micro-SID lengths: 32/16, 32/32",
        ),
        ("no_locator", F3216_UN, "fcbb:bbbb:200:777:400::", "no_locator", "micro-SID 777"),
        ("other_block", F3216_UN, "fcbb:cccc:200:300::", "no_locator", "no router's SRv6 SID has its locator block"),
    ],
)
def test_a_container_that_jalapenos_sids_cannot_expand_is_reported_with_its_reason(
    arango, case, p2_structure, forward, reason, forward_detail
):
    s = dict(USID_SESSION, segments=[forward])
    sink, paths = usid_paths(arango, session=s, sids=usid_sids(p2_structure))
    fwd = paths["forward"]
    assert [(u["sid"], u["reason"]) for u in fwd["unexpanded"]] == [(forward, reason)]
    assert forward_detail in fwd["unexpanded"][0]["detail"]
    # not expanded, so none of its routers is named and the container stays unresolved
    assert fwd["hops"] == ["A", "B"] and fwd["unresolved_sids"] == [forward] and fwd["links"] is None
    # the reverse container crosses P2 too: it fails alike when P2's SID is the problem
    p2_broken = case in ("missing", "overflow", "other_width")
    assert len(paths["reverse"]["unexpanded"]) == int(p2_broken)
    counted = {r: getattr(sink.model.counters, f"not_expanded_{r}") for r in NOT_EXPANDED_REASONS}
    assert counted == {r: (1 + p2_broken if r == reason else 0) for r in NOT_EXPANDED_REASONS}
    assert sink.counters.jalapeno_sids_unusable == int(case in ("missing", "overflow"))


def test_a_structure_jalapeno_learns_later_expands_the_path_at_the_next_refresh(arango):
    clocks = Clocks()
    sink, paths = usid_paths(arango, sids=usid_sids(None), clocks=clocks)
    assert paths["forward"]["unexpanded"][0]["reason"] == "no_sid_structure"
    fixed = jf.ls_srv6_sid("P2", "fcbb:bbbb:300::", F3216_UN)
    sink.writer.db.collection("ls_srv6_sid").insert(fixed, overwrite_mode="replace")
    clocks.advance(29)
    sink.flush()
    assert {p["direction"]: p["unexpanded"] for p in stored_paths(sink)}["forward"] != []  # refresh not due
    clocks.advance(1)
    sink.flush()
    paths = {p["direction"]: p for p in stored_paths(sink)}
    assert paths["forward"]["hops"] == ["A", "P1", "P2", "B"] and paths["forward"]["unexpanded"] == []
    assert sink.model.counters.not_expanded_no_sid_structure == 0
