/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * IPv6 Hop-by-Hop and Destination Options headers (RFC 8200 §4.2-§4.6): the
 * TLV walk both IOAM options (ioam_trace_option.h, ioam_e2e_option.h) are
 * found with, the IOAM option header (RFC 9486 §2) and the error codes the
 * IOAM codecs share. User space; the BPF programs include it for the
 * constants only. Python mirror: schemas/python/segscope_schemas/ipv6_options.py.
 *
 *   Next Header (8) | Hdr Ext Len (8, 8-octet units after the first 8) | options
 *   option: Type (8) | Opt Data Len (8) | data; Pad1 is the single byte 0
 *
 * The walk applies what the Linux kernel applies to every such header
 * (net/ipv6/exthdrs.c ip6_parse_tlv): options stay inside the header, a run
 * of padding is at most 7 bytes, PadN carries zeros; and one more bound of
 * its own: at most IPV6_OPTS_MAX_TLVS options (Pad1 included) are walked, so
 * the BPF programs that follow the same rules have a fixed loop bound.
 */
#ifndef SEGSCOPE_IPV6_OPTIONS_H
#define SEGSCOPE_IPV6_OPTIONS_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

#define IPV6_NH_HOPOPTS        0
#define IPV6_NH_ROUTING        43
#define IPV6_NH_DSTOPTS        60
#define IPV6_NH_IPV6           41

#define IPV6_OPT_PAD1          0x00
#define IPV6_OPT_PADN          0x01
#define IPV6_OPTS_MAX_PAD      7      /* longest run of padding (kernel: RFC 4942 §2.1.9.5) */
#define IPV6_OPTS_MAX_TLVS     16     /* options walked per header, padding included */

/* IOAM option header (RFC 9486 §2): Option Type, Opt Data Len, Reserved, IOAM Option-Type. */
#define IOAM_OPT_HDR_LEN       4
#define IOAM_OPTION_PREALLOC_TRACE 0  /* IOAM Option-Type (RFC 9197 §4.4, IANA) */
#define IOAM_OPTION_E2E        3      /* (RFC 9197 §4.6) */
#define IOAM_ALIGN             4      /* IOAM options start 4n from the IPv6 header (RFC 9486 §3;
					* the kernel drops a misaligned trace) */

/*
 * Decode outcomes shared by the IOAM codecs, in the order the checks run;
 * the egress program (datapath/ioam_rx.bpf.c) counts the same classes.
 */
enum ioam_decode_err {
	IOAM_OK              = 0,
	IOAM_E_TRUNCATED     = -1,  /* the header runs past the buffer (frame / IPv6 payload) */
	IOAM_E_BAD_LENGTH    = -2,  /* lengths inconsistent: option past its header, padding, alignment,
				     * Opt Data Len, RemainingLen, NodeLen */
	IOAM_E_NO_OPTION     = -3,  /* well formed, without the IOAM option looked for */
	IOAM_E_UNKNOWN_TYPE  = -4,  /* another IOAM Option-Type, Trace-Type or E2E-Type than segscope's */
	IOAM_E_BAD_TIMESTAMP = -5,  /* E2E subseconds >= 10^9 (not PTPv2 nanoseconds) */
	IOAM_E_SPACE         = -6,  /* encoder: buffer too small, or a value out of range */
};

#ifndef __bpf__
#include <stddef.h>

static inline const char *ioam_strerror(int err)
{
	switch (err) {
	case IOAM_OK:              return "ok";
	case IOAM_E_TRUNCATED:     return "truncated";
	case IOAM_E_BAD_LENGTH:    return "bad_length";
	case IOAM_E_NO_OPTION:     return "no_option";
	case IOAM_E_UNKNOWN_TYPE:  return "unknown_type";
	case IOAM_E_BAD_TIMESTAMP: return "bad_timestamp";
	case IOAM_E_SPACE:         return "space";
	default:                   return "?";
	}
}

static inline __u16 ioam_get16(const __u8 *p) { return (__u16)(p[0] << 8 | p[1]); }
static inline __u32 ioam_get24(const __u8 *p) { return (__u32)p[0] << 16 | (__u32)p[1] << 8 | p[2]; }
static inline __u32 ioam_get32(const __u8 *p) { return (__u32)p[0] << 24 | ioam_get24(p + 1); }
static inline __u64 ioam_get64(const __u8 *p) { return (__u64)ioam_get32(p) << 32 | ioam_get32(p + 4); }
static inline void ioam_put16(__u8 *p, __u16 v) { p[0] = v >> 8; p[1] = (__u8)v; }
static inline void ioam_put24(__u8 *p, __u32 v) { p[0] = (__u8)(v >> 16); ioam_put16(p + 1, (__u16)v); }
static inline void ioam_put32(__u8 *p, __u32 v) { p[0] = v >> 24; ioam_put24(p + 1, v); }
static inline void ioam_put64(__u8 *p, __u64 v) { ioam_put32(p, (__u32)(v >> 32)); ioam_put32(p + 4, (__u32)v); }

/*
 * Walk the options header at buf[0..len) and find the first option of
 * opt_type. Returns IOAM_OK with *opt_off = its offset from buf (the header's
 * start), IOAM_E_NO_OPTION when the whole header is well formed without it,
 * IOAM_E_TRUNCATED when the header runs past len, IOAM_E_BAD_LENGTH when an
 * option runs past the header, padding is longer than 7 bytes or not zero,
 * the header holds more than IPV6_OPTS_MAX_TLVS options, or the option is not
 * 4n-aligned (hdr_align: the header's offset from the IPv6 header mod 4; 0
 * for segscope's headers, which start 8n). The walk always covers the whole
 * header: an option after the one found must be well formed too.
 */
static inline int ipv6_opts_find(const __u8 *buf, size_t len, __u8 opt_type, unsigned int hdr_align,
				 size_t *opt_off)
{
	size_t hdr_len, off = 2;
	unsigned int pad = 0, tlvs = 0;
	int found = 0;

	if (len < 2)
		return IOAM_E_TRUNCATED;
	hdr_len = ((size_t)buf[1] + 1) * 8;
	if (hdr_len > len)
		return IOAM_E_TRUNCATED;
	while (off < hdr_len) {
		size_t opt_len;

		if (++tlvs > IPV6_OPTS_MAX_TLVS)
			return IOAM_E_BAD_LENGTH;
		if (buf[off] == IPV6_OPT_PAD1) {
			if (++pad > IPV6_OPTS_MAX_PAD)
				return IOAM_E_BAD_LENGTH;
			off++;
			continue;
		}
		if (off + 2 > hdr_len)
			return IOAM_E_BAD_LENGTH;
		opt_len = 2 + (size_t)buf[off + 1];
		if (off + opt_len > hdr_len)
			return IOAM_E_BAD_LENGTH;
		if (buf[off] == IPV6_OPT_PADN) {
			pad += opt_len;
			if (pad > IPV6_OPTS_MAX_PAD)
				return IOAM_E_BAD_LENGTH;
			for (size_t i = 2; i < opt_len; i++)
				if (buf[off + i])
					return IOAM_E_BAD_LENGTH;
		} else {
			pad = 0;
			if (buf[off] == opt_type && !found) {
				if ((off + hdr_align) % IOAM_ALIGN)
					return IOAM_E_BAD_LENGTH;
				*opt_off = off;
				found = 1;
			}
		}
		off += opt_len;
	}
	return found ? IOAM_OK : IOAM_E_NO_OPTION;
}
#endif /* !__bpf__ */

#endif /* SEGSCOPE_IPV6_OPTIONS_H */
