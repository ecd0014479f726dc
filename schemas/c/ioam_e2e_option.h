/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The IOAM Edge-to-Edge option (RFC 9197 §4.6) in an IPv6 Destination Options
 * header (RFC 9486 §3, option type 0x11), as segscope's ingress edge inserts
 * it after the SRH (datapath/ioam_tx.bpf.c) for the egress edge
 * (datapath/ioam_rx.bpf.c): schemas/IOAM.md draws the bytes. Encode and
 * decode of the whole 32-byte header; user space (the BPF programs include it
 * for the constants). Python mirror:
 * schemas/python/segscope_schemas/ioam_e2e_option.py; vectors:
 * schemas/vectors/ioam_e2e_option.json.
 *
 *   DOH:    Next Header | Hdr Ext Len 3 | PadN(2) 01 00 |
 *   option: 0x11 | Opt Data Len 22 | Reserved | IOAM Option-Type 3 |
 *           Namespace-ID (16) | IOAM-E2E-Type 0xB000 (16) |
 *           Sequence Number (64) | Timestamp Seconds (32) | Timestamp Subseconds (32) |
 *   PadN(4) 01 02 00 00
 *
 * E2E-Type 0xB000 = bits 0, 2, 3: 64-bit sequence number, timestamp seconds
 * and subseconds. The timestamp is PTPv2 truncated: TAI seconds and
 * nanoseconds of the ingress transmit.
 *
 * Decode rules, in order: the header walk of ipv6_options.h (truncated /
 * bad_length / no_option), then on the first 0x11 option: Opt Data Len < 6
 * -> bad_length; IOAM Option-Type not 3 -> unknown_type; E2E-Type not
 * 0xB000 -> unknown_type; Opt Data Len not 22 -> bad_length; subseconds >=
 * 10^9 -> bad_timestamp.
 */
#ifndef SEGSCOPE_IOAM_E2E_OPTION_H
#define SEGSCOPE_IOAM_E2E_OPTION_H

#include "ipv6_options.h"

#define IOAM_DOH_OPT_TYPE        0x11     /* IOAM Destination: act 00 (skip if unknown), chg 0 */
#define IOAM_E2E_TYPE_SEGSCOPE   0xB000   /* 64-bit sequence number, timestamp s, timestamp subs */
#define IOAM_E2E_OPT_DATA_LEN    22
#define IOAM_E2E_DOH_LEN         32
#define IOAM_E2E_OPT_OFF         4        /* the option's offset in segscope's DOH (after PadN(2)) */
#define IOAM_E2E_NS_PER_SEC      1000000000U

#ifndef __bpf__
#include <stddef.h>

struct ioam_e2e {
	__u8  next_header;
	size_t doh_len;
	size_t opt_off;
	__u16 namespace_id;
	__u16 e2e_type;
	__u64 seq;
	__u32 ts_sec;       /* TAI seconds, low 32 bits */
	__u32 ts_nsec;
};

/* Write segscope's 32-byte Destination Options header. Returns 32 or IOAM_E_SPACE. */
static inline int ioam_e2e_doh_encode(__u8 *buf, size_t cap, __u8 next_header, __u16 namespace_id, __u64 seq,
				      __u32 ts_sec, __u32 ts_nsec)
{
	if (cap < IOAM_E2E_DOH_LEN || ts_nsec >= IOAM_E2E_NS_PER_SEC)
		return IOAM_E_SPACE;
	buf[0] = next_header;
	buf[1] = IOAM_E2E_DOH_LEN / 8 - 1;
	buf[2] = IPV6_OPT_PADN;
	buf[3] = 0;
	buf[4] = IOAM_DOH_OPT_TYPE;
	buf[5] = IOAM_E2E_OPT_DATA_LEN;
	buf[6] = 0;
	buf[7] = IOAM_OPTION_E2E;
	ioam_put16(buf + 8, namespace_id);
	ioam_put16(buf + 10, IOAM_E2E_TYPE_SEGSCOPE);
	ioam_put64(buf + 12, seq);
	ioam_put32(buf + 20, ts_sec);
	ioam_put32(buf + 24, ts_nsec);
	buf[28] = IPV6_OPT_PADN;
	buf[29] = 2;
	buf[30] = 0;
	buf[31] = 0;
	return IOAM_E2E_DOH_LEN;
}

/* Decode the Destination Options header at buf[0..len) (the rules above). */
static inline int ioam_e2e_doh_decode(const __u8 *buf, size_t len, struct ioam_e2e *e)
{
	size_t off;
	const __u8 *opt;
	int err = ipv6_opts_find(buf, len, IOAM_DOH_OPT_TYPE, 0, &off);

	if (err)
		return err;
	opt = buf + off;
	e->next_header = buf[0];
	e->doh_len = ((size_t)buf[1] + 1) * 8;
	e->opt_off = off;
	if (opt[1] < 6)
		return IOAM_E_BAD_LENGTH;
	if (opt[3] != IOAM_OPTION_E2E)
		return IOAM_E_UNKNOWN_TYPE;
	e->namespace_id = ioam_get16(opt + 4);
	e->e2e_type = ioam_get16(opt + 6);
	if (e->e2e_type != IOAM_E2E_TYPE_SEGSCOPE)
		return IOAM_E_UNKNOWN_TYPE;
	if (opt[1] != IOAM_E2E_OPT_DATA_LEN)
		return IOAM_E_BAD_LENGTH;
	e->seq = ioam_get64(opt + 8);
	e->ts_sec = ioam_get32(opt + 16);
	e->ts_nsec = ioam_get32(opt + 20);
	if (e->ts_nsec >= IOAM_E2E_NS_PER_SEC)
		return IOAM_E_BAD_TIMESTAMP;
	return IOAM_OK;
}
#endif /* !__bpf__ */

#endif /* SEGSCOPE_IOAM_E2E_OPTION_H */
