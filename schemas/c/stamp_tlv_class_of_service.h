/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Class of Service TLV, Type 4 (RFC 8972 §4.4). Value (Length 4):
 * DSCP1 (6) | DSCP2 (6) | ECN (2) | RP (2) | Reserved (16).
 * Sender: DSCP1 = DSCP requested for the reflected packet, rest 0.
 * Reflector: DSCP2/ECN = those of the received packet, RP = 1 when it
 * could not use DSCP1 for the reflected packet, DSCP1 unchanged.
 * Python: segscope_schemas/stamp_tlv_class_of_service.py.
 */
#ifndef SEGSCOPE_STAMP_TLV_CLASS_OF_SERVICE_H
#define SEGSCOPE_STAMP_TLV_CLASS_OF_SERVICE_H
#include "stamp_tlv.h"

#define STAMP_TLV_COS_LEN 4

struct stamp_tlv_class_of_service {
	__u8 flags;
	__u8 dscp1, dscp2, ecn, rp;
};

static inline int stamp_tlv_class_of_service_value_ok(const __u8 *value, __u16 len)
{
	(void)value;
	return len == STAMP_TLV_COS_LEN;
}

static inline int stamp_tlv_class_of_service_decode(const __u8 *buf, size_t len,
						    struct stamp_tlv_class_of_service *v)
{
	struct stamp_tlv_view t;
	int rc = stamp_tlv_split(buf, len, STAMP_TLV_CLASS_OF_SERVICE, &t);
	__u16 w;

	if (rc)
		return rc;
	if (t.length != STAMP_TLV_COS_LEN)
		return STAMP_TLV_ELENGTH;
	w = stamp_get_be16(t.value);
	v->flags = t.flags;
	v->dscp1 = (__u8)(w >> 10);
	v->dscp2 = (__u8)((w >> 4) & 0x3f);
	v->ecn = (__u8)((w >> 2) & 3);
	v->rp = (__u8)(w & 3);
	return 0;
}

static inline int stamp_tlv_class_of_service_encode(__u8 *out, size_t cap,
						    const struct stamp_tlv_class_of_service *v)
{
	int rc = stamp_tlv_put_header(out, cap, v->flags, STAMP_TLV_CLASS_OF_SERVICE, STAMP_TLV_COS_LEN);

	if (rc < 0)
		return rc;
	if (v->dscp1 > 63 || v->dscp2 > 63 || v->ecn > 3 || v->rp > 3)
		return STAMP_TLV_EVALUE;
	stamp_put_be16(out + 4, (__u16)((v->dscp1 << 10) | (v->dscp2 << 4) | (v->ecn << 2) | v->rp));
	stamp_put_be16(out + 6, 0);
	return STAMP_TLV_HDR_LEN + STAMP_TLV_COS_LEN;
}

/* Reflector, in place on the Value: received TOS/Traffic Class byte, DSCP1 used or not. */
static inline void stamp_tlv_class_of_service_reflect(__u8 *value, __u8 received_tos, int dscp1_applied)
{
	__u16 dscp1 = stamp_get_be16(value) >> 10;

	stamp_put_be16(value, (__u16)((dscp1 << 10) | ((received_tos >> 2) << 4) |
				      ((received_tos & 3) << 2) | (dscp1_applied ? 0 : 1)));
	stamp_put_be16(value + 2, 0);
}
#endif
