// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * In-line IOAM on the route: an `encap bpf in` program on the monitored SRv6 policy's route
 * (lwt_in: forwarded packets, before the forwarding path). It takes the place of the route's
 * `encap seg6 mode encap segs ...`, so the TC egress hook (clsact + ioam_tx) is not needed on the
 * forwarding path:
 *
 *   - every packet not instrumented gets the kernel's own seg6 encapsulation:
 *     bpf_lwt_push_encap(BPF_LWT_ENCAP_SEG6) with the route's SRH, return BPF_OK (the kernel has
 *     looked up the first SID's route; forwarding goes on as with the seg6 route);
 *   - a sampled packet gets a header built here, pushed with bpf_lwt_push_encap(BPF_LWT_ENCAP_IP)
 *     and re-routed on its outer destination (BPF_LWT_REROUTE):
 *       IPv6 | HBH: IOAM Pre-allocated Trace (our entry filled) | SRH | DOH: IOAM E2E | packet
 *     with the fields seg6 encap would write (traffic class, flow label and hop limit of the inner
 *     packet, the route's tunnel source) and the option bytes ioam_tx writes (schemas/IOAM.md).
 *
 * Packets the node sends itself never pass lwt_in. The same program's second entry, ioam_lwt_local,
 * runs on an `encap bpf xmit` copy of the route that only locally sent packets find (table 3356, rule
 * `iif lo`; ioam_lwt.h). lwt_xmit cannot call the kernel's seg6 encap, so there every packet not
 * instrumented is marked IOAM_LWT_SEG6_MARK and re-routed to the seg6 route's copy (table 3355):
 * the kernel's own encapsulation, GSO included. A sampled one gets the header built here, as above.
 * Both entries share the flows: forwarded and locally sent packets of a flow take one series of
 * sequence numbers.
 *
 * Sampling, the 5-tuple filter and the per-flow counters are ioam_tx's (struct ioam_tx_flow,
 * atomic adds: the sampling position and the sequence numbers are global across CPUs). A sampled
 * packet that cannot be instrumented (GSO, header > 256 bytes, over the route MTU, push failed)
 * gets the kernel's encapsulation and is counted; the sample does not move to the next packet.
 * Nothing is fragmented; a packet is dropped only where the seg6 route would drop it (counted).
 * lwt_in cannot write packet bytes: the packet itself is only read.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "ioam_lwt.h"
#include "ioam_sample.bpf.h"

#define ETH_P_IPV6_BE bpf_htons(0x86DD)

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, IOAM_LWT_MAX_ROUTES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct ioam_lwt_route_key);
	__type(value, struct ioam_lwt_route);
} ioam_lwt_routes SEC(".maps");

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
	__uint(max_entries, IOLWT_NR_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} ioam_lwt_stats SEC(".maps");

/* the header of a sampled packet is built here (per CPU: one packet at a time per CPU) */
struct scratch {
	__u8 buf[IOAM_LWT_SCRATCH];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} ioam_lwt_scratch SEC(".maps");

static __always_inline void count(enum ioam_lwt_counter counter)
{
	__u32 key = counter;
	__u64 *value = bpf_map_lookup_elem(&ioam_lwt_stats, &key);

	if (value)
		*value += 1;   /* per-CPU slot: no atomic needed */
}

/* The flow's filter on the packet (its IPv6 header; TCP/UDP ports right after it). */
static __always_inline bool filter_match(struct __sk_buff *skb, const struct ipv6hdr *ip6, const struct ioam_match *m)
{
	__u8 ports[4];

	if (!m->fields)
		return true;
	if (!ioam_match_addrs(m, ip6))
		return false;
	if (ioam_match_wants_ports(m)) {
		if (!ioam_has_ports(ip6->nexthdr))
			return false;
		/* the ports may lie outside the linear part: copied, not read in place */
		if (bpf_skb_load_bytes(skb, sizeof(*ip6), ports, sizeof(ports)))
			return false;
		return ioam_match_ports(m, ports);
	}
	return true;
}

static __always_inline __u16 if_id(__u32 ifindex)
{
	__u16 *id = ifindex ? bpf_map_lookup_elem(&ioam_if_ids, &ifindex) : NULL;

	return id ? *id : IOAM_IF_ID_UNAVAILABLE;
}

