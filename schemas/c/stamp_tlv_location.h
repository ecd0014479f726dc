/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Session-Reflector Location TLV, Type 2 (RFC 8972 §4.2).
 * Value: Destination Port (16) | Source Port (16) | Sub-TLVs (TLV header each).
 * The sender asks with generic sub-TLVs and zeroed values; the reflector
 * copies the received UDP ports and answers each request with the specific
 * sub-TLV of the same size. Sub-TLV types: IANA "STAMP Sub-TLV Types".
 * Python: segscope_schemas/stamp_tlv_location.py.
 */
#ifndef SEGSCOPE_STAMP_TLV_LOCATION_H
#define SEGSCOPE_STAMP_TLV_LOCATION_H
#include <string.h>
#include "stamp_tlv.h"

enum stamp_location_sub {
	STAMP_LOC_SRC_MAC   = 1,  /* request, Length 8 */
	STAMP_LOC_SRC_EUI48 = 2,  /* 6 bytes + 2 reserved, Length 8 */
	STAMP_LOC_SRC_EUI64 = 3,  /* Length 8 */
	STAMP_LOC_DST_IP    = 4,  /* request, Length 16 */
	STAMP_LOC_DST_IPV4  = 5,  /* 4 bytes + 12 MBZ, Length 16 */
	STAMP_LOC_DST_IPV6  = 6,  /* Length 16 */
	STAMP_LOC_SRC_IP    = 7,  /* request, Length 16 */
	STAMP_LOC_SRC_IPV4  = 8,  /* 4 bytes + 12 MBZ, Length 16 */
	STAMP_LOC_SRC_IPV6  = 9,  /* Length 16 */
};

/* Length of a Location sub-TLV type, -1 for a type we do not know. */
static inline int stamp_location_sub_length(__u8 type)
{
	if (type >= STAMP_LOC_SRC_MAC && type <= STAMP_LOC_SRC_EUI64)
		return 8;
	if (type >= STAMP_LOC_DST_IP && type <= STAMP_LOC_SRC_IPV6)
		return 16;
	return -1;
}

struct stamp_tlv_location {
	__u8 flags;
	__u16 dst_port;
	__u16 src_port;
	const __u8 *sub_tlvs;   /* raw sub-TLV area (iterate with stamp_tlv_next) */
	__u16 sub_len;
};

static inline int stamp_tlv_location_check(const __u8 *value, __u16 len)
{
	struct stamp_tlv_view s;
	size_t off = 4;
	int rc;

	if (len < 4)
		return STAMP_TLV_ELENGTH;
	while ((rc = stamp_tlv_next(value, len, &off, &s)) == 1) {
		int want = stamp_location_sub_length(s.type);

		if (want < 0)
			return STAMP_TLV_EVALUE;
		if (s.length != want)
			return STAMP_TLV_ELENGTH;
	}
	return rc < 0 ? STAMP_TLV_EVALUE : 0;
}

static inline int stamp_tlv_location_value_ok(const __u8 *value, __u16 len)
{
	return stamp_tlv_location_check(value, len) == 0;
}

static inline int stamp_tlv_location_decode(const __u8 *buf, size_t len, struct stamp_tlv_location *v)
{
	struct stamp_tlv_view t;
	int rc = stamp_tlv_split(buf, len, STAMP_TLV_LOCATION, &t);

	if (rc)
		return rc;
	rc = stamp_tlv_location_check(t.value, t.length);
	if (rc)
		return rc;
	v->flags = t.flags;
	v->dst_port = stamp_get_be16(t.value);
	v->src_port = stamp_get_be16(t.value + 2);
	v->sub_tlvs = t.value + 4;
	v->sub_len = t.length - 4;
	return 0;
}

static inline int stamp_tlv_location_encode(__u8 *out, size_t cap, const struct stamp_tlv_location *v)
{
	int rc = stamp_tlv_put_header(out, cap, v->flags, STAMP_TLV_LOCATION, 4 + (size_t)v->sub_len);

	if (rc < 0)
		return rc;
	stamp_put_be16(out + 4, v->dst_port);
	stamp_put_be16(out + 6, v->src_port);
	if (v->sub_len)
		memmove(out + 8, v->sub_tlvs, v->sub_len);
	return 8 + v->sub_len;
}

/*
 * Reflector, in place on a valid Location value: copy the received UDP
 * ports and answer each request sub-TLV (same size). mac: 6 bytes (EUI-48)
 * or NULL; src_ip/dst_ip: 4 or 16 bytes (ip_len) or NULL.
 */
static inline int stamp_tlv_location_reflect(__u8 *value, __u16 len, __u16 dst_port, __u16 src_port,
					     const __u8 *mac, const __u8 *src_ip, const __u8 *dst_ip,
					     int ip_len)
{
	struct stamp_tlv_view s;
	size_t off = 4;
	int rc = stamp_tlv_location_check(value, len);

	if (rc)
		return rc;
	stamp_put_be16(value, dst_port);
	stamp_put_be16(value + 2, src_port);
	while (stamp_tlv_next(value, len, &off, &s) == 1) {
		__u8 *h = value + s.offset, *val = h + STAMP_TLV_HDR_LEN;
		const __u8 *ip = NULL;
		int is_src = 0;

		h[0] = 0;
		if (s.type <= STAMP_LOC_SRC_EUI64 && mac) {
			h[1] = STAMP_LOC_SRC_EUI48;
			memset(val, 0, 8);
			memcpy(val, mac, 6);
			continue;
		}
		if (s.type >= STAMP_LOC_DST_IP && s.type <= STAMP_LOC_DST_IPV6)
			ip = dst_ip;
		else if (s.type >= STAMP_LOC_SRC_IP)
			ip = src_ip, is_src = 1;
		if (!ip)
			continue;
		h[1] = (__u8)((is_src ? STAMP_LOC_SRC_IPV4 : STAMP_LOC_DST_IPV4) + (ip_len == 16));
		memset(val, 0, 16);
		memcpy(val, ip, ip_len == 16 ? 16 : 4);
	}
	return 0;
}
#endif
