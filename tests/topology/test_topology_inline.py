"""In-line per-hop delay (inline_hop_delay) on the topology graph's link edges.

The lines are written here from the measurement's specification (schemas/metrics.md,
inline_hop_delay: one point per flow, hop and second, tags flow, path, hop, link, from_node, to_node,
from_if, to_if; fields count, sum_us, min_us, mean_us, p50_us, p99_us, max_us, ipdv_mean_us,
measured), never from the model's code; the expected numbers are worked out by hand from what each
test sets up. The network is netlab line5 (topo_views): A a0 fc00:12::1 - r0 fc00:12::2 R
r1 fc00:23::1 - b0 fc00:23::2 B, ifindexes a0 13, r0 14, r1 15, b0 16.

Covered: the newest second per directed link over all flows (packet-weighted mean, min, max,
pair-weighted IPDV), measured=false, interface matching, spans and malformed lines counted, the
plain metrics path (one pass) and the full parser ending equal, the summary path
(processors/newest.py) ending equal to the metrics path, every case of the STAMP / in-line
precedence, and the documents in own mode and jalapeno mode (igp-graph's types) against the
stand-in (or the real ArangoDB of SEGSCOPE_ARANGO_URL), expiry included.
"""

from __future__ import annotations

import copy
import json
import random

import jalapeno_fixture as jf
import pytest
from test_topology_jalapeno import AR, RA, Clocks, edges, jalapeno_sink
from test_topology_model import AR_KEY, ONE_HOP, RA_KEY, stamp, views

from processors.newest import NewestLines
from processors.topology.model import DELAY_FIELDS, TopologyModel
from processors.topology.sink import TopologySink
from processors.topology.writer import ArangoWriter
from segscope_schemas.line_protocol import parse_lines

S = 1_000_000_000
T = 1795306905 * S  # the second the tests measure (UTC ns)
RB_KEY = "200_0_2_0_R_fc00:23::1_B_fc00:23::2"
BR_KEY = "200_0_2_0_B_fc00:23::2_R_fc00:23::1"
FWD_PATH = "fc00:2::e\\,fc00:3::d6"  # A -> B over R, escaped as line protocol has it
# the delay fields an edge carries when something measured its delay, and none else
LINK_DELAY = {
    "latency",
    "unidir_link_delay",
    "unidir_link_delay_min_max",
    "unidir_delay_variation",
    "delay_measured_at_ns",
    "delay_source",
    "link_delay_source",
}


def hop(
    flow,
    hop_no,
    link,
    ts,
    *,
    count=None,
    sum_us=None,
    min_us=None,
    max_us=None,
    ipdv=None,
    measured=True,
    path=FWD_PATH,
):
    """One inline_hop_delay line; link = "<from_node>:<from_if>-><to_node>:<to_if>"."""
    from_end, to_end = link.split("->")
    from_node, from_if = from_end.split(":")
    to_node, to_if = to_end.split(":")
    tags = (
        f"flow={flow},path={path},hop={hop_no},link={link},from_node={from_node},to_node={to_node},"
        f"from_if={from_if},to_if={to_if}"
    )
    if not measured:
        return f"inline_hop_delay,{tags} measured=false,unmeasured=12i {ts}"
    mean = sum_us / count
    fields = (
        f"count={count}i,sum_us={sum_us!r},min_us={min_us!r},mean_us={mean!r},p50_us={mean!r},"
        f"p99_us={max_us!r},max_us={max_us!r}"
    )
    if ipdv is not None:
        fields += f",ipdv_mean_us={ipdv!r}"
    return f"inline_hop_delay,{tags} {fields},measured=true,unmeasured=0i {ts}"


def model(*lines, sessions=(), window_s=None):
    m = TopologyModel() if window_s is None else TopologyModel(stamp_precedence_ns=int(window_s * S))
    for v in views(sessions=sessions):
        m.apply_view(copy.deepcopy(v))
    if lines:
        m.apply_metrics_text("\n".join(lines))
    return m


