// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * In-line IOAM insertion at the ingress edge (TC egress, clsact, after the
 * seg6 encapsulation and after the alternate-marking colourer altmark_tx).
 *
 * A packet of a monitored flow is Ethernet | IPv6 | [DOH AltMark] | SRH |
 * inner packet; the flow is its SRH SID list (the key of altmark_flows) and,
 * optionally, a filter on the inner packet. Sampled packets get, with one
 * bpf_skb_adjust_room(BPF_ADJ_ROOM_NET) and a 32-byte move of DOH + SRH:
 *
 *   IPv6 | HBH: IOAM Pre-allocated Trace (our entry filled) | [DOH AltMark] |
 *   SRH | DOH: IOAM E2E (sequence number, TAI timestamp) | inner packet
 *
 * (schemas/IOAM.md draws the bytes). Sampling (per flow, global across CPUs):
 *   --sample-every N:       packet k of the flow, k = 0, 1, ... in the order the
 *                           CPUs count it (one atomic add), is sampled iff k % N == 0;
 *   --sample-interval-us M: a packet is sampled when M µs of CLOCK_TAI have passed
 *                           since the flow's last sampled packet (the first is);
 *                           concurrent candidates race with a compare-and-swap, one wins.
 * A sampled packet that cannot be instrumented (GSO, already IOAM, another HBH
 * or DOH in the way, headers too long to move, MTU, adjust failure) goes out
 * unchanged and is counted; the sample does not move to the next packet.
 * Traffic is never dropped: the program always returns TC_ACT_UNSPEC, so the
 * next filter of the clsact chain still runs (TC_ACT_OK would end the chain)
 * and the packet then goes out as usual.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "ioam.h"
#include "altmark_parse.bpf.h"
#include "ioam_parse.bpf.h"
#include "ioam_sample.bpf.h"

#define TC_ACT_UNSPEC (-1)
/* the DOH + SRH block moved 32 bytes forward: an AltMark DOH (8) + an SRH of 6 SIDs (104) with room for TLVs */
#define IOAM_TX_MAX_MOVE 256
/* headers read in the common case: Ethernet + IPv6 + AltMark DOH + SRH of ALTMARK_MAX_SIDS */
#define IOTX_PULL_LEN    (IOAM_L4_OFF + 8 + 8 + 16 * ALTMARK_MAX_SIDS)
#define IOTX_MAX_EXT_LEN 2048  /* one HBH or DOH: (255 + 1) * 8 */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, IOAM_MAX_FLOWS);
	__type(key, struct altmark_sidlist_key);
	__type(value, struct ioam_tx_flow);
} ioam_tx_flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, IOAM_MAX_IFS);
	__type(key, __u32);
	__type(value, __u16);
} ioam_if_ids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ioam_tx_config);
} ioam_tx_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, IOTX_NR_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} ioam_tx_stats SEC(".maps");

IOAM_DEFINE_OPTS_FIND(ioam_opts_find_tc, struct __sk_buff)

static __always_inline int count(enum ioam_tx_counter counter)
{
	__u32 key = counter;
	__u64 *value = bpf_map_lookup_elem(&ioam_tx_stats, &key);

	if (value)
		*value += 1;   /* per-CPU slot: no atomic needed */
	return TC_ACT_UNSPEC;
}

/* Make the first `want` bytes linear if the packet has them; a helper call only when needed. */
static __always_inline void pull(struct __sk_buff *skb, __u32 want)
{
	__u32 linear = IOAM_DATA_END(skb) - IOAM_DATA(skb);

	if (linear < want && skb->len > linear)
		bpf_skb_pull_data(skb, skb->len < want ? skb->len : want);
}

/* Where the extension headers are (frame offsets; 0 = absent), found by walk(). */
struct tx_view {
	__u32 limit;        /* end of the IPv6 packet: min(frame, 54 + payload length) */
	__u32 hbh_off;
	__u32 doh_off;      /* DOH between IPv6 [HBH] and SRH */
	__u32 srh_off;
	__u32 srh_end;
	__u32 post_doh_off; /* DOH right after the SRH */
	__u32 inner_off;    /* the header after all of them */
	__u8 inner_nh;
};

