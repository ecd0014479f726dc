// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * In-line IOAM extraction at the egress edge (XDP or TC ingress, before
 * End.DT6): for every packet of a monitored flow that carries segscope's two
 * IOAM options, one struct ioam_record (schemas/c/ioam_record.h) into the
 * `ioam_records` ring buffer. It only reads: the packet always goes on
 * (XDP: xdp_chain_next, the next member of the node's XDP chain, or the
 * stack; TC: TC_ACT_UNSPEC, the next filter), End.DT6 then removes the outer
 * header with both options, and the kernel fills this node's own trace entry
 * only after this hook (the record carries the receive time instead).
 *
 * Two entries, one parser: `ioam_rx` (SEC("xdp"), native XDP behind the XDP
 * chain: a real NIC runs it on its DMA buffer) and `ioam_rx_tc` (SEC("tc"),
 * a clsact ingress classifier: on a veth, native XDP switches the device's
 * receive to NAPI and copies every skb into an xdp_buff, which costs more
 * than the program; at TC ingress the skb is read where it is). The same
 * checks, counters and records for the same packet (tests/fuzz: a
 * differential test run); the loader attaches one of the two (--hook).
 *
 *   IPv6 | HBH (IOAM trace) | [DOH, e.g. AltMark] | SRH | DOH (IOAM E2E) | inner
 *
 * The flow is the SRH SID list (key of ioam_rx_flows, as altmark_sidlist_key).
 * The checks (schemas/IOAM.md, "What the egress accepts") are the kernel's for
 * the trace option and more: every header inside the IPv6 payload, option
 * walk, alignment and lengths, segscope's Trace-Type / E2E-Type, NodeLen, the
 * flow's Namespace-ID in both options, E2E nanoseconds. A packet that fails
 * one is counted in that one stats counter and never recorded.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "ioam.h"
#include "altmark_parse.bpf.h"
#include "ioam_parse.bpf.h"
#include "xdp_chain.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, IOAM_MAX_FLOWS);
	__type(key, struct altmark_sidlist_key);
	__type(value, struct ioam_rx_flow);
} ioam_rx_flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ioam_rx_config);
} ioam_rx_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, IORX_NR_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} ioam_rx_stats SEC(".maps");

/* size set by the loader (--ringbuf-size) before load */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, IOAM_DEFAULT_RINGBUF);
} ioam_records SEC(".maps");

#define TC_ACT_UNSPEC (-1)

IOAM_DEFINE_OPTS_FIND(ioam_opts_find_xdp, struct xdp_md)
IOAM_DEFINE_OPTS_FIND(ioam_opts_find_tc, struct __sk_buff)

/*
 * The parser below takes the context as `void *` and the hook it came from as a constant: every
 * function is inlined into one entry, so the compiler keeps only that hook's branch of each of
 * these, and the verifier sees a plain xdp_md or __sk_buff program.
 */
enum rx_hook { RX_XDP, RX_TC };
#define RX_DATA(ctx, hook) \
	((hook) == RX_TC ? IOAM_DATA((struct __sk_buff *)(ctx)) : IOAM_DATA((struct xdp_md *)(ctx)))
#define RX_DATA_END(ctx, hook) \
	((hook) == RX_TC ? IOAM_DATA_END((struct __sk_buff *)(ctx)) : IOAM_DATA_END((struct xdp_md *)(ctx)))
#define RX_OPTS_FIND(ctx, hook, off, limit, type)                                       \
	((hook) == RX_TC ? ioam_opts_find_tc((struct __sk_buff *)(ctx), off, limit, type) \
			 : ioam_opts_find_xdp((struct xdp_md *)(ctx), off, limit, type))
#define RX_LOAD_BYTES(ctx, hook, off, to, len)                                    \
	((hook) == RX_TC ? bpf_skb_load_bytes((struct __sk_buff *)(ctx), off, to, len) \
			 : bpf_xdp_load_bytes((struct xdp_md *)(ctx), off, to, len))
