"""The checks the XDP programs make so that they never reflect or collect what the kernel's IPv6/UDP
stack would drop (datapath/README.md, "Counters"): IPv6 version and Payload Length (RFC 8200 §3),
UDP length within the IPv6 payload, source address class (RFC 4291), UDP checksum zero (RFC 8200
§8.1) or wrong (full check before reflecting / collecting, UDP datagrams up to 1500 bytes).

Crafted frames through the loaders' `test-run` (BPF_PROG_TEST_RUN on the pinned program); every frame
moves exactly one counter. Checksums are computed here with an independent Python implementation.
"""

from __future__ import annotations

import socket
import struct

import pytest

from tests.datapath.dp_env import (
    COLLECTOR,
    REFLECTOR,
    Attached,
    delta,
    eth_ipv6,
    parse_frame,
    prog_test_run,
    run_tool,
    srh_wire,
    stamp_sender_payload,
    stats,
    tai_ns,
    udp6_checksum,
    udp_datagram,
)
from tests.datapath.test_collector import dump

pytestmark = pytest.mark.datapath

S, R, OTHER = "fd00:d5::1", "fd00:d5::2", "fd00:d5::3"  # VethPair: sender, reflector, not a reflector address
SID = "fc00:d5::e1"
UDP_CSUM_MAX_LEN = 1500
BASE = 8 + 44  # UDP header + STAMP base packet


@pytest.fixture(scope="module")
def progs(veth):
    """Reflector (session 7 plain, 9 with --tlv echo) and collector (session 25 from port 50025)."""
    with Attached(veth, with_collector=True) as att:
        run_tool(REFLECTOR, "add-session", "--pin-dir", str(att.refl_dir), "--ssid", "7")
        run_tool(REFLECTOR, "add-session", "--pin-dir", str(att.refl_dir), "--ssid", "9", "--tlv", "echo")
        run_tool(COLLECTOR, "activate", "--pin-dir", str(att.coll_dir), "--ssid", "25", "--port", "50025")
        yield att


def run_counted(tool, pin_dir, frame: bytes) -> tuple[dict, dict]:
    before = stats(tool, pin_dir)
    out = prog_test_run(tool, pin_dir, frame)
    return out, delta(before, stats(tool, pin_dir))


# ---- frames -----------------------------------------------------------------------------


def sender_frame(ssid: int = 7, tlv: bytes = b"", src: str = S, dst: str = R, dport: int = 862) -> bytes:
    return eth_ipv6(
        src, dst, 17, udp_datagram(src, dst, 40000, dport, stamp_sender_payload(3, ssid, tai_ns(), extra=tlv))
    )


