"""XDP collector on the sender veth: reflected replies become ring-buffer records (T1..T4), consumed."""

from __future__ import annotations

import json
import socket
import struct
import time

import pytest

from segscope_schemas.stamp_error_estimate import clock_read, ee_from_clock
from segscope_schemas.stamp_timestamp import TsFormat
from tests.datapath.dp_env import (
    COLLECTOR,
    REFLECTOR,
    Attached,
    delta,
    eth_ipv6,
    prog_test_run,
    recv_reply,
    run_tool,
    srh_wire,
    stamp_sender_payload,
    stats,
    tai_ns,
    udp_datagram,
    udp_socket,
)

pytestmark = pytest.mark.datapath

HOPS = 61


def dump(pin_dir, count: int, timeout_ms: int = 2000, check: bool = True) -> list[dict]:
    p = run_tool(
        COLLECTOR,
        "dump",
        "--pin-dir",
        str(pin_dir),
        "--count",
        str(count),
        "--timeout-ms",
        str(timeout_ms),
        check=check,
    )
    return [json.loads(line) for line in p.stdout.splitlines()]


def setup_session(att: Attached, ssid: int, port: int, activate: bool = True) -> socket.socket:
    run_tool(REFLECTOR, "add-session", "--pin-dir", str(att.refl_dir), "--ssid", str(ssid))
    if activate:
        run_tool(COLLECTOR, "activate", "--pin-dir", str(att.coll_dir), "--ssid", str(ssid), "--port", str(port))
    s = udp_socket(att.veth.s_ns, att.veth.s_addr, port)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS, HOPS)
    return s


def send_burst(veth, sock: socket.socket, ssid: int, n: int) -> list[int]:
    t1s = []
    for seq in range(n):
        t1 = tai_ns()
        sock.sendto(stamp_sender_payload(seq, ssid, t1), (veth.x_addr, 862))
        t1s.append(t1)
    return t1s


