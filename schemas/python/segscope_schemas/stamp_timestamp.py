"""STAMP timestamps (RFC 8762 §4.2.1): NTP 64-bit (RFC 5905 §6, era 0) and PTPv2 truncated.

Mirror of schemas/c/stamp_timestamp.h (same names without the ``stamp_`` prefix).
segscope keeps time as 64-bit TAI nanoseconds; NTP is UTC, so NTP conversions
take the TAI-UTC offset in seconds. Bounds (see the C header):
ns -> NTP fraction <= 2^-33 s (0.1164 ns); NTP fraction -> ns <= 0.5 ns;
TAI ns -> NTP -> TAI ns exact; NTP -> ns -> NTP within 2 fraction units; PTP exact.
"""

from __future__ import annotations

import struct
from enum import IntEnum

from .stamp_test_packet import EE_Z, NS_PER_SEC, ptp_from_ns, ptp_to_ns, sec32_widen

NTP_UNIX_OFFSET = 2_208_988_800  # RFC 5905 §6: 1900-01-01 -> 1970-01-01, seconds
NTP_FRAC_ONE = 1 << 32
NTP_ENCODE_MAX_ERR_PS = 117  # 2^-33 s, ceil
NTP_DECODE_MAX_ERR_PS = 500
TIMESTAMP_LEN = 8

_TS = struct.Struct("!II")


class TsFormat(IntEnum):
    """Timestamp format of a session; the value is the Error Estimate Z bit."""

    NTP = 0
    PTP = 1


class MalformedTimestamp(ValueError):
    pass


def ntp_frac_from_nsec(nsec: int) -> int:
    """Nanoseconds (< 10^9) -> NTP fraction, rounded to nearest (never carries)."""
    if not 0 <= nsec < NS_PER_SEC:
        raise ValueError(f"nsec {nsec} is not in [0, 10^9)")
    return ((nsec << 32) + NS_PER_SEC // 2) // NS_PER_SEC


def ntp_nsec_from_frac(frac: int) -> int:
    """NTP fraction -> nanoseconds, rounded to nearest; 0xffffffff gives 10^9."""
    return (frac * NS_PER_SEC + (1 << 31)) >> 32


def ntp_from_tai_ns(tai_ns: int, tai_utc_offset_s: int) -> tuple[int, int]:
    """TAI ns -> (NTP seconds mod 2^32, fraction). ValueError before the UTC epoch."""
    utc_ns = tai_ns - tai_utc_offset_s * NS_PER_SEC
    if utc_ns < 0:
        raise ValueError(f"TAI {tai_ns} ns is before 1970-01-01 UTC (offset {tai_utc_offset_s} s)")
    sec, nsec = divmod(utc_ns, NS_PER_SEC)
    return (sec + NTP_UNIX_OFFSET) & 0xFFFFFFFF, ntp_frac_from_nsec(nsec)


def ntp_to_tai_ns(sec: int, frac: int, tai_utc_offset_s: int, ref_tai_ns: int) -> int:
    """NTP -> TAI ns; ref_tai_ns (within 68 years) picks the NTP era. Before 1970 gives 0."""
    ref_utc_sec = ref_tai_ns // NS_PER_SEC - tai_utc_offset_s
    ref_ntp_sec = ref_utc_sec + NTP_UNIX_OFFSET if ref_utc_sec > 0 else NTP_UNIX_OFFSET
    tai_sec = sec32_widen(sec, ref_ntp_sec) - NTP_UNIX_OFFSET + tai_utc_offset_s
    if tai_sec < 0:
        return 0
    return tai_sec * NS_PER_SEC + ntp_nsec_from_frac(frac)


def ptp_from_tai_ns(tai_ns: int) -> tuple[int, int]:
    return ptp_from_ns(tai_ns)


def ptp_check(nsec: int) -> None:
    if nsec >= NS_PER_SEC:
        raise MalformedTimestamp(f"PTPv2 nanoseconds field {nsec} is >= 10^9")


def ptp_to_tai_ns(sec: int, nsec: int, ref_tai_ns: int) -> int:
    return ptp_to_ns(sec, nsec, ref_tai_ns)


def ts_from_tai_ns(fmt: TsFormat, tai_ns: int, tai_utc_offset_s: int) -> bytes:
    """TAI ns -> 8 wire bytes in the given format."""
    if fmt == TsFormat.PTP:
        return _TS.pack(*ptp_from_tai_ns(tai_ns))
    if fmt == TsFormat.NTP:
        return _TS.pack(*ntp_from_tai_ns(tai_ns, tai_utc_offset_s))
    raise ValueError(f"unknown timestamp format {fmt!r}")


def ts_to_tai_ns(fmt: TsFormat, buf: bytes, tai_utc_offset_s: int, ref_tai_ns: int) -> int:
    """8 wire bytes -> TAI ns. MalformedTimestamp for a short buffer or PTP ns >= 10^9."""
    if len(buf) < TIMESTAMP_LEN:
        raise MalformedTimestamp(f"timestamp is {len(buf)} bytes, needs {TIMESTAMP_LEN}")
    sec, frac = _TS.unpack_from(buf)
    if fmt == TsFormat.PTP:
        ptp_check(frac)
        return ptp_to_tai_ns(sec, frac, ref_tai_ns)
    if fmt == TsFormat.NTP:
        return ntp_to_tai_ns(sec, frac, tai_utc_offset_s, ref_tai_ns)
    raise ValueError(f"unknown timestamp format {fmt!r}")


def ts_format_of(err_est: int) -> TsFormat:
    """Format of a timestamp from its Error Estimate (the Z bit)."""
    return TsFormat.PTP if err_est & EE_Z else TsFormat.NTP
