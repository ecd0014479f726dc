"""Srv6Service end to end against node A of the agt lab: every RPC with good and bad input; what
the agent installs is read back independently with iproute2 (`ip -6 route`) and pyroute2."""

from __future__ import annotations

import grpc
import pytest

from segscope_proto.segscope.agent.v1 import srv6_pb2 as pb
from tests.agent.conftest import expect_error, ip

IA, NF, AE, FP = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION,
)


def policy(dest="fd00:70::/64", segs=("fc00:2::e", "fc00:3::d6"), **kw) -> pb.Policy:
    return pb.Policy(
        destination=dest,
        mode=kw.pop("mode", pb.ENCAP_MODE_ENCAP),
        segments=list(segs),
        device=kw.pop("device", "a0"),
        **kw,
    )


def sid(s="fc00:1::70", action=pb.LOCAL_SID_ACTION_END, **kw) -> pb.LocalSid:
    return pb.LocalSid(sid=s, action=action, device=kw.pop("device", "a0"), **kw)


def route_line(lab, node: str, dst: str, table: str = "main", family: str = "-6") -> str:
    out = ip(lab, node, family, "route", "show", "table", table)
    lines = [l for l in out.splitlines() if l.split()[0] == dst]
    return lines[0] if lines else ""


@pytest.fixture
def a(stubs, lab):
    s = stubs["A"].srv6
    yield s
    # leave A as netlab made it: remove whatever these tests created (fd00:7x / fc00:1::7x)
    for p in s.ListPolicies(pb.ListPoliciesRequest()).policies:
        if p.destination.startswith(("fd00:7", "10.70.")):
            s.RemovePolicy(pb.RemovePolicyRequest(destination=p.destination, table=p.table))
    for st in s.ListLocalSids(pb.ListLocalSidsRequest()).local_sids:
        if st.local_sid.sid.startswith("fc00:1::7"):
            s.RemoveLocalSid(pb.RemoveLocalSidRequest(sid=st.local_sid.sid, table=st.local_sid.table))


def test_lists_show_what_netlab_installed(stubs):
    s = stubs["A"].srv6
    ps = {p.destination: p for p in s.ListPolicies(pb.ListPoliciesRequest()).policies}
    assert ps["fd00:b::/64"].segments == ["fc00:2::e", "fc00:3::d6"]
    assert ps["fd00:b::/64"].mode == pb.ENCAP_MODE_ENCAP and ps["fd00:b::/64"].device == "a0"
    assert ps["fd00:b::/64"].table == 254 and ps["fd00:b::/64"].metric == 1024
    r = {x.local_sid.sid: x for x in stubs["R"].srv6.ListLocalSids(pb.ListLocalSidsRequest()).local_sids}
    assert r["fc00:2::e"].local_sid.action == pb.LOCAL_SID_ACTION_END and r["fc00:2::e"].local_sid.count
    assert r["fc00:2::e2"].local_sid.device == "r1" and r["fc00:2::e2"].HasField("counters")
    b = stubs["B"].srv6.GetLocalSid(pb.GetLocalSidRequest(sid="fc00:3::d6")).state.local_sid
    assert b.action == pb.LOCAL_SID_ACTION_END_DT6 and b.lookup_table == 254
    # a table filter
    assert not s.ListPolicies(pb.ListPoliciesRequest(table=77)).policies


