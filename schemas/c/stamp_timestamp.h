/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * STAMP timestamps (RFC 8762 §4.2.1): 64 bits, either
 *   NTP 64-bit (RFC 5905 §6, era 0): 32-bit seconds since 1900-01-01 00:00 UTC
 *     and a 32-bit fraction of a second in units of 2^-32 s (Error Estimate Z=0);
 *   PTPv2 truncated (IEEE 1588, RFC 8186 §2.3): 32-bit TAI seconds since the
 *     PTP epoch (1970-01-01 TAI) and 32-bit nanoseconds (Z=1).
 * segscope keeps time as 64-bit TAI nanoseconds (CLOCK_TAI). NTP is UTC, so
 * conversions to/from NTP take the TAI-UTC offset in seconds (37 since 2017);
 * a leap second in progress is not representable in NTP (RFC 5905 §6).
 *
 * Resolution and round-trip bounds (tested in tests/schemas/test_stamp_timestamp.py
 * and schemas/tests/test_stamp_base.c):
 *   ns -> NTP fraction rounds to nearest: error <= 2^-33 s (0.1164 ns);
 *   NTP fraction -> ns rounds to nearest: error <= 0.5 ns;
 *   TAI ns -> NTP -> TAI ns is exact (0.1164 + 0.2328 < 0.5, so the nearest
 *     ns is the original), within one NTP era and for TAI ns >= the offset;
 *   NTP -> ns -> NTP differs by at most 2 fraction units (2^-31 s);
 *   PTPv2 <-> TAI ns is exact.
 * The 32-bit seconds of both formats are widened with a reference time close
 * to the timestamp (stamp_sec32_widen, schemas/c/stamp_test_packet.h).
 *
 * Everything here is BPF-usable (no libc). Python mirror:
 * schemas/python/segscope_schemas/stamp_timestamp.py; vectors:
 * schemas/vectors/stamp_timestamp.json.
 */
#ifndef SEGSCOPE_STAMP_TIMESTAMP_H
#define SEGSCOPE_STAMP_TIMESTAMP_H

#include "stamp_test_packet.h"

/* RFC 5905 §6 / RFC 868: seconds from 1900-01-01 to 1970-01-01 (UTC). */
#define STAMP_NTP_UNIX_OFFSET   2208988800ULL
#define STAMP_NTP_FRAC_ONE      0x100000000ULL    /* 2^32 fraction units = 1 s */

/* Round-trip bounds stated above, in picoseconds (ceil). */
#define STAMP_NTP_ENCODE_MAX_ERR_PS 117   /* 2^-33 s = 116.4 ps */
#define STAMP_NTP_DECODE_MAX_ERR_PS 500   /* nearest ns */

/* Timestamp format of a session; the value is the Error Estimate Z bit. */
enum stamp_ts_format {
	STAMP_TS_NTP = 0,
	STAMP_TS_PTP = 1,
};

#define STAMP_TS_EINVAL 22   /* -EINVAL without <errno.h> (BPF) */
#define STAMP_TS_ERANGE 34   /* -ERANGE */

/* Nanoseconds (< 10^9) -> NTP fraction, rounded to nearest (never carries). */
static inline __u32 stamp_ntp_frac_from_nsec(__u32 nsec)
{
	return (__u32)((((__u64)nsec << 32) + STAMP_NS_PER_SEC / 2) / STAMP_NS_PER_SEC);
}

/* NTP fraction -> nanoseconds, rounded to nearest; 0xffffffff gives 10^9. */
static inline __u64 stamp_ntp_nsec_from_frac(__u32 frac)
{
	return ((__u64)frac * STAMP_NS_PER_SEC + (1ULL << 31)) >> 32;
}

/*
 * TAI ns -> NTP (host order). The seconds keep the low 32 bits (RFC 5905 era
 * number dropped). Returns 0, or -ERANGE if tai_ns is before the UTC epoch.
 */
static inline int stamp_ntp_from_tai_ns(__u64 tai_ns, __s32 tai_utc_offset_s,
					__u32 *sec, __u32 *frac)
{
	__s64 off_ns = (__s64)tai_utc_offset_s * (__s64)STAMP_NS_PER_SEC;
	__u64 utc_ns;

	if (off_ns > 0 && tai_ns < (__u64)off_ns)
		return -STAMP_TS_ERANGE;
	utc_ns = tai_ns - (__u64)off_ns;   /* wraps back for a negative offset */
	*sec = (__u32)(utc_ns / STAMP_NS_PER_SEC + STAMP_NTP_UNIX_OFFSET);
	*frac = stamp_ntp_frac_from_nsec((__u32)(utc_ns % STAMP_NS_PER_SEC));
	return 0;
}

