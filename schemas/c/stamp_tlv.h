/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * STAMP TLV header, TLV-area iteration and the Session-Reflector flag rules
 * (RFC 8972 §4). User space (memcpy-free byte access, no allocation); every
 * read is bounds-checked against the caller's length. Python mirror:
 * schemas/python/segscope_schemas/stamp_tlv.py; vectors:
 * schemas/vectors/stamp_tlv.json; map of all TLVs: schemas/STAMP.md.
 *
 *   STAMP TLV Flags (8) | Type (8) | Length (16, = length of Value) | Value
 *
 * Flags: bit 0 (MSB) U Unrecognized, bit 1 M Malformed, bit 2 I Integrity
 * check failed, bits 3-7 reserved (zero on transmit, ignored on receipt).
 * The TLV area starts after the base packet: STAMP_TLV_BASE_UNAUTH (44) or
 * STAMP_TLV_BASE_AUTH (112, RFC 8762 §4.2.2/§4.3.2); callers pass the offset.
 */
#ifndef SEGSCOPE_STAMP_TLV_H
#define SEGSCOPE_STAMP_TLV_H

#include <stddef.h>
#include <linux/types.h>

#define STAMP_TLV_FLAG_U        0x80  /* Unrecognized Type (set by the reflector) */
#define STAMP_TLV_FLAG_M        0x40  /* Malformed TLV (set by the reflector) */
#define STAMP_TLV_FLAG_I        0x20  /* Integrity (HMAC) check failed (set by the reflector) */
#define STAMP_TLV_FLAG_RESERVED 0x1f
#define STAMP_TLV_SENDER_FLAGS  STAMP_TLV_FLAG_U  /* RFC 8972 §4: sender sends U = 1 */
#define STAMP_TLV_HDR_LEN       4
#define STAMP_TLV_BASE_UNAUTH   44    /* RFC 8762 §4.2.1 / §4.3.1 */
#define STAMP_TLV_BASE_AUTH     112   /* RFC 8762 §4.2.2 / §4.3.2 */

/* IANA "STAMP TLV Types" (RFC 8972 §5.1, RFC 9503 §5) */
enum stamp_tlv_type {
	STAMP_TLV_EXTRA_PADDING       = 1,
	STAMP_TLV_LOCATION            = 2,
	STAMP_TLV_TIMESTAMP_INFO      = 3,
	STAMP_TLV_CLASS_OF_SERVICE    = 4,
	STAMP_TLV_DIRECT_MEASUREMENT  = 5,
	STAMP_TLV_ACCESS_REPORT       = 6,
	STAMP_TLV_FOLLOW_UP_TELEMETRY = 7,
	STAMP_TLV_HMAC                = 8,
	STAMP_TLV_DEST_NODE_ADDR      = 9,
	STAMP_TLV_RETURN_PATH         = 10,
};

/* Error codes (negative returns); same names as the Python E_* kinds. */
enum stamp_tlv_err {
	STAMP_TLV_OK        = 0,
	STAMP_TLV_ESHORT    = -1, /* buffer shorter than a header or than header + Length */
	STAMP_TLV_ETRAILING = -2, /* 1..3 bytes after the last TLV: not even a header */
	STAMP_TLV_EOVERRUN  = -3, /* a TLV's Length runs past the end of the area */
	STAMP_TLV_ETYPE     = -4, /* decoder called on a TLV of another Type */
	STAMP_TLV_ELENGTH   = -5, /* Length not valid for the Type (-> M flag) */
	STAMP_TLV_EVALUE    = -6, /* Value not valid: sub-TLV, address family, ... */
	STAMP_TLV_ESPACE    = -7, /* encoder: output buffer too small */
};

static inline const char *stamp_tlv_strerror(int err)
{
	switch (err) {
	case STAMP_TLV_OK:        return "ok";
	case STAMP_TLV_ESHORT:    return "short";
	case STAMP_TLV_ETRAILING: return "trailing";
	case STAMP_TLV_EOVERRUN:  return "overrun";
	case STAMP_TLV_ETYPE:     return "type";
	case STAMP_TLV_ELENGTH:   return "length";
	case STAMP_TLV_EVALUE:    return "value";
	case STAMP_TLV_ESPACE:    return "space";
	default:                  return "unknown error";
	}
}

/* One TLV seen in a buffer: a view, nothing copied. */
struct stamp_tlv_view {
	__u8 flags;
	__u8 type;
	__u16 length;          /* host order */
	size_t offset;         /* offset of the header in the buffer */
	const __u8 *value;     /* points into the buffer */
};

