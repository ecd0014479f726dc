"""One-way delay probe: timestamped UDP between two namespaces of one machine.

All network namespaces share the machine's clocks, so a sender's CLOCK_REALTIME
stamp in the payload and the receiver's kernel receive timestamp (SO_TIMESTAMPNS,
also CLOCK_REALTIME) give a true one-way delay. Used to measure the delay relay.

    python -m netlab.owd recv --port 9001 --count 200 --timeout 10
    python -m netlab.owd send --dst fc00:12::2 --port 9001 --count 200 --interval-us 10000
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .lab import Lab

PAYLOAD = struct.Struct("!IQ")  # seq, sender CLOCK_REALTIME ns
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
SO_TIMESTAMPING = 37
# software tx stamp (taken by the veth driver) + report it + tag it with a per-socket counter
TX_STAMP_FLAGS = (1 << 1) | (1 << 4) | (1 << 7) | (1 << 11)  # TX_SOFTWARE|SOFTWARE|OPT_ID|OPT_TSONLY
IPV6_RECVERR = 25


def receive(port: int, count: int, timeout: float, idle: float = 1.0) -> dict:
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    sock.bind(("::", port))
    print("ready", flush=True)
    delays: list[int] = []
    rx_by_seq: dict[int, int] = {}
    seqs: set[int] = set()
    bad = 0
    deadline = time.monotonic() + timeout
    while len(delays) < count and time.monotonic() < deadline:
        # after the first packet, stop once the flow has been quiet for `idle` s (lost packets)
        wait = deadline - time.monotonic()
        sock.settimeout(max(0.01, min(wait, idle) if delays else wait))
        try:
            data, ancdata, _flags, _addr = sock.recvmsg(256, 256)
        except socket.timeout:
            break
        rx_ns = None
        for level, kind, value in ancdata:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                sec, nsec = struct.unpack("qq", value[:16])
                rx_ns = sec * 1_000_000_000 + nsec
        if len(data) < PAYLOAD.size or rx_ns is None:
            bad += 1
            continue
        seq, tx_ns = PAYLOAD.unpack_from(data)
        seqs.add(seq)
        rx_by_seq[seq] = rx_ns
        delays.append(rx_ns - tx_ns)
    return {"received": len(delays), "distinct_seqs": len(seqs), "bad": bad, "delays_ns": delays, "rx_ns": rx_by_seq}


def _read_tx_stamp(sock: socket.socket, timeout: float = 0.05) -> tuple[int, int] | None:
    """(OPT_ID counter, kernel software tx time) from the socket's error queue."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            _data, ancdata, _flags, _addr = sock.recvmsg(1, 512, socket.MSG_ERRQUEUE | socket.MSG_DONTWAIT)
        except BlockingIOError:
            time.sleep(0.0002)
            continue
        stamp = ident = None
        for level, kind, value in ancdata:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPING:
                sec, nsec = struct.unpack("qq", value[:16])
                stamp = sec * 1_000_000_000 + nsec
            elif level == socket.IPPROTO_IPV6 and kind == IPV6_RECVERR:
                ident = struct.unpack_from("I", value, 12)[0]  # sock_extended_err.ee_data
        if stamp is not None and ident is not None:
            return ident, stamp
    return None


def send(dst: str, port: int, count: int, interval_us: float) -> dict:
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, TX_STAMP_FLAGS)
    start = time.monotonic()
    errors = 0
    tx_by_seq: dict[int, int] = {}
    for seq in range(count):
        # paced on an absolute schedule so one late wake-up does not shift the rest
        wait = start + seq * interval_us / 1e6 - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        try:
            sock.sendto(PAYLOAD.pack(seq, time.clock_gettime_ns(time.CLOCK_REALTIME)) + bytes(20), (dst, port))
        except OSError:
            errors += 1
            continue
        got = _read_tx_stamp(sock)
        if got:
            tx_by_seq[seq] = got[1]
    return {"sent": count - errors, "errors": errors, "tx_ns": tx_by_seq}


def summarize(delays_ns: list[int]) -> dict:
    """mean/stddev/min/p50/p99/max in microseconds."""
    if not delays_ns:
        return {"count": 0}
    us = sorted(d / 1000 for d in delays_ns)

    def pick(q: float) -> float:
        return us[min(len(us) - 1, int(q * (len(us) - 1) + 0.5))]

    return {
        "count": len(us),
        "mean": statistics.fmean(us),
        "stddev": statistics.pstdev(us),
        "min": us[0],
        "p50": pick(0.5),
        "p99": pick(0.99),
        "max": us[-1],
    }


@dataclass
class Flow:
    name: str
    src: str  # node
    dst: str  # node
    dst_addr: str
    port: int


def measure(lab: "Lab", flows: list[Flow], count: int = 200, interval_us: float = 10000) -> dict[str, dict]:
    """Run every flow at once; returns {flow name: {"sent", "received", "delays_ns", "delays_ns_by_seq",
    "summary_us"}} (delays_ns: kernel tx stamp -> kernel rx stamp, for the packets with both)."""
    from .lab import REPO_ROOT

    py = sys.executable
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    receivers = {}
    for flow in flows:
        receivers[flow.name] = lab.popen(
            flow.dst,
            [
                py,
                "-m",
                "netlab.owd",
                "recv",
                "--port",
                str(flow.port),
                "--count",
                str(count),
                "--timeout",
                str(count * interval_us / 1e6 + 5),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
    for proc in receivers.values():
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("owd receiver did not start")
    senders = {
        flow.name: lab.popen(
            flow.src,
            [
                py,
                "-m",
                "netlab.owd",
                "send",
                "--dst",
                flow.dst_addr,
                "--port",
                str(flow.port),
                "--count",
                str(count),
                "--interval-us",
                str(interval_us),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for flow in flows
    }
    results = {}
    for flow in flows:
        sent = json.loads(senders[flow.name].communicate(timeout=count * interval_us / 1e6 + 20)[0])
        got = json.loads(receivers[flow.name].communicate(timeout=30)[0])
        # kernel tx stamp (sender veth) -> kernel rx stamp (receiver socket): no Python in the path
        tx, rx = sent["tx_ns"], got["rx_ns"]
        wire = [rx[seq] - tx[seq] for seq in rx if seq in tx]
        results[flow.name] = {
            "sent": sent["sent"],
            "received": got["received"],
            "delays_ns_by_seq": {int(seq): rx[seq] - tx[seq] for seq in rx if seq in tx},
            "app_delays_ns": got["delays_ns"],
            "delays_ns": wire,
            "summary_us": summarize(wire),
            "app_summary_us": summarize(got["delays_ns"]),
        }
    return results


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m netlab.owd")
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("recv")
    r.add_argument("--port", type=int, required=True)
    r.add_argument("--count", type=int, default=200)
    r.add_argument("--timeout", type=float, default=10)
    r.add_argument("--idle", type=float, default=1.0)
    s = sub.add_parser("send")
    s.add_argument("--dst", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--count", type=int, default=200)
    s.add_argument("--interval-us", type=float, default=10000)
    args = parser.parse_args()
    if args.command == "recv":
        print(json.dumps(receive(args.port, args.count, args.timeout, args.idle)))
    else:
        print(json.dumps(send(args.dst, args.port, args.count, args.interval_us)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
