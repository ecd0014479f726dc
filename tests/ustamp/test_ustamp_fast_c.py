"""The fast engine's C under sanitizers (collectors/tests/ustamp_fast_stress.c, white box).

Built with AddressSanitizer + UBSan and with ThreadSanitizer; each binary runs in a fresh network
namespace of its own (`unshare -n`: loopback only, SRv6 enabled on it so replies with a return
SID come back): the per-sender LRU table, session table lookups, and four workers under three
flooding sender threads while the main thread does what Python does (takes stateful numbers from
the same counter, publishes new tables, reads counters, drains the queue). Every stateful number
is handed out once, every datagram is accounted, and the sanitizers report nothing.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from ustamp_env import REPO

pytestmark = pytest.mark.datapath

SETUP = "ip link set lo up && sysctl -qw net.ipv6.conf.all.seg6_enabled=1 net.ipv6.conf.lo.seg6_enabled=1 && exec "


@pytest.fixture(scope="module")
def binaries():
    subprocess.run(["make", "-s", "-C", str(REPO / "collectors"), "ustamp-fast-tests"], check=True)
    return REPO / "build" / "collectors"


@pytest.mark.parametrize("sanitizer", ["asan", "tsan"])
def test_fast_path_under_sanitizer(binaries, sanitizer):
    exe = binaries / f"ustamp_fast_stress_{sanitizer}"
    env = {**os.environ, "TSAN_OPTIONS": "halt_on_error=1 exitcode=66", "ASAN_OPTIONS": "detect_leaks=1"}
    res = subprocess.run(
        ["unshare", "-n", "sh", "-c", SETUP + str(exe)], capture_output=True, text=True, timeout=600, env=env
    )
    assert res.returncode == 0, res.stderr[-4000:]
    assert "Sanitizer" not in res.stderr, res.stderr[-4000:]
    figures = json.loads(res.stdout.strip().splitlines()[-1])
    # the run exercised what it is about: replies from the workers, datagrams handed over, table swaps
    assert figures["reflected"] > 1000 and figures["handed_to_python"] > 100 and figures["publishes"] > 10
    print(f"\n{sanitizer}: {figures}")
