"""StampService: STAMP Session-Sender and Session-Reflector of this node, driving the existing
datapath (build/datapath/stamp_collector, stamp_reflector) and build/collectors/stamp_sender.

Results: the ring buffer's one reader is build/collectors/stamp_streamer, run by the agent: it
sends the records to Kafka (`segscope.stamp.records`, stamp_batch, key "<node>"; with
--kafka) in C, and copies every batch to the agent through a pipe (`--copy-fd 1`). The agent
decodes those batches (numpy, no per-record text) into StampResults kept per session (the newest
100 000), served by GetStampSessionResults and pushed to SubscribeStampResults streams. The copy
never slows the Kafka path: a batch the agent is too slow to take is not copied, and counted
(records_copy_dropped in the segscope_streamer line the agent publishes from the streamer's
counters).

Restarts (agent/keeper.py): with --kafka the streamer and every stamp_sender outlive the agent
(tethered to the node's state directory) and the next agent adopts them from datapath.json: the
roles whose pins are still there, the sessions, the running senders (by pid and start time). The
adopted streamer is replaced at once by a fresh one (SIGTERM: it drains the ring to Kafka and waits
for the acks; the new one reads on from the ring's consumer position, so nothing is lost or sent
twice): its copy pipe went with the old agent.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from google.protobuf import json_format

from agent import children
from agent import fields as F
from agent.fields import ApiError
from agent.keeper import Adopted, Keeper, ProcRef, stop_proc
from agent.ustamp_reflector import UserspaceReflector
from segscope_proto.segscope.agent.v1 import stamp_pb2 as pb
from segscope_proto.segscope.agent.v1 import stamp_pb2_grpc as pb_grpc
from segscope_schemas import path_record as pr

log = logging.getLogger("segscope.agent.stamp")

KEEP_RESULTS = 100_000
SENDER, REFLECTOR = pb.STAMP_ROLE_SENDER, pb.STAMP_ROLE_REFLECTOR
ROLE_NAME = {SENDER: "sender", REFLECTOR: "reflector"}
FORMAT_ARG = {pb.TIMESTAMP_FORMAT_UNSPECIFIED: "ptp", pb.TIMESTAMP_FORMAT_PTP: "ptp", pb.TIMESTAMP_FORMAT_NTP: "ntp"}
MODE_ARG = {
    pb.STAMP_MODE_UNSPECIFIED: "unauthenticated",
    pb.STAMP_MODE_UNAUTHENTICATED: "unauthenticated",
    pb.STAMP_MODE_AUTHENTICATED: "authenticated",
}
FOREVER_S = 10 * 365 * 86400  # stamp_sender needs --count or --duration: "until stopped"
XDP, USERSPACE, AUTO = pb.STAMP_REFLECTOR_MODE_XDP, pb.STAMP_REFLECTOR_MODE_USERSPACE, pb.STAMP_REFLECTOR_MODE_AUTO
# the loader's words when the kernel or the driver refuses the native XDP attach (datapath/xdp_chain.c)
XDP_REFUSED = "native XDP attach of the chain dispatcher"
XDP_BUSY = "another program was attached meanwhile"  # a race with another loader: not a refusal


def xdp_refused(message: str) -> bool:
    """Did the kernel or the driver refuse XDP on the device (no native XDP, a veth peer's MTU too
    large, ...), as opposed to a missing device, a build problem or another program there?"""
    return XDP_REFUSED in message and XDP_BUSY not in message


class Tools:
    """Paths of the datapath tools and how to run them for this node."""

    def __init__(self, repo: Path, netns: str | None, pin_root: Path):
        # the eBPF objects and C tools: the checkout's build/, or SEGSCOPE_BUILD_DIR (an installed
        # package, a container image)
        self.build = Path(os.environ.get("SEGSCOPE_BUILD_DIR") or repo / "build")
        self.repo = repo
        self.netns = netns
        self.pin_root = pin_root
        self.collector = self.build / "datapath" / "stamp_collector"
        self.reflector = self.build / "datapath" / "stamp_reflector"
        self.sender = self.build / "collectors" / "stamp_sender"
        self.streamer = self.build / "collectors" / "stamp_streamer"

    @property
    def collector_pin(self) -> Path:
        return self.pin_root / "stamp_collector"

    @property
    def reflector_pin(self) -> Path:
        return self.pin_root / "stamp_reflector"

    def ns_args(self) -> list[str]:
        return ["--netns", self.netns] if self.netns else []

    def run(self, cmd: list, what: str) -> str:
        cmd = [str(c) for c in cmd]
        if not Path(cmd[0]).exists():
            raise ApiError(grpc.StatusCode.FAILED_PRECONDITION, f"{what}: {cmd[0]} is not built (make build)")
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        log.debug("ran %s -> %d", " ".join(cmd), r.returncode)
        if r.returncode != 0:
            raise ApiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{what}: {Path(cmd[0]).name} {cmd[1]} failed: {(r.stderr or r.stdout).strip()}",
            )
        return r.stdout


@dataclass
class Session:
    spec: pb.StampSession
    state: int = pb.STAMP_SESSION_STATE_CREATED
    error: str = ""  # FAILED: why (the sender's exit status and stderr)
    proc: subprocess.Popen | None = None
    packets_sent: int = 0  # finished runs (their summaries)
    stats_file: Path | None = None  # the running sender's live counters (--stats-file)
    out_file: Path | None = None  # the running sender's stdout (its JSON summary at exit) and stderr
    err_file: Path | None = None
    proc_ref: ProcRef | None = None  # pid + start time of the running sender (datapath.json)
    results: collections.deque = field(default_factory=lambda: collections.deque(maxlen=KEEP_RESULTS))
    next_index: int = 0  # the session's replies so far (results_collected), and the next result's index
    dropped: int = 0
    # The session's replies as the streamers counted them (their records_by_ssid), for the next
    # agent: an agent restart replaces the streamer, and the replies the old one read after the
    # agent went never reach the new agent's copy. streamed_before: read by streamers that have
    # ended; streamer_offset: what the running streamer had counted for this SSID when the session
    # was created (an SSID used before by a destroyed session).
    streamed_before: int = 0
    streamer_offset: int = 0

    def streamed(self, ssid_records: dict) -> int:
        """Replies of this session the streamers read so far, given the running one's per-SSID counts."""
        return self.streamed_before + max(0, int(ssid_records.get(str(self.spec.ssid), 0)) - self.streamer_offset)

    def live_sent(self) -> int:
        """Packets the running sender has sent so far (its stats file, rewritten every second)."""
        if self.proc is None or self.stats_file is None:
            return 0
        try:
            return int(json.loads(self.stats_file.read_text()).get("sent", 0))
        except (OSError, ValueError):
            return 0

    def status(self) -> pb.StampSessionStatus:
        return pb.StampSessionStatus(
            session=self.spec,
            state=self.state,
            packets_sent=self.packets_sent + self.live_sent(),
            results_collected=self.next_index,
            error=self.error,
        )


def _summary(values: list[int]) -> pb.StampDelaySummary:
    if not values:
        return pb.StampDelaySummary()
    return pb.StampDelaySummary(
        count=len(values), min_us=min(values) / 1e3, mean_us=sum(values) / len(values) / 1e3, max_us=max(values) / 1e3
    )


