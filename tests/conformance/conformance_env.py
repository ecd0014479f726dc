"""Helpers of the conformance tests: the programs under test, their counters, R's per-SID counters.

Everything runs the real binaries/modules: build/datapath/stamp_{reflector,collector} (XDP),
build/collectors/stamp_sender (C sender) and `python -m collectors.ustamp` (user space).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# netlab/topologies/line5_two_paths.yaml: the sender on A, the reflector address on B, two End SIDs on R.
# The user-space reflector process, the ustamp sender and R's per-SID counters are the ustamp tests' own
# helpers (tests/ustamp/ustamp_env.py), shared rather than copied: re-exported here for the tests.
from tests.ustamp.ustamp_env import REFLECTOR_ADDR, SENDER_ADDR, SID_FWD, SID_RET, sid_packets  # noqa: F401
from tests.ustamp.ustamp_env import ReflectorProc as UstampReflector  # noqa: F401
from tests.ustamp.ustamp_env import run_sender as run_ustamp_sender  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
ENV = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'schemas' / 'python'}"}
XDP_REFLECTOR = REPO / "build" / "datapath" / "stamp_reflector"
XDP_COLLECTOR = REPO / "build" / "datapath" / "stamp_collector"
C_SENDER = REPO / "build" / "collectors" / "stamp_sender"
TOPOLOGY = "netlab/topologies/line5_two_paths.yaml"


# Datapath counters that other traffic on the device may move (neighbour discovery, MLD, ...):
# every STAMP-port counter must move exactly as a test expects, these may move freely.
NOISE_COUNTERS = {
    "pass_not_ipv6",
    "pass_not_local_addr",
    "pass_other_ext_header",
    "pass_srh_not_final",
    "pass_not_udp",
    "pass_other_port",
    "pass_not_stamp_reply",
}


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
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0) and k not in NOISE_COUNTERS}