#define RX_IFINDEX(ctx, hook) \
	((hook) == RX_TC ? ((struct __sk_buff *)(ctx))->ingress_ifindex : ((struct xdp_md *)(ctx))->ingress_ifindex)

static __always_inline void count(enum ioam_rx_counter counter)
{
	__u32 key = counter;
	__u64 *value = bpf_map_lookup_elem(&ioam_rx_stats, &key);

	if (value)
		*value += 1;   /* per-CPU slot: no atomic needed */
}

static __always_inline __u16 get16(const __u8 *p) { return (__u16)(p[0] << 8 | p[1]); }
static __always_inline __u32 get32(const __u8 *p)
{
	return (__u32)p[0] << 24 | (__u32)p[1] << 16 | (__u32)p[2] << 8 | p[3];
}

/* What the trace option says (host order). */
struct rx_trace {
	__u32 data_off;        /* frame offset of the node data list */
	__u32 trace_type;
	__u16 namespace_id;
	__u8 slots, filled, remaining_len, flags, hbh_next;
	__u32 after_hbh;       /* frame offset of the header after the HBH */
};

/* The HBH at 54: the trace option's checks (ioam_trace_option.h, decode rules). */
static __always_inline enum ioam_rx_counter read_trace(void *ctx, enum rx_hook hook, __u32 limit, struct rx_trace *t)
{
	void *data, *data_end;
	__u32 opt_off, data_len, opt_len;
	__u8 *hbh, *p;
	int r = RX_OPTS_FIND(ctx, hook, IOAM_L4_OFF, limit, IOAM_HBH_OPT_TYPE);

	switch (IOAM_WALK_OUTCOME(r)) {
	case IOAM_WALK_FOUND:
		break;
	case IOAM_WALK_NO_OPTION:
		return IORX_PASS_NO_TRACE;
	case IOAM_WALK_TRUNCATED:
		return IORX_PASS_TRUNCATED;
	default:
		return IORX_PASS_BAD_LENGTH;
	}
	data = RX_DATA(ctx, hook);
	data_end = RX_DATA_END(ctx, hook);
	hbh = data + IOAM_L4_OFF;
	if ((void *)(hbh + 2) > data_end)
		return IORX_PASS_TRUNCATED;   /* the walk checked it; for the verifier */
	t->hbh_next = hbh[0];
	t->after_hbh = IOAM_L4_OFF + ((__u32)hbh[1] + 1) * 8;
	opt_off = IOAM_L4_OFF + (IOAM_WALK_OFF(r) & 0x7ff);
	p = data + opt_off;
	if ((void *)(p + 4) > data_end)
		return IORX_PASS_TRUNCATED;
	opt_len = p[1];
	if (opt_len < 2)
		return IORX_PASS_BAD_LENGTH;
	if (p[3] != IOAM_OPTION_PREALLOC_TRACE)
		return IORX_PASS_UNKNOWN_TYPE;
	if (opt_len < IOAM_TRACE_OPT_FIXED)
		return IORX_PASS_BAD_LENGTH;
	if ((void *)(p + 2 + IOAM_TRACE_OPT_FIXED) > data_end)
		return IORX_PASS_TRUNCATED;   /* inside the header: cannot happen */
	t->namespace_id = get16(p + 4);
	t->remaining_len = p[7] & 0x7f;
	t->flags = (__u8)((p[6] & 0x7) << 1 | p[7] >> 7);
	t->trace_type = get32(p + 8) >> 8;
	data_len = opt_len - IOAM_TRACE_OPT_FIXED;
	if ((__u32)t->remaining_len * 4 > data_len)
		return IORX_PASS_BAD_LENGTH;
	if (t->trace_type != IOAM_TRACE_TYPE_SEGSCOPE)
		return IORX_PASS_UNKNOWN_TYPE;
	if ((p[6] >> 3) != IOAM_TRACE_NODE_LEN || data_len % IOAM_TRACE_ENTRY_SIZE ||
	    t->remaining_len % IOAM_TRACE_NODE_LEN || !data_len)
		return IORX_PASS_BAD_LENGTH;
	t->slots = (__u8)(data_len / IOAM_TRACE_ENTRY_SIZE);
	t->filled = t->slots - t->remaining_len / IOAM_TRACE_NODE_LEN;
	t->data_off = opt_off + 2 + IOAM_TRACE_OPT_FIXED;
	return IORX_NR_COUNTERS;
}

