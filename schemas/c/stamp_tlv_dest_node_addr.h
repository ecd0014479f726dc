/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Destination Node Address TLV, Type 9 (RFC 9503 §3). Value: Address
 * Family (16: 1 IPv4, 2 IPv6) | Reserved (16) | Address (4 or 16);
 * Length 8 or 20. Reflector: when the address is not one of its own, it
 * sets U in the reflected TLV (our reading of RFC 9503 §3).
 * Python: segscope_schemas/stamp_tlv_dest_node_addr.py.
 */
#ifndef SEGSCOPE_STAMP_TLV_DEST_NODE_ADDR_H
#define SEGSCOPE_STAMP_TLV_DEST_NODE_ADDR_H
#include <string.h>
#include "stamp_tlv.h"

#define STAMP_AF_IPV4 1
#define STAMP_AF_IPV6 2

static inline int stamp_af_addr_len(__u16 family)
{
	return family == STAMP_AF_IPV4 ? 4 : family == STAMP_AF_IPV6 ? 16 : -1;
}

struct stamp_tlv_dest_node_addr {
	__u8 flags;
	__u16 family;
	__u8 address[16];   /* first 4 bytes for IPv4 */
};

static inline int stamp_tlv_dest_node_addr_check(const __u8 *value, __u16 len)
{
	int alen;

	if (len < 4)
		return STAMP_TLV_ELENGTH;
	alen = stamp_af_addr_len(stamp_get_be16(value));
	if (alen < 0)
		return STAMP_TLV_EVALUE;
	return len == 4 + alen ? 0 : STAMP_TLV_ELENGTH;
}

static inline int stamp_tlv_dest_node_addr_value_ok(const __u8 *value, __u16 len)
{
	return stamp_tlv_dest_node_addr_check(value, len) == 0;
}

static inline int stamp_tlv_dest_node_addr_decode(const __u8 *buf, size_t len,
						  struct stamp_tlv_dest_node_addr *v)
{
	struct stamp_tlv_view t;
	int rc = stamp_tlv_split(buf, len, STAMP_TLV_DEST_NODE_ADDR, &t);

	if (rc || (rc = stamp_tlv_dest_node_addr_check(t.value, t.length)))
		return rc;
	v->flags = t.flags;
	v->family = stamp_get_be16(t.value);
	memset(v->address, 0, sizeof(v->address));
	memcpy(v->address, t.value + 4, t.length - 4);
	return 0;
}

static inline int stamp_tlv_dest_node_addr_encode(__u8 *out, size_t cap,
						  const struct stamp_tlv_dest_node_addr *v)
{
	int alen = stamp_af_addr_len(v->family), rc;

	if (alen < 0)
		return STAMP_TLV_EVALUE;
	rc = stamp_tlv_put_header(out, cap, v->flags, STAMP_TLV_DEST_NODE_ADDR, 4 + (size_t)alen);
	if (rc < 0)
		return rc;
	stamp_put_be16(out + 4, v->family);
	stamp_put_be16(out + 6, 0);
	memcpy(out + 8, v->address, alen);
	return 8 + alen;
}

/* Reflector: U set when the address is not ours, cleared when it is. */
static inline __u8 stamp_tlv_dest_node_addr_reflected_flags(__u8 flags, int address_is_ours)
{
	return address_is_ours ? (flags & ~STAMP_TLV_FLAG_U) : (flags | STAMP_TLV_FLAG_U);
}
#endif
