"""Helpers for the alternate-marking datapath tests (altmark_tx / altmark_rx).

Real programs in the real kernel: the loaders in build/datapath, the netlab line5 network
(H1–A–R–B–H2), per-CPU maps read through ctypes on the system libbpf.so.1, frames for
BPF_PROG_TEST_RUN built with struct. Every resource carries PREFIX (default "amdp").
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import socket
import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.datapath.dp_env import in_netns
from tests.fuzz.bpf_testrun import _lib, _TestRunOpts, obj_get
from tests.isolation import own_name

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "build" / "datapath"
TX = BUILD / "altmark_tx"
RX = BUILD / "altmark_rx"
PIN_ROOT = Path("/sys/fs/bpf/segscope")
PREFIX = os.environ.get("SEGSCOPE_ALTMARK_TEST_PREFIX") or own_name("amdp")

MAX_SIDS = 6
MAX_FLOWS = 65536
METHOD_DSCP, METHOD_RFC9343 = 1, 2
OPT_TYPE = 0x12
L_FLAG, D_FLAG = 0x800, 0x400

# the line5 policy A -> B: travel order; the SRH holds it reversed (segments[0] = fc00:3::d6)
POLICY = ["fc00:2::e", "fc00:3::d6"]
H2_ADDR = "fd00:b::1"
UDP_PORT = 9000
SO_RCVBUFFORCE = 33  # root: above net.core.rmem_max, so nothing is dropped before we read

TX_COUNTERS = [
    "pass_not_ipv6",
    "pass_no_srh",
    "pass_not_srh",
    "pass_too_many_sids",
    "pass_malformed_srh",
    "pass_unmonitored",
    "pass_already_marked",
    "pass_mark_failed",
    "pass_bad_slot",
    "coloured_dscp",
    "coloured_rfc9343",
    "pass_gso_not_marked",
]
RX_COUNTERS = [
    "pass_not_ipv6",
    "pass_no_srh",
    "pass_not_srh",
    "pass_too_many_sids",
    "pass_malformed_srh",
    "pass_malformed_doh",
    "pass_unmonitored",
    "pass_unknown_flowmon",
    "pass_bad_slot",
    "counted_dscp",
    "counted_rfc9343",
    "pass_malformed_hbh",
]

_lib.bpf_map_lookup_elem.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
_lib.bpf_map_update_elem.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64]
_lib.bpf_map_delete_elem.argtypes = [ctypes.c_int, ctypes.c_void_p]
NCPU = _lib.libbpf_num_possible_cpus()


def tai_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_TAI)


def run(tool: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([str(tool), *args], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"{tool.name} {' '.join(args)} -> {p.returncode}: {p.stderr}")
    return p


def stats(tool: Path, instance: str) -> dict[str, int]:
    return json.loads(run(tool, "stats", "--instance", instance, "--json").stdout)


def list_flows(tool: Path, instance: str) -> list[dict]:
    return json.loads(run(tool, "list-flows", "--instance", instance, "--json").stdout)["flows"]


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


# ---------------------------------------------------------------- maps through ctypes


def sidlist_key(travel: list[str]) -> bytes:
    wire = [socket.inet_pton(socket.AF_INET6, s) for s in reversed(travel)]
    return struct.pack("<II", len(wire), 0) + b"".join(wire) + bytes(16 * (MAX_SIDS - len(wire)))


def flow_value(
    flow_id: int,
    slot: int,
    period_ns: int,
    method: int,
    l_bit: int = 0,
    d_bit: int = 1,
    dmark_every: int = 0,
    installed: int = 0,
) -> bytes:
    return struct.pack("<IIQQBBBBI", flow_id, slot, period_ns, installed, method, l_bit, d_bit, 0, dmark_every)


class Maps:
    """The pinned maps of one program instance."""

    def __init__(self, pin_dir: Path):
        self.dir = pin_dir
        self.counters_fd = obj_get(pin_dir / "altmark_counters")
        self.flows_fd = obj_get(pin_dir / "altmark_flows")
        self._val = (ctypes.c_uint64 * (4 * NCPU))()

    def per_cpu(self, slot: int, colour: int) -> list[tuple[int, int, int, int]]:
        """[(packets, bytes, dmark_packets, dmark_ts_sum_ns)] per CPU of counter slot*2+colour."""
        key = ctypes.c_uint32(slot * 2 + colour)
        if _lib.bpf_map_lookup_elem(self.counters_fd, ctypes.byref(key), self._val) != 0:
            raise OSError(ctypes.get_errno(), "lookup altmark_counters")
        v = list(self._val)
        return [tuple(v[c * 4 : (c + 1) * 4]) for c in range(NCPU)]

    def summed(self, slot: int, colour: int) -> tuple[int, int, int, int]:
        rows = self.per_cpu(slot, colour)
        return tuple(sum(r[i] for r in rows) & (2**64 - 1) for i in range(4))

    def put_flow(self, key: bytes, value: bytes) -> None:
        k, v = ctypes.create_string_buffer(key, len(key)), ctypes.create_string_buffer(value, len(value))
        if _lib.bpf_map_update_elem(self.flows_fd, k, v, 0) != 0:
            raise OSError(ctypes.get_errno(), "update altmark_flows")

    def del_flow(self, key: bytes) -> None:
        k = ctypes.create_string_buffer(key, len(key))
        _lib.bpf_map_delete_elem(self.flows_fd, k)


class TestRun:
    """BPF_PROG_TEST_RUN of a pinned program (TC or XDP): output frame, retval, kernel duration."""

    def __init__(self, prog_pin: Path):
        self.fd = obj_get(prog_pin)
        self._in = ctypes.create_string_buffer(4096)
        self._out = ctypes.create_string_buffer(4096 + 256)
        self.opts = _TestRunOpts(sz=ctypes.sizeof(_TestRunOpts))

    def run(self, frame: bytes, repeat: int = 1, ctx: bytes | None = None) -> tuple[int, bytes, int]:
        """ctx: the context to start from: a struct __sk_buff (TC; e.g. gso_segs/gso_size, see skb_ctx)
        or a struct xdp_md (XDP; e.g. the ingress device, see chain_env.xdp_md)."""
        ctypes.memmove(self._in, frame, len(frame))
        o = self.opts
        o.data_in, o.data_size_in = ctypes.addressof(self._in), len(frame)
        o.data_out, o.data_size_out = ctypes.addressof(self._out), len(self._out)
        o.repeat = repeat
        self._ctx = ctypes.create_string_buffer(ctx, len(ctx)) if ctx else None
        o.ctx_in = ctypes.addressof(self._ctx) if ctx else None
        o.ctx_size_in = len(ctx) if ctx else 0
        if _lib.bpf_prog_test_run_opts(self.fd, ctypes.byref(o)) != 0:
            raise OSError(ctypes.get_errno(), "bpf_prog_test_run_opts")
        # signed: a TC program's TC_ACT_UNSPEC is -1 (XDP verdicts are small and positive either way)
        return ctypes.c_int32(o.retval).value, self._out.raw[: o.data_size_out], o.duration


SKB_CTX_SIZE, SKB_GSO_SEGS_OFF, SKB_GSO_SIZE_OFF = 192, 164, 176  # struct __sk_buff (uapi bpf.h)


def skb_ctx(gso_segs: int, gso_size: int) -> bytes:
    """A struct __sk_buff for BPF_PROG_TEST_RUN making the test skb a GSO packet."""
    ctx = bytearray(SKB_CTX_SIZE)
    struct.pack_into("<I", ctx, SKB_GSO_SEGS_OFF, gso_segs)
    struct.pack_into("<I", ctx, SKB_GSO_SIZE_OFF, gso_size)
    return bytes(ctx)


# ---------------------------------------------------------------- frames


def a6(s: str) -> bytes:
    return socket.inet_pton(socket.AF_INET6, s)


def srh(
    travel: list[str],
    nexthdr: int = 41,
    segleft: int | None = None,
    hdrlen: int | None = None,
    last_entry: int | None = None,
) -> bytes:
    wire = [a6(s) for s in reversed(travel)]
    n = len(wire)
    return struct.pack(
        "!BBBBBBH",
        nexthdr,
        2 * n if hdrlen is None else hdrlen,
        4,
        n - 1 if segleft is None else segleft,
        n - 1 if last_entry is None else last_entry,
        0,
        0,
    ) + b"".join(wire)


def doh(flowmon: int, colour: int, dmark: bool, nexthdr: int = 43) -> bytes:
    data = flowmon << 12 | (L_FLAG if colour else 0) | (D_FLAG if dmark else 0)
    return struct.pack("!BBBBI", nexthdr, 0, OPT_TYPE, 4, data)


def ioam_hbh(nexthdr: int, slots: int = 2, namespace: int = 1) -> bytes:
    """In-line IOAM's Hop-by-Hop header (schemas/IOAM.md): PadN(2) + a Pre-allocated Trace option
    with room for `slots` 16-byte node entries, the ingress's entry (the last one) filled."""
    data_len = 10 + 16 * slots
    trace = struct.pack("!BBBBHBB", 0x31, data_len, 0, 0, namespace, 4 << 3, 4 * (slots - 1))
    trace += bytes([0xF0, 0x00, 0x00, 0])  # trace type: hop limit+node id, if ids, ts sec, ts subsec
    entries = bytes(16 * (slots - 1)) + struct.pack("!IHHII", 64 << 24 | 7, 1, 2, 1_700_000_000, 5)
    body = bytes([1, 0]) + trace + entries  # PadN(2): the option starts 4n-aligned
    return bytes([nexthdr, (2 + len(body)) // 8 - 1]) + body


def ioam_e2e_doh(nexthdr: int, seq: int = 1, namespace: int = 1) -> bytes:
    """In-line IOAM's Destination Options header after the SRH (schemas/IOAM.md): PadN(2) + the
    Edge-to-Edge option (sequence number, timestamp) + PadN(4), 32 bytes."""
    opt = struct.pack("!BBBBHHQII", 0x11, 22, 0, 3, namespace, 0xB000, seq, 1_700_000_000, 5)
    return bytes([nexthdr, 3, 1, 0]) + opt + bytes([1, 2, 0, 0])


def inner_udp(payload: bytes, tclass: int = 0) -> bytes:
    udp = struct.pack("!HHHH", 40000, UDP_PORT, 8 + len(payload), 0) + payload
    return ipv6_hdr("fd00:a::1", H2_ADDR, 17, len(udp), tclass=tclass) + udp


def ipv6_hdr(src: str, dst: str, nexthdr: int, plen: int, tclass: int = 0, flow: int = 0, hlim: int = 64) -> bytes:
    return struct.pack("!IHBB", 6 << 28 | tclass << 20 | flow, plen, nexthdr, hlim) + a6(src) + a6(dst)


def eth(ethertype: int = 0x86DD) -> bytes:
    return bytes.fromhex("020000000002020000000001") + struct.pack("!H", ethertype)


def encapped(
    travel: list[str] = POLICY,
    tclass: int = 0,
    payload: bytes = b"x" * 32,
    ext: bytes | None = None,
    outer_next: int = 43,
) -> bytes:
    """An outer IPv6 + SRH (+ext) + inner IPv6/UDP frame as A's seg6 encap writes it."""
    inner = inner_udp(payload)
    body = (srh(travel) if ext is None else ext) + inner
    return eth() + ipv6_hdr("fc00:12::1", travel[-1], outer_next, len(body), tclass=tclass) + body


def tclass_of(frame: bytes, l3: int = 14) -> int:
    return (struct.unpack_from("!I", frame, l3)[0] >> 20) & 0xFF


def colour_at(t_ns: int, period_ns: int) -> int:
    return (t_ns // period_ns) & 1


# ---------------------------------------------------------------- traffic in the lab


@dataclass
class Sent:
    seq: int
    t_before: int  # CLOCK_TAI ns just before sendto
    t_after: int  # just after (the TC program ran in between: same CPU, same syscall)
    cpu: int


def udp_sender(ns: str, tclass: int | None = None) -> socket.socket:
    """A UDP socket in ns; reuse it to send identical packets twice (same port, same flow label)."""
    with in_netns(ns):
        s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    if tclass is not None:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, tclass)
    return s


def send_udp(
    ns: str,
    dst: str,
    n: int,
    cpus: list[int],
    gap_s: float = 0.0,
    payload_len: int = 64,
    tclass: int | None = None,
    seq0: int = 0,
    sock: socket.socket | None = None,
) -> list[Sent]:
    """n UDP datagrams from ns (kernel socket), the sending thread pinned to cpus in turn (round robin).

    On veth the whole path H1 -> A (forward, seg6 encap, TC egress on a0) runs in the sender's
    syscall / softirq on the sender's CPU, so the CPU a packet was sent from is the CPU whose
    per-CPU counter it lands in."""
    s = sock or udp_sender(ns, tclass)
    old = os.sched_getaffinity(0)
    out: list[Sent] = []
    try:
        for i in range(n):
            cpu = cpus[i % len(cpus)]
            os.sched_setaffinity(0, {cpu})
            seq = seq0 + i
            payload = struct.pack("!Q", seq) + bytes((seq + k) & 0xFF for k in range(payload_len - 8))
            t0 = tai_ns()
            s.sendto(payload, (dst, UDP_PORT))
            out.append(Sent(seq, t0, tai_ns(), cpu))
            if gap_s:
                time.sleep(gap_s)
    finally:
        os.sched_setaffinity(0, old)
        if sock is None:
            s.close()
    return out


class Receiver:
    """UDP receiver in a namespace; collects the datagrams' payloads."""

    def __init__(self, ns: str, addr: str = "::", port: int = UDP_PORT):
        with in_netns(ns):
            self.sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVTCLASS, 1)
        self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 16 << 20)  # we read after sending
        self.sock.bind((addr, port))
        self.sock.settimeout(0.5)

    def drain(self, want: int, timeout_s: float = 3.0) -> list[tuple[bytes, int]]:
        got: list[tuple[bytes, int]] = []
        end = time.monotonic() + timeout_s
        while len(got) < want and time.monotonic() < end:
            try:
                data, anc, _flags, _addr = self.sock.recvmsg(4096, 256)
            except socket.timeout:
                continue
            tc = next(
                (
                    struct.unpack("i", d[:4])[0]
                    for lvl, typ, d in anc
                    if lvl == socket.IPPROTO_IPV6 and typ == socket.IPV6_TCLASS
                ),
                -1,
            )
            got.append((data, tc))
        return got

    def close(self) -> None:
        self.sock.close()


