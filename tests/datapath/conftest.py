"""Fixtures for the datapath tests (root, real kernel): build, veth pair, attached programs."""
from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from tests.datapath.dp_env import (COLLECTOR, PIN_ROOT, REFLECTOR, REPO, VethPair, ensure_bpffs,
                                   run_tool, sh)

pytestmark = pytest.mark.datapath


@pytest.fixture(scope="session")
def datapath_build() -> None:
    if os.geteuid() != 0:
        pytest.fail("datapath tests need root (XDP, netns, bpffs)")
    subprocess.run(["make", "-s", "-C", str(REPO / "datapath")], check=True)
    ensure_bpffs()


def _remove_pins(pin_dir) -> None:
    if pin_dir.exists():
        shutil.rmtree(pin_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def veth(datapath_build):
    pair = VethPair()
    try:
        pair.setup()
        time.sleep(1.5)   # let the MLD reports of address setup pass before programs count anything
        yield pair
    finally:
        pair.teardown()


class Attached:
    """The reflector on dp-x0, and on dp-s0 either the collector or a count-and-pass program."""

    def __init__(self, veth: VethPair, with_collector: bool, ringbuf_size: int | None = None):
        self.veth = veth
        self.refl_dir = PIN_ROOT / "dp-x" / "stamp_reflector"
        self.coll_dir = PIN_ROOT / "dp-s" / "stamp_collector"
        self.with_collector = with_collector
        self.ringbuf_size = ringbuf_size

    def __enter__(self) -> "Attached":
        v = self.veth
        _remove_pins(self.refl_dir)
        _remove_pins(self.coll_dir)
        v.detach_xdp(v.x_ns, v.x_dev)
        v.detach_xdp(v.s_ns, v.s_dev)
        run_tool(REFLECTOR, "attach", "--netns", v.x_ns, "--dev", v.x_dev, "--pin-dir", str(self.refl_dir))
        run_tool(REFLECTOR, "add-address", "--pin-dir", str(self.refl_dir), v.x_addr)
        if self.with_collector:
            extra = ["--ringbuf-size", str(self.ringbuf_size)] if self.ringbuf_size else []
            run_tool(COLLECTOR, "attach", "--netns", v.s_ns, "--dev", v.s_dev,
                     "--pin-dir", str(self.coll_dir), *extra)
        else:
            v.attach_count_pass(v.s_ns, v.s_dev)
        return self

    def __exit__(self, *exc) -> None:
        v = self.veth
        run_tool(REFLECTOR, "detach", "--netns", v.x_ns, "--dev", v.x_dev, "--pin-dir", str(self.refl_dir),
                 check=False)
        if self.with_collector:
            run_tool(COLLECTOR, "detach", "--netns", v.s_ns, "--dev", v.s_dev, "--pin-dir",
                     str(self.coll_dir), check=False)
        v.detach_xdp(v.s_ns, v.s_dev)
        v.detach_xdp(v.x_ns, v.x_dev)
        _remove_pins(self.refl_dir)
        _remove_pins(self.coll_dir)


@pytest.fixture
def reflector(veth):
    with Attached(veth, with_collector=False) as a:
        yield a


@pytest.fixture
def reflector_and_collector(veth):
    with Attached(veth, with_collector=True) as a:
        yield a
