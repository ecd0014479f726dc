// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Benchmark baseline for the STAMP reflector: the cheapest possible "reply"
 * to an IPv6/UDP packet (swap MACs, addresses and ports, XDP_TX). No checksum
 * change is needed: swapping the pseudo-header addresses and the ports keeps
 * the UDP sum. Anything else passes.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "stamp_parse.bpf.h"

SEC("xdp")
int xdp_bounce(struct xdp_md *ctx)
{
	void *data_end = (void *)(long)ctx->data_end;
	struct pkt_view v;
	unsigned char mac[ETH_ALEN];
	struct in6_addr addr;
	__be16 port;

	if (!parse_ipv6(ctx, &v) || v.ip6->nexthdr != NEXTHDR_UDP)
		return XDP_PASS;
	v.udp = (void *)(v.ip6 + 1);
	if ((void *)(v.udp + 1) > data_end)
		return XDP_PASS;

	__builtin_memcpy(mac, v.eth->h_dest, ETH_ALEN);
	__builtin_memcpy(v.eth->h_dest, v.eth->h_source, ETH_ALEN);
	__builtin_memcpy(v.eth->h_source, mac, ETH_ALEN);
	addr = v.ip6->saddr;
	v.ip6->saddr = v.ip6->daddr;
	v.ip6->daddr = addr;
	port = v.udp->source;
	v.udp->source = v.udp->dest;
	v.udp->dest = port;
	return XDP_TX;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
