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
	PARSE_SRH_NOT_FINAL,     /* segments_left > 0, the destination not yet segments[0] */
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
 * A compressed path (RFC 9800 NEXT-C-SID): the last micro-SID of a container
 * shifted into place is the node's own address, which is also segments[0] of
 * the SRH (segments_left 1). The node's End would now only decrement
 * segments_left and copy segments[0] into the destination, which it already
 * holds: the packet is at its final destination.
 */
static __always_inline bool at_final_segment(const struct ipv6hdr *ip6, struct ipv6_sr_hdr *srh,
					     void *data_end)
{
	const __u32 *seg0 = (const void *)(srh + 1);
	const __u32 *d = (const void *)&ip6->daddr;

	if (srh->segments_left != 1 || (void *)(seg0 + 4) > data_end)
		return false;
	return d[0] == seg0[0] && d[1] == seg0[1] && d[2] == seg0[2] && d[3] == seg0[3];
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
		if (srh->segments_left != 0 && !at_final_segment(v->ip6, srh, data_end))
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
 * RFC 8200 §3 checks the kernel's ipv6_rcv() also makes: version 6, and the
 * Payload Length within the frame. A frame longer than Ethernet + IPv6 header
 * + Payload Length is fine (Ethernet padding, trailer): those bytes are not
 * part of the packet and are never read as such.
 */
static __always_inline bool ipv6_header_ok(struct xdp_md *ctx, const struct pkt_view *v)
{
	__u32 frame_len = (__u32)(ctx->data_end - ctx->data);

	if ((*(const __u8 *)v->ip6 >> 4) != 6)
		return false;
	return L4_OFF_NO_SRH + (__u32)bpf_ntohs(v->ip6->payload_len) <= frame_len;
}

/*
 * After PARSE_OK and ipv6_header_ok(): UDP payload length from the UDP length
 * field, or -1 if that field is below 8 or the datagram does not fit in the
 * IPv6 payload (after the SRH): a truncated datagram, which the stack drops
 * too. UDP shorter than the IPv6 payload is allowed (the stack trims it).
 */
static __always_inline int udp_payload_len(struct xdp_md *ctx, struct pkt_view *v)
{
	void *data_end = (void *)(long)ctx->data_end;
	__u32 udp_len = bpf_ntohs(v->udp->len);

	if (udp_len < sizeof(struct udphdr) || v->srh_len + udp_len > bpf_ntohs(v->ip6->payload_len))
		return -1;
	if ((void *)v->udp + udp_len > data_end)   /* implied by the above; for the verifier's sake */
		return -1;
	return udp_len - sizeof(struct udphdr);
}

/*
 * RFC 4291: an unspecified (::, §2.5.2), loopback (::1, §2.5.3) or multicast
 * (ff00::/8, §2.7) source can not have sent a test packet or a reply; the
 * kernel drops multicast and loopback sources on receive, and no answer can
 * go back to ::.
 */
static __always_inline bool ipv6_src_ok(const struct ipv6hdr *ip6)
{
	const __u32 *s = (const void *)&ip6->saddr;
	__u32 s0 = s[0];

	if ((s0 & bpf_htonl(0xff000000)) == bpf_htonl(0xff000000))
		return false;
	if (s0 | s[1] | s[2])
		return true;
	return s[3] != 0 && s[3] != bpf_htonl(1);
}

/*
 * Longest UDP datagram (header included) whose checksum the programs verify:
 * the chunk loop below is bounded by it. The veth/Ethernet MTU here is 1500,
 * so a STAMP packet is never longer; a longer one is left to the stack.
 */
#define UDP_CSUM_MAX_LEN   1500
/* UDP header + STAMP base packet: always present when the checksum is checked */
#define UDP_CSUM_FIXED_LEN 52
#define CSUM_DIFF_MAX      512   /* bpf_csum_diff() takes at most 512 bytes, a multiple of 4 */

/* Add the ones'-complement sum of `size` bytes at p (a constant multiple of 4,
 * <= 512) and step over them; return false from the caller if they are not
 * all in the packet. */
#define CSUM_CHUNK(sum, p, size, data_end)                                       \
	do {                                                                      \
		if ((void *)(p) + (size) > (data_end))                            \
			return -1;                                                \
		(sum) += (__u32)bpf_csum_diff(NULL, 0, (void *)(p), (size), 0);   \
		(p) += (size);                                                    \
	} while (0)

/* Fold a 64-bit ones'-complement accumulator to 16 bits. */
static __always_inline __u32 csum_fold64(__u64 sum)
{
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (sum & 0xffff) + (sum >> 16);
}

/*
 * Checksum of the bytes after the first 52 of the datagram (the TLVs), added
 * to `partial` (pseudo-header + first 52 bytes, see udp6_csum_check()): by
 * bpf_csum_diff() in power-of-two chunks, at most 11 calls for 1500 bytes (a
 * plain word loop cost ~0.4 ns per byte here), then the 1..3 odd bytes.
 *
 * A global (BPF-to-BPF, separately verified) function: the verifier walks the
 * 2^9 chunk combinations once, not once per path of the program around it
 * (inlined or as a static subprogram, the collector hit the 1M instruction
 * limit). So it takes offsets, not packet pointers, and checks every bound
 * itself. Returns the folded 16-bit sum (0xffff: the checksum verifies), or
 * -1 when a byte is out of bounds.
 */
__noinline int udp6_csum_rest(struct xdp_md *ctx, __u32 udp_off, __u32 udp_len, __u64 partial)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	union { __u8 b[4]; __u32 w; } last = {};
	__u32 rest, tail = udp_len & 3;
	__u64 sum = partial;
	const __u8 *p;

	if (udp_off > L4_OFF_NO_SRH + 2048 || udp_len < UDP_CSUM_FIXED_LEN || udp_len > UDP_CSUM_MAX_LEN)
		return -1;
	p = data + udp_off + UDP_CSUM_FIXED_LEN;
	rest = udp_len - UDP_CSUM_FIXED_LEN;
	/* rest < 1500 - 52: two full chunks at most, then its binary digits */
	if (rest >= CSUM_DIFF_MAX)
		CSUM_CHUNK(sum, p, CSUM_DIFF_MAX, data_end);
	if (rest >= 2 * CSUM_DIFF_MAX)
		CSUM_CHUNK(sum, p, CSUM_DIFF_MAX, data_end);
	if (rest & 256)
		CSUM_CHUNK(sum, p, 256, data_end);
	if (rest & 128)
		CSUM_CHUNK(sum, p, 128, data_end);
	if (rest & 64)
		CSUM_CHUNK(sum, p, 64, data_end);
	if (rest & 32)
		CSUM_CHUNK(sum, p, 32, data_end);
	if (rest & 16)
		CSUM_CHUNK(sum, p, 16, data_end);
	if (rest & 8)
		CSUM_CHUNK(sum, p, 8, data_end);
	if (rest & 4)
		CSUM_CHUNK(sum, p, 4, data_end);
	barrier_var(p);
	if (tail) {   /* 1..3 bytes, zero-padded to a word like RFC 1071 pads odd lengths */
		if ((void *)(p + 1) > data_end)
			return -1;
		last.b[0] = p[0];
		if (tail > 1) {
			if ((void *)(p + 2) > data_end)
				return -1;
			last.b[1] = p[1];
		}
		if (tail > 2) {
			if ((void *)(p + 3) > data_end)
				return -1;
			last.b[2] = p[2];
		}
		sum += last.w;
	}
	return csum_fold64(sum);
}

