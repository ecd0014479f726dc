// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Test/benchmark helper (not used in production): counts every frame into
 * xdp_count_stats[0] and returns COUNT_ACTION. Built twice:
 *   xdp_count_drop.bpf.o: the benchmark's reply counter on the sender veth;
 *   xdp_count_pass.bpf.o: an XDP program for the veth peer of an XDP_TX
 *                         program (veth needs one to deliver XDP_TX frames).
 * Attach with `ip link set dev X xdpdrv obj <obj> sec xdp`.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#ifndef COUNT_ACTION
#define COUNT_ACTION XDP_PASS
#endif

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} xdp_count_stats SEC(".maps");

SEC("xdp")
int xdp_count(struct xdp_md *ctx)
{
	__u32 key = 0;
	__u64 *value = bpf_map_lookup_elem(&xdp_count_stats, &key);

	if (value)
		*value += 1;
	return COUNT_ACTION;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