def delay_of(edge: dict) -> dict:
    return {k: edge[k] for k in sorted(LINK_DELAY | {"stamp_link_delay", "inline_link_delay"}) if k in edge}


# -- the link's in-line delay ------------------------------------------------------------
def test_the_newest_second_of_all_flows_crossing_a_link_gives_its_delay():
    m = model(
        # second T on A -> R: flow 1, 10 packets, mean 2000; flow 2, 30 packets, mean 2100
        hop(1, 0, "A:a0->R:r0", T, count=10, sum_us=20000.0, min_us=1990.0, max_us=2015.0, ipdv=3.0),
        hop(2, 0, "A:a0->R:r0", T, count=30, sum_us=63000.0, min_us=2050.0, max_us=2200.0, ipdv=5.0, path="unknown"),
        # flow 3's newest second is older: not part of the link's newest second
        hop(3, 0, "A:a0->R:r0", T - S, count=50, sum_us=50.0e3, min_us=900.0, max_us=1100.0, ipdv=1.0),
        # flow 4 crossed A -> R at T but R did not measure it
        hop(4, 0, "A:a0->R:r0", T, measured=False),
        # hop 1 of flow 1: R -> B, one packet (no IPDV)
        hop(1, 1, "R:r1->B:b0", T, count=1, sum_us=512.0, min_us=512.0, max_us=512.0),
    )
    docs = m.documents()
    ar = docs["segscope_graph_edge"][AR_KEY]
    # mean = (20000 + 63000) / (10 + 30); IPDV weighted by the pairs of each flow: (3 x 9 + 5 x 29) / 38
    assert delay_of(ar) == {
        "latency": 2075.0,
        "unidir_link_delay": 2075.0,
        "unidir_link_delay_min_max": [1990.0, 2200.0],
        "unidir_delay_variation": 4.526,
        "delay_measured_at_ns": T,
        "delay_source": {"kind": "inline", "flows": [1, 2], "count": 40},
        "link_delay_source": "inline",
        "inline_link_delay": {
            "mean_us": 2075.0,
            "min_us": 1990.0,
            "max_us": 2200.0,
            "variation_us": 4.526,
            "count": 40,
            "flows": [1, 2],
        },
    }
    assert ar["inline_link_delay_measured_at_ns"] == T and "stamp_link_delay" not in ar
    rb = docs["segscope_graph_edge"][RB_KEY]
    assert (rb["unidir_link_delay"], rb["unidir_link_delay_min_max"], rb["delay_source"]["flows"]) == (
        512.0,
        [512.0, 512.0],
        [1],
    )
    assert "unidir_delay_variation" not in rb  # one packet: no variation, absent (never null)
    assert "variation_us" not in rb["inline_link_delay"]
    # the reverse directions were not measured: directed edges
    assert not LINK_DELAY & set(docs["segscope_graph_edge"][RA_KEY])
    assert not LINK_DELAY & set(docs["segscope_graph_edge"][BR_KEY])
    assert (m.counters.points_in, m.counters.inline_hops_not_measured, m.counters.measurements_unmapped) == (5, 1, 0)
    # links and path documents carry no in-line delay
    assert not LINK_DELAY & set(docs["segscope_link"][AR_KEY])


