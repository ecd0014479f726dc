"""The IOAM Edge-to-Edge option in a Destination Options header: mirror of schemas/c/ioam_e2e_option.h.

segscope's ingress edge writes a 32-byte DOH after the SRH: PadN(2), the option (type 0x11, IOAM
Option-Type 3, E2E-Type 0xB000: 64-bit sequence number, timestamp seconds and nanoseconds, PTPv2
truncated TAI), PadN(4) (schemas/IOAM.md). decode_doh() applies the egress program's rules in
its order (the Namespace-ID is the caller's to check against the flow's).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from segscope_schemas.ipv6_options import (
    BAD_LENGTH,
    BAD_TIMESTAMP,
    IOAM_OPTION_E2E,
    SPACE,
    UNKNOWN_TYPE,
    MalformedIoam,
    find_option,
)

DOH_OPT_TYPE = 0x11
E2E_TYPE_SEGSCOPE = 0xB000
OPT_DATA_LEN = 22
DOH_LEN = 32
NS_PER_SEC = 1_000_000_000
_DOH = struct.Struct("!BBBBBBBBHHQII4s")


@dataclass(frozen=True)
class E2E:
    next_header: int
    doh_len: int
    opt_off: int
    namespace_id: int
    e2e_type: int
    seq: int
    ts_sec: int  # TAI seconds, low 32 bits
    ts_nsec: int

    @property
    def tai_ns(self) -> int:
        return self.ts_sec * NS_PER_SEC + self.ts_nsec


def encode_doh(next_header: int, namespace_id: int, seq: int, ts_sec: int, ts_nsec: int) -> bytes:
    if not 0 <= ts_nsec < NS_PER_SEC:
        raise MalformedIoam(SPACE, f"nanoseconds {ts_nsec} not in 0..999999999")
    return _DOH.pack(
        next_header, DOH_LEN // 8 - 1, 1, 0, DOH_OPT_TYPE, OPT_DATA_LEN, 0, IOAM_OPTION_E2E,
        namespace_id, E2E_TYPE_SEGSCOPE, seq, ts_sec, ts_nsec, b"\x01\x02\x00\x00",
    )  # fmt: skip


def decode_doh(buf: bytes | memoryview) -> E2E:
    """Decode the DOH at buf[0:] by the rules of ioam_e2e_option.h; raises MalformedIoam."""
    off = find_option(buf, DOH_OPT_TYPE)
    opt_len = buf[off + 1]
    if opt_len < 6:
        raise MalformedIoam(BAD_LENGTH, f"Opt Data Len {opt_len} < 6")
    if buf[off + 3] != IOAM_OPTION_E2E:
        raise MalformedIoam(UNKNOWN_TYPE, f"IOAM Option-Type {buf[off + 3]}, not Edge-to-Edge")
    ns, e2e_type = struct.unpack_from("!HH", buf, off + 4)
    if e2e_type != E2E_TYPE_SEGSCOPE:
        raise MalformedIoam(UNKNOWN_TYPE, f"IOAM-E2E-Type 0x{e2e_type:04x}")
    if opt_len != OPT_DATA_LEN:
        raise MalformedIoam(BAD_LENGTH, f"Opt Data Len {opt_len}, E2E-Type 0xB000 has {OPT_DATA_LEN}")
    seq, sec, nsec = struct.unpack_from("!QII", buf, off + 8)
    if nsec >= NS_PER_SEC:
        raise MalformedIoam(BAD_TIMESTAMP, f"subseconds {nsec} >= 10^9")
    return E2E(buf[0], (buf[1] + 1) * 8, off, ns, e2e_type, seq, sec, nsec)
