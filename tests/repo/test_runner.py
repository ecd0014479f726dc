"""The test command's runner (scripts/test_groups.py): the [alone] group prepares beside the last
parallel groups and measures only once they have all ended."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_runner():
    spec = importlib.util.spec_from_file_location("test_groups_under_test", REPO / "scripts" / "test_groups.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


# A module that writes when it starts and when wait_until_alone returned; `sleep_s` of work before.
PROBE = """
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, {repo!r})
from tests.isolation import wait_until_alone

def test_probe():
    t0 = time.time()
    if {burn}:  # a daemon (its parent exits at once) that burns 0.5 s of CPU: no rusage sees it
        import subprocess
        subprocess.run(["sh", "-c", "{python} {burner} &"], check=True)
    Path({out!r} + ".started").touch()
    time.sleep({sleep_s})
    deadline = time.time() + 120
    while {wait_for!r} and not Path({wait_for!r}).exists() and time.time() < deadline:
        time.sleep(0.1)  # until the other probe has started (a loaded machine starts it late)
    waited = wait_until_alone()
    Path({out!r}).write_text(json.dumps({{"start": t0, "alone": time.time(), "waited": waited}}))
"""


def write_probe(tmp: Path, name: str, sleep_s: float, burn: bool = False, wait_for: str = "") -> tuple[Path, Path]:
    out = tmp / f"{name}.json"
    mod = tmp / f"test_{name}.py"
    burner = tmp / "burn.py"
    burner.write_text("import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5:\n    pass\n")
    mod.write_text(
        PROBE.format(
            repo=str(REPO),
            sleep_s=sleep_s,
            out=str(out),
            burn=burn,
            python=sys.executable,
            burner=burner,
            wait_for=wait_for,
        )
    )
    return mod, out


def test_alone_group_prepares_beside_the_last_groups_and_measures_after_them(tmp_path):
    tg = load_runner()
    fast, fast_out = write_probe(tmp_path, "fast", 0.2, burn=True)
    slow, slow_out = write_probe(tmp_path, "slow", 0.5, wait_for=str(tmp_path / "alone.json.started"))
    alone, alone_out = write_probe(tmp_path, "alone", 0.0)
    out_dir = tmp_path / "groups"

    def run(name: str, module: Path, port: int, **kw):
        group = tg.Group(name, [tg.Unit(name, [str(module)], 1.0, True)])
        return tg.Run(group, port, out_dir / name, **kw)

    runs = [run("g1", fast, 28700), run("g2", slow, 28800)]
    alone_run = run("alone", alone, 28900, alone_file=out_dir / "alone.go")
    try:
        tg.run_phase(runs, [], {"signal": 0}, alone=[alone_run])
    finally:
        time.sleep(1.0)  # the daemon's last CPU
        burnt = tg.cgroup_cpu_s(runs[0].cgroup)
        tg.remove_cgroups()

    assert [r.rc for r in runs + [alone_run]] == [0, 0, 0], [r.log.read_text()[-2000:] for r in runs + [alone_run]]
    got = json.loads(alone_out.read_text())
    slow = json.loads(slow_out.read_text())
    # started while g2's test still ran (after g1 ended), and went on only after g2 had ended
    assert got["start"] < slow["alone"] <= got["alone"], (got, slow)
    assert got["waited"] > 0.5, got
    assert alone_run.started < runs[1].ended
    # the parallel groups see no alone file: they never wait
    assert json.loads(fast_out.read_text())["waited"] == 0.0
    # the group's cgroup counts what its daemon burnt, which the rusage of its pytest cannot
    assert runs[0].cgroup is not None, "no cgroup (cpuacct or v2) could be made here"
    if runs[0].cgroup:
        assert burnt >= 0.5 and burnt >= runs[0].cpu_s, (burnt, runs[0].cpu_s)


# A stand-in for scripts/test_builds.sh: a session leader that ticks every 20 ms, with a child and a
# grandchild in a session of its own (as a build's tools may start); their PIDs in `pids`.
BUILDS = """
import os, subprocess, sys, time
child = subprocess.Popen(["sleep", "60"])
grandchild = subprocess.Popen(["sleep", "60"], start_new_session=True)
open({pids!r}, "w").write(f"{{os.getpid()}} {{child.pid}} {{grandchild.pid}}")
while True:
    open({ticks!r}, "a").write(f"{{time.time()}}\\n")
    time.sleep(0.02)
