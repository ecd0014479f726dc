"""Helpers of the conformance tests: the programs under test, their counters, R's per-SID counters.

Everything runs the real binaries/modules: build/datapath/stamp_{reflector,collector} (XDP),
build/collectors/stamp_sender (C sender) and `python -m collectors.ustamp` (user space).
"""
from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
ENV = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'schemas' / 'python'}"}
XDP_REFLECTOR = REPO / "build" / "datapath" / "stamp_reflector"
XDP_COLLECTOR = REPO / "build" / "datapath" / "stamp_collector"
C_SENDER = REPO / "build" / "collectors" / "stamp_sender"
TOPOLOGY = "netlab/topologies/line5_two_paths.yaml"

# netlab/topologies/line5_two_paths.yaml: the sender on A, the reflector address on B, two End SIDs on R
SENDER_ADDR, REFLECTOR_ADDR = "fc00:1::1", "fc00:3::1"
SID_FWD, SID_RET = "fc00:2::e", "fc00:2::e2"

# Datapath counters that other traffic on the device may move (neighbour discovery, MLD, ...):
# every STAMP-port counter must move exactly as a test expects, these may move freely.
NOISE_COUNTERS = {"pass_not_ipv6", "pass_not_local_addr", "pass_other_ext_header", "pass_srh_not_final",
                  "pass_not_udp", "pass_other_port", "pass_not_stamp_reply"}


def build() -> None:
    for part in ("datapath", "collectors"):
        subprocess.run(["make", "-s", "-C", str(REPO / part)], check=True)


def run_tool(tool: Path, *args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    res = subprocess.run([str(tool), *args], capture_output=True, text=True, timeout=timeout)
    if check:
        assert res.returncode == 0, (tool.name, args, res.returncode, res.stderr)
    return res


def xdp_stats(tool: Path, pin: str) -> dict[str, int]:
    return json.loads(run_tool(tool, "stats", "--pin-dir", pin, "--json").stdout)


def counter_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Changed counters only (noise counters left out)."""
    return {k: after[k] - before.get(k, 0) for k in after
            if after[k] != before.get(k, 0) and k not in NOISE_COUNTERS}


def sid_packets(lab, node: str = "R") -> dict[str, int]:
    """Packets counted per seg6local route (`count: true`) on a node."""
    out = lab.run(node, ["ip", "-s", "-6", "route", "show"], check=True).stdout
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"^(\S+)\s+encap seg6local action \S+ packets (\d+)", out, re.M)}


class UstampReflector:
    """`python -m collectors.ustamp reflector` in a namespace; stdout JSON lines read by a thread."""

    def __init__(self, netns: str, *args: str):
        self.proc = subprocess.Popen([PY, "-m", "collectors.ustamp", "reflector", "--netns", netns, *args],
                                     cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        ready = self.next_line(20)
        assert ready.get("event") == "ready", ready

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))

    def next_line(self, timeout: float = 10) -> dict:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no output from the ustamp reflector in {timeout} s; stderr: "
                                 f"{self.proc.stderr.read() if self.proc.poll() is not None else '(running)'}")

    def counters(self) -> dict[str, int]:
        self.proc.send_signal(signal.SIGUSR1)
        return self.next_line()["counters"]

    def stop(self) -> dict[str, int]:
        if self.proc.poll() is not None:
            return {}
        self.proc.send_signal(signal.SIGTERM)
        final = self.next_line()
        self.proc.wait(10)
        return final.get("counters", {})

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def run_ustamp_sender(netns: str, *args: str, timeout: float = 30) -> tuple[list[dict], dict, subprocess.CompletedProcess]:
    """The ustamp sender to completion: (records, summary, process)."""
    res = subprocess.run([PY, "-m", "collectors.ustamp", "sender", "--netns", netns, *args],
                         cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout)
    lines = [json.loads(l) for l in res.stdout.splitlines() if l.strip()]
    assert lines and "summary" in lines[-1], (res.returncode, res.stdout, res.stderr)
    return lines[:-1], lines[-1]["summary"], res
