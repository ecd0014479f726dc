"""One ioam_rx instance on two devices of a node, each on its own hook: native XDP (a member of the
device's XDP chain) on one, a TC ingress filter on the other, one set of flows, counters and one ring.

Node B has two veths, b1 (from P1) and b2 (from P2). Instrumented frames of one monitored flow are
sent on both links from packet sockets; each step checks exactly, per device: the records in the
ring (their ifindex names the device they came in on, their sequence numbers are the ones sent),
ioam_rx's counters, what runs on each device (`ip link` XDP, `tc filter`), and the pins.

The sequence covers what a node meets when its devices come and go:
- `attach --hook auto` on a veth puts the instance on TC ingress (the driver is asked), and on the
  chain of a veth where an XDP program runs already;
- `attach-dev --hook xdp` on the other device loads the XDP entry with the instance's maps;
- when b1's chain is removed (its last member left) and made again by another program, the XDP
  entry is loaded again against the new chain: a stamp_collector after ioam_rx in that chain sees
  every frame ioam_rx passes on (the old entry's tail calls would go to the removed chain's array);
- `detach` on the TC device takes the instance off its XDP device too and removes the pins, and
  the other program's chain on b1 goes on.
"""

from __future__ import annotations

import json
import socket
import subprocess

import pytest

from tests.datapath.dp_env import BUILD, in_netns, sh
from tests.datapath.ioam_env import (
    IOAM_RX,
    PIN_ROOT,
    Node,
    Trace,
    delta,
    dump,
    e2e_doh,
    instrumented,
    run,
    stats,
)
from tests.isolation import own_name

pytestmark = pytest.mark.datapath

PREFIX = own_name("iohk")
NS_B, NS_P1, NS_P2 = f"{PREFIX}-B", f"{PREFIX}-P1", f"{PREFIX}-P2"
INST = f"{PREFIX}-inst"
PIN = PIN_ROOT / INST / "ioam_rx"
COLLECTOR = BUILD / "stamp_collector"
COLLECTOR_PIN = PIN_ROOT / INST / "stamp_collector"
IOAM_NS, FLOW_ID, NODE_ID = 123, 7, 9
B_MAC, P_MAC = "02:00:00:00:00:02", "02:00:00:00:00:01"  # the MACs instrumented() frames carry
LINKS = {"b1": (NS_P1, "p1"), "b2": (NS_P2, "p2")}


