// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* Helpers shared by the datapath loaders. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/if_link.h>
#include <net/if.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/timex.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include "loader_util.h"
#include "xdp_chain.h"

#define BPF_FS_ROOT  "/sys/fs/bpf"
#define BPF_FS_MAGIC_NR 0xcafe4a11

extern const char *loader_name;   /* set by each loader's main() */

void die_msg(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", loader_name);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

bool parse_u64_arg(const char *what, const char *text, uint64_t min, uint64_t max, uint64_t *out)
{
	char *end;
	unsigned long long v;

	if (!text || !*text || *text == '-') {
		die_msg("%s: expected a number in [%llu, %llu], got '%s'", what,
			(unsigned long long)min, (unsigned long long)max, text ? text : "");
		return false;
	}
	errno = 0;
	v = strtoull(text, &end, 0);
	if (errno || *end || v < min || v > max) {
		die_msg("%s: expected a number in [%llu, %llu], got '%s'", what,
			(unsigned long long)min, (unsigned long long)max, text);
		return false;
	}
	*out = v;
	return true;
}

bool parse_s64_arg(const char *what, const char *text, int64_t min, int64_t max, int64_t *out)
{
	char *end;
	long long v;

	errno = 0;
	v = text && *text ? strtoll(text, &end, 0) : 0;
	if (!text || !*text || errno || *end || v < min || v > max) {
		die_msg("%s: expected a number in [%lld, %lld], got '%s'", what,
			(long long)min, (long long)max, text ? text : "");
		return false;
	}
	*out = v;
	return true;
}

int parse_choice_arg(const char *what, const char *text, const char *const *choices, int n)
{
	for (int i = 0; i < n; i++)
		if (text && !strcmp(text, choices[i]))
			return i;
	if (n == 2)
		die_msg("%s: expected %s or %s, got '%s'", what, choices[0], choices[1], text ? text : "");
	else
		die_msg("%s: invalid value '%s'", what, text ? text : "");
	return -1;
}

int host_tai_utc_offset(int32_t *offset_s)
{
	struct timex tx = {};

	if (adjtimex(&tx) < 0) {
		die_msg("adjtimex: %s (pass --tai-offset)", strerror(errno));
		return -1;
	}
	*offset_s = tx.tai;   /* 0 when nothing (NTP/PTP daemon) set it: then CLOCK_TAI == CLOCK_REALTIME */
	return 0;
}

bool parse_ipv6_arg(const char *what, const char *text, uint8_t out[16])
{
	if (!text || inet_pton(AF_INET6, text, out) != 1) {
		die_msg("%s: '%s' is not an IPv6 address", what, text ? text : "");
		return false;
	}
	return true;
}

int ensure_bpffs(void)
{
	struct statfs st;

	if (statfs(BPF_FS_ROOT, &st) == 0 && st.f_type == BPF_FS_MAGIC_NR)
		return 0;
	if (mount("bpf", BPF_FS_ROOT, "bpf", 0, NULL)) {
		die_msg("cannot mount bpffs on %s: %s", BPF_FS_ROOT, strerror(errno));
		return -errno;
	}
	return 0;
}

int mkdir_p(const char *path)
{
	char buf[PATH_MAX];
	size_t len = strlen(path);

	if (len >= sizeof(buf))
		return -ENAMETOOLONG;
	memcpy(buf, path, len + 1);
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(buf, 0700) && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	if (mkdir(buf, 0700) && errno != EEXIST)
		return -errno;
	return 0;
}

int enter_netns(const char *netns)
{
	char path[PATH_MAX];
	int fd;

	if (!netns)
		return 0;
	snprintf(path, sizeof(path), "/run/netns/%s", netns);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		die_msg("--netns: network namespace '%s' not found (%s: %s)", netns, path, strerror(errno));
		return -ENOENT;
	}
	if (setns(fd, CLONE_NEWNET)) {
		int err = -errno;

		die_msg("--netns: setns(%s) failed: %s", path, strerror(errno));
		close(fd);
		return err;
	}
	close(fd);
	return 0;
}

