"""Srv6Service: SRv6 policies (seg6 encap routes) and local SIDs (seg6local routes) of the node.

The kernel is the source of truth. The agent keeps an index of the node's SRv6 routes (loaded by
a dump at start, refreshed by every Get/List, updated by its own changes) so that a configuration
operation costs ONE netlink round trip: Create sends RTM_NEWROUTE(CREATE|EXCL), Update sends
RTM_NEWROUTE(REPLACE) (hitless: the route is replaced in place, never absent), Remove sends
RTM_DELROUTE. When the kernel disagrees with the index (EEXIST / ENOENT / ESRCH: someone changed
routes behind the agent's back) the table is re-read and the operation decided again.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import grpc

from agent import fields as F
from agent import rtnl as R
from agent.fields import ApiError
from segscope_proto.segscope.agent.v1 import srv6_pb2 as pb
from segscope_proto.segscope.agent.v1 import srv6_pb2_grpc as pb_grpc

log = logging.getLogger("segscope.agent.srv6")

MODE_TO_KERNEL = {
    pb.ENCAP_MODE_ENCAP: R.SEG6_IPTUN_MODE_ENCAP,
    pb.ENCAP_MODE_INLINE: R.SEG6_IPTUN_MODE_INLINE,
    pb.ENCAP_MODE_ENCAP_RED: R.SEG6_IPTUN_MODE_ENCAP_RED,
}
MODE_FROM_KERNEL = {v: k for k, v in MODE_TO_KERNEL.items()}
MODE_NAMES = {
    R.SEG6_IPTUN_MODE_ENCAP: "encap",
    R.SEG6_IPTUN_MODE_INLINE: "inline",
    R.SEG6_IPTUN_MODE_ENCAP_RED: "encap.red",
}

ACTION_TO_KERNEL = {
    pb.LOCAL_SID_ACTION_END: R.ACT_END,
    pb.LOCAL_SID_ACTION_END_X: R.ACT_END_X,
    pb.LOCAL_SID_ACTION_END_T: R.ACT_END_T,
    pb.LOCAL_SID_ACTION_END_DX6: R.ACT_END_DX6,
    pb.LOCAL_SID_ACTION_END_DX4: R.ACT_END_DX4,
    pb.LOCAL_SID_ACTION_END_DT6: R.ACT_END_DT6,
    pb.LOCAL_SID_ACTION_END_DT4: R.ACT_END_DT4,
    pb.LOCAL_SID_ACTION_END_DT46: R.ACT_END_DT46,
    pb.LOCAL_SID_ACTION_END_B6: R.ACT_END_B6,
    pb.LOCAL_SID_ACTION_END_B6_ENCAPS: R.ACT_END_B6_ENCAP,
}
ACTION_FROM_KERNEL = {v: k for k, v in ACTION_TO_KERNEL.items()}
FLAVOR_TO_KERNEL = {
    pb.LOCAL_SID_FLAVOR_PSP: R.FLV_PSP,
    pb.LOCAL_SID_FLAVOR_USP: R.FLV_USP,
    pb.LOCAL_SID_FLAVOR_USD: R.FLV_USD,
    pb.LOCAL_SID_FLAVOR_NEXT_CSID: R.FLV_NEXT_CSID,
}
FLAVOR_FROM_KERNEL = {v: k for k, v in FLAVOR_TO_KERNEL.items()}
# which optional parameter each action requires (every other one is refused)
ACTION_PARAMS = {
    R.ACT_END: "",
    R.ACT_END_X: "nh6",
    R.ACT_END_T: "lookup_table",
    R.ACT_END_DX6: "nh6",
    R.ACT_END_DX4: "nh4",
    R.ACT_END_DT6: "lookup_table",
    R.ACT_END_DT4: "lookup_table",
    R.ACT_END_DT46: "lookup_table",
    R.ACT_END_B6: "segments",
    R.ACT_END_B6_ENCAP: "segments",
}

OK = grpc.StatusCode.OK
# datapath/ioam_lwt.c COPY_TABLE: the route program's copy of a taken-over seg6 route (the packets
# it re-routes to the kernel's seg6 encapsulation)
LWT_COPY_TABLE = 3355
# datapath/ioam_lwt.c LOCAL_TABLE: the route program's lwt_xmit copy of the route for the packets the
# node sends itself (rule `iif lo lookup 3356`): a bpf route that stands for no policy of its own
LWT_LOCAL_TABLE = 3356


def describe_policy(p: R.PolicyRoute) -> str:
    return f"policy {p.destination} table {p.table}"


def describe_sid(s: R.LocalSidRoute) -> str:
    return f"local SID {s.sid} table {s.table}"


@dataclass
class Plan:
    """What one operation does: netlink messages to send, then on success `commit` (index
    update) and the response. Empty msgs = nothing to change (idempotent repeat)."""

    msgs: list[tuple[int, int, bytes]]
    commit: Callable[[], None]
    response: Callable[[], object]
    changed: bool
    log_line: Callable[[], str]  # built only when logged
    what: str  # object path for kernel errors ("policy", "local_sid")
    key: tuple[str, int] = ("", 0)
    retry: Callable[[], "Plan"] | None = None  # re-plan after a table re-read
    extra: dict = field(default_factory=dict)


class Srv6State:
    """The index of the node's SRv6 routes + the netlink socket + device names."""

    def __init__(self, rtnl: R.Rtnl, node: str):
        self.rtnl, self.node = rtnl, node
        self.lock = threading.RLock()
        self.policies: dict[tuple[str, int], R.PolicyRoute] = {}
        self.sids: dict[tuple[str, int], R.LocalSidRoute] = {}
        self.ifindex: dict[str, int] = {}
        self.ifname: dict[int, str] = {}
        self.taken_over: dict[tuple[str, int], R.BpfRoute] = {}  # policies the route program runs
        # the in-line agent: it gives a taken-over route back before the policy is removed
        self.route_program = None
        self.on_change: Callable[[], None] | None = None  # e.g. topology publisher
        self.refresh_links()
        self.resync(None)

    # -- kernel reads --------------------------------------------------------------------------
    def refresh_links(self) -> None:
        self.ifindex = self.rtnl.links()
        self.ifname = {v: k for k, v in self.ifindex.items()}

    def resync(self, table: int | None) -> None:
        """Re-read SRv6 routes (one table or all) from the kernel into the index. A policy whose route
        the route program (ioam_lwt) has taken over is read from its copy in LWT_COPY_TABLE: the
        policy keeps its SID list while monitored, and the copy is no policy of that table."""
        if table in (LWT_COPY_TABLE, LWT_LOCAL_TABLE):
            table = None  # which copies are copies depends on the bpf routes of every table
        routes = self.rtnl.srv6_routes(table)
        if table is not None:
            routes += [r for r in self.rtnl.srv6_routes(LWT_COPY_TABLE) if isinstance(r, R.PolicyRoute)]
        policies, taken_over = policies_of(routes, table)
        with self.lock:
            if table is None:
                self.policies.clear()
                self.sids.clear()
                self.taken_over.clear()
            else:
                for d in (self.policies, self.sids, self.taken_over):
                    for k in [k for k in d if k[1] == table]:
                        del d[k]
            self.taken_over.update(taken_over)
            for r in [*policies, *(r for r in routes if isinstance(r, R.LocalSidRoute))]:
                d = self.policies if isinstance(r, R.PolicyRoute) else self.sids
                old = d.get(r.key)
                if old is None or r.metric < old.metric:  # lowest metric wins, as in the FIB
                    d[r.key] = r

    def route_program_of(self, key: tuple[str, int]) -> R.BpfRoute | None:
        """The route program's route in place of this policy's seg6 route, if it is taken over."""
        with self.lock:
            return self.taken_over.get(key)

    def oif(self, path: str, name: str) -> int:
        idx = self.ifindex.get(name)
        if idx is None:
            self.refresh_links()
            idx = self.ifindex.get(name)
        if idx is None:
            raise ApiError(grpc.StatusCode.FAILED_PRECONDITION, f"{path}: no device {name!r} on node {self.node}")
        return idx

    def devname(self, idx: int) -> str:
        name = self.ifname.get(idx)
        if name is None:
            self.refresh_links()
            name = self.ifname.get(idx, f"if{idx}")
        return name

    def changed(self) -> None:
        if self.on_change:
            try:
                self.on_change()
            except Exception:  # noqa: BLE001 - a publisher problem must not fail the RPC
                log.exception("on_change hook failed")


