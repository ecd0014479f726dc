#!/usr/bin/env python3
"""STAMP Session-Reflectors on one veth pair, one run: XDP, the user-space reflector's fast engine
(C workers), its Python engine, and (with --peer-binary) stamp-suite's reflector.

Short interleaved trials (the order rotates every round) on the same veth pair and flood
(`build/bench/udp_flood`, one thread, sendmmsg batches of 44-byte STAMP test packets, as fast as it
can, for --seconds). Replies are counted on the sender veth by `xdp_count_drop.bpf.o` (counted,
then dropped). What a user-space reflector cannot take is dropped by the kernel at its socket
(Udp6RcvbufErrors, reported): every flood packet is a reply or a counted drop ("unaccounted" = sent
- replies - socket drops, 0 when nothing is lost elsewhere).

Reflectors (each the program users run, as they run it):
  xdp          build/datapath/stamp_reflector attach + add-session (XDP_TX in the driver)
  fast         python -m collectors.ustamp reflector (default engine: C workers, one per CPU,
               session steering: this single flow lands on one worker)
  fast-packet  the same with --steering packet (the flow spread over every worker)
  python       python -m collectors.ustamp reflector --engine python (the pure-Python reflector)
  stamp-suite  --peer-binary PATH (github.com/asmie/stamp-suite, `stamp-suite -i -S ::`: open mode)
CPU per reply = the reflector process's CPU time (all threads, utime + stime, read right before and
after the flood) / its replies; XDP runs in the softirq of whichever CPU receives (not a process).
Then, for the fast engine at --send-batch 64, 16 and 1: how early T3 is under the flood, from a packet
tap on the reflector's veth (the kernel's stamp of each reply frame leaving minus the T3 it carries;
the tap reads a sample of the frames).

    sudo .local/venv/bin/python bench/reflector_userspace_vs_xdp.py [--trials 3] [--seconds 3]
         [--peer-binary /path/to/stamp-suite] [--only xdp,fast,...]

Needs `make -C datapath`, `make -C collectors` and `make -C bench`. Own resources: netns us-bs/us-bx,
pins under /sys/fs/bpf/segscope/us-bench. Runtime about trials * reflectors * (seconds + 3) s.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import select
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.process_cpu import cpu_seconds  # noqa: E402
from bench.reflector_vs_bounce import attach_reply_counter, remove_bench_env, reply_count  # noqa: E402
from bench.report import machine, write_section  # noqa: E402
from bench.stamp_forwarding_capacity import cpu_ticks, steal_share  # noqa: E402
from tests.datapath.dp_env import VethPair, ensure_bpffs, run_tool, sh  # noqa: E402

BUILD = REPO / "build"
REFLECTOR = BUILD / "datapath" / "stamp_reflector"
COUNT_DROP_OBJ = BUILD / "datapath" / "xdp_count_drop.bpf.o"
FLOOD = BUILD / "bench" / "udp_flood"
FAST_LIB = BUILD / "collectors" / "libustamp_fast.so"
PIN_DIR = Path("/sys/fs/bpf/segscope/us-bench/stamp_reflector")
SECTION = "reflector_userspace_vs_xdp"
SSID = 1
MODES = ("xdp", "fast", "fast-packet", "python", "stamp-suite")


def rcvbuf_errors(ns: str) -> int:
    for line in sh("cat", "/proc/net/snmp6", ns=ns).stdout.splitlines():
        if line.startswith("Udp6RcvbufErrors"):
            return int(line.split()[1])
    return 0


class Ustamp:
    """`python -m collectors.ustamp reflector` in the reflector's namespace."""

    def __init__(self, pair: VethPair, *extra: str):
        env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'schemas' / 'python'}"}
        cmd = [sys.executable, "-m", "collectors.ustamp", "reflector", "--netns", pair.x_ns]
        cmd += ["--add-session", f"--ssid {SSID} --sender {pair.s_addr}", *extra]
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
        self.ready = json.loads(self.proc.stdout.readline())
        assert self.ready.get("event") == "ready", self.ready
        self.pid = self.proc.pid

    def stop(self) -> dict:
        self.proc.send_signal(signal.SIGTERM)
        final = json.loads(self.proc.stdout.readline())
        while "final" not in final:
            final = json.loads(self.proc.stdout.readline())
        self.proc.wait(10)
        return final["counters"]


class Peer:
    """stamp-suite's reflector (open mode, all addresses, port 862) in the reflector's namespace."""

    def __init__(self, pair: VethPair, binary: Path):
        # `ip netns exec` execs the binary: the pid is stamp-suite's own
        cmd = ["ip", "netns", "exec", pair.x_ns, str(binary), "-i", "-S", "::", "-o", "862"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.pid = self.proc.pid
        deadline = time.monotonic() + 10
        while not udp_bound(pair.x_ns, 862):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"stamp-suite did not start: {self.proc.stderr.read() if self.proc.poll() else ''}")
            time.sleep(0.1)

    def stop(self) -> dict:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return {}


