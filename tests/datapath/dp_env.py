"""Helpers for the datapath tests: a 2-namespace veth pair, the loaders, STAMP senders.

Real kernel, real XDP programs; needs root. Every resource carries the `dp` prefix.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import socket
import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.isolation import own_name

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "build" / "datapath"
REFLECTOR = BUILD / "stamp_reflector"
COLLECTOR = BUILD / "stamp_collector"
XDP_COUNT_OBJ = BUILD / "xdp_count_pass.bpf.o"
PIN_ROOT = Path("/sys/fs/bpf/segscope")
# netns, veth and pin names start with this (override to run two suites side by side)
PREFIX = os.environ.get("SEGSCOPE_DP_TEST_PREFIX") or own_name("dp")

CLONE_NEWNET = 0x40000000
IPV6_RTHDR = 57
IPV6_RECVRTHDR = 56
IPV6_RECVHOPLIMIT = 51
IPV6_HOPLIMIT = 52

_libc = ctypes.CDLL("libc.so.6", use_errno=True)


def sh(*cmd: str, check: bool = True, ns: str | None = None) -> subprocess.CompletedProcess:
    if ns:
        cmd = ("ip", "netns", "exec", ns) + cmd
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def ensure_bpffs() -> None:
    if "/sys/fs/bpf type bpf" not in Path("/proc/mounts").read_text().replace(" bpf rw", " type bpf rw") and not any(
        line.split()[1] == "/sys/fs/bpf" and line.split()[2] == "bpf"
        for line in Path("/proc/mounts").read_text().splitlines()
    ):
        subprocess.run(["mount", "-t", "bpf", "bpf", "/sys/fs/bpf"], check=True)


@contextlib.contextmanager
def in_netns(name: str):
    """Run the calling thread in netns `name`; sockets created inside stay there."""
    orig = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if _libc.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({name})")
        yield
    finally:
        _libc.setns(orig, CLONE_NEWNET)
        os.close(orig)
        os.close(target)


def udp_socket(ns: str, addr: str, port: int = 0) -> socket.socket:
    with in_netns(ns):
        s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s.bind((addr, port))
    s.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVHOPLIMIT, 1)
    s.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVRTHDR, 1)
    s.settimeout(2.0)
    return s


def srh_bytes(segments: list[str], segments_left: int = 0) -> bytes:
    """An SRH for IPV6_RTHDR: segments[0] = final destination (the kernel fills it)."""
    n = len(segments)
    hdr = struct.pack("!BBBBBBH", 0, 2 * n, 4, segments_left, n - 1, 0, 0)
    return hdr + b"".join(socket.inet_pton(socket.AF_INET6, s) for s in segments)


def parse_srh(buf: bytes) -> dict:
    nh, hdrlen, rtype, segleft, last, flags, tag = struct.unpack_from("!BBBBBBH", buf)
    segs = [socket.inet_ntop(socket.AF_INET6, buf[8 + 16 * i : 24 + 16 * i]) for i in range(last + 1)]
    return dict(
        nexthdr=nh,
        hdrlen=hdrlen,
        type=rtype,
        segments_left=segleft,
        last_entry=last,
        flags=flags,
        tag=tag,
        segments=segs,
    )


def tai_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_TAI)


def stamp_sender_payload(seq: int, ssid: int, t1_ns: int, err_est: int = 0x4001, extra: bytes = b"") -> bytes:
    sec, nsec = (t1_ns // 10**9) & 0xFFFFFFFF, t1_ns % 10**9
    return struct.pack("!IIIHH28s", seq, sec, nsec, err_est, ssid, bytes(28)) + extra


def recv_reply(sock: socket.socket) -> tuple[bytes, tuple, int | None, bytes | None]:
    data, anc, _flags, peer = sock.recvmsg(2048, socket.CMSG_SPACE(4) + socket.CMSG_SPACE(512))
    hop, rthdr = None, None
    for level, ctype, cdata in anc:
        if level == socket.IPPROTO_IPV6 and ctype == IPV6_HOPLIMIT:
            hop = struct.unpack("i", cdata[:4])[0]
        elif level == socket.IPPROTO_IPV6 and ctype == IPV6_RTHDR:
            rthdr = bytes(cdata)
    return data, peer, hop, rthdr


def udp6_counter(ns: str, name: str) -> int:
    for line in sh("cat", "/proc/net/snmp6", ns=ns).stdout.splitlines():
        k, v = line.split()
        if k == name:
            return int(v)
    raise KeyError(name)


def run_tool(tool: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([str(tool), *args], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"{tool.name} {' '.join(args)} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def stats(tool: Path, pin_dir: Path) -> dict[str, int]:
    return json.loads(run_tool(tool, "stats", "--pin-dir", str(pin_dir), "--json").stdout)


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


def prog_test_run(tool: Path, pin_dir: Path, frame: bytes) -> dict:
    p = run_tool(tool, "test-run", "--pin-dir", str(pin_dir), "--hex", frame.hex())
    out = json.loads(p.stdout)
    out["data_out"] = bytes.fromhex(out["data_out"])
    return out


@dataclass
class VethPair:
    """dp-s (sender, dev dp-s0) <-> dp-x (reflector, dev dp-x0)."""

    s_ns: str = f"{PREFIX}-s"
    x_ns: str = f"{PREFIX}-x"
    s_dev: str = f"{PREFIX}-s0"
    x_dev: str = f"{PREFIX}-x0"
    s_addr: str = "fd00:d5::1"
    x_addr: str = "fd00:d5::2"
    x_other: str = "fd00:d5::3"  # on dp-x0 but not a reflector address
    # local addresses of dp-s used as return SIDs: the kernel's own SRH processing
    # (seg6_enabled) loops through them and delivers. (A seg6local End route would
    # not: End refuses a next hop that is local.)
    s_sids: tuple = ("fc00:d5::e1", "fc00:d5::e2")
    s_mac: str = "02:d5:00:00:00:01"
    x_mac: str = "02:d5:00:00:00:02"

    def setup(self) -> None:
        self.teardown()
        for ns in (self.s_ns, self.x_ns):
            sh("ip", "netns", "add", ns)
            for k, v in (
                ("net.ipv6.conf.default.accept_dad", "0"),
                ("net.ipv6.conf.default.router_solicitations", "0"),
                ("net.ipv6.conf.default.accept_ra", "0"),
                ("net.ipv6.conf.all.seg6_enabled", "1"),
                ("net.ipv6.conf.default.seg6_enabled", "1"),
            ):
                sh("sysctl", "-qw", f"{k}={v}", ns=ns)
            sh("ip", "link", "set", "lo", "up", ns=ns)
            # Only the tests' own packets on the link: the stack's multicast (MLD reports)
            # would land in the programs' counters at random times.
            sh(
                "nft",
                "add table ip6 dp_quiet { chain out { type filter hook output priority 0; "
                "ip6 daddr ff00::/8 counter drop; }; }",
                ns=ns,
            )
        sh(
            "ip",
            "link",
            "add",
            self.s_dev,
            "netns",
            self.s_ns,
            "address",
            self.s_mac,
            "type",
            "veth",
            "peer",
            "name",
            self.x_dev,
            "netns",
            self.x_ns,
            "address",
            self.x_mac,
        )
        for ns, dev, addrs, peer_addrs, peer_mac in (
            (self.s_ns, self.s_dev, [self.s_addr], [self.x_addr, self.x_other], self.x_mac),
            (self.x_ns, self.x_dev, [self.x_addr, self.x_other], [self.s_addr], self.s_mac),
        ):
            # no link-local address, no multicast: nothing but our own packets on the link
            sh("ip", "link", "set", dev, "addrgenmode", "none", "multicast", "off", ns=ns)
            sh("ethtool", "-K", dev, "tx", "off", ns=ns)
            for a in addrs:
                sh("ip", "-6", "addr", "add", f"{a}/64", "dev", dev, "nodad", ns=ns)
            sh("ip", "link", "set", dev, "up", ns=ns)
            for a in peer_addrs:
                sh("ip", "-6", "neigh", "replace", a, "lladdr", peer_mac, "dev", dev, "nud", "permanent", ns=ns)
        for sid in self.s_sids:
            sh("ip", "-6", "addr", "add", f"{sid}/128", "dev", "lo", "nodad", ns=self.s_ns)
        # the reflector side routes the SIDs to the sender (for ICMP errors; replies use XDP_TX)
        sh("ip", "-6", "route", "add", "fc00:d5::/64", "via", self.s_addr, "dev", self.x_dev, ns=self.x_ns)

    def teardown(self) -> None:
        for ns in (self.s_ns, self.x_ns):
            sh("ip", "netns", "del", ns, check=False)

    def ifindex(self, ns: str, dev: str) -> int:
        return int(sh("cat", f"/sys/class/net/{dev}/ifindex", ns=ns).stdout)

    def attach_count_pass(self, ns: str, dev: str) -> None:
        """veth delivers XDP_TX frames only if the peer has an XDP program too."""
        sh("ip", "link", "set", "dev", dev, "xdpdrv", "obj", str(XDP_COUNT_OBJ), "sec", "xdp", ns=ns)

    def detach_xdp(self, ns: str, dev: str) -> None:
        sh("ip", "link", "set", "dev", dev, "xdpdrv", "off", ns=ns, check=False)


# ---- crafted frames for BPF_PROG_TEST_RUN ----------------------------------------------


def _csum16(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def udp6_checksum(src: str, dst: str, udp: bytes) -> int:
    """Checksum over pseudo-header + UDP (with its checksum field as given); 0 = valid if filled."""
    pseudo = (
        socket.inet_pton(socket.AF_INET6, src)
        + socket.inet_pton(socket.AF_INET6, dst)
        + struct.pack("!I3xB", len(udp), 17)
    )
    return (~_csum16(pseudo + udp)) & 0xFFFF


def udp_datagram(src: str, final_dst: str, sport: int, dport: int, payload: bytes, length: int | None = None) -> bytes:
    ulen = 8 + len(payload) if length is None else length
    hdr = struct.pack("!HHHH", sport, dport, ulen, 0)
    csum = udp6_checksum(src, final_dst, hdr + payload) or 0xFFFF
    return struct.pack("!HHHH", sport, dport, ulen, csum) + payload


def srh_wire(
    segments: list[str], segments_left: int, nexthdr: int = 17, hdrlen: int | None = None, last_entry: int | None = None
) -> bytes:
    n = len(segments)
    hdr = struct.pack(
        "!BBBBBBH",
        nexthdr,
        2 * n if hdrlen is None else hdrlen,
        4,
        segments_left,
        n - 1 if last_entry is None else last_entry,
        0,
        0,
    )
    return hdr + b"".join(socket.inet_pton(socket.AF_INET6, s) for s in segments)


def eth_ipv6(
    src: str,
    dst: str,
    nexthdr: int,
    body: bytes,
    hlim: int = 64,
    smac: str = "02:d5:00:00:00:01",
    dmac: str = "02:d5:00:00:00:02",
    payload_len: int | None = None,
) -> bytes:
    eth = bytes.fromhex(dmac.replace(":", "")) + bytes.fromhex(smac.replace(":", "")) + b"\x86\xdd"
    ip6 = struct.pack("!IHBB", 6 << 28, len(body) if payload_len is None else payload_len, nexthdr, hlim)
    return eth + ip6 + socket.inet_pton(socket.AF_INET6, src) + socket.inet_pton(socket.AF_INET6, dst) + body


@dataclass
class ParsedFrame:
    dmac: bytes
    smac: bytes
    hlim: int
    src: str
    dst: str
    nexthdr: int
    payload_len: int
    srh: dict | None
    udp: bytes  # UDP header + payload
    sport: int
    dport: int


def parse_frame(buf: bytes) -> ParsedFrame:
    assert struct.unpack_from("!H", buf, 12)[0] == 0x86DD
    _vtf, plen, nh, hlim = struct.unpack_from("!IHBB", buf, 14)
    src = socket.inet_ntop(socket.AF_INET6, buf[22:38])
    dst = socket.inet_ntop(socket.AF_INET6, buf[38:54])
    off, srh = 54, None
    if nh == 43:
        srh = parse_srh(buf[off:])
        off += (srh["hdrlen"] + 1) * 8
    udp = buf[off:]
    sport, dport = struct.unpack_from("!HH", udp)
    return ParsedFrame(buf[0:6], buf[6:12], hlim, src, dst, nh, plen, srh, udp, sport, dport)


def _remove_pins(pin_dir) -> None:
    if pin_dir.exists():
        shutil.rmtree(pin_dir, ignore_errors=True)


class Attached:
    """The reflector on dp-x0, and on dp-s0 either the collector or a count-and-pass program."""

    def __init__(self, veth: VethPair, with_collector: bool, ringbuf_size: int | None = None):
        self.veth = veth
        self.refl_dir = PIN_ROOT / veth.x_ns / "stamp_reflector"
        self.coll_dir = PIN_ROOT / veth.s_ns / "stamp_collector"
        self.with_collector = with_collector
        self.ringbuf_size = ringbuf_size

    def __enter__(self) -> "Attached":
        v = self.veth
        _remove_pins(self.refl_dir)
        _remove_pins(self.coll_dir)
        v.detach_xdp(v.x_ns, v.x_dev)
        v.detach_xdp(v.s_ns, v.s_dev)
        run_tool(REFLECTOR, "attach", "--netns", v.x_ns, "--dev", v.x_dev, "--pin-dir", str(self.refl_dir))
        run_tool(REFLECTOR, "add-address", "--pin-dir", str(self.refl_dir), v.x_addr)
        if self.with_collector:
            extra = ["--ringbuf-size", str(self.ringbuf_size)] if self.ringbuf_size else []
            run_tool(COLLECTOR, "attach", "--netns", v.s_ns, "--dev", v.s_dev, "--pin-dir", str(self.coll_dir), *extra)
        else:
            v.attach_count_pass(v.s_ns, v.s_dev)
        return self

    def __exit__(self, *exc) -> None:
        v = self.veth
        run_tool(REFLECTOR, "detach", "--netns", v.x_ns, "--dev", v.x_dev, "--pin-dir", str(self.refl_dir), check=False)
        if self.with_collector:
            run_tool(
                COLLECTOR, "detach", "--netns", v.s_ns, "--dev", v.s_dev, "--pin-dir", str(self.coll_dir), check=False
            )
        v.detach_xdp(v.s_ns, v.s_dev)
        v.detach_xdp(v.x_ns, v.x_dev)
        _remove_pins(self.refl_dir)
        _remove_pins(self.coll_dir)