class Capture:
    """AF_PACKET capture of incoming frames on one device of a namespace (IPv6 only)."""

    def __init__(self, ns: str, dev: str, outgoing: bool = False):
        with in_netns(ns):
            # ETH_P_ALL: only "all" taps see outgoing frames (dev_queue_xmit_nit)
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
            self.sock.bind((dev, 0))
        self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 16 << 20)
        self.sock.settimeout(0.3)
        self.outgoing = outgoing

    def frames(self, want: int, timeout_s: float = 3.0, match=None) -> list[bytes]:
        out: list[bytes] = []
        end = time.monotonic() + timeout_s
        while len(out) < want and time.monotonic() < end:
            try:
                data, addr = self.sock.recvfrom(65536)
            except socket.timeout:
                continue
            is_out = addr[2] == socket.PACKET_OUTGOING
            if is_out != self.outgoing or data[12:14] != b"\x86\xdd":
                continue
            if match is None or match(data):
                out.append(data)
        return out

    def close(self) -> None:
        self.sock.close()


def find_udp(frame: bytes) -> tuple[int, int] | None:
    """(offset of the inner IPv6 header, seq) of our test datagram inside a frame, if it is one."""
    off, nh = 14 + 40, frame[14 + 6] if len(frame) > 54 else None
    for _ in range(4):
        if nh in (43, 60, 0):
            if len(frame) < off + 2:
                return None
            nh, off = frame[off], off + (frame[off + 1] + 1) * 8
        elif nh == 41:
            inner = off
            if len(frame) < inner + 48 + 8 or frame[inner + 6] != 17:
                return None
            if struct.unpack_from("!H", frame, inner + 42)[0] != UDP_PORT:
                return None
            return inner, struct.unpack_from("!Q", frame, inner + 48)[0]
        elif nh == 17 and off == 54:  # plain (decapsulated) packet
            if len(frame) < 62 + 8 or struct.unpack_from("!H", frame, 56)[0] != UDP_PORT:
                return None
            return 14, struct.unpack_from("!Q", frame, 62)[0]
        else:
            return None
    return None