def policies_of(routes: list, table: int | None) -> tuple[list[R.PolicyRoute], dict]:
    """The policies in a route dump: the seg6 routes, except ioam_lwt's copies in LWT_COPY_TABLE,
    and for every bpf route with such a copy the policy it stands for (its table and metric, the
    copy's mode, SID list and device). Also the bpf routes by policy key."""
    copies = {r.destination: r for r in routes if isinstance(r, R.PolicyRoute) and r.table == LWT_COPY_TABLE}
    taken_over = {
        r.key: r
        for r in routes
        if isinstance(r, R.BpfRoute)
        and r.table != LWT_LOCAL_TABLE  # the copy for locally sent packets
        and r.destination in copies
        and (table is None or r.table == table)
    }
    copied = {k[0] for k in taken_over}
    out = [
        r
        for r in routes
        if isinstance(r, R.PolicyRoute)
        and not (r.table == LWT_COPY_TABLE and r.destination in copied)
        and (table is None or r.table == table)
    ]
    for key, bpf in taken_over.items():
        c = copies[key[0]]
        out.append(R.PolicyRoute(bpf.destination, bpf.table, c.mode, c.segments, c.oif, bpf.metric))
    return out, taken_over


# --- proto <-> routes -------------------------------------------------------------------------
def policy_from_msg(st: Srv6State, m: pb.Policy, path: str) -> R.PolicyRoute:
    dest, fam = F.prefix(f"{path}.destination", m.destination)
    table = F.table(f"{path}.table", m.table)
    mode = F.enum_value(f"{path}.mode", m.mode, pb.EncapMode)
    if mode == pb.ENCAP_MODE_INLINE and fam != socket.AF_INET6:
        raise F.invalid(f"{path}.mode", f"ENCAP_MODE_INLINE needs an IPv6 destination, not {dest}")
    segs = F.segments(f"{path}.segments", m.segments)
    dev = F.ifname(f"{path}.device", m.device)
    metric = m.metric or (R.V6_DEFAULT_METRIC if fam == socket.AF_INET6 else 0)
    return R.PolicyRoute(dest, table, MODE_TO_KERNEL[mode], segs, st.oif(f"{path}.device", dev), metric)


