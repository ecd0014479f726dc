"""Session fixtures of the in-line IOAM datapath tests (imported by tests/datapath/conftest.py).

io_testrun: ioam_tx and ioam_rx attached to a veth pair in their own namespace (devices down, no
IPv6: no packet of their own reaches the counters), for BPF_PROG_TEST_RUN; a second veth pair with
a small MTU for the MTU check (a TC test run takes skb->dev from the context's ifindex).
"""

from __future__ import annotations

import contextlib
import os
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.datapath.altmark_env import TestRun
from tests.datapath.dp_env import in_netns
from tests.datapath.ioam_env import IOAM_LWT, IOAM_RX, IOAM_TX, PIN_ROOT, POLICY, PREFIX, REPO, run

SKB_CTX_SIZE = 192  # struct __sk_buff (uapi bpf.h)
SKB_INGRESS_IFINDEX_OFF, SKB_IFINDEX_OFF, SKB_GSO_SEGS_OFF, SKB_GSO_SIZE_OFF = 36, 40, 164, 176


def skb_ctx(ifindex: int = 0, ingress_ifindex: int = 0, gso_segs: int = 0, gso_size: int = 0) -> bytes:
    """A struct __sk_buff for a TC test run: the device it leaves by (MTU, egress if id), the one it came in by."""
    ctx = bytearray(SKB_CTX_SIZE)
    struct.pack_into("<I", ctx, SKB_INGRESS_IFINDEX_OFF, ingress_ifindex)
    struct.pack_into("<I", ctx, SKB_IFINDEX_OFF, ifindex)
    struct.pack_into("<I", ctx, SKB_GSO_SEGS_OFF, gso_segs)
    struct.pack_into("<I", ctx, SKB_GSO_SIZE_OFF, gso_size)
    return bytes(ctx)


@dataclass
class IoTestRun:
    ns: str
    inst: str
    tx: TestRun
    rx: TestRun
    devs: dict[str, str]  # t0 (ioam_tx), t1 (ioam_rx), m0/m1 (MTU 1280) -> device name
    ifindex: dict[str, int]  # the same keys -> ifindex in ns

    def tx_run(self, frame: bytes, ctx: bytes | None = None, repeat: int = 1) -> tuple[int, bytes, int]:
        """A TC test run inside ns (the context's ifindex names a device of ns)."""
        with in_netns(self.ns):
            return self.tx.run(frame, repeat=repeat, ctx=ctx)


@pytest.fixture(scope="session")
def io_build() -> None:
    if os.geteuid() != 0:
        pytest.fail("in-line IOAM datapath tests need root (TC, XDP, netns, bpffs)")
    subprocess.run(["make", "-s", "-C", str(REPO / "datapath")], check=True)


@pytest.fixture(scope="session")
def io_testrun(io_build):
    ns = inst = f"{PREFIX}tr"  # not "<prefix>-...": that would belong to a lab
    names = {k: f"{PREFIX}{k}" for k in ("t0", "t1", "m0", "m1")}
    devs = list(names.values())
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        for cmd in (
            ["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"],
            ["sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1"],
            ["ip", "link", "add", devs[0], "type", "veth", "peer", "name", devs[1]],
            ["ip", "link", "add", devs[2], "mtu", "1280", "type", "veth", "peer", "name", devs[3]],
        ):
            subprocess.run(["ip", "netns", "exec", ns, *cmd], check=True)
        run(IOAM_TX, "attach", "--netns", ns, "--dev", devs[0], "--instance", inst, "--tai-offset", "37")
        run(
            IOAM_RX,
            "attach",
            "--netns",
            ns,
            "--dev",
            devs[1],
            "--instance",
            inst,
            "--node-id",
            "9",
            "--tai-offset",
            "37",
        )
        ifindex = {}
        for k, d in names.items():
            p = subprocess.run(
                ["ip", "netns", "exec", ns, "cat", f"/sys/class/net/{d}/ifindex"],
                capture_output=True,
                text=True,
                check=True,
            )
            ifindex[k] = int(p.stdout)
        tx_dir, rx_dir = PIN_ROOT / inst / "ioam_tx", PIN_ROOT / inst / "ioam_rx"
        yield IoTestRun(ns, inst, TestRun(tx_dir / "prog"), TestRun(rx_dir / "prog"), names, ifindex)
    finally:
        run(IOAM_TX, "detach", "--netns", ns, "--dev", devs[0], "--instance", inst, check=False)
        run(IOAM_RX, "detach", "--netns", ns, "--dev", devs[1], "--instance", inst, check=False)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


# IOAM in the lab: R and B fill their trace entries (kernel), node ids and interface ids below
LAB_NAMESPACE = 123
LAB_NODES = {"A": 5, "R": 7, "B": 9}  # IOAM node ids (A: ioam_tx --node-id; R, B: net.ipv6.ioam6_id)
LAB_IF_IDS = {("A", "ah"): 10, ("A", "a0"): 11, ("R", "r0"): 70, ("R", "r1"): 71, ("B", "b0"): 90, ("B", "bh"): 91}


@dataclass
class IoLab:
    lab: object
    tx_inst: str
    rx_inst: str
    tx_tool: Path = IOAM_TX  # the inserter the flows go to: ioam_tx (TC) or ioam_lwt (the route program)


