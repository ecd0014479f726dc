"""Crafted frames through BPF_PROG_TEST_RUN on the pinned reflector: every outcome counted, never XDP_TX
for bad input, replies well formed (checksum verified independently)."""

from __future__ import annotations

import struct

import pytest

from segscope_schemas.stamp_test_packet import ReflectorPacket
from tests.datapath.dp_env import (
    REFLECTOR,
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

pytestmark = pytest.mark.datapath

S, R, OTHER = "fd00:d5::1", "fd00:d5::2", "fd00:d5::3"
SIDS8 = [f"fc00:d5::{i + 1:x}" for i in range(8)]


@pytest.fixture
def refl(veth, reflector):
    d = str(reflector.refl_dir)
    run_tool(REFLECTOR, "add-session", "--pin-dir", d, "--ssid", "7")
    run_tool(REFLECTOR, "add-session", "--pin-dir", d, "--ssid", "8", "--sender", S, "--return-sids", ",".join(SIDS8))
    run_tool(REFLECTOR, "add-session", "--pin-dir", d, "--ssid", "9", "--tlv", "echo")
    return reflector.refl_dir


def stamp_frame(
    ssid: int = 7,
    dport: int = 862,
    dst: str = R,
    payload: bytes | None = None,
    srh: list[str] | None = None,
    hlim: int = 64,
) -> bytes:
    payload = stamp_sender_payload(5, ssid, tai_ns()) if payload is None else payload
    udp = udp_datagram(S, dst, 40000, dport, payload)
    if srh is None:
        return eth_ipv6(S, dst, 17, udp, hlim=hlim)
    return eth_ipv6(S, dst, 43, srh_wire(srh, 0) + udp, hlim=hlim)


def run_and_count(pin_dir, frame: bytes) -> tuple[dict, dict]:
    before = stats(REFLECTOR, pin_dir)
    out = prog_test_run(REFLECTOR, pin_dir, frame)
    return out, delta(before, stats(REFLECTOR, pin_dir))


def assert_valid_reply(out: dict, sent: bytes, ssid: int):
    assert out["action"] == "XDP_TX"
    f = parse_frame(out["data_out"])
    final_dst = f.srh["segments"][0] if f.srh else f.dst
    assert (f.src, final_dst, f.hlim) == (R, S, 255)
    assert udp6_checksum(f.src, final_dst, f.udp) == 0  # incremental update is right
    rp = ReflectorPacket.decode(f.udp[8:])
    assert rp.ssid == ssid and rp.sender_seq == 5 and rp.sender_ttl == parse_frame(sent).hlim
    assert f.payload_len == len(out["data_out"]) - 54
    return f


def test_plain_reply(refl):
    frame = stamp_frame(hlim=33)
    out, d = run_and_count(refl, frame)
    f = assert_valid_reply(out, frame, 7)
    assert f.srh is None and (f.sport, f.dport) == (862, 40000)
    assert d == {"reflected": 1}


def test_eight_return_sids_from_srh_packet(refl):
    frame = stamp_frame(ssid=8, srh=[R, OTHER])
    out, d = run_and_count(refl, frame)
    f = assert_valid_reply(out, frame, 8)
    assert f.dst == SIDS8[0]
    assert f.srh["segments"] == [S] + SIDS8[::-1]
    assert f.srh["segments_left"] == 8 and f.srh["last_entry"] == 8 and f.srh["hdrlen"] == 18
    assert d == {"reflected": 1}


def test_tlvs_after_base_packet_keep_checksum_valid(refl):
    """A session configured --tlv echo returns the TLV area unchanged (test_reflector_modes: the default)."""
    frame = stamp_frame(ssid=9, payload=stamp_sender_payload(5, 9, tai_ns(), extra=b"\x01\x02\x03\x04tlv!"))
    out, d = run_and_count(refl, frame)
    f = assert_valid_reply(out, frame, 9)
    assert f.udp[8 + 44 :] == b"\x01\x02\x03\x04tlv!"
    assert d == {"reflected": 1}


def _udp_short_header() -> bytes:
    return eth_ipv6(S, R, 17, struct.pack("!HH", 40000, 862))


def _udp_len_beyond_frame() -> bytes:
    udp = udp_datagram(S, R, 40000, 862, stamp_sender_payload(1, 7, 0), length=200)
    return eth_ipv6(S, R, 17, udp)


def _truncated_srh() -> bytes:
    full = srh_wire([R, OTHER, "fc00::1", "fc00::2"], 0)
    return eth_ipv6(S, R, 43, full[:40], payload_len=len(full) + 60)


def _srh(segments, segleft, **kw) -> bytes:
    udp = udp_datagram(S, R, 40000, 862, stamp_sender_payload(1, 7, 0))
    return eth_ipv6(S, R, 43, srh_wire(segments, segleft, **kw) + udp)


BAD_FRAMES = {
    "short_payload_43": (lambda: stamp_frame(payload=stamp_sender_payload(1, 7, 0)[:43]), "drop_malformed_short"),
    "empty_payload": (lambda: stamp_frame(payload=b""), "drop_malformed_short"),
    "udp_header_cut": (_udp_short_header, "drop_malformed_short"),
    "udp_len_beyond_frame": (_udp_len_beyond_frame, "drop_malformed_short"),
    "truncated_srh": (_truncated_srh, "drop_malformed_srh"),
    "srh_segleft_gt_last_entry": (lambda: _srh([R, OTHER], 2), "drop_malformed_srh"),
    "srh_hdrlen_too_small": (lambda: _srh([R, OTHER], 0, hdrlen=2), "drop_malformed_srh"),
    "srh_header_cut": (lambda: eth_ipv6(S, R, 43, b"\x11\x02\x04"), "drop_malformed_srh"),
    "srh_not_final": (lambda: _srh([OTHER, R], 1), "pass_srh_not_final"),
    "routing_type_0": (lambda: eth_ipv6(S, R, 43, bytes([17, 0, 0, 0, 0, 0, 0, 0])), "pass_other_ext_header"),
    "hop_by_hop": (
        lambda: eth_ipv6(S, R, 0, bytes([17, 0, 1, 4, 0, 0, 0, 0]) + udp_datagram(S, R, 1, 862, bytes(44))),
        "pass_other_ext_header",
    ),
    "unknown_ssid": (lambda: stamp_frame(ssid=4242), "pass_unknown_session"),
    "other_port": (lambda: stamp_frame(dport=863), "pass_other_port"),
    "not_local": (lambda: stamp_frame(dst=OTHER), "pass_not_local_addr"),
    "icmpv6": (lambda: eth_ipv6(S, R, 58, struct.pack("!BBHHH", 128, 0, 0, 1, 1)), "pass_not_udp"),
    "tcp": (lambda: eth_ipv6(S, R, 6, bytes(20)), "pass_not_udp"),
    "ipv4": (lambda: bytes(12) + b"\x08\x00" + bytes(60), "pass_not_ipv6"),
    "arp": (lambda: bytes(12) + b"\x08\x06" + bytes(28), "pass_not_ipv6"),
    "ipv6_header_cut": (lambda: eth_ipv6(S, R, 17, b"")[:40], "pass_not_ipv6"),
    "eth_only": (lambda: bytes(12) + b"\x86\xdd", "pass_not_ipv6"),
}


@pytest.mark.parametrize("name", sorted(BAD_FRAMES))
def test_bad_or_foreign_frames(refl, name):
    make, counter = BAD_FRAMES[name]
    out, d = run_and_count(refl, make())
    assert out["action"] != "XDP_TX"
    assert out["action"] == ("XDP_DROP" if counter.startswith("drop_") else "XDP_PASS")
    assert d == {counter: 1}
