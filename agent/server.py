"""The agent's gRPC server: Srv6Service, StampService, FlowMonitorService, InlineMonitorService,
grpc.health.v1 and server reflection, over TLS (optionally mutual TLS) or, only when asked,
plaintext."""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from agent.fields import ApiError
from agent.flowmon import FlowMonAgent, FlowMonitorServicer
from agent.inline import InlineAgent, InlineMonitorServicer
from agent.ioam import IoamNode
from agent.keeper import Adopted, Keeper, ProcRef, stop_proc
from agent.metrics import AgentCounters, StatsPublisher
from agent.paths import PathPublisher, stamp_records
from agent.rtnl import Rtnl
from agent.srv6 import Srv6Servicer, Srv6State
from agent.stamp import ROLE_NAME, StampAgent, StampServicer, Tools
from segscope_proto.segscope.agent.v1 import (
    flowmon_pb2,
    flowmon_pb2_grpc,
    inline_pb2,
    inline_pb2_grpc,
    srv6_pb2,
    srv6_pb2_grpc,
    stamp_pb2,
    stamp_pb2_grpc,
)
from segscope_schemas import names
from segscope_schemas import path_record as pr
from segscope_schemas.health import Health, parse_address
from segscope_schemas.version import __version__

# what this agent calls its version in its logs and in datapath.json: the package's, unless
# SEGSCOPE_AGENT_VERSION says otherwise (how the tests play an upgrade with the same code)
AGENT_VERSION = os.environ.get("SEGSCOPE_AGENT_VERSION") or __version__

log = logging.getLogger("segscope.agent")

# seconds the Kafka flushes of a stop may take together (counters, topology view, path records);
# what is not delivered by then is logged, and the next agent publishes all of it again
STOP_FLUSH_BUDGET_S = 5.0
REPO = Path(__file__).resolve().parents[1]
SERVICES = {
    "Srv6Service": (srv6_pb2, srv6_pb2_grpc.add_Srv6ServiceServicer_to_server),
    "StampService": (stamp_pb2, stamp_pb2_grpc.add_StampServiceServicer_to_server),
    "FlowMonitorService": (flowmon_pb2, flowmon_pb2_grpc.add_FlowMonitorServiceServicer_to_server),
    "InlineMonitorService": (inline_pb2, inline_pb2_grpc.add_InlineMonitorServiceServicer_to_server),
}


def supervisor_restarts() -> int | None:
    """How often the container's supervisor (agent/supervise.py) restarted a dead agent before
    this one; None when no supervisor started this agent."""
    value = os.environ.get("SEGSCOPE_AGENT_SUPERVISOR_RESTARTS", "")
    return int(value) if value.isdigit() else None


@dataclass
class AgentConfig:
    node: str
    listen: str
    netns: str | None = None
    instance: str | None = None  # bpffs instance; default: netns or node
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None  # set = mutual TLS (client certificate required)
    insecure: bool = False  # plaintext (development only; refused without the flag)
    kafka: str | None = None  # Kafka bootstrap: stamp records, topology views, altmark blocks
    workers: int = 16
    topology_interval_s: float = 30.0
    stats_interval_s: float = 1.0  # segscope_datapath / segscope_agent lines (with kafka)
    paths_interval_s: float = 60.0  # full republication of segscope.paths records (with kafka)
    health: str | None = None  # HOST:PORT of /healthz /readyz /metrics /status (None: off)
    stamp_linger_ms: int = 200  # stamp_streamer --linger-ms: records held to batch them per node
    # ioam_rx --hook per device: "auto" (tc on a veth without XDP, else xdp), "xdp", "tc"
    inline_egress_hook: str = "auto"
    # what must outlive a killed agent (the IOAM values to restore): default /run/segscope/<instance>
    state_dir: str | None = None
    # the host's /proc/sys/net as the agent sees it (a container's own /proc/sys is read-only)
    sysctl_net: str = "/proc/sys/net"
    # the data-path processes outlive the agent; one no agent adopts within this stops (0: they die
    # with the agent, nothing is adopted)
    adopt_timeout_s: float = 30.0
    on_stop: str = "teardown"  # SIGTERM/SIGINT: "teardown" (stop and detach) or "handover" (leave running)