/*
 * NTP (host order) -> TAI ns. ref_tai_ns is a TAI time close to the timestamp
 * (within 68 years) that selects the NTP era. Times before the UTC epoch
 * (1970) give 0.
 */
static inline __u64 stamp_ntp_to_tai_ns(__u32 sec, __u32 frac, __s32 tai_utc_offset_s,
					__u64 ref_tai_ns)
{
	__s64 ref_utc_sec = (__s64)(ref_tai_ns / STAMP_NS_PER_SEC) - tai_utc_offset_s;
	__u64 ref_ntp_sec = ref_utc_sec > 0 ? (__u64)ref_utc_sec + STAMP_NTP_UNIX_OFFSET
					    : STAMP_NTP_UNIX_OFFSET;
	__u64 full = stamp_sec32_widen(sec, ref_ntp_sec);
	__s64 tai_sec = (__s64)full - (__s64)STAMP_NTP_UNIX_OFFSET + tai_utc_offset_s;

	if (tai_sec < 0)
		return 0;
	return (__u64)tai_sec * STAMP_NS_PER_SEC + stamp_ntp_nsec_from_frac(frac);
}

/* PTPv2 truncated is TAI already: exact both ways (stamp_test_packet.h). */
static inline void stamp_ptp_from_tai_ns(__u64 tai_ns, __u32 *sec, __u32 *nsec)
{
	stamp_ptp_from_ns(tai_ns, sec, nsec);
}

/* PTPv2 nanoseconds must be < 10^9 (IEEE 1588): 0, or -EINVAL (malformed). */
static inline int stamp_ptp_check(__u32 nsec)
{
	return nsec < STAMP_NS_PER_SEC ? 0 : -STAMP_TS_EINVAL;
}

/* PTPv2 (host order) -> TAI ns, seconds widened with ref_tai_ns. */
static inline __u64 stamp_ptp_to_tai_ns(__u32 sec, __u32 nsec, __u64 ref_tai_ns)
{
	return stamp_ptp_to_ns(sec, nsec, ref_tai_ns);
}

/* Byte order helpers that work in BPF and user space. */
static inline __u32 stamp_ts_be32(__u32 v)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	return __builtin_bswap32(v);
#else
	return v;
#endif
}

/* TAI ns -> wire timestamp (big-endian) in the given format. */
static inline int stamp_ts_from_tai_ns(enum stamp_ts_format fmt, __u64 tai_ns,
				       __s32 tai_utc_offset_s, struct stamp_timestamp *ts)
{
	__u32 sec, frac;
	int err = 0;

	if (fmt == STAMP_TS_PTP)
		stamp_ptp_from_tai_ns(tai_ns, &sec, &frac);
	else if (fmt == STAMP_TS_NTP)
		err = stamp_ntp_from_tai_ns(tai_ns, tai_utc_offset_s, &sec, &frac);
	else
		return -STAMP_TS_EINVAL;
	if (err)
		return err;
	ts->sec = (__be32)stamp_ts_be32(sec);
	ts->frac = (__be32)stamp_ts_be32(frac);
	return 0;
}

/*
 * Wire timestamp (big-endian) -> TAI ns. Returns 0 and sets *tai_ns, or
 * -EINVAL for a PTPv2 nanoseconds field >= 10^9 or an unknown format.
 * *tai_ns is a __u64 (unsigned long long): in user space pass a __u64, not a
 * uint64_t (unsigned long on LP64) through a cast, or strict aliasing at -O2
 * may read the old value.
 */
static inline int stamp_ts_to_tai_ns(enum stamp_ts_format fmt, const struct stamp_timestamp *ts,
				     __s32 tai_utc_offset_s, __u64 ref_tai_ns, __u64 *tai_ns)
{
	__u32 sec = stamp_ts_be32((__u32)ts->sec), frac = stamp_ts_be32((__u32)ts->frac);

	if (fmt == STAMP_TS_PTP) {
		if (stamp_ptp_check(frac))
			return -STAMP_TS_EINVAL;
		*tai_ns = stamp_ptp_to_tai_ns(sec, frac, ref_tai_ns);
		return 0;
	}
	if (fmt == STAMP_TS_NTP) {
		*tai_ns = stamp_ntp_to_tai_ns(sec, frac, tai_utc_offset_s, ref_tai_ns);
		return 0;
	}
	return -STAMP_TS_EINVAL;
}

/* Format of a timestamp from its Error Estimate (host order): the Z bit. */
static inline enum stamp_ts_format stamp_ts_format_of(__u16 err_est)
{
	return (err_est & STAMP_EE_Z) ? STAMP_TS_PTP : STAMP_TS_NTP;
}

#endif /* SEGSCOPE_STAMP_TIMESTAMP_H */
