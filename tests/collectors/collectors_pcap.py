"""tcpdump capture in a network namespace, for the collector tests."""

from __future__ import annotations

import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def capture(netns: str, dev: str, path: Path, expr: str = "ip6"):
    """tcpdump of IPv6 (or what `expr` selects) on `dev` in `netns` into `path` (nanosecond
    timestamps), stopped cleanly.

    --immediate-mode: without it, packets still in a partly filled capture block when tcpdump
    is stopped are never written (seen: an empty pcap after a short burst)."""
    proc = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            netns,
            "tcpdump",
            "-i",
            dev,
            "-n",
            "-U",
            "--immediate-mode",
            "-B",
            "16384",
            "--time-stamp-precision",
            "nano",
            "-w",
            str(path),
            expr,
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stderr.readline()  # "listening on ..." once the socket is up
    assert "listening" in line, line
    try:
        yield
    finally:
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=10)
