/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * XDP chain: every segscope XDP program of a node on any of its devices, in any
 * combination, through one design.
 *
 * A device has one native XDP program on this kernel, but an edge router needs
 * several on the same device (the alternate-marking counter, the in-line IOAM
 * extractor, a STAMP collector and a STAMP reflector), on any of its devices
 * (a multi-homed node), added and removed in any order. So the program attached
 * to every such device is the small dispatcher `xdp_chain` (xdp_chain.bpf.c),
 * and the members run behind it through tail calls, in a fixed order by role:
 *
 *   device -> xdp_chain -> altmark_rx -> ioam_rx -> stamp_collector -> stamp_reflector -> stack
 *             (dispatch)   (counts)      (records)  (STAMP replies:      (STAMP test packets:
 *                                                    XDP_DROP)            XDP_TX)
 *
 * Each member runs only where it is joined; a member that would pass a packet
 * (XDP_PASS) hands it to the next member joined on the same device instead
 * (xdp_chain_next); a terminal verdict (XDP_TX, XDP_DROP) ends the chain. So a
 * packet sees exactly the members of its device, in role order, until one of
 * them consumes it.
 *
 * Shared state of one node instance, pinned under
 * /sys/fs/bpf/segscope/<instance>/xdp_chain/ (the directory beside the members'
 * own pin directories):
 *
 *   xdp_chain_progs  PROG_ARRAY, XDP_CHAIN_MAX_DEVS * XDP_CHAIN_NR_ROLES slots:
 *                    slot = device slot * XDP_CHAIN_NR_ROLES + role -> member program
 *   xdp_chain_devs   HASH  __u32 ifindex -> __u32 device slot (0 .. XDP_CHAIN_MAX_DEVS - 1)
 *   prog             the dispatcher program (attached to every device of the chain)
 *
 * Every member object declares the two maps (this header) and its loader makes
 * them the pinned ones before load (bpf_map__reuse_fd), so all members and the
 * dispatcher of an instance share one prog array and one device table. A member
 * that runs without a chain (BPF_PROG_TEST_RUN of a lone program, an ifindex not
 * in xdp_chain_devs) finds no device slot and returns XDP_PASS, as if alone.
 */
#ifndef SEGSCOPE_XDP_CHAIN_H
#define SEGSCOPE_XDP_CHAIN_H

/* The order a packet visits the members of its device. Appending a role is
 * compatible; reordering changes what runs first (and the slot layout). */
enum xdp_chain_role {
	XDP_CHAIN_ALTMARK_RX = 0,       /* alternate-marking counter: always passes on */
	XDP_CHAIN_IOAM_RX = 1,          /* in-line IOAM extractor: always passes on */
	XDP_CHAIN_STAMP_COLLECTOR = 2,  /* STAMP Session-Sender RX: consumes replies */
	XDP_CHAIN_STAMP_REFLECTOR = 3,  /* STAMP Session-Reflector: answers test packets */
	XDP_CHAIN_NR_ROLES = 4,
};

#define XDP_CHAIN_MAX_DEVS    16
#define XDP_CHAIN_NR_SLOTS    (XDP_CHAIN_MAX_DEVS * XDP_CHAIN_NR_ROLES)
#define XDP_CHAIN_DIR_NAME    "xdp_chain"
#define XDP_CHAIN_PROGS_MAP   "xdp_chain_progs"
#define XDP_CHAIN_DEVS_MAP    "xdp_chain_devs"

#ifdef __VMLINUX_H__   /* the BPF side */

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, XDP_CHAIN_NR_SLOTS);
	__type(key, __u32);
	__type(value, __u32);
} xdp_chain_progs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, XDP_CHAIN_MAX_DEVS);
	__type(key, __u32);
	__type(value, __u32);
} xdp_chain_devs SEC(".maps");

/*
 * Run the members of this packet's device from role `first` on, in order. A
 * tail call into an empty slot returns, so the loop tries the next role; a
 * successful one never returns. Nothing left: the packet goes to the stack.
 * `first` is a constant at every call site, so the loop unrolls.
 */
static __always_inline int xdp_chain_from(struct xdp_md *ctx, __u32 first)
{
	__u32 ifindex = ctx->ingress_ifindex;
	__u32 *dev = bpf_map_lookup_elem(&xdp_chain_devs, &ifindex);
	__u32 base;

	if (!dev || *dev >= XDP_CHAIN_MAX_DEVS)
		return XDP_PASS;
	base = *dev * XDP_CHAIN_NR_ROLES;
#pragma unroll
	for (__u32 role = 0; role < XDP_CHAIN_NR_ROLES; role++) {
		if (role >= first)
			bpf_tail_call(ctx, &xdp_chain_progs, base + role);
	}
	return XDP_PASS;
}

/* A member's XDP_PASS: hand the packet to the next member of its device. */
static __always_inline int xdp_chain_next(struct xdp_md *ctx, enum xdp_chain_role self)
{
	return xdp_chain_from(ctx, (__u32)self + 1);
}

#endif /* __VMLINUX_H__ */
#endif /* SEGSCOPE_XDP_CHAIN_H */
