/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * altmark_block: the packets and bytes one edge node counted for one flow in
 * one alternate-marking block (RFC 9341), and altmark_batch, the Kafka message
 * value on topic `segscope.altmark.blocks` that carries them.
 * Python mirror: schemas/python/segscope_schemas/altmark_block.py.
 * Vectors: schemas/vectors/altmark_block.json. Description: schemas/ALTMARK.md.
 *
 * struct altmark_block, 64 bytes, little-endian, no implicit padding:
 *
 *   offset size field
 *   0      8    block_index    floor(block_start_ns / period_ns), period_ns = period_ms * 1e6;
 *                              both edges compute it from CLOCK_TAI, no messaging
 *   8      8    block_start_ns CLOCK_TAI ns of the block start = block_index * period_ns
 *   16     8    packets        packets of this flow and colour counted in THIS block (a delta,
 *                              not a cumulative counter: see altmark_counter_delta)
 *   24     8    bytes          bytes of those packets (L3 length as the program saw it)
 *   32     8    boot_id        the collector agent's epoch: changes whenever the agent (or the
 *                              datapath program it reads) restarts, so a consumer can tell a
 *                              restart from anything else
 *   40     4    flow_id        RFC 9343 FlowMonID (20 bits) or the id the controller gave a
 *                              SID-list flow (dscp method, 32 bits)
 *   44     4    period_ms      colour period T of the flow (block length), > 0
 *   48     1    direction      ALTMARK_DIR_TX (ingress edge, colourer) / ALTMARK_DIR_RX (egress edge)
 *   49     1    colour         0 or 1 = block_index & 1 (the colour that was active in the block)
 *   50     1    method         ALTMARK_METHOD_DSCP / ALTMARK_METHOD_RFC9343
 *   51     1    reserved0      0
 *   52     2    flags          ALTMARK_BLOCK_F_*
 *   54     2    dmark_packets  double marking (RFC 9341): D-marked packets this edge saw in the
 *                              block (a per-block delta like packets, mod 2^16)
 *   56     8    dmark_ts_sum_ns per-block delta (mod 2^64) of the sum of the CLOCK_TAI ns
 *                              timestamps of those D-marked packets. Mean one-way delay of the
 *                              block = (int64_t)(rx.dmark_ts_sum_ns - tx.dmark_ts_sum_ns) / n,
 *                              valid only when tx.dmark_packets == rx.dmark_packets == n > 0
 *                              (altmark_dmark_delay_ns). Records written before double marking
 *                              have 0 in both fields (bytes 52..63 were flags u32 + reserved).
 */
#ifndef SEGSCOPE_ALTMARK_BLOCK_H
#define SEGSCOPE_ALTMARK_BLOCK_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

#define ALTMARK_BLOCK_SIZE 64

#define ALTMARK_DIR_TX 1
#define ALTMARK_DIR_RX 2

#define ALTMARK_METHOD_DSCP    1   /* colour in two DSCP bits (seed 001) */
#define ALTMARK_METHOD_RFC9343 2   /* IPv6 Alternate-Marking option: FlowMonID, L (loss) and D flags */

#define ALTMARK_FLOWMONID_MAX 0xFFFFF  /* RFC 9343: FlowMonID is 20 bits */

/* flags */
#define ALTMARK_BLOCK_F_PARTIAL 0x1  /* the counts do not cover the whole block: the agent or the
				      * datapath program started (counters reset) during it */
#define ALTMARK_BLOCK_F_KNOWN   0x1

struct altmark_block {
	__u64 block_index;
	__u64 block_start_ns;
	__u64 packets;
	__u64 bytes;
	__u64 boot_id;
	__u32 flow_id;
	__u32 period_ms;
	__u8  direction;
	__u8  colour;
	__u8  method;
	__u8  reserved0;
	__u16 flags;
	__u16 dmark_packets;
	__u64 dmark_ts_sum_ns;
};

_Static_assert(sizeof(struct altmark_block) == ALTMARK_BLOCK_SIZE, "altmark_block size");

/*
 * Packets (or bytes) counted between two snapshots of a per-colour counter
 * that is `width_bits` wide (64 for the datapath's __u64 counters): modular
 * subtraction, so a counter that wrapped between the snapshots still gives the
 * right delta (it cannot wrap twice within one colour cycle at any real rate).
 * A counter that was reset (map recreated) is NOT detectable from the values:
 * the collector must know it (program/map id changed) and set F_PARTIAL.
 */
static inline __u64 altmark_counter_delta(__u64 prev, __u64 cur, unsigned int width_bits)
{
	__u64 mask = width_bits >= 64 ? ~0ULL : ((1ULL << width_bits) - 1);

	return (cur - prev) & mask;
}

/*
 * Mean one-way delay (ns) of a block from the TX and RX records' double-marking
 * fields: 0 with *ok = 0 when it is not defined (no D-marked packet, or the two
 * edges saw a different number of them: a D-marked packet was lost, so the sums
 * do not cover the same packets).
 */