int resolve_ifindex(const char *dev)
{
	unsigned int ifindex = if_nametoindex(dev);

	if (!ifindex) {
		die_msg("--dev: no interface '%s' in this network namespace", dev);
		return -ENODEV;
	}
	return ifindex;
}

static bool is_internal_map(const struct bpf_map *map)
{
	return strchr(bpf_map__name(map), '.') != NULL;   /* .rodata, .bss, ... */
}

int pin_object(struct bpf_object *obj, struct bpf_program *prog, const char *dir)
{
	return pin_object_as(obj, prog, dir, PROG_PIN_NAME, false);
}

int reuse_pinned_maps(struct bpf_object *obj, const char *dir, bool *none)
{
	char path[PATH_MAX];
	struct bpf_map *map;

	*none = true;
	bpf_object__for_each_map(map, obj) {
		int fd, err;

		/* the chain's maps: xdp_chain_reuse_maps */
		if (is_internal_map(map) || !strncmp(bpf_map__name(map), "xdp_chain_", 10))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, bpf_map__name(map));
		fd = bpf_obj_get(path);
		if (fd < 0)
			continue;
		*none = false;
		err = bpf_map__reuse_fd(map, fd);
		close(fd);
		if (err) {
			die_msg("cannot use %s: %s", path, strerror(-err));
			return err;
		}
	}
	return 0;
}

int pin_object_as(struct bpf_object *obj, struct bpf_program *prog, const char *dir, const char *prog_pin,
		  bool reused)
{
	char path[PATH_MAX];
	struct bpf_map *map;
	int err;

	bpf_object__for_each_map(map, obj) {
		/* the chain's maps are pinned once, in <instance>/xdp_chain (xdp_chain.c) */
		if (is_internal_map(map) || !strncmp(bpf_map__name(map), "xdp_chain_", 10))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, bpf_map__name(map));
		if (reused && access(path, F_OK) == 0)
			continue;
		err = bpf_map__pin(map, path);
		if (err) {
			die_msg("cannot pin map %s: %s", path, strerror(-err));
			return err;
		}
	}
	snprintf(path, sizeof(path), "%s/%s", dir, prog_pin);
	err = bpf_program__pin(prog, path);
	if (err)
		die_msg("cannot pin program %s: %s", path, strerror(-err));
	return err;
}

int unpin_dir(const char *dir)
{
	char path[PATH_MAX];
	struct dirent *de;
	DIR *d = opendir(dir);

	if (!d)
		return -errno;
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		if (unlink(path))
			die_msg("cannot remove pin %s: %s", path, strerror(errno));
	}
	closedir(d);
	if (rmdir(dir)) {
		die_msg("cannot remove %s: %s", dir, strerror(errno));
		return -errno;
	}
	/* the instance dir (e.g. /sys/fs/bpf/segscope/<instance>) goes once its last program is gone */
	snprintf(path, sizeof(path), "%s", dir);
	char *slash = strrchr(path, '/');
	if (slash && slash != path) {
		*slash = '\0';
		rmdir(path);   /* fails with ENOTEMPTY while other pins live there: fine */
	}
	return 0;
}

int check_netns_exists(const char *netns)
{
	char path[PATH_MAX];

	if (!netns)
		return 0;
	snprintf(path, sizeof(path), "/run/netns/%s", netns);
	if (access(path, F_OK)) {
		die_msg("--netns: network namespace '%s' not found (%s)", netns, path);
		return -ENOENT;
	}
	return 0;
}

int open_pinned(const char *dir, const char *name)
{
	char path[PATH_MAX];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	fd = bpf_obj_get(path);
	if (fd < 0)
		die_msg("--pin-dir: cannot open %s (%s); is the program attached with this --pin-dir?",
			path, strerror(errno));
	return fd;
}

