"""Per-packet cost of the in-line IOAM programs (datapath/ioam_tx.bpf.c, ioam_rx.bpf.c) measured by
the kernel with BPF_PROG_TEST_RUN.

    sudo .local/venv/bin/python bench/ioam_testrun_cost.py [--prefix iocb] [--rounds 5] [--json] [--no-doc]

Both programs are attached to a veth pair (down, no IPv6) in a throwaway netns <prefix>tr; one
monitored flow (the line5 policy [fc00:2::e, fc00:3::d6], trace of 4 slots). Packets: the outer
IPv6 + SRH + inner IPv6/UDP (32 B payload) A's seg6 encap writes, and at the egress the same packet
instrumented (HBH trace with 2 entries filled, E2E option). Numbers (best of --rounds):
  tx per call      repeat=1, mean of 1000 calls: an skb test run reruns the same skb, and ioam_tx
                   changes it, so instrumenting cannot be looped; the per-call numbers include the
                   test-run timer (~80 ns): compare them with the unmonitored packet's per-call cost
                   - unmonitored (an SRv6 packet of no flow: parse + one missed lookup)
                   - N=1 (every packet instrumented), N=100 (the mean over 1000 consecutive packets:
                     10 instrumented, 990 counted and passed)
  tx looped        repeat=60000 on a packet of the flow that is not sampled (the flow saw one
                   packet first, so with --sample-every 65535 none of the loop is sampled)
  rx looped        repeat=50000 (ioam_rx does not change the packet): a recorded packet (one ring
                   buffer record per run, the ring drained between rounds), a packet of the flow
                   without IOAM (not sampled at the ingress: no Hop-by-Hop header)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "schemas" / "python")]
os.chdir(REPO)

from bench.report import machine_line, write_section  # noqa: E402
from tests.datapath.altmark_env import TestRun  # noqa: E402
from tests.datapath.dp_env import in_netns  # noqa: E402
from tests.datapath.ioam_env import (  # noqa: E402
    IOAM_RX,
    IOAM_TX,
    PIN_ROOT,
    POLICY,
    Node,
    Trace,
    e2e_doh,
    encapped,
    instrumented,
    run,
    stats,
)

SLOTS = 4


def tx_flow(inst: str, every: int) -> None:
    run(IOAM_TX, "del-flow", "--instance", inst, "--sids", ",".join(POLICY), check=False)
    run(
        IOAM_TX, "add-flow", "--instance", inst, "--sids", ",".join(POLICY), "--flow-id", "7", "--namespace-id", "123",
        "--node-id", "5", "--trace-nodes", str(SLOTS), "--sample-every", str(every),
    )  # fmt: skip


def per_call(prog: TestRun, frame: bytes, calls: int = 1000) -> float:
    return sum(prog.run(frame)[2] for _ in range(calls)) / calls


def measure(inst: str, ns: str, tx: TestRun, rx: TestRun, rounds: int) -> dict[str, float]:
    frame = encapped(POLICY)
    unmonitored = encapped(["fc00:2::e", "fc00:3::d7"])
    at_egress = instrumented(
        Trace(43, 123, SLOTS, [Node(62, 7, 70, 71, 1, 2), Node(63, 5, 10, 11, 1, 1)]), e2e_doh(41, 123, 5, 1, 3)
    )
    plain = encapped(POLICY)  # at the egress: a packet of the flow the ingress did not sample
    out: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        out.setdefault(key, []).append(value)

    with in_netns(ns):
        for _ in range(rounds):
            tx_flow(inst, 1)
            add("tx_unmonitored_per_call_ns", per_call(tx, unmonitored))
            add("tx_n1_per_call_ns", per_call(tx, frame))
            tx_flow(inst, 100)
            add("tx_n100_per_call_ns", per_call(tx, frame))
            tx_flow(inst, 65535)
            tx.run(frame)  # packet 0 of the flow is sampled; the loop below starts at packet 1
            add("tx_not_sampled_looped_ns", float(tx.run(frame, repeat=60_000)[2]))  # packets 1..60000
            add("rx_recorded_looped_ns", float(rx.run(at_egress, repeat=50_000)[2]))
            run(IOAM_RX, "dump", "--instance", inst, "--timeout-ms", "200")  # drain
            add("rx_not_instrumented_looped_ns", float(rx.run(plain, repeat=50_000)[2]))
    return {k: min(v) for k, v in out.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix", default="iocb")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-doc", action="store_true")
    a = ap.parse_args()
    started = machine_line()
    subprocess.run(["make", "-s", "-C", "datapath"], check=True)
    ns = inst = f"{a.prefix}tr"
    dev0, dev1 = f"{a.prefix}tr0", f"{a.prefix}tr1"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        for cmd in (
            ["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"],
            ["ip", "link", "add", dev0, "type", "veth", "peer", "name", dev1],
        ):
            subprocess.run(["ip", "netns", "exec", ns, *cmd], check=True)
        run(IOAM_TX, "attach", "--netns", ns, "--dev", dev0, "--instance", inst)
        run(IOAM_RX, "attach", "--netns", ns, "--dev", dev1, "--instance", inst, "--node-id", "9",
            "--ringbuf-size", str(64 << 20))  # fmt: skip
        run(
            IOAM_RX,
            "add-flow",
            "--instance",
            inst,
            "--sids",
            ",".join(POLICY),
            "--flow-id",
            "7",
            "--namespace-id",
            "123",
        )
        tx = TestRun(PIN_ROOT / inst / "ioam_tx" / "prog")
        rx = TestRun(PIN_ROOT / inst / "ioam_rx" / "prog")
        result = measure(inst, ns, tx, rx, a.rounds)
        # the programs took the paths measured (a benchmark of a program that passes everything is worthless)
        tx_stats, rx_stats = stats(IOAM_TX, inst), stats(IOAM_RX, inst)
        assert tx_stats["instrumented"] == a.rounds * 1011 and tx_stats["pass_not_sampled"] == a.rounds * 60_990
        assert tx_stats["pass_unmonitored"] >= a.rounds * 1000
        assert rx_stats["recorded"] == a.rounds * 50_000 and rx_stats["pass_no_hbh"] >= a.rounds * 50_000
    finally:
        run(IOAM_TX, "detach", "--netns", ns, "--dev", dev0, "--instance", inst, check=False)
        run(IOAM_RX, "detach", "--netns", ns, "--dev", dev1, "--instance", inst, check=False)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    if a.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:<34}{v:>10.1f}")
    if not a.no_doc:
        write_section("ioam_testrun_cost", report(result, a.rounds, started))
        print("updated docs/benchmarks.md")
    return 0


def report(r: dict[str, float], rounds: int, started: str) -> str:
    per_call_floor = r["tx_unmonitored_per_call_ns"]
    return f"""## In-line IOAM: per-packet cost of the programs, BPF_PROG_TEST_RUN (bench/ioam_testrun_cost.py)

{dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}; {started}. Best of {rounds} rounds; the kernel's
time per run. One flow (trace of {SLOTS} slots). An skb test run reruns the same skb and ioam_tx changes it, so
instrumenting is timed one call at a time (mean of 1000 calls, the test run's own timer included: compare with the
unmonitored packet, timed the same way); ioam_rx does not change the packet and is looped.

| program, packet | ns per packet | |
|---|---|---|
| ioam_tx, SRv6 packet of no flow (per call: the floor) | {per_call_floor:.0f} | |
| ioam_tx, N=1: every packet instrumented (per call) | {r["tx_n1_per_call_ns"]:.0f} | +{r["tx_n1_per_call_ns"] - per_call_floor:.0f} over the floor |
| ioam_tx, N=100: mean over 1000 packets of the flow (per call) | {r["tx_n100_per_call_ns"]:.0f} | +{r["tx_n100_per_call_ns"] - per_call_floor:.0f} over the floor |
| ioam_tx, a packet of the flow not sampled (looped) | {r["tx_not_sampled_looped_ns"]:.0f} | |
| ioam_rx, an instrumented packet, recorded (looped) | {r["rx_recorded_looped_ns"]:.0f} | |
| ioam_rx, a packet of the flow without IOAM (looped) | {r["rx_not_instrumented_looped_ns"]:.0f} | |

The programs took the paths timed (their stats are checked after the run). The shared 2-vCPU VM is noisy (±30 %).
"""  # noqa: E501 - markdown report


if __name__ == "__main__":
    sys.exit(main())
