#!/usr/bin/env python3
"""PDR@0.5 % (Partial Drop Rate) of an SRv6 path in a netlab lab, with the PASTRAMI saturation check.

Method (seed 003, PASTRAMI; seed 000, SRPerf/TRex as the traffic generator):
- A *trial* offers a constant rate O for a short time (default 1 s) from the sender node with
  `build/bench/pktgen_udp` (sendmmsg, paced on absolute deadlines, exact packet count, a given share
  of STAMP test packets with an SRH). Packet loss is counted exactly: sent (by the generator) against
  received, counted by XDP counting programs (`xdp_count_drop.bpf.o`) on the receiver's interface
  (data packets, after A encaps, R End, B End.DT6) and on the sender's interface (STAMP replies that
  the device under test reflected). PLR = 1 - received/sent, throughput T = received / duration.
  A trial passes if PLR <= 0.5 % *and* the generator really offered the rate (>= 99 %); a trial the
  generator could not keep up with is reported as `sender_limited` and counts as a failure.
- *PDR search*: bounded binary search on O between `lo` and `hi` (`steps` trials in all); the PDR is
  the highest passing rate seen. One search = one repetition; repetitions give mean and a 95 %
  confidence interval with Student's t (n-1 degrees of freedom), as in PASTRAMI §IV-A. To compare
  configurations on a noisy machine, `find_pdr_lockstep` runs their searches side by side (one
  trial of each per step, order rotating), and `ratio_ci95` / `bootstrap_ratio_ci95` give the
  paired ratio with a 95 % interval.
- *PASTRAMI check* (§V): a load sweep around the PDR; the first load whose PLR exceeds 0.5 % is the
  potential saturation point; from there on, every Throughput Increase Ratio
  TIR = ΔT/ΔO between consecutive loads must stay <= 0.1 (further load turns into loss, not into
  throughput). GOOD = the PDR marks the onset of saturation; BAD = losses grow slowly past the PDR
  (or appear at low load): the environment is not stable enough for PDR to characterise it.

Device under test (DUT): node A of `netlab/topologies/line5.yaml`, on a CPU of its own, as the SUT's
forwarding core in seed 000: the generator is pinned to CPU 0 and RPS on A's ingress veth (`ah`) queues
every packet to CPU 1's backlog (net.core.netdev_max_backlog, 1000 here), where A's whole receive path
runs: XDP (the reflector is attached in *generic* mode so that it runs there, after RPS), IPv6 forwarding,
seg6 encap, and then R, B and H2, whose veths deliver on the CPU that transmits. When CPU 1 falls
behind, its backlog overflows: at A's ingress (counted as `ingress_drops`, the sender veth's tx drops)
or at R's/B's ingress; every such loss is in sent - received.
Generator: by default complete frames on an AF_PACKET socket (`--dev`, no UDP/IPv6 stack cost, so it
outruns the DUT like a hardware generator) with a 64 MiB send buffer: veth does not orphan the skbs it
forwards, and with the default send buffer the generator *blocked* once a few hundred packets were
in flight, so an overloaded DUT showed up as a slow generator with 0 % loss instead of as loss.
Measured alternatives (not used): native XDP on `ah` runs in the veth NAPI of the *sender's* CPU
(inline in its syscalls); threaded NAPI pinned to CPU 1 decouples it, but its queue is the veth's
256-entry ring, and on this VM (vCPU steal up to ~40 %, ms-long stalls) it lost 7-40 % already at
5-20 kpps.

Library use:
    with Line5Bench(prefix="pdbench", dut="xdp") as bench:
        result = find_pdr(lambda r: bench.trial(r, share=0.01, seconds=1.0), lo=50_000, hi=350_000, steps=8)
CLI:
    sudo .local/venv/bin/python bench/pdr.py [--dut xdp|userspace|none] [--share 0.01] [--reps 3]
         [--seconds 1] [--lo 50000] [--hi 350000] [--steps 8] [--no-check] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from segscope_schemas.names import BPFFS_PIN_ROOT

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

BUILD = REPO / "build"
PKTGEN = BUILD / "bench" / "pktgen_udp"
REFLECTOR = BUILD / "datapath" / "stamp_reflector"
COUNT_DROP_OBJ = BUILD / "datapath" / "xdp_count_drop.bpf.o"

PLR_LIMIT = 0.005  # PDR@0.5 %
TIR_THRESHOLD = 0.1  # PASTRAMI: < 10 % of added load becomes throughput = saturated
SENDER_OK_RATIO = 0.99  # the generator must really offer >= 99 % of the target rate
SWEEP_FACTORS = (0.6, 0.9, 1.0, 1.1, 1.25, 1.5)

# Student's t, 97.5th percentile (two-sided 95 %), by degrees of freedom.
_T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
    16: 2.120,
    17: 2.110,
    18: 2.101,
    19: 2.093,
    20: 2.086,
    21: 2.080,
    22: 2.074,
    23: 2.069,
    24: 2.064,
    25: 2.060,
    26: 2.056,
    27: 2.052,
    28: 2.048,
    29: 2.045,
    30: 2.042,
    40: 2.021,
    60: 2.000,
    120: 1.980,
}


# ---------------------------------------------------------------- statistics (pure functions)


def t975(df: int) -> float:
    """Critical value t_{0.975, df} (table; between tabulated df the next smaller df, conservative)."""
    if df < 1:
        raise ValueError("need at least 2 samples (df >= 1) for a confidence interval")
    if df in _T975:
        return _T975[df]
    if df > 120:
        return 1.960
    return _T975[max(k for k in _T975 if k < df)]


@dataclass
class CI95:
    n: int
    mean: float
    stdev: float  # sample standard deviation (n - 1)
    half_width: float  # t_{0.975,n-1} * s / sqrt(n)
    low: float
    high: float
    rel_upper: float  # PASTRAMI's normalised uncertainty (high - mean) / mean


def ci95(values: Sequence[float]) -> CI95:
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return CI95(n, mean, float("nan"), float("nan"), float("nan"), float("nan"), float("nan"))
    s = statistics.stdev(values)
    half = t975(n - 1) * s / math.sqrt(n)
    return CI95(n, mean, s, half, mean - half, mean + half, half / mean if mean else float("inf"))


def ratio_ci95(ratios: Sequence[float]) -> tuple[float, float, float]:
    """Geometric mean of paired ratios with a 95 % interval: Student's t on their logarithms (n-1 df),
    back-transformed. Ratios average in log space (a ratio and its inverse weigh the same).
    Returns (geometric mean, low, high); low/high are nan with fewer than 2 ratios."""
    if not ratios or min(ratios) <= 0:
        raise ValueError("need positive ratios")
    c = ci95([math.log(r) for r in ratios])
    return math.exp(c.mean), math.exp(c.low), math.exp(c.high)


def bootstrap_ratio_ci95(
    num: Sequence[float], den: Sequence[float], resamples: int = 10_000, seed: int = 1
) -> tuple[float, float, float]:
    """sum(num) / sum(den) over paired samples (num[i] and den[i] measured together), with the 2.5th
    and 97.5th percentiles of the same ratio over `resamples` resamplings of the pairs with replacement
    (percentile bootstrap; fixed seed, so a report is reproducible from its numbers). Returns
    (ratio, low, high)."""
    if len(num) != len(den) or len(num) < 2:
        raise ValueError("need at least 2 pairs")
    rng, n = random.Random(seed), len(num)
    point = sum(num) / sum(den)
    stats = []
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        d = sum(den[i] for i in idx)
        stats.append(sum(num[i] for i in idx) / d if d else float("inf"))
    stats.sort()
    return point, stats[int(0.025 * (resamples - 1))], stats[int(0.975 * (resamples - 1))]


# ---------------------------------------------------------------- trials, search, check


@dataclass
class Trial:
    target_pps: float
    offered_pps: float  # what the generator really sent per second
    seconds: float
    sent: int
    received: int  # data at the receiver + STAMP replies back at the sender
    data_sent: int = 0
    stamp_sent: int = 0
    data_received: int = 0
    stamp_received: int = 0
    ingress_drops: int = 0  # dropped entering the DUT (backlog full on its CPU; sender veth tx drops)
    late_batches: int = 0

    @property
    def plr(self) -> float:
        return 1.0 - self.received / self.sent if self.sent else 1.0

    @property
    def throughput_pps(self) -> float:
        return self.received / self.seconds if self.seconds else 0.0

    @property
    def sender_limited(self) -> bool:
        return self.offered_pps < SENDER_OK_RATIO * self.target_pps

    def passed(self, plr_limit: float = PLR_LIMIT) -> bool:
        return not self.sender_limited and self.plr <= plr_limit

    def row(self) -> dict:
        d = asdict(self)
        d.update(
            plr=self.plr, throughput_pps=self.throughput_pps, sender_limited=self.sender_limited, passed=self.passed()
        )
        return d


TrialFn = Callable[[float], Trial]


@dataclass
class SearchResult:
    pdr_pps: float  # highest passing offered rate (0 if even `lo` failed)
    trials: list[Trial]
    at_upper_bound: bool = False  # `hi` passed: the PDR is >= hi, raise --hi
    below_lower_bound: bool = False

    @property
    def loss_failures(self) -> int:
        return sum(1 for t in self.trials if t.plr > PLR_LIMIT)

    @property
    def generator_bound(self) -> bool:
        """Every failed trial failed because the generator could not offer the rate, none by loss:
        the PDR found is the generator's limit, a lower bound of the DUT's capacity."""
        failed = [t for t in self.trials if not t.passed()]
        return bool(failed) and all(t.plr <= PLR_LIMIT for t in failed)


def find_pdr(
    trial: TrialFn,
    lo: float,
    hi: float,
    steps: int = 7,
    plr_limit: float = PLR_LIMIT,
    log: Callable[[str], None] | None = None,
) -> SearchResult:
    """Bounded binary search for the highest rate whose trial passes (PLR <= plr_limit).

    Trials: `lo` first (must pass, else the PDR is below the range), then `hi` (if it passes, the PDR
    is at least `hi`), then bisection between the highest pass and the lowest failure, `steps` trials
    in all. Each trial is independent; a failure above a pass narrows from above (monotone model).
    """
    if not 0 < lo < hi:
        raise ValueError(f"need 0 < lo < hi, got lo={lo} hi={hi}")
    if steps < 2:
        raise ValueError("steps must be >= 2 (lo and hi)")
    trials: list[Trial] = []

    def run(rate: float) -> Trial:
        t = trial(rate)
        trials.append(t)
        if log:
            log(
                f"    {rate:>10,.0f} pps: offered {t.offered_pps:>10,.0f} plr {t.plr * 100:7.3f} % "
                f"{'pass' if t.passed(plr_limit) else 'FAIL'}{' (sender limited)' if t.sender_limited else ''}"
            )
        return t

    if not run(lo).passed(plr_limit):
        return SearchResult(0.0, trials, below_lower_bound=True)
    if run(hi).passed(plr_limit):
        return SearchResult(hi, trials, at_upper_bound=True)
    good, bad = lo, hi
    for _ in range(steps - 2):
        mid = (good + bad) / 2
        if run(mid).passed(plr_limit):
            good = mid
        else:
            bad = mid
    return SearchResult(good, trials)


def find_pdr_lockstep(
    trials: Sequence[TrialFn],
    lo: float,
    hi: float,
    steps: int = 7,
    plr_limit: float = PLR_LIMIT,
    first: int = 0,
    log: Callable[[str], None] | None = None,
) -> list[SearchResult]:
    """The bounded binary search of find_pdr for several configurations at once, in lockstep: step k
    runs the k-th trial of every configuration's own search back to back, so the shared machine's load
    changes (seconds to minutes here) fall on the same steps of every search, instead of on one
    configuration's whole search. The order within a step rotates (step k starts with configuration
    (first + k) mod n: with two, A B | B A | A B ..., each switch of configuration followed by two
    trials of the other). A search that ends early (`lo` failed, or `hi` passed) leaves the others to go on.
    """
    if not 0 < lo < hi:
        raise ValueError(f"need 0 < lo < hi, got lo={lo} hi={hi}")
    if steps < 2:
        raise ValueError("steps must be >= 2 (lo and hi)")
    n = len(trials)
    done: list[SearchResult | None] = [None] * n
    ran: list[list[Trial]] = [[] for _ in range(n)]
    good, bad = [lo] * n, [hi] * n

    def run(i: int, rate: float) -> bool:
        t = trials[i](rate)
        ran[i].append(t)
        if log:
            log(
                f"    [{i}] {rate:>10,.0f} pps: offered {t.offered_pps:>10,.0f} plr {t.plr * 100:7.3f} % "
                f"{'pass' if t.passed(plr_limit) else 'FAIL'}{' (sender limited)' if t.sender_limited else ''}"
            )
        return t.passed(plr_limit)

    for step in range(steps):
        start = (first + step) % n
        for i in [(start + j) % n for j in range(n)]:
            if done[i] is not None:
                continue
            if step == 0:
                if not run(i, lo):
                    done[i] = SearchResult(0.0, ran[i], below_lower_bound=True)
            elif step == 1:
                if run(i, hi):
                    done[i] = SearchResult(hi, ran[i], at_upper_bound=True)
            else:
                mid = (good[i] + bad[i]) / 2
                if run(i, mid):
                    good[i] = mid
                else:
                    bad[i] = mid
    return [d if d is not None else SearchResult(good[i], ran[i]) for i, d in enumerate(done)]


@dataclass
class PastramiVerdict:
    verdict: str  # GOOD | BAD | NO_SATURATION
    reason: str
    potential_index: int | None  # first sweep point with PLR > threshold
    tirs: list[float] = field(default_factory=list)  # TIR from the potential point on
    max_plr_below: float = 0.0  # largest PLR before the potential point (low-load loss)


def pastrami_check(
    points: Sequence[tuple[float, float]], plr_threshold: float = PLR_LIMIT, tir_threshold: float = TIR_THRESHOLD
) -> PastramiVerdict:
    """PASTRAMI §V on a load sweep: points = (offered pps, throughput pps), any order.

    GOOD if, from the first load with PLR > plr_threshold on, every TIR = ΔT/ΔO between consecutive
    loads is <= tir_threshold (saturation starts at the potential point and persists).
    """
    pts = sorted(points)
    if len(pts) < 2:
        raise ValueError("need at least 2 sweep points")
    plrs = [1.0 - t / o if o else 1.0 for o, t in pts]
    k = next((i for i, p in enumerate(plrs) if p > plr_threshold), None)
    if k is None:
        return PastramiVerdict(
            "NO_SATURATION", f"no sweep load reached PLR > {plr_threshold * 100:g} %: extend the sweep", None
        )
    max_below = max(plrs[:k], default=0.0)
    if k == len(pts) - 1:
        return PastramiVerdict(
            "NO_SATURATION",
            "only the last sweep load exceeds the PLR threshold: no load beyond it to compute a TIR",
            k,
            [],
            max_below,
        )
    tirs = [(pts[i + 1][1] - pts[i][1]) / (pts[i + 1][0] - pts[i][0]) for i in range(k, len(pts) - 1)]
    bad = [i for i, tir in enumerate(tirs) if tir > tir_threshold]
    if bad:
        return PastramiVerdict(
            "BAD",
            f"TIR {tirs[bad[0]]:.2f} > {tir_threshold} after the PLR passed "
            f"{plr_threshold * 100:g} %: loss grows slowly, throughput still rises "
            "(PDR does not mark saturation)",
            k,
            tirs,
            max_below,
        )
    return PastramiVerdict(
        "GOOD",
        f"all {len(tirs)} TIR <= {tir_threshold} from the first load with PLR > "
        f"{plr_threshold * 100:g} % on: PDR marks the onset of saturation",
        k,
        tirs,
        max_below,
    )


def sweep(trial: TrialFn, center_pps: float, factors: Sequence[float] = SWEEP_FACTORS, reps: int = 1) -> list[Trial]:
    """Trials at center * each factor, `reps` passes over the whole sweep (low to high load each time)."""
    return [trial(center_pps * f) for _ in range(reps) for f in factors]


def sweep_points(trials: Sequence[Trial]) -> list[tuple[float, float]]:
    """(mean offered, mean throughput) per target rate: PASTRAMI's per-load averages over repetitions."""
    by_target: dict[float, list[Trial]] = {}
    for t in trials:
        by_target.setdefault(t.target_pps, []).append(t)
    return sorted(
        (statistics.fmean(t.offered_pps for t in ts), statistics.fmean(t.throughput_pps for t in ts))
        for ts in by_target.values()
    )


