#!/usr/bin/env python3
"""Session-Sender receive side: XDP collector vs. the ustamp sender/collector, one veth pair, one run.

The collector side (netns cm-bc, dev cm-bc0, address fd00:d5::2) receives a flood of STAMP
reflector packets (RFC 8762 §4.3.1 replies, 44 bytes, from [fd00:d5::1]:862 to the session's
sender port). The frames are built once, each with its own sequence number 0..K-1 and correct
UDP checksum, and sent back to back from the peer (cm-bs0) through an AF_PACKET socket.
  xdp:       build/datapath/stamp_collector on cm-bc0 (session active): T4, a stamp_record into the
             ring buffer, XDP_DROP. `stamp_collector dump` consumes the ring meanwhile. Counted:
             `collected` (records written), `drop_ringbuf_full`, records the consumer read.
  userspace: `python -m collectors.ustamp sender` bound to the session's port. It first sends its
             K test packets (to the peer, where xdp_count_drop counts and drops them) so that every
             flooded reply matches a sequence number it sent; then the flood. Counted: its
             `records` (each reply decoded, timestamps widened, a record emitted as a JSON line),
             and the kernel's socket drops (Udp6RcvbufErrors) for what it could not take.
records/s = records / (time from the flood's start to the last record). Every flooded frame must
be a record or a counted drop ("unaccounted" column, 0 expected).
Prints a table and updates the `collector_userspace_vs_xdp` section of docs/benchmarks.md.

    sudo .local/venv/bin/python bench/collector_userspace_vs_xdp.py [--rounds 3] [--packets 150000]

Needs `make -C datapath`. Own resources: netns cm-bs/cm-bc, pins under
/sys/fs/bpf/segscope/cm-bench. Runtime ~30 s with the defaults.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "schemas" / "python"))
from bench.reflector_userspace_vs_xdp import rcvbuf_errors  # noqa: E402
from bench.reflector_vs_bounce import attach_reply_counter, remove_bench_env, reply_count  # noqa: E402
from bench.report import machine, write_section  # noqa: E402
from tests.datapath.dp_env import VethPair, ensure_bpffs, in_netns, run_tool  # noqa: E402

BUILD = REPO / "build"
COLLECTOR = BUILD / "datapath" / "stamp_collector"
COUNT_DROP_OBJ = BUILD / "datapath" / "xdp_count_drop.bpf.o"
PIN_DIR = Path("/sys/fs/bpf/segscope/cm-bench/stamp_collector")
SECTION = "collector_userspace_vs_xdp"
SSID, SENDER_PORT = 7, 50007
NS_PER_SEC = 1_000_000_000


def _csum_words(buf: bytes) -> int:
    if len(buf) % 2:
        buf += b"\0"
    return sum(struct.unpack(f"!{len(buf) // 2}H", buf))


def _fold(s: int) -> int:
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def build_frames(pair: VethPair, count: int) -> list[bytes]:
    """K reflector packets (PTP, stateless: reflector seq = sender seq = i), full UDP checksums.
    T1 < T2 < T3 are a recent CLOCK_TAI instant (the collector widens 32-bit seconds around T4)."""
    t1 = time.clock_gettime_ns(time.CLOCK_TAI) - 1_000_000
    sec, nsec = divmod(t1, NS_PER_SEC)
    ee = 0x4001  # Z = PTP, multiplier 1
    payload0 = struct.pack(
        "!IIIHHIIIIIHHB3x",
        0,
        sec,
        (nsec + 2000) % NS_PER_SEC,
        ee,
        SSID,
        sec,
        (nsec + 1000) % NS_PER_SEC,
        0,
        sec,
        nsec,
        ee,
        0,
        63,
    )
    assert len(payload0) == 44
    src, dst = socket.inet_pton(socket.AF_INET6, pair.s_addr), socket.inet_pton(socket.AF_INET6, pair.x_addr)
    udp_len = 8 + len(payload0)
    udp0 = struct.pack("!HHHH", 862, SENDER_PORT, udp_len, 0)
    # RFC 8200 §8.1 pseudo-header + UDP header + payload with seq fields 0; each frame adds 2 * seq
    base = _csum_words(src + dst + struct.pack("!IxxxB", udp_len, 17) + udp0 + payload0)
    eth = bytes.fromhex(pair.x_mac.replace(":", "")) + bytes.fromhex(pair.s_mac.replace(":", "")) + b"\x86\xdd"
    ip6 = struct.pack("!IHBB", 0x60000000, udp_len, 17, 64) + src + dst
    head = eth + ip6
    frames = []
    for i in range(count):
        c = 0xFFFF - _fold(base + 2 * ((i >> 16) + (i & 0xFFFF)))
        seq = struct.pack("!I", i)
        frames.append(
            b"".join(
                (
                    head,
                    struct.pack("!HHHH", 862, SENDER_PORT, udp_len, c or 0xFFFF),
                    seq,
                    payload0[4:24],
                    seq,
                    payload0[28:],
                )
            )
        )
    return frames


def flood(pair: VethPair, frames: list[bytes]) -> tuple[float, float]:
    """All frames once, back to back, from the peer's veth. Returns (start, end) monotonic."""
    with in_netns(pair.s_ns):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        s.bind((pair.s_dev, 0))
    send = s.send
    start = time.monotonic()
    for f in frames:
        send(f)
    end = time.monotonic()
    s.close()
    return start, end


