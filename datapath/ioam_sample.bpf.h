/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * What the two in-line IOAM inserters share, so both decide and write alike: ioam_tx (TC egress,
 * after the seg6 encap) and ioam_lwt (the policy's route): a flow's 5-tuple filter, the sampling
 * rule (1 in N, or one per M µs across CPUs) and the big-endian stores of the header they build.
 * Included after vmlinux.h and ioam.h.
 */
#ifndef SEGSCOPE_IOAM_SAMPLE_BPF_H
#define SEGSCOPE_IOAM_SAMPLE_BPF_H

static __always_inline bool prefix_match(const __u8 *addr, const __u8 *want, const __u8 *mask)
{
	__u64 a0, a1, w0, w1, m0, m1;

	__builtin_memcpy(&a0, addr, 8);
	__builtin_memcpy(&a1, addr + 8, 8);
	__builtin_memcpy(&w0, want, 8);
	__builtin_memcpy(&w1, want + 8, 8);
	__builtin_memcpy(&m0, mask, 8);
	__builtin_memcpy(&m1, mask + 8, 8);
	return (a0 & m0) == w0 && (a1 & m1) == w1;
}

/* The filter's address and protocol fields on the packet's IPv6 header. */
static __always_inline bool ioam_match_addrs(const struct ioam_match *m, const struct ipv6hdr *ip6)
{
	__u32 fields = m->fields;

	if ((fields & IOAM_MATCH_SRC) && !prefix_match((__u8 *)&ip6->saddr, m->src, m->src_mask))
		return false;
	if ((fields & IOAM_MATCH_DST) && !prefix_match((__u8 *)&ip6->daddr, m->dst, m->dst_mask))
		return false;
	if ((fields & IOAM_MATCH_PROTO) && ip6->nexthdr != m->proto)
		return false;
	return true;
}

/* Whether the filter needs the ports, and then whether the packet can have them (TCP, UDP). */
static __always_inline bool ioam_match_wants_ports(const struct ioam_match *m)
{
	return m->fields & (IOAM_MATCH_SPORT | IOAM_MATCH_DPORT);
}

static __always_inline bool ioam_has_ports(__u8 nexthdr)
{
	return nexthdr == IPPROTO_TCP || nexthdr == IPPROTO_UDP;
}

/* The filter's port fields on the first 4 bytes of TCP/UDP (source, destination port). */
static __always_inline bool ioam_match_ports(const struct ioam_match *m, const __u8 *ports)
{
	if ((m->fields & IOAM_MATCH_SPORT) && (ports[0] << 8 | ports[1]) != m->sport)
		return false;
	if ((m->fields & IOAM_MATCH_DPORT) && (ports[2] << 8 | ports[3]) != m->dport)
		return false;
	return true;
}

/* The sampling rule; every call counts the packet in `seen`. One in sample_every by that count, or
 * one per sample_interval_ns: the CPU whose compare-and-swap moves last_sample_tai_ns samples. */
static __always_inline bool ioam_sampled(struct ioam_tx_flow *f)
{
	__u64 k = __sync_fetch_and_add(&f->seen, 1), now, last;

	if (f->sample_mode == IOAM_SAMPLE_EVERY)
		return k % f->sample_every == 0;
	now = bpf_ktime_get_tai_ns();
	last = *(volatile __u64 *)&f->last_sample_tai_ns;
	/* signed: another CPU may have stored a time later than ours */
	if ((__s64)(now - last) < (__s64)f->sample_interval_ns)
		return false;
	return __sync_val_compare_and_swap(&f->last_sample_tai_ns, last, now) == last;
}

static __always_inline void put16(__u8 *p, __u16 v)
{
	p[0] = v >> 8;
	p[1] = (__u8)v;
}

static __always_inline void put32(__u8 *p, __u32 v)
{
	p[0] = v >> 24;
	p[1] = (__u8)(v >> 16);
	p[2] = (__u8)(v >> 8);
	p[3] = (__u8)v;
}

#endif /* SEGSCOPE_IOAM_SAMPLE_BPF_H */
