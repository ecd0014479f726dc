"""XDP STAMP reflector on a real veth pair: replies checked field by field, kernel-accepted."""

from __future__ import annotations

import socket
import struct
import time

import pytest

from segscope_schemas.stamp_error_estimate import clock_read, ee_from_clock
from segscope_schemas.stamp_test_packet import ReflectorPacket, ptp_to_ns
from segscope_schemas.stamp_timestamp import TsFormat
from tests.datapath.dp_env import (
    IPV6_RTHDR,
    PIN_ROOT,
    PREFIX,
    REFLECTOR,
    delta,
    in_netns,
    parse_frame,
    parse_srh,
    recv_reply,
    run_tool,
    srh_bytes,
    stamp_sender_payload,
    stats,
    tai_ns,
    udp6_counter,
    udp_socket,
)

pytestmark = pytest.mark.datapath

SENDER_HOPS = 77
IPV6_HOPOPTS = 54


def sender(veth, port: int) -> socket.socket:
    s = udp_socket(veth.s_ns, veth.s_addr, port)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS, SENDER_HOPS)
    return s


def clock_err_est() -> int:
    """What `attach` writes: the Error Estimate of this clock in PTP format (S from the sync
    state, scale/multiplier from the clock's error; never Multiplier 0)."""
    return ee_from_clock(clock_read(), TsFormat.PTP)


def check_reply(
    data: bytes, seq: int, ssid: int, t1: int, t_recv: int, err_est: int | None = None, sender_err_est: int = 0x4001
) -> ReflectorPacket:
    assert len(data) == 44
    r = ReflectorPacket.decode(data)
    assert r.seq == seq and r.sender_seq == seq  # stateless: reflector seq = sender seq
    assert r.ssid == ssid
    assert (r.sender_ts_sec, r.sender_ts_frac) == ((t1 // 10**9) & 0xFFFFFFFF, t1 % 10**9)
    assert r.sender_err_est == sender_err_est
    if err_est is None:
        # attach's value from the clock; a synchronised clock's error can move between attach
        # and now, so compare S and Z exactly and require a valid (non-zero) multiplier
        want = clock_err_est()
        assert r.err_est & 0xC000 == want & 0xC000 and r.err_est & 0xFF != 0, (hex(r.err_est), hex(want))
        if not want & 0x8000:  # free-running clock: maxerror is pinned at 16 s
            assert r.err_est == want
    else:
        assert r.err_est == err_est
    assert r.sender_ttl == SENDER_HOPS
    assert data[38:40] == b"\0\0" and data[41:44] == b"\0\0\0"  # MBZ
    t2 = ptp_to_ns(r.rx_sec, r.rx_frac, t_recv)
    t3 = ptp_to_ns(r.ts_sec, r.ts_frac, t_recv)
    assert t1 <= t2 <= t3 <= t_recv, (t1, t2, t3, t_recv)
    return r


def roundtrip(veth, sock: socket.socket, seq: int, ssid: int, dst: str | None = None):
    t1 = tai_ns()
    sock.sendto(stamp_sender_payload(seq, ssid, t1), (dst or veth.x_addr, 862))
    data, peer, hop, rthdr = recv_reply(sock)
    return data, peer, hop, rthdr, t1, tai_ns()


def test_plain_reflection_fields_and_counters(veth, reflector):
    run_tool(REFLECTOR, "add-session", "--pin-dir", str(reflector.refl_dir), "--ssid", "7")
    before = stats(REFLECTOR, reflector.refl_dir)
    csum_before = udp6_counter(veth.s_ns, "Udp6InCsumErrors")
    sock = sender(veth, 50007)
    for seq in range(10):
        data, peer, hop, rthdr, t1, t_recv = roundtrip(veth, sock, seq, 7)
        check_reply(data, seq, 7, t1, t_recv)
        assert peer[:2] == (veth.x_addr, 862)
        assert hop == 255  # RFC 8762: reflector sets the hop limit to 255
        assert rthdr is None
    assert udp6_counter(veth.s_ns, "Udp6InCsumErrors") == csum_before
    assert delta(before, stats(REFLECTOR, reflector.refl_dir)) == {"reflected": 10}


def test_incoming_srh_is_stripped(veth, reflector):
    run_tool(REFLECTOR, "add-session", "--pin-dir", str(reflector.refl_dir), "--ssid", "8")
    before = stats(REFLECTOR, reflector.refl_dir)
    sock = sender(veth, 50008)
    # SRH with segments_left 0 ending at the reflector (segments[0] = final dst, filled by the kernel)
    sock.setsockopt(socket.IPPROTO_IPV6, IPV6_RTHDR, srh_bytes([veth.x_addr, "fd00:d5::99"]))
    for seq in range(5):
        data, peer, hop, rthdr, t1, t_recv = roundtrip(veth, sock, seq, 8)
        check_reply(data, seq, 8, t1, t_recv)
        assert hop == 255 and rthdr is None
    assert udp6_counter(veth.s_ns, "Udp6InCsumErrors") == 0
    assert delta(before, stats(REFLECTOR, reflector.refl_dir)) == {"reflected": 5}


def capture_socket(veth) -> socket.socket:
    with in_netns(veth.s_ns):
        cap = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x86DD))
    cap.bind((veth.s_dev, 0x86DD))
    cap.settimeout(2.0)
    return cap