def _wrap(name: str, fn, streaming: bool, counters: AgentCounters):
    """ApiError -> status with its message; anything else -> INTERNAL (logged with traceback).
    Every call counts in `rpcs`, every error answer in `rpc_errors` (segscope_agent)."""
    if streaming:

        def stream(req, ctx):
            counters.add("rpcs")
            try:
                yield from fn(req, ctx)
            except ApiError as e:
                counters.add("rpc_errors")
                log.info("%s -> %s: %s", name, e.code.name, e.message)
                ctx.abort(e.code, e.message)

        return stream

    def unary(req, ctx):
        counters.add("rpcs")
        try:
            return fn(req, ctx)
        except ApiError as e:
            counters.add("rpc_errors")
            log.info("%s -> %s: %s", name, e.code.name, e.message)
            ctx.abort(e.code, e.message)
        except Exception as e:  # noqa: BLE001 - reported to the client, logged here
            if isinstance(e, grpc.RpcError) or type(e).__name__ == "_AbortedError":
                raise
            counters.add("rpc_errors")
            log.exception("%s failed", name)
            ctx.abort(grpc.StatusCode.INTERNAL, f"{name}: internal error: {type(e).__name__}: {e}")

    return unary


def _wrap_servicer(servicer, pb2, service: str, counters: AgentCounters) -> None:
    for m in pb2.DESCRIPTOR.services_by_name[service].methods:
        setattr(servicer, m.name, _wrap(f"{service}.{m.name}", getattr(servicer, m.name), m.server_streaming, counters))


