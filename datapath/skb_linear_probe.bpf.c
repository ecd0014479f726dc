// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Test helper (not used in production): what a TC ingress filter sees of an skb's layout. For
 * every skb, one event into the `skb_linear_events` ring buffer: the bytes the program can read
 * directly (data_end - data: the skb's linear part from the Ethernet header on), skb->len (the
 * whole frame, page fragments included), and from the kernel's struct sk_buff (bpf_cast_to_kern_ctx)
 * its number of page fragments and whether its data is shared with a clone. Two entries, the same
 * event with the stage they
 * stand at, for clsact ingress filters placed before and after the filter under test
 * (tests/datapath/test_ioam_rx_nonlinear.py: ioam_rx_tc between them):
 *
 *   skb_linear_before  stage 1: what arrived (a lower tc priority number: it runs first)
 *   skb_linear_after   stage 2: what the filters before it left (bpf_skb_pull_data moves data_end)
 *
 * Both only read and return TC_ACT_UNSPEC (the next filter, or the stack). Load with
 * `bpftool prog loadall skb_linear_probe.bpf.o DIR type classifier pinmaps MAPDIR`, attach with
 * `tc filter add dev IF ingress prio N handle 1 bpf da object-pinned DIR/skb_linear_before`.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

#define TC_ACT_UNSPEC (-1)

struct skb_linear_event {
	__u32 stage;       /* 1: before the filter under test, 2: after it */
	__u32 linear;      /* data_end - data */
	__u32 len;         /* skb->len */
	__u32 ifindex;     /* the device it arrived by */
	__u8 nr_frags;     /* page fragments (skb_shinfo(skb)->nr_frags) */
	__u8 cloned;       /* skb->cloned: its data is shared with a clone (a tap's copy) */
	__u8 pad[2];
};

extern void *bpf_cast_to_kern_ctx(void *) __ksym;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} skb_linear_events SEC(".maps");

static __always_inline int emit(struct __sk_buff *skb, __u32 stage)
{
	struct sk_buff *kskb = bpf_cast_to_kern_ctx(skb);
	struct skb_linear_event *e = bpf_ringbuf_reserve(&skb_linear_events, sizeof(*e), 0);
	struct skb_shared_info *shinfo;

	if (!e)
		return TC_ACT_UNSPEC;   /* the test sees the missing event */
	e->stage = stage;
	e->linear = (__u32)((long)skb->data_end - (long)skb->data);
	e->len = skb->len;
	e->ifindex = skb->ingress_ifindex;
	e->cloned = BPF_CORE_READ_BITFIELD(kskb, cloned);
	/* skb_shinfo(): at head + end (end is an offset on 64-bit kernels) */
	shinfo = (void *)(BPF_CORE_READ(kskb, head) + BPF_CORE_READ(kskb, end));
	e->nr_frags = BPF_CORE_READ(shinfo, nr_frags);
	e->pad[0] = e->pad[1] = 0;
	bpf_ringbuf_submit(e, 0);
	return TC_ACT_UNSPEC;
}

SEC("tc")
int skb_linear_before(struct __sk_buff *skb)
{
	return emit(skb, 1);
}

SEC("tc")
int skb_linear_after(struct __sk_buff *skb)
{
	return emit(skb, 2);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
