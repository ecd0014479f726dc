#!/usr/bin/env python3
"""Cost of alternate marking on the SRv6 path, PDR@0.5 % (seed 001: TC −13.9 %, XDP −5.4 %).

PDR@0.5 % with the PASTRAMI saturation check (seed 003), via bench/pdr.py, on netlab's line5:
H1 (generator) -> A (H.Encaps: the ingress edge) -> R (End) -> B (End.DT6: the egress edge) -> H2,
in one run and one lab, for:
  - base      no alternate-marking program (the kernel's SRv6 encap + decap path alone)
  - tx        the TC colourer `altmark_tx` on A's a0 egress (the ingress edge's egress device)
  - tx+rx     the colourer and the XDP counter `altmark_rx` on B's b0 (the egress edge's ingress device)
each with N = 1, 100 and 10 000 monitored flows installed (every program instance has its own maps).
Encap cost = PDR(tx, N) / PDR(base); decap cost = PDR(tx+rx, N) / PDR(tx, N): the counter is measured
on coloured traffic, as in production (with the rfc9343 method it only sees the flow through the
colourer's Destination Options header).

Traffic: 44-byte UDP data from H1 round-robin over K = min(N, 8) destinations fd00:b::100.. ; each
destination has its own SRv6 policy at A (segs fc00:2::e,fc00:3::d6<i>, an End.DT6 SID per policy at B),
so the traffic is spread over K monitored flows (with N = 1, all of it is the one flow). The other
N − K installed flows are SID lists the traffic never carries: they only fill the maps. The baseline is
measured with K = 1 and K = 8 destinations, so every ratio compares the same traffic.
The monitored packets are really coloured and counted: after the run, for each configuration, the
programs' own stats (coloured_* at A, counted_* at B) must have grown by at least the data packets
delivered during its trials and at most those sent, and every one of the K flows' per-flow counters
must have grown. Otherwise the script fails (a benchmark of a program that passes everything
unmonitored is worthless).

Method (bench/pdr.py): trials of constant rate, loss = sent − delivered (XDP counters at H2), PDR =
highest passing rate of a bounded binary search; configurations interleaved (every repetition visits
all of them, in a rotated order) so slow changes of the shared machine's load hit every configuration
alike; CI95 with Student's t; PASTRAMI sweep per configuration around its median PDR.

    sudo .local/venv/bin/python bench/altmark_overhead.py [--quick] [--reps 3] [--seconds 1] [--steps 9]
         [--flows 1,100,10000] [--method dscp|rfc9343] [--no-doc] [--json-out FILE] [--baseline-only]

Full run ~6 min, --quick ~2 min (this 2-vCPU VM). Needs `make -C datapath` and `make -C bench`. Own resources: netns
ambench-*, pins /sys/fs/bpf/segscope/ambench-*.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as dt
import ipaddress
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.pdr import (  # noqa: E402
    PLR_LIMIT,
    SWEEP_FACTORS,
    TIR_THRESHOLD,
    Line5Bench,
    PathSpec,
    Trial,
    ci95,
    find_pdr,
    pastrami_check,
    sh,
    sweep,
    sweep_points,
)
from bench.report import machine, write_section  # noqa: E402
from bench.stamp_forwarding_capacity import cpu_ticks, steal_share  # noqa: E402
from segscope_schemas.names import BPFFS_PIN_ROOT

SECTION = "altmark_overhead"
TX_LOADER = REPO / "build" / "datapath" / "altmark_tx"
RX_LOADER = REPO / "build" / "datapath" / "altmark_rx"
PIN_ROOT = Path(BPFFS_PIN_ROOT)

SPREAD = 8  # destinations / policies the traffic is spread over
FIRST_DST = "fd00:b::100"  # destination i = FIRST_DST + i (pktgen_udp --data-dsts)
TX_NODE, TX_DEV = "A", "a0"  # ingress edge, its egress device toward the core
RX_NODE, RX_DEV = "B", "b0"  # egress edge, its ingress device from the core
GOAL_TX_RATIO = 0.95  # the colourer costs <= 5 % of the PDR
GOAL_RX_RATIO = 0.98  # the counter costs <= 2 %
SEED001 = {"tx": 0.139, "rx": 0.054}  # seed 001's measured throughput losses
PERIOD_MS = 1000  # colour period: every trial spans colour changes
DEFAULT_RANGE = (15_000.0, 400_000.0)  # pps: from a loaded machine's PDR to past the generator's limit
CAL_LO, CAL_HI = 0.25, 2.5  # calibrated search range, x the baseline's first PDR (wide: the
# PDR of one configuration varies by tens of % within minutes here)


# ---------------------------------------------------------------- flows and policies


def policy_sid(i: int) -> str:
    """End.DT6 SID at B of policy i (one per traffic destination)."""
    return f"fc00:3::d6{i:02x}"


def flow_sids(i: int) -> list[str]:
    """SID list (travel order) of monitored flow i: the first SPREAD are the policies the traffic
    uses; the others are SID lists no packet carries (they only fill the maps)."""
    return ["fc00:2::e", policy_sid(i) if i < SPREAD else f"fc00:3::f:{i:x}"]


def flow_id(i: int) -> int:
    return i + 1  # FlowMonID 1..N (rfc9343 allows up to 0xFFFFF)


def dst(i: int) -> str:
    return str(ipaddress.IPv6Address(FIRST_DST) + i)


def add_policies(bench: Line5Bench) -> None:
    """SPREAD SRv6 policies at A (one /128 per destination, each its own SID list), their End.DT6
    SIDs at B, and static neighbours at B for the destinations (H2 counts and drops whatever arrives)."""
    lab = bench.lab
    h2_mac = lab.mac(bench.spec.receiver, bench.spec.receiver_dev)
    a_cmds = [
        f"route add {dst(i)}/128 encap seg6 mode encap segs {','.join(flow_sids(i))} dev {TX_DEV}"
        for i in range(SPREAD)
    ]
    b_cmds = [
        f"route add {policy_sid(i)}/128 encap seg6local action End.DT6 table 254 dev {RX_DEV}" for i in range(SPREAD)
    ]
    b_cmds += [f"neigh replace {dst(i)} lladdr {h2_mac} dev bh nud permanent" for i in range(SPREAD)]
    for node, cmds in ((TX_NODE, a_cmds), (RX_NODE, b_cmds)):
        lab.run(node, ["ip", "-6", "-batch", "-"], input="\n".join(cmds) + "\n", check=True)


# ---------------------------------------------------------------- pinned maps (libbpf via ctypes)


class _Libbpf:
    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
        self.lib.bpf_obj_get.argtypes = [ctypes.c_char_p]
        self.lib.bpf_map_update_elem.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64]

    def open(self, path: Path) -> int:
        fd = self.lib.bpf_obj_get(str(path).encode())
        if fd < 0:
            raise OSError(ctypes.get_errno(), f"bpf_obj_get({path})")
        return fd

    def update(self, fd: int, key: bytes, value: bytes) -> None:
        k, v = ctypes.create_string_buffer(key, len(key)), ctypes.create_string_buffer(value, len(value))
        if self.lib.bpf_map_update_elem(fd, k, v, 0):
            raise OSError(ctypes.get_errno(), "bpf_map_update_elem")


_LIBBPF: _Libbpf | None = None


def libbpf() -> _Libbpf:
    global _LIBBPF
    if _LIBBPF is None:
        _LIBBPF = _Libbpf()
    return _LIBBPF


def sidlist_key(sids_travel: list[str]) -> bytes:
    """struct altmark_sidlist_key (datapath/altmark.h): nsids, pad, sids in SRH wire order."""
    wire = [ipaddress.IPv6Address(s).packed for s in reversed(sids_travel)]
    return struct.pack("<II", len(wire), 0) + b"".join(wire) + bytes(16 * (6 - len(wire)))


def flow_value(fid: int, slot: int, method: int, installed_tai_ns: int) -> bytes:
    """struct altmark_flow: flow_id, slot, period_ns, installed_tai_ns, method, L bit, D bit, pad,
    dmark_every (0: no double marking)."""
    return struct.pack("<IIQQBBBBI", fid, slot, PERIOD_MS * 1_000_000, installed_tai_ns, method, 0, 1, 0, 0)


METHOD_CODE = {"dscp": 1, "rfc9343": 2}  # ALTMARK_METHOD_* (schemas/c/altmark_block.h)


# ---------------------------------------------------------------- one loaded program instance


@dataclass
class ProgramSet:
    """One altmark_tx or altmark_rx instance with its own pinned maps and N flows installed, loaded
    once; the benchmark attaches and detaches its pinned program between configurations."""

    kind: str  # tx | rx
    nflows: int
    method: str
    bench: Line5Bench
    attached: bool = False
    loader_flows: int = 0  # installed through the loader's add-flow (the rest: bulk map writes)

    @property
    def loader(self) -> Path:
        return TX_LOADER if self.kind == "tx" else RX_LOADER

    @property
    def node(self) -> str:
        return TX_NODE if self.kind == "tx" else RX_NODE

    @property
    def dev(self) -> str:
        return TX_DEV if self.kind == "tx" else RX_DEV

    @property
    def instance(self) -> str:
        return f"{self.bench.prefix}-{self.node}-n{self.nflows}"

    @property
    def pin_dir(self) -> Path:
        return PIN_ROOT / self.instance / f"altmark_{self.kind}"

    def _loader(self, *args: str) -> subprocess.CompletedProcess:
        # The loader may be being rebuilt by `make` in the shared tree (exec then fails for a moment).
        for attempt in range(10):
            try:
                return sh([str(self.loader), *args])
            except OSError:
                if attempt == 9:
                    raise
                time.sleep(0.5)
        raise AssertionError("unreachable")

    def load(self) -> None:
        """Load and pin through the loader, install the flows, then take the program off the device
        (its pins stay): configurations switch by attaching the pinned program (see attach)."""
        shutil.rmtree(self.pin_dir, ignore_errors=True)
        ns = self.bench.lab.ns(self.node)
        self._loader("attach", "--netns", ns, "--dev", self.dev, "--instance", self.instance)
        self.attached = True
        # The traffic's flows through the official path (loader add-flow: slot allocation, zeroed
        # counters, installed_tai_ns) ...
        real = min(self.nflows, SPREAD)
        for i in range(real):
            self._loader(*self._add_flow_args(i))
        self.loader_flows = real
        # ... and the filler flows (never matched) written straight into the hash map: 10 000 loader
        # runs would take minutes. Slots after the loader's (it allocates the lowest free ones).
        if self.nflows > real:
            self._bulk_fill(real)
        self.detach()

    def _add_flow_args(self, i: int) -> list[str]:
        args = [
            "add-flow",
            "--instance",
            self.instance,
            "--flow-id",
            str(flow_id(i)),
            "--method",
            self.method,
            "--period-ms",
            str(PERIOD_MS),
        ]
        if self.kind == "rx" and self.method == "rfc9343":
            return args + ["--flowmon-id", str(flow_id(i))]
        return args + ["--sids", ",".join(flow_sids(i))]

    def _bulk_fill(self, first: int) -> None:
        lb = libbpf()
        tai = time.clock_gettime_ns(time.CLOCK_TAI)
        code = METHOD_CODE[self.method]
        by_flowmon = self.kind == "rx" and self.method == "rfc9343"
        fd = lb.open(self.pin_dir / ("altmark_flowmon" if by_flowmon else "altmark_flows"))
        try:
            for i in range(first, self.nflows):
                key = struct.pack("<I", flow_id(i)) if by_flowmon else sidlist_key(flow_sids(i))
                lb.update(fd, key, flow_value(flow_id(i), i, code, tai))
        finally:
            os.close(fd)

    # -- attach / detach the pinned program with iproute2 (the loader's detach also unpins)
    def attach(self) -> None:
        if self.attached:
            return
        # nsenter, not `ip netns exec`: that remounts /sys, hiding the bpffs pins from tc and ip
        enter = ["nsenter", f"--net=/run/netns/{self.bench.lab.ns(self.node)}"]
        prog = str(self.pin_dir / "prog")
        if self.kind == "tx":
            sh(enter + ["tc", "qdisc", "replace", "dev", self.dev, "clsact"])
            sh(
                enter
                + [
                    "tc",
                    "filter",
                    "replace",
                    "dev",
                    self.dev,
                    "egress",
                    "pref",
                    "1",
                    "handle",
                    "1",
                    "bpf",
                    "da",
                    "object-pinned",
                    prog,
                ]
            )
        else:
            sh(enter + ["ip", "link", "set", "dev", self.dev, "xdpdrv", "pinned", prog])
        self.attached = True

    def detach(self) -> None:
        """Off the device entirely: no clsact qdisc (TC) / no XDP program, as in the baseline."""
        lab = self.bench.lab
        if self.kind == "tx":
            lab.run(self.node, ["tc", "qdisc", "del", "dev", self.dev, "clsact"])
        else:
            lab.run(self.node, ["ip", "link", "set", "dev", self.dev, "xdp", "off"])
        self.attached = False

    def unload(self) -> None:
        if self.attached and self.bench.lab is not None:
            self.detach()
        shutil.rmtree(self.pin_dir.parent, ignore_errors=True)

    # -- what the program did
    def stats(self) -> dict[str, int]:
        return json.loads(self._loader("stats", "--instance", self.instance, "--json").stdout)

    def marked(self, stats: dict[str, int]) -> int:
        """Packets the program coloured (tx) or counted (rx) as monitored."""
        prefix = "coloured_" if self.kind == "tx" else "counted_"
        return sum(v for k, v in stats.items() if k.startswith(prefix))

    def flow_packets(self) -> list[int]:
        """Packets (both colours, all CPUs: the loader's list-flows) of the flows the traffic uses."""
        flows = {f["flow_id"]: f for f in self.list_flows()}
        if len(flows) != self.nflows:
            raise RuntimeError(f"{self.instance}: {len(flows)} flows installed, expected {self.nflows}")
        return [sum(c["packets"] for c in flows[flow_id(i)]["counters"]) for i in range(min(self.nflows, SPREAD))]

    def test_run_ns(self, frame: bytes, repeat: int, workdir: Path) -> tuple[float, bytes]:
        """BPF_PROG_TEST_RUN of the pinned program on `frame` (`repeat` runs on the same packet):
        mean ns per run as the kernel times it, and the packet as the program left it."""
        src, out = workdir / "in.bin", workdir / f"out-{self.kind}.bin"
        src.write_bytes(frame)
        res = json.loads(
            sh(
                [
                    "bpftool",
                    "-j",
                    "prog",
                    "run",
                    "pinned",
                    str(self.pin_dir / "prog"),
                    "data_in",
                    str(src),
                    "data_out",
                    str(out),
                    "repeat",
                    str(repeat),
                ]
            ).stdout
        )
        return float(res["duration"]), out.read_bytes()

    def list_flows(self) -> list[dict]:
        return json.loads(self._loader("list-flows", "--instance", self.instance, "--json").stdout)["flows"]


def encapsulated_frame(i: int = 0) -> bytes:
    """The frame A's a0 egress sees for traffic destination i: Ethernet | IPv6 (to the first SID) | SRH
    (segments left 1) | IPv6 | UDP | 44-byte payload, as `encap seg6 mode encap` builds it."""

    def a(x: str) -> bytes:
        return ipaddress.IPv6Address(x).packed

    udp = struct.pack("!HHHH", 40000, 9, 8 + 44, 0) + bytes(44)
    inner = struct.pack("!IHBB", 6 << 28, len(udp), 17, 64) + a("fd00:a::1") + a(dst(i)) + udp
    segs = [a(s) for s in reversed(flow_sids(i))]
    srh = struct.pack("!BBBBBBH", 41, 2 * len(segs), 4, len(segs) - 1, len(segs) - 1, 0, 0) + b"".join(segs)
    outer = struct.pack("!IHBB", 6 << 28, len(srh) + len(inner), 43, 64) + a("fc00:12::1") + a(flow_sids(i)[0])
    return bytes.fromhex("020000000002020000000001") + b"\x86\xdd" + outer + srh + inner


def program_costs(programs: list[ProgramSet], prefix: str, rounds: int = 5, repeat: int = 200_000) -> dict[str, float]:
    """Median ns per packet of each program instance on a packet of monitored flow 0 (BPF_PROG_TEST_RUN,
    rounds interleaved over the instances). The colourer's output packet feeds the counter, so the
    counter sees a coloured packet. rfc9343: the colourer's repeated runs on one packet would find
    it already marked after the first, so only the counter's cost is measured."""
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix=f"{prefix}-cost-") as tmp:
        work = Path(tmp)
        for _ in range(rounds):
            for n in sorted({p.nflows for p in programs}):
                tx = next(p for p in programs if p.kind == "tx" and p.nflows == n)
                rx = next((p for p in programs if p.kind == "rx" and p.nflows == n), None)
                ns, marked = tx.test_run_ns(encapsulated_frame(0), 1 if tx.method == "rfc9343" else repeat, work)
                if tx.method != "rfc9343":
                    samples.setdefault(tx.instance + "/tx", []).append(ns)
                if rx is not None:
                    samples.setdefault(rx.instance + "/rx", []).append(rx.test_run_ns(marked, repeat, work)[0])
    return {k: statistics.median(v) for k, v in samples.items()}


