"""Real kernel maps with the layout of datapath/altmark.h, for driving the altmark collector.

`AltmarkMaps.create(pin_dir, direction)` makes the maps the altmark_tx / altmark_rx loaders pin
(altmark_flows, altmark_counters, and altmark_flowmon for rx) with `bpftool map create`; flows
and per-CPU counter values are then written through libbpf (ctypes on libbpf.so.1), exactly as
a loader (flows) and the datapath (counters) would. Nothing here is a mock: the collector reads
these kernel maps through the same syscalls as in production.

install_flow() follows the loader contract: zero the slot's counters, then insert the flow with
installed_tai_ns = now (CLOCK_TAI).
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import struct
import subprocess
import time
from pathlib import Path

MAX_SIDS = 6
MAX_FLOWS = 65536
SIDLIST_KEY = struct.Struct("<II" + "16s" * MAX_SIDS)  # 104 bytes
FLOW = struct.Struct("<IIQQBBBBI")  # 32 bytes
COUNTER = struct.Struct("<QQQQ")  # 32 bytes per CPU
METHOD_DSCP, METHOD_RFC9343 = 1, 2
U64 = (1 << 64) - 1

_lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
_lib.bpf_obj_get.argtypes = [ctypes.c_char_p]
_lib.bpf_map_update_elem.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64]
_lib.bpf_map_lookup_elem.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
_lib.bpf_map_delete_elem.argtypes = [ctypes.c_int, ctypes.c_void_p]
NCPUS = _lib.libbpf_num_possible_cpus()


def tai_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_TAI)


def sidlist_key(sids_travel_order: list[str]) -> bytes:
    """Key of altmark_flows: SRH wire order (reverse of travel order), unused SIDs zero."""
    wire = [ipaddress.IPv6Address(s).packed for s in reversed(sids_travel_order)]
    wire += [bytes(16)] * (MAX_SIDS - len(wire))
    return SIDLIST_KEY.pack(len(sids_travel_order), 0, *wire)


def _check(rc: int, what: str) -> None:
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


class AltmarkMaps:
    def __init__(self, pin_dir: Path, fds: dict[str, int]):
        self.pin_dir = pin_dir
        self.fds = fds

    @classmethod
    def create(cls, pin_dir: Path, direction: str) -> "AltmarkMaps":
        pin_dir = Path(pin_dir)
        pin_dir.mkdir(parents=True, exist_ok=True)
        maps = {
            "altmark_flows": ("hash", SIDLIST_KEY.size, FLOW.size, MAX_FLOWS),
            "altmark_counters": ("percpu_array", 4, COUNTER.size, 2 * MAX_FLOWS),
        }
        if direction == "rx":
            maps["altmark_flowmon"] = ("hash", 4, FLOW.size, MAX_FLOWS)
        for name, (kind, key, value, entries) in maps.items():
            subprocess.run(
                [
                    "bpftool",
                    "map",
                    "create",
                    str(pin_dir / name),
                    "type",
                    kind,
                    "key",
                    str(key),
                    "value",
                    str(value),
                    "entries",
                    str(entries),
                    "name",
                    name,
                ],
                check=True,
                capture_output=True,
                text=True,
            )
        return cls.open(pin_dir)

    @classmethod
    def open(cls, pin_dir: Path) -> "AltmarkMaps":
        fds = {}
        for name in ("altmark_flows", "altmark_counters", "altmark_flowmon"):
            path = Path(pin_dir) / name
            if path.exists():
                fd = _lib.bpf_obj_get(str(path).encode())
                _check(fd, f"bpf_obj_get {path}")
                fds[name] = fd
        return cls(Path(pin_dir), fds)

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}

    # -- flows (what the loader does) ----------------------------------------

    def install_flow(
        self,
        slot: int,
        flow_id: int,
        period_ms: int,
        *,
        sids: list[str] | None = None,
        flowmon_id: int | None = None,
        method: int = METHOD_DSCP,
        installed_tai_ns: int | None = None,
        zero_counters: bool = True,
    ) -> int:
        """Zero the slot's counters, then insert the flow; returns installed_tai_ns."""
        if zero_counters:
            for colour in (0, 1):
                self.set_counter(slot, colour, [(0, 0, 0, 0)] * NCPUS)
        installed = tai_ns() if installed_tai_ns is None else installed_tai_ns
        value = FLOW.pack(flow_id, slot, period_ms * 1_000_000, installed, method, 0, 1, 0, 0)
        self._update(*self._flow_key(sids, flowmon_id), value)
        return installed

    def delete_flow(self, *, sids: list[str] | None = None, flowmon_id: int | None = None) -> None:
        name, key = self._flow_key(sids, flowmon_id)
        buf = ctypes.create_string_buffer(key, len(key))
        _check(_lib.bpf_map_delete_elem(self.fds[name], buf), f"delete {name}")

    def _flow_key(self, sids, flowmon_id) -> tuple[str, bytes]:
        if flowmon_id is not None:
            return "altmark_flowmon", struct.pack("<I", flowmon_id)
        return "altmark_flows", sidlist_key(sids)

    # -- counters (what the datapath does) -----------------------------------

    def set_counter(self, slot: int, colour: int, per_cpu: list[tuple[int, int, int, int]]) -> None:
        assert len(per_cpu) == NCPUS
        value = b"".join(COUNTER.pack(*(v & U64 for v in vals)) for vals in per_cpu)
        self._update("altmark_counters", struct.pack("<I", slot * 2 + colour), value)

    def get_counter(self, slot: int, colour: int) -> list[tuple[int, int, int, int]]:
        key = ctypes.create_string_buffer(struct.pack("<I", slot * 2 + colour), 4)
        out = ctypes.create_string_buffer(COUNTER.size * NCPUS)
        _check(_lib.bpf_map_lookup_elem(self.fds["altmark_counters"], key, out), "lookup counters")
        return [COUNTER.unpack_from(out.raw, i * COUNTER.size) for i in range(NCPUS)]

    def add(
        self,
        slot: int,
        colour: int,
        packets: int,
        nbytes: int,
        dmark_packets: int = 0,
        dmark_ts_sum_ns: int = 0,
        cpu: int = 0,
    ) -> None:
        """Count like the datapath: add to one CPU's cumulative values (mod 2^64)."""
        cur = self.get_counter(slot, colour)
        new = list(cur)
        p, b, dp, ds = cur[cpu]
        new[cpu] = ((p + packets) & U64, (b + nbytes) & U64, (dp + dmark_packets) & U64, (ds + dmark_ts_sum_ns) & U64)
        self.set_counter(slot, colour, new)

    def _update(self, name: str, key: bytes, value: bytes) -> None:
        kbuf = ctypes.create_string_buffer(key, len(key))
        vbuf = ctypes.create_string_buffer(value, len(value))
        _check(_lib.bpf_map_update_elem(self.fds[name], kbuf, vbuf, 0), f"update {name}")
