"""Document model: keys, link matching, path resolution, edge/path annotations, replays.

Input: node views derived from netlab/topologies/line5.yaml (topo_views.expected_views), so the
network is the one the end-to-end tests run: H1 - A - R - B - H2 with agents on A, R and B.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest
from topo_views import expected_views

from processors.topology.model import Identity, MalformedView, TopologyModel, diff_documents, safe_key, validate_view
from segscope_schemas.line_protocol import LineError, parse_line, parse_lines

REPO = Path(__file__).resolve().parents[2]
LINE5 = REPO / "netlab" / "topologies" / "line5.yaml"
AR_KEY = "200_0_2_0_A_fc00:12::1_R_fc00:12::2"
RA_KEY = "200_0_2_0_R_fc00:12::2_A_fc00:12::1"
# as the agent writes them (agent/server.py _publish_sections)
ONE_HOP = {
    "ssid": 7,
    "role": "STAMP_ROLE_SENDER",
    "sender_address": "fc00:1::1",
    "reflector_address": "fc00:12::2",
    "segments": [],
    "return_segments": [],
    "state": "STAMP_SESSION_STATE_RUNNING",
}
VIA_R_TO_B = {
    "ssid": 8,
    "role": "STAMP_ROLE_SENDER",
    "sender_address": "fc00:1::1",
    "reflector_address": "fc00:3::1",
    "segments": ["fc00:2::e"],
    "return_segments": ["fc00:2::e"],
}


def views(sessions=(), flows=(), nodes="ARB", t=1_000_000_000):
    out = expected_views(LINE5, generated_at_ns=t)
    out["A"]["stamp_sessions"] = [dict(s) for s in sessions]
    out["A"]["flows"] = [dict(f) for f in flows]
    return [out[n] for n in nodes]


def model_with(*vs, **kw) -> TopologyModel:
    m = TopologyModel(**kw)
    for v in vs:
        m.apply_view(copy.deepcopy(v))
    return m


def stamp(direction, mean, ts=1795306905000000000, ssid=7, node="A", ipdv=6.3):
    extra = f",ipdv_mean_us={ipdv}" if ipdv is not None else ""
    return parse_line(
        f"stamp_delay,node={node},ssid={ssid},direction={direction} count=100i,min_us={mean - 10},"
        f"mean_us={mean},max_us={mean + 50},p50_us={mean},p99_us={mean + 40}{extra} {ts}"
    )


# -- keys ------------------------------------------------------------------------------
def test_node_sid_and_link_keys_follow_jalapeno_conventions():
    docs = model_with(*views()).documents()
    assert sorted(docs["segscope_node"]) == ["200_0_0_A", "200_0_0_B", "200_0_0_R"]
    assert sorted(docs["segscope_srv6_sid"]) == ["0_A_fc00:1::d6", "0_B_fc00:3::d6", "0_R_fc00:2::e"]
    assert sorted(docs["segscope_link"]) == sorted(
        [AR_KEY, RA_KEY, "200_0_2_0_R_fc00:23::1_B_fc00:23::2", "200_0_2_0_B_fc00:23::2_R_fc00:23::1"]
    )
    a = docs["segscope_node"]["200_0_0_A"]
    assert (a["router_id"], a["router_ip"], a["protocol_id"], a["locators"]) == ("A", "fc00:1::1", 200, ["fc00:1::/64"])
    assert a["srv6_policies"] == [{"prefix": "fd00:b::/64", "mode": "encap", "segments": ["fc00:2::e", "fc00:3::d6"]}]
    sid = docs["segscope_srv6_sid"]["0_R_fc00:2::e"]
    assert sid["srv6_endpoint_behavior"] == {"endpoint_behavior": 1, "name": "End"}
    assert docs["segscope_srv6_sid"]["0_B_fc00:3::d6"]["srv6_endpoint_behavior"]["endpoint_behavior"] == 18


def test_identity_is_configurable_and_keys_stay_valid():
    m = model_with(*views(), identity=Identity(protocol_id=201, domain_id=7))
    docs = m.documents()
    assert "201_7_0_A" in docs["segscope_node"]
    assert "201_7_2_0_A_fc00:12::1_R_fc00:12::2" in docs["segscope_link"]
    assert "7_R_fc00:2::e" in docs["segscope_srv6_sid"]
    assert safe_key("a/b c") != "a/b c" and "/" not in safe_key("a/b c")
    assert safe_key("x" * 300) != safe_key("x" * 301) and len(safe_key("x" * 300)) <= 254


# -- links -----------------------------------------------------------------------------
def test_links_join_interfaces_on_the_same_subnet_one_per_direction():
    docs = model_with(*views()).documents()
    ar = docs["segscope_link"][AR_KEY]
    assert (ar["local_interface"], ar["remote_interface"], ar["prefix"]) == ("a0", "r0", "fc00:12::/64")
    assert ar["neighbour_confirmed"] is True
    edge = docs["segscope_graph_edge"][AR_KEY]
    assert (edge["_from"], edge["_to"]) == ("segscope_node/200_0_0_A", "segscope_node/200_0_0_R")
    assert docs["segscope_graph_edge"][RA_KEY]["_from"] == "segscope_node/200_0_0_R"
    # A's ah (fd00:a::/64) leads to H1, which runs no agent: no link, and loopbacks (/128) never pair
    assert not any("fd00:a" in k or "fc00:1::1" in k for k in docs["segscope_link"])


def test_only_a_node_pair_with_views_on_both_ends_forms_a_link():
    docs = model_with(*views(nodes="AR")).documents()
    assert sorted(docs["segscope_link"]) == sorted([AR_KEY, RA_KEY])
    assert model_with(*views(nodes="AB")).documents()["segscope_link"] == {}


def test_neighbour_confirmation_needs_the_far_mac():
    a, r = views(nodes="AR")
    a["neighbours"] = [n for n in a["neighbours"] if n["address"] != "fc00:12::2"]
    docs = model_with(a, r).documents()
    assert docs["segscope_link"][AR_KEY]["neighbour_confirmed"] is False
    assert docs["segscope_link"][RA_KEY]["neighbour_confirmed"] is True


def test_endx_sid_is_attached_to_the_link_of_its_next_hop():
    a, r = views(nodes="AR")
    a["local_sids"].append(
        {
            "sid": "fc00:1::e1",
            "prefixlen": 128,
            "action": "End.X",
            "params": {"nh6": "fc00:12::2"},
            "interface": "a0",
            "table": 254,
        }
    )
    docs = model_with(a, r).documents()
    assert docs["segscope_link"][AR_KEY]["srv6_endx_sid"] == ["fc00:1::e1"]
    assert docs["segscope_link"][RA_KEY]["srv6_endx_sid"] == []


# -- measurements onto edges and paths ------------------------------------------------
def test_one_hop_stamp_session_annotates_both_edges_and_the_path_docs():
    m = model_with(*views(sessions=[ONE_HOP]))
    for p in (stamp("forward", 2044.9), stamp("reverse", 1033.0), stamp("round_trip", 3077.9)):
        assert m.apply_point(p)
    docs = m.documents()
    ar, ra = docs["segscope_graph_edge"][AR_KEY], docs["segscope_graph_edge"][RA_KEY]
    assert (ar["latency"], ar["unidir_link_delay"], ar["unidir_delay_variation"]) == (2044.9, 2044.9, 6.3)
    assert ar["unidir_link_delay_min_max"] == [2034.9, 2094.9]
    assert ar["delay_source"] == {"kind": "stamp", "node": "A", "ssid": 7, "direction": "forward", "count": 100}
    assert ra["unidir_link_delay"] == 1033.0
    # links (not edges) carry no measurement; R-B edges carry none either
    assert "latency" not in docs["segscope_link"][AR_KEY]
    assert "latency" not in docs["segscope_graph_edge"]["200_0_2_0_R_fc00:23::1_B_fc00:23::2"]
    fwd = docs["segscope_path"]["200_0_0_A_200_0_0_R_fc00:12::2"]
    assert (fwd["sid_list"], fwd["hops"], fwd["links"]) == (["fc00:12::2"], ["A", "R"], [AR_KEY])
    assert (fwd["delay_us"], fwd["jitter_us"], fwd["round_trip_delay_us"]) == (2044.9, 6.3, 3077.9)
    rev = docs["segscope_path"]["200_0_0_R_200_0_0_A_fc00:1::1"]
    assert (rev["src_node"], rev["dst_node"], rev["delay_us"]) == ("R", "A", 1033.0)


def test_a_metrics_message_is_read_line_by_line_and_only_measured_lines_are_parsed():
    """apply_metrics_text (the app's path for segscope.metrics): stamp_delay / altmark_loss lines are
    parsed and taken; the histogram and counter lines beside them are counted ignored, unparsed (a
    broken counter line is not this processor's to judge); a broken stamp_delay line is malformed."""
    m = model_with(*views(sessions=[ONE_HOP]))
    fwd = "stamp_delay,node=A,ssid=7,direction=forward count=100i,mean_us=2044.9,ipdv_mean_us=6.3 1795306905000000000"
    rev = "stamp_delay,node=A,ssid=7,direction=reverse count=100i,mean_us=1033.0 1795306905000000000"
    text = "\n".join(
        [
            "# a comment",
            fwd,
            "stamp_delay_histogram,node=A,ssid=7,direction=forward b10=3i,b11=97i 1795306905000000000",
            "segscope_processor,processor=delay records_in=5i 1795306905000000000",
            "segscope_processor,processor=delay this is not line protocol",
            "stamp_delay,node=A,ssid=7,direction=round_trip count=100i,mean_us=",  # broken, ours
            "   " + rev,  # leading blanks are allowed by line protocol
            "",
        ]
    )
    m.apply_metrics_text(text)
    c = m.counters
    assert (c.points_in, c.points_ignored, c.malformed_lines) == (2, 3, 1)
    ar = m.documents()["segscope_graph_edge"][AR_KEY]
    ra = m.documents()["segscope_graph_edge"][RA_KEY]
    assert (ar["unidir_link_delay"], ra["unidir_link_delay"]) == (2044.9, 1033.0)


def _stamp_line(node, ssid, direction, ts, mean):
    return (
        f"stamp_delay,node={node},ssid={ssid},path=fc00:12::2,direction={direction} "
        f"count=10i,min_us={mean - 1},mean_us={mean},max_us={mean + 1},newest_ns={ts + 900}i {ts}"
    )


def test_stamp_lines_taken_unparsed_end_as_if_every_line_had_been_parsed():
    """The fast path (tags and time read, fields parsed when a reader needs them) against the full
    parser + apply_point on the same shuffled lines: re-emissions, out-of-order seconds, escaped
    node names (full parser), complete and incomplete loss blocks, histogram and counter lines."""
    rng = random.Random(3)
    lines = []
    for node in ("A", "B", "edge\\ 1"):
        for ssid in range(1, 6):
            for direction in ("forward", "reverse", "round_trip"):
                for second in range(20):
                    ts = 1795306905000000000 + second * 1_000_000_000
                    lines.append(_stamp_line(node, ssid, direction, ts, rng.randint(100, 5000) / 10))
                    if rng.random() < 0.2:  # a re-emission of the second, other numbers
                        lines.append(_stamp_line(node, ssid, direction, ts, rng.randint(100, 5000) / 10))
    for flow in range(1, 8):
        for second in range(20):
            ts = 1795306905000000000 + second * 1_000_000_000
            tx, rx = 1000, 1000 - rng.randint(0, 5)
            complete = 'complete=true,reason="ok"' if rng.random() < 0.8 else 'complete=false,reason="missing_rx"'
            node = "A" if flow < 6 else "edge\\,1"
            lines.append(
                f"altmark_loss,flow={flow},method=dscp,period_ms=1000,tx_node={node},rx_node=B,path=fc00:12::2 "
                f"tx_packets={tx}i,rx_packets={rx}i,lost={tx - rx}i,{complete},newest_ns={ts}i {ts}"
            )
    lines += [f"stamp_delay_histogram,node=A,ssid=1,direction=forward b{i}=1i {i}" for i in range(50)]
    lines += [f"segscope_processor,processor=delay records_in={i}i {i}" for i in range(50)]
    rng.shuffle(lines)
    parsed, fast = TopologyModel(), TopologyModel()
    for start in range(0, len(lines), 97):
        chunk = lines[start : start + 97]
        points, bad = parse_lines("\n".join(chunk))
        assert not bad
        for p in points:
            parsed.apply_point(p)
        fast.apply_metrics_text("\n".join(chunk))
        if start % 5 == 0:
            fast.edge_measurements()  # a flush in between settles what was taken so far
    fast.edge_measurements()
    assert fast.counters.as_dict() == parsed.counters.as_dict()
    assert fast.counters.points_stale > 0 and fast.counters.points_ignored > 100  # + incomplete blocks

    def held(m):
        return {k: (v.timestamp_ns, v.fields, v.tags) for k, v in [*m.stamp.items(), *m.loss.items()]}

    assert held(fast) == held(parsed) and len(held(fast)) == 45 + 7


def _odd_or_plain_line(rng: random.Random, second: int) -> str:
    """A line of segscope.metrics: mostly what the processors write, sometimes something else."""
    ts = 1795306905000000000 + second * 1_000_000_000
    node, ssid, direction = rng.choice("AB"), rng.randint(1, 4), rng.choice(("forward", "reverse"))
    stamp = _stamp_line(node, ssid, direction, ts, rng.randint(100, 5000) / 10)
    flow, lost = rng.randint(1, 4), rng.randint(0, 3)
    complete = rng.choice(("complete=true", "complete=t", "complete=TRUE", "complete=false", "complete=maybe"))
    reason = rng.choice(
        ('reason="ok"', 'reason="a b"', 'reason="x,complete=true,y"', 'reason="open', "complete=t", "complete=f")
    )
    loss = (
        f"altmark_loss,flow={flow},method=dscp,period_ms=1000,tx_node={node},rx_node=B,path=p "
        f"tx_packets=100i,rx_packets={100 - lost}i,lost={lost}i,{complete},{reason},newest_ns={ts}i {ts}"
    )
    odd = [
        stamp,
        loss,
        "",  # a blank line
        "# a comment",
        "  " + stamp,  # indented: the line loop strips it and takes it
        "\t" + loss,
        stamp.replace("ssid=", "ssid=x"),  # a tag the key cannot use
        stamp.replace(f"node={node},", ""),  # no node tag
        stamp.replace("count=10i", "count=ten"),  # malformed fields, found at settle
        stamp.rsplit(" ", 1)[0],  # no timestamp
        stamp + " ",  # four parts
        stamp.split(" ")[0] + "  " + str(ts),  # no fields
        stamp.replace(f" {ts}", f" {ts // 1_000_000_000}_000_000_000"),  # int() reads underscores
        stamp.replace(",direction=", ",direction=a=b,x="),
        f"stamp_delay_histogram,node={node},ssid={ssid},direction={direction} b1=3i {ts}",
        f"segscope_processor,processor=delay records_in={second}i {ts}",
        "stamp_delay" + stamp[len("stamp_delay,") - 1 :].replace(",", " ", 1),  # no tags
    ]
    weights = [30, 20] + [1] * (len(odd) - 2)
    return rng.choices(odd, weights)[0]


@pytest.mark.parametrize("seed", range(6))
def test_a_message_read_in_one_pass_ends_as_if_read_line_by_line(seed):
    """apply_metrics_text's one pass over a plain message (split once, tag sets cached) against
    the line loop (_apply_lines) on the same messages: counters and held measures equal, for
    messages of processor lines mixed with blank, comment, indented, broken, incomplete, unusual
    lines, with and without a final line break; some messages have an escape or a \\r (line loop)."""
    rng = random.Random(seed)
    one_pass, line_loop = TopologyModel(), TopologyModel()
    plain_messages = 0
    for message in range(150):
        lines = [_odd_or_plain_line(rng, rng.randint(0, 30)) for _ in range(rng.randint(1, 40))]
        text = "\n".join(lines) + ("\n" if rng.random() < 0.5 else "")
        if rng.random() < 0.1:
            text = text.replace("node=B", rng.choice(("node=B\\ 2", "node=B\r", "node=B\x0c", "node=B\u2028")))
        plain_messages += text.isascii() and "\\" not in text and "\r" not in text
        one_pass.apply_metrics_text(text)
        line_loop._apply_lines(text)
        if message % 7 == 0:  # a flush settles what was taken so far
            one_pass.settle()
            line_loop.settle()
    one_pass.settle()
    line_loop.settle()
    assert one_pass.counters.as_dict() == line_loop.counters.as_dict()
    c = one_pass.counters
    assert c.points_in > 500 and c.points_stale > 0 and c.points_ignored > 50 and c.malformed_lines > 10
    assert plain_messages > 100  # the one pass was what read most messages

    def held(m):
        return {k: (v.timestamp_ns, v.fields, v.tags) for k, v in [*m.stamp.items(), *m.loss.items()]}

    assert held(one_pass) == held(line_loop) and len(held(one_pass)) >= 16


def test_a_stamp_line_with_malformed_fields_is_undone_at_the_next_reading():
    m = TopologyModel()
    good = _stamp_line("A", 7, "forward", 1000, 2044.9)
    broken = good.replace("count=10i", "count=ten").replace(" 1000", " 2000")
    m.apply_metrics_text(good)
    m.apply_metrics_text(broken)
    m.apply_metrics_text(broken.replace(" 2000", " 3000"))  # two in a row: the good one is still kept
    m.edge_measurements()
    held = m.stamp[("A", 7, "forward")]
    assert (held.timestamp_ns, held.fields["mean_us"]) == (1000, 2044.9)
    assert (m.counters.malformed_lines, m.counters.points_in) == (2, 3)  # each broken line, as the full parser
    m.apply_metrics_text(broken.replace("ssid=7", "ssid=8"))  # nothing before it: the session is absent
    m.edge_measurements()
    assert ("A", 8, "forward") not in m.stamp and m.counters.malformed_lines == 3
    loss = "altmark_loss,flow=9,tx_node=A,rx_node=B tx_packets={}i,rx_packets=990i,complete=true,reason=\"ok\" {}"
    m.apply_metrics_text(loss.format(1000, 5) + "\n" + loss.format("x", 6))  # the newer one is broken
    m.edge_measurements()
    assert m.loss[(9, "A")].fields["tx_packets"] == 1000 and m.counters.malformed_lines == 4


def test_multi_hop_session_annotates_its_path_doc_only():
    m = model_with(*views(sessions=[VIA_R_TO_B]))
    m.apply_point(stamp("forward", 3000.0, ssid=8))
    docs = m.documents()
    path = docs["segscope_path"]["200_0_0_A_200_0_0_B_fc00:2::e,fc00:3::1"]
    assert path["hops"] == ["A", "R", "B"]
    assert path["links"] == [AR_KEY, "200_0_2_0_R_fc00:23::1_B_fc00:23::2"]
    assert path["delay_us"] == 3000.0
    assert not any("latency" in e for e in docs["segscope_graph_edge"].values())


def test_unknown_sid_leaves_the_path_unresolved_and_unannotated():
    s = dict(ONE_HOP, ssid=9, reflector_address="fc00:99::1")
    m = model_with(*views(sessions=[s]))
    m.apply_point(stamp("forward", 100.0, ssid=9))
    docs = m.documents()
    assert docs["segscope_path"] == {}  # no reflector node: no path doc
    assert not any("latency" in e for e in docs["segscope_graph_edge"].values())
    res = m.resolve_path("A", ["fc00:2::e", "fc00:99::1"])
    assert res["links"] is None and res["unresolved_sids"] == ["fc00:99::1"]


def test_measurement_without_declared_session_is_counted_not_guessed():
    m = model_with(*views())
    m.apply_point(stamp("forward", 100.0, ssid=42))
    docs = m.documents()
    assert m.counters.measurements_unmapped == 1
    assert not any("latency" in e for e in docs["segscope_graph_edge"].values())


def test_newest_point_wins_and_older_ones_are_counted_stale():
    m = model_with(*views(sessions=[ONE_HOP]))
    m.apply_point(stamp("forward", 2000.0, ts=2_000))
    assert not m.apply_point(stamp("forward", 9999.0, ts=1_000))
    assert m.apply_point(stamp("forward", 2100.0, ts=2_000))  # re-emission of the same second
    assert m.counters.points_stale == 1
    assert m.documents()["segscope_graph_edge"][AR_KEY]["unidir_link_delay"] == 2100.0


def test_altmark_loss_on_a_one_hop_flow_sets_packet_loss_percent():
    flow = {
        "side": "FLOW_MONITOR_SIDE_TX",
        "flow_id": 5,
        "method": "MARKING_METHOD_DSCP",
        "segments": ["fc00:2::e"],
        "device": "a0",
        "period_ms": 1000,
    }
    m = model_with(*views(flows=[flow]))
    ok = parse_line(
        'altmark_loss,flow=5,method=dscp,period_ms=1000,tx_node=A,rx_node=R tx_packets=1000i,'
        'rx_packets=990i,lost=10i,loss_ratio=0.01,complete=true,reason="ok" 2000'
    )
    partial = parse_line(
        'altmark_loss,flow=5,method=dscp,period_ms=1000,tx_node=A,rx_node=unknown '
        'tx_packets=500i,complete=false,reason="missing_rx" 3000'
    )
    assert m.apply_point(ok) and not m.apply_point(partial)
    docs = m.documents()
    assert docs["segscope_graph_edge"][AR_KEY]["unidir_packet_loss"] == 1.0
    path = docs["segscope_path"]["200_0_0_A_200_0_0_R_fc00:2::e"]
    assert (path["loss_percent"], path["loss_lost"], path["flows"]) == (1.0, 10, [5])


# -- validation, replays, diffs --------------------------------------------------------
@pytest.mark.parametrize(
    "mutate,reason",
    [
        (lambda v: v.update(schema="other"), "bad_schema"),
        (lambda v: v.update(version=99), "unsupported_version"),
        (lambda v: v.update(node=""), "bad_node"),
        (lambda v: v.update(node="a/b"), "bad_node"),
        (lambda v: v.update(interfaces="eth0"), "bad_field"),
        (lambda v: v["interfaces"][1]["addresses"].append({"address": "not-an-ip", "prefixlen": 64}), "bad_field"),
        (lambda v: v.update(stamp_sessions={"ssid": 1}), "bad_field"),
        (lambda v: v.pop("generated_at_ns"), "bad_field"),
    ],
)
def test_malformed_views_are_rejected_with_a_reason(mutate, reason):
    v = views(nodes="A")[0]
    mutate(v)
    m = TopologyModel()
    with pytest.raises(MalformedView) as e:
        m.apply_view(v)
    assert e.value.reason == reason
    assert m.counters.malformed_views == 1 and m.views == {}
    with pytest.raises(MalformedView):
        validate_view([1, 2])


def test_an_older_view_never_replaces_a_newer_one():
    new_a = views(nodes="A", t=2_000)[0]
    old_a = views(nodes="A", t=1_000)[0]
    old_a["loopbacks"] = []
    m = model_with(new_a)
    assert m.apply_view(old_a) is False
    assert m.counters.views_stale == 1 and m.views["A"]["loopbacks"]


def test_replays_in_any_order_give_identical_documents():
    inputs = (
        [("view", v) for v in views(sessions=[ONE_HOP])]
        + [("point", stamp("forward", 2000.0 + i, ts=1_000 + i)) for i in range(5)]
        + [("point", stamp("reverse", 1000.0 + i, ts=1_000 + i)) for i in range(5)]
    )

    def run(seq):
        m = TopologyModel()
        for kind, item in seq:
            m.apply_view(copy.deepcopy(item)) if kind == "view" else m.apply_point(item)
        return m.documents()

    reference = run(inputs)
    rng = random.Random(6)
    for _ in range(5):
        seq = inputs + inputs  # everything twice (a replay) ...
        rng.shuffle(seq)  # ... in any order
        assert json.dumps(run(seq), sort_keys=True) == json.dumps(reference, sort_keys=True)
    assert reference["segscope_graph_edge"][AR_KEY]["unidir_link_delay"] == 2004.0


def test_diff_sends_only_changes_and_deletes_what_disappeared():
    m = model_with(*views(sessions=[ONE_HOP]))
    first = m.documents()
    up, dl = diff_documents({}, first)
    assert sum(len(v) for v in up.values()) == sum(len(v) for v in first.values()) and dl == {}
    assert diff_documents(first, m.documents()) == ({}, {})
    m.apply_point(stamp("forward", 2000.0))
    up, dl = diff_documents(first, m.documents())
    assert {c: [d["_key"] for d in docs] for c, docs in up.items()} == {
        "segscope_graph_edge": [AR_KEY],
        "segscope_path": ["200_0_0_A_200_0_0_R_fc00:12::2"],
    }
    r_gone = views(sessions=[ONE_HOP], nodes="AB", t=2)  # R's interface r0 lost its address
    r = views(nodes="R", t=2)[0]
    r["interfaces"] = [i for i in r["interfaces"] if i["name"] != "r0"]
    m2 = model_with(*r_gone, r)
    _, dl = diff_documents(first, m2.documents())
    assert sorted(dl["segscope_link"]) == sorted([AR_KEY, RA_KEY])
    assert sorted(dl["segscope_graph_edge"]) == sorted([AR_KEY, RA_KEY])


def test_jalapeno_annotations_carry_link_ips_and_measurement_fields_only():
    m = model_with(*views(sessions=[ONE_HOP]))
    m.apply_point(stamp("forward", 2000.0))
    ann = m.jalapeno_annotations()
    assert [(a["local_ip"], a["remote_ip"]) for a in ann] == [("fc00:12::1", "fc00:12::2")]
    assert set(ann[0]["fields"]) <= {
        "latency",
        "unidir_link_delay",
        "unidir_link_delay_min_max",
        "unidir_delay_variation",
        "delay_measured_at_ns",
        "delay_source",
        "delay_mean_us",  # the exact mean beside the whole-µs TE fields (bgp_ls_fields)
        "link_delay_source",  # which source gives the link's delay, and each source's own value
        "stamp_link_delay",
        "stamp_link_delay_measured_at_ns",
        "inline_link_delay",
        "inline_link_delay_measured_at_ns",
        "stamp_minus_inline_us",  # STAMP mean minus in-line mean, when both measure the link
    }
    assert not any(k.startswith("_") for k in ann[0]["fields"])


# -- line protocol ---------------------------------------------------------------------
def test_line_protocol_parser_reads_segscope_lines_with_escapes_and_types():
    p = parse_line(
        'altmark_loss,flow=7,tx_node=edge\\ router\\,1,rx_node=B tx_packets=1000i,'
        'loss_ratio=0.01,complete=true,reason="say \\"ok\\", here" 1795305563000000000'
    )
    assert p.measurement == "altmark_loss"
    assert p.tags == {"flow": "7", "tx_node": "edge router,1", "rx_node": "B"}
    assert p.fields == {"tx_packets": 1000, "loss_ratio": 0.01, "complete": True, "reason": 'say "ok", here'}
    assert p.timestamp_ns == 1795305563000000000
    assert parse_line("m v=1").timestamp_ns is None
    points, bad = parse_lines("m v=1 1\n\nm,t=x v=2i 2\nbroken\nm v=notanumber 3\n")
    assert [pt.fields["v"] for pt in points] == [1.0, 2] and len(bad) == 2
    for line in ("m", "m,t v=1", "m v=1 x", 'm v="open 1', "m v= 1"):
        with pytest.raises(LineError):
            parse_line(line)


def _split_reference(text: str, sep: str, quotes: bool = False) -> list[str]:
    """The parser's character loop, kept as the oracle of its str.split fast paths."""
    parts, cur, i, in_quotes = [], [], 0, False
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            cur.append(text[i : i + 2])
            i += 2
            continue
        if quotes and ch == '"':
            in_quotes = not in_quotes
        if ch == sep and not in_quotes:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    if in_quotes:
        raise LineError("unterminated string field")
    parts.append("".join(cur))
    return parts


def test_line_protocol_fast_paths_split_exactly_like_the_character_loop():
    from segscope_schemas.line_protocol import _split_unescaped

    rng = random.Random(5)
    alphabet = 'ab,= "\\1'
    for _ in range(20_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14)))
        for sep, quotes in ((" ", True), (",", True), (",", False), ("=", False)):
            try:
                want = _split_reference(text, sep, quotes)
            except LineError:
                with pytest.raises(LineError):
                    _split_unescaped(text, sep, quotes)
                continue
            assert _split_unescaped(text, sep, quotes) == want, (text, sep, quotes)


