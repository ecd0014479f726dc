/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * STAMP base test packets, authenticated mode, 112 bytes each, big-endian:
 * RFC 8762 §4.2.2 (Session-Sender) and §4.3.2 (Session-Reflector), with the
 * RFC 8972 §3 SSID in the MBZ after the Error Estimate (RFC 8972 Figures 2
 * and 4: sender MBZ 70 -> SSID + MBZ 68; reflector MBZ 6 -> SSID + MBZ 4).
 * RFC 8762 §4.4: the HMAC (HMAC-SHA-256 truncated to 128 bits, stamp_hmac.h)
 * is the last 16 octets and covers the first six 16-octet blocks (octets
 * 0-95, everything before it). TLVs (RFC 8972) follow the 112 bytes and are
 * not covered by this HMAC (they have the HMAC TLV).
 * The struct layouts are BPF-usable; sign/verify (stamp_hmac.h) are user
 * space only. Python mirror: segscope_schemas/stamp_auth_packet.py; vectors:
 * schemas/vectors/stamp_auth_packet.json.
 */
#ifndef SEGSCOPE_STAMP_AUTH_PACKET_H
#define SEGSCOPE_STAMP_AUTH_PACKET_H

#include "stamp_test_packet.h"

#define STAMP_AUTH_LEN          112
#define STAMP_AUTH_HMAC_OFFSET  96    /* = octets covered by the HMAC */
#define STAMP_AUTH_HMAC_LEN     16

/* RFC 8762 §4.2.2 + RFC 8972 §3 (Figure 2). */
struct stamp_auth_sender_packet {
	__be32 seq;                       /*   0 Sequence Number */
	__u8   mbz0[12];                  /*   4 MBZ (12 octets) */
	struct stamp_timestamp ts;        /*  16 Timestamp (T1) */
	__be16 err_est;                   /*  24 Error Estimate */
	__be16 ssid;                      /*  26 SSID (RFC 8972) */
	__u8   mbz1[68];                  /*  28 MBZ (68 octets) */
	__u8   hmac[16];                  /*  96 HMAC (16 octets) */
} __attribute__((packed));

/* RFC 8762 §4.3.2 + RFC 8972 §3 (Figure 4). */
struct stamp_auth_reflector_packet {
	__be32 seq;                       /*   0 Sequence Number */
	__u8   mbz0[12];                  /*   4 MBZ (12 octets) */
	struct stamp_timestamp ts;        /*  16 Timestamp (T3) */
	__be16 err_est;                   /*  24 Error Estimate */
	__be16 ssid;                      /*  26 SSID (RFC 8972) */
	__u8   mbz1[4];                   /*  28 MBZ (4 octets) */
	struct stamp_timestamp rx_ts;     /*  32 Receive Timestamp (T2) */
	__u8   mbz2[8];                   /*  40 MBZ (8 octets) */
	__be32 sender_seq;                /*  48 Session-Sender Sequence Number */
	__u8   mbz3[12];                  /*  52 MBZ (12 octets) */
	struct stamp_timestamp sender_ts; /*  64 Session-Sender Timestamp (T1) */
	__be16 sender_err_est;            /*  72 Session-Sender Error Estimate */
	__u8   mbz4[6];                   /*  74 MBZ (6 octets) */
	__u8   sender_ttl;                /*  80 Ses-Sender TTL */
	__u8   mbz5[15];                  /*  81 MBZ (15 octets) */
	__u8   hmac[16];                  /*  96 HMAC (16 octets) */
} __attribute__((packed));

_Static_assert(sizeof(struct stamp_auth_sender_packet) == STAMP_AUTH_LEN, "sender layout");
_Static_assert(sizeof(struct stamp_auth_reflector_packet) == STAMP_AUTH_LEN, "reflector layout");
_Static_assert(__builtin_offsetof(struct stamp_auth_sender_packet, hmac) == STAMP_AUTH_HMAC_OFFSET,
	       "sender HMAC offset");
_Static_assert(__builtin_offsetof(struct stamp_auth_reflector_packet, hmac) == STAMP_AUTH_HMAC_OFFSET,
	       "reflector HMAC offset");

#if !defined(__bpf__) && !defined(__BPF__)
#include "stamp_hmac.h"

/*
 * Writes the HMAC of octets 0-95 of a 112-byte authenticated packet (sender or
 * reflector) with the table's current key. 0 or the stamp_hmac_sign() error;
 * -EMSGSIZE if len < 112.
 */
static inline int stamp_auth_sign(struct stamp_hmac_keytab *t, uint64_t now_ns, void *pkt,
				  size_t len, uint32_t *key_id)
{
	uint8_t *p = pkt;

	if (len < STAMP_AUTH_LEN)
		return -EMSGSIZE;
	return stamp_hmac_sign(t, now_ns, p, STAMP_AUTH_HMAC_OFFSET, p + STAMP_AUTH_HMAC_OFFSET, key_id);
}

/*
 * Checks the HMAC of a received authenticated packet. 0 and the matching key
 * id; -EMSGSIZE (short), -ENOKEY (no valid key), -EBADMSG (integrity failed:
 * RFC 8762 §4.4, the packet must be discarded).
 */
static inline int stamp_auth_verify(const struct stamp_hmac_keytab *t, uint64_t now_ns,
				    const void *pkt, size_t len, uint32_t *key_id)
{
	const uint8_t *p = pkt;

	if (len < STAMP_AUTH_LEN)
		return -EMSGSIZE;
	return stamp_hmac_verify(t, now_ns, p, STAMP_AUTH_HMAC_OFFSET, p + STAMP_AUTH_HMAC_OFFSET, key_id);
}
#endif /* !BPF */

#endif /* SEGSCOPE_STAMP_AUTH_PACKET_H */