def trial_xdp(pair: VethPair, frames: list[bytes]) -> dict:
    shutil.rmtree(PIN_DIR, ignore_errors=True)
    run_tool(COLLECTOR, "attach", "--netns", pair.x_ns, "--dev", pair.x_dev, "--pin-dir", str(PIN_DIR))
    try:
        run_tool(COLLECTOR, "activate", "--pin-dir", str(PIN_DIR), "--ssid", str(SSID), "--port", str(SENDER_PORT))
        # the consumer writes to a file: a reader thread here would take the GIL from the flood loop
        with tempfile.TemporaryFile(prefix="cm-bench-dump-") as out:
            consumer = subprocess.Popen(
                [
                    str(COLLECTOR),
                    "dump",
                    "--pin-dir",
                    str(PIN_DIR),
                    "--count",
                    str(len(frames)),
                    "--timeout-ms",
                    "3000",
                ],
                stdout=out,
            )
            time.sleep(0.3)  # the consumer is polling the ring
            start, end = flood(pair, frames)
            consumer.wait(30)
            out.seek(0)
            consumed = sum(1 for line in out if line.startswith(b"{"))
        stats = json.loads(run_tool(COLLECTOR, "stats", "--pin-dir", str(PIN_DIR), "--json").stdout)
    finally:
        run_tool(COLLECTOR, "detach", "--netns", pair.x_ns, "--dev", pair.x_dev, "--pin-dir", str(PIN_DIR), check=False)
    # the XDP program writes each record when its frame arrives (T4 is taken at program entry), so
    # the records are all written by the end of the flood; the consumer may read the last ones later
    return {
        "mode": "xdp",
        "sent": len(frames),
        "flood_s": end - start,
        "records": stats["collected"],
        "drops": stats["drop_ringbuf_full"],
        "drop_kind": "ringbuf full",
        "consumed": consumed,
        "seconds": end - start,
        "other": sum(v for k, v in stats.items() if k not in ("collected", "drop_ringbuf_full")),
    }


def trial_userspace(pair: VethPair, frames: list[bytes], count_map: int) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'schemas' / 'python'}"}
    k = len(frames)
    sent_before = reply_count(count_map)
    drops_before = rcvbuf_errors(pair.x_ns)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "collectors.ustamp",
            "sender",
            "--netns",
            pair.x_ns,
            "--src",
            pair.x_addr,
            "--dst",
            pair.s_addr,
            "--sport",
            str(SENDER_PORT),
            "--ssid",
            str(SSID),
            "--rate",
            "10000000",
            "--count",
            str(k),
            "--wait",
            "4",
            "--batch-interval",
            "0.02",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    stamps: list[float] = []
    summary: dict = {}

    def read() -> None:
        for line in proc.stdout:
            if line.startswith('{"summary"'):
                summary.update(json.loads(line)["summary"])
            else:
                stamps.append(time.monotonic())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 60
    while reply_count(count_map) - sent_before < k:  # its test packets are all out
        assert proc.poll() is None and time.monotonic() < deadline, "ustamp sender did not send its packets"
        time.sleep(0.05)
    start, end = flood(pair, frames)
    proc.wait(60)
    reader.join(10)
    drops = rcvbuf_errors(pair.x_ns) - drops_before
    last = max(stamps) if stamps else end
    return {
        "mode": "userspace",
        "sent": k,
        "flood_s": end - start,
        "records": summary["records"],
        "drops": drops,
        "drop_kind": "socket (Udp6RcvbufErrors)",
        "consumed": len(stamps),
        "seconds": max(last, end) - start,
        "other": summary["received"] - summary["records"],
    }


