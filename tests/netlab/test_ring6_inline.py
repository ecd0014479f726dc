"""netlab/topologies/ring6_inline.yaml, the in-line measurement tests' topology, for real.

- SRv6 traffic flows end to end on both paths in both directions, and takes the path its SID list
  says: the End SID counters of the path's transit nodes count every packet, the other path's
  count none, and on every link of the path the relay saw the flow in the right direction with
  the outer destination that hop's segment (End rewrote it), carrying the link's delay.
- The one-way delay (kernel timestamps, netlab.owd) is at least the sum of the path's delays.
- The MTU of I-Q1 is 1400, as the file says, and what that means for SRv6 traffic (measured).
- IOAM: the file's node ids, namespaces and interface ids are set, and the kernels fill a trace
  whose per-hop timestamp differences are the links' delays in that direction.

Runs as root. Namespaces: NETLAB_RING_TEST_PREFIX (default "nlring"), + "i" for the IOAM switch test.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from netlab import Lab, TopologyError, load, owd, relay_flow, relay_ground_truth, seqflow, status, teardown
from netlab.lab import REPO_ROOT, _netns_names, _own_netns
from tests.isolation import own_name

REPO = Path(__file__).resolve().parents[2]
RING6 = REPO / "netlab" / "topologies" / "ring6_inline.yaml"
PREFIX = os.environ.get("NETLAB_RING_TEST_PREFIX") or own_name("nlring")
PY = sys.executable
CORE = ("ip1", "p12", "p23", "p3e", "iq1", "q1e")
END_SIDS = {"P1": "fc00:21::e", "P2": "fc00:22::e", "P3": "fc00:23::e", "Q1": "fc00:31::e"}
DT6_SIDS = {"I": "fc00:1::d6", "E": "fc00:9::d6"}

# (path, direction): sender, receiver, destination, [(link, link direction, outer destination on it)],
# transit End nodes, decapsulating node
PATHS = {
    ("primary", "forward"): ("H1", "H2", "fd00:b::1",
                             [("ip1", "a_to_b", "fc00:21::e"), ("p12", "a_to_b", "fc00:22::e"),
                              ("p23", "a_to_b", "fc00:23::e"), ("p3e", "a_to_b", "fc00:9::d6")],
                             ("P1", "P2", "P3"), "E"),
    ("primary", "reverse"): ("H2", "H1", "fd00:a::1",
                             [("p3e", "b_to_a", "fc00:23::e"), ("p23", "b_to_a", "fc00:22::e"),
                              ("p12", "b_to_a", "fc00:21::e"), ("ip1", "b_to_a", "fc00:1::d6")],
                             ("P3", "P2", "P1"), "I"),
    ("alternative", "forward"): ("H1", "H2", "fd00:c::1",
                                 [("iq1", "a_to_b", "fc00:31::e"), ("q1e", "a_to_b", "fc00:9::d6")], ("Q1",), "E"),
    ("alternative", "reverse"): ("H2", "H1", "fd00:d::1",
                                 [("q1e", "b_to_a", "fc00:31::e"), ("iq1", "b_to_a", "fc00:1::d6")], ("Q1",), "I"),
}  # fmt: skip

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="netlab needs root (network namespaces)")


@pytest.fixture(scope="module")
def lab():
    teardown(PREFIX)
    lab = Lab.up(RING6, PREFIX)
    try:
        yield lab
    finally:
        lab.down()
    assert _own_netns(PREFIX, _netns_names()) == []


def link_delay(lab: Lab, link: str, direction: str) -> float:
    t = lab.topo.link(link)
    return t.delay_a_to_b_us if direction == "a_to_b" else t.delay_b_to_a_us


def seg6_packets(lab: Lab, node: str, sid: str) -> int:
    out = lab.run(node, ["ip", "-s", "-6", "route", "show", f"{sid}/128"], check=True).stdout
    return int(re.search(r"packets (\d+)", out).group(1))


def snmp6(lab: Lab, node: str) -> dict[str, int]:
    out = lab.run(node, ["cat", "/proc/net/snmp6"], check=True).stdout
    return {k: int(v) for k, v in (line.split() for line in out.splitlines() if line.strip())}


def test_the_file_checks_and_says_what_the_header_says():
    proc = subprocess.run([PY, "-m", "netlab", "check", str(RING6)], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0 and "ok (8 nodes, 8 links)" in proc.stdout, proc.stdout + proc.stderr
    topo = load(RING6)
    delays = [d for name in CORE for d in (topo.link(name).delay_a_to_b_us, topo.link(name).delay_b_to_a_us)]
    assert len(delays) == 12 and len(set(delays)) == 12 and min(delays) > 0  # every link and direction its own
    assert all(topo.link(n).wants_relay for n in CORE) and not any(topo.link(n).wants_relay for n in ("h1i", "eh2"))
    assert {link.name: link.mtu for link in topo.links if link.mtu} == {"iq1": 1400}
    ioam = {
        name: (node.ioam.node_id, [ns.id for ns in node.ioam.namespaces])
        for name, node in topo.nodes.items()
        if node.ioam
    }
    assert ioam == {"I": (1, [1]), "P1": (21, [1]), "P2": (22, [1]), "P3": (23, [1]), "Q1": (31, [1]), "E": (9, [1])}


def test_lab_comes_up_with_a_relay_on_every_core_link(lab):
    st = status(PREFIX)
    nodes = {f"{PREFIX}-{n}" for n in ("H1", "I", "P1", "P2", "P3", "Q1", "E", "H2")}
    assert set(st["netns"]) == nodes | {f"{PREFIX}-dly-{link}" for link in CORE}
    assert sorted(st["relays"]) == sorted(CORE) and all(r["alive"] for r in st["relays"].values())


@pytest.mark.parametrize("path", list(PATHS), ids=["-".join(p) for p in PATHS])
def test_srv6_traffic_takes_its_path(lab, path):
    src, dst, addr, hops, transit, decap = PATHS[path]
    label = 0x10000 + list(PATHS).index(path)  # a flow label of our own: the relays' flow key
    count, probes = 300, 200
    ends_before = {node: seg6_packets(lab, node, sid) for node, sid in END_SIDS.items()}
    dt6_before = {node: seg6_packets(lab, node, sid) for node, sid in DT6_SIDS.items()}
    relays_before = {link: lab.relay_stats(link) for link in CORE}
    run = seqflow.run(lab, src, dst, addr, 9600, count, interval_us=1000, flow_label=label)
    res = owd.measure(lab, [owd.Flow("path", src, dst, addr, 9601)], count=probes, interval_us=2000)["path"]
    windows = {link: relay_ground_truth(relays_before[link], lab.relay_stats(link)) for link in CORE}
    ends = {node: seg6_packets(lab, node, sid) - ends_before[node] for node, sid in END_SIDS.items()}
    dt6 = {node: seg6_packets(lab, node, sid) - dt6_before[node] for node, sid in DT6_SIDS.items()}

    got = run["flows"]["0"]
    assert (got["distinct"], got["reordered"], got["flow_labels"], run["socket_drops"]) == (count, 0, [label], 0), got
    assert res["sent"] == res["received"] == probes
    total = count + probes
    # exactly this traffic passed the path's End SIDs and its decapsulation, none the other path's
    assert ends == {node: total if node in transit else 0 for node in END_SIDS}, ends
    assert dt6 == {node: total if node == decap else 0 for node in DT6_SIDS}, dt6
    for link, direction, outer_dst in hops:
        flow = relay_flow(windows[link], direction, dst=outer_dst, flow_label=label)
        assert (flow["received"], flow["released"], flow["reordered"]) == (count, count, 0), (link, flow)
        assert flow["delay_ns_sum"] == link_delay(lab, link, direction) * 1000 * count, (link, flow)
    on_path = {(link, direction) for link, direction, _ in hops}
    for link in CORE:
        for direction in ("a_to_b", "b_to_a"):
            labels = [f["flow_label"] for f in windows[link][direction]["flows"] if f["released"]]
            assert (label in labels) == ((link, direction) in on_path), (link, direction, labels)
    # end to end: never less than the path's injected delays, and not much more
    injected = sum(link_delay(lab, link, direction) for link, direction, _ in hops)
    one_way = [d / 1000 for d in res["delays_ns"]]
    assert len(one_way) >= probes * 0.95 and min(one_way) >= injected, (min(one_way), injected)
    excess = statistics.median(one_way) - injected
    print(f"\n{path}: injected {injected:.0f} us, one-way median {statistics.median(one_way):.1f} us (+{excess:.1f})")
    assert excess < 250  # veth hops, SRv6 End/encap/decap and the relays' lateness; seen 30-60 us


def test_mtu_of_the_alternative_link_is_1400(lab):
    def mtu(ns: str, dev: str) -> int:
        return json.loads(
            subprocess.run(
                ["ip", "-n", ns, "-j", "link", "show", "dev", dev], capture_output=True, text=True, check=True
            ).stdout
        )[0]["mtu"]

    relay_ns = lab.relay_ns("iq1")
    assert [mtu(lab.ns("I"), "i2"), mtu(lab.ns("Q1"), "q1a"), mtu(relay_ns, "ra"), mtu(relay_ns, "rb")] == [1400] * 4
    assert [mtu(lab.ns("I"), "i1"), mtu(lab.ns("Q1"), "q1b"), mtu(lab.relay_ns("ip1"), "ra")] == [1500] * 3
    # the kernel enforces it: 1400 bytes (1352 ICMPv6 payload + 8 + 40) leave I, 1401 do not
    ok = lab.run("I", ["ping", "-6", "-n", "-c", "1", "-W", "2", "-M", "do", "-s", "1352", "fc00:b1::2"])
    assert ok.returncode == 0, ok.stdout
    big = lab.run("I", ["ping", "-6", "-n", "-c", "1", "-W", "2", "-M", "do", "-s", "1353", "fc00:b1::2"])
    assert big.returncode != 0 and "mtu: 1400" in big.stdout + big.stderr, big.stdout + big.stderr
    # over SRv6 (40 + 40 bytes of headers with two SIDs): an inner packet of 1320 bytes takes the
    # alternative path both ways; 1321 bytes are dropped at I after the encapsulation, counted in
    # Ip6FragFails, and the Packet Too Big goes to the outer source, I itself
    ping = ["ping", "-6", "-n", "-c", "1", "-W", "2", "-M", "do", "-I", "fd00:d::1"]
    assert lab.run("H1", ping + ["-s", "1272", "fd00:c::1"]).returncode == 0
    before = snmp6(lab, "I")
    lost = lab.run("H1", ping + ["-s", "1273", "fd00:c::1"])
    after = snmp6(lab, "I")
    assert lost.returncode != 0 and " 0 received" in lost.stdout, lost.stdout
    assert after["Ip6FragFails"] - before["Ip6FragFails"] == 1
    assert after["Icmp6InPktTooBigs"] - before["Icmp6InPktTooBigs"] == 1
    assert after["Icmp6OutPktTooBigs"] - before["Icmp6OutPktTooBigs"] == 1


IOAM_IDS = {  # node: (node id, {device: interface id})
    "I": (1, {"ih": 11, "i1": 12, "i2": 13}),
    "P1": (21, {"p1a": 211, "p1b": 212}),
    "P2": (22, {"p2a": 221, "p2b": 222}),
    "P3": (23, {"p3a": 231, "p3b": 232}),
    "Q1": (31, {"q1a": 311, "q1b": 312}),
    "E": (9, {"e1": 91, "e2": 92, "eh": 93}),
}


def test_ioam_settings_are_applied(lab):
    for node, (node_id, devices) in IOAM_IDS.items():
        assert lab.run(node, ["sysctl", "-n", "net.ipv6.ioam6_id"], check=True).stdout.strip() == str(node_id)
        assert "namespace 1" in lab.run(node, ["ip", "ioam", "namespace", "show"], check=True).stdout
        for dev, if_id in devices.items():
            conf = f"net.ipv6.conf.{dev}"
            out = lab.run(node, ["sysctl", "-n", f"{conf}.ioam6_enabled", f"{conf}.ioam6_id"], check=True).stdout
            assert out.split() == ["1", str(if_id)], (node, dev, out)
    assert lab.run("H1", ["sysctl", "-n", "net.ipv6.conf.h1.ioam6_enabled"], check=True).stdout.strip() == "0"


# (sender, its loopback, receiver, its loopback, SIDs before it, expected trace: [(node id, ingress if,
#  egress if)] in list order (last hop first), [(link, direction)] between consecutive filling nodes)
# An End node's egress interface id is that of its SID route's device (the kernel routes the packet
# by its destination, the SID, before filling), not of the device it leaves by: Q1 says 311 both
# ways. The receiving node's egress id is lo's (default 65535).
TRACES = {
    "primary_forward": ("I", "fc00:1::1", "E", "fc00:9::1", ["fc00:21::e", "fc00:22::e", "fc00:23::e"],
                        [(9, 91, 65535), (23, 231, 231), (22, 221, 221), (21, 211, 211)],
                        [("p3e", "a_to_b"), ("p23", "a_to_b"), ("p12", "a_to_b")]),
    "primary_reverse": ("E", "fc00:9::1", "I", "fc00:1::1", ["fc00:23::e", "fc00:22::e", "fc00:21::e"],
                        [(1, 12, 65535), (21, 212, 211), (22, 222, 221), (23, 232, 231)],
                        [("ip1", "b_to_a"), ("p12", "b_to_a"), ("p23", "b_to_a")]),
    "alternative_forward": ("I", "fc00:1::1", "E", "fc00:9::1", ["fc00:31::e"],
                            [(9, 92, 65535), (31, 311, 311)], [("q1e", "a_to_b")]),
    "alternative_reverse": ("E", "fc00:9::1", "I", "fc00:1::1", ["fc00:31::e"],
                            [(1, 13, 65535), (31, 312, 311)], [("iq1", "b_to_a")]),
}  # fmt: skip


@pytest.mark.parametrize("name", list(TRACES))
def test_ioam_trace_shows_each_hop_and_its_delay(lab, name):
    """Probes with a Pre-allocated Trace (4 slots) in a Hop-by-Hop header and an SRH, from a
    loopback to a loopback (netlab.ioam_trace): each node on the path fills its entry; the
    difference of consecutive entries' timestamps (kernel receive times, microseconds) is the
    link's delay in that direction plus a little (the relay's lateness, the veth path)."""
    src, src_addr, dst, dst_addr, segs, want, links = TRACES[name]
    count = 30
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    recv = lab.popen(
        dst,
        [PY, "-m", "netlab.ioam_trace", "recv", "--port", "9650", "--count", str(count), "--timeout", "20"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert recv.stdout.readline().strip() == "ready"
        send = [PY, "-m", "netlab.ioam_trace", "send", "--dst", dst_addr, "--port", "9650", "--src", src_addr]
        send += ["--count", str(count), "--slots", "4", "--interval", "0.01", "--segs", ",".join(segs)]
        lab.run(src, send, check=True, env=env)
        traces = json.loads(recv.communicate(timeout=30)[0])
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()
    assert len(traces) == count
    per_hop: list[list[int]] = [[] for _ in links]
    for t in traces:
        assert (t["namespace"], t["overflow"], t["remaining_words"]) == (1, False, 4 * (4 - len(want))), t
        entries = t["entries"]
        assert [(e["node_id"], e["ingress_if"], e["egress_if"]) for e in entries] == want, entries
        hop_limits = [e["hop_limit"] for e in entries]
        assert hop_limits == list(range(hop_limits[0], hop_limits[0] + len(entries))), hop_limits  # one less per hop
        stamps = [e["sec"] * 1_000_000 + e["usec"] for e in entries]
        for i in range(len(links)):
            per_hop[i].append(stamps[i] - stamps[i + 1])  # the later node's entry comes first
    for (link, direction), diffs in zip(links, per_hop):
        delay = link_delay(lab, link, direction)
        excess = statistics.median(diffs) - delay
        print(
            f"\n{name}: {link} {direction} delay {delay:.0f} us, IOAM median {statistics.median(diffs)} us (+{excess})"
        )
        assert min(diffs) >= delay - 1, (link, direction, diffs)  # microsecond stamps: truncation
        # the other direction's delay differs by >= 150 us on every link, so this names the direction
        assert excess < 100, (link, direction, diffs)


def test_ioam_can_be_left_off_and_set_per_device(tmp_path):
    """Lab.up(ioam=False) applies none of it; an end's `ioam: {enabled: false}` keeps that device off."""
    text = (REPO / "netlab" / "topologies" / "pair.yaml").read_text()
    node, dev = "S", "s0"
    ioam = "    ioam: {node_id: 77, node_id_wide: 7700, namespaces: [1, {id: 5, data: 9}]}\n"
    text = text.replace(f"  {node}:\n", f"  {node}:\n{ioam}", 1)
    text = text.replace(f"ifname: {dev},", f"ifname: {dev}, ioam: {{enabled: false, id: 70}},", 1)
    path = tmp_path / "pair_ioam.yaml"
    path.write_text(text)
    assert load(path).nodes[node].ioam.node_id == 77
    prefix = PREFIX + "i"
    for ioam in (True, False):
        teardown(prefix)
        with Lab.up(path, prefix, ioam=ioam) as lab2:
            ids = lab2.run(node, ["sysctl", "-n", "net.ipv6.ioam6_id", "net.ipv6.ioam6_id_wide"], check=True).stdout
            conf = f"net.ipv6.conf.{dev}"
            dev_conf = lab2.run(node, ["sysctl", "-n", f"{conf}.ioam6_enabled", f"{conf}.ioam6_id"], check=True).stdout
            namespaces = lab2.run(node, ["ip", "ioam", "namespace", "show"], check=True).stdout
        if ioam:
            assert ids.split() == ["77", "7700"] and dev_conf.split() == ["0", "70"]
            assert "namespace 1" in namespaces and re.search(r"namespace 5, data 0x0+9", namespaces), namespaces
        else:
            assert ids.split() != ["77", "7700"] and dev_conf.split() == ["0", "65535"] and namespaces.strip() == ""
    assert _own_netns(prefix, _netns_names()) == []


