"""altmark_block / altmark_batch: vectors (schemas/vectors/altmark_block.json, written with
plain struct calls by make_altmark_vectors.py) decoded by the Python mirror and by the C
header (build/schemas/test_altmark), and the C layout equal to the numpy dtype."""

from __future__ import annotations

import json
import re
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from segscope_schemas import altmark_block as ab

REPO = Path(__file__).resolve().parents[2]
VECTORS = json.loads((REPO / "schemas" / "vectors" / "altmark_block.json").read_text())
RECORDS = {r["name"]: r for r in VECTORS["records"]}
BUILD = REPO / "build" / "schemas"


@pytest.fixture(scope="module")
def c_test() -> Path:
    subprocess.run(
        ["make", "-s", "-C", str(REPO / "schemas"), "../build/schemas/test_altmark"],
        check=True,
        capture_output=True,
        text=True,
    )
    return BUILD / "test_altmark"


def _one(fields: dict) -> np.ndarray:
    r = np.zeros(1, dtype=ab.ALTMARK_BLOCK_DTYPE)
    for k, v in fields.items():
        r[k] = v
    return r


@pytest.mark.parametrize("vec", VECTORS["records"], ids=lambda v: v["name"])
def test_record_decode_encode_check(vec):
    raw = bytes.fromhex(vec["hex"])
    rec = np.frombuffer(raw, dtype=ab.ALTMARK_BLOCK_DTYPE)
    assert {k: int(rec[0][k]) for k in ab.ALTMARK_BLOCK_DTYPE.names} == vec["fields"]
    assert _one(vec["fields"]).tobytes() == raw
    assert (ab.check_records(rec)[0] or "ok") == vec["check"]


def test_check_records_vectorised_matches_one_by_one():
    raw = b"".join(bytes.fromhex(v["hex"]) for v in VECTORS["records"])
    recs = np.frombuffer(raw, dtype=ab.ALTMARK_BLOCK_DTYPE)
    assert [c or "ok" for c in ab.check_records(recs)] == [v["check"] for v in VECTORS["records"]]


@pytest.mark.parametrize("vec", VECTORS["batches"], ids=lambda v: v["name"])
def test_batch_decode(vec):
    raw = bytes.fromhex(vec["hex"])
    if "error" in vec:
        with pytest.raises(ab.MalformedBatch) as e:
            ab.decode_batch(raw)
        assert e.value.reason == vec["error"]
        return
    hdr, recs = ab.decode_batch(raw)
    assert (hdr.node, hdr.batch_seq, hdr.record_count) == (vec["node"], vec["batch_seq"], vec["record_count"])
    assert recs.tobytes() == b"".join(bytes.fromhex(RECORDS[n]["hex"]) for n in vec["records"])
    assert ab.encode_batch(recs, vec["node"], vec["batch_seq"]) == raw


def test_batch_bad_node_utf8():
    raw = bytearray(ab.encode_batch(np.zeros(0, dtype=ab.ALTMARK_BLOCK_DTYPE), "A", 1))
    raw[24] = 0xFF
    with pytest.raises(ab.MalformedBatch) as e:
        ab.decode_batch(bytes(raw))
    assert e.value.reason == "bad_node"


def test_encode_rejects_long_node():
    with pytest.raises(ValueError, match="longer than 32"):
        ab.encode_batch(np.zeros(0, dtype=ab.ALTMARK_BLOCK_DTYPE), "n" * 33, 0)


@pytest.mark.parametrize("vec", VECTORS["deltas"], ids=lambda v: f"{v['prev']}->{v['cur']}/{v['bits']}")
def test_counter_delta(vec):
    assert ab.counter_delta(vec["prev"], vec["cur"], vec["bits"]) == vec["delta"]


@pytest.mark.parametrize("vec", VECTORS["dmark_delays"], ids=lambda v: v["name"])
def test_dmark_delay(vec):
    got = ab.dmark_delay_ns(vec["tx_n"], vec["tx_sum"], vec["rx_n"], vec["rx_sum"])
    assert got == (vec["delay_ns"] if vec["ok"] else None)


def test_block_index_and_key():
    assert ab.block_index(1_795_305_600_999_999_999, 1000) == 1_795_305_600
    assert ab.block_index(1_795_305_601_000_000_000, 1000) == 1_795_305_601
    assert ab.block_index(1_000_000_000, 300) == 3  # 1 s / 300 ms: block 3 starts at 0.9 s
    assert ab.kafka_key("edge-A", 1048575) == b"edge-A/1048575"


def test_c_vectors_pass(c_test):
    out = subprocess.run([str(c_test), str(REPO / "schemas" / "vectors")], capture_output=True, text=True)
    m = re.search(r"(\d+) passed, (\d+) failed", out.stdout)
    assert m and out.returncode == 0, out.stdout + out.stderr
    n_rec, n_batch = len(VECTORS["records"]), len(VECTORS["batches"])
    assert int(m[1]) >= 4 * n_rec + n_batch + len(VECTORS["deltas"]) + len(VECTORS["dmark_delays"]) and m[2] == "0"


def test_c_layout_equals_numpy_dtype_and_header_struct(c_test):
    c = json.loads(subprocess.run([str(c_test), "--layouts"], capture_output=True, text=True, check=True).stdout)
    dt = ab.ALTMARK_BLOCK_DTYPE
    assert c["altmark_block"]["size"] == dt.itemsize == ab.ALTMARK_BLOCK_SIZE
    assert c["altmark_block"]["fields"] == {n: [dt.fields[n][1], dt.fields[n][0].itemsize] for n in dt.names}
    assert list(c["altmark_block"]["fields"]) == list(dt.names)
    # no implicit padding: the fields tile the record exactly
    assert sum(s for _, s in c["altmark_block"]["fields"].values()) == ab.ALTMARK_BLOCK_SIZE
    off, hdr = 0, {}
    for name, code in zip(
        ["magic", "header_size", "record_size", "record_count", "flags", "batch_seq", "node"],
        re.findall(r"\d*[a-zA-Z]", ab._HEADER.format[1:]),
    ):
        size = struct.calcsize("<" + code)
        hdr[name] = [off, size]
        off += size
    assert c["altmark_batch_header"] == {"size": ab.ALTMARK_BATCH_HEADER_SIZE, "fields": hdr}
