"""Destination Node Address TLV, Type 9 (RFC 9503 §3). Mirror of schemas/c/stamp_tlv_dest_node_addr.h.

Value: the address of the intended Session-Reflector, nothing else: Length 4 = IPv4, 16 = IPv6.
Used when the test packet's IP destination does not name the reflector (e.g. SR-MPLS 127/8).
Reflector (RFC 9503 §3): U = 1 in the reflected TLV when it is not the node named here,
U = 0 when it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from .stamp_tlv import E_LENGTH, FLAG_U, MalformedTLV, encode_tlv, split_tlv
from .stamp_tlv import TYPE_DEST_NODE_ADDR as TYPE

AF_IPV4 = 1  # IANA Address Family Numbers, used here only to name what the Length selects
AF_IPV6 = 2
ADDR_LEN = {AF_IPV4: 4, AF_IPV6: 16}


def family_of(address: bytes) -> int:
    if len(address) == 4:
        return AF_IPV4
    if len(address) == 16:
        return AF_IPV6
    raise MalformedTLV(E_LENGTH, f"address of {len(address)} bytes is neither IPv4 (4) nor IPv6 (16)")


@dataclass
class DestNodeAddr:
    address: bytes = bytes(16)
    flags: int = 0

    @property
    def family(self) -> int:
        return family_of(self.address)

    def encode(self) -> bytes:
        family_of(self.address)
        return encode_tlv(TYPE, self.address, self.flags)

    @classmethod
    def decode(cls, buf: bytes) -> "DestNodeAddr":
        flags, value = split_tlv(buf, TYPE)
        family_of(value)
        return cls(value, flags)


def value_ok(value: bytes) -> bool:
    return len(value) in (4, 16)


def reflected_flags(flags: int, address_is_ours: bool) -> int:
    return (flags & ~FLAG_U & 0xFF) if address_is_ours else (flags | FLAG_U)