/* [DOH] SRH after the HBH: the SID list into key, *after_srh = the frame offset behind the SRH. */
static __always_inline enum ioam_rx_counter read_srh(void *ctx, enum rx_hook hook, __u32 limit,
						      const struct rx_trace *t, struct altmark_sidlist_key *key,
						      __u32 *after_srh, __u8 *srh_next)
{
	void *data = RX_DATA(ctx, hook), *data_end = RX_DATA_END(ctx, hook);
	__u32 off = t->after_hbh & 0xfff;
	struct ipv6_sr_hdr *srh;
	__u8 nh = t->hbh_next, *doh;

	if (nh == IPV6_NH_DSTOPTS) {
		doh = data + off;
		if ((void *)(doh + 2) > data_end || off + 2 > limit)
			return IORX_PASS_TRUNCATED;
		nh = doh[0];
		off += ((__u32)doh[1] + 1) * 8;
		if (off > limit)
			return IORX_PASS_TRUNCATED;
	}
	if (nh != IPV6_NH_ROUTING)
		return IORX_PASS_NO_SRH;
	srh = data + (off & IOAM_OFF_MASK);
	if ((void *)srh + 8 > data_end || off + 8 > limit)
		return IORX_PASS_TRUNCATED;
	if (srh->type != IPV6_SRH_TYPE)
		return IORX_PASS_NO_SRH;
	if (off + ((__u32)srh->hdrlen + 1) * 8 > limit)
		return IORX_PASS_TRUNCATED;
	switch (am_srh_key(srh, data_end, key)) {
	case AM_SRH_OK:
		break;
	case AM_SRH_TOO_MANY_SIDS:
		return IORX_PASS_TOO_MANY_SIDS;
	default:
		return IORX_PASS_MALFORMED_SRH;
	}
	*srh_next = srh->nexthdr;
	*after_srh = off + ((__u32)srh->hdrlen + 1) * 8;
	return IORX_NR_COUNTERS;
}

/* What the E2E option says (host order). */
struct rx_e2e {
	__u64 seq;
	__u32 ts_sec, ts_nsec;
};

/* The DOH behind the SRH: the E2E option's checks (ioam_e2e_option.h, decode rules). */
static __always_inline enum ioam_rx_counter read_e2e(void *ctx, enum rx_hook hook, __u32 limit, __u32 off,
						      __u16 namespace_id, struct rx_e2e *e)
{
	int r = RX_OPTS_FIND(ctx, hook, off, limit, IOAM_DOH_OPT_TYPE);
	void *data, *data_end;
	__u8 *p;

	switch (IOAM_WALK_OUTCOME(r)) {
	case IOAM_WALK_FOUND:
		break;
	case IOAM_WALK_NO_OPTION:
		return IORX_PASS_NO_E2E;
	case IOAM_WALK_TRUNCATED:
		return IORX_PASS_TRUNCATED;
	default:
		return IORX_PASS_BAD_LENGTH;
	}
	data = RX_DATA(ctx, hook);
	data_end = RX_DATA_END(ctx, hook);
	p = data + ((off + IOAM_WALK_OFF(r)) & IOAM_OFF_MASK);
	if ((void *)(p + 4) > data_end)
		return IORX_PASS_TRUNCATED;
	if (p[1] < 6)
		return IORX_PASS_BAD_LENGTH;
	if ((void *)(p + 8) > data_end)
		return IORX_PASS_TRUNCATED;
	if (p[3] != IOAM_OPTION_E2E || get16(p + 6) != IOAM_E2E_TYPE_SEGSCOPE)
		return IORX_PASS_UNKNOWN_TYPE;
	if (p[1] != IOAM_E2E_OPT_DATA_LEN)
		return IORX_PASS_BAD_LENGTH;
	if ((void *)(p + 2 + IOAM_E2E_OPT_DATA_LEN) > data_end)
		return IORX_PASS_TRUNCATED;
	if (get16(p + 4) != namespace_id)
		return IORX_PASS_UNKNOWN_NAMESPACE;
	e->seq = (__u64)get32(p + 8) << 32 | get32(p + 12);
	e->ts_sec = get32(p + 16);
	e->ts_nsec = get32(p + 20);
	if (e->ts_nsec >= IOAM_E2E_NS_PER_SEC)
		return IORX_PASS_BAD_TIMESTAMP;
	return IORX_NR_COUNTERS;
}