def wait_counter(tool, pin_dir, name: str, value: int, timeout: float = 2.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        st = stats(tool, pin_dir)
        if st[name] >= value or time.monotonic() > deadline:
            return st
        time.sleep(0.02)


def test_records_for_active_session(veth, reflector_and_collector):
    att = reflector_and_collector
    before_c = stats(COLLECTOR, att.coll_dir)
    sock = setup_session(att, 21, 50021)
    t1s = send_burst(veth, sock, 21, 30)
    # attach fills the reflector's Error Estimate from the clock (S, scale, multiplier; Z=PTP)
    clock_ee = ee_from_clock(clock_read(), TsFormat.PTP)
    t_end = tai_ns()
    recs = dump(att.coll_dir, 30)
    assert len(recs) == 30
    ifindex = veth.ifindex(veth.s_ns, veth.s_dev)
    for seq, (rec, t1) in enumerate(zip(recs, t1s)):
        assert rec["sender_seq"] == seq and rec["reflector_seq"] == seq and rec["ssid"] == 21
        assert rec["t1_ns"] == t1  # widened back exactly
        assert t1 <= rec["t2_ns"] <= rec["t3_ns"] <= rec["t4_ns"] <= t_end + 10**9
        assert rec["t4_ns"] <= tai_ns()
        assert rec["sender_ttl"] == HOPS and rec["reply_hop_limit"] == 255
        assert rec["sender_err_est"] == 0x4001
        if clock_ee & 0x8000:  # synchronised: the error can move between attach and now
            assert rec["reflector_err_est"] & 0xC000 == clock_ee & 0xC000 and rec["reflector_err_est"] & 0xFF
        else:  # free-running: maxerror is pinned at 16 s, the value is exact
            assert rec["reflector_err_est"] == clock_ee
        assert rec["ifindex"] == ifindex and rec["flags"] == 0
    # consumed by XDP: the sender socket sees nothing
    sock.settimeout(0.3)
    with pytest.raises(socket.timeout):
        recv_reply(sock)
    assert delta(before_c, stats(COLLECTOR, att.coll_dir)) == {"collected": 30}
    assert dump(att.coll_dir, 1, timeout_ms=200, check=False) == []  # exactly one record each


def test_inactive_and_unknown_sessions_pass(veth, reflector_and_collector):
    att = reflector_and_collector
    d = str(att.coll_dir)
    sock = setup_session(att, 22, 50022)
    run_tool(COLLECTOR, "deactivate", "--pin-dir", d, "--ssid", "22")
    other = setup_session(att, 23, 50023, activate=False)
    before = stats(COLLECTOR, att.coll_dir)
    send_burst(veth, sock, 22, 3)
    send_burst(veth, other, 23, 2)
    for s, n in ((sock, 3), (other, 2)):  # passed to the stack: the sockets get them
        for _ in range(n):
            data, peer, hop, _ = recv_reply(s)
            assert len(data) == 44 and peer[1] == 862 and hop == 255
    assert delta(before, stats(COLLECTOR, att.coll_dir)) == {"pass_inactive_session": 3, "pass_unknown_session": 2}
    # activated again, but for another port: port mismatch passes too
    run_tool(COLLECTOR, "activate", "--pin-dir", d, "--ssid", "22", "--port", "50099")
    before = stats(COLLECTOR, att.coll_dir)
    send_burst(veth, sock, 22, 1)
    recv_reply(sock)
    assert delta(before, stats(COLLECTOR, att.coll_dir)) == {"pass_port_mismatch": 1}
    p = run_tool(COLLECTOR, "deactivate", "--pin-dir", d, "--ssid", "999", check=False)
    assert p.returncode == 1 and "--ssid" in p.stderr
    p = run_tool(COLLECTOR, "activate", "--pin-dir", d, "--ssid", "5", check=False)
    assert p.returncode == 2 and "--port" in p.stderr


def test_ring_full_is_counted(veth):
    with Attached(veth, with_collector=True, ringbuf_size=4096) as att:
        sock = setup_session(att, 24, 50024)
        sent = 150
        send_burst(veth, sock, 24, sent)
        st = wait_counter(COLLECTOR, att.coll_dir, "collected", 1)
        time.sleep(0.2)
        st = stats(COLLECTOR, att.coll_dir)
        assert st["collected"] + st["drop_ringbuf_full"] == sent
        assert st["drop_ringbuf_full"] > 0
        assert 0 < st["collected"] <= 4096 // (64 + 8)
        recs = dump(att.coll_dir, st["collected"])
        assert [r["sender_seq"] for r in recs] == list(range(st["collected"]))
        # the ring has room again: the next reply is recorded
        send_burst(veth, sock, 24, 1)
        assert dump(att.coll_dir, 1)[0]["ssid"] == 24


def test_crafted_replies(veth, reflector_and_collector):
    att = reflector_and_collector
    d = att.coll_dir
    run_tool(COLLECTOR, "activate", "--pin-dir", str(d), "--ssid", "25", "--port", "50025")
    S, R = veth.s_addr, veth.x_addr
    now = tai_ns()
    sec = lambda ns: ((ns // 10**9) & 0xFFFFFFFF, ns % 10**9)  # noqa: E731
    t1, t2, t3 = now - 3000, now - 2000, now - 1000
    payload = struct.pack("!I2IHH2II2IHHB3s", 9, *sec(t3), 0x4000, 25, *sec(t2), 9, *sec(t1), 0x4001, 0, 17, bytes(3))
    udp = udp_datagram(R, S, 862, 50025, payload)
    srh_reply = eth_ipv6(R, S, 43, srh_wire([S, "fc00:d5::e1"], 0) + udp, hlim=250)
    before = stats(COLLECTOR, d)
    out = prog_test_run(COLLECTOR, d, srh_reply)
    assert out["action"] == "XDP_DROP"
    rec = dump(d, 1)[0]
    assert (rec["t1_ns"], rec["t2_ns"], rec["t3_ns"]) == (t1, t2, t3)
    assert rec["t4_ns"] >= now and rec["flags"] == 2 and rec["reply_hop_limit"] == 250
    assert rec["sender_ttl"] == 17 and rec["sender_seq"] == 9
    cases = [
        (eth_ipv6(R, S, 17, udp_datagram(R, S, 862, 50025, payload[:40])), "drop_malformed_short", "XDP_DROP"),
        (eth_ipv6(R, S, 43, srh_wire([S, "fc00:d5::e1"], 0)[:30]), "drop_malformed_srh", "XDP_DROP"),
        (eth_ipv6(R, "fc00:d5::e1", 43, srh_wire([S, "fc00:d5::e1"], 1) + udp), "pass_srh_not_final", "XDP_PASS"),
        (eth_ipv6(R, S, 17, udp_datagram(R, S, 863, 50025, payload)), "pass_not_stamp_reply", "XDP_PASS"),
        (eth_ipv6(R, S, 58, bytes(8)), "pass_not_udp", "XDP_PASS"),
        (bytes(12) + b"\x08\x00" + bytes(40), "pass_not_ipv6", "XDP_PASS"),
        (eth_ipv6(R, S, 60, bytes([17, 0, 1, 4, 0, 0, 0, 0]) + udp), "pass_other_ext_header", "XDP_PASS"),
    ]
    assert delta(before, stats(COLLECTOR, d)) == {"collected": 1}
    for frame, counter, action in cases:
        before = stats(COLLECTOR, d)
        out = prog_test_run(COLLECTOR, d, frame)
        assert out["action"] == action, counter
        assert delta(before, stats(COLLECTOR, d)) == {counter: 1}