def iface_counter(ns: str, dev: str, name: str) -> int:
    p = subprocess.run(
        ["ip", "netns", "exec", ns, "cat", f"/sys/class/net/{dev}/statistics/{name}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(p.stdout)


@contextlib.contextmanager
def flows(installs: list[tuple[Path, str, list[str]]]):
    """add-flow each (tool, instance, args) and del-flow them at the end."""
    done = []
    try:
        for tool, inst, args in installs:
            run(tool, "add-flow", "--instance", inst, *args)
            done.append((tool, inst, args))
        yield
    finally:
        for tool, inst, args in done:
            fid = args[args.index("--flow-id") + 1] if "--flow-id" in args else args[args.index("--flowmon-id") + 1]
            run(tool, "del-flow", "--instance", inst, "--flow-id", fid, check=False)


class PathLoss(Exception):
    """The kernel dropped a test packet outside the programs under test (veth backlog overflow
    while other load shares the 2 cores); the measurement is repeated, never loosened."""


def retry_on_path_loss(fn, attempts: int = 4):
    losses = []
    for _ in range(attempts):
        try:
            return fn()
        except PathLoss as e:
            losses.append(str(e))
    raise AssertionError(f"packets lost outside the programs in all {attempts} attempts: {losses}")


def expect_all(what: str, got: int, want: int) -> None:
    if got != want:
        raise PathLoss(f"{what}: {got} of {want}")
