// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * softirq_time: nanoseconds each CPU spent in each softirq vector (NET_RX = 3, ...), measured at the
 * softirq_entry / softirq_exit tracepoints with bpf_ktime_get_ns. For the forwarding benchmarks:
 * the lab's whole datapath (veth receive, forwarding, seg6, TC and XDP programs) runs in NET_RX
 * softirq, so this is the CPU time of the packets' path on a CPU, to the nanosecond, without the
 * time of other processes that the shared machine runs on the same CPU (the kernel's own
 * /proc/stat softirq field is sampled at the tick, 4 ms here, as CONFIG_IRQ_TIME_ACCOUNTING is off).
 *
 * Softirqs do not nest on a CPU (a hard interrupt during one does not start another), so one start
 * time per CPU is enough. Hard interrupts taken during a softirq, and time the hypervisor steals
 * from the vCPU during it, are counted in it. A softirq already running when the programs are
 * attached is not counted (no start time). Loaded and attached by bench/softirq_time.py.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#define SOFTIRQ_VECS 10 /* NR_SOFTIRQS */

struct start {
	__u64 ns;
	__u32 vec;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct start);
} softirq_start SEC(".maps");

/* [vec] = ns spent in vector vec on this CPU; [SOFTIRQ_VECS + vec] = how many times it ran */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2 * SOFTIRQ_VECS);
	__type(key, __u32);
	__type(value, __u64);
} softirq_ns SEC(".maps");

SEC("raw_tp/softirq_entry")
int softirq_entry(struct bpf_raw_tracepoint_args *ctx)
{
	__u32 zero = 0;
	struct start *s = bpf_map_lookup_elem(&softirq_start, &zero);

	if (s) {
		s->vec = (__u32)ctx->args[0];
		s->ns = bpf_ktime_get_ns();
	}
	return 0;
}

SEC("raw_tp/softirq_exit")
int softirq_exit(struct bpf_raw_tracepoint_args *ctx)
{
	__u32 zero = 0, vec = (__u32)ctx->args[0], n;
	struct start *s = bpf_map_lookup_elem(&softirq_start, &zero);
	__u64 *acc, now = bpf_ktime_get_ns();

	if (!s || !s->ns || s->vec != vec || vec >= SOFTIRQ_VECS)
		return 0;
	acc = bpf_map_lookup_elem(&softirq_ns, &vec);
	if (acc)
		*acc += now - s->ns;
	n = vec + SOFTIRQ_VECS;
	acc = bpf_map_lookup_elem(&softirq_ns, &n);
	if (acc)
		*acc += 1;
	s->ns = 0;
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
