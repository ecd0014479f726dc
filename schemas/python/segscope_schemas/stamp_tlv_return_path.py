"""Return Path TLV, Type 10 (RFC 9503 §4). Mirror of schemas/c/stamp_tlv_return_path.h.

Value: Return Path sub-TLVs (same header as a TLV), types from the RFC 9503 §4.1 figures:
  1 Return Path Control Code (Length 4): Control Code Flags (32). RFC 9503 §4.1.1 defines the
      Reply Request flag, bit 31 (the least significant bit): 0x0 No Reply Requested, 0x1 Reply
      Requested on the Same Link; the other bits are unassigned and ignored on receipt.
  2 Return Address: the address the reply goes to (Length 4 = IPv4, 16 = IPv6).
  3 SR-MPLS Label Stack: n x 32-bit label stack entries.
  4 SRv6 Segment List: n x 128-bit SIDs, Segment(1) first, Segment(n) last (bottom of stack).
A sub-TLV type appears at most once (a second one makes the TLV malformed).
Note: these sub-TLV numbers overlap RFC 8972's Location sub-TLV numbers in IANA's "STAMP Sub-TLV
Types" registry (1-9 = Location); they are scoped by the parent TLV, and we follow RFC 9503's figures.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Optional

from .stamp_tlv import E_LENGTH, E_VALUE, TLV, MalformedTLV, encode_tlv, iter_sub_tlvs, iter_tlvs, split_tlv
from .stamp_tlv import TYPE_RETURN_PATH as TYPE

SUB_CONTROL_CODE = 1
SUB_RETURN_ADDRESS = 2
SUB_SR_MPLS_LABELS = 3
SUB_SRV6_SEGMENTS = 4
CC_REPLY_REQUEST = 0x1  # mask: the Reply Request flag (bit 31)
CC_NO_REPLY = 0x0  # flag values, RFC 9503 §4.1.1
CC_REPLY_SAME_LINK = 0x1


@dataclass
class ReturnPath:
    sub_tlvs: list[TLV] = field(default_factory=list)
    flags: int = 0

    # typed views of the sub-TLVs
    @property
    def control_code(self) -> Optional[int]:
        for s in self.sub_tlvs:
            if s.type == SUB_CONTROL_CODE:
                return struct.unpack("!I", s.value)[0]
        return None

    @property
    def reply_requested(self) -> bool:
        """The Reply Request flag of the Control Code; True without a Control Code (the default)."""
        cc = self.control_code
        return True if cc is None else bool(cc & CC_REPLY_REQUEST)

    @property
    def return_address(self) -> Optional[bytes]:
        for s in self.sub_tlvs:
            if s.type == SUB_RETURN_ADDRESS:
                return s.value
        return None

    @property
    def segments(self) -> list[bytes]:
        for s in self.sub_tlvs:
            if s.type == SUB_SRV6_SEGMENTS:
                return [s.value[i : i + 16] for i in range(0, len(s.value), 16)]
        return []

    @property
    def labels(self) -> list[int]:
        for s in self.sub_tlvs:
            if s.type == SUB_SR_MPLS_LABELS:
                return list(struct.unpack(f"!{len(s.value) // 4}I", s.value))
        return []

    def encode(self) -> bytes:
        return encode_tlv(TYPE, b"".join(s.encode() for s in self.sub_tlvs), self.flags)

    @classmethod
    def decode(cls, buf: bytes) -> "ReturnPath":
        flags, value = split_tlv(buf, TYPE)
        check_value(value)
        return cls(list(iter_tlvs(value, 0)), flags)


def control_code(cc_flags: int, flags: int = 0) -> TLV:
    return TLV(flags, SUB_CONTROL_CODE, struct.pack("!I", cc_flags))


def return_address(address: bytes, flags: int = 0) -> TLV:
    if len(address) not in (4, 16):
        raise ValueError("a Return Address is 4 (IPv4) or 16 (IPv6) bytes")
    return TLV(flags, SUB_RETURN_ADDRESS, bytes(address))


def srv6_segments(sids: list[bytes], flags: int = 0) -> TLV:
    if not sids or any(len(s) != 16 for s in sids):
        raise ValueError("an SRv6 Segment List holds one or more 16-byte SIDs")
    return TLV(flags, SUB_SRV6_SEGMENTS, b"".join(sids))


def check_value(value: bytes) -> None:
    seen: set[int] = set()
    for s in iter_sub_tlvs(value, 0):
        if s.type in seen:
            raise MalformedTLV(E_VALUE, f"Return Path sub-TLV type {s.type} appears twice")
        seen.add(s.type)
        if s.type == SUB_CONTROL_CODE and s.length != 4:
            raise MalformedTLV(E_LENGTH, f"Control Code Length {s.length}, expected 4")
        elif s.type == SUB_RETURN_ADDRESS and s.length not in (4, 16):
            raise MalformedTLV(E_LENGTH, f"Return Address Length {s.length}, expected 4 or 16")
        elif s.type == SUB_SR_MPLS_LABELS and (s.length == 0 or s.length % 4):
            raise MalformedTLV(E_LENGTH, f"SR-MPLS Label Stack Length {s.length} is not a multiple of 4")
        elif s.type == SUB_SRV6_SEGMENTS and (s.length == 0 or s.length % 16):
            raise MalformedTLV(E_LENGTH, f"SRv6 Segment List Length {s.length} is not a multiple of 16")
        elif s.type not in (SUB_CONTROL_CODE, SUB_RETURN_ADDRESS, SUB_SR_MPLS_LABELS, SUB_SRV6_SEGMENTS):
            raise MalformedTLV(E_VALUE, f"unknown Return Path sub-TLV type {s.type}")
    if not seen:
        raise MalformedTLV(E_LENGTH, "Return Path TLV without a sub-TLV")


def value_ok(value: bytes) -> bool:
    try:
        check_value(value)
        return True
    except MalformedTLV:
        return False
