"""InlineMonitorService: in-line (IOAM) monitors of this node and its IOAM identity.

Drives build/datapath/ioam_tx (INGRESS side: TC egress after the seg6 encap, inserts the IOAM
trace and E2E options into sampled packets) and build/datapath/ioam_rx (EGRESS side: XDP, one
ioam_record per sampled packet into the pinned ring buffer `ioam_records`) of the agent's bpffs
instance (/sys/fs/bpf/segscope/<instance>/ioam_{tx,rx}); agent/ioam.py does the kernel's part
(EnableIoam: node id, interface ids, namespaces).

A side's program is attached to a device with the side's first monitor there (`attach`, then
`attach-dev` for more devices: one program, its flows and counters shared) and detached with the
last. ioam_rx joins the node's XDP chain through its loader (datapath/xdp_chain.h), or with the
agent's --inline-egress-hook, per device, as a TC ingress filter (auto, the default: on a veth or a
pod's interface, where native XDP costs NAPI and a copy per packet); the node's XDP attaches and
detaches are serialised with the STAMP and alternate-marking ones (one lock). The
INGRESS side writes the packet's ingress and egress interface ids into its own trace entry: the
agent gives ioam_tx every interface id of the node's IOAM configuration (`set-if-id`) when it
attaches and whenever EnableIoam changes them. With --kafka the agent runs stamp_streamer
--records ioam on the ring (key "<node>/<flow_id>", topic segscope.ioam.records); without Kafka
nothing reads the ring and ioam_rx counts the records it cannot store.

Restarts (agent/keeper.py): with the node's state directory the streamer outlives the agent
(tethered: `--agent-dir --adopt-timeout`) and goes on delivering the ring to Kafka; the sides, their
monitors, the IOAM identity and the streamer are in datapath.json ("inline"), and the next agent
adopts them: each side whose pins are still there with the flows its datapath still lists, the
IOAM identity as the previous agent left it (ioam.json: not restored, the monitors need it), and
the streamer as it runs (a pidfd on it: no copy pipe to replace, so nothing read twice or lost).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from google.protobuf import json_format

from agent import children
from agent import fields as F
from agent.fields import ApiError
from agent.ioam import MAX_IF_ID, MAX_NODE_ID, IoamError, IoamNode
from agent.keeper import Adopted, Keeper, ProcRef, stop_proc
from agent.rtnl import SEG6_IPTUN_MODE_ENCAP, LocalSidRoute
from agent.srv6 import LWT_COPY_TABLE
from segscope_proto.segscope.agent.v1 import inline_pb2 as pb
from segscope_proto.segscope.agent.v1 import inline_pb2_grpc as pb_grpc
from segscope_schemas import names
from segscope_schemas import path_record as pr

log = logging.getLogger("segscope.agent.inline")

INGRESS, EGRESS = pb.INLINE_SIDE_INGRESS, pb.INLINE_SIDE_EGRESS
PROG = {INGRESS: "ioam_tx", EGRESS: "ioam_rx"}
# the INGRESS inserter on the policy's route (`encap bpf in`, datapath/README.md "In-line IOAM on the
# route"): used when the node has the monitor's policy route; ioam_tx on TC is the fallback
ROUTE_PROG = "ioam_lwt"
# the side as segscope.paths and the segscope_inline lines name it (schemas/paths.md: tx = ingress)
SIDE_NAME = {INGRESS: "tx", EGRESS: "rx"}
MAX_SIDS = 6  # the SID lists the datapaths key flows by (as altmark and STAMP)
MAX_TRACE_NODES = 12  # IOAM_RECORD_MAX_NODES (schemas/c/ioam_record.h)
# the kernel's limit on a header a route program pushes (LWT_BPF_MAX_HEADROOM) and what ioam_lwt puts in it:
# outer IPv6 40, HBH with the trace 16 + 16 per slot, SRH 8 + 16 per SID, DOH with the E2E option 32
LWT_MAX_HEADER = 256
# How often the agent checks the first SID's next hop of the routes it runs with a fixed next hop: a
# route change is followed within this (plus one attach-route, ~20 ms)
NEXT_HOP_CHECK_S = 1.0
# a paused route's packets that read its entry before the pause finish within microseconds (the
# program runs to completion under RCU); after this their sequence numbers are all taken
ROUTE_PAUSE_SETTLE_S = 0.05
MAX_SAMPLE_EVERY = 65535  # the datapath's IOAM_SAMPLE_EVERY_MAX (datapath/ioam.h)
MAX_SAMPLE_INTERVAL_US = 60_000_000
MAX_NAMESPACES = 64
MAX_ALTERNATE_PATHS = 15  # an EGRESS monitor's other SID lists (a steered policy's candidates)
PORT_PROTOCOLS = (6, 17)  # TCP, UDP: the inner protocols whose ports ioam_tx can match
# ioam_tx list-flows --json per flow (`seen` is the API's `packets`)
INGRESS_COUNTERS = ("sampled", "instrumented", "skipped_mtu", "skipped_gso", "skipped_other")


def validate_monitor(m: pb.InlineMonitor) -> pb.InlineMonitor:
    """The monitor normalised (canonical SIDs and prefixes, trace_nodes default), or INVALID_ARGUMENT
    naming the field."""
    side = F.enum_value("monitor.side", m.side, pb.InlineSide)
    if m.flow_id == 0:
        raise F.invalid("monitor.flow_id", "required (1..4294967295)")
    out = pb.InlineMonitor()
    out.CopyFrom(m)
    out.device = F.ifname("monitor.device", m.device)
    del out.segments[:]
    out.segments.extend(F.segments("monitor.segments", m.segments, max_len=MAX_SIDS))
    if m.namespace_id == 0:
        raise F.invalid("monitor.namespace_id", "required (an IOAM Namespace-ID, 1..65535)")
    F.in_range("monitor.namespace_id", m.namespace_id, 1, 0xFFFF)
    sampling = m.WhichOneof("sampling")
    _validate_alternate_paths(out, side)
    if side == EGRESS:
        F.refuse("monitor.trace_nodes", m.trace_nodes != 0, "with INLINE_SIDE_EGRESS (the ingress sizes the trace)")
        F.refuse("monitor.sampling", sampling is not None, "with INLINE_SIDE_EGRESS (the ingress samples)")
        F.refuse("monitor.match", m.HasField("match"), "with INLINE_SIDE_EGRESS (the ingress selects the packets)")
        return out
    if m.trace_nodes == 0:
        out.trace_nodes = min(len(out.segments) + 1, MAX_TRACE_NODES)
    F.in_range("monitor.trace_nodes", out.trace_nodes, 1, MAX_TRACE_NODES, "nodes (the ingress included)")
    if sampling is None:
        raise F.invalid("monitor.sampling", "required (sample_every or sample_interval_us)")
    if sampling == "sample_every":
        F.in_range("monitor.sample_every", m.sample_every, 1, MAX_SAMPLE_EVERY)
    else:
        F.in_range("monitor.sample_interval_us", m.sample_interval_us, 1, MAX_SAMPLE_INTERVAL_US)
    if m.HasField("match"):
        mt = m.match
        for name in ("src_prefix", "dst_prefix"):
            if getattr(mt, name):
                canon, fam = F.prefix(f"monitor.match.{name}", getattr(mt, name))
                if fam != socket.AF_INET6:
                    raise F.invalid(
                        f"monitor.match.{name}",
                        f"{getattr(mt, name)!r} is not an IPv6 prefix (ioam_tx matches the inner IPv6 packet)",
                    )
                setattr(out.match, name, canon)
        F.in_range("monitor.match.protocol", mt.protocol, 0, 255)
        for name in ("src_port", "dst_port"):
            value = getattr(mt, name)
            F.in_range(f"monitor.match.{name}", value, 0, 65535)
            if value and mt.protocol not in PORT_PROTOCOLS:
                raise F.invalid(f"monitor.match.{name}", f"needs match.protocol 6 (TCP) or 17 (UDP), not {mt.protocol}")
        if out.match == pb.InlineMatch():
            out.ClearField("match")  # an empty match is the whole flow: one form of it
    return out


def _validate_alternate_paths(out: pb.InlineMonitor, side: int) -> None:
    """monitor.alternate_paths canonical in `out`: EGRESS only (the ingress follows its policy), each a
    SID list of its own, none the monitor's `segments`."""
    paths = out.alternate_paths
    F.refuse(
        "monitor.alternate_paths",
        side != EGRESS and len(paths) > 0,
        "with INLINE_SIDE_INGRESS (the ingress monitor follows its policy's SID list on the route)",
    )
    if len(paths) > MAX_ALTERNATE_PATHS:
        raise F.invalid("monitor.alternate_paths", f"{len(paths)} SID lists, at most {MAX_ALTERNATE_PATHS}")
    seen = {tuple(out.segments): "monitor.segments"}
    for i, path in enumerate(paths):
        where = f"monitor.alternate_paths[{i}].segments"
        sids = F.segments(where, path.segments, max_len=MAX_SIDS)
        if sids in seen:
            raise F.invalid(where, f"{','.join(sids)} is {seen[sids]} already; give each SID list once")
        seen[sids] = where
        path.segments[:] = sids