def policy_to_msg(st: Srv6State, p: R.PolicyRoute) -> pb.Policy:
    return pb.Policy(
        destination=p.destination,
        table=p.table,
        mode=MODE_FROM_KERNEL.get(p.mode, pb.ENCAP_MODE_UNSPECIFIED),
        segments=p.segments,
        device=st.devname(p.oif),
        metric=p.metric,
    )


def sid_from_msg(st: Srv6State, m: pb.LocalSid, path: str) -> R.LocalSidRoute:
    sid = sid_text(f"{path}.sid", m.sid)
    table = F.table(f"{path}.table", m.table)
    action_pb = F.enum_value(f"{path}.action", m.action, pb.LocalSidAction)
    action = ACTION_TO_KERNEL[action_pb]
    dev = F.ifname(f"{path}.device", m.device)
    need = ACTION_PARAMS[action]
    aname = pb.LocalSidAction.Name(action_pb)
    present = {
        "nh6": bool(m.nh6),
        "nh4": bool(m.nh4),
        "lookup_table": m.lookup_table != 0,
        "segments": len(m.segments) > 0,
    }
    for name, is_set in present.items():
        if name == need and not is_set:
            raise F.invalid(f"{path}.{name}", f"required with {aname}")
        if name != need and is_set:
            raise F.invalid(f"{path}.{name}", f"not allowed with {aname}")
    nh6 = F.ipv6(f"{path}.nh6", m.nh6, required=False) if need == "nh6" else ""
    nh4 = F.ipv4(f"{path}.nh4", m.nh4, required=False) if need == "nh4" else ""
    lookup = F.required_table(f"{path}.lookup_table", m.lookup_table) if need == "lookup_table" else 0
    segs = F.segments(f"{path}.segments", m.segments) if need == "segments" else ()
    return R.LocalSidRoute(
        sid,
        table,
        action,
        st.oif(f"{path}.device", dev),
        nh6=nh6,
        nh4=nh4,
        lookup_table=lookup,
        segments=segs,
        count=m.count,
        **flavors_from_msg(m, path),
    )


def sid_text(path: str, value: str) -> str:
    """A local SID's key text: an address (route /128) or "addr/len" for a locator prefix."""
    if "/" not in value:
        return F.ipv6(path, value)
    text, fam = F.prefix(path, value)
    if fam != socket.AF_INET6:
        raise F.invalid(path, f"{value!r} is not an IPv6 prefix")
    addr, plen = R.sid_route_prefix(text)
    return addr if plen == 128 else text


def csid_length(path: str, value: int, default: int) -> int:
    bits = value or default
    if bits % 8 or not 8 <= bits <= 120:
        raise F.invalid(path, f"{bits} bits: the kernel takes a multiple of 8 in 8..120")
    return bits


def flavors_from_msg(m: pb.LocalSid, path: str) -> dict:
    """flavors/lblen/nflen of a LocalSid, checked; NEXT-C-SID lengths are explicit (the kernel's
    defaults filled in) so that the index equals what a dump reads back."""
    flavors: list[int] = []
    for i, f in enumerate(m.flavors):
        F.enum_value(f"{path}.flavors[{i}]", f, pb.LocalSidFlavor)
        if FLAVOR_TO_KERNEL[f] in flavors:
            raise F.invalid(f"{path}.flavors[{i}]", f"{pb.LocalSidFlavor.Name(f)} is listed twice")
        flavors.append(FLAVOR_TO_KERNEL[f])
    if R.FLV_NEXT_CSID not in flavors:
        for name in ("lblen", "nflen"):
            if getattr(m, name):
                raise F.invalid(f"{path}.{name}", "only with the LOCAL_SID_FLAVOR_NEXT_CSID flavour")
        return {"flavors": tuple(sorted(flavors))}
    lblen = csid_length(f"{path}.lblen", m.lblen, R.CSID_DEFAULT_LBLEN)
    nflen = csid_length(f"{path}.nflen", m.nflen, R.CSID_DEFAULT_NFLEN)
    if lblen + nflen > 128:
        raise F.invalid(f"{path}.nflen", f"lblen {lblen} + nflen {nflen} is more than 128 bits")
    plen = R.sid_route_prefix(sid_text(f"{path}.sid", m.sid))[1]
    if plen != lblen + nflen:
        raise F.invalid(
            f"{path}.sid",
            f"a NEXT-C-SID SID is the prefix locator-block + micro-SID: /{lblen + nflen} "
            f"(lblen {lblen} + nflen {nflen}), not /{plen}",
        )
    return {"flavors": tuple(sorted(flavors)), "lblen": lblen, "nflen": nflen}


