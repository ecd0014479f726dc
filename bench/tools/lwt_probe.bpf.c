// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Probes of what a lightweight-tunnel BPF program on a route (`ip -6 route add P encap bpf xmit
 * obj lwt_probe.bpf.o section S dev D`) may do on this kernel: the candidate hook for doing the
 * SRv6 encapsulation and the IOAM insertion in one program instead of seg6 encap + ioam_tx on TC
 * egress. Each program stores its helper's return code in rc[slot]; datapath/README.md
 * ("In-line IOAM on the route") records the results. Build with -DREJECTED to add the two
 * programs the verifier refuses (bpf_skb_adjust_room in lwt_xmit, bpf_skb_store_bytes in lwt_in).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __s64);
} rc SEC(".maps");

/* an SRH with two segments, fc00::2 then fc00::1 (segment list stored last segment first) */
struct srh2 {
	__u8 next_header, hdr_ext_len, routing_type, segments_left, last_entry, flags;
	__u16 tag;
	struct in6_addr segments[2];
};

struct outer_v6_srh {
	struct ipv6hdr ip;
	struct srh2 srh;
};

static __always_inline void note(__u32 slot, __s64 value)
{
	__s64 *stored = bpf_map_lookup_elem(&rc, &slot);

	if (stored)
		*stored = value;
}

static __always_inline void fill_srh(struct srh2 *srh)
{
	__builtin_memset(srh, 0, sizeof(*srh));
	srh->next_header = 41; /* IPv6 inside */
	srh->hdr_ext_len = 4;
	srh->routing_type = 4;
	srh->segments_left = 1;
	srh->last_entry = 1;
	srh->segments[0].in6_u.u6_addr8[0] = 0xfc;
	srh->segments[0].in6_u.u6_addr8[15] = 2;
	srh->segments[1].in6_u.u6_addr8[0] = 0xfc;
	srh->segments[1].in6_u.u6_addr8[15] = 1;
}

/* the kernel's own seg6 encap from lwt_xmit: loads, but returns -EINVAL (only IP encap there) */
SEC("s_x_seg6")
int x_seg6(struct __sk_buff *skb)
{
	struct srh2 srh;

	fill_srh(&srh);
	note(0, bpf_lwt_push_encap(skb, BPF_LWT_ENCAP_SEG6, &srh, sizeof(srh)));
	return BPF_OK;
}

/* a whole outer IPv6 + SRH pushed as IP encap, then re-routed on the outer destination: works */
SEC("s_x_ip")
int x_ip(struct __sk_buff *skb)
{
	struct outer_v6_srh outer;

	__builtin_memset(&outer, 0, sizeof(outer));
	fill_srh(&outer.srh);
	outer.ip.version = 6;
	outer.ip.nexthdr = 43; /* routing header */
	outer.ip.hop_limit = 64;
	outer.ip.payload_len = bpf_htons(skb->len + sizeof(outer.srh));
	outer.ip.saddr.in6_u.u6_addr8[0] = 0xfc;
	outer.ip.saddr.in6_u.u6_addr8[15] = 9;
	outer.ip.daddr = outer.srh.segments[1];
	note(1, bpf_lwt_push_encap(skb, BPF_LWT_ENCAP_IP, &outer, sizeof(outer)));
	return BPF_LWT_REROUTE;
}

/* room at the front for headers written by the program: allowed in lwt_xmit */
SEC("s_x_head")
int x_head(struct __sk_buff *skb)
{
	note(2, bpf_skb_change_head(skb, 48, 0));
	return BPF_DROP;
}

/* lwt_in (input of forwarded packets) may push the kernel's seg6 encap: works */
SEC("s_i_seg6")
int i_seg6(struct __sk_buff *skb)
{
	struct srh2 srh;

	fill_srh(&srh);
	note(0, bpf_lwt_push_encap(skb, BPF_LWT_ENCAP_SEG6, &srh, sizeof(srh)));
	return BPF_OK;
}

/* lwt_in may also push a whole outer IPv6 + SRH as IP encap (the sampled packets' path) */
SEC("s_i_ip")
int i_ip(struct __sk_buff *skb)
{
	struct outer_v6_srh outer;

	__builtin_memset(&outer, 0, sizeof(outer));
	fill_srh(&outer.srh);
	outer.ip.version = 6;
	outer.ip.nexthdr = 43; /* routing header */
	outer.ip.hop_limit = 64;
	outer.ip.payload_len = bpf_htons(skb->len + sizeof(outer.srh));
	outer.ip.saddr.in6_u.u6_addr8[0] = 0xfc;
	outer.ip.saddr.in6_u.u6_addr8[15] = 9;
	outer.ip.daddr = outer.srh.segments[1];
	note(1, bpf_lwt_push_encap(skb, BPF_LWT_ENCAP_IP, &outer, sizeof(outer)));
	return BPF_LWT_REROUTE;
}

#ifdef REJECTED
SEC("s_x_adjust")
int x_adjust(struct __sk_buff *skb)
{
	note(3, bpf_skb_adjust_room(skb, 48, BPF_ADJ_ROOM_NET, 0));
	return BPF_DROP;
}

SEC("s_i_store")
int i_store(struct __sk_buff *skb)
{
	__u8 byte = 1;

	note(1, bpf_skb_store_bytes(skb, 0, &byte, 1, 0));
	return BPF_OK;
}
#endif

char LICENSE[] SEC("license") = "GPL";
