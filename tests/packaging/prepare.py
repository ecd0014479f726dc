"""What the packaging tests build before they can test anything, built while the other tests run.

scripts/test_groups.py starts this (niced) at the start of `make test` and tells the groups where
(SEGSCOPE_PACKAGING_PREP_DIR): three steps side by side, mostly waiting on the package registries,
which would otherwise be waited for inside one group:

    root   the cached minbase Debian root (tests/packaging/debroot.py; mmdebstrap, ~2 min cold)
    debs   both Debian packages (packaging/debian/build.py) into DIR/debs
    venv   `pip install .` into a fresh venv at DIR/pip-venv (tests/packaging/test_pip_install.py)

Each step writes DIR/<step>.status: "ok", or "failed (exit N)" with DIR/<step>.log. The fixtures
wait for their step (wait_for_step) and assert on its outcome as if they had run it themselves;
without the variable (a plain pytest run) they build what they need themselves.

    python -m tests.packaging.prepare DIR
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENV = "SEGSCOPE_PACKAGING_PREP_DIR"
STEPS = ("root", "debs", "venv")
WAIT_S = 1800.0


def step_commands(out: Path) -> dict[str, list[str]]:
    py = str(REPO / ".local" / "venv" / "bin" / "python")
    venv = out / "pip-venv"
    return {
        "root": [py, "-c", "from tests.packaging import debroot; debroot.ensure_root_tar()"],
        "debs": [py, str(REPO / "packaging" / "debian" / "build.py"), "--out", str(out / "debs")],
        # the interpreter the test suite runs on, as test_pip_install's own fixture did it
        "venv": [
            "sh",
            "-c",
            f'"{sys.base_prefix}/bin/python3" -m venv "{venv}" && "{venv}/bin/pip" install -q "{REPO}"',
        ],
    }


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the builds bring their own imports
    procs = {}
    for step, cmd in step_commands(out).items():
        (out / f"{step}.status").write_text("building\n")
        log = open(out / f"{step}.log", "w")  # noqa: SIM115 (open while the step runs)
        procs[step] = (
            subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT),
            log,
            time.monotonic(),
        )
    failed = 0
    for step, (proc, log, t0) in procs.items():
        rc = proc.wait()
        log.write(f"\n[prepare] {step}: exit {rc} after {time.monotonic() - t0:.0f} s\n")
        log.close()
        (out / f"{step}.status").write_text("ok\n" if rc == 0 else f"failed (exit {rc})\n")
        failed += rc != 0
    return 1 if failed else 0


def prep_dir() -> Path | None:
    given = os.environ.get(ENV)
    return Path(given) if given else None


def wait_for_step(step: str) -> tuple[bool, str] | None:
    """None outside the runner (build it yourself); else (ok, the step's log tail) once it ended."""
    out = prep_dir()
    if out is None:
        return None
    status = out / f"{step}.status"
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        text = status.read_text().strip() if status.exists() else "building"
        if text != "building":
            log = out / f"{step}.log"
            return text == "ok", f"{status}: {text}\n" + (
                log.read_text(errors="replace")[-4000:] if log.exists() else ""
            )
        time.sleep(1.0)
    return False, f"{status}: still building after {WAIT_S:.0f} s"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
