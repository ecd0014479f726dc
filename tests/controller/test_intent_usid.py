"""The intent's compressed SIDs (RFC 9800 NEXT-C-SID, "uSID"): the `usid:` domain, next-csid local
SIDs and containers in SID lists; every bad container is refused at its FILE:LINE:COLUMN."""

from __future__ import annotations

import pytest

from controller.intent import IntentError, parse_intent
from controller.usid import CsidFormat

HEAD = """version: 1
nodes:
  A: {agent: "127.0.0.1:50061", tls: {ca: ca.pem, cert: c.pem, key: c.key}}
  R: {agent: "127.0.0.1:50062", tls: {ca: ca.pem, cert: c.pem, key: c.key}}
  B: {agent: "127.0.0.1:50063", tls: {ca: ca.pem, cert: c.pem, key: c.key}}
usid: {block: "fcbb:bbbb::/32", nflen: 16}
"""  # 6 lines: what a test appends starts on line 7


def intent(body: str):
    return parse_intent(HEAD + body, "usid.yaml")


def problems(text: str) -> list[str]:
    with pytest.raises(IntentError) as info:
        parse_intent(text, "usid.yaml")
    assert all(". Fix: " in line for line in info.value.lines), info.value.lines
    return info.value.lines


def test_container_arithmetic():
    fmt = CsidFormat.parse("fcbb:bbbb::/32", 16)
    assert fmt.capacity == 6 and fmt.pack([0x100, 0x200, 0x300]) == "fcbb:bbbb:100:200:300::"
    assert fmt.usids("fcbb:bbbb:100:200:300::") == [0x100, 0x200, 0x300]
    assert fmt.shifts("fcbb:bbbb:100:200:300::") == [
        "fcbb:bbbb:100:200:300::",
        "fcbb:bbbb:200:300::",
        "fcbb:bbbb:300::",
    ]
    assert fmt.locator(0x200) == "fcbb:bbbb:200::/48"
    assert "micro-SID 2 is zero" in fmt.container_problem("fcbb:bbbb:100:0:300::")
    assert fmt.container_problem("fcbb:bbbb:100:200:300::") == ""
    # a 40-bit block leaves 88 bits: 5 micro-SIDs of 16 and 8 bits that belong to none
    odd = CsidFormat.parse("fcbb:bbbb:bb00::/40", 16)
    assert odd.capacity == 5 and "last 8 bits" in odd.container_problem("fcbb:bbbb:bb01:2:3:4:5:1")


def test_good_usid_intent():
    got = intent(
        """local_sids:
  - {node: R, sid: "fcbb:bbbb:200::/48", action: End, flavors: [next-csid], dev: r0}
  - {node: R, sid: "fcbb:bbbb:e200::/48", action: End.X, nh6: "fc00:23::2", flavors: [next-csid], dev: r1}
  - {node: B, sid: "fc00:3::e", action: End, flavors: [psp], dev: b0}
policies:
  - {node: A, destination: "fd00:b::/64", mode: encap.red, segs: [{usids: ["100", "200", "300"]}], dev: a0}
  - {node: B, destination: "fd00:a::/64", segs: ["fcbb:bbbb:300:200:100::", "fc00:1::d6"], dev: b0}
"""
    )
    assert got.usid == CsidFormat.parse("fcbb:bbbb::/32", 16)
    r = {s.sid: s for s in got.local_sids}
    assert r["fcbb:bbbb:200::/48"].flavors == ("next-csid",) and (
        r["fcbb:bbbb:200::/48"].lblen,
        r["fcbb:bbbb:200::/48"].nflen,
    ) == (32, 16)
    assert r["fc00:3::e"].flavors == ("psp",) and r["fc00:3::e"].lblen == 0
    a, b = got.policies
    assert a.segs == ("fcbb:bbbb:100:200:300::",) and a.written == ("usid(100,200,300)",)
    assert b.segs == ("fcbb:bbbb:300:200:100::", "fc00:1::d6") and b.written == b.segs