def udp_bound(ns: str, port: int) -> bool:
    return f":{port} " in sh("ss", "-Hlun", ns=ns).stdout


def start(mode: str, pair: VethPair, peer_binary: Path | None):
    if mode == "xdp":
        shutil.rmtree(PIN_DIR, ignore_errors=True)
        run_tool(REFLECTOR, "attach", "--netns", pair.x_ns, "--dev", pair.x_dev, "--pin-dir", str(PIN_DIR))
        run_tool(REFLECTOR, "add-address", "--pin-dir", str(PIN_DIR), pair.x_addr)
        run_tool(REFLECTOR, "add-session", "--pin-dir", str(PIN_DIR), "--ssid", str(SSID), "--sender", pair.s_addr)
        return None
    if mode == "fast":
        return Ustamp(pair, "--engine", "fast")
    if mode == "fast-packet":
        return Ustamp(pair, "--engine", "fast", "--steering", "packet")
    if mode == "python":
        return Ustamp(pair, "--engine", "python")
    return Peer(pair, peer_binary)


def stop(mode: str, pair: VethPair, proc) -> dict:
    if proc is not None:
        return proc.stop()
    counters = json.loads(run_tool(REFLECTOR, "stats", "--pin-dir", str(PIN_DIR), "--json").stdout)
    run_tool(REFLECTOR, "detach", "--netns", pair.x_ns, "--dev", pair.x_dev, "--pin-dir", str(PIN_DIR))
    return counters


def trial(mode: str, pair: VethPair, map_id: int, seconds: int, peer_binary: Path | None) -> dict:
    proc = start(mode, pair, peer_binary)
    drops_before = rcvbuf_errors(pair.x_ns)
    try:
        before = reply_count(map_id)
        cpu0 = cpu_seconds(proc.pid) if proc else None
        flood = subprocess.run(
            [str(FLOOD), "--netns", pair.s_ns, "--src", pair.s_addr, "--dst", pair.x_addr, "--ssid", str(SSID)]
            + ["--seconds", str(seconds), "--batch", "64"],
            check=True,
            capture_output=True,
            text=True,
        )
        time.sleep(0.5)  # a user-space reflector's backlog
        replies = reply_count(map_id) - before
        cpu = cpu_seconds(proc.pid) - cpu0 if proc else None
    finally:
        counters = stop(mode, pair, proc)
    sent = json.loads(flood.stdout)
    return {
        "mode": mode,
        "sent": sent["sent"],
        "seconds": sent["seconds"],
        "replies": replies,
        "replies_per_s": replies / sent["seconds"],
        "reflected": counters.get("reflected"),
        "socket_drops": rcvbuf_errors(pair.x_ns) - drops_before,
        "cpu_s": cpu,
        "workers": getattr(proc, "ready", {}).get("workers") if proc else None,
    }


ETH_P_ALL, ETH_P_IPV6, PACKET_OUTGOING, SO_TIMESTAMPNS = 0x0003, 0x86DD, 4, 35
SEND_BATCHES = (64, 16, 1)


