/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Packet parsing shared by the STAMP XDP programs: Ethernet -> IPv6 ->
 * optional SRH (routing type 4) -> UDP. Only header layouts and bounds
 * checks; what each outcome means is up to the program.
 */
#ifndef SEGSCOPE_STAMP_PARSE_BPF_H
#define SEGSCOPE_STAMP_PARSE_BPF_H

#define ETH_P_IPV6_BE      bpf_htons(0x86DD)
#define ETH_ALEN           6
#define NEXTHDR_HOP        0
#define NEXTHDR_UDP        17
#define NEXTHDR_ROUTING    43
#define NEXTHDR_FRAGMENT   44
#define NEXTHDR_DEST       60
#define SRH_ROUTING_TYPE   4
#define L3_OFF             (sizeof(struct ethhdr))
#define L4_OFF_NO_SRH      (sizeof(struct ethhdr) + sizeof(struct ipv6hdr))

enum parse_outcome {
	PARSE_OK = 0,
	PARSE_OTHER_EXT_HEADER,  /* HBH/dest opts/fragment/non-SRH routing header */
	PARSE_BAD_SRH,           /* truncated or inconsistent SRH */
	PARSE_SRH_NOT_FINAL,     /* segments_left > 0 */
	PARSE_NOT_UDP,
	PARSE_SHORT_UDP,         /* UDP header beyond the frame */
};

struct pkt_view {
	struct ethhdr *eth;
	struct ipv6hdr *ip6;
	struct ipv6_sr_hdr *srh;   /* NULL without SRH */
	__u32 srh_len;             /* bytes, 0 without SRH */
	struct udphdr *udp;
};

/* Ethernet + IPv6 fixed header present and ethertype IPv6? */
static __always_inline bool parse_ipv6(struct xdp_md *ctx, struct pkt_view *v)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;

	v->eth = data;
	v->ip6 = data + L3_OFF;
	if ((void *)(v->ip6 + 1) > data_end)
		return false;
	return v->eth->h_proto == ETH_P_IPV6_BE;
}

/*
 * After parse_ipv6(): the optional SRH and the UDP header. The SRH is fully
 * bounds-checked (its length comes from the packet, at most 2048 bytes).
 */
static __always_inline enum parse_outcome parse_srh_udp(struct xdp_md *ctx, struct pkt_view *v)
{
	void *data_end = (void *)(long)ctx->data_end;
	void *l4 = (void *)(v->ip6 + 1);
	__u8 nexthdr = v->ip6->nexthdr;

	v->srh = NULL;
	v->srh_len = 0;
	if (nexthdr == NEXTHDR_ROUTING) {
		struct ipv6_sr_hdr *srh = l4;
		__u32 srh_len;

		if ((void *)(srh + 1) > data_end)
			return PARSE_BAD_SRH;
		if (srh->type != SRH_ROUTING_TYPE)
			return PARSE_OTHER_EXT_HEADER;
		srh_len = ((__u32)srh->hdrlen + 1) * 8;     /* 8..2048 */
		/* the segment list must fit in the header and segments_left index it */
		if (((__u32)srh->first_segment + 1) * 2 > srh->hdrlen ||
		    srh->segments_left > srh->first_segment)
			return PARSE_BAD_SRH;
		if ((void *)srh + srh_len > data_end)
			return PARSE_BAD_SRH;
		if (srh->segments_left != 0)
			return PARSE_SRH_NOT_FINAL;
		v->srh = srh;
		v->srh_len = srh_len;
		nexthdr = srh->nexthdr;
		l4 = (void *)srh + srh_len;
	}
	if (nexthdr == NEXTHDR_HOP || nexthdr == NEXTHDR_ROUTING ||
	    nexthdr == NEXTHDR_FRAGMENT || nexthdr == NEXTHDR_DEST)
		return PARSE_OTHER_EXT_HEADER;
	if (nexthdr != NEXTHDR_UDP)
		return PARSE_NOT_UDP;
	v->udp = l4;
	if ((void *)(v->udp + 1) > data_end)
		return PARSE_SHORT_UDP;
	return PARSE_OK;
}

/*
 * After PARSE_OK: UDP payload length from the UDP length field, or -1 if that
 * field is below 8 or points beyond the frame (a truncated datagram).
 */
static __always_inline int udp_payload_len(struct xdp_md *ctx, struct pkt_view *v)
{
	void *data_end = (void *)(long)ctx->data_end;
	__u16 udp_len = bpf_ntohs(v->udp->len);

	if (udp_len < sizeof(struct udphdr) || (void *)v->udp + udp_len > data_end)
		return -1;
	return udp_len - sizeof(struct udphdr);
}

/* Fold a bpf_csum_diff() result into the final (inverted) 16-bit checksum. */
static __always_inline __u16 csum_fold_invert(__s64 sum)
{
	__u32 s = (__u32)sum;

	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	s = ~s & 0xffff;
	return s ? s : 0xffff;   /* 0 means "no checksum", not allowed in IPv6 */
}

#endif /* SEGSCOPE_STAMP_PARSE_BPF_H */