"""


def start_builds(tmp_path: Path) -> tuple[subprocess.Popen, Path, list[int]]:
    ticks, pids = tmp_path / "ticks", tmp_path / "builds.pids"
    builds = subprocess.Popen(
        [sys.executable, "-c", BUILDS.format(pids=str(pids), ticks=str(ticks))], start_new_session=True
    )
    deadline = time.time() + 30
    while not (pids.exists() and len(pids.read_text().split()) == 3) and time.time() < deadline:
        time.sleep(0.05)
    (tmp_path / "builds.pid").write_text(str(builds.pid))
    return builds, ticks, [int(x) for x in pids.read_text().split()]


def stop_builds(builds: subprocess.Popen, pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    builds.wait()


def alone_phase(tg, tmp_path: Path, builds, extra: str = "") -> tuple[list, dict, float]:
    """One parallel group and an [alone] probe that measures for 1.5 s (running `extra` first)."""
    fast, _ = write_probe(tmp_path, "fast", 0.2)
    alone, alone_out = write_probe(tmp_path, "alone", 0.0)
    end_file = Path(str(alone_out) + ".end")
    alone.write_text(alone.read_text() + extra + f"\n    time.sleep(1.5)\n    Path({str(end_file)!r}).touch()\n")
    out_dir = tmp_path / "groups"
    group = tg.Group("g1", [tg.Unit("g1", [str(fast)], 1.0, True)])
    alone_group = tg.Group("alone", [tg.Unit("alone", [str(alone)], 1.0, True)])
    runs = [tg.Run(group, 28700, out_dir / "g1")]
    alone_run = tg.Run(alone_group, 28900, out_dir / "alone", alone_file=out_dir / "alone.go")
    try:
        tg.run_phase(runs, [], {"signal": 0}, alone=[alone_run], builds=builds)
    finally:
        tg.remove_cgroups()
    runs.append(alone_run)
    assert [r.rc for r in runs] == [0, 0], [r.log.read_text()[-2000:] for r in runs]
    return runs, json.loads(alone_out.read_text()), end_file.stat().st_mtime


def cpu_cgroup_line(pid: int) -> str:
    """The line of /proc/PID/cgroup for the cpu controller (v1), else v2's."""
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    v1 = [ln for ln in lines if "cpu" in ln.split(":")[1].split(",")]
    return (v1 or [ln for ln in lines if ln.startswith("0::")])[0]


@dataclass
class Held:
    """What the stand-in builds did through an [alone] phase: the probe's times (`got`: when it was
    alone; `end`), the builds' ticks, and each of their processes' cpu cgroup before and after."""

    got: dict
    end: float
    ticks: list[float]
    home: dict[int, str]
    after: dict[int, str]


def hold_builds(tg, tmp_path: Path, extra: str = "", **builds_kw) -> Held:
    """The stand-in builds (start_builds) through an [alone] phase whose probe runs `extra`."""
    builds, ticks, pids = start_builds(tmp_path)
    home = {pid: cpu_cgroup_line(pid) for pid in pids}
    try:
        _, got, end = alone_phase(tg, tmp_path, tg.BackgroundBuilds(tmp_path / "builds.pid", **builds_kw), extra)
        time.sleep(0.5)  # the ticker runs on
        after = {pid: cpu_cgroup_line(pid) for pid in pids}
    finally:
        stop_builds(builds, pids)
    return Held(got, end, [float(x) for x in ticks.read_text().split()], home, after)


def idle_cgroup_name(tg) -> str:
    """A name of this test's own for the builds' idle cgroup, checked to be makeable here."""
    name = f"segscope-test-builds-{os.getpid()}"
    made = tg.keep_awake.idle_cgroup(tg.CPU_CGROUP_ROOTS[0], name)
    if made is None:
        pytest.fail("no idle cpu cgroup can be made here (cgroup v1's cpu controller)")
    made.rmdir()  # the builds' hold makes it again
    return name