def sid_to_msg(st: Srv6State, s: R.LocalSidRoute) -> pb.LocalSid:
    return pb.LocalSid(
        sid=s.sid,
        table=s.table,
        action=ACTION_FROM_KERNEL.get(s.action, pb.LOCAL_SID_ACTION_UNSPECIFIED),
        device=st.devname(s.oif),
        nh6=s.nh6,
        nh4=s.nh4,
        lookup_table=s.lookup_table,
        segments=s.segments,
        count=s.count,
        flavors=[FLAVOR_FROM_KERNEL[f] for f in s.flavors if f in FLAVOR_FROM_KERNEL],
        lblen=s.lblen,
        nflen=s.nflen,
    )


def sid_state(st: Srv6State, s: R.LocalSidRoute) -> pb.LocalSidState:
    out = pb.LocalSidState(local_sid=sid_to_msg(st, s))
    if s.counters is not None:
        out.counters.CopyFrom(pb.LocalSidCounters(packets=s.counters[0], bytes=s.counters[1], errors=s.counters[2]))
    return out


def key_from(path: str, destination: str, table: int) -> tuple[str, int]:
    return F.prefix(f"{path}destination", destination)[0], F.table(f"{path}table", table)


def sid_key_from(path: str, sid: str, table: int) -> tuple[str, int]:
    return sid_text(f"{path}sid", sid), F.table(f"{path}table", table)


def _fmt_policy(p: R.PolicyRoute, st: Srv6State) -> str:
    return (
        f"{p.destination} table {p.table} encap seg6 mode {MODE_NAMES.get(p.mode, p.mode)} "
        f"segs {','.join(p.segments)} dev {st.devname(p.oif)} metric {p.metric}"
    )


def route_prefix(sid: str) -> str:
    return sid if "/" in sid else f"{sid}/128"


def _fmt_flavors(s: R.LocalSidRoute) -> str:
    if not s.flavors:
        return ""
    text = " flavors " + ",".join(R.FLAVOR_NAMES[f] for f in s.flavors)
    return text + (f" lblen {s.lblen} nflen {s.nflen}" if s.lblen else "")


def _fmt_sid(s: R.LocalSidRoute, st: Srv6State) -> str:
    extra = "".join(
        f" {k} {v}"
        for k, v in (("nh6", s.nh6), ("nh4", s.nh4), ("table", s.lookup_table), ("segs", ",".join(s.segments)))
        if v
    )
    return (
        f"{s.sid} table {s.table} seg6local action {R.ACTION_NAMES.get(s.action, s.action)}"
        f"{extra}{_fmt_flavors(s)}{' count' if s.count else ''} dev {st.devname(s.oif)}"
    )


# --- planning: validated request -> Plan ------------------------------------------------------
ADD = R.NLM_F_CREATE | R.NLM_F_EXCL


def plan_create_policy(st: Srv6State, req: pb.CreatePolicyRequest, path: str = "", pre=None) -> Plan:
    p = pre or policy_from_msg(st, req.policy, f"{path}policy")

    def decide() -> Plan:
        old = st.policies.get(p.key)
        if old == p:
            return Plan(
                [],
                lambda: None,
                lambda: pb.CreatePolicyResponse(policy=policy_to_msg(st, p), changed=False),
                False,
                lambda: f"CreatePolicy {_fmt_policy(p, st)}: unchanged (identical policy exists)",
                "policy",
                p.key,
            )
        if old is not None:
            raise ApiError(
                grpc.StatusCode.ALREADY_EXISTS,
                f"{path}policy: {describe_policy(p)} exists with different content "
                f"({_fmt_policy(old, st)}); use UpdatePolicy",
            )
        return Plan(
            [(R.RTM_NEWROUTE, ADD, R.encode_policy(p))],
            lambda: st.policies.__setitem__(p.key, p),
            lambda: pb.CreatePolicyResponse(policy=policy_to_msg(st, p), changed=True),
            True,
            lambda: f"CreatePolicy {_fmt_policy(p, st)}: created",
            f"{path}policy",
            p.key,
            retry=decide,
        )

    return decide()


