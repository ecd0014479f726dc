"""The fast engine of the user-space reflector (C workers + the Python code) against the Python engine.

One veth pair of our own (namespaces usf-s / usf-x, tests/datapath/dp_env.VethPair: sender fd00:d5::1
with the local SIDs fc00:d5::e1/e2 that return paths loop through, reflector addresses fd00:d5::2 and
fd00:d5::3). Every test packet is sent by this test, from sockets it opens in usf-s; what comes
back is read as frames from an AF_PACKET socket on usf-s0, so replies are compared byte by byte,
IPv6 header and SRH included. Ground truth for T2 is a packet socket on the reflector's veth: the
kernel stamps a received frame once, so the reflector's T2 must equal that capture's timestamp.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import socket
import struct
import subprocess
import time
from dataclasses import dataclass, field

import pytest
from ustamp_env import PY, REPO, ReflectorProc, socket_in_netns

from collectors.ustamp.netutil import socket_drops
from segscope_schemas import stamp_hmac
from segscope_schemas import stamp_tlv as T
from segscope_schemas.stamp_test_packet import SenderPacket
from segscope_schemas.stamp_timestamp import ntp_to_tai_ns, ptp_to_tai_ns
from tests.datapath.dp_env import VethPair, udp6_checksum
from tests.isolation import own_name

pytestmark = pytest.mark.datapath

KEY = bytes(range(32))
ETH_P_ALL, ETH_P_IPV6 = 0x0003, 0x86DD
PACKET_HOST, PACKET_OUTGOING = 0, 4
SO_TIMESTAMPNS = 35
EE_PTP, EE_NTP = 0x4001, 0x0001  # what a sender puts in (Z says its format; the reflector ignores it)
FLOOD = REPO / "build" / "bench" / "udp_flood"
CLOCK_TAI = 11


def tai_offset_s() -> int:
    return (time.clock_gettime_ns(CLOCK_TAI) - time.time_ns() + 500_000_000) // 1_000_000_000


@pytest.fixture(scope="module")
def pair(bpffs):
    subprocess.run(["make", "-s", "-C", str(REPO / "collectors")], check=True)
    subprocess.run(["make", "-s", "-C", str(REPO / "bench")], check=True)
    usf = own_name("usf")
    p = VethPair(s_ns=f"{usf}-s", x_ns=f"{usf}-x", s_dev=f"{usf}-s0", x_dev=f"{usf}-x0")
    p.setup()
    try:
        yield p
    finally:
        p.teardown()


@pytest.fixture(scope="module")
def key_file(tmp_path_factory):
    f = tmp_path_factory.mktemp("usf") / "keys.json"
    f.write_text(json.dumps({"keys": [{"id": 1, "key_hex": KEY.hex()}]}))
    return str(f)


def reflector(pair: VethPair, engine: str, *args: str) -> ReflectorProc:
    r = ReflectorProc(pair.x_ns, "--engine", engine, *args)
    assert r.ready["engine"] == engine, r.ready
    return r


class Frames:
    """Frames on a device, read by an AF_PACKET socket in its namespace (with kernel timestamps)."""

    def __init__(self, ns: str, dev: str):
        # ETH_P_ALL: a tap that sees the frames the device sends too (a protocol-bound one does not)
        self.sock = socket_in_netns(ns, socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.bind((dev, ETH_P_ALL))

    def read(self, timeout: float, until=None, grace: float = 0.05) -> list[tuple[int, int, bytes]]:
        """(pkttype, realtime ns, IPv6 packet) of every frame until `timeout` s pass without one, or
        until a frame satisfies `until` (then `grace` s more for any frame that should not come)."""
        out = []
        wait = timeout
        while select.select([self.sock], [], [], wait)[0]:
            data, anc, _flags, addr = self.sock.recvmsg(65535, 64)
            if struct.unpack_from("!H", data, 12)[0] != ETH_P_IPV6:
                continue
            ts = next(struct.unpack("=qq", d) for lvl, typ, d in anc if typ == SO_TIMESTAMPNS)
            out.append((addr[2], ts[0] * 1_000_000_000 + ts[1], data[14:]))
            if until is not None and until(out[-1]):
                wait = grace
        return out

    def close(self) -> None:
        self.sock.close()


@dataclass
class Udp:
    """An IPv6 packet's addresses, SRH and UDP datagram."""

    raw: bytes
    src: str = ""
    dst: str = ""
    final_dst: str = ""
    sport: int = 0
    dport: int = 0
    payload: bytes = b""
    udp_off: int = 0

    @classmethod
    def parse(cls, raw: bytes) -> "Udp | None":
        nh, off = raw[6], 40
        u = cls(raw, socket.inet_ntop(socket.AF_INET6, raw[8:24]), socket.inet_ntop(socket.AF_INET6, raw[24:40]))
        u.final_dst = u.dst
        if nh == 43:  # routing header: segments[0] is where the packet ends
            nh, hdrlen = raw[40], raw[41]
            u.final_dst = socket.inet_ntop(socket.AF_INET6, raw[48:64])
            off += 8 + 8 * hdrlen
        if nh != 17:
            return None
        u.udp_off = off
        u.sport, u.dport = struct.unpack_from("!HH", raw, off)
        u.payload = raw[off + 8 :]
        return u

    def checksum_ok(self) -> bool:
        return udp6_checksum(self.src, self.final_dst, self.raw[self.udp_off :]) == 0


