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

#endif /* SEGSCOPE_RINGBUF_GEN_H */
