/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Helpers shared by the datapath loaders (stamp_reflector, stamp_collector, altmark_tx, altmark_rx). */
#ifndef SEGSCOPE_LOADER_UTIL_H
#define SEGSCOPE_LOADER_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <bpf/libbpf.h>

/* exit codes of every loader command */
#define EXIT_OK     0
#define EXIT_FAIL   1   /* the command was valid but failed (kernel, missing pins, ...) */
#define EXIT_USAGE  2   /* bad command line: the message names the argument */

#define PROG_PIN_NAME "prog"

/* Print "<prog>: <message>\n" to stderr. */
void die_msg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* false (after "missing required <name>") when value is NULL. */
bool require_arg(const char *value, const char *name);

/* Parse an unsigned number in [min, max]; on error print "--<what> ..." and return false. */
bool parse_u64_arg(const char *what, const char *text, uint64_t min, uint64_t max, uint64_t *out);
bool parse_s64_arg(const char *what, const char *text, int64_t min, int64_t max, int64_t *out);
bool parse_ipv6_arg(const char *what, const char *text, uint8_t out[16]);
/* Index of text in choices, or -1 after "<what>: expected A or B, got 'x'". */
int parse_choice_arg(const char *what, const char *text, const char *const *choices, int n);

/* TAI - UTC in seconds as the kernel knows it (struct timex.tai from adjtimex). */
#define TAI_OFFSET_MIN (-1000)
#define TAI_OFFSET_MAX 1000
int host_tai_utc_offset(int32_t *offset_s);

int ensure_bpffs(void);
int mkdir_p(const char *path);
int enter_netns(const char *netns);              /* NULL: stay */
int check_netns_exists(const char *netns);       /* error message names --netns */
int resolve_ifindex(const char *dev);            /* in the current netns; <0 on error */

/*
 * Before loading `what` (e.g. "reflector"): the netns exists, bpffs is mounted,
 * dir holds no attached program yet, and dir exists. Errors name the flag.
 */
int prepare_pin_dir(const char *netns, const char *dir, const char *what);
/* Write slot 0 of an array map holding one config struct; error names the map. */
int write_config_map(int fd, const void *cfg, const char *map_name);

/* Pin all user maps of obj as <dir>/<map name> (the XDP chain's excepted) and prog as <dir>/prog. */
int pin_object(struct bpf_object *obj, struct bpf_program *prog, const char *dir);
/* The same with prog as <dir>/<prog_pin>; reused: a map already pinned there is the one obj uses
 * (bpf_map__reuse_fd before load) and stays as it is. */
int pin_object_as(struct bpf_object *obj, struct bpf_program *prog, const char *dir, const char *prog_pin,
		  bool reused);
/* Before load: the maps already pinned in dir (by a program of the same object loaded earlier, such
 * as another entry) are used as they are (bpf_map__reuse_fd); *none: there were none. */
int reuse_pinned_maps(struct bpf_object *obj, const char *dir, bool *none);
/* Remove every pin in dir and dir itself. */
int unpin_dir(const char *dir);
int open_pinned(const char *dir, const char *name);

/* Id of the BPF program behind fd (0 if unknown). */
uint32_t prog_id_of(int fd);

/*
 * The subcommands every XDP member (stamp_reflector, stamp_collector,
 * altmark_rx) shares, through the XDP chain (xdp_chain.h): cmd "attach-dev",
 * "detach-dev", "detach" (--dev and --pin-dir required) or "chain" (prints
 * the instance's chain as JSON). role: enum xdp_chain_role. Returns the exit
 * code.
 */
int member_subcommand(const char *cmd, const char *netns, const char *dev, const char *dir, int role);

/*
 * TC filters (clsact, direct action) at a fixed handle / priority per
 * program, so detach finds its own again; the lower priority runs first. The
 * clsact qdisc is created if missing and never removed (others may share it).
 * attach refuses to replace another filter at that place. detach: 1 detached,
 * 0 the program pinned in dir is not the filter there (*our_id: its id),
 * -ENODEV no such netns or device; other < 0: no pins, or the detach failed
 * (said).
 */
int tc_filter_attach(const char *netns, const char *dev, bool ingress, int prog_fd, uint32_t handle,
		     uint32_t priority);
int tc_filter_detach_if_ours(const char *netns, const char *dev, bool ingress, const char *dir, uint32_t handle,
			     uint32_t priority, uint32_t *our_id);
/* the same for program our_id (an instance with a program pinned under another name) */
int tc_filter_detach_id(const char *netns, const char *dev, bool ingress, uint32_t our_id, uint32_t handle,
			uint32_t priority);
/* the same on egress */
int tc_egress_attach(const char *netns, const char *dev, int prog_fd, uint32_t handle, uint32_t priority);
int tc_egress_detach_if_ours(const char *netns, const char *dev, const char *dir, uint32_t handle,
			     uint32_t priority, uint32_t *our_id);

/*
 * detach, attach-dev, detach-dev of a loader whose program is pinned in `dir` and runs as the TC
 * filter at handle/priority (ioam_tx on egress, ioam_rx --hook tc on ingress): attach-dev puts the
 * pinned program on --dev too; detach-dev takes it off --dev (an error if it is not ours there);
 * detach takes it off --dev and removes the pins (a warning if it was not attached there). The
 * clsact qdisc stays: other filters may share it. Returns the loader's exit code.
 */
int tc_member_subcommand(const char *name, const char *cmd, const char *netns, const char *dev, const char *dir,
			 bool ingress, uint32_t handle, uint32_t priority);

/* Print a per-CPU counter array summed over CPUs, as text or one JSON object. */
int print_counters(const char *dir, const char *map_name, const char *const *names,
		   unsigned int n, bool json);

/* BPF_PROG_TEST_RUN of <dir>/prog on a hex-encoded frame; prints one JSON line. */
int test_run_pinned(const char *dir, const char *hex, int repeat);

/* One subcommand of a loader: `stamp_reflector attach ...` runs run(args, ctx). args is the
 * loader's parsed command line, ctx what the loader shares between commands (altmark: which
 * program, tx or rx), NULL elsewhere. A table ends with {NULL, NULL}. */
struct loader_cmd {
	const char *name;
	int (*run)(void *args, const void *ctx);
};

/* Run the table's entry named cmd and return its exit code; -1, with a message naming cmd,
 * when there is none (the caller prints its usage and exits EXIT_USAGE). */
int run_subcommand(const struct loader_cmd *cmds, const char *cmd, void *args, const void *ctx);

#endif
