"""PathBook (processors/paths.py): what the processors know of each session's and flow's SID list.
The core (apply) on the codec's own messages, and the reader on a real Kafka topic: what was
published before start() is known when start() returns, what comes after is followed."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Producer

from processors.delay.aggregate import DelayAggregator
from processors.delay.topics import ensure_topics
from processors.paths import PathBook
from segscope_schemas import path_record as pr
from tests.processors.test_delay_aggregate import BASE_S, NS_PER_S, delay_lines, far_future, make_records, parse_line


def stamp(node, ssid, path, role="sender", ts=1):
    return pr.encode(pr.PathRecord.stamp(node, ssid, role, path, [], ts))


def flow(node, flow_id, path, side="tx", ts=1):
    return pr.encode(pr.PathRecord.flow(node, flow_id, side, path, "dscp", 1000, ts))


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_sessions_flows_tombstones_and_malformed_records():
    clock = Clock()
    book = PathBook(forget_after_s=600, clock=clock)
    book.apply(*stamp("A", 1, ["fc00:2::e", "fc00:3::d6"]))
    book.apply(*stamp("A", 1, ["fc00:9::1"], role="reflector"))  # same ssid reflected on A: no clash
    book.apply(*stamp("A", 2, []))
    book.apply(*flow("A", 7, ["fc00:2::e"], ts=5))
    book.apply(*flow("C", 7, ["fc00:4::e"], ts=9))  # a second tx node of flow 7 (newer)
    book.apply(*flow("B", 7, [], side="rx"))  # rx sides never name the flow's path
    assert book.path_for_session("A", 1) == "fc00:2::e,fc00:3::d6"
    assert book.path_for_session("A", 2) == "direct"
    assert book.path_for_session("B", 1) is None
    assert book.path_for_flow(7, tx_node="A") == "fc00:2::e"
    assert book.path_for_flow(7) == "fc00:4::e"  # no tx node known: the newest tx record
    assert book.path_for_flow(8) is None
    # re-routed: the newest record wins
    book.apply(*stamp("A", 1, ["fc00:5::e"]))
    assert book.path_for_session("A", 1) == "fc00:5::e"
    # deleted: the path stays for the session's last seconds, then is forgotten
    book.apply(*pr.tombstone("stamp", "A", 1, "sender"))
    book.apply(*pr.tombstone("flow", "C", 7, "tx"))
    clock.t = 599
    book.apply(*stamp("Z", 1, []))  # any message runs the forgetting
    assert book.path_for_session("A", 1) == "fc00:5::e" and book.path_for_flow(7) == "fc00:4::e"
    clock.t = 601
    book.apply(*stamp("Z", 1, []))
    assert book.path_for_session("A", 1) is None and book.path_for_flow(7) == "fc00:2::e"
    # a re-created session is not forgotten by its old tombstone
    book.apply(*pr.tombstone("stamp", "A", 2, "sender"))
    book.apply(*stamp("A", 2, ["fc00:6::e"]))
    clock.t = 2000
    book.apply(*stamp("Z", 1, []))
    assert book.path_for_session("A", 2) == "fc00:6::e"
    # malformed: counted, ignored, nothing else changes
    book.apply(b"stamp/A/2/sender", b"{not json")
    book.apply(None, b"{}")
    assert book.malformed == 2 and book.path_for_session("A", 2) == "fc00:6::e"
    assert book.records == 16


def test_paths_for_flows_answers_as_path_for_flow_one_by_one():
    """The bulk look-up a loss flush uses (one lock for many flows): each answer is path_for_flow's,
    the tx node's record, the newest tx record without a tx node (or with one that has none), None
    for a flow nobody named."""
    book = PathBook()
    book.apply(*flow("A", 7, ["fc00:2::e"], ts=5))
    book.apply(*flow("C", 7, ["fc00:4::e"], ts=9))
    book.apply(*flow("A", 8, [], ts=1))
    book.apply(*flow("B", 9, ["fc00:7::1"], side="rx"))
    questions = [(7, "A"), (7, "C"), (7, None), (7, "Q"), (8, "A"), (9, "B"), (10, None), (7, "A")]
    answers = book.paths_for_flows(questions)
    assert answers == [book.path_for_flow(f, n) for f, n in questions]
    assert answers == ["fc00:2::e", "fc00:4::e", "fc00:4::e", "fc00:4::e", "flowmonid", None, None, "fc00:2::e"]
    assert book.paths_for_flows([]) == []


def test_inline_monitors_and_ioam_nodes():
    """In-line tx records name a flow's path and ingress; ioam records name node ids, their devices
    and their SIDs; a newer record claiming a node id or SID wins; tombstones forget after a while."""
    clock = Clock()
    book = PathBook(forget_after_s=600, clock=clock)
    book.apply(*pr.encode(pr.PathRecord.inline("A", 7, "tx", ["fc00:2::e", "fc00:3::d6"], 1, 4, 100, 5)))
    book.apply(*pr.encode(pr.PathRecord.inline("B", 7, "rx", [], 1, 4, 100, 9)))  # rx sides name no path
    book.apply(*pr.encode(pr.PathRecord.inline("C", 7, "tx", ["fc00:4::e"], 1, 4, 100, 9)))
    r = pr.IoamNode("R", 7, (pr.IoamInterface("r0", 70), pr.IoamInterface("r1", 71)), (1,), ("fc00:2::e",), 1)
    book.apply(*pr.encode(r))
    assert book.inline_tx(7, tx_node="A").path == ("fc00:2::e", "fc00:3::d6")
    assert book.inline_tx(7).node == "C"  # no tx node known: the newest tx record
    assert book.inline_tx(8) is None and book.path_for_flow(7) is None  # not an altmark flow
    assert book.node_name(7) == "R" and book.node_name(8) is None
    assert book.sid_owner("fc00:2::e") == "R" and book.ioam_node("R") == r
    # R2 now claims node id 7 and the SID (re-numbered, newer): it wins
    book.apply(*pr.encode(pr.IoamNode("R2", 7, (), (1,), ("fc00:2::e",), 2)))
    assert book.node_name(7) == "R2" and book.sid_owner("fc00:2::e") == "R2"
    book.apply(*pr.tombstone(pr.IOAM, "R2"))
    book.apply(*pr.tombstone(pr.INLINE, "C", 7, "tx"))
    clock.t = 599
    book.apply(*stamp("Z", 1, []))
    assert book.node_name(7) == "R2" and book.inline_tx(7).node == "C"
    clock.t = 601
    book.apply(*stamp("Z", 1, []))
    assert book.node_name(7) == "R" and book.sid_owner("fc00:2::e") == "R"  # R's record is still there
    assert book.inline_tx(7).node == "A" and book.malformed == 0


def test_aggregator_fixes_the_path_of_a_second_at_its_first_emission():
    """A second emitted as unknown stays unknown when late records re-emit it after the path became
    known (same series: InfluxDB overwrites, never a second point); later seconds get the path."""
    book = PathBook()
    agg = DelayAggregator(grace_s=1.0, retention_s=30.0, path_of=book.path_for_session)
    t0 = BASE_S * NS_PER_S
    now = t0 + 10 * NS_PER_S
    agg.ingest("A", make_records([1, 2], [t0, t0 + 1], [1000, 2000], [100, 100]), now_tai_ns=now)
    now += 2 * NS_PER_S  # idle for the grace: the wall clock closes the second
    first = delay_lines(agg.flush(now))
    assert {parse_line(x)[1]["path"] for x in first} == {"unknown"}
    assert agg.counters.path_unknown == 3
    book.apply(*stamp("A", 1, ["fc00:2::e", "fc00:3::d6"]))
    agg.ingest("A", make_records([3], [t0 + 2], [3000], [100]), now_tai_ns=now)  # late, same second
    agg.ingest("A", make_records([4], [t0 + 3 * NS_PER_S], [1000], [100]), now_tai_ns=now)  # a new second
    lines = agg.flush(far_future(agg))
    by_ts = {}
    for line in lines:
        meas, tags, fields, ts = parse_line(line)
        by_ts.setdefault(ts, set()).add((meas, tags["path"]))
    assert by_ts[t0] == {("stamp_delay", "unknown"), ("stamp_delay_histogram", "unknown")}
    assert by_ts[t0 + 3 * NS_PER_S] == {(m, "fc00:2::e,fc00:3::d6") for m in ("stamp_delay", "stamp_delay_histogram")}
    assert any(r"path=fc00:2::e\,fc00:3::d6,direction=forward " in x for x in lines)  # escaped
    assert agg.counters.path_unknown == 6  # the re-emission of the unknown second counts again
    assert agg.counters.seconds_reemitted == 1


@pytest.fixture
def paths_topic(kafka_bootstrap):
    name = f"test.paths.{uuid.uuid4().hex[:8]}"
    ensure_topics(kafka_bootstrap, [name], partitions=1, config={"cleanup.policy": "compact"})
    return name


def test_reader_knows_what_was_published_before_start_and_follows_after(kafka_bootstrap, paths_topic):
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(1, 201):  # more than one fetch's worth
        p.produce(paths_topic, value=stamp("A", i, [f"fc00:{i:x}::e"])[1], key=f"stamp/A/{i}/sender")
    p.produce(paths_topic, value=b"garbage", key=b"stamp/A/999/sender")
    assert p.flush(30) == 0
    book = PathBook(kafka_bootstrap, paths_topic)
    book.start(timeout_s=30)
    try:
        assert book.records == 201 and book.malformed == 1
        assert book.path_for_session("A", 200) == "fc00:c8::e"
        key, value = flow("A", 7, ["fc00:2::e"])
        p.produce(paths_topic, value=value, key=key)
        p.produce(paths_topic, value=None, key=b"stamp/A/1/sender")
        assert p.flush(30) == 0
        deadline = time.monotonic() + 15
        while book.records < 203 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert book.path_for_flow(7) == "fc00:2::e"
        assert "stamp/A/1/sender" in book.deleted and book.path_for_session("A", 1) == "fc00:1::e"
    finally:
        book.stop()