uint32_t prog_id_of(int fd)
{
	struct bpf_prog_info info = {};
	uint32_t len = sizeof(info);

	if (bpf_obj_get_info_by_fd(fd, &info, &len))
		return 0;
	return info.id;
}

/* ---- TC filters, egress or ingress (see loader_util.h) ---- */

static int tc_hook_for(const char *netns, const char *dev, bool ingress, struct bpf_tc_hook *hook)
{
	int ifindex;

	if (enter_netns(netns))
		return -ENOENT;
	ifindex = resolve_ifindex(dev);
	if (ifindex < 0)
		return ifindex;
	memset(hook, 0, sizeof(*hook));
	hook->sz = sizeof(*hook);
	hook->ifindex = ifindex;
	hook->attach_point = ingress ? BPF_TC_INGRESS : BPF_TC_EGRESS;
	return 0;
}

int tc_filter_attach(const char *netns, const char *dev, bool ingress, int prog_fd, uint32_t handle,
		     uint32_t priority)
{
	LIBBPF_OPTS(bpf_tc_opts, opts, .handle = handle, .priority = priority, .prog_fd = prog_fd);
	const char *where = ingress ? "ingress" : "egress";
	struct bpf_tc_hook hook;
	int err = tc_hook_for(netns, dev, ingress, &hook);

	if (err)
		return err;
	err = bpf_tc_hook_create(&hook);   /* the clsact qdisc; it may exist already (other filters) */
	if (err && err != -EEXIST) {
		die_msg("--dev: cannot create the clsact qdisc on %s: %s", dev, strerror(-err));
		return err;
	}
	err = bpf_tc_attach(&hook, &opts);   /* no BPF_TC_F_REPLACE: refuse to replace another filter */
	if (err == -EEXIST)
		die_msg("--dev: %s already has a TC %s filter at handle 0x%x prio 0x%x; detach it first",
			dev, where, handle, priority);
	else if (err)
		die_msg("--dev: TC %s attach to %s failed: %s", where, dev, strerror(-err));
	return err;
}

int tc_filter_detach_if_ours(const char *netns, const char *dev, bool ingress, const char *dir, uint32_t handle,
			     uint32_t priority, uint32_t *our_id)
{
	int prog_fd = open_pinned(dir, PROG_PIN_NAME);

	if (prog_fd < 0)
		return prog_fd;
	*our_id = prog_id_of(prog_fd);
	close(prog_fd);
	return tc_filter_detach_id(netns, dev, ingress, *our_id, handle, priority);
}

int tc_filter_detach_id(const char *netns, const char *dev, bool ingress, uint32_t our_id, uint32_t handle,
			uint32_t priority)
{
	LIBBPF_OPTS(bpf_tc_opts, opts, .handle = handle, .priority = priority);
	struct bpf_tc_hook hook;
	int err;

	if (tc_hook_for(netns, dev, ingress, &hook))
		return -ENODEV;
	if (bpf_tc_query(&hook, &opts) || opts.prog_id != our_id)
		return 0;
	LIBBPF_OPTS(bpf_tc_opts, del, .handle = handle, .priority = priority);
	err = bpf_tc_detach(&hook, &del);
	if (err) {
		die_msg("--dev: detach from %s failed: %s", dev, strerror(-err));
		return err;
	}
	return 1;
}