def test_a_newer_second_replaces_the_older_and_a_re_emitted_second_replaces_its_first_emission():
    m = model(hop(1, 0, "A:a0->R:r0", T, count=10, sum_us=20000.0, min_us=1990.0, max_us=2015.0, ipdv=3.0))
    m.apply_metrics_text(hop(1, 0, "A:a0->R:r0", T + S, count=4, sum_us=8800.0, min_us=2100.0, max_us=2300.0))
    m.apply_metrics_text(hop(1, 0, "A:a0->R:r0", T, count=99, sum_us=99.0, min_us=1.0, max_us=1.0))  # older: stale
    ar = m.documents()["segscope_graph_edge"][AR_KEY]
    assert (ar["unidir_link_delay"], ar["delay_measured_at_ns"], ar["inline_link_delay"]["count"]) == (2200.0, T + S, 4)
    assert "unidir_delay_variation" not in ar  # the newer second has none: not left from the older one
    # the in-line processor emits a second again (late records) with the whole recomputed aggregate
    m.apply_metrics_text(hop(1, 0, "A:a0->R:r0", T + S, count=5, sum_us=11300.0, min_us=2100.0, max_us=2500.0))
    ar = m.documents()["segscope_graph_edge"][AR_KEY]
    assert (ar["unidir_link_delay"], ar["unidir_link_delay_min_max"]) == (2260.0, [2100.0, 2500.0])
    assert m.counters.points_stale == 1


def test_measured_false_never_writes_a_delay():
    # every hop of flow 1 not measured (the transit node filled no entry): no delay anywhere
    m = model(hop(1, 0, "A:a0->R:r0", T, measured=False), hop(1, 1, "R:r1->B:b0", T, measured=False))
    docs = m.documents()
    for key, edge in docs["segscope_graph_edge"].items():
        assert not LINK_DELAY & set(edge) and "inline_link_delay" not in edge, key
    assert m.counters.inline_hops_not_measured == 2 and m.jalapeno_annotations() == []
    # a hop whose newest second is not measured gives nothing any more, even if an older one was:
    # what the summary topic would hold of it is that newest line alone
    m.apply_metrics_text(hop(2, 0, "A:a0->R:r0", T - S, count=2, sum_us=4000.0, min_us=1990.0, max_us=2010.0))
    m.apply_metrics_text(hop(2, 0, "A:a0->R:r0", T, measured=False))
    assert not LINK_DELAY & set(m.documents()["segscope_graph_edge"][AR_KEY])
    # another flow measured the link in that second: the link has its delay, from that flow only
    m.apply_metrics_text(hop(3, 0, "A:a0->R:r0", T, count=2, sum_us=4100.0, min_us=2040.0, max_us=2060.0, ipdv=20.0))
    ar = m.documents()["segscope_graph_edge"][AR_KEY]
    assert (ar["unidir_link_delay"], ar["delay_source"]) == (2050.0, {"kind": "inline", "flows": [3], "count": 2})
    assert m.counters.inline_hops_not_measured == 3


@pytest.mark.parametrize(
    "link,edge_key",
    [
        ("A:a0->R:r0", AR_KEY),  # both interfaces named
        ("A:unknown->R:r0", AR_KEY),  # the departure interface unknown (an SRv6 endpoint's)
        ("A:7->R:r0", AR_KEY),  # a bare IOAM interface id: no device name for it
        ("A:a0->R:ifindex-14", AR_KEY),  # the egress edge's device without a record: its ifindex
        ("R:unknown->B:unknown", RB_KEY),  # one link between the two nodes
        ("R:r0->B:b0", None),  # R's r0 is not on the link to B
        ("A:a0->R:r1", None),  # nor is R's r1 on A's
        ("A:a0->B:b0", None),  # A and B are not adjacent
        ("A:a0->X:x0", None),  # a node without a view
    ],
)
def test_a_hop_is_put_on_the_link_its_interfaces_name(link, edge_key):
    m = model(hop(1, 0, link, T, count=2, sum_us=300.0, min_us=100.0, max_us=200.0))
    docs = m.documents()
    measured = sorted(k for k, e in docs["segscope_graph_edge"].items() if "unidir_link_delay" in e)
    assert measured == ([edge_key] if edge_key else [])
    assert m.counters.measurements_unmapped == (0 if edge_key else 1)  # counted, never guessed