def test_the_newest_of_several_sessions_on_one_link_wins_on_edge_and_path():
    other = dict(ONE_HOP, ssid=11)
    m = model_with(*views(sessions=[other, ONE_HOP]))  # ssid 11 listed first, 7 second
    m.apply_point(stamp("forward", 2500.0, ssid=11, ts=5_000))
    m.apply_point(stamp("forward", 2000.0, ssid=7, ts=4_000))
    docs = m.documents()
    edge = docs["segscope_graph_edge"][AR_KEY]
    assert (edge["unidir_link_delay"], edge["delay_source"]["ssid"]) == (2500.0, 11)
    path = docs["segscope_path"]["200_0_0_A_200_0_0_R_fc00:12::2"]
    assert (path["delay_us"], path["delay_source"]["ssid"]) == (2500.0, 11)
    assert sorted(s["ssid"] for s in path["stamp_sessions"]) == [7, 11]
    m.apply_point(stamp("forward", 2100.0, ssid=7, ts=6_000))
    docs = m.documents()
    assert docs["segscope_graph_edge"][AR_KEY]["unidir_link_delay"] == 2100.0
    assert docs["segscope_path"]["200_0_0_A_200_0_0_R_fc00:12::2"]["delay_us"] == 2100.0


def test_bad_session_entries_are_dropped_and_counted_not_the_whole_view():
    reflector_side = dict(ONE_HOP, role="STAMP_ROLE_REFLECTOR", ssid=12, reflector_address="")
    rx_flow = {"side": "FLOW_MONITOR_SIDE_RX", "flow_id": 5, "segments": ["fc00:2::e"]}
    a = views(
        sessions=[ONE_HOP, {"ssid": "x"}, dict(ONE_HOP, sender_address="nope"), reflector_side],
        flows=[{"flow_id": 1}, rx_flow],
        nodes="A",
    )[0]
    m = model_with(a, *views(nodes="RB"))
    assert m.counters.invalid_entries == 3 and m.counters.malformed_views == 0
    assert [(p["ssid"], p["direction"]) for p in m.stamp_paths()] == [(7, "forward"), (7, "reverse")]
    assert m.flow_paths() == []  # only the tx side of a flow names its path
    assert len(m.documents()["segscope_node"]) == 3


