"""stamp_streamer --records ioam: 256-byte ioam_records from a real BPF ring buffer (ringbuf_gen
--records ioam, BPF_PROG_TEST_RUN) into a real Kafka, read back as ioam_batch ("IOB1") messages keyed
"<node>/<flow_id>" and checked record by record against what the generator wrote
(collectors/bench/ringbuf_gen.h: every field is a function of flow and sequence number)."""

from __future__ import annotations

import subprocess
import time
from collections import defaultdict

import numpy as np
import pytest

from segscope_schemas import ioam_record as ir
from tests.collectors.test_stamp_streamer import NODE, Streamer, consume_all, gen, make_topics

pytestmark = pytest.mark.datapath  # loads a BPF program (ringbuf_gen) into the kernel

# collectors/bench/ringbuf_gen.h
TX_BASE_NS = 1800000000000000000
EGRESS_NODE, NODE0, NAMESPACE = 0xB00B, 0xA000, 123


def tx_ns(flow: int, seq: int) -> int:
    return TX_BASE_NS + flow * 1_000_000_000 + seq * 1000


@pytest.fixture
def ioam_ring(collectors_build, co_pins, request):
    pin = co_pins / request.node.name / "ioam_records"
    subprocess.run(["rm", "-rf", str(pin.parent)], check=True)
    gen(collectors_build, pin, 0, "--ring-size", str(16 << 20), "--records", "ioam")
    yield pin
    subprocess.run(["rm", "-rf", str(pin.parent)], check=True)


def ioam_gen(build, pin, count: int, *extra: str) -> dict:
    return gen(build, pin, count, "--records", "ioam", *extra)


def check_record(rec, flow: int, seq: int) -> None:
    """Every field the generator wrote, as the egress writes it (entries newest first, big-endian)."""
    assert (int(rec["flow_id"]), int(rec["seq"])) == (flow, seq)
    assert int(rec["tx_tai_ns"]) == tx_ns(flow, seq)
    assert int(rec["rx_tai_ns"]) == tx_ns(flow, seq) + 5000 + seq % 7
    assert (int(rec["node_id"]), int(rec["namespace_id"])) == (EGRESS_NODE, NAMESPACE)
    assert (int(rec["slots"]), int(rec["filled"]), int(rec["trace_type"])) == (4, 3, ir.IOAM_TRACE_TYPE)
    assert (int(rec["hop_limit"]), int(rec["tai_utc_offset_s"]), int(rec["flags"])) == (61, 37, 0)
    e = rec["entries"]
    for i in range(3):
        assert int(e[i]["hop_limit_node_id"]) == ((62 + i) << 24) | (NODE0 + 2 - i)
        assert (int(e[i]["ingress_if_id"]), int(e[i]["egress_if_id"])) == (10 + i, 20 + i)
        assert (int(e[i]["ts_sec"]), int(e[i]["ts_subsec"])) == (seq + 1000, 100 * (3 - i))
    assert not np.any(e[3:].view(np.uint8)), "entries past `filled` are zero"