/* The HBH with the trace option at b (hbh_len bytes): empty slots, our entry in the last one. */
static __always_inline void write_trace(__u8 *b, const struct ioam_tx_flow *f, __u32 slots, __u8 hop_limit,
					 __u16 in_if, __u16 out_if, __u64 utc_ns)
{
	__u8 *entry;

	b[0] = IPV6_NH_ROUTING;
	b[1] = (__u8)(IOAM_TRACE_HBH_LEN(slots) / 8 - 1);
	b[2] = IPV6_OPT_PADN;
	b[3] = 0;
	b[4] = IOAM_HBH_OPT_TYPE;
	b[5] = (__u8)(IOAM_TRACE_OPT_FIXED + IOAM_TRACE_ENTRY_SIZE * slots);
	b[6] = 0;
	b[7] = IOAM_OPTION_PREALLOC_TRACE;
	put16(b + 8, f->namespace_id);
	b[10] = IOAM_TRACE_NODE_LEN << 3;                      /* NodeLen, flags 0 */
	b[11] = (__u8)((slots - 1) * IOAM_TRACE_NODE_LEN);     /* RemainingLen: our entry is filled */
	b[12] = (__u8)(IOAM_TRACE_TYPE_SEGSCOPE >> 16);
	b[13] = (__u8)(IOAM_TRACE_TYPE_SEGSCOPE >> 8);
	b[14] = (__u8)IOAM_TRACE_TYPE_SEGSCOPE;
	b[15] = 0;
	for (__u32 i = 0; i < IOAM_TRACE_MAX_SLOTS - 1; i++) {
		__u64 *slot = (__u64 *)(b + IOAM_TRACE_DATA_OFF + i * IOAM_TRACE_ENTRY_SIZE);

		if (i + 1 >= slots)
			break;
		slot[0] = 0;
		slot[1] = 0;
	}
	entry = b + IOAM_TRACE_DATA_OFF + ((slots - 1) & 0xf) * IOAM_TRACE_ENTRY_SIZE;
	put32(entry, (__u32)hop_limit << 24 | (f->node_id & IOAM_NODE_ID_MAX));
	put16(entry + 4, in_if);
	put16(entry + 6, out_if);
	put32(entry + 8, (__u32)(utc_ns / IOAM_E2E_NS_PER_SEC));
	put32(entry + 12, (__u32)(utc_ns % IOAM_E2E_NS_PER_SEC / 1000));
}

/* The 32-byte DOH with the E2E option at b (schemas/IOAM.md). */
static __always_inline void write_e2e(__u8 *b, __u16 namespace_id, __u64 seq, __u64 tai_ns)
{
	b[0] = IPV6_NH_IPV6;
	b[1] = IOAM_E2E_DOH_LEN / 8 - 1;
	b[2] = IPV6_OPT_PADN;
	b[3] = 0;
	b[4] = IOAM_DOH_OPT_TYPE;
	b[5] = IOAM_E2E_OPT_DATA_LEN;
	b[6] = 0;
	b[7] = IOAM_OPTION_E2E;
	put16(b + 8, namespace_id);
	put16(b + 10, IOAM_E2E_TYPE_SEGSCOPE);
	put32(b + 12, (__u32)(seq >> 32));
	put32(b + 16, (__u32)seq);
	put32(b + 20, (__u32)(tai_ns / IOAM_E2E_NS_PER_SEC));   /* PTPv2 truncated: TAI s, ns */
	put32(b + 24, (__u32)(tai_ns % IOAM_E2E_NS_PER_SEC));
	b[28] = IPV6_OPT_PADN;
	b[29] = 2;
	b[30] = 0;
	b[31] = 0;
}

/*
 * The first 8 bytes of the packet's IPv6 header, copied before any helper may move the packet (a
 * failed push leaves the verifier no valid packet pointer): version, traffic class, flow label,
 * payload length, next header, hop limit.
 */
struct inner_head {
	__u8 vtf[4];
	__u16 payload_len;
	__u8 nexthdr;
	__u8 hop_limit;
};

/* The outer IPv6 header seg6_do_srh_encap writes for an IPv6 packet; false if the SID count is off. */
static __always_inline bool write_outer(struct ipv6hdr *outer, const struct inner_head *ip6,
					const struct ioam_lwt_route *rt, __u32 payload_len, __u8 nexthdr)
{
	__u32 first_sid = rt->sids.nsids - 1;

	asm volatile("" : "+r"(first_sid));   /* the verifier sees the bound checked here, not an earlier copy */
	if (first_sid >= ALTMARK_MAX_SIDS)
		return false;
	__builtin_memcpy(outer, ip6, 4);   /* version, traffic class, flow label */
	outer->payload_len = bpf_htons(payload_len);
	outer->nexthdr = nexthdr;
	outer->hop_limit = ip6->hop_limit;
	__builtin_memcpy(&outer->saddr, rt->tunsrc, 16);
	__builtin_memcpy(&outer->daddr, &rt->sids.sids[first_sid], 16);   /* the first SID: the last entry */
	return true;
}

static __always_inline void copy_srh(__u8 *to, const struct ioam_lwt_route *rt, __u32 srh_len)
{
	for (__u32 i = 0; i < IOAM_LWT_SRH_MAX / 8; i++) {
		if (i * 8 >= srh_len)
			break;
		*(__u64 *)(to + i * 8) = *(__u64 *)(rt->srh + i * 8);
	}
}