class Agent:
    """One node's agent: state objects + the gRPC server."""

    def __init__(self, cfg: AgentConfig):
        self.cfg = cfg
        instance = cfg.instance or cfg.netns or cfg.node
        state_dir = Path(cfg.state_dir or Path("/run/segscope") / instance)
        # the node's state directory: the lock every data-path process watches, datapath.json
        self.keeper = Keeper(state_dir, cfg.adopt_timeout_s, cfg.node, instance, AGENT_VERSION)
        if self.keeper.enabled:
            try:
                self.keeper.lock()  # AgentLockError: another agent of this instance runs
            except OSError as e:  # no writable state directory: the agent runs, its children die with it
                log.error(
                    "state directory %s not usable (%s): no hitless restarts, the data path dies with this agent",
                    state_dir,
                    e,
                )
                self.keeper.adopt_timeout_s = 0
        self.rtnl = Rtnl(cfg.netns)
        self.srv6 = Srv6State(self.rtnl, cfg.node)
        self.stamp = StampAgent(
            cfg.node,
            Tools(REPO, cfg.netns, Path(names.BPFFS_PIN_ROOT) / instance),
            cfg.kafka,
            linger_ms=cfg.stamp_linger_ms,
            keeper=self.keeper,
        )
        self.stamp.link_stats = self.rtnl.link_stats
        # altmark_rx and the STAMP programs share the node's devices through the XDP chain of the
        # instance (datapath/README.md, "Chaining"); the loaders serialise its changes themselves
        self.flowmon = FlowMonAgent(cfg.node, REPO, cfg.netns, instance, cfg.kafka, keeper=self.keeper)
        self.ioam = IoamNode(cfg.netns, state_dir, self.rtnl.links, Path(cfg.sysctl_net))
        self.inline = InlineAgent(
            cfg.node,
            REPO,
            cfg.netns,
            instance,
            cfg.kafka,
            self.ioam,
            linger_ms=cfg.stamp_linger_ms,
            rtnl=self.rtnl,
            keeper=self.keeper,
            egress_hook=cfg.inline_egress_hook,
        )
        # the in-line agent takes policy routes over (ioam_lwt) and gives them back on RemovePolicy
        self.inline.srv6, self.srv6.route_program = self.srv6, self.inline
        self.adopted: dict = {}  # what this agent took over from the previous one (adopt_ms, notes)
        self._adopt_previous()
        # a killed agent's ioam_lwt routes that no adopted monitor owns: the plain seg6 routes back
        for note in self.inline.release_leftover_routes():
            log.warning("%s", note)
        # a killed agent of this node left IOAM enabled and its in-line monitors were not adopted:
        # put back what it had saved, before serving
        self.ioam.restore_leftovers()
        self.publisher = None
        self.paths: PathPublisher | None = None
        self.counters = AgentCounters()
        self.stats: StatsPublisher | None = None
        self.http_health: Health | None = None
        self.server: grpc.Server | None = None
        self.port = 0
        self.health = health.HealthServicer()

    # -- restarts: adopt what the previous agent of the node left running (agent/keeper.py) -------
    def _adopt_previous(self) -> None:
        k = self.keeper
        for o in k.take_orphan_reports():
            log.warning(
                "while no agent ran, %s (pid %s, %s) stopped itself after %s s without an agent: nobody adopted it",
                o.get("program", "?"),
                o.get("pid", "?"),
                o.get("what", ""),
                o.get("unadopted_s", "?"),
            )
        if not k.enabled:
            self._stop_unadoptable(k.leftovers(), "this agent adopts nothing (--adopt-timeout 0)")
            return
        t0 = time.monotonic()
        doc = k.load()
        if doc is None:
            if k.previous is not None:  # a format this agent does not know (a downgrade)
                self._stop_unadoptable(k.previous, "its state has a format this agent does not know")
            k.clear()
            return
        notes = (
            self.stamp.adopt(doc.get("stamp") or {})
            + self.flowmon.adopt(doc.get("flowmon") or {})
            + self.inline.adopt(doc.get("inline") or {})
        )
        ms = (time.monotonic() - t0) * 1e3
        self.adopted = {
            "from_pid": doc.get("agent_pid"),
            "from_version": doc.get("agent_version"),
            "adopt_ms": round(ms, 1),
            "notes": notes,
        }
        log.warning(
            "adopted the data path of the previous agent (pid %s, version %s; this is version %s) in %.0f ms: %s",
            doc.get("agent_pid"),
            doc.get("agent_version"),
            AGENT_VERSION,
            ms,
            "; ".join(notes) or "nothing was running",
        )

    @staticmethod
    def _stop_unadoptable(doc: dict | None, why: str) -> None:
        """Stop the processes a previous agent left running that this one will not adopt."""
        if not doc:
            return
        try:
            refs = [ProcRef.from_json((doc.get("stamp") or {}).get("streamer"))]
            refs += [ProcRef.from_json(sd.get("sender")) for sd in (doc.get("stamp") or {}).get("sessions", [])]
            refs.append(ProcRef.from_json((doc.get("flowmon") or {}).get("collector")))
            refs.append(ProcRef.from_json(((doc.get("stamp") or {}).get("reflector") or {}).get("userspace")))
            refs.append(ProcRef.from_json((doc.get("inline") or {}).get("streamer")))
        except (AttributeError, TypeError) as e:  # a layout this version does not know
            log.error("cannot read the processes a previous agent left (%s): they stop by themselves unadopted", e)
            return
        handles = [h for h in (Adopted.open(r) for r in refs) if h is not None]
        for h in handles:
            log.warning("stopping pid %d a previous agent left running: %s", h.pid, why)
            stop_proc(h, 20.0)

    # -- topology publisher (collectors/topology, only with --kafka) ------------------------------
    def _start_publisher(self) -> None:
        from collectors.topology.publisher import NodeViewPublisher  # lazy: only with --kafka

        self.publisher = NodeViewPublisher(
            self.cfg.node, self.cfg.netns, self.cfg.kafka, interval_s=self.cfg.topology_interval_s
        )
        self._publish_sections()
        self.publisher.start()
        # SRv6 routes: the publisher's own netlink poll sees them (no per-operation cost here);
        # sessions and flows are not in netlink, so they are handed over as sections on change,
        # and their SID lists as segscope.paths records (the processors' `path` tag).
        self.paths = PathPublisher(
            self.cfg.node, self.cfg.kafka, self._path_records, interval_s=self.cfg.paths_interval_s
        )
        self.paths.start()
        self.stamp.on_change = self._on_change
        self.flowmon.on_change = self._on_change
        self.inline.on_change = self._on_change

    def _on_change(self) -> None:
        self._publish_sections()
        if self.paths is not None:
            self.paths.changed()

    def _path_records(self) -> list[pr.PathRecord]:
        """Every session's and flow monitor side's SID list now (schemas/paths.md)."""
        with self.stamp.lock:
            out = stamp_records(self.cfg.node, self.stamp.sessions, ROLE_NAME)
        ts = out[0].ts_ns if out else None
        with self.flowmon.lock:
            out += self.flowmon.path_records(ts)
        out += self.inline.path_records(ts)
        return out

    def _sender_address(self, spec) -> str:
        """The address a sender session sends from: its own, else its Init source (what the
        sender process is given). The topology processor needs it to find the path: a sender
        entry without it was dropped as invalid."""
        cfg = self.stamp.sender_cfg
        if spec.sender_address or spec.role != stamp_pb2.STAMP_ROLE_SENDER or cfg is None:
            return spec.sender_address
        return cfg.source_address

    def _publish_sections(self) -> None:
        if self.publisher is None:
            return
        with self.stamp.lock:
            sessions = [
                {
                    "role": stamp_pb2.StampRole.Name(s.spec.role),
                    "ssid": s.spec.ssid,
                    "sender_address": self._sender_address(s.spec),
                    "reflector_address": s.spec.reflector_address,
                    "segments": list(s.spec.segments),
                    "return_segments": list(s.spec.return_segments),
                    "state": stamp_pb2.StampSessionState.Name(s.state),
                }
                for _, s in sorted(self.stamp.sessions.items())
            ]
        with self.flowmon.lock:
            flows = [
                {
                    "side": flowmon_pb2.FlowMonitorSide.Name(m.side),
                    "flow_id": m.flow_id,
                    "device": m.device,
                    "method": flowmon_pb2.MarkingMethod.Name(m.method),
                    "segments": list(m.segments),
                    "period_ms": m.period_ms,
                }
                for side in sorted(self.flowmon.sides)
                for m in self.flowmon.sides[side].flows.values()
            ]
        inline = [
            {
                "side": inline_pb2.InlineSide.Name(side),
                "flow_id": m.flow_id,
                "device": m.device,
                "segments": list(m.segments),
                "namespace_id": m.namespace_id,
                "trace_nodes": m.trace_nodes,
            }
            for side, m in self.inline.monitors()
        ]
        self.publisher.set_section("stamp_sessions", sessions)
        self.publisher.set_section("flows", flows)
        self.publisher.set_section("inline_monitors", inline)

    # -- counters on segscope.metrics (only with --kafka) -----------------------------------------
    def _start_stats(self) -> None:
        self.stats = StatsPublisher(
            self.cfg.node,
            self.cfg.kafka,
            programs=self._attached_programs,
            counters=self.counters,
            gauges=self._agent_gauges,
            interval_s=self.cfg.stats_interval_s,
            on_tick=self._on_stats_tick,
            streamer=self._streamers,
            devices=self._program_devices,
            link_stats=self.rtnl.link_stats,
            inventory=self._inventory_lines,
        )
        self.stats.start()

    def _attached_programs(self) -> list:
        return self.stamp.attached_programs() + self.flowmon.attached_programs() + self.inline.attached_programs()

    def _on_stats_tick(self) -> None:
        self.stamp.poll_producer()
        self.inline.poll_streamer()

    def _streamers(self) -> list[tuple[str, dict[str, int]]]:
        """(records kind, counters) of every ring buffer the agent streams (segscope_streamer)."""
        out = []
        for kind, fields in (("stamp", self.stamp.streamer_counters()), ("ioam", self.inline.streamer_counters())):
            if fields is not None:
                out.append((kind, fields))
        return out

    def _agent_gauges(self) -> dict[str, int]:
        out = {**self.stamp.counters(), **self.inline.counters()}
        out.update(
            orphans_stopped=self.keeper.orphans_stopped,
            collectors_adopted=self.flowmon.collectors_adopted,
            state_write_errors=self.keeper.write_errors,
        )
        if self.paths is not None:
            out.update(paths_published=self.paths.sent, paths_failed=self.paths.failed)
        restarts = supervisor_restarts()
        if restarts is not None:
            out.update(supervisor_restarts=restarts)
        return out

    def _inventory_lines(self, node_tag: str, ts: int) -> list[str]:
        return (
            self.stamp.session_lines(node_tag, ts)
            + self.flowmon.flow_lines(node_tag, ts)
            + self.inline.inventory_lines(node_tag, ts)
        )

    def _program_devices(self) -> list[tuple[str, str]]:
        return self.stamp.program_devices() + self.flowmon.program_devices() + self.inline.program_devices()

    # -- HTTP health endpoint (--health) ---------------------------------------------------------
    def _start_health(self) -> None:
        """/healthz: the agent's watch thread runs; /readyz: the gRPC server serves and, with
        --kafka, the last counters reached Kafka within 15 s; /metrics: the segscope_datapath,
        segscope_streamer and segscope_agent lines of segscope.metrics (schemas/metrics.md).
        For a Kubernetes probe: the gRPC port speaks TLS, which kubelet's gRPC probe does not."""
        address = parse_address(self.cfg.health, "--health")
        self.http_health = Health(f"agent-{self.cfg.node}")
        host, port = self.http_health.serve(address, "--health")
        log.info("agent health on http://%s:%d/healthz (/readyz /metrics /status)", host, port)
        local = None
        if self.stats is None:  # no Kafka: the same lines, computed here instead of by the publisher
            local = StatsPublisher(
                self.cfg.node,
                "",
                programs=self._attached_programs,
                counters=self.counters,
                gauges=self._agent_gauges,
                streamer=self._streamers,
                devices=self._program_devices,
                link_stats=self.rtnl.link_stats,
                inventory=self._inventory_lines,
            )
        stop = self._health_stop = threading.Event()

        def watch() -> None:
            produced = -1
            while not stop.is_set():
                h = self.http_health
                h.tick()
                try:
                    lines = local.lines() if local is not None else self.stats.last_lines
                    h.set_lines("agent", lines)
                except Exception as e:  # noqa: BLE001 - a bad read must not stop the probe answering
                    h.not_ready(f"counters unreadable: {e!r}")
                    stop.wait(1.0)
                    continue
                if self.server is None:
                    h.not_ready("gRPC server stopped")
                elif local is not None:
                    h.ok()
                else:
                    now = self.counters.snapshot()["metrics_produced"]
                    if now > produced:
                        h.ok()  # a counters message was acknowledged by Kafka since the last look
                    produced = now
                stop.wait(1.0)

        threading.Thread(target=watch, name="health-watch", daemon=True).start()

    # -- server -----------------------------------------------------------------------------------
    def credentials(self) -> grpc.ServerCredentials | None:
        c = self.cfg
        if c.insecure:
            return None
        if not (c.tls_cert and c.tls_key):
            raise SystemExit("agent: --tls-cert and --tls-key are required (or --insecure for plaintext)")
        cert, key = Path(c.tls_cert).read_bytes(), Path(c.tls_key).read_bytes()
        ca = Path(c.tls_client_ca).read_bytes() if c.tls_client_ca else None
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)

    def start(self) -> int:
        c = self.cfg
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=c.workers, thread_name_prefix="rpc"),
            options=[("grpc.so_reuseport", 0)],
        )
        servicers = {
            "Srv6Service": Srv6Servicer(self.srv6),
            "StampService": StampServicer(self.stamp),
            "FlowMonitorService": FlowMonitorServicer(self.flowmon),
            "InlineMonitorService": InlineMonitorServicer(self.inline),
        }
        names = [reflection.SERVICE_NAME, health.SERVICE_NAME]
        for svc, servicer in servicers.items():
            pb2, add = SERVICES[svc]
            _wrap_servicer(servicer, pb2, svc, self.counters)
            add(servicer, self.server)
            full = pb2.DESCRIPTOR.services_by_name[svc].full_name
            names.append(full)
            self.health.set(full, health_pb2.HealthCheckResponse.SERVING)
        self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(names, self.server)
        creds = self.credentials()
        self.port = (
            self.server.add_insecure_port(c.listen) if creds is None else self.server.add_secure_port(c.listen, creds)
        )
        if self.port == 0:
            raise SystemExit(f"agent: cannot listen on {c.listen}")
        self.server.start()
        if c.kafka:
            self._start_publisher()
            self._start_stats()
        if c.health:
            self._start_health()
        mode = "plaintext" if creds is None else ("mutual TLS" if c.tls_client_ca else "TLS")
        log.info(
            "agent %s for node %s (netns %s, bpffs instance %s) listening on %s (port %d, %s); "
            "%d policies and %d local SIDs in the kernel",
            AGENT_VERSION,
            c.node,
            c.netns or "-",
            self.stamp.tools.pin_root.name,
            c.listen,
            self.port,
            mode,
            len(self.srv6.policies),
            len(self.srv6.sids),
        )
        return self.port

    def stop(self, grace: float = 2.0) -> None:
        log.info("agent for node %s stopping", self.cfg.node)
        if self.http_health is not None:
            self._health_stop.set()
            self.http_health.close()
        for svc in ("", *[SERVICES[s][0].DESCRIPTOR.services_by_name[s].full_name for s in SERVICES]):
            self.health.set(svc, health_pb2.HealthCheckResponse.NOT_SERVING)
        if self.server is not None:
            self.server.stop(grace).wait()
        t0 = time.monotonic()
        # one budget for every Kafka flush of the stop: with the broker gone (Kafka's pod deleted
        # first by an uninstall, a broker down) each flush waited its whole timeout, 18 s in all
        flush_until = t0 + STOP_FLUSH_BUDGET_S

        def flush_left() -> float:
            return max(0.1, flush_until - time.monotonic())

        if self.stats is not None:
            self.stats.stop(flush_left())  # last counters while the programs are still attached
        if self.cfg.on_stop == "handover" and self.keeper.enabled:
            # the next agent of the node adopts them; until then (or --adopt-timeout) they measure on
            self.stamp.handover()
            self.flowmon.handover()
            self.inline.handover()
            log.info(
                "handover: STAMP roles, sessions, senders, streamers, the user-space reflector, flow and in-line "
                "monitors and the IOAM identity left running for the next agent"
            )
        else:
            self.stamp.shutdown()
            self.flowmon.shutdown()
            self.inline.shutdown()  # monitors stopped, programs detached, IOAM sysctls and namespaces restored
            self.keeper.clear()
        if self.publisher is not None:
            self.publisher.stop(flush_timeout_s=flush_left())
        if self.paths is not None:
            self.paths.stop(flush_left())
        self.rtnl.close()
        log.info("agent stopped (cleanup %.1f s)", time.monotonic() - t0)
