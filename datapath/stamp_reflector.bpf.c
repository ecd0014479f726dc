// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * XDP STAMP Session-Reflector, unauthenticated (RFC 8762 §4.3 with the RFC
 * 8972 SSID), stateless or stateful and with PTPv2 or NTP timestamps per
 * session. A test packet to one of our addresses, on the STAMP port, of a
 * configured session, is turned into the reflector packet in place and sent
 * back with XDP_TX, optionally along a return SID list (new SRH). What XDP
 * does not do is left to the user-space reflector (XDP_PASS): unknown
 * sessions, authenticated sessions, and test packets with TLVs unless the
 * session echoes them. Malformed STAMP for us is dropped. Each packet bumps
 * exactly one counter.
 *
 * It runs as the last member of the XDP chain (xdp_chain.h): what it passes
 * goes on to the next member of the device if a role is ever added after it,
 * else to the stack.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "stamp_test_packet.h"
#include "stamp_reflector.h"
#include "stamp_time.h"
#include "stamp_parse.bpf.h"
#include "xdp_chain.h"

/* STAMP UDP port, set by the loader before load (--port). */
const volatile __u16 stamp_port = STAMP_PORT;
/* Answer test packets whose UDP checksum is the pseudo-header sum only (see
 * udp6_csum_check()); set by the loader before load (--partial-csum). */
const volatile bool accept_partial_csum = true;

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, REFL_NR_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} stamp_reflector_stats SEC(".maps");

/* IPv6 addresses this reflector answers for (one entry, see reflector_address_set). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct reflector_address_set);
} reflector_addresses SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, REFLECTOR_MAX_SESSIONS);
	__type(key, struct reflector_session_key);
	__type(value, struct reflector_session);
} reflector_sessions SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct reflector_config);
} reflector_config SEC(".maps");

static __always_inline int count(enum reflector_counter counter, int action)
{
	__u32 key = counter;
	__u64 *value = bpf_map_lookup_elem(&stamp_reflector_stats, &key);

	if (value)
		*value += 1;   /* per-CPU slot: no atomic needed */
	return action;
}

/* What a reply needs from the session and the run-time config. */
struct reply_params {
	__u32 seq;                /* reflector Sequence Number, host order */
	__u16 err_est;            /* host order, Z already matching the format */
	bool ntp;
	__s32 tai_utc_offset_s;
};

static __always_inline void get_reply_params(struct reply_params *p, struct reflector_session *sess,
					     __u32 sender_seq)
{
	__u32 zero = 0;
	struct reflector_config *cfg = bpf_map_lookup_elem(&reflector_config, &zero);
	__u16 ee = cfg ? cfg->err_est : 0;
	__u32 flags = sess->flags;

	p->ntp = flags & REFL_SESS_F_NTP;
	p->tai_utc_offset_s = cfg ? cfg->tai_utc_offset_s : 0;
	/* Z says which format our timestamps are in: 1 PTPv2, 0 NTP */
	p->err_est = p->ntp ? (ee & ~STAMP_EE_Z) : (ee | STAMP_EE_Z);
	/* RFC 8762 §4.3: stateful = own counter from 0 (atomic: other CPUs reflect
	 * the same session); stateless = the sender's number */
	p->seq = (flags & REFL_SESS_F_STATEFUL) ? __sync_fetch_and_add(&sess->next_seq, 1) : sender_seq;
}

/*
 * 16-byte copy as four 32-bit moves. The u8[16] and packed layouts would make
 * clang copy byte by byte; x86 and the verifier (no strict alignment) take
 * unaligned 32-bit packet accesses.
 */
static __always_inline void copy16(void *dst, const void *src)
{
	__u32 *d = dst;
	const __u32 *s = src;

	d[0] = s[0];
	d[1] = s[1];
	d[2] = s[2];
	d[3] = s[3];
}

