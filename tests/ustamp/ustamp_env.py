"""Helpers of the ustamp tests: processes of collectors.ustamp in netlab namespaces, R's SID counters."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
ENV = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'schemas' / 'python'}"}

# line5 addresses (netlab/topologies/line5.yaml) and the second End SID the tests add on R
SENDER_ADDR, REFLECTOR_ADDR = "fc00:1::1", "fc00:3::1"
SID_FWD, SID_RET = "fc00:2::e", "fc00:2::e2"


class ReflectorProc:
    """`python -m collectors.ustamp reflector` in a namespace; stdout JSON lines read by a thread."""

    def __init__(self, netns: str, *args: str):
        self.proc = subprocess.Popen(
            [PY, "-m", "collectors.ustamp", "reflector", "--netns", netns, *args],
            cwd=REPO,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        ready = self.next_line(15)
        assert ready.get("event") == "ready", ready
        self.ready = ready

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))

    def next_line(self, timeout: float = 10) -> dict:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(  # noqa: B904 - the timeout is the message; the Empty adds nothing
                f"no output from the reflector in {timeout} s; stderr: "
                f"{self.proc.stderr.read() if self.proc.poll() is not None else '(running)'}"
            )

    def counters(self) -> dict:
        self.proc.send_signal(signal.SIGUSR1)
        return self.next_line()["counters"]

    def stop(self, timeout: float = 60) -> dict:
        """SIGTERM; the final counters come after the fast engine has answered what its workers had
        queued for Python (up to 8192 datagrams: seconds on a busy machine)."""
        self.proc.send_signal(signal.SIGTERM)
        final = self.next_line(timeout)
        assert final.get("final") is True
        assert self.proc.wait(10) == 0
        return final["counters"]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def run_sender(netns: str, *args: str, timeout: float = 30) -> tuple[list[dict], dict, subprocess.CompletedProcess]:
    """Run the ustamp sender to completion: (records, summary, process)."""
    res = subprocess.run(
        [PY, "-m", "collectors.ustamp", "sender", "--netns", netns, *args],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [json.loads(l) for l in res.stdout.splitlines() if l.strip()]
    assert lines and "summary" in lines[-1], (res.returncode, res.stdout, res.stderr)
    return lines[:-1], lines[-1]["summary"], res


def sid_packets(lab, node: str = "R") -> dict[str, int]:
    """Packets counted per seg6local route (`count: true` / `count`) on a node."""
    out = lab.run(node, ["ip", "-s", "-6", "route", "show"], check=True).stdout
    return {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"^(\S+)\s+encap seg6local action \S+ packets (\d+)", out, re.M)
    }


def socket_in_netns(ns: str, family: int, kind: int, proto: int = 0) -> socket.socket:
    """A socket of namespace `ns`, opened from a short-lived thread (setns moves that thread only)."""
    from collectors.ustamp.netutil import enter_netns

    out: dict = {}

    def run() -> None:
        enter_netns(ns)
        out["sock"] = socket.socket(family, kind, proto)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out["sock"]
