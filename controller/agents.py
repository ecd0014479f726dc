"""gRPC side of the controller: one persistent mutual-TLS channel per agent, reading what a node
has (List* RPCs -> model.Resource) and carrying out diff.Op's.

Every RPC goes through a client interceptor that counts it by method name, so `apply` can say
exactly which calls it made (and the tests can assert that a second apply makes none that change
anything).
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from controller.diff import Op
from controller.intent import NodeSpec
from controller.model import (
    IOAM_KEY,
    MAIN_TABLE,
    Resource,
    canon_prefix,
    canon_sid,
    flow_spec,
    inline_match,
    inline_spec,
    ioam_spec,
    local_sid_spec,
    policy_spec,
    reflector_spec,
    sender_spec,
)
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

RPC_TIMEOUT_S = 30.0
READ_METHODS = {
    "ListLocalSids",
    "ListPolicies",
    "ListStampSessions",
    "ListFlowMonitors",
    "GetPolicy",
    "GetLocalSid",
    "GetStampSessionResults",
    "GetFlowMonitorResults",
    "ListInlineMonitors",
    "GetInlineMonitorResults",
    "GetIoamConfig",
}

MODE_TO_PB = {
    "encap": srv6_pb2.ENCAP_MODE_ENCAP,
    "inline": srv6_pb2.ENCAP_MODE_INLINE,
    "encap.red": srv6_pb2.ENCAP_MODE_ENCAP_RED,
}
MODE_FROM_PB = {v: k for k, v in MODE_TO_PB.items()}
ACTION_TO_PB = {
    "End": srv6_pb2.LOCAL_SID_ACTION_END,
    "End.X": srv6_pb2.LOCAL_SID_ACTION_END_X,
    "End.T": srv6_pb2.LOCAL_SID_ACTION_END_T,
    "End.DX6": srv6_pb2.LOCAL_SID_ACTION_END_DX6,
    "End.DX4": srv6_pb2.LOCAL_SID_ACTION_END_DX4,
    "End.DT6": srv6_pb2.LOCAL_SID_ACTION_END_DT6,
    "End.DT4": srv6_pb2.LOCAL_SID_ACTION_END_DT4,
    "End.DT46": srv6_pb2.LOCAL_SID_ACTION_END_DT46,
    "End.B6": srv6_pb2.LOCAL_SID_ACTION_END_B6,
    "End.B6.Encaps": srv6_pb2.LOCAL_SID_ACTION_END_B6_ENCAPS,
}
ACTION_FROM_PB = {v: k for k, v in ACTION_TO_PB.items()}
FLAVOR_TO_PB = {  # the intent's words (iproute2's) -> the agent's enum
    "psp": srv6_pb2.LOCAL_SID_FLAVOR_PSP,
    "usp": srv6_pb2.LOCAL_SID_FLAVOR_USP,
    "usd": srv6_pb2.LOCAL_SID_FLAVOR_USD,
    "next-csid": srv6_pb2.LOCAL_SID_FLAVOR_NEXT_CSID,
}
FLAVOR_FROM_PB = {v: k for k, v in FLAVOR_TO_PB.items()}
FORMAT_TO_PB = {"ptp": stamp_pb2.TIMESTAMP_FORMAT_PTP, "ntp": stamp_pb2.TIMESTAMP_FORMAT_NTP}
FORMAT_FROM_PB = {**{v: k for k, v in FORMAT_TO_PB.items()}, stamp_pb2.TIMESTAMP_FORMAT_UNSPECIFIED: "ptp"}
STAMP_MODE_TO_PB = {
    "unauthenticated": stamp_pb2.STAMP_MODE_UNAUTHENTICATED,
    "authenticated": stamp_pb2.STAMP_MODE_AUTHENTICATED,
}
STAMP_MODE_FROM_PB = {
    **{v: k for k, v in STAMP_MODE_TO_PB.items()},
    stamp_pb2.STAMP_MODE_UNSPECIFIED: "unauthenticated",
}
ROLE_TO_PB = {"sender": stamp_pb2.STAMP_ROLE_SENDER, "reflector": stamp_pb2.STAMP_ROLE_REFLECTOR}
METHOD_TO_PB = {"dscp": flowmon_pb2.MARKING_METHOD_DSCP, "rfc9343": flowmon_pb2.MARKING_METHOD_RFC9343}
METHOD_FROM_PB = {v: k for k, v in METHOD_TO_PB.items()}
SIDE_TO_PB = {"tx": flowmon_pb2.FLOW_MONITOR_SIDE_TX, "rx": flowmon_pb2.FLOW_MONITOR_SIDE_RX}
INLINE_SIDE_TO_PB = {"ingress": inline_pb2.INLINE_SIDE_INGRESS, "egress": inline_pb2.INLINE_SIDE_EGRESS}
INLINE_SIDE_FROM_PB = {v: k for k, v in INLINE_SIDE_TO_PB.items()}


class AgentError(RuntimeError):
    """An RPC failed: which node, which call, the gRPC code and the agent's message."""

    def __init__(self, node: str, call: str, code: str, detail: str):
        self.node, self.call, self.code, self.detail = node, call, code, detail
        super().__init__(f"node {node}: {call}: {code}: {detail}")