def plan_update_policy(st: Srv6State, req: pb.UpdatePolicyRequest, path: str = "", pre=None) -> Plan:
    p = pre or policy_from_msg(st, req.policy, f"{path}policy")

    def decide() -> Plan:
        old = st.policies.get(p.key)
        if old is None:
            raise ApiError(grpc.StatusCode.NOT_FOUND, f"{path}policy: {describe_policy(p)}: no such policy")

        def resp(changed: bool):
            return lambda: pb.UpdatePolicyResponse(
                policy=policy_to_msg(st, p), previous=policy_to_msg(st, old), changed=changed
            )

        if old == p:
            return Plan(
                [],
                lambda: None,
                resp(False),
                False,
                lambda: f"UpdatePolicy {_fmt_policy(p, st)}: unchanged",
                "policy",
                p.key,
            )
        # an in-line monitor that fell back to ioam_tx on TC from this policy (before this update)
        # follows it once the kernel has the new SID list (commit runs after the kernel's ack)
        follows = st.route_program is not None and st.route_program.follower_of(p.key) is not None
        if st.route_program_of(p.key) is not None and st.route_program is not None:
            # an in-line monitor runs on this policy's route: the route program moves with it (the
            # steer keeps the monitor), or gives the route back and the plain seg6 route is updated
            if st.route_program.steer_policy(old, p):
                st.resync(None)
                return Plan(
                    [],
                    lambda: None,
                    resp(True),
                    True,
                    lambda: f"UpdatePolicy {_fmt_policy(p, st)}: steered on the route program ioam_lwt "
                    f"(was segs {','.join(old.segments)}), its in-line monitor kept",
                    f"{path}policy",
                    p.key,
                )
            st.resync(p.key[1])
            old = st.policies.get(p.key, old)
        before = old

        def commit() -> None:
            st.policies[p.key] = p
            if follows:
                st.route_program.follow_policy(before, p)

        if old.metric == p.metric:
            # hitless: one RTM_NEWROUTE with NLM_F_REPLACE, the FIB entry is swapped in place
            msgs = [(R.RTM_NEWROUTE, R.NLM_F_REPLACE, R.encode_policy(p))]
        else:
            # a new metric is a new FIB entry: add it first, then delete the old one (never absent)
            msgs = [
                (R.RTM_NEWROUTE, ADD, R.encode_policy(p)),
                (R.RTM_DELROUTE, 0, R.encode_delete(old.destination, old.table, old.metric)),
            ]
        return Plan(
            msgs,
            commit,
            resp(True),
            True,
            lambda: f"UpdatePolicy {_fmt_policy(p, st)}: replaced (was segs {','.join(old.segments)} "
            f"mode {MODE_NAMES.get(old.mode)} dev {st.devname(old.oif)} metric {old.metric})",
            f"{path}policy",
            p.key,
            retry=decide,
            extra={"after_the_kernel": True} if follows else {},
        )

    return decide()


def plan_remove_policy(st: Srv6State, req: pb.RemovePolicyRequest, path: str = "", pre=None) -> Plan:
    key = pre or key_from(path, req.destination, req.table)

    def decide() -> Plan:
        old = st.policies.get(key)
        if old is None:
            if req.allow_missing:
                return Plan(
                    [],
                    lambda: None,
                    lambda: pb.RemovePolicyResponse(changed=False),
                    False,
                    lambda: f"RemovePolicy {key[0]} table {key[1]}: absent, allow_missing",
                    "policy",
                    key,
                )
            raise ApiError(
                grpc.StatusCode.NOT_FOUND, f"{path}destination: policy {key[0]} table {key[1]}: no such policy"
            )
        if st.route_program_of(key) is not None and st.route_program is not None:
            # the route program's state (its route entry, the copy in LWT_COPY_TABLE, the rule) goes
            # first: the seg6 route is given back, then removed like any policy
            st.route_program.release_policy(old)
            st.resync(key[1])
        return Plan(
            [(R.RTM_DELROUTE, 0, R.encode_delete(old.destination, old.table, old.metric))],
            lambda: st.policies.pop(key, None),
            lambda: pb.RemovePolicyResponse(changed=True),
            True,
            lambda: f"RemovePolicy {_fmt_policy(old, st)}: removed",
            f"{path}destination",
            key,
            retry=decide,
        )

    return decide()


def plan_create_sid(st: Srv6State, req: pb.CreateLocalSidRequest, path: str = "", pre=None) -> Plan:
    s = pre or sid_from_msg(st, req.local_sid, f"{path}local_sid")

    def decide() -> Plan:
        old = st.sids.get(s.key)
        if old == s:
            return Plan(
                [],
                lambda: None,
                lambda: pb.CreateLocalSidResponse(local_sid=sid_to_msg(st, s), changed=False),
                False,
                lambda: f"CreateLocalSid {_fmt_sid(s, st)}: unchanged (identical SID exists)",
                "local_sid",
                s.key,
            )
        if old is not None:
            raise ApiError(
                grpc.StatusCode.ALREADY_EXISTS,
                f"{path}local_sid: {describe_sid(s)} exists with different content "
                f"({_fmt_sid(old, st)}); use UpdateLocalSid",
            )
        return Plan(
            [(R.RTM_NEWROUTE, ADD, R.encode_local_sid(s))],
            lambda: st.sids.__setitem__(s.key, s),
            lambda: pb.CreateLocalSidResponse(local_sid=sid_to_msg(st, s), changed=True),
            True,
            lambda: f"CreateLocalSid {_fmt_sid(s, st)}: created",
            f"{path}local_sid",
            s.key,
            retry=decide,
        )

    return decide()


