#!/usr/bin/env python3
"""User-space STAMP reflector (collectors/ustamp) vs. the XDP reflector, one veth pair, one run.

Short interleaved trials (xdp, userspace, userspace, xdp, ...) on the same veth pair and flood
(`build/bench/udp_flood`, sendmmsg batches of 44-byte STAMP test packets, as fast as one thread
can). Replies are counted on the sender veth by `xdp_count_drop.bpf.o` (counted, then dropped).
The user-space reflector is one Python process (socket, SO_TIMESTAMPNS, sendmsg per reply); what
it cannot take is dropped by the kernel at its socket (Udp6RcvbufErrors, reported).
Prints a table and updates the `reflector_userspace_vs_xdp` section of docs/benchmarks.md.

    sudo .local/venv/bin/python bench/reflector_userspace_vs_xdp.py [--trials 2] [--seconds 3]

Needs `make -C datapath` and `make -C bench`. Own resources: netns us-bs/us-bx, pins under
/sys/fs/bpf/segscope/us-bench. Runtime about 2 * trials * (seconds + 2) s (~20 s by default).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.reflector_vs_bounce import attach_reply_counter, remove_bench_env, reply_count  # noqa: E402
from bench.report import machine, write_section  # noqa: E402
from tests.datapath.dp_env import VethPair, ensure_bpffs, run_tool, sh  # noqa: E402

BUILD = REPO / "build"
REFLECTOR = BUILD / "datapath" / "stamp_reflector"
COUNT_DROP_OBJ = BUILD / "datapath" / "xdp_count_drop.bpf.o"
FLOOD = BUILD / "bench" / "udp_flood"
PIN_DIR = Path("/sys/fs/bpf/segscope/us-bench/stamp_reflector")
SECTION = "reflector_userspace_vs_xdp"
SSID = 1
CLK_TCK = os.sysconf("SC_CLK_TCK")


def rcvbuf_errors(ns: str) -> int:
    for line in sh("cat", "/proc/net/snmp6", ns=ns).stdout.splitlines():
        if line.startswith("Udp6RcvbufErrors"):
            return int(line.split()[1])
    return 0


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


class Userspace:
    def __init__(self, pair: VethPair):
        env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'schemas' / 'python'}"}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "collectors.ustamp",
                "reflector",
                "--netns",
                pair.x_ns,
                "--add-session",
                f"--ssid {SSID} --sender {pair.s_addr}",
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready = json.loads(self.proc.stdout.readline())
        assert ready.get("event") == "ready", ready

    def stop(self) -> tuple[dict, float]:
        cpu = proc_cpu_s(self.proc.pid)
        self.proc.send_signal(signal.SIGTERM)
        final = json.loads(self.proc.stdout.readline())
        while "final" not in final:
            final = json.loads(self.proc.stdout.readline())
        self.proc.wait(10)
        return final["counters"], cpu


def trial(mode: str, pair: VethPair, map_id: int, seconds: int) -> dict:
    user = None
    if mode == "xdp":
        shutil.rmtree(PIN_DIR, ignore_errors=True)
        run_tool(REFLECTOR, "attach", "--netns", pair.x_ns, "--dev", pair.x_dev, "--pin-dir", str(PIN_DIR))
        run_tool(REFLECTOR, "add-address", "--pin-dir", str(PIN_DIR), pair.x_addr)
        run_tool(REFLECTOR, "add-session", "--pin-dir", str(PIN_DIR), "--ssid", str(SSID), "--sender", pair.s_addr)
    else:
        user = Userspace(pair)
    drops_before = rcvbuf_errors(pair.x_ns)
    try:
        before = reply_count(map_id)
        flood = subprocess.run(
            [
                str(FLOOD),
                "--netns",
                pair.s_ns,
                "--src",
                pair.s_addr,
                "--dst",
                pair.x_addr,
                "--ssid",
                str(SSID),
                "--seconds",
                str(seconds),
                "--batch",
                "64",
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        time.sleep(0.5)  # let the user-space reflector finish its backlog
        replies = reply_count(map_id) - before
    finally:
        if user is not None:
            counters, refl_cpu = user.stop()
        else:
            counters = json.loads(run_tool(REFLECTOR, "stats", "--pin-dir", str(PIN_DIR), "--json").stdout)
            refl_cpu = None
            run_tool(REFLECTOR, "detach", "--netns", pair.x_ns, "--dev", pair.x_dev, "--pin-dir", str(PIN_DIR))
    sent = json.loads(flood.stdout)
    return {
        "mode": mode,
        "sent": sent["sent"],
        "seconds": sent["seconds"],
        "replies": replies,
        "replies_per_s": replies / sent["seconds"],
        "reflected": counters["reflected"],
        "socket_drops": rcvbuf_errors(pair.x_ns) - drops_before,
        "reflector_cpu_s": refl_cpu,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()
    for f in (REFLECTOR, COUNT_DROP_OBJ, FLOOD):
        if not f.exists():
            sys.exit(f"missing {f.relative_to(REPO)}: run `make -C datapath` and `make -C bench`")
    ensure_bpffs()
    pair = VethPair(s_ns="us-bs", x_ns="us-bx", s_dev="us-bs0", x_dev="us-bx0")
    results = []
    try:
        pair.setup()
        map_id = attach_reply_counter(pair)
        for i in range(args.trials):
            for mode in ("xdp", "userspace") if i % 2 == 0 else ("userspace", "xdp"):
                r = trial(mode, pair, map_id, args.seconds)
                results.append(r)
                print(
                    f"  trial {i + 1} {mode:9s} sent {r['sent']:>10,d}  replies {r['replies']:>10,d}  "
                    f"{r['replies_per_s']:>10,.0f}/s  socket drops {r['socket_drops']:,}",
                    flush=True,
                )
    finally:
        remove_bench_env(pair, PIN_DIR)
    med = {m: statistics.median(r["replies_per_s"] for r in results if r["mode"] == m) for m in ("xdp", "userspace")}
    user_cpu = [
        r["replies"] / r["reflector_cpu_s"] for r in results if r["mode"] == "userspace" and r["reflector_cpu_s"]
    ]
    mach = machine()
    load = Path("/proc/loadavg").read_text().split()[:3]

    def cpu(r: dict) -> str:
        return "(XDP: softirq)" if r["reflector_cpu_s"] is None else f"{r['reflector_cpu_s']:.2f}"

    rows = "\n".join(
        f"| {i // 2 + 1} | {r['mode']} | {r['sent']:,} | {r['replies']:,} | {r['replies_per_s']:,.0f} | "
        f"{r['socket_drops']:,} | {r['sent'] - r['replies'] - r['socket_drops']:,} | {cpu(r)} |"
        for i, r in enumerate(results)
    )
    text = f"""## User-space vs. XDP STAMP reflector (bench/reflector_userspace_vs_xdp.py)

{dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}; {mach['nproc']} CPUs, {mach['cpu']}, kernel {mach['kernel']}.
One veth pair (us-bs0 <-> us-bx0), one `udp_flood` thread (sendmmsg, batch 64, 44-byte STAMP packets, as fast as it
can), {args.trials} rounds of one {args.seconds} s trial per reflector, order alternating. Replies counted by `xdp_count_drop` on the
sender veth. `collectors/ustamp` is one Python process (select + recvmsg with SO_TIMESTAMPNS/HOPLIMIT/PKTINFO,
one sendmsg per reply); packets it cannot take are dropped at its socket (Udp6RcvbufErrors, "socket drops");
"unaccounted" = sent − replies − socket drops (0: every packet is either answered or a counted drop).

| round | reflector | sent | replies | replies/s | socket drops | unaccounted | reflector CPU s |
|---|---|---|---|---|---|---|---|
{rows}

Median replies/s: XDP **{med['xdp']:,.0f}**, user space **{med['userspace']:,.0f}**
(**XDP / user space = {med['xdp'] / med['userspace']:.1f}x**). User-space replies per reflector CPU-second:
{', '.join(f'{x:,.0f}' for x in user_cpu)}. Load average at the end: {' '.join(load)} (2 shared cores).
The user-space reflector is the fallback for kernels or modes without XDP and for low-rate sessions (a STAMP
session is typically 1–1000 packets/s); its T2 is the kernel's socket receive stamp, its T3 a clock read
just before sendmsg, so T3−T2 includes the Python processing time (a few hundred µs under load), which the
round-trip formula (T4−T1)−(T3−T2) removes.
"""  # noqa: E501 - markdown report: one table row or paragraph per line
    print()
    print(text)
    if not args.no_doc:
        write_section(SECTION, text)
        print("updated docs/benchmarks.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
