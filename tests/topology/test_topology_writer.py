"""The python-arango writer and the sink against an ArangoDB HTTP API.

By default the API is the in-process STAND-IN (tests/topology/arango_standin.py); with
SEGSCOPE_ARANGO_URL set the same tests run against a real ArangoDB (conftest.py). Tests that
inspect the stand-in itself (its request log, its refusal of other AQL) say so and only run on it.
"""

from __future__ import annotations

import copy

import pytest
from arango import ArangoClient
from arango.exceptions import ArangoServerError
from test_topology_model import AR_KEY, ONE_HOP, RA_KEY, stamp, views

from processors.topology.model import TopologyModel
from processors.topology.sink import TopologySink
from processors.topology.writer import ArangoWriter, WriterError


def writer(t, **kw) -> ArangoWriter:
    return ArangoWriter(t.url, t.db_name, t.user, t.password, **kw)


def model_with(*vs):
    m = TopologyModel()
    for v in vs:
        m.apply_view(copy.deepcopy(v))
    return m


def counts(w: ArangoWriter) -> dict[str, int]:
    n = w.names
    return {c: len(w.all_documents(c)) for c in (n.nodes, n.links, n.sids, n.edges, n.paths)}


def test_ensure_schema_creates_db_collections_and_graph_once(arango):
    w = writer(arango)
    w.ensure_schema()
    w.ensure_schema()  # idempotent: nothing fails the second time
    assert w.db.has_graph("segscope_graph")
    cols = {c["name"]: c["type"] for c in w.db.collections() if not c["system"]}
    assert cols == {
        "segscope_node": "document",
        "segscope_link": "document",
        "segscope_srv6_sid": "document",
        "segscope_path": "document",
        "segscope_graph_edge": "edge",
    }
    g = w.db.graph("segscope_graph").properties()
    assert g["edge_definitions"] == [
        {
            "edge_collection": "segscope_graph_edge",
            "from_vertex_collections": ["segscope_node"],
            "to_vertex_collections": ["segscope_node"],
        }
    ]


def test_upsert_by_key_never_duplicates_and_merges_fields(arango):
    w = writer(arango)
    w.ensure_schema()
    docs = [{"_key": "200_0_0_A", "name": "A", "x": 1}, {"_key": "200_0_0_R", "name": "R"}]
    assert w.upsert("segscope_node", docs) == 2
    assert w.upsert("segscope_node", docs) == 2
    w.upsert("segscope_node", [{"_key": "200_0_0_A", "y": 2}])
    got = {d["_key"]: d for d in w.all_documents("segscope_node")}
    assert len(got) == 2
    assert (got["200_0_0_A"]["x"], got["200_0_0_A"]["y"], got["200_0_0_A"]["name"]) == (1, 2, "A")
    assert w.db.collection("segscope_node").get("200_0_0_R")["name"] == "R"


def test_an_edge_without_from_to_and_a_bad_key_are_errors_not_silent(arango):
    w = writer(arango)
    w.ensure_schema()
    with pytest.raises(WriterError, match="1 of 1 upserts into segscope_graph_edge failed"):
        w.upsert("segscope_graph_edge", [{"_key": "k", "latency": 1.0}])
    with pytest.raises(WriterError):
        w.upsert("segscope_node", [{"_key": "a/b"}])
    assert w.counters.document_errors == 2
    assert w.all_documents("segscope_graph_edge") == []


def test_wrong_password_is_refused(arango):
    w = ArangoWriter(arango.url, arango.db_name, arango.user, arango.password + "-wrong")
    with pytest.raises(ArangoServerError) as e:
        w.ensure_schema()
    assert e.value.http_code == 401


def test_jwt_authentication_works_and_a_wrong_password_gets_no_token(arango):
    w = writer(arango, auth_method="jwt")
    w.ensure_schema()
    assert w.upsert("segscope_node", [{"_key": "200_0_0_A", "name": "A"}]) == 1
    assert [d["name"] for d in w.all_documents("segscope_node")] == ["A"]
    with pytest.raises(ArangoServerError) as e:
        ArangoWriter(arango.url, arango.db_name, arango.user, arango.password + "-wrong", auth_method="jwt")
    assert e.value.http_code == 401


def test_sink_writes_the_model_then_only_changes_and_replays_add_nothing(arango):
    m = model_with(*views(sessions=[ONE_HOP]))
    sink = TopologySink(m, writer(arango))
    assert sink.flush() == {"upserted": 3 + 4 + 3 + 4 + 2, "deleted": 0, "expired": 0}
    assert counts(sink.writer) == {
        "segscope_node": 3,
        "segscope_link": 4,
        "segscope_srv6_sid": 3,
        "segscope_graph_edge": 4,
        "segscope_path": 2,
    }
    assert sink.flush() == {"upserted": 0, "deleted": 0, "expired": 0}  # nothing changed: nothing sent
    m.apply_point(stamp("forward", 2044.9))
    assert sink.flush() == {"upserted": 2, "deleted": 0, "expired": 0}  # edge A->R + forward path doc
    edge = sink.writer.db.collection("segscope_graph_edge").get(AR_KEY)
    assert (edge["_from"], edge["_to"], edge["latency"], edge["unidir_link_delay"]) == (
        "segscope_node/200_0_0_A",
        "segscope_node/200_0_0_R",
        2044.9,
        2044.9,
    )
    # a restarted processor (or a new leader) replaying everything reads the database back first:
    # the documents are already what its model says, nothing is sent, nothing duplicated
    m2 = model_with(*views(sessions=[ONE_HOP]))
    m2.apply_point(stamp("forward", 2044.9))
    sink2 = TopologySink(m2, writer(arango))
    assert sink2.flush() == {"upserted": 0, "deleted": 0, "expired": 0}
    assert sink2.counters.documents_read_back == 16
    assert counts(sink2.writer) == {
        "segscope_node": 3,
        "segscope_link": 4,
        "segscope_srv6_sid": 3,
        "segscope_graph_edge": 4,
        "segscope_path": 2,
    }
    assert sink2.writer.db.collection("segscope_graph_edge").get(AR_KEY)["latency"] == 2044.9


