// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * stamp_collector: loader and control tool of the XDP STAMP collector
 * (Session-Sender receive side).
 *
 *   stamp_collector attach --netns NS --dev IF --pin-dir DIR [--port 862] [--ringbuf-size BYTES]
 *                   [--tai-offset S] [--partial-csum accept|drop]
 *   stamp_collector activate --pin-dir DIR --ssid N --port P [--format ptp|ntp]
 *   stamp_collector set-tai-offset --pin-dir DIR [--tai-offset S]   (default: adjtimex)
 *   stamp_collector deactivate --pin-dir DIR --ssid N
 *   stamp_collector stats --pin-dir DIR [--json]
 *   stamp_collector dump --pin-dir DIR [--count N] [--timeout-ms T]
 *   stamp_collector test-run --pin-dir DIR --hex FRAME
 *   stamp_collector detach --netns NS --dev IF --pin-dir DIR
 *   stamp_collector attach-dev --netns NS --dev IF --pin-dir DIR
 *   stamp_collector detach-dev --netns NS --dev IF --pin-dir DIR
 *   stamp_collector chain [--netns NS] --pin-dir DIR
 *
 * DIR holds this program's pins, by convention
 * /sys/fs/bpf/segscope/<instance>/stamp_collector; the records ring buffer is
 * DIR/stamp_records (struct stamp_record, schemas/c/stamp_record.h). The
 * program runs in the XDP chain of the instance (xdp_chain.h:
 * <instance>/xdp_chain), after altmark_rx and ioam_rx, before stamp_reflector.
 * For attach, --port is the STAMP port replies come from; for activate it
 * is the Session-Sender's local UDP port.
 */
#include <errno.h>
#include <limits.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include "stamp_collector.h"
#include "stamp_record.h"
#include "stamp_test_packet.h"
#include "stamp_collector.skel.h"
#include "loader_util.h"
#include "xdp_chain.h"

const char *loader_name = "stamp_collector";

struct args {
	const char *netns, *dev, *pin_dir, *hex;
	uint64_t port, ssid, ringbuf_size, count, timeout_ms, repeat;
	int64_t tai_offset;
	bool have_port, have_ssid, have_tai_offset, ntp, json;
	bool drop_partial_csum;   /* attach --partial-csum drop */
};

enum { OPT_NETNS = 256, OPT_DEV, OPT_PIN_DIR, OPT_PORT, OPT_SSID, OPT_RINGBUF_SIZE, OPT_JSON,
       OPT_COUNT, OPT_TIMEOUT, OPT_HEX, OPT_REPEAT, OPT_FORMAT, OPT_TAI_OFFSET, OPT_PARTIAL_CSUM };

static const char *const format_names[] = { "ptp", "ntp" };
static const char *const partial_csum_names[] = { "accept", "drop" };

