"""UDP probes carrying an IOAM Pre-allocated Trace option (RFC 9197 / RFC 9486) in a Hop-by-Hop
header set by the sending socket, and a receiver that returns the trace the kernels filled in.

Checks a lab's IOAM settings (topology `ioam:`) without any eBPF: every node with ioam6_enabled on
its ingress device and the namespace known fills one entry on receive (schemas/IOAM.md has the
layout; trace type 0xF00000: hop limit + node id, ingress/egress interface id, timestamp seconds
and microseconds). The sender's own node fills nothing (the kernel fills on receive only).

    python -m netlab.ioam_trace recv --port 9500 --count 5 --timeout 10
    python -m netlab.ioam_trace send --dst fc00:9::1 --port 9500 --count 5 --slots 4 --namespace 1 \
        --segs fc00:21::e,fc00:22::e,fc00:23::e
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import time

IPV6_RECVHOPOPTS = 53
IPV6_HOPOPTS = 54
IPV6_RTHDR = 57
IOAM_HBH_OPTION = 0x31
TRACE_TYPE = 0xF00000  # hop limit + node id, ingress/egress if id, timestamp seconds, subseconds
NODE_LEN_WORDS = 4  # 16 bytes per node for TRACE_TYPE
PROBE = struct.Struct("!4sI")
MAGIC = b"IOT1"


def hop_by_hop(namespace: int, slots: int) -> bytes:
    """The whole Hop-by-Hop header: PadN(2) so the option starts 4n-aligned (the kernel drops the
    packet otherwise), then the IOAM option with `slots` empty 16-byte node entries."""
    data_len = 10 + 16 * slots
    option = struct.pack(
        "!BBBBHBB",
        IOAM_HBH_OPTION,
        data_len,
        0,  # reserved
        0,  # IOAM option type: Pre-allocated Trace
        namespace,
        NODE_LEN_WORDS << 3,  # NodeLen (5 bits) | 3 high flag bits
        NODE_LEN_WORDS * slots,  # 1 low flag bit | RemainingLen (4-octet units)
    )
    option += TRACE_TYPE.to_bytes(3, "big") + b"\x00" + bytes(16 * slots)
    total = 2 + 2 + len(option)
    assert total % 8 == 0, total
    return bytes([0, total // 8 - 1, 1, 0]) + option  # next header is set by the kernel


def segment_routing_header(segs: list[str]) -> bytes:
    """An SRH (type 4) for IPV6_RTHDR that visits `segs` before the destination given to sendto:
    the kernel puts that destination in segments[0] and sends to segs[0] first."""
    n = len(segs) + 1
    header = struct.pack("!BBBBBBH", 0, 2 * n, 4, n - 1, n - 1, 0, 0)  # nh, len, type, left, last, flags, tag
    slots = [bytes(16)] + [socket.inet_pton(socket.AF_INET6, sid) for sid in reversed(segs)]
    return header + b"".join(slots)


def parse_trace(hbh: bytes) -> dict:
    """The IOAM trace of a received Hop-by-Hop header: namespace, remaining length and the filled
    entries in list order (the last hop first, as RFC 9197 §4.4 fills from the end)."""
    at = 2
    while at < len(hbh):
        kind = hbh[at]
        if kind == 0:  # Pad1
            at += 1
            continue
        length = hbh[at + 1]
        if kind == IOAM_HBH_OPTION:
            body = hbh[at + 2 : at + 2 + length]
            namespace = struct.unpack_from("!H", body, 2)[0]
            node_len, remaining = body[4] >> 3, body[5] & 0x7F
            overflow = bool(body[4] & 0x04)
            data = body[10:]
            entries = []
            for off in range(remaining * 4, len(data), node_len * 4):
                word, ingress, egress, sec, subsec = struct.unpack_from("!IHHII", data, off)
                entries.append(
                    {
                        "hop_limit": word >> 24,
                        "node_id": word & 0xFFFFFF,
                        "ingress_if": ingress,
                        "egress_if": egress,
                        "sec": sec,
                        "usec": subsec,
                    }
                )
            return {"namespace": namespace, "remaining_words": remaining, "overflow": overflow, "entries": entries}
        at += 2 + length
    return {"namespace": None, "remaining_words": None, "overflow": False, "entries": []}


def receive(port: int, count: int, timeout: float) -> list[dict]:
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVHOPOPTS, 1)
    sock.bind(("::", port))
    print("ready", flush=True)
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data, ancdata, _flags, addr = sock.recvmsg(2048, 1024)
        except socket.timeout:
            break
        if len(data) < PROBE.size or data[:4] != MAGIC:
            continue
        trace = {"namespace": None, "entries": []}
        for level, kind, value in ancdata:
            if level == socket.IPPROTO_IPV6 and kind == IPV6_HOPOPTS:
                trace = parse_trace(value)
        out.append({"seq": PROBE.unpack_from(data)[1], "src": addr[0], **trace})
    return out


def send(
    dst: str,
    port: int,
    count: int,
    slots: int,
    namespace: int,
    interval_s: float,
    src: str | None,
    segs: list[str] | None = None,
) -> int:
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IPV6, IPV6_HOPOPTS, hop_by_hop(namespace, slots))
    if segs:  # the kernel orders them Hop-by-Hop, then the SRH (RFC 8200)
        sock.setsockopt(socket.IPPROTO_IPV6, IPV6_RTHDR, segment_routing_header(segs))
    if src:
        sock.bind((src, 0))
    for seq in range(count):
        sock.sendto(PROBE.pack(MAGIC, seq) + bytes(16), (dst, port))
        time.sleep(interval_s)
    return count


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m netlab.ioam_trace", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("recv")
    r.add_argument("--port", type=int, required=True)
    r.add_argument("--count", type=int, default=1)
    r.add_argument("--timeout", type=float, default=10)
    s = sub.add_parser("send")
    s.add_argument("--dst", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--count", type=int, default=1)
    s.add_argument("--slots", type=int, default=4, help="node entries pre-allocated (1..14)")
    s.add_argument("--namespace", type=int, default=1)
    s.add_argument("--interval", type=float, default=0.05, help="seconds between probes")
    s.add_argument("--src")
    s.add_argument("--segs", default="", help="SIDs to visit before --dst, comma separated (an SRH)")
    args = parser.parse_args()
    if args.command == "recv":
        print(json.dumps(receive(args.port, args.count, args.timeout)))
    else:
        segs = [sid for sid in args.segs.split(",") if sid]
        sent = send(args.dst, args.port, args.count, args.slots, args.namespace, args.interval, args.src, segs)
        print(json.dumps({"sent": sent}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
