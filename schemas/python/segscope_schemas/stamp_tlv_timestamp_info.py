"""Timestamp Information TLV, Type 3 (RFC 8972 §4.3). Mirror of schemas/c/stamp_tlv_timestamp_info.h.

Value: Sync Src In (8) | Timestamp In (8) | Sync Src Out (8) | Timestamp Out (8) | optional sub-TLVs.
"In" describes the reflector's receive timestamp (T2), "Out" its transmit timestamp (T3): the
synchronization source of the clock and the timestamping method. The sender sends zeros; the
reflector fills the four octets. Timestamping methods (IANA "STAMP Timestamping Methods"):
1 HW Assist, 2 SW Local, 3 Control Plane. Synchronization sources (IANA "STAMP Synchronization
Sources", RFC 8972 §4.3): 0 Reserved, 1 NTP, 2 PTP, 3 SSU/BITS, 4 GPS/GLONASS/LORAN-C/BDS/Galileo,
5 Local free-running (a clock that follows no source: what an unsynchronized reflector reports).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from .stamp_tlv import E_LENGTH, TLV, MalformedTLV, encode_tlv, iter_sub_tlvs, iter_tlvs, split_tlv
from .stamp_tlv import TYPE_TIMESTAMP_INFO as TYPE

SYNC_RESERVED = 0  # never sent
SYNC_NTP = 1
SYNC_PTP = 2
SYNC_SSU_BITS = 3
SYNC_GNSS = 4
SYNC_LOCAL_FREE_RUNNING = 5
METHOD_HW_ASSIST = 1
METHOD_SW_LOCAL = 2
METHOD_CONTROL_PLANE = 3
_FIXED = struct.Struct("!BBBB")


@dataclass
class TimestampInfo:
    sync_src_in: int = 0
    ts_in: int = 0
    sync_src_out: int = 0
    ts_out: int = 0
    sub_tlvs: list[TLV] = field(default_factory=list)
    flags: int = 0

    def encode(self) -> bytes:
        value = _FIXED.pack(self.sync_src_in, self.ts_in, self.sync_src_out, self.ts_out)
        return encode_tlv(TYPE, value + b"".join(s.encode() for s in self.sub_tlvs), self.flags)

    @classmethod
    def decode(cls, buf: bytes) -> "TimestampInfo":
        flags, value = split_tlv(buf, TYPE)
        check_value(value)
        return cls(*_FIXED.unpack_from(value), sub_tlvs=list(iter_tlvs(value, 4)), flags=flags)


def check_value(value: bytes) -> None:
    if len(value) < 4:
        raise MalformedTLV(E_LENGTH, f"Timestamp Information Length {len(value)} < 4")
    list(iter_sub_tlvs(value, 4))


def value_ok(value: bytes) -> bool:
    try:
        check_value(value)
        return True
    except MalformedTLV:
        return False


def reflect(value: bytes, sync_src_in: int, ts_in: int, sync_src_out: int, ts_out: int) -> bytes:
    check_value(value)
    return _FIXED.pack(sync_src_in, ts_in, sync_src_out, ts_out) + value[4:]
