/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Return Path TLV, Type 10 (RFC 9503 §4). Value: Return Path sub-TLVs,
 * types from the RFC 9503 §4.1 figures (scoped by this TLV; they overlap
 * the Location sub-TLV numbers in IANA "STAMP Sub-TLV Types"):
 *   1 Control Code (Length 4): Control Code Flags, 32 bits; RFC 9503 §4.1.1
 *     defines the Reply Request flag, bit 31 (the least significant bit):
 *     0x0 No Reply Requested, 0x1 Reply Requested on the Same Link. The other
 *     bits are unassigned: ignored on receipt;
 *   2 Return Address: the reply's destination (Length 4 IPv4, 16 IPv6);
 *   3 SR-MPLS Label Stack: n x 32-bit label stack entries;
 *   4 SRv6 Segment List: n x 128-bit SIDs, Segment(1) first.
 * A sub-TLV type appears at most once (a second one: malformed).
 * Python: segscope_schemas/stamp_tlv_return_path.py.
 */
#ifndef SEGSCOPE_STAMP_TLV_RETURN_PATH_H
#define SEGSCOPE_STAMP_TLV_RETURN_PATH_H
#include <string.h>
#include "stamp_tlv.h"
#include "stamp_tlv_dest_node_addr.h"   /* address families */

#define STAMP_RP_SUB_CONTROL_CODE   1
#define STAMP_RP_SUB_RETURN_ADDRESS 2
#define STAMP_RP_SUB_SR_MPLS_LABELS 3
#define STAMP_RP_SUB_SRV6_SEGMENTS  4
#define STAMP_RP_CC_REPLY_REQUEST   0x1   /* mask: the Reply Request flag (bit 31) */
#define STAMP_RP_CC_NO_REPLY        0x0   /* flag values, RFC 9503 §4.1.1 */
#define STAMP_RP_CC_REPLY_SAME_LINK 0x1

struct stamp_tlv_return_path {
	__u8 flags;
	const __u8 *sub_tlvs;        /* raw sub-TLV area */
	__u16 sub_len;
	/* typed views, filled by decode */
	int has_control_code;
	__u32 control_code;          /* raw Control Code Flags */
	int reply_requested;         /* has_control_code: the Reply Request flag; else 1 (no code: reply) */
	__u16 ret_family;            /* STAMP_AF_*, 0 when there is no Return Address */
	__u8 ret_address[16];
	const __u8 *segments;        /* n_segments x 16 bytes, NULL if none */
	unsigned int n_segments;
	const __u8 *labels;          /* n_labels x 4 bytes, NULL if none */
	unsigned int n_labels;
};

static inline int stamp_tlv_return_path_check(const __u8 *value, __u16 len)
{
	struct stamp_tlv_view s;
	size_t off = 0;
	unsigned int seen = 0;
	int rc;

	while ((rc = stamp_tlv_next(value, len, &off, &s)) == 1) {
		if (s.type >= STAMP_RP_SUB_CONTROL_CODE && s.type <= STAMP_RP_SUB_SRV6_SEGMENTS) {
			if (seen & (1u << s.type))
				return STAMP_TLV_EVALUE;
			seen |= 1u << s.type;
		}
		switch (s.type) {
		case STAMP_RP_SUB_CONTROL_CODE:
			if (s.length != 4)
				return STAMP_TLV_ELENGTH;
			break;
		case STAMP_RP_SUB_RETURN_ADDRESS:
			if (stamp_af_of_len(s.length) < 0)
				return STAMP_TLV_ELENGTH;
			break;
		case STAMP_RP_SUB_SR_MPLS_LABELS:
			if (s.length == 0 || s.length % 4)
				return STAMP_TLV_ELENGTH;
			break;
		case STAMP_RP_SUB_SRV6_SEGMENTS:
			if (s.length == 0 || s.length % 16)
				return STAMP_TLV_ELENGTH;
			break;
		default:
			return STAMP_TLV_EVALUE;
		}
	}
	if (rc < 0)
		return STAMP_TLV_EVALUE;
	return seen ? 0 : STAMP_TLV_ELENGTH;
}

