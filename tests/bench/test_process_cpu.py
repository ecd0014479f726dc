"""bench/process_cpu.py: a pinned process runs on its CPU only, its CPU time is what it burned, and
the scaling bench reads a worker's partition share from the worker's own log line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import namedtuple

from bench.process_cpu import cpu_seconds, pinned, stop
from bench.processor_records import owned_partitions, session_partition
from processors.runtime.moves import _tps

TP = namedtuple("TP", "topic partition")

# busy for 0.4 s of its own CPU time, then idle until stopped
BURN = """
import time
t = time.process_time()
while time.process_time() - t < 0.4:
    pass
print("done", flush=True)
time.sleep(60)
"""


def test_pinned_process_cpu_time_and_stop():
    cpu = max(os.sched_getaffinity(0))
    proc = subprocess.Popen(pinned(cpu, [sys.executable, "-c", BURN]), stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "done"  # the pid is python's: taskset exec'd it
        assert os.sched_getaffinity(proc.pid) == {cpu}
        burned = cpu_seconds(proc.pid)
        assert 0.35 <= burned < 2.0, burned
        time.sleep(0.3)
        assert cpu_seconds(proc.pid) - burned < 0.05  # sleeping costs (almost) nothing
    finally:
        stop([proc])
    assert proc.returncode == -15  # SIGTERM, not the SIGKILL fallback


def test_partition_share_from_worker_log(tmp_path):
    log = tmp_path / "w0.log"
    log.write_text("starting\n")
    assert owned_partitions(log, "t.records") == (None, 0)
    # the lines as the workers' PartitionMoves writes them
    own = [[TP("t.records", 0), TP("t.records", 1)], [TP("other.topic", 1)], [TP("other.topic", 0), TP("t.records", 1)]]
    log.write_text("".join(f"[2026] rebalance: own {_tps(tps)}\n" for tps in own))
    assert owned_partitions(log, "t.records") == ({1}, 3)
    assert owned_partitions(log, "other.topic") == ({0}, 3)
    assert owned_partitions(log, "missing") == (set(), 3)
    # four sessions: two per partition
    assert [session_partition(f"bench/{s}".encode()) for s in range(1, 5)] == [0, 1, 0, 1]