# ---------------------------------------------------------------- the line5 environment


def sh(cmd: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and proc.returncode:
        raise RuntimeError(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr.strip()}")
    return proc


@dataclass
class PathSpec:
    """Who sends, who receives and what the DUT is, in a netlab topology (defaults: line5)."""

    topology: str = "netlab/topologies/line5.yaml"
    sender: str = "H1"
    sender_dev: str = "h1"
    sender_addr: str = "fd00:a::1"
    receiver: str = "H2"
    receiver_dev: str = "h2"
    data_dst: str = "fd00:b::1"
    dut: str = "A"
    dut_ingress: str = "ah"
    reflector_addr: str = "fc00:1::1"  # STAMP Session-Reflector address on the DUT (A's loopback)
    stamp_segs: tuple[str, ...] = ()  # SIDs before the reflector (empty: SRH [reflector], SL 0)
    ssid: int = 1
    generator_cpu: int = 0
    dut_cpu: int = 1
    generator: str = "packet"  # packet (AF_PACKET frames, cheap) | socket (UDP sockets)
    generator_batch: int = 32  # packets per sendmmsg (one pacing deadline per batch)
    data_dsts: int = 1  # packet mode: data round-robin over data_dst + 0..K-1


DUT_MODES = ("none", "xdp", "userspace")


class Line5Bench:
    """A netlab lab prepared for PDR trials; `dut` = none (xdp_pass on the ingress) | xdp (XDP STAMP
    reflector on the ingress) | userspace (xdp_pass + collectors.ustamp reflector in the DUT)."""

    def __init__(self, prefix: str, dut: str = "xdp", spec: PathSpec | None = None):
        if dut not in DUT_MODES:
            raise ValueError(f"dut must be one of {DUT_MODES}, got {dut!r}")
        for f in (PKTGEN, REFLECTOR, COUNT_DROP_OBJ):
            if not f.exists():
                raise FileNotFoundError(f"missing {f.relative_to(REPO)}: run `make -C datapath` and `make -C bench`")
        self.prefix, self.spec, self.dut_mode = prefix, spec or PathSpec(), None
        self.lab = None
        self._map_ids: dict[str, int] = {}
        self._ustamp: subprocess.Popen | None = None
        self._wanted_dut = dut

    # -- lifecycle
    def __enter__(self) -> "Line5Bench":
        self.up()
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> None:
        from netlab import Lab
        from tests.datapath.dp_env import ensure_bpffs

        ensure_bpffs()
        self.lab = Lab.up(self.spec.topology, prefix=self.prefix)
        s = self.spec
        for node, dev in ((s.receiver, s.receiver_dev), (s.sender, s.sender_dev)):
            self._ip(node, "link", "set", "dev", dev, "xdpdrv", "obj", str(COUNT_DROP_OBJ), "sec", "xdp")
            self._map_ids[node] = self._count_map_id(node, dev)
        self._steer_to_dut_cpu()
        self.set_dut(self._wanted_dut)
        self._settle()

    def _settle(self, timeout_s: float = 4.0) -> None:
        """Wait until the namespaces' own start-up frames (MLD reports, ...) stop reaching the
        counters, so trials count only the generator's packets (at most a few strays remain)."""
        s, deadline = self.spec, time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            now = (self._count(s.receiver), self._count(s.sender))
            if now == last:
                return
            last = now
            time.sleep(0.7)

    def down(self) -> None:
        self._stop_dut()
        if self.lab is not None:
            self.lab.down()
            self.lab = None

    # -- DUT programs
    @property
    def pin_dir(self) -> Path:
        return Path(BPFFS_PIN_ROOT) / f"{self.prefix}-{self.spec.dut}" / "stamp_reflector"

    def set_dut(self, mode: str) -> None:
        """Switch what the DUT runs at its ingress: nothing (kernel forwarding only), the XDP reflector
        (generic XDP, so it runs on the DUT's CPU after RPS; see module doc) or the user-space reflector."""
        if mode not in DUT_MODES:
            raise ValueError(f"dut must be one of {DUT_MODES}, got {mode!r}")
        s, ns = self.spec, self.lab.ns(self.spec.dut)
        self._stop_dut()
        if mode == "xdp":
            # The loader attaches in driver mode and pins prog + maps; re-attach the pinned program in
            # generic mode (driver and generic XDP cannot be active together).
            sh([str(REFLECTOR), "attach", "--netns", ns, "--dev", s.dut_ingress, "--pin-dir", str(self.pin_dir)])
            sh([str(REFLECTOR), "add-address", "--pin-dir", str(self.pin_dir), s.reflector_addr])
            sh(
                [
                    str(REFLECTOR),
                    "add-session",
                    "--pin-dir",
                    str(self.pin_dir),
                    "--ssid",
                    str(s.ssid),
                    "--sender",
                    s.sender_addr,
                ]
            )
            self._ip(s.dut, "link", "set", "dev", s.dut_ingress, "xdpdrv", "off")
            sh(
                [
                    "nsenter",
                    f"--net=/run/netns/{ns}",
                    "bpftool",
                    "net",
                    "attach",
                    "xdpgeneric",
                    "pinned",
                    str(self.pin_dir / "prog"),
                    "dev",
                    s.dut_ingress,
                ]
            )
        elif mode == "userspace":
            env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'schemas' / 'python'}"}
            self._ustamp = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "collectors.ustamp",
                    "reflector",
                    "--netns",
                    ns,
                    "--address",
                    s.reflector_addr,
                    "--add-session",
                    f"--ssid {s.ssid} --sender {s.sender_addr}",
                ],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            ready = json.loads(self._ustamp.stdout.readline() or "{}")
            if ready.get("event") != "ready":
                raise RuntimeError(f"ustamp reflector did not start: {ready}")
        self.dut_mode = mode

    def _stop_dut(self) -> None:
        if self._ustamp is not None:
            self._ustamp.send_signal(signal.SIGTERM)
            try:
                self._ustamp.wait(10)
            except subprocess.TimeoutExpired:
                self._ustamp.kill()
            self._ustamp = None
        if self.dut_mode == "xdp" and self.lab is not None:
            self._ip(self.spec.dut, "link", "set", "dev", self.spec.dut_ingress, "xdpgeneric", "off")
            shutil.rmtree(self.pin_dir, ignore_errors=True)
        self.dut_mode = None

    def reflector_stats(self) -> dict:
        if self.dut_mode != "xdp":
            return {}
        return json.loads(sh([str(REFLECTOR), "stats", "--pin-dir", str(self.pin_dir), "--json"]).stdout)

    def _steer_to_dut_cpu(self) -> None:
        """RPS on the DUT's ingress: every packet H1 sends is queued to the DUT CPU's backlog
        (net.core.netdev_max_backlog deep) and processed there, XDP (generic) included."""
        s = self.spec
        mask = format(1 << s.dut_cpu, "x")
        self.lab.run(
            s.dut,
            ["sh", "-c", f"for q in /sys/class/net/{s.dut_ingress}/queues/rx-*; do echo {mask} > $q/rps_cpus; done"],
            check=True,
        )

    # -- counters
    def _ip(self, node: str, *args: str) -> None:
        self.lab.run(node, ["ip", *args], check=True)

    def _count_map_id(self, node: str, dev: str) -> int:
        info = json.loads(self.lab.run(node, ["ip", "-j", "link", "show", "dev", dev], check=True).stdout)[0]
        prog = json.loads(sh(["bpftool", "prog", "show", "id", str(info["xdp"]["prog"]["id"]), "-j"]).stdout)
        return prog["map_ids"][0]

    def _count(self, node: str) -> int:
        out = json.loads(sh(["bpftool", "map", "dump", "id", str(self._map_ids[node]), "-j"]).stdout)
        return sum(v["value"] for v in out[0]["formatted"]["values"])

    def _ingress_drops(self) -> int:
        """Packets lost on the way into the DUT (backlog full on the DUT CPU): the sender veth's tx
        drops (the DUT ingress counts the same packets as rx drops)."""
        s = self.spec
        return json.loads(
            self.lab.run(s.sender, ["ip", "-j", "-s", "link", "show", "dev", s.sender_dev], check=True).stdout
        )[0]["stats64"]["tx"]["dropped"]

    # -- one trial
    def trial(self, rate_pps: float, share: float = 0.0, seconds: float = 1.0, drain_s: float = 0.15) -> Trial:
        s = self.spec
        data0, stamp0, drop0 = self._count(s.receiver), self._count(s.sender), self._ingress_drops()
        cmd = [
            str(PKTGEN),
            "--netns",
            self.lab.ns(s.sender),
            "--src",
            s.sender_addr,
            "--data-dst",
            s.data_dst,
            "--rate",
            f"{rate_pps:.0f}",
            "--seconds",
            f"{seconds}",
            "--cpu",
            str(s.generator_cpu),
            "--batch",
            str(s.generator_batch),
        ]
        if s.generator == "packet":
            cmd += [
                "--dev",
                s.sender_dev,
                "--src-mac",
                self.lab.mac(s.sender, s.sender_dev),
                "--dst-mac",
                self.lab.mac(s.dut, s.dut_ingress),
            ]
            if s.data_dsts > 1:
                cmd += ["--data-dsts", str(s.data_dsts)]
        if share > 0:
            cmd += ["--stamp-dst", s.reflector_addr, "--stamp-share", f"{share}", "--ssid", str(s.ssid)]
            if s.stamp_segs:
                cmd += ["--stamp-segs", ",".join(s.stamp_segs)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not proc.stdout.strip():
            raise RuntimeError(f"pktgen_udp failed ({proc.returncode}): {proc.stderr.strip()}")
        gen = json.loads(proc.stdout)
        time.sleep(drain_s)  # packets still in flight in the lab
        data_rx = self._count(s.receiver) - data0
        stamp_rx = self._count(s.sender) - stamp0
        return Trial(
            target_pps=rate_pps,
            offered_pps=gen["offered_pps"],
            seconds=gen["seconds"],
            sent=gen["sent"],
            received=data_rx + stamp_rx,
            data_sent=gen["data_sent"],
            stamp_sent=gen["stamp_sent"],
            data_received=data_rx,
            stamp_received=stamp_rx,
            ingress_drops=self._ingress_drops() - drop0,
            late_batches=gen["late_batches"],
        )


# ---------------------------------------------------------------- one PDR measurement with repetitions


@dataclass
class PdrMeasurement:
    dut: str
    share: float
    pdrs: list[float]
    ci: CI95
    searches: list[SearchResult]
    sweep: list[Trial]
    check: PastramiVerdict | None

    def summary(self) -> dict:
        return {
            "dut": self.dut,
            "stamp_share": self.share,
            "pdr_pps": self.pdrs,
            "ci95": asdict(self.ci),
            "at_upper_bound": any(s.at_upper_bound for s in self.searches),
            "below_lower_bound": any(s.below_lower_bound for s in self.searches),
            "generator_bound": [s.generator_bound for s in self.searches],
            "pastrami": asdict(self.check) if self.check else None,
            "sweep": [t.row() for t in self.sweep],
        }


def measure(
    bench: Line5Bench,
    share: float,
    reps: int = 3,
    seconds: float = 1.0,
    lo: float = 50_000,
    hi: float = 350_000,
    steps: int = 8,
    check: bool = True,
    sweep_reps: int = 1,
    log: Callable[[str], None] | None = None,
) -> PdrMeasurement:
    def run(rate: float) -> Trial:
        return bench.trial(rate, share=share, seconds=seconds)

    searches = []
    for i in range(reps):
        if log:
            log(f"  [{bench.dut_mode} {share * 100:g} % STAMP] repetition {i + 1}/{reps}")
        searches.append(find_pdr(run, lo, hi, steps, log=log))
    pdrs = [s.pdr_pps for s in searches]
    ci = ci95(pdrs)
    swept, verdict = [], None
    if check and ci.mean > 0:
        swept = sweep(run, ci.mean, reps=sweep_reps)
        verdict = pastrami_check(sweep_points(swept))
        if log:
            log(f"  PASTRAMI: {verdict.verdict} ({verdict.reason})")
    return PdrMeasurement(bench.dut_mode, share, pdrs, ci, searches, swept, verdict)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix", default="pdbench", help="netlab prefix (namespaces <prefix>-<node>)")
    ap.add_argument("--topology", default=PathSpec.topology)
    ap.add_argument("--dut", choices=DUT_MODES, default="xdp")
    ap.add_argument("--share", type=float, default=0.0, help="STAMP share of the offered packets (0..1)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=1.0, help="trial duration")
    ap.add_argument("--lo", type=float, default=50_000)
    ap.add_argument("--hi", type=float, default=350_000)
    ap.add_argument("--steps", type=int, default=8, help="trials per binary search")
    ap.add_argument("--no-check", action="store_true", help="skip the PASTRAMI sweep")
    ap.add_argument("--sweep-reps", type=int, default=1, help="passes over the PASTRAMI sweep (averaged per load)")
    ap.add_argument("--json", action="store_true", help="print the full result as JSON")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("pdr.py needs root (namespaces, XDP)")
    if not 0 <= args.share <= 1:
        sys.exit("--share must be within 0..1")
    with Line5Bench(args.prefix, args.dut, PathSpec(topology=args.topology)) as bench:
        m = measure(
            bench,
            args.share,
            args.reps,
            args.seconds,
            args.lo,
            args.hi,
            args.steps,
            check=not args.no_check,
            sweep_reps=args.sweep_reps,
            log=lambda s: print(s, file=sys.stderr, flush=True),
        )
    if args.json:
        print(json.dumps(m.summary(), indent=2))
    else:
        c = m.ci
        print(
            f"PDR@0.5% dut={m.dut} stamp={m.share * 100:g}%: mean {c.mean:,.0f} pps, CI95 ±{c.half_width:,.0f} "
            f"(n={c.n}), runs {', '.join(f'{p:,.0f}' for p in m.pdrs)}"
            f"{' (generator-bound: a lower bound)' if any(s.generator_bound for s in m.searches) else ''}; PASTRAMI "
            f"{m.check.verdict if m.check else 'not run'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