def plan_update_sid(st: Srv6State, req: pb.UpdateLocalSidRequest, path: str = "", pre=None) -> Plan:
    s = pre or sid_from_msg(st, req.local_sid, f"{path}local_sid")

    def decide() -> Plan:
        old = st.sids.get(s.key)
        if old is None:
            raise ApiError(grpc.StatusCode.NOT_FOUND, f"{path}local_sid: {describe_sid(s)}: no such local SID")
        resp = lambda ch: (  # noqa: E731
            lambda: pb.UpdateLocalSidResponse(
                local_sid=sid_to_msg(st, s),
                previous=sid_to_msg(st, old),
                changed=ch,
            )
        )
        if old == s:
            return Plan(
                [],
                lambda: None,
                resp(False),
                False,
                lambda: f"UpdateLocalSid {_fmt_sid(s, st)}: unchanged",
                "local_sid",
                s.key,
            )
        return Plan(
            [(R.RTM_NEWROUTE, R.NLM_F_REPLACE, R.encode_local_sid(s))],
            lambda: st.sids.__setitem__(s.key, s),
            resp(True),
            True,
            lambda: f"UpdateLocalSid {_fmt_sid(s, st)}: replaced (was {_fmt_sid(old, st)})",
            f"{path}local_sid",
            s.key,
            retry=decide,
        )

    return decide()


def plan_remove_sid(st: Srv6State, req: pb.RemoveLocalSidRequest, path: str = "", pre=None) -> Plan:
    key = pre or sid_key_from(path, req.sid, req.table)

    def decide() -> Plan:
        old = st.sids.get(key)
        if old is None:
            if req.allow_missing:
                return Plan(
                    [],
                    lambda: None,
                    lambda: pb.RemoveLocalSidResponse(changed=False),
                    False,
                    lambda: f"RemoveLocalSid {key[0]} table {key[1]}: absent, allow_missing",
                    "local_sid",
                    key,
                )
            raise ApiError(
                grpc.StatusCode.NOT_FOUND, f"{path}sid: local SID {key[0]} table {key[1]}: no such local SID"
            )
        return Plan(
            [(R.RTM_DELROUTE, 0, R.encode_delete(route_prefix(old.sid), old.table, old.metric))],
            lambda: st.sids.pop(key, None),
            lambda: pb.RemoveLocalSidResponse(changed=True),
            True,
            lambda: f"RemoveLocalSid {_fmt_sid(old, st)}: removed",
            f"{path}sid",
            key,
            retry=decide,
        )

    return decide()


PLANNERS = {
    "create_policy": plan_create_policy,
    "update_policy": plan_update_policy,
    "remove_policy": plan_remove_policy,
    "create_local_sid": plan_create_sid,
    "update_local_sid": plan_update_sid,
    "remove_local_sid": plan_remove_sid,
}
STALE = (errno.EEXIST, errno.ENOENT, errno.ESRCH)
# seg6 routes allocate a per-CPU dst cache with GFP_ATOMIC: a burst of route changes can drain the
# kernel's atomic per-CPU pool, which is refilled by a work item; measured here as sporadic
# ENOMEM during bulk creates/replaces. Such an operation is retried after a short sleep.
TRANSIENT = (errno.ENOMEM, errno.ENOBUFS)
TRANSIENT_RETRIES_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
transient_retries = 0  # total, for logs/benchmarks


def kernel_error(plan: Plan, e: R.NetlinkError) -> ApiError:
    hint = ""
    if e.errno == errno.EINVAL and plan.what.endswith("local_sid"):
        hint = (
            " (End.DT4/End.DT46 need a VRF device in strict mode, net.vrf.strict_mode=1, "
            "bound to lookup_table; End.X/End.DX* need a reachable next hop)"
        )
    code = grpc.StatusCode.INTERNAL if e.errno in (errno.ENOBUFS, errno.ENOMEM) else grpc.StatusCode.FAILED_PRECONDITION
    return ApiError(code, f"{plan.what}: the kernel refused it: {e.text}{hint}")