def t3_lead_trial(pair: VethPair, map_id: int, seconds: int, send_batch: int) -> dict:
    """The fast engine under the flood with a tap on its veth: kernel stamp of each reply frame
    leaving - its T3 (PTP), over the frames the tap reads."""
    from tests.ustamp.ustamp_env import socket_in_netns

    tap = socket_in_netns(pair.x_ns, socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    tap.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    tap.setsockopt(socket.SOL_SOCKET, 33, 32 << 20)  # SO_RCVBUFFORCE
    tap.bind((pair.x_dev, ETH_P_ALL))
    tai_ns = (time.clock_gettime_ns(time.CLOCK_TAI) - time.time_ns() + 500_000_000) // 10**9 * 10**9
    leads: list[int] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            if not select.select([tap], [], [], 0.1)[0]:
                continue
            data, anc, _flags, addr = tap.recvmsg(256, 64)
            if addr[2] != PACKET_OUTGOING or struct.unpack_from("!H", data, 12)[0] != ETH_P_IPV6 or data[20] != 17:
                continue
            sec, nsec = next(struct.unpack("=qq", d) for _l, t, d in anc if t == SO_TIMESTAMPNS)
            t3_sec, t3_nsec = struct.unpack_from("!II", data, 14 + 40 + 8 + 4)
            leads.append(sec * 10**9 + nsec + tai_ns - (t3_sec * 10**9 + t3_nsec))

    reader = threading.Thread(target=read)
    reader.start()
    proc = Ustamp(pair, "--engine", "fast", "--send-batch", str(send_batch))
    try:
        before = reply_count(map_id)
        flood = subprocess.run(
            [str(FLOOD), "--netns", pair.s_ns, "--src", pair.s_addr, "--dst", pair.x_addr, "--ssid", str(SSID)]
            + ["--seconds", str(seconds), "--batch", "64"],
            check=True,
            capture_output=True,
            text=True,
        )
        time.sleep(0.5)
        replies = reply_count(map_id) - before
    finally:
        proc.stop()
        stop.set()
        reader.join()
        tap.close()
    leads.sort()
    pick = lambda q: leads[min(len(leads) - 1, int(q * len(leads)))] / 1000  # noqa: E731
    return {
        "send_batch": send_batch,
        "replies_per_s": replies / json.loads(flood.stdout)["seconds"],
        "sampled": len(leads),
        "negative": sum(1 for x in leads if x < 0),
        "p50_us": pick(0.5),
        "p99_us": pick(0.99),
        "max_us": leads[-1] / 1000,
    }


def peer_version(binary: Path) -> str:
    res = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
    return (res.stdout or res.stderr).strip().splitlines()[0] if res.returncode == 0 else "version unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--peer-binary", type=Path, help="stamp-suite's binary (built from its source; not in the repo)")
    ap.add_argument("--peer-source", default="", help="what the peer binary was built from (for the report)")
    ap.add_argument("--only", default="", help=f"comma-separated subset of {','.join(MODES)}")
    ap.add_argument("--no-t3-lead", action="store_true", help="skip the T3 measurement under the flood")
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()
    for f in (REFLECTOR, COUNT_DROP_OBJ, FLOOD, FAST_LIB):
        if not f.exists():
            sys.exit(f"missing {f.relative_to(REPO)}: run `make -C datapath`, `make -C collectors`, `make -C bench`")
    modes = [m for m in MODES if m != "stamp-suite" or args.peer_binary]
    if args.only:
        wanted = args.only.split(",")
        unknown = set(wanted) - set(MODES)
        if unknown:
            sys.exit(f"--only: unknown reflector {sorted(unknown)[0]!r} (known: {', '.join(MODES)})")
        modes = [m for m in modes if m in wanted]
    if args.peer_binary and not os.access(args.peer_binary, os.X_OK):
        sys.exit(f"--peer-binary: not an executable: {args.peer_binary}")
    ensure_bpffs()
    pair = VethPair(s_ns="us-bs", x_ns="us-bx", s_dev="us-bs0", x_dev="us-bx0")
    results = []
    ticks0, t0 = cpu_ticks(), time.monotonic()
    try:
        pair.setup()
        map_id = attach_reply_counter(pair)
        for i in range(args.trials):
            order = modes[i % len(modes) :] + modes[: i % len(modes)]
            for mode in order:
                r = trial(mode, pair, map_id, args.seconds, args.peer_binary)
                r["round"] = i + 1
                results.append(r)
                per = f"  {r['cpu_s'] / r['replies'] * 1e6:5.2f} us CPU/reply" if r["cpu_s"] and r["replies"] else ""
                print(
                    f"  round {i + 1} {mode:11s} sent {r['sent']:>10,d}  replies {r['replies']:>10,d}  "
                    f"{r['replies_per_s']:>10,.0f}/s  socket drops {r['socket_drops']:>9,d}{per}",
                    flush=True,
                )
        leads = []
        if not args.no_t3_lead and "fast" in modes:
            for sb in SEND_BATCHES:
                lead = t3_lead_trial(pair, map_id, args.seconds, sb)
                leads.append(lead)
                print(f"  T3 lead, --send-batch {sb:2d}: {json.dumps(lead)}", flush=True)
    finally:
        remove_bench_env(pair, PIN_DIR)
    steal = steal_share(ticks0, cpu_ticks())
    elapsed = time.monotonic() - t0
    text = report(args, modes, results, steal, elapsed, leads)
    print()
    print(text)
    if not args.no_doc:
        write_section(SECTION, text)
        print("updated docs/benchmarks.md")
    return 0


