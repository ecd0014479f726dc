"""STAMP Error Estimate (RFC 8762 §4.2.1; RFC 4656 §4.1.2; Z bit RFC 8186 §2.3).

Mirror of schemas/c/stamp_error_estimate.h. 16 bits: S|Z|Scale(6)|Multiplier(8),
error = Multiplier * 2^(-32) * 2^Scale s, Multiplier != 0. ``ee_from_error_ns``
gives the smallest representable error >= the given one; ``ee_to_error_ns``
rounds up to whole ns (saturating at 2^64-1 like the C side).
``clock_read`` reads the kernel clock's sync state with adjtimex(2) (ctypes).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from dataclasses import dataclass

from .stamp_test_packet import EE_S, EE_Z, NS_PER_SEC
from .stamp_timestamp import TsFormat

EE_SCALE_MAX = 63
EE_MULT_MAX = 255
EE_MIN_ERROR_NS = 1
U64_MAX = (1 << 64) - 1

# <sys/timex.h>
STA_UNSYNC = 0x0040
TIME_ERROR = 5
NTP_PHASE_LIMIT_US = 16_000_000


class MalformedErrorEstimate(ValueError):
    pass


@dataclass(frozen=True)
class EeFields:
    s: int
    z: int
    scale: int
    multiplier: int


def ee_pack(synced: bool, fmt: TsFormat, scale: int, multiplier: int) -> int:
    if not (0 <= scale <= EE_SCALE_MAX and 1 <= multiplier <= EE_MULT_MAX):
        raise ValueError(f"scale must be 0..63 and multiplier 1..255, got {scale}, {multiplier}")
    return (EE_S if synced else 0) | (EE_Z if fmt == TsFormat.PTP else 0) | (scale << 8) | multiplier


def ee_unpack(ee: int) -> EeFields:
    """Host-order Error Estimate -> fields; MalformedErrorEstimate for Multiplier 0."""
    f = EeFields(int(bool(ee & EE_S)), int(bool(ee & EE_Z)), (ee >> 8) & 0x3F, ee & 0xFF)
    if f.multiplier == 0:
        raise MalformedErrorEstimate(f"Error Estimate 0x{ee:04x}: Multiplier is 0 (RFC 4656 §4.1.2)")
    return f


def ee_from_error_ns(err_ns: int) -> tuple[int, int]:
    """Smallest (scale, multiplier) with Multiplier*2^(Scale-32) s >= err_ns ns."""
    if err_ns < 0:
        raise ValueError("error must be >= 0")
    for scale in range(EE_SCALE_MAX + 1):
        # ceil(err_ns * 2^32 / (10^9 * 2^scale)), exact in integers
        den = NS_PER_SEC << scale
        m = -((-err_ns << 32) // den)
        if m <= EE_MULT_MAX:
            return scale, max(m, 1)
    raise ValueError(f"error {err_ns} ns does not fit an Error Estimate")


def ee_to_error_ns(scale: int, multiplier: int) -> int:
    """Error in ns, rounded up; 2^64-1 if it does not fit 64 bits (as in C)."""
    num = multiplier * NS_PER_SEC << scale  # error * 2^32 in ns
    ns = -((-num) >> 32)
    return min(ns, U64_MAX)


def ee_encode(synced: bool, fmt: TsFormat, err_ns: int) -> int:
    scale, mult = ee_from_error_ns(err_ns)
    return ee_pack(synced, fmt, scale, mult)


class _Timeval(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


class _Timex(ctypes.Structure):
    """struct timex of <sys/timex.h> (glibc, LP64)."""

    _fields_ = [
        ("modes", ctypes.c_uint),
        ("offset", ctypes.c_long),
        ("freq", ctypes.c_long),
        ("maxerror", ctypes.c_long),
        ("esterror", ctypes.c_long),
        ("status", ctypes.c_int),
        ("constant", ctypes.c_long),
        ("precision", ctypes.c_long),
        ("tolerance", ctypes.c_long),
        ("time", _Timeval),
        ("tick", ctypes.c_long),
        ("ppsfreq", ctypes.c_long),
        ("jitter", ctypes.c_long),
        ("shift", ctypes.c_int),
        ("stabil", ctypes.c_long),
        ("jitcnt", ctypes.c_long),
        ("calcnt", ctypes.c_long),
        ("errcnt", ctypes.c_long),
        ("stbcnt", ctypes.c_long),
        ("tai", ctypes.c_int),
        ("_reserved", ctypes.c_int * 11),
    ]


@dataclass(frozen=True)
class ClockState:
    state: int  # adjtimex return value (TIME_OK .. TIME_ERROR)
    status: int  # STA_* bits
    maxerror_us: int
    esterror_us: int
    tai_offset_s: int
    synced: bool


def clock_synced(state: int, status: int, maxerror_us: int) -> bool:
    """S bit: not STA_UNSYNC, not TIME_ERROR, maxerror under NTP's 16 s phase limit."""
    return state != TIME_ERROR and not status & STA_UNSYNC and maxerror_us < NTP_PHASE_LIMIT_US


def clock_read() -> ClockState:
    """adjtimex(2) with modes 0 (read only). OSError on failure."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    tx = _Timex()
    state = libc.adjtimex(ctypes.byref(tx))
    if state < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"adjtimex: {os.strerror(err)}")
    return ClockState(state, tx.status, tx.maxerror, tx.esterror, tx.tai, clock_synced(state, tx.status, tx.maxerror))


def clock_error_ns(cs: ClockState) -> int:
    """Estimated error when synchronised, the maximum error (a bound) when not; >= 1 ns."""
    us = cs.esterror_us if cs.synced else cs.maxerror_us
    return max(us * 1000 if us > 0 else 0, EE_MIN_ERROR_NS)


def ee_from_clock(cs: ClockState, fmt: TsFormat) -> int:
    """Host-order Error Estimate for a session's format from the clock state."""
    return ee_encode(cs.synced, fmt, clock_error_ns(cs))
