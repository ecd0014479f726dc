"""Destination Node Address TLV, Type 9 (RFC 9503 §3). Mirror of schemas/c/stamp_tlv_dest_node_addr.h.

Value: Address Family (16, IANA Address Family Numbers: 1 IPv4, 2 IPv6) | Reserved (16) |
Address (4 or 16). Length 8 (IPv4) or 20 (IPv6).
Used when the test packet's IP destination is not the reflector itself (e.g. SR-MPLS 127/8).
Reflector: when the address is one of its own it processes the packet normally; when it is not,
it sets the U flag in the reflected TLV (this implementation's reading of RFC 9503 §3).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from .stamp_tlv import (E_LENGTH, E_VALUE, FLAG_U, MalformedTLV, TYPE_DEST_NODE_ADDR as TYPE, encode_tlv,
                        split_tlv)

AF_IPV4 = 1
AF_IPV6 = 2
ADDR_LEN = {AF_IPV4: 4, AF_IPV6: 16}
_H = struct.Struct("!HH")


@dataclass
class DestNodeAddr:
    family: int = AF_IPV6
    address: bytes = bytes(16)
    flags: int = 0

    def encode(self) -> bytes:
        if ADDR_LEN.get(self.family) != len(self.address):
            raise ValueError(f"address of {len(self.address)} bytes for family {self.family}")
        return encode_tlv(TYPE, _H.pack(self.family, 0) + self.address, self.flags)

    @classmethod
    def decode(cls, buf: bytes) -> "DestNodeAddr":
        flags, value = split_tlv(buf, TYPE)
        check_value(value)
        return cls(_H.unpack_from(value)[0], value[4:], flags)


def check_value(value: bytes) -> None:
    if len(value) < 4:
        raise MalformedTLV(E_LENGTH, f"Destination Node Address Length {len(value)} < 4")
    family = _H.unpack_from(value)[0]
    want = ADDR_LEN.get(family)
    if want is None:
        raise MalformedTLV(E_VALUE, f"Address Family {family} is neither 1 (IPv4) nor 2 (IPv6)")
    if len(value) != 4 + want:
        raise MalformedTLV(E_LENGTH, f"Length {len(value)} for Address Family {family}, expected {4 + want}")


def value_ok(value: bytes) -> bool:
    try:
        check_value(value)
        return True
    except MalformedTLV:
        return False


def reflected_flags(flags: int, address_is_ours: bool) -> int:
    return (flags & ~FLAG_U & 0xFF) if address_is_ours else (flags | FLAG_U)
