"""Session-Reflector Location TLV, Type 2 (RFC 8972 §4.2). Mirror of schemas/c/stamp_tlv_location.h.

Value: Destination Port (16) | Source Port (16) | Sub-TLVs (same header as a TLV).
The sender asks with the generic sub-TLVs and zeroed values; the reflector copies the UDP ports
of the received packet and answers each request with the specific sub-TLV of the same size
(the reflected packet keeps its length). Sub-TLV types (IANA "STAMP Sub-TLV Types", RFC 8972):
  1 Source MAC Address (request, 8)    2 Source EUI-48 (6 + 2 reserved)  3 Source EUI-64 (8)
  4 Destination IP Address (req., 16)  5 Destination IPv4 (4 + 12 MBZ)   6 Destination IPv6 (16)
  7 Source IP Address (request, 16)    8 Source IPv4 (4 + 12 MBZ)        9 Source IPv6 (16)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Optional

from .stamp_tlv import E_LENGTH, E_VALUE, TLV, MalformedTLV, encode_tlv, iter_sub_tlvs, iter_tlvs, split_tlv
from .stamp_tlv import TYPE_LOCATION as TYPE

SUB_SRC_MAC = 1
SUB_SRC_EUI48 = 2
SUB_SRC_EUI64 = 3
SUB_DST_IP = 4
SUB_DST_IPV4 = 5
SUB_DST_IPV6 = 6
SUB_SRC_IP = 7
SUB_SRC_IPV4 = 8
SUB_SRC_IPV6 = 9
# every sub-TLV type has one fixed Length
SUB_LENGTH = {
    SUB_SRC_MAC: 8,
    SUB_SRC_EUI48: 8,
    SUB_SRC_EUI64: 8,
    SUB_DST_IP: 16,
    SUB_DST_IPV4: 16,
    SUB_DST_IPV6: 16,
    SUB_SRC_IP: 16,
    SUB_SRC_IPV4: 16,
    SUB_SRC_IPV6: 16,
}
_PORTS = struct.Struct("!HH")


@dataclass
class Location:
    dst_port: int = 0
    src_port: int = 0
    sub_tlvs: list[TLV] = field(default_factory=list)
    flags: int = 0

    def encode(self) -> bytes:
        value = _PORTS.pack(self.dst_port, self.src_port) + b"".join(s.encode() for s in self.sub_tlvs)
        return encode_tlv(TYPE, value, self.flags)

    @classmethod
    def decode(cls, buf: bytes) -> "Location":
        flags, value = split_tlv(buf, TYPE)
        check_value(value)
        dst, src = _PORTS.unpack_from(value)
        return cls(dst, src, list(iter_tlvs(value, 4)), flags)


def check_value(value: bytes) -> None:
    if len(value) < 4:
        raise MalformedTLV(E_LENGTH, f"Location Length {len(value)} < 4 (ports)")
    for sub in iter_sub_tlvs(value, 4):
        want = SUB_LENGTH.get(sub.type)
        if want is None:
            raise MalformedTLV(E_VALUE, f"unknown Location sub-TLV type {sub.type}")
        if sub.length != want:
            raise MalformedTLV(E_LENGTH, f"Location sub-TLV {sub.type} Length {sub.length}, expected {want}")


def value_ok(value: bytes) -> bool:
    try:
        check_value(value)
        return True
    except MalformedTLV:
        return False


def request(sub_types: list[int]) -> Location:
    """The sender's TLV: ports zero, one zeroed sub-TLV per requested item."""
    return Location(0, 0, [TLV(0, t, bytes(SUB_LENGTH[t])) for t in sub_types])


def reflect(
    value: bytes,
    dst_port: int,
    src_port: int,
    src_mac: Optional[bytes] = None,
    src_ip: Optional[bytes] = None,
    dst_ip: Optional[bytes] = None,
) -> bytes:
    """Reflector: copy the received UDP ports and answer each request sub-TLV (same sizes)."""
    check_value(value)
    out = bytearray(_PORTS.pack(dst_port, src_port))
    for sub in iter_tlvs(value, 4):
        t, v = sub.type, sub.value
        if t in (SUB_SRC_MAC, SUB_SRC_EUI48, SUB_SRC_EUI64) and src_mac is not None:
            t, v = (SUB_SRC_EUI48, src_mac + bytes(2)) if len(src_mac) == 6 else (SUB_SRC_EUI64, src_mac)
        elif t in (SUB_DST_IP, SUB_DST_IPV4, SUB_DST_IPV6) and dst_ip is not None:
            t, v = (SUB_DST_IPV4, dst_ip + bytes(12)) if len(dst_ip) == 4 else (SUB_DST_IPV6, dst_ip)
        elif t in (SUB_SRC_IP, SUB_SRC_IPV4, SUB_SRC_IPV6) and src_ip is not None:
            t, v = (SUB_SRC_IPV4, src_ip + bytes(12)) if len(src_ip) == 4 else (SUB_SRC_IPV6, src_ip)
        out += encode_tlv(t, v, 0)
    return bytes(out)
