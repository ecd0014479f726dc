#!/usr/bin/env python3
"""Capture an IOAM trace the Linux kernel filled on real veths, for schemas/vectors/.

Three network namespaces S - R - D (plain IPv6, veth pairs). R and D have IOAM enabled on their
ingress devices (node ids 7 and 9, interface ids 70/71 and 90, namespace 123). S sends one UDP
datagram whose Hop-by-Hop header (set with IPV6_HOPOPTS) is segscope's trace of 3 slots with S's
own entry already in the last one, as the ingress edge writes it (schemas/IOAM.md, built here with
struct); R fills the middle entry, D the first on receive, and D's socket hands the header back
(IPV6_RECVHOPOPTS). Writes ioam_trace_kernel_capture.json: the bytes, the setup (the ground truth
the generator checks the bytes against) and the time window of the send.

Needs root; run once, the output is committed (make_ioam_vectors.py reads it):
    sudo python3 schemas/vectors/capture_ioam_kernel_vector.py
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import struct
import subprocess
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "ioam_trace_kernel_capture.json"
P = "ioamvec"
NAMESPACE = 123
SLOTS = 3
S_ENTRY = {"hop_limit": 64, "node_id": 5, "in_if": 10, "out_if": 11}
NODES = {"R": {"node_id": 7, "ifs": {"r0": 70, "r1": 71}}, "D": {"node_id": 9, "ifs": {"d0": 90}}}
PORT = 9600
IPV6_RECVHOPOPTS, IPV6_HOPOPTS = 53, 54
CLONE_NEWNET = 0x40000000
libc = ctypes.CDLL("libc.so.6", use_errno=True)


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def ns(node: str, *cmd: str) -> None:
    sh("ip", "netns", "exec", f"{P}{node}", *cmd)


def enter(node: str) -> int:
    orig = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    fd = os.open(f"/run/netns/{P}{node}", os.O_RDONLY)
    assert libc.setns(fd, CLONE_NEWNET) == 0
    os.close(fd)
    return orig


def leave(orig: int) -> None:
    assert libc.setns(orig, CLONE_NEWNET) == 0
    os.close(orig)


def hop_by_hop(tai_ns: int) -> bytes:
    """segscope's HBH (IOAM.md): PadN(2), the trace option, S's entry in the last slot (UTC s + us)."""
    utc_ns = tai_ns  # TAI - UTC is 0 on this machine's kernel (adjtimex); the sender is ours anyway
    entry = struct.pack(
        "!IHHII",
        S_ENTRY["hop_limit"] << 24 | S_ENTRY["node_id"],
        S_ENTRY["in_if"],
        S_ENTRY["out_if"],
        utc_ns // 10**9,
        utc_ns % 10**9 // 1000,
    )
    opt = struct.pack("!BBBBHBB", 0x31, 10 + 16 * SLOTS, 0, 0, NAMESPACE, 4 << 3, 4 * (SLOTS - 1))
    opt += (0xF00000).to_bytes(3, "big") + b"\x00" + bytes(16 * (SLOTS - 1)) + entry
    return bytes([0, (4 + len(opt)) // 8 - 1, 1, 0]) + opt  # the kernel sets the next header


def main() -> None:
    for node in "SRD":
        subprocess.run(["ip", "netns", "del", f"{P}{node}"], capture_output=True)
        sh("ip", "netns", "add", f"{P}{node}")
        ns(node, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
        ns(node, "sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0")
        ns(node, "ip", "link", "set", "lo", "up")
    try:
        for a, b, an, bn in (("S", "R", "s0", "r0"), ("R", "D", "r1", "d0")):
            sh("ip", "link", "add", f"{P}x", "type", "veth", "peer", "name", f"{P}y")
            sh("ip", "link", "set", f"{P}x", "netns", f"{P}{a}", "name", an)
            sh("ip", "link", "set", f"{P}y", "netns", f"{P}{b}", "name", bn)
        ns("S", "ip", "-6", "addr", "add", "fd10:1::1/64", "dev", "s0", "nodad")
        ns("R", "ip", "-6", "addr", "add", "fd10:1::2/64", "dev", "r0", "nodad")
        ns("R", "ip", "-6", "addr", "add", "fd10:2::1/64", "dev", "r1", "nodad")
        ns("D", "ip", "-6", "addr", "add", "fd10:2::2/64", "dev", "d0", "nodad")
        for node, dev in (("S", "s0"), ("R", "r0"), ("R", "r1"), ("D", "d0")):
            ns(node, "ip", "link", "set", dev, "up")
        ns("S", "ip", "-6", "route", "add", "default", "via", "fd10:1::2")
        ns("D", "ip", "-6", "route", "add", "default", "via", "fd10:2::1")
        for node, cfg in NODES.items():
            ns(node, "sysctl", "-qw", f"net.ipv6.ioam6_id={cfg['node_id']}")
            for dev, if_id in cfg["ifs"].items():
                conf = f"net.ipv6.conf.{dev}"
                ns(node, "sysctl", "-qw", f"{conf}.ioam6_enabled=1", f"{conf}.ioam6_id={if_id}")
            ns(node, "ip", "ioam", "namespace", "add", str(NAMESPACE))
        time.sleep(1.0)  # neighbour discovery on first use below; routes settle
        orig = enter("D")
        rx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        leave(orig)
        rx.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVHOPOPTS, 1)
        rx.bind(("fd10:2::2", PORT))
        rx.settimeout(5)
        orig = enter("S")
        tx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        leave(orig)
        tx.sendto(b"warm", ("fd10:2::2", PORT))  # neighbour entries, without IOAM
        rx.recvmsg(64, 512)
        t0 = time.clock_gettime_ns(time.CLOCK_TAI)
        tx.setsockopt(socket.IPPROTO_IPV6, IPV6_HOPOPTS, hop_by_hop(t0))
        tx.sendto(b"segscope", ("fd10:2::2", PORT))
        _data, anc, _flags, _addr = rx.recvmsg(64, 512)
        t1 = time.clock_gettime_ns(time.CLOCK_TAI)
        hbh = next(d for lvl, typ, d in anc if lvl == socket.IPPROTO_IPV6 and typ == IPV6_HOPOPTS)
        OUT.write_text(
            json.dumps(
                {
                    "note": "IOAM trace (segscope's HBH, 3 slots) filled by the Linux kernel on real veths: "
                    "S wrote the last entry, R (transit) and D (destination) filled theirs on receive; "
                    "written by capture_ioam_kernel_vector.py",
                    "kernel": os.uname().release,
                    "hex": hbh.hex(),
                    "namespace_id": NAMESPACE,
                    "slots": SLOTS,
                    "sender": S_ENTRY,
                    "R": {"node_id": 7, "in_if": 70, "out_if": 71, "hop_limit": 63},
                    "D": {"node_id": 9, "in_if": 90, "out_if": 0xFFFF, "hop_limit": 62},
                    "t0_tai_ns": t0,
                    "t1_tai_ns": t1,
                },
                indent=1,
            )
            + "\n"
        )
        print(f"wrote {OUT}: {hbh.hex()}")
    finally:
        for node in "SRD":
            subprocess.run(["ip", "netns", "del", f"{P}{node}"], capture_output=True)


if __name__ == "__main__":
    main()