def _send(st: Srv6State, plan: Plan) -> R.NetlinkError | None:
    """Send a plan's messages one after the other (an update that changes the metric adds the new
    route before deleting the old one: the delete must not run if the add failed); retry
    transient kernel allocation failures (TRANSIENT) a few times."""
    global transient_retries
    while plan.msgs:
        for pause in (*TRANSIENT_RETRIES_S, None):
            err = st.rtnl.batch(plan.msgs[:1])[0]
            if err is None:
                break
            if err.errno not in TRANSIENT or pause is None:
                return err
            transient_retries += 1
            time.sleep(pause)
        plan.msgs = plan.msgs[1:]
    return None


def execute(st: Srv6State, plan: Plan) -> Plan:
    """Send a plan; on a stale index (EEXIST/ENOENT/ESRCH) re-read the table and decide again once."""
    for attempt in (0, 1):
        if not plan.msgs:
            return plan
        err = _send(st, plan)  # consumes plan.msgs
        if err is None:
            plan.commit()
            return plan
        if err.errno in STALE and attempt == 0 and plan.retry is not None:
            log.info("%s: kernel said %s, re-reading table %d", plan.log_line().split(':')[0], err.text, plan.key[1])
            st.resync(plan.key[1])
            plan = plan.retry()
            continue
        raise kernel_error(plan, err)
    return plan