def reply_frame(ssid: int = 25, tlv: bytes = b"", src: str = R, srh: bool = False) -> bytes:
    now = tai_ns()
    ts = ((now // 10**9) & 0xFFFFFFFF, now % 10**9)
    payload = struct.pack("!I2IHH2II2IHHB3s", 4, *ts, 0x4000, ssid, *ts, 4, *ts, 0x4001, 0, 64, bytes(3)) + tlv
    udp = udp_datagram(src, S, 862, 50025, payload)
    if srh:
        return eth_ipv6(src, S, 43, srh_wire([S, SID], 0) + udp)
    return eth_ipv6(src, S, 17, udp)


def udp_off(f: bytes) -> int:
    return 54 + ((f[55] + 1) * 8 if f[20] == 43 else 0)


def set_version(f: bytes, version: int) -> bytes:
    return f[:14] + bytes([version << 4 | (f[14] & 0x0F)]) + f[15:]


def set_plen(f: bytes, plen: int) -> bytes:
    return f[:18] + struct.pack("!H", plen) + f[20:]


def plen(f: bytes) -> int:
    return struct.unpack_from("!H", f, 18)[0]


def set_src(f: bytes, src: str) -> bytes:
    """New source address, UDP checksum recomputed (so only the address class is wrong)."""
    f = f[:22] + socket.inet_pton(socket.AF_INET6, src) + f[38:]
    u = udp_off(f)
    ulen = struct.unpack_from("!H", f, u + 4)[0]
    udp = f[u : u + 6] + b"\0\0" + f[u + 8 : u + ulen]
    final_dst = socket.inet_ntop(socket.AF_INET6, f[38:54])
    csum = udp6_checksum(src, final_dst, udp) or 0xFFFF
    return f[: u + 6] + struct.pack("!H", csum) + f[u + 8 :]


def set_csum(f: bytes, csum: int) -> bytes:
    u = udp_off(f)
    return f[: u + 6] + struct.pack("!H", csum) + f[u + 8 :]


def flip(f: bytes, off: int) -> bytes:
    return f[:off] + bytes([f[off] ^ 0x10]) + f[off + 1 :]


def csum_ok(f: bytes) -> bool:
    p = parse_frame(f)
    final_dst = p.srh["segments"][0] if p.srh else p.dst
    ulen = struct.unpack_from("!H", p.udp, 4)[0]
    return struct.unpack_from("!H", p.udp, 6)[0] != 0 and udp6_checksum(p.src, final_dst, p.udp[:ulen]) == 0


def csum_of(f: bytes) -> int:
    return struct.unpack_from("!H", f, udp_off(f) + 6)[0]


# ---- the same defects, reflector and collector ----------------------------------------------


def defects(make) -> dict[str, tuple[bytes, str]]:
    """name -> (frame, the one counter it must land in); every frame is otherwise accepted."""
    f = make()
    u = udp_off(f)
    return {
        "version_4": (set_version(f, 4), "drop_malformed_ipv6"),
        "version_0": (set_version(f, 0), "drop_malformed_ipv6"),
        "version_15": (set_version(f, 15), "drop_malformed_ipv6"),
        "payload_len_beyond_frame_by_1": (set_plen(f, plen(f) + 1), "drop_malformed_ipv6"),
        "payload_len_0xffff": (set_plen(f, 0xFFFF), "drop_malformed_ipv6"),
        # the UDP datagram runs past the IPv6 payload (the frame has the bytes: padding)
        "payload_len_short_by_1": (set_plen(f + b"\0", plen(f) - 1), "drop_malformed_short"),
        "payload_len_short_by_8": (set_plen(f + bytes(8), plen(f) - 8), "drop_malformed_short"),
        "src_unspecified": (set_src(f, "::"), "drop_malformed_src_addr"),
        "src_loopback": (set_src(f, "::1"), "drop_malformed_src_addr"),
        "src_multicast_ff02": (set_src(f, "ff02::1"), "drop_malformed_src_addr"),
        "src_multicast_ff0e": (set_src(f, "ff0e:1234::5"), "drop_malformed_src_addr"),
        "udp_checksum_zero": (set_csum(f, 0), "drop_malformed_udp_csum"),
        "udp_checksum_off_by_one": (set_csum(f, (csum_of(f) + 1) & 0xFFFF or 1), "drop_malformed_udp_csum"),
        "udp_payload_bit_flip": (flip(f, u + 8 + 20), "drop_malformed_udp_csum"),
        "ip_src_bit_flip": (flip(f, 30), "drop_malformed_udp_csum"),  # pseudo-header: address changed
        # checks in order: the version is looked at before the source address
        "version_and_src": (set_version(set_src(f, "::1"), 4), "drop_malformed_ipv6"),
    }


REFL_DEFECTS = defects(sender_frame)
COLL_DEFECTS = defects(reply_frame)


@pytest.mark.parametrize("name", sorted(REFL_DEFECTS))
def test_reflector_drops_defect(progs, name):
    frame, counter = REFL_DEFECTS[name]
    assert csum_ok(sender_frame()) and run_counted(REFLECTOR, progs.refl_dir, sender_frame())[1] == {"reflected": 1}
    out, d = run_counted(REFLECTOR, progs.refl_dir, frame)
    assert (out["action"], d) == ("XDP_DROP", {counter: 1})


@pytest.mark.parametrize("name", sorted(COLL_DEFECTS))
def test_collector_drops_defect(progs, name):
    frame, counter = COLL_DEFECTS[name]
    out, d = run_counted(COLLECTOR, progs.coll_dir, reply_frame())
    assert d == {"collected": 1} and len(dump(progs.coll_dir, 1)) == 1
    out, d = run_counted(COLLECTOR, progs.coll_dir, frame)
    assert (out["action"], d) == ("XDP_DROP", {counter: 1})
    assert dump(progs.coll_dir, 1, timeout_ms=100, check=False) == []  # no record from a dropped reply


def test_reflector_srh_packet_checks_use_the_final_destination(progs):
    """With a final SRH the pseudo-header's destination is the IPv6 destination (= segments[0])."""
    udp = udp_datagram(S, R, 40000, 862, stamp_sender_payload(3, 7, tai_ns()))
    good = eth_ipv6(S, R, 43, srh_wire([R, SID], 0) + udp)
    out, d = run_counted(REFLECTOR, progs.refl_dir, good)
    assert (out["action"], d) == ("XDP_TX", {"reflected": 1}) and csum_ok(out["data_out"])
    # Payload Length covering the SRH but not the whole datagram (the frame has all of it)
    out, d = run_counted(REFLECTOR, progs.refl_dir, set_plen(good, plen(good) - 4))
    assert (out["action"], d) == ("XDP_DROP", {"drop_malformed_short": 1})
    out, d = run_counted(REFLECTOR, progs.refl_dir, set_csum(good, csum_of(good) ^ 0x0100))
    assert (out["action"], d) == ("XDP_DROP", {"drop_malformed_udp_csum": 1})


def test_collector_srh_reply_checks(progs):
    good = reply_frame(srh=True)
    out, d = run_counted(COLLECTOR, progs.coll_dir, good)
    assert d == {"collected": 1} and len(dump(progs.coll_dir, 1)) == 1
    for frame, counter in [
        (set_csum(good, 0), "drop_malformed_udp_csum"),
        (flip(good, len(good) - 1), "drop_malformed_udp_csum"),
        (set_src(good, "ff02::2"), "drop_malformed_src_addr"),
        (set_plen(good, plen(good) + 2), "drop_malformed_ipv6"),
    ]:
        out, d = run_counted(COLLECTOR, progs.coll_dir, frame)
        assert (out["action"], d) == ("XDP_DROP", {counter: 1})
    assert dump(progs.coll_dir, 1, timeout_ms=100, check=False) == []


# TLV area lengths: odd tails (1..3 bytes), every bpf_csum_diff chunk size (4..512), up to the
# largest verified datagram (1500 - 52 = 1448 bytes after the base packet)
TLV_LENGTHS = [
    1,
    2,
    3,
    4,
    5,
    7,
    8,
    12,
    16,
    31,
    32,
    64,
    100,
    127,
    128,
    255,
    256,
    511,
    512,
    513,
    1023,
    1024,
    1025,
    1400,
    1447,
    1448,
]


def tlv_bytes(n: int) -> bytes:
    return bytes((i * 37 + 11) & 0xFF for i in range(n))


@pytest.mark.parametrize("n", TLV_LENGTHS)
def test_reflector_verifies_every_length(progs, n):
    """Right checksum: reflected with a right checksum; a single bit flipped anywhere after the base
    packet (first, middle, last byte): dropped. So every chunk of the sum is really added."""
    frame = sender_frame(ssid=9, tlv=tlv_bytes(n))
    out, d = run_counted(REFLECTOR, progs.refl_dir, frame)
    assert (out["action"], d) == ("XDP_TX", {"reflected": 1})
    assert csum_ok(out["data_out"]) and parse_frame(out["data_out"]).udp[BASE:] == tlv_bytes(n)
    u = udp_off(frame)
    for off in sorted({u + BASE, u + BASE + n // 2, len(frame) - 1}):
        out, d = run_counted(REFLECTOR, progs.refl_dir, flip(frame, off))
        assert (out["action"], d) == ("XDP_DROP", {"drop_malformed_udp_csum": 1}), f"bit flipped at {off - u}"


@pytest.mark.parametrize("n", [3, 512, 1448])
def test_collector_verifies_every_length(progs, n):
    frame = reply_frame(tlv=tlv_bytes(n))
    out, d = run_counted(COLLECTOR, progs.coll_dir, frame)
    assert d == {"collected": 1} and len(dump(progs.coll_dir, 1)) == 1
    for off in (udp_off(frame) + BASE, len(frame) - 1):
        out, d = run_counted(COLLECTOR, progs.coll_dir, flip(frame, off))
        assert (out["action"], d) == ("XDP_DROP", {"drop_malformed_udp_csum": 1})
    assert dump(progs.coll_dir, 1, timeout_ms=100, check=False) == []


def test_longer_than_verifiable_goes_to_the_stack(progs):
    """UDP datagram of 1501 bytes: not verified in XDP, passed to the stack (which verifies it)."""
    frame = sender_frame(ssid=9, tlv=tlv_bytes(UDP_CSUM_MAX_LEN - BASE + 1))
    out, d = run_counted(REFLECTOR, progs.refl_dir, frame)
    assert (out["action"], d) == ("XDP_PASS", {"pass_too_long_to_verify": 1})
    assert out["data_out"] == frame
    reply = reply_frame(tlv=tlv_bytes(UDP_CSUM_MAX_LEN - BASE + 1))
    out, d = run_counted(COLLECTOR, progs.coll_dir, reply)
    assert (out["action"], d) == ("XDP_PASS", {"pass_too_long_to_verify": 1})


def test_trailing_bytes_after_the_ipv6_payload_are_allowed(progs):
    """Ethernet padding / a trailer beyond the Payload Length: accepted, not part of the packet.
    The reply keeps the frame's length and its Payload Length; the checksum stays right."""
    frame = sender_frame() + b"\xa5" * 20
    out, d = run_counted(REFLECTOR, progs.refl_dir, frame)
    assert (out["action"], d) == ("XDP_TX", {"reflected": 1})
    reply = out["data_out"]
    assert len(reply) == len(frame) and plen(reply) == plen(frame) and csum_ok(reply)
    assert reply[-20:] == b"\xa5" * 20
    # a wrong checksum is still found: the trailer is not summed, the datagram is
    out, d = run_counted(REFLECTOR, progs.refl_dir, flip(frame, len(frame) - 21))
    assert (out["action"], d) == ("XDP_DROP", {"drop_malformed_udp_csum": 1})
    out, d = run_counted(COLLECTOR, progs.coll_dir, reply_frame() + bytes(6))
    assert d == {"collected": 1} and len(dump(progs.coll_dir, 1)) == 1


def test_other_traffic_is_left_to_the_stack(progs):
    """The checks apply to STAMP packets for us / STAMP replies only; the rest keeps its counter."""
    bad = set_version(set_csum(sender_frame(), 0), 4)
    cases = [
        (REFLECTOR, progs.refl_dir, sender_frame(dst=OTHER), "pass_not_local_addr"),
        (REFLECTOR, progs.refl_dir, set_version(set_csum(sender_frame(dport=863), 0), 4), "pass_other_port"),
        # unknown session, wrong checksum: user space's socket never sees it, the stack drops it
        (REFLECTOR, progs.refl_dir, set_csum(sender_frame(ssid=4242), 1), "pass_unknown_session"),
        (COLLECTOR, progs.coll_dir, bad, "pass_not_stamp_reply"),
        (COLLECTOR, progs.coll_dir, set_csum(reply_frame(ssid=4242), 1), "pass_unknown_session"),
    ]
    for tool, pin_dir, frame, counter in cases:
        out, d = run_counted(tool, pin_dir, frame)
        assert (out["action"], d) == ("XDP_PASS", {counter: 1}), counter
