"""Clocks and timestamp formats for ustamp, on top of the shared wire modules.

Everything inside ustamp is CLOCK_TAI nanoseconds, like the XDP datapath and stamp_record.
Kernel receive timestamps (SO_TIMESTAMPNS) are CLOCK_REALTIME: TAI = REALTIME + tai, with tai =
struct timex.tai from adjtimex(2) (0 when nobody told the kernel the leap-second count).
Wire conversions: segscope_schemas.stamp_timestamp (NTP = UTC since 1900, PTPv2 truncated = TAI);
Error Estimate: segscope_schemas.stamp_error_estimate (S from the kernel's sync state, Z from the
format, Scale/Multiplier from esterror when synchronised, maxerror when not) — the same rules the
C side and the XDP loader use.
"""

from __future__ import annotations

import time
from enum import Enum

from segscope_schemas import stamp_error_estimate as ee
from segscope_schemas import stamp_timestamp as ts
from segscope_schemas.stamp_error_estimate import ClockState

NS_PER_SEC = 1_000_000_000
EE_Z = 0x4000


class TimestampFormat(str, Enum):
    PTP = "ptp"
    NTP = "ntp"

    @property
    def wire(self) -> ts.TsFormat:
        return ts.TsFormat.PTP if self is TimestampFormat.PTP else ts.TsFormat.NTP


def clock_state() -> ClockState:
    return ee.clock_read()


def tai_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_TAI)


def error_estimate(state: ClockState, fmt: TimestampFormat) -> int:
    return ee.ee_from_clock(state, fmt.wire)


def encode_ts(t_tai_ns: int, fmt: TimestampFormat, tai_offset_s: int) -> tuple[int, int]:
    """(seconds, fraction) words of a wire timestamp for a CLOCK_TAI time."""
    if fmt is TimestampFormat.PTP:
        return ts.ptp_from_tai_ns(t_tai_ns)
    return ts.ntp_from_tai_ns(t_tai_ns, tai_offset_s)


def decode_ts(sec: int, frac: int, fmt: TimestampFormat, tai_offset_s: int, ref_tai_ns: int) -> int:
    """CLOCK_TAI ns of a wire timestamp; 32-bit seconds are widened around ref_tai_ns."""
    if fmt is TimestampFormat.PTP:
        return ts.ptp_to_tai_ns(sec, frac, ref_tai_ns)
    return ts.ntp_to_tai_ns(sec, frac, tai_offset_s, ref_tai_ns)


def format_of(err_est: int) -> TimestampFormat:
    return TimestampFormat.PTP if err_est & EE_Z else TimestampFormat.NTP