/* Step over one HBH/DOH at *off: its next header, or -1 if it runs past the IPv6 packet. */
static __always_inline int step_opts(struct __sk_buff *skb, struct tx_view *v, __u32 *off)
{
	void *data, *data_end;
	__u8 *hdr;

	pull(skb, *off + 2);
	data = IOAM_DATA(skb);
	data_end = IOAM_DATA_END(skb);
	hdr = data + (*off & IOAM_OFF_MASK);
	if ((void *)(hdr + 2) > data_end || *off + 2 > v->limit)
		return -1;
	*off += ((__u32)hdr[1] + 1) * 8;
	if (*off > v->limit)
		return -1;
	return hdr[0];
}

/* IPv6 [HBH] [DOH] SRH [DOH]: the SID list into key; a stats counter to stop with, or IOTX_NR_COUNTERS. */
static __always_inline enum ioam_tx_counter walk(struct __sk_buff *skb, struct tx_view *v,
						  struct altmark_sidlist_key *key)
{
	void *data = IOAM_DATA(skb), *data_end = IOAM_DATA_END(skb);
	struct ipv6hdr *ip6 = data + IOAM_L3_OFF;
	struct ipv6_sr_hdr *srh;
	__u32 off = IOAM_L4_OFF, frame = skb->len;
	int nh;

	if ((void *)(ip6 + 1) > data_end || skb->protocol != IOAM_ETH_P_IPV6_BE ||
	    ((struct ethhdr *)data)->h_proto != IOAM_ETH_P_IPV6_BE)
		return IOTX_PASS_NOT_IPV6;
	v->limit = IOAM_L4_OFF + bpf_ntohs(ip6->payload_len);
	if (v->limit > frame)
		v->limit = frame;
	nh = ip6->nexthdr;
	if (nh == IPV6_NH_HOPOPTS) {
		v->hbh_off = off;
		nh = step_opts(skb, v, &off);
		if (nh < 0)
			return IOTX_PASS_MALFORMED;
	}
	if (nh == IPV6_NH_DSTOPTS) {
		if (off > IOAM_L4_OFF + IOTX_MAX_EXT_LEN)
			return IOTX_PASS_MALFORMED;
		v->doh_off = off;
		nh = step_opts(skb, v, &off);
		if (nh < 0)
			return IOTX_PASS_MALFORMED;
	}
	if (nh != IPV6_NH_ROUTING)
		return IOTX_PASS_NO_SRH;
	if (off > IOAM_L4_OFF + 2 * IOTX_MAX_EXT_LEN)
		return IOTX_PASS_MALFORMED;
	pull(skb, off + 8 + 16 * ALTMARK_MAX_SIDS);
	data = IOAM_DATA(skb);
	data_end = IOAM_DATA_END(skb);
	srh = data + (off & IOAM_OFF_MASK);
	if ((void *)srh + 8 > data_end || off + 8 > v->limit)
		return IOTX_PASS_MALFORMED;
	if (srh->type != IPV6_SRH_TYPE)
		return IOTX_PASS_NO_SRH;
	switch (am_srh_key(srh, data_end, key)) {
	case AM_SRH_OK:
		break;
	case AM_SRH_TOO_MANY_SIDS:
		return IOTX_PASS_TOO_MANY_SIDS;
	default:
		return IOTX_PASS_MALFORMED;
	}
	v->srh_off = off;
	nh = srh->nexthdr;
	off += ((__u32)srh->hdrlen + 1) * 8;
	if (off > v->limit)
		return IOTX_PASS_MALFORMED;
	v->srh_end = off;
	if (nh == IPV6_NH_DSTOPTS) {
		v->post_doh_off = off;
		nh = step_opts(skb, v, &off);
		if (nh < 0)
			return IOTX_PASS_MALFORMED;
	}
	v->inner_off = off;
	v->inner_nh = (__u8)nh;
	return IOTX_NR_COUNTERS;
}