int tc_member_subcommand(const char *name, const char *cmd, const char *netns, const char *dev, const char *dir,
			 bool ingress, uint32_t handle, uint32_t priority)
{
	const char *where = ingress ? "ingress" : "egress";
	uint32_t our_id = 0;
	int prog_fd, r, rc = 0;

	if (!strcmp(cmd, "attach-dev")) {
		prog_fd = open_pinned(dir, PROG_PIN_NAME);
		if (prog_fd < 0)
			return EXIT_FAIL;
		r = tc_filter_attach(netns, dev, ingress, prog_fd, handle, priority);
		close(prog_fd);
		if (!r)
			printf("%s (pinned in %s) also attached to %s %s\n", name, dir, dev, where);
		return r ? EXIT_FAIL : EXIT_OK;
	}
	r = tc_filter_detach_if_ours(netns, dev, ingress, dir, handle, priority, &our_id);
	if (!strcmp(cmd, "detach-dev")) {
		if (r == 0)
			die_msg("--dev: program %u pinned in %s is not attached to %s %s", our_id, dir, dev, where);
		return r == 1 ? EXIT_OK : EXIT_FAIL;
	}
	if (r == -ENODEV || (r < 0 && !our_id))   /* no such device, or no pins (said) */
		return EXIT_FAIL;
	if (r < 0)
		rc = r;
	else if (r == 0)
		die_msg("warning: program %u pinned in %s is not attached to %s %s; removing pins only", our_id, dir,
			dev, where);
	if (unpin_dir(dir))
		rc = rc ? rc : -EIO;
	return rc ? EXIT_FAIL : EXIT_OK;
}

int tc_egress_attach(const char *netns, const char *dev, int prog_fd, uint32_t handle, uint32_t priority)
{
	return tc_filter_attach(netns, dev, false, prog_fd, handle, priority);
}

int tc_egress_detach_if_ours(const char *netns, const char *dev, const char *dir, uint32_t handle,
			     uint32_t priority, uint32_t *our_id)
{
	return tc_filter_detach_if_ours(netns, dev, false, dir, handle, priority, our_id);
}

int member_subcommand(const char *cmd, const char *netns, const char *dev, const char *dir, int role)
{
	bool show = !strcmp(cmd, "chain");
	char inst[PATH_MAX];
	int err;

	if ((!show && !require_arg(dev, "--dev")) || !require_arg(dir, "--pin-dir"))
		return EXIT_USAGE;
	if (check_netns_exists(netns))
		return EXIT_FAIL;
	if (show)
		err = xdp_member_instance_dir(dir, inst, sizeof(inst)) ? xdp_chain_show(inst, netns) : -EINVAL;
	else if (!strcmp(cmd, "attach-dev"))
		err = xdp_member_attach_dev(netns, dev, dir, role);
	else if (!strcmp(cmd, "detach-dev"))
		err = xdp_member_detach_dev(netns, dev, dir, role);
	else
		err = xdp_member_detach(netns, dev, dir, role);
	if (err || show)
		return err ? EXIT_FAIL : EXIT_OK;
	if (!strcmp(cmd, "attach-dev"))
		printf("%s (pinned in %s) also runs on %s\n", loader_name, dir, dev);
	else if (!strcmp(cmd, "detach-dev"))
		printf("%s left %s; still pinned in %s\n", loader_name, dev, dir);
	else
		printf("%s left %s, pins removed\n", loader_name, dev);
	return EXIT_OK;
}

int print_counters(const char *dir, const char *map_name, const char *const *names,
		   unsigned int n, bool json)
{
	int ncpu = libbpf_num_possible_cpus();
	int fd = open_pinned(dir, map_name);
	uint64_t *values;

	if (fd < 0)
		return fd;
	if (ncpu <= 0) {
		close(fd);
		return -EINVAL;
	}
	values = calloc(ncpu, sizeof(*values));
	if (!values) {
		close(fd);
		return -ENOMEM;
	}
	if (json)
		putchar('{');
	for (uint32_t key = 0; key < n; key++) {
		uint64_t total = 0;

		if (bpf_map_lookup_elem(fd, &key, values)) {
			die_msg("lookup of counter %u in %s/%s failed: %s", key, dir, map_name, strerror(errno));
			free(values);
			close(fd);
			return -errno;
		}
		for (int cpu = 0; cpu < ncpu; cpu++)
			total += values[cpu];
		if (json)
			printf("%s\"%s\": %llu", key ? ", " : "", names[key], (unsigned long long)total);
		else
			printf("%-24s %llu\n", names[key], (unsigned long long)total);
	}
	if (json)
		printf("}\n");
	free(values);
	close(fd);
	return 0;
}