def report(args, modes: list[str], results: list[dict], steal: float, elapsed: float, leads: list[dict]) -> str:
    mach = machine()
    load = Path("/proc/loadavg").read_text().split()[:3]
    med = {m: statistics.median(r["replies_per_s"] for r in results if r["mode"] == m) for m in modes}
    cpu_per = {
        m: statistics.median(r["cpu_s"] / r["replies"] * 1e6 for r in results if r["mode"] == m and r["replies"])
        for m in modes
        if m != "xdp"
    }

    def cpu(r: dict) -> str:
        if r["cpu_s"] is None:
            return "(softirq)"
        if not r["replies"]:
            return f"{r['cpu_s']:.2f} s"
        return f"{r['cpu_s']:.2f} s, {r['cpu_s'] / r['replies'] * 1e6:.2f} µs"

    rows = "\n".join(
        f"| {r['round']} | {r['mode']} | {r['sent']:,} | {r['replies']:,} | {r['replies_per_s']:,.0f} | "
        f"{r['socket_drops']:,} | {r['sent'] - r['replies'] - r['socket_drops']:,} | {cpu(r)} |"
        for r in results
    )
    medians = "\n".join(
        f"| {m} | {med[m]:,.0f} | {cpu_per[m]:.2f} | {1e6 / cpu_per[m]:,.0f} |"
        if m in cpu_per
        else f"| {m} | {med[m]:,.0f} | (softirq) | |"
        for m in modes
    )
    ratios = []
    if "fast" in med and "python" in med:
        ratios.append(f"fast / python = **{med['fast'] / med['python']:.1f}x**")
    if "fast" in med and "stamp-suite" in med:
        ratios.append(
            f"fast / stamp-suite = **{med['fast'] / med['stamp-suite']:.2f}x** replies/s, "
            f"**{cpu_per['stamp-suite'] / cpu_per['fast']:.1f}x** replies per CPU-second"
        )
    if "xdp" in med and "fast" in med:
        ratios.append(f"xdp / fast = {med['xdp'] / med['fast']:.2f}x")
    lead_rows = "\n".join(
        f"| {x['send_batch']} | {x['replies_per_s']:,.0f} | {x['sampled']:,} | {x['negative']} | "
        f"{x['p50_us']:.1f} | {x['p99_us']:.1f} | {x['max_us']:.1f} |"
        for x in leads
    )
    lead_text = (
        f"""
How early the fast engine's T3 is under this flood (one trial each, after the rounds): a packet tap on the
reflector's veth stamps each reply frame as it leaves; lead = that stamp − the T3 in the frame (the tap reads a
sample; "T3 after" counts frames whose T3 was later than their departure, which must stay 0). The tap costs the
reflector's CPU too, so these replies/s are below the table's.

| --send-batch | replies/s | frames sampled | T3 after | lead p50 µs | lead p99 µs | lead max µs |
|---|---|---|---|---|---|---|
{lead_rows}
"""
        if leads
        else ""
    )
    peer = ""
    if args.peer_binary:
        peer = (
            f" stamp-suite: {peer_version(args.peer_binary)}"
            + (f", {args.peer_source}" if args.peer_source else "")
            + " (built with `cargo build --release` outside this repository; `stamp-suite -i -S ::`, open mode)."
        )
    return f"""## STAMP reflectors on one veth: XDP, ustamp fast and Python engines, stamp-suite (bench/reflector_userspace_vs_xdp.py)

{dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}; {mach['nproc']} CPUs, {mach['cpu']}, kernel {mach['kernel']},
shared with other work: load average {' '.join(load)} at the end, CPU steal {steal * 100:.1f} % over the {elapsed:.0f} s run.
One veth pair (us-bs0 <-> us-bx0), one `udp_flood` thread (sendmmsg, batch 64, 44-byte STAMP packets, as fast as it
can: the flood and the receive path of the test packets take one of the two CPUs), {args.trials} rounds of one
{args.seconds} s trial per reflector, the order rotating. Replies counted by `xdp_count_drop` on the sender veth.
What a user-space reflector cannot take is dropped at its socket (Udp6RcvbufErrors, "socket drops"); "unaccounted" =
sent − replies − socket drops. CPU = the reflector process's CPU time during the flood (all its threads) and per
reply. `fast` is `python -m collectors.ustamp reflector` as it starts by default (C workers, one per CPU, session
steering: this one flow goes to one worker); `fast-packet` adds `--steering packet` (every worker takes part);
`python` is `--engine python`.{peer}

| round | reflector | sent | replies | replies/s | socket drops | unaccounted | reflector CPU (total, per reply) |
|---|---|---|---|---|---|---|---|
{rows}

| reflector | median replies/s | median CPU µs per reply | replies per CPU-second |
|---|---|---|---|
{medians}

{'; '.join(ratios)}.
On these two shared vCPUs the flood generator needs one CPU, so the second worker of `fast-packet` competes with it
rather than adding a core; the workers scale where cores are free. The user-space reflectors' T2 is the kernel's
socket receive stamp; the fast engine's T3 is a CLOCK_TAI read right before each sendmmsg() (at most 16 replies by
default, `--send-batch`), the Python engine's one before each sendmsg().
{lead_text}"""  # noqa: E501 - markdown report: one table row or paragraph per line


if __name__ == "__main__":
    sys.exit(main())