static inline __u16 stamp_get_be16(const __u8 *p) { return (__u16)((p[0] << 8) | p[1]); }
static inline __u32 stamp_get_be32(const __u8 *p)
{
	return ((__u32)p[0] << 24) | ((__u32)p[1] << 16) | ((__u32)p[2] << 8) | p[3];
}
static inline void stamp_put_be16(__u8 *p, __u16 v) { p[0] = (__u8)(v >> 8); p[1] = (__u8)v; }
static inline void stamp_put_be32(__u8 *p, __u32 v)
{
	p[0] = (__u8)(v >> 24); p[1] = (__u8)(v >> 16); p[2] = (__u8)(v >> 8); p[3] = (__u8)v;
}

/*
 * Next TLV of buf[*off, end): 1 with *tlv filled and *off advanced, 0 at the
 * end of the area, or STAMP_TLV_ETRAILING / STAMP_TLV_EOVERRUN (*off then
 * stays on the bad TLV). Never reads at or past buf + end.
 */
static inline int stamp_tlv_next(const __u8 *buf, size_t end, size_t *off,
				 struct stamp_tlv_view *tlv)
{
	size_t o = *off;
	__u16 len;

	if (o >= end)
		return 0;
	if (end - o < STAMP_TLV_HDR_LEN)
		return STAMP_TLV_ETRAILING;
	len = stamp_get_be16(buf + o + 2);
	if ((size_t)len > end - o - STAMP_TLV_HDR_LEN)
		return STAMP_TLV_EOVERRUN;
	tlv->flags = buf[o];
	tlv->type = buf[o + 1];
	tlv->length = len;
	tlv->offset = o;
	tlv->value = buf + o + STAMP_TLV_HDR_LEN;
	*off = o + STAMP_TLV_HDR_LEN + len;
	return 1;
}

/* Count the TLVs of buf[off, end); negative error if the area is malformed. */
static inline int stamp_tlv_count(const __u8 *buf, size_t end, size_t off)
{
	struct stamp_tlv_view t;
	int n = 0, rc;

	while ((rc = stamp_tlv_next(buf, end, &off, &t)) == 1)
		n++;
	return rc < 0 ? rc : n;
}

/*
 * buf[0, len) is exactly one TLV of the expected type: fill *tlv.
 * Used by every per-TLV decoder.
 */
static inline int stamp_tlv_split(const __u8 *buf, size_t len, __u8 expected_type,
				  struct stamp_tlv_view *tlv)
{
	size_t off = 0;
	int rc;

	if (len < STAMP_TLV_HDR_LEN)
		return STAMP_TLV_ESHORT;
	if (buf[1] != expected_type)
		return STAMP_TLV_ETYPE;
	rc = stamp_tlv_next(buf, len, &off, tlv);
	if (rc != 1 || off != len)
		return STAMP_TLV_ESHORT;
	return STAMP_TLV_OK;
}

/* Write a header at out (cap bytes available for header + value): bytes written or ESPACE. */
static inline int stamp_tlv_put_header(__u8 *out, size_t cap, __u8 flags, __u8 type, size_t value_len)
{
	if (value_len > 0xffff || cap < STAMP_TLV_HDR_LEN + value_len)
		return STAMP_TLV_ESPACE;
	out[0] = flags;
	out[1] = type;
	stamp_put_be16(out + 2, (__u16)value_len);
	return STAMP_TLV_HDR_LEN;
}

/* ---- Session-Reflector rules (RFC 8972 §4) ---------------------------- */

/* The flags a reflector writes: U/M/I from its verdict, reserved bits zero. */
static inline __u8 stamp_tlv_reflected_flags(int understood, int malformed, int integrity_failed)
{
	return (understood ? 0 : STAMP_TLV_FLAG_U) | (malformed ? STAMP_TLV_FLAG_M : 0) |
	       (integrity_failed ? STAMP_TLV_FLAG_I : 0);
}

static inline void stamp_tlv_mark_unknown(__u8 *hdr) { hdr[0] = stamp_tlv_reflected_flags(0, 0, 0); }
static inline void stamp_tlv_mark_malformed(__u8 *hdr) { hdr[0] = (hdr[0] & STAMP_TLV_FLAG_U) | STAMP_TLV_FLAG_M; }
static inline void stamp_tlv_mark_integrity_failed(__u8 *hdr) { hdr[0] |= STAMP_TLV_FLAG_I; }

