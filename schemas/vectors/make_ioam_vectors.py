#!/usr/bin/env python3
"""Write the in-line IOAM vectors in schemas/vectors/ (run once; the output is committed).

Independent of segscope_schemas: every byte is laid out here with plain struct calls at the
offsets schemas/IOAM.md and schemas/c/ioam_record.h document, so the vectors test the C headers
and the Python mirrors rather than one against itself.

  ioam_batch_<name>.hex / .json     Kafka messages on segscope.ioam.records (envelope "IOB1" +
                                    256-byte ioam_records) and what a decoder must find
  ioam_trace_option.json            Hop-by-Hop headers with the IOAM trace: decode and encode
  ioam_e2e_option.json              Destination Options headers with the IOAM E2E option

ioam_trace_kernel_capture.json (capture_ioam_kernel_vector.py, root, once) holds a trace the Linux
kernel filled on real veths; its decode here is checked against the setup the capture used.

Usage: python3 schemas/vectors/make_ioam_vectors.py
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

OUT = Path(__file__).resolve().parent
NS = 10**9
U64 = 2**64 - 1

# ---------------------------------------------------------------- ioam_record / ioam_batch
RECORD_FIELDS = [  # name, struct code, offset (schemas/c/ioam_record.h)
    ("rx_tai_ns", "Q", 0),
    ("tx_tai_ns", "Q", 8),
    ("seq", "Q", 16),
    ("flow_id", "I", 24),
    ("ifindex", "I", 28),
    ("node_id", "I", 32),
    ("namespace_id", "H", 36),
    ("slots", "B", 38),
    ("filled", "B", 39),
    ("trace_type", "I", 40),
    ("trace_flags", "B", 44),
    ("hop_limit", "B", 45),
    ("tai_utc_offset_s", "h", 46),
    ("flags", "I", 48),
    ("reserved0", "I", 52),
    ("reserved1", "Q", 56),
]
RECORD_SIZE, ENTRIES_OFF, MAX_NODES = 256, 64, 12
HEADER = struct.Struct("<4sHHIIQ32s")
ENTRY_KEYS = ("hop_limit", "node_id", "ingress_if_id", "egress_if_id", "ts_sec", "ts_subsec")


def entry(hop_limit, node_id, in_if, out_if, sec, subsec) -> dict:
    return dict(zip(ENTRY_KEYS, (hop_limit, node_id, in_if, out_if, sec, subsec)))


def pack_entry(e: dict) -> bytes:
    """One node entry as on the wire: big-endian inside the little-endian record."""
    hop_node = e["hop_limit"] << 24 | e["node_id"]
    return struct.pack(">IHHII", hop_node, e["ingress_if_id"], e["egress_if_id"], e["ts_sec"], e["ts_subsec"])


def record(**kw) -> dict:
    r = {name: 0 for name, _, _ in RECORD_FIELDS} | {"trace_type": 0xF00000}
    r.update(kw)
    r.setdefault("entries", [])
    return r


def pack_record(r: dict) -> bytes:
    out = bytearray(RECORD_SIZE)
    for name, code, off in RECORD_FIELDS:
        struct.pack_into("<" + code, out, off, r[name])
    for i, e in enumerate(r["entries"]):
        out[ENTRIES_OFF + 16 * i : ENTRIES_OFF + 16 * (i + 1)] = pack_entry(e)
    return bytes(out)


T = 1_795_000_000  # TAI seconds, late 2026
PATH = [entry(62, 9, 90, 91, T, 500_010), entry(63, 7, 70, 71, T, 500_004), entry(64, 5, 10, 11, T, 499_990)]
RECORDS = {
    "three_hops": record(
        rx_tai_ns=(T + 37) * NS + 500_020_000,
        tx_tai_ns=(T + 37) * NS + 499_990_123,
        seq=41,
        flow_id=7,
        ifindex=3,
        node_id=9,
        namespace_id=123,
        slots=4,
        filled=2,
        hop_limit=62,
        tai_utc_offset_s=37,
        entries=PATH[1:],
    ),
    "overflow_other_flow": record(
        rx_tai_ns=(T + 1) * NS,
        tx_tai_ns=T * NS + 999_999_999,
        seq=0,
        flow_id=0xFFFFF,
        ifindex=12,
        node_id=0xFFFFFF,
        namespace_id=1,
        slots=3,
        filled=3,
        trace_flags=0x8,
        hop_limit=1,
        tai_utc_offset_s=-5,
        flags=1,
        entries=PATH,
    ),
    "truncated_15_of_15": record(
        rx_tai_ns=(T + 2) * NS,
        tx_tai_ns=(T + 2) * NS - 1,
        seq=2**40 + 3,
        flow_id=8,
        ifindex=2,
        node_id=9,
        namespace_id=65535,
        slots=15,
        filled=15,
        hop_limit=50,
        flags=2,
        entries=[entry(64 - i, 100 + i, i, i + 1, T, i) for i in range(MAX_NODES)],
    ),
    "extremes": record(
        rx_tai_ns=U64,
        tx_tai_ns=U64 - 1,
        seq=U64,
        flow_id=2**32 - 1,
        ifindex=2**32 - 1,
        node_id=0xFFFFFF,
        namespace_id=65535,
        slots=12,
        filled=12,
        hop_limit=255,
        tai_utc_offset_s=-32768,
        flags=3,
        trace_flags=0xF,
        entries=[entry(255, 0xFFFFFF, 0xFFFF, 0xFFFF, 2**32 - 1, 999_999) for _ in range(MAX_NODES)],
    ),
}


def batch(name: str, recs: list[str], node: str = "B", batch_seq: int = 1, **raw) -> None:
    body = b"".join(pack_record(RECORDS[r]) for r in recs)
    hdr_size = raw.get("header_size", 56)
    hdr = HEADER.pack(
        raw.get("magic", b"IOB1"),
        hdr_size,
        raw.get("record_size", RECORD_SIZE),
        raw.get("record_count", len(recs)),
        0,
        batch_seq,
        node.encode(),
    )
    msg = hdr + bytes(hdr_size - 56) + body + raw.get("tail", b"")
    msg = msg[: raw["cut"]] if "cut" in raw else msg
    meta = {"name": f"ioam_batch_{name}", "kind": "ioam_batch", "length": len(msg)}
    if "error" in raw:
        meta |= {"valid": False, "error": raw["error"], "c_error": raw["c_error"]}
    else:
        meta |= {
            "valid": True,
            "header_size": hdr_size,
            "record_count": len(recs),
            "batch_seq": batch_seq,
            "node": node,
            "records": [RECORDS[r] for r in recs],
            "kafka_key": f"{node}/{RECORDS[recs[0]]['flow_id']}" if recs else None,
        }
    (OUT / f"ioam_batch_{name}.hex").write_text(msg.hex() + "\n")
    (OUT / f"ioam_batch_{name}.json").write_text(json.dumps(meta, indent=1) + "\n")


def batches() -> None:
    batch("empty", [], node="edge-B", batch_seq=0)
    batch("one", ["three_hops"], node="edge-B", batch_seq=1)
    batch("three", ["three_hops", "overflow_other_flow", "truncated_15_of_15"], batch_seq=42)
    batch("extremes", ["extremes"], node="n" * 32, batch_seq=U64)
    batch("long_header", ["three_hops", "three_hops"], header_size=64, batch_seq=7)
    batch("bad_magic", ["three_hops"], magic=b"SSB1", error="bad_magic", c_error="EBADMSG")
    batch("record_size_64", ["three_hops"], record_size=64, error="bad_record_size", c_error="EBADMSG")
    batch("count_too_big", ["three_hops"], record_count=2, error="length_mismatch", c_error="EMSGSIZE")
    batch("trailing_byte", ["three_hops"], tail=b"\0", error="length_mismatch", c_error="EMSGSIZE")
    batch("short_header", [], cut=40, error="short_header", c_error="EMSGSIZE")


# ---------------------------------------------------------------- the two options (schemas/IOAM.md)
TRACE_TYPE, E2E_TYPE = 0xF00000, 0xB000


def node_bytes(n: dict) -> bytes:
    return pack_entry(n)


def trace_hbh(
    next_header: int,
    namespace: int,
    slots: int,
    filled: list[dict],
    *,
    flags: int = 0,
    trace_type: int = TRACE_TYPE,
    node_len: int = 4,
    remaining: int | None = None,
    opt_len: int | None = None,
    ioam_type: int = 0,
    pre: bytes = b"\x01\x00",
    post: bytes = b"",
    data: bytes | None = None,
) -> bytes:
    """An HBH with the trace option; padded to 8n with Pad1/PadN after `post`."""
    opt = trace_option(namespace, slots, filled, flags, trace_type, node_len, remaining, opt_len, ioam_type, data)
    body = pre + opt + post
    pad = (-(2 + len(body))) % 8
    body += b"\x00" if pad == 1 else (bytes([1, pad - 2]) + bytes(pad - 2) if pad else b"")
    return bytes([next_header, (2 + len(body)) // 8 - 1]) + body


def trace_option(
    namespace: int,
    slots: int,
    filled: list[dict],
    flags: int = 0,
    trace_type: int = TRACE_TYPE,
    node_len: int = 4,
    remaining: int | None = None,
    opt_len: int | None = None,
    ioam_type: int = 0,
    data: bytes | None = None,
) -> bytes:
    """The 0x31 option alone: type, length, reserved, IOAM type, trace header, node data list."""
    rem = 4 * (slots - len(filled)) if remaining is None else remaining
    dl = bytes(16 * (slots - len(filled))) + b"".join(node_bytes(n) for n in filled) if data is None else data
    olen = 10 + len(dl) if opt_len is None else opt_len
    b10, b11 = node_len << 3 | flags >> 1, (flags & 1) << 7 | rem  # NodeLen | Flags | RemainingLen
    opt = struct.pack("!BBBBHBB", 0x31, olen, 0, ioam_type, namespace, b10, b11)
    return opt + struct.pack("!I", trace_type << 8) + dl


def hbh_raw(next_header: int, options: bytes) -> bytes:
    assert (2 + len(options)) % 8 == 0
    return bytes([next_header, (2 + len(options)) // 8 - 1]) + options


def nodes(n: int) -> list[dict]:
    return [entry(64 - i, 0x10 + i, 100 + i, 200 + i, T + i, 1000 * i) for i in range(n)]


def trace_ok(name: str, hbh: bytes, nh: int, ns: int, slots: int, filled: list[dict], flags: int = 0, rem=None) -> dict:
    return {
        "name": name,
        "hex": hbh.hex(),
        "next_header": nh,
        "namespace_id": ns,
        "node_len": 4,
        "flags": flags,
        "remaining_len": 4 * (slots - len(filled)) if rem is None else rem,
        "trace_type": TRACE_TYPE,
        "slots": slots,
        "filled": len(filled),
        "nodes": filled,  # newest first (wire order)
    }


def trace_err(name: str, hbh: bytes, error: str) -> dict:
    return {"name": name, "hex": hbh.hex(), "error": error}


def kernel_vector() -> dict:
    cap = json.loads((OUT / "ioam_trace_kernel_capture.json").read_text())
    raw = bytes.fromhex(cap["hex"])
    # IOAM.md offsets: the option at 4, the data list at 16, the last entry is the sender's
    assert raw[2:4] == b"\x01\x00" and raw[4] == 0x31 and raw[5] == 10 + 16 * cap["slots"]
    assert struct.unpack_from("!H", raw, 8)[0] == cap["namespace_id"] and raw[11] & 0x7F == 0
    got = []
    for i in range(cap["slots"]):
        hn, i_if, o_if, sec, us = struct.unpack_from("!IHHII", raw, 16 + 16 * i)
        got.append(entry(hn >> 24, hn & 0xFFFFFF, i_if, o_if, sec, us))
    # the ground truth of the capture: who filled which entry, with what ids and hop limits ...
    for e, who in zip(got, ("D", "R", "sender")):
        want = cap[who]
        assert (e["hop_limit"], e["node_id"], e["ingress_if_id"], e["egress_if_id"]) == (
            want["hop_limit"],
            want["node_id"],
            want["in_if"],
            want["out_if"],
        ), who
    # ... and when: within the send's window, in the order the packet travelled
    us = [e["ts_sec"] * 1_000_000 + e["ts_subsec"] for e in got]
    assert cap["t0_tai_ns"] // 1000 <= us[2] <= us[1] <= us[0] <= cap["t1_tai_ns"] // 1000, us
    return trace_ok("kernel_filled_3_of_3", raw, raw[0], cap["namespace_id"], cap["slots"], got) | {
        "note": cap["note"] + f" (kernel {cap['kernel']})"
    }


def trace_vectors() -> dict:
    one, four, twelve = nodes(1), nodes(4), nodes(12)
    ra = b"\x05\x02\x00\x00"  # Router Alert, value 0
    decode = [
        trace_ok("ingress_1_slot", trace_hbh(43, 123, 1, one), 43, 123, 1, one),
        trace_ok("ingress_4_slots_after_doh", trace_hbh(60, 1, 4, one), 60, 1, 4, one),
        trace_ok("ingress_12_slots", trace_hbh(43, 65535, 12, one), 43, 65535, 12, one),
        trace_ok("empty_4_slots", trace_hbh(43, 0, 4, []), 43, 0, 4, []),
        trace_ok("full_4_of_4", trace_hbh(43, 123, 4, four), 43, 123, 4, four),
        trace_ok("full_12_of_12", trace_hbh(43, 123, 12, twelve), 43, 123, 12, twelve),
        trace_ok("overflow", trace_hbh(43, 123, 2, nodes(2), flags=0x8), 43, 123, 2, nodes(2), flags=0x8),
        trace_ok("all_flags", trace_hbh(43, 123, 2, one, flags=0xF), 43, 123, 2, one, flags=0xF),
        trace_ok("more_than_a_record_15", trace_hbh(17, 123, 15, nodes(15)), 17, 123, 15, nodes(15)),
        trace_ok("pad1_pad1_then_option", trace_hbh(43, 7, 2, one, pre=b"\x00\x00"), 43, 7, 2, one),
        trace_ok("option_then_router_alert", trace_hbh(43, 7, 2, one, post=ra), 43, 7, 2, one),
        trace_ok(
            "second_trace_ignored",
            trace_hbh(43, 7, 1, one, post=trace_option(8, 1, nodes(1))),
            43,
            7,
            1,
            one,
        ),
        kernel_vector(),
    ]
    errors = [
        trace_err("empty_buffer", b"", "truncated"),
        trace_err("one_byte", b"\x2b", "truncated"),
        trace_err("header_past_buffer", trace_hbh(43, 1, 2, one)[:-1], "truncated"),
        trace_err("option_past_header", hbh_raw(43, b"\x01\x00\x31\x06\x00\x00"), "bad_length"),
        trace_err("option_type_last_byte", hbh_raw(43, b"\x01\x03\x00\x00\x00\x31"), "bad_length"),
        trace_err("padding_8", trace_hbh(43, 1, 2, one, pre=b"\x01\x06" + bytes(6)), "bad_length"),
        trace_err("pad1_run_8", hbh_raw(43, bytes(14)), "bad_length"),
        trace_err("padn_not_zero", trace_hbh(43, 1, 2, one, pre=b"\x01\x02\x00\x01\x01\x02\x00\x00"), "bad_length"),
        trace_err("misaligned", trace_hbh(43, 1, 2, one, pre=b"\x01\x01\x00"), "bad_length"),
        # the short option, an unknown one (the run of padding restarts), PadN(5): a well-formed walk
        trace_err("opt_len_1", hbh_raw(43, b"\x01\x00\x31\x01\x00\x1e\x02\x00\x00\x01\x03\x00\x00\x00"), "bad_length"),
        trace_err("opt_len_8", hbh_raw(43, b"\x01\x00\x31\x08\x00\x00\x00\x7b\x20\x00\x01\x00\x01\x00"), "bad_length"),
        trace_err("remaining_beyond_data", trace_hbh(43, 1, 2, one, remaining=12), "bad_length"),
        trace_err("remaining_not_entries", trace_hbh(43, 1, 2, one, remaining=2), "bad_length"),
        trace_err("node_len_3", trace_hbh(43, 1, 2, one, node_len=3), "bad_length"),
        trace_err("data_20_bytes", trace_hbh(43, 1, 2, one, data=bytes(20), remaining=0), "bad_length"),
        trace_err("no_slot", trace_hbh(43, 1, 0, [], data=b"", remaining=0), "bad_length"),
        trace_err("17_options", hbh_raw(43, b"\x1e\x00" * 17 + b"\x01\x02\x00\x00"), "bad_length"),
        trace_err("only_padding", hbh_raw(43, b"\x01\x04\x00\x00\x00\x00"), "no_option"),
        trace_err("router_alert_only", hbh_raw(43, b"\x05\x02\x00\x00\x01\x00"), "no_option"),
        trace_err("ioam_option_type_2", trace_hbh(43, 1, 2, one, ioam_type=2), "unknown_type"),
        trace_err("trace_type_f80000", trace_hbh(43, 1, 2, one, trace_type=0xF80000), "unknown_type"),
    ]
    s_entry = entry(63, 0xABCDE, 10, 11, T, 999_999)
    encode = [
        {"name": "ingress_4", "next_header": 43, "namespace_id": 123, "slots": 4, "first": s_entry,
         "hex": trace_hbh(43, 123, 4, [s_entry]).hex()},
        {"name": "ingress_1_after_doh", "next_header": 60, "namespace_id": 1, "slots": 1, "first": s_entry,
         "hex": trace_hbh(60, 1, 1, [s_entry]).hex()},
        {"name": "ingress_12", "next_header": 43, "namespace_id": 65535, "slots": 12, "first": s_entry,
         "hex": trace_hbh(43, 65535, 12, [s_entry]).hex()},
        {"name": "empty_3", "next_header": 43, "namespace_id": 5, "slots": 3, "first": None,
         "hex": trace_hbh(43, 5, 3, []).hex()},
        {"name": "slots_0", "next_header": 43, "namespace_id": 5, "slots": 0, "first": None, "error": "space"},
        {"name": "slots_13", "next_header": 43, "namespace_id": 5, "slots": 13, "first": None, "error": "space"},
    ]  # fmt: skip
    return {"decode": decode + errors, "encode": encode}


def e2e_doh(
    next_header: int,
    namespace: int,
    seq: int,
    sec: int,
    nsec: int,
    *,
    e2e_type: int = E2E_TYPE,
    opt_len: int = 22,
    ioam_type: int = 3,
    pre: bytes = b"\x01\x00",
    post: bytes = b"\x01\x02\x00\x00",
) -> bytes:
    opt = struct.pack("!BBBBHHQII", 0x11, opt_len, 0, ioam_type, namespace, e2e_type, seq, sec, nsec)
    body = pre + opt + post
    assert (2 + len(body)) % 8 == 0
    return bytes([next_header, (2 + len(body)) // 8 - 1]) + body


def e2e_ok(name: str, doh: bytes, nh: int, ns: int, seq: int, sec: int, nsec: int) -> dict:
    return {
        "name": name,
        "hex": doh.hex(),
        "next_header": nh,
        "namespace_id": ns,
        "e2e_type": E2E_TYPE,
        "seq": seq,
        "ts_sec": sec,
        "ts_nsec": nsec,
    }


def e2e_vectors() -> dict:
    decode = [
        e2e_ok("segscope", e2e_doh(41, 123, 41, T, 123_456_789), 41, 123, 41, T, 123_456_789),
        e2e_ok("extremes", e2e_doh(6, 65535, U64, 2**32 - 1, 999_999_999), 6, 65535, U64, 2**32 - 1, 999_999_999),
        e2e_ok("zeros", e2e_doh(59, 0, 0, 0, 0), 59, 0, 0, 0, 0),
        e2e_ok(
            "option_at_8_then_other",
            e2e_doh(41, 9, 5, 6, 7, pre=b"\x01\x04\x00\x00\x00\x00", post=b"\x1e\x00\x01\x04\x00\x00\x00\x00"),
            41,
            9,
            5,
            6,
            7,
        ),
        {"name": "empty_buffer", "hex": "", "error": "truncated"},
        {"name": "header_past_buffer", "hex": e2e_doh(41, 1, 1, 1, 1)[:31].hex(), "error": "truncated"},
        {"name": "opt_len_21", "hex": e2e_doh(41, 1, 1, 1, 0x300, opt_len=21).hex(), "error": "bad_length"},
        {
            "name": "opt_len_4",
            "hex": hbh_raw(41, b"\x01\x00\x11\x04\x00\x03\x00\x01\x01\x02\x00\x00\x00\x00").hex(),
            "error": "bad_length",
        },
        {
            "name": "misaligned",
            "hex": e2e_doh(41, 1, 1, 1, 1, pre=b"\x00", post=b"\x01\x03\x00\x00\x00").hex(),
            "error": "bad_length",
        },
        {"name": "only_padding", "hex": hbh_raw(41, b"\x01\x04\x00\x00\x00\x00").hex(), "error": "no_option"},
        {"name": "altmark_only", "hex": hbh_raw(43, b"\x12\x04\x00\x00\x70\x00").hex(), "error": "no_option"},
        {"name": "ioam_option_type_2", "hex": e2e_doh(41, 1, 1, 1, 1, ioam_type=2).hex(), "error": "unknown_type"},
        {"name": "e2e_type_8000", "hex": e2e_doh(41, 1, 1, 1, 1, e2e_type=0x8000).hex(), "error": "unknown_type"},
        {"name": "nsec_1e9", "hex": e2e_doh(41, 1, 1, 1, NS).hex(), "error": "bad_timestamp"},
    ]
    encode = [
        {"name": "segscope", "next_header": 41, "namespace_id": 123, "seq": 41, "ts_sec": T, "ts_nsec": 123_456_789,
         "hex": e2e_doh(41, 123, 41, T, 123_456_789).hex()},
        {"name": "extremes", "next_header": 6, "namespace_id": 65535, "seq": U64, "ts_sec": 2**32 - 1,
         "ts_nsec": 999_999_999, "hex": e2e_doh(6, 65535, U64, 2**32 - 1, 999_999_999).hex()},
        {"name": "nsec_1e9", "next_header": 41, "namespace_id": 1, "seq": 0, "ts_sec": 0, "ts_nsec": NS,
         "error": "space"},
    ]  # fmt: skip
    return {"decode": decode, "encode": encode}


def main() -> None:
    batches()
    for name, vec in (("ioam_trace_option", trace_vectors()), ("ioam_e2e_option", e2e_vectors())):
        (OUT / f"{name}.json").write_text(json.dumps(vec, indent=1) + "\n")
    print(f"wrote ioam_batch_*.hex/.json, ioam_trace_option.json, ioam_e2e_option.json in {OUT}")


if __name__ == "__main__":
    main()
