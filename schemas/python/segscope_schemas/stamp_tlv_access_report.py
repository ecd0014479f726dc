"""Access Report TLV, Type 6 (RFC 8972 §4.6). Mirror of schemas/c/stamp_tlv_access_report.h.

Value (Length 4): ID (4) | Resv (4) | Return Code (8) | Reserved (16).
ID: the access network (1 = 3GPP, 2 = non-3GPP); Return Code (IANA "STAMP Return Codes"):
1 Network available, 2 Network unavailable. Sent by the Session-Sender; the reflector returns it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .stamp_tlv import E_LENGTH, MalformedTLV, encode_tlv, split_tlv
from .stamp_tlv import TYPE_ACCESS_REPORT as TYPE

LENGTH = 4
ID_3GPP = 1
ID_NON_3GPP = 2
RC_NETWORK_AVAILABLE = 1
RC_NETWORK_UNAVAILABLE = 2
_V = struct.Struct("!BBH")


@dataclass
class AccessReport:
    id: int = 0
    return_code: int = 0
    flags: int = 0

    def encode(self) -> bytes:
        if not 0 <= self.id < 16:
            raise ValueError("ID is 4-bit")
        return encode_tlv(TYPE, _V.pack(self.id << 4, self.return_code, 0), self.flags)

    @classmethod
    def decode(cls, buf: bytes) -> "AccessReport":
        flags, value = split_tlv(buf, TYPE)
        if len(value) != LENGTH:
            raise MalformedTLV(E_LENGTH, f"Access Report Length {len(value)}, expected {LENGTH}")
        b0, rc, _ = _V.unpack(value)
        return cls(b0 >> 4, rc, flags)


def value_ok(value: bytes) -> bool:
    return len(value) == LENGTH
