"""STAMP base test packets (RFC 8762 §4.2.1/§4.3.1 + RFC 8972 SSID), unauthenticated.

Mirror of schemas/c/stamp_test_packet.h. Big-endian on the wire, 44 bytes each.
Timestamps: PTPv2 truncated (32-bit TAI seconds, 32-bit ns), Error Estimate Z=1.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

STAMP_PORT = 862
STAMP_BASE_LEN = 44
NS_PER_SEC = 1_000_000_000

EE_S = 0x8000  # clock synchronised
EE_Z = 0x4000  # PTPv2 format

_SENDER = struct.Struct("!IIIHH28s")  # seq, ts.sec, ts.frac, err_est, ssid, mbz
_REFLECTOR = struct.Struct("!IIIHHIIIIIHHB3s")  # seq, ts, err, ssid, rx_ts, s_seq, s_ts, s_err, mbz1, ttl, mbz2
assert _SENDER.size == STAMP_BASE_LEN and _REFLECTOR.size == STAMP_BASE_LEN


class MalformedPacket(ValueError):
    pass


def ptp_from_ns(ns: int) -> tuple[int, int]:
    return (ns // NS_PER_SEC) & 0xFFFFFFFF, ns % NS_PER_SEC


def sec32_widen(sec: int, ref_sec: int) -> int:
    """Widen a 32-bit seconds field with the upper bits of a nearby reference (same epoch)."""
    full = (ref_sec & ~0xFFFFFFFF) | sec
    if full > ref_sec + 0x80000000 and full >= 0x100000000:
        full -= 0x100000000
    elif full + 0x80000000 < ref_sec:
        full += 0x100000000
    return full


def ptp_to_ns(sec: int, nsec: int, ref_ns: int) -> int:
    """Widen a 32-bit-seconds PTP timestamp with the upper bits of a nearby reference time."""
    return sec32_widen(sec, ref_ns // NS_PER_SEC) * NS_PER_SEC + nsec


def error_estimate(synced: bool, ptp: bool, scale: int, multiplier: int) -> int:
    if not (0 <= scale < 64 and 0 <= multiplier < 256):
        raise ValueError("scale must be 0..63 and multiplier 0..255")
    return (EE_S if synced else 0) | (EE_Z if ptp else 0) | (scale << 8) | multiplier


@dataclass
class SenderPacket:
    seq: int
    ts_sec: int
    ts_frac: int
    err_est: int
    ssid: int

    def encode(self) -> bytes:
        return _SENDER.pack(self.seq, self.ts_sec, self.ts_frac, self.err_est, self.ssid, bytes(28))

    @classmethod
    def decode(cls, buf: bytes) -> "SenderPacket":
        if len(buf) < STAMP_BASE_LEN:
            raise MalformedPacket(f"sender packet is {len(buf)} bytes, needs {STAMP_BASE_LEN}")
        seq, sec, frac, ee, ssid, _ = _SENDER.unpack_from(buf)
        return cls(seq, sec, frac, ee, ssid)


@dataclass
class ReflectorPacket:
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

    def encode(self) -> bytes:
        return _REFLECTOR.pack(
            self.seq,
            self.ts_sec,
            self.ts_frac,
            self.err_est,
            self.ssid,
            self.rx_sec,
            self.rx_frac,
            self.sender_seq,
            self.sender_ts_sec,
            self.sender_ts_frac,
            self.sender_err_est,
            0,
            self.sender_ttl,
            bytes(3),
        )

    @classmethod
    def decode(cls, buf: bytes) -> "ReflectorPacket":
        if len(buf) < STAMP_BASE_LEN:
            raise MalformedPacket(f"reflector packet is {len(buf)} bytes, needs {STAMP_BASE_LEN}")
        (seq, sec, frac, ee, ssid, rsec, rfrac, sseq, ssec, sfrac, see, _mbz1, ttl, _mbz2) = _REFLECTOR.unpack_from(buf)
        return cls(seq, sec, frac, ee, ssid, rsec, rfrac, sseq, ssec, sfrac, see, ttl)
