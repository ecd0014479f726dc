"""The IOAM Pre-allocated Trace option in a Hop-by-Hop header: mirror of schemas/c/ioam_trace_option.h.

segscope's ingress edge writes PadN(2) and the option (type 0x31) with room for `slots` 16-byte
node entries of trace type 0xF00000 (hop limit + node id, ingress/egress interface id, timestamp
seconds and subseconds), its own entry in the last slot; every IOAM node fills the entry before
the last one filled (schemas/IOAM.md). decode_hbh() applies the egress program's rules in its order.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from segscope_schemas.ipv6_options import (
    BAD_LENGTH,
    IOAM_OPTION_PREALLOC_TRACE,
    OPT_PADN,
    SPACE,
    UNKNOWN_TYPE,
    MalformedIoam,
    find_option,
)

HBH_OPT_TYPE = 0x31
TRACE_TYPE_SEGSCOPE = 0xF00000
NODE_LEN = 4  # 4-octet units per entry of that trace type
ENTRY_SIZE = 16
OPT_FIXED = 10  # Opt Data Len without the data list
DATA_OFF = 16  # the data list's offset in segscope's HBH
MAX_SLOTS = 12  # segscope's traces (ioam_tx --trace-nodes)
FLAG_OVERFLOW = 0x8
IF_ID_UNAVAILABLE = 0xFFFF
NODE_ID_MAX = 0xFFFFFF
_ENTRY = struct.Struct("!IHHII")


def hbh_len(slots: int) -> int:
    return DATA_OFF + ENTRY_SIZE * slots


@dataclass(frozen=True)
class TraceNode:
    """One node entry (host order)."""

    hop_limit: int
    node_id: int
    ingress_if_id: int
    egress_if_id: int
    ts_sec: int
    ts_subsec: int  # microseconds (the Linux kernel's format)

    def encode(self) -> bytes:
        return _ENTRY.pack(
            self.hop_limit << 24 | (self.node_id & NODE_ID_MAX),
            self.ingress_if_id,
            self.egress_if_id,
            self.ts_sec,
            self.ts_subsec,
        )

    @classmethod
    def decode(cls, raw: bytes | memoryview) -> TraceNode:
        hn, i, o, s, us = _ENTRY.unpack_from(raw, 0)
        return cls(hn >> 24, hn & NODE_ID_MAX, i, o, s, us)


@dataclass(frozen=True)
class Trace:
    """A decoded Hop-by-Hop header holding a trace."""

    next_header: int
    hbh_len: int
    opt_off: int
    namespace_id: int
    node_len: int
    flags: int
    remaining_len: int
    trace_type: int
    slots: int
    filled: int
    nodes: tuple[TraceNode, ...]  # the filled entries, newest first (wire order)

    @property
    def overflow(self) -> bool:
        return bool(self.flags & FLAG_OVERFLOW)


def encode_hbh(next_header: int, namespace_id: int, slots: int, first: TraceNode | None = None) -> bytes:
    """segscope's HBH: PadN(2), the trace with `slots` empty entries, `first` in the last one."""
    if not 1 <= slots <= MAX_SLOTS:
        raise MalformedIoam(SPACE, f"slots {slots} not in 1..{MAX_SLOTS}")
    length = hbh_len(slots)
    remaining = NODE_LEN * (slots - 1 if first else slots)
    out = bytearray(length)
    out[0:12] = struct.pack(
        "!BBBBBBBBHBB",
        next_header,
        length // 8 - 1,
        OPT_PADN,
        0,
        HBH_OPT_TYPE,
        OPT_FIXED + ENTRY_SIZE * slots,
        0,
        IOAM_OPTION_PREALLOC_TRACE,
        namespace_id,
        NODE_LEN << 3,
        remaining,
    )
    out[12:15] = TRACE_TYPE_SEGSCOPE.to_bytes(3, "big")
    if first:
        out[length - ENTRY_SIZE :] = first.encode()
    return bytes(out)


def decode_hbh(buf: bytes | memoryview) -> Trace:
    """Decode the HBH at buf[0:] by the rules of ioam_trace_option.h; raises MalformedIoam."""
    off = find_option(buf, HBH_OPT_TYPE)
    opt_len = buf[off + 1]
    if opt_len < 2:
        raise MalformedIoam(BAD_LENGTH, f"Opt Data Len {opt_len} < 2")
    if buf[off + 3] != IOAM_OPTION_PREALLOC_TRACE:
        raise MalformedIoam(UNKNOWN_TYPE, f"IOAM Option-Type {buf[off + 3]}, not Pre-allocated Trace")
    if opt_len < OPT_FIXED:
        raise MalformedIoam(BAD_LENGTH, f"Opt Data Len {opt_len} < {OPT_FIXED}")
    ns, b6, b7 = struct.unpack_from("!HBB", buf, off + 4)
    trace_type = int.from_bytes(buf[off + 8 : off + 11], "big")
    node_len, flags, remaining = b6 >> 3, (b6 & 7) << 1 | b7 >> 7, b7 & 0x7F
    data_len = opt_len - OPT_FIXED
    if remaining * 4 > data_len:
        raise MalformedIoam(BAD_LENGTH, f"RemainingLen {remaining} beyond a data list of {data_len} bytes")
    if trace_type != TRACE_TYPE_SEGSCOPE:
        raise MalformedIoam(UNKNOWN_TYPE, f"IOAM-Trace-Type 0x{trace_type:06x}")
    if node_len != NODE_LEN or data_len % ENTRY_SIZE or remaining % NODE_LEN or not data_len:
        raise MalformedIoam(BAD_LENGTH, f"NodeLen {node_len}, data list {data_len} bytes, RemainingLen {remaining}")
    slots = data_len // ENTRY_SIZE
    filled = slots - remaining // NODE_LEN
    first = off + 2 + OPT_FIXED + remaining * 4
    nodes = tuple(TraceNode.decode(buf[first + ENTRY_SIZE * i : first + ENTRY_SIZE * (i + 1)]) for i in range(filled))
    return Trace(buf[0], (buf[1] + 1) * 8, off, ns, node_len, flags, remaining, trace_type, slots, filled, nodes)