# ---------------------------------------------------------------- configurations


@dataclass
class Config:
    name: str
    dsts: int
    tx: ProgramSet | None = None
    rx: ProgramSet | None = None
    searches: list = field(default_factory=list)
    sweep: list[Trial] = field(default_factory=list)
    data_sent: int = 0
    data_received: int = 0
    marked: dict[str, int] = field(default_factory=dict)  # tx/rx -> packets coloured/counted
    flow_packets: dict[str, list[int]] = field(default_factory=dict)

    @property
    def programs(self) -> list[ProgramSet]:
        return [p for p in (self.tx, self.rx) if p is not None]


def build_configs(bench: Line5Bench, flows: list[int], method: str, baseline_only: bool) -> list[Config]:
    configs = [Config("base K=1", 1)]
    if any(n > 1 for n in flows):
        configs.append(Config(f"base K={SPREAD}", SPREAD))
    if baseline_only:
        return configs
    for n in flows:
        tx, rx = ProgramSet("tx", n, method, bench), ProgramSet("rx", n, method, bench)
        configs += [Config(f"tx N={n}", min(n, SPREAD), tx=tx), Config(f"tx+rx N={n}", min(n, SPREAD), tx=tx, rx=rx)]
    return configs


WARMUP_S = 0.3


def switch_to(cfg: Config, all_programs: list[ProgramSet], bench: Line5Bench, warmup_pps: float = 0) -> None:
    """Attach cfg's programs (and only those), then, if warmup_pps, one discarded short trial: the first
    packets after an attach pay for it (qdisc creation, veth switching to NAPI for XDP, cold caches),
    which would otherwise land in the first trial of the configuration's search."""
    for p in all_programs:
        if p.attached and p not in cfg.programs:
            p.detach()
    for p in cfg.programs:
        p.attach()
    bench.spec.data_dsts = cfg.dsts
    if warmup_pps:
        bench.trial(warmup_pps, share=0.0, seconds=WARMUP_S)


