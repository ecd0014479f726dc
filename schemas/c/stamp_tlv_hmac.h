/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * HMAC TLV, Type 8 (RFC 8972 §4.8). Value (Length 16): HMAC-SHA-256
 * truncated to 128 bits (RFC 8762 §4.4) over the base packet's Sequence
 * Number followed by every TLV before the HMAC TLV (headers as sent).
 * The HMAC is computed by stamp_hmac; this file places it and names the
 * covered bytes. Python: segscope_schemas/stamp_tlv_hmac.py.
 */
#ifndef SEGSCOPE_STAMP_TLV_HMAC_H
#define SEGSCOPE_STAMP_TLV_HMAC_H
#include <string.h>
#include "stamp_tlv.h"

#define STAMP_TLV_HMAC_LEN 16

struct stamp_tlv_hmac {
	__u8 flags;
	__u8 hmac[STAMP_TLV_HMAC_LEN];
};

static inline int stamp_tlv_hmac_value_ok(const __u8 *value, __u16 len)
{
	(void)value;
	return len == STAMP_TLV_HMAC_LEN;
}

static inline int stamp_tlv_hmac_decode(const __u8 *buf, size_t len, struct stamp_tlv_hmac *v)
{
	struct stamp_tlv_view t;
	int rc = stamp_tlv_split(buf, len, STAMP_TLV_HMAC, &t);

	if (rc)
		return rc;
	if (t.length != STAMP_TLV_HMAC_LEN)
		return STAMP_TLV_ELENGTH;
	v->flags = t.flags;
	memcpy(v->hmac, t.value, STAMP_TLV_HMAC_LEN);
	return 0;
}

static inline int stamp_tlv_hmac_encode(__u8 *out, size_t cap, const struct stamp_tlv_hmac *v)
{
	int rc = stamp_tlv_put_header(out, cap, v->flags, STAMP_TLV_HMAC, STAMP_TLV_HMAC_LEN);

	if (rc < 0)
		return rc;
	memcpy(out + 4, v->hmac, STAMP_TLV_HMAC_LEN);
	return STAMP_TLV_HDR_LEN + STAMP_TLV_HMAC_LEN;
}
#endif
