// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * XDP STAMP Session-Sender receive side ("collector"). A reflector packet
 * (UDP from the STAMP port) of an active session is stamped with T4, turned
 * into a struct stamp_record in the `stamp_records` ring buffer and consumed
 * (XDP_DROP). Each side's timestamps are read in that side's format: T1 in
 * the session's (record flag STAMP_RECORD_F_NTP), T2 and T3 in the one the
 * reflector names with the Z bit of its Error Estimate (RFC 8762 §4.3.1; flag
 * STAMP_RECORD_F_REFLECTOR_NTP), so a PTP session against an NTP reflector
 * measures one-way delays right. Everything else goes on: to the next member
 * of the XDP chain on the device (xdp_chain.h; a STAMP reflector), else to the
 * stack. Each packet bumps exactly one counter; a record that does not fit
 * into the ring is counted, never lost silently.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "stamp_test_packet.h"
#include "stamp_record.h"
#include "stamp_collector.h"
#include "stamp_time.h"
#include "stamp_parse.bpf.h"
#include "xdp_chain.h"

/* STAMP UDP port the replies come from, set by the loader before load. */
const volatile __u16 stamp_port = STAMP_PORT;
/* Collect replies whose UDP checksum is the pseudo-header sum only (see
 * udp6_csum_check()); set by the loader before load (--partial-csum). */
const volatile bool accept_partial_csum = true;

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, COLL_NR_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} stamp_collector_stats SEC(".maps");

/* key: SSID (host order) */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, COLLECTOR_MAX_SESSIONS);
	__type(key, __u16);
	__type(value, struct collector_session);
} stamp_sessions SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct collector_config);
} collector_config SEC(".maps");

/* size: loader sets it before load (--ringbuf-size), default 8 MiB */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, COLLECTOR_DEFAULT_RINGBUF_SIZE);
} stamp_records SEC(".maps");

static __always_inline int count(enum collector_counter counter, int action)
{
	__u32 key = counter;
	__u64 *value = bpf_map_lookup_elem(&stamp_collector_stats, &key);

	if (value)
		*value += 1;   /* per-CPU slot: no atomic needed */
	return action;
}

/* Wire timestamp in the session's format -> TAI ns. */
static __always_inline __u64 ts_tai_ns(const struct stamp_timestamp *ts, __u64 ref_ns, bool ntp,
				       __s32 tai_utc_offset_s)
{
	if (ntp)
		return stamp_ntp_to_tai_ns(bpf_ntohl(ts->sec), bpf_ntohl(ts->frac), tai_utc_offset_s, ref_ns);
	return stamp_ptp_to_ns(bpf_ntohl(ts->sec), bpf_ntohl(ts->frac), ref_ns);
}

static __always_inline __s32 tai_utc_offset(void)
{
	__u32 zero = 0;
	struct collector_config *cfg = bpf_map_lookup_elem(&collector_config, &zero);

	return cfg ? cfg->tai_utc_offset_s : 0;
}

static __always_inline void fill_record(struct stamp_record *rec,
					const struct stamp_reflector_packet *rp,
					const struct pkt_view *v, struct xdp_md *ctx, __u64 t4,
					bool ntp)
{
	/* Z = 0 in the reflector's Error Estimate: its T2 and T3 are NTP */
	bool refl_ntp = !(bpf_ntohs(rp->err_est) & STAMP_EE_Z);
	__s32 off = (ntp || refl_ntp) ? tai_utc_offset() : 0;

	rec->t1_ns = ts_tai_ns(&rp->sender_ts, t4, ntp, off);
	rec->t2_ns = ts_tai_ns(&rp->rx_ts, t4, refl_ntp, off);
	rec->t3_ns = ts_tai_ns(&rp->ts, t4, refl_ntp, off);
	rec->t4_ns = t4;
	rec->sender_seq = bpf_ntohl(rp->sender_seq);
	rec->reflector_seq = bpf_ntohl(rp->seq);
	rec->ssid = bpf_ntohs(rp->ssid);
	rec->sender_err_est = bpf_ntohs(rp->sender_err_est);
	rec->reflector_err_est = bpf_ntohs(rp->err_est);
	rec->sender_ttl = rp->sender_ttl;
	rec->reply_hop_limit = v->ip6->hop_limit;
	rec->ifindex = ctx->ingress_ifindex;
	rec->flags = (v->srh ? STAMP_RECORD_F_SRH : 0) | (ntp ? STAMP_RECORD_F_NTP : 0) |
		     (refl_ntp ? STAMP_RECORD_F_REFLECTOR_NTP : 0);
	rec->reserved = 0;
}

/*
 * Checks the kernel's IPv6/UDP receive path would make, for a STAMP reply
 * (cheap, before the clock read): version and Payload Length (RFC 8200 §3),
 * UDP length within the IPv6 payload and a base packet, source address class
 * (RFC 4291), UDP checksum present (RFC 8200 §8.1). Returns the payload
 * length, or -1 with the packet counted and dropped.
 */