static inline __s64 altmark_dmark_delay_ns(__u16 tx_n, __u64 tx_sum, __u16 rx_n, __u64 rx_sum, int *ok)
{
	*ok = tx_n && tx_n == rx_n;
	return *ok ? (__s64)(rx_sum - tx_sum) / (__s64)tx_n : 0;
}

#if !defined(__bpf__) && !defined(__VMLINUX_H__)
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "batch_envelope.h"

/* Why a record is not usable (altmark_block_check); names match the Python mirror. */
enum altmark_block_problem {
	ALTMARK_OK = 0,
	ALTMARK_BAD_DIRECTION,
	ALTMARK_BAD_METHOD,
	ALTMARK_BAD_COLOUR,
	ALTMARK_ZERO_PERIOD,
	ALTMARK_BAD_BLOCK_START,
	ALTMARK_COLOUR_MISMATCH,
	ALTMARK_FLOW_ID_TOO_BIG,
	ALTMARK_UNKNOWN_FLAGS,
};

static inline const char *altmark_block_problem_name(enum altmark_block_problem p)
{
	static const char *const names[] = {
		"ok", "bad_direction", "bad_method", "bad_colour", "zero_period",
		"bad_block_start", "colour_mismatch", "flow_id_too_big", "unknown_flags",
	};

	return (unsigned int)p < sizeof(names) / sizeof(names[0]) ? names[p] : "?";
}

/* First problem of a record, checked in the order of the enum; ALTMARK_OK if none. */
static inline enum altmark_block_problem altmark_block_check(const struct altmark_block *b)
{
	uint64_t period_ns = (uint64_t)b->period_ms * 1000000ULL;

	if (b->direction != ALTMARK_DIR_TX && b->direction != ALTMARK_DIR_RX)
		return ALTMARK_BAD_DIRECTION;
	if (b->method != ALTMARK_METHOD_DSCP && b->method != ALTMARK_METHOD_RFC9343)
		return ALTMARK_BAD_METHOD;
	if (b->colour > 1)
		return ALTMARK_BAD_COLOUR;
	if (!period_ns)
		return ALTMARK_ZERO_PERIOD;
	/* division, not block_index * period_ns: that product can overflow */
	if (b->block_start_ns % period_ns || b->block_start_ns / period_ns != b->block_index)
		return ALTMARK_BAD_BLOCK_START;
	if (b->colour != (b->block_index & 1))
		return ALTMARK_COLOUR_MISMATCH;
	if (b->method == ALTMARK_METHOD_RFC9343 && b->flow_id > ALTMARK_FLOWMONID_MAX)
		return ALTMARK_FLOW_ID_TOO_BIG;
	if (b->flags & ~ALTMARK_BLOCK_F_KNOWN)
		return ALTMARK_UNKNOWN_FLAGS;
	return ALTMARK_OK;
}

/*
 * altmark_batch: one Kafka message = one collector poll's records of ONE flow
 * (key "<node>/<flow_id>", so a flow's records stay ordered in one partition).
 *
 *   offset size field
 *   0      4    magic        "AMB1" (segscope altmark batch, layout 1)
 *   4      2    header_size  56 (a reader skips to header_size)
 *   6      2    record_size  64
 *   8      4    record_count N
 *   12     4    flags        0
 *   16     8    batch_seq    per-collector counter, +1 per message
 *   24     32   node         node name, UTF-8, NUL-padded
 *   56     N*64 records      struct altmark_block[N]
 *
 * A message whose length is not header_size + N*record_size is malformed.
 */
#define ALTMARK_BATCH_MAGIC "AMB1"
#define ALTMARK_BATCH_HEADER_SIZE BATCH_HEADER_SIZE
#define ALTMARK_BATCH_NODE_LEN BATCH_NODE_LEN

/* The header is the shared envelope's (batch_envelope.h). */
#define altmark_batch_header batch_header

/* Write a header for `count` records; returns header size. */
static inline size_t altmark_batch_encode_header(void *buf, const char *node,
						 uint32_t count, uint64_t batch_seq)
{
	return batch_encode_header(buf, ALTMARK_BATCH_MAGIC, ALTMARK_BLOCK_SIZE, node, count, batch_seq);
}

/*
 * Validate a message; on success point *records at the first record and
 * return the record count. Returns -EBADMSG (bad magic/sizes) or -EMSGSIZE
 * (shorter than a header, or length does not match the count).
 */
static inline int64_t altmark_batch_decode(const void *buf, size_t len,
					   const struct altmark_block **records,
					   struct altmark_batch_header *hdr_out)
{
	return batch_decode(buf, len, ALTMARK_BATCH_MAGIC, ALTMARK_BLOCK_SIZE,
			    (const void **)records, hdr_out);
}

/* Kafka key "<node>/<flow_id>"; returns snprintf's result (>= cap means truncated). */
static inline int altmark_kafka_key(char *out, size_t cap, const char *node, uint32_t flow_id)
{
	return snprintf(out, cap, "%s/%u", node, flow_id);
}
#endif /* !__bpf__ */

#endif /* SEGSCOPE_ALTMARK_BLOCK_H */