/* Is dst (in the packet) one of reflector_addresses? */
static __always_inline bool is_local_address(const struct in6_addr *dst)
{
	const __u32 *d = (const void *)dst;
	__u32 d0 = d[0], d1 = d[1], d2 = d[2], d3 = d[3];
	struct reflector_address_set *set;
	__u32 zero = 0, n;

	set = bpf_map_lookup_elem(&reflector_addresses, &zero);
	if (!set)
		return false;
	n = set->n;
#pragma clang loop unroll(disable)
	for (__u32 i = 0; i < REFLECTOR_MAX_ADDRESSES; i++) {
		const __u32 *a = (const void *)set->addrs[i];

		if (i >= n)
			break;
		if (!((a[0] ^ d0) | (a[1] ^ d1) | (a[2] ^ d2) | (a[3] ^ d3)))
			return true;
	}
	return false;
}

static __always_inline struct reflector_session *
lookup_session(const struct in6_addr *sender, __u16 ssid)
{
	struct reflector_session_key key = {};
	struct reflector_session *sess;

	copy16(key.sender, sender);
	key.ssid = ssid;
	sess = bpf_map_lookup_elem(&reflector_sessions, &key);
	if (sess)
		return sess;
	__builtin_memset(key.sender, 0, sizeof(key.sender));   /* {::, ssid}: any sender */
	return bpf_map_lookup_elem(&reflector_sessions, &key);
}

/*
 * Write the new SRH right after the IPv6 header: segments[0] = the sender
 * (final destination), segments[1..n] = return SIDs in reverse visiting
 * order, so segments[n] (= return_sids[0]) is visited first.
 */
static __always_inline int write_srh(struct xdp_md *ctx, __u32 n,
				     const struct reflector_session *sess,
				     const struct in6_addr *sender)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ipv6_sr_hdr *srh = data + L4_OFF_NO_SRH;
	__u8 *segs = (void *)(srh + 1);

	if ((void *)(srh + 1) + sizeof(struct in6_addr) > data_end)
		return -1;
	srh->nexthdr = NEXTHDR_UDP;
	srh->hdrlen = 2 * (n + 1);
	srh->type = SRH_ROUTING_TYPE;
	srh->segments_left = n;
	srh->first_segment = n;
	srh->flags = 0;
	srh->tag = 0;
	copy16(segs, sender);

	for (__u32 j = 1; j <= REFLECTOR_MAX_RETURN_SIDS; j++) {
		__u32 idx = n - j;
		__u8 *seg = segs + j * sizeof(struct in6_addr);

		if (j > n || idx >= REFLECTOR_MAX_RETURN_SIDS)
			break;
		if ((void *)(seg + sizeof(struct in6_addr)) > data_end)
			return -1;
		copy16(seg, sess->return_sids[idx]);
	}
	return 0;
}

/* STAMP base packets as eleven 32-bit words in wire order (see stamp_test_packet.h). */
#define STAMP_WORDS (STAMP_BASE_LEN / 4)

/* PTPv2 truncated timestamp as two big-endian words; same result as stamp_ptp_from_ns(). */
static __always_inline void ptp_words(__u32 *w, __u64 ns)
{
	__u64 sec = ns / STAMP_NS_PER_SEC;

	w[0] = bpf_htonl((__u32)sec);
	w[1] = bpf_htonl((__u32)(ns - sec * STAMP_NS_PER_SEC));
}

/* Timestamp words of a TAI time in the session's format. */
static __always_inline void ts_words(__u32 *w, __u64 tai_ns, const struct reply_params *p)
{
	__u32 sec, frac;

	if (!p->ntp) {
		ptp_words(w, tai_ns);
		return;
	}
	stamp_ntp_from_tai_ns(tai_ns, p->tai_utc_offset_s, &sec, &frac);
	w[0] = bpf_htonl(sec);
	w[1] = bpf_htonl(frac);
}

/*
 * RFC 8762 §4.3.1 reflector packet from the sender packet `in`. Words:
 *  0 seq | 1-2 T3 | 3 err_est,ssid | 4-5 T2 | 6 sender seq | 7-8 sender ts |
 *  9 sender err_est,MBZ | 10 Ses-Sender TTL,MBZ(3)
 * Reflector seq from p (sender seq when stateless).
 */