def test_reverse_path_takes_the_return_sids_from_the_reflector():
    """The sender's entry has `return_segments: []` (the sender does not know them): the reverse
    path's SID list comes from the reflector node's entry of the same ssid and sender address."""
    sender = dict(VIA_R_TO_B, return_segments=[])
    reflector_entry = {
        "ssid": 8,
        "role": "STAMP_ROLE_REFLECTOR",
        "sender_address": "fc00:1::1",
        "reflector_address": "",
        "segments": [],
        "return_segments": ["fc00:2::e"],
    }
    a, r, b = views(sessions=[sender])
    b["stamp_sessions"] = [reflector_entry]
    rev = [p for p in model_with(a, r, b).stamp_paths() if p["direction"] == "reverse"]
    assert rev == [
        {
            "node": "A",
            "ssid": 8,
            "direction": "reverse",
            "src": "B",
            "dst": "A",
            "sids": ["fc00:2::e", "fc00:1::1"],
            "return_sids_from": "reflector",
        }
    ]
    # a reflector entry for another sender is not this session's
    b["stamp_sessions"] = [dict(reflector_entry, sender_address="fc00:9::1", return_segments=["fc00:2::e2"])]
    rev = [p for p in model_with(a, r, b).stamp_paths() if p["direction"] == "reverse"]
    assert rev[0]["sids"] == ["fc00:1::1"] and rev[0]["return_sids_from"] == "sender"
    # no reflector entry at all: the sender's own (empty) list, as before
    rev = [p for p in model_with(a, r, views(nodes="B")[0]).stamp_paths() if p["direction"] == "reverse"]
    assert rev[0]["return_sids_from"] == "sender"