static __always_inline int check_reply(struct xdp_md *ctx, struct pkt_view *v)
{
	int payload_len;

	if (!ipv6_header_ok(ctx, v))
		return count(COLL_DROP_MALFORMED_IPV6, -1);
	payload_len = udp_payload_len(ctx, v);
	if (payload_len < STAMP_BASE_LEN ||
	    (void *)((struct stamp_reflector_packet *)(v->udp + 1) + 1) > (void *)(long)ctx->data_end)
		return count(COLL_DROP_MALFORMED_SHORT, -1);
	if (!ipv6_src_ok(v->ip6))
		return count(COLL_DROP_MALFORMED_SRC_ADDR, -1);
	if (v->udp->check == 0)
		return count(COLL_DROP_MALFORMED_UDP_CSUM, -1);
	return payload_len;
}

/* The collector's verdict on one packet (counted). */
static __always_inline int collector_verdict(struct xdp_md *ctx)
{
	struct stamp_reflector_packet *rp;
	struct collector_session *sess;
	struct stamp_record *rec;
	enum csum_verdict csum;
	__u16 csum_seed = 0;
	struct pkt_view v;
	int payload_len;
	__u32 udp_len;
	__u16 ssid;
	__u64 t4;

	if (!parse_ipv6(ctx, &v))
		return count(COLL_PASS_NOT_IPV6, XDP_PASS);

	switch (parse_srh_udp(ctx, &v)) {
	case PARSE_OK:
		break;
	case PARSE_OTHER_EXT_HEADER:
		return count(COLL_PASS_OTHER_EXT_HEADER, XDP_PASS);
	case PARSE_BAD_SRH:
		return count(COLL_DROP_MALFORMED_SRH, XDP_DROP);
	case PARSE_SRH_NOT_FINAL:
		return count(COLL_PASS_SRH_NOT_FINAL, XDP_PASS);
	case PARSE_NOT_UDP:
		return count(COLL_PASS_NOT_UDP, XDP_PASS);
	default:   /* PARSE_SHORT_UDP: the UDP header itself is cut off; the stack would drop it too */
		return count(COLL_DROP_MALFORMED_SHORT, XDP_DROP);
	}
	if (v.udp->source != bpf_htons(stamp_port))
		return count(COLL_PASS_NOT_STAMP_REPLY, XDP_PASS);

	payload_len = check_reply(ctx, &v);
	rp = (void *)(v.udp + 1);
	if (payload_len < 0 || (void *)(rp + 1) > (void *)(long)ctx->data_end)
		return XDP_DROP;   /* counted by check_reply */
	/* T4: the receive time of a well-formed STAMP reply. Taken after the
	 * cheap checks (~10 ns of parsing) so that the other traffic on this
	 * device, which may be all of a router's, never pays the ~45 ns clock read */
	t4 = bpf_ktime_get_tai_ns();

	ssid = bpf_ntohs(rp->ssid);
	sess = bpf_map_lookup_elem(&stamp_sessions, &ssid);
	if (!sess)
		return count(COLL_PASS_UNKNOWN_SESSION, XDP_PASS);
	if (!sess->active)
		return count(COLL_PASS_INACTIVE_SESSION, XDP_PASS);
	if (v.udp->dest != bpf_htons(sess->sender_port))
		return count(COLL_PASS_PORT_MISMATCH, XDP_PASS);

	/* We are the final consumer: a corrupted reply must never become a
	 * record. What we pass, the stack verifies itself. */
	udp_len = payload_len + sizeof(struct udphdr);
	if (udp_len > UDP_CSUM_MAX_LEN)
		return count(COLL_PASS_TOO_LONG_TO_VERIFY, XDP_PASS);
	csum = udp6_csum_check(ctx, &v, udp_len, accept_partial_csum, &csum_seed);
	if (csum == CSUM_BAD)
		return count(COLL_DROP_MALFORMED_UDP_CSUM, XDP_DROP);

	rec = bpf_ringbuf_reserve(&stamp_records, sizeof(*rec), 0);
	if (!rec)
		return count(COLL_DROP_RINGBUF_FULL, XDP_DROP);
	fill_record(rec, rp, &v, ctx, t4, sess->flags & COLL_SESS_F_NTP);
	bpf_ringbuf_submit(rec, 0);
	return count(csum == CSUM_PARTIAL ? COLL_COLLECTED_PARTIAL_CSUM : COLL_COLLECTED, XDP_DROP);
}

SEC("xdp")
int stamp_collector(struct xdp_md *ctx)
{
	int verdict = collector_verdict(ctx);

	/* one call site: the chain's code is inlined once, not at every XDP_PASS above */
	return verdict == XDP_PASS ? xdp_chain_next(ctx, XDP_CHAIN_STAMP_COLLECTOR) : verdict;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
