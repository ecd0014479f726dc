"""Candidate SID lists from the topology graph (controller/steer/candidates.py): Yen's K shortest
paths by the edges' measured delay, read back from the topology processor's own-mode collections
(the ArangoDB stand-in, or a real ArangoDB with SEGSCOPE_ARANGO_URL)."""

from __future__ import annotations

from arango import ArangoClient

from controller.steer.candidates import candidates, k_shortest, main, read_graph
from processors.topology.writer import ArangoWriter

# A-R1-B 400 us, A-R1-R2-B 450, A-R2-B 1100, A-R3-B 1600; A-R5-B 20 but R5 has no End SID;
# A-R4-B shorter still but A-R4 is not measured (no latency on the edge)
LINKS = {
    ("A", "R1"): 300, ("A", "R2"): 1000, ("A", "R3"): 1500, ("A", "R5"): 10, ("A", "R4"): None,
    ("R1", "B"): 100, ("R2", "B"): 100, ("R3", "B"): 100, ("R5", "B"): 10, ("R4", "B"): 1, ("R1", "R2"): 50,
}  # fmt: skip
END_SIDS = {"R1": "fc00:11::e", "R2": "fc00:12::e", "R3": "fc00:13::e", "R4": "fc00:14::e"}
DECAP = "fc00:3::d6"


def graph() -> dict:
    g: dict = {}
    for (a, b), d in LINKS.items():
        if d is not None:
            g.setdefault(a, {})[b] = float(d)
    return g


def test_yen_orders_loopless_paths_by_delay():
    paths = k_shortest(graph(), "A", "B", 5)
    assert [(d, "-".join(p)) for d, p in paths] == [
        (20.0, "A-R5-B"),
        (400.0, "A-R1-B"),
        (450.0, "A-R1-R2-B"),
        (1100.0, "A-R2-B"),
        (1600.0, "A-R3-B"),
    ]
    assert k_shortest(graph(), "A", "nowhere", 3) == []


def test_candidates_skip_paths_without_sids():
    skipped = []
    found = candidates(graph(), END_SIDS, "A", "B", 3, DECAP, say=skipped.append)
    assert [(n, "-".join(p), s) for n, _, p, s in found] == [
        ("k1", "A-R1-B", ("fc00:11::e", DECAP)),
        ("k2", "A-R1-R2-B", ("fc00:11::e", "fc00:12::e", DECAP)),
        ("k3", "A-R2-B", ("fc00:12::e", DECAP)),
    ]
    assert skipped == ["# skipped A-R5-B: a node on it has no End SID"]


def test_read_from_the_topology_collections(arango, capsys, tmp_path):
    w = ArangoWriter(arango.url, arango.db_name, arango.user, arango.password)
    w.ensure_schema()
    edges = []
    for (a, b), delay in LINKS.items():
        doc = {"_key": f"200_0_2_0_{a}_{b}", "_from": f"segscope_node/200_0_0_{a}", "_to": f"segscope_node/200_0_0_{b}",
               "router_id": a, "remote_router_id": b}  # fmt: skip
        edges.append(doc | ({"latency": delay} if delay is not None else {}))
    w.upsert("segscope_graph_edge", edges)
    sids = [
        {"_key": f"0_{n}_{s}", "router_id": n, "srv6_sid": s, "srv6_endpoint_behavior": {"name": "End"}}
        for n, s in END_SIDS.items()
    ] + [{"_key": "0_B_fc00:3::d6", "router_id": "B", "srv6_sid": DECAP, "srv6_endpoint_behavior": {"name": "End.DT6"}}]
    w.upsert("segscope_srv6_sid", sids)
    db = ArangoClient(hosts=arango.url).db(arango.db_name, username=arango.user, password=arango.password)
    g, end_sids = read_graph(db)
    assert g == graph() and end_sids == END_SIDS  # the unmeasured link left out, End.DT6 is no End SID
    password_file = tmp_path / "arango-password"
    password_file.write_text(arango.password)
    argv = ["--from", "A", "--to", "B", "--k", "2", "--decap-sid", DECAP, "--arango", arango.url,
            "--db", arango.db_name, "--user", arango.user, "--password-file", str(password_file)]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "candidates:",
        "  # A-R1-B: 400 us measured one way",
        '  - {name: k1, segs: ["fc00:11::e", "fc00:3::d6"], sender_dev: FILL, reflector_dev: FILL}',
        "  # A-R1-R2-B: 450 us measured one way",
        '  - {name: k2, segs: ["fc00:11::e", "fc00:12::e", "fc00:3::d6"], sender_dev: FILL, reflector_dev: FILL}',
    ]