def sender_packet(seq: int, ssid: int, ee: int = EE_PTP, t1: tuple[int, int] = (1_800_000_000, 123_456_789)) -> bytes:
    return SenderPacket(seq, t1[0], t1[1], ee, ssid).encode()


def auth_packet(seq: int, ssid: int, good: bool = True) -> bytes:
    p = bytearray(112)
    struct.pack_into("!I", p, 0, seq)
    struct.pack_into("!IIHH", p, 16, 1_800_000_000, 5, EE_PTP, ssid)
    table = stamp_hmac.HmacKeyTable()
    table.add(1, KEY if good else bytes(32))
    table.set_current(1)
    p[96:112] = table.sign(bytes(p[:96]), time.clock_gettime_ns(CLOCK_TAI))[0]
    return bytes(p)


def tlv(t: int, value: bytes, flags: int = 0x80) -> bytes:
    return T.encode_tlv(t, value, flags)


@dataclass
class Send:
    """One datagram of a scenario and what we know about its reply."""

    payload: bytes
    src: str = "s"  # "s" = the sender address, "e1" = a second source address of the sender node
    dst: str = "x"  # "x" = fd00:d5::2, "o" = fd00:d5::3 (both the reflector's)
    hop_limit: int = 64
    tclass: int = 0
    reply: bool = True
    masks: list[tuple[int, int]] = field(default_factory=list)  # payload ranges that hold times
    authenticated: bool = False


# payload ranges holding T3 and T2 (RFC 8762 §4.3.1 / §4.3.2), and the authenticated HMAC
BASE_TIMES = [(4, 12), (16, 24)]
AUTH_TIMES = [(16, 24), (32, 40), (96, 112)]


def scenario() -> list[Send]:
    """Every mode of the fast path, and what goes to the Python code, from two senders."""
    out: list[Send] = []
    for ssid in (1, 2, 3, 4, 5, 6):  # PTP/NTP x stateless/stateful x return SIDs, exact and any sender
        for i, (hop, dst, ee) in enumerate(((64, "x", EE_PTP), (5, "o", EE_NTP), (255, "x", 0x8123))):
            t1 = (1_800_000_000 + i, 999_999_999 - i)
            out.append(Send(sender_packet(100 * ssid + i, ssid, ee, t1), "s", dst, hop))
        # another sender: the {::, ssid} session answers (SSID 6 has only one for fd00:d5::1)
        out.append(Send(sender_packet(7000 + ssid, ssid), "e1", "x", 17, reply=ssid != 6))
    out.append(Send(sender_packet(42, 0, EE_PTP), "s", "x", 33))  # RFC 8762 sender without SSID: {::, 0}
    out.append(Send(sender_packet(43, 99), reply=False))  # unknown SSID
    out.append(Send(sender_packet(44, 1)[:40], reply=False))  # short
    # TLVs (the Python code): Direct Measurement counts this sender's fast-path packets too
    out.append(Send(sender_packet(50, 3) + tlv(T.TYPE_DIRECT_MEASUREMENT, struct.pack("!III", 77, 0, 0))))
    out.append(Send(sender_packet(51, 1) + tlv(T.TYPE_TIMESTAMP_INFO, bytes(4)) + tlv(200, b"abcd")))
    out.append(Send(sender_packet(52, 2) + tlv(T.TYPE_CLASS_OF_SERVICE, struct.pack("!I", 46 << 26)), tclass=0x2A << 2))
    fut_t3 = (44 + 4 + 4, 44 + 4 + 12)  # Follow-Up Telemetry's T3 (its value: seq, T3, method)
    out.append(Send(sender_packet(53, 4) + tlv(T.TYPE_FOLLOW_UP_TELEMETRY, bytes(16)), masks=[fut_t3]))
    ret = tlv(10, T.encode_tlv(3, socket.inet_pton(socket.AF_INET6, "fc00:d5::e2"), 0), 0x80)  # SRv6 segment list
    out.append(Send(sender_packet(54, 1) + ret))
    out.append(Send(sender_packet(55, 1) + tlv(10, T.encode_tlv(1, struct.pack("!I", 0), 0)), reply=False))
    out.append(Send(sender_packet(56, 1) + b"\x00"))  # a broken TLV area: M flag, echoed
    out.append(Send(auth_packet(60, 7), masks=AUTH_TIMES, authenticated=True))
    out.append(Send(auth_packet(61, 7, good=False), reply=False, authenticated=True))
    out.append(Send(sender_packet(62, 7), reply=False))  # an unauthenticated packet for it: auth_failed
    out.append(Send(sender_packet(63, 3) + tlv(T.TYPE_DIRECT_MEASUREMENT, struct.pack("!III", 78, 0, 0))))
    for s in out:
        s.masks = BASE_TIMES + s.masks if not s.authenticated else s.masks
    return out