static __always_inline void build_reply(__u32 *out, const __u32 *in, __u64 t2, __u8 ttl,
					const struct reply_params *p)
{
	__u32 in_w3 = bpf_ntohl(in[3]);          /* sender err_est << 16 | ssid */

	out[0] = bpf_htonl(p->seq);
	out[3] = bpf_htonl((__u32)p->err_est << 16 | (in_w3 & 0xffff));
	ts_words(&out[4], t2, p);
	out[6] = in[0];
	out[7] = in[1];
	out[8] = in[2];
	out[9] = bpf_htonl(in_w3 & 0xffff0000);
	out[10] = bpf_htonl((__u32)ttl << 24);
	ts_words(&out[1], bpf_ktime_get_tai_ns(), p);   /* T3: last, right before it is written */
}

/*
 * What bpf_csum_diff(old, 44, new, 44, seed) returns, computed inline: the
 * ones'-complement sum of seed + ~old words + new words (carries folded by
 * csum_fold_invert). Eleven words do not overflow 64 bits.
 */
static __always_inline __u64 csum_words_diff(const __u32 *old, const __u32 *new, __u32 seed)
{
	__u64 sum = seed;

	for (int i = 0; i < STAMP_WORDS; i++)
		sum += (__u32)~old[i] + (__u64)new[i];
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffffffff) + (sum >> 32);
	return sum;
}

/* csum_seed: ~(the test packet's full UDP checksum), from udp6_csum_check(). */
static __always_inline int reflect(struct xdp_md *ctx, struct pkt_view *v,
				   struct reflector_session *sess, __u64 t2, __u16 csum_seed,
				   enum reflector_counter done)
{
	__u32 sent[STAMP_WORDS], reply[STAMP_WORDS];
	struct reply_params params;
	struct ethhdr eth;
	struct ipv6hdr ip6;
	__u32 n = sess->n_return_sids;
	__u32 old_srh_len = v->srh_len;
	__u32 new_srh_len;
	__be16 sport, dport;
	void *data, *data_end;
	struct udphdr *udp;
	__u32 *payload;
	int delta;

	if (n > REFLECTOR_MAX_RETURN_SIDS)   /* the loader refuses this; never trust a map blindly */
		return count(REFL_DROP_ADJUST_FAILED, XDP_DROP);
	new_srh_len = n ? sizeof(struct ipv6_sr_hdr) + (n + 1) * sizeof(struct in6_addr) : 0;

	/* Save what we need: bpf_xdp_adjust_head() invalidates packet pointers. */
	__builtin_memcpy(&eth, v->eth, sizeof(eth));
	__builtin_memcpy(&ip6, v->ip6, sizeof(ip6));
	payload = (void *)(v->udp + 1);
	for (int i = 0; i < STAMP_WORDS; i++)
		sent[i] = payload[i];
	sport = v->udp->source;
	dport = v->udp->dest;

	delta = (int)old_srh_len - (int)new_srh_len;
	if (delta && bpf_xdp_adjust_head(ctx, delta))
		return count(REFL_DROP_ADJUST_FAILED, XDP_DROP);

	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	if (data + L4_OFF_NO_SRH > data_end)
		return count(REFL_DROP_ADJUST_FAILED, XDP_DROP);

	/* Ethernet: back to where it came from. */
	{
		struct ethhdr *e = data;

		__builtin_memcpy(e->h_dest, eth.h_source, ETH_ALEN);
		__builtin_memcpy(e->h_source, eth.h_dest, ETH_ALEN);
		e->h_proto = eth.h_proto;
	}
	/* IPv6: keep version/class/flow label; swap; new next header and length. */
	{
		struct ipv6hdr *h = data + L3_OFF;

		*(__u32 *)h = *(__u32 *)&ip6;   /* version, traffic class, flow label (moved if delta != 0) */
		h->payload_len = bpf_htons(bpf_ntohs(ip6.payload_len) - old_srh_len + new_srh_len);
		h->nexthdr = n ? NEXTHDR_ROUTING : NEXTHDR_UDP;
		h->hop_limit = 255;   /* RFC 8762 §4.3: the reflector sets TTL/hop limit to 255 */
		copy16(&h->saddr, &ip6.daddr);
		copy16(&h->daddr, n ? (const void *)sess->return_sids[0] : (const void *)&ip6.saddr);
	}
	if (n && write_srh(ctx, n, sess, &ip6.saddr))
		return count(REFL_DROP_ADJUST_FAILED, XDP_DROP);

