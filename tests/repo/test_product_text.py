"""Product text says what a thing is, never which issue or ticket asked for it: no issue numbers in
code, docs, dashboards, deploy files or help text. Scans every tracked text file."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# "issue 17", "issues 12 and 13", "(#17)", "ticket 4", "PR 9": a tracker reference; not a TLV type,
# an RFC section or a colour (those read "type 0x0D", "RFC 8762 §4", "#888")
TRACKER = re.compile(r"\b(?:issues?|tickets?|PR)\s+#?\d+\b|\(#\d{1,5}\)", re.IGNORECASE)
# recorded timings, and this file (its examples are the pattern's test vectors)
SKIP = {"tests/durations.json", "tests/repo/test_product_text.py"}
TEXT_SUFFIXES = {".py", ".md", ".c", ".h", ".yaml", ".yml", ".toml", ".json", ".sh", ".conf", ".proto", ".txt",
                 ".tpl", ".cfg", ".ini", ".service", ""}  # fmt: skip


def tracked_text_files() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [f for f in out.splitlines() if Path(f).suffix in TEXT_SUFFIXES and f not in SKIP]


def test_no_issue_numbers_in_product_text():
    hits = []
    for name in tracked_text_files():
        path = REPO / name
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            for m in TRACKER.finditer(line):
                hits.append(f"{name}:{lineno}: {m.group(0)!r} in {line.strip()[:100]}")
    assert not hits, "issue references in product text (say what the thing is instead):\n" + "\n".join(hits)


def test_the_pattern_finds_what_it_must():
    found = [bool(TRACKER.search(s)) for s in ("Goal (issue 17): x", "capacity (#17)", "see issues 12", "ticket #4")]
    missed = [bool(TRACKER.search(s)) for s in ("RFC 8762 §4", "colour: #888", "&#39;", "type 0x0D", "C#")]
    assert found == [True] * 4 and missed == [False] * 5
