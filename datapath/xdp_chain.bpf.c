// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * The XDP chain's dispatcher: the one program attached to every device of a
 * node that runs segscope XDP programs. It looks up the packet's device in
 * xdp_chain_devs and tail-calls the device's first member in role order
 * (xdp_chain.h); each member hands a packet it would pass to the next one.
 * A device without members (or a BPF_PROG_TEST_RUN without a known
 * ingress_ifindex) passes the packet to the stack.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "xdp_chain.h"

SEC("xdp")
int xdp_chain(struct xdp_md *ctx)
{
	return xdp_chain_from(ctx, 0);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