def sid_lists(m: pb.InlineMonitor) -> list[list[str]]:
    """Every SID list the monitor's datapath entry keys: its own, then its alternate paths."""
    return [list(m.segments), *(list(p.segments) for p in m.alternate_paths)]


def validate_config(c: pb.IoamConfig) -> pb.IoamConfig:
    """EnableIoam's configuration normalised (namespaces sorted, interfaces sorted by device)."""
    if c.node_id == 0:
        raise F.invalid("config.node_id", f"required (an IOAM node id, 1..{MAX_NODE_ID})")
    F.in_range("config.node_id", c.node_id, 1, MAX_NODE_ID, "(24 bits; 16777215 is the kernel's 'no id')")
    if not c.namespace_ids:
        raise F.invalid("config.namespace_ids", f"required (1..{MAX_NAMESPACES} IOAM Namespace-IDs in 1..65535)")
    if len(c.namespace_ids) > MAX_NAMESPACES:
        raise F.invalid("config.namespace_ids", f"{len(c.namespace_ids)} namespaces, at most {MAX_NAMESPACES}")
    for i, n in enumerate(c.namespace_ids):
        F.in_range(f"config.namespace_ids[{i}]", n, 1, 0xFFFF)
        if n in c.namespace_ids[:i]:
            raise F.invalid(f"config.namespace_ids[{i}]", f"{n} appears twice")
    devices: dict[str, int] = {}
    ids: dict[int, str] = {}
    for i, itf in enumerate(c.interfaces):
        dev = F.ifname(f"config.interfaces[{i}].device", itf.device)
        if itf.if_id == 0:
            raise F.invalid(f"config.interfaces[{i}].if_id", f"required (1..{MAX_IF_ID})")
        F.in_range(f"config.interfaces[{i}].if_id", itf.if_id, 1, MAX_IF_ID, "(65535 means 'unavailable')")
        if dev in devices:
            raise F.invalid(f"config.interfaces[{i}].device", f"{dev} appears twice")
        if itf.if_id in ids:
            raise F.invalid(f"config.interfaces[{i}].if_id", f"{itf.if_id} is also {ids[itf.if_id]}'s interface id")
        devices[dev], ids[itf.if_id] = itf.if_id, dev
    return pb.IoamConfig(
        node_id=c.node_id,
        namespace_ids=sorted(c.namespace_ids),
        interfaces=[pb.IoamInterface(device=d, if_id=i) for d, i in sorted(devices.items())],
        all_devices=c.all_devices,
    )


@dataclass
class RouteMonitor:
    """An INGRESS monitor that ioam_lwt runs on its policies' routes (taken over from the seg6 routes)."""

    monitor: pb.InlineMonitor
    policies: list[dict]  # prefix, table, metric, device, fixed_next_hop: what detach-route needs
    node_id: int
    # the datapath's flow key: the SID list the monitor was started on. A steer moves the policy (and
    # monitor.segments) to another SID list; the route's packets keep counting in this flow.
    flow_sids: list[str] = field(default_factory=list)
    reattachments: int = 0  # its routes attached again: the first SID's next hop changed


@dataclass
class Side:
    devices: list[str]  # where the side's program runs (the first is where it was attached)
    monitors: dict[int, pb.InlineMonitor] = field(default_factory=dict)
    node_id: int = 0  # the IOAM node id the side's monitors were started with


def _first_seq_args(first_seq: int) -> list:
    return ["--first-seq", first_seq] if first_seq else []


def _egress_flows(entries: list[dict]) -> dict[int, dict]:
    """ioam_rx list-flows has one entry per SID list: a flow with alternate paths has several, its
    counters the sums."""
    flows: dict[int, dict] = {}
    for e in entries:
        fid = int(e["flow_id"])
        if fid not in flows:
            flows[fid] = dict(e)
            continue
        for counter in ("records", "ringbuf_full"):
            flows[fid][counter] = int(flows[fid][counter]) + int(e[counter])
    return flows


