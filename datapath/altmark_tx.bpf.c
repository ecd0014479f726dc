// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Alternate-marking colourer at the ingress edge (TC egress, clsact).
 * Runs after the SRv6 encapsulation (`encap seg6 mode encap`), so a packet of a
 * monitored SRv6 policy is Ethernet | IPv6 | SRH | inner packet. The SID list
 * of the SRH selects the flow (one hash lookup). With reduced encapsulation of
 * one uSID container (`mode encap.red`, Ethernet | IPv6 | inner packet) the
 * outer destination is the SID list [container]. The colour is the parity of
 * the CLOCK_TAI block, so the egress edge needs no messages to agree:
 *
 *   colour = (tai_ns / period_ns) & 1
 *
 * Method dscp writes the colour (and the delay mark) into two DSCP bits of the
 * outer header; method rfc9343 inserts an 8-byte Destination Options header
 * with the AltMark option (FlowMonID, L, D) between the outer IPv6 header and
 * the SRH. Every marked packet is counted per (slot, colour) in per-CPU
 * counters; every packet lands in exactly one stats counter. Traffic is never
 * dropped: when marking fails the packet goes out unmarked and is counted.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "altmark.h"
#include "altmark_parse.bpf.h"

/*
 * The verdict of every packet: in direct-action cls_bpf, TC_ACT_OK ends the
 * clsact filter chain (net/sched/cls_bpf.c: only TC_ACT_UNSPEC makes
 * tcf_classify try the next filter), so the in-line IOAM inserter ioam_tx,
 * a later filter on the same device, would never see the packet. With
 * TC_ACT_UNSPEC the next filter runs, and at the end of the chain the packet
 * goes out as with TC_ACT_OK.
 */
#define TC_ACT_UNSPEC (-1)
/* headers the program reads: Ethernet + IPv6 + DOH + SRH with ALTMARK_MAX_SIDS */
#define AM_PULL_LEN (14 + 40 + 8 + 8 + 16 * ALTMARK_MAX_SIDS)
/* GSO: also the inner IPv6 header and the start of its TCP header (data offset byte) */
#define AM_PULL_LEN_GSO (AM_PULL_LEN + 40 + 20)
#define AM_MAX_SRH_LEN 256             /* SRHs with TLVs beyond this: GSO header size estimated */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, ALTMARK_MAX_FLOWS);
	__type(key, struct altmark_sidlist_key);
	__type(value, struct altmark_flow);
} altmark_flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, ALTMARK_NR_COUNTERS);
	__type(key, __u32);
	__type(value, struct altmark_counter);
} altmark_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, AMTX_NR_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} altmark_stats SEC(".maps");

static __always_inline int count(enum altmark_tx_counter counter)
{
	__u32 key = counter;
	__u64 *value = bpf_map_lookup_elem(&altmark_stats, &key);

	if (value)
		*value += 1;   /* per-CPU slot: no atomic needed */
	return TC_ACT_UNSPEC;
}

/* D-mark this packet? One in dmark_every of the (slot, colour) per-CPU count. */
static __always_inline bool dmark_due(const struct altmark_flow *flow, const struct altmark_counter *c)
{
	return flow->dmark_every && c->packets % flow->dmark_every == 0;
}

static __always_inline void account(struct altmark_counter *c, __u32 packets, __u64 bytes, bool dmark,
				    __u64 tai_ns)
{
	c->packets += packets;
	c->bytes += bytes;
	if (dmark) {
		c->dmark_packets += 1;
		c->dmark_ts_sum_ns += tai_ns;
	}
}

/*
 * A GSO packet leaves as several packets, each with a copy of all headers
 * (outer IPv6, SRH, inner IPv6, TCP/UDP): the egress edge counts every one of
 * them, so the colourer must too. Header bytes per segment are read from the
 * packet (inner IPv6 assumed without extension headers; TCP data offset or
 * UDP 8). Segments: gso_segs, or (when the stack left it 0 = unknown) the
 * payload divided by gso_size, rounded up. Bytes = what the segments' IPv6
 * lengths add up to.
 */
static __always_inline __u32 gso_hdr_len(struct ipv6hdr *ip6, void *data_end, __u32 srh_len)
{
	__u8 *inner = (__u8 *)(ip6 + 1) + srh_len;

	if (srh_len <= AM_MAX_SRH_LEN && (void *)(inner + 40 + 13) <= data_end) {
		if (inner[6] == 17)
			return 40 + srh_len + 40 + 8;
		if (inner[6] == 6)
			return 40 + srh_len + 40 + ((__u32)(inner[40 + 12] >> 4) * 4);
	}
	return 40 + srh_len + 40 + 20;         /* fallback: TCP without options */
}

