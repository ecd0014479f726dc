/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Follow-Up Telemetry TLV, Type 7 (RFC 8972 §4.7). Value (Length 16):
 * Sequence Number (32) | Follow-Up Timestamp (64) | Timestamp M (8) |
 * Reserved (24). The reflector reports the sequence number and transmit
 * timestamp of the packet it reflected before this one, and the method.
 * Python: segscope_schemas/stamp_tlv_follow_up_telemetry.py.
 */
#ifndef SEGSCOPE_STAMP_TLV_FOLLOW_UP_TELEMETRY_H
#define SEGSCOPE_STAMP_TLV_FOLLOW_UP_TELEMETRY_H
#include "stamp_tlv.h"

#define STAMP_TLV_FUT_LEN 16

struct stamp_tlv_follow_up_telemetry {
	__u8 flags;
	__u32 seq;
	__u32 ts_sec, ts_frac;
	__u8 ts_method;
};

static inline int stamp_tlv_follow_up_telemetry_value_ok(const __u8 *value, __u16 len)
{
	(void)value;
	return len == STAMP_TLV_FUT_LEN;
}

static inline int stamp_tlv_follow_up_telemetry_decode(const __u8 *buf, size_t len,
						       struct stamp_tlv_follow_up_telemetry *v)
{
	struct stamp_tlv_view t;
	int rc = stamp_tlv_split(buf, len, STAMP_TLV_FOLLOW_UP_TELEMETRY, &t);

	if (rc)
		return rc;
	if (t.length != STAMP_TLV_FUT_LEN)
		return STAMP_TLV_ELENGTH;
	v->flags = t.flags;
	v->seq = stamp_get_be32(t.value);
	v->ts_sec = stamp_get_be32(t.value + 4);
	v->ts_frac = stamp_get_be32(t.value + 8);
	v->ts_method = t.value[12];
	return 0;
}

static inline int stamp_tlv_follow_up_telemetry_encode(__u8 *out, size_t cap,
						       const struct stamp_tlv_follow_up_telemetry *v)
{
	int rc = stamp_tlv_put_header(out, cap, v->flags, STAMP_TLV_FOLLOW_UP_TELEMETRY, STAMP_TLV_FUT_LEN);

	if (rc < 0)
		return rc;
	stamp_put_be32(out + 4, v->seq);
	stamp_put_be32(out + 8, v->ts_sec);
	stamp_put_be32(out + 12, v->ts_frac);
	out[16] = v->ts_method;
	out[17] = out[18] = out[19] = 0;
	return STAMP_TLV_HDR_LEN + STAMP_TLV_FUT_LEN;
}
#endif
