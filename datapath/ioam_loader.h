/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Command line and map handling shared by the two in-line IOAM loaders
 * (ioam_tx.c: TC insertion, ioam_rx.c: XDP extraction): arguments, pin
 * directories, SID lists, TAI-UTC, stats, test runs. Each loader brings its
 * skeleton, its commands and its flow maps.
 */
#ifndef SEGSCOPE_IOAM_LOADER_H
#define SEGSCOPE_IOAM_LOADER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include "ioam.h"
#include "loader_util.h"
#include "segscope_names.h"   /* schemas/names.toml */

#define IOAM_PIN_ROOT SEGSCOPE_BPFFS_PIN_ROOT

/* ioam_rx's hook (--hook): none given, native XDP in the XDP chain, a TC ingress classifier, or by the
 * device's driver (auto: TC on a veth, XDP elsewhere). One instance runs on each device with its own
 * hook: the XDP entry is pinned as PROG_PIN_NAME, the TC entry as IOAM_RX_TC_PIN, the maps shared. */
enum ioam_hook { IOAM_HOOK_UNSET = 0, IOAM_HOOK_XDP, IOAM_HOOK_TC, IOAM_HOOK_AUTO };
#define IOAM_RX_TC_PIN "prog_tc"

struct ioam_args {
	const char *netns, *dev, *instance, *pin_dir, *sids, *match_src, *match_dst, *hex;
	const char *prefix, *tunsrc;          /* ioam_lwt: the route */
	const char *flow_sids;                /* ioam_lwt: the flow the route's packets count in (default --sids) */
	char pin_dir_buf[512];
	uint64_t flow_id, namespace_id, node_id, trace_nodes, sample_every, sample_interval_us;
	uint64_t match_proto, match_sport, match_dport, if_id, ringbuf_size, count, timeout_ms, repeat;
	uint64_t table, metric, mtu;          /* ioam_lwt: the route (mtu 0: the device's) */
	int64_t tai_offset;
	bool have_flow_id, have_namespace_id, have_node_id, have_trace_nodes, have_sample_every;
	bool have_sample_interval, have_match_proto, have_match_sport, have_match_dport, have_if_id;
	bool have_tai_offset, json, fixed_next_hop;
	bool alternate;                       /* ioam_rx add-flow: another SID list of an existing flow */
	bool paused;                          /* ioam_lwt attach-route: encapsulate only */
	uint64_t first_seq;                   /* ioam_tx add-flow: the first E2E sequence number (default 0) */
	enum ioam_hook hook;                  /* ioam_rx attach, attach-dev: where; test-run: which entry */
};

struct ioam_prog {
	const char *name;                     /* "ioam_tx" / "ioam_rx": pin subdirectory, messages */
	const struct loader_cmd *commands;    /* run(args = struct ioam_args *, ctx = this) */
	const char *usage;
	const char *const *counter_names;
	unsigned int n_counters;
	const char *stats_map;
	bool is_tc;                           /* test-run names TC verdicts */
};

/* Parse argv (after the command word), run the command; returns the exit code. */
int ioam_main(const struct ioam_prog *p, int argc, char **argv);

/* --pin-dir, else IOAM_PIN_ROOT/<instance>/<prog>; false after a message naming the flag. */
bool ioam_resolve_pin_dir(const struct ioam_prog *p, struct ioam_args *a);
/* "a,b,c" in travel order -> key in SRH wire order (sids[0] = c, the final segment). */
bool ioam_parse_sids(const char *text, struct altmark_sidlist_key *key);
void ioam_print_sids_json(const struct altmark_sidlist_key *key);
uint64_t ioam_tai_now_ns(void);
/* TAI - UTC: --tai-offset, else the kernel's (adjtimex). */
int ioam_tai_offset(const struct ioam_args *a, int32_t *offset_s);

/* The shared commands (ctx = the struct ioam_prog). */
int ioam_run_stats(void *args, const void *prog);
int ioam_run_test_run(void *args, const void *prog);

/*
 * The key of the flow whose value (value_size bytes, flow_id its first __u32,
 * as in both flow structs) holds flow_id: 1 found, 0 none, <0 error.
 */
int ioam_find_flow_id(int flows_fd, size_t value_size, uint32_t flow_id, struct altmark_sidlist_key *key_out);

#endif /* SEGSCOPE_IOAM_LOADER_H */