def captured_reply(cap: socket.socket, ssid: int):
    while True:
        frame, addr = cap.recvfrom(4096)
        if addr[2] == socket.PACKET_OUTGOING:
            continue
        f = parse_frame(frame)
        if f.sport == 862 and struct.unpack_from("!H", f.udp, 8 + 14)[0] == ssid:
            return f


@pytest.mark.parametrize(
    "incoming, n_return",
    [
        (None, 1),  # no SRH in, 1 SID out: grow by 40
        (None, 2),  # grow by 56
        (["fd00:d5::99"], 1),  # SRH 40 B in, 40 B out: no adjust
        (["fd00:d5::99"], 2),  # 40 -> 56: grow by 16
        (["fd00:d5::a", "fd00:d5::b", "fd00:d5::c", "fd00:d5::d"], 1),  # 88 -> 40: shrink
    ],
)
def test_return_sid_list(veth, reflector, incoming, n_return):
    ssid = 20 + n_return + (len(incoming) if incoming else 0)
    sids = list(veth.s_sids[:n_return])
    run_tool(
        REFLECTOR,
        "add-session",
        "--pin-dir",
        str(reflector.refl_dir),
        "--ssid",
        str(ssid),
        "--sender",
        veth.s_addr,
        "--return-sids",
        ",".join(sids),
    )
    before = stats(REFLECTOR, reflector.refl_dir)
    csum_before = udp6_counter(veth.s_ns, "Udp6InCsumErrors")
    sock = sender(veth, 50000 + ssid)
    if incoming:
        sock.setsockopt(socket.IPPROTO_IPV6, IPV6_RTHDR, srh_bytes([veth.x_addr] + incoming))
    cap = capture_socket(veth)
    for seq in range(3):
        data, peer, hop, rthdr, t1, t_recv = roundtrip(veth, sock, seq, ssid)
        check_reply(data, seq, ssid, t1, t_recv)
        # delivered by the kernel after its own SRH processing: one hop per local SID visited
        assert hop == 255 - n_return
        srh = parse_srh(rthdr)
        assert srh["segments"] == [veth.s_addr] + sids[::-1]
        assert srh["segments_left"] == 0 and srh["last_entry"] == n_return and srh["type"] == 4
        # on the wire, as the reflector built it
        f = captured_reply(cap, ssid)
        assert f.dmac == bytes.fromhex(veth.s_mac.replace(":", ""))
        assert f.smac == bytes.fromhex(veth.x_mac.replace(":", ""))
        assert (f.src, f.dst, f.hlim, f.nexthdr) == (veth.x_addr, sids[0], 255, 43)
        assert f.srh["segments_left"] == n_return and f.srh["nexthdr"] == 17
        assert f.srh["hdrlen"] == 2 * (n_return + 1)
        assert f.payload_len == len(f.srh["segments"]) * 16 + 8 + 8 + 44
        assert (f.sport, f.dport) == (862, 50000 + ssid)
    assert udp6_counter(veth.s_ns, "Udp6InCsumErrors") == csum_before
    assert delta(before, stats(REFLECTOR, reflector.refl_dir)) == {"reflected": 3}


