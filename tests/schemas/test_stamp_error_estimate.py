"""STAMP Error Estimate (schemas/*/stamp_error_estimate.*): RFC vectors, honesty, clock state."""

from __future__ import annotations

import math
import random
import re
from fractions import Fraction

import pytest
from _stamp_base_c import load_vectors, run_c_test

from segscope_schemas import stamp_error_estimate as ee
from segscope_schemas.stamp_timestamp import TsFormat

DOC = load_vectors("stamp_error_estimate")
NS = 10**9


def _value(scale: int, mult: int) -> Fraction:
    """RFC 4656 §4.1.2: Multiplier * 2^(-32) * 2^Scale seconds."""
    return Fraction(mult * 2**scale, 2**32)


def test_c_program_passes_every_check():
    r = run_c_test()
    assert r.failed == 0 and r.returncode == 0, r.stdout


@pytest.mark.parametrize("vec", DOC["decode"], ids=lambda v: v["name"])
def test_python_decodes_vector(vec):
    word = int(vec["hex"], 16)
    if not vec["valid"]:
        with pytest.raises(ee.MalformedErrorEstimate, match="Multiplier is 0"):
            ee.ee_unpack(word)
        return
    f = ee.ee_unpack(word)
    assert (f.s, f.z, f.scale, f.multiplier) == (vec["S"], vec["Z"], vec["scale"], vec["multiplier"])
    assert ee.ee_to_error_ns(f.scale, f.multiplier) == vec["error_ns"]
    assert ee.ee_pack(bool(f.s), TsFormat(f.z), f.scale, f.multiplier) == word


@pytest.mark.parametrize("vec", DOC["encode"], ids=lambda v: v["name"])
def test_python_encodes_vector(vec):
    scale, mult = ee.ee_from_error_ns(vec["error_ns"])
    assert (scale, mult) == (vec["scale"], vec["multiplier"])
    assert ee.ee_to_error_ns(scale, mult) == vec["encoded_error_ns"] >= min(vec["error_ns"], ee.U64_MAX)


@pytest.mark.parametrize("vec", DOC["clock"], ids=lambda v: v["name"])
def test_error_estimate_from_clock_state_vector(vec):
    synced = ee.clock_synced(vec["state"], vec["status"], vec["maxerror_us"])
    cs = ee.ClockState(vec["state"], vec["status"], vec["maxerror_us"], vec["esterror_us"], 0, synced)
    assert int(synced) == vec["S"]
    assert ee.clock_error_ns(cs) == vec["error_ns"]
    assert ee.ee_from_clock(cs, TsFormat.PTP if vec["format"] == "ptp" else TsFormat.NTP) == int(vec["hex"], 16)


def test_encoding_is_the_smallest_value_not_below_the_error():
    rng = random.Random(7)
    for _ in range(800):  # exact Fractions over 64 scales each; the C test does 100k
        err = rng.getrandbits(64) >> rng.randrange(64)
        scale, mult = ee.ee_from_error_ns(err)
        got = _value(scale, mult)
        assert 1 <= mult <= 255 and got * NS >= err
        # nothing representable lies in [err, got): check the neighbours on every scale
        for s in range(64):
            m = max(math.ceil(Fraction(err, NS) / _value(s, 1)), 1)  # smallest m covering err at s
            if m <= 255:
                assert _value(s, m) >= got


def test_decode_rounds_up_so_the_error_is_never_understated():
    for scale in range(64):
        for mult in (1, 2, 127, 255):
            ns = ee.ee_to_error_ns(scale, mult)
            assert ns == ee.U64_MAX or Fraction(ns) >= _value(scale, mult) * NS > ns - 1


def test_bad_fields_are_refused():
    with pytest.raises(ValueError, match="multiplier 1..255"):
        ee.ee_pack(True, TsFormat.NTP, 3, 0)
    with pytest.raises(ValueError, match="scale must be 0..63"):
        ee.ee_pack(True, TsFormat.NTP, 64, 1)
    with pytest.raises(ValueError):
        ee.ee_from_error_ns(-1)


def test_live_clock_matches_the_c_reader_and_is_encoded_honestly():
    cs = ee.clock_read()
    m = re.search(
        r"clock: state=(\d+) status=0x([0-9a-f]+) maxerror=(-?\d+)us esterror=(-?\d+)us "
        r"tai=(-?\d+) synced=(\d)",
        run_c_test().stdout,
    )
    assert m, "C test prints the clock state it read"
    assert (cs.state, cs.status, cs.tai_offset_s, int(cs.synced)) == (int(m[1]), int(m[2], 16), int(m[5]), int(m[6]))
    word = ee.ee_from_clock(cs, TsFormat.NTP)
    f = ee.ee_unpack(word)
    assert f.s == int(cs.synced) and f.z == 0
    assert ee.ee_to_error_ns(f.scale, f.multiplier) >= ee.clock_error_ns(cs) >= 1
    if not cs.synced:  # a free-running clock reports its maximum error, not its estimate
        assert ee.clock_error_ns(cs) == max(cs.maxerror_us * 1000, 1)
