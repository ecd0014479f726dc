"""The AQL recipes of docs/querying-aql.md.

Always: each recipe names only collections and fields that the topology writer's documents
have, read from what the writer actually stored (own mode and jalapeno mode, into the stand-in
or a real ArangoDB). With SEGSCOPE_ARANGO_URL: each recipe runs on that ArangoDB and returns the
measured values (the stand-in does not run arbitrary AQL, so without one they are skipped).
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path

import jalapeno_fixture as jf
import pytest
from test_topology_inline import hop
from test_topology_model import ONE_HOP, stamp, views

from processors.topology.model import TopologyModel
from processors.topology.sink import TopologySink
from processors.topology.writer import ArangoWriter
from segscope_schemas.line_protocol import parse_line

# a one-hop altmark flow A -> R (as the agent declares it; test_topology_model's flow)
FLOW = {
    "side": "FLOW_MONITOR_SIDE_TX",
    "flow_id": 5,
    "method": "MARKING_METHOD_DSCP",
    "segments": ["fc00:2::e"],
    "device": "a0",
    "period_ms": 1000,
}
T0 = 1795306905000000000
DOC = Path(__file__).resolve().parents[2] / "docs" / "querying-aql.md"
# attributes of AQL's own path/traversal results, not of stored documents
AQL_RESULT_ATTRS = {"vertices", "edges", "weight"}


def recipes() -> list[dict]:
    out = []
    for block in re.findall(r"```aql\n(.*?)```", DOC.read_text(), re.S):
        head = re.match(r"// mode: (\w+)\s+collections: ([\w, ]+?)(?:\s+binds: (.*))?\n", block)
        assert head, f"recipe without its `// mode: ... collections: ...` line:\n{block}"
        binds = dict(b.split("=") for b in (head.group(3) or "").split())
        out.append(
            {
                "mode": head.group(1),
                "collections": [c.strip() for c in head.group(2).split(",")],
                "binds": binds,
                "aql": block,
            }
        )
    return out


def populate(t, mode: str) -> ArangoWriter:
    m = TopologyModel()
    for v in views(sessions=[ONE_HOP], flows=[FLOW]):
        m.apply_view(copy.deepcopy(v))
    for direction, mean in (("forward", 2044.9), ("reverse", 1033.2), ("round_trip", 3080.0)):
        assert m.apply_point(stamp(direction, mean))
    assert m.apply_point(
        parse_line(
            "altmark_loss,flow=5,method=dscp,period_ms=1000,tx_node=A,rx_node=R tx_packets=1000i,"
            f'rx_packets=990i,lost=10i,loss_ratio=0.01,complete=true,reason="ok" {T0}'
        )
    )
    # in-line hops: A -> R (STAMP measures it too) and R -> B (only in-line)
    m.apply_metrics_text(
        "\n".join(
            [
                hop(1, 0, "A:a0->R:r0", T0, count=10, sum_us=20600.0, min_us=2050.0, max_us=2090.0, ipdv=4.0),
                hop(1, 1, "R:r1->B:b0", T0, count=10, sum_us=5120.0, min_us=500.0, max_us=530.0, ipdv=2.0),
            ]
        )
    )
    if mode == "jalapeno":
        jf.build(t)
    w = ArangoWriter(t.url, t.db_name, t.user, t.password, mode=mode)
    assert "error" not in TopologySink(m, w).flush()
    return w


def attribute_names(doc: dict) -> set[str]:
    """Every attribute name of a document, nested objects' included (e.stamp_link_delay.mean_us)."""
    names = set()
    for k, v in doc.items():
        names.add(k)
        if isinstance(v, dict):
            names |= attribute_names(v)
    return names


def referenced(aql: str) -> tuple[set[str], set[str]]:
    """(collections after IN/TO/GRAPH, attribute names after a '.')."""
    code = re.sub(r"//.*", "", aql)
    code = re.sub(r'"[^"]*"', lambda s: s.group(0) if s.group(0).strip('"').isidentifier() else '""', code)
    colls = set(re.findall(r"\bIN\s+([a-z_][a-z0-9_]*)\b", code)) | set(re.findall(r"\bTO\s+@\w+\s+([a-z_]\w*)", code))
    colls |= set(re.findall(r'GRAPH\s+"(\w+)"', code))
    fields = set(re.findall(r"\.\s*([A-Za-z_][A-Za-z0-9_]*)", code)) - AQL_RESULT_ATTRS
    return colls, fields


RECIPES = recipes()


def test_the_doc_has_the_recipes_it_promises():
    modes = [r["mode"] for r in RECIPES]
    assert len(RECIPES) >= 4 and {"own", "jalapeno"} <= set(modes)
    assert any("SHORTEST_PATH" in r["aql"] for r in RECIPES) and any("K_SHORTEST_PATHS" in r["aql"] for r in RECIPES)
    assert all('weightAttribute: "latency"' in r["aql"] for r in RECIPES if "SHORTEST" in r["aql"])
    # links by delay with the source of their delay (STAMP or in-line), in both modes
    by_source = {r["mode"] for r in RECIPES if "SORT" in r["aql"] and "e.link_delay_source" in r["aql"]}
    assert by_source == {"own", "jalapeno"}


@pytest.mark.parametrize("mode", ["own", "jalapeno"])
def test_recipes_name_only_collections_and_fields_the_writer_writes(arango, mode):
    w = populate(arango, mode)
    for r in (r for r in RECIPES if r["mode"] == mode):
        colls, fields = referenced(r["aql"])
        graphs = set(re.findall(r'GRAPH\s+"(\w+)"', r["aql"]))
        assert all(w.db.has_graph(g) for g in graphs), f"graph {sorted(graphs)} missing"
        stored = colls - graphs
        assert stored <= set(r["collections"]), f"{sorted(stored)} not declared in {r['collections']}"
        keys = set()
        for c in r["collections"]:
            docs = w.all_documents(c)
            assert docs, f"{c}: the writer stored nothing there"
            for d in docs:
                keys |= attribute_names(d)
        missing = fields - keys
        assert not missing, f"recipe uses fields the writer never stores: {sorted(missing)}\n{r['aql']}"


@pytest.mark.skipif(
    not os.environ.get("SEGSCOPE_ARANGO_URL"), reason="AQL recipes run only on a real ArangoDB (SEGSCOPE_ARANGO_URL)"
)
@pytest.mark.parametrize("recipe", RECIPES, ids=[f"{r['mode']}-{i}" for i, r in enumerate(RECIPES)])
def test_recipes_run_on_a_real_arangodb(arango, recipe):
    w = populate(arango, recipe["mode"])
    node_coll = "igp_node" if recipe["mode"] == "jalapeno" else "segscope_node"
    binds = {}
    for var, name in recipe["binds"].items():
        (binds[var],) = [d["_id"] for d in w.all_documents(node_coll) if d.get("name") == name]
    rows = list(w.db.aql.execute(recipe["aql"], bind_vars=binds))
    assert rows, recipe["aql"]
    text = repr(rows)
    assert "2045" in text or "2044.9" in text, f"no measured A->R delay in {rows}"