/* The flow's filter on the inner IPv6 packet (its own next header; TCP/UDP ports). */
static __always_inline bool filter_match(struct __sk_buff *skb, const struct tx_view *v, const struct ioam_match *m)
{
	void *data, *data_end;
	struct ipv6hdr *in6;
	__u8 *l4;
	__u32 fields = m->fields;

	if (!fields)
		return true;
	if (v->inner_nh != IPV6_NH_IPV6 || v->inner_off > IOAM_L4_OFF + 3 * IOTX_MAX_EXT_LEN)
		return false;
	pull(skb, v->inner_off + 40 + 4);
	data = IOAM_DATA(skb);
	data_end = IOAM_DATA_END(skb);
	in6 = data + (v->inner_off & IOAM_OFF_MASK);
	if ((void *)(in6 + 1) > data_end || v->inner_off + 40 > v->limit)
		return false;
	if (!ioam_match_addrs(m, in6))
		return false;
	if (ioam_match_wants_ports(m)) {
		l4 = (__u8 *)(in6 + 1);
		if (!ioam_has_ports(in6->nexthdr))
			return false;
		if ((void *)(l4 + 4) > data_end || v->inner_off + 44 > v->limit)
			return false;
		return ioam_match_ports(m, l4);
	}
	return true;
}

/* Does the options header at off carry an IOAM option of type opt_type? */
static __always_inline bool has_ioam(struct __sk_buff *skb, const struct tx_view *v, __u32 off, __u32 opt_type)
{
	return IOAM_WALK_OUTCOME(ioam_opts_find_tc(skb, off, v->limit, opt_type)) == IOAM_WALK_FOUND;
}

static __always_inline __u16 if_id(__u32 ifindex)
{
	__u16 *id = ifindex ? bpf_map_lookup_elem(&ioam_if_ids, &ifindex) : NULL;

	return id ? *id : IOAM_IF_ID_UNAVAILABLE;
}

/*
 * Grow the packet by the HBH + the E2E header and write both (the layout in
 * schemas/IOAM.md). The block [54, srh_end) (DOH + SRH, `moved` bytes) is
 * what bpf_skb_adjust_room left after the gap; it moves 32 bytes forward,
 * behind the new HBH, and the E2E header takes the 32 bytes freed behind it.
 * Every check that can fail runs before the first byte is written; after a
 * failure the gap is removed again, so the packet goes out as it came.
 */
