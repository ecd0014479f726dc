"""FlowMonitorService: alternate-marking flow monitors of this node, driving
build/datapath/altmark_tx (TC egress, TX side) and altmark_rx (XDP, RX side) of the agent's
bpffs instance (/sys/fs/bpf/segscope/<instance>/altmark_{tx,rx}).

A side's program is attached to its device with the side's first flow and detached with its
last; a flow on another device attaches the same program there too (`attach-dev`: one program,
its flows and counters shared; a multi-homed node), detached from it with that device's last flow. With --kafka the
agent runs build/collectors/altmark_collector for the attached sides, so per-block records reach
`segscope.altmark.blocks` (-> processors/loss). GetFlowMonitorResults returns the cumulative
per-colour counters the datapath holds now (`list-flows --json`).

Restarts (agent/keeper.py): the collector outlives the agent (tethered to the node's state
directory); the next agent adopts the sides whose pins are still there, their flows (those the
datapath still has) and the collector as it runs (by pid and start time), or starts a collector when
none runs any more.
"""

from __future__ import annotations

import json
import logging
import os
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
from segscope_proto.segscope.agent.v1 import flowmon_pb2 as pb
from segscope_proto.segscope.agent.v1 import flowmon_pb2_grpc as pb_grpc
from segscope_schemas import names
from segscope_schemas import path_record as pr

log = logging.getLogger("segscope.agent.flowmon")

TX, RX = pb.FLOW_MONITOR_SIDE_TX, pb.FLOW_MONITOR_SIDE_RX
PROG = {TX: "altmark_tx", RX: "altmark_rx"}
SIDE_NAME = {TX: "tx", RX: "rx"}
METHOD_ARG = {pb.MARKING_METHOD_DSCP: "dscp", pb.MARKING_METHOD_RFC9343: "rfc9343"}
MAX_SIDS = 6
MAX_FLOWMON_ID = 0xFFFFF


@dataclass
class Side:
    device: str  # where the side's program was attached first
    flows: dict[int, pb.FlowMonitor]
    devices: list[str] = field(default_factory=list)  # every device it runs on (device first)


def validate_monitor(m: pb.FlowMonitor) -> pb.FlowMonitor:
    side = F.enum_value("monitor.side", m.side, pb.FlowMonitorSide)
    if m.flow_id == 0:
        raise F.invalid("monitor.flow_id", "required (1..4294967295)")
    method = F.enum_value("monitor.method", m.method, pb.MarkingMethod)
    if method == pb.MARKING_METHOD_RFC9343 and m.flow_id > MAX_FLOWMON_ID:
        raise F.invalid(
            "monitor.flow_id", f"{m.flow_id} is not a FlowMonID (<= {MAX_FLOWMON_ID}) as MARKING_METHOD_RFC9343 needs"
        )
    out = pb.FlowMonitor()
    out.CopyFrom(m)
    out.device = F.ifname("monitor.device", m.device)
    if side == RX and method == pb.MARKING_METHOD_RFC9343:
        F.refuse(
            "monitor.segments",
            len(m.segments) > 0,
            "with FLOW_MONITOR_SIDE_RX and MARKING_METHOD_RFC9343 (the flow is found by FlowMonID)",
        )
    else:
        del out.segments[:]
        out.segments.extend(F.segments("monitor.segments", m.segments, max_len=MAX_SIDS))
    if m.period_ms == 0:
        raise F.invalid("monitor.period_ms", "required (1..3600000)")
    F.in_range("monitor.period_ms", m.period_ms, 1, 3_600_000)
    F.refuse("monitor.dmark_every", side == RX and m.dmark_every != 0, "with FLOW_MONITOR_SIDE_RX (TX decides)")
    if method == pb.MARKING_METHOD_DSCP:
        if m.dscp_l_bit == 0 and m.dscp_d_bit == 0:
            out.dscp_l_bit, out.dscp_d_bit = 0, 1
        F.in_range("monitor.dscp_l_bit", out.dscp_l_bit, 0, 5)
        F.in_range("monitor.dscp_d_bit", out.dscp_d_bit, 0, 5)
        if out.dscp_l_bit == out.dscp_d_bit:
            raise F.invalid("monitor.dscp_d_bit", f"must differ from dscp_l_bit ({out.dscp_l_bit})")
    else:
        F.refuse("monitor.dscp_l_bit", m.dscp_l_bit != 0, "with MARKING_METHOD_RFC9343")
        F.refuse("monitor.dscp_d_bit", m.dscp_d_bit != 0, "with MARKING_METHOD_RFC9343")
    return out


