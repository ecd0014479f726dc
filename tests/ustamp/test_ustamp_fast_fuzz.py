"""Random and mutated datagrams through both engines of the user-space reflector, over real sockets.

The same corpus (tests/ustamp/fuzz_reflector.py's generators: valid, with TLVs, authenticated,
mutated, random bytes) goes to the Python engine and then to the fast engine (C workers deciding
what they answer and what they hand to the Python code) in namespaces usd-s / usd-x. Both must
count every datagram in the same outcome counters and send the same replies, byte for byte but for
the times (T2, T3, the HMACs over them). Sessions are stateless here (a stateful number depends on
the order two paths finish in; test_ustamp_fast.py checks it), and the per-sender TLV values
(Direct Measurement, Follow-Up Telemetry) are compared by length only for the same reason.
USTAMP_FAST_FUZZ_COUNT datagrams per engine (default 3000).
"""

from __future__ import annotations

import json
import os
import random
import select
import socket
import struct
import subprocess
import time

import pytest
from fuzz_reflector import TLV_SAMPLES, key_ring, mutate
from ustamp_env import REPO, ReflectorProc, socket_in_netns

from tests.datapath.dp_env import VethPair
from tests.isolation import own_name

pytestmark = pytest.mark.datapath

KEY = bytes(range(32))  # fuzz_reflector.key_ring()'s key
SESSIONS = ["--ssid 1", "--ssid 3 --format ntp --return-sids fc00:d5::e1"]
FAST_ONLY = {"slow_path", "slow_path_queue_full", "srh_switches", "batches"}
PER_SENDER_TLVS = (5, 7)  # Direct Measurement, Follow-Up Telemetry: values depend on the order
# datagrams sent but not yet counted `received` by the reflector, at most (checked every CHECK_EVERY):
# 100 of these datagrams fit a default 208 KiB socket buffer many times over
WINDOW, CHECK_EVERY = 100, 50


def corpus(count: int, seed: int) -> list[bytes]:
    """Datagrams whose first four octets are their index (the key of their reply: the Session-Sender
    Sequence Number the reflector copies), authenticated ones signed after that."""
    rng = random.Random(seed)
    ring = key_ring()
    out = []
    for i in range(count):
        kind = rng.choice(("random", "valid", "valid_tlvs", "auth", "auth_tlvs", "mutated", "mutated_auth", "short"))
        if kind == "random":
            p = bytearray(os.urandom(rng.randrange(4, 200)))
        elif kind == "short":
            p = bytearray(os.urandom(rng.randrange(4, 44)))
        elif kind.startswith("valid") or kind == "mutated":
            p = bytearray(44)
            struct.pack_into("!IIIHH", p, 0, 0, rng.getrandbits(32), rng.randrange(10**9), rng.getrandbits(16), 0)
            struct.pack_into("!H", p, 14, rng.choice((0, 1, 3, 9)))
            if kind != "valid":
                p += b"".join(rng.choice(TLV_SAMPLES) for _ in range(rng.randrange(1, 4)))
        else:
            p = bytearray(112)
            struct.pack_into("!IIHH", p, 16, rng.getrandbits(32), rng.randrange(10**9), rng.getrandbits(16), 2)
            if kind == "auth_tlvs":
                p += b"".join(rng.choice(TLV_SAMPLES) for _ in range(rng.randrange(1, 3)))
        struct.pack_into("!I", p, 0, i)
        if kind.endswith("auth") or kind == "auth_tlvs":
            ring.sign_packet(p, time.clock_gettime_ns(time.CLOCK_TAI))
        if kind.startswith("mutated"):
            p = mutate(rng, p)
            if len(p) >= 4:
                struct.pack_into("!I", p, 0, i)
        out.append(bytes(p))
    return out


def masked(reply: bytes) -> bytes:
    """Times and HMACs zeroed, per-sender TLV values zeroed (their length stays)."""
    b = bytearray(reply)
    auth = len(b) >= 112 and struct.unpack_from("!I", b, 4)[0] == 0 and b[4:16] == bytes(12)
    if auth:  # RFC 8762 §4.3.2: T3 16-23, T2 32-39, HMAC 96-111
        spans, off = [(16, 24), (32, 40), (96, 112)], 112
    else:  # §4.3.1: T3 4-11, T2 16-23
        spans, off = [(4, 12), (16, 24)], 44
    for lo, hi in spans:
        b[lo:hi] = bytes(hi - lo)
    while off + 4 <= len(b):
        _flags, t, length = struct.unpack_from("!BBH", b, off)
        if off + 4 + length > len(b):
            break
        if t in PER_SENDER_TLVS or t == 8:  # and the HMAC TLV's value (covers the times)
            b[off + 4 : off + 4 + length] = bytes(length)
        off += 4 + length
    return bytes(b)


