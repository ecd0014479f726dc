/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * In-line IOAM measurement (RFC 9197 / RFC 9486): shared between
 * ioam_tx.bpf.c (TC egress at the ingress edge: inserts the trace and the E2E
 * option into sampled packets of a monitored flow), ioam_rx.bpf.c (XDP at
 * the egress edge: one ioam_record per instrumented packet), their loaders
 * ioam_tx.c / ioam_rx.c and the agent, which reads the pinned maps under
 * /sys/fs/bpf/segscope/<instance>/ioam_{tx,rx}/:
 *
 *   ioam_tx_flows   HASH  struct altmark_sidlist_key -> struct ioam_tx_flow
 *                         (configuration + the flow's counters, sampling position
 *                         and sequence number, updated atomically by the program)
 *   ioam_if_ids     HASH  __u32 ifindex -> __u16 IOAM interface id (tx: the ingress
 *                         entry's ingress / egress interface ids; 0xFFFF if absent)
 *   ioam_tx_config  ARRAY[1] struct ioam_tx_config (TAI - UTC)
 *   ioam_tx_stats   PERCPU_ARRAY of __u64, IOTX_NR_COUNTERS
 *   ioam_rx_flows   HASH  struct altmark_sidlist_key -> struct ioam_rx_flow
 *   ioam_rx_config  ARRAY[1] struct ioam_rx_config (node id, TAI - UTC)
 *   ioam_rx_stats   PERCPU_ARRAY of __u64, IORX_NR_COUNTERS
 *   ioam_records    RINGBUF of struct ioam_record (schemas/c/ioam_record.h)
 *
 * Every packet a program sees lands in exactly one counter of its stats.
 * Wire formats: schemas/IOAM.md, schemas/c/ioam_trace_option.h,
 * schemas/c/ioam_e2e_option.h.
 */
#ifndef SEGSCOPE_IOAM_H
#define SEGSCOPE_IOAM_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

#include "altmark.h"              /* struct altmark_sidlist_key, ALTMARK_MAX_SIDS */
#include "ioam_trace_option.h"
#include "ioam_e2e_option.h"
#include "ioam_record.h"

#define IOAM_MAX_FLOWS        65536
#define IOAM_MAX_IFS          1024       /* ioam_if_ids entries */
#define IOAM_SAMPLE_EVERY_MAX 65535
#define IOAM_SAMPLE_INTERVAL_US_MAX 3600000000ULL   /* one per hour */
#define IOAM_DEFAULT_RINGBUF  (1 << 22)  /* 4 MiB: 16 384 records of 256 B (+ 8 B header each) */

/* How a flow picks the packets it instruments (struct ioam_tx_flow.sample_mode). */
enum ioam_sample_mode {
	IOAM_SAMPLE_EVERY = 1,     /* packet k of the flow (k = 0, 1, ...) iff k % sample_every == 0 */
	IOAM_SAMPLE_INTERVAL = 2,  /* a packet when sample_interval_ns have passed since the last sampled one */
};

/* struct ioam_match.fields: which parts of the inner packet the flow's filter checks. */
#define IOAM_MATCH_SRC    0x01
#define IOAM_MATCH_DST    0x02
#define IOAM_MATCH_PROTO  0x04
#define IOAM_MATCH_SPORT  0x08
#define IOAM_MATCH_DPORT  0x10

/*
 * Optional filter on the inner packet (the seed paper's five-entry filter):
 * inner IPv6 source / destination prefix, next header, TCP/UDP ports. Only
 * the fields named in `fields` are checked; prefixes are stored masked.
 */
struct ioam_match {
	__u8  src[16];          /* prefix & mask */
	__u8  src_mask[16];
	__u8  dst[16];
	__u8  dst_mask[16];
	__u16 sport;            /* host order */
	__u16 dport;
	__u8  proto;            /* inner IPv6 Next Header (no extension headers are walked) */
	__u8  fields;           /* IOAM_MATCH_* */
	__u8  src_len;          /* prefix lengths, for list-flows */
	__u8  dst_len;
};

/*
 * Value of ioam_tx_flows. The configuration is written by add-flow; the
 * counters below it by the program, with atomic adds: the sampling position
 * and the sequence number must be global across CPUs (a per-CPU count would
 * sample 1 in N per CPU and number packets twice), so the flow's few other
 * counters live beside them. add-flow of a key already present replaces the
 * value: everything restarts from 0.
 */
struct ioam_tx_flow {
	__u32 flow_id;
	__u32 node_id;                /* the ingress edge's IOAM node id (24 bits) */
	__u16 namespace_id;
	__u8  trace_nodes;            /* trace slots, ingress included: 1..IOAM_TRACE_MAX_SLOTS */
	__u8  sample_mode;            /* enum ioam_sample_mode */
	__u32 sample_every;           /* N: 1..IOAM_SAMPLE_EVERY_MAX */
	__u64 sample_interval_ns;     /* M µs * 1000 */
	__u64 installed_tai_ns;
	struct ioam_match match;
	/* written by the program (atomic) */
	__u64 seen;                   /* packets of the flow (SID list and filter matched) */
	__u64 sampled;                /* = instrumented + skipped_mtu + skipped_gso + skipped_other */
	__u64 instrumented;
	__u64 skipped_mtu;            /* would exceed the device MTU: sent unchanged */
	__u64 skipped_gso;            /* GSO packet: sent unchanged */
	__u64 skipped_other;          /* already IOAM, another HBH/DOH in the way, headers too long, adjust failed */
	__u64 next_seq;               /* the E2E sequence number of the next instrumented packet */
	__u64 last_sample_tai_ns;     /* interval sampling: CLOCK_TAI of the last sampled packet */
};

struct ioam_tx_config {
	__s32 tai_utc_offset_s;       /* trace timestamps are UTC: CLOCK_TAI - this */
	__u32 pad;
};

/* Value of ioam_rx_flows. */
struct ioam_rx_flow {
	__u32 flow_id;
	__u16 namespace_id;           /* trace and E2E option must carry this one */
	__u16 pad;
	__u64 installed_tai_ns;
	__u64 records;                /* records written (atomic) */
	__u64 ringbuf_full;           /* records lost to a full ring buffer (atomic) */
};

struct ioam_rx_config {
	__u32 node_id;                /* this egress node's IOAM node id (24 bits), into every record */
	__s16 tai_utc_offset_s;
	__u16 pad;
};

/* ioam_tx stats, in check order: every packet lands in exactly one. */
enum ioam_tx_counter {
	IOTX_PASS_NOT_IPV6 = 0,       /* not IPv6, or shorter than Ethernet + IPv6 */
	IOTX_PASS_NO_SRH,             /* no SRH after IPv6 [HBH] [DOH] (another header, another routing type) */
	IOTX_PASS_TOO_MANY_SIDS,      /* SRH with more than ALTMARK_MAX_SIDS segments */
	IOTX_PASS_MALFORMED,          /* HBH, DOH or SRH cut off, or SRH hdr_ext_len / last_entry inconsistent */
	IOTX_PASS_UNMONITORED,        /* SID list not in ioam_tx_flows */
	IOTX_PASS_BAD_FLOW,           /* inconsistent flow entry (trace_nodes, sampling): never from the loader */
	IOTX_PASS_FILTERED,           /* the inner packet does not match the flow's filter */
	IOTX_PASS_NOT_SAMPLED,        /* a packet of the flow the sampling rule leaves alone */
	IOTX_SKIP_GSO,                /* sampled, GSO: sent unchanged */
	IOTX_SKIP_ALREADY_IOAM,       /* sampled, already carries an IOAM option (HBH or after the SRH) */
	IOTX_SKIP_OTHER_EXT,          /* sampled, another HBH, or a DOH after the SRH, is in the way */
	IOTX_SKIP_TOO_LONG,           /* sampled, DOH + SRH longer than IOAM_TX_MAX_MOVE */
	IOTX_SKIP_MTU,                /* sampled, would exceed the device MTU: sent unchanged */
	IOTX_SKIP_ADJUST_FAILED,      /* sampled, bpf_skb_adjust_room failed: sent unchanged */
	IOTX_INSTRUMENTED,            /* trace + E2E option inserted */
	IOTX_NR_COUNTERS,
};

static const char *const ioam_tx_counter_names[IOTX_NR_COUNTERS] = {
	[IOTX_PASS_NOT_IPV6]      = "pass_not_ipv6",
	[IOTX_PASS_NO_SRH]        = "pass_no_srh",
	[IOTX_PASS_TOO_MANY_SIDS] = "pass_too_many_sids",
	[IOTX_PASS_MALFORMED]     = "pass_malformed",
	[IOTX_PASS_UNMONITORED]   = "pass_unmonitored",
	[IOTX_PASS_BAD_FLOW]      = "pass_bad_flow",
	[IOTX_PASS_FILTERED]      = "pass_filtered",
	[IOTX_PASS_NOT_SAMPLED]   = "pass_not_sampled",
	[IOTX_SKIP_GSO]           = "skip_gso",
	[IOTX_SKIP_ALREADY_IOAM]  = "skip_already_ioam",
	[IOTX_SKIP_OTHER_EXT]     = "skip_other_ext",
	[IOTX_SKIP_TOO_LONG]      = "skip_too_long",
	[IOTX_SKIP_MTU]           = "skip_mtu",
	[IOTX_SKIP_ADJUST_FAILED] = "skip_adjust_failed",
	[IOTX_INSTRUMENTED]       = "instrumented",
};

/* ioam_rx stats, in check order: every packet lands in exactly one (always passed on). */
enum ioam_rx_counter {
	IORX_PASS_NOT_IPV6 = 0,       /* not IPv6, or shorter than Ethernet + IPv6 */
	IORX_PASS_NO_HBH,             /* no Hop-by-Hop header: not instrumented (most traffic) */
	IORX_PASS_TRUNCATED,          /* a header or option read runs past the frame or the IPv6 payload */
	IORX_PASS_BAD_LENGTH,         /* option walk, alignment, Opt Data Len, RemainingLen, NodeLen wrong */
	IORX_PASS_NO_TRACE,           /* a Hop-by-Hop header without IOAM trace option */
	IORX_PASS_UNKNOWN_TYPE,       /* IOAM Option-Type, Trace-Type or E2E-Type not segscope's */
	IORX_PASS_NO_SRH,             /* no SRH after HBH [DOH] */
	IORX_PASS_TOO_MANY_SIDS,      /* SRH with more than ALTMARK_MAX_SIDS segments */
	IORX_PASS_MALFORMED_SRH,      /* SRH hdr_ext_len / last_entry / segments_left inconsistent */
	IORX_PASS_UNMONITORED,        /* SID list not in ioam_rx_flows */
	IORX_PASS_UNKNOWN_NAMESPACE,  /* trace or E2E Namespace-ID not the flow's */
	IORX_PASS_NO_E2E,             /* no Destination Options header with the E2E option after the SRH */
	IORX_PASS_BAD_TIMESTAMP,      /* E2E subseconds >= 10^9 */
	IORX_PASS_RINGBUF_FULL,       /* record lost: ring buffer full (the packet passes) */
	IORX_RECORDED,                /* one ioam_record written */
	IORX_RECORDED_TRUNCATED,      /* recorded, more filled entries than a record holds (F_TRUNCATED) */
	IORX_NR_COUNTERS,
};

static const char *const ioam_rx_counter_names[IORX_NR_COUNTERS] = {
	[IORX_PASS_NOT_IPV6]          = "pass_not_ipv6",
	[IORX_PASS_NO_HBH]            = "pass_no_hbh",
	[IORX_PASS_TRUNCATED]         = "pass_truncated",
	[IORX_PASS_BAD_LENGTH]        = "pass_bad_length",
	[IORX_PASS_NO_TRACE]          = "pass_no_trace",
	[IORX_PASS_UNKNOWN_TYPE]      = "pass_unknown_type",
	[IORX_PASS_NO_SRH]            = "pass_no_srh",
	[IORX_PASS_TOO_MANY_SIDS]     = "pass_too_many_sids",
	[IORX_PASS_MALFORMED_SRH]     = "pass_malformed_srh",
	[IORX_PASS_UNMONITORED]       = "pass_unmonitored",
	[IORX_PASS_UNKNOWN_NAMESPACE] = "pass_unknown_namespace",
	[IORX_PASS_NO_E2E]            = "pass_no_e2e",
	[IORX_PASS_BAD_TIMESTAMP]     = "pass_bad_timestamp",
	[IORX_PASS_RINGBUF_FULL]      = "pass_ringbuf_full",
	[IORX_RECORDED]               = "recorded",
	[IORX_RECORDED_TRUNCATED]     = "recorded_truncated",
};

#endif /* SEGSCOPE_IOAM_H */