def test_every_ioam_record_once_in_order_per_flow(collectors_build, ioam_ring, kafka_bootstrap, work_dir):
    n, flows = 60_000, 3
    topic, mtopic = make_topics(kafka_bootstrap)
    st = Streamer(collectors_build, ioam_ring, kafka_bootstrap, topic, mtopic, work_dir, "--records", "ioam")
    try:
        time.sleep(0.5)
        g = ioam_gen(collectors_build, ioam_ring, n, "--ssids", str(flows), "--first-ssid", "700")
        assert (g["generated"], g["rb_full"]) == (n, 0)
        st.wait_delivered(n)
        time.sleep(1.2)  # two more stats ticks
        rc, final, err = st.stop()
    finally:
        st.kill()
    assert rc == 0, err
    assert final["records"] == "ioam"
    assert final["records_in"] == final["records_delivered"] == n
    assert final["records_failed"] == final["malformed_records"] == final["produce_errors"] == 0
    assert final["batches_produced"] == final["batches_delivered"] == final["batch_seq"]

    msgs = consume_all(kafka_bootstrap, topic, lambda ms: len(ms) >= final["batches_produced"])
    assert len(msgs) == final["batches_produced"]
    seqs: dict[int, list[int]] = defaultdict(list)
    for m in msgs:
        hdr, recs = ir.decode_batch(m.value())
        assert hdr.node == NODE and hdr.record_count == len(recs) > 0
        flow_ids = set(recs["flow_id"].tolist())
        assert len(flow_ids) == 1, "a batch holds one flow"
        flow = flow_ids.pop()
        assert m.key() == f"{NODE}/{flow}".encode()
        assert hdr.record_count <= 1024  # the ioam default --max-batch (256 KiB messages)
        for rec in recs:
            seq = int(rec["seq"])
            check_record(rec, flow, seq)
            seqs[flow].append(seq)
    assert sorted(seqs) == [700, 701, 702]
    for flow, got in seqs.items():
        assert got == list(range(n // flows)), f"flow {flow}: records missing, duplicated or out of order"
    assert sorted(ir.decode_header(m.value()).batch_seq for m in msgs) == list(range(len(msgs)))

    lines = [
        ln
        for m in consume_all(kafka_bootstrap, mtopic, lambda ms: len(ms) >= 3)
        for ln in m.value().decode().splitlines()
    ]
    mine = [ln for ln in lines if ln.startswith(f"segscope_streamer,node={NODE},records=ioam ")]
    assert len(mine) >= 3, lines
    fields = dict(kv.split("=") for kv in mine[-1].split(" ")[1].split(","))
    assert fields["records_in"] == f"{n}i" and fields["records_failed"] == "0i"


def test_ioam_max_batch_and_malformed_samples(collectors_build, ioam_ring, kafka_bootstrap, work_dir):
    """A wrong-size sample is counted, never shipped, and fails the exit code; --max-batch cuts."""
    n = 1000
    topic, mtopic = make_topics(kafka_bootstrap, partitions=1)
    st = Streamer(
        collectors_build, ioam_ring, kafka_bootstrap, topic, mtopic, work_dir, "--records", "ioam", "--max-batch", "50"
    )
    try:
        time.sleep(0.3)
        g = ioam_gen(collectors_build, ioam_ring, n, "--malformed-every", "10")
        assert g["malformed"] == 100
        st.wait_delivered(n - 100)
        rc, final, err = st.stop()
    finally:
        st.kill()
    assert final["malformed_records"] == 100 and final["records_in"] == final["records_delivered"] == 900
    assert rc == 1 and "100 records lost" in err and "expected 256 (ioam records)" in err
    msgs = consume_all(
        kafka_bootstrap, topic, lambda ms: sum(ir.decode_header(m.value()).record_count for m in ms) >= 900
    )
    counts = [ir.decode_header(m.value()).record_count for m in msgs]
    assert sum(counts) == 900 and max(counts) == 50
    got = [int(s) for m in msgs for s in ir.decode_batch(m.value())[1]["seq"]]
    # the generator's record k is seq k of flow 1; every 10th k was the malformed sample instead
    assert got == [k for k in range(n) if k % 10 != 9]


@pytest.mark.parametrize(
    "args,flag",
    [
        (["--records", "altmark"], "--records"),
        (["--records", "ioam", "--key", "node"], "--key"),
        (["--key", "session", "--records", "ioam"], "--key"),  # the kind decides, whatever the order
        (["--records", "stamp", "--key", "flow"], "--key"),
    ],
)
def test_bad_kind_and_key_exit_2_naming_the_flag(collectors_build, args, flag):
    res = subprocess.run(
        [str(collectors_build / "stamp_streamer"), "--ringbuf", "/sys/fs/bpf/co-none", "--node", "x", *args],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2
    assert res.stderr.startswith(f"stamp_streamer: {flag}:"), res.stderr


def test_missing_ioam_ring_names_the_kind(collectors_build):
    res = subprocess.run(
        [str(collectors_build / "stamp_streamer"), "--node", "x", "--records", "ioam"], capture_output=True, text=True
    )
    assert res.returncode == 2 and "required (pinned ioam_records ring buffer)" in res.stderr
