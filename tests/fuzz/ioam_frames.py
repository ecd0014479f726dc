"""Frames for fuzzing ioam_rx: instrumented packets as the egress edge sees them (schemas/IOAM.md)
and mutants of them. Every seed remembers where its fields are, so mutators can aim at them
(lengths, types, namespaces, next headers) as well as hit random bytes.
"""

from __future__ import annotations

import random
import socket
import struct
from dataclasses import dataclass, field

from tests.fuzz.ioam_oracle import Flow

ETHER = bytes.fromhex("020000000002020000000001") + b"\x86\xdd"


def a6(s: str) -> bytes:
    return socket.inet_pton(socket.AF_INET6, s)


POLICY = ["fc00:2::e", "fc00:3::d6"]  # travel order
OTHER = ["fc00:9::1", "fc00:9::2", "fc00:9::3"]
SIX = [f"fc00:6::{i}" for i in range(1, 7)]
SEVEN = [f"fc00:7::{i}" for i in range(1, 8)]
UNMONITORED = ["fc00:2::e", "fc00:3::d7"]
FLOWS_CLI = [(POLICY, 7, 123), (OTHER, 8, 200), (SIX, 9, 123)]  # (SIDs, flow id, namespace) installed


def wire_key(travel: list[str]) -> tuple[bytes, ...]:
    return tuple(a6(s) for s in reversed(travel))


FLOWS = {wire_key(sids): Flow(fid, ns) for sids, fid, ns in FLOWS_CLI}


@dataclass
class Seed:
    name: str
    frame: bytes
    at: dict[str, int] = field(default_factory=dict)  # field name -> byte offset in the frame


def node(i: int) -> bytes:
    return struct.pack("!IHHII", (64 - i) << 24 | (0x100 + i), 10 + i, 20 + i, 1_795_000_000 + i, 1000 * i)


