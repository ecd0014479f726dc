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
 *   xdp_chain_devs   ARRAY, 1 entry: struct xdp_chain_dev_table, the ifindex each device
 *                    slot serves (0: a free slot, whose row in xdp_chain_progs is empty)
 *   prog             the dispatcher program (attached to every device of the chain)
 *
 * Every member object declares the two maps (this header) and its loader makes
 * them the pinned ones before load (bpf_map__reuse_fd), so all members and the
 * dispatcher of an instance share one prog array and one device table. A member
 * that runs without a chain (BPF_PROG_TEST_RUN of a lone program, an ifindex not
 * in xdp_chain_devs) finds no device slot and returns XDP_PASS, as if alone.
 *
 * The device table is a scanned array, not a hash keyed by ifindex: every packet
 * looks its device up once in the dispatcher and once more per member that passes
 * it on, and a hash lookup cost ~25 ns here against ~3 ns for the array lookup and
 * the scan of the few slots a node uses. Devices take the lowest free slot, so the
 * scan stops early. Each (device slot, role) has its own call site with a constant
 * slot number, so the tail calls are direct jumps (xdp_chain_tails). One instance
 * serves the devices of one network namespace (ifindexes are per namespace).
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

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

/* The value of xdp_chain_devs (one entry): device slot i serves ifindex[i]. */
struct xdp_chain_dev_table {
	__u32 ifindex[XDP_CHAIN_MAX_DEVS];
};

#ifdef __VMLINUX_H__   /* the BPF side */

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, XDP_CHAIN_NR_SLOTS);
	__type(key, __u32);
	__type(value, __u32);
} xdp_chain_progs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct xdp_chain_dev_table);
} xdp_chain_devs SEC(".maps");

/*
 * The members of device slot `dev` from role `first` on, in order: a tail call
 * into an empty slot returns, so the next role is tried; a successful one never
 * returns. Every slot number is a constant here (bpf_tail_call_static), so the
 * x86 JIT makes each call a direct jump it patches when the slot changes, or a
 * no-op while the slot is empty: no retpoline'd indirect jump (~17 ns per hop
 * here) and no bounds check.
 */
static __always_inline void xdp_chain_tails(struct xdp_md *ctx, __u32 dev, __u32 first)
{
#pragma unroll
	for (__u32 role = 0; role < XDP_CHAIN_NR_ROLES; role++) {
		if (role >= first)
			bpf_tail_call_static(ctx, &xdp_chain_progs, dev * XDP_CHAIN_NR_ROLES + role);
	}
}

/* Device slot `dev` serves the packet: run its members, then the stack. Written out once per
 * slot (not a loop): a loop lets the compiler merge the call sites, and a merged call site
 * has no constant slot number. */
#define XDP_CHAIN_DEV(dev)                                          \
	if (devs->ifindex[dev] == ifindex) {                        \
		xdp_chain_tails(ctx, dev, first);                   \
		return XDP_PASS;                                    \
	}

_Static_assert(XDP_CHAIN_MAX_DEVS == 16, "xdp_chain_from() checks 16 device slots");

/*
 * Run the members of this packet's device from role `first` on, in order.
 * Nothing left: the packet goes to the stack. `first` is a constant at every
 * call site, so the role loops unroll to the roles from `first` on, and the
 * last role's xdp_chain_next() compiles to a plain XDP_PASS (no device lookup
 * for nothing: the lookup is a helper call the compiler cannot drop).
 */
static __always_inline int xdp_chain_from(struct xdp_md *ctx, __u32 first)
{
	__u32 ifindex = ctx->ingress_ifindex, zero = 0;
	struct xdp_chain_dev_table *devs;

	if (first >= XDP_CHAIN_NR_ROLES)
		return XDP_PASS;
	devs = bpf_map_lookup_elem(&xdp_chain_devs, &zero);
	if (!devs)
		return XDP_PASS;
	XDP_CHAIN_DEV(0) XDP_CHAIN_DEV(1) XDP_CHAIN_DEV(2) XDP_CHAIN_DEV(3)
	XDP_CHAIN_DEV(4) XDP_CHAIN_DEV(5) XDP_CHAIN_DEV(6) XDP_CHAIN_DEV(7)
	XDP_CHAIN_DEV(8) XDP_CHAIN_DEV(9) XDP_CHAIN_DEV(10) XDP_CHAIN_DEV(11)
	XDP_CHAIN_DEV(12) XDP_CHAIN_DEV(13) XDP_CHAIN_DEV(14) XDP_CHAIN_DEV(15)
	return XDP_PASS;
}

/* A member's XDP_PASS: hand the packet to the next member of its device. */
static __always_inline int xdp_chain_next(struct xdp_md *ctx, enum xdp_chain_role self)
{
	return xdp_chain_from(ctx, (__u32)self + 1);
}

#else /* user space: the loaders' side, xdp_chain.c (documented in datapath/README.md, "Chaining") */

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <bpf/libbpf.h>

