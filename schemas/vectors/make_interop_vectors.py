#!/usr/bin/env python3
"""Writes stamp_interop.json: what an independent STAMP implementation puts on the wire and what
segscope must make of it, from the RFC figures and text alone (plain struct packing at the
offsets of the figures, RFC 1071 checksums, RFC 5905 / IEEE 1588 timestamp arithmetic written
here; no segscope code is imported).

  base_sender_*   RFC 8762 §4.2.1 unauthenticated test packet from a sender without the RFC 8972
                  SSID (bytes 14-15 stay MBZ): a reflector answers it (stateless, RFC 8762 §4.3).
  partial_csum_*  the same, or a reply, whose UDP checksum field holds only the pseudo-header sum
                  (RFC 8200 §8.1 pseudo-header; what a kernel socket behind a veth hands over
                  while checksum offload is pending): accepted, the reply gets a full checksum.
  mixed_format_*  RFC 8762 §4.3.1 reflector packets where the Session-Sender's Error Estimate
                  (Z = 1: PTPv2 truncated, IEEE 1588) and the reflector's (Z = 0: NTP, RFC 5905
                  §6) differ, and the reverse: each timestamp decodes in its own side's format.

Consumers: tests/datapath/test_interop_vectors.py (the XDP programs, C) and
tests/ustamp/test_ustamp_interop_vectors.py (the user-space reflector and sender, Python).

usage: python3 schemas/vectors/make_interop_vectors.py   (rewrites the file)
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

HERE = Path(__file__).resolve().parent
NS = 10**9
NTP_UNIX = 2_208_988_800  # RFC 5905 §6: 1900-01-01 to 1970-01-01 in seconds
TAI_UTC = 37  # TAI - UTC since 2017-01-01 (IERS Bulletin C); the programs are configured with it
STAMP_PORT = 862  # RFC 8762 §4.1
EE_S, EE_Z = 0x8000, 0x4000  # RFC 8762 §4.2.1 Error Estimate: S (synchronized), Z (1 = PTPv2)

SENDER, REFLECTOR = "fd00:d5::1", "fd00:d5::2"  # tests/datapath/dp_env.py VethPair addresses
SENDER_MAC, REFLECTOR_MAC = "02:d5:00:00:00:01", "02:d5:00:00:00:02"


def ip6(text: str) -> bytes:
    import ipaddress

    return ipaddress.IPv6Address(text).packed


def ones_sum(data: bytes) -> int:
    """RFC 1071: 16-bit ones' complement sum, folded."""
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def pseudo_header(src: bytes, dst: bytes, udp_len: int) -> bytes:
    """RFC 8200 §8.1: source, destination, upper-layer packet length (32), 3 zero octets, next header."""
    return src + dst + struct.pack("!I3xB", udp_len, 17)


def frame(src: str, dst: str, sport: int, dport: int, payload: bytes, checksum: str) -> bytes:
    """Ethernet + IPv6 (hop limit 64) + UDP; checksum "full" (RFC 768 / RFC 8200 §8.1) or
    "partial" (the pseudo-header sum alone, as the kernel leaves it for offload)."""
    s, d = ip6(src), ip6(dst)
    udp_len = 8 + len(payload)
    if checksum == "full":
        c = (
            ~ones_sum(pseudo_header(s, d, udp_len) + struct.pack("!HHHH", sport, dport, udp_len, 0) + payload)
        ) & 0xFFFF
        c = c or 0xFFFF
    else:
        c = ones_sum(pseudo_header(s, d, udp_len))
    udp = struct.pack("!HHHH", sport, dport, udp_len, c) + payload
    ipv6 = struct.pack("!IHBB", 6 << 28, udp_len, 17, 64) + s + d
    macs = {SENDER: SENDER_MAC, REFLECTOR: REFLECTOR_MAC}
    eth = bytes.fromhex(macs[dst].replace(":", "")) + bytes.fromhex(macs[src].replace(":", "")) + b"\x86\xdd"
    return eth + ipv6 + udp