def run_block(cfg: Config, bench: Line5Bench, fn) -> None:
    """Run fn() (trials) in cfg, adding the programs' coloured/counted deltas and the trials' data
    packets to cfg's tallies, for the check that monitored traffic really was monitored."""
    before = {p.kind: p.marked(p.stats()) for p in cfg.programs}
    trials: list[Trial] = fn()
    for p in cfg.programs:
        cfg.marked[p.kind] = cfg.marked.get(p.kind, 0) + p.marked(p.stats()) - before[p.kind]
    cfg.data_sent += sum(t.data_sent for t in trials)
    cfg.data_received += sum(t.data_received for t in trials)


def check_monitored(cfg: Config) -> list[str]:
    """Problems if the programs did not colour/count the monitored traffic (empty = fine)."""
    problems = []
    for p in cfg.programs:
        got = cfg.marked.get(p.kind, 0)
        # Delivered packets all crossed both programs; strays (ND, MLD) carry no SRH and are not marked.
        if not cfg.data_received <= got <= cfg.data_sent:
            problems.append(
                f"{cfg.name}: {p.kind} marked {got} packets, expected between {cfg.data_received} "
                f"delivered and {cfg.data_sent} sent"
            )
        per_flow = cfg.flow_packets.get(p.kind, [])
        if len(per_flow) != cfg.dsts or min(per_flow, default=0) == 0:
            problems.append(
                f"{cfg.name}: {p.kind} per-flow packets {per_flow}: not every one of the "
                f"{cfg.dsts} traffic flows was counted"
            )
    return problems