def run(pair: VethPair, engine: str, key_file: str, datagrams: list[bytes]) -> tuple[dict, dict]:
    args = [a for s in SESSIONS for a in ("--add-session", s)]
    args += ["--add-session", f"--ssid 2 --mode authenticated --key-file {key_file}"]
    r = ReflectorProc(pair.x_ns, "--engine", engine, *args)
    sk = socket_in_netns(pair.s_ns, socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        sk.setsockopt(socket.SOL_SOCKET, 33, 16 << 20)  # SO_RCVBUFFORCE: every reply waits for us
        sk.bind((pair.s_addr, 40870))
        replies: dict[int, list[bytes]] = {}
        start = time.monotonic()
        for i, d in enumerate(datagrams):
            sk.sendto(d, (pair.x_addr, 862))
            # paced (2000/s) and at most WINDOW datagrams ahead of what the reflector has accounted for
            # (a starved engine on a busy machine): neither engine's socket nor the fast engine's queue
            # to Python overflows
            delay = start + (i + 1) / 2000 - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if (i + 1) % CHECK_EVERY == 0:
                deadline = time.monotonic() + 60
                while i + 1 - r.counters()["received"] > WINDOW and time.monotonic() < deadline:
                    time.sleep(0.02)
        while select.select([sk], [], [], 1.5)[0]:
            reply = sk.recv(65535)
            key_off = 48 if len(reply) >= 112 and reply[4:16] == bytes(12) else 24
            replies.setdefault(struct.unpack_from("!I", reply, key_off)[0], []).append(reply)
        return replies, r.stop()
    finally:
        r.kill()
        sk.close()


@pytest.fixture(scope="module")
def pair(bpffs):
    subprocess.run(["make", "-s", "-C", str(REPO / "collectors")], check=True)
    usd = own_name("usd")
    p = VethPair(s_ns=f"{usd}-s", x_ns=f"{usd}-x", s_dev=f"{usd}-s0", x_dev=f"{usd}-x0")
    p.setup()
    try:
        yield p
    finally:
        p.teardown()


def test_fast_engine_answers_every_datagram_like_the_python_engine(pair, tmp_path):
    count = int(os.environ.get("USTAMP_FAST_FUZZ_COUNT", "3000"))
    key_file = tmp_path / "keys.json"
    key_file.write_text(json.dumps({"keys": [{"id": 1, "key_hex": KEY.hex()}], "current": 1}))
    datagrams = corpus(count, seed=8621)
    old, old_c = run(pair, "python", str(key_file), datagrams)
    new, new_c = run(pair, "fast", str(key_file), datagrams)
    assert new_c["socket_drops"] == old_c["socket_drops"] == 0 and new_c["slow_path_queue_full"] == 0
    assert {k: v for k, v in new_c.items() if k not in FAST_ONLY} == old_c
    assert new_c["received"] == count
    assert new_c["slow_path"] + new_c["batches"] > 0
    # every kind of outcome happened, so the comparison covers the C workers' every decision
    for outcome in ("reflected", "unknown_session", "malformed_short", "auth_failed"):
        assert new_c[outcome] > count // 50, (outcome, new_c)
    base_replies = sum(len(r) == 44 for v in new.values() for r in v)  # answered by the C workers
    assert new_c["slow_path"] > count // 10 and base_replies > count // 20, (new_c["slow_path"], base_replies)
    assert sorted(old) == sorted(new)
    assert sum(len(v) for v in new.values()) == new_c["reflected"]
    mismatches = [k for k in old if sorted(map(masked, old[k])) != sorted(map(masked, new[k]))]
    assert not mismatches, [(k, old[k][0].hex(), new[k][0].hex()) for k in mismatches[:3]]
    print(f"\n{count} datagrams: {json.dumps({k: new_c[k] for k in sorted(new_c) if new_c[k]})}")