def test_spans_and_malformed_lines_are_counted_never_written():
    good = hop(1, 0, "A:a0->R:r0", T, count=2, sum_us=300.0, min_us=100.0, max_us=200.0)
    lines = [
        # a span over R (it did not fill): A -> B is not one link
        hop(1, "0-1", "A:a0->B:b0", T, count=2, sum_us=900.0, min_us=400.0, max_us=500.0),
        good.replace("flow=1,", "flow=x,"),  # the flow is not an id
        good.replace(",to_if=r0", ""),  # a hop tag missing
        good.replace(",measured=true", ""),  # measured missing
        good.replace("measured=true", "measured=2i"),  # measured not a boolean
        good.replace("count=2i,", ""),  # measured without a packet count
        good.replace("count=2i", "count=0i"),
        good.replace("sum_us=300.0", 'sum_us="300"'),
        good.replace("min_us=100.0", "min_us=true"),
        good.rsplit(" ", 1)[0],  # no timestamp
        "inline_hop_delay,flow=1 this is not line protocol",
    ]
    m = model(*lines)
    c = m.counters
    assert (c.inline_span_points, c.malformed_lines, c.points_in) == (1, 10, 0)
    docs = m.documents()
    assert not any(LINK_DELAY & set(e) for e in docs["segscope_graph_edge"].values())
    m.apply_metrics_text("\n".join(lines + [good]))  # beside them, a good line is taken
    assert m.documents()["segscope_graph_edge"][AR_KEY]["unidir_link_delay"] == 150.0
    assert (m.counters.inline_span_points, m.counters.malformed_lines, m.counters.points_in) == (2, 20, 1)


def _mixed_lines(rng: random.Random) -> list[str]:
    """Lines of several flows over line5's four directed links, with older and re-emitted seconds,
    measured=false hops, spans, paths with and without escapes, and other producers' lines."""
    links = ["A:a0->R:r0", "R:r1->B:b0", "B:b0->R:r1", "R:r0->A:a0"]
    lines = []
    for flow in range(1, 7):
        path = FWD_PATH if flow % 2 else "unknown"
        for second in range(12):
            ts = T + second * S
            for hop_no, link in enumerate(links[(flow % 2) * 2 : (flow % 2) * 2 + 2]):
                for _ in range(2 if rng.random() < 0.2 else 1):  # sometimes a re-emission
                    if rng.random() < 0.15:
                        lines.append(hop(flow, hop_no, link, ts, measured=False, path=path))
                        continue
                    n = rng.randint(1, 40)
                    lo, hi = rng.randint(100, 2000), rng.randint(2001, 4000)
                    lines.append(
                        hop(
                            flow,
                            hop_no,
                            link,
                            ts,
                            count=n,
                            sum_us=float(rng.randint(lo * n, hi * n)),
                            min_us=float(lo),
                            max_us=float(hi),
                            ipdv=rng.randint(0, 500) / 10 if n > 1 else None,
                            path=path,
                        )
                    )
            if rng.random() < 0.3:
                lines.append(hop(flow, "0-1", "A:a0->B:b0", ts, count=3, sum_us=9.0, min_us=2.0, max_us=4.0))
    lines += [f"segscope_processor,processor=inline,instance=x hop_points_out={i}i {T + i}" for i in range(20)]
    rng.shuffle(lines)
    return lines


def held(m: TopologyModel) -> dict:
    m.settle()
    return {k: (v.timestamp_ns, v.fields, v.tags) for k, v in m.inline.items()}


@pytest.mark.parametrize("seed", range(3))
def test_the_one_pass_over_plain_messages_ends_as_the_full_parser(seed):
    lines = _mixed_lines(random.Random(seed))
    fast, parsed = model(), model()
    for start in range(0, len(lines), 53):
        chunk = lines[start : start + 53]
        fast.apply_metrics_text("\n".join(chunk))
        points, bad = parse_lines("\n".join(chunk))
        assert not bad
        for p in points:
            parsed.apply_point(p)
        if start % 3 == 0:
            fast.settle()  # a flush in between
    assert held(fast) == held(parsed) and len(held(fast)) == 12  # 6 flows x 2 hops
    assert fast.counters.as_dict() == parsed.counters.as_dict()
    assert fast.counters.inline_span_points > 0 and fast.counters.points_stale > 0
    assert json.dumps(fast.documents(), sort_keys=True) == json.dumps(parsed.documents(), sort_keys=True)


