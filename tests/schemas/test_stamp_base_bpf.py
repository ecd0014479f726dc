"""The codecs in the kernel: schemas/tests/stamp_base_check.bpf.c (timestamps, Error
Estimate, authenticated-packet layouts) passes the verifier and, run with BPF_PROG_TEST_RUN
(bpftool prog run), gives the same bytes as the Python mirrors."""

from __future__ import annotations

import os
import random
import struct
import subprocess
from pathlib import Path

import pytest

from segscope_schemas import stamp_error_estimate as ee
from segscope_schemas import stamp_timestamp as st

REPO = Path(__file__).resolve().parents[2]
OBJ = REPO / "build" / "schemas" / "stamp_base_check.bpf.o"
NS = 10**9

pytestmark = pytest.mark.datapath


@pytest.fixture(scope="module")
def pinned_prog(bpffs: Path):
    subprocess.run(
        ["make", "-C", str(REPO / "schemas"), "-s", "../build/schemas/stamp_base_check.bpf.o"],
        check=True,
        capture_output=True,
    )
    pin = bpffs / f"segscope_schemas_check_{os.getpid()}"
    p = subprocess.run(["bpftool", "prog", "load", str(OBJ), str(pin)], capture_output=True, text=True)
    assert p.returncode == 0, f"verifier refused the codecs:\n{p.stderr[-3000:]}"
    try:
        yield pin
    finally:
        pin.unlink(missing_ok=True)


def _run(pin: Path, tmp: Path, tai: int, err: int, ref: int, off: int) -> bytes:
    data_in, data_out = tmp / "in.bin", tmp / "out.bin"
    data_in.write_bytes(struct.pack("<QQQi", tai, err, ref, off) + bytes(36))
    p = subprocess.run(
        ["bpftool", "prog", "run", "pinned", str(pin), "data_in", str(data_in), "data_out", str(data_out)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "Return value: 2" in p.stdout, p.stdout  # XDP_PASS: every conversion succeeded
    return data_out.read_bytes()


def test_bpf_codecs_agree_with_python(pinned_prog, tmp_path):
    rng = random.Random(9)
    cases = [
        ((1_732_000_000 + 37) * NS + 5, 0, 37),
        ((2**32 - st.NTP_UNIX_OFFSET + 37) * NS - 1, 16 * NS, 37),
        (37 * NS, 1, 37),
        (1_600_000_000 * NS, 2**64 - 1, 0),
    ]
    cases += [(rng.randrange(40 * NS, 2**63), rng.getrandbits(64) >> rng.randrange(64), 37) for _ in range(12)]
    for tai, err, off in cases:
        ref = max(tai + rng.randrange(-3600, 3600) * NS, 0)
        out = _run(pinned_prog, tmp_path, tai, err, ref, off)
        assert out[24:32] == st.ts_from_tai_ns(st.TsFormat.NTP, tai, off), (tai, off)
        assert out[32:40] == st.ts_from_tai_ns(st.TsFormat.PTP, tai, off)
        assert struct.unpack_from("<Q", out, 40)[0] == tai  # exact NTP round trip in BPF too
        scale, mult = ee.ee_from_error_ns(err)
        assert out[48:50] == ee.ee_pack(True, st.TsFormat.NTP, scale, mult).to_bytes(2, "big"), err
        assert struct.unpack_from("<Q", out, 56)[0] == ee.ee_to_error_ns(scale, mult)
