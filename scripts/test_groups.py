"""The test command's runner: the suite split into groups that run in parallel, each group one
pytest process with its own service stack, then the tests that must run alone, then the [last]
group (the local Kubernetes cluster's test), which needs the machine to itself from its start.

    .local/venv/bin/python scripts/test_groups.py [--groups K] [--plan] [--save-durations]
    .local/venv/bin/python scripts/test_groups.py --quick

scripts/test.sh runs it after lint (`make test`, CI); `make test-quick` runs it with --quick.

Why groups: the suite mostly waits (Kafka, InfluxDB, Telegraf, timers, traffic of a fixed
duration), not on the CPU, so K pytest processes side by side finish in a fraction of the serial
time. What a group gets for itself (tests/isolation.py reads it from the environment):

    SEGSCOPE_STACK_PORT_BASE / SEGSCOPE_STACK_RUN_DIR   its own Kafka, InfluxDB and Telegraf
    SEGSCOPE_TEST_PORT_BLOCK   100 ports for the group (the stack at +0, the tests' extra stacks
                               at +10, +20, ...); blocks are taken in 21000-28999 under a lock
                               that lives as long as this process (two runs never share one)
    SEGSCOPE_TEST_GROUP_DIR    .run/test-groups/<group>/: the group's stacks and scratch files
    SEGSCOPE_TEST_TAG          `_<n>`, n the block's number: appended to the group's netlab
                               prefixes, netns, veth and bpffs instance names (tests/isolation.py
                               own_name), so that another checkout running the same tests on this
                               machine at the same time never meets them

Within a group the names are the modules' own: modules that share one (or a session fixture)
run in the same group (tests/schedule.toml, [together]); every other module uses names of its own.

How modules are split: tests/schedule.toml groups modules that must run in one process into units;
tests/durations.json holds each module's measured seconds; units go, longest first, to the group
with the least work so far (a module without a recorded duration goes last to the lightest group).
--save-durations writes this run's measured durations to tests/durations.json (`make
test-durations`). Output: one log, one JUnit XML per group under .run/test-groups/; at the end
the failures of each failed group, one summary and one exit code (0 only if every group passed).
What the packaging tests need (a Debian root, the .debs, a pip venv) is built beside the groups
(tests/packaging/prepare.py); they run last in their group and wait for it. The summary gives each
group's CPU seconds and how busy the machine was per phase (whether more groups could help).
On SIGINT/SIGTERM the groups are interrupted (pytest tears its fixtures down), and whatever a
group left behind (its stacks, its labs, any process of ours) is stopped before this exits.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from netlab import keep_awake  # noqa: E402 - the idle cpu cgroup, as the relays' spinners have it
from tests.isolation import cgroup_cpu_s  # noqa: E402 - the runner and the groups' conftest read it alike

SCHEDULE = REPO / "tests" / "schedule.toml"
DURATIONS = REPO / "tests" / "durations.json"
OUT_DIR = REPO / ".run" / "test-groups"
PY = sys.executable
PORT_RANGE = (21000, 29000)  # the suite's port blocks (below the ephemeral ports, 32768-); a group's block is 100 ports
BLOCK_SIZE = 100
FULL_GROUPS = 4  # measured: tests/README.md
QUICK_GROUPS = 2  # the quick tests compute rather than wait: one group per CPU
NEW_MODULE_S = 30.0  # a module without a recorded duration counts this much when balancing
INTERRUPT_GRACE_S = 90.0  # after SIGINT: the fixtures' teardown (stacks, labs, agents) time
CPU_TOP = 12  # the summary's list of the modules that used the most CPU
FAILURE_LINES = 400  # a failed group's failures shown at the end, at most this many lines


# --------------------------------------------------------------------------- the plan
@dataclass
class Unit:
    """Modules that run whole in one group (one module, or what [together] ties)."""

    name: str
    modules: list[str]
    seconds: float
    known: bool  # some module of it has a recorded duration


@dataclass
class Group:
    name: str
    units: list[Unit] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(u.seconds for u in self.units)

    @property
    def modules(self) -> list[str]:
        return [m for u in self.units for m in u.modules]


def all_modules() -> list[str]:
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py"))


def load_schedule() -> dict:
    return tomllib.loads(SCHEDULE.read_text())


def durations_key(quick: bool) -> str:
    """The section of tests/durations.json for this kind of run: a module of the quick tests takes
    a fraction of its full-run time in `make test-quick` (two CPU-bound groups, no stacks beside
    it), so each kind balances by its own measurements."""
    return "quick_modules" if quick else "modules"


def load_durations(quick: bool = False) -> dict[str, float]:
    try:
        record = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}
    section = record.get(durations_key(quick)) or record.get("modules") or {}
    return {k: float(v) for k, v in section.items()}


def covered(module: str, prefixes: list[str]) -> bool:
    return any(module == p or module.startswith(p.rstrip("/") + "/") for p in prefixes)


def make_units(modules: list[str], schedule: dict, durations: dict[str, float]) -> list[Unit]:
    together: dict[str, str] = schedule.get("together", {})
    by_key: dict[str, list[str]] = {}
    for module in modules:
        key = next((p for p in together if covered(module, [p])), module)
        by_key.setdefault(key, []).append(module)
    units = []
    for key, mods in by_key.items():
        # known: some module of it has a recorded duration (a [together] folder that gained a new
        # module is still placed by its recorded seconds, the new one counted NEW_MODULE_S)
        known = any(m in durations for m in mods)
        seconds = sum(durations.get(m, NEW_MODULE_S) for m in mods)
        units.append(Unit(key, mods, seconds, known))
    return units


def balance(units: list[Unit], count: int) -> list[Group]:
    """Longest processing time first: each unit to the group with the least work so far; units
    of only unrecorded modules after all the others (the lightest groups get the new tests)."""
    groups = [Group(f"g{i + 1}") for i in range(count)]
    for unit in sorted(units, key=lambda u: (not u.known, -u.seconds, u.name)):
        min(groups, key=lambda g: (g.seconds, g.name)).units.append(unit)
    for g in groups:  # what waits for a background build runs after it may be ready (tests/conftest.py LAST)
        g.units.sort(key=lambda u: next((i + 1 for i, p in enumerate(RUN_LAST) if covered(u.name, [p])), 0))
        g.units = place_deploy(g.units)
    return [g for g in groups if g.units]


RUN_LAST = ("tests/packaging", "tests/deploy")  # tests/conftest.py LAST, in that order
# The deploy tests wait for the Kubernetes tools (scripts/k8s_tools.sh): ready about 3 min into the
# groups on a fresh machine, at once on a warm one. They run once their group has run this share of
# its recorded work, not last: a long unit at the end of a group is work no other group can take,
# and in fresh-machine runs the group that ended with them ended 20-25 s after the others.
DEPLOY_AFTER = 0.5


def place_deploy(units: list[Unit]) -> list[Unit]:
    """The tests/deploy unit moved to where the units before it hold DEPLOY_AFTER of the recorded
    seconds of the others (never after a tests/packaging unit: those wait for their own build)."""
    deploy = [u for u in units if covered(u.name, ["tests/deploy"])]
    if not deploy:
        return units
    rest = [u for u in units if u not in deploy]
    goal = DEPLOY_AFTER * sum(u.seconds for u in rest)
    at, done = len(rest), 0.0
    for i, u in enumerate(rest):
        if done >= goal or covered(u.name, ["tests/packaging"]):
            at = i
            break
        done += u.seconds
    return rest[:at] + deploy + rest[at:]


def write_shared_plan(groups: list[Group], out_dir: Path) -> Path:
    """The plan the groups share their units by (tests/work_sharing.py), and a fresh claims dir."""
    claims = out_dir / "claims"
    shutil.rmtree(claims, ignore_errors=True)
    claims.mkdir(parents=True)
    plan = {
        "units": {u.name: u.modules for g in groups for u in g.units},
        "order": {g.name: [u.name for u in g.units] for g in groups},
        "seconds": {u.name: u.seconds for g in groups for u in g.units},
        "claims": str(claims),
    }
    path = out_dir / "units.json"
    path.write_text(json.dumps(plan, indent=1) + "\n")
    return path


def plan(count: int, quick: bool) -> tuple[list[Group], list[Group]]:
    """(parallel groups, the alone phase: a group per unit, each with its stack; they prepare
    beside the last parallel groups and measure after them, one at a time)."""
    schedule = load_schedule()
    durations = load_durations(quick)
    modules = all_modules()
    if quick:
        quick_mods = [m for m in modules if covered(m, schedule["quick"]["modules"])]
        return balance(make_units(quick_mods, schedule, durations), count), []
    alone = [m for m in modules if covered(m, schedule.get("alone", {}).get("modules", []))]
    rest = [m for m in modules if m not in alone]
    # one group per [alone] unit: all prepare at once beside the last parallel groups, then measure
    # one at a time (tests/isolation.py wait_until_alone takes a lock)
    alone_units = make_units(alone, schedule, durations)
    alone_groups = [Group(f"alone{i + 1}", [u]) for i, u in enumerate(alone_units)]
    return balance(make_units(rest, schedule, durations), count), alone_groups


def last_phase(quick: bool) -> list[Group]:
    """The [last] group (tests/schedule.toml): modules that need the whole machine for themselves
    from their start, not only while they measure, run after every other group has ended. They are
    named in the schedule, not found by name: `make test-cluster` and this runner are what runs them."""
    if quick:
        return []
    schedule = load_schedule()
    modules = [m for m in schedule.get("last", {}).get("modules", []) if (REPO / m).exists()]
    return [Group("last", make_units(modules, schedule, load_durations()))] if modules else []


# --------------------------------------------------------------------------- ports
class PortBlocks:
    """Blocks of 100 ports in 21000-28999, each held by an abstract unix socket named after it:
    the kernel releases it when this process ends, however it ends (no file left behind), and a
    second run on the machine takes other blocks."""

    def __init__(self) -> None:
        self.held: list[socket.socket] = []

    def take(self) -> int:
        for base in range(PORT_RANGE[0], PORT_RANGE[1], BLOCK_SIZE):
            lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                lock.bind(f"\0segscope-test-ports-{base}")
            except OSError:
                lock.close()
                continue
            if any(port_busy(base + off) for off in (0, 1, 2, 3, 10, 11, 20, 21, 30, 31, 32, 33, 40, 41, 42, 43)):
                lock.close()  # someone outside the suite listens in this block: leave it to them
                continue
            self.held.append(lock)
            return base
        raise SystemExit(f"no free block of {BLOCK_SIZE} ports in {PORT_RANGE[0]}-{PORT_RANGE[1] - 1}")


def port_busy(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


# --------------------------------------------------------------------------- running
@dataclass
class Run:
    group: Group
    port_base: int
    dir: Path
    proc: subprocess.Popen | None = None
    started: float = 0.0
    ended: float = 0.0
    rc: int | None = None
    quick: bool = False
    cpu_s: float = 0.0  # CPU seconds of the group's pytest and the children it waited for
    alone_file: Path | None = None  # an [alone] group: exists once the parallel groups have ended
    cgroup: Path | None = None  # the group's processes, for their CPU seconds (cpu_cgroup)
    # the parallel groups' shared plan (tests/work_sharing.py): every group collects every module
    # of it and runs its own units, then those another group has not started
    shared: tuple[Path, list[str]] | None = None

    @property
    def log(self) -> Path:
        return self.dir.with_suffix(".log")

    @property
    def junit(self) -> Path:
        return self.dir.with_suffix(".xml")

    def env(self) -> dict[str, str]:
        return dict(
            os.environ,
            SEGSCOPE_STACK_PORT_BASE=str(self.port_base),
            SEGSCOPE_STACK_RUN_DIR=str(self.dir / "stack"),
            SEGSCOPE_TEST_PORT_BLOCK=str(self.port_base),
            SEGSCOPE_TEST_GROUP_DIR=str(self.dir),
            SEGSCOPE_TEST_GROUP=self.group.name,
            SEGSCOPE_TEST_TAG=f"_{(self.port_base - PORT_RANGE[0]) // BLOCK_SIZE}",
            **({"SEGSCOPE_TEST_QUICK": "1"} if self.quick else {}),
            **({"SEGSCOPE_TEST_ALONE_FILE": str(self.alone_file)} if self.alone_file else {}),
            **({"SEGSCOPE_TEST_ALONE_LOCK": str(self.alone_file.with_suffix(".lock"))} if self.alone_file else {}),
            **({"SEGSCOPE_TEST_BUILDS_STOP": str(builds_stop_file(self.alone_file))} if self.alone_file else {}),
            **({"SEGSCOPE_TEST_CPU_CGROUP": str(self.cgroup)} if self.cgroup else {}),
            **({"SEGSCOPE_TEST_UNITS": str(self.shared[0])} if self.shared else {}),
        )

    def units_ran(self) -> dict[str, list[str]] | None:
        """{"own": [...], "taken": [...]}: the units this group ran (tests/work_sharing.py)."""
        try:
            return json.loads((self.dir / "units.json").read_text())
        except (OSError, ValueError):
            return None

    def start(self, extra_args: list[str]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            PY, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={self.junit}",
            "-o", "junit_family=xunit1", *extra_args,
            *(["-p", "tests.work_sharing", *self.shared[1]] if self.shared else self.group.modules),
        ]  # fmt: skip
        with open(self.log, "w") as log:
            log.write(f"# {self.group.name}: {' '.join(cmd)}\n# port block {self.port_base}, dir {self.dir}\n")
            log.flush()
            # its own session: the terminal's Ctrl-C reaches this runner, which interrupts each
            # group itself (and waits for its teardown) instead of every process at once
            self.cgroup = cpu_cgroup(self.group.name)
            procs = self.cgroup / "cgroup.procs" if self.cgroup else None

            def enter_cgroup() -> None:  # in the child, before pytest: all it starts is counted
                if procs is not None:
                    procs.write_text(str(os.getpid()))

            self.proc = subprocess.Popen(
                cmd, cwd=REPO, env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=enter_cgroup,
            )  # fmt: skip
        self.started = time.monotonic()

    def poll(self) -> bool:
        if self.rc is None and self.proc is not None and self.proc.returncode is None:
            # wait4, not Popen.poll: the rusage says what the group cost in CPU (the summary)
            try:
                pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            except ChildProcessError:
                pid = 0
                self.proc.poll()
            if pid:
                self.proc.returncode = os.waitstatus_to_exitcode(status)
                self.cpu_s = usage.ru_utime + usage.ru_stime
                if self.cgroup is not None:  # with its stack and every daemon it started
                    self.cpu_s = max(self.cpu_s, cgroup_cpu_s(self.cgroup))
        if self.rc is None and self.proc is not None and self.proc.returncode is not None:
            self.rc, self.ended = self.proc.returncode, time.monotonic()
        return self.rc is not None

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    @property
    def wall(self) -> float:
        return (self.ended or time.monotonic()) - self.started if self.started else 0.0

    def counts(self) -> dict[str, int]:
        """passed/failed/errors/skipped from the JUnit XML (pytest's own count of the group)."""
        out = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
        try:
            root = ET.parse(self.junit).getroot()
        except (OSError, ET.ParseError):
            return out
        for case in root.iter("testcase"):
            kinds = {child.tag for child in case}
            if "failure" in kinds:
                out["failed"] += 1
            elif "error" in kinds:
                out["errors"] += 1
            elif "skipped" in kinds:
                out["skipped"] += 1
            else:
                out["passed"] += 1
        return out

    def durations(self) -> dict[str, float]:
        """Seconds per module (setup + call + teardown of each test, as JUnit reports them)."""
        out: dict[str, float] = {}
        try:
            root = ET.parse(self.junit).getroot()
        except (OSError, ET.ParseError):
            return out
        for case in root.iter("testcase"):
            module = case.get("file")
            if module:
                out[module] = out.get(module, 0.0) + float(case.get("time") or 0.0)
        return out

    def failures(self) -> str:
        """The group's failures as pytest printed them (FAILURES/ERRORS and the short summary)."""
        lines = self.log.read_text(errors="replace").splitlines()
        start = next(
            (i for i, line in enumerate(lines) if re.match(r"^=+ (FAILURES|ERRORS) =+$", line)), max(0, len(lines) - 60)
        )
        shown = lines[start:]
        if len(shown) > FAILURE_LINES:
            cut = len(shown) - FAILURE_LINES
            half = FAILURE_LINES // 2
            shown = shown[:half] + [f"... ({cut} lines cut: see {self.log})"] + shown[-half:]
        return "\n".join(shown)


class Interrupted(Exception):
    pass


def cpu_times() -> tuple[float, float, float]:
    """(busy, total, spinners) CPU seconds of the machine since boot (/proc/stat's cpu line), and of
    the delay relays' keep-awake spinners since this run began (their cgroup, SPINNERS)."""
    fields = [float(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(fields) - idle) / hz, sum(fields) / hz, cgroup_cpu_s(SPINNERS["cgroup"])


# The delay relays' keep-awake spinners (netlab/keep_awake.py) run only on CPU time nothing else
# wants, at SCHED_IDLE in an idle cpu cgroup. They still count as busy in /proc/stat, and in the
# cpuacct cgroup of the group that started them: one lab with relays made a 2-core machine look
# 100% busy. They go to a cpuacct cgroup of their own (SEGSCOPE_SPINNER_CPUACCT, which keep_awake
# reads), so a module's CPU seconds are its work and a phase's busy share says whether the
# machine has CPU left for another group.
SPINNERS: dict[str, Path | None] = {"cgroup": None}


def busy_text(t0: tuple[float, float, float], t1: tuple[float, float, float]) -> str:
    busy, total, spin = (b - a for a, b in zip(t0, t1))
    total = max(1.0, total)
    return f"{100 * (busy - spin) / total:.0f}% (the relays' idle spinners another {100 * spin / total:.0f}%)"


# --------------------------------------------------------------------------- CPU per group and module
CGROUP_ROOTS = (Path("/sys/fs/cgroup/cpuacct"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))


def cpu_cgroup(name: str) -> Path | None:
    """A cgroup of this run for one group (v1 cpuacct, or v2), or None where none can be made: every
    process the group starts (its stack, agents, labs' processes, daemons that outlive their
    parent) is counted in it, which the rusage of the group's pytest cannot do."""
    for root in CGROUP_ROOTS:
        usage = "cpuacct.usage" if root.name == "cpuacct" else "cpu.stat"
        if not (root / "cgroup.procs").exists():
            continue
        path = root / f"segscope-tests-{os.getpid()}" / name
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if (path / usage).exists():
            return path
    return None


def remove_cgroups() -> None:
    for root in CGROUP_ROOTS:
        top = root / f"segscope-tests-{os.getpid()}"
        if top.is_dir():
            for child in top.iterdir():
                if child.is_dir():
                    try:
                        child.rmdir()
                    except OSError:
                        pass
            try:
                top.rmdir()
            except OSError:
                pass


def cpu_by_module(runs: list[Run]) -> dict[str, float]:
    """CPU seconds per module, from each group's cgroup as its conftest read it at every test's
    start and end (tests/conftest.py: setup, call and teardown, with what a module's fixtures
    start); the session fixtures' stack is counted in the group's first module."""
    out: dict[str, float] = {}
    for run in runs:
        try:
            out.update(json.loads((run.dir / "cpu.json").read_text()))
        except (OSError, ValueError):
            pass
    return out


# Where the background builds go while the [alone] groups measure: an idle cpu cgroup (cpu.idle = 1,
# cgroup v1's cpu controller) of their own, made as the delay relays' keep-awake spinners' is
BUILDS_IDLE_CGROUP = "segscope-background-builds"
CPU_CGROUP_ROOTS = (keep_awake.CPU_CGROUP_V1,)


def session_pids(sid: int) -> list[int]:
    """Every process of a session and every descendant of its leader (scripts/test_builds.sh's: the
    builds and whatever they started, also in sessions of their own)."""
    parent, session = {}, {}
    for p in Path("/proc").glob("[0-9]*"):
        try:
            # the fields after the command's ")" (which may hold spaces): state ppid pgrp session
            fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
            parent[int(p.name)], session[int(p.name)] = int(fields[1]), int(fields[3])
        except (OSError, IndexError, ValueError):
            continue
    found = {pid for pid, s in session.items() if s == sid} | ({sid} if sid in parent else set())
    while True:
        more = {pid for pid, ppid in parent.items() if ppid in found} - found
        if not more:
            return sorted(found)
        found |= more


def cgroup_of(pid: int, root: Path) -> Path | None:
    """The cgroup of `pid` in the v1 hierarchy mounted at `root` (named after its controller, as
    /sys/fs/cgroup/cpu), from /proc/PID/cgroup."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if root.name in controllers.split(","):
            return root / rel.lstrip("/")
    return None


def builds_stop_file(alone_file: Path) -> Path:
    """Where an [alone] module that needs the background builds stopped, not only idle, writes its
    PID (tests/isolation.py wait_until_alone): they stand still while that process lives."""
    return alone_file.with_suffix(".builds-stop")


def builds_stop_wanted(path: Path) -> bool:
    try:
        os.kill(int(path.read_text()), 0)
    except (OSError, ValueError):
        return False
    return True


class BackgroundBuilds:
    """scripts/test_builds.sh's session (scripts/test.sh writes its PID to `pid_file`): held back
    while the [alone] groups measure, let go after. At its usual share (one session's), "alone"
    would be alone with `go build` and buildah: a fresh run's PDR search found 4 625 pps for a
    limiter of 8 000, the machine 94 % busy.

    Held back: moved into an idle cpu cgroup (keep_awake.idle_cgroup), where the builds run only on CPU
    time nothing else wants and yield the CPU at once to any other task that wakes. The [alone]
    groups' tests passed here beside a cold `go build -a std` in such a cgroup, and a fresh
    machine's builds go on through the [alone] phase (they stood still ~95 s when stopped).
    Processes the builds start meanwhile are born in it. Where no such cgroup can be made, the
    builds are stopped (SIGSTOP) instead, and so they are, also in the cgroup, while an [alone]
    module that measures packet rates asks for it (tests/isolation.py wait_until_alone): a compile
    at idle priority still slows a packet generator on the other vCPU (on many hosts its SMT
    sibling), and a fresh run's PDR search found 6 375 pps for a limiter of 8 000 beside them."""

    def __init__(
        self, pid_file: Path, cgroup_name: str = BUILDS_IDLE_CGROUP, roots: tuple[Path, ...] = CPU_CGROUP_ROOTS
    ):
        self.pid_file = pid_file
        self.cgroup_name, self.roots = cgroup_name, roots
        self.paused: int | None = None  # the session held back (its leader's PID)
        self.idle: Path | None = None  # the idle cgroup the builds are in, or None: stopped
        self.home: Path | None = None  # the cgroup they came from
        self.stopped = False  # SIGSTOP sent (in the cgroup: for an [alone] module that asked)
        self.t0 = 0.0

    def pause(self) -> None:
        try:
            sid = int(self.pid_file.read_text())
            os.kill(sid, 0)
        except (OSError, ValueError):  # no builds started, or all ended: nothing to hold back
            return
        self.paused, self.t0 = sid, time.monotonic()
        self.idle = next((g for g in (keep_awake.idle_cgroup(r, self.cgroup_name) for r in self.roots) if g), None)
        if self.idle is not None:
            self.home = cgroup_of(sid, self.idle.parent)
            if self.home is not None and self.move(session_pids(sid), self.idle):
                # twice: a process forked by one not yet moved, between the scan and its parent's move
                self.move(session_pids(sid), self.idle)
                say(
                    f"background builds (scripts/test_builds.sh, session {sid}) moved to the idle cpu cgroup "
                    f"{self.idle} while the [alone] groups measure: they use only CPU time nothing else wants"
                )
                return
            self.remove_idle()
        self.signal(signal.SIGSTOP)
        self.stopped = True
        say(f"background builds (scripts/test_builds.sh, process group {sid}) paused while the [alone] groups measure")

    def signal(self, sig: int) -> None:
        """The session's process group and every other process of it (session_pids)."""
        if self.paused is None:
            return
        with contextlib.suppress(OSError):
            os.killpg(self.paused, sig)
        for pid in session_pids(self.paused):
            with contextlib.suppress(OSError):
                os.kill(pid, sig)

    def stand_still(self, wanted: bool) -> None:
        """In the idle cgroup: stopped while `wanted` (an [alone] module asked), going on after."""
        if self.paused is None or self.idle is None or wanted == self.stopped:
            return
        self.signal(signal.SIGSTOP if wanted else signal.SIGCONT)
        self.stopped = wanted
        say(f"background builds {'stopped while an [alone] module measures packet rates' if wanted else 'going on'}")

    @staticmethod
    def move(pids: list[int], cgroup: Path) -> bool:
        """Each process to `cgroup`; False if none could be moved (a process that ended is skipped)."""
        moved = False
        for pid in pids:
            try:
                (cgroup / "cgroup.procs").write_text(f"{pid}\n")
                moved = True
            except OSError:
                pass
        return moved

    def remove_idle(self) -> None:
        if self.idle is not None:
            with contextlib.suppress(OSError):
                self.idle.rmdir()
        self.idle = None

    def resume(self) -> None:
        if self.paused is None:
            return
        if self.stopped:
            self.signal(signal.SIGCONT)
            self.stopped = False
        if self.idle is not None and self.home is not None:
            for _ in range(5):  # until no process is left in it (one may be forked while we move)
                try:
                    left = [int(x) for x in (self.idle / "cgroup.procs").read_text().split()]
                except OSError:
                    break
                if not left:
                    break
                self.move(left, self.home)
            self.remove_idle()
            say(f"background builds back at their share after {time.monotonic() - self.t0:.0f} s")
        else:
            say(f"background builds resumed after {time.monotonic() - self.t0:.0f} s")
        self.paused = None


def run_phase(
    runs: list[Run],
    extra_args: list[str],
    stop: dict,
    alone: list[Run] | None = None,
    alone_may_prepare: Callable[[], bool] | None = None,
    builds: BackgroundBuilds | None = None,
) -> None:
    """Start every run, wait for all; on a stop request interrupt them and wait for teardown.

    `alone`: the [alone] groups. They start when the first of `runs` has ended, or earlier when
    `alone_may_prepare()` says so (every unit of the shared plan started: what is left is the
    groups' last units), so that their stacks, labs and agents come up beside the last parallel
    groups; they measure only once every group of `runs` has ended: their modules wait for the
    file `alone_file` (tests/isolation.py wait_until_alone) before their traffic starts, and then
    take turns. Their wall time then costs only what follows. `builds`: held back while they measure."""
    try:
        _run_phase(runs, extra_args, stop, alone or [], alone_may_prepare, builds)
    finally:
        if builds is not None:
            builds.resume()


def _run_phase(
    runs: list[Run],
    extra_args: list[str],
    stop: dict,
    alone: list[Run],
    alone_may_prepare: Callable[[], bool] | None,
    builds: BackgroundBuilds | None,
) -> None:
    cpu0 = cpu_times()
    load0 = os.getloadavg()[0]
    for run in runs:
        run.start(extra_args)
        say(f"{run.group.name} started: {len(run.group.modules)} modules, ~{run.group.seconds:.0f} s recorded")
    interrupted_at = None
    alone_started = alone_signalled = False
    while True:
        polled = [run.poll() for run in runs]  # a list: every run polled (its end time taken) each turn
        may_prepare = any(polled) or (alone_may_prepare is not None and alone_may_prepare())
        if alone and not alone_started and may_prepare and not stop["signal"]:
            alone_started = True
            for run in alone:
                run.start(extra_args)
                say(f"{run.group.name} started beside the last groups: {len(run.group.modules)} modules, "
                    f"~{run.group.seconds:.0f} s recorded; it measures once they have ended")  # fmt: skip
        if all(polled) and not alone_signalled:
            alone_signalled = True
            if alone:
                cpu1 = cpu_times()
                say(
                    f"phase {'+'.join(r.group.name for r in runs)}: machine CPU busy {busy_text(cpu0, cpu1)}, "
                    f"load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; the [alone] "
                    "group measures now"
                )
                cpu0, load0 = cpu1, os.getloadavg()[0]
                if builds is not None:
                    builds.pause()
                for run in alone:
                    run.alone_file.touch()
                    if not run.started and not stop["signal"]:  # every group ended at once: nothing to overlap
                        run.start(extra_args)
                        say(f"{run.group.name} started: {len(run.group.modules)} modules")
        if builds is not None and alone_signalled and alone:
            builds.stand_still(builds_stop_wanted(builds_stop_file(alone[0].alone_file)))
        if all(polled) and all([run.poll() or not run.started for run in alone]):
            break
        if stop["signal"] and interrupted_at is None:
            interrupted_at = time.monotonic()
            for run in runs + alone:
                run.signal(signal.SIGINT)
        if interrupted_at is not None and time.monotonic() - interrupted_at > INTERRUPT_GRACE_S:
            for run in runs + alone:
                run.signal(signal.SIGKILL)
        # an orphan that ended (a daemon a script started, as cluster.sh's) is a zombie until we
        # reap it, and `kill -0` still finds a zombie: a stop that waits for the PID to go waited
        # its whole timeout (10 s for each Kubernetes component at the cluster's teardown)
        reap_orphans(KEEP_PIDS | {run.proc.pid for run in runs + alone if run.proc is not None})
        for run in runs + alone:
            if run.rc is not None and not getattr(run, "_said", False):
                run._said = True  # type: ignore[attr-defined]
                say(f"{run.group.name} finished in {run.wall:.0f} s: {summary_of(run)}")
        time.sleep(0.5)
    for run in runs + alone:
        if not getattr(run, "_said", False):
            say(f"{run.group.name} finished in {run.wall:.0f} s: {summary_of(run)}")
    # whether more groups could help: a machine busy ~100% of the phase gains nothing from them
    say(
        f"phase {'+'.join(r.group.name for r in (alone or runs))}: machine CPU busy "
        f"{busy_text(cpu0, cpu_times())}, all processes, ours and others'; load average {load0:.1f} at "
        f"the start, {os.getloadavg()[0]:.1f} at the end"
    )
    if stop["signal"]:
        raise Interrupted()


def summary_of(run: Run) -> str:
    c = run.counts()
    text = ", ".join(f"{v} {k}" for k, v in c.items() if v) or "no tests reported"
    return text + ("" if run.rc == 0 else f" (pytest exit {run.rc}, log {run.log.relative_to(REPO)})")


def say(msg: str) -> None:
    print(f"[tests {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def start_packaging_prep() -> subprocess.Popen:
    """tests/packaging/prepare.py in the background: the Debian root, the .debs and the pip venv
    the packaging tests need are built (much of it waiting on the package registries) while the
    groups run, instead of inside one group; their fixtures wait for it. Not niced: it is work a
    group would otherwise do at normal priority, and a starved build only makes its group wait
    (niced 10 under a load of 20 it took over 10 minutes). The sweep stops it."""
    out = OUT_DIR / "packaging-prep"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for step in ("root", "debs", "venv"):  # before any group can look (prepare.py rewrites them)
        (out / f"{step}.status").write_text("building\n")
    os.environ["SEGSCOPE_PACKAGING_PREP_DIR"] = str(out)
    with open(out / "prepare.log", "w") as log:
        return subprocess.Popen(
            [PY, "-m", "tests.packaging.prepare", str(out)],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip


# --------------------------------------------------------------------------- sweeping up
def become_subreaper() -> None:
    """Processes our tests start and lose (their parent died first) become our children, so the
    sweep can still find them: nothing of ours outlives the test command unnoticed."""
    PR_SET_CHILD_SUBREAPER = 36
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def sweep(runs: list[Run]) -> list[str]:
    """Stop what the groups left: stacks under their dirs, labs with state in .run/netlab, then
    any process still below this one. Returns what it had to stop (empty after a clean run)."""
    left: list[str] = []
    stack_dirs = sorted({lock.parent for run in runs for lock in run.dir.glob("**/.lock")})
    for run_dir in stack_dirs:
        if any((run_dir / s / f"{s}.pid").exists() for s in ("kafka", "influxdb", "telegraf")):
            out = subprocess.run(
                [PY, "-m", "services.stack", "down", "--if-unused", "--run-dir", str(run_dir)],
                cwd=REPO,
                capture_output=True,
                text=True,
            )
            stopped = re.findall(r"\[stack\] (\w+): stopped pid", out.stderr)
            if stopped:
                left.append(f"stack {run_dir.relative_to(REPO)}: {', '.join(stopped)}")
    netlab_root = REPO / ".run" / "netlab"
    for state in sorted(netlab_root.glob("*/state.json")) if netlab_root.is_dir() else []:
        prefix = state.parent.name
        subprocess.run([PY, "-m", "netlab", "down", "--prefix", prefix], cwd=REPO, capture_output=True)
        left.append(f"netlab lab {prefix}")
    for pid in descendants(os.getpid()):
        what = cmdline(pid)
        if not what:
            continue  # a zombie or gone
        try:
            os.kill(pid, signal.SIGKILL)
            left.append(f"process {pid}: {what[:160]}")
        except ProcessLookupError:
            pass
    reap_orphans(set())
    return left


# our own children, whose status their Popen collects: never reaped as orphans
KEEP_PIDS: set[int] = set()


def own_children() -> list[int]:
    """Our direct children, from the kernel's per-thread lists (cheap enough for every poll of the
    groups); without CONFIG_PROC_CHILDREN, from a walk of /proc."""
    tasks = list(Path(f"/proc/{os.getpid()}/task").glob("*/children"))
    if not tasks:
        return descendants(os.getpid())  # waitpid below refuses the grandchildren among them
    out: list[int] = []
    for task in tasks:
        try:
            out += [int(pid) for pid in task.read_text().split()]
        except OSError:
            continue
    return out


def reap_orphans(keep: set[int]) -> None:
    """Reap zombies that were reparented to us (never our own pytest children: Popen does)."""
    for pid in own_children():
        if pid in keep:
            continue
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z":
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


# --------------------------------------------------------------------------- main
def show_plan(groups: list[Group], alone: list[Group]) -> None:
    for g in groups + alone:
        mods = ", ".join(u.name.removeprefix("tests/") + ("" if u.known else " (new)") for u in g.units)
        say(f"{g.name} ~{g.seconds:.0f} s: {mods}")


def save_durations(runs: list[Run], quick: bool) -> None:
    """This run's seconds per module into its section of tests/durations.json (the other kind's
    section is kept)."""
    measured = {}
    for run in runs:
        measured.update(run.durations())
    try:
        record = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        record = {}
    record["about"] = (
        "seconds per test module, measured by scripts/test_groups.py in a parallel run: `modules` by "
        "`make test-durations`, `quick_modules` by `bash scripts/test.sh --quick --save-durations`; "
        "used only to balance the groups"
    )
    record[durations_key(quick)] = {k: round(v, 1) for k, v in sorted(measured.items())}
    DURATIONS.write_text(json.dumps(record, indent=1) + "\n")
    say(f"wrote {DURATIONS.relative_to(REPO)} [{durations_key(quick)}] ({len(measured)} modules)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--groups",
        type=int,
        default=int(os.environ.get("SEGSCOPE_TEST_GROUPS", "0")) or None,
        help=f"parallel groups (default {FULL_GROUPS}; --quick: {QUICK_GROUPS}, its tests keep the CPUs busy)",
    )
    ap.add_argument("--quick", action="store_true", help="only the tests of tests/schedule.toml [quick]")
    ap.add_argument("--plan", action="store_true", help="print the split and exit")
    ap.add_argument("--save-durations", action="store_true", help="write tests/durations.json after the run")
    # anything else goes to pytest: options (-x, -k EXPR) to every group; with test paths among
    # them the paths replace the split (one group runs exactly what was asked, on its own stack)
    args, pytest_args = ap.parse_known_args(argv)

    paths = [a for a in pytest_args if not a.startswith("-") and Path(a.split("::")[0]).exists()]
    if paths:
        groups, alone, last = [Group("g1", [Unit("as asked: " + " ".join(pytest_args), [], 0.0, True)])], [], []
    else:
        count = args.groups or (QUICK_GROUPS if args.quick else FULL_GROUPS)
        groups, alone = plan(max(1, count), args.quick)
        last = last_phase(args.quick)
    show_plan(groups, alone + last)
    if args.plan:
        return 0

    # what session fixtures `make` (datapath, collectors, the e2e tools) is built once here, so
    # that their `make` calls in parallel groups find nothing to do instead of racing
    if subprocess.run(["make", "-s", "build"], cwd=REPO).returncode != 0:
        say("make build failed")
        return 2

    if not args.quick and not paths and any(m.startswith("tests/packaging/") for g in groups for m in g.modules):
        KEEP_PIDS.add(start_packaging_prep().pid)

    stop = {"signal": 0}

    def on_signal(signum, _frame):
        if not stop["signal"]:
            say(f"{signal.Signals(signum).name}: interrupting every group (their teardown runs first)")
        stop["signal"] = signum

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    become_subreaper()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    blocks = PortBlocks()
    SPINNERS["cgroup"] = cpu_cgroup("keep-awake-spinners")
    if SPINNERS["cgroup"] is not None:
        os.environ["SEGSCOPE_SPINNER_CPUACCT"] = str(SPINNERS["cgroup"])  # every group inherits it
    t0 = time.monotonic()
    runs = [Run(g, blocks.take(), OUT_DIR / g.name, quick=args.quick) for g in groups]
    every_unit_started = None
    if len(runs) > 1:
        shared = (write_shared_plan(groups, OUT_DIR), [m for g in groups for m in g.modules])
        for run in runs:
            (run.dir / "units.json").unlink(missing_ok=True)
            run.shared = shared
        units = sum(len(g.units) for g in groups)

        def every_unit_started() -> bool:  # every unit claimed: each group is on its last one
            return sum(1 for _ in (OUT_DIR / "claims").iterdir()) >= units

    done: list[Run] = []
    interrupted = False
    try:
        alone_runs = [Run(g, blocks.take(), OUT_DIR / g.name, alone_file=OUT_DIR / "alone.go") for g in alone]
        for run in alone_runs:
            run.alone_file.unlink(missing_ok=True)
            builds_stop_file(run.alone_file).unlink(missing_ok=True)
        done += runs + alone_runs
        builds = BackgroundBuilds(REPO / ".local" / "bin" / ".k8s-tools.pid")
        run_phase(runs, pytest_args, stop, alone=alone_runs, alone_may_prepare=every_unit_started, builds=builds)
        # the [last] group: alone on the machine from its start (its stack, cluster and labs too)
        last_runs = [Run(g, blocks.take(), OUT_DIR / g.name) for g in last]
        if last_runs:
            say(f"the [last] phase: {', '.join(m for r in last_runs for m in r.group.modules)}")
            done += last_runs
            run_phase(last_runs, pytest_args, stop)
    except Interrupted:
        interrupted = True
        done = runs + [r for r in done if r not in runs]
    finally:
        left = sweep(runs + [r for r in done if r not in runs])
    wall = time.monotonic() - t0

    print()
    failed = [r for r in done if r.rc != 0]
    for run in failed:
        print(f"{'=' * 30} {run.group.name}: failures (full log {run.log.relative_to(REPO)}) {'=' * 30}")
        print(run.failures())
        print()
    print(f"{'=' * 30} summary {'=' * 30}")
    totals: dict[str, int] = {}
    for run in done:
        for k, v in run.counts().items():
            totals[k] = totals.get(k, 0) + v
        status = "ok" if run.rc == 0 else f"FAILED (exit {run.rc})"
        ran = run.units_ran() if run.shared else None
        units = {u.name: u for g in groups for u in g.units}
        mods = (
            sum(len(units[u].modules) for u in ran["own"] + ran["taken"] if u in units)
            if ran
            else len(run.group.modules)
        )
        taken = f", {len(ran['taken'])} units taken from other groups" if ran and ran["taken"] else ""
        print(
            f"{run.group.name:8} {run.wall:6.0f} s  {run.cpu_s:6.0f} CPU-s  {mods:3} modules  {status:18} "
            f"{summary_of(run)}{taken}"
        )
    print(f"{'all':8} {wall:6.0f} s  " + ", ".join(f"{v} {k}" for k, v in totals.items() if v))
    if SPINNERS["cgroup"] is not None:
        print(f"the relays' keep-awake spinners: {cgroup_cpu_s(SPINNERS['cgroup']):.0f} CPU-s of idle time, "
              "counted in no group")  # fmt: skip
    cpu = cpu_by_module(done)
    if cpu:
        top = sorted(cpu.items(), key=lambda kv: -kv[1])[:CPU_TOP]
        print(f"most CPU (of {sum(cpu.values()):.0f} CPU-s in modules; per group: {OUT_DIR.name}/<group>/cpu.json):")
        for module, seconds in top:
            print(f"  {seconds:7.1f} CPU-s  {module}")
    remove_cgroups()
    if left:
        print("swept up after the groups (a test or fixture did not stop these):")
        for what in left:
            print(f"  {what}")
    if args.save_durations and not failed and not interrupted:
        save_durations(done, args.quick)
    if interrupted:
        return 130
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
