"""STAMP TLV header, TLV-area iteration and the Session-Reflector flag rules (RFC 8972 §4).

Mirror of schemas/c/stamp_tlv.h. Every TLV is

    STAMP TLV Flags (8) | Type (8) | Length (16, = length of Value) | Value

Flags (RFC 8972 §4, IANA "STAMP TLV Flags"): bit 0 (MSB) U Unrecognized, bit 1 M Malformed,
bit 2 I Integrity check failed, bits 3-7 reserved (zero on transmit, ignored on receipt).
The TLV area starts after the base packet: 44 bytes unauthenticated (RFC 8762 §4.2.1/§4.3.1),
112 bytes authenticated (§4.2.2/§4.3.2); callers pass that offset.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

FLAG_U = 0x80  # Unrecognized: the reflector did not understand the Type
FLAG_M = 0x40  # Malformed: Length not valid for the Type, or the TLV runs past the packet
FLAG_I = 0x20  # Integrity: the STAMP extensions failed HMAC verification
FLAG_RESERVED = 0x1F
SENDER_FLAGS = FLAG_U  # RFC 8972 §4: the Session-Sender sends every TLV with U = 1

HDR = struct.Struct("!BBH")
HDR_LEN = HDR.size  # 4
BASE_LEN_UNAUTH = 44  # RFC 8762 §4.2.1 / §4.3.1
BASE_LEN_AUTH = 112  # RFC 8762 §4.2.2 / §4.3.2

# IANA "STAMP TLV Types" (RFC 8972 §5.1, RFC 9503 §5)
TYPE_EXTRA_PADDING = 1
TYPE_LOCATION = 2
TYPE_TIMESTAMP_INFO = 3
TYPE_CLASS_OF_SERVICE = 4
TYPE_DIRECT_MEASUREMENT = 5
TYPE_ACCESS_REPORT = 6
TYPE_FOLLOW_UP_TELEMETRY = 7
TYPE_HMAC = 8
TYPE_DEST_NODE_ADDR = 9
TYPE_RETURN_PATH = 10

# error kinds (same names as the C STAMP_TLV_E* codes)
E_SHORT = "short"  # buffer shorter than a header, or than header + Length
E_TRAILING = "trailing"  # 1..3 bytes left after the last TLV: not even a header
E_OVERRUN = "overrun"  # a TLV's Length runs past the end of the area
E_TYPE = "type"  # decoder called on a TLV of another Type
E_LENGTH = "length"  # Length not valid for this Type (RFC 8972 §4: M flag)
E_VALUE = "value"  # Value not valid (bad sub-TLV, address family, ...)


class MalformedTLV(ValueError):
    """A TLV or TLV area that cannot be decoded; .kind is one of the E_* names."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind


@dataclass(frozen=True)
class TLV:
    flags: int
    type: int
    value: bytes
    offset: int = 0  # offset of the header in the buffer it was read from

    @property
    def length(self) -> int:
        return len(self.value)

    def encode(self) -> bytes:
        return encode_tlv(self.type, self.value, self.flags)


def encode_tlv(tlv_type: int, value: bytes, flags: int = 0) -> bytes:
    if not (0 <= tlv_type <= 255 and 0 <= flags <= 255):
        raise ValueError("flags and type are 8-bit")
    if len(value) > 0xFFFF:
        raise ValueError(f"value of {len(value)} bytes does not fit the 16-bit Length")
    return HDR.pack(flags, tlv_type, len(value)) + bytes(value)


def iter_tlvs(buf: bytes, offset: int = BASE_LEN_UNAUTH, end: Optional[int] = None) -> Iterator[TLV]:
    """Yield the TLVs of buf[offset:end]; raise MalformedTLV at the first one that does not fit."""
    end = len(buf) if end is None else end
    if offset > end:
        raise MalformedTLV(E_SHORT, f"TLV area offset {offset} is past the end {end}")
    off = offset
    while off < end:
        if end - off < HDR_LEN:
            raise MalformedTLV(E_TRAILING, f"{end - off} byte(s) at offset {off} are shorter than a TLV header")
        flags, tlv_type, length = HDR.unpack_from(buf, off)
        if length > end - off - HDR_LEN:
            raise MalformedTLV(
                E_OVERRUN,
                f"TLV type {tlv_type} at offset {off} has Length {length} "
                f"but only {end - off - HDR_LEN} byte(s) follow",
            )
        yield TLV(flags, tlv_type, bytes(buf[off + HDR_LEN : off + HDR_LEN + length]), off)
        off += HDR_LEN + length


def parse_tlvs(buf: bytes, offset: int = BASE_LEN_UNAUTH) -> list[TLV]:
    return list(iter_tlvs(buf, offset))


def iter_sub_tlvs(value: bytes, offset: int = 0) -> Iterator[TLV]:
    """Sub-TLVs inside a TLV's Value: a sub-TLV area that does not parse makes the Value invalid."""
    try:
        yield from iter_tlvs(value, offset)
    except MalformedTLV as e:
        raise MalformedTLV(E_VALUE, f"sub-TLVs: {e}") from None