class Srv6Servicer(pb_grpc.Srv6ServiceServicer):
    def __init__(self, state: Srv6State):
        self.st = state

    def _run(self, planner, req):
        with self.st.lock:
            plan = execute(self.st, planner(self.st, req))
        log.info("%s", plan.log_line())
        if plan.changed:
            self.st.changed()
        return plan.response()

    # policies
    def CreatePolicy(self, req, ctx):
        return self._run(plan_create_policy, req)

    def UpdatePolicy(self, req, ctx):
        return self._run(plan_update_policy, req)

    def RemovePolicy(self, req, ctx):
        return self._run(plan_remove_policy, req)

    def GetPolicy(self, req, ctx):
        key = key_from("", req.destination, req.table)
        self.st.resync(key[1])
        p = self.st.policies.get(key)
        if p is None:
            raise ApiError(grpc.StatusCode.NOT_FOUND, f"destination: policy {key[0]} table {key[1]}: no such policy")
        log.info("GetPolicy %s table %d: found", key[0], key[1])
        return pb.GetPolicyResponse(policy=policy_to_msg(self.st, p))

    def ListPolicies(self, req, ctx):
        table = F.table("table", req.table) if req.HasField("table") else None
        self.st.resync(table)
        with self.st.lock:
            ps = sorted(self.st.policies.values(), key=lambda p: (p.table, p.destination))
        out = [policy_to_msg(self.st, p) for p in ps if table is None or p.table == table]
        log.info("ListPolicies table %s: %d policies", "all" if table is None else table, len(out))
        return pb.ListPoliciesResponse(policies=out)

    # local SIDs
    def CreateLocalSid(self, req, ctx):
        return self._run(plan_create_sid, req)

    def UpdateLocalSid(self, req, ctx):
        return self._run(plan_update_sid, req)

    def RemoveLocalSid(self, req, ctx):
        return self._run(plan_remove_sid, req)

    def GetLocalSid(self, req, ctx):
        key = sid_key_from("", req.sid, req.table)
        self.st.resync(key[1])
        s = self.st.sids.get(key)
        if s is None:
            raise ApiError(grpc.StatusCode.NOT_FOUND, f"sid: local SID {key[0]} table {key[1]}: no such local SID")
        log.info("GetLocalSid %s table %d: found", key[0], key[1])
        return pb.GetLocalSidResponse(state=sid_state(self.st, s))

    def ListLocalSids(self, req, ctx):
        table = F.table("table", req.table) if req.HasField("table") else None
        self.st.resync(table)
        with self.st.lock:
            ss = sorted(self.st.sids.values(), key=lambda s: (s.table, s.sid))
        out = [sid_state(self.st, s) for s in ss if table is None or s.table == table]
        log.info("ListLocalSids table %s: %d local SIDs", "all" if table is None else table, len(out))
        return pb.ListLocalSidsResponse(local_sids=out)

    # batch
    def ApplyBatch(self, req, ctx):
        n = len(req.operations)
        if n == 0 or n > 10000:
            raise F.invalid("operations", f"{n} operations, expected 1..10000")
        ops = []
        for i, op in enumerate(req.operations):  # validate everything before changing anything
            kind = op.WhichOneof("op")
            if kind is None:
                raise F.invalid(
                    f"operations[{i}]",
                    "empty (set one of create_policy, update_policy, "
                    "remove_policy, create_local_sid, update_local_sid, remove_local_sid)",
                )
            sub, path = getattr(op, kind), f"operations[{i}].{kind}."
            ops.append((kind, sub, path, F_check_only(self.st, kind, sub, path)))
        results = [pb.Srv6OperationResult() for _ in ops]
        with self.st.lock:
            if req.stop_on_error:
                self._batch_sequential(ops, results)
            else:
                self._batch_pipelined(ops, results)
        applied = sum(1 for r in results if r.code == 0)
        log.info(
            "ApplyBatch: %d operations, %d ok, %d failed, %d changed",
            n,
            applied,
            n - applied,
            sum(1 for r in results if r.changed),
        )
        if any(r.changed for r in results):
            self.st.changed()
        return pb.ApplyBatchResponse(results=results, applied=applied, failed=n - applied)

    def StreamOperations(self, request_iterator, ctx):
        for op in request_iterator:
            kind = op.WhichOneof("op")
            res = pb.Srv6OperationResult()
            try:
                if kind is None:
                    raise F.invalid(
                        "op",
                        "empty (set one of create_policy, update_policy, remove_policy, "
                        "create_local_sid, update_local_sid, remove_local_sid)",
                    )
                with self.st.lock:
                    plan = execute(self.st, PLANNERS[kind](self.st, getattr(op, kind), f"{kind}."))
                res.changed = plan.changed
                log.info("StreamOperations: %s", plan.log_line())
                if plan.changed:
                    self.st.changed()
            except ApiError as e:
                log.info("StreamOperations %s -> %s: %s", kind, e.code.name, e.message)
                res.code, res.message = e.code.value[0], e.message
            yield res

    def _batch_sequential(self, ops, results) -> None:
        for i, (kind, sub, path, pre) in enumerate(ops):
            try:
                plan = execute(self.st, PLANNERS[kind](self.st, sub, path, pre))
                results[i].changed = plan.changed
            except ApiError as e:
                results[i].code, results[i].message = e.code.value[0], e.message
                for j in range(i + 1, len(ops)):
                    results[j].code = grpc.StatusCode.ABORTED.value[0]
                    results[j].message = f"operations[{j}]: not run, operations[{i}] failed (stop_on_error)"
                return

    def _batch_pipelined(self, ops, results) -> None:
        """Plan every operation against the index (as if the previous ones succeeded), send the
        netlink messages of consecutive single-message operations at once (Rtnl.batch: 256 per
        sendmsg), then read one ack each. An operation with two messages (an update that changes
        the metric) runs on its own, in order. Operations the kernel found stale or that hit a
        transient allocation failure are re-read and re-run one by one at the end."""
        pending: list[tuple[int, Plan]] = []
        redo: list[int] = []

        def flush() -> None:
            global transient_retries
            todo = list(pending)
            pending.clear()
            for pause in (*TRANSIENT_RETRIES_S, None):
                if not todo:
                    return
                errs = self.st.rtnl.batch([p.msgs[0] for _, p in todo])
                again = []
                for (i, plan), err in zip(todo, errs):
                    if err is None:
                        results[i].changed = plan.changed
                        if log.isEnabledFor(logging.DEBUG):
                            log.debug("ApplyBatch: %s", plan.log_line())
                    elif err.errno in TRANSIENT and pause is not None:
                        again.append((i, plan))  # nothing was applied: send it again
                    elif err.errno in STALE or err.errno in TRANSIENT:
                        redo.append(i)
                    else:
                        e = kernel_error(plan, err)
                        results[i].code, results[i].message = e.code.value[0], e.message
                if again:
                    transient_retries += len(again)
                    time.sleep(pause)
                todo = again

        for i, (kind, sub, path, pre) in enumerate(ops):
            try:
                plan = PLANNERS[kind](self.st, sub, path, pre)
                if len(plan.msgs) > 1 or plan.extra.get("after_the_kernel"):
                    flush()
                    plan = execute(self.st, plan)
                    results[i].changed = plan.changed
                    continue
            except ApiError as e:
                results[i].code, results[i].message = e.code.value[0], e.message
                continue
            if plan.msgs:
                pending.append((i, plan))
            else:  # nothing to send: unchanged, or done already (a steer the route program applied)
                results[i].changed = plan.changed
            plan.commit()  # optimistic: later operations see this one's effect; re-read below on failure
            if len(pending) >= 4096:
                flush()
        flush()
        if any(r.code != 0 for r in results) or redo:
            self.st.resync(None)  # the optimistic index may be wrong where something failed
        for i in sorted(redo):
            kind, sub, path, pre = ops[i]
            try:
                plan = execute(self.st, PLANNERS[kind](self.st, sub, path, pre))
                results[i].changed = plan.changed
            except ApiError as e:
                results[i].code, results[i].message = e.code.value[0], e.message


def F_check_only(st: Srv6State, kind: str, sub, path: str) -> None:
    """Field validation of one batch operation without deciding anything (no index access)."""
    if kind in ("create_policy", "update_policy"):
        return policy_from_msg(st, sub.policy, f"{path}policy")
    if kind == "remove_policy":
        return key_from(path, sub.destination, sub.table)
    if kind in ("create_local_sid", "update_local_sid"):
        return sid_from_msg(st, sub.local_sid, f"{path}local_sid")
    return sid_key_from(path, sub.sid, sub.table)
