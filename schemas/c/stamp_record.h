/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * stamp_record: one STAMP measurement (T1..T4 of one reflected test packet),
 * as the XDP Session-Sender collector writes it into the `stamp_records` ring
 * buffer and as the streamer ships it to Kafka, unchanged, inside a
 * stamp_batch (see stamp_batch.h).
 *
 * Layout: 64 bytes, little-endian (host order of the node; every supported
 * node is little-endian), no implicit padding. Python mirror:
 * schemas/python/segscope_schemas/stamp_record.py. Vectors:
 * schemas/vectors/stamp_batch_*.hex (+ .json with the expected decode).
 *
 * All timestamps are full 64-bit nanoseconds of CLOCK_TAI. T1..T3 come from the
 * packet (32-bit seconds on the wire) and are widened with T4's upper bits, so
 * they are comparable with T4 directly.
 */
#ifndef SEGSCOPE_STAMP_RECORD_H
#define SEGSCOPE_STAMP_RECORD_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

#define STAMP_RECORD_SIZE 64

/* flags */
#define STAMP_RECORD_F_NTP        0x1  /* the session used NTP timestamps on the wire (converted to TAI here) */
#define STAMP_RECORD_F_SRH        0x2  /* the reply arrived with an SRH (reflector used a return SID list) */
#define STAMP_RECORD_F_ONE_WAY    0x4  /* one-way mode: only T1 and T2 are measured (t3_ns = t4_ns = 0) */
#define STAMP_RECORD_F_LOOPBACK   0x8  /* loopback mode: the sender reflected to itself, T1 and T4 only (t2_ns = t3_ns = 0) */
/* The reflector's T2 and T3 were NTP on the wire (its Error Estimate had Z = 0, RFC 8762
 * §4.3.1), converted to TAI here; clear: PTPv2 truncated. Independent of F_NTP, which is the
 * sender's own format (T1): each side says its format in its own Error Estimate. */
#define STAMP_RECORD_F_REFLECTOR_NTP 0x10

struct stamp_record {
	__u64 t1_ns;              /*  0 Session-Sender transmit (from the reflected packet) */
	__u64 t2_ns;              /*  8 Session-Reflector receive */
	__u64 t3_ns;              /* 16 Session-Reflector transmit */
	__u64 t4_ns;              /* 24 Session-Sender receive (collector, bpf_ktime_get_tai_ns) */
	__u32 sender_seq;         /* 32 Session-Sender Sequence Number */
	__u32 reflector_seq;      /* 36 Session-Reflector Sequence Number */
	__u16 ssid;               /* 40 STAMP Session Identifier (RFC 8972) */
	__u16 sender_err_est;     /* 42 Session-Sender Error Estimate, as on the wire (host order) */
	__u16 reflector_err_est;  /* 44 Session-Reflector Error Estimate, as on the wire (host order) */
	__u8  sender_ttl;         /* 46 Ses-Sender TTL: hop limit of the test packet at the reflector */
	__u8  reply_hop_limit;    /* 47 hop limit of the reply at the collector */
	__u32 ifindex;            /* 48 interface the reply arrived on */
	__u32 flags;              /* 52 STAMP_RECORD_F_* */
	__u64 reserved;           /* 56 zero; room for a later field without changing the size */
};

#ifdef __cplusplus
static_assert(sizeof(struct stamp_record) == STAMP_RECORD_SIZE, "stamp_record size");
#elif !defined(__bpf__)
_Static_assert(sizeof(struct stamp_record) == STAMP_RECORD_SIZE, "stamp_record size");
#endif

#endif /* SEGSCOPE_STAMP_RECORD_H */
