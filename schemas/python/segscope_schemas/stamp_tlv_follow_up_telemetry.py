"""Follow-Up Telemetry TLV, Type 7 (RFC 8972 §4.7). Mirror of schemas/c/stamp_tlv_follow_up_telemetry.h.

Value (Length 16): Sequence Number (32) | Follow-Up Timestamp (64: sec 32 + fraction 32, in the
session's format) | Timestamp M (8, timestamping method) | Reserved (24).
The sender zeroes it; the reflector reports the sequence number and the (more accurate) transmit
timestamp of the packet it reflected *before* this one, and how that timestamp was taken.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .stamp_tlv import E_LENGTH, MalformedTLV, encode_tlv, split_tlv
from .stamp_tlv import TYPE_FOLLOW_UP_TELEMETRY as TYPE

LENGTH = 16
_V = struct.Struct("!IIIB3s")


@dataclass
class FollowUpTelemetry:
    seq: int = 0
    ts_sec: int = 0
    ts_frac: int = 0
    ts_method: int = 0
    flags: int = 0

    def encode(self) -> bytes:
        return encode_tlv(TYPE, _V.pack(self.seq, self.ts_sec, self.ts_frac, self.ts_method, bytes(3)), self.flags)

    @classmethod
    def decode(cls, buf: bytes) -> "FollowUpTelemetry":
        flags, value = split_tlv(buf, TYPE)
        if len(value) != LENGTH:
            raise MalformedTLV(E_LENGTH, f"Follow-Up Telemetry Length {len(value)}, expected {LENGTH}")
        seq, sec, frac, method, _ = _V.unpack(value)
        return cls(seq, sec, frac, method, flags)


def value_ok(value: bytes) -> bool:
    return len(value) == LENGTH
