"""Session-Reflector TLV processing (RFC 8972 §4, RFC 9503) on the shared wire modules.

segscope_schemas.stamp_tlvs.reflect() applies the flag rules to the received TLV area (U for an
unknown Type, M + stop for a malformed TLV, I on every TLV when the HMAC TLV fails); this module then
fills the reflector's part of every understood TLV, in place (the reply keeps the packet's length):

  1 Extra Padding        echoed
  2 Location             received UDP ports; source/destination IPv6 address sub-TLVs answered
  3 Timestamp Info       sync source (NTP when the kernel clock is synchronised, else 0 = unknown),
                         method SW local (2) for T2 (socket receive stamp) and T3 (clock read)
  4 Class of Service     DSCP2/ECN = received Traffic Class; the reply is sent with DSCP1 (RP = 0)
  5 Direct Measurement   R_RxC / R_TxC = the session's received / transmitted test packets
  6 Access Report        echoed
  7 Follow-Up Telemetry  seq and T3 of the session's previous reply, method SW local
  8 HMAC                 verified by the caller's hmac_verify (authenticated sessions); re-signed there
  9 Dest. Node Address   U = 0 if the address is the packet's destination (ours), U = 1 otherwise
 10 Return Path          Control Code (no reply / same link), Return Address, SRv6 Segment List:
                         the reply goes to that address over that segment list (<= 16 SIDs;
                         longer lists and SR-MPLS stacks are counted unsupported and not used)
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass, field
from typing import Callable, Optional

from segscope_schemas import stamp_tlv as T
from segscope_schemas import (
    stamp_tlv_class_of_service,
    stamp_tlv_dest_node_addr,
    stamp_tlv_direct_measurement,
    stamp_tlv_location,
    stamp_tlv_return_path,
    stamp_tlv_timestamp_info,
    stamp_tlvs,
)

from .netutil import MAX_SIDS

METHOD_SW_LOCAL = stamp_tlv_timestamp_info.METHOD_SW_LOCAL
SYNC_NTP = stamp_tlv_timestamp_info.SYNC_NTP
# an unsynchronized clock runs free; 0 is Reserved in the IANA registry (RFC 8972 §4.3)
SYNC_FREE_RUNNING = stamp_tlv_timestamp_info.SYNC_LOCAL_FREE_RUNNING


@dataclass
class TlvContext:
    """What the reflector knows about this exchange (inputs) ..."""

    sender_addr: str
    sender_port: int
    local_addr: str
    local_port: int
    received_tclass: int
    clock_synced: bool
    rx_count: int  # this sender's received test packets in the session, this one included
    tx_count: int  # replies sent to this sender in the session, this one included
    prev_seq: int = 0  # Follow-Up Telemetry: the previous reply (0s if none)
    prev_t3: tuple[int, int] = (0, 0)
    hmac_verify: Optional[Callable[[bytes, bytes], bool]] = None


@dataclass
class TlvResult:
    """... and what the TLVs ask of the reply (outputs)."""

    reply_area: bytes = b""
    unrecognized: int = 0
    malformed: int = 0
    handled: int = 0
    integrity_failed: bool = False
    hmac_offset: Optional[int] = None  # offset of the HMAC TLV in the packet (re-sign there)
    no_reply: bool = False  # Return Path Control Code "No Reply Requested"
    same_link: bool = False  # "Reply Requested on the Same Link"
    return_address: Optional[str] = None
    return_sids: Optional[list[str]] = None
    reply_tclass: Optional[int] = None
    unsupported: list[str] = field(default_factory=list)


def _ip(addr: str) -> bytes:
    return ipaddress.IPv6Address(addr).packed


def _fill(out: bytearray, off: int, tlv_type: int, value: bytes, ctx: TlvContext, res: TlvResult) -> None:
    vstart = off + T.HDR_LEN

    def put(new_value: bytes) -> None:
        assert len(new_value) == len(value), (tlv_type, len(new_value), len(value))
        out[vstart : vstart + len(value)] = new_value

    if tlv_type == T.TYPE_LOCATION:
        put(
            stamp_tlv_location.reflect(
                value,
                ctx.local_port,
                ctx.sender_port,
                None,
                _ip(ctx.sender_addr),
                _ip(ctx.local_addr) if ctx.local_addr else None,
            )
        )
    elif tlv_type == T.TYPE_TIMESTAMP_INFO:
        sync = SYNC_NTP if ctx.clock_synced else SYNC_FREE_RUNNING
        put(stamp_tlv_timestamp_info.reflect(value, sync, METHOD_SW_LOCAL, sync, METHOD_SW_LOCAL))
    elif tlv_type == T.TYPE_CLASS_OF_SERVICE:
        put(stamp_tlv_class_of_service.reflect(value, ctx.received_tclass, True))
        res.reply_tclass = (struct.unpack_from("!H", value)[0] >> 10) << 2  # DSCP1, ECN 0
    elif tlv_type == T.TYPE_DIRECT_MEASUREMENT:
        put(stamp_tlv_direct_measurement.reflect(value, ctx.rx_count, ctx.tx_count))
    elif tlv_type == T.TYPE_FOLLOW_UP_TELEMETRY:
        put(
            struct.pack(
                "!IIIB3s",
                ctx.prev_seq,
                ctx.prev_t3[0],
                ctx.prev_t3[1],
                METHOD_SW_LOCAL if ctx.prev_t3 != (0, 0) else 0,
                bytes(3),
            )
        )
    elif tlv_type == T.TYPE_DEST_NODE_ADDR:
        ours = bool(ctx.local_addr) and len(value) == 16 and value == _ip(ctx.local_addr)
        out[off] = stamp_tlv_dest_node_addr.reflected_flags(out[off], ours)
    elif tlv_type == T.TYPE_RETURN_PATH:
        _return_path(value, res)
    # Extra Padding, Access Report, HMAC: echoed as received (HMAC re-signed by the caller)


def _return_path(value: bytes, res: TlvResult) -> None:
    for sub in T.iter_tlvs(value, 0):
        if sub.type == stamp_tlv_return_path.SUB_CONTROL_CODE:
            cc = struct.unpack("!I", sub.value)[0]
            # RFC 9503 §4.1.1: one flag, bit 31 (LSB): 0 No Reply Requested, 1 Reply on the Same Link
            requested = bool(cc & stamp_tlv_return_path.CC_REPLY_REQUEST)
            res.no_reply = not requested
            res.same_link = requested
        elif sub.type == stamp_tlv_return_path.SUB_RETURN_ADDRESS:
            if len(sub.value) == 16:
                res.return_address = str(ipaddress.IPv6Address(sub.value))
            else:
                res.unsupported.append("return_address_ipv4")
        elif sub.type == stamp_tlv_return_path.SUB_SRV6_SEGMENTS:
            if len(sub.value) // 16 > MAX_SIDS:  # more than an SRH from a socket can carry here
                res.unsupported.append("srv6_segments_too_long")
                continue
            res.return_sids = [str(ipaddress.IPv6Address(sub.value[i : i + 16])) for i in range(0, len(sub.value), 16)]
        elif sub.type == stamp_tlv_return_path.SUB_SR_MPLS_LABELS:
            res.unsupported.append("sr_mpls_labels")


def reflect(payload: bytes, offset: int, ctx: TlvContext) -> TlvResult:
    """Reply TLV area (same length as payload[offset:]) and what it asks of the reply."""
    out, r = stamp_tlvs.reflect(payload, offset, ctx.hmac_verify)
    res = TlvResult(unrecognized=r.unknown, integrity_failed=r.integrity_failed, hmac_offset=r.hmac_offset)
    res.malformed = 1 if (r.malformed_at is not None or r.error) else 0
    if not r.integrity_failed:  # RFC 8972 §4.8: failed integrity -> no TLV is processed further
        for off in r.understood_offsets:
            _, tlv_type, length = T.HDR.unpack_from(payload, off)
            _fill(out, off, tlv_type, bytes(payload[off + T.HDR_LEN : off + T.HDR_LEN + length]), ctx, res)
            res.handled += 1
    res.reply_area = bytes(out[offset:])
    return res