SESSIONS = [
    "--ssid 1",
    "--ssid 2 --format ntp",
    "--ssid 3 --stateful",
    "--ssid 4 --format ntp --stateful --return-sids fc00:d5::e1",
    "--ssid 5 --sender fd00:d5::1 --return-sids fc00:d5::e1,fc00:d5::e2",
    "--ssid 5 --format ntp",  # any sender: answers e1
    "--ssid 6 --sender fd00:d5::1 --format ntp --stateful --return-sids fc00:d5::e2",
]


def run_scenario(pair: VethPair, engine: str, key_file: str, sends: list[Send]) -> tuple[list, dict]:
    """Each datagram alone (the next one leaves when its reply is in, or 0.3 s after one that gets
    none): (reply frames, counters)."""
    args = [a for s in SESSIONS for a in ("--add-session", s)]
    args += ["--add-session", f"--ssid 7 --mode authenticated --key-file {key_file}"]
    r = reflector(pair, engine, *args)
    frames = Frames(pair.s_ns, pair.s_dev)
    socks = {}
    try:
        for name, addr in (("s", pair.s_addr), ("e1", pair.s_sids[0])):
            sk = socket_in_netns(pair.s_ns, socket.AF_INET6, socket.SOCK_DGRAM)
            sk.bind((addr, 40862))
            socks[name] = sk
        dsts = {"x": pair.x_addr, "o": pair.x_other}
        replies = []
        for s in sends:
            cmsg = [
                (socket.IPPROTO_IPV6, socket.IPV6_HOPLIMIT, struct.pack("=i", s.hop_limit)),
                (socket.IPPROTO_IPV6, socket.IPV6_TCLASS, struct.pack("=i", s.tclass)),
            ]
            socks[s.src].sendmsg([s.payload], cmsg, 0, (dsts[s.dst], 862))
            got = [f for f in frames.read(2.0 if s.reply else 0.3, is_reply) if f[0] == PACKET_HOST]
            got = [u for u in (Udp.parse(f[2]) for f in got) if u and u.sport == 862]
            assert len(got) == (1 if s.reply else 0), (engine, s, got)
            replies.append(got[0] if got else None)
        return replies, r.stop()
    finally:
        r.kill()
        frames.close()
        for sk in socks.values():
            sk.close()


def is_reply(frame: tuple[int, int, bytes]) -> bool:
    u = Udp.parse(frame[2]) if frame[0] == PACKET_HOST else None
    return u is not None and u.sport == 862


def masked(u: Udp, masks: list[tuple[int, int]]) -> bytes:
    b = bytearray(u.raw)
    b[u.udp_off + 6 : u.udp_off + 8] = b"\0\0"  # the UDP checksum covers T2/T3 (checked on its own)
    for lo, hi in masks:
        b[u.udp_off + 8 + lo : u.udp_off + 8 + hi] = bytes(hi - lo)
    return bytes(b)


