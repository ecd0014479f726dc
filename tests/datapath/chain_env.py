"""Helpers for tests and benchmarks of the XDP chain (datapath/xdp_chain.h): the role order as the
header defines it, a loader's `chain` JSON, and BPF_PROG_TEST_RUN of an instance's dispatcher
with the ingress device set (the dispatcher finds a packet's members by ingress_ifindex)."""

from __future__ import annotations

import json
import re
import struct
import subprocess
from pathlib import Path

from tests.datapath.altmark_env import TestRun
from tests.datapath.dp_env import BUILD, PIN_ROOT, REPO, in_netns, run_tool

XDP_ABORTED, XDP_DROP, XDP_PASS, XDP_TX = 0, 1, 2, 3


def role_order() -> list[str]:
    """The roles in the order a packet visits them: xdp_chain_role_names of datapath/xdp_chain.h,
    read from the header so the tests follow it (a role appended there is appended here)."""
    text = (REPO / "datapath" / "xdp_chain.h").read_text()
    enum = dict(re.findall(r"XDP_CHAIN_(\w+)\s*=\s*(\d+),", text))
    names = dict(re.findall(r"\[XDP_CHAIN_(\w+)\]\s*=\s*\"(\w+)\"", text))
    return [names[k] for k in sorted(names, key=lambda k: int(enum[k]))]


def chain_of(netns: str, instance: str) -> dict[str, list[dict]]:
    """`stamp_reflector chain` of an instance: {device: [{"role", "id", "name"}, ...]} in role order.
    (Any member's loader prints it; only the instance directory matters.)"""
    p = run_tool(BUILD / "stamp_reflector", "chain", "--netns", netns, "--pin-dir", str(PIN_ROOT / instance / "x"))
    return json.loads(p.stdout)


def prog_id(pin: Path) -> int:
    out = subprocess.run(["bpftool", "-j", "prog", "show", "pinned", str(pin)], capture_output=True, text=True)
    return json.loads(out.stdout)["id"] if out.returncode == 0 else 0


def xdp_program(netns: str, dev: str) -> str | None:
    """Name of the native XDP program attached to dev (None: none)."""
    out = subprocess.run(
        ["ip", "-n", netns, "-j", "link", "show", "dev", dev], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)[0].get("xdp", {}).get("prog", {}).get("name")


def xdp_md(frame_len: int, ingress_ifindex: int) -> bytes:
    """struct xdp_md for BPF_PROG_TEST_RUN: data 0, data_end = frame length, no metadata, the
    receiving device (the kernel looks it up in the caller's netns: run inside it)."""
    return struct.pack("<6I", 0, frame_len, 0, ingress_ifindex, 0, 0)


class DispatcherRun:
    """BPF_PROG_TEST_RUN of an instance's dispatcher (<instance>/xdp_chain/prog) as if the frame
    had arrived on a device of netns: returns (verdict, frame out, kernel ns per run)."""

    def __init__(self, netns: str, instance: str):
        self.netns = netns
        self.prog = TestRun(PIN_ROOT / instance / "xdp_chain" / "prog")

    def run(self, frame: bytes, ifindex: int, repeat: int = 1) -> tuple[int, bytes, int]:
        with in_netns(self.netns):
            return self.prog.run(frame, repeat=repeat, ctx=xdp_md(len(frame), ifindex))
