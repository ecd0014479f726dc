/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Header parsing shared by altmark_tx.bpf.c (TC) and altmark_rx.bpf.c (XDP):
 * both hand in [data, data_end) of the frame, so the same bounds checks serve
 * both. Only layouts and checks; what an outcome means is up to the program.
 */
#ifndef SEGSCOPE_ALTMARK_PARSE_BPF_H
#define SEGSCOPE_ALTMARK_PARSE_BPF_H

#include "altmark.h"

#define AM_ETH_P_IPV6_BE bpf_htons(0x86DD)
#define AM_L3_OFF        (sizeof(struct ethhdr))

enum am_srh_outcome {
	AM_SRH_OK = 0,
	AM_SRH_NOT_SRH,        /* routing header of another type */
	AM_SRH_MALFORMED,      /* truncated, or hdr_ext_len / last_entry inconsistent */
	AM_SRH_TOO_MANY_SIDS,  /* well formed, but more segments than ALTMARK_MAX_SIDS */
};

/*
 * Check the SRH at srh (fixed 8-byte part already bounds-checked by the
 * caller) and copy its SID list into key in wire order. The loop is bounded
 * by ALTMARK_MAX_SIDS and every SID read is checked against data_end, so the
 * verifier sees both bounds.
 */
static __always_inline enum am_srh_outcome
am_srh_key(struct ipv6_sr_hdr *srh, void *data_end, struct altmark_sidlist_key *key)
{
	__u32 nsids = (__u32)srh->first_segment + 1;   /* first_segment = last_entry */
	__u32 len = ((__u32)srh->hdrlen + 1) * 8;

	if (srh->type != IPV6_SRH_TYPE)
		return AM_SRH_NOT_SRH;
	if ((void *)srh + len > data_end || nsids * 2 > srh->hdrlen || srh->segments_left > srh->first_segment)
		return AM_SRH_MALFORMED;
	if (nsids > ALTMARK_MAX_SIDS)
		return AM_SRH_TOO_MANY_SIDS;
	key->nsids = nsids;
	key->pad = 0;
#pragma unroll
	for (int i = 0; i < ALTMARK_MAX_SIDS; i++) {
		struct in6_addr *sid = &srh->segments[i];

		if (i >= nsids) {
			__builtin_memset(&key->sids[i], 0, sizeof(key->sids[i]));
			continue;
		}
		if ((void *)(sid + 1) > data_end)
			return AM_SRH_MALFORMED;
		__builtin_memcpy(&key->sids[i], sid, sizeof(*sid));
	}
	return AM_SRH_OK;
}

/* The key of a packet without an SRH whose destination is its one SID (a uSID container sent
 * with reduced encapsulation): the SID list [destination]. */
static __always_inline void am_da_key(struct ipv6hdr *ip6, struct altmark_sidlist_key *key)
{
	__builtin_memset(key, 0, sizeof(*key));
	key->nsids = 1;
	__builtin_memcpy(&key->sids[0], &ip6->daddr, sizeof(key->sids[0]));
}

/* The AltMark option's 32-bit data (host order), if the DOH at doh holds one. */
enum am_doh_outcome {
	AM_DOH_ALTMARK = 0,
	AM_DOH_NO_ALTMARK,     /* well formed, no AltMark option */
	AM_DOH_MALFORMED,      /* truncated header or option */
};

#define AM_DOH_MAX_OPTS 4      /* options scanned per DOH (Pad1/PadN included); bounded for the verifier */
#define AM_DOH_MAX_LEN  64     /* longer DOHs are not scanned past this */

static __always_inline enum am_doh_outcome
am_doh_altmark(__u8 *doh, void *data_end, __u32 *opt_data)
{
	__u32 len, off = 2;

	if ((void *)(doh + 2) > data_end)
		return AM_DOH_MALFORMED;
	len = ((__u32)doh[1] + 1) * 8;
	if ((void *)doh + len > data_end)
		return AM_DOH_MALFORMED;
	if (len > AM_DOH_MAX_LEN)
		len = AM_DOH_MAX_LEN;
	for (int i = 0; i < AM_DOH_MAX_OPTS; i++) {
		__u8 *opt;

		if (off + 1 > len || off >= AM_DOH_MAX_LEN)
			return AM_DOH_NO_ALTMARK;
		opt = doh + off;
		if ((void *)(opt + 1) > data_end)
			return AM_DOH_MALFORMED;
		if (opt[0] == 0) {          /* Pad1 */
			off += 1;
			continue;
		}
		if ((void *)(opt + 2) > data_end || off + 2 > len)
			return AM_DOH_MALFORMED;
		if (opt[0] == ALTMARK_OPT_TYPE) {
			if (opt[1] != ALTMARK_OPT_DATA_LEN || off + 6 > len || (void *)(opt + 6) > data_end)
				return AM_DOH_MALFORMED;
			*opt_data = ((__u32)opt[2] << 24) | ((__u32)opt[3] << 16) |
				    ((__u32)opt[4] << 8) | opt[5];
			return AM_DOH_ALTMARK;
		}
		off += 2 + (__u32)opt[1];
	}
	return AM_DOH_NO_ALTMARK;
}

/* Traffic Class bit of DSCP bit b in the first 16 bits (host order) of the IPv6 header. */
static __always_inline __u16 am_dscp_word_bit(__u8 dscp_bit)
{
	return (__u16)1 << (6 + (dscp_bit & 7));   /* DSCP bit b = TC bit b+2 = word bit b+6 */
}

#endif /* SEGSCOPE_ALTMARK_PARSE_BPF_H */
