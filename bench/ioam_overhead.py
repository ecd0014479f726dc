#!/usr/bin/env python3
"""Forwarding capacity of the SRv6 path with in-line IOAM on vs off, PDR@0.5 % (goal: on/off ≥ 0.97 at 1 in 100).

PDR@0.5 % with the PASTRAMI saturation check (seed 003), via bench/pdr.py, on netlab's line5, the
method and lab of bench/altmark_overhead.py: H1 (generator) -> A (H.Encaps, ingress edge) -> R (End)
-> B (End.DT6, egress edge) -> H2, A's whole receive path and R, B, H2 on one CPU. Configurations,
interleaved in every repetition (rotated order):
  - off       no IOAM program (the kernel's SRv6 encap + decap path alone)
  - on N=...  ioam_tx on A's a0 (TC egress, sampling 1 in N, trace of 4 slots: +112 bytes on a
              sampled packet) and ioam_rx on B's b0 (XDP), one monitored flow carrying all the
              traffic; a consumer drains the ring buffer, as the agent's streamer does
Capacity ratio = PDR(on) / PDR(off). The programs must really have worked: after the run, for every
"on" configuration, ioam_tx counted all the delivered packets of its trials as packets of the flow
(between delivered and sent), instrumented 1 in N of them (within one of seen / N) and skipped none,
and ioam_rx recorded every instrumented packet that arrived (between instrumented − lost and
instrumented); otherwise the script fails.

    sudo .local/venv/bin/python bench/ioam_overhead.py [--quick] [--reps 3] [--seconds 1] [--steps 9]
         [--every 100] [--no-doc] [--json-out FILE]

Full run ~4 min, --quick ~1.5 min (this 2-vCPU VM). Own resources: netns iobench-*, pins
/sys/fs/bpf/segscope/iobench-*.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.altmark_overhead import (  # noqa: E402
    DEFAULT_RANGE,
    FIRST_DST,
    WARMUP_S,
    LoadMonitor,
    add_policies,
    flow_sids,
    median_ratio,
    paired_ratios,
    ratio,
)
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

SECTION = "ioam_overhead"
TX_LOADER = REPO / "build" / "datapath" / "ioam_tx"
RX_LOADER = REPO / "build" / "datapath" / "ioam_rx"
GOAL = 0.97
SLOTS, NAMESPACE = 4, 123


@dataclass
class Ioam:
    """ioam_tx on A's a0 and ioam_rx on B's b0, one flow sampled 1 in `every`, loaded once; the
    benchmark puts them on and takes them off the devices (their pins stay)."""

    every: int
    bench: Line5Bench
    on: bool = False
    consumer: subprocess.Popen | None = None

    @property
    def tx_inst(self) -> str:
        return f"{self.bench.prefix}-A-n{self.every}"

    @property
    def rx_inst(self) -> str:
        return f"{self.bench.prefix}-B-n{self.every}"

    def _tx(self, *args: str) -> subprocess.CompletedProcess:
        return sh([str(TX_LOADER), *args])

    def _rx(self, *args: str) -> subprocess.CompletedProcess:
        return sh([str(RX_LOADER), *args])

    def load(self) -> None:
        lab, sids = self.bench.lab, ",".join(flow_sids(0))
        self._tx("attach", "--netns", lab.ns("A"), "--dev", "a0", "--instance", self.tx_inst)
        self._rx("attach", "--netns", lab.ns("B"), "--dev", "b0", "--instance", self.rx_inst, "--node-id", "9")
        self._tx(
            "add-flow", "--instance", self.tx_inst, "--sids", sids, "--flow-id", "7", "--namespace-id", str(NAMESPACE),
            "--node-id", "5", "--trace-nodes", str(SLOTS), "--sample-every", str(self.every),
        )  # fmt: skip
        self._rx(
            "add-flow", "--instance", self.rx_inst, "--sids", sids, "--flow-id", "7", "--namespace-id", str(NAMESPACE)
        )
        # the agent's streamer reads the ring: here a reader that throws the records away
        self.consumer = subprocess.Popen(
            [str(RX_LOADER), "dump", "--instance", self.rx_inst, "--timeout-ms", "3600000"],
            stdout=subprocess.DEVNULL,
        )
        self.on = True
        self.off()

    def switch(self, on: bool) -> None:
        if on == self.on:
            return
        lab, verb = self.bench.lab, "attach-dev" if on else "detach-dev"
        if not on:  # off entirely: no clsact qdisc left on a0, as in the baseline
            self._tx("detach-dev", "--netns", lab.ns("A"), "--dev", "a0", "--instance", self.tx_inst)
            lab.run("A", ["tc", "qdisc", "del", "dev", "a0", "clsact"])
        else:
            self._tx(verb, "--netns", lab.ns("A"), "--dev", "a0", "--instance", self.tx_inst)
        self._rx(verb, "--netns", lab.ns("B"), "--dev", "b0", "--instance", self.rx_inst)
        self.on = on

    def off(self) -> None:
        self.switch(False)

    def unload(self) -> None:
        if self.consumer is not None:
            self.consumer.terminate()
            self.consumer.wait(10)
        if self.bench.lab is None:
            return
        lab = self.bench.lab
        self.switch(True)  # detach removes the pins of the attached program
        sh([str(TX_LOADER), "detach", "--netns", lab.ns("A"), "--dev", "a0", "--instance", self.tx_inst], check=False)
        sh([str(RX_LOADER), "detach", "--netns", lab.ns("B"), "--dev", "b0", "--instance", self.rx_inst], check=False)

    def counters(self) -> dict[str, int]:
        rx = json.loads(self._rx("stats", "--instance", self.rx_inst, "--json").stdout)
        (flow,) = json.loads(self._tx("list-flows", "--instance", self.tx_inst, "--json").stdout)["flows"]
        return {
            "seen": flow["seen"],
            "sampled": flow["sampled"],
            "instrumented": flow["instrumented"],
            "skipped": flow["skipped_mtu"] + flow["skipped_gso"] + flow["skipped_other"],
            "recorded": rx["recorded"] + rx["recorded_truncated"],
            "ringbuf_full": rx["pass_ringbuf_full"],
            "rx_bad": sum(v for k, v in rx.items() if k not in ("recorded", "pass_no_hbh", "pass_not_ipv6")),
        }


@dataclass
class Config:
    name: str
    ioam: Ioam | None = None
    searches: list = field(default_factory=list)
    sweep: list[Trial] = field(default_factory=list)
    data_sent: int = 0
    data_received: int = 0
    done: dict[str, int] = field(default_factory=dict)  # counter deltas over its trials


def switch_to(cfg: Config, configs: list[Config], bench: Line5Bench, warmup_pps: float) -> None:
    for c in configs:
        if c.ioam is not None and c.ioam is not cfg.ioam:
            c.ioam.off()
    if cfg.ioam is not None:
        cfg.ioam.switch(True)
    bench.trial(warmup_pps, share=0.0, seconds=WARMUP_S)  # the first packets after a switch pay for it


def run_block(cfg: Config, fn) -> None:
    before = cfg.ioam.counters() if cfg.ioam else {}
    trials: list[Trial] = fn()
    if cfg.ioam:
        for k, v in cfg.ioam.counters().items():
            cfg.done[k] = cfg.done.get(k, 0) + v - before[k]
    cfg.data_sent += sum(t.data_sent for t in trials)
    cfg.data_received += sum(t.data_received for t in trials)


def check_worked(cfg: Config) -> list[str]:
    """Problems if the programs did not do their work on the configuration's traffic (empty = fine)."""
    if cfg.ioam is None:
        return []
    d, n = cfg.done, cfg.ioam.every
    problems = []
    if not cfg.data_received <= d["seen"] <= cfg.data_sent:
        problems.append(f"{cfg.name}: seen {d['seen']}, delivered {cfg.data_received}, sent {cfg.data_sent}")
    # 1 in N of what was seen, over blocks that each start anywhere in the flow's count
    blocks = len(cfg.searches) + 1
    if not d["seen"] / n - blocks <= d["instrumented"] <= d["seen"] / n + blocks or d["skipped"]:
        problems.append(
            f"{cfg.name}: instrumented {d['instrumented']} of {d['seen']} seen (1 in {n}), skipped {d['skipped']}"
        )
    lost = cfg.data_sent - cfg.data_received
    if not d["instrumented"] - lost <= d["recorded"] <= d["instrumented"] or d["ringbuf_full"] or d["rx_bad"]:
        problems.append(
            f"{cfg.name}: recorded {d['recorded']} of {d['instrumented']} instrumented ({lost} packets lost), "
            f"ring full {d['ringbuf_full']}, malformed at the egress {d['rx_bad']}"
        )
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix", default="iobench")
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 repetitions, 0.5 s trials, 7-step searches")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=9)
    ap.add_argument("--lo", type=float, default=DEFAULT_RANGE[0])
    ap.add_argument("--hi", type=float, default=DEFAULT_RANGE[1])
    ap.add_argument("--every", default="100", help="sampling 1 in N, comma-separated configurations (default 100)")
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    if args.quick:
        args.reps, args.seconds, args.steps = 2, 0.5, 7
    if args.reps < 2:
        sys.exit("--reps must be >= 2 for a confidence interval")
    everies = [int(x) for x in args.every.split(",")]
    for f in (TX_LOADER, RX_LOADER):
        if not f.exists():
            sys.exit(f"missing {f.relative_to(REPO)}: run `make -C datapath`")
    log = lambda s: print(s, flush=True)  # noqa: E731
    started, ticks0, monitor = time.monotonic(), cpu_ticks(), LoadMonitor()
    monitor.OWN = monitor.OWN | {"ioam_tx", "ioam_rx"}
    with Line5Bench(args.prefix, "none", PathSpec(data_dst=FIRST_DST)) as bench:
        add_policies(bench)
        configs = [Config("off")] + [Config(f"on N={n}", Ioam(n, bench)) for n in everies]
        try:
            for c in configs[1:]:
                c.ioam.load()
            bench._settle()

            def trial(rate: float) -> Trial:
                return bench.trial(rate, share=0.0, seconds=args.seconds)

            for rep in range(args.reps):
                for cfg in configs[rep % len(configs) :] + configs[: rep % len(configs)]:
                    switch_to(cfg, configs, bench, args.lo)
                    monitor.sample()
                    log(f"rep {rep + 1}/{args.reps} {cfg.name}")

                    def search(c=cfg):
                        res = find_pdr(trial, args.lo, args.hi, args.steps, log=log)
                        c.searches.append(res)
                        return res.trials

                    run_block(cfg, search)
            for cfg in configs:
                switch_to(cfg, configs, bench, args.lo)
                centre = max(statistics.median([s.pdr_pps for s in cfg.searches]), args.lo)
                log(f"PASTRAMI sweep {cfg.name} around {centre:,.0f} pps")

                def do_sweep(c=cfg, m=centre):
                    c.sweep = sweep(trial, m)
                    return c.sweep

                run_block(cfg, do_sweep)
        finally:
            for c in configs[1:]:
                c.ioam.unload()
    problems = [p for c in configs for p in check_worked(c)]
    args.steal, args.elapsed, args.others = (
        steal_share(ticks0, cpu_ticks()),
        time.monotonic() - started,
        monitor.busiest(),
    )
    text = report(args, configs, problems)
    print()
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(
            json.dumps(
                {c.name: {"pdrs": [s.pdr_pps for s in c.searches], "done": c.done, "sweep": [t.row() for t in c.sweep]}
                 for c in configs} | {"problems": problems},
                indent=1,
            )
        )  # fmt: skip
    if not args.no_doc:
        write_section(SECTION, text)
        print("updated docs/benchmarks.md")
    if problems:
        print("FAILED: the programs did not do their work:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    return 0


def report(args, configs: list[Config], problems: list[str]) -> str:
    m = machine()
    load = Path("/proc/loadavg").read_text().split()[:3]
    rows, sweep_rows, cmp_rows = [], [], []
    for c in configs:
        pdrs = [s.pdr_pps for s in c.searches]
        ci, chk = ci95(pdrs), pastrami_check(sweep_points(c.sweep))
        bounds = any(s.at_upper_bound or s.below_lower_bound for s in c.searches)
        done = (
            f"{c.done['seen']:,} seen, {c.done['instrumented']:,} instrumented, {c.done['recorded']:,} recorded"
            if c.done
            else "–"
        )
        rows.append(
            f"| {c.name} | {', '.join(f'{p / 1e3:.1f}' for p in pdrs)} | **{ci.mean / 1e3:.1f}** | "
            f"±{ci.half_width / 1e3:.1f} | {statistics.median(pdrs) / 1e3:.1f} | {chk.verdict} | "
            f"{chk.max_plr_below * 100:.2f} % | "
            f"{', '.join(f'{t:.2f}' for t in chk.tirs) or '–'} | {c.data_sent:,} / {c.data_received:,} | {done} |"
            f"{' search hit a bound' if bounds else ''}"
        )
        sweep_rows.append(
            f"| {c.name} | "
            + ", ".join(f"{o / 1e3:.1f}→{(1 - t / o) * 100:.2f}%" for o, t in sweep_points(c.sweep))
            + " |"
        )
    for c in configs[1:]:
        r, lo, hi = ratio(c, configs[0])
        paired = paired_ratios(c, configs[0])
        pci = ci95(paired) if len(paired) >= 2 else None
        hit = any(x.at_upper_bound or x.below_lower_bound for k in (c, configs[0]) for x in k.searches)
        conclusive = pci is not None and (pci.low >= GOAL or pci.high < GOAL) and not hit
        cmp_rows.append(
            f"| {c.name} / off | **{r:.3f}** ({(1 - r) * 100:+.1f} % cost) | {lo:.3f}–{hi:.3f} | "
            f"{median_ratio(c, configs[0]):.3f} | "
            f"{', '.join(f'{x:.3f}' for x in paired)} | " + (f"{pci.mean:.3f} ± {pci.half_width:.3f}" if pci else "–")
            + f" | ≥ {GOAL} | {'met' if r >= GOAL else 'NOT met'}{'' if conclusive else ' (not conclusive)'} |"
        )  # fmt: skip
    verdicts = {c.name: pastrami_check(sweep_points(c.sweep)).verdict for c in configs}
    stable = set(verdicts.values()) == {"GOOD"}
    datapath = subprocess.run(
        ["git", "log", "-1", "--format=%h %s", "--", "datapath"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()[:90]
    cmd = (
        f"sudo .local/venv/bin/python bench/ioam_overhead.py{' --quick' if args.quick else ''} --reps {args.reps} "
        f"--seconds {args.seconds:g} --steps {args.steps} --lo {args.lo:g} --hi {args.hi:g} --every {args.every}"
    )
    worked = (
        "every \"on\" configuration's ioam_tx saw its delivered packets, instrumented 1 in N of them and skipped none, "
        "and ioam_rx recorded every instrumented packet that arrived"
        if not problems
        else "**FAILED**: " + "; ".join(problems)
    )
    return f"""## In-line IOAM on the SRv6 path, forwarding capacity on vs off, PDR@0.5 % (bench/ioam_overhead.py)

{m['date']}; {m['nproc']} vCPUs, {m['cpu']}, kernel {m['kernel']}; load average at the end {' '.join(load)};
CPU steal during the run {args.steal * 100:.1f} %; {args.elapsed:.0f} s; other processes' CPU use during the run: {args.others}.
Datapath: last commit touching datapath/ `{datapath}`. Command: `{cmd}`. The machine is shared: expect noise.

Method (bench/altmark_overhead.py's lab and statistics): netlab line5, generator `pktgen_udp` in H1 on CPU 0
(44-byte UDP payloads, one destination behind A's policy `segs fc00:2::e,fc00:3::d600`), A's receive path
and R, B, H2 on CPU 1. **off**: no program. **on N=n**: `ioam_tx` (TC egress on A's a0, 1 in n packets
instrumented with a 4-slot trace and the E2E option, +112 bytes) and `ioam_rx` (native XDP on B's b0; R's
kernel does not fill: IOAM is off in this lab, the insertion and the extraction are what is measured), one
monitored flow carrying all the traffic, a process draining the ring buffer. PDR@0.5 %: {args.steps}-trial binary
search in [{args.lo / 1e3:g}, {args.hi / 1e3:g}] kpps, {args.seconds:g} s trials; {args.reps} repetitions, configurations
interleaved (rotated order), a discarded {WARMUP_S:g} s warm-up trial after each switch; CI95 Student's t. PASTRAMI:
sweep at {', '.join(f'{f:g}' for f in SWEEP_FACTORS)} × the median PDR; GOOD iff every TIR from the first load with
PLR > {PLR_LIMIT * 100:g} % on is ≤ {TIR_THRESHOLD}. Work check: {worked}.

| configuration | PDR per repetition (kpps) | mean (kpps) | CI95 (kpps) | median (kpps) | PASTRAMI | max PLR below saturation | TIRs | data sent / delivered | IOAM work (all trials) |
|---|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

| compared | ratio of the mean PDRs | bounds from the two CI95 | ratio of the median PDRs | per-repetition ratios | paired mean ± CI95 | goal | verdict (mean ratio) |
|---|---|---|---|---|---|---|---|
{chr(10).join(cmp_rows)}

Sweeps (mean offered kpps → PLR):

| configuration | points |
|---|---|
{chr(10).join(sweep_rows)}

**PASTRAMI verdict for this run: {'stable (every configuration GOOD)' if stable else 'NOT stable (' + ', '.join(f'{k} {v}' for k, v in verdicts.items() if v != 'GOOD') + ')'}.**
{'' if stable else 'With an unstable environment the PDR values and their ratios are not a reliable comparison (PASTRAMI §V-B): reported, not claimed. '}A goal is
"met" on the point estimate; "not conclusive" when the paired CI95 straddles it or a search hit a bound of its range.
Per-packet costs of the programs alone: the section of bench/ioam_testrun_cost.py.
"""  # noqa: E501 - markdown report: one table row or paragraph per line


if __name__ == "__main__":
    sys.exit(main())
