"""The fast engine of the user-space reflector: C workers (collectors/ustamp_fast.c) + this Python code.

`libustamp_fast.so` (build/collectors/, or SEGSCOPE_BUILD_DIR/collectors/) runs N worker threads in
this process, each with a UDP socket in one SO_REUSEPORT group, recvmmsg/sendmmsg batches, T2 from
SO_TIMESTAMPNS and T3 read right before each sendmmsg(). They answer the 44-byte base packets of
unauthenticated sessions; every other datagram of a known session (TLVs, authenticated packets,
IPv4 senders) comes here with its receive metadata through a bounded queue and is handled by the
code of the pure-Python reflector (Reflector.handle_meta), replying from a socket of the same group
that the kernel never hands a datagram to. Session state both sides touch lives in C
(NativeSessionState): the stateful Sequence Number (one counter per session for every worker and
Python) and the per-sender Direct Measurement / Follow-Up Telemetry state.

The ctypes mirrors below follow collectors/ustamp_fast.h field by field; load_library() checks
their sizes against the library's.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import socket
from pathlib import Path

from .netutil import RxMeta
from .reflector import OUTCOMES, Reflector
from .sessions import PeerState, SessionTable

REPO = Path(__file__).resolve().parents[2]
LIBRARY = "libustamp_fast.so"
UFAST_MAX_DATAGRAM = 65536
UFAST_MAX_WORKERS = 64
UFAST_MAX_BATCH = 256
SESS_STATEFUL, SESS_NTP, SESS_AUTHENTICATED = 0x1, 0x2, 0x4
STEERING = {"session": 0, "packet": 1}
# the fast path's own outcome (the Python queue was full: no reply), on top of Reflector's
FAST_OUTCOMES = (*OUTCOMES, "slow_path_queue_full")


class FastEngineUnavailable(RuntimeError):
    pass


class RxMetaC(ctypes.Structure):
    _fields_ = [
        ("rx_realtime_ns", ctypes.c_int64),
        ("hop_limit", ctypes.c_int32),
        ("tclass", ctypes.c_int32),
        ("ifindex", ctypes.c_uint32),
        ("peer_scope_id", ctypes.c_uint32),
        ("local_addr", ctypes.c_uint8 * 16),
        ("peer_addr", ctypes.c_uint8 * 16),
        ("peer_port", ctypes.c_uint16),
        ("has_local_addr", ctypes.c_uint8),
        ("worker", ctypes.c_uint8),
    ]


class PeerViewC(ctypes.Structure):
    _fields_ = [
        ("rx_count", ctypes.c_uint32),
        ("tx_count", ctypes.c_uint32),
        ("prev_seq", ctypes.c_uint32),
        ("prev_t3_sec", ctypes.c_uint32),
        ("prev_t3_frac", ctypes.c_uint32),
    ]


def library_path() -> Path:
    build = Path(os.environ.get("SEGSCOPE_BUILD_DIR") or REPO / "build")
    return build / "collectors" / LIBRARY


_lib = None


def load_library() -> ctypes.CDLL:
    """The C fast path, its prototypes declared (FastEngineUnavailable says why not)."""
    global _lib
    if _lib is not None:
        return _lib
    path = library_path()
    if not path.exists():
        raise FastEngineUnavailable(f"{path} is missing: run `make -C collectors`")
    lib = ctypes.CDLL(str(path), use_errno=True)
    vp, u8p, u64p = ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint8), ctypes.POINTER(ctypes.c_uint64)
    protos = {
        "ufast_open": (
            vp,
            [u8p, ctypes.c_uint16, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
            + [ctypes.c_char_p, ctypes.c_size_t],
        ),
        "ufast_port": (ctypes.c_int, [vp]),
        "ufast_slow_fd": (ctypes.c_int, [vp]),
        "ufast_workers": (ctypes.c_int, [vp]),
        "ufast_set_clock": (None, [vp, ctypes.c_int32, ctypes.c_uint16, ctypes.c_uint16]),
        "ufast_start": (ctypes.c_int, [vp]),
        "ufast_stop": (None, [vp]),
        "ufast_close": (None, [vp]),
        "ufast_publish": (None, [vp, vp]),
        "ufast_counters": (None, [vp, u64p]),
        "ufast_worker_counters": (ctypes.c_int, [vp, ctypes.c_int, u64p]),
        "ufast_socket_drops": (ctypes.c_uint64, [vp]),
        "ufast_slow_pop": (ctypes.c_int, [vp, ctypes.c_void_p, ctypes.c_uint32, ctypes.POINTER(RxMetaC)]),
        "ufast_table_new": (vp, [ctypes.c_int]),
        "ufast_table_free": (None, [vp]),
        "ufast_table_add": (ctypes.c_int, [vp, u8p, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_int, u8p, vp]),
        "ufast_sstate_new": (vp, []),
        "ufast_sstate_put": (None, [vp]),
        "ufast_take_seq": (ctypes.c_uint32, [vp]),
        "ufast_peek_seq": (ctypes.c_uint32, [vp]),
        "ufast_peer_received": (None, [vp, u8p, ctypes.c_uint16, ctypes.POINTER(PeerViewC)]),
        "ufast_peer_replied": (
            None,
            [vp, u8p, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32],
        ),
        "ufast_peer_get": (ctypes.c_int, [vp, u8p, ctypes.c_uint16, ctypes.POINTER(PeerViewC)]),
        "ufast_sstate_peers_forgotten": (ctypes.c_uint64, [vp]),
        "ufast_counter_name": (ctypes.c_char_p, [ctypes.c_int]),
        "ufast_nr_counters": (ctypes.c_int, []),
        "ufast_sizeof_rx_meta": (ctypes.c_int, []),
        "ufast_sizeof_peer_view": (ctypes.c_int, []),
    }
    for name, (restype, argtypes) in protos.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    for struct_c, size_fn in ((RxMetaC, lib.ufast_sizeof_rx_meta), (PeerViewC, lib.ufast_sizeof_peer_view)):
        if ctypes.sizeof(struct_c) != size_fn():
            raise FastEngineUnavailable(
                f"{path}: struct {struct_c.__name__} is {size_fn()} bytes in C, {ctypes.sizeof(struct_c)} here"
                " (collectors/ustamp_fast.h and fast.py disagree: rebuild, or fix the mirror)"
            )
    _lib = lib
    return lib


def counter_names(lib: ctypes.CDLL) -> list[str]:
    return [lib.ufast_counter_name(i).decode() for i in range(lib.ufast_nr_counters())]


def _addr16(addr: str):
    return (ctypes.c_uint8 * 16).from_buffer_copy(ipaddress.IPv6Address(addr.split("%")[0]).packed)


class NativeSessionState:
    """sessions.SessionState kept in C, where the workers update it for every fast-path reply."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        self.ptr = lib.ufast_sstate_new()
        if not self.ptr:
            raise MemoryError("ufast_sstate_new")

    def __del__(self):
        if getattr(self, "ptr", None):
            self.lib.ufast_sstate_put(self.ptr)
            self.ptr = None

    def peer_received(self, addr: str, port: int) -> PeerState:
        v = PeerViewC()
        self.lib.ufast_peer_received(self.ptr, _addr16(addr), port, ctypes.byref(v))
        return PeerState(v.rx_count, v.tx_count, v.prev_seq, (v.prev_t3_sec, v.prev_t3_frac))

    def seq_for_reply(self) -> int:
        """Taken at once: the workers share the counter (a reply that then fails leaves a gap)."""
        return self.lib.ufast_take_seq(self.ptr)

    def replied(self, addr: str, port: int, peer: PeerState, seq: int, t3: tuple[int, int], stateful: bool) -> None:
        self.lib.ufast_peer_replied(self.ptr, _addr16(addr), port, seq, t3[0], t3[1])

    # read-only views (tests, describe)
    @property
    def next_seq(self) -> int:
        return self.lib.ufast_peek_seq(self.ptr)

    @property
    def peers_forgotten(self) -> int:
        return self.lib.ufast_sstate_peers_forgotten(self.ptr)

    def peer(self, addr: str, port: int) -> PeerState | None:
        v = PeerViewC()
        if not self.lib.ufast_peer_get(self.ptr, _addr16(addr), port, ctypes.byref(v)):
            return None
        return PeerState(v.rx_count, v.tx_count, v.prev_seq, (v.prev_t3_sec, v.prev_t3_frac))


