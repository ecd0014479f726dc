"""The project's own build outputs a test module needs. `make test` always builds them, so a
missing one is a broken build, not a reason to skip: the module's tests fail, naming what is
missing and the command that builds it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BUILD = Path(os.environ.get("SEGSCOPE_BUILD_DIR") or REPO / "build")


def require(*paths: str) -> None:
    """Fail the calling test unless every `paths` (relative to the build directory) exists."""
    missing = [p for p in paths if not (BUILD / p).exists()]
    if missing:
        pytest.fail(f"not built: {', '.join(str(BUILD / p) for p in missing)}; run `make build`", pytrace=False)


def required(*paths: str):
    """An autouse module fixture that calls require(*paths) before each test of the module."""

    @pytest.fixture(autouse=True)
    def _built() -> None:
        require(*paths)

    return _built