/* One record into the ring buffer; the counter it lands in. */
static __always_inline enum ioam_rx_counter record(void *ctx, enum rx_hook hook, struct ioam_rx_flow *flow,
						    const struct rx_trace *t, const struct rx_e2e *e, __u8 hop_limit)
{
	__u64 rx_tai_ns = bpf_ktime_get_tai_ns();
	struct ioam_rx_config *cfg;
	struct ioam_record *rec;
	__u32 zero = 0, n, len;
	bool truncated = false;

	rec = bpf_ringbuf_reserve(&ioam_records, sizeof(*rec), 0);
	if (!rec) {
		__sync_fetch_and_add(&flow->ringbuf_full, 1);
		return IORX_PASS_RINGBUF_FULL;
	}
	__builtin_memset(rec, 0, sizeof(*rec));
	cfg = bpf_map_lookup_elem(&ioam_rx_config, &zero);
	rec->rx_tai_ns = rx_tai_ns;
	rec->tx_tai_ns = (__u64)e->ts_sec * IOAM_E2E_NS_PER_SEC + e->ts_nsec;
	rec->seq = e->seq;
	rec->flow_id = flow->flow_id;
	rec->ifindex = RX_IFINDEX(ctx, hook);
	rec->node_id = cfg ? cfg->node_id : 0;
	rec->tai_utc_offset_s = cfg ? cfg->tai_utc_offset_s : 0;
	rec->namespace_id = t->namespace_id;
	rec->slots = t->slots;
	rec->filled = t->filled;
	rec->trace_type = t->trace_type;
	rec->trace_flags = t->flags;
	rec->hop_limit = hop_limit;
	if (t->flags & IOAM_TRACE_FLAG_OVERFLOW)
		rec->flags |= IOAM_RECORD_F_OVERFLOW;
	n = t->filled;
	if (n > IOAM_RECORD_MAX_NODES) {
		n = IOAM_RECORD_MAX_NODES;   /* the newest ones: the oldest are not copied */
		rec->flags |= IOAM_RECORD_F_TRUNCATED;
		truncated = true;
	}
	/* the filled entries start RemainingLen * 4 bytes into the data list */
	len = n * IOAM_TRACE_ENTRY_SIZE;
	barrier_var(len);   /* the bounds below on len itself: clang would test n, which the verifier does not link */
	if (len >= IOAM_TRACE_ENTRY_SIZE && len <= sizeof(rec->entries) &&
	    RX_LOAD_BYTES(ctx, hook, t->data_off + (__u32)t->remaining_len * 4, rec->entries, len)) {
		bpf_ringbuf_discard(rec, 0);
		return IORX_PASS_TRUNCATED;   /* inside the checked header: cannot happen */
	}
	bpf_ringbuf_submit(rec, 0);
	__sync_fetch_and_add(&flow->records, 1);
	return truncated ? IORX_RECORDED_TRUNCATED : IORX_RECORDED;
}