	udp = data + L4_OFF_NO_SRH + new_srh_len;
	payload = (void *)(udp + 1);
	if ((void *)(payload + STAMP_WORDS) > data_end)
		return count(REFL_DROP_ADJUST_FAILED, XDP_DROP);
	udp->source = dport;
	udp->dest = sport;

	get_reply_params(&params, sess, bpf_ntohl(sent[0]));
	build_reply(reply, sent, t2, ip6.hop_limit, &params);
	/*
	 * The pseudo-header {src, final dst} is only swapped and the ports are
	 * only swapped, so the checksum changes by the payload bytes alone (from
	 * the full checksum the test packet had, or would have had if its
	 * sender's offload had been completed).
	 */
	udp->check = csum_fold_invert(csum_words_diff(sent, reply, csum_seed));
	for (int i = 0; i < STAMP_WORDS; i++)
		payload[i] = reply[i];
	return count(done, XDP_TX);
}

/*
 * An authenticated test packet (RFC 8762 §4.2.2, >= 112 bytes) has its SSID at
 * offset 26, and zeros (MBZ) at 14-15 where the unauthenticated layout has it.
 * Asked when no session matched at offset 14, or only SSID 0 did (the base
 * senders' session would otherwise take every authenticated packet): does
 * offset 26 name an authenticated session? User space gets such packets.
 */
static __always_inline bool names_authenticated_session(struct xdp_md *ctx, struct pkt_view *v, int payload_len)
{
	__u8 *payload = (void *)(v->udp + 1);
	struct reflector_session *sess;
	__be16 *ssid;

	if (payload_len < STAMP_AUTH_BASE_LEN)
		return false;
	ssid = (void *)(payload + STAMP_AUTH_SSID_OFF);
	if ((void *)(ssid + 1) > (void *)(long)ctx->data_end)   /* covered by payload_len; for the verifier */
		return false;
	sess = lookup_session(&v->ip6->saddr, bpf_ntohs(*ssid));
	return sess && (sess->flags & REFL_SESS_F_AUTHENTICATED);
}

/*
 * Checks the kernel's IPv6/UDP receive path would make, for a STAMP packet to
 * us (cheap, no clock read yet): version and Payload Length (RFC 8200 §3),
 * UDP length within the IPv6 payload and a base packet, source address class
 * (RFC 4291), UDP checksum present (RFC 8200 §8.1). Returns the payload
 * length, or -1 with the packet counted and dropped.
 */
static __always_inline int check_test_packet(struct xdp_md *ctx, struct pkt_view *v)
{
	int payload_len;

	if (!ipv6_header_ok(ctx, v))
		return count(REFL_DROP_MALFORMED_IPV6, -1);
	payload_len = udp_payload_len(ctx, v);
	if (payload_len < STAMP_BASE_LEN ||
	    (void *)((struct stamp_sender_packet *)(v->udp + 1) + 1) > (void *)(long)ctx->data_end)
		return count(REFL_DROP_MALFORMED_SHORT, -1);
	if (!ipv6_src_ok(v->ip6))
		return count(REFL_DROP_MALFORMED_SRC_ADDR, -1);
	if (v->udp->check == 0)
		return count(REFL_DROP_MALFORMED_UDP_CSUM, -1);
	return payload_len;
}