/*
 * Build IPv6 | HBH | SRH | E2E DOH for this packet in the per-CPU scratch buffer and push it. The
 * checks that can fail run before the sequence number is taken: a sample not instrumented uses
 * none. The outer IPv6 header is what seg6_do_srh_encap writes for an IPv6 packet: version,
 * traffic class and flow label of the inner header, its hop limit, the tunnel source, the first
 * SID as destination (the SRH's last entry).
 */
static __always_inline enum ioam_lwt_counter instrument(struct __sk_buff *skb, const struct inner_head *ip6,
							 const struct ioam_lwt_route *rt, struct ioam_tx_flow *f,
							 bool local)
{
	__u32 slots = (rt->trace_nodes ? rt->trace_nodes : f->trace_nodes) & 0xf, zero = 0, nsids = rt->sids.nsids;
	__u32 hbh_len = IOAM_TRACE_HBH_LEN(slots), srh_len = rt->srh_len;
	__u32 total = sizeof(struct ipv6hdr) + hbh_len + srh_len + IOAM_E2E_DOH_LEN;
	struct ioam_tx_config *cfg = bpf_map_lookup_elem(&ioam_tx_config, &zero);
	struct scratch *s = bpf_map_lookup_elem(&ioam_lwt_scratch, &zero);
	__u64 tai_ns, utc_ns, seq;
	__u8 *srh;

	if (skb->gso_size)
		return IOLWT_SKIP_GSO;
	if (total > IOAM_LWT_MAX_HEADER || srh_len > IOAM_LWT_SRH_MAX || nsids < 1 || nsids > ALTMARK_MAX_SIDS)
		return IOLWT_SKIP_TOO_LONG;
	if (skb->len + total > rt->mtu)
		return IOLWT_SKIP_MTU;
	if (!s)
		return IOLWT_SKIP_PUSH_FAILED;

	if (!write_outer((struct ipv6hdr *)s->buf, ip6, rt, skb->len + total - sizeof(struct ipv6hdr),
			 IPV6_NH_HOPOPTS))
		return IOLWT_SKIP_TOO_LONG;
	srh = s->buf + sizeof(struct ipv6hdr) + (hbh_len & 0xff);
	copy_srh(srh, rt, srh_len);
	srh[0] = IPV6_NH_DSTOPTS;

	tai_ns = bpf_ktime_get_tai_ns();
	utc_ns = tai_ns - (cfg ? (__s64)cfg->tai_utc_offset_s * IOAM_E2E_NS_PER_SEC : 0);
	/*
	 * our entry: the hop limit as the packet leaves (forwarding decrements it after lwt_in; a packet
	 * sent here is not forwarded) and the interface it came in on (none for a packet sent here)
	 */
	write_trace(s->buf + sizeof(struct ipv6hdr), f, slots, local ? ip6->hop_limit : ip6->hop_limit - 1,
		    local ? IOAM_IF_ID_UNAVAILABLE : if_id(skb->ingress_ifindex), if_id(rt->oif), utc_ns);
	seq = __sync_fetch_and_add(&f->next_seq, 1);
	write_e2e(srh + (srh_len & 0x7f), f->namespace_id, seq, tai_ns);
	if (bpf_lwt_push_encap(skb, BPF_LWT_ENCAP_IP, s->buf, total & 0x1ff)) {
		/* the number is taken: the egress sees a gap, as for a lost packet; counted here */
		return IOLWT_SKIP_PUSH_FAILED;
	}
	return IOLWT_INSTRUMENTED;
}

/*
 * A packet not instrumented: with a fixed next hop the outer IPv6 + SRH built here, pushed as IP
 * encap (forwarded by this route); otherwise the kernel's seg6 encapsulation with the route's SRH
 * (BPF_OK, or BPF_DROP counted). A GSO packet can take neither (the IP-encap helper segments only TCP
 * under GRE/UDP, the seg6 one leaves its GSO type untunnelled), and a packet sent here (lwt_xmit) cannot
 * reach the seg6 one: marked and re-routed to the seg6 route's copy in table 3355 (IOAM_LWT_SEG6_MARK).
 */
