// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Alternate-marking counter at the egress edge (XDP, before End.DT6 decap).
 * Only counts, always XDP_PASS: the kernel then decapsulates, which
 * removes the outer header with its DSCP colour and its Destination Options
 * header, so marking never leaks past this node.
 *
 * The colour comes from the packet, not from the clock: the AltMark option's
 * L flag (rfc9343 flows, looked up by FlowMonID) or the flow's DSCP colour bit
 * (dscp flows, looked up by the SRH SID list). The DOH may sit before or after
 * the SRH. A D-marked packet of a known flow adds its CLOCK_TAI arrival time to
 * the (slot, colour) sum, for the double-marking delay. Every packet lands in
 * exactly one stats counter.
 *
 * Chaining (xdp_chain.h): altmark_rx is the first role of the XDP chain, so
 * it sees every packet of its device first; after counting it hands the
 * packet to the next member on the device (in-line IOAM extraction, a STAMP
 * collector or reflector), or to the stack when there is none.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "altmark.h"
#include "altmark_parse.bpf.h"
#include "xdp_chain.h"

#define AM_MAX_HBH_END  2200   /* bound for the verifier: Eth + IPv6 + one HBH (<= 2048 B) */
#define AM_MAX_EXT_OFF  4400   /* ... + one DOH (<= 2048 B) */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, ALTMARK_MAX_FLOWS);
	__type(key, struct altmark_sidlist_key);
	__type(value, struct altmark_flow);
} altmark_flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, ALTMARK_MAX_FLOWS);
	__type(key, __u32);
	__type(value, struct altmark_flow);
} altmark_flowmon SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, ALTMARK_NR_COUNTERS);
	__type(key, __u32);
	__type(value, struct altmark_counter);
} altmark_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, AMRX_NR_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} altmark_stats SEC(".maps");

static __always_inline void count(enum altmark_rx_counter counter)
{
	__u32 key = counter;
	__u64 *value = bpf_map_lookup_elem(&altmark_stats, &key);

	if (value)
		*value += 1;   /* per-CPU slot: no atomic needed */
}

/* What the extension-header walk found. */
struct am_rx_view {
	__u32 opt_data;                /* AltMark option data, host order */
	bool has_altmark;
	bool has_srh;
	enum am_srh_outcome srh;       /* valid when has_srh */
};

/* One DOH at hdr: note its AltMark option, step over it. Returns a counter to stop with or AMRX_NR_COUNTERS. */
static __always_inline enum altmark_rx_counter
step_doh(__u8 *hdr, void *data_end, struct am_rx_view *v, __u8 *next, __u32 *off)
{
	__u32 opt;

	switch (am_doh_altmark(hdr, data_end, &opt)) {
	case AM_DOH_ALTMARK:
		if (!v->has_altmark) {
			v->opt_data = opt;
			v->has_altmark = true;
		}
		break;
	case AM_DOH_MALFORMED:
		return AMRX_PASS_MALFORMED_DOH;
	default:
		break;
	}
	if ((void *)(hdr + 2) > data_end)   /* checked by am_doh_altmark; for the verifier */
		return AMRX_PASS_MALFORMED_DOH;
	*next = hdr[0];
	*off += ((__u32)hdr[1] + 1) * 8;
	return AMRX_NR_COUNTERS;
}

/*
 * The extension headers the edge can see after the IPv6 header, in this
 * order: [HBH] [DOH] [SRH] [DOH] (RFC 8200 order; the in-line IOAM trace
 * (ioam_tx) is a Hop-by-Hop header in front of everything, TX inserts its DOH
 * before the SRH, a DOH for the final destination (e.g. IOAM E2E) follows
 * it). Written out instead of a loop over any order: that keeps the
 * verifier's path count small. Returns a stats counter to stop with, or
 * AMRX_NR_COUNTERS to go on.
 */
static __always_inline enum altmark_rx_counter
walk_ext_headers(void *data, void *data_end, struct ipv6hdr *ip6, struct am_rx_view *v,
		 struct altmark_sidlist_key *key)
{
	__u32 off = AM_L3_OFF + sizeof(*ip6);
	__u8 next = ip6->nexthdr;
	enum altmark_rx_counter stop;
	struct ipv6_sr_hdr *srh;

