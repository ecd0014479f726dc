"""Keep a delay relay's spinner threads truly idle.

`delay_relay --keep-awake` runs one SCHED_IDLE spinning thread per CPU so that a
VM's vCPUs never halt and the relay's timer wakes on time. SCHED_IDLE only yields
to the tasks of the same task group, though: with autogroup scheduling
(`kernel.sched_autogroup_enabled`, on by default) every session is a task group,
and netlab starts each relay in a session of its own. Its spinners then took a
full fair share of the CPUs from every other session: beside six relays a
CPU-bound job ran three times slower (measured on a 2-vCPU VM).

The fix puts the spinners where "idle" means idle machine-wide: a cpu cgroup with
`cpu.idle = 1` (cgroup v1's cpu controller, which takes single threads). The
relay cannot do it itself: it runs under `ip netns exec`, whose fresh /sys hides
/sys/fs/cgroup. Where no such cgroup can be made, the relay's own autogroup gets
the lowest weight (nice 19), which leaves the spinners about 1.5 % of a share.
"""

from __future__ import annotations

import os
from pathlib import Path

CPU_CGROUP_V1 = Path("/sys/fs/cgroup/cpu")
IDLE_CGROUP_NAME = "segscope-keep-awake"


def spinner_tids(pid: int) -> list[int]:
    """The relay's threads other than its main thread: with --keep-awake these are
    the spinners, the relay starts no other thread."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []
    return sorted(t for t in tids if t != pid)


def idle_cgroup(root: Path = CPU_CGROUP_V1, name: str = IDLE_CGROUP_NAME) -> Path | None:
    """The idle cpu cgroup `name`, made on first use; None where the kernel has none. The spinners'
    by default; the test runner puts its background builds in one of their own."""
    if not (root / "tasks").exists():
        return None
    group = root / name
    try:
        group.mkdir(exist_ok=True)
        if (group / "cpu.idle").exists():
            (group / "cpu.idle").write_text("1\n")
        else:  # kernels before 5.15: the lowest weight is the closest there is
            (group / "cpu.shares").write_text("2\n")
    except OSError:
        return None
    return group


def make_spinners_idle(pid: int) -> str:
    """Move the relay's spinners out of its task group's fair share. Returns how:
    "cgroup", "autogroup", "none" (no spinners) or "failed"."""
    tids = spinner_tids(pid)
    if not tids:
        return "none"
    account_spinners(tids)
    group = idle_cgroup()
    if group is not None:
        try:
            for tid in tids:
                (group / "tasks").write_text(f"{tid}\n")
            return "cgroup"
        except OSError:
            pass  # a thread gone meanwhile, or the write refused: try the autogroup
    try:
        if os.getsid(pid) == pid:  # the relay leads its session: the autogroup is its own
            Path(f"/proc/{pid}/autogroup").write_text("19\n")
            return "autogroup"
    except OSError:
        pass
    return "failed"


def account_spinners(tids: list[int]) -> None:
    """Count the spinners' CPU apart, in the v1 cpuacct cgroup SEGSCOPE_SPINNER_CPUACCT names
    (the test runner sets it): they burn only idle time, which would otherwise show as the CPU
    seconds of whichever test started the relay. Best effort: accounting, never behaviour."""
    where = os.environ.get("SEGSCOPE_SPINNER_CPUACCT")
    if not where or not (Path(where) / "tasks").exists():
        return
    for tid in tids:
        try:
            (Path(where) / "tasks").write_text(f"{tid}\n")
        except OSError:
            pass  # the thread is gone


def remove_idle_cgroup(root: Path = CPU_CGROUP_V1) -> bool:
    """Remove the idle cgroup once no spinner is left in it (True if gone)."""
    group = root / IDLE_CGROUP_NAME
    try:
        group.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False  # still in use by another lab's relays
    return True
