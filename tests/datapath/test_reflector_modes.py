"""Per-session modes of the XDP reflector/collector: NTP vs PTPv2 per session, stateful sequence numbers,
TLVs echoed or passed to user space, authenticated sessions passed to user space, TAI-UTC config.

NTP timestamps are checked against an independent encoder/decoder written here from RFC 5905 §6
(UTC seconds since 1900 + 2^-32 s fraction) with exact rational arithmetic.
"""

from __future__ import annotations

import json
import random
import struct
import subprocess
import time
from fractions import Fraction

import pytest

from segscope_schemas.stamp_test_packet import ReflectorPacket
from tests.datapath.dp_env import (
    COLLECTOR,
    REFLECTOR,
    delta,
    eth_ipv6,
    parse_frame,
    prog_test_run,
    recv_reply,
    run_tool,
    stamp_sender_payload,
    stats,
    tai_ns,
    udp6_checksum,
    udp_datagram,
    udp_socket,
)

pytestmark = pytest.mark.datapath

S, R = "fd00:d5::1", "fd00:d5::2"
NTP_UNIX = 2_208_988_800  # RFC 5905 §6: 1970-01-01 is 2208988800 s after the NTP era 0 start
E9 = 10**9
EE_Z = 0x4000
SENDER_PORT = 40000

# ssid -> add-session flags
SESSIONS = {
    30: [],  # defaults: PTP, stateless, TLVs to user space
    31: ["--format", "ntp"],
    32: ["--stateful"],
    33: ["--stateful", "--format", "ntp"],
    34: ["--tlv", "echo"],
    35: ["--mode", "authenticated"],
    36: ["--format", "ptp", "--tlv", "userspace", "--mode", "unauthenticated"],  # explicit defaults
}


# ---- NTP from the RFC, exact ------------------------------------------------------------


