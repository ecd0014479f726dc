"""Wire codec of ustamp: every layout comes from segscope_schemas (the modules the C side mirrors).

Base packets (RFC 8762 §4.2.1/§4.3.1 + RFC 8972 SSID, 44 bytes): stamp_test_packet. The TLV area
after the base packet (RFC 8972 §4): stamp_tlv / stamp_tlvs, reflector rules in ustamp/tlvs.py.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from segscope_schemas import stamp_auth_packet as ap
from segscope_schemas import stamp_test_packet as tp
from segscope_schemas import stamp_tlv as T

BASE_LEN = tp.STAMP_BASE_LEN
TLV_F_U, TLV_F_M, TLV_F_I = T.FLAG_U, T.FLAG_M, T.FLAG_I

# Offsets inside the 44-byte reflector packet (RFC 8762 §4.3.1)
REFL_TS_OFF = 4  # Timestamp (T3): seconds, fraction
REFL_RX_TS_OFF = 16  # Receive Timestamp (T2)
AUTH_TS_OFF = 16  # Timestamp in the authenticated packets (RFC 8762 §4.2.2/§4.3.2)


class Malformed(ValueError):
    """A test packet the reflector must not reflect; `reason` is the counter name."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def split_tlvs(area: bytes) -> tuple[list[T.TLV], bytes]:
    """TLVs of a reply's TLV area (sender side), and the unparsable tail (b'' if all are whole)."""
    tlvs = []
    try:
        for tlv in T.iter_tlvs(area, 0):
            tlvs.append(tlv)
    except T.MalformedTLV:
        consumed = sum(T.HDR_LEN + t.length for t in tlvs)
        return tlvs, area[consumed:]
    return tlvs, b""


@dataclass
class SenderTest:
    packet: tp.SenderPacket
    tlv_area: bytes = field(default=b"")


def decode_sender(payload: bytes) -> SenderTest:
    if len(payload) < BASE_LEN:
        raise Malformed("malformed_short", f"{len(payload)} bytes, base packet needs {BASE_LEN}")
    return SenderTest(tp.SenderPacket.decode(payload), payload[BASE_LEN:])


def decode_auth_sender(payload: bytes) -> SenderTest:
    """112-byte authenticated sender packet (RFC 8762 §4.2.2), as the base-packet fields."""
    p = ap.AuthSenderPacket.decode(payload)
    return SenderTest(tp.SenderPacket(p.seq, p.ts_sec, p.ts_frac, p.err_est, p.ssid), payload[ap.AUTH_LEN :])


def encode_reply_base(
    seq: int,
    err_est: int,
    ssid: int,
    rx_sec: int,
    rx_frac: int,
    sender: tp.SenderPacket,
    sender_ttl: int,
    authenticated: bool = False,
) -> bytearray:
    """44-byte (or 112-byte authenticated, HMAC zero) reflector packet with T3 = 0: patch it with
    `stamp_t3` right before sending."""
    cls = ap.AuthReflectorPacket if authenticated else tp.ReflectorPacket
    return bytearray(
        cls(
            seq,
            0,
            0,
            err_est,
            ssid,
            rx_sec,
            rx_frac,
            sender.seq,
            sender.ts_sec,
            sender.ts_frac,
            sender.err_est,
            sender_ttl,
        ).encode()
    )


def stamp_t3(reply: bytearray, sec: int, frac: int, authenticated: bool = False) -> None:
    struct.pack_into("!II", reply, AUTH_TS_OFF if authenticated else REFL_TS_OFF, sec, frac)
