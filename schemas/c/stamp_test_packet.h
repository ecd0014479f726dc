/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * STAMP base test packets, unauthenticated mode: RFC 8762 §4.2.1 (Session-
 * Sender) and §4.3.1 (Session-Reflector), with the RFC 8972 §3 SSID in the
 * former MBZ field. Both are 44 bytes; TLVs (RFC 8972) follow them. Fields
 * are big-endian on the wire. Included by the eBPF programs (no libc here)
 * and by user space. Python mirror: schemas/python/segscope_schemas/
 * stamp_test_packet.py; vectors: schemas/vectors/stamp_test_packet.json.
 *
 * Timestamps in this layout: PTPv2 truncated, 32-bit seconds +
 * 32-bit nanoseconds of TAI (Error Estimate Z = 1). NTP: stamp_timestamp.h.
 */
#ifndef SEGSCOPE_STAMP_TEST_PACKET_H
#define SEGSCOPE_STAMP_TEST_PACKET_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

#define STAMP_PORT          862   /* IANA UDP port for STAMP (RFC 8762 §4.1) */
#define STAMP_BASE_LEN      44    /* both base packets, unauthenticated */

/* Error Estimate (RFC 4656 §4.1.2 / RFC 8762 §4.2.1): S|Z|Scale(6)|Multiplier(8) */
#define STAMP_EE_S          0x8000  /* clock synchronised to UTC/TAI */
#define STAMP_EE_Z          0x4000  /* 1 = PTPv2 timestamp format, 0 = NTP */
#define STAMP_EE_SCALE(x)   (((x) >> 8) & 0x3f)
#define STAMP_EE_MULT(x)    ((x) & 0xff)

/* PTPv2 truncated timestamp: seconds and nanoseconds, both 32-bit BE. */
struct stamp_timestamp {
	__be32 sec;
	__be32 frac;   /* nanoseconds for PTPv2; 2^-32 s fraction for NTP */
} __attribute__((packed));

/* RFC 8762 §4.2.1 + RFC 8972 §3: Session-Sender test packet (44 bytes). */
struct stamp_sender_packet {
	__be32 seq;                       /*  0 Sequence Number */
	struct stamp_timestamp ts;        /*  4 Timestamp (T1) */
	__be16 err_est;                   /* 12 Error Estimate */
	__be16 ssid;                      /* 14 SSID */
	__u8   mbz[28];                   /* 16 MBZ */
} __attribute__((packed));

/* RFC 8762 §4.3.1 + RFC 8972 §3: Session-Reflector test packet (44 bytes). */
struct stamp_reflector_packet {
	__be32 seq;                       /*  0 Sequence Number (= sender seq when stateless) */
	struct stamp_timestamp ts;        /*  4 Timestamp (T3) */
	__be16 err_est;                   /* 12 Error Estimate */
	__be16 ssid;                      /* 14 SSID */
	struct stamp_timestamp rx_ts;     /* 16 Receive Timestamp (T2) */
	__be32 sender_seq;                /* 24 Session-Sender Sequence Number */
	struct stamp_timestamp sender_ts; /* 28 Session-Sender Timestamp (T1) */
	__be16 sender_err_est;            /* 36 Session-Sender Error Estimate */
	__be16 mbz1;                      /* 38 MBZ */
	__u8   sender_ttl;                /* 40 Ses-Sender TTL */
	__u8   mbz2[3];                   /* 41 MBZ */
} __attribute__((packed));

#define STAMP_NS_PER_SEC 1000000000ULL

/* TAI nanoseconds -> PTPv2 truncated (host order sec/nsec; caller converts). */
static inline void stamp_ptp_from_ns(__u64 ns, __u32 *sec, __u32 *nsec)
{
	*sec = (__u32)(ns / STAMP_NS_PER_SEC);
	*nsec = (__u32)(ns % STAMP_NS_PER_SEC);
}

/*
 * Widen a 32-bit seconds field (PTPv2 truncated, or NTP era seconds) to 64
 * bits with the upper bits of a reference time in the same epoch taken close
 * to it (e.g. T4): the wire carries only the low 32 bits, which wrap every
 * 136 years. Picks the candidate within half a wrap of the reference.
 */
static inline __u64 stamp_sec32_widen(__u32 sec, __u64 ref_sec)
{
	__u64 full = (ref_sec & ~0xffffffffULL) | sec;

	if (full > ref_sec + 0x80000000ULL && full >= 0x100000000ULL)
		full -= 0x100000000ULL;
	else if (full + 0x80000000ULL < ref_sec)
		full += 0x100000000ULL;
	return full;
}

/* PTPv2 truncated (host order) -> 64-bit TAI ns, widened with ref_ns (TAI). */
static inline __u64 stamp_ptp_to_ns(__u32 sec, __u32 nsec, __u64 ref_ns)
{
	return stamp_sec32_widen(sec, ref_ns / STAMP_NS_PER_SEC) * STAMP_NS_PER_SEC + nsec;
}

#endif /* SEGSCOPE_STAMP_TEST_PACKET_H */