def on_ns(ns: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return sh(*cmd, ns=ns, check=check)


@pytest.fixture(scope="module")
def node(datapath_build):
    """B with b1 <-> P1's p1 and b2 <-> P2's p2; nothing but the test's frames on the links."""

    def teardown():
        subprocess.run([str(IOAM_RX), "detach", "--instance", INST, "--netns", NS_B, "--dev", "b2"],
                       capture_output=True)  # fmt: skip
        subprocess.run([str(COLLECTOR), "detach", "--netns", NS_B, "--dev", "b1", "--pin-dir", str(COLLECTOR_PIN)],
                       capture_output=True)  # fmt: skip
        for ns in (NS_B, NS_P1, NS_P2):
            sh("ip", "netns", "del", ns, check=False)

    teardown()
    for ns in (NS_B, NS_P1, NS_P2):
        sh("ip", "netns", "add", ns)
        on_ns(ns, "ip", "link", "set", "lo", "up")
    for bdev, (pns, pdev) in LINKS.items():
        sh("ip", "link", "add", bdev, "netns", NS_B, "address", B_MAC, "type", "veth",
           "peer", "name", pdev, "netns", pns, "address", P_MAC)  # fmt: skip
        for ns, dev in ((NS_B, bdev), (pns, pdev)):
            on_ns(ns, "ip", "link", "set", dev, "addrgenmode", "none", "multicast", "off")
            on_ns(ns, "ip", "link", "set", dev, "up")
    try:
        yield {dev: int(on_ns(NS_B, "cat", f"/sys/class/net/{dev}/ifindex").stdout) for dev in LINKS}
    finally:
        teardown()


def send(dev: str, seqs: range) -> None:
    """Instrumented frames of the flow, one per sequence number, from the peer of B's `dev`."""
    pns, pdev = LINKS[dev]
    with in_netns(pns):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    try:
        s.bind((pdev, 0))
        for seq in seqs:
            trace = Trace(43, IOAM_NS, 4, [Node(62, 3, 1, 2, 1_795_000_000, 1000 + seq)])
            s.send(instrumented(trace, e2e_doh(41, IOAM_NS, seq, 1_795_000_000, seq)))
    finally:
        s.close()


def hooks_on_b() -> dict[str, tuple[bool, bool]]:
    """device -> (an XDP program on it, ioam_rx's TC entry on its ingress)."""
    out = {}
    for dev in LINKS:
        xdp = "xdp" in on_ns(NS_B, "ip", "link", "show", dev).stdout
        tc = "ioam_rx_tc" in on_ns(NS_B, "tc", "filter", "show", "dev", dev, "ingress").stdout
        out[dev] = (xdp, tc)
    return out


def rx(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run(IOAM_RX, *args, "--instance", INST, "--netns", NS_B, check=check)


def collector_counters() -> dict[str, int]:
    return json.loads(run(COLLECTOR, "stats", "--pin-dir", str(COLLECTOR_PIN), "--json").stdout)


def exchange(node: dict[str, int], frames: dict[str, range]) -> None:
    """Send `frames` (device -> sequence numbers) and check the ring and the counters exactly."""
    before = stats(IOAM_RX, INST)
    for dev, seqs in frames.items():
        send(dev, seqs)
    want = sorted((node[dev], seq) for dev, seqs in frames.items() for seq in seqs)
    recs = dump(INST, count=len(want), timeout_ms=3000)
    assert sorted((r["ifindex"], r["seq"]) for r in recs) == want
    assert {(r["flow_id"], r["node_id"], r["namespace_id"]) for r in recs} == {(FLOW_ID, NODE_ID, IOAM_NS)}
    assert delta(before, stats(IOAM_RX, INST)) == {"recorded": len(want)}
    assert dump(INST, timeout_ms=200) == []  # nothing else came


def test_one_instance_xdp_on_one_device_tc_on_another(node):
    # auto on a veth: TC ingress (its native XDP would cost the veth NAPI and a copy per packet)
    out = rx("attach", "--dev", "b2", "--node-id", str(NODE_ID), "--hook", "auto").stdout
    assert "TC ingress" in out, out
    rx_flow = ["add-flow", "--sids", "fc00:2::e,fc00:3::d6", "--flow-id", str(FLOW_ID), "--namespace-id", str(IOAM_NS)]
    run(IOAM_RX, *rx_flow, "--instance", INST)
    assert hooks_on_b() == {"b1": (False, False), "b2": (False, True)}
    assert sorted(p.name for p in PIN.iterdir() if p.name.startswith("prog")) == ["prog_tc"]
    exchange(node, {"b2": range(1, 6)})

    # b1 on XDP: the XDP entry joins with the instance's maps (the flow added above, one ring)
    assert "XDP" in rx("attach-dev", "--dev", "b1", "--hook", "xdp").stdout
    assert hooks_on_b() == {"b1": (True, False), "b2": (False, True)}
    exchange(node, {"b1": range(10, 17), "b2": range(20, 23)})

    # b1's chain goes with its last member; the instance goes on on b2
    first_xdp = int(json.loads(subprocess.run(["bpftool", "-j", "prog", "show", "pinned", str(PIN / "prog")],
                                              capture_output=True, text=True, check=True).stdout)["id"])  # fmt: skip
    rx("detach-dev", "--dev", "b1")
    assert hooks_on_b() == {"b1": (False, False), "b2": (False, True)}
    assert not (PIN_ROOT / INST / "xdp_chain").exists()
    exchange(node, {"b2": range(30, 33)})

    # another program makes b1's chain again; ioam_rx joins it with an XDP entry loaded against it
    # (auto on a veth that runs XDP already: the chain, whose NAPI cost is paid, not a second hook)
    run(COLLECTOR, "attach", "--netns", NS_B, "--dev", "b1", "--pin-dir", str(COLLECTOR_PIN))
    assert "XDP" in rx("attach-dev", "--dev", "b1", "--hook", "auto").stdout
    again = int(json.loads(subprocess.run(["bpftool", "-j", "prog", "show", "pinned", str(PIN / "prog")],
                                          capture_output=True, text=True, check=True).stdout)["id"])  # fmt: skip
    assert again != first_xdp, "the XDP entry of the removed chain was used again"
    c0 = collector_counters()
    exchange(node, {"b1": range(40, 48), "b2": range(50, 52)})
    # every frame ioam_rx passed on at b1 reached the next member of b1's chain
    assert delta(c0, collector_counters()) == {"pass_other_ext_header": 8}

    # detach on the TC device: off b1's XDP too, pins gone; the collector's chain on b1 goes on
    p = rx("detach", "--dev", "b2")
    assert "ioam_rx also left b1" in p.stdout, p.stdout
    assert hooks_on_b() == {"b1": (True, False), "b2": (False, False)}
    assert not PIN.exists()
    c1 = collector_counters()
    send("b1", range(60, 64))
    assert delta(c1, collector_counters()) == {"pass_other_ext_header": 4}
    run(COLLECTOR, "detach", "--netns", NS_B, "--dev", "b1", "--pin-dir", str(COLLECTOR_PIN))
    assert hooks_on_b() == {"b1": (False, False), "b2": (False, False)}


def test_attach_dev_refusals_and_test_run_entries(node):
    """attach-dev on a device already on the instance is refused with what runs there; test-run
    picks the entry by --hook (without it, the XDP one when there is one)."""
    rx("attach", "--dev", "b1", "--node-id", str(NODE_ID), "--hook", "tc")
    try:
        p = rx("attach-dev", "--dev", "b1", "--hook", "tc", check=False)
        assert p.returncode == 1 and "already has a TC ingress filter" in p.stderr, p.stderr
        frame = instrumented(Trace(43, IOAM_NS, 4, [Node(62, 3, 1, 2, 1, 2)]), e2e_doh(41, IOAM_NS, 1, 2, 3)).hex()
        tc_only = json.loads(run(IOAM_RX, "test-run", "--instance", INST, "--hex", frame).stdout)
        assert tc_only["action"].startswith("TC_ACT"), tc_only
        rx("attach-dev", "--dev", "b2", "--hook", "xdp")
        both = json.loads(run(IOAM_RX, "test-run", "--instance", INST, "--hex", frame).stdout)
        assert both["action"] == "XDP_PASS", both
        tc = json.loads(run(IOAM_RX, "test-run", "--instance", INST, "--hex", frame, "--hook", "tc").stdout)
        assert tc["action"] == tc_only["action"], tc
    finally:
        rx("detach-dev", "--dev", "b2", check=False)
        rx("detach", "--dev", "b1", check=False)
    assert hooks_on_b() == {"b1": (False, False), "b2": (False, False)} and not PIN.exists()
