"""The user-space reflector and sender on schemas/vectors/stamp_interop.json (the frames an
independent STAMP implementation sends, written from the RFC figures): the Python side of what
tests/datapath/test_interop_vectors.py checks for the XDP programs."""

from __future__ import annotations

import json
import socket
import struct
from pathlib import Path

import pytest

from collectors.ustamp.clock import decode_ts, format_of
from collectors.ustamp.reflector import Reflector
from collectors.ustamp.sessions import SessionTable, base_sender_session, session_from_cli
from segscope_schemas.stamp_test_packet import ReflectorPacket

VECTORS = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "vectors" / "stamp_interop.json").read_text())
ETH_IPV6_LEN = 14 + 40
EE_Z = 0x4000


def udp_payload(vec: dict) -> bytes:
    frame = bytes.fromhex(vec["frame"])
    return frame[ETH_IPV6_LEN + 8 :]


@pytest.mark.parametrize("vec", [v for v in VECTORS["vectors"] if v["program"] == "reflector"], ids=lambda v: v["name"])
def test_ustamp_reflector_answers_rfc8762_sender(vec):
    """A real Reflector on ::1 (ephemeral port) handles the vector's test packet and sends its reply."""
    table = SessionTable([session_from_cli("--ssid 5"), base_sender_session()])
    refl = Reflector(table, "::1", 0)
    rx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    rx.bind(("::1", 0))
    rx.settimeout(2)
    try:
        outcome = refl.handle(udp_payload(vec), [], ("::1", rx.getsockname()[1], 0, 0))
        reply = rx.recv(2048)
    finally:
        rx.close()
        refl.sock.close()
    assert outcome == "reflected"
    r = ReflectorPacket.decode(reply[:44])
    want = vec["expect"]
    assert (r.seq, r.ssid, bool(r.err_est & EE_Z)) == (want["reply_seq"], vec["ssid"], bool(want["reply_z"]))


def test_ustamp_reflector_without_base_session_ignores_ssid0():
    vec = next(v for v in VECTORS["vectors"] if v["name"] == "base_sender_ssid0")
    refl = Reflector(SessionTable([session_from_cli("--ssid 5")]), "::1", 0)
    try:
        assert refl.handle(udp_payload(vec), [], ("::1", 9, 0, 0)) == "unknown_session"
    finally:
        refl.sock.close()


@pytest.mark.parametrize("vec", [v for v in VECTORS["vectors"] if v["program"] == "collector"], ids=lambda v: v["name"])
def test_ustamp_sender_reads_each_side_in_its_format(vec):
    """The sender's T1 in its own format, T2/T3 in the one the reflector's Z names (RFC 8762 §4.3.1)."""
    r = ReflectorPacket.decode(udp_payload(vec)[:44])
    want, off = vec["expect"], vec["tai_utc_offset_s"]
    t4 = want["t3_ns"] + 1_000_000
    t1 = decode_ts(r.sender_ts_sec, r.sender_ts_frac, format_of(r.sender_err_est), off, t4)
    t2 = decode_ts(r.rx_sec, r.rx_frac, format_of(r.err_est), off, t4)
    t3 = decode_ts(r.ts_sec, r.ts_frac, format_of(r.err_est), off, t4)
    assert (t1, t2, t3) == (want["t1_ns"], want["t2_ns"], want["t3_ns"])
    assert struct.unpack_from("!H", udp_payload(vec), 14)[0] == vec["ssid"]


def test_direct_measurement_and_follow_up_are_per_sender():
    """RFC 8972 §4.5/§4.7 counters and the previous reply belong to one STAMP session, i.e. one
    sender: a new sender (another source port) of the same any-sender session starts from zero."""
    dm = bytes.fromhex("8005000c") + bytes(12)  # Direct Measurement, U set by the sender (ignored)
    fu = bytes.fromhex("80070010") + bytes(16)  # Follow-Up Telemetry
    refl = Reflector(SessionTable([session_from_cli("--ssid 5")]), "::1", 0)
    rx_a, rx_b = (socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) for _ in range(2))
    try:
        for s in (rx_a, rx_b):
            s.bind(("::1", 0))
            s.settimeout(2)

        def exchange(rx: socket.socket, seq: int) -> tuple[int, int, int]:
            test = struct.pack("!I8xHH28x", seq, 0x8001, 5) + dm + fu
            assert refl.handle(test, [], ("::1", rx.getsockname()[1], 0, 0)) == "reflected"
            area = rx.recv(2048)[44:]
            _s_tx, r_rx, r_tx = struct.unpack_from("!III", area, 4)
            prev_seq, prev_t3 = struct.unpack_from("!IQ", area, 16 + 4)
            return r_rx, r_tx, prev_seq if prev_t3 else None  # None: no previous reply

        assert [exchange(rx_a, i) for i in range(3)] == [(1, 1, None), (2, 2, 0), (3, 3, 1)]
        assert exchange(rx_b, 0) == (1, 1, None)  # sender B: its own counters, no previous reply
        assert exchange(rx_a, 3) == (4, 4, 2)  # sender A unaffected
    finally:
        for s in (rx_a, rx_b, refl.sock):
            s.close()
