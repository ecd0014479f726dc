"""`candidates: {k_shortest: K}`: a steering entry's candidates resolved from the topology graph
(controller/steer/resolve.py), and kept across graph readings with the entry's hysteresis."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.intent import IntentError, load_intent, parse_intent
from controller.steer.resolve import CandidateSet, Topology, ranked_paths

REPO = Path(__file__).resolve().parents[2]
LISTED = REPO / "controller" / "examples" / "tri3_steering.yaml"
K_SHORTEST = REPO / "controller" / "examples" / "tri3_steering_k_shortest.yaml"
DECAP = "fc00:3::d6"
# netlab/topologies/tri3_steer.yaml as the topology processor's graph has it: (a, b, a's
# interface, b's interface, measured one-way delay us), each link both ways
TRI3_LINKS = [
    ("A", "R1", "a1", "r1a", 300), ("A", "R2", "a2", "r2a", 1000), ("A", "R3", "a3", "r3a", 1500),
    ("R1", "B", "r1b", "b1", 20), ("R2", "B", "r2b", "b2", 20), ("R3", "B", "r3b", "b3", 20),
]  # fmt: skip
END_SIDS = {"R1": "fc00:11::e", "R2": "fc00:12::e", "R3": "fc00:13::e"}


def tri3(delays: dict | None = None) -> Topology:
    """The tri3 graph; `delays` overrides the A -> Ri delays ({"R2": 100})."""
    topo = Topology({}, dict(END_SIDS), {})
    for a, b, ia, ib, us in TRI3_LINKS:
        us = (delays or {}).get(b, us) if a == "A" else us
        for x, y, ix, iy in ((a, b, ia, ib), (b, a, ib, ia)):
            topo.graph.setdefault(x, {})[y] = float(us)
            topo.interfaces[(x, y)] = (ix, iy)
    return topo


def test_k_shortest_resolves_to_the_listed_candidates():
    """The three disjoint tri3 paths, in delay order, are the example's listed p1, p2, p3: same SID
    lists, probe and return SID lists, devices and probe ssids."""
    listed = load_intent(LISTED)
    resolved = load_intent(K_SHORTEST, graph=tri3)
    (want,), (got,) = listed.steering, resolved.steering
    assert got.k_shortest == 3 and [c.name for c in got.candidates] == ["k1", "k2", "k3"]
    fields = ("segs", "ssid", "return_segs", "sender_dev", "probe_segs", "reflector_dev")
    assert [[getattr(c, f) for f in fields] for c in got.candidates] == [
        [getattr(c, f) for f in fields] for c in want.candidates
    ]
    assert [c.nodes for c in got.candidates] == [("A", f"R{i}", "B") for i in (1, 2, 3)]
    assert [c.graph_delay_us for c in got.candidates] == [320.0, 1020.0, 1520.0]
    assert listed.stamp_sessions == resolved.stamp_sessions  # the same probes


def test_k_shortest_follows_the_graph_and_avoids_nodes():
    got = load_intent(K_SHORTEST, graph=lambda: tri3({"R3": 100})).steering[0]
    assert [c.segs[0] for c in got.candidates] == ["fc00:13::e", "fc00:11::e", "fc00:12::e"]
    text = K_SHORTEST.read_text().replace("{k_shortest: 3}", "{k_shortest: 3, avoid: [R1]}")
    got = parse_intent(text, str(K_SHORTEST), K_SHORTEST.parent, graph=tri3).steering[0]
    assert [c.segs[0] for c in got.candidates] == ["fc00:12::e", "fc00:13::e"]  # only two paths left


def problems(text: str, graph) -> list[str]:
    with pytest.raises(IntentError) as info:
        parse_intent(text, "x.yaml", K_SHORTEST.parent, graph=graph)
    return info.value.lines


def test_a_node_missing_from_the_graph_or_too_few_paths_is_named_at_the_entry():
    text = K_SHORTEST.read_text()
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "k_shortest: 3}" in t)
    no_b = tri3()
    for a in list(no_b.graph):
        no_b.graph[a].pop("B", None)
    no_b.graph.pop("B")
    (msg,) = problems(text, lambda: no_b)
    assert msg.startswith(f"x.yaml:{line}:") and "the reflector node B is not in the topology graph" in msg, msg
    one_path = tri3()
    for r in ("R2", "R3"):
        del one_path.end_sids[r]  # a path through a node without an End SID is not usable
    (msg,) = problems(text, lambda: one_path)
    assert "the topology graph has 1 usable path(s) from A to B: steering needs at least 2" in msg, msg

    def unreachable():
        from controller.steer.resolve import GraphError

        raise GraphError("cannot read the topology graph from http://127.0.0.1:9 (database segscope): refused")

    (msg,) = problems(text, unreachable)
    assert "cannot read the topology graph" in msg and "Fix: check the graph (SEGSCOPE_ARANGO_URL" in msg


def paths(topo: Topology):
    return ranked_paths(topo, "A", "B", DECAP)


def test_the_set_changes_only_for_a_path_better_by_the_hysteresis_in_each_of_n_readings():
    """K=2 of the three paths: R3 (1520 us) is out; it comes in only when it beats the slower member
    by 10 % and 200 us in each of 3 consecutive readings, into that member's slot."""
    kept = CandidateSet(2, pct=10, us=200, seconds=3)
    kept.update(paths(tri3()))
    assert [p.nodes[1] for p in kept.slots] == ["R1", "R2"]
    # R3 better than R2 (1020) but by less than 200 us: never enters
    for _ in range(10):
        assert kept.update(paths(tri3({"R3": 850}))) == []
    # clearly better, but in 2 readings, then not: the streak starts over
    for reading in ({"R3": 500}, {"R3": 500}, {"R3": 1500}, {"R3": 500}, {"R3": 500}):
        assert kept.update(paths(tri3(reading))) == []
    changed = kept.update(paths(tri3({"R3": 500})))  # the 3rd consecutive clearly better reading
    assert [(slot, p.nodes[1]) for slot, p in changed] == [(1, "R3")]
    assert [p.nodes[1] for p in kept.slots] == ["R1", "R3"]  # R1 kept its slot (its ssid)


