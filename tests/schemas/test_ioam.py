"""In-line IOAM wire formats: the vectors (schemas/vectors/, written with plain struct calls by
make_ioam_vectors.py, one trace filled by the Linux kernel on real veths) decoded and encoded by
the Python mirrors and by the C headers (build/schemas/test_ioam), the C layouts equal to the numpy
dtypes, and the C and Python option decoders agreeing on 30 000 mutated headers."""

from __future__ import annotations

import json
import random
import re
import subprocess
from pathlib import Path

import pytest

from segscope_schemas import ioam_e2e_option as e2e
from segscope_schemas import ioam_record as ir
from segscope_schemas import ioam_trace_option as tr
from segscope_schemas.ipv6_options import MalformedIoam

REPO = Path(__file__).resolve().parents[2]
VECTORS = REPO / "schemas" / "vectors"
BUILD = REPO / "build" / "schemas"
TRACE = json.loads((VECTORS / "ioam_trace_option.json").read_text())
E2E = json.loads((VECTORS / "ioam_e2e_option.json").read_text())
BATCHES = [json.loads(p.read_text()) for p in sorted(VECTORS.glob("ioam_batch_*.json"))]
ENTRY_KEYS = ("hop_limit", "node_id", "ingress_if_id", "egress_if_id", "ts_sec", "ts_subsec")


@pytest.fixture(scope="module")
def c_test() -> Path:
    subprocess.run(["make", "-s", "-C", str(REPO / "schemas"), "../build/schemas/test_ioam"], check=True)
    return BUILD / "test_ioam"


def _node(d: dict) -> tr.TraceNode:
    return tr.TraceNode(*(d[k] for k in ENTRY_KEYS))


# ---------------------------------------------------------------- the two options


@pytest.mark.parametrize("vec", TRACE["decode"], ids=lambda v: v["name"])
def test_trace_decode(vec):
    raw = bytes.fromhex(vec["hex"])
    if "error" in vec:
        with pytest.raises(MalformedIoam) as e:
            tr.decode_hbh(raw)
        assert e.value.reason == vec["error"]
        return
    t = tr.decode_hbh(raw)
    fields = ("next_header", "namespace_id", "node_len", "flags", "remaining_len", "trace_type", "slots", "filled")
    assert {k: getattr(t, k) for k in fields} == {k: vec[k] for k in fields}
    assert list(t.nodes) == [_node(n) for n in vec["nodes"]]
    assert t.overflow == bool(vec["flags"] & 0x8)


def test_kernel_filled_vector_is_there():
    """One vector is a trace the Linux kernel filled (R: node 7, ifs 70/71; D: node 9, in 90)."""
    k = next(v for v in TRACE["decode"] if v["name"] == "kernel_filled_3_of_3")
    t = tr.decode_hbh(bytes.fromhex(k["hex"]))
    assert [(n.node_id, n.ingress_if_id, n.egress_if_id) for n in t.nodes] == [
        (9, 90, 0xFFFF),
        (7, 70, 71),
        (5, 10, 11),
    ]


@pytest.mark.parametrize("vec", TRACE["encode"], ids=lambda v: v["name"])
def test_trace_encode(vec):
    first = _node(vec["first"]) if vec["first"] else None
    if "error" in vec:
        with pytest.raises(MalformedIoam) as e:
            tr.encode_hbh(vec["next_header"], vec["namespace_id"], vec["slots"], first)
        assert e.value.reason == vec["error"]
        return
    raw = tr.encode_hbh(vec["next_header"], vec["namespace_id"], vec["slots"], first)
    assert raw.hex() == vec["hex"]
    t = tr.decode_hbh(raw)
    assert (t.slots, t.filled, list(t.nodes)) == (vec["slots"], 1 if first else 0, [first] if first else [])


@pytest.mark.parametrize("vec", E2E["decode"], ids=lambda v: v["name"])
def test_e2e_decode(vec):
    raw = bytes.fromhex(vec["hex"])
    if "error" in vec:
        with pytest.raises(MalformedIoam) as e:
            e2e.decode_doh(raw)
        assert e.value.reason == vec["error"]
        return
    d = e2e.decode_doh(raw)
    fields = ("next_header", "namespace_id", "e2e_type", "seq", "ts_sec", "ts_nsec")
    assert {k: getattr(d, k) for k in fields} == {k: vec[k] for k in fields}
    assert d.tai_ns == vec["ts_sec"] * 10**9 + vec["ts_nsec"]


@pytest.mark.parametrize("vec", E2E["encode"], ids=lambda v: v["name"])
def test_e2e_encode(vec):
    args = (vec["next_header"], vec["namespace_id"], vec["seq"], vec["ts_sec"], vec["ts_nsec"])
    if "error" in vec:
        with pytest.raises(MalformedIoam) as e:
            e2e.encode_doh(*args)
        assert e.value.reason == vec["error"]
        return
    assert e2e.encode_doh(*args).hex() == vec["hex"]


# ---------------------------------------------------------------- ioam_record / ioam_batch


