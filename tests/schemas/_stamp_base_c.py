"""Builds and runs the C test of the STAMP base wire formats (schemas/tests/test_stamp_base.c).

Shared by test_stamp_timestamp.py, test_stamp_error_estimate.py and
test_stamp_auth_packet.py; the run is cached for the pytest session.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VECTORS = REPO / "schemas" / "vectors"
BINARY = REPO / "build" / "schemas" / "test_stamp_base"


@dataclass(frozen=True)
class CRun:
    returncode: int
    passed: int
    failed: int
    stdout: str


@functools.lru_cache(maxsize=1)
def run_c_test() -> CRun:
    # the target name as schemas/Makefile spells it ($(OUT) = ../build/schemas)
    subprocess.run(
        ["make", "-C", str(REPO / "schemas"), "-s", "../build/schemas/test_stamp_base"], check=True, capture_output=True
    )
    p = subprocess.run([str(BINARY), str(VECTORS)], capture_output=True, text=True, timeout=60)
    m = re.search(r"^(\d+) passed, (\d+) failed$", p.stdout, re.M)
    assert m, f"no summary line in:\n{p.stdout}\n{p.stderr}"
    return CRun(p.returncode, int(m.group(1)), int(m.group(2)), p.stdout)


def load_vectors(name: str) -> dict:
    return json.loads((VECTORS / f"{name}.json").read_text())