# ---------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix", default="ambench")
    ap.add_argument(
        "--quick", action="store_true", help="smoke run: 2 repetitions, 0.5 s trials, 5-step searches, 1 and 100 flows"
    )
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=9, help="trials per binary search")
    ap.add_argument("--lo", type=float, help=f"search range, default {DEFAULT_RANGE[0]:g}-{DEFAULT_RANGE[1]:g} pps")
    ap.add_argument("--hi", type=float)
    ap.add_argument(
        "--calibrate",
        metavar="LO,HI",
        help="instead of a fixed range: a 7-trial search of the baseline in LO-HI sets the searches' "
        f"range to {CAL_LO:g}-{CAL_HI:g} x its PDR (finer steps, but a calibration in a loss burst "
        "or a quiet spell misplaces the whole run: the machine's PDR moves by 2x within minutes)",
    )
    ap.add_argument("--flows", help="monitored flows installed, comma-separated (default 1,100,10000; --quick: 1,100)")
    ap.add_argument("--method", choices=tuple(METHOD_CODE), default="dscp")
    ap.add_argument("--sweep-reps", type=int, default=1, help="passes over each PASTRAMI sweep (averaged per load)")
    ap.add_argument("--baseline-only", action="store_true", help="no programs: the harness on the bare path")
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--json-out", help="write every trial and the summary as JSON here")
    args = ap.parse_args()
    if (args.lo is None) != (args.hi is None):
        sys.exit("--lo and --hi go together")
    if args.lo is None and not args.calibrate:
        args.lo, args.hi = DEFAULT_RANGE
    if args.quick:
        args.reps, args.seconds, args.steps = 2, 0.5, 7
        args.flows = args.flows or "1,100"
    args.flows = args.flows or "1,100,10000"
    flows = [int(x) for x in args.flows.split(",")]
    if args.reps < 2:
        sys.exit("--reps must be >= 2 for a confidence interval")
    if any(not 1 <= n <= 65536 for n in flows):
        sys.exit("--flows: each between 1 and 65536 (ALTMARK_MAX_FLOWS)")
    if not args.baseline_only:
        for f in (TX_LOADER, RX_LOADER):
            if not f.exists():
                sys.exit(f"missing {f.relative_to(REPO)}: run `make -C datapath` (or --baseline-only)")

    log = lambda s: print(s, flush=True)  # noqa: E731
    started = time.monotonic()
    ticks0, args.load_monitor = cpu_ticks(), LoadMonitor()
    with Line5Bench(args.prefix, "none", PathSpec(data_dst=FIRST_DST)) as bench:
        add_policies(bench)
        configs = build_configs(bench, flows, args.method, args.baseline_only)
        programs = list({id(p): p for c in configs for p in c.programs}.values())
        try:
            problems = run(args, configs, programs, bench, log)
        finally:
            for p in programs:
                p.unload()
    steal = steal_share(ticks0, cpu_ticks())
    elapsed = time.monotonic() - started
    args.others = args.load_monitor.busiest()
    text = report(args, flows, configs, problems, steal, elapsed)
    print()
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(
            json.dumps(summary(configs, problems, steal, elapsed, getattr(args, "costs", {})), indent=1)
        )
    if not args.no_doc:
        write_section(SECTION if args.method == "dscp" else f"{SECTION}_{args.method}", text)
        print("updated docs/benchmarks.md")
    if problems:
        print("FAILED: monitored traffic was not marked/counted:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    return 0


def run(args, configs: list[Config], programs: list[ProgramSet], bench: Line5Bench, log) -> list[str]:
    """Load the program instances, run the interleaved searches and the sweeps; returns the
    monitoring problems (empty if every configuration's traffic was coloured/counted)."""
    for p in programs:
        t0 = time.monotonic()
        p.load()
        log(
            f"loaded {p.kind} instance {p.instance}: {p.nflows} flows ({p.loader_flows} via add-flow) "
            f"in {time.monotonic() - t0:.1f} s"
        )
    bench._settle()

    def trial(rate: float) -> Trial:
        return bench.trial(rate, share=0.0, seconds=args.seconds)

    if args.lo is None:
        switch_to(configs[0], programs, bench)
        lo, hi = (float(x) for x in args.calibrate.split(","))
        log(f"calibration: {configs[0].name} in [{lo:,.0f}, {hi:,.0f}] pps")
        cal = find_pdr(trial, lo, hi, 7, log=log)
        if cal.pdr_pps <= 0:
            raise RuntimeError(f"calibration: even {lo:,.0f} pps lost more than 0.5 % (machine overloaded?)")
        args.lo, args.hi = CAL_LO * cal.pdr_pps, CAL_HI * cal.pdr_pps
        args.calibrated_pdr = cal.pdr_pps
        log(f"calibration: PDR {cal.pdr_pps:,.0f} pps -> searches in [{args.lo:,.0f}, {args.hi:,.0f}] pps")

    for rep in range(args.reps):
        order = configs[rep % len(configs) :] + configs[: rep % len(configs)]
        for cfg in order:
            switch_to(cfg, programs, bench, warmup_pps=args.lo)
            args.load_monitor.sample()
            log(f"rep {rep + 1}/{args.reps} {cfg.name}")
            run_block(cfg, bench, lambda c=cfg: _search(c, trial, args, log))
    for cfg in configs:
        switch_to(cfg, programs, bench, warmup_pps=args.lo)
        args.load_monitor.sample()
        # around the median: one search whose low end failed in a loss burst (PDR 0) would drag the
        # mean, and the sweep, far below the configuration's saturation
        centre = statistics.median([s.pdr_pps for s in cfg.searches])
        log(f"PASTRAMI sweep {cfg.name} around {centre:,.0f} pps")
        run_block(cfg, bench, lambda c=cfg, m=centre: _sweep(c, trial, max(m, args.lo), args.sweep_reps))
    # per-flow counters are cumulative per instance: read once, at the end
    for cfg in configs:
        for p in cfg.programs:
            cfg.flow_packets[p.kind] = p.flow_packets()
    for p in programs:
        if p.attached:
            p.detach()
    # after the per-flow counters were read: test runs count too
    args.costs = program_costs(programs, args.prefix) if programs else {}
    return [msg for c in configs for msg in check_monitored(c)]


def _search(cfg: Config, trial, args, log) -> list[Trial]:
    res = find_pdr(trial, args.lo, args.hi, args.steps, log=log)
    cfg.searches.append(res)
    return res.trials


def _sweep(cfg: Config, trial, center: float, reps: int) -> list[Trial]:
    cfg.sweep = sweep(trial, center, reps=reps)
    return cfg.sweep


# ---------------------------------------------------------------- the machine's other load


def process_cpu_ticks() -> dict[int, tuple[str, int]]:
    """pid -> (command name, utime + stime in clock ticks) of every process now."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(d.name)] = (name, int(fields[11]) + int(fields[12]))
    return out


class LoadMonitor:
    """CPU time other processes used during the run, sampled at every configuration switch (a process
    that exits between two samples loses only its time since the last one). Ours are left out: the
    generator, this script and its helpers; kernel softirq threads stay in (they carry the DUT's work too)."""

    OWN = frozenset({"pktgen_udp", "python3", "python", "bpftool", "ip", "tc", "nsenter", "altmark_tx", "altmark_rx"})

    def __init__(self) -> None:
        self.last = process_cpu_ticks()
        self.used: dict[str, float] = {}
        self.started = time.monotonic()

    def sample(self) -> None:
        now, hz = process_cpu_ticks(), os.sysconf("SC_CLK_TCK")
        for pid, (name, ticks) in now.items():
            if name not in self.OWN and pid in self.last and self.last[pid][0] == name:
                self.used[name] = self.used.get(name, 0.0) + (ticks - self.last[pid][1]) / hz
        self.last = now

    def busiest(self) -> str:
        self.sample()
        seconds = time.monotonic() - self.started
        top = sorted(((v, k) for k, v in self.used.items() if v / seconds >= 0.05), reverse=True)[:4]
        return ", ".join(f"{k} {v / seconds * 100:.0f} % of a CPU" for v, k in top) or "none above 5 % of a CPU"


# ---------------------------------------------------------------- report


def ratio(a: Config, b: Config) -> tuple[float, float, float]:
    """Point estimate and the loose bounds from the two CI95 (a.low / b.high, a.high / b.low)."""
    ca, cb = ci95([s.pdr_pps for s in a.searches]), ci95([s.pdr_pps for s in b.searches])
    if not cb.mean:
        return float("nan"), float("nan"), float("nan")
    lo = ca.low / cb.high if cb.high > 0 else float("nan")
    hi = ca.high / cb.low if cb.low > 0 else float("inf")
    return ca.mean / cb.mean, lo, hi


def median_ratio(a: Config, b: Config) -> float:
    mb = statistics.median([s.pdr_pps for s in b.searches])
    return statistics.median([s.pdr_pps for s in a.searches]) / mb if mb else float("nan")


def paired_ratios(a: Config, b: Config) -> list[float]:
    """Per-repetition ratios (the two searches of a repetition ran minutes apart at most)."""
    return [x.pdr_pps / y.pdr_pps for x, y in zip(a.searches, b.searches) if y.pdr_pps]


def comparisons(configs: list[Config], flows: list[int]) -> list[tuple[str, str, Config, Config, float]]:
    by = {c.name: c for c in configs}
    out = []
    for n in flows:
        base = by[f"base K={min(n, SPREAD)}"]
        if f"tx N={n}" in by:
            out.append(("TC colourer (encap path)", f"N={n}", by[f"tx N={n}"], base, GOAL_TX_RATIO))
            out.append(("XDP counter (decap path)", f"N={n}", by[f"tx+rx N={n}"], by[f"tx N={n}"], GOAL_RX_RATIO))
    return out


def report(args, flows, configs: list[Config], problems: list[str], steal: float, elapsed: float) -> str:
    m = machine()
    load = Path("/proc/loadavg").read_text().split()[:3]
    rows = []
    for c in configs:
        pdrs = [s.pdr_pps for s in c.searches]
        ci, chk = ci95(pdrs), pastrami_check(sweep_points(c.sweep))
        tirs = ", ".join(f"{t:.2f}" for t in chk.tirs) or "–"
        bounds = any(s.at_upper_bound or s.below_lower_bound for s in c.searches)
        marked = ", ".join(f"{k} {v:,}" for k, v in c.marked.items()) or "–"
        rows.append(
            f"| {c.name} | {', '.join(f'{p / 1e3:.1f}' for p in pdrs)} | **{ci.mean / 1e3:.1f}** | "
            f"±{ci.half_width / 1e3:.1f} | {statistics.median(pdrs) / 1e3:.1f} | {chk.verdict} | "
            f"{chk.max_plr_below * 100:.2f} % | {tirs} | "
            f"{c.data_sent:,} / {c.data_received:,} | {marked} |{' search hit a bound' if bounds else ''}"
        )
    sweep_rows = [
        f"| {c.name} | " + ", ".join(f"{o / 1e3:.1f}→{(1 - t / o) * 100:.2f}%" for o, t in sweep_points(c.sweep)) + " |"
        for c in configs
    ]
    cmp_rows = []
    for what, n, a, b, goal in comparisons(configs, flows):
        r, lo, hi = ratio(a, b)
        paired = paired_ratios(a, b)
        pci = ci95(paired) if len(paired) >= 2 else None
        verdict = "met" if r >= goal else "NOT met"
        hit_bound = any(x.at_upper_bound or x.below_lower_bound for c in (a, b) for x in c.searches)
        conclusive = (pci is not None and (pci.low >= goal or pci.high < goal)) and not hit_bound
        cmp_rows.append(
            f"| {what} | {n} | {a.name} / {b.name} | **{r:.3f}** ({(1 - r) * 100:+.1f} % cost) | "
            f"{lo:.3f}–{hi:.3f} | {median_ratio(a, b):.3f} | {', '.join(f'{x:.3f}' for x in paired)} | "
            + (f"{pci.mean:.3f} ± {pci.half_width:.3f}" if pci else "–")
            + f" | ≥ {goal} | {verdict}{'' if conclusive else ' (not conclusive)'} |"
        )
    costs = getattr(args, "costs", {}) or {}
    base_pdr = statistics.median([s.pdr_pps for s in configs[0].searches])
    cost_rows = []
    for key, ns in costs.items():
        instance, kind = key.rsplit("/", 1)
        n = instance.rsplit("-n", 1)[1]
        cost_rows.append(
            f"| {'altmark_tx (TC)' if kind == 'tx' else 'altmark_rx (XDP)'} | {n} | {ns:.0f} | "
            f"{ns * base_pdr / 1e9 * 100:.1f} % |"
        )
    cost_text = (
        ""
        if not cost_rows
        else f"""Per-packet cost of the programs alone, for comparison (`bpftool prog run`, BPF_PROG_TEST_RUN: the kernel's mean
time per run, median of 5 rounds × 200 000 runs on one packet of monitored flow 0; the counter runs on the
colourer's output; {'the colourer is not measured with rfc9343: repeated runs on one packet find it already marked; ' if args.method == 'rfc9343' else ''}these
timings do not include the cost of the hooks themselves — the clsact qdisc, the switch of veth to NAPI for XDP).
"share" = ns × the base PDR (median of {configs[0].name}: {base_pdr / 1e3:.1f} kpps on one CPU), the share of the per-packet time budget at the base
PDR: what the PDR would lose if the program's time were the only difference.

| program | flows installed | ns per packet | share of the budget at the base PDR |
|---|---|---|---|
{chr(10).join(cost_rows)}

"""  # noqa: E501 - markdown report: one table row or paragraph per line
    )
    verdicts = {c.name: pastrami_check(sweep_points(c.sweep)).verdict for c in configs}
    stable = set(verdicts.values()) == {"GOOD"}
    cmd = (
        f"sudo .local/venv/bin/python bench/altmark_overhead.py{' --quick' if args.quick else ''}"
        f" --reps {args.reps} --seconds {args.seconds:g} --steps {args.steps} --lo {args.lo:g} --hi {args.hi:g}"
        f" --flows {','.join(map(str, flows))} --method {args.method} --sweep-reps {args.sweep_reps}"
        f"{' --baseline-only' if args.baseline_only else ''}"
    )
    datapath = (
        subprocess.run(
            ["git", "log", "-1", "--format=%h %s", "--", "datapath"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()[:90]
        or "?"
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "datapath"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    calibrated = (
        f" (search range calibrated: a 7-trial search of {configs[0].name} in [{args.calibrate}] pps found "
        f"{args.calibrated_pdr / 1e3:.1f} kpps; range {CAL_LO:g}-{CAL_HI:g} x that)"
        if getattr(args, "calibrated_pdr", None)
        else ""
    )
    monitored = (
        "every configuration's programs coloured/counted between the delivered and the sent data packets "
        "of its trials, and every traffic flow's per-flow counter grew"
        if not problems
        else "**FAILED**: " + "; ".join(problems)
    )
    return f"""## Alternate-marking overhead on the SRv6 path ({args.method} method), PDR@0.5 % (bench/altmark_overhead.py)

{dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}; {m['nproc']} vCPUs, {m['cpu']}, kernel {m['kernel']};
load average at the end {' '.join(load)}; CPU steal during the run {steal * 100:.1f} %; {elapsed:.0f} s;
other processes' CPU use during the run: {getattr(args, 'others', '?')}.
Datapath: last commit touching datapath/ `{datapath}`{' (with uncommitted changes there)' if dirty else ''}.
Command: `{cmd}`{calibrated}. The machine is shared (other engineers' tests ran at the same time): expect noise.

Method: netlab line5, H1 → A (H.Encaps, ingress edge) → R (End) → B (End.DT6, egress edge) → H2; generator
`build/bench/pktgen_udp` in H1 on CPU 0 (AF_PACKET, 44-byte UDP payloads, round-robin over K destinations, each
with its own SRv6 policy at A: segs fc00:2::e,fc00:3::d6<i>); RPS queues A's receive path to CPU 1, where A, R, B and
H2 all run (so the whole encap + transit + decap chain is the device under test; the programs' share of it is
what the ratios show). **base**: no program. **tx**: `altmark_tx` (TC egress, clsact, {args.method} method,
period {PERIOD_MS} ms) on A's a0. **tx+rx**: plus `altmark_rx` (XDP, native) on B's b0. N = monitored flows
installed in each program's maps; the traffic is spread over K = min(N, {SPREAD}) of them, the other N − K only
fill the maps. Encap cost = tx / base (same K); decap cost = tx+rx / tx (the counter sees coloured traffic).
PDR@0.5 %: {args.steps}-trial binary search in [{args.lo / 1e3:g}, {args.hi / 1e3:g}] kpps, {args.seconds:g} s trials, pass = PLR ≤
{PLR_LIMIT * 100:g} % and the generator offered ≥ 99 %; {args.reps} repetitions, all configurations interleaved in every
repetition (rotated order), each switch followed by a discarded {WARMUP_S:g} s warm-up trial at the low end of the range;
CI95 Student's t. PASTRAMI: sweep at {', '.join(f'{f:g}' for f in SWEEP_FACTORS)} × the median PDR (robust to a search whose
low end failed in a loss burst)
({args.sweep_reps} pass(es)); GOOD iff every TIR from the first load with PLR > {PLR_LIMIT * 100:g} % on is ≤ {TIR_THRESHOLD}.
Monitoring check: {monitored}.

| configuration | PDR per repetition (kpps) | mean (kpps) | CI95 (kpps) | median (kpps) | PASTRAMI | max PLR below saturation | TIRs | data sent / delivered (all trials) | coloured (tx) / counted (rx) |
|---|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

| program | flows | compared | ratio of the mean PDRs | bounds from the two CI95 | ratio of the median PDRs | per-repetition ratios | paired mean ± CI95 | goal | verdict (mean ratio) |
|---|---|---|---|---|---|---|---|---|---|
{chr(10).join(cmp_rows) or '| (baseline only) | | | | | | | | | |'}

{cost_text}
Sweeps (mean offered kpps → PLR):

| configuration | points |
|---|---|
{chr(10).join(sweep_rows)}

**PASTRAMI verdict for this run: {'stable (every configuration GOOD)' if stable else 'NOT stable (' + ', '.join(f'{k} {v}' for k, v in verdicts.items() if v != 'GOOD') + ')'}.**
{'' if stable else 'With an unstable environment the PDR values and their ratios are not a reliable comparison (PASTRAMI §V-B): reported, not claimed. '}A goal
is "met" on the point estimate; "not conclusive" when the paired CI95 straddles it or a search of either side
hit a bound of its range. Seed 001 lost
{SEED001['tx'] * 100:.1f} % (TC) and {SEED001['rx'] * 100:.1f} % (XDP) of throughput; the goals are ≤ 5 % and ≤ 2 %. On this 2-vCPU shared
VM a 2-5 % difference is within the run-to-run noise of one PDR search, so only many interleaved repetitions
(or a quieter machine) can settle it.
"""  # noqa: E501 - markdown report: one table row or paragraph per line


def summary(configs: list[Config], problems: list[str], steal: float, elapsed: float, costs: dict) -> dict:
    return {
        "elapsed_s": elapsed,
        "steal": steal,
        "problems": problems,
        "program_cost_ns": costs,
        "configs": {
            c.name: {
                "pdrs": [s.pdr_pps for s in c.searches],
                "ci95": vars(ci95([s.pdr_pps for s in c.searches])),
                "pastrami": vars(pastrami_check(sweep_points(c.sweep))),
                "marked": c.marked,
                "flow_packets": c.flow_packets,
                "data_sent": c.data_sent,
                "data_received": c.data_received,
                "sweep": [t.row() for t in c.sweep],
                "search_trials": [[t.row() for t in s.trials] for s in c.searches],
            }
            for c in configs
        },
    }


if __name__ == "__main__":
    sys.exit(main())
