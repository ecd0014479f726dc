"""The suite-wide fixtures of tests/conftest.py that are not the service stack."""

from __future__ import annotations

from pathlib import Path


def test_bpffs_fixture_gives_a_mounted_bpf_filesystem(bpffs: Path) -> None:
    mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    assert [str(bpffs), "bpf"] in [m[1:3] for m in mounts]
    assert bpffs == Path("/sys/fs/bpf")
