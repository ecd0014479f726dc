"""What every benchmark shares: the description of the machine it ran on, the writer of its
section of docs/benchmarks.md, and a Kafka-only stack of its own.

Each benchmark owns one section, between `<!-- NAME:begin -->` and `<!-- NAME:end -->`; a run
rewrites only its own section (appending it the first time) and leaves the others as they are.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import platform
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "benchmarks.md"
DOC_HEADER = (
    "# segscope benchmarks\n\nFigures measured on the project's machine; each section is rewritten by its script.\n"
)


def machine() -> dict:
    """CPU count and model, kernel, 1-minute load at the time of the call, Python, memory, date."""
    cpu = platform.processor() or "unknown"
    try:
        cpu = next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            cpu,
        )
    except OSError:
        pass
    mem_gib = None
    try:
        kib = next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal:")
        )
        mem_gib = round(kib / 2**20, 1)
    except (OSError, StopIteration, ValueError):
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "kernel": platform.release(),
        "load1": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "mem_gib": mem_gib,
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def machine_line(m: dict | None = None) -> str:
    """One sentence for a report: '2 CPUs (model), 24.0 GiB, kernel 6.18, load average 0.4 at start'."""
    m = m or machine()
    mem = f", {m['mem_gib']} GiB" if m.get("mem_gib") else ""
    return f"{m['nproc']} CPUs ({m['cpu']}){mem}, kernel {m['kernel']}, load average {m['load1']:.1f} at start"


def write_section(name: str, text: str, doc: Path = DOC) -> Path:
    """Replace section `name` of docs/benchmarks.md with text (append it when it is not there)."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{text.strip()}\n{end}"
    old = doc.read_text() if doc.exists() else DOC_HEADER
    if begin in old and end in old:
        new = old[: old.index(begin)] + block + old[old.index(end) + len(end) :]
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(new)
    return doc


@contextlib.contextmanager
def kafka_only_stack(name: str, port_base: int):
    """A Kafka-only services.stack.Stack on port_base, in its own run dir (/tmp/<name>), stopped
    on exit: a benchmark's broker, apart from the tests' shared stack."""
    from services.stack import Stack

    stack = Stack(run_dir=Path(tempfile.gettempdir()) / name, port_base=port_base, fresh=True)
    stack.up(only=["kafka"])
    try:
        yield stack
    finally:
        stack.down(only=["kafka"])
