"""Direct Measurement TLV, Type 5 (RFC 8972 §4.5). Mirror of schemas/c/stamp_tlv_direct_measurement.h.

Value (Length 12): Session-Sender Tx counter S_TxC (32) | Session-Reflector Rx counter R_RxC (32) |
Session-Reflector Tx counter R_TxC (32). The sender fills S_TxC and zeroes the rest; the reflector
fills R_RxC (packets it received in the session, this one included) and R_TxC (packets it sent).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .stamp_tlv import E_LENGTH, MalformedTLV, encode_tlv, split_tlv
from .stamp_tlv import TYPE_DIRECT_MEASUREMENT as TYPE

LENGTH = 12
_V = struct.Struct("!III")


@dataclass
class DirectMeasurement:
    s_tx: int = 0
    r_rx: int = 0
    r_tx: int = 0
    flags: int = 0

    def encode(self) -> bytes:
        return encode_tlv(TYPE, _V.pack(self.s_tx, self.r_rx, self.r_tx), self.flags)

    @classmethod
    def decode(cls, buf: bytes) -> "DirectMeasurement":
        flags, value = split_tlv(buf, TYPE)
        if len(value) != LENGTH:
            raise MalformedTLV(E_LENGTH, f"Direct Measurement Length {len(value)}, expected {LENGTH}")
        return cls(*_V.unpack(value), flags=flags)


def value_ok(value: bytes) -> bool:
    return len(value) == LENGTH


def reflect(value: bytes, r_rx: int, r_tx: int) -> bytes:
    s_tx = _V.unpack(value)[0]
    return _V.pack(s_tx, r_rx & 0xFFFFFFFF, r_tx & 0xFFFFFFFF)
