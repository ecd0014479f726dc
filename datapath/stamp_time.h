/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * STAMP timestamp formats for the datapath (BPF and user space, no libc):
 * CLOCK_TAI nanoseconds <-> NTP 64-bit (RFC 5905 §6: UTC seconds since
 * 1900-01-01 + 2^-32 s fraction). PTPv2 truncated lives in
 * schemas/c/stamp_test_packet.h (stamp_ptp_from_ns / stamp_ptp_to_ns).
 *
 * NTP carries UTC, the programs' clock is TAI, so both directions take
 * TAI - UTC in seconds (struct timex.tai). Rounding is to nearest in both
 * directions: the fraction step is 2^-32 s = 0.233 ns, so ns -> NTP -> ns
 * gives back the same nanosecond and one NTP -> ns conversion is off by
 * at most 0.5 ns from the exact value.
 */
#ifndef SEGSCOPE_STAMP_TIME_H
#define SEGSCOPE_STAMP_TIME_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

#define STAMP_TIME_NS_PER_SEC   1000000000ULL
#define STAMP_NTP_UNIX_OFFSET_S 2208988800ULL   /* 1970-01-01 - 1900-01-01 in seconds */

/* TAI ns -> NTP seconds (low 32 bits, era dropped as on the wire) and fraction, host order. */
static inline void stamp_ntp_from_tai_ns(__u64 tai_ns, __s32 tai_utc_offset_s, __u32 *sec, __u32 *frac)
{
	__u64 utc_ns = tai_ns - (__u64)((__s64)tai_utc_offset_s * (__s64)STAMP_TIME_NS_PER_SEC);
	__u64 s = utc_ns / STAMP_TIME_NS_PER_SEC;
	__u64 ns = utc_ns - s * STAMP_TIME_NS_PER_SEC;   /* < 2^30, so ns << 32 fits */

	*sec = (__u32)(s + STAMP_NTP_UNIX_OFFSET_S);
	*frac = (__u32)(((ns << 32) + STAMP_TIME_NS_PER_SEC / 2) / STAMP_TIME_NS_PER_SEC);
}

/*
 * NTP (host order) -> 64-bit TAI ns. The 32-bit seconds are widened with the
 * era of a reference TAI time taken close to them (T4), choosing the
 * candidate within half an era (68 years) of it.
 */
static inline __u64 stamp_ntp_to_tai_ns(__u32 sec, __u32 frac, __s32 tai_utc_offset_s, __u64 ref_tai_ns)
{
	__u64 ref_sec = ref_tai_ns / STAMP_TIME_NS_PER_SEC - (__u64)(__s64)tai_utc_offset_s +
			STAMP_NTP_UNIX_OFFSET_S;
	__u64 full = (ref_sec & ~0xffffffffULL) | sec;
	__u64 ns = ((__u64)frac * STAMP_TIME_NS_PER_SEC + 0x80000000ULL) >> 32;   /* may be 1e9: carries below */

	if (full > ref_sec + 0x80000000ULL && full >= 0x100000000ULL)
		full -= 0x100000000ULL;
	else if (full + 0x80000000ULL < ref_sec)
		full += 0x100000000ULL;
	return (full - STAMP_NTP_UNIX_OFFSET_S + (__u64)(__s64)tai_utc_offset_s) * STAMP_TIME_NS_PER_SEC + ns;
}

#endif /* SEGSCOPE_STAMP_TIME_H */
