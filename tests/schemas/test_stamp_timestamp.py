"""STAMP timestamps (schemas/*/stamp_timestamp.*): RFC vectors in Python and C, stated bounds."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
from _stamp_base_c import load_vectors, run_c_test

from segscope_schemas import stamp_timestamp as st

DOC = load_vectors("stamp_timestamp")
VECTORS = DOC["vectors"]
NS = 10**9


def test_c_program_passes_every_check():
    r = run_c_test()
    assert r.failed == 0 and r.returncode == 0, r.stdout
    # vectors of all four files + the property checks; a silently shrunk run would fail here
    assert r.passed >= 240


def test_vector_set_covers_both_formats_and_the_wraps():
    names = {v["name"] for v in VECTORS}
    assert {
        "ntp_unix_epoch",
        "ntp_era1_after_wrap",
        "ntp_max_fraction_carries",
        "ptp_after_32bit_wrap",
        "ptp_nsec_too_big",
    } <= names
    assert all(v["rfc"].startswith("RFC 8762 §4.2.1") for v in VECTORS)


@pytest.mark.parametrize("vec", VECTORS, ids=lambda v: v["name"])
def test_python_decodes_vector(vec):
    buf = bytes.fromhex(vec["hex"])
    fmt = st.TsFormat.PTP if vec["format"] == "ptp" else st.TsFormat.NTP
    assert int.from_bytes(buf[:4], "big") == vec["sec"] and int.from_bytes(buf[4:], "big") == vec["frac"]
    if not vec["valid"]:
        with pytest.raises(st.MalformedTimestamp, match="nanoseconds"):
            st.ts_to_tai_ns(fmt, buf, vec["tai_utc_offset_s"], vec["ref_tai_ns"])
        return
    assert st.ts_to_tai_ns(fmt, buf, vec["tai_utc_offset_s"], vec["ref_tai_ns"]) == vec["tai_ns"]
    again = st.ts_from_tai_ns(fmt, vec["tai_ns"], vec["tai_utc_offset_s"])
    assert (again == buf) == vec["encode_exact"]


def test_ntp_bounds_hold_exactly_on_random_inputs():
    rng = random.Random(4)
    worst_enc = worst_dec = Fraction(0)
    worst_back = 0
    for _ in range(20000):
        nsec = rng.randrange(NS)
        frac = st.ntp_frac_from_nsec(nsec)
        worst_enc = max(worst_enc, abs(Fraction(frac, 2**32) - Fraction(nsec, NS)))
        f = rng.randrange(2**32)
        ns = st.ntp_nsec_from_frac(f)
        worst_dec = max(worst_dec, abs(Fraction(ns, NS) - Fraction(f, 2**32)))
        if ns < NS:
            worst_back = max(worst_back, abs(st.ntp_frac_from_nsec(ns) - f))
    assert worst_enc <= Fraction(1, 2**33)  # 0.1164 ns
    assert worst_enc * NS * 1000 <= st.NTP_ENCODE_MAX_ERR_PS
    assert worst_dec <= Fraction(1, 2 * NS)  # 0.5 ns
    assert worst_dec > Fraction(4, 10 * NS)  # the bound is reached, not loose
    assert 1 <= worst_back <= 2  # NTP -> ns -> NTP


def test_tai_ntp_tai_round_trip_is_exact():
    rng = random.Random(5)
    for _ in range(20000):
        tai = rng.randrange(37 * NS, 2**63)  # eras 0..2 (until year 2262)
        sec, frac = st.ntp_from_tai_ns(tai, 37)
        ref = tai + rng.randrange(-86400, 86400) * NS
        assert st.ntp_to_tai_ns(sec, frac, 37, ref) == tai


def test_ptp_round_trip_is_exact_and_widened():
    rng = random.Random(6)
    for _ in range(20000):
        tai = rng.randrange(2**62)
        sec, nsec = st.ptp_from_tai_ns(tai)
        assert sec < 2**32 and nsec < NS
        assert st.ptp_to_tai_ns(sec, nsec, tai + rng.randrange(-(10**6), 10**6) * NS) == tai


def test_ntp_widening_picks_the_era_of_the_reference():
    wrap_unix = 2**32 - st.NTP_UNIX_OFFSET  # 2036-02-07T06:28:16Z
    before = (wrap_unix - 1) * NS
    sec, frac = st.ntp_from_tai_ns(before, 0)
    assert sec == 0xFFFFFFFF
    assert st.ntp_to_tai_ns(sec, frac, 0, before + 3 * NS) == before  # ref in era 1
    sec, frac = st.ntp_from_tai_ns(before + 2 * NS, 0)
    assert sec == 1
    assert st.ntp_to_tai_ns(sec, frac, 0, before - 3 * NS) == before + 2 * NS  # ref in era 0


def test_bad_inputs_are_refused_with_a_message():
    with pytest.raises(ValueError, match="before 1970"):
        st.ntp_from_tai_ns(36 * NS, 37)
    with pytest.raises(st.MalformedTimestamp, match="needs 8"):
        st.ts_to_tai_ns(st.TsFormat.NTP, b"\0" * 7, 37, 0)
    with pytest.raises(ValueError, match="nsec"):
        st.ntp_frac_from_nsec(NS)
    assert st.ts_format_of(0x4001) == st.TsFormat.PTP and st.ts_format_of(0x8001) == st.TsFormat.NTP
