/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * ioam_record: one sampled data packet of an in-line monitored flow, as the
 * egress edge's XDP extractor (datapath/ioam_rx.bpf.c) writes it into the
 * `ioam_records` ring buffer and as the streamer ships it to Kafka, unchanged,
 * inside an ioam_batch (the shared envelope of batch_envelope.h, magic "IOB1")
 * on topic `segscope.ioam.records`.
 *
 * What the packet carried (schemas/IOAM.md has the wire formats):
 *   - the IOAM Pre-allocated Trace (RFC 9197 §4.4, RFC 9486 Hop-by-Hop option)
 *     the ingress edge inserted with its own entry filled, and every IOAM
 *     transit node (the Linux kernel, ioam6_enabled) filled with its entry;
 *   - the IOAM Edge-to-Edge option (RFC 9197 §4.6, RFC 9486 Destination
 *     option) with the flow's 64-bit sequence number and the ingress time.
 * and what the egress adds: its receive time (the kernel fills the egress
 * node's own trace entry only after XDP) and which device it arrived on.
 *
 * Layout: 256 bytes, little-endian, no implicit padding. Python mirror:
 * schemas/python/segscope_schemas/ioam_record.py. Vectors:
 * schemas/vectors/ioam_batch_*.hex (+ .json with the expected decode).
 *
 * Node entries are copied as on the wire (network byte order inside each
 * entry, trace type 0xF00000: hop limit + node id, ingress/egress interface
 * id, timestamp seconds, timestamp subseconds), in wire order: entries[0] is
 * the node that filled last (nearest the egress), entries[filled - 1] the
 * ingress edge. Trace timestamps are the kernel's: UTC (CLOCK_REALTIME)
 * seconds and MICROseconds; add tai_utc_offset_s to compare them with the
 * TAI nanosecond fields of this record.
 */
#ifndef SEGSCOPE_IOAM_RECORD_H
#define SEGSCOPE_IOAM_RECORD_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

#define IOAM_RECORD_SIZE       256
#define IOAM_RECORD_MAX_NODES  12       /* node entries a record holds (the trace may have more: F_TRUNCATED) */
#define IOAM_NODE_ENTRY_SIZE   16       /* trace type 0xF00000, NodeLen 4 */

/* flags */
#define IOAM_RECORD_F_OVERFLOW   0x1    /* the trace's Overflow flag: a node found no room for its entry */
#define IOAM_RECORD_F_TRUNCATED  0x2    /* more filled entries than IOAM_RECORD_MAX_NODES: the oldest were not copied */

/* One node's entry of a 0xF00000 trace, as on the wire (big-endian fields). */
struct ioam_node_entry {
	__u32 hop_limit_node_id;  /* hop limit (8) | node id (24) */
	__u16 ingress_if_id;      /* 0xffff: unavailable */
	__u16 egress_if_id;       /* 0xffff: unavailable */
	__u32 ts_sec;             /* UTC seconds */
	__u32 ts_subsec;          /* microseconds (the Linux kernel's format) */
};

struct ioam_record {
	__u64 rx_tai_ns;          /*   0 egress receive, bpf_ktime_get_tai_ns() in XDP */
	__u64 tx_tai_ns;          /*   8 the E2E option's ingress timestamp (PTPv2 truncated: TAI s + ns) */
	__u64 seq;                /*  16 the E2E option's 64-bit sequence number (per flow, sampled packets) */
	__u32 flow_id;            /*  24 the in-line monitor's flow id (egress lookup by SID list) */
	__u32 ifindex;            /*  28 device the packet arrived on at the egress */
	__u32 node_id;            /*  32 the egress node's IOAM node id (24 bits) */
	__u16 namespace_id;       /*  36 IOAM Namespace-ID of trace and E2E option */
	__u8  slots;              /*  38 node entries the trace had room for */
	__u8  filled;             /*  39 node entries filled (copied: min(filled, IOAM_RECORD_MAX_NODES)) */
	__u32 trace_type;         /*  40 24-bit IOAM-Trace-Type (0xF00000) */
	__u8  trace_flags;        /*  44 the trace's 4 flag bits (RFC 9197: Overflow = 0x8) */
	__u8  hop_limit;          /*  45 outer hop limit on arrival at the egress */
	__s16 tai_utc_offset_s;   /*  46 TAI - UTC of the egress node (trace timestamps are UTC) */
	__u32 flags;              /*  48 IOAM_RECORD_F_* */
	__u32 reserved0;          /*  52 zero */
	__u64 reserved1;          /*  56 zero */
	struct ioam_node_entry entries[IOAM_RECORD_MAX_NODES];  /* 64 */
};

#ifdef __cplusplus
static_assert(sizeof(struct ioam_record) == IOAM_RECORD_SIZE, "ioam_record size");
#elif !defined(__bpf__)
_Static_assert(sizeof(struct ioam_record) == IOAM_RECORD_SIZE, "ioam_record size");
#endif

#endif /* SEGSCOPE_IOAM_RECORD_H */
