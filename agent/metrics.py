"""Counters of the node's datapath programs and of the agent itself, as line protocol on
`segscope.metrics` (only with --kafka), every --stats-interval seconds:

    segscope_datapath,node=A,program=stamp_collector pass_not_ipv6=0i,...,collected=2000i <ns>
    segscope_streamer,node=A,records=stamp records_in=2000i,records_delivered=2000i,... <ns>
    segscope_agent,node=A rpcs=12i,rpc_errors=0i,records_read=2000i,... <ns>

segscope_streamer: the agent runs stamp_streamer on the collector's ring (records=stamp, once it
has a sender role) and on ioam_rx's ring (records=ioam, once it has an in-line EGRESS side) and
reports their counters under stamp_streamer's names, one line per ring.

Programs: every segscope datapath program the agent has attached (stamp_collector,
stamp_reflector, altmark_tx, altmark_rx, ioam_tx, ioam_rx). Field names are the loader's own
(`<tool> stats --pin-dir DIR --json`, run once per loaded map: the JSON keys in counter-index order);
the values are read directly from the pinned per-CPU stats array with the bpf(2) syscall and summed
over the possible CPUs, exactly as the loaders' `stats` does - one BPF_OBJ_GET plus one lookup per
counter, no process per tick (schemas/metrics.md, segscope_datapath and segscope_agent).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import subprocess
import threading
import time
from pathlib import Path

from segscope_schemas import names

log = logging.getLogger("segscope.agent.metrics")

# bpf(2) commands and the syscall number (x86_64 321, aarch64 280)
BPF_MAP_LOOKUP_ELEM, BPF_OBJ_GET, BPF_OBJ_GET_INFO_BY_FD = 1, 7, 15
_SYS_BPF = {"x86_64": 321, "aarch64": 280}.get(os.uname().machine, 321)
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

STATS_MAP = {
    "stamp_collector": "stamp_collector_stats",
    "stamp_reflector": "stamp_reflector_stats",
    "altmark_tx": "altmark_stats",
    "altmark_rx": "altmark_stats",
    "ioam_tx": "ioam_tx_stats",
    "ioam_rx": "ioam_rx_stats",
    "ioam_lwt": "ioam_lwt_stats",
}


class _ObjGetAttr(ctypes.Structure):
    _fields_ = [("pathname", ctypes.c_uint64), ("bpf_fd", ctypes.c_uint32), ("file_flags", ctypes.c_uint32)]


class _LookupAttr(ctypes.Structure):
    _fields_ = [
        ("map_fd", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("key", ctypes.c_uint64),
        ("value", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
    ]


class _InfoAttr(ctypes.Structure):
    _fields_ = [("bpf_fd", ctypes.c_uint32), ("info_len", ctypes.c_uint32), ("info", ctypes.c_uint64)]


class _MapInfo(ctypes.Structure):  # the head of struct bpf_map_info (the kernel fills up to info_len)
    _fields_ = [
        ("type", ctypes.c_uint32),
        ("id", ctypes.c_uint32),
        ("key_size", ctypes.c_uint32),
        ("value_size", ctypes.c_uint32),
        ("max_entries", ctypes.c_uint32),
        ("map_flags", ctypes.c_uint32),
    ]


BPF_MAP_TYPE_PERCPU_ARRAY = 6


def _bpf(cmd: int, attr: ctypes.Structure) -> int:
    ret = _libc.syscall(_SYS_BPF, cmd, ctypes.byref(attr), ctypes.sizeof(attr))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret


def possible_cpus() -> int:
    """Number of possible CPUs (the per-CPU value count), like libbpf_num_possible_cpus()."""
    n = 0
    for part in Path("/sys/devices/system/cpu/possible").read_text().strip().split(","):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


class PercpuCounters:
    """One pinned per-CPU array of u64 counters, opened per read (a re-attached program replaces
    the pin; the map id tells whether the names must be read again)."""

    def __init__(self, path: Path):
        self.path = path
        self.ncpus = possible_cpus()

    def read(self) -> tuple[int, list[int]]:
        """(map id, [sum over CPUs of counter k for k in 0..max_entries-1])."""
        p = ctypes.create_string_buffer(str(self.path).encode())
        fd = _bpf(BPF_OBJ_GET, _ObjGetAttr(pathname=ctypes.addressof(p)))
        try:
            info = _MapInfo()
            _bpf(
                BPF_OBJ_GET_INFO_BY_FD, _InfoAttr(bpf_fd=fd, info_len=ctypes.sizeof(info), info=ctypes.addressof(info))
            )
            if info.type != BPF_MAP_TYPE_PERCPU_ARRAY or info.value_size != 8:
                raise OSError(
                    0, f"{self.path} is not a per-CPU array of u64 (type {info.type}, value size {info.value_size})"
                )
            values = (ctypes.c_uint64 * self.ncpus)()
            key = ctypes.c_uint32()
            attr = _LookupAttr(map_fd=fd, key=ctypes.addressof(key), value=ctypes.addressof(values))
            sums = []
            for k in range(info.max_entries):
                key.value = k
                _bpf(BPF_MAP_LOOKUP_ELEM, attr)
                sums.append(sum(values))
            return info.id, sums
        finally:
            os.close(fd)


def escape_tag(value: str) -> str:
    value = value or "unknown"
    for ch in ("\\", ",", "=", " "):
        value = value.replace(ch, "\\" + ch)
    return value.replace("\n", "\\ ").replace("\r", "\\ ").replace("\t", "\\ ")


class DatapathProgram:
    """Counters of one attached program, named as its loader's `stats --json` names them."""

    def __init__(self, program: str, tool: Path, pin_dir: Path):
        self.program, self.tool, self.pin_dir = program, tool, pin_dir
        self.map = PercpuCounters(pin_dir / STATS_MAP[program])
        self.names: list[str] = []
        self.names_map_id = -1

    def _load_names(self) -> None:
        r = subprocess.run(
            [str(self.tool), "stats", "--pin-dir", str(self.pin_dir), "--json"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if r.returncode != 0:
            raise OSError(0, f"{self.tool.name} stats: {(r.stderr or r.stdout).strip()}")
        self.names = list(json.loads(r.stdout))  # keys in counter-index order

    def counters(self) -> dict[str, int]:
        map_id, sums = self.map.read()
        if map_id != self.names_map_id:
            self._load_names()
            self.names_map_id = map_id
        # the loaders print the first len(names) entries; so do we
        return dict(zip(self.names, sums[: len(self.names)]))


class AgentCounters:
    """The agent's own counters (segscope_agent) kept here; the STAMP results counters come from
    StampAgent.counters() through StatsPublisher's `gauges`."""

    FIELDS = ("rpcs", "rpc_errors", "stats_read_errors", "metrics_produced", "metrics_failed")

    def __init__(self):
        self.lock = threading.Lock()
        self.values = dict.fromkeys(self.FIELDS, 0)

    def add(self, name: str, n: int = 1) -> None:
        with self.lock:
            self.values[name] += n

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return dict(self.values)


class StatsPublisher:
    """Thread: every interval_s, one segscope_datapath line per attached program and one
    segscope_agent line, in one Kafka message (key = node) on `segscope.metrics`."""

    def __init__(
        self,
        node: str,
        bootstrap: str,
        programs,
        counters: AgentCounters,
        gauges=None,
        interval_s: float = 1.0,
        topic: str = names.TOPIC_METRICS,
        on_tick=None,
        streamer=None,
        devices=None,
        link_stats=None,
        inventory=None,
    ):
        self.node, self.bootstrap, self.topic = node, bootstrap, topic
        self.programs = programs  # callable -> [(program, tool, pin_dir)] attached now
        self.counters = counters
        self.gauges = gauges or (lambda: {})
        self.on_tick = on_tick  # e.g. poll the STAMP producer so its delivery reports run
        # callable -> [(records kind, segscope_streamer fields)] of every ring the agent streams
        self.streamer = streamer
        self.devices = devices or (lambda: [])  # callable -> [(program, device)] the datapath runs on
        self.link_stats = link_stats  # callable -> {device: kernel counters} (Rtnl.link_stats)
        self.inventory = inventory  # callable (node tag, ts) -> segscope_stamp_session / segscope_flow lines
        self.interval_s = interval_s
        self._known: dict[Path, DatapathProgram] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._producer = None
        self._warned: set[str] = set()
        self.last_lines: list[str] = []  # what the last tick published (the health endpoint serves it)

    def start(self) -> None:
        from confluent_kafka import Producer

        from segscope_kafka import kafka_config

        # idempotent, acks=all: a retry after a broker restart neither loses nor doubles a line;
        # message.timeout.ms 10 min: a Kafka outage of minutes is buffered (bounded by librdkafka's
        # queue; a line that does not fit is counted metrics_failed)
        self._producer = Producer(
            kafka_config(
                {
                    "bootstrap.servers": self.bootstrap,
                    "linger.ms": 5,
                    "enable.idempotence": True,
                    "acks": "all",
                    "compression.type": "lz4",
                    "message.timeout.ms": 600000,
                }
            )
        )
        self._thread = threading.Thread(target=self._loop, name="stats", daemon=True)
        self._thread.start()

    def stop(self, flush_timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._producer is not None:
            self.publish_now()  # the final counters, then flush
            left = self._producer.flush(flush_timeout_s)
            if left:  # the agent's own counter lines (not measurements): the last interval's are lost
                log.warning("agent counters: %d messages not delivered at stop (Kafka unreachable?)", left)

    def _loop(self) -> None:
        # ticks on the monotonic clock, aligned to the start: no drift, one read per interval
        nxt = time.monotonic()
        while not self._stop.is_set():
            self.publish_now()
            nxt += self.interval_s
            self._stop.wait(max(0.0, nxt - time.monotonic()))

    def lines(self) -> list[str]:
        ts = time.time_ns()
        node = escape_tag(self.node)
        out = []
        attached = self.programs()
        for program, tool, pin_dir in attached:
            prog = self._known.get(pin_dir)
            if prog is None or prog.program != program:
                prog = self._known[pin_dir] = DatapathProgram(program, tool, pin_dir)
            try:
                values = prog.counters()
            except OSError as e:
                if pin_dir not in {p for _, _, p in self.programs()}:
                    continue  # detached between the list and the read: nothing to report
                # a broken pin or an unexpected map: counted, said once per pin dir
                self.counters.add("stats_read_errors")
                if str(pin_dir) not in self._warned:
                    self._warned.add(str(pin_dir))
                    log.warning("datapath stats of %s (%s): %s", program, pin_dir, e)
                continue
            if values:
                fields = ",".join(f"{k}={v}i" for k, v in values.items())
                out.append(f"segscope_datapath,node={node},program={escape_tag(program)} {fields} {ts}")
        live = {p for _, _, p in attached}
        for gone in [p for p in self._known if p not in live]:
            del self._known[gone]
        out += self.device_lines(node, ts)
        if self.inventory is not None:
            out += self.inventory(node, ts)
        for kind, fields in self.streamer() if self.streamer else []:
            out.append(
                f"segscope_streamer,node={node},records={kind} "
                + ",".join(f"{k}={v}i" for k, v in fields.items())
                + f" {ts}"
            )
        mine = {**self.counters.snapshot(), **self.gauges()}
        out.append(f"segscope_agent,node={node} " + ",".join(f"{k}={v}i" for k, v in mine.items()) + f" {ts}")
        return out

    def device_lines(self, node: str, ts: int) -> list[str]:
        """segscope_device: the kernel counters of each device a datapath program runs on; a
        reflector's replies lost on the way out show as tx_dropped here (and nowhere else)."""
        progs: dict[str, list[str]] = {}
        for program, device in self.devices():
            progs.setdefault(device, []).append(program)
        if not progs or self.link_stats is None:
            return []
        try:
            stats = self.link_stats()
        except OSError:
            self.counters.add("stats_read_errors")
            return []
        out = []
        for device, programs in sorted(progs.items()):
            if device in stats:
                fields = ",".join(f"{k}={v}i" for k, v in stats[device].items())
                tags = f"node={node},device={escape_tag(device)},programs={escape_tag('+'.join(sorted(programs)))}"
                out.append(f"segscope_device,{tags} {fields} {ts}")
        return out

    def publish_now(self) -> None:
        if self.on_tick:
            try:
                self.on_tick()
            except Exception:  # noqa: BLE001
                log.exception("stats tick hook failed")
        try:
            self.last_lines = self.lines()
            payload = "\n".join(self.last_lines).encode()
        except Exception:  # noqa: BLE001 - a tick must never kill the thread
            log.exception("stats lines failed")
            self.counters.add("stats_read_errors")
            return
        from confluent_kafka import KafkaException

        try:
            self._producer.produce(self.topic, payload, key=self.node.encode(), on_delivery=self._delivered)
        except BufferError:
            self.counters.add("metrics_failed")
        except KafkaException as e:
            # e.g. the topic does not exist yet (a pod started before the topics are made): the line
            # is counted and the next tick tries again; the thread must live on (it feeds /readyz)
            self.counters.add("metrics_failed")
            if "produce" not in self._warned:
                self._warned.add("produce")
                log.warning(
                    "stats: produce to %s failed (counted metrics_failed, retried each tick): %s", self.topic, e
                )
        self._producer.poll(0)

    def _delivered(self, err, msg) -> None:
        self.counters.add("metrics_failed" if err else "metrics_produced")