def test_bgp_ls_fields_are_typed_as_igp_graph_reads_them():
    """Jalapeno's igp-graph decodes the TE fields as uint32 (a float fails in Go): whole µs for the
    delays, RFC 8570 units of 0.000003 % for the loss, clamped to 24 bits; the exact values beside."""
    from processors.topology.model import RFC8570_MAX, bgp_ls_fields

    f = bgp_ls_fields(
        {"latency": 2044.9, "unidir_link_delay": 2044.9, "unidir_link_delay_min_max": [2034.4, 2094.6],
         "unidir_delay_variation": 6.3, "unidir_packet_loss": 1.0, "delay_measured_at_ns": 7}
    )  # fmt: skip
    assert f["latency"] == f["unidir_link_delay"] == 2045 and f["delay_mean_us"] == 2044.9
    assert f["unidir_link_delay_min_max"] == [2034, 2095] and f["unidir_delay_variation"] == 6
    assert f["unidir_packet_loss"] == 333333 and f["unidir_packet_loss_percentage"] == 1.0  # 1 % / 0.000003 %
    assert all(isinstance(f[k], int) for k in ("latency", "unidir_link_delay", "unidir_packet_loss"))
    assert f["delay_measured_at_ns"] == 7  # the rest untouched
    # clamped: negative (disagreeing clocks) -> 0, beyond 24 bits / 50.331642 % -> the maximum
    g = bgp_ls_fields({"unidir_link_delay": -3.0, "unidir_packet_loss": 100.0})
    assert (g["unidir_link_delay"], g["unidir_packet_loss"]) == (0, RFC8570_MAX)
    assert bgp_ls_fields({"unidir_packet_loss": 50.331642})["unidir_packet_loss"] == 16777214