static const struct option long_opts[] = {
	{ "netns", required_argument, NULL, OPT_NETNS },
	{ "dev", required_argument, NULL, OPT_DEV },
	{ "pin-dir", required_argument, NULL, OPT_PIN_DIR },
	{ "port", required_argument, NULL, OPT_PORT },
	{ "ssid", required_argument, NULL, OPT_SSID },
	{ "ringbuf-size", required_argument, NULL, OPT_RINGBUF_SIZE },
	{ "json", no_argument, NULL, OPT_JSON },
	{ "count", required_argument, NULL, OPT_COUNT },
	{ "timeout-ms", required_argument, NULL, OPT_TIMEOUT },
	{ "hex", required_argument, NULL, OPT_HEX },
	{ "repeat", required_argument, NULL, OPT_REPEAT },
	{ "format", required_argument, NULL, OPT_FORMAT },
	{ "tai-offset", required_argument, NULL, OPT_TAI_OFFSET },
	{ "partial-csum", required_argument, NULL, OPT_PARTIAL_CSUM },
	{ "help", no_argument, NULL, 'h' },
	{},
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage:\n"
		"  stamp_collector attach --netns NS --dev IF --pin-dir DIR [--port 862] [--ringbuf-size BYTES]\n"
		"                  [--tai-offset S] [--partial-csum accept|drop]\n"
		"      joins the XDP chain of IF (<dirname DIR>/xdp_chain: altmark_rx and ioam_rx run before it,\n"
		"      stamp_reflector after it on the same device, in any order of attach)\n"
		"      --partial-csum accept (default): collect replies whose UDP checksum is the pseudo-header\n"
		"      sum only (a kernel-socket reflector behind a veth), counted collected_partial_csum;\n"
		"      drop: count them drop_malformed_udp_csum\n"
		"  stamp_collector activate --pin-dir DIR --ssid N(0-65535) --port SENDER_PORT [--format ptp|ntp]\n"
		"  stamp_collector set-tai-offset --pin-dir DIR [--tai-offset S]   (TAI-UTC; default from adjtimex)\n"
		"  stamp_collector deactivate --pin-dir DIR --ssid N\n"
		"  stamp_collector stats --pin-dir DIR [--json]\n"
		"  stamp_collector dump --pin-dir DIR [--count N] [--timeout-ms T]   (JSON lines)\n"
		"  stamp_collector test-run --pin-dir DIR --hex FRAME [--repeat N]\n"
		"  stamp_collector detach --netns NS --dev IF --pin-dir DIR   (leaves IF and every other device, removes pins)\n"
		"  stamp_collector attach-dev --netns NS --dev IF --pin-dir DIR   (the attached program on one more device)\n"
		"  stamp_collector detach-dev --netns NS --dev IF --pin-dir DIR   (from that device only; pins stay)\n"
		"  stamp_collector chain [--netns NS] --pin-dir DIR   (JSON: every device of the instance's XDP chain\n"
		"                  and its members in the order they see a packet)\n"
		"exit codes: 0 ok, 1 failed (dump: fewer than --count records before the timeout), 2 bad arguments\n");
}

