// SPDX-License-Identifier: GPL-2.0
/*
 * xdp_pass — does nothing but XDP_PASS.
 *
 * Why it exists: on veth, frames sent with XDP_TX by a program on one end are
 * only delivered if the peer end has an XDP program attached too (measured:
 * without one they are dropped, rx_queue_0_xdp_tx_errors grows). netlab
 * attaches this program natively wherever a topology says `xdp_pass: true`.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

SEC("xdp")
int xdp_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "GPL";