# A's policy route in line5, as `ip -6 route show` prints it before and after attach-route
A_ROUTE = "fd00:b::/64"
A_SEG6 = f"{A_ROUTE}  encap seg6 mode encap segs 2 [ {' '.join(POLICY)} ] dev a0"


def a_route(io_lab) -> str:
    return io_lab.lab.run("A", ["ip", "-6", "route", "show", A_ROUTE], check=True).stdout.strip()


def route_args(io_lab) -> list[str]:
    """ioam_lwt attach-route's / detach-route's arguments for A's policy route."""
    where = ["--netns", io_lab.lab.ns("A"), "--instance", io_lab.tx_inst]
    return [*where, "--prefix", A_ROUTE, "--dev", "a0", "--sids", ",".join(POLICY)]


@contextlib.contextmanager
def route_program(io_lab, extra: tuple[str, ...] = ()):
    """ioam_lwt on A's policy route in place of its seg6 encap (interface ids as ioam_tx's); the
    flows of the block go to it. After: the seg6 route back, byte for byte, and no pins left."""
    lab, inst = io_lab.lab, io_lab.tx_inst
    route = route_args(io_lab)
    before = a_route(io_lab)
    run(IOAM_LWT, "attach-route", *route, *extra)
    try:
        for dev in ("ah", "a0"):
            run(IOAM_LWT, "set-if-id", "--instance", inst, "--netns", lab.ns("A"), "--dev", dev,
                "--if-id", str(LAB_IF_IDS[("A", dev)]))  # fmt: skip
        io_lab.tx_tool = IOAM_LWT
        yield
    finally:
        io_lab.tx_tool = IOAM_TX
        run(IOAM_LWT, "detach-route", *route)
    assert a_route(io_lab) == before, "the seg6 route is back as it was"
    rules = io_lab.lab.run("A", ["ip", "-6", "rule", "show"], check=True).stdout
    assert "lookup 3355" not in rules and "lookup 3356" not in rules, "the copies' rules are gone"
    for table in ("3355", "3356"):
        assert not io_lab.lab.run("A", ["ip", "-6", "route", "show", "table", table], check=True).stdout.strip()
    assert not (PIN_ROOT / inst / "ioam_lwt").exists(), "the last route took the pins with it"


@pytest.fixture(params=["tc", "route", "route-fixed-next-hop"])
def inserter(io_lab, request):
    """The lab's ingress insertion: ioam_tx on a0's TC egress, or ioam_lwt on A's policy route (the
    kernel's seg6 encap for the packets not instrumented, or, with --fixed-next-hop, the program's
    header for every packet and the first SID's gateway in the route)."""
    if request.param == "tc":
        yield "tc"
        return
    with route_program(io_lab, ("--fixed-next-hop",) if request.param.endswith("fixed-next-hop") else ()):
        yield request.param


def lab_enable_ioam(lab) -> None:
    """Transit R and egress B fill their entries of namespace LAB_NAMESPACE (sysctls, `ip ioam`)."""
    for node in ("R", "B"):
        lab.run(node, ["sysctl", "-qw", f"net.ipv6.ioam6_id={LAB_NODES[node]}"], check=True)
        for (n, dev), if_id in LAB_IF_IDS.items():
            if n == node:
                lab.run(
                    node,
                    ["sysctl", "-qw", f"net.ipv6.conf.{dev}.ioam6_enabled=1", f"net.ipv6.conf.{dev}.ioam6_id={if_id}"],
                    check=True,
                )
        lab.run(node, ["ip", "ioam", "namespace", "add", str(LAB_NAMESPACE)], check=True)


@pytest.fixture(scope="session")
def io_lab(io_build):
    """netlab line5 (prefix PREFIX) with IOAM on R and B, ioam_tx on A's a0 (after the seg6 encap),
    ioam_rx on B's b0 (before End.DT6); no flows installed."""
    from netlab import Lab

    with Lab.up("netlab/topologies/line5.yaml", prefix=PREFIX) as lab:
        lab_enable_ioam(lab)
        tx_inst, rx_inst = f"{PREFIX}-A", f"{PREFIX}-B"
        run(IOAM_TX, "attach", "--netns", lab.ns("A"), "--dev", "a0", "--instance", tx_inst)
        for dev in ("ah", "a0"):
            run(
                IOAM_TX,
                "set-if-id",
                "--instance",
                tx_inst,
                "--netns",
                lab.ns("A"),
                "--dev",
                dev,
                "--if-id",
                str(LAB_IF_IDS[("A", dev)]),
            )
        run(
            IOAM_RX,
            "attach",
            "--netns",
            lab.ns("B"),
            "--dev",
            "b0",
            "--instance",
            rx_inst,
            "--node-id",
            str(LAB_NODES["B"]),
        )
        try:
            yield IoLab(lab, tx_inst, rx_inst)
        finally:
            run(IOAM_TX, "detach", "--netns", lab.ns("A"), "--dev", "a0", "--instance", tx_inst, check=False)
            run(IOAM_RX, "detach", "--netns", lab.ns("B"), "--dev", "b0", "--instance", rx_inst, check=False)
