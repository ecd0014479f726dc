"""Seed frames (valid STAMP test packets and replies) and mutators for the XDP fuzz test.

Everything is drawn from one random.Random, so a seed reproduces the exact frame sequence.
"""

from __future__ import annotations

import random
import socket
import struct

from tests.fuzz.stamp_oracle import L4_NO_SRH, ones_sum, parse_transport, udp6_checksum


def a6(s: str) -> bytes:
    return socket.inet_pton(socket.AF_INET6, s)


MAC_A, MAC_B = bytes.fromhex("02f200000001"), bytes.fromhex("02f200000002")
REFL_ADDRS = [a6("fd00:f2::2"), a6("fc00:f3::1")]
OTHER_ADDR = a6("fd00:f2::3")
SENDERS = [a6("fd00:f2::1"), a6("fc00:f1::1"), a6("fd00:f2::99")]
SIDS = [a6(f"fc00:f2::{i + 1:x}") for i in range(8)]
SSIDS = [7, 8, 9, 10, 11, 12, 0, 0xFFFF]  # 12: an authenticated session (if the datapath has modes)
COLLECTOR_PORTS = [50007, 50008, 50009, 50010, 40000]
NEXT_HEADERS = [0, 4, 6, 17, 41, 43, 44, 50, 51, 58, 59, 60, 135, 139, 140, 253, 255]


# Timestamps in the seeds: a fixed instant (Nov 2026), not the clock, so a seed gives the same bytes
# on every run. The programs' own T2/T3/T4 are checked against the real clock.
BASE_TAI_NS = 1_795_000_000 * 10**9


def tai_ns() -> int:
    return BASE_TAI_NS


def eth(ethertype: bytes = b"\x86\xdd") -> bytes:
    return MAC_B + MAC_A + ethertype


def ipv6(src: bytes, dst: bytes, nexthdr: int, body_len: int, hlim: int = 64, tc_flow: int = 0) -> bytes:
    return struct.pack("!IHBB", 6 << 28 | tc_flow, body_len, nexthdr, hlim) + src + dst


def srh(segments: list[bytes], segleft: int, nexthdr: int = 17) -> bytes:
    n = len(segments)
    return struct.pack("!BBBBBBH", nexthdr, 2 * n, 4, segleft, n - 1, 0, 0) + b"".join(segments)


def udp(src: bytes, dst: bytes, sport: int, dport: int, payload: bytes) -> bytes:
    hdr = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0)
    return struct.pack("!HHHH", sport, dport, 8 + len(payload), udp6_checksum(src, dst, hdr + payload)) + payload


