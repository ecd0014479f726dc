"""Codec vectors (schemas/vectors/) decoded by the Python mirrors and by the C headers.

The vectors are written by schemas/vectors/make_vectors.py with plain struct
calls at the documented offsets, independent of segscope_schemas.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from segscope_schemas import stamp_record as sr
from segscope_schemas import stamp_test_packet as tp

REPO = Path(__file__).resolve().parents[2]
VECTORS = REPO / "schemas" / "vectors"
BUILD = REPO / "build" / "schemas"


def _vectors(kind_prefix: str) -> list[dict]:
    out = []
    for j in sorted(VECTORS.glob(f"{kind_prefix}*.json")):
        meta = json.loads(j.read_text())
        meta["bytes"] = bytes.fromhex(j.with_suffix(".hex").read_text().strip())
        out.append(meta)
    return out


BATCHES = _vectors("stamp_batch_")
PACKETS = _vectors("stamp_sender_") + _vectors("stamp_reflector_")
PTP_CASES = json.loads((VECTORS / "ptp_to_ns.json").read_text())


@pytest.fixture(scope="session")
def c_build() -> Path:
    subprocess.run(["make", "-C", str(REPO / "schemas"), "-s"], check=True)
    return BUILD


def test_vector_set_is_complete():
    names = {v["name"] for v in BATCHES + PACKETS}
    assert {
        "stamp_batch_empty",
        "stamp_batch_bad_magic",
        "stamp_batch_count_too_big",
        "stamp_batch_record_size_48",
        "stamp_sender_basic",
        "stamp_reflector_basic",
    } <= names
    assert all(v["length"] == len(v["bytes"]) for v in BATCHES + PACKETS)


@pytest.mark.parametrize("vec", BATCHES, ids=lambda v: v["name"])
def test_python_decodes_batch_vector(vec):
    if not vec["valid"]:
        with pytest.raises(sr.MalformedBatch) as e:
            sr.decode_batch(vec["bytes"])
        assert e.value.reason == vec["py_reason"]
        return
    hdr, recs = sr.decode_batch(vec["bytes"])
    assert (hdr.record_count, hdr.flags, hdr.batch_seq, hdr.node, hdr.header_size) == (
        vec["record_count"],
        vec["flags"],
        vec["batch_seq"],
        vec["node"],
        vec["header_size"],
    )
    assert len(recs) == len(vec["records"])
    for got, want in zip(recs, vec["records"]):
        assert {k: int(got[k]) for k in sr.STAMP_RECORD_DTYPE.names} == want


@pytest.mark.parametrize("vec", [v for v in BATCHES if v["valid"] and v["header_size"] == 56], ids=lambda v: v["name"])
def test_python_encode_reproduces_batch_vector(vec):
    recs = np.array(
        [tuple(r[k] for k in sr.STAMP_RECORD_DTYPE.names) for r in vec["records"]], dtype=sr.STAMP_RECORD_DTYPE
    )
    assert sr.encode_batch(recs, vec["node"], vec["batch_seq"], vec["flags"]) == vec["bytes"]


@pytest.mark.parametrize("vec", PACKETS, ids=lambda v: v["name"])
def test_python_decodes_packet_vector(vec):
    cls = tp.SenderPacket if vec["kind"] == "stamp_sender" else tp.ReflectorPacket
    if not vec["valid"]:
        with pytest.raises(tp.MalformedPacket):
            cls.decode(vec["bytes"])
        return
    pkt = cls.decode(vec["bytes"])
    for name, f in vec["fields"].items():
        assert getattr(pkt, name) == f["value"], name
        # the RFC position in the JSON really holds the value (big-endian)
        raw = vec["bytes"][f["offset"] : f["offset"] + f["size"]]
        assert int.from_bytes(raw, "big") == f["value"], name
    assert pkt.encode() == vec["bytes"][: tp.STAMP_BASE_LEN]


def test_rfc_positions_in_vectors():
    """RFC 8762 §4.2.1/§4.3.1 + RFC 8972 §3 offsets, as recorded in the vectors."""
    sender = json.loads((VECTORS / "stamp_sender_basic.json").read_text())["fields"]
    refl = json.loads((VECTORS / "stamp_reflector_basic.json").read_text())["fields"]
    assert {k: v["offset"] for k, v in sender.items()} == {
        "seq": 0,
        "ts_sec": 4,
        "ts_frac": 8,
        "err_est": 12,
        "ssid": 14,
    }
    assert {k: v["offset"] for k, v in refl.items()} == {
        "seq": 0,
        "ts_sec": 4,
        "ts_frac": 8,
        "err_est": 12,
        "ssid": 14,
        "rx_sec": 16,
        "rx_frac": 20,
        "sender_seq": 24,
        "sender_ts_sec": 28,
        "sender_ts_frac": 32,
        "sender_err_est": 36,
        "sender_ttl": 40,
    }


def test_c_codec_test_passes(c_build):
    res = subprocess.run([str(c_build / "test_codecs"), str(VECTORS)], capture_output=True, text=True)
    last = res.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"(\d+) passed, (\d+) failed", last)
    assert m, res.stdout
    n_expect = sum(
        1 for line in (VECTORS / "expectations.txt").read_text().splitlines() if line and not line.startswith("#")
    )
    assert (int(m.group(1)), int(m.group(2))) == (n_expect, 0), res.stdout
    assert res.returncode == 0


def test_c_codec_test_catches_a_wrong_expectation(c_build, tmp_path):
    """Mutate one expected value and one vector byte: the C test must report both."""
    for f in VECTORS.iterdir():
        shutil.copy(f, tmp_path / f.name)
    exp = tmp_path / "expectations.txt"
    exp.write_text(exp.read_text().replace("batch_seq=42", "batch_seq=43", 1))
    pkt = tmp_path / "stamp_sender_basic.hex"
    b = bytearray.fromhex(pkt.read_text().strip())
    b[15] ^= 0x01  # ssid low byte
    pkt.write_text(b.hex() + "\n")
    res = subprocess.run([str(c_build / "test_codecs"), str(tmp_path)], capture_output=True, text=True)
    assert res.returncode == 1
    assert "FAIL stamp_batch_three: batch_seq" in res.stdout
    assert "FAIL stamp_sender_basic: ssid" in res.stdout
    assert res.stdout.strip().endswith("2 failed")


def _struct_offsets(fmt: str, names: list[str | None]) -> dict[str, list[int]]:
    """Offsets/sizes of each item of a struct format (no padding: '<'/'!' formats)."""
    prefix, codes = fmt[0], re.findall(r"\d*[a-zA-Z]", fmt[1:])
    out, off = {}, 0
    for code, name in zip(codes, names):
        size = struct.calcsize(prefix + code)
        if name:
            out[name] = [off, size]
        off += size
    return out


def test_c_layouts_equal_python_layouts(c_build):
    c = json.loads(subprocess.run([str(c_build / "print_layouts")], capture_output=True, text=True, check=True).stdout)
    dt = sr.STAMP_RECORD_DTYPE
    assert c["stamp_record"]["size"] == dt.itemsize == sr.STAMP_RECORD_SIZE
    assert c["stamp_record"]["fields"] == {n: [dt.fields[n][1], dt.fields[n][0].itemsize] for n in dt.names}
    assert list(c["stamp_record"]["fields"]) == list(dt.names)  # same order too

    hdr_names = ["magic", "header_size", "record_size", "record_count", "flags", "batch_seq", "node"]
    assert c["stamp_batch_header"]["size"] == sr._HEADER.size == sr.STAMP_BATCH_HEADER_SIZE
    assert c["stamp_batch_header"]["fields"] == _struct_offsets(sr._HEADER.format, hdr_names)

    sender_names = ["seq", "ts_sec", "ts_frac", "err_est", "ssid", "mbz"]
    assert c["stamp_sender_packet"]["size"] == tp._SENDER.size == tp.STAMP_BASE_LEN
    assert c["stamp_sender_packet"]["fields"] == _struct_offsets(tp._SENDER.format, sender_names)

    refl_names = [
        "seq",
        "ts_sec",
        "ts_frac",
        "err_est",
        "ssid",
        "rx_sec",
        "rx_frac",
        "sender_seq",
        "sender_ts_sec",
        "sender_ts_frac",
        "sender_err_est",
        "mbz1",
        "sender_ttl",
        "mbz2",
    ]
    assert c["stamp_reflector_packet"]["size"] == tp._REFLECTOR.size == tp.STAMP_BASE_LEN
    assert c["stamp_reflector_packet"]["fields"] == _struct_offsets(tp._REFLECTOR.format, refl_names)


@pytest.mark.parametrize("case", PTP_CASES, ids=lambda c: c["name"])
def test_python_ptp_to_ns_wraparound(case):
    assert tp.ptp_to_ns(case["sec"], case["nsec"], case["ref_ns"]) == case["expect_ns"]


def test_c_ptp_to_ns_cases_are_run(c_build):
    """The C side of the same wrap-around cases runs inside test_codecs; make sure each one ran."""
    out = subprocess.run([str(c_build / "test_codecs"), str(VECTORS)], capture_output=True, text=True).stdout
    for case in PTP_CASES:
        assert f"ok   ptp_to_ns {case['name']}\n" in out


def test_ptp_round_trip_near_now():
    ref = 1_732_000_037 * tp.NS_PER_SEC + 5
    for delta in (-3 * tp.NS_PER_SEC, -1, 0, 7, 10 * tp.NS_PER_SEC):
        ns = ref + delta
        assert tp.ptp_to_ns(*tp.ptp_from_ns(ns), ref) == ns
