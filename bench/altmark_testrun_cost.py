"""Per-packet cost of the alternate-marking programs (datapath/altmark_tx.bpf.c, altmark_rx.bpf.c)
measured by the kernel with BPF_PROG_TEST_RUN, with 1 monitored flow and with 10 000 more.

    sudo .local/venv/bin/python bench/altmark_testrun_cost.py [--prefix amcb] [--flows 10000] [--json]

Both programs are attached to a veth pair (down, no IPv6: nothing else runs through them) in a
throwaway netns <prefix>tr. Packets: the outer IPv6 + SRH [fc00:3::d6, fc00:2::e] + inner IPv6/UDP
(32 B payload) that A's seg6 encap writes. Numbers:
  tx dscp      repeat=100000 (kernel average over the loop), best of 5
  tx dscp/rfc9343 per call  repeat=1, mean of 1000 calls, best of 5 batches (an skb test run reruns
               the same skb, so rfc9343 cannot use repeat: from the 2nd run on the DOH is there);
               includes the per-call timer overhead, compare the two with each other
  rx dscp / rx rfc9343  repeat=100000, best of 5
The extra flows are written straight into altmark_flows (different SID lists, their own slots).
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "schemas" / "python")]
os.chdir(REPO)

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

FLOWMON = 0x4242


def measure(tx: TestRun, rx: TestRun) -> dict[str, float]:
    dscp = encapped(tclass=0)
    rfc = encapped(["fc00:2::e", "fc00:4::d6"])
    body = doh(FLOWMON, 1, False) + srh(POLICY) + inner_udp(b"x" * 32)
    rx_rfc = eth() + ipv6_hdr("fc00:12::1", "fc00:3::d6", 60, len(body)) + body

    def per_call(prog: TestRun, frame: bytes) -> float:
        return min(sum(prog.run(frame)[2] for _ in range(1000)) / 1000 for _ in range(5))

    def looped(prog: TestRun, frame: bytes) -> float:
        return float(min(prog.run(frame, repeat=100_000)[2] for _ in range(5)))

    return {
        "tx_dscp_repeat_ns": looped(tx, dscp),
        "tx_dscp_per_call_ns": per_call(tx, dscp),
        "tx_rfc9343_per_call_ns": per_call(tx, rfc),
        "rx_dscp_ns": looped(rx, encapped(tclass=4)),
        "rx_rfc9343_ns": looped(rx, rx_rfc),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix", default="amcb")
    ap.add_argument("--flows", type=int, default=10_000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
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
        run(TX, "attach", "--netns", ns, "--dev", dev0, "--instance", inst)
        run(RX, "attach", "--netns", ns, "--dev", dev1, "--instance", inst)
        run(
            TX,
            "add-flow",
            "--instance",
            inst,
            "--sids",
            ",".join(POLICY),
            "--flow-id",
            "7",
            "--method",
            "dscp",
            "--period-ms",
            "1000",
            "--dmark-every",
            "100",
        )
        run(
            TX,
            "add-flow",
            "--instance",
            inst,
            "--sids",
            "fc00:2::e,fc00:4::d6",
            "--flow-id",
            str(FLOWMON),
            "--method",
            "rfc9343",
            "--period-ms",
            "1000",
            "--dmark-every",
            "100",
        )
        run(
            RX,
            "add-flow",
            "--instance",
            inst,
            "--sids",
            ",".join(POLICY),
            "--flow-id",
            "7",
            "--method",
            "dscp",
            "--period-ms",
            "1000",
        )
        run(
            RX,
            "add-flow",
            "--instance",
            inst,
            "--flowmon-id",
            str(FLOWMON),
            "--method",
            "rfc9343",
            "--period-ms",
            "1000",
        )
        tx_dir, rx_dir = PIN_ROOT / inst / "altmark_tx", PIN_ROOT / inst / "altmark_rx"
        tx, rx = TestRun(tx_dir / "prog"), TestRun(rx_dir / "prog")
        result = {"one_flow": measure(tx, rx)}
        for maps in (Maps(tx_dir), Maps(rx_dir)):
            for i in range(a.flows):
                maps.put_flow(
                    sidlist_key(["fc00:2::e", f"fc00:66::{i:x}"]),
                    struct.pack("<IIQQBBBBI", 100_000 + i, 10 + i, 10**9, 0, METHOD_DSCP, 0, 1, 0, 0),
                )
        result[f"plus_{a.flows}_flows"] = measure(tx, rx)
    finally:
        run(TX, "detach", "--netns", ns, "--dev", dev0, "--instance", inst, check=False)
        run(RX, "detach", "--netns", ns, "--dev", dev1, "--instance", inst, check=False)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    if a.json:
        print(json.dumps(result))
    else:
        keys = list(result["one_flow"])
        print(f"{'ns/packet':<26}" + "".join(f"{k:>18}" for k in result))
        for k in keys:
            print(f"{k:<26}" + "".join(f"{result[c][k]:>18.1f}" for c in result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
