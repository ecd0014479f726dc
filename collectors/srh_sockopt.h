/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Put an SRv6 Segment Routing Header (RFC 8754, type 4) on a UDP socket's
 * packets with setsockopt(IPV6_RTHDR). Shared by the STAMP sender, the benchmark generator
 * and the user-space reflector's fast path (ustamp_fast.c).
 *
 * Linux's ipv6_push_rthdr4() copies segments[1..last_entry] from the option,
 * writes the socket's destination into segments[0] and sends the packet to
 * segments[segments_left]. So the SIDs go in reverse visiting order into
 * segments[n..1] and segments_left = last_entry = n: the first SID visited is
 * segments[n], the final destination is segments[0].
 */
#ifndef SEGSCOPE_SRH_SOCKOPT_H
#define SEGSCOPE_SRH_SOCKOPT_H

#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#define SRH_TYPE_SEGMENT_ROUTING 4
#define SRH_SOCKOPT_MAX_SEGS 16

/* Type-4 SRH as the kernel expects it in IPV6_RTHDR (RFC 8754 §2). */
struct srh_sockopt {
	uint8_t  nexthdr;        /* filled by the kernel */
	uint8_t  hdrlen;         /* 8-octet units, not counting the first 8 */
	uint8_t  type;           /* 4 */
	uint8_t  segments_left;
	uint8_t  last_entry;     /* "first_segment" in linux/seg6.h */
	uint8_t  flags;
	uint16_t tag;
	struct in6_addr segments[SRH_SOCKOPT_MAX_SEGS + 1];
};

/*
 * Fill *srh for segs[0..n) in visiting order, final_dst = the socket's
 * destination (the kernel overwrites segments[0] with it on every send, so a
 * reflector answering many senders passes ::). Returns the option length for
 * setsockopt, or -EINVAL.
 */
static inline int srh_sockopt_build(struct srh_sockopt *srh, const struct in6_addr *final_dst,
				    const struct in6_addr *segs, int n)
{
	if (n < 0 || n > SRH_SOCKOPT_MAX_SEGS)   /* n = 0: an SRH holding only the destination */
		return -EINVAL;
	memset(srh, 0, sizeof(*srh));
	srh->type = SRH_TYPE_SEGMENT_ROUTING;
	srh->hdrlen = (n + 1) * 2;
	srh->segments_left = n;
	srh->last_entry = n;
	srh->segments[0] = *final_dst;
	for (int i = 0; i < n; i++)
		srh->segments[n - i] = segs[i];
	return 8 + (n + 1) * (int)sizeof(struct in6_addr);
}

/* segs[0..n) in visiting order, final_dst = the socket's destination. 0 or -errno. */
static inline int srh_sockopt_set(int fd, const struct in6_addr *final_dst,
				  const struct in6_addr *segs, int n)
{
	struct srh_sockopt srh;
	int len = srh_sockopt_build(&srh, final_dst, segs, n);

	if (len < 0)
		return len;
	return setsockopt(fd, IPPROTO_IPV6, IPV6_RTHDR, &srh, (socklen_t)len) < 0 ? -errno : 0;
}

#endif /* SEGSCOPE_SRH_SOCKOPT_H */
