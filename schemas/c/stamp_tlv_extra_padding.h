/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Extra Padding TLV, Type 1 (RFC 8972 §4.1): Value = padding of any length.
 * Python: segscope_schemas/stamp_tlv_extra_padding.py. */
#ifndef SEGSCOPE_STAMP_TLV_EXTRA_PADDING_H
#define SEGSCOPE_STAMP_TLV_EXTRA_PADDING_H
#include <string.h>
#include "stamp_tlv.h"

struct stamp_tlv_extra_padding {
	__u8 flags;
	__u16 length;
	const __u8 *padding;   /* view into the decoded buffer / source for encode */
};

static inline int stamp_tlv_extra_padding_value_ok(const __u8 *value, __u16 len)
{
	(void)value; (void)len;
	return 1;   /* any length is valid */
}

static inline int stamp_tlv_extra_padding_decode(const __u8 *buf, size_t len,
						 struct stamp_tlv_extra_padding *v)
{
	struct stamp_tlv_view t;
	int rc = stamp_tlv_split(buf, len, STAMP_TLV_EXTRA_PADDING, &t);

	if (rc)
		return rc;
	v->flags = t.flags;
	v->length = t.length;
	v->padding = t.value;
	return 0;
}

static inline int stamp_tlv_extra_padding_encode(__u8 *out, size_t cap,
						 const struct stamp_tlv_extra_padding *v)
{
	int rc = stamp_tlv_put_header(out, cap, v->flags, STAMP_TLV_EXTRA_PADDING, v->length);

	if (rc < 0)
		return rc;
	if (v->length)
		memmove(out + STAMP_TLV_HDR_LEN, v->padding, v->length);
	return STAMP_TLV_HDR_LEN + v->length;
}
#endif
