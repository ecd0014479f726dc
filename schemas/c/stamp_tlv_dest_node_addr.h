/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Destination Node Address TLV, Type 9 (RFC 9503 §3). Value: the address of
 * the intended Session-Reflector and nothing else; Length 4 = IPv4,
 * 16 = IPv6. Reflector: U = 1 in the reflected TLV when it is not the node
 * named here, U = 0 when it is.
 * Python: segscope_schemas/stamp_tlv_dest_node_addr.py.
 */
#ifndef SEGSCOPE_STAMP_TLV_DEST_NODE_ADDR_H
#define SEGSCOPE_STAMP_TLV_DEST_NODE_ADDR_H
#include <string.h>
#include "stamp_tlv.h"

#define STAMP_AF_IPV4 1   /* IANA Address Family Numbers: names what the Length selects */
#define STAMP_AF_IPV6 2

/* Family selected by an address length, -1 if neither 4 nor 16. */
static inline int stamp_af_of_len(__u16 len)
{
	return len == 4 ? STAMP_AF_IPV4 : len == 16 ? STAMP_AF_IPV6 : -1;
}

static inline int stamp_af_addr_len(__u16 family)
{
	return family == STAMP_AF_IPV4 ? 4 : family == STAMP_AF_IPV6 ? 16 : -1;
}

struct stamp_tlv_dest_node_addr {
	__u8 flags;
	__u16 family;       /* STAMP_AF_IPV4 / STAMP_AF_IPV6 */
	__u8 address[16];   /* first 4 bytes for IPv4 */
};

static inline int stamp_tlv_dest_node_addr_value_ok(const __u8 *value, __u16 len)
{
	(void)value;
	return stamp_af_of_len(len) > 0;
}

static inline int stamp_tlv_dest_node_addr_decode(const __u8 *buf, size_t len,
						  struct stamp_tlv_dest_node_addr *v)
{
	struct stamp_tlv_view t;
	int rc = stamp_tlv_split(buf, len, STAMP_TLV_DEST_NODE_ADDR, &t);

	if (rc)
		return rc;
	if (stamp_af_of_len(t.length) < 0)
		return STAMP_TLV_ELENGTH;
	v->flags = t.flags;
	v->family = (__u16)stamp_af_of_len(t.length);
	memset(v->address, 0, sizeof(v->address));
	memcpy(v->address, t.value, t.length);
	return 0;
}

static inline int stamp_tlv_dest_node_addr_encode(__u8 *out, size_t cap,
						  const struct stamp_tlv_dest_node_addr *v)
{
	int alen = stamp_af_addr_len(v->family), rc;

	if (alen < 0)
		return STAMP_TLV_EVALUE;
	rc = stamp_tlv_put_header(out, cap, v->flags, STAMP_TLV_DEST_NODE_ADDR, (size_t)alen);
	if (rc < 0)
		return rc;
	memcpy(out + 4, v->address, alen);
	return 4 + alen;
}

/* Reflector: U set when the address is not ours, cleared when it is. */
static inline __u8 stamp_tlv_dest_node_addr_reflected_flags(__u8 flags, int address_is_ours)
{
	return address_is_ours ? (flags & ~STAMP_TLV_FLAG_U) : (flags | STAMP_TLV_FLAG_U);
}
#endif