static inline int stamp_tlv_return_path_value_ok(const __u8 *value, __u16 len)
{
	return stamp_tlv_return_path_check(value, len) == 0;
}

static inline int stamp_tlv_return_path_decode(const __u8 *buf, size_t len,
					       struct stamp_tlv_return_path *v)
{
	struct stamp_tlv_view t, s;
	size_t off = 0;
	int rc = stamp_tlv_split(buf, len, STAMP_TLV_RETURN_PATH, &t);

	if (rc || (rc = stamp_tlv_return_path_check(t.value, t.length)))
		return rc;
	memset(v, 0, sizeof(*v));
	v->flags = t.flags;
	v->reply_requested = 1;
	v->sub_tlvs = t.value;
	v->sub_len = t.length;
	while (stamp_tlv_next(t.value, t.length, &off, &s) == 1) {
		if (s.type == STAMP_RP_SUB_CONTROL_CODE && !v->has_control_code) {
			v->has_control_code = 1;
			v->control_code = stamp_get_be32(s.value);
			v->reply_requested = !!(v->control_code & STAMP_RP_CC_REPLY_REQUEST);
		} else if (s.type == STAMP_RP_SUB_RETURN_ADDRESS && !v->ret_family) {
			v->ret_family = (__u16)stamp_af_of_len(s.length);
			memcpy(v->ret_address, s.value, s.length);
		} else if (s.type == STAMP_RP_SUB_SRV6_SEGMENTS && !v->segments) {
			v->segments = s.value;
			v->n_segments = s.length / 16;
		} else if (s.type == STAMP_RP_SUB_SR_MPLS_LABELS && !v->labels) {
			v->labels = s.value;
			v->n_labels = s.length / 4;
		}
	}
	return 0;
}

/* Whole TLV from its raw sub-TLV area (build that with the put_* helpers). */
static inline int stamp_tlv_return_path_encode(__u8 *out, size_t cap, const struct stamp_tlv_return_path *v)
{
	int rc = stamp_tlv_put_header(out, cap, v->flags, STAMP_TLV_RETURN_PATH, v->sub_len);

	if (rc < 0)
		return rc;
	if (v->sub_len)
		memmove(out + 4, v->sub_tlvs, v->sub_len);
	return STAMP_TLV_HDR_LEN + v->sub_len;
}

static inline int stamp_tlv_return_path_put_control_code(__u8 *out, size_t cap, __u32 cc)
{
	int rc = stamp_tlv_put_header(out, cap, 0, STAMP_RP_SUB_CONTROL_CODE, 4);

	if (rc < 0)
		return rc;
	stamp_put_be32(out + 4, cc);
	return 8;
}

static inline int stamp_tlv_return_path_put_return_address(__u8 *out, size_t cap, __u16 family,
							   const __u8 *addr)
{
	int alen = stamp_af_addr_len(family), rc;

	if (alen < 0)
		return STAMP_TLV_EVALUE;
	rc = stamp_tlv_put_header(out, cap, 0, STAMP_RP_SUB_RETURN_ADDRESS, (size_t)alen);
	if (rc < 0)
		return rc;
	memcpy(out + 4, addr, alen);
	return 4 + alen;
}

static inline int stamp_tlv_return_path_put_segments(__u8 *out, size_t cap, const __u8 *sids, unsigned int n)
{
	int rc;

	if (n == 0)
		return STAMP_TLV_EVALUE;
	rc = stamp_tlv_put_header(out, cap, 0, STAMP_RP_SUB_SRV6_SEGMENTS, (size_t)n * 16);
	if (rc < 0)
		return rc;
	memcpy(out + 4, sids, (size_t)n * 16);
	return 4 + (int)n * 16;
}
#endif