def test_background_builds_run_in_an_idle_cgroup_while_the_alone_group_measures(tmp_path):
    """While the [alone] group measures, the builds (the session, its descendants, also those in a
    session of their own) are in an idle cpu cgroup (cpu.idle = 1): they use only CPU time nothing
    else wants. Before and after, they are in their own cgroup, and the idle one is gone after."""
    tg = load_runner()
    name = idle_cgroup_name(tg)
    seen = tmp_path / "seen.json"
    # the probe, itself at its usual share, looks at the builds' cgroups while it measures
    probe = f"""
    here = {{}}
    for pid in open({str(tmp_path / "builds.pids")!r}).read().split():
        line = [ln for ln in open(f"/proc/{{pid}}/cgroup").read().splitlines()
                if "cpu" in ln.split(":")[1].split(",")] or [ln for ln in open(f"/proc/{{pid}}/cgroup")
                if ln.startswith("0::")]
        here[pid] = line[0].strip()
    idle = [p for p in ({str(tg.CPU_CGROUP_ROOTS[0] / name)!r},) if os.path.exists(p + "/cpu.idle")]
    here["cpu.idle"] = open(idle[0] + "/cpu.idle").read().strip() if idle else None
    Path({str(seen)!r}).write_text(json.dumps(here))"""
    held = hold_builds(tg, tmp_path, probe, cgroup_name=name)
    during = json.loads(seen.read_text())
    assert during.pop("cpu.idle") == "1"
    assert len(during) == 3 and all(line.endswith("/" + name) for line in during.values()), (during, name)
    assert held.after == held.home, (held.after, held.home)
    assert not any((root / name).exists() for root in tg.CPU_CGROUP_ROOTS), "the idle cgroup is left"
    t = held.ticks
    assert any(x < held.got["alone"] for x in t) and any(x > held.end for x in t), "the builds ran before and after"


def test_background_builds_stand_still_while_an_alone_module_asks(tmp_path):
    """An [alone] module that measures packet rates asks for the builds stopped, not only idle
    (wait_until_alone(builds_stopped=True)): from its call until its process ends they do not run,
    and they go on after, back in their own cgroup."""
    tg = load_runner()
    name = idle_cgroup_name(tg)
    stopped_at = tmp_path / "stopped_at"
    ask = f"""
    wait_until_alone(builds_stopped=True)
    Path({str(stopped_at)!r}).write_text(str(time.time()))"""
    held = hold_builds(tg, tmp_path, ask, cgroup_name=name)
    since = float(stopped_at.read_text())
    during = [x for x in held.ticks if since <= x <= held.end]
    assert not during, f"{len(during)} ticks while the [alone] module that asked measured"
    assert any(x > held.end for x in held.ticks), "the builds went on after"
    assert held.after == held.home, (held.after, held.home)
    assert not any((root / name).exists() for root in tg.CPU_CGROUP_ROOTS), "the idle cgroup is left"


def test_background_builds_stop_while_the_alone_group_measures_where_no_idle_cgroup_can_be_made(tmp_path):
    """Without a cgroup to move them to, the builds are stopped from the moment the parallel groups
    have ended until the [alone] groups have, and run on after: here a stand-in that ticks every
    20 ms, and an [alone] probe that measures for 1.5 s."""
    tg = load_runner()
    held = hold_builds(tg, tmp_path, roots=())
    during = [x for x in held.ticks if held.got["alone"] <= x <= held.end]
    assert not during, f"{len(during)} ticks while the [alone] group measured"
    t = held.ticks
    assert any(x < held.got["alone"] for x in t) and any(x > held.end for x in t), "the builds ran before and after"


def test_every_alone_module_waits_until_alone_before_its_traffic():
    schedule = tomllib.loads((REPO / "tests" / "schedule.toml").read_text())
    modules = schedule["alone"]["modules"]
    assert modules
    for module in modules:
        text = (REPO / module).read_text()
        assert re.search(r"\bwait_until_alone\(", text), f"{module}: [alone] modules call wait_until_alone()"


