#!/usr/bin/env python3
"""Write the codec test vectors in schemas/vectors/ (run once; the output is committed).

Deliberately independent of segscope_schemas: every byte is laid out here with
plain struct calls at the offsets the C headers and RFCs define, so decoding
these vectors really checks both decoders rather than one against itself.

Output, per vector NAME:
  NAME.hex   the message/packet bytes as hex (one line)
  NAME.json  what a decoder must find (fields, or the expected error)
plus expectations.txt: the same expectations as `key=value` lines for the C
test (build/schemas/test_codecs), and ptp_to_ns.json for the wrap-around cases.

Usage: python3 schemas/vectors/make_vectors.py [OUT_DIR]
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

NS = 1_000_000_000
WRAP = 1 << 32

# ---------------------------------------------------------------- stamp_batch
RECORD_FIELDS = [  # name, struct code, offset (schemas/c/stamp_record.h)
    ("t1_ns", "Q", 0),
    ("t2_ns", "Q", 8),
    ("t3_ns", "Q", 16),
    ("t4_ns", "Q", 24),
    ("sender_seq", "I", 32),
    ("reflector_seq", "I", 36),
    ("ssid", "H", 40),
    ("sender_err_est", "H", 42),
    ("reflector_err_est", "H", 44),
    ("sender_ttl", "B", 46),
    ("reply_hop_limit", "B", 47),
    ("ifindex", "I", 48),
    ("flags", "I", 52),
    ("reserved", "Q", 56),
]
RECORD_SIZE = 64
HEADER_SIZE = 56


def record(i: int, ssid: int, base_ns: int) -> dict:
    t1 = base_ns + i * 1_000_000
    return {
        "t1_ns": t1,
        "t2_ns": t1 + 2_000_123,
        "t3_ns": t1 + 2_004_567,
        "t4_ns": t1 + 3_010_001,
        "sender_seq": i,
        "reflector_seq": 1000 + i,
        "ssid": ssid,
        "sender_err_est": 0xC001 + i,
        "reflector_err_est": 0x4102,
        "sender_ttl": 64 - i % 3,
        "reply_hop_limit": 62,
        "ifindex": 7,
        "flags": 0x2,
        "reserved": 0,
    }


def pack_record(r: dict) -> bytes:
    buf = bytearray(RECORD_SIZE)
    for name, code, off in RECORD_FIELDS:
        struct.pack_into("<" + code, buf, off, r[name])
    return bytes(buf)


def pack_header(
    *, magic=b"SSB1", header_size=HEADER_SIZE, record_size=RECORD_SIZE, count=0, flags=0, batch_seq=0, node=b""
) -> bytes:
    buf = bytearray(max(header_size, HEADER_SIZE))
    buf[0:4] = magic
    struct.pack_into("<H", buf, 4, header_size)
    struct.pack_into("<H", buf, 6, record_size)
    struct.pack_into("<I", buf, 8, count)
    struct.pack_into("<I", buf, 12, flags)
    struct.pack_into("<Q", buf, 16, batch_seq)
    buf[24 : 24 + len(node)] = node
    return bytes(buf[:header_size]) if header_size >= HEADER_SIZE else bytes(buf[:HEADER_SIZE])


def batch_vectors() -> list[dict]:
    base = 37 * NS + 1_732_000_000 * NS  # a TAI time in 2024
    recs3 = [record(i, 5, base) for i in range(3)]
    big = {
        **record(9, 65535, 0),
        "t1_ns": 2**64 - 4,
        "t2_ns": 2**64 - 3,
        "t3_ns": 2**64 - 2,
        "t4_ns": 2**64 - 1,
        "sender_seq": 2**32 - 1,
        "reflector_seq": 2**32 - 2,
        "ifindex": 2**32 - 1,
        "flags": 0x3,
        "reserved": 0,
    }
    v: list[dict] = []

    def ok(name, recs, *, node="A", batch_seq=0, flags=0, header_size=HEADER_SIZE, note=""):
        hdr = pack_header(
            header_size=header_size, count=len(recs), flags=flags, batch_seq=batch_seq, node=node.encode()
        )
        v.append(
            {
                "name": name,
                "kind": "stamp_batch",
                "note": note,
                "bytes": hdr + b"".join(pack_record(r) for r in recs),
                "expect": {
                    "valid": True,
                    "header_size": header_size,
                    "record_count": len(recs),
                    "flags": flags,
                    "batch_seq": batch_seq,
                    "node": node,
                    "records": recs,
                },
            }
        )

    def bad(name, data, py_reason, c_errno, note):
        v.append(
            {
                "name": name,
                "kind": "stamp_batch",
                "note": note,
                "bytes": data,
                "expect": {"valid": False, "py_reason": py_reason, "c_errno": c_errno},
            }
        )

    ok("stamp_batch_empty", [], node="A", batch_seq=0, note="empty batch: header only")
    ok("stamp_batch_one", [record(0, 1, base)], node="demo-A", batch_seq=1)
    ok("stamp_batch_three", recs3, node="A", batch_seq=42, note="one session, consecutive seqs")
    ok(
        "stamp_batch_extremes",
        [big],
        node="n" * 32,
        batch_seq=2**64 - 1,
        flags=0,
        note="all-ones values, 32-byte node name without NUL terminator",
    )
    ok(
        "stamp_batch_long_header",
        recs3[:2],
        node="B",
        batch_seq=7,
        header_size=64,
        note="a later layout with a 64-byte header: readers skip to header_size",
    )

    good = pack_header(count=3, batch_seq=42, node=b"A") + b"".join(pack_record(r) for r in recs3)
    bad("stamp_batch_bad_magic", b"SSB2" + good[4:], "bad_magic", "EBADMSG", "magic SSB2")
    bad(
        "stamp_batch_count_too_big",
        good[:-RECORD_SIZE],
        "length_mismatch",
        "EMSGSIZE",
        "record_count 3 but only 2 records follow",
    )
    bad(
        "stamp_batch_trailing_byte",
        good + b"\0",
        "length_mismatch",
        "EMSGSIZE",
        "one byte more than header_size + 3*64",
    )
    bad(
        "stamp_batch_record_size_48",
        pack_header(record_size=48, count=1, node=b"A") + bytes(48),
        "bad_record_size",
        "EBADMSG",
        "record_size 48 (an older record layout)",
    )
    bad("stamp_batch_short_header", good[:20], "short_header", "EMSGSIZE", "20 bytes, less than a header")
    bad(
        "stamp_batch_header_size_40",
        bytearray(good[:4]) + struct.pack("<H", 40) + good[6:],
        "bad_header_size",
        "EBADMSG",
        "header_size 40 < 56",
    )
    return v


# ------------------------------------------------------- STAMP test packets
SENDER_LAYOUT = [  # RFC 8762 §4.2.1 + RFC 8972 §3: name, offset, size
    ("seq", 0, 4),
    ("ts_sec", 4, 4),
    ("ts_frac", 8, 4),
    ("err_est", 12, 2),
    ("ssid", 14, 2),
]
REFLECTOR_LAYOUT = [  # RFC 8762 §4.3.1 + RFC 8972 §3
    ("seq", 0, 4),
    ("ts_sec", 4, 4),
    ("ts_frac", 8, 4),
    ("err_est", 12, 2),
    ("ssid", 14, 2),
    ("rx_sec", 16, 4),
    ("rx_frac", 20, 4),
    ("sender_seq", 24, 4),
    ("sender_ts_sec", 28, 4),
    ("sender_ts_frac", 32, 4),
    ("sender_err_est", 36, 2),
    ("sender_ttl", 40, 1),
]
SIZE_CODE = {1: "B", 2: "H", 4: "I"}


def pack_packet(layout, fields: dict, length=44) -> bytes:
    buf = bytearray(length)
    for name, off, size in layout:
        struct.pack_into("!" + SIZE_CODE[size], buf, off, fields[name])
    return bytes(buf)


def packet_vectors() -> list[dict]:
    v: list[dict] = []
    sender = {
        "seq": 7,
        "ts_sec": 1_732_000_037,
        "ts_frac": 123_456_789,
        "err_est": 0x8000 | 0x4000 | (10 << 8) | 0x31,
        "ssid": 1,
    }
    sender_max = {
        "seq": 2**32 - 1,
        "ts_sec": 2**32 - 1,
        "ts_frac": 999_999_999,
        "err_est": 0x4000 | (63 << 8) | 255,
        "ssid": 65535,
    }
    refl = {
        "seq": 7,
        "ts_sec": 1_732_000_037,
        "ts_frac": 125_000_000,
        "err_est": 0xC001,
        "ssid": 1,
        "rx_sec": 1_732_000_037,
        "rx_frac": 124_900_000,
        "sender_seq": 7,
        "sender_ts_sec": 1_732_000_037,
        "sender_ts_frac": 123_456_789,
        "sender_err_est": sender["err_est"],
        "sender_ttl": 62,
    }

    def add(name, kind, layout, fields, length=44, note=""):
        v.append(
            {
                "name": name,
                "kind": kind,
                "note": note,
                "bytes": pack_packet(layout, fields, length),
                "expect": {
                    "valid": True,
                    "fields": {n: {"offset": o, "size": s, "value": fields[n]} for n, o, s in layout},
                },
            }
        )

    add("stamp_sender_basic", "stamp_sender", SENDER_LAYOUT, sender, note="S=1 Z=1 scale=10 multiplier=0x31")
    add("stamp_sender_max", "stamp_sender", SENDER_LAYOUT, sender_max, note="all-ones fields")
    add(
        "stamp_sender_padded",
        "stamp_sender",
        SENDER_LAYOUT,
        sender,
        length=60,
        note="44-byte base + 16 bytes of zero padding (the sender's --padding)",
    )
    add("stamp_reflector_basic", "stamp_reflector", REFLECTOR_LAYOUT, refl, note="reflection of stamp_sender_basic")
    v.append(
        {
            "name": "stamp_sender_truncated",
            "kind": "stamp_sender",
            "note": "40 bytes < 44",
            "bytes": pack_packet(SENDER_LAYOUT, sender)[:40],
            "expect": {"valid": False, "error": "short"},
        }
    )
    v.append(
        {
            "name": "stamp_reflector_truncated",
            "kind": "stamp_reflector",
            "note": "43 bytes < 44",
            "bytes": pack_packet(REFLECTOR_LAYOUT, refl)[:43],
            "expect": {"valid": False, "error": "short"},
        }
    )
    return v


# ----------------------------------------------------------- ptp_to_ns wrap
def ptp_to_ns_reference(sec: int, nsec: int, ref_ns: int) -> int:
    """Nearest candidate (epoch-1, epoch, epoch+1) to the reference; ties keep the reference's epoch."""
    ref_sec = ref_ns // NS
    same = (ref_sec & ~(WRAP - 1)) | sec
    cands = [c for c in (same - WRAP, same, same + WRAP) if c >= 0]
    best = min(cands, key=lambda c: (abs(c - ref_sec), c != same))
    return best * NS + nsec


