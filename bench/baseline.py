"""The datapath as it was at another commit, built beside the current one, so a benchmark can
measure before and after in ONE run (interleaved: the shared machine's load drifts between runs).

    build_datapath("ddc18de")  # -> /tmp/segscope-datapath-<sha>/build/datapath (loaders, .bpf.o)

Only datapath/ and schemas/c/ of that commit are taken (`git archive`), and built with its own
Makefile; a second call for the same commit reuses the build.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def build_datapath(rev: str) -> Path:
    sha = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    root = Path(tempfile.gettempdir()) / f"segscope-datapath-{sha[:12]}"
    out = root / "build" / "datapath"
    if not (out / "stamp_reflector").exists():
        root.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", sha, "datapath", "schemas/c"], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
        subprocess.run(["make", "-s", "-C", str(root / "datapath")], check=True)
    return out
