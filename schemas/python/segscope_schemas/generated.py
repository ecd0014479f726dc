"""Files segscope generates and commits (the dashboards, the kustomize base rendered from the Helm
chart): write them, or with `check` compare them with what is committed, so a test fails when the
source changed and the files were not regenerated."""

from __future__ import annotations

import difflib
import sys
from pathlib import Path


def write_or_check(files: dict[Path, str], check: bool, regenerate: str, max_diff_lines: int = 80) -> int:
    """Write `files` ({path: text}); with check, write nothing and print a diff of each stale file.
    Returns 0, or 1 when check found a stale file (stderr names them and the `regenerate` command)."""
    stale = []
    for path, text in files.items():
        if check:
            old = path.read_text() if path.exists() else ""
            if old != text:
                stale.append(path.name)
                diff = difflib.unified_diff(old.splitlines(True), text.splitlines(True), str(path), "generated")
                sys.stdout.writelines(list(diff)[:max_diff_lines])
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"stale: {', '.join(stale)}; run: {regenerate}", file=sys.stderr)
        return 1
    return 0