def host_tai_offset() -> int:
    """TAI - UTC as the kernel keeps it (struct timex.tai), via CLOCK_TAI - CLOCK_REALTIME."""
    for _ in range(5):
        a = time.clock_gettime_ns(time.CLOCK_REALTIME)
        t = time.clock_gettime_ns(time.CLOCK_TAI)
        b = time.clock_gettime_ns(time.CLOCK_REALTIME)
        off = round((t - (a + b) // 2) / E9)
        if abs((t - (a + b) // 2) - off * E9) < E9 // 10:
            return off
    raise RuntimeError("cannot read TAI-UTC")


def ntp_encode(tai_ns: int, tai_utc_s: int) -> tuple[int, int]:
    """TAI ns -> (NTP seconds mod 2^32, fraction), fraction rounded to nearest."""
    utc = Fraction(tai_ns - tai_utc_s * E9, E9)
    sec = utc.numerator // utc.denominator
    frac = round((utc - sec) * 2**32)
    assert frac < 2**32
    return (sec + NTP_UNIX) & 0xFFFFFFFF, frac


def ntp_exact_tai_ns(sec: int, frac: int, tai_utc_s: int, ref_tai_ns: int) -> Fraction:
    """NTP -> exact TAI ns (a Fraction), era chosen within half an era of the reference."""
    ref = (ref_tai_ns // E9) - tai_utc_s + NTP_UNIX
    full = min((((ref >> 32) + k) << 32 | sec for k in (-1, 0, 1)), key=lambda f: abs(f - ref))
    return (full - NTP_UNIX + tai_utc_s) * E9 + Fraction(frac * E9, 2**32)


# ---- frames -----------------------------------------------------------------------------


def make_frame(ssid: int, seq: int = 5, extra: bytes = b"", payload: bytes | None = None, src: str = S) -> bytes:
    payload = stamp_sender_payload(seq, ssid, tai_ns(), extra=extra) if payload is None else payload
    sport = 862 if src == R else SENDER_PORT
    return eth_ipv6(src, R, 17, udp_datagram(src, R, sport, 862, payload))


def auth_payload(ssid: int, seq: int = 1) -> bytes:
    """RFC 8762 §4.2.2 + RFC 8972 §3 authenticated Session-Sender packet: seq, MBZ(12), timestamp,
    error estimate, SSID (offset 26), MBZ(68), HMAC(16) = 112 bytes."""
    now = tai_ns()
    return struct.pack(
        "!I12sIIHH68s", seq, bytes(12), (now // E9) & 0xFFFFFFFF, now % E9, EE_Z | 1, ssid, bytes(68)
    ) + bytes(range(16))


def reflect(refl_dir, frame: bytes) -> tuple[dict, dict]:
    before = stats(REFLECTOR, refl_dir)
    out = prog_test_run(REFLECTOR, refl_dir, frame)
    return out, delta(before, stats(REFLECTOR, refl_dir))


def reply_of(out: dict) -> tuple[ReflectorPacket, bytes]:
    assert out["action"] == "XDP_TX"
    f = parse_frame(out["data_out"])
    assert udp6_checksum(f.src, f.dst, f.udp) == 0
    return ReflectorPacket.decode(f.udp[8:52]), f.udp[8:]


@pytest.fixture
def refl(veth, reflector):
    d = str(reflector.refl_dir)
    for ssid, flags in SESSIONS.items():
        run_tool(REFLECTOR, "add-session", "--pin-dir", d, "--ssid", str(ssid), *flags)
    # S=1, Z=1 (must be cleared for NTP sessions), scale 1, multiplier 5
    run_tool(REFLECTOR, "set-err-est", "--pin-dir", d, "--err-est", str(0x8000 | EE_Z | 0x0105))
    return reflector.refl_dir


# ---- timestamp formats ------------------------------------------------------------------


def test_ntp_session_stamps_utc_ntp_and_clears_z(refl):
    off = host_tai_offset()
    t1 = tai_ns()
    sent = stamp_sender_payload(7, 31, t1, err_est=0x0001)  # the sender's own NTP-or-not is copied
    rt_before = time.clock_gettime_ns(time.CLOCK_REALTIME)
    out, d = reflect(refl, make_frame(31, payload=sent))
    rt_after = time.clock_gettime_ns(time.CLOCK_REALTIME)
    rp, _ = reply_of(out)
    assert d == {"reflected": 1}
    assert rp.err_est == 0x8105  # Z = 0: NTP; S/scale/mult kept
    assert (rp.seq, rp.sender_seq, rp.ssid, rp.sender_err_est) == (7, 7, 31, 0x0001)
    assert sent[4:12] == struct.pack("!II", rp.sender_ts_sec, rp.sender_ts_frac)  # T1 copied verbatim
    ref = tai_ns()
    t2 = ntp_exact_tai_ns(rp.rx_sec, rp.rx_frac, off, ref)
    t3 = ntp_exact_tai_ns(rp.ts_sec, rp.ts_frac, off, ref)
    # NTP is UTC: compare with CLOCK_REALTIME (= CLOCK_TAI - TAI-UTC by the kernel's definition)
    utc2, utc3 = t2 - off * E9, t3 - off * E9
    assert rt_before - 1 <= utc2 <= utc3 <= rt_after + 1, (rt_before, utc2, utc3, rt_after)


def test_ptp_session_unchanged(refl):
    t_before = tai_ns()
    out, d = reflect(refl, make_frame(30))
    rp, _ = reply_of(out)
    assert rp.err_est == 0x8000 | EE_Z | 0x0105
    t2 = (rp.rx_sec, rp.rx_frac)
    assert t_before // E9 & 0xFFFFFFFF <= t2[0] <= (tai_ns() // E9) & 0xFFFFFFFF and t2[1] < E9
    assert d == {"reflected": 1}


def test_tai_offset_override_shifts_ntp_only(refl):
    host = host_tai_offset()
    run_tool(REFLECTOR, "set-tai-offset", "--pin-dir", str(refl), "--tai-offset", str(host + 37))
    try:
        t_before = tai_ns()
        rp, _ = reply_of(reflect(refl, make_frame(31))[0])
        t_after = tai_ns()
        # with TAI-UTC claimed 37 s larger, the NTP (UTC) seconds are 37 s smaller
        t2 = ntp_exact_tai_ns(rp.rx_sec, rp.rx_frac, host, t_after)
        assert t_before - 37 * E9 - 1 <= t2 <= t_after - 37 * E9 + 1
        rp_ptp, _ = reply_of(reflect(refl, make_frame(30))[0])
        assert t_before // E9 <= rp_ptp.rx_sec <= t_after // E9 + 1  # PTP (TAI) not affected
        # err_est and TAI offset are independent fields of reflector_config
        assert rp_ptp.err_est == 0x8000 | EE_Z | 0x0105
    finally:
        run_tool(REFLECTOR, "set-tai-offset", "--pin-dir", str(refl))  # back to adjtimex
    rp, _ = reply_of(reflect(refl, make_frame(31))[0])
    t2 = ntp_exact_tai_ns(rp.rx_sec, rp.rx_frac, host, tai_ns())
    assert abs(t2 - tai_ns()) < 5 * E9


# ---- stateful ---------------------------------------------------------------------------


def test_stateful_counts_from_zero_per_session(refl):
    got: dict[int, list[int]] = {30: [], 32: [], 33: []}
    order = [32, 33, 32, 30, 32, 33, 30, 33, 32]
    for i, ssid in enumerate(order):
        rp, _ = reply_of(reflect(refl, make_frame(ssid, seq=1000 + i))[0])
        assert rp.sender_seq == 1000 + i
        got[ssid].append(rp.seq)
    assert got[32] == [0, 1, 2, 3]
    assert got[33] == [0, 1, 2]
    assert got[30] == [1003, 1006]  # stateless copies the sender's number
    # many runs in one go: the counter moves once per reflected packet (test-run --repeat reuses the
    # reflected frame, so it is sent from the reflector's own address and port: the reply is a test packet again)
    before = stats(REFLECTOR, refl)
    run_tool(REFLECTOR, "test-run", "--pin-dir", str(refl), "--hex", make_frame(32, src=R).hex(), "--repeat", "500")
    assert delta(before, stats(REFLECTOR, refl)) == {"reflected": 500}
    rp, _ = reply_of(reflect(refl, make_frame(32))[0])
    assert rp.seq == 4 + 500
    # a dropped or passed packet does not use a number
    reflect(refl, make_frame(32, extra=b"\x01\x02\x00\x00"))  # TLVs -> user space
    reflect(refl, make_frame(32, payload=stamp_sender_payload(1, 32, 0)[:40]))  # too short
    assert reply_of(reflect(refl, make_frame(32))[0])[0].seq == 505
    # re-adding the session starts over
    run_tool(REFLECTOR, "add-session", "--pin-dir", str(refl), "--ssid", "32", "--stateful")
    assert reply_of(reflect(refl, make_frame(32))[0])[0].seq == 0


def test_stateful_counter_is_atomic_across_cpus(refl):
    """Two BPF_PROG_TEST_RUN loops at once (one per CPU of this 2-core machine) on one stateful
    session: no number is lost or reused, so the next reply carries exactly their sum."""
    frame = make_frame(33, src=R).hex()
    runs = 200000  # ~50 ms per loop: the two overlap
    procs = [
        subprocess.Popen(
            [str(REFLECTOR), "test-run", "--pin-dir", str(refl), "--hex", frame, "--repeat", str(runs)],
            stdout=subprocess.DEVNULL,
        )
        for _ in range(2)
    ]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    assert reply_of(reflect(refl, make_frame(33))[0])[0].seq == 2 * runs


def test_stateful_over_veth(veth, refl):
    """Real kernel senders: two stateful sessions from two sockets, replies delivered to the stack."""
    socks = {32: udp_socket(veth.s_ns, veth.s_addr, 50032), 33: udp_socket(veth.s_ns, veth.s_addr, 50033)}
    seqs: dict[int, list[int]] = {32: [], 33: []}
    for i in range(6):
        ssid = 32 if i % 3 else 33
        socks[ssid].sendto(stamp_sender_payload(100 + i, ssid, tai_ns()), (veth.x_addr, 862))
        data, _peer, hop, _ = recv_reply(socks[ssid])
        rp = ReflectorPacket.decode(data)
        assert rp.sender_seq == 100 + i and hop == 255
        seqs[ssid].append(rp.seq)
    assert seqs == {32: [0, 1, 2, 3], 33: [0, 1]}


# ---- TLVs and authenticated mode --------------------------------------------------------

TLVS = bytes([0x80, 1, 0, 8]) + bytes(range(8))  # an Extra Padding TLV (RFC 8972 §4.1), U flag set


def test_tlvs_go_to_userspace_by_default_and_are_echoed_on_request(refl):
    for ssid in (30, 31, 36):
        frame = make_frame(ssid, extra=TLVS)
        out, d = reflect(refl, frame)
        assert out["action"] == "XDP_PASS" and d == {"pass_tlvs_to_userspace": 1}
        assert out["data_out"] == frame  # untouched for user space
    frame = make_frame(34, extra=TLVS)
    out, d = reflect(refl, frame)
    _rp, payload = reply_of(out)
    assert d == {"reflected": 1} and payload[44:] == TLVS
    assert parse_frame(out["data_out"]).payload_len == parse_frame(frame).payload_len
    # base packets of the same sessions are reflected
    for ssid in (30, 34, 36):
        assert reflect(refl, make_frame(ssid))[1] == {"reflected": 1}


def test_authenticated_sessions_go_to_userspace(refl):
    cases = [
        (make_frame(35, payload=auth_payload(35)), "pass_authenticated_to_userspace"),  # SSID at offset 26
        (make_frame(35), "pass_authenticated_to_userspace"),  # SSID at 14, auth session
        # no authenticated session at offset 26: bytes 14-15 are zero, so this is a plain RFC 8762
        # packet (SSID 0, the base senders' session) with 68 bytes after the base: user space
        (make_frame(35, payload=auth_payload(4242)), "pass_tlvs_to_userspace"),
        (make_frame(30, payload=auth_payload(30)), "pass_tlvs_to_userspace"),  # ssid 30 is not authenticated
    ]
    for frame, counter in cases:
        out, d = reflect(refl, frame)
        assert out["action"] == "XDP_PASS" and d == {counter: 1}
        assert out["data_out"] == frame


def test_passed_tlv_packet_reaches_a_userspace_socket(veth, refl):
    """XDP_PASS really hands the packet to the stack: a socket on the reflector side gets it."""
    listener = udp_socket(veth.x_ns, veth.x_addr, 862)
    sender = udp_socket(veth.s_ns, veth.s_addr, 50030)
    before = stats(REFLECTOR, refl)
    payloads = [stamp_sender_payload(1, 30, tai_ns(), extra=TLVS), auth_payload(35)]
    for p in payloads:
        sender.sendto(p, (veth.x_addr, 862))
        data, peer = listener.recvfrom(2048)
        assert data == p and peer[:2] == (veth.s_addr, 50030)
    assert delta(before, stats(REFLECTOR, refl)) == {"pass_tlvs_to_userspace": 1, "pass_authenticated_to_userspace": 1}
    listener.close()
    sender.close()


def test_every_packet_in_exactly_one_counter(refl):
    rng = random.Random(4)
    kinds = {
        "reflected": lambda: make_frame(rng.choice([30, 31, 32, 33, 34, 36])),
        "echo": lambda: make_frame(34, extra=TLVS[: rng.randrange(4, len(TLVS) + 1)]),
        "pass_tlvs_to_userspace": lambda: make_frame(rng.choice([30, 31, 33]), extra=TLVS),
        "pass_authenticated_to_userspace": lambda: make_frame(35, payload=auth_payload(35)),
        "pass_unknown_session": lambda: make_frame(999),
        "drop_malformed_short": lambda: make_frame(30, payload=bytes(43)),
    }
    want: dict[str, int] = {}
    before = stats(REFLECTOR, refl)
    n = 60
    for _ in range(n):
        kind = rng.choice(sorted(kinds))
        out = prog_test_run(REFLECTOR, refl, kinds[kind]())
        counter = "reflected" if kind == "echo" else kind
        assert out["action"] == {"reflected": "XDP_TX", "drop_malformed_short": "XDP_DROP"}.get(counter, "XDP_PASS")
        want[counter] = want.get(counter, 0) + 1
    got = delta(before, stats(REFLECTOR, refl))
    assert got == want and sum(got.values()) == n


# ---- collector: NTP back to TAI ---------------------------------------------------------


def dump(pin_dir, count: int) -> list[dict]:
    p = run_tool(COLLECTOR, "dump", "--pin-dir", str(pin_dir), "--count", str(count), "--timeout-ms", "2000")
    return [json.loads(line) for line in p.stdout.splitlines()]


def reply_frame(ssid: int, t1: tuple, t2: tuple, t3: tuple, port: int, ee: int = 0x0001) -> bytes:
    payload = struct.pack("!I2IHH2II2IHHB3s", 9, *t3, ee, ssid, *t2, 9, *t1, ee, 0, 64, bytes(3))
    return eth_ipv6(R, S, 17, udp_datagram(R, S, 862, port, payload))


@pytest.mark.parametrize("tai_utc", [None, 37])
def test_collector_ntp_conversion_error_below_1ns(veth, reflector_and_collector, tai_utc):
    d = reflector_and_collector.coll_dir
    off = host_tai_offset() if tai_utc is None else tai_utc
    if tai_utc is not None:
        run_tool(COLLECTOR, "set-tai-offset", "--pin-dir", str(d), "--tai-offset", str(tai_utc))
    run_tool(COLLECTOR, "activate", "--pin-dir", str(d), "--ssid", "41", "--port", "50041", "--format", "ntp")
    rng = random.Random(41)
    now = tai_ns()
    frames, exact = [], []
    for i in range(40):
        # random NTP fields near now, including the fraction extremes (0 and 2^32-1 carries into the second)
        ts = []
        for _ in range(3):
            sec, _f = ntp_encode(now + rng.randrange(-10 * E9, 10 * E9), off)
            frac = [0, 2**32 - 1, 1, 2**31][i] if i < 4 else rng.randrange(2**32)
            ts.append((sec, frac))
        frames.append(reply_frame(41, *ts, 50041))
        exact.append([ntp_exact_tai_ns(s, f, off, now) for s, f in ts])
    before = stats(COLLECTOR, d)
    for f in frames:
        assert prog_test_run(COLLECTOR, d, f)["action"] == "XDP_DROP"
    assert delta(before, stats(COLLECTOR, d)) == {"collected": len(frames)}
    worst = Fraction(0)
    for rec, ex in zip(dump(d, len(frames)), exact):
        assert rec["flags"] & 1 and rec["ssid"] == 41  # STAMP_RECORD_F_NTP
        for key, e in zip(("t1_ns", "t2_ns", "t3_ns"), ex):
            worst = max(worst, abs(rec[key] - e))
    assert worst <= Fraction(1, 2)  # bound: < 1 ns per conversion
    # TAI ns -> NTP -> TAI ns is exact
    t = [now + rng.randrange(E9) for _ in range(3)]
    run_tool(COLLECTOR, "activate", "--pin-dir", str(d), "--ssid", "41", "--port", "50041", "--format", "ntp")
    prog_test_run(COLLECTOR, d, reply_frame(41, *(ntp_encode(x, off) for x in t), 50041))
    rec = dump(d, 1)[0]
    assert [rec["t1_ns"], rec["t2_ns"], rec["t3_ns"]] == t


def test_reflector_ntp_reply_through_collector(veth, reflector_and_collector):
    """The reflector's NTP reply, fed to the collector: TAI ns in the record = what the reflector stamped."""
    att = reflector_and_collector
    run_tool(REFLECTOR, "add-session", "--pin-dir", str(att.refl_dir), "--ssid", "42", "--format", "ntp", "--stateful")
    run_tool(
        COLLECTOR,
        "activate",
        "--pin-dir",
        str(att.coll_dir),
        "--ssid",
        "42",
        "--port",
        str(SENDER_PORT),
        "--format",
        "ntp",
    )
    off = host_tai_offset()
    for i in range(5):
        t1 = tai_ns()
        sec, frac = ntp_encode(t1, off)
        payload = struct.pack("!IIIHH28s", 70 + i, sec, frac, 0x0001, 42, bytes(28))
        out = prog_test_run(REFLECTOR, att.refl_dir, make_frame(42, payload=payload))
        rp, _ = reply_of(out)
        ref = tai_ns()
        stamped_t2 = ntp_exact_tai_ns(rp.rx_sec, rp.rx_frac, off, ref)
        stamped_t3 = ntp_exact_tai_ns(rp.ts_sec, rp.ts_frac, off, ref)
        assert prog_test_run(COLLECTOR, att.coll_dir, out["data_out"])["action"] == "XDP_DROP"
        rec = dump(att.coll_dir, 1)[0]
        assert rec["t1_ns"] == t1  # exact round trip
        assert abs(rec["t2_ns"] - stamped_t2) <= 1 and abs(rec["t3_ns"] - stamped_t3) <= 1
        assert t1 <= rec["t2_ns"] <= rec["t3_ns"] <= rec["t4_ns"]
        # F_NTP (the session's T1) | F_REFLECTOR_NTP (the reply's Z = 0: T2, T3 in NTP)
        assert (rec["reflector_seq"], rec["sender_seq"], rec["flags"]) == (i, 70 + i, 0x11)
        assert rec["reflector_err_est"] & EE_Z == 0


def test_ntp_and_ptp_sessions_over_veth(veth, reflector_and_collector):
    """Real sockets, both formats side by side, stateful NTP: records in TAI ns, ordered T1<=T2<=T3<=T4."""
    att = reflector_and_collector
    off = host_tai_offset()
    cfg = {43: ("ntp", ["--format", "ntp", "--stateful"]), 44: ("ptp", [])}
    socks = {}
    for ssid, (fmt, flags) in cfg.items():
        run_tool(REFLECTOR, "add-session", "--pin-dir", str(att.refl_dir), "--ssid", str(ssid), *flags)
        run_tool(
            COLLECTOR,
            "activate",
            "--pin-dir",
            str(att.coll_dir),
            "--ssid",
            str(ssid),
            "--port",
            str(50000 + ssid),
            "--format",
            fmt,
        )
        socks[ssid] = udp_socket(veth.s_ns, veth.s_addr, 50000 + ssid)
    t1s = []
    for i in range(10):
        ssid = 43 if i % 2 else 44
        t1 = tai_ns()
        if ssid == 43:
            sec, frac = ntp_encode(t1, off)
            payload = struct.pack("!IIIHH28s", i, sec, frac, 0x0001, ssid, bytes(28))
        else:
            payload = stamp_sender_payload(i, ssid, t1)
        socks[ssid].sendto(payload, (veth.x_addr, 862))
        t1s.append((ssid, t1))
    recs = dump(att.coll_dir, 10)
    t_end = tai_ns()
    by_seq = {r["sender_seq"]: r for r in recs}
    assert sorted(by_seq) == list(range(10))
    ntp_refl_seqs = []
    for i, (ssid, t1) in enumerate(t1s):
        r = by_seq[i]
        assert r["ssid"] == ssid and r["t1_ns"] == t1
        assert t1 <= r["t2_ns"] <= r["t3_ns"] <= r["t4_ns"] <= t_end
        assert r["flags"] == (0x11 if ssid == 43 else 0)  # F_NTP | F_REFLECTOR_NTP for the NTP session
        assert (r["reflector_err_est"] & EE_Z) == (0 if ssid == 43 else EE_Z)
        if ssid == 43:
            ntp_refl_seqs.append(r["reflector_seq"])
        else:
            assert r["reflector_seq"] == i
    assert ntp_refl_seqs == [0, 1, 2, 3, 4]
    for s in socks.values():
        s.close()


# ---- CLI --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tool,args,flag",
    [
        (REFLECTOR, ["add-session", "--ssid", "1", "--format", "tai"], "--format"),
        (REFLECTOR, ["add-session", "--ssid", "1", "--tlv", "drop"], "--tlv"),
        (REFLECTOR, ["add-session", "--ssid", "1", "--mode", "encrypted"], "--mode"),
        (REFLECTOR, ["set-tai-offset", "--tai-offset", "abc"], "--tai-offset"),
        (REFLECTOR, ["set-tai-offset", "--tai-offset", "5000"], "--tai-offset"),
        (COLLECTOR, ["activate", "--ssid", "1", "--port", "5", "--format", "NTP4"], "--format"),
        (COLLECTOR, ["set-tai-offset", "--tai-offset", "-2000"], "--tai-offset"),
    ],
)
def test_bad_values_refused(reflector_and_collector, tool, args, flag):
    att = reflector_and_collector
    pin = att.refl_dir if tool == REFLECTOR else att.coll_dir
    p = run_tool(tool, args[0], "--pin-dir", str(pin), *args[1:], check=False)
    assert p.returncode == 2 and flag in p.stderr, (p.returncode, p.stderr)


# ---- address set (array scanned by the program) -----------------------------------------


def test_address_set_add_delete_and_limit(refl):
    d = str(refl)
    extra = ["fd00:d5::a1", "fd00:d5::a2", "fd00:d5::a3"]

    def outcome(dst: str) -> dict:
        frame = eth_ipv6(S, dst, 17, udp_datagram(S, dst, SENDER_PORT, 862, stamp_sender_payload(1, 30, tai_ns())))
        return reflect(refl, frame)[1]

    for a in extra + [extra[0]]:  # adding twice is a no-op
        run_tool(REFLECTOR, "add-address", "--pin-dir", d, a)
    assert all(outcome(a) == {"reflected": 1} for a in [R] + extra)
    run_tool(REFLECTOR, "del-address", "--pin-dir", d, R)  # the first slot: the last moves in
    assert outcome(R) == {"pass_not_local_addr": 1}
    assert all(outcome(a) == {"reflected": 1} for a in extra)
    p = run_tool(REFLECTOR, "del-address", "--pin-dir", d, R, check=False)
    assert p.returncode == 1 and "ADDR" in p.stderr
    for i in range(64 - len(extra)):
        run_tool(REFLECTOR, "add-address", "--pin-dir", d, f"fd00:d5:1::{i + 1:x}")
    assert outcome("fd00:d5:1::3d") == {"reflected": 1}  # the 64th address
    p = run_tool(REFLECTOR, "add-address", "--pin-dir", d, "fd00:d5:2::1", check=False)
    assert p.returncode == 1 and "ADDR" in p.stderr and "64" in p.stderr
    p = run_tool(REFLECTOR, "add-address", "--pin-dir", d, "not-an-address", check=False)
    assert p.returncode == 2 and "ADDR" in p.stderr
