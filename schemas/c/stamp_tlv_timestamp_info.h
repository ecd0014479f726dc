/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Timestamp Information TLV, Type 3 (RFC 8972 §4.3).
 * Value: Sync Src In | Timestamp In | Sync Src Out | Timestamp Out (8 bits
 * each) | optional sub-TLVs. "In" = reflector's receive timestamp (T2),
 * "Out" = its transmit timestamp (T3). The sender sends zeros.
 * Python: segscope_schemas/stamp_tlv_timestamp_info.py.
 */
#ifndef SEGSCOPE_STAMP_TLV_TIMESTAMP_INFO_H
#define SEGSCOPE_STAMP_TLV_TIMESTAMP_INFO_H
#include <string.h>
#include "stamp_tlv.h"

#define STAMP_SYNC_RESERVED          0  /* IANA "STAMP Synchronization Sources" (RFC 8972 §4.3): never sent */
#define STAMP_SYNC_NTP               1
#define STAMP_SYNC_PTP               2
#define STAMP_SYNC_SSU_BITS          3
#define STAMP_SYNC_GNSS              4  /* GPS/GLONASS/LORAN-C/BDS/Galileo */
#define STAMP_SYNC_LOCAL_FREE_RUNNING 5 /* the clock follows no source (unsynchronized) */
#define STAMP_TSMETHOD_HW_ASSIST     1  /* IANA "STAMP Timestamping Methods" */
#define STAMP_TSMETHOD_SW_LOCAL      2
#define STAMP_TSMETHOD_CONTROL_PLANE 3

struct stamp_tlv_timestamp_info {
	__u8 flags;
	__u8 sync_src_in, ts_in, sync_src_out, ts_out;
	const __u8 *sub_tlvs;   /* optional sub-TLVs, raw */
	__u16 sub_len;
};

static inline int stamp_tlv_timestamp_info_check(const __u8 *value, __u16 len)
{
	if (len < 4)
		return STAMP_TLV_ELENGTH;
	return stamp_tlv_count(value, len, 4) < 0 ? STAMP_TLV_EVALUE : 0;
}

static inline int stamp_tlv_timestamp_info_value_ok(const __u8 *value, __u16 len)
{
	return stamp_tlv_timestamp_info_check(value, len) == 0;
}

static inline int stamp_tlv_timestamp_info_decode(const __u8 *buf, size_t len,
						  struct stamp_tlv_timestamp_info *v)
{
	struct stamp_tlv_view t;
	int rc = stamp_tlv_split(buf, len, STAMP_TLV_TIMESTAMP_INFO, &t);

	if (rc || (rc = stamp_tlv_timestamp_info_check(t.value, t.length)))
		return rc;
	v->flags = t.flags;
	v->sync_src_in = t.value[0];
	v->ts_in = t.value[1];
	v->sync_src_out = t.value[2];
	v->ts_out = t.value[3];
	v->sub_tlvs = t.value + 4;
	v->sub_len = t.length - 4;
	return 0;
}

static inline int stamp_tlv_timestamp_info_encode(__u8 *out, size_t cap,
						  const struct stamp_tlv_timestamp_info *v)
{
	int rc = stamp_tlv_put_header(out, cap, v->flags, STAMP_TLV_TIMESTAMP_INFO, 4 + (size_t)v->sub_len);

	if (rc < 0)
		return rc;
	out[4] = v->sync_src_in;
	out[5] = v->ts_in;
	out[6] = v->sync_src_out;
	out[7] = v->ts_out;
	if (v->sub_len)
		memmove(out + 8, v->sub_tlvs, v->sub_len);
	return 8 + v->sub_len;
}

/* Reflector, in place on the Value: fill the four octets. */
static inline void stamp_tlv_timestamp_info_reflect(__u8 *value, __u8 sync_in, __u8 ts_in,
						    __u8 sync_out, __u8 ts_out)
{
	value[0] = sync_in; value[1] = ts_in; value[2] = sync_out; value[3] = ts_out;
}
#endif