	if (next == IPPROTO_HOPOPTS_HDR) {
		__u8 *hbh = data + off;

		if ((void *)(hbh + 2) > data_end)
			return AMRX_PASS_MALFORMED_HBH;
		next = hbh[0];
		off += ((__u32)hbh[1] + 1) * 8;
	}
	if (next == IPPROTO_DSTOPTS_HDR) {
		if (off > AM_MAX_HBH_END)
			return AMRX_PASS_MALFORMED_HBH;   /* cannot happen: HBH <= 2048 B */
		stop = step_doh(data + off, data_end, v, &next, &off);
		if (stop != AMRX_NR_COUNTERS)
			return stop;
	}
	if (next != IPPROTO_ROUTING_HDR)
		return AMRX_NR_COUNTERS;
	if (off > AM_MAX_EXT_OFF)
		return AMRX_PASS_MALFORMED_DOH;
	srh = data + off;
	if ((void *)srh + 8 > data_end)
		return AMRX_PASS_MALFORMED_SRH;
	v->has_srh = true;
	v->srh = am_srh_key(srh, data_end, key);
	if (v->srh == AM_SRH_MALFORMED)
		return AMRX_PASS_MALFORMED_SRH;
	next = srh->nexthdr;
	off += ((__u32)srh->hdrlen + 1) * 8;
	if (next != IPPROTO_DSTOPTS_HDR || v->has_altmark)
		return AMRX_NR_COUNTERS;
	if (off > AM_MAX_EXT_OFF * 2)
		return AMRX_NR_COUNTERS;   /* cannot happen: HBH, DOH and SRH are <= 2048 B each */
	return step_doh(data + off, data_end, v, &next, &off);
}

static __always_inline void account(const struct altmark_flow *flow, __u32 colour, bool dmark, __u32 bytes)
{
	__u32 idx = flow->slot * 2 + colour;
	struct altmark_counter *c;

	c = bpf_map_lookup_elem(&altmark_counters, &idx);
	if (!c)
		return;   /* slot checked by the caller: cannot happen */
	c->packets += 1;
	c->bytes += bytes;
	if (dmark) {
		c->dmark_packets += 1;
		c->dmark_ts_sum_ns += bpf_ktime_get_tai_ns();
	}
}

/* Count the packet in its flow (if any); returns the one stats counter it lands in. */
static __always_inline enum altmark_rx_counter classify(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data, *data_end = (void *)(long)ctx->data_end;
	struct altmark_sidlist_key key;
	struct am_rx_view v = {};
	struct altmark_flow *flow;
	enum altmark_rx_counter stop;
	struct ipv6hdr *ip6 = data + AM_L3_OFF;
	__u32 bytes, colour;
	bool dmark;

	if ((void *)(ip6 + 1) > data_end || ((struct ethhdr *)data)->h_proto != AM_ETH_P_IPV6_BE)
		return AMRX_PASS_NOT_IPV6;
	bytes = 40 + bpf_ntohs(ip6->payload_len);
	stop = walk_ext_headers(data, data_end, ip6, &v, &key);
	if (stop != AMRX_NR_COUNTERS)
		return stop;

	if (v.has_altmark) {
		__u32 flowmon = v.opt_data >> ALTMARK_OPT_FLOWMON_SHIFT;

		flow = bpf_map_lookup_elem(&altmark_flowmon, &flowmon);
		if (!flow)
			return AMRX_PASS_UNKNOWN_FLOWMON;
		if (flow->slot >= ALTMARK_MAX_FLOWS)
			return AMRX_PASS_BAD_SLOT;
		account(flow, !!(v.opt_data & ALTMARK_OPT_L_FLAG), !!(v.opt_data & ALTMARK_OPT_D_FLAG), bytes);
		return AMRX_COUNTED_RFC9343;
	}
	if (!v.has_srh)
		return AMRX_PASS_NO_SRH;
	if (v.srh == AM_SRH_NOT_SRH)
		return AMRX_PASS_NOT_SRH;
	if (v.srh == AM_SRH_TOO_MANY_SIDS)
		return AMRX_PASS_TOO_MANY_SIDS;
	flow = bpf_map_lookup_elem(&altmark_flows, &key);
	if (!flow || flow->method != ALTMARK_METHOD_DSCP)
		return AMRX_PASS_UNMONITORED;
	if (flow->slot >= ALTMARK_MAX_FLOWS || flow->dscp_l_bit >= ALTMARK_DSCP_BITS ||
	    flow->dscp_d_bit >= ALTMARK_DSCP_BITS)
		return AMRX_PASS_BAD_SLOT;
	{
		__u16 word = bpf_ntohs(*(__be16 *)ip6);

		colour = !!(word & am_dscp_word_bit(flow->dscp_l_bit));
		dmark = !!(word & am_dscp_word_bit(flow->dscp_d_bit));
	}
	account(flow, colour, dmark, bytes);
	return AMRX_COUNTED_DSCP;
}

SEC("xdp")
int altmark_rx(struct xdp_md *ctx)
{
	count(classify(ctx));
	return xdp_chain_next(ctx, XDP_CHAIN_ALTMARK_RX);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
