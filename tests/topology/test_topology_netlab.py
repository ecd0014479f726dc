"""Node views read from a real netlab line5 match the topology file; the publisher publishes
them to Kafka on change and periodically.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from topo_views import expected_views

from collectors.topology import NodeViewError, NodeViewPublisher, build_node_view, view_fingerprint
from netlab import Lab, teardown
from processors.delay.topics import ensure_topics
from processors.topology.model import TopologyModel
from tests.isolation import own_name

REPO = Path(__file__).resolve().parents[2]
LINE5 = REPO / "netlab" / "topologies" / "line5.yaml"
PREFIX = own_name("topo")


@pytest.fixture(scope="module")
def lab():
    teardown(PREFIX)
    lab = Lab.up(LINE5, prefix=PREFIX)
    try:
        yield lab
    finally:
        lab.down()


def _global(iface):
    return sorted((a["address"], a["prefixlen"]) for a in iface["addresses"] if a["scope"] == "global")


@pytest.mark.parametrize("node", ["H1", "A", "R", "B", "H2"])
def test_view_matches_the_topology_file(lab, node):
    want = expected_views(LINE5)[node]
    got = build_node_view(node, lab.ns(node))
    assert (got["schema"], got["version"], got["node"], got["netns"]) == (
        "segscope.topology.node_view",
        1,
        node,
        lab.ns(node),
    )
    got_ifs = {i["name"]: i for i in got["interfaces"]}
    assert sorted(got_ifs) == sorted(i["name"] for i in want["interfaces"])
    for w in want["interfaces"]:
        g = got_ifs[w["name"]]
        assert _global(g) == _global(w), w["name"]
        if w["name"] != "lo":
            assert g["mac"] == lab.mac(node, w["name"]) and g["ifindex"] == lab.ifindex(node, w["name"])
            assert (g["kind"], g["mtu"], g["admin_up"], g["oper_state"]) == ("veth", 1500, True, "up")
            # the kernel's EUI-64 link-local address is there too, with scope link
            assert any(a["scope"] == "link" and a["address"].startswith("fe80::") for a in g["addresses"])
    assert got["loopbacks"] == want["loopbacks"]
    assert [
        {k: s[k] for k in ("sid", "prefixlen", "action", "params", "interface", "table")} for s in got["local_sids"]
    ] == want["local_sids"]
    assert got["policies"] == want["policies"]
    assert got["locators"] == want["locators"]
    # neighbours: netlab's static entries for the far ends, with the far end's real MAC
    topo_ends = {
        (e.ifname, far.node, far.ifname)
        for link in lab.topo.links
        for e, far in ((link.a, link.b), (link.b, link.a))
        if e.node == node
    }
    for ifname, far_node, far_if in topo_ends:
        far_mac = lab.mac(far_node, far_if)
        want_addrs = {n["address"] for n in want["neighbours"] if n["interface"] == ifname}
        got_addrs = {
            n["address"]
            for n in got["neighbours"]
            if n["interface"] == ifname
            and n["mac"] == far_mac
            and n["state"] == "permanent"
            and not n["address"].startswith("fe80")
        }
        assert got_addrs == want_addrs


def test_views_of_the_real_network_give_the_expected_links(lab):
    m = TopologyModel()
    for node in ("A", "R", "B"):
        m.apply_view(build_node_view(node, lab.ns(node)))
    links = m.documents()["segscope_link"]
    assert sorted(links) == sorted(
        [
            "200_0_2_0_A_fc00:12::1_R_fc00:12::2",
            "200_0_2_0_R_fc00:12::2_A_fc00:12::1",
            "200_0_2_0_R_fc00:23::1_B_fc00:23::2",
            "200_0_2_0_B_fc00:23::2_R_fc00:23::1",
        ]
    )
    assert all(link["neighbour_confirmed"] for link in links.values())
    ar = links["200_0_2_0_A_fc00:12::1_R_fc00:12::2"]
    assert (ar["local_mac"], ar["remote_mac"]) == (lab.mac("A", "a0"), lab.mac("R", "r0"))


def test_cli_prints_the_view_and_fails_clearly_on_a_missing_namespace(lab):
    import subprocess
    import sys

    ok = subprocess.run(
        [sys.executable, "-m", "collectors.topology", "--node", "B", "--netns", lab.ns("B"), "--print"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert ok.returncode == 0, ok.stderr
    assert [s["sid"] for s in json.loads(ok.stdout)["local_sids"]] == ["fc00:3::d6"]
    bad = subprocess.run(
        [sys.executable, "-m", "collectors.topology", "--node", "B", "--netns", "topo-nosuchnode", "--print"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert bad.returncode == 1 and "topo-nosuchnode" in bad.stderr and "does not exist" in bad.stderr


def test_view_of_a_missing_namespace_is_a_clear_error():
    with pytest.raises(NodeViewError, match="topo-nosuchnode"):
        build_node_view("X", "topo-nosuchnode")


def _consume(bootstrap, topic, until, timeout_s=20.0) -> list[dict]:
    from confluent_kafka import Consumer

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"topo-test-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([topic])
    out, deadline = [], time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and not until(out):
            msg = c.poll(0.2)
            if msg is None or msg.error():
                continue
            out.append({"key": msg.key().decode(), **json.loads(msg.value())})
    finally:
        c.close()
    return out


def test_publisher_publishes_at_start_on_change_periodically_and_on_request(lab, stack):
    topic = f"topo.test.views.{uuid.uuid4().hex[:8]}"
    ensure_topics(stack.kafka_bootstrap, [topic])
    pub = NodeViewPublisher(
        "R", lab.ns("R"), stack.kafka_bootstrap, interval_s=4.0, topic=topic, poll_s=0.2, metrics_topic=None
    )
    pub.start()
    try:
        time.sleep(0.5)
        t_change = time.monotonic()
        lab.run(
            "R",
            [
                "ip",
                "-6",
                "route",
                "add",
                "fc00:2::e2/128",
                "encap",
                "seg6local",
                "action",
                "End.X",
                "nh6",
                "fc00:23::2",
                "dev",
                "r1",
            ],
            check=True,
        )
        has_endx = lambda x: any(s["sid"] == "fc00:2::e2" for s in x["local_sids"])  # noqa: E731
        msgs = _consume(stack.kafka_bootstrap, topic, lambda m: any(has_endx(x) for x in m))
        change_seen = time.monotonic() - t_change
        periodic = _consume(
            stack.kafka_bootstrap, topic, lambda m: any(x["reason"] == "periodic" for x in m), timeout_s=15
        )
        view = pub.publish_now()
    finally:
        pub.stop()
        lab.run("R", ["ip", "-6", "route", "del", "fc00:2::e2/128"])
    assert msgs[0]["reason"] == "start"
    assert all(m["key"] == "R" for m in periodic)
    # the first view with the new SID is a change publication (others before it may be changes
    # too: the kernel adds neighbour entries of its own on a fresh network)
    start, change = msgs[0], [m for m in msgs if has_endx(m)][0]
    assert change["reason"] == "change" and not has_endx(start)
    assert [s["sid"] for s in start["local_sids"]] == ["fc00:2::e"]
    endx = [s for s in change["local_sids"] if s["sid"] == "fc00:2::e2"]
    assert endx and endx[0]["action"] == "End.X" and endx[0]["params"] == {"nh6": "fc00:23::2"}
    assert change_seen < 5.0  # poll 0.2 s (+ Kafka round trip, group join)
    per = [m for m in periodic if m["reason"] == "periodic"][0]
    assert view_fingerprint(per) == view_fingerprint(change)  # unchanged network: same content
    assert [m["seq"] for m in periodic] == list(range(1, len(periodic) + 1))
    c = pub.counters()
    assert c["published_on_change"] >= 1 and c["published_periodic"] >= 1 and c["published_on_request"] == 1
    assert c["views_published"] == len(periodic) + 1 and c["delivery_errors"] == 0 and c["build_errors"] == 0
    assert view["reason"] == "request"


def test_publisher_counts_build_errors_and_says_why(stack):
    pub = NodeViewPublisher("X", "topo-nosuchnode", stack.kafka_bootstrap, metrics_topic=None)
    with pytest.raises(NodeViewError, match="topo-nosuchnode"):
        pub.publish_now()
    assert pub.counters()["build_errors"] == 1 and pub.counters()["views_published"] == 0
    with pytest.raises(ValueError):
        NodeViewPublisher("X", None, stack.kafka_bootstrap, interval_s=0)
