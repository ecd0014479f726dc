/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Shared between ringbuf_gen.bpf.c and its loader ringbuf_gen.c: a synthetic
 * stamp_record source for streamer tests and benchmarks (no network needed).
 */
#ifndef SEGSCOPE_RINGBUF_GEN_H
#define SEGSCOPE_RINGBUF_GEN_H

/* Per-run state in .bss; the loader reads it back after BPF_PROG_TEST_RUN. */
#define RINGBUF_GEN_DEFAULT_SIZE (64u << 20)
#define RINGBUF_GEN_MAX_PER_RUN  64   /* records written by one program run, at most */

/* --records: what the program writes */
#define RINGBUF_GEN_STAMP 0
#define RINGBUF_GEN_IOAM  1

/* The synthetic IOAM record of (flow, seq): tests check every record against these. */
#define RINGBUF_GEN_IOAM_TX_NS(flow, seq)  (1800000000000000000ULL + (__u64)(flow) * 1000000000ULL + (__u64)(seq) * 1000ULL)
#define RINGBUF_GEN_IOAM_RX_NS(flow, seq)  (RINGBUF_GEN_IOAM_TX_NS(flow, seq) + 5000ULL + (__u64)(seq) % 7)
#define RINGBUF_GEN_IOAM_EGRESS_NODE 0xB00B
#define RINGBUF_GEN_IOAM_NODE0       0xA000   /* node ids NODE0 (ingress), NODE0+1, NODE0+2 */
#define RINGBUF_GEN_IOAM_NAMESPACE   123

#endif /* SEGSCOPE_RINGBUF_GEN_H */