class StampAgent:
    """State of the node's STAMP roles and sessions (one lock)."""

    def __init__(
        self, node: str, tools: Tools, kafka: str | None = None, linger_ms: int = 200, keeper: Keeper | None = None
    ):
        self.node, self.tools, self.kafka, self.linger_ms = node, tools, kafka, linger_ms
        self.keeper = keeper if keeper is not None and keeper.enabled else None
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        # the first Init of a role attaches its program (sender_cfg / reflector_cfg: that device);
        # an Init with another device attaches the same program there too (a multi-homed node:
        # one session map, one ring buffer, one set of counters), recorded in *_devices
        self.sender_cfg: pb.StampSenderConfig | None = None
        self.reflector_cfg: pb.StampReflectorConfig | None = None
        self.sender_devices: dict[str, pb.StampSenderConfig] = {}
        self.reflector_devices: dict[str, pb.StampReflectorConfig] = {}
        # kernel counters of the node's devices (the server sets Rtnl.link_stats); the TX drops
        # of each reflector device when it was Init'ed, so a status shows the drops since then
        self.link_stats = lambda: {}
        self.reflector_tx_base: dict[str, int] = {}
        # what answers the reflector role's test packets: the XDP reflector, or the user-space one
        # (mode USERSPACE, or AUTO where XDP was refused: reflector_fallback says why)
        self.reflector_running = pb.STAMP_REFLECTOR_MODE_UNSPECIFIED
        self.reflector_fallback = ""
        self.userspace: UserspaceReflector | None = None
        self.socket_drops_base = 0  # the user-space reflector's socket_drops at Init
        self.sessions: dict[tuple[int, int], Session] = {}
        self.reader: subprocess.Popen | Adopted | None = None
        self.reader_ref: ProcRef | None = None
        self.reader_thread: threading.Thread | None = None
        self.stopping = threading.Event()
        self.unmatched_records = 0
        self.records_read = 0
        self.leftover_records_streamed = 0  # found in a killed agent's ring at Init, sent to Kafka
        self.leftover_records_lost = 0  # found there and not delivered (no Kafka, or it failed)
        self.results_evicted = 0  # results pushed out of a session's KEEP_RESULTS window
        self.malformed_records = 0  # copied batches that did not decode (the streamer is restarted)
        self.senders_adopted = 0  # running stamp_senders this agent took over from the previous one
        self.senders_ended_unadopted = 0  # senders that ended while no agent ran (their run was cut)
        self.handover_records_lost = 0  # records the replaced streamer of a previous agent did not deliver
        self._streamer_stats: dict = {}  # stamp_streamer's last --stats-json
        self.streamer_stats_interval_s = 0.2
        import tempfile

        # where the children's files are: the state directory when they outlive the agent (the next
        # agent finds them there), else a temporary directory
        run_dir = (
            self.keeper.run_dir("stamp")
            if self.keeper is not None
            else Path(tempfile.mkdtemp(prefix=f"segscope-agent-{node}-"))
        )
        self.streamer_stats_path = run_dir / "stamp_streamer.json"
        self.on_change = None  # topology publisher hook

    # -- ring buffer reader -------------------------------------------------------------------
    def _start_reader(self) -> None:
        # a fresh Event per reader: a reader stopped by Reset never restarts after a new Init
        self.stopping = threading.Event()
        self.reader_thread = threading.Thread(
            target=self._reader_loop, args=(self.stopping,), name="stamp-results", daemon=True
        )
        self.reader_thread.start()

    def _streamer_cmd(self) -> list[str]:
        cmd = [
            str(self.tools.streamer),
            "--ringbuf",
            str(self.tools.collector_pin / "stamp_records"),
            "--node",
            self.node,
            "--copy-fd",
            "1",
            "--stats-json",
            str(self.streamer_stats_path),
            "--stats-interval",
            str(self.streamer_stats_interval_s),
            "--no-metrics",  # the agent publishes the streamer's counters with its own (one line per tick)
            "--linger-ms",
            str(self.linger_ms),
        ]
        return cmd + (["--brokers", self.kafka] if self.kafka else ["--no-kafka"])

    def _reader_loop(self, stopping: threading.Event) -> None:
        from segscope_schemas.stamp_record import STAMP_BATCH_HEADER_SIZE, MalformedBatch, decode_batch, message_length

        while not stopping.is_set():
            # stderr to a file: a pipe nobody reads would stall the streamer once full
            errlog = open(self.streamer_stats_path.with_suffix(".log"), "ab")  # noqa: SIM115
            # without Kafka the copy is the only way out: a streamer left behind would read the ring
            # into a dead pipe, so that one dies with the agent (the ring keeps the records)
            p = children.spawn(
                self._streamer_cmd(), outlive=self._outlive() if self.kafka else None, stdout=subprocess.PIPE,
                stderr=errlog,
            )  # fmt: skip
            errlog.close()
            with self.lock:
                self.reader = p
                self.reader_ref = ProcRef.of(p.pid)
            self.persist()
            assert p.stdout is not None
            stream = p.stdout
            while True:
                header = stream.read(STAMP_BATCH_HEADER_SIZE)
                if len(header) < STAMP_BATCH_HEADER_SIZE:
                    break
                try:
                    body = stream.read(message_length(header) - STAMP_BATCH_HEADER_SIZE)
                    _, recs = decode_batch(header + body)
                except MalformedBatch as exc:  # a byte stream cannot resync: restart the streamer
                    self.malformed_records += 1
                    log.warning("stamp_streamer copy: %s; restarting it", exc)
                    self._stop_proc(p)
                    break
                self._ingest(recs)
            p.wait()
            self._fold_streamer_counts(self._read_streamer_stats())
            # counted: the next streamer's file must not be mistaken for this one's before it writes
            self.streamer_stats_path.unlink(missing_ok=True)
            if stopping.is_set():
                break
            if p.returncode not in (0, -signal.SIGTERM):
                err = self.streamer_stats_path.with_suffix(".log").read_text(errors="replace")
                log.warning("stamp_streamer exited %s: %s", p.returncode, err[-500:])
                time.sleep(0.5)

    def _ingest(self, recs) -> None:
        """One copied batch (STAMP_RECORD_DTYPE array) into the sessions' results."""
        ssids = recs["ssid"].tolist()
        seqs = recs["sender_seq"].tolist()
        t1s, t2s = recs["t1_ns"].tolist(), recs["t2_ns"].tolist()
        t3s, t4s = recs["t3_ns"].tolist(), recs["t4_ns"].tolist()
        with self.cond:
            self.records_read += len(ssids)
            for ssid, seq, t1, t2, t3, t4 in zip(ssids, seqs, t1s, t2s, t3s, t4s):
                s = self.sessions.get((SENDER, ssid))
                if s is None:
                    self.unmatched_records += 1
                    continue
                if len(s.results) == s.results.maxlen:
                    s.dropped += 1
                    self.results_evicted += 1
                s.results.append(
                    pb.StampResult(
                        ssid=ssid,
                        index=s.next_index,
                        sequence=seq,
                        t1_ns=t1,
                        t2_ns=t2,
                        t3_ns=t3,
                        t4_ns=t4,
                        forward_delay_ns=t2 - t1,
                        reverse_delay_ns=t4 - t3,
                        round_trip_delay_ns=(t4 - t1) - (t3 - t2),
                    )
                )
                s.next_index += 1
            self.cond.notify_all()

    def _fold_streamer_counts(self, final: dict) -> None:
        """A streamer ended: its per-SSID counts go into each sender session's streamed_before (the
        next streamer counts from 0)."""
        by_ssid = final.get("records_by_ssid") or {}
        with self.lock:
            for (role, _), s in self.sessions.items():
                if role == SENDER:
                    s.streamed_before, s.streamer_offset = s.streamed(by_ssid), 0
        self.persist()

    def _ssid_records_now(self) -> dict:
        """The running streamer's per-SSID counts, read now (its stats file)."""
        try:
            return json.loads(self.streamer_stats_path.read_text()).get("records_by_ssid") or {}
        except (OSError, ValueError):
            return {}

    def _read_streamer_stats(self) -> dict:
        """The streamer's counters (its --stats-json, rewritten every 0.2 s); {} before the first."""
        try:
            stats = json.loads(self.streamer_stats_path.read_text())
        except (OSError, ValueError):
            return self._streamer_stats
        with self.lock:
            self._streamer_stats = stats
        return stats

    def poll_producer(self) -> None:
        """Called by the stats thread every tick: refresh the streamer's counters."""
        if self.reader is not None:
            self._read_streamer_stats()

    def counters(self) -> dict[str, int]:
        st = self._streamer_stats
        with self.lock:
            return {
                "records_read": self.records_read,
                "records_unmatched": self.unmatched_records,
                "records_streamed": int(st.get("records_delivered", 0)),
                "records_dropped": int(st.get("records_failed", 0)),
                "records_copy_dropped": int(st.get("records_copy_dropped", 0)),
                "results_evicted": self.results_evicted,
                "leftover_records_streamed": self.leftover_records_streamed,
                "leftover_records_lost": self.leftover_records_lost,
                "senders_adopted": self.senders_adopted,
                "senders_ended_unadopted": self.senders_ended_unadopted,
                "handover_records_lost": self.handover_records_lost,
                "kafka_queue_len": int(st.get("kafka_queue_len", 0)),
                "stamp_sessions": len(self.sessions),
                "stamp_reflector_userspace": int(self.reflector_running == USERSPACE),
            }

    def streamer_counters(self) -> dict[str, int] | None:
        """stamp_streamer's own counters (segscope_streamer: the ring buffer -> Kafka path), plus
        records_unmatched (copied records of no session of this agent); None while no streamer
        has run (no sender role initialised yet)."""
        st = self._streamer_stats
        if not st:
            return None
        out = {k: int(v) for k, v in st.items() if isinstance(v, int) and not isinstance(v, bool)}
        out.pop("batch_seq", None)
        with self.lock:
            out["records_unmatched"] = self.unmatched_records
        return out

    def session_lines(self, node_tag: str, ts: int) -> list[str]:
        """segscope_stamp_session: one line per STAMP session of this agent, what the session's
        results (stamp_delay, keyed by node and ssid) cannot say - the SID lists it travels, its
        peer, its rate - so a dashboard can pick a session by its path (schemas/metrics.md)."""
        from agent.metrics import escape_tag

        out = []
        with self.lock:
            for (role, ssid), s in sorted(self.sessions.items()):
                sp = s.spec
                tags = (
                    f"segscope_stamp_session,node={node_tag},ssid={ssid},role={ROLE_NAME[role]},"
                    f"path={escape_tag(pr.sids_tag(pr.STAMP, sp.segments))},"
                    f"return_path={escape_tag(','.join(sp.return_segments) or 'direct')}"
                    + (f",written={escape_tag(sp.written)}" if sp.written else "")
                )
                running = int(s.state == pb.STAMP_SESSION_STATE_RUNNING)
                out.append(f"{tags} rate_pps={sp.rate_pps}i,running={running}i {ts}")
        return out

    def program_devices(self) -> list[tuple[str, str]]:
        """(program, device) of every device a STAMP program of this agent runs on."""
        with self.lock:
            xdp = self.reflector_running == XDP
            return [("stamp_collector", d) for d in sorted(self.sender_devices)] + [
                ("stamp_reflector", d) for d in sorted(self.reflector_devices) if xdp
            ]

    def note_reflector_device(self, device: str) -> None:
        """Remember the device's TX drops at Init (reflector_tx_dropped counts from here)."""
        try:
            self.reflector_tx_base[device] = self.link_stats().get(device, {}).get("tx_dropped", 0)
        except OSError:
            self.reflector_tx_base[device] = 0

    def reflector_tx_dropped(self) -> int:
        if not self.reflector_devices or self.reflector_running != XDP:
            return 0
        try:
            stats = self.link_stats()
        except OSError:
            return 0
        return sum(
            max(0, stats.get(d, {}).get("tx_dropped", 0) - self.reflector_tx_base.get(d, 0))
            for d in self.reflector_devices
        )

    # -- the user-space reflector -------------------------------------------------------------------
    def _userspace_reflector(self, cfg: pb.StampReflectorConfig) -> UserspaceReflector:
        return UserspaceReflector(
            self.tools.repo,
            self.tools.netns,
            cfg.udp_port,
            self.streamer_stats_path.parent,
            self.node,
            self.kafka,
            outlive=self._outlive(),
        )

    def start_userspace_reflector(self, cfg: pb.StampReflectorConfig) -> None:
        self.userspace = self._userspace_reflector(cfg)
        self.userspace.start()
        self.socket_drops_base = self.userspace.counters().get("socket_drops", 0)

    def userspace_sessions(self) -> list[dict]:
        """The running reflector sessions as the user-space reflector's session file holds them."""
        return [
            {
                "ssid": ssid,
                "sender": s.spec.sender_address,
                "return_sids": list(s.spec.return_segments),
                "format": FORMAT_ARG[s.spec.timestamp_format],
            }
            for (role, ssid), s in sorted(self.sessions.items())
            if role == REFLECTOR and s.state == pb.STAMP_SESSION_STATE_RUNNING
        ]

    def reflector_socket_drops(self) -> int:
        """Test packets the kernel dropped at the user-space reflector's sockets since Init."""
        if self.userspace is None:
            return 0
        return max(0, self.userspace.counters().get("socket_drops", 0) - self.socket_drops_base)

    def attached_programs(self) -> list[tuple[str, Path, Path]]:
        """(program, loader, pin dir) of the STAMP programs attached now."""
        with self.lock:
            out = []
            if self.sender_cfg is not None:
                out.append(("stamp_collector", self.tools.collector, self.tools.collector_pin))
            if self.reflector_cfg is not None and self.reflector_running == XDP:
                out.append(("stamp_reflector", self.tools.reflector, self.tools.reflector_pin))
            return out

    def clear_leftovers(self, tool: Path, pin: Path, device: str) -> None:
        """Pins of this instance that this agent did not make: a previous agent of the node was
        killed without cleaning up. Detach them so Init starts from a clean datapath.

        A killed agent's collector stays attached: replies still in flight when its streamer
        drained are collected into a ring nobody reads. Before detaching, a streamer opens that
        ring (holding it past the detach) and sends what is left to Kafka; they are counted in
        leftover_records_streamed / leftover_records_lost (segscope_agent)."""
        if not pin.exists():
            return
        log.warning("Init: %s exists from a previous agent; detaching it first", pin)
        drain = None
        ring = pin / "stamp_records"
        if tool == self.tools.collector and ring.exists():
            drain = self._open_leftover_ring(ring)
        subprocess.run(
            [str(tool), "detach", *self.tools.ns_args(), "--dev", device, "--pin-dir", str(pin)],
            capture_output=True,
            timeout=30,
        )
        if drain is not None:
            self._finish_leftover_ring(drain)

    def _open_leftover_ring(self, ring: Path) -> subprocess.Popen | None:
        """A stamp_streamer on a previous agent's ring; returns once it has the ring open."""
        import select

        cmd = [str(self.tools.streamer), "--ringbuf", str(ring), "--node", self.node, "--no-metrics"]
        cmd += ["--stats-interval", "3600"]
        devnull = None
        if self.kafka:
            cmd += ["--brokers", self.kafka]
        else:  # nowhere to send them: read them (to /dev/null) so they are counted as lost
            devnull = os.open(os.devnull, os.O_WRONLY)
            cmd += ["--no-kafka", "--copy-fd", str(devnull)]
        try:
            p = children.spawn(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(devnull,) if devnull else ()
            )
        finally:
            if devnull is not None:
                os.close(devnull)
        assert p.stderr is not None
        # "stamp_streamer: RING -> ..." once the ring (and the Kafka client) are open
        ready, _, _ = select.select([p.stderr], [], [], 10.0)
        line = p.stderr.readline() if ready else b""
        if not line.startswith(b"stamp_streamer: "):
            self._stop_proc(p)
            log.warning("Init: cannot read the previous agent's ring %s: %r", ring, line[:200])
            return None
        return p

    def _finish_leftover_ring(self, p: subprocess.Popen) -> None:
        """SIGTERM: the streamer drains the ring, waits for Kafka's acks and prints its counters."""
        p.send_signal(signal.SIGTERM)
        try:
            out, _ = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self._stop_proc(p)
            log.warning("Init: the previous agent's ring did not drain within 60 s")
            return
        try:
            st = json.loads(out.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            log.warning("Init: no counters from the previous agent's ring drain: %r", out[-200:])
            return
        read = int(st.get("records_in", 0))
        delivered = int(st.get("records_delivered", 0)) if self.kafka else 0
        with self.lock:
            self.leftover_records_streamed += delivered
            self.leftover_records_lost += read - delivered
        if read:
            log.warning(
                "Init: %d records a previous agent left in the collector's ring: %d to Kafka, %d lost",
                read,
                delivered,
                read - delivered,
            )

    # -- sender processes -----------------------------------------------------------------------
    def _spawn_sender(self, s: Session, duration_s: float) -> None:
        sp = s.spec
        cmd = [
            str(self.tools.sender),
            *self.tools.ns_args(),
            "--src",
            sp.sender_address or self.sender_cfg.source_address,
            "--dst",
            sp.segments[0] if sp.reduced else sp.reflector_address,
            "--ssid",
            str(sp.ssid),
            "--sport",
            str(sp.sender_port or 50000 + sp.ssid),
            "--dport",
            str(sp.reflector_port or 862),
            "--rate",
            str(sp.rate_pps),
            "--duration",
            str(duration_s or FOREVER_S),
            "--format",
            FORMAT_ARG[sp.timestamp_format],
        ]
        if sp.reduced:  # the container is the destination; the checksum is for the last shift's
            cmd += ["--final-dst", sp.reflector_address]
        elif sp.segments:
            cmd += ["--segs", ",".join(sp.segments)]
        if sp.padding_bytes:
            cmd += ["--padding", str(sp.padding_bytes)]
        run_dir = self.streamer_stats_path.parent
        s.stats_file = run_dir / f"sender-{sp.ssid}.json"
        s.stats_file.unlink(missing_ok=True)
        cmd += ["--stats-file", str(s.stats_file)]
        if not self.tools.sender.exists():
            raise ApiError(grpc.StatusCode.FAILED_PRECONDITION, f"ssid: {self.tools.sender} is not built (make build)")
        # files, not pipes: a sender that outlives the agent must not write into a dead pipe
        s.out_file, s.err_file = run_dir / f"sender-{sp.ssid}.out", run_dir / f"sender-{sp.ssid}.err"
        with open(s.out_file, "wb") as out, open(s.err_file, "wb") as err:
            s.proc = children.spawn(cmd, outlive=self._outlive(), stdout=out, stderr=err)
        s.proc_ref = ProcRef.of(s.proc.pid)
        log.info("stamp_sender ssid %d started (pid %d): %s", sp.ssid, s.proc.pid, " ".join(cmd))
        threading.Thread(target=self._reap_sender, args=(s, s.proc), daemon=True).start()

    def _reap_sender(self, s: Session, p) -> None:
        """Wait for a sender (ours or adopted) to end; its summary and stderr from its files."""
        p.wait()
        out, err = _read(s.out_file), _read(s.err_file)
        summary = _last_json(out)
        adopted = getattr(p, "adopted", False)
        if adopted:  # not our child: its exit status is not ours to read, its summary says how it ended
            ok = bool(summary) and not summary.get("orphaned")
            how = "ended" if summary else "ended without a summary (killed?)"
        else:
            ok = p.returncode in (0, -signal.SIGTERM)
            how = f"exited {p.returncode}"
        with self.lock:
            s.packets_sent += int(summary.get("sent", summary.get("packets_sent", 0)) or 0)
            if s.proc is p:
                s.proc = None
                s.proc_ref = None
                if s.state == pb.STAMP_SESSION_STATE_RUNNING:
                    if ok:
                        s.state = pb.STAMP_SESSION_STATE_STOPPED
                    else:  # e.g. "Address already in use": the controller sees it and fails
                        s.state = pb.STAMP_SESSION_STATE_FAILED
                        s.error = f"stamp_sender {how}: {err.strip()[-300:]}"
        self.persist()
        log.info(
            "stamp_sender ssid %d %s%s: %s%s",
            s.spec.ssid,
            how,
            f" (pid {p.pid}, adopted)" if adopted else "",
            json.dumps(summary),
            f" stderr: {err.strip()[:300]}" if not ok else "",
        )

    def _outlive(self) -> list[str] | None:
        """The tether arguments of a child that outlives the agent; None: it dies with the agent."""
        return self.keeper.tether_args() if self.keeper is not None else None

    # -- restarts: what the next agent adopts (agent/keeper.py) ---------------------------------
    def persist(self) -> None:
        """This part of datapath.json, now."""
        if self.keeper is not None:
            self.keeper.put("stamp", self.snapshot())

    def snapshot(self) -> dict:
        def js(m) -> dict:
            return json_format.MessageToDict(m, preserving_proto_field_name=True)

        with self.lock:
            out: dict = {}
            if self.sender_cfg is not None:
                out["sender"] = {"devices": [js(c) for c in self.sender_devices.values()]}
            if self.reflector_cfg is not None:
                out["reflector"] = {
                    "config": js(self.reflector_cfg),
                    "devices": [js(c) for c in self.reflector_devices.values()],
                    "running": pb.StampReflectorMode.Name(self.reflector_running),
                    "fallback_reason": self.reflector_fallback,
                }
                if self.userspace is not None and self.userspace.snapshot() is not None:
                    out["reflector"]["userspace"] = self.userspace.snapshot()
                    out["reflector"]["socket_drops_base"] = self.socket_drops_base
            if self.reader_ref is not None and self.reader is not None and self.reader.poll() is None:
                out["streamer"] = self.reader_ref.to_json()
            out["sessions"] = [
                {
                    "spec": js(s.spec),
                    "state": pb.StampSessionState.Name(s.state),
                    "error": s.error,
                    "packets_sent": s.packets_sent,
                    "streamed_before": s.streamed_before,
                    "streamer_offset": s.streamer_offset,
                    "sender": s.proc_ref.to_json() if s.proc is not None and s.proc_ref is not None else None,
                    "files": {
                        k: str(v)
                        for k, v in (("stats", s.stats_file), ("out", s.out_file), ("err", s.err_file))
                        if v is not None
                    },  # fmt: skip
                }
                for _, s in sorted(self.sessions.items())
            ]
            return out

    def adopt(self, doc: dict) -> list[str]:
        """Take over the STAMP part a previous agent of the node left (datapath.json "stamp"): each
        role whose program is still pinned, its sessions, the senders that still run. Returns what
        was done, for the log."""
        t = self.tools
        notes: list[str] = []
        with self.lock:
            sender = doc.get("sender")
            if (
                sender
                and (t.collector_pin / "stamp_sessions").exists()
                and (t.collector_pin / "stamp_records").exists()
            ):
                cfgs = [json_format.ParseDict(c, pb.StampSenderConfig()) for c in sender["devices"]]
                self.sender_cfg = cfgs[0]
                self.sender_devices = {c.device: c for c in cfgs}
                notes.append(f"sender role on {','.join(self.sender_devices)}")
            elif sender:
                notes.append("sender role NOT adopted: the collector's pins are gone")
            refl = doc.get("reflector")
            xdp = refl and refl.get("running") == "STAMP_REFLECTOR_MODE_XDP"
            if xdp and (t.reflector_pin / "reflector_sessions").exists():
                self.reflector_cfg = json_format.ParseDict(refl["config"], pb.StampReflectorConfig())
                self.reflector_devices = {
                    c.device: c for c in (json_format.ParseDict(d, pb.StampReflectorConfig()) for d in refl["devices"])
                }
                self.reflector_running, self.reflector_fallback = XDP, refl.get("fallback_reason", "")
                for dev in self.reflector_devices:
                    self.note_reflector_device(dev)
                notes.append(f"XDP reflector on {','.join(self.reflector_devices)}")
            elif refl and refl.get("running") == "STAMP_REFLECTOR_MODE_USERSPACE":
                notes.append(self._adopt_userspace(refl))
            elif refl:
                notes.append(f"reflector role NOT adopted ({refl.get('running')}: its pins are gone)")
            roles = {SENDER: self.sender_cfg is not None, REFLECTOR: self.reflector_cfg is not None}
            running = ended = dropped = 0
            for sd in doc.get("sessions", []):
                spec = json_format.ParseDict(sd["spec"], pb.StampSession())
                if not roles.get(spec.role):
                    dropped += 1
                    continue
                s = Session(spec, state=pb.StampSessionState.Value(sd.get("state", "STAMP_SESSION_STATE_CREATED")))
                s.error, s.packets_sent = sd.get("error", ""), int(sd.get("packets_sent", 0))
                s.streamed_before = int(sd.get("streamed_before", 0))
                s.streamer_offset = int(sd.get("streamer_offset", 0))
                files = sd.get("files", {})
                s.stats_file, s.out_file, s.err_file = (
                    Path(files[k]) if k in files else None for k in ("stats", "out", "err")
                )
                if spec.role == SENDER and s.state == pb.STAMP_SESSION_STATE_RUNNING:
                    handle = Adopted.open(ProcRef.from_json(sd.get("sender")))
                    if handle is not None:
                        s.proc, s.proc_ref = handle, handle.ref
                        threading.Thread(target=self._reap_sender, args=(s, handle), daemon=True).start()
                        running += 1
                    else:
                        ended += 1
                        self._ended_unadopted(s, sd.get("sender"))
                self.sessions[(spec.role, spec.ssid)] = s
            self.senders_adopted += running
            notes.append(f"{len(self.sessions)} sessions ({running} senders running and adopted"
                         + (f", {ended} ended while no agent ran" if ended else "") + ")"  # fmt: skip
                         + (f", {dropped} of roles not adopted dropped" if dropped else ""))  # fmt: skip
            old = Adopted.open(ProcRef.from_json(doc.get("streamer")))
        if old is not None:
            lost = self._replace_streamer(old)
            notes.append(f"streamer pid {old.pid} replaced (it delivered all but {lost} records)")
        self._continue_counts(self._ssid_records_now() if doc.get("streamer") else {})
        if self.sender_cfg is not None:
            self._start_reader()
        self.persist()
        return notes

    def _adopt_userspace(self, refl: dict) -> str:
        """The user-space reflector a previous agent left answering: adopted if that very process
        still runs with the arguments this agent would give it (the role with it), else the role is
        dropped (and a process with other arguments stopped)."""
        u = refl.get("userspace") or {}
        handle = Adopted.open(ProcRef.from_json(u))
        cfg = json_format.ParseDict(refl["config"], pb.StampReflectorConfig())
        mine = self._userspace_reflector(cfg)
        if handle is None:
            return "reflector role NOT adopted (the user-space reflector ended while no agent ran)"
        if u.get("cmd") != mine.command():
            stop_proc(handle, 10.0)
            return f"reflector role NOT adopted (user-space reflector pid {handle.pid} had other arguments: stopped)"
        mine.adopt(handle, int(refl.get("socket_drops_base", 0)))
        self.userspace, self.socket_drops_base = mine, int(refl.get("socket_drops_base", 0))
        self.reflector_cfg = cfg
        self.reflector_devices = {
            c.device: c for c in (json_format.ParseDict(d, pb.StampReflectorConfig()) for d in refl["devices"])
        }
        self.reflector_running, self.reflector_fallback = USERSPACE, refl.get("fallback_reason", "")
        return f"user-space reflector pid {handle.pid} on port {cfg.udp_port} adopted"

    def _continue_counts(self, last_streamer: dict) -> None:
        """Each adopted sender session's results_collected goes on from what the streamers read
        (the previous agent's, until this agent's streamer starts), not from 0: replies the old
        streamer delivered while no agent ran count (they are in Kafka), so `controller status`
        does not call them lost. The results this agent holds start at that index."""
        with self.lock:
            for (role, _), s in self.sessions.items():
                if role != SENDER:
                    continue
                s.streamed_before, s.streamer_offset = s.streamed(last_streamer), 0
                s.next_index = max(s.next_index, s.streamed_before)

    def _ended_unadopted(self, s: Session, ref: dict | None) -> None:
        """A sender that was running when its agent went and ended before this one came."""
        summary = _last_json(_read(s.out_file))
        s.packets_sent += int(summary.get("sent", 0) or 0)
        pid = (ref or {}).get("pid", "?")
        if summary and not summary.get("orphaned"):  # it ran its course (duration_s) meanwhile
            s.state = pb.STAMP_SESSION_STATE_STOPPED
            return
        self.senders_ended_unadopted += 1
        s.state = pb.STAMP_SESSION_STATE_FAILED
        s.error = (
            f"stamp_sender (pid {pid}) stopped itself: no agent adopted it in time"
            if summary.get("orphaned")
            else f"stamp_sender (pid {pid}) ended while no agent ran: {_read(s.err_file).strip()[-200:] or 'killed'}"
        )
        log.warning("adoption: session ssid %d: %s", s.spec.ssid, s.error)

    def _replace_streamer(self, old: Adopted) -> int:
        """Stop a previous agent's streamer gracefully (it drains the ring to Kafka, waits for the
        acks); returns the records it read and did not deliver (its final counters, in its log)."""
        stop_proc(old, 60.0)
        final = {}
        for line in reversed(_read(self.streamer_stats_path.with_suffix(".log")).splitlines()):
            candidate = _last_json(line)
            if candidate.get("final"):
                final = candidate
                break
        lost = max(0, int(final.get("records_in", 0)) - int(final.get("records_delivered", 0))) if final else 0
        with self.lock:
            self.handover_records_lost += lost
        if not final:
            log.warning("adoption: the previous streamer (pid %d) left no final counters", old.pid)
        return lost

    def handover(self) -> None:
        """--on-stop handover: leave the roles, sessions, senders, the streamer and the user-space
        reflector to the next agent (they keep measuring meanwhile)."""
        with self.lock:
            self.stopping.set()  # the reader thread does not start another streamer
        self.persist()

    @staticmethod
    def _stop_proc(p) -> None:
        stop_proc(p, 5.0)

    def reset(self) -> tuple[int, bool]:
        """Stop and destroy every session, stop the results reader, detach the datapath."""
        t = self.tools
        with self.lock:
            n = len(self.sessions)
            changed = bool(n or self.sender_cfg or self.reflector_cfg)
            for s in list(self.sessions.values()):
                if s.proc is not None:
                    s.state = pb.STAMP_SESSION_STATE_STOPPED
                    self._stop_proc(s.proc)
            self.sessions.clear()
            self.stopping.set()
            if self.reader is not None:
                self._stop_proc(self.reader)
                self.reader = None
            # `detach` takes each program out of the node's XDP chain on every device it runs on;
            # the other members there (the flow monitor's altmark_rx, the other STAMP role) keep running
            if self.userspace is not None:
                final = self.userspace.stop()
                log.info("Reset: user-space reflector stopped, counters %s", json.dumps(final))
                self.userspace = None
            xdp_reflector = self.reflector_cfg if self.reflector_running == XDP else None
            for tool, pin, cfg, devices in (
                (t.collector, t.collector_pin, self.sender_cfg, self.sender_devices),
                (t.reflector, t.reflector_pin, xdp_reflector, self.reflector_devices),
            ):
                if cfg is not None:
                    cmd = [str(tool), "detach", *t.ns_args(), "--dev", cfg.device, "--pin-dir", str(pin)]
                    subprocess.run(cmd, capture_output=True)
                devices.clear()
            self.sender_cfg = None
            self.reflector_cfg = None
            self.reflector_running = pb.STAMP_REFLECTOR_MODE_UNSPECIFIED
            self.reflector_fallback = ""
        self.persist()
        if changed:
            log.info("Reset: %d sessions destroyed, datapath detached", n)
        else:
            log.info("Reset: nothing to do")
        return n, changed

    def shutdown(self) -> None:
        try:
            self.reset()
        finally:
            if self.keeper is None:  # a temporary directory; the state directory's files stay
                shutil.rmtree(self.streamer_stats_path.parent, ignore_errors=True)


def _read(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _last_json(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return {}


def _role(path: str, v: int) -> int:
    return F.enum_value(path, v, pb.StampRole)


def _ssid(path: str, v: int) -> int:
    if v == 0:
        raise F.invalid(path, "required (1..65535)")
    F.in_range(path, v, 1, 65535)
    return v


def validate_session(sp: pb.StampSession) -> pb.StampSession:
    """Validate every field; returns a normalised copy (canonical addresses)."""
    role = _role("session.role", sp.role)
    _ssid("session.ssid", sp.ssid)
    out = pb.StampSession()
    out.CopyFrom(sp)
    F.enum_value("session.timestamp_format", sp.timestamp_format, pb.TimestampFormat, required=False)
    F.enum_value("session.mode", sp.mode, pb.StampMode, required=False)
    F.in_range("session.sender_port", sp.sender_port, 0, 65535)
    F.in_range("session.reflector_port", sp.reflector_port, 0, 65535)
    if role == SENDER:
        out.sender_address = F.ipv6("session.sender_address", sp.sender_address, required=False)
        out.reflector_address = F.ipv6("session.reflector_address", sp.reflector_address)
        del out.segments[:]
        out.segments.extend(F.segments("session.segments", sp.segments, min_len=0))
        F.refuse(
            "session.return_segments",
            len(sp.return_segments) > 0,
            "with STAMP_ROLE_SENDER (the reflector's return path is set on the reflector)",
        )
        if sp.reduced and len(out.segments) != 1:
            raise F.invalid(
                "session.segments",
                f"{len(out.segments)} SIDs with reduced: give exactly one, the uSID container the "
                "destination holds (its address after the last shift is reflector_address)",
            )
        if sp.rate_pps == 0:
            raise F.invalid("session.rate_pps", "required with STAMP_ROLE_SENDER (1..1000000)")
        F.in_range("session.rate_pps", sp.rate_pps, 1, 1_000_000)
        F.in_range("session.padding_bytes", sp.padding_bytes, 0, 1400)
        F.refuse(
            "session.mode",
            sp.mode == pb.STAMP_MODE_AUTHENTICATED,
            "with STAMP_ROLE_SENDER (the sender sends unauthenticated test packets)",
        )
    else:
        out.sender_address = F.ipv6("session.sender_address", sp.sender_address)
        F.refuse(
            "session.segments",
            len(sp.segments) > 0,
            "with STAMP_ROLE_REFLECTOR (use return_segments for the return path)",
        )
        del out.return_segments[:]
        out.return_segments.extend(F.segments("session.return_segments", sp.return_segments, min_len=0))
        F.refuse("session.rate_pps", sp.rate_pps != 0, "with STAMP_ROLE_REFLECTOR")
        F.refuse("session.reduced", sp.reduced, "with STAMP_ROLE_REFLECTOR (it is the sender's encapsulation)")
        F.refuse("session.padding_bytes", sp.padding_bytes != 0, "with STAMP_ROLE_REFLECTOR")
        F.refuse(
            "session.reflector_port",
            sp.reflector_port != 0,
            "with STAMP_ROLE_REFLECTOR (the port comes from Init's reflector.udp_port)",
        )
        out.reflector_address = ""
    return out


class StampServicer(pb_grpc.StampServiceServicer):
    def __init__(self, agent: StampAgent):
        self.a = agent

    def _changed(self) -> None:
        self.a.persist()
        if self.a.on_change:
            try:
                self.a.on_change()
            except Exception:  # noqa: BLE001
                log.exception("on_change hook failed")

    # -- Init / Reset ------------------------------------------------------------------------
    def Init(self, req, ctx):
        a, t = self.a, self.a.tools
        if not req.HasField("sender") and not req.HasField("reflector"):
            raise F.invalid("sender", "set sender and/or reflector")
        snd = rfl = None
        if req.HasField("sender"):
            snd = pb.StampSenderConfig(
                device=F.ifname("sender.device", req.sender.device),
                source_address=F.ipv6("sender.source_address", req.sender.source_address),
            )
        if req.HasField("reflector"):
            r = req.reflector
            if not r.addresses:
                raise F.invalid("reflector.addresses", "required (1..64 IPv6 addresses)")
            F.in_range("reflector.addresses", len(r.addresses), 1, 64, "addresses")
            F.in_range("reflector.udp_port", r.udp_port, 0, 65535)
            rfl = pb.StampReflectorConfig(
                device=F.ifname("reflector.device", r.device),
                addresses=[F.ipv6(f"reflector.addresses[{i}]", x) for i, x in enumerate(r.addresses)],
                udp_port=r.udp_port or 862,
                mode=F.enum_value("reflector.mode", r.mode, pb.StampReflectorMode, required=False) or AUTO,
            )
        changed = False
        with a.lock:
            if snd is not None and snd.device in a.sender_devices and a.sender_devices[snd.device] != snd:
                have = a.sender_devices[snd.device]
                raise ApiError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"sender: device {snd.device} already initialised with source {have.source_address}; Reset first",
                )
            if rfl is not None and a.reflector_cfg is not None and a.reflector_cfg.udp_port != rfl.udp_port:
                raise ApiError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"reflector.udp_port: the reflector already answers on port {a.reflector_cfg.udp_port} "
                    f"(devices {sorted(a.reflector_devices)}); one port per node, or Reset first",
                )
            if rfl is not None and a.reflector_cfg is not None and a.reflector_cfg.mode != rfl.mode:
                raise ApiError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"reflector.mode: the reflector was initialised with "
                    f"{pb.StampReflectorMode.Name(a.reflector_cfg.mode)}; Reset first",
                )
            if snd is not None and a.sender_cfg is not None and snd.device not in a.sender_devices:
                changed |= self._add_device(snd, "sender", t.collector, t.collector_pin, a.sender_devices)
            if rfl is not None and a.reflector_cfg is not None:
                xdp = a.reflector_running == XDP
                if rfl.device not in a.reflector_devices:
                    if xdp:
                        changed |= self._add_device(rfl, "reflector", t.reflector, t.reflector_pin, a.reflector_devices)
                    else:  # the user-space reflector's socket takes every device's packets already
                        a.reflector_devices[rfl.device] = rfl
                        changed = True
                have = set(a.reflector_cfg.addresses)
                for i, addr in enumerate(rfl.addresses):
                    if addr not in have:
                        if xdp:
                            t.run(
                                [t.reflector, "add-address", "--pin-dir", t.reflector_pin, addr],
                                f"reflector.addresses[{i}]",
                            )
                        a.reflector_cfg.addresses.append(addr)
                        changed = True
            # the STAMP programs join the node's XDP chain (datapath/README.md, "Chaining"): any
            # device, beside the flow monitor's altmark_rx and each other, in any order
            if snd is not None and a.sender_cfg is None:
                a.clear_leftovers(t.collector, t.collector_pin, snd.device)
                t.run(
                    [t.collector, "attach", *t.ns_args(), "--dev", snd.device, "--pin-dir", t.collector_pin],
                    "sender.device",
                )
                a.sender_cfg = snd
                a.sender_devices[snd.device] = snd
                a._start_reader()
                changed = True
                log.info("Init sender: stamp_collector attached to %s, results reader started", snd.device)
            if rfl is not None and a.reflector_cfg is None:
                running, reason = USERSPACE, ""
                if rfl.mode != USERSPACE:
                    try:
                        self._attach_xdp_reflector(rfl)
                        running = XDP
                    except ApiError as exc:
                        # AUTO: a device or kernel without native XDP gets the user-space reflector
                        if rfl.mode == XDP or not xdp_refused(exc.message):
                            raise
                        reason = exc.message
                        log.warning("Init reflector: XDP refused on %s, the user-space reflector answers: %s",
                                    rfl.device, reason)  # fmt: skip
                if running == USERSPACE:
                    a.start_userspace_reflector(rfl)
                    log.info(
                        "Init reflector: user-space reflector on port %d (pid %d)", rfl.udp_port, a.userspace.proc.pid
                    )
                a.reflector_cfg = pb.StampReflectorConfig()
                a.reflector_cfg.CopyFrom(rfl)
                a.reflector_devices[rfl.device] = rfl
                a.reflector_running, a.reflector_fallback = running, reason
                if running == XDP:
                    a.note_reflector_device(rfl.device)
                changed = True
            response = pb.InitResponse(changed=changed)
            if a.reflector_cfg is not None:
                response.reflector_running = a.reflector_running
                response.reflector_fallback_reason = a.reflector_fallback
        if not changed:
            log.info("Init: unchanged (same configuration)")
        else:
            self._changed()
        return response

    def _attach_xdp_reflector(self, rfl: pb.StampReflectorConfig) -> None:
        """The XDP reflector on rfl.device (it joins the node's XDP chain) with rfl's addresses."""
        a, t = self.a, self.a.tools
        a.clear_leftovers(t.reflector, t.reflector_pin, rfl.device)
        t.run(
            [t.reflector, "attach", *t.ns_args(), "--dev", rfl.device, "--pin-dir", t.reflector_pin]
            + ["--port", rfl.udp_port],
            "reflector.device",
        )
        try:
            for i, addr in enumerate(rfl.addresses):
                t.run([t.reflector, "add-address", "--pin-dir", t.reflector_pin, addr], f"reflector.addresses[{i}]")
        except ApiError:
            t.run(
                [t.reflector, "detach", *t.ns_args(), "--dev", rfl.device, "--pin-dir", t.reflector_pin],
                "reflector.device",
            )
            raise
        log.info(
            "Init reflector: stamp_reflector attached to %s for %s port %d",
            rfl.device,
            ",".join(rfl.addresses),
            rfl.udp_port,
        )

    def _add_device(self, cfg, role: str, tool: Path, pin: Path, devices: dict) -> bool:
        """The role's program, already attached, on one more device (same maps); True when done."""
        a, t = self.a, self.a.tools
        t.run([tool, "attach-dev", *t.ns_args(), "--dev", cfg.device, "--pin-dir", pin], f"{role}.device")
        devices[cfg.device] = cfg
        if role == "reflector":
            a.note_reflector_device(cfg.device)
        log.info("Init %s: %s also attached to %s (devices %s)", role, tool.name, cfg.device, sorted(devices))
        return True

    def Reset(self, req, ctx):
        n, changed = self.a.reset()
        if changed:
            self._changed()
        return pb.ResetResponse(sessions_destroyed=n, changed=changed)

    # -- sessions ----------------------------------------------------------------------------
    def _get(self, role: int, ssid: int) -> Session:
        s = self.a.sessions.get((role, ssid))
        if s is None:
            raise ApiError(grpc.StatusCode.NOT_FOUND, f"ssid: no {ROLE_NAME[role]} session {ssid}")
        return s

    def CreateStampSession(self, req, ctx):
        sp = validate_session(req.session)
        a, t = self.a, self.a.tools
        key = (sp.role, sp.ssid)
        with a.lock:
            cfg = a.sender_cfg if sp.role == SENDER else a.reflector_cfg
            if cfg is None:
                raise ApiError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"session.role: the {ROLE_NAME[sp.role]} role is not initialised (call Init first)",
                )
            if sp.role == REFLECTOR and a.reflector_running == USERSPACE and sp.mode == pb.STAMP_MODE_AUTHENTICATED:
                raise ApiError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "session.mode: the user-space reflector needs a key file for an authenticated session, which "
                    "the API does not carry (collectors/ustamp/README.md: --sessions with key_file, by hand)",
                )
            old = a.sessions.get(key)
            if old is not None:
                if old.spec == sp:
                    log.info("CreateStampSession %s ssid %d: unchanged", ROLE_NAME[sp.role], sp.ssid)
                    return pb.CreateStampSessionResponse(status=old.status(), changed=False)
                raise ApiError(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"session.ssid: {ROLE_NAME[sp.role]} session {sp.ssid} exists with different "
                    f"parameters; DestroyStampSession first",
                )
            if sp.role == SENDER:
                t.run(
                    [
                        t.collector,
                        "activate",
                        "--pin-dir",
                        t.collector_pin,
                        "--ssid",
                        sp.ssid,
                        "--port",
                        sp.sender_port or 50000 + sp.ssid,
                        "--format",
                        FORMAT_ARG[sp.timestamp_format],
                    ],
                    "session",
                )
            s = a.sessions[key] = Session(sp)
            if sp.role == SENDER:  # the running streamer may have counted this SSID for an earlier session
                s.streamer_offset = int(a._ssid_records_now().get(str(sp.ssid), 0))
            log.info(
                "CreateStampSession %s ssid %d: created (%s -> %s, segs %s, return %s, rate %d)",
                ROLE_NAME[sp.role],
                sp.ssid,
                sp.sender_address or (cfg.source_address if sp.role == SENDER else ""),
                sp.reflector_address,
                ",".join(sp.segments),
                ",".join(sp.return_segments),
                sp.rate_pps,
            )
        self._changed()
        return pb.CreateStampSessionResponse(status=s.status(), changed=True)

    def _reflector_add(self, sp: pb.StampSession) -> None:
        a, t = self.a, self.a.tools
        if a.reflector_running == USERSPACE:
            # the running sessions and this one, in the user-space reflector's session file
            key = (REFLECTOR, sp.ssid)
            prev = a.sessions[key].state
            a.sessions[key].state = pb.STAMP_SESSION_STATE_RUNNING
            try:
                a.userspace.set_sessions(a.userspace_sessions(), "session")
            except ApiError:
                a.sessions[key].state = prev
                raise
            return
        cmd = [
            t.reflector,
            "add-session",
            "--pin-dir",
            t.reflector_pin,
            "--ssid",
            sp.ssid,
            "--sender",
            sp.sender_address,
            "--format",
            FORMAT_ARG[sp.timestamp_format],
            "--mode",
            MODE_ARG[sp.mode],
        ]
        if sp.return_segments:
            cmd += ["--return-sids", ",".join(sp.return_segments)]
        t.run(cmd, "session")

    def _reflector_del(self, sp: pb.StampSession) -> None:
        a, t = self.a, self.a.tools
        if a.reflector_running == USERSPACE:
            key = (REFLECTOR, sp.ssid)
            a.sessions[key].state = pb.STAMP_SESSION_STATE_STOPPED
            a.userspace.set_sessions(a.userspace_sessions(), "ssid")
            return
        t.run(
            [
                t.reflector,
                "del-session",
                "--pin-dir",
                t.reflector_pin,
                "--ssid",
                sp.ssid,
                "--sender",
                sp.sender_address,
            ],
            "ssid",
        )

    def StartStampSession(self, req, ctx):
        role, ssid = _role("role", req.role), _ssid("ssid", req.ssid)
        if req.duration_s < 0 or req.duration_s > 86400 * 365 or req.duration_s != req.duration_s:
            raise F.invalid("duration_s", f"{req.duration_s} out of range 0..31536000 seconds")
        F.refuse("duration_s", role == REFLECTOR and req.duration_s != 0, "with STAMP_ROLE_REFLECTOR")
        with self.a.lock:
            s = self._get(role, ssid)
            if s.state == pb.STAMP_SESSION_STATE_RUNNING:
                log.info("StartStampSession %s ssid %d: already running", ROLE_NAME[role], ssid)
                return pb.StartStampSessionResponse(status=s.status(), changed=False)
            if role == SENDER:
                s.error = ""
                self.a._spawn_sender(s, req.duration_s)
            else:
                self._reflector_add(s.spec)
            s.state = pb.STAMP_SESSION_STATE_RUNNING
            log.info(
                "StartStampSession %s ssid %d: running%s",
                ROLE_NAME[role],
                ssid,
                f" for {req.duration_s} s" if req.duration_s else "",
            )
            status = s.status()
        self.a.persist()
        return pb.StartStampSessionResponse(status=status, changed=True)

    def _stop(self, s: Session) -> bool:
        if s.state != pb.STAMP_SESSION_STATE_RUNNING:
            return False
        if s.spec.role == SENDER:
            p = s.proc
            s.state = pb.STAMP_SESSION_STATE_STOPPED
            self.a._stop_proc(p)
        else:
            self._reflector_del(s.spec)
            s.state = pb.STAMP_SESSION_STATE_STOPPED
        return True

    def StopStampSession(self, req, ctx):
        role, ssid = _role("role", req.role), _ssid("ssid", req.ssid)
        with self.a.lock:
            s = self._get(role, ssid)
            changed = self._stop(s)
            log.info("StopStampSession %s ssid %d: %s", ROLE_NAME[role], ssid, "stopped" if changed else "not running")
            status = s.status()
        if changed:
            self.a.persist()
        return pb.StopStampSessionResponse(status=status, changed=changed)

    def DestroyStampSession(self, req, ctx):
        role, ssid = _role("role", req.role), _ssid("ssid", req.ssid)
        t = self.a.tools
        with self.a.lock:
            s = self.a.sessions.get((role, ssid))
            if s is None:
                if req.allow_missing:
                    log.info("DestroyStampSession %s ssid %d: absent, allow_missing", ROLE_NAME[role], ssid)
                    return pb.DestroyStampSessionResponse(changed=False)
                self._get(role, ssid)
            self._stop(s)
            if role == SENDER:
                t.run([t.collector, "deactivate", "--pin-dir", t.collector_pin, "--ssid", ssid], "ssid")
            del self.a.sessions[(role, ssid)]
            log.info("DestroyStampSession %s ssid %d: destroyed", ROLE_NAME[role], ssid)
        self._changed()
        return pb.DestroyStampSessionResponse(changed=True)

    def ListStampSessions(self, req, ctx):
        with self.a.lock:
            out = [s.status() for _, s in sorted(self.a.sessions.items())]
            tx_dropped = self.a.reflector_tx_dropped()
            socket_drops = self.a.reflector_socket_drops()
        for st in out:
            if st.session.role == REFLECTOR:
                st.reflector_tx_dropped = tx_dropped
                st.reflector_socket_drops = socket_drops
        log.info("ListStampSessions: %d sessions", len(out))
        return pb.ListStampSessionsResponse(sessions=out)

    # -- results -----------------------------------------------------------------------------
    def GetStampSessionResults(self, req, ctx):
        ssid = _ssid("ssid", req.ssid)
        F.in_range("max_results", req.max_results, 0, 100_000)
        limit = req.max_results or 1000
        with self.a.lock:
            s = self._get(SENDER, ssid)
            held = list(s.results)
            dropped = s.dropped
        first_held = held[0].index if held else 0
        start = max(0, req.from_index - first_held)
        out = held[start : start + limit]
        nxt = out[-1].index + 1 if out else max(req.from_index, first_held + len(held))
        log.info("GetStampSessionResults ssid %d from %d: %d results", ssid, req.from_index, len(out))
        return pb.GetStampSessionResultsResponse(
            results=out,
            next_index=nxt,
            dropped_results=dropped,
            forward=_summary([r.forward_delay_ns for r in held]),
            reverse=_summary([r.reverse_delay_ns for r in held]),
            round_trip=_summary([r.round_trip_delay_ns for r in held]),
        )

    def SubscribeStampResults(self, req, ctx):
        for i, ssid in enumerate(req.ssids):
            _ssid(f"ssids[{i}]", ssid)
        F.in_range("max_delay_ms", req.max_delay_ms, 0, 60_000)
        delay = (req.max_delay_ms or 200) / 1000
        wanted = set(req.ssids)
        a = self.a
        with a.lock:  # start after what is there now: a subscription pushes NEW results
            cursor = {ssid: s.next_index for (role, ssid), s in a.sessions.items() if role == SENDER}
        log.info("SubscribeStampResults from %s: ssids %s", ctx.peer(), sorted(wanted) or "all")
        while ctx.is_active():
            batch: list[pb.StampResult] = []
            with a.cond:
                a.cond.wait(timeout=delay)
                for (role, ssid), s in a.sessions.items():
                    if role != SENDER or (wanted and ssid not in wanted):
                        continue
                    start = cursor.get(ssid, 0)
                    if s.next_index > start:
                        held_first = s.next_index - len(s.results)
                        batch.extend(list(s.results)[max(0, start - held_first) :])
                        cursor[ssid] = s.next_index
            if batch:
                yield pb.StampResultBatch(results=batch)
        log.info("SubscribeStampResults from %s: ended", ctx.peer())
