/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Parsing shared by ioam_tx.bpf.c (TC) and ioam_rx.bpf.c (XDP): the walk of
 * an IPv6 Hop-by-Hop / Destination Options header looking for one option,
 * with the rules of schemas/c/ipv6_options.h (ipv6_opts_find), so the
 * programs and the user-space codecs classify a header the same way.
 *
 * The walk is a global BPF function (verified once, on its own, whatever the
 * caller's state): a 16-step loop over options of variable length inlined
 * into every caller would multiply the verifier's paths. Global functions
 * take the context, not packet pointers, so the header is named by its
 * offset from the frame start; each program instantiates the walk for its
 * context type (IOAM_DEFINE_OPTS_FIND).
 */
#ifndef SEGSCOPE_IOAM_PARSE_BPF_H
#define SEGSCOPE_IOAM_PARSE_BPF_H

#include "ioam.h"

#define IOAM_ETH_P_IPV6_BE bpf_htons(0x86DD)
#define IOAM_L3_OFF        14
#define IOAM_L4_OFF        (IOAM_L3_OFF + 40)
#define IOAM_OFF_MASK      0x1fff   /* every offset the programs read at: < 8 KiB (the verifier needs a bound) */

/* Outcome of the walk, in the low byte of its return value; the option's offset from the header start above it. */
enum ioam_walk_outcome {
	IOAM_WALK_FOUND = 0,
	IOAM_WALK_NO_OPTION,
	IOAM_WALK_TRUNCATED,     /* the header runs past `limit` (the frame or the IPv6 payload) */
	IOAM_WALK_BAD_LENGTH,    /* option past the header, padding > 7 bytes or not zero, > 16 options, misaligned */
};

/*
 * ctx->data / ctx->data_end read with one load each, always from the context
 * register: clang otherwise keeps &ctx->data in a register when a function
 * reads it twice (around a helper that moves the packet), and the verifier
 * refuses a dereference of a modified context pointer.
 */
#define IOAM_CTX_PTR(ctx, field) ({                                                         \
	void *__p;                                                                         \
	asm volatile("%0 = *(u32 *)(%1 + %2)" : "=r"(__p)                                  \
		     : "r"(ctx), "i"(__builtin_offsetof(typeof(*(ctx)), field)));          \
	__p;                                                                               \
})
#define IOAM_DATA(ctx)     IOAM_CTX_PTR(ctx, data)
#define IOAM_DATA_END(ctx) IOAM_CTX_PTR(ctx, data_end)

#define IOAM_WALK_OUTCOME(r) ((r) & 0xff)
#define IOAM_WALK_OFF(r)     ((__u32)(r) >> 8)

/*
 * The walk's loop state lives in a per-CPU map value, not in registers: the
 * verifier does not track what a map value holds, so every iteration starts
 * from the same state and the paths through one iteration (Pad1, PadN,
 * another option, the one looked for) prune each other at the loop head.
 * With the state in registers each path carried its own ranges, and 16
 * iterations exceeded the verifier's million instructions.
 */
struct ioam_walk_state {
	__u32 off;        /* next option, from the header start */
	__u32 pad;        /* bytes in the current run of padding */
	__u32 found_off;  /* 0: not found (an option never starts at 0) */
	__u32 done;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ioam_walk_state);
} ioam_walk SEC(".maps");