static __always_inline int kernel_encap(struct __sk_buff *skb, const struct inner_head *ip6,
					const struct ioam_lwt_route *rt, enum ioam_lwt_counter c, bool local)
{
	__u32 len = rt->srh_len, zero = 0;
	struct scratch *s;

	if (len < 24 || len > IOAM_LWT_SRH_MAX)
		goto failed;
	if (skb->gso_size || local) {
		/* the seg6 route's copy in table 3355, by the mark's rule (ioam_lwt.h) */
		skb->mark = IOAM_LWT_SEG6_MARK;
		count(c);
		return BPF_LWT_REROUTE;
	}
	if (rt->flags & IOAM_LWT_FIXED_NEXT_HOP) {
		s = bpf_map_lookup_elem(&ioam_lwt_scratch, &zero);
		if (!s || !write_outer((struct ipv6hdr *)s->buf, ip6, rt, skb->len + len, IPV6_NH_ROUTING))
			goto failed;
		copy_srh(s->buf + sizeof(struct ipv6hdr), rt, len);
		if (bpf_lwt_push_encap(skb, BPF_LWT_ENCAP_IP, s->buf, (sizeof(struct ipv6hdr) + len) & 0xff))
			goto failed;
	} else if (bpf_lwt_push_encap(skb, BPF_LWT_ENCAP_SEG6, (void *)rt->srh, len)) {
		goto failed;
	}
	count(c);
	return BPF_OK;
failed:
	count(IOLWT_DROP_ENCAP_FAILED);
	return BPF_DROP;
}

static __always_inline void flow_counted(struct ioam_tx_flow *f, enum ioam_lwt_counter c)
{
	__sync_fetch_and_add(&f->sampled, 1);
	switch (c) {
	case IOLWT_INSTRUMENTED:
		__sync_fetch_and_add(&f->instrumented, 1);
		break;
	case IOLWT_SKIP_MTU:
		__sync_fetch_and_add(&f->skipped_mtu, 1);
		break;
	case IOLWT_SKIP_GSO:
		__sync_fetch_and_add(&f->skipped_gso, 1);
		break;
	default:
		__sync_fetch_and_add(&f->skipped_other, 1);
		break;
	}
}

/*
 * One packet on the route: local is false for lwt_in (forwarded packets), true for lwt_xmit (packets
 * this node sends, on the copy in table 3356).
 */
static __always_inline int route_packet(struct __sk_buff *skb, bool local)
{
	void *data = (void *)(long)skb->data, *data_end = (void *)(long)skb->data_end;
	struct ipv6hdr *ip6 = data;
	struct ioam_lwt_route_key rkey = {.prefixlen = 128};
	struct inner_head head;
	struct ioam_lwt_route *rt;
	struct ioam_tx_flow *f;
	enum ioam_lwt_counter c;

	if ((void *)(ip6 + 1) > data_end || skb->protocol != ETH_P_IPV6_BE) {
		count(IOLWT_DROP_NOT_IPV6);
		return BPF_DROP;
	}
	__builtin_memcpy(rkey.addr, &ip6->daddr, 16);
	__builtin_memcpy(&head, ip6, sizeof(head));
	rt = bpf_map_lookup_elem(&ioam_lwt_routes, &rkey);
	if (!rt) {
		count(IOLWT_DROP_NO_ROUTE);
		return BPF_DROP;
	}
	if (rt->flags & IOAM_LWT_PAUSED)
		return kernel_encap(skb, &head, rt, IOLWT_PASS_UNMONITORED, local);
	f = bpf_map_lookup_elem(&ioam_tx_flows, &rt->flow);
	if (!f)
		return kernel_encap(skb, &head, rt, IOLWT_PASS_UNMONITORED, local);
	if (f->trace_nodes < 1 || f->trace_nodes > IOAM_TRACE_MAX_SLOTS || rt->trace_nodes > IOAM_TRACE_MAX_SLOTS ||
	    (f->sample_mode == IOAM_SAMPLE_EVERY ? !f->sample_every : f->sample_mode != IOAM_SAMPLE_INTERVAL))
		return kernel_encap(skb, &head, rt, IOLWT_PASS_BAD_FLOW, local);
	if (!filter_match(skb, ip6, &f->match))
		return kernel_encap(skb, &head, rt, IOLWT_PASS_FILTERED, local);
	if (!ioam_sampled(f))
		return kernel_encap(skb, &head, rt, IOLWT_PASS_NOT_SAMPLED, local);
	c = instrument(skb, &head, rt, f, local);
	flow_counted(f, c);
	if (c != IOLWT_INSTRUMENTED)
		return kernel_encap(skb, &head, rt, c, local);
	count(c);
	/*
	 * the built header's first SID: this route's fixed next hop, else a lookup of it (always for a
	 * packet sent here: the copy in table 3356 has no next hop of its own)
	 */
	return rt->flags & IOAM_LWT_FIXED_NEXT_HOP && !local ? BPF_OK : BPF_LWT_REROUTE;
}

SEC("lwt_in")
int ioam_lwt(struct __sk_buff *skb)
{
	return route_packet(skb, false);
}

SEC("lwt_xmit")
int ioam_lwt_local(struct __sk_buff *skb)
{
	return route_packet(skb, true);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