class InlineAgent:
    """The node's in-line monitor sides, its IOAM identity, the ioam_records streamer; one lock."""

    def __init__(
        self,
        node: str,
        repo: Path,
        netns: str | None,
        instance: str,
        kafka: str | None,
        ioam: IoamNode,
        linger_ms: int = 200,
        rtnl=None,
        keeper: Keeper | None = None,
        egress_hook: str = "auto",
    ):
        self.node, self.netns, self.instance, self.kafka, self.ioam = node, netns, instance, kafka, ioam
        # ioam_rx's hook on each device: "xdp" (the XDP chain), "tc" (TC ingress) or "auto" (the
        # loader asks the device: tc on a veth that runs no XDP program, xdp elsewhere)
        self.egress_hook = egress_hook
        self.build = Path(os.environ.get("SEGSCOPE_BUILD_DIR") or repo / "build")
        self.linger_ms = linger_ms
        self.rtnl = rtnl  # the node's rtnetlink socket: ifindexes, prefixes and local SIDs for ioam/<node>
        self.lock = threading.RLock()
        self.sides: dict[int, Side] = {}
        self.routes: dict[int, RouteMonitor] = {}  # INGRESS monitors on ioam_lwt, by flow id
        self.srv6 = None  # the node's Srv6State: which policy routes carry a monitor's SID list
        self.notes: dict[int, str] = {}  # INGRESS flow id -> where its policy's update moved the monitor
        # INGRESS flow id on ioam_tx (TC) -> the policy (prefix, table) it fell back from: it follows
        # that policy's later updates (follow_policy)
        self.fell_back: dict[int, tuple[str, int]] = {}
        self.route_steers = 0  # UpdatePolicy moved a route monitor's policy to another SID list on the route
        self.route_fallbacks = 0  # ... and the new policy could not stay on the route: ioam_tx on TC took over
        self.tc_follows = 0  # a monitor that fell back to TC followed a later update of its policy
        self.next_hop_reattachments = 0  # routes attached again: the first SID's next hop changed
        self.next_hop_lost = 0  # ... of those, to the kernel's seg6 encap: the first SID had no gateway any more
        self._watch_stop = threading.Event()
        self._watch_thread: threading.Thread | None = None
        self.config: pb.IoamConfig | None = None  # the last EnableIoam (normalised)
        self.on_change = None
        self.xdp_lock = threading.Lock()  # this agent's attach/detach; the loaders lock the node's XDP chain
        self.keeper = keeper if keeper is not None and keeper.enabled else None
        self.streamer: subprocess.Popen | Adopted | None = None
        self.streamer_ref: ProcRef | None = None
        self.streamers_adopted = 0  # ioam streamers taken over from a previous agent
        self._streamer_stop = threading.Event()
        self._streamer_thread: threading.Thread | None = None
        self._streamer_stats: dict = {}
        self.streamer_restarts = 0  # the streamer exited on its own and was started again
        self.leftover_records_streamed = 0  # in a killed agent's ring at the first attach, sent to Kafka
        self.leftover_records_lost = 0  # found there, not delivered
        # the streamer's files: in the state directory when it outlives the agent (the next agent
        # finds them there), else a temporary directory
        self.run_dir = (
            self.keeper.run_dir("inline")
            if self.keeper is not None
            else Path(tempfile.mkdtemp(prefix=f"segscope-agent-{node}-inline-"))
        )
        self.stats_path = self.run_dir / "ioam_streamer.json"

    # -- tools -----------------------------------------------------------------------------------
    def tool(self, side: int) -> Path:
        return self.build / "datapath" / PROG[side]

    def pin_dir(self, side: int) -> Path:
        return Path(names.BPFFS_PIN_ROOT) / self.instance / PROG[side]

    def ns_args(self) -> list[str]:
        return ["--netns", self.netns] if self.netns else []

    def run(self, side: int, args: list, what: str) -> str:
        return self.run_exe(self.tool(side), args, what)

    def run_exe(self, exe: Path, args: list, what: str) -> str:
        if not exe.exists():
            raise ApiError(grpc.StatusCode.FAILED_PRECONDITION, f"{what}: {exe} is not built (make build)")
        cmd = [str(exe), *[str(a) for a in args]]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        log.debug("ran %s -> %d", " ".join(cmd), r.returncode)
        if r.returncode != 0:
            raise ApiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{what}: {exe.name} {args[0]} failed: {(r.stderr or r.stdout).strip()}",
            )
        return r.stdout

    # -- attach / detach -------------------------------------------------------------------------
    def attach(self, side: int, device: str, node_id: int) -> None:
        self._clear_leftovers(side, device)
        args = ["attach", "--dev", device, "--instance", self.instance, *self.ns_args()]
        if side == EGRESS:
            args += ["--node-id", node_id, "--hook", self.egress_hook]
        with self.xdp_lock:
            out = self.run(side, args, "monitor.device")
        self.sides[side] = Side([device], node_id=node_id)
        log.info("%s (instance %s, node id %d)", out.strip().splitlines()[0] if out.strip() else PROG[side],
                 self.instance, node_id)  # fmt: skip
        try:
            if side == INGRESS:
                self.set_if_ids(self.ioam.interfaces_now(), {})
            elif self.kafka:
                self._start_streamer()
        except ApiError:
            self.detach(side)
            raise

    def attach_dev(self, side: int, device: str) -> None:
        args = ["attach-dev", "--dev", device, "--instance", self.instance, *self.ns_args()]
        if side == EGRESS:
            args += ["--hook", self.egress_hook]
        with self.xdp_lock:
            self.run(side, args, "monitor.device")
        self.sides[side].devices.append(device)
        log.info("%s also attached to %s (devices %s)", PROG[side], device, self.sides[side].devices)

    def detach_dev(self, side: int, device: str) -> None:
        with self.xdp_lock:
            self.run(side, ["detach-dev", "--dev", device, "--instance", self.instance, *self.ns_args()], "side")
        self.sides[side].devices.remove(device)
        log.info("%s detached from %s (still on %s)", PROG[side], device, self.sides[side].devices)

    def detach(self, side: int) -> None:
        s = self.sides.pop(side)
        if side == EGRESS:
            self._stop_streamer()  # it drains the ring first (SIGTERM)
        else:  # its monitors go with it (Reset): no policy update may find one to move any more
            for flow_id in s.monitors:
                self.notes.pop(flow_id, None)
                self.fell_back.pop(flow_id, None)
        with self.xdp_lock:
            for extra in s.devices[1:]:
                self.run(side, ["detach-dev", "--dev", extra, "--instance", self.instance, *self.ns_args()], "side")
            self.run(side, ["detach", "--dev", s.devices[0], "--instance", self.instance, *self.ns_args()], "side")
        log.info("%s detached from %s", PROG[side], s.devices[0])

    def set_if_ids(self, now: dict[str, int], before: dict[str, int]) -> None:
        """ioam_tx and ioam_lwt write these interface ids; devices no longer configured go back to 65535."""
        tools = ([self.tool(INGRESS)] if INGRESS in self.sides else []) + ([self.route_tool()] if self.routes else [])
        for dev, if_id in sorted({**{d: 0xFFFF for d in before if d not in now}, **now}.items()):
            if before.get(dev) == if_id:
                continue
            args = ["set-if-id", "--instance", self.instance, *self.ns_args(), "--dev", dev, "--if-id", if_id]
            for exe in tools:
                self.run_exe(exe, args, "config.interfaces")

    def _clear_leftovers(self, side: int, device: str) -> None:
        """Pins of this instance that this agent did not make: a previous agent of the node was
        killed. Its ioam_rx ring may still hold records: a streamer drains them to Kafka (counted
        leftover_records_streamed / leftover_records_lost) while the leftover is detached."""
        pin = self.pin_dir(side)
        if not pin.exists():
            return
        log.warning("%s exists from a previous agent; detaching it first", pin)
        drain = None
        ring = pin / "ioam_records"
        if side == EGRESS and ring.exists() and self._streamer_exe().exists():
            drain = self._open_leftover_ring(ring)
        with self.xdp_lock:
            subprocess.run(
                [str(self.tool(side)), "detach", "--dev", device, "--instance", self.instance, *self.ns_args()],
                capture_output=True,
                timeout=30,
            )
        if drain is not None:
            self._finish_leftover_ring(drain)

    # -- the ioam_records streamer ---------------------------------------------------------------
    def _streamer_exe(self) -> Path:
        return self.build / "collectors" / "stamp_streamer"

    def _streamer_cmd(self) -> list[str]:
        return [
            str(self._streamer_exe()),
            "--records",
            "ioam",
            "--ringbuf",
            str(self.pin_dir(EGRESS) / "ioam_records"),
            "--node",
            self.node,
            "--brokers",
            self.kafka,
            "--stats-json",
            str(self.stats_path),
            "--stats-interval",
            "0.5",
            "--no-metrics",  # the agent publishes its counters with its own (records=ioam)
            "--linger-ms",
            str(self.linger_ms),
        ]

    def _start_streamer(self, adopted: Adopted | None = None) -> None:
        """The streamer's thread: it runs `adopted` (a previous agent's streamer) or starts one."""
        if adopted is None and not self._streamer_exe().exists():
            raise ApiError(grpc.StatusCode.FAILED_PRECONDITION, f"monitor: {self._streamer_exe()} is not built")
        self._streamer_stop = threading.Event()
        if adopted is not None:
            self.streamer, self.streamer_ref = adopted, adopted.ref
        self._streamer_thread = threading.Thread(
            target=self._streamer_loop, args=(self._streamer_stop, adopted), name="ioam-streamer", daemon=True
        )
        self._streamer_thread.start()

    def _spawn_streamer(self) -> subprocess.Popen:
        outlive = self.keeper.tether_args() if self.keeper is not None else None
        with open(self.stats_path.with_suffix(".log"), "ab") as errlog:
            p = children.spawn(self._streamer_cmd(), outlive=outlive, stdout=subprocess.DEVNULL, stderr=errlog)
        with self.lock:
            self.streamer, self.streamer_ref = p, ProcRef.of(p.pid)
        self.persist()
        log.info("ioam streamer started (pid %d): %s", p.pid, " ".join(self._streamer_cmd()))
        return p

    def _streamer_loop(self, stop: threading.Event, adopted: Adopted | None) -> None:
        """Runs the streamer; one that exits on its own (e.g. Kafka client error) is restarted."""
        while not stop.is_set():
            p = adopted or self._spawn_streamer()
            adopted = None
            p.wait()
            self._read_streamer_stats()
            if stop.is_set():
                break
            self.streamer_restarts += 1
            err = self.stats_path.with_suffix(".log").read_text(errors="replace")
            log.warning("ioam streamer exited %s: %s; restarting", p.returncode, err[-500:])
            stop.wait(0.5)

    def _stop_streamer(self) -> None:
        self._streamer_stop.set()
        stop_proc(self.streamer, 20.0)  # SIGTERM: it drains the ring and waits for Kafka's acks
        if self._streamer_thread is not None:
            self._streamer_thread.join(timeout=5)
            self._streamer_thread = None
        self.streamer, self.streamer_ref = None, None
        self._read_streamer_stats()

    # -- monitors: which program runs each --------------------------------------------------------
    def add_flow_args(self, m: pb.InlineMonitor, node_id: int) -> list:
        args = ["add-flow", "--instance", self.instance, "--sids", ",".join(m.segments)]
        args += ["--flow-id", m.flow_id, "--namespace-id", m.namespace_id]
        if m.side != INGRESS:
            return args
        args += ["--node-id", node_id, "--trace-nodes", m.trace_nodes]
        if m.WhichOneof("sampling") == "sample_every":
            args += ["--sample-every", m.sample_every]
        else:
            args += ["--sample-interval-us", m.sample_interval_us]
        if m.HasField("match"):
            mt = m.match
            for flag, value in (
                ("--match-src", mt.src_prefix),
                ("--match-dst", mt.dst_prefix),
                ("--match-proto", mt.protocol),
                ("--match-sport", mt.src_port),
                ("--match-dport", mt.dst_port),
            ):
                if value:
                    args += [flag, value]
        return args

    def start_tc(self, m: pb.InlineMonitor, node_id: int, first_seq: int = 0) -> None:
        """The monitor on its side's program: ioam_tx on TC (INGRESS without a policy route) or ioam_rx.
        first_seq: where an INGRESS monitor moving from the route program goes on numbering."""
        attached = self._on_device(m.side, m.device, node_id)
        s = self.sides[m.side]
        try:
            self.run(m.side, [*self.add_flow_args(m, s.node_id), *_first_seq_args(first_seq)], "monitor")
            self._add_alternate_paths(m)
        except ApiError:
            self._off_device(m.side, m.device, attached)
            raise
        s.monitors[m.flow_id] = m

    def _on_device(self, side: int, device: str, node_id: int) -> str:
        """The side's program on device (a monitor's, or ahead of one): "attached" (the side's first
        device), "added" (another device of it) or "" (already there)."""
        s = self.sides.get(side)
        if s is None:
            self.attach(side, device, node_id)
            return "attached"
        if device not in s.devices:
            self.attach_dev(side, device)
            return "added"
        return ""

    def _off_device(self, side: int, device: str, attached: str) -> None:
        """Undo _on_device when no monitor came to use the device."""
        s = self.sides.get(side)
        if s is None or any(m.device == device for m in s.monitors.values()):
            return
        if attached == "attached" and not s.monitors:
            self.detach(side)
        elif attached:
            self.detach_dev(side, device)

    def _add_alternate_paths(self, m: pb.InlineMonitor) -> None:
        """ioam_rx keys its flows by SID list: each alternate path one more entry of the flow (the
        packets of a steered policy recorded in it). On a failure the flow goes, all its entries."""
        base = ["add-flow", "--instance", self.instance, "--flow-id", m.flow_id, "--namespace-id", m.namespace_id]
        try:
            for i, path in enumerate(m.alternate_paths):
                self.run(m.side, [*base, "--sids", ",".join(path.segments), "--alternate"], f"alternate_paths[{i}]")
        except ApiError:
            self.run(m.side, ["del-flow", "--instance", self.instance, "--flow-id", m.flow_id], "flow_id")
            raise

    def stop_tc(self, side: int, flow_id: int) -> None:
        s = self.sides[side]
        self.run(side, ["del-flow", "--instance", self.instance, "--flow-id", flow_id], "flow_id")
        device = s.monitors.pop(flow_id).device
        if side == INGRESS:
            self.notes.pop(flow_id, None)
            self.fell_back.pop(flow_id, None)
        log.info("StopInlineMonitor %s flow %d: stopped", PROG[side], flow_id)
        if not s.monitors:
            self.detach(side)
        elif device not in {m.device for m in s.monitors.values()}:
            self.detach_dev(side, device)  # that device's last monitor

    def monitor(self, side: int, flow_id: int) -> pb.InlineMonitor | None:
        if side == INGRESS and flow_id in self.routes:
            return self.routes[flow_id].monitor
        s = self.sides.get(side)
        return s.monitors.get(flow_id) if s is not None else None

    def program_of(self, side: int, flow_id: int) -> str:
        """The datapath program that serves the monitor: ioam_lwt (on the policy's route), ioam_tx, ioam_rx."""
        return ROUTE_PROG if side == INGRESS and flow_id in self.routes else PROG[side]

    def status(self, side: int, flow_id: int) -> pb.InlineMonitorStatus:
        if side == INGRESS and flow_id in self.routes:
            rm = self.routes[flow_id]
            return pb.InlineMonitorStatus(
                monitor=rm.monitor,
                node_id=rm.node_id,
                program=ROUTE_PROG,
                routes=[f"{p['prefix']} table {p['table']}" for p in rm.policies],
                fixed_next_hop=all(p.get("fixed_next_hop") for p in rm.policies),
                note=self.notes.get(flow_id, ""),
                next_hop_reattachments=rm.reattachments,
            )
        return pb.InlineMonitorStatus(
            monitor=self.sides[side].monitors[flow_id],
            node_id=self.sides[side].node_id,
            program=PROG[side],
            note=self.notes.get(flow_id, "") if side == INGRESS else "",
        )

    # -- the INGRESS inserter on the policy's route (ioam_lwt) ------------------------------------
    def route_tool(self) -> Path:
        return self.build / "datapath" / ROUTE_PROG

    def route_pin_dir(self) -> Path:
        return Path(names.BPFFS_PIN_ROOT) / self.instance / ROUTE_PROG

    def run_route(self, args: list, what: str) -> str:
        return self.run_exe(self.route_tool(), args, what)

    def locks(self):
        """The Srv6 index's lock, then this agent's: RemovePolicy holds the first when it calls
        release_policy, so every path that takes both takes them in this order."""
        outer = self.srv6.lock if self.srv6 is not None else contextlib.nullcontext()
        return _Both(outer, self.lock)

    def policies_for(self, m: pb.InlineMonitor) -> list:
        """The node's seg6 encap policies that send the monitor's SID list out of its device, not
        yet taken over: the routes ioam_lwt can run in their place (mode encap only)."""
        if self.srv6 is None or m.side != INGRESS or not self.route_tool().exists():
            return []
        st = self.srv6
        st.resync(None)
        return [
            p
            for p in sorted(st.policies.values(), key=lambda p: (p.table, p.destination))
            if p.mode == SEG6_IPTUN_MODE_ENCAP
            and list(p.segments) == list(m.segments)
            and st.devname(p.oif) == m.device
            and st.route_program_of(p.key) is None
            and p.table != LWT_COPY_TABLE
        ]

    def _route_args(self, pol: dict) -> list:
        return [
            "--instance",
            self.instance,
            *self.ns_args(),
            "--prefix",
            pol["prefix"],
            "--dev",
            pol["device"],
            "--sids",
            ",".join(pol["sids"]),
            "--table",
            pol["table"],
            "--metric",
            pol["metric"],
        ]

    def attach_route(self, pol: dict, extra: list) -> None:
        """attach-route with the fixed next hop when the first SID has a gateway to fix, else the
        kernel's seg6 encap through the helper; pol["fixed_next_hop"] says which."""
        try:
            self.run_route(["attach-route", *self._route_args(pol), *extra, "--fixed-next-hop"], "monitor")
            pol["fixed_next_hop"] = True
        except ApiError as e:
            log.info("ioam_lwt %s: no fixed next hop (%s); the kernel's seg6 encap", pol["prefix"], e.message)
            pol["fixed_next_hop"] = False
            self.run_route(["attach-route", *self._route_args(pol), *extra], "monitor")
        # what the watch compares with (the loader resolved it a moment ago: a change in between is
        # seen at the next check and attached again)
        pol["next_hop"] = self.first_sid_next_hop(pol["sids"])
        self._start_next_hop_watch()

    # -- the fixed next hop follows the route to the first SID -------------------------------------
    def first_sid_next_hop(self, sids: list[str]) -> str | None:
        """`via GW dev D` of the route the kernel uses now for the first SID, None when it has none
        with a gateway (unreachable, on-link): what attach-route --fixed-next-hop would fix."""
        cmd = ["ip", *(["-n", self.netns] if self.netns else []), "-6", "route", "get", sids[0]]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        words = r.stdout.split() if r.returncode == 0 else []
        if "via" not in words or "dev" not in words:
            return None
        return f"via {words[words.index('via') + 1]} dev {words[words.index('dev') + 1]}"

    def _start_next_hop_watch(self) -> None:
        """One thread for the agent's life, from its first route monitor. Why polling `ip -6 route
        get` and not a netlink route monitor: the next hop of the first SID changes with any route
        that covers it, a neighbour or a device going down, and only the kernel's own lookup says
        which one it picks now; one lookup per monitored route and second is cheap (~2 ms) and bounds
        the time packets go to the old neighbour at NEXT_HOP_CHECK_S."""
        if self._watch_thread is None:
            self._watch_thread = threading.Thread(target=self._next_hop_loop, name="inline-next-hop", daemon=True)
            self._watch_thread.start()

    def _next_hop_loop(self) -> None:
        while not self._watch_stop.wait(NEXT_HOP_CHECK_S):
            try:
                self.check_next_hops()
            except Exception:  # noqa: BLE001 - the watch goes on; the next round tries again
                log.exception("next hop check failed")

    def _moved(self) -> list[tuple[RouteMonitor, dict, str | None]]:
        with self.lock:
            pols = [(rm, pol) for rm in self.routes.values() for pol in rm.policies if "next_hop" in pol]
        out = []
        for rm, pol in pols:
            now = self.first_sid_next_hop(pol["sids"])
            if now != pol["next_hop"]:
                out.append((rm, pol, now))
        return out

    def check_next_hops(self) -> int:
        """Attach again every route whose first SID's next hop is not the one it was attached with:
        the new gateway fixed (flow and sequence numbers kept: the same entry, rewritten), or the
        kernel's seg6 encap where there is no gateway any more. Returns how many were attached."""
        if not self._moved():
            return 0
        n = 0
        with self.locks():
            for rm, pol, now in self._moved():
                if rm.monitor.flow_id not in self.routes or pol not in rm.policies:
                    continue
                self._reattach(rm, pol, now)
                n += 1
            if n:
                self.srv6.resync(None)
        if n:
            self._changed_hook()
        return n

    def _reattach(self, rm: RouteMonitor, pol: dict, now: str | None) -> None:
        was = pol["next_hop"]
        extra = ["--flow-sids", ",".join(rm.flow_sids), "--trace-nodes", rm.monitor.trace_nodes]
        self.attach_route(pol, extra)
        self.next_hop_reattachments += 1
        rm.reattachments += 1
        fid = rm.monitor.flow_id
        if pol["fixed_next_hop"]:
            self.notes[fid] = (
                f"{pol['prefix']}: the first SID's next hop moved from {was or 'none'} to {now}; attached again"
            )
        else:
            self.next_hop_lost += 1
            self.notes[fid] = (
                f"{pol['prefix']}: the first SID {pol['sids'][0]} has no route with a gateway now (was {was}): "
                "the kernel's seg6 encap, no fixed next hop"
            )
        log.warning("ioam_lwt flow %d: %s", fid, self.notes[fid])

    def take_over(self, p, m: pb.InlineMonitor) -> dict:
        """The policy's seg6 route replaced by ioam_lwt's (in place, never absent): with the fixed next
        hop when the first SID has a gateway to fix, the kernel's seg6 encap through the helper else."""
        pol = {
            "prefix": p.destination,
            "table": p.table,
            "metric": p.metric,
            "device": m.device,
            "sids": list(m.segments),
            "fixed_next_hop": True,
        }
        self.attach_route(pol, [])
        log.info(
            "ioam_lwt took over %s table %d (%s)",
            p.destination,
            p.table,
            "fixed next hop" if pol["fixed_next_hop"] else "seg6 encap helper",
        )
        return pol

    def give_back(self, pol: dict) -> None:
        """The plain seg6 route back in place of ioam_lwt's; the last route removes the program's pins."""
        self.run_route(["detach-route", *self._route_args(pol)], "monitor")
        log.info("ioam_lwt gave %s table %d back to the seg6 route", pol["prefix"], pol["table"])

    def start_route(self, m: pb.InlineMonitor, policies: list, node_id: int, first_seq: int = 0) -> None:
        taken: list[dict] = []
        try:
            for p in policies:
                taken.append(self.take_over(p, m))
            for dev, if_id in sorted(self.ioam.interfaces_now().items()):
                args = ["set-if-id", "--instance", self.instance, *self.ns_args(), "--dev", dev, "--if-id", if_id]
                self.run_route(args, "config.interfaces")
            self.run_route([*self.add_flow_args(m, node_id), *_first_seq_args(first_seq)], "monitor")
        except ApiError:
            for pol in taken:
                self.give_back(pol)
            raise
        finally:
            self.srv6.resync(None)
        self.routes[m.flow_id] = RouteMonitor(m, taken, node_id, list(m.segments))

    def stop_route(self, flow_id: int) -> None:
        rm = self.routes.pop(flow_id)
        self.notes.pop(flow_id, None)
        errors = []
        try:
            self.run_route(["del-flow", "--instance", self.instance, "--flow-id", flow_id], "flow_id")
        except ApiError as e:
            errors.append(e.message)
        for pol in rm.policies:
            try:
                self.give_back(pol)
            except ApiError as e:
                errors.append(e.message)
        if self.srv6 is not None:
            self.srv6.resync(None)
        if errors:
            raise ApiError(grpc.StatusCode.FAILED_PRECONDITION, "; ".join(errors))

    def monitor_of(self, key: tuple[str, int]) -> int | None:
        """The flow id of the route monitor running on this policy (Srv6Service names it)."""
        with self.lock:
            for fid, rm in self.routes.items():
                if any((p["prefix"], p["table"]) == key for p in rm.policies):
                    return fid
        return None

    def release_policy(self, policy) -> None:
        """RemovePolicy of a policy ioam_lwt runs: its route is given back (the route entry, the copies in
        tables 3355 and 3356 and their rules go), then Srv6Service removes it. A monitor left without a policy
        route goes on with ioam_tx on TC, the inserter for a SID list without a policy route, its
        numbering going on (the route paused first, as for a fallback)."""
        with self.lock:
            fid = self.monitor_of(policy.key)
            if fid is None:
                self.give_back(self._leftover_policy(policy))
                return
            rm = self.routes[fid]
            pol = next(p for p in rm.policies if (p["prefix"], p["table"]) == policy.key)
            if len(rm.policies) > 1:
                self.give_back(pol)
                rm.policies.remove(pol)
            else:  # the flow first: the last route's give-back removes the program's pins
                next_seq = self._pause_route(rm, pol)
                self.stop_route(fid)
                log.info(
                    "flow %d: its policy %s was removed; ioam_tx on TC takes over from sequence number %d",
                    fid,
                    policy.destination,
                    next_seq,
                )
                self.start_tc(rm.monitor, rm.node_id, next_seq)
        self._changed_hook()

    def steer_policy(self, old, new) -> bool:
        """UpdatePolicy of a policy ioam_lwt runs (what segscope-steer calls). The monitor follows its
        policy: on the route, its entry rewritten with the new SID list (one map update: the packets
        after it carry the new SRH) while they keep counting in the monitor's flow, so the sampling
        position and the sequence numbers go on; the trace sized for the new path; the copies in tables
        3355 and 3356 and the route's next hop follow. True: done, nothing left for Srv6Service to send.
        Where the new policy cannot stay on the route (another mode, device or metric, a header over
        the kernel's 256 bytes, a monitor with other routes), its route is given back and False
        returned: Srv6Service updates the plain seg6 route, and a monitor left without a route goes
        on with ioam_tx on TC with the new SID list (sequence numbers from 0 there), said in its
        status and counted (route_fallbacks). An update is never refused for a monitor."""
        with self.lock:
            fid = self.monitor_of(old.key)
            if fid is None:
                self.give_back(self._leftover_policy(old))
                return False
            rm = self.routes[fid]
            pol = next(p for p in rm.policies if (p["prefix"], p["table"]) == old.key)
            trace_nodes = min(len(new.segments) + 1, MAX_TRACE_NODES)
            why = self._cannot_stay_on_route(rm, old, new, trace_nodes)
            if why is None:
                self._retarget(rm, pol, list(new.segments), trace_nodes)
                return True
            self._fall_back(fid, rm, pol, new, trace_nodes, why)
        self._changed_hook()
        return False

    def _cannot_stay_on_route(self, rm: RouteMonitor, old, new, trace_nodes: int) -> str | None:
        """Why the updated policy cannot stay on ioam_lwt with its monitor, or None."""
        header = 40 + (16 + 16 * trace_nodes) + (8 + 16 * len(new.segments)) + 32
        if new.mode != SEG6_IPTUN_MODE_ENCAP:
            return "the new policy is not mode encap"
        if new.oif != old.oif or new.metric != old.metric:
            return "the new policy has another device or metric"
        if len(new.segments) > MAX_SIDS or header > LWT_MAX_HEADER:
            return (
                f"{len(new.segments)} SIDs with a trace of {trace_nodes} nodes need a {header}-byte header, over the "
                f"route program's {LWT_MAX_HEADER}"
            )
        if len(rm.policies) > 1:
            return "the monitor runs on other policy routes of its SID list"
        return None

    def _retarget(self, rm: RouteMonitor, pol: dict, sids: list[str], trace_nodes: int) -> None:
        was = ",".join(pol["sids"])
        moved = {**pol, "sids": sids}
        extra = ["--flow-sids", ",".join(rm.flow_sids), "--trace-nodes", trace_nodes]
        self.attach_route(moved, extra)
        pol.update(moved)
        rm.monitor.segments[:] = sids
        rm.monitor.trace_nodes = trace_nodes
        self.route_steers += 1
        self.notes[rm.monitor.flow_id] = (
            f"steered from {was} to {','.join(sids)} on the route (flow and sequence numbers kept, "
            f"trace of {trace_nodes} nodes)"
        )
        log.info("ioam_lwt flow %d: %s", rm.monitor.flow_id, self.notes[rm.monitor.flow_id])
        self.srv6.resync(None)
        self._changed_hook()

    def _fall_back(self, fid: int, rm: RouteMonitor, pol: dict, new, trace_nodes: int, why: str) -> None:
        old_key = (pol["prefix"], pol["table"])
        self.route_fallbacks += 1
        if len(rm.policies) > 1:
            self.give_back(pol)
            rm.policies.remove(pol)
            log.warning("ioam_lwt flow %d: policy %s leaves the monitor (%s)", fid, pol["prefix"], why)
            return
        m = pb.InlineMonitor()
        m.CopyFrom(rm.monitor)
        m.segments[:] = list(new.segments)
        m.trace_nodes = trace_nodes
        m.device = self.srv6.devname(new.oif)
        # ioam_tx on the device before the route pauses: its loading (tens of ms) stays out of the
        # window in which the flow's packets go uninstrumented; with no flow yet it only passes them
        attached = self._on_device(INGRESS, m.device, rm.node_id)
        try:
            next_seq = self._pause_route(rm, pol)
            self.stop_route(fid)
            self.start_tc(m, rm.node_id, next_seq)
        except ApiError:
            self._off_device(INGRESS, m.device, attached)
            raise
        self.fell_back[fid] = old_key
        self.notes[fid] = (
            f"fell back to ioam_tx on TC when its policy was updated to {','.join(new.segments)}: {why}; "
            f"sequence numbers go on from {next_seq}"
        )
        log.warning("flow %d: %s", fid, self.notes[fid])

    def follower_of(self, key: tuple[str, int]) -> int | None:
        """The ioam_tx (TC) monitor that fell back from this policy, if any: it follows its updates."""
        with self.lock:
            return next((fid for fid, k in self.fell_back.items() if k == key), None)

    def follow_policy(self, old, new) -> None:
        """After the kernel has the updated policy (Srv6Service calls it on commit): the monitor that
        fell back to ioam_tx on TC from it moves to the new SID list, onto the policy's route again
        when the header fits, with its numbering going on: the old list's flow no longer sees
        packets once the packets encapsulated before the update have passed TC, so its next
        sequence number is final then."""
        with self.lock:
            fid = self.follower_of(old.key)
            if fid is None:
                return
            side = self.sides[INGRESS]
            node_id, was = side.node_id, ",".join(side.monitors[fid].segments)
            time.sleep(ROUTE_PAUSE_SETTLE_S)
            next_seq = int(self.datapath_flows(INGRESS)[fid]["next_seq"])
            m = pb.InlineMonitor()
            m.CopyFrom(side.monitors[fid])
            m.segments[:] = list(new.segments)
            m.trace_nodes = min(len(new.segments) + 1, MAX_TRACE_NODES)
            m.device = self.srv6.devname(new.oif)
            self.stop_tc(INGRESS, fid)
            where = self._start_following(m, node_id, next_seq, new.key)
            self.tc_follows += 1
            self.notes[fid] = (
                f"followed its policy from {was} to {','.join(new.segments)} {where}; "
                f"sequence numbers go on from {next_seq}"
            )
            log.warning("flow %d: %s", fid, self.notes[fid])
        self._changed_hook()

    def _start_following(self, m: pb.InlineMonitor, node_id: int, next_seq: int, key: tuple[str, int]) -> str:
        """The moved monitor on the policy's route when its header fits, else on TC; where it went."""
        header = 40 + (16 + 16 * m.trace_nodes) + (8 + 16 * len(m.segments)) + 32
        policies = self.policies_for(m) if len(m.segments) <= MAX_SIDS and header <= LWT_MAX_HEADER else []
        if policies:
            try:
                self.start_route(m, policies, node_id, next_seq)
                return "on the route (ioam_lwt)"
            except ApiError as e:
                log.warning("flow %d: cannot go back onto the route (%s): ioam_tx on TC", m.flow_id, e.message)
        self.start_tc(m, node_id, next_seq)
        self.fell_back[m.flow_id] = key
        return "on ioam_tx on TC"

    def _pause_route(self, rm: RouteMonitor, pol: dict) -> int:
        """The route only encapsulates from now on (its entry rewritten with --paused: one map
        update), then the flow's next sequence number, which no packet moves any more: where ioam_tx
        on TC goes on, so the egress sees one series of numbers across the move."""
        self.attach_route(dict(pol), ["--flow-sids", ",".join(rm.flow_sids), "--paused"])
        time.sleep(ROUTE_PAUSE_SETTLE_S)
        return int(self.datapath_flows(INGRESS, on_route=True)[rm.monitor.flow_id]["next_seq"])

    def _leftover_policy(self, policy) -> dict:
        return {
            "prefix": policy.destination,
            "table": policy.table,
            "metric": policy.metric,
            "device": self.srv6.devname(policy.oif),
            "sids": list(policy.segments),
        }

    def release_leftover_routes(self) -> list[str]:
        """Routes this instance's ioam_lwt runs that no monitor of this agent owns (a killed agent's,
        not adopted): the seg6 routes back."""
        if self.srv6 is None or not (self.route_pin_dir() / "ioam_lwt_routes").exists():
            return []
        try:
            listed = json.loads(self.run_route(["list-routes", "--instance", self.instance, "--json"], "routes"))
        except (ApiError, ValueError) as e:
            log.warning("cannot list ioam_lwt's routes: %s", e)
            return []
        mine = {p["prefix"] for rm in self.routes.values() for p in rm.policies}
        prefixes = {r["prefix"] for r in listed.get("routes", [])} - mine
        notes = []
        with self.srv6.lock:
            self.srv6.resync(None)
            for key, _bpf in sorted(self.srv6.taken_over.items()):
                if key[0] in prefixes and key in self.srv6.policies:
                    try:
                        self.give_back(self._leftover_policy(self.srv6.policies[key]))
                        notes.append(f"ioam_lwt route {key[0]} table {key[1]} given back (no monitor owns it)")
                    except ApiError as e:
                        log.warning("%s", e.message)
            self.srv6.resync(None)
        return notes

    def _changed_hook(self) -> None:
        self.persist()
        if self.on_change:
            try:
                self.on_change()
            except Exception:  # noqa: BLE001
                log.exception("on_change hook failed")

    # -- restarts: what the next agent adopts (agent/keeper.py) ---------------------------------
    def persist(self) -> None:
        """This part of datapath.json, now."""
        if self.keeper is not None:
            self.keeper.put("inline", self.snapshot())

    def snapshot(self) -> dict:
        def js(m) -> dict:
            return json_format.MessageToDict(m, preserving_proto_field_name=True)

        with self.lock:
            out: dict = {
                "sides": [
                    {
                        "side": pb.InlineSide.Name(side),
                        "devices": list(s.devices),
                        "node_id": s.node_id,
                        "monitors": [js(m) for _, m in sorted(s.monitors.items())],
                    }
                    for side, s in sorted(self.sides.items())
                ],
                "config": js(self.config) if self.config is not None else None,
                "fell_back": [[fid, *key] for fid, key in sorted(self.fell_back.items())],
                "routes": [
                    {
                        "monitor": js(rm.monitor),
                        "policies": rm.policies,
                        "node_id": rm.node_id,
                        "flow_sids": rm.flow_sids,
                    }
                    for _, rm in sorted(self.routes.items())
                ],
            }
            p = self.streamer
            if p is not None and self.streamer_ref is not None and p.poll() is None:
                out["streamer"] = {**self.streamer_ref.to_json(), "cmd": self._streamer_cmd()}
            return out

    def adopt(self, doc: dict) -> list[str]:
        """Take over the in-line part a previous agent left (datapath.json "inline"): the IOAM
        identity it set (with what to restore later), each side whose pins are still there with the
        monitors its datapath still lists, and the ioam streamer if it runs with the arguments this
        agent would give it. Returns what was done, for the log."""
        notes: list[str] = []
        with self.lock:
            if doc.get("config") and self.ioam.adopt_leftovers():
                self.config = json_format.ParseDict(doc["config"], pb.IoamConfig())
                notes.append(f"IOAM identity (node id {self.config.node_id}) kept")
            for sd in doc.get("sides", []):
                side = pb.InlineSide.Value(sd["side"])
                notes.append(self._adopt_side(side, sd))
            notes += self._adopt_routes(doc.get("routes", []))
            ingress = self.sides.get(INGRESS)
            for fid, prefix, table in doc.get("fell_back", []):
                if ingress is not None and fid in ingress.monitors:
                    self.fell_back[fid] = (prefix, table)
            old = Adopted.open(ProcRef.from_json(doc.get("streamer")))
            if EGRESS in self.sides and self.kafka:
                if old is not None and (doc.get("streamer") or {}).get("cmd") == self._streamer_cmd():
                    self.streamers_adopted += 1
                    self._start_streamer(old)
                    notes.append(f"ioam streamer pid {old.pid} adopted")
                else:
                    stop_proc(old, 20.0)
                    self._start_streamer()
                    notes.append("ioam streamer started" + (f" (pid {old.pid} had other arguments)" if old else ""))
            else:
                stop_proc(old, 20.0)
        self.persist()
        return notes

    def _adopt_routes(self, docs: list[dict]) -> list[str]:
        """ioam_lwt's monitors whose flow its datapath still lists: kept on their routes (the routes
        never stopped forwarding and instrumenting). Their routes whose flow is gone are given back
        by release_leftover_routes."""
        if not docs:
            return []
        if not (self.route_pin_dir() / "ioam_tx_flows").exists():
            return [f"{ROUTE_PROG} NOT adopted: its pins are gone"]
        try:
            present = self.datapath_flows(INGRESS, on_route=True)
        except ApiError as e:
            return [f"{ROUTE_PROG} NOT adopted: {e.message}"]
        notes = []
        for d in docs:
            m = json_format.ParseDict(d["monitor"], pb.InlineMonitor())
            if m.flow_id not in present:
                notes.append(f"{ROUTE_PROG} flow {m.flow_id} NOT adopted: no longer in the datapath")
                continue
            flow_sids = list(d.get("flow_sids") or m.segments)
            self.routes[m.flow_id] = RouteMonitor(m, list(d["policies"]), int(d.get("node_id", 0)), flow_sids)
            self._start_next_hop_watch()
            notes.append(f"{ROUTE_PROG} flow {m.flow_id} on {', '.join(p['prefix'] for p in d['policies'])} adopted")
        return notes

    def _adopt_side(self, side: int, sd: dict) -> str:
        flows_pin = self.pin_dir(side) / f"{PROG[side]}_flows"
        if not flows_pin.exists():
            return f"{PROG[side]} NOT adopted: its pins are gone"
        monitors = {
            m.flow_id: m for m in (json_format.ParseDict(d, pb.InlineMonitor()) for d in sd.get("monitors", []))
        }
        try:
            present = self.datapath_flows(side)
        except ApiError as e:
            return f"{PROG[side]} NOT adopted: {e.message}"
        gone = sorted(set(monitors) - set(present))
        for fid in gone:
            monitors.pop(fid)
        self.sides[side] = Side(list(sd["devices"]), monitors, node_id=int(sd.get("node_id", 0)))
        return f"{PROG[side]} on {','.join(sd['devices'])} with monitors {sorted(monitors)}" + (
            f" ({gone} no longer in the datapath)" if gone else ""
        )

    def handover(self) -> None:
        """--on-stop handover: the sides, their monitors, the IOAM identity and the streamer stay for
        the next agent."""
        self._streamer_stop.set()  # the streamer thread does not start another one
        self._stop_next_hop_watch()
        self.persist()
        self.ioam.close()

    def _read_streamer_stats(self) -> dict:
        try:
            self._streamer_stats = json.loads(self.stats_path.read_text())
        except (OSError, ValueError):
            pass
        return self._streamer_stats

    def poll_streamer(self) -> None:
        if self.streamer is not None:
            self._read_streamer_stats()

    def streamer_counters(self) -> dict[str, int] | None:
        """The ioam streamer's counters (segscope_streamer,records=ioam); None before it first ran."""
        st = self._streamer_stats
        if not st:
            return None
        out = {k: int(v) for k, v in st.items() if isinstance(v, int) and not isinstance(v, bool)}
        out.pop("batch_seq", None)
        return out

    def _open_leftover_ring(self, ring: Path) -> subprocess.Popen | None:
        cmd = [str(self._streamer_exe()), "--records", "ioam", "--ringbuf", str(ring), "--node", self.node]
        cmd += ["--no-metrics", "--stats-interval", "3600"]
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
        ready, _, _ = select.select([p.stderr], [], [], 10.0)
        line = p.stderr.readline() if ready else b""
        if not line.startswith(b"stamp_streamer: "):
            p.kill()
            p.wait()
            log.warning("cannot read the previous agent's ring %s: %r", ring, line[:200])
            return None
        return p

    def _finish_leftover_ring(self, p: subprocess.Popen) -> None:
        p.send_signal(signal.SIGTERM)
        try:
            out, _ = p.communicate(timeout=60)
            st = json.loads(out.decode().strip().splitlines()[-1])
        except (subprocess.TimeoutExpired, ValueError, IndexError):
            p.kill()
            p.wait()
            log.warning("the previous agent's ioam_records ring did not drain")
            return
        read = int(st.get("records_in", 0))
        delivered = int(st.get("records_delivered", 0)) if self.kafka else 0
        self.leftover_records_streamed += delivered
        self.leftover_records_lost += read - delivered
        if read:
            log.warning(
                "%d ioam_records a previous agent left: %d to Kafka, %d lost", read, delivered, read - delivered
            )

    # -- reads -----------------------------------------------------------------------------------
    def datapath_flows(self, side: int, on_route: bool = False) -> dict[int, dict]:
        args = ["list-flows", "--instance", self.instance, "--json"]
        out = json.loads(self.run_route(args, "side") if on_route else self.run(side, args, "side"))
        flows = out.get("flows", []) if isinstance(out, dict) else out
        if side == EGRESS:
            return _egress_flows(flows)
        return {int(f["flow_id"]): f for f in flows}

    def counters(self) -> dict[str, int]:
        """segscope_agent gauges of the in-line part."""
        with self.lock:
            return {
                "inline_monitors": sum(len(s.monitors) for s in self.sides.values()) + len(self.routes),
                "inline_monitors_on_route": len(self.routes),
                "inline_route_steers": self.route_steers,
                "inline_route_fallbacks": self.route_fallbacks,
                "inline_tc_follows": self.tc_follows,
                "inline_route_next_hop_reattachments": self.next_hop_reattachments,
                "inline_route_next_hop_lost": self.next_hop_lost,
                "ioam_streamer_restarts": self.streamer_restarts,
                "ioam_streamers_adopted": self.streamers_adopted,
                "ioam_leftover_records_streamed": self.leftover_records_streamed,
                "ioam_leftover_records_lost": self.leftover_records_lost,
            }

    def attached_programs(self) -> list[tuple[str, Path, Path]]:
        with self.lock:
            out = [(PROG[side], self.tool(side), self.pin_dir(side)) for side in sorted(self.sides)]
            if self.routes:
                out.append((ROUTE_PROG, self.route_tool(), self.route_pin_dir()))
            return out

    def program_devices(self) -> list[tuple[str, str]]:
        with self.lock:
            return [(PROG[side], d) for side in sorted(self.sides) for d in self.sides[side].devices]

    def monitors(self) -> list[tuple[int, pb.InlineMonitor]]:
        """Every monitor (ioam_lwt's among the INGRESS ones), by side and flow id."""
        with self.lock:
            out = [(side, m) for side in sorted(self.sides) for _, m in sorted(self.sides[side].monitors.items())]
            out += [(INGRESS, rm.monitor) for rm in self.routes.values()]
            return sorted(out, key=lambda sm: (sm[0], sm[1].flow_id))

    def path_records(self, ts_ns: int | None = None) -> list:
        """segscope.paths: one `inline` record per monitor side, and the node's `ioam` identity."""
        ts = time.time_ns() if ts_ns is None else ts_ns
        out: list = []
        for side, m in self.monitors():
            tx = side == INGRESS
            mode = m.WhichOneof("sampling") if tx else None
            out.append(
                pr.PathRecord.inline(
                    self.node,
                    m.flow_id,
                    SIDE_NAME[side],
                    m.segments,
                    m.namespace_id,
                    m.trace_nodes if tx else 0,
                    m.sample_every if mode == "sample_every" else 0,
                    ts,
                    sample_interval_us=m.sample_interval_us if mode == "sample_interval_us" else 0,
                )
            )
        with self.ioam.lock:
            a = self.ioam.applied
            identity = (a.node_id, dict(a.interfaces), a.namespaces) if a is not None else None
        if identity is not None:
            out.append(self._ioam_identity(*identity, ts))
        return out

    def _ioam_identity(self, node_id: int, interfaces: dict[str, int], namespaces, ts: int) -> pr.IoamNode:
        """`ioam/<node>`: what the in-line processor needs to name a trace's nodes and links - the
        devices' IOAM ids, ifindexes (the egress record names its device by ifindex) and global
        prefixes (which device faces which neighbour), and the node's local SIDs."""
        links, prefixes, sids = {}, {}, ()
        if self.rtnl is not None:
            links = self.rtnl.links()
            prefixes = self.rtnl.global_prefixes()
            sids = tuple(sorted({r.sid for r in self.rtnl.srv6_routes() if isinstance(r, LocalSidRoute)}))
        devices = tuple(
            pr.IoamInterface(dev, if_id, links.get(dev), tuple(sorted(prefixes.get(links.get(dev), []))))
            for dev, if_id in sorted(interfaces.items())
        )
        return pr.IoamNode(self.node, node_id, devices, tuple(namespaces), sids, ts)

    def inventory_lines(self, node_tag: str, ts: int) -> list[str]:
        """segscope_inline: one line per in-line monitor side (schemas/metrics.md)."""
        from agent.metrics import escape_tag

        out = []
        for side, m in self.monitors():
            mode = m.WhichOneof("sampling") if side == INGRESS else None
            tags = (
                f"segscope_inline,node={node_tag},flow={m.flow_id},side={SIDE_NAME[side]},"
                f"path={escape_tag(pr.sids_tag(pr.INLINE, m.segments))},device={escape_tag(m.device)},"
                f"program={self.program_of(side, m.flow_id)}"
            )
            out.append(
                f"{tags} namespace={m.namespace_id}i,trace_nodes={m.trace_nodes}i,"
                f"sample_every={m.sample_every if mode == 'sample_every' else 0}i,"
                f"sample_interval_us={m.sample_interval_us if mode == 'sample_interval_us' else 0}i {ts}"
            )
        return out

    # -- teardown --------------------------------------------------------------------------------
    def reset(self) -> tuple[int, bool]:
        """Every monitor stopped, both programs detached, the streamer stopped, IOAM restored."""
        with self.locks():
            n = sum(len(s.monitors) for s in self.sides.values()) + len(self.routes)
            changed = bool(self.sides) or bool(self.routes)
            errors = []
            for flow_id in list(self.routes):
                try:
                    self.stop_route(flow_id)
                except ApiError as e:
                    errors.append(e.message)
            for side in list(self.sides):
                try:
                    self.detach(side)
                except ApiError as e:
                    errors.append(e.message)
            self._stop_streamer()
            self.config = None
            changed |= self.ioam.disable()
            if errors:
                raise ApiError(grpc.StatusCode.FAILED_PRECONDITION, "; ".join(errors))
            return n, changed

    def _stop_next_hop_watch(self) -> None:
        self._watch_stop.set()
        if self._watch_thread is not None:
            self._watch_thread.join(timeout=15)

    def shutdown(self) -> None:
        self._stop_next_hop_watch()
        try:
            self.reset()
        except ApiError as e:
            log.warning("shutdown: %s", e.message)
        self.ioam.close()