def sender_payload(rng: random.Random, ssid: int, tlv_len: int = 0) -> bytes:
    t1 = tai_ns() - rng.randrange(10**9)
    ee = rng.choice([0x4001, 0xC105, 0x0001, rng.randrange(65536)])
    return struct.pack(
        "!IIIHH28s", rng.randrange(2**32), (t1 // 10**9) & 0xFFFFFFFF, t1 % 10**9, ee, ssid, bytes(28)
    ) + rng.randbytes(tlv_len)


def auth_sender_payload(rng: random.Random, ssid: int, tlv_len: int = 0) -> bytes:
    """RFC 8762 §4.2.2 authenticated layout (112 bytes, SSID at 26, HMAC at 96), random HMAC."""
    t1 = tai_ns()
    return struct.pack(
        "!I12xIIHH68x16s", rng.randrange(2**32), (t1 // 10**9) & 0xFFFFFFFF, t1 % 10**9, 0x4001, ssid, rng.randbytes(16)
    ) + rng.randbytes(tlv_len)


def reflector_payload(rng: random.Random, ssid: int, tlv_len: int = 0) -> bytes:
    now = tai_ns()
    t1, t2 = now - rng.randrange(10**9), now - rng.randrange(10**8)
    t3 = t2 + rng.randrange(10**5)
    ts = lambda ns: ((ns // 10**9) & 0xFFFFFFFF, ns % 10**9)  # noqa: E731
    seq = rng.randrange(2**32)
    if rng.random() < 0.2:  # arbitrary timestamps, including the 32-bit wrap region
        t1s, t2s, t3s = (
            (rng.randrange(2**32), rng.randrange(10**9)),
            (rng.randrange(2**32), 0),
            (rng.randrange(2**32), rng.randrange(10**9)),
        )
    else:
        t1s, t2s, t3s = ts(t1), ts(t2), ts(t3)
    return struct.pack(
        "!IIIHHIIIIIHHB3s",
        seq,
        *t3s,
        0x4001 | rng.randrange(2) << 15,
        ssid,
        *t2s,
        seq,
        *t1s,
        0x4001,
        0,
        rng.randrange(256),
        bytes(3),
    ) + rng.randbytes(tlv_len)


def build(
    src: bytes,
    dst: bytes,
    sport: int,
    dport: int,
    payload: bytes,
    segments: list[bytes] | None = None,
    segleft: int = 0,
    hlim: int = 64,
    hbh: bool = False,
) -> bytes:
    """Ethernet/IPv6[/SRH][/HBH]/UDP with consistent lengths and a valid checksum (final dst = dst)."""
    final_dst = segments[0] if segments and segleft == 0 else dst
    body = udp(src, final_dst, sport, dport, payload)
    nh = 17
    if hbh:
        body, nh = bytes([17, 0, 1, 4, 0, 0, 0, 0]) + body, 0  # HBH with PadN
    if segments is not None:
        body, nh = srh(segments, segleft, nh) + body, 43
    return eth() + ipv6(src, dst, nh, len(body), hlim, tc_flow=0) + body


def reflector_seed(rng: random.Random) -> bytes:
    src, ssid = rng.choice(SENDERS), rng.choice(SSIDS)
    dst = rng.choice(REFL_ADDRS + REFL_ADDRS + [OTHER_ADDR])
    dport = 862 if rng.random() < 0.9 else rng.choice([861, 863, 8620, 0])
    if rng.random() < 0.1:
        payload = auth_sender_payload(rng, ssid, rng.choice([0, 0, 8]))
    else:
        payload = sender_payload(rng, ssid, rng.choice([0, 0, 0, 0, 4, 8, 12, 68, 100]))
    hlim = rng.choice([1, 64, 255, rng.randrange(256)])
    kind = rng.randrange(6)
    if kind <= 2:
        return build(src, dst, rng.randrange(1024, 65536), dport, payload, hlim=hlim)
    if kind == 3:  # SRH, segments left 0: dst is the final segment
        segs = [dst] + rng.sample(SIDS, rng.randrange(0, 4))
        return build(src, dst, (50000 + ssid) & 0xFFFF, dport, payload, segments=segs, hlim=hlim)
    if kind == 4:  # SRH, not yet at the final segment
        segs = [dst] + rng.sample(SIDS, rng.randrange(1, 4))
        return build(
            src,
            dst,
            (50000 + ssid) & 0xFFFF,
            dport,
            payload,
            segments=segs,
            segleft=rng.randrange(1, len(segs)),
            hlim=hlim,
        )
    return build(src, dst, (50000 + ssid) & 0xFFFF, dport, payload, hbh=True, hlim=hlim)


def collector_seed(rng: random.Random) -> bytes:
    ssid = rng.choice(SSIDS)
    src, dst = rng.choice(REFL_ADDRS), rng.choice(SENDERS)
    sport = 862 if rng.random() < 0.9 else rng.choice([861, 863, 0])
    dport = (50000 + ssid) & 0xFFFF if rng.random() < 0.8 else rng.choice(COLLECTOR_PORTS)
    payload = reflector_payload(rng, ssid, rng.choice([0, 0, 0, 4, 8, 100]))
    kind = rng.randrange(4)
    if kind <= 1:
        return build(src, dst, sport, dport, payload, hlim=rng.randrange(256))
    if kind == 2:  # the reply's return path SRH, arrived at the final segment
        segs = [dst] + rng.sample(SIDS, rng.randrange(1, 4))
        return build(src, dst, sport, dport, payload, segments=segs, hlim=rng.randrange(256))
    segs = [dst] + rng.sample(SIDS, rng.randrange(1, 4))
    return build(src, segs[-1], sport, dport, payload, segments=segs, segleft=rng.randrange(1, len(segs)))


# ---- mutators ------------------------------------------------------------------------


def fix_udp_checksum(f: bytes) -> bytes:
    """Recompute the UDP checksum if the frame still parses to a UDP datagram inside the frame."""
    if len(f) < L4_NO_SRH or f[12:14] != b"\x86\xdd":
        return f
    t = parse_transport(f)
    if t.outcome != "ok":
        return f
    ulen = struct.unpack_from("!H", f, t.udp_off + 4)[0]
    if ulen < 8 or t.udp_off + ulen > len(f):
        return f
    d = f[t.udp_off : t.udp_off + ulen]
    c = udp6_checksum(f[22:38], f[38:54], d[:6] + b"\0\0" + d[8:])
    return f[: t.udp_off + 6] + struct.pack("!H", c) + f[t.udp_off + 8 :]


def _put16(f: bytes, off: int, v: int) -> bytes:
    if off + 2 > len(f):
        return f
    return f[:off] + struct.pack("!H", v & 0xFFFF) + f[off + 2 :]


def _put8(f: bytes, off: int, v: int) -> bytes:
    if off >= len(f):
        return f
    return f[:off] + bytes([v & 0xFF]) + f[off + 1 :]


def _udp_off(f: bytes) -> int | None:
    if len(f) < L4_NO_SRH:
        return None
    t = parse_transport(f)
    return t.udp_off if t.outcome == "ok" else None


def _lie(rng: random.Random, true: int) -> int:
    return rng.choice(
        [
            0,
            1,
            7,
            8,
            51,
            52,
            rng.randrange(65536),
            0xFFFF,
            true + rng.randint(-16, 16),
            true + rng.choice([-8, -1, 1, 8, 44]),
        ]
    )


def m_bitflip(rng, f):
    b = bytearray(f)
    if not b:
        return f
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(min(len(b), 130)) if rng.random() < 0.7 else rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
    return bytes(b)


def m_truncate(rng, f):
    return f[: rng.randrange(len(f) + 1)]


def m_ip_payload_len(rng, f):
    return _put16(f, 18, _lie(rng, len(f) - L4_NO_SRH))


def m_srh_fields(rng, f):
    if len(f) < L4_NO_SRH + 8 or f[20] != 43:
        return m_insert_srh(rng, f)
    field = rng.choice([55, 57, 58, 56])  # hdrlen, segments left, last entry, routing type
    return _put8(f, field, rng.choice([0, 1, 2, 3, 4, 5, 7, 8, 16, 254, 255, rng.randrange(256)]))


def m_insert_srh(rng, f):
    if len(f) < L4_NO_SRH:
        return f
    n = rng.randint(0, 3)
    segs = [f[38:54]] + rng.sample(SIDS, n)
    h = srh(segs, 0 if rng.random() < 0.7 else rng.randrange(n + 1), f[20])
    if rng.random() < 0.5:
        h = bytearray(h)
        h[rng.choice([1, 3, 4])] = rng.randrange(256)
        h = bytes(h)
    out = f[:20] + b"\x2b" + f[21:L4_NO_SRH] + h + f[L4_NO_SRH:]
    return _put16(out, 18, struct.unpack_from("!H", f, 18)[0] + len(h))


def m_udp_len(rng, f):
    off = _udp_off(f)
    if off is None:
        return m_bitflip(rng, f)
    return _put16(f, off + 4, _lie(rng, len(f) - off))


def m_random_frame(rng, f):
    if rng.random() < 0.5:
        return rng.randbytes(rng.randrange(200))
    hdr = f[:L4_NO_SRH] if len(f) >= L4_NO_SRH else eth() + ipv6(SENDERS[0], REFL_ADDRS[0], 17, 0)
    return hdr + rng.randbytes(rng.randrange(120))


def m_next_header(rng, f):
    if len(f) >= L4_NO_SRH + 8 and f[20] == 43 and rng.random() < 0.5:
        return _put8(f, L4_NO_SRH, rng.choice(NEXT_HEADERS))
    return _put8(f, 20, rng.choice(NEXT_HEADERS))


def m_ipv4(rng, f):
    """The same UDP/STAMP payload over IPv4 (ethertype 0x0800, or 0x86dd with an IPv4 header)."""
    off = _udp_off(f)
    body = f[off:] if off is not None else f[L4_NO_SRH:]
    ip4 = struct.pack(
        "!BBHHHBBH4s4s", 0x45, 0, 20 + len(body), 0, 0, 64, 17, 0, bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])
    )
    return eth(b"\x08\x00" if rng.random() < 0.7 else b"\x86\xdd") + ip4 + body


def m_vlan(rng, f):
    tags = b"".join(b"\x81\x00" + struct.pack("!H", rng.randrange(4096)) for _ in range(rng.randint(1, 2)))
    return f[:12] + tags + f[12:]


def m_version(rng, f):
    return _put8(f, 14, (rng.choice([0, 4, 5, 7, 15]) << 4) | (f[14] & 0x0F)) if len(f) > 14 else f


def m_checksum(rng, f):
    off = _udp_off(f)
    if off is None:
        return m_bitflip(rng, f)
    if rng.random() < 0.3 and off + 8 <= len(f):
        # what a kernel socket behind a veth sends with checksum offload on: the pseudo-header
        # sum alone (the programs accept it by default, README)
        ulen = struct.unpack_from("!H", f, off + 4)[0]
        return _put16(f, off + 6, ones_sum(f[22:38] + f[38:54] + struct.pack("!I3xB", ulen, 17)))
    return _put16(f, off + 6, rng.choice([0, 0xFFFF, rng.randrange(65536)]))


def m_src_special(rng, f):
    if len(f) < L4_NO_SRH:
        return f
    src = rng.choice(
        [
            bytes([0xFF, 0x02]) + bytes(13) + b"\x01",
            bytes(15) + b"\x01",
            bytes(16),
            bytes([0xFF, 0x0E]) + rng.randbytes(14),
        ]
    )
    return f[:22] + src + f[38:]


def m_insert_delete(rng, f):
    i = rng.randrange(len(f) + 1)
    if rng.random() < 0.5 and f:
        return f[:i] + f[i + rng.randint(1, 16) :]
    return f[:i] + rng.randbytes(rng.randint(1, 16)) + f[i:]


def m_tail(rng, f):
    return f + rng.randbytes(rng.randint(1, 64))


MUTATORS = [
    m_bitflip,
    m_bitflip,
    m_truncate,
    m_ip_payload_len,
    m_srh_fields,
    m_insert_srh,
    m_udp_len,
    m_random_frame,
    m_next_header,
    m_ipv4,
    m_vlan,
    m_version,
    m_checksum,
    m_src_special,
    m_insert_delete,
    m_tail,
]


def mutate(rng: random.Random, f: bytes) -> tuple[bytes, list[str]]:
    """1-3 mutators in a row; returns the frame and their names (m_ prefix dropped)."""
    names = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        m = rng.choice(MUTATORS)
        names.append(m.__name__[2:])
        f = m(rng, f)
    if rng.random() < 0.5:  # a consistent checksum lets the frame reach the deeper checks
        f = fix_udp_checksum(f)
    return f[:2048], names


def frames(rng: random.Random, seed_fn, count: int):
    """count frames: every truncation length of a few seeds, then 15 % seeds and 85 % mutants."""
    produced = 0
    for _ in range(4):
        s = seed_fn(rng)
        for n in range(len(s) + 1):
            if produced >= count:
                return
            yield "truncate_sweep", s[:n]
            produced += 1
    while produced < count:
        s = seed_fn(rng)
        if rng.random() < 0.15:
            yield "seed", s
        else:
            f, names = mutate(rng, s)
            yield "+".join(names), f
        produced += 1