def test_deploy_runs_mid_group_and_packaging_last():
    """The deploy tests wait for the Kubernetes tools, the packaging tests for their own build: the
    packaging unit ends its group; the deploy unit runs once the units before it hold half of the
    group's other recorded seconds, not last, where no other group could share its length."""
    tg = load_runner()
    u = lambda name, s: tg.Unit(name, [name], s, True)  # noqa: E731
    units = [u("tests/a.py", 300), u("tests/b.py", 200), u("tests/packaging", 100), u("tests/deploy", 150),
             u("tests/c.py", 100), u("tests/d.py", 50)]  # fmt: skip
    (group,) = tg.balance(units, 1)
    names = [x.name for x in group.units]
    # the others: 300 + 200 + 100 + 50 + 100 (packaging) = 750; half is 375, reached after a and b
    assert names == ["tests/a.py", "tests/b.py", "tests/deploy", "tests/c.py", "tests/d.py", "tests/packaging"]
    # a group whose other units are only packaging: deploy still before it
    (group,) = tg.balance([u("tests/packaging", 100), u("tests/deploy", 150)], 1)
    assert [x.name for x in group.units] == ["tests/deploy", "tests/packaging"]
    # the plan of the suite: deploy is in a group, before that group's packaging unit if it has one
    groups, _ = tg.plan(4, quick=False)
    (holder,) = [g for g in groups if any(x.name == "tests/deploy" for x in g.units)]
    order = [x.name for x in holder.units]
    assert order.index("tests/deploy") < len(order) - 1, order


def test_the_cluster_test_runs_in_the_last_phase_and_nowhere_else():
    """The local cluster's test is in the test command (never skipped), once: in the [last] group,
    after every other group; no parallel or [alone] group collects it."""
    tg = load_runner()
    last = tg.last_phase(quick=False)
    assert [m for g in last for m in g.modules] == ["tests/deploy/cluster_install.py"]
    groups, alone = tg.plan(4, quick=False)
    elsewhere = [m for g in groups + alone for m in g.modules]
    assert "tests/deploy/cluster_install.py" not in elsewhere
    assert not any(Path(m).name == "cluster_install.py" for m in tg.all_modules())
    assert tg.last_phase(quick=True) == []  # make test-quick: no services, no cluster


# A module whose module-scoped fixture logs its setup and teardown, per group, and whose test
# sleeps `sleep_s`: what each group ran, in what order, and that pytest tore a module down before
# the next one came up.
SHARED_PROBE = """
import os, time
from pathlib import Path
import pytest

@pytest.fixture(scope="module")
def logged():
    log = Path({log!r}) / (os.environ["SEGSCOPE_TEST_GROUP"] + ".log")
    with log.open("a") as f:
        f.write("setup {name}\\n")
    yield
    with log.open("a") as f:
        f.write("teardown {name}\\n")

def test_one(logged):
    deadline = time.time() + 60
    while {wait_for!r} and not Path({wait_for!r}).exists() and time.time() < deadline:
        time.sleep(0.05)  # the other group has started its first unit (a loaded machine starts it late)
    time.sleep({sleep_s})

def test_two(logged):
    pass
"""


def test_a_group_done_with_its_share_takes_the_units_another_group_has_not_started(tmp_path):
    """g1's share is short, g2's first unit long (its recorded seconds were not): g1 takes g2's
    other units, smallest first; every module runs once, torn down before the next one."""
    tg = load_runner()
    log_dir = tmp_path / "logs"
    log_dir.mkdir()

    def probe(name: str, sleep_s: float, wait_for: str) -> str:
        mod = tmp_path / f"test_{name}.py"
        mod.write_text(SHARED_PROBE.format(log=str(log_dir), name=name, sleep_s=sleep_s, wait_for=wait_for))
        return str(mod)

    def unit(name: str, sleep_s: float, recorded_s: float, wait_for: str = ""):
        return tg.Unit(name, [probe(name, sleep_s, wait_for)], recorded_s, True)

    groups = [
        tg.Group("g1", [unit("a", 0.1, 3.0, wait_for=str(log_dir / "g2.log"))]),
        tg.Group("g2", [unit("b", 4.0, 1.0), unit("c", 0.1, 0.6), unit("d", 0.1, 0.5)]),
    ]
    out_dir = tmp_path / "groups"
    out_dir.mkdir()
    shared = (tg.write_shared_plan(groups, out_dir), [m for g in groups for m in g.modules])
    runs = [tg.Run(g, port, out_dir / g.name, shared=shared) for g, port in zip(groups, (28700, 28800))]
    try:
        tg.run_phase(runs, [], {"signal": 0})
    finally:
        tg.remove_cgroups()
    assert [r.rc for r in runs] == [0, 0], [r.log.read_text()[-2000:] for r in runs]
    assert runs[0].units_ran() == {"own": ["a"], "taken": ["d", "c"]}, runs[0].units_ran()
    assert runs[1].units_ran() == {"own": ["b"], "taken": []}, runs[1].units_ran()
    g1 = (log_dir / "g1.log").read_text().split("\n")[:-1]
    assert g1 == ["setup a", "teardown a", "setup d", "teardown d", "setup c", "teardown c"], g1
    assert (log_dir / "g2.log").read_text().split("\n")[:-1] == ["setup b", "teardown b"]
    # every test ran once, in the group that ran its module
    assert [r.counts()["passed"] for r in runs] == [6, 2]