def test_sender_specific_session_wins_over_wildcard(veth, reflector):
    d = str(reflector.refl_dir)
    run_tool(REFLECTOR, "add-session", "--pin-dir", d, "--ssid", "12")
    run_tool(
        REFLECTOR,
        "add-session",
        "--pin-dir",
        d,
        "--ssid",
        "12",
        "--sender",
        veth.s_addr,
        "--return-sids",
        veth.s_sids[0],
    )
    sock = sender(veth, 50012)
    _data, _peer, _hop, rthdr, _t1, _t = roundtrip(veth, sock, 1, 12)
    assert rthdr is not None and parse_srh(rthdr)["segments"] == [veth.s_addr, veth.s_sids[0]]
    run_tool(REFLECTOR, "del-session", "--pin-dir", d, "--ssid", "12", "--sender", veth.s_addr)
    _data, _peer, hop, rthdr, _t1, _t = roundtrip(veth, sock, 2, 12)
    assert rthdr is None and hop == 255
    run_tool(REFLECTOR, "del-session", "--pin-dir", d, "--ssid", "12")
    before = stats(REFLECTOR, reflector.refl_dir)
    sock.sendto(stamp_sender_payload(3, 12, tai_ns()), (veth.x_addr, 862))
    with pytest.raises(socket.timeout):
        sock.settimeout(0.5)
        recv_reply(sock)  # no session: passed to the stack, nobody listens on 862
    assert delta(before, stats(REFLECTOR, reflector.refl_dir)) == {"pass_unknown_session": 1}


def test_error_estimate_from_config(veth, reflector):
    d = str(reflector.refl_dir)
    run_tool(REFLECTOR, "add-session", "--pin-dir", d, "--ssid", "13")
    run_tool(REFLECTOR, "set-err-est", "--pin-dir", d, "--err-est", str(0x8000 | 0x0105))  # S=1, scale 1, mult 5
    sock = sender(veth, 50013)
    data, _peer, _hop, _rthdr, t1, t_recv = roundtrip(veth, sock, 4, 13)
    check_reply(data, 4, 13, t1, t_recv, err_est=0xC105)


def raw_frame_sender(veth) -> socket.socket:
    with in_netns(veth.s_ns):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind((veth.s_dev, 0))
    return s


