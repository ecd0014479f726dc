"""Fixtures for the fuzz tests: the real reflector and collector, attached in a throwaway netns.

The veth pair stays down: no packet ever reaches the programs from the link, so every counter
movement comes from our own BPF_PROG_TEST_RUN calls. Names carry SEGSCOPE_FUZZ_PREFIX (default fz).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fuzz.report import SUMMARY
from tests.isolation import own_name

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "build" / "datapath"
REFLECTOR = BUILD / "stamp_reflector"
COLLECTOR = BUILD / "stamp_collector"
PREFIX = os.environ.get("SEGSCOPE_FUZZ_PREFIX") or own_name("fz")
NETNS = f"{PREFIX}-fuzz"
DEV_REFL, DEV_COLL = f"{PREFIX}-fx0", f"{PREFIX}-fs0"
PIN_BASE = Path("/sys/fs/bpf/segscope") / NETNS


def tool(binary: Path, *args: str) -> str:
    p = subprocess.run([str(binary), *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise AssertionError(f"{binary.name} {' '.join(args)} -> exit {p.returncode}: {p.stderr.strip()}")
    return p.stdout


def stats(binary: Path, pin_dir: Path) -> dict[str, int]:
    """Counters by name, in the order of the program's counter enum (the loader prints them so)."""
    return json.loads(tool(binary, "stats", "--pin-dir", str(pin_dir), "--json"))


@dataclass
class FuzzTarget:
    netns: str
    refl_dir: Path
    coll_dir: Path


def _cleanup() -> None:
    for d in (PIN_BASE / "stamp_reflector", PIN_BASE / "stamp_collector"):
        if d.exists():
            shutil.rmtree(d, ignore_errors=True)
    subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)
    if PIN_BASE.exists():
        shutil.rmtree(PIN_BASE, ignore_errors=True)


@pytest.fixture(scope="session")
def fuzz_target(bpffs) -> FuzzTarget:
    if os.geteuid() != 0:
        pytest.fail("the XDP fuzz test needs root (BPF_PROG_TEST_RUN, netns, bpffs)")
    subprocess.run(["make", "-s", "-C", str(REPO / "datapath")], check=True)
    _cleanup()
    subprocess.run(["ip", "netns", "add", NETNS], check=True)
    try:
        subprocess.run(
            ["ip", "-n", NETNS, "link", "add", DEV_REFL, "type", "veth", "peer", "name", DEV_COLL], check=True
        )
        target = FuzzTarget(NETNS, PIN_BASE / "stamp_reflector", PIN_BASE / "stamp_collector")
        tool(REFLECTOR, "attach", "--netns", NETNS, "--dev", DEV_REFL, "--pin-dir", str(target.refl_dir))
        tool(
            COLLECTOR,
            "attach",
            "--netns",
            NETNS,
            "--dev",
            DEV_COLL,
            "--pin-dir",
            str(target.coll_dir),
            "--ringbuf-size",
            str(1 << 20),
        )
        yield target
    finally:
        for binary, dev, d in (
            (REFLECTOR, DEV_REFL, PIN_BASE / "stamp_reflector"),
            (COLLECTOR, DEV_COLL, PIN_BASE / "stamp_collector"),
        ):
            subprocess.run(
                [str(binary), "detach", "--netns", NETNS, "--dev", dev, "--pin-dir", str(d)], capture_output=True
            )
        _cleanup()


def pytest_terminal_summary(terminalreporter) -> None:
    if SUMMARY:
        terminalreporter.section("segscope fuzz")
        for line in SUMMARY:
            terminalreporter.write_line(line)