def git_head() -> str:
    """Last commit of datapath/ (+ a note if the working tree differs from it)."""

    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True).stdout.strip()

    head = git("log", "-1", "--format=%h", "--", "datapath")
    if not head:
        return "unknown (not a git checkout)"
    return head + (" + uncommitted changes" if git("status", "--porcelain", "--", "datapath") else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--packets", type=int, default=150_000)
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()
    for f in (COLLECTOR, COUNT_DROP_OBJ):
        if not f.exists():
            sys.exit(f"missing {f.relative_to(REPO)}: run `make -C datapath`")
    ensure_bpffs()
    pair = VethPair(s_ns="cm-bs", x_ns="cm-bc", s_dev="cm-bs0", x_dev="cm-bc0")
    results = []
    try:
        pair.setup()
        # the peer counts and drops what the collector side sends (the ustamp sender's test packets)
        count_map = attach_reply_counter(pair)
        t0 = time.monotonic()
        frames = build_frames(pair, args.packets)
        print(f"  built {len(frames):,} reply frames in {time.monotonic() - t0:.1f} s", flush=True)
        for i in range(args.rounds):
            for mode in ("xdp", "userspace") if i % 2 == 0 else ("userspace", "xdp"):
                r = trial_xdp(pair, frames) if mode == "xdp" else trial_userspace(pair, frames, count_map)
                r["round"] = i + 1
                r["per_s"] = r["records"] / r["seconds"]
                results.append(r)
                print(
                    f"  round {i + 1} {mode:9s} flood {r['sent']:,} in {r['flood_s']:.2f} s "
                    f"({r['sent'] / r['flood_s']:,.0f}/s)  records {r['records']:,} ({r['per_s']:,.0f}/s)  "
                    f"drops {r['drops']:,}  other {r['other']:,}",
                    flush=True,
                )
    finally:
        remove_bench_env(pair, PIN_DIR)
    med = {m: statistics.median(r["per_s"] for r in results if r["mode"] == m) for m in ("xdp", "userspace")}
    flood_rate = statistics.median(r["sent"] / r["flood_s"] for r in results)
    xdp_all = all(r["records"] == r["sent"] for r in results if r["mode"] == "xdp")
    mach = machine()
    load = Path("/proc/loadavg").read_text().split()[:3]
    rows = "\n".join(
        f"| {r['round']} | {r['mode']} | {r['sent']:,} | {r['sent'] / r['flood_s']:,.0f} | {r['records']:,} | "
        f"{r['per_s']:,.0f} | {r['consumed']:,} | {r['drops']:,} {r['drop_kind']} | "
        f"{r['sent'] - r['records'] - r['drops']:,} |"
        for r in results
    )
    xdp_note = (
        "The XDP collector recorded every flooded reply in every round, so its number is the flood's rate "
        "(one Python AF_PACKET thread), a lower bound of its capacity"
        if xdp_all
        else "The XDP collector did not record every reply (see drops)"
    )
    text = f"""## Session-Sender receive side: XDP collector vs. ustamp (bench/collector_userspace_vs_xdp.py)

{dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}; {mach['nproc']} CPUs, {mach['cpu']}, kernel {mach['kernel']}.
One veth pair (cm-bs0 -> cm-bc0). {args.packets:,} STAMP reflector packets (44 bytes, PTP, one SSID, sequence numbers
0..K-1, full UDP checksums) are built once and sent back to back through an AF_PACKET socket on cm-bs0, {args.rounds}
rounds, order alternating. **xdp**: `stamp_collector` on cm-bc0 stamps T4 and writes a 64-byte `stamp_record` into its
ring buffer (XDP_DROP), `stamp_collector dump` reads the ring meanwhile; records = `collected`. **userspace**:
the `collectors/ustamp` sender (one Python process) first sends its K test packets (counted and dropped on the peer)
so every reply matches a sent sequence number, then takes the flood on its socket (recvmsg with SO_TIMESTAMPNS,
decode, 64-bit timestamps, one JSON record line); what it cannot take is dropped at its socket (Udp6RcvbufErrors).
records/s = records / (flood start → last record out). "unaccounted" = sent − records − drops (0: every reply is a
record or a counted drop); "records read" = records the consumer (`dump`, the sender's JSON lines) delivered.
Datapath: commit {git_head()}.

| round | collector | replies sent | flood/s | records | records/s | records read | drops | unaccounted |
|---|---|---|---|---|---|---|---|---|
{rows}

Median records/s: XDP **{med['xdp']:,.0f}**, user space **{med['userspace']:,.0f}** (**XDP / user space =
{med['xdp'] / med['userspace']:.1f}x**; flood median {flood_rate:,.0f}/s). {xdp_note}. Load average at the end:
{' '.join(load)} (2 shared cores). The user-space collector is the fallback where XDP is not available; a STAMP session
is typically 1–1000 packets/s, far below either number.
"""  # noqa: E501 - markdown report: one table row or paragraph per line
    print()
    print(text)
    if not args.no_doc:
        write_section(SECTION, text)
        print("updated docs/benchmarks.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