@pytest.mark.parametrize("seed", range(3))
def test_a_model_fed_the_summary_ends_as_one_fed_every_line(seed):
    """processors/newest.py as the in-line workers would run it (SEGSCOPE_TOPIC_METRICS_NEWEST): the
    newest line of each series every interval; the topology model reading that topic instead of
    segscope.metrics ends with the same edges."""
    rng = random.Random(seed)
    lines = _mixed_lines(rng)
    every, summarized = model(), model()
    newest = NewestLines()
    for start in range(0, len(lines), 40):  # one publish_lines call of a worker
        chunk = lines[start : start + 40]
        every.apply_metrics_text("\n".join(chunk))
        newest.take(chunk)
        if rng.random() < 0.3:  # a summary interval ends
            for message in newest.messages(newest.drain()):
                summarized.apply_metrics_text(message.decode())
    for message in newest.messages(newest.drain()):
        summarized.apply_metrics_text(message.decode())
    assert held(summarized) == held(every)
    assert summarized.edge_measurements() == every.edge_measurements()
    edges_measured = [k for k, f in every.edge_measurements().items() if f.get("link_delay_source") == "inline"]
    assert len(edges_measured) >= 3  # not an empty comparison
    assert newest.counters.newest_lines_held > 0 and summarized.counters.points_in < every.counters.points_in


# -- precedence: STAMP single-hop vs in-line ----------------------------------------------
# the A -> R link measured by ONE_HOP (STAMP, ssid 7, forward) and by flow 1's hop 0
STAMP_FIELDS = {  # what stamp("forward", 2044.9) reports (test_topology_model.stamp)
    "latency": 2044.9,
    "unidir_link_delay": 2044.9,
    "unidir_link_delay_min_max": [2034.9, 2094.9],
    "unidir_delay_variation": 6.3,
}
INLINE_FIELDS = {  # what inline_ar() reports: 40 packets, mean 82010 / 40
    "latency": 2050.25,
    "unidir_link_delay": 2050.25,
    "unidir_link_delay_min_max": [2040.6, 2069.4],
    "unidir_delay_variation": 2.6,
}
STAMP_VALUE = {
    "mean_us": 2044.9,
    "min_us": 2034.9,
    "max_us": 2094.9,
    "variation_us": 6.3,
    "count": 100,
    "node": "A",
    "ssid": 7,
    "direction": "forward",
}
INLINE_VALUE = {"mean_us": 2050.25, "min_us": 2040.6, "max_us": 2069.4, "variation_us": 2.6, "count": 40, "flows": [1]}


def inline_ar(ts, measured=True):
    if not measured:
        return hop(1, 0, "A:a0->R:r0", ts, measured=False)
    return hop(1, 0, "A:a0->R:r0", ts, count=40, sum_us=82010.0, min_us=2040.6, max_us=2069.4, ipdv=2.6)


# (stamp point's second, in-line point's second (None: none; "off": measured=false), cutoff,
#  precedence window s (None: the default 30), the source that gives the link's delay (None: none),
#  whether the STAMP / in-line value is kept beside it)
PRECEDENCE = {
    "both fresh: STAMP": (T + 1 * S, T + 3 * S, None, None, "stamp", True, True),
    "STAMP newer than in-line: STAMP": (T + 10 * S, T, None, None, "stamp", True, True),
    "STAMP behind by the window: STAMP": (T, T + 30 * S, None, None, "stamp", True, True),
    "STAMP behind by more (stopped): in-line": (T, T + 31 * S, None, None, "inline", True, True),
    "a 5 s window": (T, T + 6 * S, None, 5, "inline", True, True),
    "STAMP stale: in-line": (T, T + 100 * S, T + 50 * S, None, "inline", False, True),
    "in-line stale: STAMP": (T + 100 * S, T, T + 50 * S, None, "stamp", True, False),
    "both stale: none": (T, T + 10 * S, T + 50 * S, None, None, False, False),
    "STAMP alone": (T, None, None, None, "stamp", True, False),
    "in-line alone": (None, T, None, None, "inline", False, True),
    "in-line not measured alone: none": (None, "off", None, None, None, False, False),
    "STAMP and in-line not measured: STAMP": (T, "off", None, None, "stamp", True, False),
}