/* One option of the walk: an outcome to stop with, or -1 to go on (st->done: the header ended). */
static __always_inline int ioam_walk_step(volatile struct ioam_walk_state *st, __u8 *hdr, void *data_end, __u32 hdr_len,
					  __u32 opt_type)
{
	__u32 off = st->off, opt_len, type, pad;
	__u8 *p;

	if (off >= hdr_len) {
		st->done = 1;
		return -1;
	}
	p = hdr + (off & 0x7ff);
	if ((void *)(p + 1) > data_end)
		return IOAM_WALK_TRUNCATED;   /* within limit, so within the frame */
	type = p[0];
	pad = st->pad;
	if (type == IPV6_OPT_PAD1) {
		if (pad + 1 > IPV6_OPTS_MAX_PAD)
			return IOAM_WALK_BAD_LENGTH;
		st->pad = pad + 1;
		st->off = off + 1;
		return -1;
	}
	if (off + 2 > hdr_len)
		return IOAM_WALK_BAD_LENGTH;
	if ((void *)(p + 2) > data_end)
		return IOAM_WALK_TRUNCATED;
	opt_len = 2 + (__u32)p[1];
	if (off + opt_len > hdr_len)
		return IOAM_WALK_BAD_LENGTH;
	if (type == IPV6_OPT_PADN) {
		if (pad + opt_len > IPV6_OPTS_MAX_PAD)
			return IOAM_WALK_BAD_LENGTH;
		/* PadN content must be zero: at most 5 bytes (padding <= 7) */
		for (__u32 j = 2; j < IPV6_OPTS_MAX_PAD; j++) {
			if (j >= opt_len)
				break;
			if ((void *)(p + j + 1) > data_end)
				return IOAM_WALK_TRUNCATED;
			if (p[j])
				return IOAM_WALK_BAD_LENGTH;
		}
		st->pad = pad + opt_len;
	} else {
		st->pad = 0;
		if (type == opt_type && !st->found_off) {
			if (off & (IOAM_ALIGN - 1))
				return IOAM_WALK_BAD_LENGTH;
			st->found_off = off;
		}
	}
	st->off = off + opt_len;
	return -1;
}

/*
 * int NAME(CTX *ctx, __u32 hdr_off, __u32 limit, __u32 opt_type): walk the
 * options header at frame offset hdr_off (8n from the IPv6 header, so 4n
 * alignment is the option's offset in the header mod 4), ending before frame
 * offset `limit`. Every byte read is also checked against data_end (limit
 * never exceeds the frame, so those checks only serve the verifier).
 */
#define IOAM_DEFINE_OPTS_FIND(NAME, CTX)                                                        \
__attribute__((noinline)) int NAME(CTX *ctx, __u32 hdr_off, __u32 limit, __u32 opt_type)        \
{                                                                                               \
	void *data = IOAM_DATA(ctx), *data_end = IOAM_DATA_END(ctx);                            \
	volatile struct ioam_walk_state *st;                                                    \
	__u32 hdr_len, zero = 0;                                                                \
	__u8 *hdr;                                                                              \
                                                                                                \
	st = bpf_map_lookup_elem(&ioam_walk, &zero);                                            \
	if (!st)                                                                                \
		return IOAM_WALK_TRUNCATED;                                                     \
	hdr_off &= IOAM_OFF_MASK;                                                               \
	hdr = data + hdr_off;                                                                   \
	if (hdr_off + 2 > limit || (void *)(hdr + 2) > data_end)                                \
		return IOAM_WALK_TRUNCATED;                                                     \
	hdr_len = ((__u32)hdr[1] + 1) * 8;                                                      \
	if (hdr_off + hdr_len > limit)                                                          \
		return IOAM_WALK_TRUNCATED;                                                     \
	st->off = 2;                                                                            \
	st->pad = 0;                                                                            \
	st->found_off = 0;                                                                      \
	st->done = 0;                                                                           \
	for (int i = 0; i < IPV6_OPTS_MAX_TLVS; i++) {                                          \
		int r = ioam_walk_step(st, hdr, data_end, hdr_len, opt_type);                   \
                                                                                                \
		if (r >= 0)                                                                     \
			return r;                                                               \
		if (st->done)                                                                   \
			break;                                                                  \
	}                                                                                       \
	/* the 16th option may end the header: the loop had no turn left to see it */          \
	if (!st->done && st->off < hdr_len)                                                     \
		return IOAM_WALK_BAD_LENGTH;   /* more than IPV6_OPTS_MAX_TLVS options */       \
	return st->found_off ? (int)(IOAM_WALK_FOUND | st->found_off << 8) : IOAM_WALK_NO_OPTION; \
}

#endif /* SEGSCOPE_IOAM_PARSE_BPF_H */
