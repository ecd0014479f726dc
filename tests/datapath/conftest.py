"""Fixtures for the datapath tests (root, real kernel): build, veth pair, attached programs."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests.datapath.dp_env import REPO, Attached, VethPair, ensure_bpffs


@pytest.fixture(scope="session")
def datapath_build() -> None:
    if os.geteuid() != 0:
        pytest.fail("datapath tests need root (XDP, netns, bpffs)")
    subprocess.run(["make", "-s", "-C", str(REPO / "datapath")], check=True)
    ensure_bpffs()


@pytest.fixture(scope="module")
def veth(datapath_build):
    pair = VethPair()
    try:
        pair.setup()
        time.sleep(1.5)  # let the MLD reports of address setup pass before programs count anything
        yield pair
    finally:
        pair.teardown()


@pytest.fixture
def reflector(veth):
    with Attached(veth, with_collector=False) as a:
        yield a


@pytest.fixture
def reflector_and_collector(veth):
    with Attached(veth, with_collector=True) as a:
        yield a


# alternate-marking datapath fixtures (am_build, am_lab, am_testrun), shared by test_altmark_*.py
from tests.datapath.altmark_fixtures import am_build, am_lab, am_testrun  # noqa: E402,F401

# in-line IOAM datapath fixtures (io_build, io_testrun, io_lab), shared by test_ioam_*.py
from tests.datapath.ioam_fixtures import inserter, io_build, io_lab, io_testrun  # noqa: E402,F401