class _Both:
    """Two locks taken in order, released in reverse."""

    def __init__(self, first, second):
        self.first, self.second = first, second

    def __enter__(self):
        self.first.__enter__()
        self.second.__enter__()
        return self

    def __exit__(self, *exc):
        self.second.__exit__(*exc)
        self.first.__exit__(*exc)
        return False


def _sid_list_taken(a: InlineAgent, m: pb.InlineMonitor) -> tuple[str, list[str], int] | None:
    """The first SID list of `m` another monitor of its side already keys: (field, SIDs, its flow)."""
    held: dict[tuple, int] = {}
    for side, other in a.monitors():
        if side == m.side:
            held.update({tuple(sids): other.flow_id for sids in sid_lists(other)})
    if m.side == INGRESS:
        held.update({tuple(rm.flow_sids): fid for fid, rm in a.routes.items()})
    for i, sids in enumerate(sid_lists(m)):
        if tuple(sids) in held:
            field_name = "monitor.segments" if i == 0 else f"monitor.alternate_paths[{i - 1}].segments"
            return field_name, sids, held[tuple(sids)]
    return None


class InlineMonitorServicer(pb_grpc.InlineMonitorServiceServicer):
    def __init__(self, agent: InlineAgent):
        self.a = agent

    def _changed(self) -> None:
        self.a.persist()
        if self.a.on_change:
            try:
                self.a.on_change()
            except Exception:  # noqa: BLE001
                log.exception("on_change hook failed")

    # -- monitors --------------------------------------------------------------------------------
    def StartInlineMonitor(self, req, ctx):
        m = validate_monitor(req.monitor)
        a = self.a
        with a.locks():
            known = a.monitor(m.side, m.flow_id)
            if known is not None:
                if known == m:
                    log.info("StartInlineMonitor %s flow %d: unchanged", PROG[m.side], m.flow_id)
                    return pb.StartInlineMonitorResponse(status=a.status(m.side, m.flow_id), changed=False)
                raise ApiError(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"monitor.flow_id: {PROG[m.side]} flow {m.flow_id} exists with different parameters; "
                    "StopInlineMonitor first",
                )
            taken = _sid_list_taken(a, m)
            if taken:  # the datapath finds a flow by its SID list: a second one would take it over
                where, sids, flow_id = taken
                raise ApiError(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"{where}: {PROG[m.side]} flow {flow_id} already monitors {','.join(sids)}; one in-line "
                    "monitor per SID list and side",
                )
            applied = a.ioam.applied
            if applied is None:
                raise ApiError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "monitor: the node's IOAM identity is not configured (EnableIoam first: its node id goes "
                    "into the trace entry and the records)",
                )
            policies = a.policies_for(m)
            if policies:
                a.start_route(m, policies, applied.node_id)
            else:
                a.start_tc(m, applied.node_id)
            log.info(
                "StartInlineMonitor %s flow %d on %s: sids %s namespace %d%s: started",
                a.program_of(m.side, m.flow_id),
                m.flow_id,
                m.device,
                ",".join(m.segments),
                m.namespace_id,
                f" trace_nodes {m.trace_nodes} {m.WhichOneof('sampling')} {getattr(m, m.WhichOneof('sampling'))}"
                if m.side == INGRESS
                else "",
            )
            status = a.status(m.side, m.flow_id)
        self._changed()
        return pb.StartInlineMonitorResponse(status=status, changed=True)

    def _key(self, req) -> tuple[int, int]:
        side = F.enum_value("side", req.side, pb.InlineSide)
        if req.flow_id == 0:
            raise F.invalid("flow_id", "required (1..4294967295)")
        return side, req.flow_id

    def StopInlineMonitor(self, req, ctx):
        side, flow_id = self._key(req)
        a = self.a
        with a.locks():
            if a.monitor(side, flow_id) is None:
                if req.allow_missing:
                    log.info("StopInlineMonitor %s flow %d: absent, allow_missing", PROG[side], flow_id)
                    return pb.StopInlineMonitorResponse(changed=False)
                raise ApiError(grpc.StatusCode.NOT_FOUND, f"flow_id: no {PROG[side]} flow {flow_id}")
            if side == INGRESS and flow_id in a.routes:
                a.stop_route(flow_id)
                log.info("StopInlineMonitor %s flow %d: stopped, routes given back", ROUTE_PROG, flow_id)
            else:
                a.stop_tc(side, flow_id)
        self._changed()
        return pb.StopInlineMonitorResponse(changed=True)

    def ListInlineMonitors(self, req, ctx):
        want = F.enum_value("side", req.side, pb.InlineSide, required=False)
        with self.a.lock:
            out = [self.a.status(side, m.flow_id) for side, m in self.a.monitors() if not want or side == want]
        log.info("ListInlineMonitors: %d monitors", len(out))
        return pb.ListInlineMonitorsResponse(monitors=out)

    def GetInlineMonitorResults(self, req, ctx):
        side, flow_id = self._key(req)
        with self.a.lock:
            if self.a.monitor(side, flow_id) is None:
                raise ApiError(grpc.StatusCode.NOT_FOUND, f"flow_id: no {PROG[side]} flow {flow_id}")
            status = self.a.status(side, flow_id)
            dp = self.a.datapath_flows(side, on_route=side == INGRESS and flow_id in self.a.routes).get(flow_id)
        if dp is None:
            raise ApiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"flow_id: {status.program} flow {flow_id} is no longer in the datapath",
            )
        out = pb.GetInlineMonitorResultsResponse(status=status)
        try:
            if side == INGRESS:
                out.ingress.CopyFrom(
                    pb.InlineIngressCounters(
                        packets=int(dp["seen"]),
                        **{k: int(dp[k]) for k in INGRESS_COUNTERS},
                        next_sequence=int(dp["next_seq"]),
                    )
                )
            else:
                out.egress.CopyFrom(
                    pb.InlineEgressCounters(records=int(dp["records"]), ringbuf_full=int(dp["ringbuf_full"]))
                )
        except (KeyError, TypeError, ValueError) as e:
            raise ApiError(
                grpc.StatusCode.INTERNAL, f"flow_id: {PROG[side]} list-flows gave no counter {e} for flow {flow_id}"
            ) from None
        log.info("GetInlineMonitorResults %s flow %d", PROG[side], flow_id)
        return out

    # -- the node's IOAM identity ----------------------------------------------------------------
    def EnableIoam(self, req, ctx):
        cfg = validate_config(req.config)
        a = self.a
        with a.lock:
            running = [(PROG[side], s.node_id) for side, s in a.sides.items() if s.monitors]
            running += [(ROUTE_PROG, rm.node_id) for rm in a.routes.values()]
            for prog, node_id in running:
                if node_id != cfg.node_id:
                    raise ApiError(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"config.node_id: {prog} monitors run with node id {node_id}; stop them "
                        f"(StopInlineMonitor or Reset) before changing it to {cfg.node_id}",
                    )
            try:
                ifs = a.ioam.resolve(cfg.node_id, {i.device: i.if_id for i in cfg.interfaces}, cfg.all_devices)
                before = a.ioam.interfaces_now()
                changed = a.ioam.enable(cfg.node_id, tuple(cfg.namespace_ids), ifs)
            except IoamError as e:
                raise ApiError(grpc.StatusCode.FAILED_PRECONDITION, f"{e.field}: {e.message}") from None
            except OSError as e:  # the state dir or /proc/sys not writable (a read-only container)
                raise ApiError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"config: the agent cannot change or remember the node's IOAM state: {e} "
                    "(it needs /proc/sys/net writable and a writable --state-dir)",
                ) from None
            changed |= a.config != cfg
            a.config = cfg
            a.set_if_ids(ifs, before)
            log.info(
                "EnableIoam node id %d namespaces %s devices %s%s: %s",
                cfg.node_id,
                list(cfg.namespace_ids),
                ifs,
                " (all devices)" if cfg.all_devices else "",
                "changed" if changed else "unchanged",
            )
            resp = pb.EnableIoamResponse(
                config=cfg,
                interfaces=[pb.IoamInterface(device=d, if_id=i) for d, i in ifs.items()],
                changed=changed,
            )
        if changed:
            self._changed()
        return resp

    def DisableIoam(self, req, ctx):
        a = self.a
        with a.lock:
            running = sorted(f"{a.program_of(side, m.flow_id)} flow {m.flow_id}" for side, m in a.monitors())
            if running:
                raise ApiError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"in-line monitors run on this node ({', '.join(running)}): stop them first, or Reset",
                )
            changed = a.ioam.disable()
            a.config = None
            log.info("DisableIoam: %s", "restored" if changed else "was not enabled")
        if changed:
            self._changed()
        return pb.DisableIoamResponse(changed=changed)

    def GetIoamConfig(self, req, ctx):
        a = self.a
        with a.lock:
            if a.config is None or a.ioam.applied is None:
                return pb.GetIoamConfigResponse(enabled=False)
            ifs = a.ioam.interfaces_now()
            return pb.GetIoamConfigResponse(
                enabled=True,
                config=a.config,
                interfaces=[pb.IoamInterface(device=d, if_id=i) for d, i in ifs.items()],
            )

    def Reset(self, req, ctx):
        n, changed = self.a.reset()
        log.info("Reset: %d in-line monitors stopped%s", n, ", IOAM restored" if changed else "")
        if changed:
            self._changed()
        return pb.ResetInlineResponse(monitors_stopped=n, changed=changed)