def test_the_active_path_is_never_taken_out_of_the_set():
    kept = CandidateSet(2, pct=10, us=200, seconds=1)
    kept.update(paths(tri3()))
    active = kept.slots[1].segs  # R2 carries the traffic
    slow_r2 = tri3({"R2": 9000, "R3": 10})  # R3 beats R1 (the only member not active) by 290 us
    assert [(s, p.nodes[1]) for s, p in kept.update(paths(slow_r2), active)] == [(0, "R3")]  # R1 goes, R2 stays
    assert [p.nodes[1] for p in kept.slots] == ["R3", "R2"]
    gone = tri3()
    del gone.graph["A"]["R1"]  # R1's path no longer measured: nothing to replace the active R2 with
    assert kept.update(paths(gone), active) == [] and kept.slots[1].segs == active


def test_a_member_gone_from_the_graph_is_replaced_at_once():
    kept = CandidateSet(2, pct=10, us=200, seconds=5)
    kept.update(paths(tri3()))
    gone = tri3()
    del gone.graph["A"]["R2"]  # the A-R2 link lost its measurement
    assert [(s, p.nodes[1]) for s, p in kept.update(paths(gone), kept.slots[0].segs)] == [(1, "R3")]


def test_validate_and_status_list_the_resolved_candidates():
    from controller.status import _render_steering
    from controller.steering import describe_candidates

    entry = describe_candidates(load_intent(K_SHORTEST, graph=tri3).steering[0])
    assert entry["source"] == "k_shortest 3"
    assert entry["candidates"][1] == {
        "name": "k2",
        "ssid": 102,
        "segs": ["fc00:12::e", "fc00:3::d6"],
        "nodes": ["A", "R2", "B"],
        "graph_delay_us": 1020.0,
    }
    lines = _render_steering({"entries": [entry], "policies": [], "decisions": [], "window_s": 3600})
    assert lines[2:6] == [
        "  A fd00:b::/64: candidates k_shortest 3",
        "    k1   ssid 101   [fc00:11::e, fc00:3::d6]  path A-R1-B, 320 us in the graph",
        "    k2   ssid 102   [fc00:12::e, fc00:3::d6]  path A-R2-B, 1020 us in the graph",
        "    k3   ssid 103   [fc00:13::e, fc00:3::d6]  path A-R3-B, 1520 us in the graph",
    ]