@pytest.mark.parametrize("case", list(PRECEDENCE))
def test_precedence_between_stamp_and_in_line(case):
    stamp_s, inline_s, cutoff, window, source, keeps_stamp, keeps_inline = PRECEDENCE[case]
    lines = []
    if inline_s == "off":
        lines.append(inline_ar(T + 5 * S, measured=False))
    elif inline_s is not None:
        lines.append(inline_ar(inline_s))
    m = model(*lines, sessions=[ONE_HOP], window_s=window)
    if stamp_s is not None:
        assert m.apply_point(stamp("forward", 2044.9, ts=stamp_s))
    ar = m.documents(cutoff)["segscope_graph_edge"][AR_KEY]
    if source is None:
        assert not (LINK_DELAY | {"stamp_link_delay", "inline_link_delay"}) & set(ar), sorted(ar)
        return
    want = STAMP_FIELDS if source == "stamp" else INLINE_FIELDS
    assert {k: ar[k] for k in want} == want
    assert ar["link_delay_source"] == ar["delay_source"]["kind"] == source
    assert ar["delay_measured_at_ns"] == (stamp_s if source == "stamp" else inline_s)
    assert ar.get("stamp_link_delay") == (STAMP_VALUE if keeps_stamp else None)
    assert ar.get("stamp_link_delay_measured_at_ns") == (stamp_s if keeps_stamp else None)
    assert ar.get("inline_link_delay") == (INLINE_VALUE if keeps_inline else None)
    assert ar.get("inline_link_delay_measured_at_ns") == (inline_s if keeps_inline else None)
    # the comparison of the two, when both are kept: 2044.9 - 2050.25
    assert ar.get("stamp_minus_inline_us") == (-5.35 if keeps_stamp and keeps_inline else None)


def test_a_multi_hop_stamp_session_never_competes_with_the_in_line_hop():
    """A session over A -> R -> B measures the path, not a link (schemas/topology.md): the A -> R
    edge's delay is the in-line one."""
    via_r = {**ONE_HOP, "ssid": 8, "reflector_address": "fc00:3::1", "segments": ["fc00:2::e"]}
    m = model(inline_ar(T), sessions=[via_r])
    m.apply_point(stamp("forward", 4000.0, ts=T, ssid=8))
    ar = m.documents()["segscope_graph_edge"][AR_KEY]
    assert (ar["link_delay_source"], ar["unidir_link_delay"], "stamp_link_delay" in ar) == ("inline", 2050.25, False)