static __always_inline enum ioam_tx_counter insert(struct __sk_buff *skb, struct ioam_tx_flow *f,
						    const struct tx_view *v)
{
	__u32 slots = f->trace_nodes, hbh_len = IOAM_TRACE_HBH_LEN(slots & 0xf);
	__u32 grow = hbh_len + IOAM_E2E_DOH_LEN, moved = v->srh_end - IOAM_L4_OFF;
	__u32 srh_rel = v->srh_off - IOAM_L4_OFF, mtu_len = 0, zero = 0;
	struct ioam_tx_config *cfg = bpf_map_lookup_elem(&ioam_tx_config, &zero);
	__u64 tai_ns, utc_ns, seq;
	__u16 in_if, out_if;
	void *data, *data_end;
	struct ipv6hdr *ip6;
	__u8 *hbh, *blk, *e2e, old_nh, hop_limit;

	if (moved > IOAM_TX_MAX_MOVE || srh_rel >= moved)
		return IOTX_SKIP_TOO_LONG;
	if (bpf_check_mtu(skb, 0, &mtu_len, grow, 0) != BPF_MTU_CHK_RET_SUCCESS)
		return IOTX_SKIP_MTU;
	pull(skb, v->srh_end);   /* the block moves with direct access: SRH TLVs included */
	/* looked up before the packet changes: a failed lookup cannot leave it half written */
	in_if = if_id(skb->ingress_ifindex);
	out_if = if_id(skb->ifindex);
	if (bpf_skb_adjust_room(skb, grow, BPF_ADJ_ROOM_NET, 0))
		return IOTX_SKIP_ADJUST_FAILED;
	data = IOAM_DATA(skb);
	data_end = IOAM_DATA_END(skb);
	ip6 = data + IOAM_L3_OFF;
	hbh = data + IOAM_L4_OFF;
	/* the whole region written: HBH, the moved block, E2E (linear: it was before the adjust) */
	if ((void *)(hbh + IOAM_TRACE_DATA_OFF) > data_end || IOAM_L4_OFF + grow + moved > (__u32)(data_end - data)) {
		bpf_skb_adjust_room(skb, -(__s32)grow, BPF_ADJ_ROOM_NET, 0);
		return IOTX_SKIP_ADJUST_FAILED;
	}

	/* the block moves 32 bytes forward; destination before source, so copying upwards is safe */
	blk = hbh + (hbh_len & 0xff);
	for (__u32 i = 0; i < IOAM_TX_MAX_MOVE / 8; i++) {
		__u8 *dst = blk + i * 8;

		if (i * 8 >= moved)
			break;
		if ((void *)(dst + IOAM_E2E_DOH_LEN + 8) > data_end)
			return IOTX_INSTRUMENTED;   /* cannot happen: checked above (the verifier needs it) */
		*(__u64 *)dst = *(__u64 *)(dst + IOAM_E2E_DOH_LEN);
	}
	/* the SRH now precedes the E2E header */
	e2e = blk + (srh_rel & 0xff);
	if ((void *)(e2e + 1) > data_end)
		return IOTX_INSTRUMENTED;
	old_nh = e2e[0];
	e2e[0] = IPV6_NH_DSTOPTS;

	tai_ns = bpf_ktime_get_tai_ns();
	seq = __sync_fetch_and_add(&f->next_seq, 1);
	e2e = blk + (moved & 0x1ff);
	if ((void *)(e2e + IOAM_E2E_DOH_LEN) > data_end)
		return IOTX_INSTRUMENTED;
	e2e[0] = old_nh;
	e2e[1] = IOAM_E2E_DOH_LEN / 8 - 1;
	e2e[2] = IPV6_OPT_PADN;
	e2e[3] = 0;
	e2e[4] = IOAM_DOH_OPT_TYPE;
	e2e[5] = IOAM_E2E_OPT_DATA_LEN;
	e2e[6] = 0;
	e2e[7] = IOAM_OPTION_E2E;
	put16(e2e + 8, f->namespace_id);
	put16(e2e + 10, IOAM_E2E_TYPE_SEGSCOPE);
	put32(e2e + 12, (__u32)(seq >> 32));
	put32(e2e + 16, (__u32)seq);
	put32(e2e + 20, (__u32)(tai_ns / IOAM_E2E_NS_PER_SEC));   /* PTPv2 truncated: TAI s, ns */
	put32(e2e + 24, (__u32)(tai_ns % IOAM_E2E_NS_PER_SEC));
	e2e[28] = IPV6_OPT_PADN;
	e2e[29] = 2;
	e2e[30] = 0;
	e2e[31] = 0;

	/* the HBH: header, empty slots, our entry in the last one */
	old_nh = ip6->nexthdr;
	hop_limit = ip6->hop_limit;
	ip6->nexthdr = IPV6_NH_HOPOPTS;
	ip6->payload_len = bpf_htons(bpf_ntohs(ip6->payload_len) + grow);
	hbh[0] = old_nh;
	hbh[1] = (__u8)(hbh_len / 8 - 1);
	hbh[2] = IPV6_OPT_PADN;
	hbh[3] = 0;
	hbh[4] = IOAM_HBH_OPT_TYPE;
	hbh[5] = (__u8)(IOAM_TRACE_OPT_FIXED + IOAM_TRACE_ENTRY_SIZE * slots);
	hbh[6] = 0;
	hbh[7] = IOAM_OPTION_PREALLOC_TRACE;
	put16(hbh + 8, f->namespace_id);
	hbh[10] = IOAM_TRACE_NODE_LEN << 3;                       /* NodeLen, flags 0 */
	hbh[11] = (__u8)((slots - 1) * IOAM_TRACE_NODE_LEN);      /* RemainingLen: our entry is filled */
	hbh[12] = (__u8)(IOAM_TRACE_TYPE_SEGSCOPE >> 16);
	hbh[13] = (__u8)(IOAM_TRACE_TYPE_SEGSCOPE >> 8);
	hbh[14] = (__u8)IOAM_TRACE_TYPE_SEGSCOPE;
	hbh[15] = 0;
	for (__u32 i = 0; i < IOAM_TRACE_MAX_SLOTS - 1; i++) {
		__u64 *slot = (__u64 *)(hbh + IOAM_TRACE_DATA_OFF + i * IOAM_TRACE_ENTRY_SIZE);

		if (i + 1 >= slots)
			break;
		if ((void *)(slot + 2) > data_end)
			return IOTX_INSTRUMENTED;   /* cannot happen: checked above */
		slot[0] = 0;
		slot[1] = 0;
	}
	/* our entry: the time the packet leaves, in the kernel's format (UTC s + µs) */
	utc_ns = tai_ns - (cfg ? (__s64)cfg->tai_utc_offset_s * IOAM_E2E_NS_PER_SEC : 0);
	hbh = hbh + IOAM_TRACE_DATA_OFF + ((slots - 1) & 0xf) * IOAM_TRACE_ENTRY_SIZE;
	if ((void *)(hbh + IOAM_TRACE_ENTRY_SIZE) > data_end)
		return IOTX_INSTRUMENTED;
	put32(hbh, (__u32)hop_limit << 24 | (f->node_id & IOAM_NODE_ID_MAX));
	put16(hbh + 4, in_if);
	put16(hbh + 6, out_if);
	put32(hbh + 8, (__u32)(utc_ns / IOAM_E2E_NS_PER_SEC));
	put32(hbh + 12, (__u32)(utc_ns % IOAM_E2E_NS_PER_SEC / 1000));
	return IOTX_INSTRUMENTED;
}