def split_tlv(buf: bytes, expected_type: int) -> tuple[int, bytes]:
    """One whole TLV of expected_type in buf (nothing after it): return (flags, value)."""
    if len(buf) < HDR_LEN:
        raise MalformedTLV(E_SHORT, f"{len(buf)} byte(s) is shorter than a TLV header")
    flags, tlv_type, length = HDR.unpack_from(buf, 0)
    if tlv_type != expected_type:
        raise MalformedTLV(E_TYPE, f"type {tlv_type}, expected {expected_type}")
    if length > len(buf) - HDR_LEN:
        raise MalformedTLV(E_SHORT, f"Length {length} but {len(buf) - HDR_LEN} byte(s) of value")
    if length < len(buf) - HDR_LEN:
        raise MalformedTLV(E_SHORT, f"{len(buf) - HDR_LEN - length} byte(s) after the TLV")
    return flags, bytes(buf[HDR_LEN:])


# ---- Session-Reflector rules (RFC 8972 §4) ------------------------------------------------


def reflected_flags(understood: bool, malformed: bool, integrity_failed: bool) -> int:
    """Flags the reflector writes: U/M/I from its own verdict, reserved bits zero (§4)."""
    return (0 if understood else FLAG_U) | (FLAG_M if malformed else 0) | (FLAG_I if integrity_failed else 0)


def mark_unknown(area: bytearray, off: int) -> None:
    area[off] = reflected_flags(understood=False, malformed=False, integrity_failed=False)


def mark_malformed(area: bytearray, off: int) -> None:
    area[off] = (area[off] & FLAG_U) | FLAG_M


def mark_integrity_failed(area: bytearray, off: int) -> None:
    area[off] |= FLAG_I


# value_check(type, value) -> None: Type not understood; True: well formed; False: malformed
ValueCheck = Callable[[int, bytes], Optional[bool]]
# hmac_verify(text, hmac16) -> bool; text = base Sequence Number + the TLVs before the HMAC TLV
HmacVerify = Callable[[bytes, bytes], bool]


@dataclass
class ReflectResult:
    tlvs: int = 0  # TLVs whose header was read
    unknown: int = 0  # TLVs echoed with U set
    malformed_at: Optional[int] = None  # offset (in the packet) of the TLV flagged M
    integrity_failed: bool = False  # I set on every TLV
    error: Optional[str] = None  # E_TRAILING / E_OVERRUN when the area itself is broken
    hmac_offset: Optional[int] = None  # offset of the HMAC TLV, when present
    understood_offsets: list[int] = field(default_factory=list)


def reflect_tlvs(
    packet: bytes, offset: int, value_check: ValueCheck, hmac_verify: Optional[HmacVerify] = None
) -> tuple[bytearray, ReflectResult]:
    """Apply RFC 8972 §4 to the TLV area of a received packet; return (reflected copy, result).

    - understood Type with a valid Length/Value: U=M=I=0 (the per-TLV reflect helpers then fill
      the reflector's fields);
    - unknown Type: echoed unchanged with U=1;
    - malformed (Length invalid for a known Type, or the TLV runs past the packet): M=1 on that
      TLV, processing stops, the rest of the packet is returned unchanged;
    - 1..3 trailing bytes (no room for a header): copied unchanged, error E_TRAILING;
    - HMAC TLV present and hmac_verify given: verified on the bytes as received; on failure
      I=1 on every TLV header the reflector processed.
    Never reads past len(packet); the reflected copy has the same length as the packet.
    TLVs after the HMAC TLV are not covered by it (RFC 8972 §4.8 puts the HMAC TLV last).
    """
    out = bytearray(packet)
    res = ReflectResult()
    end = len(packet)
    if offset > end or offset < 4:  # the base packet holds at least the Sequence Number
        res.error = E_SHORT
        return out, res
    headers: list[int] = []
    off = offset
    while off < end:
        if end - off < HDR_LEN:
            res.error = E_TRAILING
            break
        _, tlv_type, length = HDR.unpack_from(packet, off)
        res.tlvs += 1
        headers.append(off)
        if length > end - off - HDR_LEN:
            res.error = E_OVERRUN
            res.malformed_at = off
            out[off] = reflected_flags(True, True, False)
            break
        value = bytes(packet[off + HDR_LEN : off + HDR_LEN + length])
        verdict = value_check(tlv_type, value)
        if verdict is None:
            res.unknown += 1
            out[off] = reflected_flags(False, False, False)
        elif verdict is False:
            out[off] = reflected_flags(True, True, False)
            res.malformed_at = off
            break
        else:
            out[off] = reflected_flags(True, False, False)
            res.understood_offsets.append(off)
            if tlv_type == TYPE_HMAC and res.hmac_offset is None:
                res.hmac_offset = off
        off += HDR_LEN + length
    if res.hmac_offset is not None and hmac_verify is not None:
        text = bytes(packet[0:4]) + bytes(packet[offset : res.hmac_offset])
        mac = bytes(packet[res.hmac_offset + HDR_LEN : res.hmac_offset + HDR_LEN + 16])
        if not hmac_verify(text, mac):
            res.integrity_failed = True
            for h in headers:
                mark_integrity_failed(out, h)
    return out, res