/* 1: Type understood and Value valid; 0: malformed; -1: Type not understood. */
typedef int (*stamp_tlv_value_check_fn)(__u8 type, const __u8 *value, __u16 len);
/* 1: HMAC good. text = base Sequence Number (4 bytes) + TLVs before the HMAC TLV. */
typedef int (*stamp_tlv_hmac_verify_fn)(void *ctx, const __u8 *seq4, const __u8 *tlvs,
					size_t tlvs_len, const __u8 hmac[16]);

struct stamp_tlv_reflect_result {
	int tlvs;               /* TLV headers read */
	int unknown;            /* echoed with U set */
	long malformed_at;      /* packet offset of the TLV flagged M, -1 if none */
	int integrity_failed;   /* I set on every processed TLV */
	int error;              /* STAMP_TLV_ETRAILING / EOVERRUN / ESHORT, 0 if the area is sound */
	long hmac_offset;       /* packet offset of the HMAC TLV, -1 if none */
};

/*
 * Apply RFC 8972 §4 to pkt[off, len) in place (the caller has copied the
 * received packet into the reply buffer; the reply keeps the same length):
 *  - understood Type, valid Value: U=M=I=0;
 *  - unknown Type: echoed unchanged with U=1;
 *  - malformed (Length invalid for a known Type, or the TLV runs past the
 *    packet): M=1 on it, processing stops, the rest is left unchanged;
 *  - 1..3 trailing bytes: left unchanged, error STAMP_TLV_ETRAILING;
 *  - an HMAC TLV with verify != NULL: verified on the bytes as received
 *    (before any flag is rewritten); failure sets I on every processed TLV.
 * Returns the number of TLVs read, or a negative error for off > len.
 */
static inline int stamp_tlv_reflect(__u8 *pkt, size_t len, size_t off,
				    stamp_tlv_value_check_fn check,
				    stamp_tlv_hmac_verify_fn verify, void *verify_ctx,
				    struct stamp_tlv_reflect_result *res)
{
	struct stamp_tlv_view t;
	size_t o = off;
	int rc, verdict;

	res->tlvs = res->unknown = res->integrity_failed = res->error = 0;
	res->malformed_at = res->hmac_offset = -1;
	if (off > len || off < 4) {
		res->error = STAMP_TLV_ESHORT;
		return STAMP_TLV_ESHORT;
	}
	/* pass 1: verify the HMAC on the bytes as received (flags included) */
	if (verify) {
		/* only an HMAC TLV that pass 2 will reach (no malformed TLV before it) */
		while ((rc = stamp_tlv_next(pkt, len, &o, &t)) == 1) {
			verdict = check(t.type, t.value, t.length);
			if (verdict == 0)
				break;
			if (t.type != STAMP_TLV_HMAC)
				continue;
			res->integrity_failed = verify(verify_ctx, pkt, pkt + off, t.offset - off, t.value) != 1;
			break;
		}
	}
	/* pass 2: the flags of every TLV, in order */
	o = off;
	for (;;) {
		rc = stamp_tlv_next(pkt, len, &o, &t);
		if (rc == 0)
			break;
		if (rc == STAMP_TLV_ETRAILING) {
			res->error = rc;
			break;
		}
		res->tlvs++;
		if (rc == STAMP_TLV_EOVERRUN) {
			res->error = rc;
			res->malformed_at = (long)o;
			pkt[o] = stamp_tlv_reflected_flags(1, 1, 0);
			break;
		}
		verdict = check(t.type, t.value, t.length);
		if (verdict < 0) {
			res->unknown++;
			pkt[t.offset] = stamp_tlv_reflected_flags(0, 0, 0);
		} else if (verdict == 0) {
			pkt[t.offset] = stamp_tlv_reflected_flags(1, 1, 0);
			res->malformed_at = (long)t.offset;
			break;
		} else {
			pkt[t.offset] = stamp_tlv_reflected_flags(1, 0, 0);
			if (t.type == STAMP_TLV_HMAC && res->hmac_offset < 0)
				res->hmac_offset = (long)t.offset;
		}
		if (res->integrity_failed)
			stamp_tlv_mark_integrity_failed(pkt + t.offset);
	}
	if (res->integrity_failed && res->malformed_at >= 0)
		stamp_tlv_mark_integrity_failed(pkt + res->malformed_at);
	return res->tlvs;
}

#endif /* SEGSCOPE_STAMP_TLV_H */