def default_workers() -> int:
    """One worker per CPU this process may run on (at most 8: the UDP path is the limit beyond)."""
    return max(1, min(8, len(os.sched_getaffinity(0))))


class FastReflector(Reflector):
    """Reflector with the C workers in front; Python answers what they hand over."""

    engine = "fast"

    def __init__(
        self,
        sessions: SessionTable,
        address: str = "::",
        port: int = 862,
        node: str = "",
        kafka=None,
        load_sessions=None,
        workers: int = 0,
        steering: str = "session",
        batch: int = 64,
        send_batch: int = 16,
        rcvbuf: int = 0,
    ):
        lib = load_library()
        self.lib = lib
        self.u = None
        self.nworkers = workers or default_workers()
        self.steering = steering
        err = ctypes.create_string_buffer(256)
        u = lib.ufast_open(
            _addr16(address), port, self.nworkers, STEERING[steering], batch, send_batch, rcvbuf, err, len(err)
        )
        if not u:
            raise OSError(f"fast engine on [{address}]:{port}: {err.value.decode()}")
        self.u = u
        self.counter_names = counter_names(lib)
        self._cbuf = (ctypes.c_uint64 * len(self.counter_names))()
        self._pkt = ctypes.create_string_buffer(UFAST_MAX_DATAGRAM)
        self._meta = RxMetaC()
        try:
            # Python's socket joins the group after the steering program: it is never selected
            super().__init__(sessions, address, lib.ufast_port(u), node, kafka, load_sessions, reuse_port=True)
            self.counters["slow_path_queue_full"] = 0
            self.install_sessions(sessions)
            rc = lib.ufast_start(u)
            if rc:
                raise OSError(-rc, f"fast engine: starting the workers: {os.strerror(-rc)}")
        except BaseException:
            self.close()
            raise
        self.slow_fd = lib.ufast_slow_fd(u)

    # -- configuration --------------------------------------------------------

    def refresh_clock(self) -> None:
        super().refresh_clock()
        if self.u:
            from .clock import TimestampFormat

            self.lib.ufast_set_clock(
                self.u, self.tai_offset_s, self.err_est[TimestampFormat.PTP], self.err_est[TimestampFormat.NTP]
            )

    def install_sessions(self, table: SessionTable) -> None:
        """Give every session a native state (adopted ones keep theirs), publish the C table, then
        switch Python's view."""
        from .clock import TimestampFormat

        for s in table:
            if not isinstance(s.state, NativeSessionState):
                s.state = NativeSessionState(self.lib)
        t = self.lib.ufast_table_new(len(table))
        if not t:
            raise MemoryError("ufast_table_new")
        for s in table:
            flags = (SESS_STATEFUL if s.stateful else 0) | (SESS_NTP if s.format is TimestampFormat.NTP else 0)
            flags |= SESS_AUTHENTICATED if s.authenticated else 0
            sids = b"".join(ipaddress.IPv6Address(x).packed for x in s.return_sids)
            sids_c = (ctypes.c_uint8 * max(1, len(sids))).from_buffer_copy(sids or b"\0")
            rc = self.lib.ufast_table_add(t, _addr16(s.sender), s.ssid, flags, len(s.return_sids), sids_c, s.state.ptr)
            if rc:
                self.lib.ufast_table_free(t)
                raise ValueError(f"session ssid={s.ssid} sender={s.sender}: refused by the fast engine ({rc})")
        self.lib.ufast_publish(self.u, t)
        super().install_sessions(table)

    # -- loop -----------------------------------------------------------------

    def ready_event(self) -> dict:
        return {**super().ready_event(), "workers": self.nworkers, "steering": self.steering}

    def wait_fd(self) -> int:
        return self.slow_fd

    def _drain(self) -> None:
        """The datagrams the workers handed over, in their order."""
        try:
            os.read(self.slow_fd, 8)
        except BlockingIOError:
            pass
        lib, u, meta, buf = self.lib, self.u, self._meta, self._pkt
        while True:
            n = lib.ufast_slow_pop(u, buf, len(buf), ctypes.byref(meta))
            if n < 0:
                return
            payload = ctypes.string_at(buf, n)
            peer_addr = socket.inet_ntop(socket.AF_INET6, bytes(meta.peer_addr))
            rx = RxMeta(
                rx_realtime_ns=meta.rx_realtime_ns if meta.rx_realtime_ns >= 0 else None,
                hop_limit=meta.hop_limit if meta.hop_limit >= 0 else None,
                local_addr=socket.inet_ntop(socket.AF_INET6, bytes(meta.local_addr)) if meta.has_local_addr else None,
                ifindex=meta.ifindex,
                tclass=meta.tclass,
            )
            self.account(payload, rx, (peer_addr, meta.peer_port, 0, meta.peer_scope_id))

    def snapshot(self) -> dict[str, int]:
        """Python's counters plus the workers' (each worker's read consistently): received = the
        sum of FAST_OUTCOMES at every moment; datagrams still queued for Python are in neither."""
        out = super().snapshot()
        self.lib.ufast_counters(self.u, self._cbuf)
        for name, value in zip(self.counter_names, self._cbuf):
            out[name] = out.get(name, 0) + value
        out["socket_drops"] += self.lib.ufast_socket_drops(self.u)
        return out

    def dump_event(self) -> dict:
        """SIGUSR1: the counters, and each worker's own (how the steering spread the datagrams)."""
        workers = []
        for i in range(self.nworkers):
            self.lib.ufast_worker_counters(self.u, i, self._cbuf)
            workers.append(dict(zip(self.counter_names, self._cbuf)))
        return {**super().dump_event(), "workers": workers}

    def shutdown(self) -> None:
        """Stop the workers, then answer what they had handed over: nothing is left unaccounted."""
        self.lib.ufast_stop(self.u)
        self._drain()

    def close(self) -> None:
        if self.u:
            self.lib.ufast_close(self.u)
            self.u = None
