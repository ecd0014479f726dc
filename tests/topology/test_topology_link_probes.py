"""Link probes (controller/examples/mesh8_link_probes.yaml: one STAMP session per core link of
netlab mesh8_two_paths) on the topology graph: every session resolves to its one link, so each of
the 12 directed edges carries the delay of its own session and direction; where an in-line hop
measures the same link, both values are kept and compared (stamp_minus_inline_us).

Input: node views derived from the topology file (topo_views), the sessions as the agents publish
them (a sender entry on the sending node, a reflector entry on the reflecting one), and
stamp_delay lines written here from schemas/metrics.md, each with its own made-up mean.
"""

from __future__ import annotations

import copy
from pathlib import Path

from test_topology_inline import hop
from test_topology_model import stamp
from topo_views import expected_views

from controller.intent import load_intent
from processors.topology.model import TopologyModel

REPO = Path(__file__).resolve().parents[2]
MESH8 = REPO / "netlab" / "topologies" / "mesh8_two_paths.yaml"
PROBES = load_intent(REPO / "controller" / "examples" / "mesh8_link_probes.yaml").stamp_sessions
T = 1795306905 * 1_000_000_000


def edge_key(from_node: str, from_ip: str, to_node: str, to_ip: str) -> str:
    return f"200_0_2_0_{from_node}_{from_ip}_{to_node}_{to_ip}"


def mesh_model() -> TopologyModel:
    views = expected_views(MESH8, generated_at_ns=1_000_000_000)
    for v in views.values():
        v["stamp_sessions"] = []
    for s in PROBES:
        views[s.sender.node]["stamp_sessions"].append(
            {
                "ssid": s.ssid,
                "role": "STAMP_ROLE_SENDER",
                "sender_address": s.sender.address,
                "reflector_address": s.reflector.address,
                "segments": [],
                "return_segments": [],
            }
        )
        views[s.reflector.node]["stamp_sessions"].append(
            {"ssid": s.ssid, "role": "STAMP_ROLE_REFLECTOR", "sender_address": s.sender.address, "return_segments": []}
        )
    m = TopologyModel()
    for v in views.values():
        m.apply_view(copy.deepcopy(v))
    return m


def forward_mean(index: int) -> float:
    return 1000.0 + 10 * index


def reverse_mean(index: int) -> float:
    return 2000.0 + 10 * index


def test_every_directed_edge_gets_its_own_link_probe_delay():
    m = mesh_model()
    for i, s in enumerate(PROBES):
        assert m.apply_point(stamp("forward", forward_mean(i), ts=T, ssid=s.ssid, node=s.sender.node))
        assert m.apply_point(stamp("reverse", reverse_mean(i), ts=T, ssid=s.ssid, node=s.sender.node))
    edges = m.documents()["segscope_graph_edge"]
    annotated = {k for k, e in edges.items() if "unidir_link_delay" in e}
    want = set()
    for i, s in enumerate(PROBES):
        fwd = edge_key(s.sender.node, s.sender.address, s.reflector.node, s.reflector.address)
        rev = edge_key(s.reflector.node, s.reflector.address, s.sender.node, s.sender.address)
        want |= {fwd, rev}
        assert (edges[fwd]["unidir_link_delay"], edges[rev]["unidir_link_delay"]) == (forward_mean(i), reverse_mean(i))
        assert edges[fwd]["delay_source"] == {
            "kind": "stamp",
            "node": s.sender.node,
            "ssid": s.ssid,
            "direction": "forward",
            "count": 100,
        }
        assert edges[rev]["delay_source"]["direction"] == "reverse"
        assert "stamp_minus_inline_us" not in edges[fwd]  # no in-line hop on it
    assert len(want) == 12 and annotated == want  # the 12 directed core edges, and no other edge


def test_a_link_probe_and_an_in_line_hop_on_the_same_link_are_compared():
    m = mesh_model()
    a1 = next(s for s in PROBES if s.link == "a1")
    assert m.apply_point(stamp("forward", 305.5, ts=T, ssid=a1.ssid, node="A"))
    # a flow's hop over a1, A -> R1, 40 packets, mean 312.25 us
    m.apply_metrics_text(
        hop(1, 0, "A:a1->R1:r1b", T, count=40, sum_us=12490.0, min_us=301.0, max_us=330.0, path="fc00:11::e")
    )
    e = m.documents()["segscope_graph_edge"][edge_key("A", "fc00:a1::1", "R1", "fc00:a1::2")]
    assert (e["link_delay_source"], e["unidir_link_delay"]) == ("stamp", 305.5)
    assert (e["stamp_link_delay"]["mean_us"], e["inline_link_delay"]["mean_us"]) == (305.5, 312.25)
    assert e["stamp_minus_inline_us"] == -6.75
