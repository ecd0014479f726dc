"""What the worker benchmarks share for scaling runs: a command pinned to one CPU, the CPU time a
process has used, and stopping the processes a run started.

Records per CPU-second of the worker processes is the figure other load on this shared 2-core
machine changes least (wall rates also depend on what else runs); pinning each worker to its own
CPU keeps two workers of one group from sharing a core with each other.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of process `pid` so far, all its threads (fields 14 and 15 of /proc/<pid>/stat)."""
    # the command name (field 2) may hold spaces and parentheses: split after its closing one
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S


def pinned(cpu: int, argv: list[str]) -> list[str]:
    """`argv` run on CPU `cpu` only (taskset execs it: the pid Popen returns is the command's)."""
    return ["taskset", "-c", str(cpu), *argv]


def stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM to every process still running (they stop in parallel), SIGKILL after 30 s."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