static __always_inline __u64 gso_account(struct __sk_buff *skb, struct ipv6hdr *ip6, void *data_end,
					 __u32 srh_len, __u32 *segs)
{
	__u32 ip_len = 40 + bpf_ntohs(ip6->payload_len), hdr = gso_hdr_len(ip6, data_end, srh_len);
	__u32 gso_size = skb->gso_size, payload = ip_len > hdr ? ip_len - hdr : 0;

	*segs = skb->gso_segs;
	if (!*segs && gso_size)
		*segs = (payload + gso_size - 1) / gso_size;
	if (!*segs)
		*segs = 1;
	return (__u64)ip_len + (__u64)(*segs - 1) * hdr;
}

/* Method dscp: L bit = colour, D bit = dmark; nothing else in the header changes. */
static __always_inline void mark_dscp(struct ipv6hdr *ip6, const struct altmark_flow *flow,
				      __u32 colour, bool dmark)
{
	__be16 *word = (__be16 *)ip6;
	__u16 v = bpf_ntohs(*word);
	__u16 l = am_dscp_word_bit(flow->dscp_l_bit), d = am_dscp_word_bit(flow->dscp_d_bit);

	v = colour ? v | l : v & ~l;
	v = dmark ? v | d : v & ~d;
	*word = bpf_htons(v);   /* IPv6 has no header checksum; TC is not in the UDP pseudo-header */
}

/*
 * Method rfc9343: grow the packet by 8 bytes right after the fixed IPv6
 * header (BPF_ADJ_ROOM_NET) and write the Destination Options header there.
 * Returns the new IPv6 length, or 0 if the room could not be made (packet
 * unchanged, goes out unmarked).
 *
 * bpf_skb_adjust_room does not check the MTU (not since 5.12): a packet within
 * 8 bytes of the device MTU would grow past it, veth would still send it and
 * the next router would drop it (Packet Too Big). So the MTU is checked here
 * first and such a packet is sent unmarked (counted), never lost.
 */
static __always_inline __u32 mark_rfc9343(struct __sk_buff *skb, const struct altmark_flow *flow,
					  __u32 colour, bool dmark)
{
	void *data, *data_end;
	struct ipv6hdr *ip6;
	__u8 *doh;
	__u32 opt;
	__u32 mtu_len = 0;
	__u8 next;

	if (bpf_check_mtu(skb, 0, &mtu_len, ALTMARK_DOH_LEN, 0) != BPF_MTU_CHK_RET_SUCCESS)
		return 0;
	if (bpf_skb_adjust_room(skb, ALTMARK_DOH_LEN, BPF_ADJ_ROOM_NET, 0))
		return 0;
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	ip6 = data + AM_L3_OFF;
	doh = (__u8 *)(ip6 + 1);
	if ((void *)(doh + ALTMARK_DOH_LEN) > data_end)
		return 0;   /* cannot happen after a successful adjust_room; verifier needs it */
	next = ip6->nexthdr;
	ip6->nexthdr = IPPROTO_DSTOPTS_HDR;
	ip6->payload_len = bpf_htons(bpf_ntohs(ip6->payload_len) + ALTMARK_DOH_LEN);
	opt = (flow->flow_id & ALTMARK_FLOWMONID_MAX) << ALTMARK_OPT_FLOWMON_SHIFT |
	      (colour ? ALTMARK_OPT_L_FLAG : 0) | (dmark ? ALTMARK_OPT_D_FLAG : 0);
	doh[0] = next;
	doh[1] = 0;                       /* hdr ext len: 8 bytes in all */
	doh[2] = ALTMARK_OPT_TYPE;
	doh[3] = ALTMARK_OPT_DATA_LEN;
	*(__be32 *)(doh + 4) = bpf_htonl(opt);
	return 40 + bpf_ntohs(ip6->payload_len);
}