def test_policy_lifecycle_and_idempotency(a, lab):
    r = a.CreatePolicy(pb.CreatePolicyRequest(policy=policy()))
    assert r.changed and r.policy.table == 254 and r.policy.metric == 1024
    assert route_line(lab, "A", "fd00:70::/64").startswith(
        "fd00:70::/64  encap seg6 mode encap segs 2 [ fc00:2::e fc00:3::d6 ] dev a0"
    )
    # identical create: OK, nothing changes; different content: ALREADY_EXISTS naming the policy
    assert not a.CreatePolicy(pb.CreatePolicyRequest(policy=policy())).changed
    msg = expect_error(a.CreatePolicy, pb.CreatePolicyRequest(policy=policy(segs=["fc00:2::e2"])), AE, "policy:")
    assert "fd00:70::/64" in msg and "UpdatePolicy" in msg
    got = a.GetPolicy(pb.GetPolicyRequest(destination="fd00:70::/64")).policy
    assert list(got.segments) == ["fc00:2::e", "fc00:3::d6"]
    # update: previous + new, kernel agrees
    u = a.UpdatePolicy(pb.UpdatePolicyRequest(policy=policy(segs=["fc00:2::e2", "fc00:3::d6"])))
    assert u.changed and list(u.previous.segments) == ["fc00:2::e", "fc00:3::d6"]
    assert "[ fc00:2::e2 fc00:3::d6 ]" in route_line(lab, "A", "fd00:70::/64")
    assert not a.UpdatePolicy(pb.UpdatePolicyRequest(policy=policy(segs=["fc00:2::e2", "fc00:3::d6"]))).changed
    # a new metric: added first, old one deleted; exactly one route remains
    u = a.UpdatePolicy(pb.UpdatePolicyRequest(policy=policy(segs=["fc00:2::e2", "fc00:3::d6"], metric=500)))
    assert u.changed and u.policy.metric == 500
    lines = [l for l in ip(lab, "A", "-6", "route").splitlines() if l.startswith("fd00:70::/64")]
    assert len(lines) == 1 and "metric 500" in lines[0]
    # remove, then absent: NOT_FOUND, or OK with allow_missing
    assert a.RemovePolicy(pb.RemovePolicyRequest(destination="fd00:70::/64")).changed
    assert route_line(lab, "A", "fd00:70::/64") == ""
    expect_error(a.RemovePolicy, pb.RemovePolicyRequest(destination="fd00:70::/64"), NF, "destination:")
    assert not a.RemovePolicy(pb.RemovePolicyRequest(destination="fd00:70::/64", allow_missing=True)).changed
    expect_error(a.GetPolicy, pb.GetPolicyRequest(destination="fd00:70::/64"), NF, "destination:")
    expect_error(a.UpdatePolicy, pb.UpdatePolicyRequest(policy=policy()), NF, "policy:")


def test_policy_modes_tables_and_ipv4(a, lab):
    a.CreatePolicy(pb.CreatePolicyRequest(policy=policy("fd00:71::/64", mode=pb.ENCAP_MODE_INLINE)))
    assert "encap seg6 mode inline segs 3 [ fc00:2::e fc00:3::d6 :: ]" in route_line(lab, "A", "fd00:71::/64")
    a.CreatePolicy(pb.CreatePolicyRequest(policy=policy("fd00:72::/64", mode=pb.ENCAP_MODE_ENCAP_RED)))
    assert "mode encap.red segs 2 [ fc00:2::e fc00:3::d6 ]" in route_line(lab, "A", "fd00:72::/64")
    a.CreatePolicy(pb.CreatePolicyRequest(policy=policy("fd00:73::/64", table=100)))
    assert "segs 2 [ fc00:2::e fc00:3::d6 ]" in route_line(lab, "A", "fd00:73::/64", table="100")
    assert route_line(lab, "A", "fd00:73::/64") == ""  # not in main
    a.CreatePolicy(pb.CreatePolicyRequest(policy=policy("10.70.0.0/24")))
    assert "encap seg6 mode encap segs 2 [ fc00:2::e fc00:3::d6 ]" in route_line(lab, "A", "10.70.0.0/24", family="-4")
    got = {p.destination: p for p in a.ListPolicies(pb.ListPoliciesRequest()).policies}
    assert got["fd00:71::/64"].mode == pb.ENCAP_MODE_INLINE
    assert list(got["fd00:71::/64"].segments) == ["fc00:2::e", "fc00:3::d6"]
    assert got["fd00:72::/64"].mode == pb.ENCAP_MODE_ENCAP_RED and got["fd00:73::/64"].table == 100
    assert got["10.70.0.0/24"].metric == 0
    assert [p.destination for p in a.ListPolicies(pb.ListPoliciesRequest(table=100)).policies] == ["fd00:73::/64"]
    # pyroute2 (independent decoder) sees the inline policy's SRH with the reserved :: slot
    from pyroute2 import NetNS

    with NetNS(lab.ns("A")) as ns:
        r = [x for x in ns.route("dump", family=10, table=254) if x.get_attr("RTA_DST") == "fd00:71::"][0]
        srh = r.get_attr("RTA_ENCAP").get_attr("SEG6_IPTUNNEL_SRH")
        assert srh["mode"] == "inline" and srh["segs"] == ["::", "fc00:3::d6", "fc00:2::e"]