def build(
    name: str,
    travel: list[str] = POLICY,
    ns: int = 123,
    slots: int = 4,
    filled: int = 2,
    flags: int = 0,
    altmark: bool = False,
    e2e: bool = True,
    pre: bytes = b"\x01\x00",
    post: bytes = b"",
    trailer: bytes = b"",
    e2e_ns: int | None = None,
) -> Seed:
    at = {}
    opt = struct.pack(
        "!BBBBHBB", 0x31, 10 + 16 * slots, 0, 0, ns, 4 << 3 | flags >> 1, (flags & 1) << 7 | 4 * (slots - filled)
    )
    opt += b"\xf0\x00\x00\x00" + bytes(16 * (slots - filled)) + b"".join(node(i) for i in range(filled))
    body = pre + opt + post
    pad = (-(2 + len(body))) % 8
    body += b"\x00" if pad == 1 else (bytes([1, pad - 2]) + bytes(pad - 2) if pad else b"")
    hbh = bytes([60 if altmark else 43, (2 + len(body)) // 8 - 1]) + body
    o = 54 + 2 + len(pre)
    if pre[:1] == b"\x01":  # a PadN in front: its length and a content byte
        at |= {"pre_pad_len": 57, "pre_pad_byte": 58 + max(0, len(pre) - 3)}
    if post:
        at |= {"post": o + len(opt), "post_end": o + len(opt) + len(post) - 1}
    at |= {"hbh_nh": 54, "hbh_len": 55, "opt_len": o + 1, "ioam_type": o + 3, "ns": o + 4, "nodelen": o + 6}
    at |= {"remlen": o + 7, "trace_type": o + 8, "data": o + 12}
    doh = bytes([43, 0, 0x12, 4]) + struct.pack("!I", 7 << 12 | 0x800) if altmark else b""
    wire = [a6(s) for s in reversed(travel)]
    n = len(wire)
    srh = struct.pack("!BBBBBBH", 60 if e2e else 41, 2 * n, 4, 0, n - 1, 0, 0) + b"".join(wire)
    so = 54 + len(hbh) + len(doh)
    at |= {"srh_nh": so, "srh_len": so + 1, "srh_type": so + 2, "segleft": so + 3, "last_entry": so + 4}
    e = b""
    if e2e:
        e = bytes([41, 3, 1, 0, 0x11, 22, 0, 3]) + struct.pack(
            "!HHQII", ns if e2e_ns is None else e2e_ns, 0xB000, 0x0102030405060708, 1_795_000_123, 456_789_012
        )
        e += b"\x01\x02\x00\x00"
        eo = so + len(srh)
        at |= {"e2e_len": eo + 1, "e2e_opt_len": eo + 5, "e2e_type_ioam": eo + 7, "e2e_ns": eo + 8}
        at |= {"e2e_type": eo + 10, "e2e_nsec": eo + 24}
    inner = struct.pack("!IHBB", 6 << 28, 8 + 16, 17, 63) + a6("fd00:a::1") + a6("fd00:b::1")
    inner += struct.pack("!HHHH", 40000, 9000, 24, 0) + bytes(range(16))
    payload = hbh + doh + srh + e + inner
    ip6 = struct.pack("!IHBB", 6 << 28, len(payload), 0, 61) + a6("fc00:12::1") + a6(travel[-1])
    at |= {"plen": 18, "outer_nh": 20, "hop_limit": 21}
    return Seed(name, ETHER + ip6 + payload + trailer, at)


def seeds() -> list[Seed]:
    return [
        build("policy_4_2"),
        build("altmark_doh", altmark=True),
        build("full_12", slots=12, filled=12),
        build("15_slots_14_filled", slots=15, filled=14),
        build("overflow", slots=2, filled=2, flags=0x8),
        build("other_flow_1_slot", travel=OTHER, ns=200, slots=1, filled=1),
        build("empty_trace", slots=3, filled=0),
        build("six_sids", travel=SIX),
        build("seven_sids", travel=SEVEN),
        build("unmonitored", travel=UNMONITORED),
        build("other_namespace", ns=124),
        build("e2e_other_namespace", e2e_ns=200),
        build("no_e2e", e2e=False),
        build("pad1_layout_router_alert", pre=b"\x00\x00", post=b"\x05\x02\x00\x00"),
        build("trailer", trailer=bytes(range(9))),
        # near the walk's limits: a run of 6 bytes of padding, a run of 7, 16 options in all
        build("padn6_before", pre=b"\x01\x04\x00\x00\x00\x00"),
        build("padding_run_7_after", post=b"\x1e\x07" + bytes(7) + b"\x01\x05" + bytes(5)),
        build("sixteen_options", post=b"\x1e\x00" * 13 + b"\x1e\x04" + bytes(4)),
        Seed("no_hbh", ETHER + struct.pack("!IHBB", 6 << 28, 8, 17, 64) + a6("fc00::1") + a6("fc00::2") + bytes(8)),
    ]


INTERESTING = [0, 1, 2, 3, 4, 5, 6, 7, 8, 0x0F, 0x10, 0x11, 0x12, 0x1F, 0x20, 0x29, 0x2B, 0x31, 0x3C, 0x7F, 0x80, 0xFF]


def _set(b: bytearray, off: int, value: int) -> None:
    if off < len(b):
        b[off] = value & 0xFF


def mutate(seed: Seed, rng: random.Random) -> tuple[str, bytes]:
    b = bytearray(seed.frame)
    names = []
    for _ in range(rng.choice((1, 1, 1, 2, 2, 3))):
        m = rng.random()
        if m < 0.35 and seed.at:  # a field: a nearby or an interesting value
            name = rng.choice(sorted(seed.at))
            off = seed.at[name] + (rng.randrange(4) if name in ("trace_type", "e2e_nsec", "data") else 0)
            if off < len(b):
                b[off] = rng.choice([rng.choice(INTERESTING), (b[off] + rng.choice((-1, 1, 4, 16))) & 0xFF])
                if name in ("post", "post_end", "pre_pad_byte") and rng.random() < 0.5:
                    b[off] = rng.choice((0, 1, 0x1E))  # a Pad1, a PadN, another option
            names.append(f"field:{name}")
        elif m < 0.5 and b:
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
            names.append("bitflip")
        elif m < 0.6:
            del b[rng.randrange(14, max(15, len(b))) :]
            names.append("truncate")
        elif m < 0.7 and len(b) >= 20:
            plen = struct.unpack_from("!H", b, 18)[0]
            struct.pack_into("!H", b, 18, max(0, min(0xFFFF, plen + rng.choice((-64, -16, -8, -1, 1, 8, 300)))))
            names.append("payload_len")
        elif m < 0.77:
            i = rng.randrange(54, max(55, len(b)))
            b[i:i] = rng.choice(
                [b"\x00", b"\x01\x00", b"\x01\x02\x00\x00", b"\x1e\x00", bytes(rng.randrange(1, 9)), rng.randbytes(8)]
            )
            names.append("insert")
        elif m < 0.84 and len(b) > 60:
            i = rng.randrange(54, len(b) - 1)
            del b[i : i + rng.randrange(1, 9)]
            names.append("delete")
        elif m < 0.9:
            b += rng.randbytes(rng.randrange(1, 40))
            names.append("tail")
        elif m < 0.93:
            _set(b, 12, 0x08)
            _set(b, 13, 0x00)
            names.append("ipv4")
        elif m < 0.97 and "e2e_nsec" in seed.at:
            off = seed.at["e2e_nsec"]
            if off + 4 <= len(b):
                struct.pack_into("!I", b, off, rng.choice((999_999_999, 1_000_000_000, 0xFFFFFFFF)))
            names.append("nsec")
        else:
            _set(b, rng.choice([seed.at.get("outer_nh", 20), seed.at.get("hbh_nh", 54), seed.at.get("srh_nh", 54)]),
                 rng.choice([0, 6, 17, 41, 43, 59, 60]))  # fmt: skip
            names.append("next_header")
    return "+".join(names), bytes(b)


def frames(n: int, seed: int):
    """(origin, frame): the seeds, every length of three of them, then mutants until n."""
    rng = random.Random(seed)
    base = seeds()
    count = 0
    for s in base:
        yield "seed", s.frame
        count += 1
    for s in (base[0], base[1], base[13], base[17]):
        for length in range(14, len(s.frame)):
            yield "truncate_sweep", s.frame[:length]
            count += 1
    while count < n:
        yield mutate(rng.choice(base), rng)
        count += 1