/* Byte offset of the UDP header in the frame. */
static __always_inline __u32 udp_offset(struct xdp_md *ctx, const struct pkt_view *v)
{
	return (__u32)((void *)v->udp - (void *)(long)ctx->data);
}

/* What the UDP checksum of a datagram says (udp6_csum_check()). */
enum csum_verdict {
	CSUM_BAD = 0,   /* neither a full checksum nor (when accepted) a partial one */
	CSUM_FULL,      /* RFC 8200 §8.1: verifies */
	CSUM_PARTIAL,   /* the pseudo-header sum alone: checksum offload not done (below) */
};

/*
 * UDP checksum check (RFC 8200 §8.1): pseudo-header {src, dst (the final
 * destination: segments_left is 0), UDP length, next header 17} + the
 * datagram must sum to 0xffff in ones'-complement arithmetic. Words are summed
 * in memory order (the ones'-complement sum does not depend on the byte order
 * as long as all words are loaded alike, and 0xffff reads the same either
 * way). The pseudo-header and the first 52 bytes (UDP header + base packet)
 * are summed inline, the rest by udp6_csum_rest(). Caller guarantees
 * UDP_CSUM_FIXED_LEN <= udp_len <= UDP_CSUM_MAX_LEN.
 *
 * Partial checksums: a kernel-socket sender on a veth (a pod, a container)
 * hands the packet over with checksum offload pending (CHECKSUM_PARTIAL): the
 * checksum field holds the folded pseudo-header sum and nobody ever completes
 * it, because the veth peer trusts it. With accept_partial, a checksum field
 * that is exactly that sum is CSUM_PARTIAL (the payload is then unverified,
 * as the receiving kernel would treat it too).
 *
 * *seed gets the ones'-complement of the datagram's full checksum (what an
 * incremental update of the checksum starts from): ~check for CSUM_FULL, the
 * sum of pseudo-header and datagram without the partial field for CSUM_PARTIAL.
 */
static __always_inline enum csum_verdict udp6_csum_check(struct xdp_md *ctx, const struct pkt_view *v,
							 __u32 udp_len, bool accept_partial, __u16 *seed)
{
	const __u32 *addrs = (const void *)&v->ip6->saddr;   /* saddr, daddr: 8 words */
	const __u32 *fixed = (const void *)v->udp;
	__u16 check, pseudo;
	__u64 sum;
	int total;

	if ((void *)fixed + UDP_CSUM_FIXED_LEN > (void *)(long)ctx->data_end)
		return CSUM_BAD;
	sum = bpf_htonl(udp_len) + (__u64)bpf_htonl(NEXTHDR_UDP);
	for (int i = 0; i < 8; i++)
		sum += addrs[i];
	pseudo = csum_fold64(sum);
	for (int i = 0; i < UDP_CSUM_FIXED_LEN / 4; i++)
		sum += fixed[i];
	if (udp_len == UDP_CSUM_FIXED_LEN)
		total = csum_fold64(sum);
	else
		total = udp6_csum_rest(ctx, udp_offset(ctx, v), udp_len, sum);
	if (total < 0)
		return CSUM_BAD;
	check = v->udp->check;
	if (total == 0xffff) {
		*seed = (__u16)~check;
		return CSUM_FULL;
	}
	if (!accept_partial || check != pseudo)
		return CSUM_BAD;
	/* total = pseudo + datagram without the field + the field (= pseudo) */
	*seed = csum_fold64((__u64)total + (__u16)~pseudo);
	return CSUM_PARTIAL;
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
