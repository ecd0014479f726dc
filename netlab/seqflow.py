"""Sequence-numbered UDP flows and a receiver that counts loss, duplicates and reordering from them.

The receiver's numbers are ground truth for anything that claims to measure a flow's loss or
reordering (the delay relay's counters, an IOAM or alternate-marking pipeline): they come from
the sender's own sequence numbers, as RFC 4737 defines them.

    python -m netlab.seqflow recv --port 9400 --expect 2000 --timeout 20
    python -m netlab.seqflow send --dst fd00:b::1 --port 9400 --count 1000 --flows 2 --interval-us 200

Payload: magic "SQF1", flow id (u32), sequence number (u64, from 0), zero padding to --size.
Every flow is its own socket (own source port), so its 5-tuple and its IPv6 flow label differ
from the other flows': the kernel's choice (a hash of the 5-tuple: two flows collide with
probability ~1/2**20, about 4 % among 300 flows) or, with --flow-label BASE, BASE + flow id
exactly (leased from the kernel's flow label manager). The receiver reports, per flow id:
received, distinct, duplicates, the RFC 4737 Type-P-Reordered count (a packet whose sequence
number is below NextExp = 1 + the largest one received before it; duplicates excluded), the
first reordered sequence numbers, the source address and port, the flow label the packet
arrived with (IPV6_FLOWINFO), the datagram sizes received (length -> packets) and the packets whose
padding was not all zero (`pad_errors`: the bytes arrived changed).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .lab import Lab

HEADER = struct.Struct("!4sIQ")
MAGIC = b"SQF1"
IPV6_FLOWINFO = 11  # setsockopt: deliver the flow info (traffic class + label) as a cmsg
IPV6_FLOWLABEL_MGR = 32  # lease a flow label for a socket (the kernel's flow label manager)
IPV6_FLOWINFO_SEND = 33  # then sendto's sin6_flowinfo sets the packet's label
IPV6_FL_S_ANY = 255  # the lease may be shared: a label reused soon after a socket closed is no error
FLOW_LABEL_MAX = 0x7FFFF  # net.ipv6.flowlabel_state_ranges=1: the upper half is for stateless labels
SO_RXQ_OVFL = 40  # setsockopt: deliver the socket's count of datagrams dropped (buffer full) as a cmsg
REORDERED_SEQS_KEPT = 1000


class FlowCount:
    """RFC 4737 bookkeeping of one flow at the receiver."""

    def __init__(self) -> None:
        self.received = 0
        self.duplicates = 0
        self.reordered = 0
        self.next_expected = 0
        self.seen: set[int] = set()
        self.reordered_seqs: list[int] = []
        self.src = ""
        self.src_port = 0
        self.flow_labels: set[int] = set()
        self.sizes: dict[int, int] = {}  # datagram length -> packets
        self.pad_errors = 0  # packets whose padding is not the sender's (all zero)

    def add(self, seq: int, size: int = 0, pad_ok: bool = True) -> None:
        self.received += 1
        self.sizes[size] = self.sizes.get(size, 0) + 1
        self.pad_errors += not pad_ok
        if seq in self.seen:
            self.duplicates += 1
            return
        self.seen.add(seq)
        if seq < self.next_expected:  # Type-P-Reordered: a later-sent packet arrived before it
            self.reordered += 1
            if len(self.reordered_seqs) < REORDERED_SEQS_KEPT:
                self.reordered_seqs.append(seq)
        else:
            self.next_expected = seq + 1

    def result(self) -> dict[str, Any]:
        return {
            "received": self.received,
            "distinct": len(self.seen),
            "duplicates": self.duplicates,
            "reordered": self.reordered,
            "reordered_seqs": self.reordered_seqs,
            "max_seq": self.next_expected - 1,
            "src": self.src,
            "src_port": self.src_port,
            "flow_labels": sorted(self.flow_labels),
            "sizes": {str(k): v for k, v in sorted(self.sizes.items())},
            "pad_errors": self.pad_errors,
        }


def receive(port: int, expect: int, timeout: float, idle: float = 1.0) -> dict[str, Any]:
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IPV6, IPV6_FLOWINFO, 1)
    sock.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind(("::", port))
    print("ready", flush=True)
    flows: dict[int, FlowCount] = {}
    bad = total = socket_drops = 0
    deadline = time.monotonic() + timeout
    while total < expect and time.monotonic() < deadline:
        # after the first packet, stop once the flows have been quiet for `idle` s (lost packets)
        wait = deadline - time.monotonic()
        sock.settimeout(max(0.01, min(wait, idle) if total else wait))
        try:
            data, ancdata, _flags, addr = sock.recvmsg(65536, 64)
        except socket.timeout:
            break
        if len(data) < HEADER.size or data[:4] != MAGIC:
            bad += 1
            continue
        _magic, flow_id, seq = HEADER.unpack_from(data)
        flow = flows.setdefault(flow_id, FlowCount())
        flow.src, flow.src_port = addr[0], addr[1]
        for level, kind, value in ancdata:
            if level == socket.IPPROTO_IPV6 and kind == IPV6_FLOWINFO:
                flow.flow_labels.add(int.from_bytes(value[:4], "big") & 0xFFFFF)
            elif level == socket.SOL_SOCKET and kind == SO_RXQ_OVFL:
                socket_drops = struct.unpack("I", value[:4])[0]
        pad = len(data) - HEADER.size
        flow.add(seq, len(data), data.count(0, HEADER.size) == pad)
        total += 1
    # socket_drops: the kernel's count of datagrams this socket could not take (buffer full),
    # as of the last packet received: a lost packet the network did not lose
    return {"bad": bad, "socket_drops": socket_drops, "flows": {str(k): v.result() for k, v in sorted(flows.items())}}


def _lease_flow_label(sock: socket.socket, dst: str, label: int) -> None:
    """struct in6_flowlabel_req: dst, label (big endian), action GET, share, flags CREATE, expires,
    linger, pad."""
    req = struct.pack(
        "=16s4sBBHHHI", socket.inet_pton(socket.AF_INET6, dst), label.to_bytes(4, "big"), 0, IPV6_FL_S_ANY, 1, 0, 0, 0
    )
    sock.setsockopt(socket.IPPROTO_IPV6, IPV6_FLOWLABEL_MGR, req)
    sock.setsockopt(socket.IPPROTO_IPV6, IPV6_FLOWINFO_SEND, 1)


def send(
    dst: str,
    port: int,
    count: int,
    flows: int,
    interval_us: float,
    size: int,
    src: str | None,
    flow_label: int | None = None,
    start_at: float | None = None,
) -> dict:
    """start_at: wall clock (time.time()) of the first packet (several senders in step; when it is
    given, a line {"started_late_s": ...} is printed as the first packet leaves); None: now."""
    if flow_label is not None and not (1 <= flow_label and flow_label + flows - 1 <= FLOW_LABEL_MAX):
        raise ValueError(f"flow labels {flow_label}..{flow_label + flows - 1} must lie in 1..{FLOW_LABEL_MAX:#x}")
    socks = []
    targets = []
    for flow_id in range(flows):
        sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        sock.bind((src or "::", 0))
        if flow_label is None:
            targets.append((dst, port))
        else:
            _lease_flow_label(sock, dst, flow_label + flow_id)
            targets.append((dst, port, flow_label + flow_id, 0))  # CPython converts flowinfo with htonl
        socks.append(sock)
    sent = [0] * flows
    errors = [0] * flows
    pad = bytes(max(0, size - HEADER.size))
    late = 0.0
    if start_at is not None:
        time.sleep(max(0.0, start_at - time.time()))
        late = time.time() - start_at
        print(json.dumps({"started_late_s": late}), flush=True)  # a line before the summary
    start = time.monotonic()
    for seq in range(count):
        # paced on an absolute schedule so one late wake-up does not shift the rest
        wait = start + seq * interval_us / 1e6 - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        for flow_id, sock in enumerate(socks):
            try:
                sock.sendto(HEADER.pack(MAGIC, flow_id, seq) + pad, targets[flow_id])
                sent[flow_id] += 1
            except OSError:
                errors[flow_id] += 1
    return {
        "sent": {str(i): n for i, n in enumerate(sent)},
        "errors": {str(i): n for i, n in enumerate(errors)},
        "src_ports": {str(i): s.getsockname()[1] for i, s in enumerate(socks)},
        "seconds": time.monotonic() - start,
        "started_late_s": late,
    }


def run(
    lab: "Lab",
    src_node: str,
    dst_node: str,
    dst_addr: str,
    port: int,
    count: int,
    interval_us: float = 1000,
    flows: int = 1,
    size: int = 64,
    src_addr: str | None = None,
    flow_label: int | None = None,
) -> dict[str, Any]:
    """Send `flows` flows of `count` packets each from src_node to dst_addr (in dst_node) and count
    what arrived; flow i carries the IPv6 flow label flow_label + i (None: the kernel's choice).
    Returns {"sent": {flow_id: n}, "errors": {...}, "flows": {flow_id: the receiver's counts
    (FlowCount.result)}, "bad": n, "socket_drops": n}; flow ids are "0", "1", ..."""
    from .lab import REPO_ROOT

    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    duration = count * interval_us / 1e6
    cmd = [sys.executable, "-m", "netlab.seqflow", "recv", "--port", str(port)]
    cmd += ["--expect", str(count * flows), "--timeout", str(duration + 10)]
    receiver = lab.popen(dst_node, cmd, stdout=subprocess.PIPE, text=True, env=env)
    try:
        if receiver.stdout.readline().strip() != "ready":
            raise RuntimeError("seqflow receiver did not start")
        cmd = [sys.executable, "-m", "netlab.seqflow", "send", "--dst", dst_addr, "--port", str(port)]
        cmd += ["--count", str(count), "--flows", str(flows), "--interval-us", str(interval_us), "--size", str(size)]
        if src_addr:
            cmd += ["--src", src_addr]
        if flow_label is not None:
            cmd += ["--flow-label", str(flow_label)]
        sender = lab.run(src_node, cmd, check=True, timeout=duration * 5 + 60, env=env)
        sent = json.loads(sender.stdout)
        got = json.loads(receiver.communicate(timeout=duration + 30)[0])
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
    return {**sent, **got}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m netlab.seqflow", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("recv", help="count what arrives on --port until --expect packets, --timeout or --idle")
    r.add_argument("--port", type=int, required=True)
    r.add_argument("--expect", type=int, required=True)
    r.add_argument("--timeout", type=float, default=10)
    r.add_argument("--idle", type=float, default=1.0)
    s = sub.add_parser("send", help="--count packets per flow, --flows flows, one every --interval-us")
    s.add_argument("--dst", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--count", type=int, default=1000)
    s.add_argument("--flows", type=int, default=1)
    s.add_argument("--interval-us", type=float, default=1000)
    s.add_argument("--size", type=int, default=64, help="UDP payload bytes (>= 16)")
    s.add_argument("--src", help="source address (default: the kernel's choice)")
    s.add_argument("--flow-label", type=lambda v: int(v, 0), help="flow i gets IPv6 flow label BASE + i")
    s.add_argument(
        "--start-at", type=float, help="wall clock (Unix s) of the first packet (senders in step); prints a line then"
    )
    args = parser.parse_args()
    if args.command == "recv":
        print(json.dumps(receive(args.port, args.expect, args.timeout, args.idle)))
    else:
        result = send(
            args.dst,
            args.port,
            args.count,
            args.flows,
            args.interval_us,
            args.size,
            args.src,
            args.flow_label,
            args.start_at,
        )
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
