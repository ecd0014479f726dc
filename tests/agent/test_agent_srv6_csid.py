"""Local SIDs with flavours (RFC 9800 NEXT-C-SID, RFC 8986 PSP/USP/USD) through Srv6Service on
node A of the agt lab: what the agent installs is read back with iproute2; what this kernel lacks
is refused with the kernel's own words; bad lengths and prefixes name the field."""

from __future__ import annotations

import grpc
import pytest

from segscope_proto.segscope.agent.v1 import srv6_pb2 as pb
from tests.agent.conftest import expect_error, ip

IA, FP = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION
NEXT_CSID, PSP, USP, USD = (
    pb.LOCAL_SID_FLAVOR_NEXT_CSID,
    pb.LOCAL_SID_FLAVOR_PSP,
    pb.LOCAL_SID_FLAVOR_USP,
    pb.LOCAL_SID_FLAVOR_USD,
)


def sid(s: str, action=pb.LOCAL_SID_ACTION_END, **kw) -> pb.LocalSid:
    return pb.LocalSid(sid=s, action=action, device=kw.pop("device", "a0"), **kw)


def route_line(lab, dst: str) -> str:
    out = ip(lab, "A", "-6", "route", "show", "table", "main")
    return next((line for line in out.splitlines() if line.split()[0] == dst), "")


@pytest.fixture
def a(stubs):
    s = stubs["A"].srv6
    yield s
    for st in s.ListLocalSids(pb.ListLocalSidsRequest()).local_sids:
        if st.local_sid.sid.startswith(("fcbb:", "fc00:1::8")):
            s.RemoveLocalSid(pb.RemoveLocalSidRequest(sid=st.local_sid.sid, table=st.local_sid.table))


ACCEPTED = [  # (sid, action kwargs, flavour kwargs, what iproute2 shows after the action)
    ("fcbb:bbbb:100::/48", {}, dict(flavors=[NEXT_CSID]), "End flavors next-csid lblen 32 nflen 16 dev a0"),
    (
        "fcbb:bbbb:0:e001::/64",
        dict(action=pb.LOCAL_SID_ACTION_END_X, nh6="fc00:12::2"),
        dict(flavors=[NEXT_CSID], lblen=48, nflen=16),
        "End.X nh6 fc00:12::2 flavors next-csid lblen 48 nflen 16 dev a0",
    ),
    ("fc00:1::81", {}, dict(flavors=[PSP]), "End flavors psp dev a0"),
    ("fcbb:bbbb:101::/48", {}, dict(flavors=[NEXT_CSID, PSP]), "End flavors psp,next-csid lblen 32 nflen 16 dev a0"),
    # a function in the node's locator (uDT6): a prefix SID without a flavour
    (
        "fcbb:bbbb:100:d6::/64",
        dict(action=pb.LOCAL_SID_ACTION_END_DT6, lookup_table=254),
        {},
        "End.DT6 table main dev a0",
    ),
]


@pytest.mark.parametrize("s,action,flv,text", ACCEPTED, ids=[t.split(" dev")[0] for *_, t in ACCEPTED])
def test_flavoured_local_sid_installed_and_read_back(a, lab, s, action, flv, text):
    m = sid(s, **action, **flv)
    r = a.CreateLocalSid(pb.CreateLocalSidRequest(local_sid=m))
    assert r.changed
    line = route_line(lab, s)
    assert f"encap seg6local action {text}" in line, line
    got = a.GetLocalSid(pb.GetLocalSidRequest(sid=s)).state.local_sid
    # the kernel's lengths come back (defaults filled in), flavours in ascending order
    assert sorted(got.flavors) == list(got.flavors) == sorted(m.flavors)
    if NEXT_CSID in m.flavors:
        assert (got.lblen, got.nflen) == (m.lblen or 32, m.nflen or 16)
        assert got.sid == s  # the locator prefix, as written
    # the same request again is a no-op: the index equals what the kernel dump reads back
    assert not a.CreateLocalSid(pb.CreateLocalSidRequest(local_sid=m)).changed
    assert a.RemoveLocalSid(pb.RemoveLocalSidRequest(sid=s)).changed
    assert route_line(lab, s) == ""


def test_update_changes_flavour_in_place(a, lab):
    s = "fcbb:bbbb:102::/48"
    a.CreateLocalSid(pb.CreateLocalSidRequest(local_sid=sid(s, flavors=[NEXT_CSID])))
    u = a.UpdateLocalSid(pb.UpdateLocalSidRequest(local_sid=sid(s, flavors=[NEXT_CSID, PSP])))
    assert u.changed and list(u.previous.flavors) == [NEXT_CSID]
    assert "flavors psp,next-csid lblen 32 nflen 16" in route_line(lab, s)


KERNEL_LACKS = [  # this kernel (6.18) refuses these flavour/action pairs
    ("fc00:1::82", {}, [USP]),
    ("fc00:1::83", {}, [USD]),
    ("fc00:1::84", dict(action=pb.LOCAL_SID_ACTION_END_X, nh6="fc00:12::2"), [PSP]),
]


@pytest.mark.parametrize("s,action,flavors", KERNEL_LACKS, ids=["End-usp", "End-usd", "End.X-psp"])
def test_flavour_the_kernel_lacks_is_refused_in_its_words(a, lab, s, action, flavors):
    msg = expect_error(
        a.CreateLocalSid, pb.CreateLocalSidRequest(local_sid=sid(s, **action, flavors=flavors)), FP, "local_sid:"
    )
    assert "kernel refused it: Unsupported Flavor operation(s)" in msg, msg
    assert route_line(lab, s) == ""


BAD = [  # (sid, flavour kwargs, expected message start)
    ("fcbb:bbbb:100::/48", dict(flavors=[NEXT_CSID], nflen=32), "local_sid.sid: a NEXT-C-SID SID is the prefix"),
    ("fcbb:bbbb:100::/48", dict(flavors=[NEXT_CSID], lblen=20, nflen=28), "local_sid.lblen: 20 bits"),
    ("fcbb:bbbb:100::/48", dict(flavors=[NEXT_CSID], lblen=120, nflen=16), "local_sid.nflen: lblen 120 + nflen 16"),
    ("fc00:1::85", dict(flavors=[PSP], lblen=32), "local_sid.lblen: only with the LOCAL_SID_FLAVOR_NEXT_CSID"),
    (
        "fcbb:bbbb:100::/48",
        dict(flavors=[NEXT_CSID, NEXT_CSID]),
        "local_sid.flavors[1]: LOCAL_SID_FLAVOR_NEXT_CSID is listed twice",
    ),
    ("fcbb:bbbb:100::1/48", dict(flavors=[NEXT_CSID]), "local_sid.sid: 'fcbb:bbbb:100::1/48' has host bits set"),
    ("fcbb:bbbb:100::/48", dict(flavors=[9]), "local_sid.flavors[0]: 9 is not a LocalSidFlavor value"),
]


@pytest.mark.parametrize("s,flv,msg", BAD, ids=[m.split(":")[0] + f"-{i}" for i, (*_, m) in enumerate(BAD)])
def test_bad_flavour_input_names_the_field(a, s, flv, msg):
    got = expect_error(a.CreateLocalSid, pb.CreateLocalSidRequest(local_sid=sid(s, **flv)), IA, msg.split(":")[0])
    assert got.startswith(msg), got