POLICY = 'policies:\n  - {node: A, destination: "fd00:b::/64", segs: %s, dev: a0}\n'
SID = "local_sids:\n  - {node: R, %s, dev: r0}\n"
BAD = [  # (lines appended to HEAD, the problem at FILE:LINE:COLUMN)
    (
        POLICY % '[{usids: ["1","2","3","4","5","6","7"]}]',
        "usid.yaml:8:58: policies[0].segs[0].usids: 7 micro-SIDs do not fit in one container: block /32 leaves 96",
    ),
    (
        POLICY % '[{block: "fcbb:cccc::/32", usids: ["100"]}]',
        "usid.yaml:8:58: policies[0].segs[0].block: block fcbb:cccc::/32 is not the uSID block fcbb:bbbb::/32",
    ),
    (
        POLICY % '["fcbb:bbbb:100:0:300::"]',
        "usid.yaml:8:50: policies[0].segs[0]: container fcbb:bbbb:100:0:300:: micro-SID 2 is zero",
    ),
    (
        POLICY % '[{usids: ["100", "0", "300"]}]',
        "usid.yaml:8:66: policies[0].segs[0].usids[1]: micro-SID 0 is the end of a container",
    ),
    (
        POLICY % '[{usids: ["100", "1ffff"]}]',
        "usid.yaml:8:66: policies[0].segs[0].usids[1]: micro-SID 1ffff is wider than 16 bits",
    ),
    (
        SID % 'sid: "fcbb:bbbb:200::/64", action: End, flavors: [next-csid]',
        "usid.yaml:8:20: local_sids[0].sid: fcbb:bbbb:200::/64 is a /64, the next-csid locator is block + micro-SID",
    ),
    (
        SID % 'sid: "fcbb:cccc:200::/48", action: End, flavors: [next-csid]',
        "usid.yaml:8:20: local_sids[0].sid: fcbb:cccc:200::/48 is not in the uSID block fcbb:bbbb::/32",
    ),
    (
        SID % 'sid: "fcbb:bbbb:200::/48", action: End, flavors: [next-csid], nflen: 12',
        "usid.yaml:8:84: local_sids[0].nflen: nflen 12 bits: the kernel takes a multiple of 8 in 8..120",
    ),
    (
        SID % 'sid: "fc00:2::e", action: End, lblen: 32',
        "usid.yaml:8:46: local_sids[0].lblen: `lblen` is a next-csid length",
    ),
    (
        SID % 'sid: "fc00:2::e", action: End, flavors: [psp, usx]',
        "usid.yaml:8:61: local_sids[0].flavors[1]: flavour 'usx' is not known",
    ),
]


@pytest.mark.parametrize("body,want", BAD, ids=[w.split(": ")[1] for _, w in BAD])
def test_bad_container_named_at_its_line(body, want):
    lines = problems(HEAD + body)
    assert any(line.startswith(want) for line in lines), (want, lines)


def test_container_without_domain():
    text = HEAD.replace('usid: {block: "fcbb:bbbb::/32", nflen: 16}\n', "")
    lines = problems(text + POLICY % '[{usids: ["100"]}]')
    assert any(line.startswith("usid.yaml:7:") and "needs the `usid:` domain" in line for line in lines), lines


def test_bad_domain():
    lines = problems(HEAD.replace("/32", "/36").replace("nflen: 16", "nflen: 16"))
    assert any(line.startswith("usid.yaml:6:") and "block length 36 bits" in line for line in lines), lines


REDUCED_SESSION = """stamp_sessions:
  - ssid: 9
    sender: {{node: A, address: "fcbb:bbbb:100::", dev: a0}}
    reflector: {{node: B, address: "{reflector}", dev: b0}}
    segs: [{segs}]
    reduced: true
"""  # the session starts on line 8; segs on line 11, reduced on line 12


def test_a_reduced_session_sends_to_its_container_and_the_model_carries_it():
    from controller.model import desired_state

    got = intent(REDUCED_SESSION.format(reflector="fcbb:bbbb:400::", segs='{usids: ["200", "300", "400"]}'))
    s = got.stamp_sessions[0]
    assert (s.reduced, s.segs) == (True, ("fcbb:bbbb:200:300:400::",))
    sender = next(r for r in desired_state(got).resources.values() if r.kind == "stamp_sender")
    assert sender.fields["reduced"] is True and sender.fields["segs"] == ("fcbb:bbbb:200:300:400::",)
    # the path as the operator wrote it goes to the agent with the session
    assert s.written == sender.fields["written"] == "usid(200,300,400)"


@pytest.mark.parametrize(
    "reflector,segs,where,message",
    [
        ("fcbb:bbbb:300::", '{usids: ["200", "300", "400"]}', "usid.yaml:10:", "is not where container"),
        ("fcbb:bbbb:400::", '"fcbb:bbbb:200::", "fcbb:bbbb:400::"', "usid.yaml:11:", "2 SIDs with reduced: true"),
        ("fcbb:bbbb:400::", '"fc00:2::e"', "usid.yaml:11:", "is not a uSID container of block fcbb:bbbb::/32"),
    ],
)
def test_a_reduced_session_is_checked_against_its_container(reflector, segs, where, message):
    lines = problems(HEAD + REDUCED_SESSION.format(reflector=reflector, segs=segs))
    assert len(lines) == 1 and lines[0].startswith(where) and message in lines[0], lines


def test_a_reduced_session_needs_the_domain():
    body = REDUCED_SESSION.format(reflector="fcbb:bbbb:400::", segs='"fcbb:bbbb:200:300:400::"')
    lines = problems(HEAD.replace('usid: {block: "fcbb:bbbb::/32", nflen: 16}\n', "") + body)
    assert any("reduced: a reduced session needs the usid: domain" in line for line in lines), lines


def test_a_flow_over_a_container_keeps_it_as_written():
    from controller.model import desired_state

    got = intent(
        """flows:
  - {flow_id: 21, ingress: {node: A, dev: a0}, egress: {node: B, dev: b0}, segs: [{usids: ["200", "300", "d6"]}]}
"""
    )
    f = got.flows[0]
    assert (f.segs, f.written) == (("fcbb:bbbb:200:300:d6::",), "usid(200,300,d6)")
    sides = [r for r in desired_state(got).resources.values() if r.kind.startswith("flow_")]
    assert sorted(r.fields["written"] for r in sides) == ["usid(200,300,d6)"] * 2
