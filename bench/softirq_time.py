"""Per-CPU time in each softirq vector, to the nanosecond (build/bench/softirq_time.bpf.o, loaded with
libbpf through ctypes and attached to the softirq_entry / softirq_exit raw tracepoints for as long as
the object lives: the links are not pinned, nothing stays behind when the process exits).

Why: the forwarding benchmarks' datapath runs in NET_RX softirq on the CPU the lab steers it to, so
NET_RX time on that CPU per forwarded packet is the packets' CPU cost there, and unlike the CPU's busy
time in /proc/stat it does not count the other processes the shared machine runs on that CPU. The
kernel's own softirq figure in /proc/stat is sampled at the tick (CONFIG_IRQ_TIME_ACCOUNTING is off
here): 4 ms granularity, too coarse for a few % in a few seconds.

    with SoftirqClock() as clock:
        before = clock.read()
        ...
        net_rx_ns_cpu1 = clock.read().delta(before).ns(NET_RX, cpu=1)
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OBJ = REPO / "build" / "bench" / "softirq_time.bpf.o"
VECS = 10  # NR_SOFTIRQS; the map holds [vec] = ns, [VECS + vec] = runs
NET_TX, NET_RX = 2, 3


@dataclass
class Reading:
    """ns[cpu][vec] and runs[cpu][vec], cumulative since attach (or a difference of two readings)."""

    ns_by_cpu: list[list[int]]
    runs_by_cpu: list[list[int]]

    def ns(self, vec: int, cpu: int) -> int:
        return self.ns_by_cpu[cpu][vec]

    def runs(self, vec: int, cpu: int) -> int:
        return self.runs_by_cpu[cpu][vec]

    def delta(self, before: "Reading") -> "Reading":
        def sub(a: list[list[int]], b: list[list[int]]) -> list[list[int]]:
            return [[x - y for x, y in zip(ra, rb)] for ra, rb in zip(a, b)]

        return Reading(sub(self.ns_by_cpu, before.ns_by_cpu), sub(self.runs_by_cpu, before.runs_by_cpu))


class SoftirqClock:
    def __init__(self, obj: Path = OBJ) -> None:
        if not obj.exists():
            raise FileNotFoundError(f"missing {obj.relative_to(REPO)}: run `make -C bench`")
        lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
        lib.bpf_object__open_file.restype = ctypes.c_void_p
        lib.bpf_object__open_file.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
        lib.bpf_object__load.argtypes = [ctypes.c_void_p]
        lib.bpf_object__next_program.restype = ctypes.c_void_p
        lib.bpf_object__next_program.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.bpf_program__attach.restype = ctypes.c_void_p
        lib.bpf_program__attach.argtypes = [ctypes.c_void_p]
        lib.bpf_object__find_map_fd_by_name.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.bpf_map_lookup_elem.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        lib.bpf_link__destroy.argtypes = [ctypes.c_void_p]
        lib.bpf_object__close.argtypes = [ctypes.c_void_p]
        self.lib, self.links = lib, []
        self.obj = lib.bpf_object__open_file(str(obj).encode(), None)
        if not self.obj:
            raise OSError(ctypes.get_errno(), f"bpf_object__open_file({obj})")
        try:
            if lib.bpf_object__load(self.obj):
                raise OSError(ctypes.get_errno(), f"bpf_object__load({obj.name})")
            prog = lib.bpf_object__next_program(self.obj, None)
            while prog:
                link = lib.bpf_program__attach(prog)
                if not link:
                    raise OSError(ctypes.get_errno(), "bpf_program__attach (softirq tracepoints)")
                self.links.append(link)
                prog = lib.bpf_object__next_program(self.obj, prog)
            self.fd = lib.bpf_object__find_map_fd_by_name(self.obj, b"softirq_ns")
            if self.fd < 0:
                raise OSError(-self.fd, "softirq_ns map")
        except BaseException:
            self.close()
            raise
        self.ncpu = lib.libbpf_num_possible_cpus()
        self._value = (ctypes.c_uint64 * self.ncpu)()

    def read(self) -> Reading:
        ns = [[0] * VECS for _ in range(self.ncpu)]
        runs = [[0] * VECS for _ in range(self.ncpu)]
        key = ctypes.c_uint32()
        for k in range(2 * VECS):
            key.value = k
            if self.lib.bpf_map_lookup_elem(self.fd, ctypes.byref(key), self._value):
                raise OSError(ctypes.get_errno(), "bpf_map_lookup_elem(softirq_ns)")
            for cpu in range(self.ncpu):
                (ns if k < VECS else runs)[cpu][k % VECS] = self._value[cpu]
        return Reading(ns, runs)

    def close(self) -> None:
        for link in self.links:
            self.lib.bpf_link__destroy(link)
        self.links = []
        if self.obj:
            self.lib.bpf_object__close(self.obj)
            self.obj = None

    def __enter__(self) -> "SoftirqClock":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def cpu_times(cpu: int) -> dict[str, int]:
    """The /proc/stat line of one CPU, in USER_HZ ticks (idle is exact on this NO_HZ kernel; the split
    of busy time into user/system/softirq is tick-sampled)."""
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{cpu} "):
            return dict(zip(names, (int(x) for x in line.split()[1:9])))
    raise ValueError(f"no cpu{cpu} in /proc/stat")


TICK_S = 1 / os.sysconf("SC_CLK_TCK")