def test_sink_deletes_links_and_edges_that_disappear(arango):
    m = model_with(*views())
    sink = TopologySink(m, writer(arango))
    sink.flush()
    r = views(nodes="R", t=2_000_000_000)[0]
    r["interfaces"] = [i for i in r["interfaces"] if i["name"] != "r0"]
    m.apply_view(r)
    assert sink.flush() == {"upserted": 1, "deleted": 4, "expired": 0}  # R's node doc; A<->R link + edge x2
    keys = {d["_key"] for d in sink.writer.all_documents("segscope_graph_edge")}
    assert AR_KEY not in keys and RA_KEY not in keys and len(keys) == 2


def test_sink_retries_after_a_failed_write(arango):
    m = model_with(*views())
    sink = TopologySink(
        m, ArangoWriter("http://127.0.0.1:9", arango.db_name, arango.user, arango.password, timeout_s=1)
    )
    assert sink.flush() == {"error": 1}
    assert sink.counters.flush_errors == 1 and sink.last_error and sink.written == {}
    sink.writer = writer(arango)  # the database is back
    assert sink.flush()["upserted"] == 14 and sink.last_error is None


def test_sink_rewrites_everything_after_the_database_was_lost(arango):
    m = model_with(*views(sessions=[ONE_HOP]))
    sink = TopologySink(m, writer(arango))
    assert sink.flush()["upserted"] == 16
    if arango.standin is not None:
        arango.standin.store.dbs.pop(arango.db_name)  # the stand-in "loses" the database
    else:
        ArangoClient(hosts=arango.url).db("_system", username=arango.user, password=arango.password).delete_database(
            arango.db_name
        )
    m.apply_view(views(nodes="R", t=2_000_000_000)[0])  # no content change: nothing to send...
    assert sink.flush() == {"upserted": 0, "deleted": 0, "expired": 0}  # ... so nothing notices yet
    m.apply_point(stamp("forward", 1.0))  # a change: the write fails (no database)
    assert sink.flush() == {"error": 1} and not sink.schema_ready
    assert sink.flush()["upserted"] == 16  # database recreated, everything rewritten
    assert counts(sink.writer)["segscope_graph_edge"] == 4


def test_jalapeno_mode_refuses_a_database_without_jalapeno_collections(arango):
    ArangoClient(hosts=arango.url).db("_system", username=arango.user, password=arango.password).create_database(
        arango.db_name
    )
    with pytest.raises(WriterError, match="no collection 'igp_node'"):
        writer(arango, mode="jalapeno").ensure_schema()


# -- the stand-in itself -----------------------------------------------------------------
def test_standin_serves_only_the_endpoints_the_writer_uses(arango):
    if arango.standin is None:
        pytest.skip("inspects the stand-in's request log; SEGSCOPE_ARANGO_URL points at a real ArangoDB")
    m = model_with(*views(sessions=[ONE_HOP]))
    m.apply_point(stamp("forward", 2044.9))
    sink = TopologySink(m, writer(arango))
    sink.flush()
    sink.writer.delete("segscope_path", ["200_0_0_A_200_0_0_R_fc00:12::2"])
    sink.writer.all_documents("segscope_node")
    used = {(meth, "/".join(p.split("/")[:5])) for meth, p in arango.standin.store.requests}
    assert used == {
        ("GET", "/_db/_system/_api/database"),
        ("POST", "/_db/_system/_api/database"),
        ("GET", f"/_db/{arango.db_name}/_api/collection"),
        ("POST", f"/_db/{arango.db_name}/_api/collection"),
        ("GET", f"/_db/{arango.db_name}/_api/gharial"),
        ("POST", f"/_db/{arango.db_name}/_api/gharial"),
        ("GET", f"/_db/{arango.db_name}/_api/index"),
        ("POST", f"/_db/{arango.db_name}/_api/index"),
        ("POST", f"/_db/{arango.db_name}/_api/document"),
        ("DELETE", f"/_db/{arango.db_name}/_api/document"),
        ("POST", f"/_db/{arango.db_name}/_api/cursor"),
    }
    with pytest.raises(ArangoServerError) as e:
        sink.writer.db.aql.execute("FOR d IN segscope_node FILTER d.x == 1 RETURN d")
    assert e.value.error_code == 1501
    with pytest.raises(ArangoServerError) as e:
        sink.writer.db.collection("segscope_node").truncate()
    assert e.value.http_code == 501
