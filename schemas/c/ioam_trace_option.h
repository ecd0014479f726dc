/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The IOAM Pre-allocated Trace option (RFC 9197 §4.4) in the IPv6 Hop-by-Hop
 * header (RFC 9486 §3, option type 0x31), as segscope's ingress edge inserts
 * it (datapath/ioam_tx.bpf.c) and every IOAM node fills it: schemas/IOAM.md
 * draws the bytes. Encode and decode of the whole Hop-by-Hop header and of
 * one node entry; user space (the BPF programs include it for the
 * constants). Python mirror: schemas/python/segscope_schemas/ioam_trace_option.py;
 * vectors: schemas/vectors/ioam_trace_option.json (one filled by the Linux
 * kernel on a real veth).
 *
 *   HBH:    Next Header | Hdr Ext Len | PadN(2) 01 00 |
 *   option: 0x31 | Opt Data Len = 10 + 16 * slots | Reserved | IOAM Option-Type 0 |
 *           Namespace-ID (16) | NodeLen (5) Flags (4) RemainingLen (7) |
 *           IOAM-Trace-Type (24) | Reserved (8) | node data list (16 * slots)
 *
 * The node data list is filled from its end (RFC 9197 §4.4): a node writes
 * its entry at RemainingLen * 4 - NodeLen * 4 and lowers RemainingLen by
 * NodeLen; with no room left it sets the Overflow flag (the first of the four
 * flag bits) instead. So entries [RemainingLen * 4 / 16 .. slots) are filled,
 * the first of them by the node that measured last.
 *
 * Decode rules, in order (each outcome is one counter of ioam_rx): the
 * header walk of ipv6_options.h (truncated / bad_length / no_option), then
 * on the first 0x31 option: Opt Data Len < 2 -> bad_length; IOAM Option-Type
 * not 0 -> unknown_type; Opt Data Len < 10 -> bad_length; RemainingLen * 4
 * > Opt Data Len - 10 -> bad_length (these three are the kernel's
 * ipv6_hop_ioam checks); Trace-Type not 0xF00000 -> unknown_type; NodeLen not
 * 4 -> bad_length (the kernel: NodeLen must match the Trace-Type); the data
 * list not a whole number of entries, RemainingLen not a whole number of
 * entries, or no entry at all -> bad_length.
 */
#ifndef SEGSCOPE_IOAM_TRACE_OPTION_H
#define SEGSCOPE_IOAM_TRACE_OPTION_H

#include "ipv6_options.h"

#define IOAM_HBH_OPT_TYPE         0x31      /* IOAM Hop-by-Hop: act 00 (skip if unknown), chg 1 */
#define IOAM_TRACE_TYPE_SEGSCOPE  0xF00000  /* bits 0-3: hop limit + node id, if ids (short),
					     * timestamp seconds, timestamp subseconds */
#define IOAM_TRACE_NODE_LEN       4         /* NodeLen of that type, 4-octet units */
#define IOAM_TRACE_ENTRY_SIZE     16
#define IOAM_TRACE_OPT_FIXED      10        /* Opt Data Len without the data list */
#define IOAM_TRACE_OPT_OFF        4         /* the option's offset in segscope's HBH (after PadN(2)) */
#define IOAM_TRACE_DATA_OFF       16        /* the node data list's offset in segscope's HBH */
#define IOAM_TRACE_MAX_SLOTS      12        /* segscope's traces: 1..12 entries (ioam_tx --trace-nodes) */
#define IOAM_TRACE_HBH_LEN(slots) (IOAM_TRACE_DATA_OFF + IOAM_TRACE_ENTRY_SIZE * (slots))
#define IOAM_TRACE_FLAG_OVERFLOW  0x8       /* in the 4-bit Flags: the first bit (RFC 9197 §4.4.1) */
#define IOAM_IF_ID_UNAVAILABLE    0xFFFF    /* RFC 9197 §4.4.2.2 / the kernel's IOAM6_U16_UNAVAILABLE */
#define IOAM_NODE_ID_MAX          0xFFFFFF

#ifndef __bpf__
#include <stddef.h>

/* One node entry of a 0xF00000 trace, host order. */
struct ioam_trace_node {
	__u8  hop_limit;
	__u32 node_id;        /* 24 bits */
	__u16 ingress_if_id;
	__u16 egress_if_id;
	__u32 ts_sec;
	__u32 ts_subsec;
};

/* A decoded Hop-by-Hop header holding a trace (pointers into the caller's buffer). */
struct ioam_trace {
	__u8  next_header;
	size_t hbh_len;          /* the whole header, bytes */
	size_t opt_off;          /* the 0x31 option's offset in the header */
	__u16 namespace_id;
	__u8  node_len;          /* 4-octet units */
	__u8  flags;             /* 4 bits; IOAM_TRACE_FLAG_OVERFLOW */
	__u8  remaining_len;     /* 4-octet units */
	__u32 trace_type;        /* 24 bits */
	__u8  slots;             /* entries the data list has room for */
	__u8  filled;            /* slots - remaining_len / node_len */
	const __u8 *data;        /* the node data list, slots * 16 bytes, wire order */
};