BAD_POLICIES = [
    (dict(destination=""), "policy.destination: required"),
    (dict(destination="fd00::zz/64"), "policy.destination: 'fd00::zz/64' is not"),
    (dict(destination="fd00:70::/129"), "policy.destination: 'fd00:70::/129': prefix length"),
    (dict(destination="fd00:70::1/64"), "policy.destination: 'fd00:70::1/64' has host bits set"),
    (dict(segs=[]), "policy.segments: required"),
    (dict(segs=["fc00:2::e", "fc00::zz"]), "policy.segments[1]: 'fc00::zz' is not an IPv6 address"),
    (dict(segs=["ff02::1"]), "policy.segments[0]: 'ff02::1' is a multicast address"),
    (dict(segs=["::"]), "policy.segments[0]: '::' is the unspecified address"),
    (dict(segs=["10.0.0.1"]), "policy.segments[0]: '10.0.0.1' is not an IPv6 address"),
    (dict(segs=["fc00::1"] * 17), "policy.segments: 17 SIDs, at most 16"),
    (dict(mode=pb.ENCAP_MODE_UNSPECIFIED), "policy.mode: required"),
    (dict(mode=42), "policy.mode: 42 is not a EncapMode value"),
    (dict(device=""), "policy.device: required"),
    (dict(device="a" * 16), "policy.device: 'aaaaaaaaaaaaaaaa' is not a device name"),
    (dict(destination="10.70.0.0/24", mode=pb.ENCAP_MODE_INLINE), "policy.mode: ENCAP_MODE_INLINE needs an IPv6"),
    (dict(table=0xFFFFFFFF), "policy.table: 4294967295 is not a routing table id"),
]


@pytest.mark.parametrize(
    "kw,msg", BAD_POLICIES, ids=[m.split(":")[0] + "-" + str(i) for i, (_, m) in enumerate(BAD_POLICIES)]
)
def test_policy_bad_input_names_the_field(a, lab, kw, msg):
    kw = dict(kw)
    p = policy(kw.pop("destination", "fd00:70::/64"), kw.pop("segs", ("fc00:2::e",)), **kw)
    for rpc, req in (
        (a.CreatePolicy, pb.CreatePolicyRequest(policy=p)),
        (a.UpdatePolicy, pb.UpdatePolicyRequest(policy=p)),
    ):
        got = expect_error(rpc, req, IA, msg.split(":")[0] + ":")
        assert got.startswith(msg), got
    assert route_line(lab, "A", "fd00:70::/64") == ""


def test_policy_unknown_device_and_bad_keys(a):
    msg = expect_error(a.CreatePolicy, pb.CreatePolicyRequest(policy=policy(device="nope0")), FP, "policy.device:")
    assert "no device 'nope0' on node A" in msg
    expect_error(a.GetPolicy, pb.GetPolicyRequest(destination="x"), IA, "destination:")
    expect_error(a.RemovePolicy, pb.RemovePolicyRequest(destination=""), IA, "destination: required")
    expect_error(a.GetPolicy, pb.GetPolicyRequest(destination="fd00:b::/64", table=0xFFFFFFFF), IA, "table:")
    expect_error(a.ListPolicies, pb.ListPoliciesRequest(table=0xFFFFFFFF), IA, "table:")


