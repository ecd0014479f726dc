"""Session fixtures of the alternate-marking datapath tests (imported by tests/datapath/conftest.py).

am_lab: netlab line5 (prefix PREFIX) with altmark_tx on A's a0 (TC egress, after the seg6 encap)
and altmark_rx on B's b0 (XDP, before End.DT6), plus a second, unmonitored policy on A
(fd00:b::100 -> SID list [fc00:3::d6]) to H2's extra address fd00:b::100.
am_testrun: both programs attached to a veth pair in their own namespace, for BPF_PROG_TEST_RUN
without lab traffic in the counters.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass

import pytest

from tests.datapath.altmark_env import PIN_ROOT, PREFIX, REPO, RX, TX, Maps, TestRun, run

UNMONITORED_DST = "fd00:b::100"
UNMONITORED_SIDS = ["fc00:3::d6"]


@dataclass
class AmLab:
    lab: object
    tx_inst: str
    rx_inst: str
    tx_maps: Maps
    rx_maps: Maps


@pytest.fixture(scope="session")
def am_build() -> None:
    if os.geteuid() != 0:
        pytest.fail("altmark datapath tests need root (TC, XDP, netns, bpffs)")
    subprocess.run(["make", "-s", "-C", str(REPO / "datapath")], check=True)


@pytest.fixture(scope="session")
def am_lab(am_build):
    from netlab import Lab

    with Lab.up("netlab/topologies/line5.yaml", prefix=PREFIX) as lab:
        lab.run(
            "A",
            [
                "ip",
                "-6",
                "route",
                "replace",
                f"{UNMONITORED_DST}/128",
                "encap",
                "seg6",
                "mode",
                "encap",
                "segs",
                ",".join(UNMONITORED_SIDS),
                "dev",
                "a0",
            ],
            check=True,
        )
        lab.run("H2", ["ip", "-6", "addr", "add", f"{UNMONITORED_DST}/64", "dev", "h2", "nodad"], check=True)
        tx_inst, rx_inst = f"{PREFIX}-A", f"{PREFIX}-B"
        run(TX, "attach", "--netns", lab.ns("A"), "--dev", "a0", "--instance", tx_inst)
        run(RX, "attach", "--netns", lab.ns("B"), "--dev", "b0", "--instance", rx_inst)
        # warm up neighbour entries of the extra address (ND), so no test waits for it
        lab.run("H1", ["ping", "-6", "-c", "1", "-W", "2", UNMONITORED_DST])
        time.sleep(0.2)
        try:
            yield AmLab(
                lab, tx_inst, rx_inst, Maps(PIN_ROOT / tx_inst / "altmark_tx"), Maps(PIN_ROOT / rx_inst / "altmark_rx")
            )
        finally:
            run(TX, "detach", "--netns", lab.ns("A"), "--dev", "a0", "--instance", tx_inst, check=False)
            run(RX, "detach", "--netns", lab.ns("B"), "--dev", "b0", "--instance", rx_inst, check=False)


@dataclass
class AmTestRun:
    inst: str
    tx: TestRun
    rx: TestRun
    tx_maps: Maps
    rx_maps: Maps


@pytest.fixture(scope="session")
def am_testrun(am_build):
    ns, inst = f"{PREFIX}tr", f"{PREFIX}tr"  # not "<prefix>-...": that would belong to the lab
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        # the devices stay down and without IPv6: no packet of their own reaches the counters
        for cmd in (
            ["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"],
            ["sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1"],
            ["ip", "link", "add", f"{PREFIX}tr0", "type", "veth", "peer", "name", f"{PREFIX}tr1"],
        ):
            subprocess.run(["ip", "netns", "exec", ns, *cmd], check=True)
        run(TX, "attach", "--netns", ns, "--dev", f"{PREFIX}tr0", "--instance", inst)
        run(RX, "attach", "--netns", ns, "--dev", f"{PREFIX}tr1", "--instance", inst)
        tx_dir, rx_dir = PIN_ROOT / inst / "altmark_tx", PIN_ROOT / inst / "altmark_rx"
        yield AmTestRun(inst, TestRun(tx_dir / "prog"), TestRun(rx_dir / "prog"), Maps(tx_dir), Maps(rx_dir))
    finally:
        run(TX, "detach", "--netns", ns, "--dev", f"{PREFIX}tr0", "--instance", inst, check=False)
        run(RX, "detach", "--netns", ns, "--dev", f"{PREFIX}tr1", "--instance", inst, check=False)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