class _Counter(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Counts every RPC started on the channel, by method name (e.g. "CreatePolicy"; a stream
    counts once however many messages it carries)."""

    def __init__(self):
        self.calls: collections.Counter[str] = collections.Counter()
        self.retries = 0  # reads repeated after a broken transport (AgentClient.call)
        self._lock = threading.Lock()

    def _count(self, details) -> None:
        with self._lock:
            self.calls[details.method.rsplit("/", 1)[-1]] += 1

    def intercept_unary_unary(self, continuation, client_call_details, request):
        self._count(client_call_details)
        return continuation(client_call_details, request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        self._count(client_call_details)
        return continuation(client_call_details, request)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        self._count(client_call_details)
        return continuation(client_call_details, request_iterator)


# ---------------------------------------------------------------------- agent message <-> Resource
# Pure translations, so a unit test can check that what the controller sends reads back equal.


def local_sid_resource(node: str, st: srv6_pb2.LocalSidState) -> Resource:
    s = st.local_sid
    return Resource(
        "local_sid",
        node,
        (canon_sid(s.sid), s.table or MAIN_TABLE),
        local_sid_spec(
            ACTION_FROM_PB.get(s.action, str(s.action)),
            s.device,
            s.lookup_table,
            s.nh6,
            s.nh4,
            s.segments,
            s.count,
            tuple(FLAVOR_FROM_PB.get(f, str(f)) for f in s.flavors),
            s.lblen,
            s.nflen,
        ),
    )


def local_sid_msg(r: Resource) -> srv6_pb2.LocalSid:
    f = r.fields
    return srv6_pb2.LocalSid(
        sid=r.key[0],
        table=r.key[1],
        action=ACTION_TO_PB[f["action"]],
        device=f["dev"],
        nh6=f["nh6"],
        nh4=f["nh4"],
        lookup_table=f["lookup_table"],
        segments=list(f["segs"]),
        count=f["count"],
        flavors=[FLAVOR_TO_PB[x] for x in f.get("flavors", ())],
        lblen=f.get("lblen", 0),
        nflen=f.get("nflen", 0),
    )


def policy_resource(node: str, p: srv6_pb2.Policy) -> Resource:
    return Resource(
        "policy",
        node,
        (canon_prefix(p.destination), p.table or MAIN_TABLE),
        policy_spec(MODE_FROM_PB.get(p.mode, str(p.mode)), p.segments, p.device, p.metric),
    )


def policy_msg(r: Resource) -> srv6_pb2.Policy:
    f = r.fields
    return srv6_pb2.Policy(
        destination=r.key[0],
        table=r.key[1],
        mode=MODE_TO_PB[f["mode"]],
        segments=list(f["segs"]),
        device=f["dev"],
        metric=f["metric"],
    )


def stamp_resource(node: str, st: stamp_pb2.StampSessionStatus) -> Resource:
    s = st.session
    running = st.state == stamp_pb2.STAMP_SESSION_STATE_RUNNING
    finished = st.state == stamp_pb2.STAMP_SESSION_STATE_STOPPED
    mode = STAMP_MODE_FROM_PB.get(s.mode, str(s.mode))
    if s.role == stamp_pb2.STAMP_ROLE_SENDER:
        return Resource(
            "stamp_sender",
            node,
            ("sender", s.ssid),
            sender_spec(
                s.ssid,
                s.sender_address,
                s.reflector_address,
                s.sender_port,
                s.reflector_port,
                s.segments,
                s.rate_pps,
                FORMAT_FROM_PB.get(s.timestamp_format, "ptp"),
                mode,
                s.padding_bytes,
                s.reduced,
                s.written,
            ),
            running=running,
            finished=finished,
        )
    return Resource(
        "stamp_reflector",
        node,
        ("reflector", s.ssid),
        reflector_spec(s.sender_address, s.return_segments, mode, FORMAT_FROM_PB.get(s.timestamp_format, "ptp")),
        running=running,
        finished=finished,
    )


def stamp_session_msg(r: Resource) -> stamp_pb2.StampSession:
    role, ssid = r.key
    f = r.fields
    if role == "sender":
        return stamp_pb2.StampSession(
            role=ROLE_TO_PB[role],
            ssid=ssid,
            sender_address=f["sender_address"],
            reflector_address=f["reflector_address"],
            sender_port=f["sender_port"],
            reflector_port=f["reflector_port"],
            segments=list(f["segs"]),
            rate_pps=f["rate_pps"],
            timestamp_format=FORMAT_TO_PB[f["format"]],
            mode=STAMP_MODE_TO_PB[f["mode"]],
            padding_bytes=f["padding_bytes"],
            reduced=f["reduced"],
            written=f["written"],
        )
    return stamp_pb2.StampSession(
        role=ROLE_TO_PB[role],
        ssid=ssid,
        sender_address=f["sender_address"],
        return_segments=list(f["return_segs"]),
        mode=STAMP_MODE_TO_PB[f["mode"]],
        timestamp_format=FORMAT_TO_PB[f["format"]],
    )


def flow_resource(node: str, st: flowmon_pb2.FlowMonitorStatus) -> Resource:
    m = st.monitor
    side = "tx" if m.side == flowmon_pb2.FLOW_MONITOR_SIDE_TX else "rx"
    return Resource(
        f"flow_{side}",
        node,
        (side, m.flow_id),
        flow_spec(
            side,
            m.device,
            METHOD_FROM_PB.get(m.method, str(m.method)),
            m.segments,
            m.period_ms,
            m.dmark_every,
            m.dscp_l_bit,
            m.dscp_d_bit,
            m.written,
        ),
    )


def flow_msg(r: Resource) -> flowmon_pb2.FlowMonitor:
    side, flow_id = r.key
    f = r.fields
    l_bit, d_bit = f["dscp_bits"] or (0, 0)
    return flowmon_pb2.FlowMonitor(
        side=SIDE_TO_PB[side],
        flow_id=flow_id,
        device=f["dev"],
        method=METHOD_TO_PB[f["method"]],
        segments=list(f["segs"]),
        period_ms=f["period_ms"],
        dmark_every=f["dmark_every"],
        dscp_l_bit=l_bit,
        dscp_d_bit=d_bit,
        written=f["written"],
    )


def ioam_resource(node: str, r: inline_pb2.GetIoamConfigResponse) -> Resource | None:
    if not r.enabled:
        return None
    c = r.config
    return Resource(
        "ioam_node",
        node,
        IOAM_KEY,
        ioam_spec(c.node_id, c.namespace_ids, c.all_devices, [(i.device, i.if_id) for i in c.interfaces]),
    )


def ioam_config_msg(r: Resource) -> inline_pb2.IoamConfig:
    f = r.fields
    return inline_pb2.IoamConfig(
        node_id=f["node_id"],
        namespace_ids=list(f["namespaces"]),
        interfaces=[inline_pb2.IoamInterface(device=d, if_id=i) for d, i in f["interfaces"]],
        all_devices=f["all_devices"],
    )


def inline_resource(node: str, st: inline_pb2.InlineMonitorStatus) -> Resource:
    m = st.monitor
    side = INLINE_SIDE_FROM_PB.get(m.side, str(m.side))
    mode = m.WhichOneof("sampling")
    mt = m.match
    return Resource(
        f"inline_{side}",
        node,
        (side, m.flow_id),
        inline_spec(
            side,
            m.device,
            m.segments,
            m.namespace_id,
            st.node_id,
            m.trace_nodes,
            m.sample_every if mode == "sample_every" else 0,
            m.sample_interval_us if mode == "sample_interval_us" else 0,
            inline_match(mt.src_prefix, mt.dst_prefix, mt.protocol, mt.src_port, mt.dst_port),
            tuple(tuple(p.segments) for p in m.alternate_paths),
        ),
    )


def inline_msg(r: Resource) -> inline_pb2.InlineMonitor:
    side, flow_id = r.key
    f = r.fields
    m = inline_pb2.InlineMonitor(
        side=INLINE_SIDE_TO_PB[side],
        flow_id=flow_id,
        device=f["dev"],
        segments=list(f["segs"]),
        namespace_id=f["namespace"],
        alternate_paths=[inline_pb2.InlinePath(segments=list(p)) for p in f["alternates"]],
    )
    if side == "ingress":
        m.trace_nodes = f["trace_nodes"]
        if f["sample_every"]:
            m.sample_every = f["sample_every"]
        else:
            m.sample_interval_us = f["sample_interval_us"]
        src, dst, proto, sport, dport = f["match"]
        if any(f["match"]):
            m.match.CopyFrom(
                inline_pb2.InlineMatch(src_prefix=src, dst_prefix=dst, protocol=proto, src_port=sport, dst_port=dport)
            )
    return m


CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


def credentials(node: NodeSpec) -> grpc.ChannelCredentials:
    tls = node.tls
    return grpc.ssl_channel_credentials(
        root_certificates=Path(tls.ca).read_bytes(),
        private_key=Path(tls.key).read_bytes(),
        certificate_chain=Path(tls.cert).read_bytes(),
    )


@dataclass
class AgentClient:
    """One node's agent over one persistent mTLS channel (opened once, reused for every call)."""

    node: NodeSpec
    counter: _Counter = field(default_factory=_Counter)
    channel_options: list = field(default_factory=list)  # more gRPC channel options (`run`: fast reconnect)

    def __post_init__(self):
        options = [("grpc.keepalive_time_ms", 30000), *self.channel_options]
        if self.node.tls.server_name:
            options.append(("grpc.ssl_target_name_override", self.node.tls.server_name))
        raw = grpc.secure_channel(self.node.agent, credentials(self.node), options=options)
        self._raw = raw
        self.channel = grpc.intercept_channel(raw, self.counter)
        self.srv6 = srv6_pb2_grpc.Srv6ServiceStub(self.channel)
        self.stamp = stamp_pb2_grpc.StampServiceStub(self.channel)
        self.flowmon = flowmon_pb2_grpc.FlowMonitorServiceStub(self.channel)
        self.inline = inline_pb2_grpc.InlineMonitorServiceStub(self.channel)

    @property
    def name(self) -> str:
        return self.node.name

    def close(self) -> None:
        self._raw.close()

    def wait_ready(self, timeout_s: float = 10.0) -> None:
        try:
            grpc.channel_ready_future(self._raw).result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            raise AgentError(
                self.name,
                "connect",
                "UNAVAILABLE",
                f"agent {self.node.agent} not reachable over TLS within {timeout_s:g} s",
            ) from None

    def call(self, stub, method: str, request, timeout: float = RPC_TIMEOUT_S):
        for attempt in (1, 2):
            try:
                return getattr(stub, method)(request, timeout=timeout)
            except grpc.RpcError as exc:
                # A read is retried once after the transport broke under it (the channel reconnects
                # by itself): a network blip, or gRPC's own TLS stream corruption after a fork in
                # this process (grpc/grpc#28557: "Stream removed ... TSI_DATA_CORRUPTED"). A change
                # is never retried: whether it was applied is not known, the next plan finds out.
                transport = exc.code() == grpc.StatusCode.UNAVAILABLE or "Stream removed" in (exc.details() or "")
                if attempt == 1 and method in READ_METHODS and transport:
                    self.counter.retries += 1
                    continue
                raise AgentError(self.name, method, exc.code().name, exc.details() or "") from None

    @property
    def mutating_calls(self) -> dict[str, int]:
        return {m: n for m, n in self.counter.calls.items() if m not in READ_METHODS}

    # -------------------------------------------------------------- read what the node has
    def read_state(self) -> dict[tuple, Resource]:
        """Everything this node reports, as model.Resource by ident (6 read RPCs: 4 List*,
        ListInlineMonitors and GetIoamConfig; an agent without InlineMonitorService (an older one)
        reports no in-line state: UNIMPLEMENTED is taken as none)."""
        node = self.name
        found = [
            local_sid_resource(node, st)
            for st in self.call(self.srv6, "ListLocalSids", srv6_pb2.ListLocalSidsRequest()).local_sids
        ]
        found += [
            policy_resource(node, p)
            for p in self.call(self.srv6, "ListPolicies", srv6_pb2.ListPoliciesRequest()).policies
        ]
        found += [
            stamp_resource(node, st)
            for st in self.call(self.stamp, "ListStampSessions", stamp_pb2.ListStampSessionsRequest()).sessions
        ]
        found += [
            flow_resource(node, st)
            for st in self.call(self.flowmon, "ListFlowMonitors", flowmon_pb2.ListFlowMonitorsRequest()).monitors
        ]
        try:
            ioam = ioam_resource(node, self.call(self.inline, "GetIoamConfig", inline_pb2.GetIoamConfigRequest()))
            found += [
                inline_resource(node, st)
                for st in self.call(self.inline, "ListInlineMonitors", inline_pb2.ListInlineMonitorsRequest()).monitors
            ]
        except AgentError as exc:
            if exc.code != "UNIMPLEMENTED":
                raise
            ioam = None
        if ioam is not None:
            found.append(ioam)
        return {r.ident: r for r in found}

    # -------------------------------------------------------------- carry out one op
    def execute(self, op: Op) -> list[str]:
        """Make the calls of one op; returns the RPC names made, in order."""
        handler = getattr(self, f"_op_{op.kind}")
        return handler(op)

    def _op_stamp_init(self, op: Op) -> list[str]:
        i = op.init
        if i.role == "sender":
            req = stamp_pb2.InitRequest(
                sender=stamp_pb2.StampSenderConfig(device=i.device, source_address=i.source_address)
            )
        else:
            req = stamp_pb2.InitRequest(
                reflector=stamp_pb2.StampReflectorConfig(
                    device=i.device, addresses=list(i.addresses), udp_port=i.udp_port
                )
            )
        self.call(self.stamp, "Init", req)
        return ["Init"]

    def execute_batch(self, ops: list[Op]) -> tuple[int, AgentError | None]:
        """SRv6 ops of this node in ONE ApplyBatch call (stop_on_error): returns how many succeeded
        (in order) and the error of the first that failed, if any."""
        operations = []
        for op in ops:
            if op.kind == "local_sid":
                if op.action == "remove":
                    sub = srv6_pb2.RemoveLocalSidRequest(sid=op.key[0], table=op.key[1])
                elif op.action == "create":
                    sub = srv6_pb2.CreateLocalSidRequest(local_sid=local_sid_msg(op.desired))
                else:
                    sub = srv6_pb2.UpdateLocalSidRequest(local_sid=local_sid_msg(op.desired))
            else:
                if op.action == "remove":
                    sub = srv6_pb2.RemovePolicyRequest(destination=op.key[0], table=op.key[1])
                elif op.action == "create":
                    sub = srv6_pb2.CreatePolicyRequest(policy=policy_msg(op.desired))
                else:
                    sub = srv6_pb2.UpdatePolicyRequest(policy=policy_msg(op.desired))
            operations.append(srv6_pb2.Srv6Operation(**{f"{op.action}_{op.kind}": sub}))
        reply = self.call(
            self.srv6, "ApplyBatch", srv6_pb2.ApplyBatchRequest(operations=operations, stop_on_error=True)
        )
        for i, r in enumerate(reply.results):
            if r.code != 0:
                return i, AgentError(
                    self.name, f"ApplyBatch operations[{i}]", CODE_NAMES.get(r.code, str(r.code)), r.message
                )
        return len(ops), None

    def _op_stamp_reset(self, op: Op) -> list[str]:
        self.call(self.stamp, "Reset", stamp_pb2.ResetRequest())
        return ["Reset"]

    def _op_local_sid(self, op: Op) -> list[str]:
        if op.action == "remove":
            sid, table = op.key
            self.call(self.srv6, "RemoveLocalSid", srv6_pb2.RemoveLocalSidRequest(sid=sid, table=table))
            return ["RemoveLocalSid"]
        msg = local_sid_msg(op.desired)
        if op.action == "create":
            self.call(self.srv6, "CreateLocalSid", srv6_pb2.CreateLocalSidRequest(local_sid=msg))
            return ["CreateLocalSid"]
        self.call(self.srv6, "UpdateLocalSid", srv6_pb2.UpdateLocalSidRequest(local_sid=msg))
        return ["UpdateLocalSid"]

    def _op_policy(self, op: Op) -> list[str]:
        destination, table = op.key
        if op.action == "remove":
            self.call(self.srv6, "RemovePolicy", srv6_pb2.RemovePolicyRequest(destination=destination, table=table))
            return ["RemovePolicy"]
        msg = policy_msg(op.desired)
        if op.action == "create":
            self.call(self.srv6, "CreatePolicy", srv6_pb2.CreatePolicyRequest(policy=msg))
            return ["CreatePolicy"]
        self.call(self.srv6, "UpdatePolicy", srv6_pb2.UpdatePolicyRequest(policy=msg))
        return ["UpdatePolicy"]

    def _op_stamp_session(self, op: Op) -> list[str]:
        role, ssid = op.key
        calls = []
        if op.action in ("remove", "replace"):
            self.call(
                self.stamp,
                "DestroyStampSession",
                stamp_pb2.DestroyStampSessionRequest(role=ROLE_TO_PB[role], ssid=ssid),
            )
            calls.append("DestroyStampSession")
        if op.action in ("create", "replace"):
            self.call(
                self.stamp,
                "CreateStampSession",
                stamp_pb2.CreateStampSessionRequest(session=stamp_session_msg(op.desired)),
            )
            calls.append("CreateStampSession")
        if op.action == "start":
            duration = op.desired.duration_s if role == "sender" else 0.0
            self.call(
                self.stamp,
                "StartStampSession",
                stamp_pb2.StartStampSessionRequest(role=ROLE_TO_PB[role], ssid=ssid, duration_s=duration),
            )
            calls.append("StartStampSession")
        if op.action == "stop":
            self.call(
                self.stamp, "StopStampSession", stamp_pb2.StopStampSessionRequest(role=ROLE_TO_PB[role], ssid=ssid)
            )
            calls.append("StopStampSession")
        return calls

    _op_stamp_sender = _op_stamp_session
    _op_stamp_reflector = _op_stamp_session

    def _op_flow(self, op: Op) -> list[str]:
        side, flow_id = op.key
        calls = []
        if op.action in ("remove", "replace"):
            self.call(
                self.flowmon,
                "StopFlowMonitor",
                flowmon_pb2.StopFlowMonitorRequest(side=SIDE_TO_PB[side], flow_id=flow_id),
            )
            calls.append("StopFlowMonitor")
        if op.action in ("create", "replace"):
            msg = flow_msg(op.desired)
            self.call(self.flowmon, "StartFlowMonitor", flowmon_pb2.StartFlowMonitorRequest(monitor=msg))
            calls.append("StartFlowMonitor")
        return calls

    _op_flow_rx = _op_flow
    _op_flow_tx = _op_flow

    def _op_ioam_node(self, op: Op) -> list[str]:
        if op.action == "remove":
            self.call(self.inline, "DisableIoam", inline_pb2.DisableIoamRequest())
            return ["DisableIoam"]
        self.call(self.inline, "EnableIoam", inline_pb2.EnableIoamRequest(config=ioam_config_msg(op.desired)))
        return ["EnableIoam"]

    def _op_inline(self, op: Op) -> list[str]:
        side, flow_id = op.key
        if op.action == "remove":
            req = inline_pb2.StopInlineMonitorRequest(side=INLINE_SIDE_TO_PB[side], flow_id=flow_id)
            self.call(self.inline, "StopInlineMonitor", req)
            return ["StopInlineMonitor"]
        self.call(
            self.inline, "StartInlineMonitor", inline_pb2.StartInlineMonitorRequest(monitor=inline_msg(op.desired))
        )
        return ["StartInlineMonitor"]

    _op_inline_egress = _op_inline
    _op_inline_ingress = _op_inline