LOCAL_SIDS = [  # (LocalSid kwargs, expected iproute2 text)
    (dict(action=pb.LOCAL_SID_ACTION_END, count=True), "action End dev a0"),
    (dict(action=pb.LOCAL_SID_ACTION_END_X, nh6="fc00:12::2"), "action End.X nh6 fc00:12::2 dev a0"),
    (dict(action=pb.LOCAL_SID_ACTION_END_T, lookup_table=100), "action End.T table 100 dev a0"),
    (dict(action=pb.LOCAL_SID_ACTION_END_DX6, nh6="fd00:a::1"), "action End.DX6 nh6 fd00:a::1 dev a0"),
    (dict(action=pb.LOCAL_SID_ACTION_END_DX4, nh4="10.0.0.1"), "action End.DX4 nh4 10.0.0.1 dev a0"),
    (dict(action=pb.LOCAL_SID_ACTION_END_DT6, lookup_table=254), "action End.DT6 table main dev a0"),
    (
        dict(action=pb.LOCAL_SID_ACTION_END_B6, segments=["fc00:2::e", "fc00:3::d6"]),
        "action End.B6 segs 3 [ fc00:2::e fc00:3::d6 :: ] dev a0",
    ),
    (
        dict(action=pb.LOCAL_SID_ACTION_END_B6_ENCAPS, segments=["fc00:2::e"]),
        "action End.B6.Encaps segs 1 [ fc00:2::e ] dev a0",
    ),
]


@pytest.mark.parametrize("kw,text", LOCAL_SIDS, ids=[t.split()[1] for _, t in LOCAL_SIDS])
def test_local_sid_actions(a, lab, kw, text):
    m = sid("fc00:1::71", **kw)
    r = a.CreateLocalSid(pb.CreateLocalSidRequest(local_sid=m))
    assert r.changed and r.local_sid.table == 254
    line = route_line(lab, "A", "fc00:1::71")
    assert f"encap seg6local {text}" in line, line
    st = a.GetLocalSid(pb.GetLocalSidRequest(sid="fc00:1::71")).state
    m.table = 254
    assert st.local_sid == m
    assert st.HasField("counters") == bool(kw.get("count"))
    assert not a.CreateLocalSid(pb.CreateLocalSidRequest(local_sid=m)).changed
    assert a.RemoveLocalSid(pb.RemoveLocalSidRequest(sid="fc00:1::71")).changed
    assert route_line(lab, "A", "fc00:1::71") == ""


def test_local_sid_update_remove_and_errors(a, lab):
    a.CreateLocalSid(pb.CreateLocalSidRequest(local_sid=sid("fc00:1::72")))
    expect_error(a.CreateLocalSid, pb.CreateLocalSidRequest(local_sid=sid("fc00:1::72", count=True)), AE, "local_sid:")
    u = a.UpdateLocalSid(
        pb.UpdateLocalSidRequest(local_sid=sid("fc00:1::72", pb.LOCAL_SID_ACTION_END_DT6, lookup_table=254))
    )
    assert u.changed and u.previous.action == pb.LOCAL_SID_ACTION_END
    assert "action End.DT6 table main" in route_line(lab, "A", "fc00:1::72")
    assert a.ListLocalSids(pb.ListLocalSidsRequest(table=254)).local_sids
    assert a.RemoveLocalSid(pb.RemoveLocalSidRequest(sid="fc00:1::72")).changed
    expect_error(a.RemoveLocalSid, pb.RemoveLocalSidRequest(sid="fc00:1::72"), NF, "sid:")
    assert not a.RemoveLocalSid(pb.RemoveLocalSidRequest(sid="fc00:1::72", allow_missing=True)).changed
    expect_error(a.GetLocalSid, pb.GetLocalSidRequest(sid="fc00:1::72"), NF, "sid:")
    expect_error(a.UpdateLocalSid, pb.UpdateLocalSidRequest(local_sid=sid("fc00:1::72")), NF, "local_sid:")
    # End.DT4 needs a VRF in strict mode: this kernel has no VRF module -> the kernel's refusal
    msg = expect_error(
        a.CreateLocalSid,
        pb.CreateLocalSidRequest(local_sid=sid("fc00:1::73", pb.LOCAL_SID_ACTION_END_DT4, lookup_table=100)),
        FP,
        "local_sid:",
    )
    assert "kernel refused" in msg and "VRF" in msg
    assert route_line(lab, "A", "fc00:1::73") == ""