USID_LINE4 = REPO / "netlab" / "topologies" / "usid_line4.yaml"


def test_containers_expand_into_the_nodes_of_their_micro_sids():
    """netlab usid_line4: R1 and R2 hold NEXT-C-SID locators (micro-SIDs 200, 300), B holds
    fcbb:bbbb:400:: and A fcbb:bbbb:100::; one container each way."""
    m = model_with(*expected_views(USID_LINE4, generated_at_ns=1_000_000_000).values())
    assert m.expand_sid("fcbb:bbbb:200:300:400::") == [
        "fcbb:bbbb:200:300:400::",
        "fcbb:bbbb:300:400::",
        "fcbb:bbbb:400::",
    ]
    assert m.expand_sid("fc00:12::2") == ["fc00:12::2"]  # not in a NEXT-C-SID block
    fwd = m.resolve_path("A", ["fcbb:bbbb:200:300:400::", "fcbb:bbbb:400::"])
    assert fwd["hops"] == ["A", "R1", "R2", "B"] and fwd["unresolved_sids"] == []
    assert [(l.local_node, l.remote_node) for l in fwd["links"]] == [("A", "R1"), ("R1", "R2"), ("R2", "B")]
    back = m.resolve_path("B", ["fcbb:bbbb:300:200:100::", "fcbb:bbbb:100::"])
    assert back["hops"] == ["B", "R2", "R1", "A"] and len(back["links"]) == 3
    # a micro-SID no node holds leaves the path unresolved, naming the address after the shift
    bad = m.resolve_path("A", ["fcbb:bbbb:200:777:400::"])
    assert bad["links"] is None and bad["unresolved_sids"] == ["fcbb:bbbb:777:400::"]


def test_next_csid_sids_carry_jalapenos_sid_structure():
    """segscope_srv6_sid documents of NEXT-C-SID SIDs hold srv6_sid_structure with the field names
    of Jalapeno's ls_srv6_sid (gobmp's SIDStructure): block 32, micro-SID 16, the other 80 bits the
    argument; a SID without the flavour has none."""
    docs = model_with(*expected_views(USID_LINE4, generated_at_ns=1_000_000_000).values()).documents()
    sids = docs["segscope_srv6_sid"]
    assert sids["0_R1_fcbb:bbbb:200::"]["srv6_sid_structure"] == {
        "locator_block_length": 32,
        "locator_node_length": 16,
        "function_length": 0,
        "argument_length": 80,
    }
    assert sids["0_R1_fcbb:bbbb:200::"]["params"]["flavors"] == {"operations": ["next-csid"], "lblen": 32, "nflen": 16}
    plain = model_with(*views()).documents()["segscope_srv6_sid"]["0_R_fc00:2::e"]
    assert "srv6_sid_structure" not in plain