/* Role names, as `chain` prints them and as the members' pin directories are named. */
static const char *const xdp_chain_role_names[XDP_CHAIN_NR_ROLES] = {
	[XDP_CHAIN_ALTMARK_RX]      = "altmark_rx",
	[XDP_CHAIN_IOAM_RX]         = "ioam_rx",
	[XDP_CHAIN_STAMP_COLLECTOR] = "stamp_collector",
	[XDP_CHAIN_STAMP_REFLECTOR] = "stamp_reflector",
};

/* Loaders of one instance wait for each other on this lock (flock) between
 * xdp_chain_open() and xdp_chain_close(). */
#define XDP_CHAIN_LOCK_DIR "/run/segscope/xdp_chain"

/* One instance's chain as a loader holds it: locked, pins open. */
struct xdp_chain {
	char instance_dir[PATH_MAX];  /* /sys/fs/bpf/segscope/<instance> */
	char dir[PATH_MAX];           /* <instance_dir>/xdp_chain */
	int lock_fd;
	int progs_fd, devs_fd, prog_fd;   /* -1 when the chain does not exist (open without create) */
	uint32_t prog_id;             /* the dispatcher's */
};

/*
 * Every XDP loader of an instance calls, in this order (errors are printed,
 * naming the flag, and returned as -errno):
 *
 *   xdp_chain_open(&c, instance_dir, true)   lock the instance's chain, open its pins or create
 *                                            them (the two maps and the dispatcher)
 *   xdp_chain_reuse_maps(&c, obj)            before loading a member: its two chain maps become
 *                                            the pinned ones
 *   ... load, configure, pin the member ...
 *   xdp_chain_join(&c, netns, dev, role, fd) the member runs on dev (the dispatcher is attached
 *                                            to dev if it is not there yet)
 *   xdp_chain_leave(&c, netns, dev, role, fd) the member stops running on dev (the dispatcher
 *                                            leaves dev with its last member)
 *   xdp_chain_close(&c)                      remove the pins if no device is left, unlock
 *
 * open(create = false) opens an existing chain only (c.progs_fd < 0 if there
 * is none), for leave and show.
 */
int xdp_chain_open(struct xdp_chain *c, const char *instance_dir, bool create);
int xdp_chain_reuse_maps(const struct xdp_chain *c, struct bpf_object *obj);
int xdp_chain_join(struct xdp_chain *c, const char *netns, const char *dev, enum xdp_chain_role role,
		   int prog_fd);
/* prog_fd >= 0: refuse unless the slot holds that program (it names the one there). */
int xdp_chain_leave(struct xdp_chain *c, const char *netns, const char *dev, enum xdp_chain_role role,
		    int prog_fd);
void xdp_chain_close(struct xdp_chain *c);
/* 0: prog_fd uses this chain's maps; -ESTALE: those of a chain removed since (it must be loaded
 * again against this one); other < 0: could not tell. *prog_id (if given): the program's id. */
int xdp_chain_uses_maps(const struct xdp_chain *c, int prog_fd, uint32_t *prog_id);

/* The `chain` subcommand: {"<device>": [{"role": ..., "id": N, "name": ...}, ...], ...} in role
 * order, device names resolved in netns. {} without a chain. 0 or -errno. */
int xdp_chain_show(const char *instance_dir, const char *netns);

/*
 * What a member's loader does with the calls above (stamp_reflector.c,
 * stamp_collector.c, altmark_rx.c; ioam_rx the same):
 *
 *   xdp_member_attach   after load: pin obj and prog under pin_dir, join dev; pins removed on error
 *   xdp_member_attach_dev / xdp_member_detach_dev   the pinned member on one more device / off one
 *   xdp_member_detach   leave dev and every other device the member still runs on, remove the pins
 *
 * The instance directory is the parent of pin_dir. These take the lock themselves except
 * xdp_member_attach, which runs between the caller's xdp_chain_open() (before load) and
 * xdp_chain_close().
 */
const char *xdp_member_instance_dir(const char *pin_dir, char *out, size_t len);
int xdp_member_attach(struct xdp_chain *c, struct bpf_object *obj, struct bpf_program *prog,
		      const char *netns, const char *dev, const char *pin_dir, enum xdp_chain_role role);
int xdp_member_attach_dev(const char *netns, const char *dev, const char *pin_dir, enum xdp_chain_role role);
int xdp_member_detach_dev(const char *netns, const char *dev, const char *pin_dir, enum xdp_chain_role role);
int xdp_member_detach(const char *netns, const char *dev, const char *pin_dir, enum xdp_chain_role role);
/* off every device the member's pinned program runs on; its pins stay (a member with another hook too) */
int xdp_member_leave_all(const char *netns, const char *pin_dir, enum xdp_chain_role role);

#endif /* __VMLINUX_H__ */
#endif /* SEGSCOPE_XDP_CHAIN_H */
