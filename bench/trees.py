"""A commit's tree in a temporary directory (git archive), so a benchmark can run the worker of
an earlier commit next to this tree's in the same run: before and after on the same machine load."""

from __future__ import annotations

import subprocess
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def archived_tree(commit: str, prefix: str = "bench-before-") -> Path:
    """The files of `commit` (this repository) in a new temporary directory."""
    tree = Path(tempfile.mkdtemp(prefix=prefix))
    archive = subprocess.run(["git", "archive", commit], cwd=REPO, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(tree, filter="data")
    return tree


def short_commit(commit: str) -> str:
    out = subprocess.run(["git", "rev-parse", "--short", commit], cwd=REPO, capture_output=True, text=True, check=True)
    return out.stdout.strip()