# -- the documents in ArangoDB (the stand-in, or SEGSCOPE_ARANGO_URL) ---------------------
def test_jalapeno_edges_carry_the_in_line_delay_in_igp_graph_types(arango):
    stored = jf.build(arango)
    clocks = Clocks()  # wall clock T0 + 1 s = T + 1 s
    sink = jalapeno_sink(arango, model(inline_ar(T)), clocks)
    stats = sink.flush()
    assert (stats["annotated"], stats["ip_annotated"], stats["unmatched"]) == (1, 1, 0)
    for coll in ("igpv6_graph", "ipv6_graph"):
        ar = edges(sink, coll)[AR]
        # igp-graph's IGPGraphObject: uint32 microseconds (whole), min/max as a list of two
        assert (ar["latency"], ar["unidir_link_delay"], ar["unidir_link_delay_min_max"]) == (2050, 2050, [2041, 2069])
        assert ar["unidir_delay_variation"] == 3
        for f in ("latency", "unidir_link_delay", "unidir_delay_variation"):
            assert type(ar[f]) is int, (coll, f)
        assert all(type(v) is int for v in ar["unidir_link_delay_min_max"])
        assert ar["delay_mean_us"] == 2050.25  # the exact mean beside it
        assert ar["delay_source"] == {"kind": "inline", "flows": [1], "count": 40}
        assert (ar["link_delay_source"], ar["inline_link_delay"]) == ("inline", INLINE_VALUE)
        assert ar["inline_link_delay_measured_at_ns"] == T and "stamp_link_delay" not in ar
        for f in ("_from", "_to", "link", "protocol_id", "srv6_endx_sid", "local_link_ip", "remote_link_ip"):
            assert ar[f] == stored[coll][AR][f]  # igp-graph's own fields untouched
        assert "latency" not in edges(sink, coll)[RA]
    assert set(edges(sink)) == set(stored["igpv6_graph"])  # nothing created


def test_jalapeno_edges_switch_from_stamp_to_in_line_and_expire_each_source(arango):
    """STAMP gives A -> R's delay while its session runs; once it stopped, the in-line delay does:
    no key of the STAMP delay_source is left by the UPDATE's object merge. Each source's own value
    goes when it is stale; all delay fields go when both are, the edge's igp-graph fields stay."""
    stored = jf.build(arango)
    clocks = Clocks()
    m = model(inline_ar(T), sessions=[ONE_HOP])
    m.apply_point(stamp("forward", 2044.9, ts=T))
    sink = jalapeno_sink(arango, m, clocks, refresh_s=1.0, stale_after_s=100.0)
    assert sink.flush()["annotated"] == 1
    ar = edges(sink)[AR]
    assert (ar["link_delay_source"], ar["latency"], ar["delay_mean_us"]) == ("stamp", 2045, 2044.9)
    assert ar["delay_source"] == {"kind": "stamp", "node": "A", "ssid": 7, "direction": "forward", "count": 100}
    assert (ar["stamp_link_delay"], ar["inline_link_delay"]) == (STAMP_VALUE, INLINE_VALUE)
    assert ar["stamp_minus_inline_us"] == -5.35  # 2044.9 - 2050.25
    # the session stopped at T; the flows go on: 40 s later the in-line delay is the link's
    clocks.advance(40)
    m.apply_metrics_text(inline_ar(T + 40 * S))
    assert sink.flush()["annotated"] == 1
    for coll in ("igpv6_graph", "ipv6_graph"):
        ar = edges(sink, coll)[AR]
        assert (ar["link_delay_source"], ar["latency"], ar["delay_mean_us"]) == ("inline", 2050, 2050.25), coll
        assert ar["delay_source"] == {"kind": "inline", "flows": [1], "count": 40}, coll
        assert ar["delay_measured_at_ns"] == T + 40 * S
        assert ar["stamp_link_delay"] == STAMP_VALUE  # not stale yet: kept beside it
    # T + 101 s: STAMP's point is stale (older than 100 s), removed; the in-line one stays
    clocks.advance(61)
    stats = sink.flush()
    assert stats["annotated"] == 1
    for coll in ("igpv6_graph", "ipv6_graph"):
        ar = edges(sink, coll)[AR]
        assert "stamp_link_delay" not in ar and "stamp_link_delay_measured_at_ns" not in ar, coll
        assert "stamp_minus_inline_us" not in ar, coll  # one source left: nothing to compare
        assert (ar["link_delay_source"], ar["inline_link_delay"]) == ("inline", INLINE_VALUE)
    # T + 141 s: the in-line point (T + 40 s) is stale too: every delay field goes, from both graphs
    clocks.advance(40)
    assert sink.flush()["expired"] == 2
    for coll in ("igpv6_graph", "ipv6_graph"):
        ar = edges(sink, coll)[AR]
        assert not (LINK_DELAY | {"delay_mean_us", "inline_link_delay", "inline_link_delay_measured_at_ns"}) & set(ar)
        # igp-graph's own fields are all there (its delay fields, which segscope overwrote, are
        # gone until its next BGP-LS update, as with an expired STAMP delay)
        assert {k: v for k, v in ar.items() if k not in ("_rev", "_id")} == {
            k: v for k, v in stored[coll][AR].items() if k not in DELAY_FIELDS and k != "_rev"
        }
    clocks.advance(5)
    assert sink.flush()["annotated"] == 0  # not written back


