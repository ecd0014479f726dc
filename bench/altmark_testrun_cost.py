"""Per-packet cost of the alternate-marking programs (datapath/altmark_tx.bpf.c, altmark_rx.bpf.c)
measured by the kernel with BPF_PROG_TEST_RUN, with 1 monitored flow and with 10 000 more.

    sudo .local/venv/bin/python bench/altmark_testrun_cost.py [--prefix amcb] [--flows 10000]
                                                              [--baseline REV] [--json] [--no-doc]

altmark_rx is measured on the path users run: a test run of the XDP chain's dispatcher
(datapath/xdp_chain.h) with the device altmark_rx runs on as ingress device, alone on that device
(`rx_*`) and followed by a STAMP reflector, which passes the monitored packet on (`rx_dscp_refl`).
With --baseline REV the same programs as they were at commit REV (built from git beside these,
attached alone; their reflector behind altmark_rx the old way) run in the same rounds, before and
after interleaved: `rx_*_before`.

The programs run on veths (down for altmark_tx, up for the chain, no IPv6: nothing else runs
through them) in a throwaway netns <prefix>tr. Packets: the outer IPv6 + SRH [fc00:3::d6, fc00:2::e]
+ inner IPv6/UDP (32 B payload) that A's seg6 encap writes. Numbers:
  tx dscp      repeat=100000 (kernel average over the loop), best of 5
  tx dscp/rfc9343 per call  repeat=1, mean of 1000 calls, best of 5 batches (an skb test run reruns
               the same skb, so rfc9343 cannot use repeat: from the 2nd run on the DOH is there);
               includes the per-call timer overhead, compare the two with each other
  rx dscp / rx rfc9343 / rx dscp + reflector  repeat=100000, best of 5 (and median), interleaved
The extra flows are written straight into altmark_flows (different SID lists, their own slots).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import struct
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "schemas" / "python")]
os.chdir(REPO)

from bench.baseline import build_datapath  # noqa: E402
from bench.report import machine_line, write_section  # noqa: E402
from tests.datapath.altmark_env import (  # noqa: E402
    METHOD_DSCP,
    PIN_ROOT,
    POLICY,
    RX,
    TX,
    Maps,
    TestRun,
    doh,
    encapped,
    eth,
    inner_udp,
    ipv6_hdr,
    run,
    sidlist_key,
    srh,
)
from tests.datapath.chain_env import DispatcherRun  # noqa: E402

FLOWMON = 0x4242
REFLECTOR = REPO / "build" / "datapath" / "stamp_reflector"


def frames() -> dict[str, bytes]:
    body = doh(FLOWMON, 1, False) + srh(POLICY) + inner_udp(b"x" * 32)
    return {
        "dscp": encapped(tclass=4),
        "rfc9343": eth() + ipv6_hdr("fc00:12::1", "fc00:3::d6", 60, len(body)) + body,
        "tx_dscp": encapped(tclass=0),
        "tx_rfc9343": encapped(["fc00:2::e", "fc00:4::d6"]),
    }


def measure(tx: TestRun, rx: dict, rounds: int = 5) -> dict[str, float]:
    """tx: altmark_tx's test run; rx: name -> (run, frame) of the rx paths, interleaved per round."""
    f = frames()

    def per_call(prog: TestRun, frame: bytes) -> float:
        return min(sum(prog.run(frame)[2] for _ in range(1000)) / 1000 for _ in range(5))

    out = {
        "tx_dscp_repeat_ns": float(min(tx.run(f["tx_dscp"], repeat=100_000)[2] for _ in range(5))),
        "tx_dscp_per_call_ns": per_call(tx, f["tx_dscp"]),
        "tx_rfc9343_per_call_ns": per_call(tx, f["tx_rfc9343"]),
    }
    got: dict[str, list[int]] = {name: [] for name in rx}
    for _ in range(rounds):
        for name, (prog_run, frame) in rx.items():
            verdict, _out, ns = prog_run(frame, repeat=100_000)
            assert verdict == 2, f"{name}: verdict {verdict}, not XDP_PASS"  # counted and passed
            got[name].append(ns)
    for name, v in got.items():
        out[f"{name}_ns"] = float(min(v))
        out[f"{name}_median_ns"] = float(statistics.median(v))
    return out