/* Sampled: instrument the packet, or say why not (stats counter; the flow's counters follow it). */
static __always_inline enum ioam_tx_counter instrument(struct __sk_buff *skb, struct ioam_tx_flow *f,
							const struct tx_view *v)
{
	if (skb->gso_size)
		return IOTX_SKIP_GSO;
	if (v->hbh_off)
		return has_ioam(skb, v, v->hbh_off, IOAM_HBH_OPT_TYPE) ? IOTX_SKIP_ALREADY_IOAM : IOTX_SKIP_OTHER_EXT;
	if (v->post_doh_off)
		return has_ioam(skb, v, v->post_doh_off, IOAM_DOH_OPT_TYPE) ? IOTX_SKIP_ALREADY_IOAM
									     : IOTX_SKIP_OTHER_EXT;
	return insert(skb, f, v);
}

SEC("tc")
int ioam_tx(struct __sk_buff *skb)
{
	struct altmark_sidlist_key key;
	struct tx_view v = {};
	struct ioam_tx_flow *f;
	enum ioam_tx_counter c;

	pull(skb, IOTX_PULL_LEN);
	c = walk(skb, &v, &key);
	if (c != IOTX_NR_COUNTERS)
		return count(c);
	f = bpf_map_lookup_elem(&ioam_tx_flows, &key);
	if (!f)
		return count(IOTX_PASS_UNMONITORED);
	if (f->trace_nodes < 1 || f->trace_nodes > IOAM_TRACE_MAX_SLOTS ||
	    (f->sample_mode == IOAM_SAMPLE_EVERY ? !f->sample_every : f->sample_mode != IOAM_SAMPLE_INTERVAL))
		return count(IOTX_PASS_BAD_FLOW);
	if (!filter_match(skb, &v, &f->match))
		return count(IOTX_PASS_FILTERED);
	if (!ioam_sampled(f))
		return count(IOTX_PASS_NOT_SAMPLED);
	__sync_fetch_and_add(&f->sampled, 1);
	c = instrument(skb, f, &v);
	switch (c) {
	case IOTX_INSTRUMENTED:
		__sync_fetch_and_add(&f->instrumented, 1);
		break;
	case IOTX_SKIP_MTU:
		__sync_fetch_and_add(&f->skipped_mtu, 1);
		break;
	case IOTX_SKIP_GSO:
		__sync_fetch_and_add(&f->skipped_gso, 1);
		break;
	default:
		__sync_fetch_and_add(&f->skipped_other, 1);
		break;
	}
	return count(c);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