ALONE_PROBE = """
import json, time
from pathlib import Path
from tests.isolation import wait_until_alone

def test_probe():
    waited = wait_until_alone()
    t_alone = time.time()
    time.sleep(0.8)  # the timed traffic
    Path({out!r}).write_text(json.dumps({{"alone": t_alone, "end": time.time(), "waited": waited}}))
"""


def test_alone_groups_prepare_together_and_measure_one_at_a_time(tmp_path):
    """Two [alone] groups start beside a parallel group and wait; once it has ended, each measures
    with the lock held, so their timed parts never overlap."""
    tg = load_runner()
    busy, busy_out = write_probe(tmp_path, "busy", 1.0)
    out_dir = tmp_path / "groups"
    outs = [tmp_path / "a1.json", tmp_path / "a2.json"]
    alone_runs = []
    for i, out in enumerate(outs):
        mod = tmp_path / f"test_alone{i}.py"
        mod.write_text(ALONE_PROBE.format(out=str(out)))
        group = tg.Group(f"alone{i + 1}", [tg.Unit(mod.name, [str(mod)], 1.0, True)])
        alone_runs.append(tg.Run(group, 28900 + 10 * i, out_dir / group.name, alone_file=out_dir / "alone.go"))
    run = tg.Run(tg.Group("g1", [tg.Unit("busy", [str(busy)], 1.0, True)]), 28700, out_dir / "g1")
    try:
        tg.run_phase([run], [], {"signal": 0}, alone=alone_runs, alone_may_prepare=lambda: True)
    finally:
        tg.remove_cgroups()
    assert [r.rc for r in [run, *alone_runs]] == [0, 0, 0], [r.log.read_text()[-2000:] for r in [run, *alone_runs]]
    a, b = sorted((json.loads(o.read_text()) for o in outs), key=lambda x: x["alone"])
    assert a["end"] <= b["alone"], (a, b)  # one at a time
    assert a["alone"] >= json.loads(busy_out.read_text())["alone"]  # after the parallel group's test
    assert all(r.started < run.ended for r in alone_runs)  # prepared beside it


ORPHAN_PROBE = """
import os, subprocess, time
from pathlib import Path

def test_orphan_is_reaped():
    pidfile = Path({pidfile!r})
    # a daemon whose parent exits at once: it becomes the runner's child (a subreaper)
    subprocess.run(["sh", "-c", "sleep 0.3 & echo $! > " + str(pidfile)], check=True)
    pid = int(pidfile.read_text())
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            os.kill(pid, 0)  # a zombie still answers: what cluster.sh's stop waited on
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError(f"pid {{pid}} still there 10 s after it ended: not reaped")
"""

RUN_ONE_GROUP = """
import sys
sys.path.insert(0, {repo!r})
from tests.repo.test_runner import load_runner
tg = load_runner()
tg.become_subreaper()
run = tg.Run(tg.Group("g1", [tg.Unit("orphan", [{module!r}], 1.0, True)]), 28700, tg.Path({out!r}))
try:
    tg.run_phase([run], [], {{"signal": 0}})
finally:
    tg.remove_cgroups()
sys.exit(run.rc)
"""


def test_an_orphan_that_ended_is_reaped_while_the_groups_run(tmp_path):
    """A daemon started by a script (its parent gone) is the runner's child; once it has ended the
    runner reaps it during the phase, so `kill -0` of its PID fails as a test's stop expects."""
    module = tmp_path / "test_orphan.py"
    module.write_text(ORPHAN_PROBE.format(pidfile=str(tmp_path / "daemon.pid")))
    script = tmp_path / "run_one.py"
    script.write_text(RUN_ONE_GROUP.format(repo=str(REPO), module=str(module), out=str(tmp_path / "g1")))
    done = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=120)
    log = (tmp_path / "g1.log").read_text() if (tmp_path / "g1.log").exists() else ""
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:] + log[-3000:]