def test_a_previous_runs_in_line_value_expires_by_its_own_timestamp(arango):
    """A restarted processor that never saw the points still removes each stale value, found by
    its own timestamp: the in-line value goes, the STAMP delay that is still fresh stays."""
    jf.build(arango)
    clocks = Clocks()
    m = model(inline_ar(T), sessions=[ONE_HOP])
    m.apply_point(stamp("forward", 2044.9, ts=T + 200 * S))
    jalapeno_sink(arango, m, clocks).flush()
    clocks.advance(250)  # in-line point 251 s old, STAMP's 51 s
    second = jalapeno_sink(arango, model(), clocks, stale_after_s=120.0)
    assert second.flush()["expired"] == 2  # A -> R in igpv6_graph and ipv6_graph
    for coll in ("igpv6_graph", "ipv6_graph"):
        ar = edges(second, coll)[AR]
        assert "inline_link_delay" not in ar and "inline_link_delay_measured_at_ns" not in ar, coll
        assert (ar["link_delay_source"], ar["latency"], ar["stamp_link_delay"]) == ("stamp", 2045, STAMP_VALUE)


def test_own_mode_edges_carry_the_in_line_delay_and_lose_it_when_stale(arango):
    clocks = Clocks()
    w = ArangoWriter(arango.url, arango.db_name, arango.user, arango.password)
    m = model(
        inline_ar(T),
        hop(2, 1, "R:r1->B:b0", T + 60 * S, count=2, sum_us=1001.0, min_us=500.0, max_us=501.0, ipdv=1.0),
        sessions=[ONE_HOP],
    )
    m.apply_point(stamp("forward", 2044.9, ts=T - 40 * S))  # behind the in-line second by 40 s
    sink = TopologySink(
        m, w, refresh_s=1.0, stale_after_s=100.0, monotonic=lambda: clocks.mono, wall_ns=lambda: clocks.wall
    )
    assert "error" not in sink.flush()
    coll = w.db.collection("segscope_graph_edge")
    ar, rb = coll.get(AR_KEY), coll.get(RB_KEY)
    assert {k: ar[k] for k in INLINE_FIELDS} == INLINE_FIELDS  # floats, µs, as the points had them
    assert (ar["link_delay_source"], ar["stamp_link_delay"], ar["inline_link_delay"]) == (
        "inline",
        STAMP_VALUE,
        INLINE_VALUE,
    )
    assert (rb["unidir_link_delay"], rb["unidir_delay_variation"], rb["link_delay_source"]) == (500.5, 1.0, "inline")
    # T + 61 s: STAMP's point (T - 40 s) is 101 s old
    clocks.advance(60)
    sink.flush()
    ar = coll.get(AR_KEY)
    assert ar["link_delay_source"] == "inline" and "stamp_link_delay" not in ar
    # T + 101 s: A -> R's in-line point is stale too; R -> B's (T + 60 s) is not
    clocks.advance(40)
    assert sink.flush()["expired"] == 1
    ar = coll.get(AR_KEY)
    assert not (LINK_DELAY | {"inline_link_delay", "inline_link_delay_measured_at_ns"}) & set(ar)
    assert ar["local_link_ip"] == "fc00:12::1" and coll.get(RB_KEY)["unidir_link_delay"] == 500.5