static inline void ioam_trace_node_encode(__u8 out[IOAM_TRACE_ENTRY_SIZE], const struct ioam_trace_node *n)
{
	ioam_put32(out, (__u32)n->hop_limit << 24 | (n->node_id & IOAM_NODE_ID_MAX));
	ioam_put16(out + 4, n->ingress_if_id);
	ioam_put16(out + 6, n->egress_if_id);
	ioam_put32(out + 8, n->ts_sec);
	ioam_put32(out + 12, n->ts_subsec);
}

static inline void ioam_trace_node_decode(const __u8 in[IOAM_TRACE_ENTRY_SIZE], struct ioam_trace_node *n)
{
	n->hop_limit = in[0];
	n->node_id = ioam_get24(in + 1);
	n->ingress_if_id = ioam_get16(in + 4);
	n->egress_if_id = ioam_get16(in + 6);
	n->ts_sec = ioam_get32(in + 8);
	n->ts_subsec = ioam_get32(in + 12);
}

/*
 * Write segscope's Hop-by-Hop header: PadN(2), the trace option with room for
 * `slots` entries, all zero except, when `first` is given, the last one
 * (the ingress edge's own entry; RemainingLen then counts slots - 1).
 * Returns the header length, or IOAM_E_SPACE (cap too small, slots not in
 * 1..IOAM_TRACE_MAX_SLOTS).
 */
static inline int ioam_trace_hbh_encode(__u8 *buf, size_t cap, __u8 next_header, __u16 namespace_id,
					unsigned int slots, const struct ioam_trace_node *first)
{
	size_t len = IOAM_TRACE_HBH_LEN(slots);
	unsigned int remaining = (first ? slots - 1 : slots) * IOAM_TRACE_NODE_LEN;

	if (slots < 1 || slots > IOAM_TRACE_MAX_SLOTS || cap < len)
		return IOAM_E_SPACE;
	for (size_t i = 0; i < len; i++)
		buf[i] = 0;
	buf[0] = next_header;
	buf[1] = (__u8)(len / 8 - 1);
	buf[2] = IPV6_OPT_PADN;
	buf[3] = 0;
	buf[4] = IOAM_HBH_OPT_TYPE;
	buf[5] = (__u8)(IOAM_TRACE_OPT_FIXED + IOAM_TRACE_ENTRY_SIZE * slots);
	buf[7] = IOAM_OPTION_PREALLOC_TRACE;
	ioam_put16(buf + 8, namespace_id);
	buf[10] = IOAM_TRACE_NODE_LEN << 3;          /* NodeLen | first 3 flag bits (0) */
	buf[11] = (__u8)remaining;                   /* last flag bit (0) | RemainingLen */
	ioam_put24(buf + 12, IOAM_TRACE_TYPE_SEGSCOPE);
	if (first)
		ioam_trace_node_encode(buf + len - IOAM_TRACE_ENTRY_SIZE, first);
	return (int)len;
}

/* Decode the Hop-by-Hop header at buf[0..len) (the rules above). */
static inline int ioam_trace_hbh_decode(const __u8 *buf, size_t len, struct ioam_trace *t)
{
	size_t off, data_len;
	const __u8 *opt;
	int err = ipv6_opts_find(buf, len, IOAM_HBH_OPT_TYPE, 0, &off);

	if (err)
		return err;
	opt = buf + off;
	t->next_header = buf[0];
	t->hbh_len = ((size_t)buf[1] + 1) * 8;
	t->opt_off = off;
	if (opt[1] < 2)
		return IOAM_E_BAD_LENGTH;
	if (opt[3] != IOAM_OPTION_PREALLOC_TRACE)
		return IOAM_E_UNKNOWN_TYPE;
	if (opt[1] < IOAM_TRACE_OPT_FIXED)
		return IOAM_E_BAD_LENGTH;
	t->namespace_id = ioam_get16(opt + 4);
	t->node_len = opt[6] >> 3;
	t->flags = (__u8)((opt[6] & 0x7) << 1 | opt[7] >> 7);
	t->remaining_len = opt[7] & 0x7f;
	t->trace_type = ioam_get24(opt + 8);
	data_len = (size_t)opt[1] - IOAM_TRACE_OPT_FIXED;
	if ((size_t)t->remaining_len * 4 > data_len)
		return IOAM_E_BAD_LENGTH;
	if (t->trace_type != IOAM_TRACE_TYPE_SEGSCOPE)
		return IOAM_E_UNKNOWN_TYPE;
	if (t->node_len != IOAM_TRACE_NODE_LEN || data_len % IOAM_TRACE_ENTRY_SIZE ||
	    t->remaining_len % IOAM_TRACE_NODE_LEN || !data_len)
		return IOAM_E_BAD_LENGTH;
	t->slots = (__u8)(data_len / IOAM_TRACE_ENTRY_SIZE);
	t->filled = (__u8)(t->slots - t->remaining_len / IOAM_TRACE_NODE_LEN);
	t->data = opt + 2 + IOAM_TRACE_OPT_FIXED;
	return IOAM_OK;
}

/* Entry i of the filled ones, 0 = the node that filled last (i < t->filled). */
static inline void ioam_trace_filled_node(const struct ioam_trace *t, unsigned int i, struct ioam_trace_node *n)
{
	ioam_trace_node_decode(t->data + ((size_t)t->remaining_len * 4) + (size_t)i * IOAM_TRACE_ENTRY_SIZE, n);
}
#endif /* !__bpf__ */

#endif /* SEGSCOPE_IOAM_TRACE_OPTION_H */
