"""STAMP base test packets, authenticated mode (RFC 8762 §4.2.2 / §4.3.2 + RFC 8972 §3 SSID).

Mirror of schemas/c/stamp_auth_packet.h: 112 bytes, big-endian, HMAC in the
last 16 octets covering octets 0-95 (RFC 8762 §4.4). MBZ fields are zero on
encode and ignored on decode (RFC 8762).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .stamp_hmac import HmacKeyTable

AUTH_LEN = 112
AUTH_HMAC_OFFSET = 96
AUTH_HMAC_LEN = 16

# seq, MBZ12, ts.sec, ts.frac, err_est, ssid, MBZ68, hmac
_SENDER = struct.Struct("!I12sIIHH68s16s")
# seq, MBZ12, ts, err, ssid, MBZ4, rx_ts, MBZ8, s_seq, MBZ12, s_ts, s_err, MBZ6, ttl, MBZ15, hmac
_REFLECTOR = struct.Struct("!I12sIIHH4sII8sI12sIIH6sB15s16s")
assert _SENDER.size == AUTH_LEN and _REFLECTOR.size == AUTH_LEN


class MalformedAuthPacket(ValueError):
    pass


def _check_len(buf: bytes, what: str) -> None:
    if len(buf) < AUTH_LEN:
        raise MalformedAuthPacket(f"authenticated {what} packet is {len(buf)} bytes, needs {AUTH_LEN}")


@dataclass
class AuthSenderPacket:
    seq: int
    ts_sec: int
    ts_frac: int
    err_est: int
    ssid: int
    hmac: bytes = bytes(AUTH_HMAC_LEN)

    def encode(self) -> bytes:
        return _SENDER.pack(
            self.seq, bytes(12), self.ts_sec, self.ts_frac, self.err_est, self.ssid, bytes(68), self.hmac
        )

    @classmethod
    def decode(cls, buf: bytes) -> "AuthSenderPacket":
        _check_len(buf, "sender")
        seq, _m0, sec, frac, ee, ssid, _m1, mac = _SENDER.unpack_from(buf)
        return cls(seq, sec, frac, ee, ssid, mac)


@dataclass
class AuthReflectorPacket:
    seq: int
    ts_sec: int
    ts_frac: int
    err_est: int
    ssid: int
    rx_sec: int
    rx_frac: int
    sender_seq: int
    sender_ts_sec: int
    sender_ts_frac: int
    sender_err_est: int
    sender_ttl: int
    hmac: bytes = bytes(AUTH_HMAC_LEN)

    def encode(self) -> bytes:
        return _REFLECTOR.pack(
            self.seq,
            bytes(12),
            self.ts_sec,
            self.ts_frac,
            self.err_est,
            self.ssid,
            bytes(4),
            self.rx_sec,
            self.rx_frac,
            bytes(8),
            self.sender_seq,
            bytes(12),
            self.sender_ts_sec,
            self.sender_ts_frac,
            self.sender_err_est,
            bytes(6),
            self.sender_ttl,
            bytes(15),
            self.hmac,
        )

    @classmethod
    def decode(cls, buf: bytes) -> "AuthReflectorPacket":
        _check_len(buf, "reflector")
        (seq, _m0, sec, frac, ee, ssid, _m1, rsec, rfrac, _m2, sseq, _m3, ssec, sfrac, see, _m4, ttl, _m5, mac) = (
            _REFLECTOR.unpack_from(buf)
        )
        return cls(seq, sec, frac, ee, ssid, rsec, rfrac, sseq, ssec, sfrac, see, ttl, mac)


def auth_sign(table: HmacKeyTable, now_ns: int, pkt: bytes) -> tuple[bytes, int]:
    """(packet with the HMAC of octets 0-95 in octets 96-111, key id used)."""
    _check_len(pkt, "test")
    mac, key_id = table.sign(pkt[:AUTH_HMAC_OFFSET], now_ns)
    return pkt[:AUTH_HMAC_OFFSET] + mac + pkt[AUTH_LEN:], key_id


def auth_verify(table: HmacKeyTable, now_ns: int, pkt: bytes) -> int:
    """Key id that authenticates the packet; stamp_hmac.IntegrityError / NoKey otherwise."""
    _check_len(pkt, "test")
    return table.verify(pkt[:AUTH_HMAC_OFFSET], pkt[AUTH_HMAC_OFFSET:AUTH_LEN], now_ns)