def test_replies_are_byte_identical_to_the_python_engine(pair, key_file):
    """The same datagrams, one at a time, to the Python engine and then to the fast engine: every
    reply is the same IPv6 packet (header, flow label, SRH, UDP, payload, TLVs) but for the times
    (T2, T3, the HMAC over them, a Follow-Up Telemetry T3) and the UDP checksum over them, both
    verified separately; the counters agree too. The modes: PTP/NTP, stateless/stateful (fresh
    counters from 0 in both), return SIDs, exact and any-sender sessions, Error Estimate, Ses-Sender
    TTL from the hop limit, reply source = the test packet's destination, a sender without SSID;
    and what the Python code answers: TLVs (Direct Measurement after fast-path packets of the
    same sender, Class of Service with the received traffic class, Return Path), authenticated."""
    sends = scenario()
    t_start = time.clock_gettime_ns(CLOCK_TAI)
    old, old_counters = run_scenario(pair, "python", key_file, sends)
    new, new_counters = run_scenario(pair, "fast", key_file, sends)
    t_end = time.clock_gettime_ns(CLOCK_TAI)
    off = tai_offset_s()
    for s, a, b in zip(sends, old, new):
        if a is None:
            assert b is None
            continue
        assert masked(a, s.masks) == masked(b, s.masks), (s, a.raw.hex(), b.raw.hex())
        for u in (a, b):
            assert u.checksum_ok(), u.raw.hex()
            assert u.dst != pair.x_addr and u.sport == 862
            if not s.authenticated:  # T2 <= T3, both inside the run (in the reply's own format)
                ntp = not (struct.unpack_from("!H", u.payload, 12)[0] & 0x4000)
                t3, t2 = (
                    ntp_to_tai_ns(*struct.unpack_from("!II", u.payload, o), off, t_end)
                    if ntp
                    else ptp_to_tai_ns(*struct.unpack_from("!II", u.payload, o), t_end)
                    for o in (4, 16)
                )
                assert t_start <= t2 <= t3 <= t_end + 1, (s, t2, t3)
    # the reply's source is the address the test packet was sent to
    for s, b in zip(sends, new):
        if b is not None:
            assert b.src == {"x": pair.x_addr, "o": pair.x_other}[s.dst]
    fast_only = {"slow_path", "slow_path_queue_full", "srh_switches", "batches"}
    assert {k: v for k, v in new_counters.items() if k not in fast_only} == old_counters
    assert new_counters["slow_path"] == sum(len(s.payload) > 44 for s in sends)
    assert new_counters["received"] == len(sends) and new_counters["slow_path_queue_full"] == 0


