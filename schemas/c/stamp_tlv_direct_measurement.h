/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Direct Measurement TLV, Type 5 (RFC 8972 §4.5). Value (Length 12):
 * S_TxC (32, Session-Sender Tx counter) | R_RxC (32, Session-Reflector Rx
 * counter) | R_TxC (32, Session-Reflector Tx counter). The sender fills
 * S_TxC; the reflector fills R_RxC and R_TxC.
 * Python: segscope_schemas/stamp_tlv_direct_measurement.py.
 */
#ifndef SEGSCOPE_STAMP_TLV_DIRECT_MEASUREMENT_H
#define SEGSCOPE_STAMP_TLV_DIRECT_MEASUREMENT_H
#include "stamp_tlv.h"

#define STAMP_TLV_DM_LEN 12

struct stamp_tlv_direct_measurement {
	__u8 flags;
	__u32 s_tx, r_rx, r_tx;
};

static inline int stamp_tlv_direct_measurement_value_ok(const __u8 *value, __u16 len)
{
	(void)value;
	return len == STAMP_TLV_DM_LEN;
}

static inline int stamp_tlv_direct_measurement_decode(const __u8 *buf, size_t len,
						      struct stamp_tlv_direct_measurement *v)
{
	struct stamp_tlv_view t;
	int rc = stamp_tlv_split(buf, len, STAMP_TLV_DIRECT_MEASUREMENT, &t);

	if (rc)
		return rc;
	if (t.length != STAMP_TLV_DM_LEN)
		return STAMP_TLV_ELENGTH;
	v->flags = t.flags;
	v->s_tx = stamp_get_be32(t.value);
	v->r_rx = stamp_get_be32(t.value + 4);
	v->r_tx = stamp_get_be32(t.value + 8);
	return 0;
}

static inline int stamp_tlv_direct_measurement_encode(__u8 *out, size_t cap,
						      const struct stamp_tlv_direct_measurement *v)
{
	int rc = stamp_tlv_put_header(out, cap, v->flags, STAMP_TLV_DIRECT_MEASUREMENT, STAMP_TLV_DM_LEN);

	if (rc < 0)
		return rc;
	stamp_put_be32(out + 4, v->s_tx);
	stamp_put_be32(out + 8, v->r_rx);
	stamp_put_be32(out + 12, v->r_tx);
	return STAMP_TLV_HDR_LEN + STAMP_TLV_DM_LEN;
}

/* Reflector, in place on the Value. */
static inline void stamp_tlv_direct_measurement_reflect(__u8 *value, __u32 r_rx, __u32 r_tx)
{
	stamp_put_be32(value + 4, r_rx);
	stamp_put_be32(value + 8, r_tx);
}
#endif
