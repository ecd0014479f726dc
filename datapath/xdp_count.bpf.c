// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Test/benchmark helpers for the datapath (not used in production):
 *   xdp_count_drop: counts every frame into xdp_count_stats[0] and drops it
 *                   (the benchmark's reply counter on the sender veth);
 *   xdp_count_pass: counts and passes (an XDP program for the veth peer of an
 *                   XDP_TX program, which veth needs to deliver XDP_TX frames).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} xdp_count_stats SEC(".maps");

static __always_inline void bump(void)
{
	__u32 key = 0;
	__u64 *value = bpf_map_lookup_elem(&xdp_count_stats, &key);

	if (value)
		*value += 1;
}

SEC("xdp")
int xdp_count_drop(struct xdp_md *ctx)
{
	bump();
	return XDP_DROP;
}

SEC("xdp")
int xdp_count_pass(struct xdp_md *ctx)
{
	bump();
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