def test_counters_add_up_with_mixed_traffic(veth, reflector):
    d = str(reflector.refl_dir)
    run_tool(REFLECTOR, "add-session", "--pin-dir", d, "--ssid", "14")
    before = stats(REFLECTOR, reflector.refl_dir)
    stamp = sender(veth, 50014)
    sent = 0
    for seq in range(4):  # reflected
        roundtrip(veth, stamp, seq, 14)
        sent += 1
    for _ in range(3):  # pass_other_port
        stamp.sendto(b"x" * 44, (veth.x_addr, 9999))
        sent += 1
    for i in range(2):  # pass_not_local_addr
        stamp.sendto(stamp_sender_payload(i, 14, tai_ns()), (veth.x_other, 862))
        sent += 1
    for i in range(2):  # pass_unknown_session
        stamp.sendto(stamp_sender_payload(i, 999, tai_ns()), (veth.x_addr, 862))
        sent += 1
    stamp.sendto(b"y" * 20, (veth.x_addr, 862))  # drop_malformed_short
    sent += 1
    srh_sock = sender(veth, 50114)  # pass_srh_not_final: dst x_addr, segleft 1
    srh_sock.setsockopt(socket.IPPROTO_IPV6, IPV6_RTHDR, srh_bytes([veth.x_other, veth.x_addr], 1))
    srh_sock.sendto(stamp_sender_payload(1, 14, tai_ns()), (veth.x_other, 862))
    sent += 1
    hbh_sock = sender(veth, 50214)  # pass_other_ext_header: hop-by-hop (PadN)
    hbh_sock.setsockopt(socket.IPPROTO_IPV6, IPV6_HOPOPTS, bytes([0, 0, 1, 4, 0, 0, 0, 0]))
    hbh_sock.sendto(stamp_sender_payload(1, 14, tai_ns()), (veth.x_addr, 862))
    sent += 1
    with in_netns(veth.s_ns):  # pass_not_udp: ICMPv6 echo request
        icmp = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
    icmp.sendto(struct.pack("!BBHHH", 128, 0, 0, 1, 1) + b"ping", (veth.x_addr, 0))
    sent += 1
    raw = raw_frame_sender(veth)  # pass_not_ipv6: an IPv4 ethertype frame
    raw.send(
        bytes.fromhex(veth.x_mac.replace(":", ""))
        + bytes.fromhex(veth.s_mac.replace(":", ""))
        + b"\x08\x00"
        + bytes(46)
    )
    sent += 1
    time.sleep(0.3)
    got = delta(before, stats(REFLECTOR, reflector.refl_dir))
    assert got == {
        "reflected": 4,
        "pass_other_port": 3,
        "pass_not_local_addr": 2,
        "pass_unknown_session": 2,
        "drop_malformed_short": 1,
        "pass_srh_not_final": 1,
        "pass_other_ext_header": 1,
        "pass_not_udp": 1,
        "pass_not_ipv6": 1,
    }
    assert sum(got.values()) == sent


def test_cli_refuses_bad_arguments(veth, reflector):
    d = str(reflector.refl_dir)
    nine = ",".join(f"fc00:d5::{i + 1:x}" for i in range(9))
    p = run_tool(REFLECTOR, "add-session", "--pin-dir", d, "--ssid", "1", "--return-sids", nine, check=False)
    assert p.returncode == 2 and "--return-sids" in p.stderr and "8" in p.stderr
    p = run_tool(REFLECTOR, "add-session", "--pin-dir", d, "--ssid", "70000", check=False)
    assert p.returncode == 2 and "--ssid" in p.stderr
    p = run_tool(REFLECTOR, "add-session", "--pin-dir", d, "--ssid", "1", "--sender", "1.2.3.4", check=False)
    assert p.returncode == 2 and "--sender" in p.stderr
    p = run_tool(REFLECTOR, "add-address", "--pin-dir", d, "not-an-address", check=False)
    assert p.returncode == 2 and "ADDR" in p.stderr
    p = run_tool(
        REFLECTOR,
        "attach",
        "--netns",
        f"{PREFIX}-nonexistent",
        "--dev",
        "x",
        "--pin-dir",
        str(PIN_ROOT / f"{PREFIX}-nonexistent" / "stamp_reflector"),
        check=False,
    )
    assert not (PIN_ROOT / f"{PREFIX}-nonexistent").exists()
    assert p.returncode == 1 and "--netns" in p.stderr
    p = run_tool(REFLECTOR, "attach", "--netns", veth.x_ns, "--dev", veth.x_dev, "--pin-dir", d, check=False)
    assert p.returncode == 1 and "already" in p.stderr
    p = run_tool(REFLECTOR, "stats", "--pin-dir", str(PIN_ROOT / f"{PREFIX}-missing"), check=False)
    assert p.returncode == 1 and "--pin-dir" in p.stderr