class FlowMonAgent:
    def __init__(
        self,
        node: str,
        repo: Path,
        netns: str | None,
        instance: str,
        kafka: str | None = None,
        keeper: Keeper | None = None,
    ):
        self.node, self.netns, self.instance, self.kafka = node, netns, instance, kafka
        self.keeper = keeper if keeper is not None and keeper.enabled else None
        # the eBPF objects and C tools: the checkout's build/, or SEGSCOPE_BUILD_DIR (an installed
        # package, a container image)
        self.build = Path(os.environ.get("SEGSCOPE_BUILD_DIR") or repo / "build")
        self.lock = threading.RLock()
        self.sides: dict[int, Side] = {}
        self.collector: subprocess.Popen | Adopted | None = None
        self.collector_ref: ProcRef | None = None
        self.collector_cmd: list[str] = []
        self.collectors_adopted = 0  # altmark_collectors taken over from a previous agent
        self.on_change = None

    def tool(self, side: int) -> Path:
        return self.build / "datapath" / PROG[side]

    def pin_dir(self, side: int) -> Path:
        return Path(names.BPFFS_PIN_ROOT) / self.instance / PROG[side]

    def run(self, side: int, args: list, what: str) -> str:
        exe = self.tool(side)
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

    def ns_args(self) -> list[str]:
        return ["--netns", self.netns] if self.netns else []

    def attach(self, side: int, device: str) -> None:
        if self.pin_dir(side).exists():  # left by a previous agent of this node that was killed
            log.warning("%s exists from a previous agent; detaching it first", self.pin_dir(side))
            subprocess.run(
                [str(self.tool(side)), "detach", "--dev", device, "--instance", self.instance, *self.ns_args()],
                capture_output=True,
                timeout=30,
            )
        # altmark_rx joins the node's XDP chain (datapath/README.md, "Chaining"): STAMP programs
        # on the same device keep running behind it, whichever came first
        self.run(side, ["attach", "--dev", device, "--instance", self.instance, *self.ns_args()], "monitor.device")
        self.sides[side] = Side(device, {}, [device])
        log.info("%s attached to %s (instance %s)", PROG[side], device, self.instance)
        self._restart_collector()

    def attach_dev(self, side: int, device: str) -> None:
        """The side's program, already attached, on one more device."""
        s = self.sides[side]
        self.run(side, ["attach-dev", "--dev", device, "--instance", self.instance, *self.ns_args()], "monitor.device")
        s.devices.append(device)
        log.info("%s also attached to %s (devices %s)", PROG[side], device, s.devices)

    def detach_dev(self, side: int, device: str) -> None:
        """Off one device; the others keep the program (and its flows)."""
        s = self.sides[side]
        self.run(side, ["detach-dev", "--dev", device, "--instance", self.instance, *self.ns_args()], "side")
        s.devices.remove(device)
        if s.device == device:
            s.device = s.devices[0]
        log.info("%s detached from %s (still on %s)", PROG[side], device, s.devices)

    def detach(self, side: int) -> None:
        # detach-dev / detach: altmark_tx leaves its devices one by one; altmark_rx leaves the node's
        # XDP chain (detach alone would take it off every device), other members there keep running
        s = self.sides.pop(side)
        for extra in [d for d in s.devices if d != s.device]:
            self.run(side, ["detach-dev", "--dev", extra, "--instance", self.instance, *self.ns_args()], "side")
        self.run(side, ["detach", "--dev", s.device, "--instance", self.instance, *self.ns_args()], "side")
        log.info("%s detached from %s", PROG[side], s.device)
        self._restart_collector()

    def _restart_collector(self) -> None:
        """With --kafka: one altmark_collector over the attached sides' pinned maps."""
        if not self.kafka:
            return
        self._stop_collector()
        if not self.sides:
            return
        cmd = self._collector_cmd()
        if self.keeper is not None:  # it outlives the agent: what it says goes to a file the next agent finds
            with open(self.keeper.run_dir("flowmon") / "altmark_collector.log", "ab") as err:
                self.collector = children.spawn(
                    cmd, outlive=self.keeper.tether_args(), stdout=subprocess.DEVNULL, stderr=err
                )
        else:
            self.collector = children.spawn(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.collector_ref, self.collector_cmd = ProcRef.of(self.collector.pid), cmd
        log.info("altmark_collector started (pid %d): %s", self.collector.pid, " ".join(cmd))

    def _collector_cmd(self) -> list[str]:
        exe = self.build / "collectors" / "altmark_collector"
        cmd = [str(exe), "--node", self.node, "--brokers", self.kafka]
        for side in sorted(self.sides):
            cmd += ["--tx-pin-dir" if side == TX else "--rx-pin-dir", str(self.pin_dir(side))]
        return cmd

    def _stop_collector(self) -> None:
        p, self.collector, self.collector_ref = self.collector, None, None
        stop_proc(p, 15.0)

    # -- restarts: what the next agent adopts (agent/keeper.py) ---------------------------------
    def persist(self) -> None:
        if self.keeper is not None:
            self.keeper.put("flowmon", self.snapshot())

    def snapshot(self) -> dict:
        with self.lock:
            out: dict = {
                "sides": [
                    {
                        "side": pb.FlowMonitorSide.Name(side),
                        "device": s.device,
                        "devices": list(s.devices),
                        "flows": [
                            json_format.MessageToDict(m, preserving_proto_field_name=True)
                            for _, m in sorted(s.flows.items())
                        ],
                    }
                    for side, s in sorted(self.sides.items())
                ]
            }
            if self.collector is not None and self.collector_ref is not None and self.collector.poll() is None:
                out["collector"] = {**self.collector_ref.to_json(), "cmd": self.collector_cmd}
            return out

    def adopt(self, doc: dict) -> list[str]:
        """Take over the sides a previous agent left whose pins are still there, the flows the
        datapath still has, and its altmark_collector if it still runs with the same arguments."""
        notes: list[str] = []
        with self.lock:
            for sd in doc.get("sides", []):
                side = pb.FlowMonitorSide.Value(sd["side"])
                if not (self.pin_dir(side) / "altmark_flows").exists():
                    notes.append(f"{PROG[side]} NOT adopted: its pins are gone")
                    continue
                flows = {
                    m.flow_id: m for m in (json_format.ParseDict(f, pb.FlowMonitor()) for f in sd.get("flows", []))
                }
                try:
                    present = self.datapath_flows(side)
                except ApiError as e:
                    notes.append(f"{PROG[side]} NOT adopted: {e.message}")
                    continue
                gone = sorted(set(flows) - set(present))
                for fid in gone:
                    flows.pop(fid)
                self.sides[side] = Side(sd["device"], flows, list(sd.get("devices") or [sd["device"]]))
                notes.append(
                    f"{PROG[side]} on {','.join(self.sides[side].devices)} with flows {sorted(flows)}"
                    + (f" ({gone} no longer in the datapath)" if gone else "")
                )
            if not self.kafka or not self.sides:
                old = Adopted.open(ProcRef.from_json(doc.get("collector")))
                stop_proc(old, 15.0)
                return notes
            c = doc.get("collector") or {}
            old = Adopted.open(ProcRef.from_json(c))
            if old is not None and c.get("cmd") == self._collector_cmd():
                self.collector, self.collector_ref, self.collector_cmd = old, old.ref, c["cmd"]
                self.collectors_adopted += 1
                notes.append(f"altmark_collector pid {old.pid} adopted")
            else:
                if old is not None:
                    notes.append(f"altmark_collector pid {old.pid} replaced (other arguments)")
                else:
                    notes.append("altmark_collector started (none ran)")
                stop_proc(old, 15.0)
                self._restart_collector()
        self.persist()
        return notes

    def handover(self) -> None:
        """--on-stop handover: the sides, their flows and the collector stay for the next agent."""
        self.persist()

    def flow_lines(self, node_tag: str, ts: int) -> list[str]:
        """segscope_flow: one line per flow monitor side of this agent, with the flow's SID list
        (altmark_loss is keyed by flow id only), so a dashboard can pick a flow by its path."""
        from agent.metrics import escape_tag

        out = []
        with self.lock:
            for side_id, side in sorted(self.sides.items()):
                for flow_id, m in sorted(side.flows.items()):
                    method = "dscp" if m.method == pb.MARKING_METHOD_DSCP else "rfc9343"
                    path = pr.sids_tag(pr.FLOW, m.segments)
                    tags = (
                        f"segscope_flow,node={node_tag},flow={flow_id},side={SIDE_NAME[side_id]},"
                        f"path={escape_tag(path)},method={method},"
                        f"device={escape_tag(m.device)}" + (f",written={escape_tag(m.written)}" if m.written else "")
                    )
                    out.append(f"{tags} period_ms={m.period_ms}i,dmark_every={m.dmark_every}i {ts}")
        return out

    def path_records(self, ts_ns: int | None = None) -> list[pr.PathRecord]:
        """segscope.paths records of every flow monitor side (schemas/paths.md); same path as flow_lines."""
        ts = time.time_ns() if ts_ns is None else ts_ns
        with self.lock:
            return [
                pr.PathRecord.flow(
                    self.node, flow_id, SIDE_NAME[side_id], m.segments, METHOD_ARG[m.method], m.period_ms, ts
                )
                for side_id, side in sorted(self.sides.items())
                for flow_id, m in sorted(side.flows.items())
            ]

    def program_devices(self) -> list[tuple[str, str]]:
        """(program, device) of every device an altmark side of this agent runs on."""
        with self.lock:
            return [(PROG[side], d) for side in sorted(self.sides) for d in self.sides[side].devices]

    def attached_programs(self) -> list[tuple[str, Path, Path]]:
        """(program, loader, pin dir) of the altmark sides attached now."""
        with self.lock:
            return [(PROG[side], self.tool(side), self.pin_dir(side)) for side in sorted(self.sides)]

    def datapath_flows(self, side: int) -> dict[int, dict]:
        out = json.loads(self.run(side, ["list-flows", "--instance", self.instance, "--json"], "side"))
        return {f["flow_id"]: f for f in out.get("flows", [])}

    def shutdown(self) -> None:
        with self.lock:
            for side in list(self.sides):
                try:
                    self.detach(side)
                except ApiError as e:
                    log.warning("shutdown: %s", e.message)
            self._stop_collector()


def _status(m: pb.FlowMonitor, dp: dict | None) -> pb.FlowMonitorStatus:
    st = pb.FlowMonitorStatus(monitor=m)
    if dp:
        st.slot = dp.get("slot", 0)
        st.installed_tai_ns = dp.get("installed_tai_ns", 0)
    return st


class FlowMonitorServicer(pb_grpc.FlowMonitorServiceServicer):
    def __init__(self, agent: FlowMonAgent):
        self.a = agent

    def _changed(self) -> None:
        self.a.persist()
        if self.a.on_change:
            try:
                self.a.on_change()
            except Exception:  # noqa: BLE001
                log.exception("on_change hook failed")

    def StartFlowMonitor(self, req, ctx):
        m = validate_monitor(req.monitor)
        a = self.a
        with a.lock:
            s = a.sides.get(m.side)
            if s is not None and m.flow_id in s.flows:
                if s.flows[m.flow_id] == m:
                    log.info("StartFlowMonitor %s flow %d: unchanged", PROG[m.side], m.flow_id)
                    return pb.StartFlowMonitorResponse(
                        status=_status(m, a.datapath_flows(m.side).get(m.flow_id)), changed=False
                    )
                raise ApiError(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"monitor.flow_id: {PROG[m.side]} flow {m.flow_id} exists with different "
                    "parameters; StopFlowMonitor first",
                )
            same = [
                f
                for f in (s.flows.values() if s is not None else [])
                if f.method == m.method and list(f.segments) == list(m.segments) and m.segments
            ]
            if same:  # the datapath keys a flow by its SID list: a second one would replace it
                raise ApiError(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"monitor.segments: {PROG[m.side]} flow {same[0].flow_id} already monitors "
                    f"{','.join(m.segments)}; one flow per SID list and method",
                )
            added_device = s is not None and m.device not in s.devices
            if added_device:
                a.attach_dev(m.side, m.device)
            fresh = s is None
            if fresh:
                a.attach(m.side, m.device)
                s = a.sides[m.side]
            args = [
                "add-flow",
                "--instance",
                a.instance,
                "--flow-id",
                m.flow_id,
                "--method",
                METHOD_ARG[m.method],
                "--period-ms",
                m.period_ms,
            ]
            if m.side == RX and m.method == pb.MARKING_METHOD_RFC9343:
                args += ["--flowmon-id", m.flow_id]
            else:
                args += ["--sids", ",".join(m.segments)]
            if m.dmark_every:
                args += ["--dmark-every", m.dmark_every]
            if m.method == pb.MARKING_METHOD_DSCP:
                args += ["--dscp-l-bit", m.dscp_l_bit, "--dscp-d-bit", m.dscp_d_bit]
            try:
                a.run(m.side, args, "monitor")
            except ApiError:
                if fresh:
                    a.detach(m.side)
                elif added_device:
                    a.detach_dev(m.side, m.device)
                raise
            s.flows[m.flow_id] = m
            log.info(
                "StartFlowMonitor %s flow %d on %s: %s sids %s period %d ms: started",
                PROG[m.side],
                m.flow_id,
                m.device,
                METHOD_ARG[m.method],
                ",".join(m.segments) or "-",
                m.period_ms,
            )
            status = _status(m, a.datapath_flows(m.side).get(m.flow_id))
        self._changed()
        return pb.StartFlowMonitorResponse(status=status, changed=True)

    def StopFlowMonitor(self, req, ctx):
        side = F.enum_value("side", req.side, pb.FlowMonitorSide)
        if req.flow_id == 0:
            raise F.invalid("flow_id", "required (1..4294967295)")
        a = self.a
        with a.lock:
            s = a.sides.get(side)
            if s is None or req.flow_id not in s.flows:
                if req.allow_missing:
                    log.info("StopFlowMonitor %s flow %d: absent, allow_missing", PROG[side], req.flow_id)
                    return pb.StopFlowMonitorResponse(changed=False)
                raise ApiError(grpc.StatusCode.NOT_FOUND, f"flow_id: no {PROG[side]} flow {req.flow_id}")
            a.run(side, ["del-flow", "--instance", a.instance, "--flow-id", req.flow_id], "flow_id")
            device = s.flows.pop(req.flow_id).device
            log.info("StopFlowMonitor %s flow %d: stopped", PROG[side], req.flow_id)
            if not s.flows:
                a.detach(side)
            elif device not in {f.device for f in s.flows.values()}:
                a.detach_dev(side, device)  # that device's last flow
        self._changed()
        return pb.StopFlowMonitorResponse(changed=True)

    def ListFlowMonitors(self, req, ctx):
        want = F.enum_value("side", req.side, pb.FlowMonitorSide, required=False)
        out = []
        with self.a.lock:
            for side in sorted(self.a.sides):
                if want and side != want:
                    continue
                dp = self.a.datapath_flows(side)
                out += [_status(m, dp.get(fid)) for fid, m in sorted(self.a.sides[side].flows.items())]
        log.info("ListFlowMonitors: %d monitors", len(out))
        return pb.ListFlowMonitorsResponse(monitors=out)

    def GetFlowMonitorResults(self, req, ctx):
        side = F.enum_value("side", req.side, pb.FlowMonitorSide)
        if req.flow_id == 0:
            raise F.invalid("flow_id", "required (1..4294967295)")
        with self.a.lock:
            s = self.a.sides.get(side)
            if s is None or req.flow_id not in s.flows:
                raise ApiError(grpc.StatusCode.NOT_FOUND, f"flow_id: no {PROG[side]} flow {req.flow_id}")
            m = s.flows[req.flow_id]
            dp = self.a.datapath_flows(side).get(req.flow_id)
        if dp is None:
            raise ApiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"flow_id: {PROG[side]} flow {req.flow_id} is no longer in the datapath",
            )
        log.info("GetFlowMonitorResults %s flow %d", PROG[side], req.flow_id)
        colours = [
            pb.ColourCounters(packets=c["packets"], bytes=c["bytes"], dmark_packets=c["dmark_packets"])
            for c in sorted(dp["counters"], key=lambda c: c["colour"])
        ]
        return pb.GetFlowMonitorResultsResponse(
            status=_status(m, dp),
            colours=colours,
            total_packets=sum(c.packets for c in colours),
            total_bytes=sum(c.bytes for c in colours),
        )
