/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Access Report TLV, Type 6 (RFC 8972 §4.6). Value (Length 4):
 * ID (4) | Resv (4) | Return Code (8) | Reserved (16).
 * ID 1 = 3GPP, 2 = non-3GPP; Return Code (IANA "STAMP Return Codes"):
 * 1 Network available, 2 Network unavailable.
 * Python: segscope_schemas/stamp_tlv_access_report.py.
 */
#ifndef SEGSCOPE_STAMP_TLV_ACCESS_REPORT_H
#define SEGSCOPE_STAMP_TLV_ACCESS_REPORT_H
#include "stamp_tlv.h"

#define STAMP_TLV_AR_LEN            4
#define STAMP_AR_ID_3GPP            1
#define STAMP_AR_ID_NON_3GPP        2
#define STAMP_AR_RC_AVAILABLE       1
#define STAMP_AR_RC_UNAVAILABLE     2

struct stamp_tlv_access_report {
	__u8 flags;
	__u8 id;
	__u8 return_code;
};

static inline int stamp_tlv_access_report_value_ok(const __u8 *value, __u16 len)
{
	(void)value;
	return len == STAMP_TLV_AR_LEN;
}

static inline int stamp_tlv_access_report_decode(const __u8 *buf, size_t len,
						 struct stamp_tlv_access_report *v)
{
	struct stamp_tlv_view t;
	int rc = stamp_tlv_split(buf, len, STAMP_TLV_ACCESS_REPORT, &t);

	if (rc)
		return rc;
	if (t.length != STAMP_TLV_AR_LEN)
		return STAMP_TLV_ELENGTH;
	v->flags = t.flags;
	v->id = t.value[0] >> 4;
	v->return_code = t.value[1];
	return 0;
}

static inline int stamp_tlv_access_report_encode(__u8 *out, size_t cap,
						 const struct stamp_tlv_access_report *v)
{
	int rc = stamp_tlv_put_header(out, cap, v->flags, STAMP_TLV_ACCESS_REPORT, STAMP_TLV_AR_LEN);

	if (rc < 0)
		return rc;
	if (v->id > 15)
		return STAMP_TLV_EVALUE;
	out[4] = (__u8)(v->id << 4);
	out[5] = v->return_code;
	out[6] = out[7] = 0;
	return STAMP_TLV_HDR_LEN + STAMP_TLV_AR_LEN;
}
#endif