SEC("tc")
int altmark_tx(struct __sk_buff *skb)
{
	struct altmark_sidlist_key key;
	struct altmark_counter *ctr;
	struct altmark_flow *flow;
	struct ipv6_sr_hdr *srh;
	void *data, *data_end;
	struct ipv6hdr *ip6;
	__u64 tai_ns, bytes;
	__u32 idx, colour, segs = 1, want, srh_len = 0;
	bool dmark, is_gso;

	/* the headers we read must be in the linear part: pull only when they are not (a helper
	 * call per packet costs); the verifier's TC prologue already makes direct writes safe */
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	is_gso = skb->gso_size != 0;
	want = is_gso ? AM_PULL_LEN_GSO : AM_PULL_LEN;
	if (data + want > data_end && skb->len > (__u32)(data_end - data)) {
		bpf_skb_pull_data(skb, skb->len < want ? skb->len : want);
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
	}
	ip6 = data + AM_L3_OFF;
	if ((void *)(ip6 + 1) > data_end || skb->protocol != AM_ETH_P_IPV6_BE ||
	    ((struct ethhdr *)data)->h_proto != AM_ETH_P_IPV6_BE)
		return count(AMTX_PASS_NOT_IPV6);
	if (ip6->nexthdr == IPPROTO_DSTOPTS_HDR) {
		__u32 opt;

		/* never mark twice (a second colourer on the path, or a re-sent packet) */
		if (am_doh_altmark((__u8 *)(ip6 + 1), data_end, &opt) == AM_DOH_ALTMARK)
			return count(AMTX_PASS_ALREADY_MARKED);
		return count(AMTX_PASS_NO_SRH);
	}
	if (ip6->nexthdr == IPPROTO_IPV6_ENCAP) {
		/* reduced encapsulation with one SID (H.Encaps.Red of a uSID container): no SRH, the
		 * container is the outer destination. Keyed as the SID list [container], the key an SRH
		 * holding that one container gives, so one flow spec covers both. */
		am_da_key(ip6, &key);
	} else if (ip6->nexthdr != IPPROTO_ROUTING_HDR) {
		return count(AMTX_PASS_NO_SRH);
	} else {
		srh = (void *)(ip6 + 1);
		if ((void *)srh + 8 > data_end)
			return count(AMTX_PASS_MALFORMED_SRH);
		switch (am_srh_key(srh, data_end, &key)) {
		case AM_SRH_OK:
			break;
		case AM_SRH_NOT_SRH:
			return count(AMTX_PASS_NOT_SRH);
		case AM_SRH_TOO_MANY_SIDS:
			return count(AMTX_PASS_TOO_MANY_SIDS);
		default:
			return count(AMTX_PASS_MALFORMED_SRH);
		}
		srh_len = ((__u32)srh->hdrlen + 1) * 8;
	}
	flow = bpf_map_lookup_elem(&altmark_flows, &key);
	if (!flow)
		return count(AMTX_PASS_UNMONITORED);
	if (!flow->period_ns || flow->dscp_l_bit >= ALTMARK_DSCP_BITS || flow->dscp_d_bit >= ALTMARK_DSCP_BITS)
		return count(AMTX_PASS_BAD_SLOT);
	tai_ns = bpf_ktime_get_tai_ns();
	colour = (tai_ns / flow->period_ns) & 1;
	idx = flow->slot * 2 + colour;
	ctr = flow->slot < ALTMARK_MAX_FLOWS ? bpf_map_lookup_elem(&altmark_counters, &idx) : NULL;
	if (!ctr)
		return count(AMTX_PASS_BAD_SLOT);
	/* a GSO packet is never D-marked: every segment would carry the mark (and one timestamp) */
	dmark = !is_gso && dmark_due(flow, ctr);
	if (flow->method == ALTMARK_METHOD_DSCP) {
		mark_dscp(ip6, flow, colour, dmark);
		if (is_gso)
			bytes = gso_account(skb, ip6, data_end, srh_len, &segs);
		else
			bytes = 40 + bpf_ntohs(ip6->payload_len);
		account(ctr, segs, bytes, dmark, tai_ns);
		return count(AMTX_COLOURED_DSCP);
	}
	if (flow->method != ALTMARK_METHOD_RFC9343)
		return count(AMTX_PASS_BAD_SLOT);
	/* growing a GSO packet changes its segmentation (gso_size, segs recomputed later):
	 * its count would not be known here. Left unmarked, so neither edge counts it. */
	if (is_gso)
		return count(AMTX_PASS_GSO_NOT_MARKED);
	/* flow and ctr are map values: they stay valid across adjust_room */
	bytes = mark_rfc9343(skb, flow, colour, dmark);
	if (!bytes)
		return count(AMTX_PASS_MARK_FAILED);
	account(ctr, 1, bytes, dmark, tai_ns);
	return count(AMTX_COLOURED_RFC9343);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
