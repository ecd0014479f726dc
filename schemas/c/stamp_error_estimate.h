/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * STAMP Error Estimate (RFC 8762 §4.2.1, format of RFC 4656 §4.1.2, Z bit of
 * RFC 8186 §2.3), 16 bits big-endian on the wire:
 *
 *    0                   1
 *    0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5
 *   +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
 *   |S|Z|   Scale   |   Multiplier  |
 *   +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
 *
 * S = 1: the clock is synchronised to UTC by an external source;
 * Z = 0: NTP 64-bit timestamps, 1: PTPv2 truncated;
 * error = Multiplier * 2^(-32) * 2^Scale seconds; Multiplier MUST NOT be 0
 * (RFC 4656 §4.1.2: such a packet is treated as corrupt).
 *
 * "Honest" encoding: stamp_ee_from_error_ns() gives the smallest representable
 * error >= the given one (never understates it); stamp_ee_to_error_ns()
 * decodes rounding up to whole ns (saturating at UINT64_MAX).
 * The codecs are BPF-usable; stamp_clock_read()/stamp_ee_from_clock() (adjtimex)
 * are user space only. Python mirror: segscope_schemas/stamp_error_estimate.py;
 * vectors: schemas/vectors/stamp_error_estimate.json.
 */
#ifndef SEGSCOPE_STAMP_ERROR_ESTIMATE_H
#define SEGSCOPE_STAMP_ERROR_ESTIMATE_H

#include "stamp_timestamp.h"

#define STAMP_EE_SCALE_MAX  63
#define STAMP_EE_MULT_MAX   255
#define STAMP_EE_EINVAL     22

/* Decoded Error Estimate. */
struct stamp_ee_fields {
	__u8 s;           /* 1 = synchronised */
	__u8 z;           /* enum stamp_ts_format */
	__u8 scale;       /* 0..63 */
	__u8 multiplier;  /* 1..255 */
};

/* Host-order Error Estimate from its fields (scale/multiplier are masked). */
static inline __u16 stamp_ee_pack(int synced, enum stamp_ts_format fmt, __u8 scale, __u8 multiplier)
{
	return (__u16)((synced ? STAMP_EE_S : 0) | (fmt == STAMP_TS_PTP ? STAMP_EE_Z : 0) |
		       ((scale & 0x3f) << 8) | multiplier);
}

/* Host-order Error Estimate -> fields. 0, or -EINVAL for Multiplier 0. */
static inline int stamp_ee_unpack(__u16 ee, struct stamp_ee_fields *f)
{
	f->s = !!(ee & STAMP_EE_S);
	f->z = !!(ee & STAMP_EE_Z);
	f->scale = STAMP_EE_SCALE(ee);
	f->multiplier = STAMP_EE_MULT(ee);
	return f->multiplier ? 0 : -STAMP_EE_EINVAL;
}

/*
 * Smallest (scale, multiplier) whose error Multiplier*2^(Scale-32) s is >=
 * err_ns. The smallest scale whose multiplier fits 8 bits gives the smallest
 * value (coarser grids only round up further). err_ns 0 gives (0, 1), the
 * smallest non-zero error. Every u64 ns fits (max 255*2^31 s).
 */
static inline void stamp_ee_from_error_ns(__u64 err_ns, __u8 *scale, __u8 *multiplier)
{
	__u64 m = 0;
	int s;

	for (s = 0; s <= STAMP_EE_SCALE_MAX; s++) {
		if (s < 32) {
			/* m = ceil(err_ns * 2^(32-s) / 10^9); skip if the product overflows */
			if (err_ns >> (32 + s))
				continue;
			__u64 scaled = err_ns << (32 - s);

			m = scaled / STAMP_NS_PER_SEC + (scaled % STAMP_NS_PER_SEC != 0);
		} else {
			__u64 unit_ns = STAMP_NS_PER_SEC << (s - 32);   /* <= 2^31 * 10^9 */

			m = err_ns / unit_ns + (err_ns % unit_ns != 0);
		}
		if (m <= STAMP_EE_MULT_MAX)
			break;
	}
	*scale = (__u8)s;
	*multiplier = (__u8)(m ? m : 1);
}

/* Error of (scale, multiplier) in ns, rounded up; UINT64_MAX if it does not fit. */
static inline __u64 stamp_ee_to_error_ns(__u8 scale, __u8 multiplier)
{
	__u64 num = (__u64)multiplier * STAMP_NS_PER_SEC;   /* error * 2^(32-scale) in ns */

	scale &= 0x3f;
	if (scale <= 32) {
		__u64 div = 1ULL << (32 - scale);

		return num / div + (num % div != 0);
	}
	if (num > (~0ULL >> (scale - 32)))
		return ~0ULL;
	return num << (scale - 32);
}

/* Host-order Error Estimate for an error in ns. */
static inline __u16 stamp_ee_encode(int synced, enum stamp_ts_format fmt, __u64 err_ns)
{
	__u8 scale, mult;

	stamp_ee_from_error_ns(err_ns, &scale, &mult);
	return stamp_ee_pack(synced, fmt, scale, mult);
}

#if !defined(__bpf__) && !defined(__BPF__)
#include <sys/timex.h>

/* Floor of the encoded error: timestamps come from a ns clock. */
#define STAMP_EE_MIN_ERROR_NS 1

/* The kernel clock's sync state (adjtimex(2), read-only). */
struct stamp_clock_state {
	int state;          /* adjtimex return: TIME_OK .. TIME_ERROR */
	int status;         /* STA_* bits */
	long maxerror_us;   /* maximum error */
	long esterror_us;   /* estimated error */
	int tai_offset_s;   /* TAI-UTC the kernel knows (0 if never set) */
	int synced;         /* S bit: see stamp_clock_synced() */
};

/*
 * S = 1 only if the kernel says the clock is disciplined: not STA_UNSYNC, not
 * TIME_ERROR, and maxerror below NTP's 16 s phase limit.
 */
static inline int stamp_clock_synced(int state, int status, long maxerror_us)
{
	return state != TIME_ERROR && !(status & STA_UNSYNC) && maxerror_us < 16000000L;
}

/* Reads adjtimex (modes 0, changes nothing). 0, or -errno. */
static inline int stamp_clock_read(struct stamp_clock_state *cs)
{
	struct timex tx = { 0 };
	int state = adjtimex(&tx);

	if (state < 0)
		return -1;
	cs->state = state;
	cs->status = tx.status;
	cs->maxerror_us = tx.maxerror;
	cs->esterror_us = tx.esterror;
	cs->tai_offset_s = tx.tai;
	cs->synced = stamp_clock_synced(state, tx.status, tx.maxerror);
	return 0;
}

/*
 * Error in ns a timestamp from this clock carries: the estimated error when
 * synchronised, the maximum error (a bound, 16 s when free-running) when not.
 */
static inline __u64 stamp_clock_error_ns(const struct stamp_clock_state *cs)
{
	long us = cs->synced ? cs->esterror_us : cs->maxerror_us;
	__u64 ns = us > 0 ? (__u64)us * 1000ULL : 0;

	return ns < STAMP_EE_MIN_ERROR_NS ? STAMP_EE_MIN_ERROR_NS : ns;
}

/* Host-order Error Estimate for a session's format from the clock state. */
static inline __u16 stamp_ee_from_clock(const struct stamp_clock_state *cs, enum stamp_ts_format fmt)
{
	return stamp_ee_encode(cs->synced, fmt, stamp_clock_error_ns(cs));
}
#endif /* !BPF */

#endif /* SEGSCOPE_STAMP_ERROR_ESTIMATE_H */
