"""The intent's `link_probes:`: one STAMP session per link, from one end's address on the link to
the other end's; each mistake is refused at its FILE:LINE:COLUMN under the key the operator wrote."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.intent import IntentError, load_intent, parse_intent

EXAMPLE = Path(__file__).resolve().parents[2] / "controller" / "examples" / "mesh8_link_probes.yaml"
HEAD = """version: 1
nodes:
  A: {agent: "127.0.0.1:50061", tls: {ca: ca.pem, cert: c.pem, key: c.key}}
  R: {agent: "127.0.0.1:50062", tls: {ca: ca.pem, cert: c.pem, key: c.key}}
link_probes:
"""  # 5 lines: the first probe is on line 6


def probe(frm: str, to: str, head: str = "link: a1, ssid: 1") -> str:
    return f"  - {{{head}, from: {{{frm}}}, to: {{{to}}}}}\n"


A_END, R_END = 'node: A, dev: a, address: "fc00:a1::1"', 'node: R, dev: r, address: "fc00:a1::2"'


def problems(body: str) -> list[str]:
    with pytest.raises(IntentError) as info:
        parse_intent(HEAD + body, "links.yaml")
    assert all(". Fix: " in line for line in info.value.lines), info.value.lines
    return info.value.lines


def test_example_has_one_session_per_core_link():
    intent = load_intent(EXAMPLE)
    by_link = {s.link: s for s in intent.stamp_sessions}
    assert sorted(by_link) == ["a1", "a2", "b1", "b2", "c1", "c2"]
    a1 = by_link["a1"]
    assert (a1.sender.node, a1.sender.dev, a1.sender.address) == ("A", "a1", "fc00:a1::1")
    assert (a1.reflector.node, a1.reflector.dev, a1.reflector.address) == ("R1", "r1b", "fc00:a1::2")
    assert a1.segs == () and a1.return_segs == () and a1.rate_pps == 10 and a1.ssid == 61


def test_missing_dev_named_under_from():
    lines = problems(probe('node: A, address: "fc00:a1::1"', R_END))
    assert (
        len(lines) == 1
        and lines[0].startswith("links.yaml:6:")
        and "link_probes[0].from: missing key `dev`" in lines[0]
    ), lines


def test_same_node_both_ends():
    lines = problems(probe(A_END, 'node: A, dev: b, address: "fc00:a1::2"'))
    assert any(
        line.startswith("links.yaml:6:") and "link_probes[0].to.node" in line and "both node A" in line
        for line in lines
    ), lines


def test_same_address_both_ends():
    lines = problems(probe(A_END, 'node: R, dev: r, address: "fc00:a1::1"'))
    assert len(lines) == 1 and "link_probes[0].to.address: both ends of link a1 have address fc00:a1::1" in lines[0], (
        lines
    )


def test_unknown_key_and_missing_link():
    lines = problems(probe(A_END, R_END, head='ssid: 1, segs: ["fc00::1"]'))
    text = "\n".join(lines)
    assert "link_probes[0]: missing key `link`" in text and "link_probes[0].segs: unknown key 'segs'" in text, lines


def test_ssid_taken_by_a_stamp_session():
    body = (
        probe(A_END, R_END, head="link: a1, ssid: 7") + "stamp_sessions:\n"
        '  - {ssid: 7, sender: {node: A, dev: a0, address: "fc00:1::1"}, '
        + 'reflector: {node: R, dev: r0, address: "fc00:2::1"}}\n'
    )
    want = "link_probes[0]: duplicate STAMP session ssid 7 from node A (also stamp_sessions[0])"
    lines = problems(body)
    assert any(line.startswith("links.yaml:6:") and want in line for line in lines), lines


def test_a_link_probe_is_written_as_its_link():
    a1 = next(s for s in load_intent(EXAMPLE).stamp_sessions if s.link == "a1")
    assert a1.written == "link:a1"