def test_follow_up_telemetry_reports_the_previous_fast_path_reply(pair):
    """Follow-Up Telemetry (RFC 8972 §4.7) carries the seq and T3 of this sender's previous reply:
    the fast path's replies too (the C workers keep the per-sender state the Python code reads)."""
    r = reflector(pair, "fast", "--add-session", "--ssid 11 --stateful")
    frames = Frames(pair.s_ns, pair.s_dev)
    sk = socket_in_netns(pair.s_ns, socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        sk.bind((pair.s_addr, 40911))
        replies = []
        for i, pkt in enumerate(
            [sender_packet(0, 11), sender_packet(1, 11), sender_packet(2, 11) + tlv(7, bytes(16)), sender_packet(3, 11)]
        ):
            sk.sendto(pkt, (pair.x_addr, 862))
            got = [Udp.parse(f[2]) for f in frames.read(2.0, is_reply) if f[0] == PACKET_HOST]
            assert len(got) == 1, (i, got)
            replies.append(got[0].payload)
        fut_seq, fut_sec, fut_frac, method = struct.unpack_from("!IIIB", replies[2], 48)
        assert (fut_seq, fut_sec, fut_frac) == struct.unpack_from("!III", replies[1], 0)  # reply 1: fast path
        assert method == 2  # SW local
        assert [struct.unpack_from("!I", p)[0] for p in replies] == [0, 1, 2, 3]  # one counter, both paths
        c = r.stop()
        assert c["slow_path"] == 1 and c["reflected"] == 4
    finally:
        r.kill()
        frames.close()
        sk.close()


@pytest.mark.parametrize("engine", ["fast", "python"])
@pytest.mark.parametrize("fmt", ["ptp", "ntp"])
def test_t2_is_the_kernel_receive_timestamp_and_t3_precedes_the_send(pair, engine, fmt):
    """T2 = the receive timestamp the kernel gave the test packet's frame, the same one a packet
    socket on the reflector's veth reads (to the ns for PTP; NTP's fraction keeps 0.23 ns); T3 is
    read after it and before the reply leaves (the packet socket's stamp of the outgoing frame)."""
    r = reflector(pair, engine, "--add-session", f"--ssid 12 --format {fmt}")
    frames = Frames(pair.x_ns, pair.x_dev)
    sk = socket_in_netns(pair.s_ns, socket.AF_INET6, socket.SOCK_DGRAM)
    n = 40
    try:
        sk.bind((pair.s_addr, 40912))
        for i in range(n):
            sk.sendto(sender_packet(i, 12), (pair.x_addr, 862))
            time.sleep(0.002)
        seen = frames.read(1.0)
    finally:
        r.kill()
        frames.close()
        sk.close()
    off = tai_offset_s() * 1_000_000_000
    rx = {}  # sender seq -> kernel receive time of the test packet (TAI)
    tx = {}  # sender seq -> (T2, T3 from the reply, kernel time of the reply leaving)
    now = time.clock_gettime_ns(CLOCK_TAI)
    for pkttype, ts, raw in seen:
        u = Udp.parse(raw)
        if u is None:
            continue
        if pkttype == PACKET_HOST and u.dport == 862:
            rx[struct.unpack_from("!I", u.payload)[0]] = ts + off
        elif pkttype == PACKET_OUTGOING and u.sport == 862:
            if fmt == "ptp":
                t3, t2 = (ptp_to_tai_ns(*struct.unpack_from("!II", u.payload, o), now) for o in (4, 16))
            else:
                t3, t2 = (ntp_to_tai_ns(*struct.unpack_from("!II", u.payload, o), off // 10**9, now) for o in (4, 16))
            tx[struct.unpack_from("!I", u.payload, 24)[0]] = (t2, t3, ts + off)
    assert sorted(rx) == sorted(tx) == list(range(n))
    tolerance = 0 if fmt == "ptp" else 1
    for seq in range(n):
        t2, t3, left = tx[seq]
        assert abs(t2 - rx[seq]) <= tolerance, (seq, t2 - rx[seq])
        assert t2 <= t3 <= left + tolerance, (seq, t3 - t2, left - t3)


def worker_of(src: str, ssid: int, workers: int) -> int:
    """The worker the session steering program picks (collectors/ustamp_fast.c attach_steering)."""
    w = struct.unpack("!4I", socket.inet_pton(socket.AF_INET6, src))
    a = w[0] ^ w[1] ^ w[2] ^ w[3] ^ ssid
    return (((a * 0x9E3779B1) & 0xFFFFFFFF) >> 16) % workers


def dump(r: ReflectorProc) -> dict:
    r.proc.send_signal(signal.SIGUSR1)
    return r.next_line()


def blast(pair: VethPair, ssid: int, count: int, port: int) -> tuple[list[bytes], int]:
    """`count` test packets as fast as this process sends them; every reply, read after the last
    one came (a 64 MiB receive buffer holds them all: the test sees every reply)."""
    sk = socket_in_netns(pair.s_ns, socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        sk.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)  # SO_RCVBUFFORCE
        sk.bind((pair.s_addr, port))
        dst = (pair.x_addr, 862)
        pkts = [sender_packet(i, ssid) for i in range(count)]
        for p in pkts:
            sk.sendto(p, dst)
        replies = []
        while select.select([sk], [], [], 1.0)[0]:
            replies.append(sk.recv(2048))
        return replies, socket_drops(sk)
    finally:
        sk.close()


def test_stateful_sequence_is_one_counter_across_workers(pair):
    """Two workers, packet steering (any datagram to any worker): one stateful session's reflector
    seqs are exactly 0..R-1 for its R replies, and both workers answered (the counter is shared)."""
    r = reflector(pair, "fast", "--workers", "2", "--steering", "packet", "--add-session", "--ssid 13 --stateful")
    try:
        before = dump(r)
        replies, receiver_drops = blast(pair, 13, 30000, 40913)
        after = dump(r)
    finally:
        r.kill()
    assert receiver_drops == 0  # the test saw every reply
    seqs = [struct.unpack_from("!I", p)[0] for p in replies]
    assert sorted(seqs) == list(range(len(seqs))), "reflector seqs unique and gap-free"
    c0, c1 = before["counters"], after["counters"]
    assert c1["reflected"] - c0["reflected"] == len(seqs)
    assert c1["received"] - c0["received"] + c1["socket_drops"] - c0["socket_drops"] == 30000
    per_worker = [a["reflected"] - b["reflected"] for a, b in zip(after["workers"], before["workers"])]
    assert all(n > 0 for n in per_worker) and sum(per_worker) == len(seqs), per_worker
    print(f"\n30000 sent, {len(seqs)} replies, per worker {per_worker}, socket drops {c1['socket_drops']}")


def test_session_steering_keeps_a_session_on_one_worker_in_order(pair):
    """Session steering (the default): a (sender, SSID) always goes to the same worker, the one the
    steering program's hash names, so a stateful session's replies leave in the order of its test
    packets; two sessions the hash puts on different workers use both."""
    ssids = [s for s in range(20, 40) if worker_of(pair.s_addr, s, 2) == 0][:1]
    ssids += [s for s in range(20, 40) if worker_of(pair.s_addr, s, 2) == 1][:1]
    specs = [a for s in ssids for a in ("--add-session", f"--ssid {s} --stateful")]
    r = reflector(pair, "fast", "--workers", "2", "--steering", "session", *specs)
    try:
        got = {}
        for k, ssid in enumerate(ssids):
            before = dump(r)
            replies, receiver_drops = blast(pair, ssid, 5000, 40920 + k)
            after = dump(r)
            assert receiver_drops == 0
            got[ssid] = (
                [a["reflected"] - b["reflected"] for a, b in zip(after["workers"], before["workers"])],
                replies,
            )
    finally:
        r.kill()
    for ssid in ssids:
        per_worker, replies = got[ssid]
        want = [0, 0]
        want[worker_of(pair.s_addr, ssid, 2)] = len(replies)
        assert per_worker == want, (ssid, per_worker)
        # in order: reflector seq i answers the i-th test packet that was answered
        pairs = [struct.unpack_from("!I", p)[0] for p in replies], [struct.unpack_from("!I", p, 24)[0] for p in replies]
        assert pairs[0] == list(range(len(replies)))
        assert pairs[1] == sorted(pairs[1])


def snmp6(ns: str) -> dict[str, int]:
    out = subprocess.run(["ip", "netns", "exec", ns, "cat", "/proc/net/snmp6"], capture_output=True, text=True)
    return {k: int(v) for k, v in (line.split() for line in out.stdout.splitlines() if line.strip())}


def test_overload_every_datagram_is_answered_or_a_counted_socket_drop(pair):
    """A flood beyond one worker: what the kernel drops at the reflector's socket is in
    socket_drops, equal to the namespace's Udp6RcvbufErrors; sent = received + socket_drops;
    every received datagram is answered (replies counted on the sender's veth by XDP)."""
    from bench.reflector_vs_bounce import attach_reply_counter, reply_count

    map_id = attach_reply_counter(pair)
    r = reflector(pair, "fast", "--workers", "1", "--add-session", f"--ssid 14 --sender {pair.s_addr}")
    try:
        snmp0, c0, replies0 = snmp6(pair.x_ns), r.counters(), reply_count(map_id)
        res = subprocess.run(
            [str(FLOOD), "--netns", pair.s_ns, "--src", pair.s_addr, "--dst", pair.x_addr, "--ssid", "14"]
            + ["--seconds", "2", "--batch", "64"],
            capture_output=True,
            text=True,
            check=True,
        )
        sent = json.loads(res.stdout)["sent"]
        time.sleep(0.5)
        c1 = r.stop()
        snmp1, replies = snmp6(pair.x_ns), reply_count(map_id) - replies0
    finally:
        r.kill()
        pair.detach_xdp(pair.s_ns, pair.s_dev)
    d = {k: c1[k] - c0[k] for k in c1}
    drops = snmp1["Udp6RcvbufErrors"] - snmp0["Udp6RcvbufErrors"]
    assert snmp1["Udp6InCsumErrors"] == snmp0["Udp6InCsumErrors"]
    assert d["socket_drops"] == drops > 0, (d, drops)
    assert d["received"] + d["socket_drops"] == sent
    assert d["reflected"] == d["received"] == replies
    print(f"\nflood {sent}: reflected {d['reflected']}, socket drops {d['socket_drops']}")


def test_slow_path_queue_full_is_counted(pair):
    """TLV packets at a rate the Python code cannot follow: the queue to it fills, and what does not
    fit is counted slow_path_queue_full (no reply) — received = the sum of the outcomes throughout."""
    r = reflector(pair, "fast", "--workers", "1", "--add-session", f"--ssid 15 --sender {pair.s_addr}")
    try:
        res = subprocess.run(
            [str(FLOOD), "--netns", pair.s_ns, "--src", pair.s_addr, "--dst", pair.x_addr, "--ssid", "15"]
            + ["--seconds", "2", "--batch", "64", "--padding-tlv", "8"],
            capture_output=True,
            text=True,
            check=True,
        )
        sent = json.loads(res.stdout)["sent"]
        c = r.stop()
    finally:
        r.kill()
    outcomes = ["reflected", "unknown_session", "malformed_short", "no_reply_requested", "auth_failed"]
    outcomes += ["auth_no_key", "send_error", "internal_error", "slow_path_queue_full"]
    assert c["received"] == sum(c[k] for k in outcomes)
    assert c["received"] + c["socket_drops"] == sent
    assert c["slow_path_queue_full"] > 0 and c["reflected"] == c["slow_path"] > 0
    assert c["tlv_handled"] == c["reflected"]
    print(f"\nTLV flood {sent}: answered by Python {c['reflected']}, queue full {c['slow_path_queue_full']}")


def test_sighup_keeps_the_shared_counter(pair, tmp_path):
    """SIGHUP with the session unchanged: the stateful counter continues (state kept in C); a changed
    session starts again from 0; a broken file keeps the running tables."""
    f = tmp_path / "s.json"
    f.write_text(json.dumps([{"ssid": 16, "stateful": True}, {"ssid": 17, "stateful": True}]))
    r = reflector(pair, "fast", "--sessions", str(f))
    sk = socket_in_netns(pair.s_ns, socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        sk.bind((pair.s_addr, 40916))
        sk.settimeout(2)

        def seqs(ssid: int, n: int) -> list[int]:
            out = []
            for i in range(n):
                sk.sendto(sender_packet(i, ssid), (pair.x_addr, 862))
                out.append(struct.unpack_from("!I", sk.recv(2048))[0])
            return out

        assert seqs(16, 3) == [0, 1, 2] and seqs(17, 2) == [0, 1]
        f.write_text(json.dumps([{"ssid": 16, "stateful": True}, {"ssid": 17, "stateful": True, "format": "ntp"}]))
        r.proc.send_signal(signal.SIGHUP)
        assert r.next_line()["event"] == "reloaded"
        assert seqs(16, 2) == [3, 4] and seqs(17, 2) == [0, 1]
        f.write_text("[{")
        r.proc.send_signal(signal.SIGHUP)
        assert seqs(16, 1) == [5]
        assert r.counters()["reflected"] == 10
    finally:
        r.kill()
        sk.close()


def test_engine_fast_without_the_library_fails_naming_the_flag(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'schemas' / 'python'}", "SEGSCOPE_BUILD_DIR": str(tmp_path)}
    cmd = [PY, "-m", "collectors.ustamp", "reflector", "--engine", "fast", "--add-session", "--ssid 1"]
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 1 and "--engine fast" in res.stderr and "libustamp_fast.so" in res.stderr


def test_ctypes_mirrors_match_the_library():
    from collectors.ustamp import fast

    lib = fast.load_library()
    assert ctypes.sizeof(fast.RxMetaC) == lib.ufast_sizeof_rx_meta()
    assert ctypes.sizeof(fast.PeerViewC) == lib.ufast_sizeof_peer_view()
    assert "slow_path_queue_full" in fast.counter_names(lib)


def test_a_second_reflector_on_the_port_is_refused(pair):
    """Two fast engines on one port would share one SO_REUSEPORT group, the second one's workers
    never picked: the second is refused at start (exit 1, naming the port)."""
    r = reflector(pair, "fast", "--add-session", "--ssid 18")
    try:
        env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'schemas' / 'python'}"}
        cmd = [PY, "-m", "collectors.ustamp", "reflector", "--netns", pair.x_ns, "--add-session", "--ssid 18"]
        res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=30)
        assert res.returncode == 1 and "port 862 is already in use" in res.stderr, res.stderr
        assert r.proc.poll() is None  # the first one runs on
    finally:
        r.kill()
