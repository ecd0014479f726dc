// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * ringbuf_gen: writes synthetic struct stamp_record (or, with kind = 1,
 * struct ioam_record) into its own ring buffer, pinned where the loader says
 * (the collector's `stamp_records` / ioam_rx's `ioam_records` layout),
 * per_run records per program run. Driven by BPF_PROG_TEST_RUN with
 * repeat=N, so tests and benchmarks can feed the streamer without a network.
 *
 * Record k (k = 0, 1, ...) belongs to SSID first_ssid + k % n_ssids and has
 * sender_seq = start_seq + k / n_ssids, so each session's sequence numbers
 * are consecutive and a consumer can check completeness and order. IOAM
 * records: flow_id = first_ssid + k % n_ssids, seq = start_seq + k / n_ssids,
 * and every other field a function of (flow_id, seq) (ringbuf_gen.h) so a
 * consumer can check each record byte for byte.
 * Back-pressure: when more than high_water bytes wait in the ring the run
 * writes nothing (counted in `throttled`) and the loader retries later;
 * `rb_full` counts reservations that failed anyway (real drops).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "stamp_record.h"
#include "ioam_record.h"
#include "ringbuf_gen.h"

const volatile __u32 n_ssids = 1;
const volatile __u16 first_ssid = 1;
const volatile __u32 start_seq = 0;
const volatile __u64 high_water = RINGBUF_GEN_DEFAULT_SIZE / 2;
const volatile __u32 malformed_every = 0;   /* >0: every Nth record is a 48-byte sample instead */
const volatile __u32 per_run = 1;           /* records per run, 1..RINGBUF_GEN_MAX_PER_RUN */
const volatile __u32 kind = RINGBUF_GEN_STAMP;   /* RINGBUF_GEN_STAMP | RINGBUF_GEN_IOAM */

__u64 generated;   /* records (and malformed samples) written */
__u64 limit;       /* stop after this many (set by the loader) */
__u64 throttled;   /* runs skipped because the ring was above high_water */
__u64 rb_full;     /* reservations that failed */
__u64 malformed;   /* wrong-size samples written on purpose (malformed_every) */

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, RINGBUF_GEN_DEFAULT_SIZE);
} stamp_records SEC(".maps");

/* IOAM record number k (a 3-node trace: ingress, one transit, one more transit). */
static __always_inline int emit_ioam(struct xdp_md *ctx, __u64 k)
{
	struct ioam_record *r = bpf_ringbuf_reserve(&stamp_records, sizeof(*r), 0);
	__u32 flow = first_ssid + (__u32)(k % n_ssids);
	__u64 seq = start_seq + k / n_ssids;

	if (!r) {
		rb_full++;
		return -1;
	}
	__builtin_memset(r, 0, sizeof(*r));
	r->rx_tai_ns = RINGBUF_GEN_IOAM_RX_NS(flow, seq);
	r->tx_tai_ns = RINGBUF_GEN_IOAM_TX_NS(flow, seq);
	r->seq = seq;
	r->flow_id = flow;
	r->ifindex = ctx->ingress_ifindex;
	r->node_id = RINGBUF_GEN_IOAM_EGRESS_NODE;
	r->namespace_id = RINGBUF_GEN_IOAM_NAMESPACE;
	r->slots = 4;
	r->filled = 3;
	r->trace_type = 0xF00000;
	r->hop_limit = 61;
	r->tai_utc_offset_s = 37;
	for (int i = 0; i < 3; i++) {
		/* entries[0] is the newest (nearest the egress); wire (big-endian) order */
		r->entries[i].hop_limit_node_id = bpf_htonl(((64 - 2 + i) << 24) | (RINGBUF_GEN_IOAM_NODE0 + 2 - i));
		r->entries[i].ingress_if_id = bpf_htons(10 + i);
		r->entries[i].egress_if_id = bpf_htons(20 + i);
		r->entries[i].ts_sec = bpf_htonl((__u32)(seq + 1000));
		r->entries[i].ts_subsec = bpf_htonl((__u32)(100 * (3 - i)));
	}
	bpf_ringbuf_submit(r, 0);
	return 0;
}

/* Write record number k; returns 0 when written, -1 when it could not be (counted). */
static __always_inline int emit_one(struct xdp_md *ctx, __u64 k)
{
	struct stamp_record *r;
	__u64 now;

	if (malformed_every && k % malformed_every == malformed_every - 1) {
		/* a sample of the wrong size: the streamer must count it, not ship it */
		__u64 junk[6] = { k, 0, 0, 0, 0, 0 };

		if (bpf_ringbuf_output(&stamp_records, junk, sizeof(junk), 0)) {
			rb_full++;
			return -1;
		}
		malformed++;
		return 0;
	}
	if (kind == RINGBUF_GEN_IOAM)
		return emit_ioam(ctx, k);
	r = bpf_ringbuf_reserve(&stamp_records, sizeof(*r), 0);
	if (!r) {
		rb_full++;
		return -1;
	}
	now = bpf_ktime_get_tai_ns();
	r->t1_ns = now - 30000;
	r->t2_ns = now - 20000;
	r->t3_ns = now - 10000;
	r->t4_ns = now;
	r->sender_seq = start_seq + (__u32)(k / n_ssids);
	r->reflector_seq = r->sender_seq;
	r->ssid = first_ssid + (__u16)(k % n_ssids);
	r->sender_err_est = 0x4001;
	r->reflector_err_est = 0x4001;
	r->sender_ttl = 63;
	r->reply_hop_limit = 62;
	r->ifindex = ctx->ingress_ifindex;
	r->flags = STAMP_RECORD_F_SRH;
	r->reserved = 0;
	bpf_ringbuf_submit(r, 0);
	return 0;
}

SEC("xdp")
int ringbuf_gen(struct xdp_md *ctx)
{
	__u64 k = generated;

	if (k >= limit)
		return XDP_PASS;
	if (bpf_ringbuf_query(&stamp_records, BPF_RB_AVAIL_DATA) > high_water) {
		throttled++;
		return XDP_PASS;
	}
	/* several records per run: one test-run iteration costs more than one record */
	for (__u32 i = 0; i < RINGBUF_GEN_MAX_PER_RUN && i < per_run; i++) {
		if (k >= limit || emit_one(ctx, k) < 0)
			break;
		k++;
	}
	generated = k;
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
