"""The ArangoDB stand-in catches what ArangoDB would refuse, and the writer reads results larger
than one cursor batch. The refusal/batching checks hold on a real ArangoDB too (same error
numbers); the ones that read the stand-in's own state say so and run only on it."""

from __future__ import annotations

import jalapeno_fixture as jf
import pytest
from arango.exceptions import ArangoServerError

import processors.topology.writer as writer_mod
from processors.topology.writer import ArangoWriter, WriterError


def own_writer(t, **kw) -> ArangoWriter:
    w = ArangoWriter(t.url, t.db_name, t.user, t.password, **kw)
    w.ensure_schema()
    return w


def test_a_query_the_writer_changed_is_refused_with_arangodb_errors(arango):
    w = own_writer(arango)
    changed = writer_mod.QUERY_ALL.replace("RETURN d", "FILTER d.x == 1 RETURN d")
    if arango.standin is not None:  # any text the stand-in has no copy of: 1501 (ArangoDB: runs it)
        with pytest.raises(ArangoServerError) as e:
            w._query(changed, {"@collection": "segscope_node"})
        assert (e.value.http_code, e.value.error_code) == (400, 1501)
    with pytest.raises(ArangoServerError) as e:  # a syntax error: 1501 on both
        w._query("FOR d IN @@collection RETURN", {"@collection": "segscope_node"})
    assert (e.value.http_code, e.value.error_code) == (400, 1501)
    with pytest.raises(ArangoServerError) as e:
        w._query(writer_mod.QUERY_ALL, {"@collection": "no_such_collection"})
    assert (e.value.http_code, e.value.error_code) == (404, 1203)
    with pytest.raises(ArangoServerError) as e:
        w._query(writer_mod.QUERY_NODE_BY_NAME, {"@nodes": "segscope_node"})  # @name missing
    assert (e.value.http_code, e.value.error_code) == (400, 1551)
    with pytest.raises(ArangoServerError) as e:
        w._query(writer_mod.QUERY_ALL, {"@collection": "segscope_node", "extra": 1})
    assert (e.value.http_code, e.value.error_code) == (400, 1552)


def test_the_standin_holds_its_own_copies_of_the_writers_queries(arango, monkeypatch):
    if arango.standin is None:
        pytest.skip("checks the stand-in's query table; SEGSCOPE_ARANGO_URL points at a real ArangoDB")
    # a writer whose query drifted (here: one extra condition) fails against the stand-in
    jf.build(arango)
    drifted = writer_mod.QUERY_ANNOTATE_EDGES.replace("FILTER", "FILTER e.mt_id == 2 AND")
    monkeypatch.setattr(writer_mod, "QUERY_ANNOTATE_EDGES", drifted)
    w = ArangoWriter(arango.url, arango.db_name, arango.user, arango.password, mode="jalapeno")
    with pytest.raises(ArangoServerError) as e:
        w.annotate_edges("igpv6_graph", [{"local_ip": "fc00:12::1", "remote_ip": "fc00:12::2", "fields": {}}])
    assert e.value.error_code == 1501


@pytest.mark.parametrize(
    "key",
    [5, "", "a/b", "a b", "ü", "k" * 255],
    ids=["int", "empty", "slash", "space", "non-ascii", "255-bytes"],
)
def test_illegal_keys_are_refused_per_document_with_1221(arango, key):
    w = own_writer(arango)
    with pytest.raises(WriterError, match="1 of 2 upserts"):
        w.upsert("segscope_node", [{"_key": "ok", "name": "A"}, {"_key": key, "name": "B"}])
    assert [d["_key"] for d in w.all_documents("segscope_node")] == ["ok"]  # the good one is written
    results = w.db.collection("segscope_node").insert_many([{"_key": key}], overwrite_mode="update")
    assert results[0].error_code == 1221 and results[0].http_code in (400, 202)
    assert w.upsert("segscope_node", [{"_key": "k" * 254}]) == 1  # 254 bytes: the longest legal key


def test_results_larger_than_one_batch_are_read_to_the_end(arango):
    jf.build(arango)
    w = ArangoWriter(arango.url, arango.db_name, arango.user, arango.password, mode="jalapeno", batch_size=2)
    w.ensure_schema()
    many = [
        {**jf.igp_edge(jf.ls_link("A", f"fc00:99::{i}", "R", f"fc00:98::{i}")), "_key": f"extra_{i}"}
        for i in range(1, 10)
    ]
    w.db.collection("igpv6_graph").insert_many(many)
    got = w.all_documents("igpv6_graph")
    assert len(got) == 4 + 9 and len({d["_key"] for d in got}) == 13
    anns = [{"local_ip": f"fc00:99::{i}", "remote_ip": f"fc00:98::{i}", "fields": {"latency": i}} for i in range(1, 10)]
    keys, unmatched = w.annotate_edges("igpv6_graph", anns + [{"local_ip": "::1", "remote_ip": "::2", "fields": {}}])
    assert sorted(keys) == sorted(f"extra_{i}" for i in range(1, 10)) and len(unmatched) == 1
    assert {d["_key"]: d.get("latency") for d in w.all_documents("igpv6_graph") if d["_key"].startswith("extra")} == {
        f"extra_{i}": i for i in range(1, 10)
    }
    if arango.standin is not None:
        cursor_calls = [p for m, p in arango.standin.store.requests if "/_api/cursor/" in p]
        assert len(cursor_calls) >= 6  # 13 rows in batches of 2: 6 next-batch calls for all_documents
        assert arango.standin.store.cursors == {}  # every cursor dropped after its last batch


def test_cursor_protocol_next_batch_delete_and_unknown_ids(arango):
    w = own_writer(arango)
    w.upsert("segscope_node", [{"_key": f"n{i}"} for i in range(5)])
    cursor = w.db.aql.execute(writer_mod.QUERY_ALL, bind_vars={"@collection": "segscope_node"}, batch_size=2)
    assert cursor.has_more() and len(cursor.batch()) == 2 and cursor.id
    cursor.fetch()  # POST /_api/cursor/<id>: rows 3-4
    assert cursor.has_more() and len(cursor.batch()) == 4
    assert cursor.close() is True  # DELETE while rows remain
    with pytest.raises(ArangoServerError) as e:
        cursor.fetch()
    assert (e.value.http_code, e.value.error_code) == (404, 1600)
    assert cursor.close(ignore_missing=True) is False
    with pytest.raises(ArangoServerError) as e:
        w.db.aql.execute(writer_mod.QUERY_ALL, bind_vars={"@collection": "segscope_node"}, batch_size=0)
    assert e.value.http_code == 400
