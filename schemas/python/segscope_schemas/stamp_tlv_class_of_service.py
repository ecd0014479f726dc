"""Class of Service TLV, Type 4 (RFC 8972 §4.4). Mirror of schemas/c/stamp_tlv_class_of_service.h.

Value (Length 4): DSCP1 (6) | DSCP2 (6) | ECN (2) | RP (2) | Reserved (16).
Sender: DSCP1 = the DSCP it asks the reflector to use on the reflected packet; DSCP2, ECN, RP = 0.
Reflector duty: DSCP2 = DSCP of the received packet, ECN = ECN of the received packet, RP = 1 when
it could not use DSCP1 for the reflected packet (0 when it did), DSCP1 returned unchanged.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .stamp_tlv import E_LENGTH, MalformedTLV, encode_tlv, split_tlv
from .stamp_tlv import TYPE_CLASS_OF_SERVICE as TYPE

LENGTH = 4
_V = struct.Struct("!HH")


@dataclass
class ClassOfService:
    dscp1: int = 0
    dscp2: int = 0
    ecn: int = 0
    rp: int = 0
    flags: int = 0

    def encode(self) -> bytes:
        if not (0 <= self.dscp1 < 64 and 0 <= self.dscp2 < 64 and 0 <= self.ecn < 4 and 0 <= self.rp < 4):
            raise ValueError("DSCP is 6-bit, ECN and RP 2-bit")
        word = (self.dscp1 << 10) | (self.dscp2 << 4) | (self.ecn << 2) | self.rp
        return encode_tlv(TYPE, _V.pack(word, 0), self.flags)

    @classmethod
    def decode(cls, buf: bytes) -> "ClassOfService":
        flags, value = split_tlv(buf, TYPE)
        if len(value) != LENGTH:
            raise MalformedTLV(E_LENGTH, f"Class of Service Length {len(value)}, expected {LENGTH}")
        word, _ = _V.unpack(value)
        return cls(word >> 10, (word >> 4) & 0x3F, (word >> 2) & 3, word & 3, flags)


def value_ok(value: bytes) -> bool:
    return len(value) == LENGTH


def reflect(value: bytes, received_tos: int, dscp1_applied: bool) -> bytes:
    """Reflector: fill DSCP2/ECN from the received TOS/Traffic Class byte, RP from whether DSCP1 was used."""
    word, _ = _V.unpack(value)
    dscp1 = word >> 10
    word = (dscp1 << 10) | ((received_tos >> 2) << 4) | ((received_tos & 3) << 2) | (0 if dscp1_applied else 1)
    return _V.pack(word, 0)