# ---------------------------------------------------------------- timestamps
def ptp(tai_ns: int) -> tuple[int, int]:
    """IEEE 1588 truncated: 32-bit seconds and 32-bit nanoseconds of TAI (RFC 8762 §4.2.1)."""
    return (tai_ns // NS) & 0xFFFFFFFF, tai_ns % NS


def ntp(tai_ns: int) -> tuple[int, int]:
    """RFC 5905 §6: UTC seconds since 1900 (32 bits) + a 2^-32 s fraction, floored to that step;
    a decoder rounds to the nearest ns, so each vector also states the value it gets back."""
    utc_ns = tai_ns - TAI_UTC * NS
    sec, ns = divmod(utc_ns, NS)
    return (sec + NTP_UNIX) & 0xFFFFFFFF, (ns << 32) // NS


def ntp_decoded(sec: int, frac: int) -> int:
    """The TAI ns an NTP timestamp stands for (era 0 here), rounded to the nearest ns."""
    return (sec - NTP_UNIX + TAI_UTC) * NS + ((frac * NS + (1 << 31)) >> 32)


def ts_words(tai_ns: int, fmt: str) -> tuple[bytes, int]:
    """(the 8 octets on the wire, the TAI ns a decoder gets back)."""
    if fmt == "ptp":
        s, n = ptp(tai_ns)
        return struct.pack("!II", s, n), tai_ns
    s, f = ntp(tai_ns)
    return struct.pack("!II", s, f), ntp_decoded(s, f)


def ee(fmt: str) -> int:
    """An Error Estimate: S = 1, Scale 10, Multiplier 1 (~1 ms), Z from the format."""
    return EE_S | (EE_Z if fmt == "ptp" else 0) | 10 << 8 | 1


# ---------------------------------------------------------------- packets
def sender_packet(seq: int, t1_tai_ns: int, fmt: str, ssid: int) -> bytes:
    """RFC 8762 §4.2.1 (RFC 8972 §3: bytes 14-15 are the SSID; 0 from a plain RFC 8762 sender)."""
    ts, _ = ts_words(t1_tai_ns, fmt)
    return struct.pack("!I", seq) + ts + struct.pack("!HH", ee(fmt), ssid) + bytes(28)


def reflector_packet(seq: int, sender_fmt: str, refl_fmt: str, ssid: int, t1: int, t2: int, t3: int, ttl: int):
    """RFC 8762 §4.3.1: Seq | T3 | Error Estimate | SSID | T2 | Sender Seq | T1 | Sender EE | MBZ |
    Ses-Sender TTL | MBZ(3). Returns (44 octets, decoded T1, T2, T3 in TAI ns)."""
    t1w, t1d = ts_words(t1, sender_fmt)
    t2w, t2d = ts_words(t2, refl_fmt)
    t3w, t3d = ts_words(t3, refl_fmt)
    pkt = (
        struct.pack("!I", seq)
        + t3w
        + struct.pack("!HH", ee(refl_fmt), ssid)
        + t2w
        + struct.pack("!I", seq)
        + t1w
        + struct.pack("!HH", ee(sender_fmt), 0)
        + struct.pack("!B3x", ttl)
    )
    assert len(pkt) == 44
    return pkt, t1d, t2d, t3d


def main() -> None:
    t1 = 1_795_305_563 * NS + 123_456_789  # TAI, 2026-11-23; any time within 68 years of now works
    t2, t3 = t1 + 2_000_000, t1 + 2_010_000  # 2 ms forward, 10 us in the reflector
    vectors = []
    base = sender_packet(7, t1, "ntp", 0)
    vectors.append(
        {
            "name": "base_sender_ssid0",
            "cite": "RFC 8762 §4.2.1 test packet, bytes 14-15 MBZ (no RFC 8972 SSID): RFC 8762 §4.3 reflector answers",
            "program": "reflector",
            "frame": frame(SENDER, REFLECTOR, 50000, STAMP_PORT, base, "full").hex(),
            "ssid": 0,
            "expect": {"counter": "reflected", "action": "XDP_TX", "reply_z": 0, "reply_seq": 7},
        }
    )
    vectors.append(
        {
            "name": "base_sender_ssid0_partial_csum",
            "cite": "the same packet, UDP checksum field = pseudo-header sum (RFC 8200 §8.1) only",
            "program": "reflector",
            "frame": frame(SENDER, REFLECTOR, 50000, STAMP_PORT, base, "partial").hex(),
            "ssid": 0,
            "expect": {"counter": "reflected_partial_csum", "action": "XDP_TX", "reply_z": 0, "reply_seq": 7},
        }
    )
    for name, sfmt, rfmt in (
        ("mixed_format_ptp_sender_ntp_reflector", "ptp", "ntp"),
        ("mixed_format_ntp_sender_ptp_reflector", "ntp", "ptp"),
    ):
        pkt, t1d, t2d, t3d = reflector_packet(3, sfmt, rfmt, 7, t1, t2, t3, 63)
        vectors.append(
            {
                "name": name,
                "cite": f"RFC 8762 §4.3.1 reply: sender Error Estimate Z={int(sfmt == 'ptp')} ({sfmt}), "
                f"reflector Error Estimate Z={int(rfmt == 'ptp')} ({rfmt}); §4.2.1: Z gives each side's format",
                "program": "collector",
                "frame": frame(REFLECTOR, SENDER, STAMP_PORT, 50007, pkt, "full").hex(),
                "ssid": 7,
                "sender_format": sfmt,
                "sender_port": 50007,
                "tai_utc_offset_s": TAI_UTC,
                "expect": {
                    "counter": "collected",
                    "action": "XDP_DROP",
                    "t1_ns": t1d,
                    "t2_ns": t2d,
                    "t3_ns": t3d,
                    "forward_ns": t2d - t1d,
                    "reflector_ntp": rfmt == "ntp",
                },
            }
        )
    pkt, t1d, t2d, t3d = reflector_packet(4, "ptp", "ptp", 7, t1, t2, t3, 63)
    vectors.append(
        {
            "name": "reply_partial_csum",
            "cite": "RFC 8762 §4.3.1 reply from a kernel-socket reflector behind a veth: checksum = pseudo-header sum",
            "program": "collector",
            "frame": frame(REFLECTOR, SENDER, STAMP_PORT, 50007, pkt, "partial").hex(),
            "ssid": 7,
            "sender_format": "ptp",
            "sender_port": 50007,
            "tai_utc_offset_s": TAI_UTC,
            "expect": {
                "counter": "collected_partial_csum",
                "action": "XDP_DROP",
                "t1_ns": t1d,
                "t2_ns": t2d,
                "t3_ns": t3d,
                "forward_ns": t2d - t1d,
                "reflector_ntp": False,
            },
        }
    )
    doc = {
        "element": "stamp_interop",
        "rfc": "RFC 8762 §4.2.1, §4.3, §4.3.1; RFC 8972 §3; RFC 8200 §8.1; RFC 5905 §6",
        "vectors": vectors,
    }
    (HERE / "stamp_interop.json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