@pytest.mark.parametrize("vec", BATCHES, ids=lambda v: v["name"])
def test_batch_decode_encode(vec):
    raw = bytes.fromhex((VECTORS / f"{vec['name']}.hex").read_text().strip())
    assert len(raw) == vec["length"]
    if not vec["valid"]:
        with pytest.raises(ir.MalformedBatch) as e:
            ir.decode_batch(raw)
        assert e.value.reason == vec["error"]
        return
    hdr, recs = ir.decode_batch(raw)
    assert (hdr.node, hdr.batch_seq, hdr.record_count, hdr.header_size) == (
        vec["node"],
        vec["batch_seq"],
        vec["record_count"],
        vec["header_size"],
    )
    for rec, want in zip(recs, vec["records"], strict=True):
        assert {k: int(rec[k]) for k in ir.IOAM_RECORD_DTYPE.names if k != "entries"} == {
            k: v for k, v in want.items() if k != "entries"
        }
        path = ir.entries_in_path_order(rec)
        assert [tuple(int(e[k]) for k in ENTRY_KEYS) for e in path] == [
            tuple(e[k] for k in ENTRY_KEYS) for e in reversed(want["entries"])
        ], "entries oldest first, host order"
        assert not rec["entries"][len(want["entries"]) :].tobytes().strip(b"\0")
    if vec["header_size"] == 56:
        assert ir.encode_batch(recs, vec["node"], vec["batch_seq"]) == raw
    if recs.size:
        assert ir.kafka_key(vec["node"], int(recs[0]["flow_id"])) == vec["kafka_key"].encode()
    assert ir.message_length(raw[:56]) == len(raw)


def test_c_vectors_pass(c_test):
    out = subprocess.run([str(c_test), str(VECTORS)], capture_output=True, text=True)
    m = re.search(r"(\d+) passed, (\d+) failed", out.stdout)
    assert m and out.returncode == 0, out.stdout + out.stderr
    n_min = len(TRACE["decode"]) + len(TRACE["encode"]) + len(E2E["decode"]) + len(E2E["encode"]) + len(BATCHES)
    assert int(m[1]) >= n_min and m[2] == "0"


def test_c_layout_equals_numpy_dtypes(c_test):
    c = json.loads(subprocess.run([str(c_test), "--layouts"], capture_output=True, text=True, check=True).stdout)
    for cname, dt in (("ioam_record", ir.IOAM_RECORD_DTYPE), ("ioam_node_entry", ir.IOAM_NODE_ENTRY_DTYPE)):
        assert c[cname]["size"] == dt.itemsize
        assert list(c[cname]["fields"]) == list(dt.names)
        assert c[cname]["fields"] == {n: [dt.fields[n][1], dt.fields[n][0].itemsize] for n in dt.names}
        # no implicit padding: the fields tile the struct exactly
        assert sum(s for _, s in c[cname]["fields"].values()) == dt.itemsize
    assert c["ioam_record"]["size"] == ir.IOAM_RECORD_SIZE == 256
    assert c["ioam_batch_header"]["size"] == 56


# ---------------------------------------------------------------- C and Python agree on anything


def _py_classify(kind: str, raw: bytes) -> str:
    try:
        if kind == "trace":
            t = tr.decode_hbh(raw)
        else:
            d = e2e.decode_doh(raw)
            fields = (d.next_header, d.doh_len, d.opt_off, d.namespace_id, d.e2e_type, d.seq, d.ts_sec, d.ts_nsec)
            return "ok " + " ".join(map(str, fields))
    except MalformedIoam as e:
        return e.reason
    nodes = "".join(
        f" {n.hop_limit}/{n.node_id}/{n.ingress_if_id}/{n.egress_if_id}/{n.ts_sec}/{n.ts_subsec}" for n in t.nodes
    )
    head = (t.next_header, t.hbh_len, t.opt_off, t.namespace_id, t.node_len, t.flags, t.remaining_len, t.trace_type)
    return "ok " + " ".join(map(str, head + (t.slots, t.filled))) + nodes


def _mutants(seeds: list[bytes], n: int, rng: random.Random) -> list[bytes]:
    out = []
    for _ in range(n):
        b = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 3)):
            op = rng.random()
            if op < 0.5 and b:
                i = rng.randrange(len(b))
                b[i] = rng.choice([0, 1, 2, 3, 4, 0x11, 0x31, 0xFF, rng.randrange(256)])
            elif op < 0.7 and b:
                del b[rng.randrange(len(b)) :]
            elif op < 0.85 and len(b) > 1:
                b[1] = rng.randrange(40)  # Hdr Ext Len lies
            else:
                b += bytes(rng.randrange(1, 9))
        out.append(bytes(b))
    return out


@pytest.mark.parametrize("kind", ["trace", "e2e"])
def test_c_and_python_decoders_agree_on_mutants(c_test, kind):
    vecs = TRACE["decode"] if kind == "trace" else E2E["decode"]
    seeds = [bytes.fromhex(v["hex"]) for v in vecs if v["hex"]]
    inputs = _mutants(seeds, 15_000, random.Random(9197)) + seeds
    p = subprocess.run(
        [str(c_test), "--classify", kind],
        input="".join(b.hex() + "\n" for b in inputs),
        capture_output=True,
        text=True,
        check=True,
    )
    got = p.stdout.splitlines()
    assert len(got) == len(inputs)
    diffs = [(raw.hex(), c, _py_classify(kind, raw)) for raw, c in zip(inputs, got) if c != _py_classify(kind, raw)]
    assert diffs == [], diffs[:5]
    classes = {line.split()[0] for line in got}
    assert {"ok", "truncated", "bad_length", "no_option", "unknown_type"} <= classes, classes