static __always_inline enum ioam_rx_counter classify(void *ctx, enum rx_hook hook)
{
	void *data = RX_DATA(ctx, hook), *data_end = RX_DATA_END(ctx, hook);
	struct ipv6hdr *ip6 = data + IOAM_L3_OFF;
	struct altmark_sidlist_key key;
	struct ioam_rx_flow *flow;
	enum ioam_rx_counter c;
	struct rx_trace t = {};
	struct rx_e2e e = {};
	__u32 limit, after_srh = 0;
	__u8 srh_next = 0, hop_limit;

	if ((void *)(ip6 + 1) > data_end || ((struct ethhdr *)data)->h_proto != IOAM_ETH_P_IPV6_BE)
		return IORX_PASS_NOT_IPV6;
	if (ip6->nexthdr != IPV6_NH_HOPOPTS)
		return IORX_PASS_NO_HBH;
	hop_limit = ip6->hop_limit;
	/* headers past the IPv6 payload are not part of the packet (trailer bytes are allowed) */
	limit = IOAM_L4_OFF + bpf_ntohs(ip6->payload_len);
	if (limit > (__u32)(data_end - data))
		limit = data_end - data;
	c = read_trace(ctx, hook, limit, &t);
	if (c != IORX_NR_COUNTERS)
		return c;
	c = read_srh(ctx, hook, limit, &t, &key, &after_srh, &srh_next);
	if (c != IORX_NR_COUNTERS)
		return c;
	flow = bpf_map_lookup_elem(&ioam_rx_flows, &key);
	if (!flow)
		return IORX_PASS_UNMONITORED;
	if (t.namespace_id != flow->namespace_id)
		return IORX_PASS_UNKNOWN_NAMESPACE;
	if (srh_next != IPV6_NH_DSTOPTS)
		return IORX_PASS_NO_E2E;
	c = read_e2e(ctx, hook, limit, after_srh, flow->namespace_id, &e);
	if (c != IORX_NR_COUNTERS)
		return c;
	return record(ctx, hook, flow, &t, &e, hop_limit);
}

SEC("xdp")
int ioam_rx(struct xdp_md *ctx)
{
	count(classify(ctx, RX_XDP));
	return xdp_chain_next(ctx, XDP_CHAIN_IOAM_RX);
}

/*
 * The part of the skb the parser reads made linear, as XDP sees the whole frame: the Ethernet and
 * IPv6 headers, and for a packet with a Hop-by-Hop header the IPv6 payload (its headers end there;
 * the parser reads nothing past it). Only what is not linear yet is pulled: an skb that is linear,
 * the usual case, is not touched (bpf_skb_pull_data would unshare a cloned one). A failed pull
 * leaves the packet shorter to the parser: counted as truncated, as XDP counts a short frame.
 */
static __always_inline void pull_headers(struct __sk_buff *skb)
{
	void *data = IOAM_DATA(skb), *data_end = IOAM_DATA_END(skb);
	__u32 linear = data_end - data, want = IOAM_L4_OFF;
	struct ipv6hdr *ip6;

	if (linear < want && skb->len > linear) {
		bpf_skb_pull_data(skb, skb->len < want ? skb->len : want);
		data = IOAM_DATA(skb);
		data_end = IOAM_DATA_END(skb);
		linear = data_end - data;
	}
	ip6 = data + IOAM_L3_OFF;
	if ((void *)(ip6 + 1) > data_end || ((struct ethhdr *)data)->h_proto != IOAM_ETH_P_IPV6_BE ||
	    ip6->nexthdr != IPV6_NH_HOPOPTS)
		return;   /* classify stops at the IPv6 header */
	want = IOAM_L4_OFF + bpf_ntohs(ip6->payload_len);
	if (want > skb->len)
		want = skb->len;
	if (linear < want)
		bpf_skb_pull_data(skb, want);
}

SEC("tc")
int ioam_rx_tc(struct __sk_buff *skb)
{
	pull_headers(skb);
	count(classify(skb, RX_TC));
	return TC_ACT_UNSPEC;   /* never the verdict: the next filter runs, or the stack */
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
