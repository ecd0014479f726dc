#!/usr/bin/env python3
"""Write schemas/vectors/altmark_block.json: altmark_block records, altmark_batch
messages and counter deltas with their expected decode, packed with plain struct
calls at the offsets documented in schemas/c/altmark_block.h (independent of
segscope_schemas.altmark_block, so the vectors test both codecs).

Run: python3 schemas/vectors/make_altmark_vectors.py
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

OUT = Path(__file__).resolve().parent / "altmark_block.json"
REC = struct.Struct("<QQQQQIIBBBBHHQ")
HDR = struct.Struct("<4sHHIIQ32s")
FIELDS = (
    "block_index",
    "block_start_ns",
    "packets",
    "bytes",
    "boot_id",
    "flow_id",
    "period_ms",
    "direction",
    "colour",
    "method",
    "reserved0",
    "flags",
    "dmark_packets",
    "dmark_ts_sum_ns",
)
MS = 1_000_000
U64 = (1 << 64) - 1


def rec(name, check="ok", **kw):
    r = dict(
        block_index=0,
        block_start_ns=0,
        packets=0,
        bytes=0,
        boot_id=0,
        flow_id=0,
        period_ms=1000,
        direction=1,
        colour=0,
        method=1,
        reserved0=0,
        flags=0,
        dmark_packets=0,
        dmark_ts_sum_ns=0,
    )
    r.update(kw)
    raw = REC.pack(*(r[f] for f in FIELDS))
    return {"name": name, "hex": raw.hex(), "check": check, "fields": r}


def block(idx, period_ms, **kw):
    return dict(block_index=idx, block_start_ns=idx * period_ms * MS, colour=idx & 1, period_ms=period_ms, **kw)


# 2026-11-22T00:00:00 TAI-ish, period 1 s: an ordinary block
T = 1_795_305_600
records = [
    rec(
        "tx_dscp",
        **block(T, 1000, packets=1000, bytes=1_200_000, boot_id=0x1122334455667788, flow_id=7, direction=1, method=1),
    ),
    rec(
        "rx_rfc9343_odd",
        **block(T + 1, 1000, packets=999, bytes=1_198_800, boot_id=42, flow_id=0xFFFFF, direction=2, method=2),
    ),
    rec("partial", **block(17, 250, packets=3, bytes=300, boot_id=9, flow_id=1, flags=1)),
    rec(
        "extremes",
        **block(
            U64 // (4_294_967_295 * MS),
            4_294_967_295,
            packets=U64,
            bytes=U64,
            boot_id=U64,
            flow_id=0xFFFFFFFF,
            direction=2,
            method=1,
        ),
    ),
    rec("bad_direction", "bad_direction", **block(4, 100, direction=3)),
    rec("bad_method", "bad_method", **block(4, 100, method=0)),
    rec("bad_colour", "bad_colour", **dict(block(4, 100), colour=2)),
    rec("zero_period", "zero_period", block_index=0, block_start_ns=0, period_ms=0),
    rec("start_not_multiple", "bad_block_start", **dict(block(4, 100), block_start_ns=4 * 100 * MS + 1)),
    rec("start_other_block", "bad_block_start", **dict(block(4, 100), block_index=5, colour=1)),
    rec("colour_mismatch", "colour_mismatch", **dict(block(4, 100), colour=1)),
    rec("flowmonid_21_bits", "flow_id_too_big", **block(4, 100, method=2, flow_id=0x100000)),
    rec("unknown_flags", "unknown_flags", **block(4, 100, flags=0x8000)),
    # double marking (RFC 9341): 10 D-marked packets and the delta of their TAI timestamp sum
    rec(
        "tx_dmark",
        **block(
            T,
            1000,
            packets=1000,
            bytes=1_200_000,
            boot_id=5,
            flow_id=7,
            dmark_packets=10,
            dmark_ts_sum_ns=10 * T * 1_000_000_000 + 4_500_000_000,
        ),
    ),
    rec(
        "rx_dmark_max",
        **block(
            T,
            1000,
            packets=65535,
            bytes=65535 * 100,
            boot_id=6,
            flow_id=0xFFFFF,
            direction=2,
            method=2,
            dmark_packets=0xFFFF,
            dmark_ts_sum_ns=U64,
        ),
    ),
]


def batch(name, node, seq, recs, error=None, c_error=None, raw=None):
    body = b"".join(bytes.fromhex(r["hex"]) for r in recs)
    if raw is None:
        raw = HDR.pack(b"AMB1", 56, 64, len(recs), 0, seq, node.encode()) + body
    out = {"name": name, "hex": raw.hex()}
    if error:
        out.update(error=error, c_error=c_error)
    else:
        out.update(node=node, batch_seq=seq, record_count=len(recs), records=[r["name"] for r in recs])
    return out


two = records[:2]
batches = [
    batch("empty", "A", 0, []),
    batch("two", "edge-A", 7, two),
    batch("node_32_bytes", "n" * 32, U64, records[2:4]),
    batch("short_header", "", 0, [], "short_header", "EMSGSIZE", raw=b"AMB1" + bytes(40)),
    batch("bad_magic", "", 0, [], "bad_magic", "EBADMSG", raw=HDR.pack(b"SSB1", 56, 64, 0, 0, 1, b"A")),
    batch("bad_header_size", "", 0, [], "bad_header_size", "EBADMSG", raw=HDR.pack(b"AMB1", 40, 64, 0, 0, 1, b"A")),
    batch("bad_record_size", "", 0, [], "bad_record_size", "EBADMSG", raw=HDR.pack(b"AMB1", 56, 48, 0, 0, 1, b"A")),
    batch(
        "count_too_big",
        "",
        0,
        [],
        "length_mismatch",
        "EMSGSIZE",
        raw=HDR.pack(b"AMB1", 56, 64, 2, 0, 1, b"A") + bytes.fromhex(records[0]["hex"]),
    ),
    batch(
        "trailing_byte",
        "",
        0,
        [],
        "length_mismatch",
        "EMSGSIZE",
        raw=HDR.pack(b"AMB1", 56, 64, 1, 0, 1, b"A") + bytes.fromhex(records[0]["hex"]) + b"\0",
    ),
]

deltas = [
    {"prev": 10, "cur": 25, "bits": 64, "delta": 15},
    {"prev": 0, "cur": 0, "bits": 64, "delta": 0},
    {"prev": U64 - 4, "cur": 3, "bits": 64, "delta": 8},
    {"prev": U64, "cur": 0, "bits": 64, "delta": 1},
    {"prev": 0xFFFFFFF0, "cur": 0x10, "bits": 32, "delta": 0x20},
    {"prev": 5, "cur": 5 + (1 << 32), "bits": 32, "delta": 0},
]

# mean one-way delay from the tx/rx double-marking fields: (rx_sum - tx_sum) mod 2^64 as a signed
# int64 divided (truncating toward 0) by n, defined only when tx_n == rx_n == n > 0
dmark_delays = [
    {
        "name": "ordinary",
        "tx_n": 10,
        "tx_sum": 10 * T * 10**9,
        "rx_n": 10,
        "rx_sum": 10 * T * 10**9 + 15_000,
        "ok": 1,
        "delay_ns": 1500,
    },
    {"name": "sum_wrapped", "tx_n": 2, "tx_sum": U64 - 99, "rx_n": 2, "rx_sum": 100, "ok": 1, "delay_ns": 100},
    {"name": "negative_truncates", "tx_n": 3, "tx_sum": 1000, "rx_n": 3, "rx_sum": 990, "ok": 1, "delay_ns": -3},
    {"name": "none_marked", "tx_n": 0, "tx_sum": 0, "rx_n": 0, "rx_sum": 0, "ok": 0, "delay_ns": 0},
    {"name": "marked_packet_lost", "tx_n": 5, "tx_sum": 500, "rx_n": 4, "rx_sum": 900, "ok": 0, "delay_ns": 0},
]

OUT.write_text(
    json.dumps({"records": records, "batches": batches, "deltas": deltas, "dmark_delays": dmark_delays}, indent=1)
    + "\n"
)
print(
    f"wrote {OUT} ({len(records)} records, {len(batches)} batches, {len(deltas)} deltas, "
    f"{len(dmark_delays)} dmark delays)"
)