BAD_SIDS = [
    (dict(sid=""), "local_sid.sid: required"),
    (dict(sid="fc00:1::zz"), "local_sid.sid: 'fc00:1::zz' is not an IPv6 address"),
    (dict(action=pb.LOCAL_SID_ACTION_UNSPECIFIED), "local_sid.action: required"),
    (dict(action=pb.LOCAL_SID_ACTION_END_X), "local_sid.nh6: required with LOCAL_SID_ACTION_END_X"),
    (dict(action=pb.LOCAL_SID_ACTION_END_X, nh6="fe80::zz"), "local_sid.nh6: 'fe80::zz' is not an IPv6"),
    (dict(action=pb.LOCAL_SID_ACTION_END_DX4, nh4="10.0.0.300"), "local_sid.nh4: '10.0.0.300' is not an IPv4"),
    (dict(action=pb.LOCAL_SID_ACTION_END_DT6), "local_sid.lookup_table: required with LOCAL_SID_ACTION_END_DT6"),
    (
        dict(action=pb.LOCAL_SID_ACTION_END, lookup_table=5),
        "local_sid.lookup_table: not allowed with LOCAL_SID_ACTION_END",
    ),
    (dict(action=pb.LOCAL_SID_ACTION_END, nh6="fc00::1"), "local_sid.nh6: not allowed with LOCAL_SID_ACTION_END"),
    (
        dict(action=pb.LOCAL_SID_ACTION_END_DT6, lookup_table=254, segments=["fc00::1"]),
        "local_sid.segments: not allowed with LOCAL_SID_ACTION_END_DT6",
    ),
    (dict(action=pb.LOCAL_SID_ACTION_END_B6), "local_sid.segments: required with LOCAL_SID_ACTION_END_B6"),
    (dict(action=pb.LOCAL_SID_ACTION_END_B6, segments=["fc00::1", "x"]), "local_sid.segments[1]: 'x' is not"),
    (dict(device=""), "local_sid.device: required"),
]


@pytest.mark.parametrize("kw,msg", BAD_SIDS, ids=[m.split(":")[0] + "-" + str(i) for i, (_, m) in enumerate(BAD_SIDS)])
def test_local_sid_bad_input_names_the_field(a, kw, msg):
    kw = dict(kw)
    m = sid(kw.pop("sid", "fc00:1::74"), kw.pop("action", pb.LOCAL_SID_ACTION_END), **kw)
    for rpc, req in (
        (a.CreateLocalSid, pb.CreateLocalSidRequest(local_sid=m)),
        (a.UpdateLocalSid, pb.UpdateLocalSidRequest(local_sid=m)),
    ):
        got = expect_error(rpc, req, IA, msg.split(":")[0] + ":")
        assert got.startswith(msg), got


def op_create(i: int) -> pb.Srv6Operation:
    return pb.Srv6Operation(create_policy=pb.CreatePolicyRequest(policy=policy(f"fd00:74:{i:x}::/64")))


