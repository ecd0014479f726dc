"""BPF_PROG_TEST_RUN, per-CPU counters and a ring buffer through ctypes on the system libbpf.so.1.

One frame costs ~10 µs this way (test run + one batched counter read), against ~2 ms for a
`stamp_reflector test-run` subprocess: that is what makes 100 k frames per program affordable.
"""

from __future__ import annotations

import ctypes
import errno
from dataclasses import dataclass
from pathlib import Path

_lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
_lib.bpf_obj_get.argtypes = [ctypes.c_char_p]

# XDP test runs put the frame behind 256 B of headroom in one page (skb_shared_info at the end):
# frames up to 3506 B run linear; we stay far below.
MAX_FRAME = 3000
OUT_CAP = 4096
XDP_ACTIONS = {0: "XDP_ABORTED", 1: "XDP_DROP", 2: "XDP_PASS", 3: "XDP_TX", 4: "XDP_REDIRECT"}


class _TestRunOpts(ctypes.Structure):  # struct bpf_test_run_opts, libbpf 1.1 (bpf.h)
    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("data_in", ctypes.c_void_p),
        ("data_out", ctypes.c_void_p),
        ("data_size_in", ctypes.c_uint32),
        ("data_size_out", ctypes.c_uint32),
        ("ctx_in", ctypes.c_void_p),
        ("ctx_out", ctypes.c_void_p),
        ("ctx_size_in", ctypes.c_uint32),
        ("ctx_size_out", ctypes.c_uint32),
        ("retval", ctypes.c_uint32),
        ("repeat", ctypes.c_int),
        ("duration", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("batch_size", ctypes.c_uint32),
    ]


class _BatchOpts(ctypes.Structure):  # struct bpf_map_batch_opts
    _fields_ = [("sz", ctypes.c_size_t), ("elem_flags", ctypes.c_uint64), ("flags", ctypes.c_uint64)]


def obj_get(path: Path) -> int:
    fd = _lib.bpf_obj_get(str(path).encode())
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bpf_obj_get({path}): {errno.errorcode.get(err, err)}")
    return fd


@dataclass
class RunResult:
    err: int  # 0, or the errno of a refused test run (e.g. EINVAL for frames < 14 bytes)
    retval: int
    data_out: bytes

    @property
    def action(self) -> str:
        return XDP_ACTIONS.get(self.retval, f"XDP_{self.retval}")


class PinnedProgram:
    """A pinned XDP or TC program and its pinned per-CPU counter array."""

    def __init__(self, prog_pin: Path, stats_pin: Path, n_counters: int):
        self.prog_fd = obj_get(prog_pin)
        self.stats_fd = obj_get(stats_pin)
        self.n_counters = n_counters
        self.ncpu = _lib.libbpf_num_possible_cpus()
        self._in = ctypes.create_string_buffer(MAX_FRAME)
        self._out = ctypes.create_string_buffer(OUT_CAP)
        self._opts = _TestRunOpts(sz=ctypes.sizeof(_TestRunOpts))
        self._keys = (ctypes.c_uint32 * n_counters)()
        self._vals = (ctypes.c_uint64 * (n_counters * self.ncpu))()
        self._count = ctypes.c_uint32()
        self._out_batch = ctypes.c_uint32()
        self._batch_opts = _BatchOpts(sz=ctypes.sizeof(_BatchOpts))

    def run(self, frame: bytes, ctx: bytes | None = None) -> RunResult:
        """One test run; ctx: the context to run with (a struct __sk_buff for a TC program), else none."""
        if len(frame) > MAX_FRAME:
            raise ValueError(f"frame of {len(frame)} bytes, harness limit {MAX_FRAME}")
        ctypes.memmove(self._in, frame, len(frame))
        o = self._opts
        o.data_in, o.data_size_in = ctypes.addressof(self._in), len(frame)
        o.data_out, o.data_size_out = ctypes.addressof(self._out), OUT_CAP
        if ctx is not None:
            self._ctx = ctypes.create_string_buffer(ctx, len(ctx))  # kept until the next run
            o.ctx_in, o.ctx_size_in = ctypes.addressof(self._ctx), len(ctx)
        else:
            o.ctx_in, o.ctx_size_in = None, 0
        o.retval = 0xFFFFFFFF
        if _lib.bpf_prog_test_run_opts(self.prog_fd, ctypes.byref(o)) != 0:
            return RunResult(ctypes.get_errno(), 0xFFFFFFFF, b"")
        return RunResult(0, o.retval, self._out.raw[: o.data_size_out])

    def counters(self) -> list[int]:
        """All counters, summed over CPUs, in one bpf_map_lookup_batch() call."""
        self._count.value = self.n_counters
        rc = _lib.bpf_map_lookup_batch(
            self.stats_fd,
            None,
            ctypes.byref(self._out_batch),
            self._keys,
            self._vals,
            ctypes.byref(self._count),
            ctypes.byref(self._batch_opts),
        )
        err = ctypes.get_errno()
        if (rc != 0 and err != errno.ENOENT) or self._count.value != self.n_counters:
            raise OSError(err, f"bpf_map_lookup_batch: rc {rc}, {self._count.value} of {self.n_counters}")
        v, n = self._vals, self.ncpu
        out = [0] * self.n_counters
        for i in range(self.n_counters):
            out[self._keys[i]] = sum(v[i * n : (i + 1) * n])
        return out


_RB_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_lib.ring_buffer__new.restype = ctypes.c_void_p
_lib.ring_buffer__new.argtypes = [ctypes.c_int, _RB_CALLBACK, ctypes.c_void_p, ctypes.c_void_p]
_lib.ring_buffer__consume.argtypes = [ctypes.c_void_p]
_lib.ring_buffer__free.argtypes = [ctypes.c_void_p]


class RingReader:
    """Consumes a pinned BPF ring buffer; drain() returns the records submitted since the last call."""

    def __init__(self, ring_pin: Path):
        self.fd = obj_get(ring_pin)
        self._pending: list[bytes] = []
        self._cb = _RB_CALLBACK(self._on_record)  # keep a reference: libbpf holds the pointer
        self._rb = _lib.ring_buffer__new(self.fd, self._cb, None, None)
        if not self._rb:
            raise OSError(ctypes.get_errno(), f"ring_buffer__new({ring_pin})")

    def _on_record(self, _ctx, data, size) -> int:
        self._pending.append(ctypes.string_at(data, size))
        return 0

    def drain(self) -> list[bytes]:
        if _lib.ring_buffer__consume(self._rb) < 0:
            raise OSError(ctypes.get_errno(), "ring_buffer__consume")
        out, self._pending = self._pending, []
        return out

    def close(self) -> None:
        if self._rb:
            _lib.ring_buffer__free(self._rb)
            self._rb = None