def add_flows(tool: Path, inst: str, *, tx: bool) -> None:
    flows = [("--sids", ",".join(POLICY), "--flow-id", "7", "--method", "dscp")]
    flows.append(
        ("--sids", "fc00:2::e,fc00:4::d6", "--flow-id", str(FLOWMON), "--method", "rfc9343")
        if tx
        else ("--flowmon-id", str(FLOWMON), "--method", "rfc9343")
    )
    for args in flows:
        run(
            tool,
            "add-flow",
            "--instance",
            inst,
            *args,
            "--period-ms",
            "1000",
            *(["--dmark-every", "100"] if tx else []),
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix", default="amcb")
    ap.add_argument("--flows", type=int, default=10_000)
    ap.add_argument("--baseline", metavar="REV", help="also measure altmark_rx as it was at git commit REV")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-doc", action="store_true", help="do not update docs/benchmarks.md")
    a = ap.parse_args()
    subprocess.run(["make", "-s", "-C", "datapath"], check=True)
    old = build_datapath(a.baseline) if a.baseline else None
    ns = inst = f"{a.prefix}tr"
    before_inst, before_refl_inst = f"{a.prefix}trb", f"{a.prefix}trc"
    devs = {k: f"{a.prefix}{k}" for k in ("t0", "t1", "r0", "r1", "q0", "q1", "b0", "b1", "c0", "c1")}
    where = {k: ["--netns", ns, "--dev", d] for k, d in devs.items()}
    mach = machine_line()
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        cmds = [["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"]]
        for x in ("t", "r", "q", "b", "c"):
            cmds.append(["ip", "link", "add", devs[f"{x}0"], "type", "veth", "peer", "name", devs[f"{x}1"]])
        # the chain's devices are up: a test run with an ingress device needs its XDP queue registered
        cmds += [["ip", "link", "set", devs[k], "up"] for k in ("r0", "r1", "q0", "q1")]
        for cmd in cmds:
            subprocess.run(["ip", "netns", "exec", ns, *cmd], check=True)
        ifindex = {}
        for k in ("r0", "q0"):
            out = subprocess.run(
                ["ip", "netns", "exec", ns, "cat", f"/sys/class/net/{devs[k]}/ifindex"],
                capture_output=True,
                text=True,
                check=True,
            )
            ifindex[k] = int(out.stdout)
        run(TX, "attach", *where["t0"], "--instance", inst)
        run(RX, "attach", *where["r0"], "--instance", inst)  # r0: altmark_rx alone in its chain
        run(RX, "attach-dev", *where["q0"], "--instance", inst)  # q0: altmark_rx, then the reflector
        refl = PIN_ROOT / inst / "stamp_reflector"
        run(REFLECTOR, "attach", *where["q0"], "--pin-dir", str(refl))
        run(REFLECTOR, "add-address", "--pin-dir", str(refl), "fc00:3::1")  # the packets go elsewhere
        add_flows(TX, inst, tx=True)
        add_flows(RX, inst, tx=False)
        disp = DispatcherRun(ns, inst)
        f = frames()
        rx = {
            "rx_dscp": (functools.partial(disp.run, ifindex=ifindex["r0"]), f["dscp"]),
            "rx_rfc9343": (functools.partial(disp.run, ifindex=ifindex["r0"]), f["rfc9343"]),
            "rx_dscp_refl": (functools.partial(disp.run, ifindex=ifindex["q0"]), f["dscp"]),
        }
        maps = [Maps(PIN_ROOT / inst / "altmark_tx"), Maps(PIN_ROOT / inst / "altmark_rx")]
        if old:
            # before: altmark_rx alone on b0 (its own instance), and altmark_rx with the reflector
            # in its one chain slot on c0 (another instance), the pre-chain way
            run(old / "altmark_rx", "attach", *where["b0"], "--instance", before_inst)
            run(old / "altmark_rx", "attach", *where["c0"], "--instance", before_refl_inst)
            old_refl = PIN_ROOT / before_refl_inst / "stamp_reflector"
            run(old / "stamp_reflector", "attach", *where["c0"], "--pin-dir", str(old_refl), "--behind", "altmark_rx")
            run(old / "stamp_reflector", "add-address", "--pin-dir", str(old_refl), "fc00:3::1")
            for i in (before_inst, before_refl_inst):
                add_flows(old / "altmark_rx", i, tx=False)
                maps.append(Maps(PIN_ROOT / i / "altmark_rx"))
            alone = TestRun(PIN_ROOT / before_inst / "altmark_rx" / "prog").run
            chained = TestRun(PIN_ROOT / before_refl_inst / "altmark_rx" / "prog").run
            rx.update(
                {
                    "rx_dscp_before": (alone, f["dscp"]),
                    "rx_rfc9343_before": (alone, f["rfc9343"]),
                    "rx_dscp_refl_before": (chained, f["dscp"]),
                }
            )
        tx = TestRun(PIN_ROOT / inst / "altmark_tx" / "prog")
        result = {"one_flow": measure(tx, rx)}
        for m in maps:
            for i in range(a.flows):
                m.put_flow(
                    sidlist_key(["fc00:2::e", f"fc00:66::{i:x}"]),
                    struct.pack("<IIQQBBBBI", 100_000 + i, 10 + i, 10**9, 0, METHOD_DSCP, 0, 1, 0, 0),
                )
        result[f"plus_{a.flows}_flows"] = measure(tx, rx)
    finally:
        run(REFLECTOR, "detach", *where["q0"], "--pin-dir", str(PIN_ROOT / inst / "stamp_reflector"), check=False)
        run(RX, "detach", *where["r0"], "--instance", inst, check=False)
        run(TX, "detach", *where["t0"], "--instance", inst, check=False)
        if old:
            run(old / "stamp_reflector", "detach", *where["c0"], "--pin-dir",
                str(PIN_ROOT / before_refl_inst / "stamp_reflector"), check=False)  # fmt: skip
            for k, i in (("b0", before_inst), ("c0", before_refl_inst)):
                run(old / "altmark_rx", "detach", *where[k], "--instance", i, check=False)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    if a.json:
        print(json.dumps(result))
        return 0
    keys = list(result["one_flow"])
    table = f"| ns/packet | {' | '.join(result)} |\n|---|{'---|' * len(result)}\n" + "\n".join(
        f"| {k} | {' | '.join(f'{result[c][k]:.1f}' for c in result)} |" for k in keys
    )
    print(table)
    if old:
        for c in result:
            r = result[c]
            print(
                f"{c}: the chain adds {r['rx_dscp_ns'] - r['rx_dscp_before_ns']:+.1f} ns (dscp), "
                f"{r['rx_rfc9343_ns'] - r['rx_rfc9343_before_ns']:+.1f} ns (rfc9343), "
                f"{r['rx_dscp_refl_ns'] - r['rx_dscp_refl_before_ns']:+.1f} ns (altmark_rx then the reflector)"
            )
    if not a.no_doc:
        one, more = result["one_flow"], result[f"plus_{a.flows}_flows"]
        paths = ("rx_dscp", "rx_rfc9343", "rx_dscp_refl")
        before = (
            f"\nBefore and after (`--baseline {a.baseline}`, the programs of that commit attached alone, its "
            f"reflector in altmark_rx's one chain slot, measured in the same rounds): altmark_rx dscp "
            f"{one['rx_dscp_before_ns']:.0f} → {one['rx_dscp_ns']:.0f} ns, rfc9343 {one['rx_rfc9343_before_ns']:.0f} → "
            f"{one['rx_rfc9343_ns']:.0f} ns, altmark_rx then the reflector {one['rx_dscp_refl_before_ns']:.0f} → "
            f"{one['rx_dscp_refl_ns']:.0f} ns (best of 5; with {a.flows} more flows: "
            + ", ".join(f"{more[k + '_before_ns']:.0f} → {more[k + '_ns']:.0f}" for k in paths)
            + " ns).\n"
            if old
            else ""
        )
        write_section(
            "altmark_testrun_cost",
            f"""## Alternate marking: per-packet cost in the kernel (bench/altmark_testrun_cost.py)

{mach}. BPF_PROG_TEST_RUN of the real programs, kernel-measured ns per packet (`_median` the median of
the 5 interleaved rounds, else the best). altmark_rx (`rx_*`) through the XDP chain's dispatcher with its device
as ingress device, the path a packet takes: alone on its device, and `rx_dscp_refl` followed by a STAMP reflector
(which passes the monitored packet on). altmark_tx is a TC program, outside the chain.

{table}
{before}""",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