static int hex_value(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

static const char *xdp_action_name(uint32_t action)
{
	static const char *const names[] = { "XDP_ABORTED", "XDP_DROP", "XDP_PASS", "XDP_TX", "XDP_REDIRECT" };

	return action < 5 ? names[action] : "unknown";
}

int test_run_pinned(const char *dir, const char *hex, int repeat)
{
	size_t hex_len = strlen(hex), len = hex_len / 2;
	unsigned char *in, *out;
	size_t out_cap = len + 512;   /* room for headers the program may add */
	int prog_fd, err;

	if (hex_len % 2 || len == 0) {
		die_msg("--hex: expected an even, non-zero number of hex digits, got %zu", hex_len);
		return -EINVAL;
	}
	in = malloc(len);
	out = malloc(out_cap);
	if (!in || !out)
		return -ENOMEM;
	for (size_t i = 0; i < len; i++) {
		int hi = hex_value(hex[2 * i]), lo = hex_value(hex[2 * i + 1]);

		if (hi < 0 || lo < 0) {
			die_msg("--hex: not a hex digit at position %zu", 2 * i);
			free(in);
			free(out);
			return -EINVAL;
		}
		in[i] = hi << 4 | lo;
	}
	prog_fd = open_pinned(dir, PROG_PIN_NAME);
	if (prog_fd < 0) {
		free(in);
		free(out);
		return prog_fd;
	}
	LIBBPF_OPTS(bpf_test_run_opts, opts,
		    .data_in = in, .data_size_in = len,
		    .data_out = out, .data_size_out = out_cap,
		    .repeat = repeat);
	err = bpf_prog_test_run_opts(prog_fd, &opts);
	if (err) {
		die_msg("BPF_PROG_TEST_RUN failed: %s", strerror(errno));
	} else {
		/* duration: average ns per run over --repeat runs (the kernel's measurement) */
		printf("{\"retval\": %u, \"action\": \"%s\", \"duration_ns\": %u, \"data_out\": \"",
		       opts.retval, xdp_action_name(opts.retval), opts.duration);
		for (uint32_t i = 0; i < opts.data_size_out && i < out_cap; i++)
			printf("%02x", out[i]);
		printf("\"}\n");
	}
	close(prog_fd);
	free(in);
	free(out);
	return err;
}

bool require_arg(const char *value, const char *name)
{
	if (!value)
		die_msg("missing required %s", name);
	return value != NULL;
}

int prepare_pin_dir(const char *netns, const char *dir, const char *what)
{
	char prog_path[4096];
	int err;

	if (check_netns_exists(netns) || ensure_bpffs())
		return -1;
	snprintf(prog_path, sizeof(prog_path), "%s/%s", dir, PROG_PIN_NAME);
	if (access(prog_path, F_OK) == 0) {
		die_msg("--pin-dir: %s already holds an attached %s; run detach first", dir, what);
		return -1;
	}
	err = mkdir_p(dir);
	if (err) {
		die_msg("--pin-dir: cannot create %s: %s", dir, strerror(-err));
		return -1;
	}
	return 0;
}

int write_config_map(int fd, const void *cfg, const char *map_name)
{
	uint32_t zero = 0;
	int err = bpf_map_update_elem(fd, &zero, cfg, BPF_ANY);

	if (err)
		die_msg("update of %s failed: %s", map_name, strerror(errno));
	return err;
}

int run_subcommand(const struct loader_cmd *cmds, const char *cmd, void *args, const void *ctx)
{
	for (; cmds->name; cmds++)
		if (!strcmp(cmds->name, cmd))
			return cmds->run(args, ctx);
	die_msg("unknown command '%s'", cmd);
	return -1;
}