def test_apply_batch(a, lab):
    ops = [op_create(i) for i in range(300)] + [
        pb.Srv6Operation(create_local_sid=pb.CreateLocalSidRequest(local_sid=sid("fc00:1::75"))),
        pb.Srv6Operation(update_policy=pb.UpdatePolicyRequest(policy=policy("fd00:74:0::/64", segs=["fc00:2::e2"]))),
        pb.Srv6Operation(remove_policy=pb.RemovePolicyRequest(destination="fd00:74:1::/64")),
    ]
    r = a.ApplyBatch(pb.ApplyBatchRequest(operations=ops))
    assert (r.applied, r.failed) == (303, 0) and all(x.changed for x in r.results)
    routes = ip(lab, "A", "-6", "route")
    assert sum(1 for l in routes.splitlines() if l.startswith("fd00:74:")) == 299
    assert "segs 1 [ fc00:2::e2 ]" in route_line(lab, "A", "fd00:74::/64")
    assert route_line(lab, "A", "fc00:1::75")
    # again: every create is an identical repeat (OK, unchanged); update of an absent policy fails alone
    again = [op_create(i) for i in range(2, 300)] + [
        pb.Srv6Operation(update_policy=pb.UpdatePolicyRequest(policy=policy("fd00:74:1::/64"))),
        pb.Srv6Operation(create_policy=pb.CreatePolicyRequest(policy=policy("fd00:74:2::/64", segs=["fc00:2::e2"]))),
    ]
    r = a.ApplyBatch(pb.ApplyBatchRequest(operations=again))
    assert r.applied == 298 and r.failed == 2 and not any(x.changed for x in r.results)
    assert r.results[298].code == grpc.StatusCode.NOT_FOUND.value[0]
    assert r.results[298].message.startswith("operations[298].update_policy.policy:")
    assert r.results[299].code == grpc.StatusCode.ALREADY_EXISTS.value[0]
    # stop_on_error: the rest is ABORTED and not applied
    r = a.ApplyBatch(
        pb.ApplyBatchRequest(
            stop_on_error=True,
            operations=[
                pb.Srv6Operation(remove_policy=pb.RemovePolicyRequest(destination="fd00:74:1::/64")),
                op_create(1000),
            ],
        )
    )
    assert [x.code for x in r.results] == [grpc.StatusCode.NOT_FOUND.value[0], grpc.StatusCode.ABORTED.value[0]]
    assert route_line(lab, "A", "fd00:74:3e8::/64") == ""
    # one invalid operation: INVALID_ARGUMENT naming it, nothing applied
    bad = [op_create(i) for i in range(500, 510)] + [
        pb.Srv6Operation(
            create_policy=pb.CreatePolicyRequest(policy=policy("fd00:74:ffff::/64", segs=["fc00::1", "nope"]))
        )
    ]
    expect_error(
        a.ApplyBatch,
        pb.ApplyBatchRequest(operations=bad),
        IA,
        "operations[10].create_policy.policy.segments[1]: 'nope' is not an IPv6 address",
    )
    assert route_line(lab, "A", "fd00:74:1f4::/64") == ""
    expect_error(a.ApplyBatch, pb.ApplyBatchRequest(operations=[]), IA, "operations:")
    expect_error(a.ApplyBatch, pb.ApplyBatchRequest(operations=[pb.Srv6Operation()]), IA, "operations[0]:")
    # cleanup in one batch
    rm = [
        pb.Srv6Operation(remove_policy=pb.RemovePolicyRequest(destination=f"fd00:74:{i:x}::/64", allow_missing=True))
        for i in range(300)
    ]
    assert a.ApplyBatch(pb.ApplyBatchRequest(operations=rm)).applied == 300
    assert not any(l.startswith("fd00:74:") for l in ip(lab, "A", "-6", "route").splitlines())


def test_stream_operations(a, lab):
    ops = [op_create(i) for i in range(50)] + [
        pb.Srv6Operation(create_policy=pb.CreatePolicyRequest(policy=policy("fd00:74:99::/64", segs=["x"]))),
        pb.Srv6Operation(),
        op_create(0),
    ]
    res = list(a.StreamOperations(iter(ops), timeout=30))
    assert len(res) == 53
    assert all(r.code == 0 and r.changed for r in res[:50])
    assert res[50].code == IA.value[0] and res[50].message.startswith("create_policy.policy.segments[0]: 'x'")
    assert res[51].code == IA.value[0] and res[51].message.startswith("op: empty")
    assert res[52].code == 0 and not res[52].changed
    assert sum(1 for l in ip(lab, "A", "-6", "route").splitlines() if l.startswith("fd00:74:")) == 50
    rm = [pb.Srv6Operation(remove_policy=pb.RemovePolicyRequest(destination=f"fd00:74:{i:x}::/64")) for i in range(50)]
    assert all(r.changed for r in a.StreamOperations(iter(rm), timeout=30))


def test_external_change_is_noticed(a, lab):
    """A route changed behind the agent's back: the kernel's answer makes the agent re-read it."""
    a.CreatePolicy(pb.CreatePolicyRequest(policy=policy("fd00:76::/64")))
    lab.run("A", ["ip", "-6", "route", "del", "fd00:76::/64"], check=True)
    expect_error(a.RemovePolicy, pb.RemovePolicyRequest(destination="fd00:76::/64"), NF, "destination:")
    lab.run(
        "A",
        [
            "ip",
            "-6",
            "route",
            "add",
            "fd00:76::/64",
            "encap",
            "seg6",
            "mode",
            "encap",
            "segs",
            "fc00:2::e2",
            "dev",
            "a0",
        ],
        check=True,
    )
    expect_error(a.CreatePolicy, pb.CreatePolicyRequest(policy=policy("fd00:76::/64")), AE, "policy:")
    got = a.GetPolicy(pb.GetPolicyRequest(destination="fd00:76::/64")).policy
    assert list(got.segments) == ["fc00:2::e2"]