/* The reflector's verdict on one packet (counted). */
static __always_inline int reflector_verdict(struct xdp_md *ctx)
{
	struct reflector_session *sess;
	struct stamp_sender_packet *sp;
	enum csum_verdict csum;
	struct pkt_view v;
	__u16 csum_seed = 0;
	__u32 udp_len;
	int payload_len;
	__u64 t2;

	if (!parse_ipv6(ctx, &v))
		return count(REFL_PASS_NOT_IPV6, XDP_PASS);
	if (!is_local_address(&v.ip6->daddr))
		return count(REFL_PASS_NOT_LOCAL_ADDR, XDP_PASS);

	switch (parse_srh_udp(ctx, &v)) {
	case PARSE_OK:
		break;
	case PARSE_OTHER_EXT_HEADER:
		return count(REFL_PASS_OTHER_EXT_HEADER, XDP_PASS);
	case PARSE_BAD_SRH:
		return count(REFL_DROP_MALFORMED_SRH, XDP_DROP);
	case PARSE_SRH_NOT_FINAL:
		return count(REFL_PASS_SRH_NOT_FINAL, XDP_PASS);
	case PARSE_NOT_UDP:
		return count(REFL_PASS_NOT_UDP, XDP_PASS);
	default:   /* PARSE_SHORT_UDP: UDP header cut off, to our address */
		return count(REFL_DROP_MALFORMED_SHORT, XDP_DROP);
	}
	if (v.udp->dest != bpf_htons(stamp_port))
		return count(REFL_PASS_OTHER_PORT, XDP_PASS);

	payload_len = check_test_packet(ctx, &v);
	sp = (void *)(v.udp + 1);
	if (payload_len < 0 || (void *)(sp + 1) > (void *)(long)ctx->data_end)
		return XDP_DROP;   /* counted by check_test_packet */
	/* T2: a STAMP packet to us that passed the cheap checks; other traffic
	 * and malformed packets do not pay for the clock read (~45 ns here) */
	t2 = bpf_ktime_get_tai_ns();

	sess = lookup_session(&v.ip6->saddr, bpf_ntohs(sp->ssid));
	if ((!sess || !sp->ssid) && names_authenticated_session(ctx, &v, payload_len))
		return count(REFL_PASS_AUTHENTICATED, XDP_PASS);
	if (!sess)
		return count(REFL_PASS_UNKNOWN_SESSION, XDP_PASS);
	if (sess->flags & REFL_SESS_F_AUTHENTICATED)
		return count(REFL_PASS_AUTHENTICATED, XDP_PASS);
	/* RFC 8972: anything after the base packet is TLVs; user space handles
	 * them fully (U/M/I flags, HMAC, Return Path ...) unless the session
	 * only wants them echoed */
	if (payload_len > STAMP_BASE_LEN && !(sess->flags & REFL_SESS_F_TLV_ECHO))
		return count(REFL_PASS_TLVS_TO_USERSPACE, XDP_PASS);
	/* Full checksum only on the reflection path: what we pass, the stack
	 * verifies itself. See datapath/README.md for the cost. */
	udp_len = payload_len + sizeof(struct udphdr);
	if (udp_len > UDP_CSUM_MAX_LEN)
		return count(REFL_PASS_TOO_LONG_TO_VERIFY, XDP_PASS);
	csum = udp6_csum_check(ctx, &v, udp_len, accept_partial_csum, &csum_seed);
	if (csum == CSUM_BAD)
		return count(REFL_DROP_MALFORMED_UDP_CSUM, XDP_DROP);
	return reflect(ctx, &v, sess, t2, csum_seed,
		       csum == CSUM_PARTIAL ? REFL_REFLECTED_PARTIAL_CSUM : REFL_REFLECTED);
}

SEC("xdp")
int stamp_reflector(struct xdp_md *ctx)
{
	int verdict = reflector_verdict(ctx);

	/* one call site: the chain's code is inlined once, not at every XDP_PASS above */
	return verdict == XDP_PASS ? xdp_chain_next(ctx, XDP_CHAIN_STAMP_REFLECTOR) : verdict;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
