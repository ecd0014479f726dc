"""Random and mutated datagrams through the user-space reflector's full receive path.

Run inside a private netns (the test does `ip netns exec`): a Reflector on [::1]:<ephemeral>
with unauthenticated, stateful-NTP-with-return-SIDs and authenticated sessions; every datagram
goes through Reflector.handle() with kernel-like ancillary data, replies go to a sink socket.
Checks per datagram, with an oracle independent of the reflector's code:
  - handle() returns one of the outcome counters, never raises;
  - shorter than 44 bytes -> malformed_short; no session -> unknown_session; an authenticated
    session's packet whose HMAC does not verify -> auth_failed; none of these is answered;
  - reflected -> exactly one reply arrives, same length, same SSID and sender seq, and its own
    HMAC verifies (authenticated sessions);
  - at the end received == sum of the outcome counters (every datagram in exactly one).
Prints one JSON line: counts per outcome, per generator, replies checked.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import struct
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "schemas" / "python")]

from collectors.ustamp.auth import KeyRing  # noqa: E402
from collectors.ustamp.netutil import SO_TIMESTAMPNS  # noqa: E402
from collectors.ustamp.reflector import OUTCOMES, Reflector  # noqa: E402
from collectors.ustamp.sessions import SessionTable, make_session  # noqa: E402
from segscope_schemas import stamp_hmac  # noqa: E402
from segscope_schemas.stamp_tlv import encode_tlv  # noqa: E402

KEY = bytes(range(32))
TLV_SAMPLES = [
    encode_tlv(1, bytes(8), 0x80),
    encode_tlv(5, bytes(12), 0x80),
    encode_tlv(3, bytes(4), 0x80),
    encode_tlv(7, bytes(16), 0x80),
    encode_tlv(4, bytes(4), 0x80),
    encode_tlv(200, b"abc", 0x80),
    encode_tlv(10, bytes.fromhex("0001000400000000"), 0x80),
    encode_tlv(9, bytes(16), 0x80),
    encode_tlv(2, bytes(4) + encode_tlv(7, bytes(16)), 0x80),
    encode_tlv(8, bytes(16), 0x80),
]


def key_ring() -> KeyRing:
    table = stamp_hmac.HmacKeyTable()
    table.add(1, KEY)
    return KeyRing(table, 1, "fuzz")


def unauth_packet(rng: random.Random, ssid: int) -> bytearray:
    p = bytearray(44)
    struct.pack_into(
        "!IIIHH", p, 0, rng.getrandbits(32), rng.getrandbits(32), rng.randrange(10**9), rng.getrandbits(16), ssid
    )
    return p


def auth_packet(rng: random.Random, ring: KeyRing, ssid: int) -> bytearray:
    p = bytearray(112)
    struct.pack_into("!I", p, 0, rng.getrandbits(32))
    struct.pack_into("!IIHH", p, 16, rng.getrandbits(32), rng.randrange(10**9), rng.getrandbits(16), ssid)
    ring.sign_packet(p, time.clock_gettime_ns(time.CLOCK_TAI))
    return p


def with_tlvs(rng: random.Random, p: bytearray) -> bytearray:
    return p + b"".join(rng.choice(TLV_SAMPLES) for _ in range(rng.randrange(0, 4)))


def mutate(rng: random.Random, p: bytearray) -> bytearray:
    p = bytearray(p)
    for _ in range(rng.randrange(1, 4)):
        op = rng.randrange(4)
        if op == 0 and p:
            p[rng.randrange(len(p))] ^= 1 << rng.randrange(8)
        elif op == 1:
            del p[rng.randrange(len(p) + 1) :]
        elif op == 2:
            p += os.urandom(rng.randrange(1, 24))
        elif op == 3 and len(p) > 48:  # TLV Length fields: the classic overrun
            struct.pack_into("!H", p, 46, rng.getrandbits(16))
    return p


def generate(rng: random.Random, ring: KeyRing) -> tuple[str, bytes]:
    kind = rng.choice(("random", "valid", "valid_tlvs", "auth", "auth_tlvs", "mutated", "mutated_auth"))
    if kind == "random":
        return kind, os.urandom(rng.randrange(0, 200))
    if kind == "valid":
        return kind, bytes(unauth_packet(rng, rng.choice((1, 3, 9))))
    if kind == "valid_tlvs":
        return kind, bytes(with_tlvs(rng, unauth_packet(rng, rng.choice((1, 3)))))
    if kind == "auth":
        return kind, bytes(auth_packet(rng, ring, 2))
    if kind == "auth_tlvs":
        return kind, bytes(with_tlvs(rng, auth_packet(rng, ring, 2)))
    if kind == "mutated":
        return kind, bytes(mutate(rng, with_tlvs(rng, unauth_packet(rng, rng.choice((1, 3))))))
    return kind, bytes(mutate(rng, auth_packet(rng, ring, 2)))


def asks_no_reply(payload: bytes, base_len: int) -> bool:
    """RFC 9503 §4.1.1: a Return Path TLV (10) whose Control Code sub-TLV (1, Length 4) has the
    Reply Request flag (bit 31, the least significant) clear: No Reply Requested."""
    off = base_len
    while off + 4 <= len(payload):
        _flags, tlv_type, length = struct.unpack_from("!BBH", payload, off)
        if off + 4 + length > len(payload):
            return False
        # the sub-TLV's flags octet does not matter: type 1, Length 4 is the Control Code
        if tlv_type == 10 and length >= 8 and payload[off + 5 : off + 8] == bytes.fromhex("010004"):
            return not payload[off + 11] & 1
        off += 4 + length
    return False


def expected_ssid(payload: bytes, ring: KeyRing) -> tuple[str, int | None]:
    """Oracle: which session a datagram belongs to, from the RFC layouts alone. "reflected" also
    admits "no_reply_requested" when the packet carries a Return Path No Reply Control Code."""
    if len(payload) < 44:
        return "malformed_short", None
    if len(payload) >= 112 and struct.unpack_from("!H", payload, 26)[0] == 2:
        ok = ring.verify(payload[:96], payload[96:112], time.clock_gettime_ns(time.CLOCK_TAI))
        if ok and asks_no_reply(payload, 112):
            return "no_reply_requested?", 2
        return ("reflected" if ok else "auth_failed"), 2
    ssid = struct.unpack_from("!H", payload, 14)[0]
    if ssid in (1, 3):
        return ("no_reply_requested?" if asks_no_reply(payload, 44) else "reflected"), ssid
    if ssid == 2:
        return "auth_failed", None
    return "unknown_session", None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=862)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    ring = key_ring()
    sessions = [make_session("fuzz", 1), make_session("fuzz", 3, return_sids=["::1"], format="ntp", stateful=True)]
    auth = make_session("fuzz", 2)
    auth.keys = ring
    refl = Reflector(SessionTable(sessions + [auth]), "::1", 0)
    sink = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sink.bind(("::1", 0))
    sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    sink.settimeout(1.0)
    peer = ("::1", sink.getsockname()[1], 0, 0)
    now = time.time_ns()
    anc = [
        (socket.SOL_SOCKET, SO_TIMESTAMPNS, struct.pack("=qq", now // 10**9, now % 10**9)),
        (socket.IPPROTO_IPV6, socket.IPV6_HOPLIMIT, struct.pack("=i", 64)),
        (socket.IPPROTO_IPV6, socket.IPV6_PKTINFO, socket.inet_pton(socket.AF_INET6, "::1") + struct.pack("=I", 1)),
    ]
    outcomes, kinds, mismatches = Counter(), Counter(), []
    replies_checked = 0
    for i in range(a.count):
        kind, payload = generate(rng, ring)
        kinds[kind] += 1
        want, ssid = expected_ssid(payload, ring)
        refl.counters["received"] += 1
        got = refl.handle(payload, anc, peer)  # any exception fails the run (traceback, exit 1)
        refl.counters[got] += 1
        outcomes[got] += 1
        if want == "no_reply_requested?":  # honoured unless the TLV was malformed or failed integrity
            want = got if got in ("no_reply_requested", "reflected") else "no_reply_requested"
        if got != want:
            mismatches.append({"i": i, "kind": kind, "want": want, "got": got, "hex": payload.hex()})
            if len(mismatches) > 20:
                break
            continue
        if got == "reflected":
            if ssid == 3:  # return SID ::1 -> the reply has an SRH and goes to ::1's SRH handling
                continue  # (not to the sink); counted, its construction checked for ssid 1/2
            reply = sink.recv(65535)
            replies_checked += 1
            # RFC 8762 §4.3.1 / §4.3.2: SSID at 14 / 26, Session-Sender Sequence Number at 24 / 48
            ssid_off, sseq_off = (14, 24) if ssid == 1 else (26, 48)
            ok = (
                len(reply) == len(payload)
                and struct.unpack_from("!H", reply, ssid_off)[0] == ssid
                and reply[sseq_off : sseq_off + 4] == payload[0:4]
            )
            if ssid == 2:
                ok = ok and ring.verify(reply[:96], reply[96:112], time.clock_gettime_ns(time.CLOCK_TAI))
            if not ok:
                mismatches.append({"i": i, "kind": kind, "reply": reply.hex(), "hex": payload.hex()})
    sink.settimeout(0.2)
    stray = 0
    try:
        while True:
            sink.recv(65535)
            stray += 1
    except (TimeoutError, socket.timeout):
        pass
    c = refl.counters
    accounted = sum(c[k] for k in OUTCOMES)
    print(
        json.dumps(
            {
                "count": a.count,
                "received": c["received"],
                "accounted": accounted,
                "outcomes": dict(outcomes),
                "kinds": dict(kinds),
                "replies_checked": replies_checked,
                "stray_replies": stray,
                "tlv": {k: c[k] for k in c if k.startswith("tlv_")},
                "mismatches": mismatches[:5],
                "n_mismatches": len(mismatches),
            }
        )
    )
    return 0 if not mismatches and accounted == c["received"] == a.count and stray == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
