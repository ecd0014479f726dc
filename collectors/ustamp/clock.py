"""Clocks and timestamp formats: CLOCK_TAI nanoseconds <-> PTPv2 / NTP wire timestamps.

Everything inside ustamp is CLOCK_TAI nanoseconds, like the XDP datapath and stamp_record.
Kernel receive timestamps (SO_TIMESTAMPNS) are CLOCK_REALTIME: TAI = REALTIME + tai, where
tai is struct timex.tai from adjtimex(2) (0 when nobody told the kernel the leap-second count).
NTP timestamps (RFC 5905) are UTC seconds since 1900, so the TAI offset is removed for them.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import time
from dataclasses import dataclass
from enum import Enum

NS_PER_SEC = 1_000_000_000
NTP_UNIX_EPOCH_OFFSET_S = 2_208_988_800      # 1900-01-01 -> 1970-01-01
EE_S = 0x8000                                 # RFC 8762 §4.2.1 Error Estimate: synchronised
EE_Z = 0x4000                                 # 1 = PTPv2 timestamp, 0 = NTP
STA_UNSYNC = 0x0040                           # linux/timex.h


class TimestampFormat(str, Enum):
    PTP = "ptp"
    NTP = "ntp"


class _Timeval(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


class _Timex(ctypes.Structure):
    """struct timex (include/uapi/linux/timex.h), 64-bit layout; ctypes adds the padding."""
    _fields_ = [("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
                ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long), ("status", ctypes.c_int),
                ("constant", ctypes.c_long), ("precision", ctypes.c_long),
                ("tolerance", ctypes.c_long), ("time", _Timeval), ("tick", ctypes.c_long),
                ("ppsfreq", ctypes.c_long), ("jitter", ctypes.c_long), ("shift", ctypes.c_int),
                ("stabil", ctypes.c_long), ("jitcnt", ctypes.c_long), ("calcnt", ctypes.c_long),
                ("errcnt", ctypes.c_long), ("stbcnt", ctypes.c_long), ("tai", ctypes.c_int),
                ("_pad", ctypes.c_int * 11)]


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


@dataclass(frozen=True)
class ClockState:
    synced: bool          # STA_UNSYNC clear
    esterror_us: int      # kernel's estimated error
    tai_offset_s: int     # TAI - UTC


def clock_state() -> ClockState:
    tx = _Timex()
    if _libc.adjtimex(ctypes.byref(tx)) < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"adjtimex: {os.strerror(err)}")
    return ClockState(not (tx.status & STA_UNSYNC), max(int(tx.esterror), 0), int(tx.tai))


def tai_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_TAI)


def error_estimate(state: ClockState, fmt: TimestampFormat) -> int:
    """RFC 8762 §4.2.1 / RFC 4656 §4.1.2 Error Estimate, the same rule as collectors/stamp_sender.c:
    error = Multiplier * 2^-32 * 2^Scale s; smallest Scale whose Multiplier (rounded up, so the
    estimate never understates the error) fits in 8 bits; Multiplier never 0."""
    units = -(-(state.esterror_us << 32) // 1_000_000)          # 2^-32 s units, rounded up
    scale = 0
    while scale < 63 and -(-units >> scale) > 255:
        scale += 1
    mult = min(max(-(-units >> scale), 1), 255)
    return ((EE_S if state.synced else 0) | (EE_Z if fmt == TimestampFormat.PTP else 0)
            | (scale << 8) | mult)


def _widen(sec32: int, ref_sec: int) -> int:
    """Full seconds from 32 wire bits: the value nearest to ref_sec."""
    full = (ref_sec & ~0xFFFFFFFF) | sec32
    if full - ref_sec > 0x80000000:
        full -= 1 << 32
    elif ref_sec - full > 0x80000000:
        full += 1 << 32
    return full


def encode_ts(t_tai_ns: int, fmt: TimestampFormat, tai_offset_s: int) -> tuple[int, int]:
    """(seconds, fraction) words of a wire timestamp for a CLOCK_TAI time."""
    if fmt == TimestampFormat.PTP:           # PTPv2 truncated: TAI seconds + nanoseconds
        return (t_tai_ns // NS_PER_SEC) & 0xFFFFFFFF, t_tai_ns % NS_PER_SEC
    utc_ns = t_tai_ns - tai_offset_s * NS_PER_SEC
    sec = utc_ns // NS_PER_SEC + NTP_UNIX_EPOCH_OFFSET_S
    frac = ((utc_ns % NS_PER_SEC) << 32) // NS_PER_SEC
    return sec & 0xFFFFFFFF, frac


def decode_ts(sec: int, frac: int, fmt: TimestampFormat, tai_offset_s: int, ref_tai_ns: int) -> int:
    """CLOCK_TAI ns of a wire timestamp; 32-bit seconds are widened around ref_tai_ns."""
    ref_sec = ref_tai_ns // NS_PER_SEC
    if fmt == TimestampFormat.PTP:
        return _widen(sec, ref_sec) * NS_PER_SEC + frac
    ntp_ref = ref_sec - tai_offset_s + NTP_UNIX_EPOCH_OFFSET_S
    ntp_sec = _widen(sec, ntp_ref)
    frac_ns = (frac * NS_PER_SEC + (1 << 31)) >> 32                # nearest ns
    return (ntp_sec - NTP_UNIX_EPOCH_OFFSET_S + tai_offset_s) * NS_PER_SEC + frac_ns


def format_of(err_est: int) -> TimestampFormat:
    return TimestampFormat.PTP if err_est & EE_Z else TimestampFormat.NTP