def ptp_cases() -> list[dict]:
    cases = [
        ("same_epoch", 1_732_000_037, 5, 1_732_000_038 * NS),
        ("reference_after_wrap", WRAP - 3, 999_999_999, (WRAP + 5) * NS + 17),
        ("reference_before_wrap", 1, 250, (WRAP - 2) * NS),
        ("first_epoch_no_negative", WRAP - 5, 0, 10 * NS),
        ("tie_half_wrap_after", 0, 0, (WRAP + WRAP // 2) * NS),
        ("tie_half_wrap_before", WRAP // 2, 1, WRAP * NS),
        ("third_epoch", 12345, 678, (2 * WRAP + 12340) * NS),
        ("zero", 0, 0, 0),
    ]
    return [
        {"name": n, "sec": s, "nsec": ns_, "ref_ns": r, "expect_ns": ptp_to_ns_reference(s, ns_, r)}
        for n, s, ns_, r in cases
    ]


# ------------------------------------------------------------------ output
def c_line(vec: dict) -> str:
    """expectations.txt line for the C test: kind name key=value ..."""
    e = vec["expect"]
    parts = [vec["kind"], vec["name"]]
    if not e["valid"]:
        parts.append("error=" + e.get("c_errno", e.get("error", "")))
        return " ".join(parts)
    if vec["kind"] == "stamp_batch":
        parts += [
            f"header_size={e['header_size']}",
            f"record_count={e['record_count']}",
            f"flags={e['flags']}",
            f"batch_seq={e['batch_seq']}",
            f"node={e['node']}",
        ]
        for i, r in enumerate(e["records"]):
            parts += [f"r{i}.{k}={r[k]}" for k, _, _ in RECORD_FIELDS]
    else:
        parts += [f"{k}={f['value']}" for k, f in e["fields"].items()]
    return " ".join(parts)


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent
    vectors = batch_vectors() + packet_vectors()
    lines = ["# generated by make_vectors.py: kind name key=value ... (see the .json files)"]
    for vec in vectors:
        (out / f"{vec['name']}.hex").write_text(vec["bytes"].hex() + "\n")
        meta = {
            "name": vec["name"],
            "kind": vec["kind"],
            "note": vec["note"],
            "length": len(vec["bytes"]),
            **vec["expect"],
        }
        (out / f"{vec['name']}.json").write_text(json.dumps(meta, indent=1) + "\n")
        lines.append(c_line(vec))
    for c in ptp_cases():
        lines.append(
            f"ptp_to_ns {c['name']} sec={c['sec']} nsec={c['nsec']} ref_ns={c['ref_ns']} expect_ns={c['expect_ns']}"
        )
    (out / "ptp_to_ns.json").write_text(json.dumps(ptp_cases(), indent=1) + "\n")
    (out / "expectations.txt").write_text("\n".join(lines) + "\n")
    print(f"{len(vectors)} vectors + {len(ptp_cases())} ptp_to_ns cases written to {out}")


if __name__ == "__main__":
    main()
