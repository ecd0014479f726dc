// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Programs that do nothing, for the hook floors of the datapath benchmarks: what a TC egress
 * filter (the clsact qdisc and one classifier call) and a native XDP program (on veth: the
 * receive side switched to NAPI, the skb converted to an xdp_buff) cost a packet before any
 * program work. bench/ioam_overhead.py's "empty hooks" configuration attaches them where
 * ioam_tx and ioam_rx go; "empty XDP on b0" and "empty TC ingress on b0" put one of them on
 * the egress edge's device alone (the classifier on ingress there: TC_ACT_UNSPEC with no other
 * filter passes the packet as TC_ACT_OK does).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#define TC_ACT_UNSPEC (-1)

SEC("tc")
int tc_nothing(struct __sk_buff *skb)
{
	return TC_ACT_UNSPEC;
}

SEC("xdp")
int xdp_nothing(struct xdp_md *ctx)
{
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
