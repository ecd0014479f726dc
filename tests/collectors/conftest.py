"""Fixtures for the collector tests: built binaries, a 2-netns veth pair, bpffs, Kafka."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.isolation import own_name

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "build" / "collectors"
PREFIX = own_name("co")  # resource prefix of these tests (netns, veths, pins)
PIN_ROOT = Path("/sys/fs/bpf") / f"{PREFIX}-test"
# isolated Kafka outside the test runner: 29000 (controller 29001); SEGSCOPE_CO_KAFKA_PORT_BASE
# moves it (two checkouts running these tests at once on one machine would otherwise share one
# port). Under scripts/test_groups.py the group's port block decides (tests/isolation.py).
KAFKA_PORT_BASE = int(os.environ.get("SEGSCOPE_CO_KAFKA_PORT_BASE", "29000"))


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True)


@pytest.fixture(scope="session")
def collectors_build() -> Path:
    subprocess.run(["make", "-C", str(REPO / "collectors"), "-s"], check=True)
    return BUILD


class VethPair:
    """netns co-snd (veth co-s0, fd00:c0::1) <-> netns co-rcv (veth co-r0, fd00:c0::2)."""

    snd_ns, rcv_ns = f"{PREFIX}-snd", f"{PREFIX}-rcv"
    snd_if, rcv_if = f"{PREFIX}-s0", f"{PREFIX}-r0"
    snd_addr, rcv_addr = "fd00:c0::1", "fd00:c0::2"
    snd_mac, rcv_mac = "02:c0:00:00:00:01", "02:c0:00:00:00:02"

    def up(self) -> "VethPair":
        self.down()
        sh("ip", "netns", "add", self.snd_ns)
        sh("ip", "netns", "add", self.rcv_ns)
        sh(
            "ip",
            "link",
            "add",
            self.snd_if,
            "netns",
            self.snd_ns,
            "address",
            self.snd_mac,
            "type",
            "veth",
            "peer",
            "name",
            self.rcv_if,
            "netns",
            self.rcv_ns,
            "address",
            self.rcv_mac,
        )
        for ns, dev, addr, peer_addr, peer_mac in (
            (self.snd_ns, self.snd_if, self.snd_addr, self.rcv_addr, self.rcv_mac),
            (self.rcv_ns, self.rcv_if, self.rcv_addr, self.snd_addr, self.snd_mac),
        ):
            ex = ("ip", "netns", "exec", ns)
            sh(*ex, "ip", "link", "set", "lo", "up")
            sh(*ex, "ip", "link", "set", dev, "up")
            sh(*ex, "ip", "-6", "addr", "add", f"{addr}/64", "dev", dev, "nodad")
            sh(*ex, "ip", "-6", "neigh", "replace", peer_addr, "lladdr", peer_mac, "dev", dev, "nud", "permanent")
            # kernel-socket senders need full checksums in the frame (see notes/infra-ebpf.md)
            sh(*ex, "ethtool", "-K", dev, "tx", "off")
        # SIDs and remote destinations are reached through the peer
        sh(
            "ip",
            "netns",
            "exec",
            self.snd_ns,
            "ip",
            "-6",
            "route",
            "add",
            "fc00::/16",
            "via",
            self.rcv_addr,
            "dev",
            self.snd_if,
        )
        self._wait_operstate_up()
        return self

    def _wait_operstate_up(self, timeout: float = 5.0) -> None:
        """A fresh veth drops what it is given until link-watch marks it up (~up to 1 s)."""
        deadline = time.monotonic() + timeout
        for ns, dev in ((self.snd_ns, self.snd_if), (self.rcv_ns, self.rcv_if)):
            while sh("ip", "netns", "exec", ns, "cat", f"/sys/class/net/{dev}/operstate").stdout.strip() != "up":
                assert time.monotonic() < deadline, f"{ns}/{dev} did not come up"
                time.sleep(0.05)

    def down(self) -> None:
        for ns in (self.snd_ns, self.rcv_ns):
            if os.path.exists(f"/run/netns/{ns}"):
                sh("ip", "netns", "del", ns, check=False)


@pytest.fixture
def work_dir(request) -> Path:
    """Scratch files of one test under .run/co-test/ (our prefix, inside the repo's run dir)."""
    d = REPO / ".run" / f"{PREFIX}-test" / request.node.name.replace("/", "_")
    subprocess.run(["rm", "-rf", str(d)], check=True)
    d.mkdir(parents=True)
    return d


@pytest.fixture
def veth_pair():
    pair = VethPair().up()
    try:
        yield pair
    finally:
        pair.down()


@pytest.fixture(scope="session")
def co_pins(bpffs) -> Path:
    """/sys/fs/bpf/co-test: pins of these tests only (bpffs: tests/conftest.py mounts it)."""
    PIN_ROOT.mkdir(exist_ok=True)
    yield PIN_ROOT
    sh("rm", "-rf", str(PIN_ROOT), check=False)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """Our own Kafka (services/stack.py, tests/isolation.py slot 1; in a lone run port base 29000
    or SEGSCOPE_CO_KAFKA_PORT_BASE and run dir .run/co-stack): the streamer tests create their own
    topics and must not depend on the suite-wide stack's state."""
    from services.stack import Stack
    from tests.isolation import extra_stack

    run_dir, port_base = extra_stack("co-stack", slot=1, default_port_base=KAFKA_PORT_BASE)
    stack = Stack(run_dir=run_dir, port_base=port_base, fresh=True)
    with stack.shared(only=["kafka"]):
        yield stack.kafka_bootstrap