static int parse_args(int argc, char **argv, struct args *a)
{
	int opt;

	memset(a, 0, sizeof(*a));
	a->port = STAMP_PORT;
	a->ringbuf_size = COLLECTOR_DEFAULT_RINGBUF_SIZE;
	a->timeout_ms = 2000;
	a->repeat = 1;
	optind = 1;
	while ((opt = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
		switch (opt) {
		case OPT_NETNS: a->netns = optarg; break;
		case OPT_DEV: a->dev = optarg; break;
		case OPT_PIN_DIR: a->pin_dir = optarg; break;
		case OPT_PORT:
			if (!parse_u64_arg("--port", optarg, 1, 65535, &a->port))
				return -1;
			a->have_port = true;
			break;
		case OPT_SSID:
			/* 0: a sender without an RFC 8972 SSID (plain RFC 8762) */
			if (!parse_u64_arg("--ssid", optarg, 0, 65535, &a->ssid))
				return -1;
			a->have_ssid = true;
			break;
		case OPT_RINGBUF_SIZE:
			if (!parse_u64_arg("--ringbuf-size", optarg, 4096, 1ULL << 30, &a->ringbuf_size))
				return -1;
			if (a->ringbuf_size & (a->ringbuf_size - 1) ||
			    a->ringbuf_size % (uint64_t)sysconf(_SC_PAGESIZE)) {
				die_msg("--ringbuf-size: %s is not a power of two multiple of the page size (%ld)",
					optarg, sysconf(_SC_PAGESIZE));
				return -1;
			}
			break;
		case OPT_FORMAT: {
			int i = parse_choice_arg("--format", optarg, format_names, 2);

			if (i < 0)
				return -1;
			a->ntp = i == 1;
			break;
		}
		case OPT_TAI_OFFSET:
			if (!parse_s64_arg("--tai-offset", optarg, TAI_OFFSET_MIN, TAI_OFFSET_MAX, &a->tai_offset))
				return -1;
			a->have_tai_offset = true;
			break;
		case OPT_PARTIAL_CSUM:
			switch (parse_choice_arg("--partial-csum", optarg, partial_csum_names, 2)) {
			case 0: a->drop_partial_csum = false; break;
			case 1: a->drop_partial_csum = true; break;
			default: return -1;
			}
			break;
		case OPT_JSON: a->json = true; break;
		case OPT_COUNT:
			if (!parse_u64_arg("--count", optarg, 0, UINT32_MAX, &a->count))
				return -1;
			break;
		case OPT_TIMEOUT:
			if (!parse_u64_arg("--timeout-ms", optarg, 0, 3600000, &a->timeout_ms))
				return -1;
			break;
		case OPT_HEX: a->hex = optarg; break;
		case OPT_REPEAT:
			if (!parse_u64_arg("--repeat", optarg, 1, 1000000, &a->repeat))
				return -1;
			break;
		case 'h': usage(stdout); exit(EXIT_OK);
		default: usage(stderr); return -1;
		}
	}
	if (optind < argc) {
		die_msg("unexpected argument '%s'", argv[optind]);
		return -1;
	}
	return 0;
}

/* --tai-offset if given, else what the kernel says (adjtimex). */
static int config_from_args(const struct args *a, struct collector_config *cfg)
{
	int32_t offset_s;

	memset(cfg, 0, sizeof(*cfg));
	if (a->have_tai_offset) {
		cfg->tai_utc_offset_s = (int32_t)a->tai_offset;
		return 0;
	}
	if (host_tai_utc_offset(&offset_s))
		return -1;
	cfg->tai_utc_offset_s = offset_s;
	return 0;
}

static int cmd_set_tai_offset(struct args *a)
{
	struct collector_config cfg;
	int fd, err;

	if (!require_arg(a->pin_dir, "--pin-dir"))
		return EXIT_USAGE;
	if (config_from_args(a, &cfg))
		return EXIT_FAIL;
	fd = open_pinned(a->pin_dir, "collector_config");
	if (fd < 0)
		return EXIT_FAIL;
	err = write_config_map(fd, &cfg, "collector_config");
	close(fd);
	return err ? EXIT_FAIL : EXIT_OK;
}

static int cmd_attach(struct args *a)
{
	struct stamp_collector_bpf *skel;
	struct collector_config cfg;
	struct xdp_chain chain;
	char inst[PATH_MAX];
	int err;

	if (!require_arg(a->dev, "--dev") || !require_arg(a->pin_dir, "--pin-dir"))
		return EXIT_USAGE;
	if (config_from_args(a, &cfg))
		return EXIT_FAIL;
	if (prepare_pin_dir(a->netns, a->pin_dir, "collector"))
		return EXIT_FAIL;
	skel = stamp_collector_bpf__open();
	if (!skel) {
		die_msg("cannot open BPF object: %s", strerror(errno));
		unpin_dir(a->pin_dir);
		return EXIT_FAIL;
	}
	skel->rodata->stamp_port = a->port;
	skel->rodata->accept_partial_csum = !a->drop_partial_csum;
	/* the chain is locked from here to its close: no other loader of the instance changes it meanwhile */
	err = xdp_member_instance_dir(a->pin_dir, inst, sizeof(inst)) ? xdp_chain_open(&chain, inst, true) : -EINVAL;
	if (err) {
		unpin_dir(a->pin_dir);
		goto out;
	}
	err = bpf_map__set_max_entries(skel->maps.stamp_records, a->ringbuf_size) ?: xdp_chain_reuse_maps(&chain, skel->obj);
	if (!err) {
		err = stamp_collector_bpf__load(skel);
		if (err)
			die_msg("cannot load BPF program (verifier log above): %s", strerror(-err));
	}
	/* the config is in place before the program sees a packet */
	if (!err)
		err = write_config_map(bpf_map__fd(skel->maps.collector_config), &cfg, "collector_config");
	if (!err)
		err = xdp_member_attach(&chain, skel->obj, skel->progs.stamp_collector, a->netns, a->dev, a->pin_dir,
					XDP_CHAIN_STAMP_COLLECTOR);
	else
		unpin_dir(a->pin_dir);
	xdp_chain_close(&chain);
	if (!err)
		printf("stamp_collector attached to %s%s%s (STAMP port %llu, ring %llu bytes, TAI-UTC %d s, "
		       "partial checksums %s), pins in %s\n",
		       a->dev, a->netns ? " in netns " : "", a->netns ? a->netns : "",
		       (unsigned long long)a->port, (unsigned long long)a->ringbuf_size,
		       cfg.tai_utc_offset_s, a->drop_partial_csum ? "dropped" : "accepted", a->pin_dir);
out:
	stamp_collector_bpf__destroy(skel);
	return err ? EXIT_FAIL : EXIT_OK;
}

static int cmd_set_session(struct args *a, bool active)
{
	struct collector_session sess = {};
	uint16_t ssid;
	int fd, err;

	if (!require_arg(a->pin_dir, "--pin-dir"))
		return EXIT_USAGE;
	if (!a->have_ssid) {
		die_msg("missing required --ssid");
		return EXIT_USAGE;
	}
	if (active && !a->have_port) {
		die_msg("missing required --port (the Session-Sender's local UDP port)");
		return EXIT_USAGE;
	}
	ssid = a->ssid;
	fd = open_pinned(a->pin_dir, "stamp_sessions");
	if (fd < 0)
		return EXIT_FAIL;
	if (!active && bpf_map_lookup_elem(fd, &ssid, &sess)) {
		die_msg("--ssid: session %u is not known to the collector", ssid);
		close(fd);
		return EXIT_FAIL;
	}
	if (active) {
		sess.sender_port = a->port;
		sess.flags = a->ntp ? COLL_SESS_F_NTP : 0;
	}
	sess.active = active;
	err = bpf_map_update_elem(fd, &ssid, &sess, BPF_ANY);
	if (err)
		die_msg("update of session %u failed: %s", ssid, strerror(errno));
	close(fd);
	return err ? EXIT_FAIL : EXIT_OK;
}

struct dump_state {
	uint64_t seen, wanted;
};

static int print_record(void *ctx, void *data, size_t size)
{
	struct dump_state *st = ctx;
	const struct stamp_record *r = data;

	if (size < sizeof(*r))
		return 0;
	printf("{\"t1_ns\": %llu, \"t2_ns\": %llu, \"t3_ns\": %llu, \"t4_ns\": %llu, "
	       "\"sender_seq\": %u, \"reflector_seq\": %u, \"ssid\": %u, \"sender_err_est\": %u, "
	       "\"reflector_err_est\": %u, \"sender_ttl\": %u, \"reply_hop_limit\": %u, "
	       "\"ifindex\": %u, \"flags\": %u}\n",
	       (unsigned long long)r->t1_ns, (unsigned long long)r->t2_ns,
	       (unsigned long long)r->t3_ns, (unsigned long long)r->t4_ns,
	       r->sender_seq, r->reflector_seq, r->ssid, r->sender_err_est, r->reflector_err_est,
	       r->sender_ttl, r->reply_hop_limit, r->ifindex, r->flags);
	st->seen++;
	/* stop consuming once we have what was asked for: the rest stays in the ring */
	return st->wanted && st->seen >= st->wanted ? 1 : 0;
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000ULL + ts.tv_nsec / 1000000;
}

static int cmd_dump(struct args *a)
{
	struct dump_state st = { .wanted = a->count };
	struct ring_buffer *rb;
	uint64_t deadline;
	int fd, err = 0;

	if (!require_arg(a->pin_dir, "--pin-dir"))
		return EXIT_USAGE;
	fd = open_pinned(a->pin_dir, "stamp_records");
	if (fd < 0)
		return EXIT_FAIL;
	rb = ring_buffer__new(fd, print_record, &st, NULL);
	if (!rb) {
		die_msg("ring_buffer__new on %s/stamp_records failed: %s", a->pin_dir, strerror(errno));
		close(fd);
		return EXIT_FAIL;
	}
	deadline = now_ms() + a->timeout_ms;
	while (!st.wanted || st.seen < st.wanted) {
		uint64_t now = now_ms();

		if (now >= deadline)
			break;
		err = ring_buffer__poll(rb, (int)(deadline - now > 100 ? 100 : deadline - now));
		if (err < 0 && err != -EINTR) {
			die_msg("ring_buffer__poll failed: %s", strerror(-err));
			break;
		}
		err = 0;
		fflush(stdout);
	}
	fflush(stdout);
	ring_buffer__free(rb);
	close(fd);
	if (err)
		return EXIT_FAIL;
	if (st.wanted && st.seen < st.wanted) {
		die_msg("only %llu of --count %llu records within --timeout-ms %llu",
			(unsigned long long)st.seen, (unsigned long long)st.wanted,
			(unsigned long long)a->timeout_ms);
		return EXIT_FAIL;
	}
	return EXIT_OK;
}

/* Subcommand handlers of the dispatch table (args is struct args *). */
static int run_attach(void *a, const void *ctx) { (void)ctx; return cmd_attach(a); }
static int run_activate(void *a, const void *ctx) { (void)ctx; return cmd_set_session(a, true); }
static int run_deactivate(void *a, const void *ctx) { (void)ctx; return cmd_set_session(a, false); }
static int run_dump(void *a, const void *ctx) { (void)ctx; return cmd_dump(a); }
static int run_set_tai_offset(void *a, const void *ctx) { (void)ctx; return cmd_set_tai_offset(a); }

static int run_stats(void *args, const void *ctx)
{
	struct args *a = args;

	(void)ctx;
	if (!require_arg(a->pin_dir, "--pin-dir"))
		return EXIT_USAGE;
	return print_counters(a->pin_dir, "stamp_collector_stats", collector_counter_names,
			      COLL_NR_COUNTERS, a->json) ? EXIT_FAIL : EXIT_OK;
}

static int run_test_run(void *args, const void *ctx)
{
	struct args *a = args;

	(void)ctx;
	if (!require_arg(a->pin_dir, "--pin-dir") || !require_arg(a->hex, "--hex"))
		return EXIT_USAGE;
	return test_run_pinned(a->pin_dir, a->hex, a->repeat) ? EXIT_FAIL : EXIT_OK;
}

/* detach, attach-dev, detach-dev, chain: the XDP chain's member commands (loader_util.c) */
static int run_member(const char *cmd, void *args)
{
	struct args *a = args;

	return member_subcommand(cmd, a->netns, a->dev, a->pin_dir, XDP_CHAIN_STAMP_COLLECTOR);
}

static int run_detach(void *a, const void *ctx) { (void)ctx; return run_member("detach", a); }
static int run_attach_dev(void *a, const void *ctx) { (void)ctx; return run_member("attach-dev", a); }
static int run_detach_dev(void *a, const void *ctx) { (void)ctx; return run_member("detach-dev", a); }
static int run_chain(void *a, const void *ctx) { (void)ctx; return run_member("chain", a); }

static const struct loader_cmd commands[] = {
	{"attach", run_attach},
	{"detach", run_detach},
	{"attach-dev", run_attach_dev},
	{"detach-dev", run_detach_dev},
	{"chain", run_chain},
	{"activate", run_activate},
	{"deactivate", run_deactivate},
	{"dump", run_dump},
	{"set-tai-offset", run_set_tai_offset},
	{"stats", run_stats},
	{"test-run", run_test_run},
	{NULL, NULL},
};

int main(int argc, char **argv)
{
	const char *cmd;
	struct args a;
	int rc;

	if (argc < 2) {
		usage(stderr);
		return EXIT_USAGE;
	}
	cmd = argv[1];
	if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
		usage(stdout);
		return EXIT_OK;
	}
	if (parse_args(argc - 1, argv + 1, &a))
		return EXIT_USAGE;

	rc = run_subcommand(commands, cmd, &a, NULL);
	if (rc < 0) {
		usage(stderr);
		return EXIT_USAGE;
	}
	return rc;
}
