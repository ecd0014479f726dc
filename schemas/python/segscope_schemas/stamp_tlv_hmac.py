"""HMAC TLV, Type 8 (RFC 8972 §4.8). Mirror of schemas/c/stamp_tlv_hmac.h.

Value (Length 16): HMAC, HMAC-SHA-256 truncated to 128 bits (RFC 8762 §4.4). It covers the
Sequence Number field of the base packet followed by every TLV that precedes the HMAC TLV (headers
included, as sent). The HMAC TLV follows the TLVs it protects. The HMAC itself is computed by
stamp_hmac (another module); this file only places it and names the covered bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from .stamp_tlv import E_LENGTH, MalformedTLV, encode_tlv, split_tlv
from .stamp_tlv import TYPE_HMAC as TYPE

LENGTH = 16


@dataclass
class Hmac:
    hmac: bytes = bytes(LENGTH)
    flags: int = 0

    def encode(self) -> bytes:
        if len(self.hmac) != LENGTH:
            raise ValueError("HMAC is 16 bytes")
        return encode_tlv(TYPE, self.hmac, self.flags)

    @classmethod
    def decode(cls, buf: bytes) -> "Hmac":
        flags, value = split_tlv(buf, TYPE)
        if len(value) != LENGTH:
            raise MalformedTLV(E_LENGTH, f"HMAC Length {len(value)}, expected {LENGTH}")
        return cls(value, flags)


def value_ok(value: bytes) -> bool:
    return len(value) == LENGTH


def covered_text(packet: bytes, tlv_offset: int, hmac_tlv_offset: int) -> bytes:
    """Bytes the HMAC TLV covers: base Sequence Number (packet[0:4]) + the TLVs before it."""
    if not (4 <= tlv_offset <= hmac_tlv_offset <= len(packet)):
        raise ValueError("offsets out of the packet")
    return bytes(packet[0:4]) + bytes(packet[tlv_offset:hmac_tlv_offset])