@pytest.mark.parametrize(
    "old,new,expect",
    [
        ("    mtu: 1400", "    mtu: 9000", r"links\[5\]\.mtu: mtu 9000 is larger than a delay relay relays"),
        ("    mtu: 1400", "    mtu: 1000", r"links\[5\]\.mtu: mtu must be an integer in \[1280, 65535\]"),
        ("ioam: {node_id: 21, namespaces: [1]}", "ioam: {node_id: 16777216, namespaces: [1]}",
         r"nodes\.P1\.ioam\.node_id: node_id must be an integer in \[0, 16777215\]"),
        ("ioam: {node_id: 21, namespaces: [1]}", "ioam: {node_id: 21, namespaces: [1, 1]}",
         r"nodes\.P1\.ioam\.namespaces\[1\]: namespace 1 is listed twice"),
        ("ioam: {node_id: 21, namespaces: [1]}", "ioam: {namespaces: [1]}", r"nodes\.P1\.ioam: missing key 'node_id'"),
        ('b: {node: H2, ifname: h2, addrs: ["fd00:b::1/64"]}',
         'b: {node: H2, ifname: h2, addrs: ["fd00:b::1/64"], ioam: {enabled: true}}',
         r"links\[7\]\.b\.ioam\.enabled: node H2 has no `ioam:`"),
    ],
)  # fmt: skip
def test_bad_mtu_or_ioam_names_the_line(tmp_path, old, new, expect):
    text = RING6.read_text()
    assert old in text
    text = text.replace(old, new, 1)
    path = tmp_path / "ring6_bad.yaml"
    path.write_text(text)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if new.strip() in t)
    with pytest.raises(TopologyError) as err:
        load(path)
    assert any(p.startswith(f"{path}:{line}: ") and re.search(expect, p) for p in err.value.problems), err.value
