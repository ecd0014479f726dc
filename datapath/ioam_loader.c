// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Shared part of the in-line IOAM loaders (see ioam_loader.h): arguments,
 * pin directories, SID lists, TAI-UTC, stats and test runs.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <limits.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include "ioam_loader.h"

enum { OPT_NETNS = 256, OPT_DEV, OPT_INSTANCE, OPT_PIN_DIR, OPT_SIDS, OPT_FLOW_ID, OPT_NAMESPACE_ID, OPT_NODE_ID,
       OPT_TRACE_NODES, OPT_SAMPLE_EVERY, OPT_SAMPLE_INTERVAL_US, OPT_MATCH_SRC, OPT_MATCH_DST, OPT_MATCH_PROTO,
       OPT_MATCH_SPORT, OPT_MATCH_DPORT, OPT_IF_ID, OPT_TAI_OFFSET, OPT_RINGBUF_SIZE, OPT_COUNT, OPT_TIMEOUT_MS,
       OPT_HEX, OPT_REPEAT, OPT_JSON, OPT_PREFIX, OPT_TUNSRC, OPT_TABLE, OPT_METRIC, OPT_MTU, OPT_FIXED_NEXT_HOP,
       OPT_FLOW_SIDS, OPT_ALTERNATE, OPT_PAUSED, OPT_FIRST_SEQ, OPT_HOOK };

static const struct option long_opts[] = {
	{ "netns", required_argument, NULL, OPT_NETNS },
	{ "dev", required_argument, NULL, OPT_DEV },
	{ "instance", required_argument, NULL, OPT_INSTANCE },
	{ "pin-dir", required_argument, NULL, OPT_PIN_DIR },
	{ "sids", required_argument, NULL, OPT_SIDS },
	{ "flow-id", required_argument, NULL, OPT_FLOW_ID },
	{ "namespace-id", required_argument, NULL, OPT_NAMESPACE_ID },
	{ "node-id", required_argument, NULL, OPT_NODE_ID },
	{ "trace-nodes", required_argument, NULL, OPT_TRACE_NODES },
	{ "sample-every", required_argument, NULL, OPT_SAMPLE_EVERY },
	{ "sample-interval-us", required_argument, NULL, OPT_SAMPLE_INTERVAL_US },
	{ "match-src", required_argument, NULL, OPT_MATCH_SRC },
	{ "match-dst", required_argument, NULL, OPT_MATCH_DST },
	{ "match-proto", required_argument, NULL, OPT_MATCH_PROTO },
	{ "match-sport", required_argument, NULL, OPT_MATCH_SPORT },
	{ "match-dport", required_argument, NULL, OPT_MATCH_DPORT },
	{ "if-id", required_argument, NULL, OPT_IF_ID },
	{ "tai-offset", required_argument, NULL, OPT_TAI_OFFSET },
	{ "ringbuf-size", required_argument, NULL, OPT_RINGBUF_SIZE },
	{ "count", required_argument, NULL, OPT_COUNT },
	{ "timeout-ms", required_argument, NULL, OPT_TIMEOUT_MS },
	{ "hex", required_argument, NULL, OPT_HEX },
	{ "repeat", required_argument, NULL, OPT_REPEAT },
	{ "json", no_argument, NULL, OPT_JSON },
	{ "prefix", required_argument, NULL, OPT_PREFIX },
	{ "tunsrc", required_argument, NULL, OPT_TUNSRC },
	{ "table", required_argument, NULL, OPT_TABLE },
	{ "metric", required_argument, NULL, OPT_METRIC },
	{ "mtu", required_argument, NULL, OPT_MTU },
	{ "fixed-next-hop", no_argument, NULL, OPT_FIXED_NEXT_HOP },
	{ "flow-sids", required_argument, NULL, OPT_FLOW_SIDS },
	{ "alternate", no_argument, NULL, OPT_ALTERNATE },
	{ "paused", no_argument, NULL, OPT_PAUSED },
	{ "first-seq", required_argument, NULL, OPT_FIRST_SEQ },
	{ "hook", required_argument, NULL, OPT_HOOK },
	{ "help", no_argument, NULL, 'h' },
	{},
};

/* A numeric flag: parse into *out and set *have; false (message names the flag) when out of range. */
static bool num(const char *flag, uint64_t min, uint64_t max, uint64_t *out, bool *have)
{
	if (!parse_u64_arg(flag, optarg, min, max, out))
		return false;
	if (have)
		*have = true;
	return true;
}

static int parse_args(const struct ioam_prog *p, int argc, char **argv, struct ioam_args *a)
{
	long pagesize = sysconf(_SC_PAGESIZE);
	bool ok = true;
	int opt;

	memset(a, 0, sizeof(*a));
	a->ringbuf_size = IOAM_DEFAULT_RINGBUF;
	a->timeout_ms = 2000;
	a->repeat = 1;
	a->table = 254;   /* main */
	a->metric = 1024; /* the kernel's default for IPv6 routes */
	optind = 1;
	while (ok && (opt = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
		switch (opt) {
		case OPT_NETNS: a->netns = optarg; break;
		case OPT_DEV: a->dev = optarg; break;
		case OPT_INSTANCE: a->instance = optarg; break;
		case OPT_PIN_DIR: a->pin_dir = optarg; break;
		case OPT_SIDS: a->sids = optarg; break;
		case OPT_MATCH_SRC: a->match_src = optarg; break;
		case OPT_MATCH_DST: a->match_dst = optarg; break;
		case OPT_HEX: a->hex = optarg; break;
		case OPT_JSON: a->json = true; break;
		case OPT_PREFIX: a->prefix = optarg; break;
		case OPT_TUNSRC: a->tunsrc = optarg; break;
		case OPT_FIXED_NEXT_HOP: a->fixed_next_hop = true; break;
		case OPT_FLOW_SIDS: a->flow_sids = optarg; break;
		case OPT_ALTERNATE: a->alternate = true; break;
		case OPT_PAUSED: a->paused = true; break;
		case OPT_HOOK: {
			static const char *const hooks[] = { "xdp", "tc", "auto" };
			static const enum ioam_hook values[] = { IOAM_HOOK_XDP, IOAM_HOOK_TC, IOAM_HOOK_AUTO };
			int h = parse_choice_arg("--hook", optarg, hooks, 3);

			ok = h >= 0;
			a->hook = ok ? values[h] : IOAM_HOOK_UNSET;
			break;
		}
		case OPT_FIRST_SEQ: ok = num("--first-seq", 0, UINT64_MAX, &a->first_seq, NULL); break;
		case OPT_TABLE: ok = num("--table", 1, UINT32_MAX, &a->table, NULL); break;
		case OPT_METRIC: ok = num("--metric", 0, UINT32_MAX, &a->metric, NULL); break;
		case OPT_MTU: ok = num("--mtu", 1280, 65535, &a->mtu, NULL); break;
		case OPT_FLOW_ID: ok = num("--flow-id", 0, UINT32_MAX, &a->flow_id, &a->have_flow_id); break;
		case OPT_NAMESPACE_ID:
			ok = num("--namespace-id", 0, UINT16_MAX, &a->namespace_id, &a->have_namespace_id);
			break;
		case OPT_NODE_ID: ok = num("--node-id", 0, IOAM_NODE_ID_MAX, &a->node_id, &a->have_node_id); break;
		case OPT_TRACE_NODES:
			ok = num("--trace-nodes", 1, IOAM_TRACE_MAX_SLOTS, &a->trace_nodes, &a->have_trace_nodes);
			break;
		case OPT_SAMPLE_EVERY:
			ok = num("--sample-every", 1, IOAM_SAMPLE_EVERY_MAX, &a->sample_every, &a->have_sample_every);
			break;
		case OPT_SAMPLE_INTERVAL_US:
			ok = num("--sample-interval-us", 1, IOAM_SAMPLE_INTERVAL_US_MAX, &a->sample_interval_us,
				 &a->have_sample_interval);
			break;
		case OPT_MATCH_PROTO: ok = num("--match-proto", 0, 255, &a->match_proto, &a->have_match_proto); break;
		case OPT_MATCH_SPORT: ok = num("--match-sport", 0, 65535, &a->match_sport, &a->have_match_sport); break;
		case OPT_MATCH_DPORT: ok = num("--match-dport", 0, 65535, &a->match_dport, &a->have_match_dport); break;
		case OPT_IF_ID: ok = num("--if-id", 0, UINT16_MAX, &a->if_id, &a->have_if_id); break;
		case OPT_COUNT: ok = num("--count", 0, UINT32_MAX, &a->count, NULL); break;
		case OPT_TIMEOUT_MS: ok = num("--timeout-ms", 0, 3600000, &a->timeout_ms, NULL); break;
		case OPT_REPEAT: ok = num("--repeat", 1, 100000000, &a->repeat, NULL); break;
		case OPT_TAI_OFFSET:
			ok = parse_s64_arg("--tai-offset", optarg, TAI_OFFSET_MIN, TAI_OFFSET_MAX, &a->tai_offset);
			a->have_tai_offset = true;
			break;
		case OPT_RINGBUF_SIZE:
			ok = num("--ringbuf-size", 4096, 1ULL << 30, &a->ringbuf_size, NULL);
			if (ok && (a->ringbuf_size & (a->ringbuf_size - 1) || a->ringbuf_size % (uint64_t)pagesize)) {
				die_msg("--ringbuf-size: %llu is not a power of two multiple of the page size (%ld)",
					(unsigned long long)a->ringbuf_size, pagesize);
				ok = false;
			}
			break;
		case 'h': fputs(p->usage, stdout); exit(EXIT_OK);
		default: fputs(p->usage, stderr); return -1;
		}
	}
	if (!ok)
		return -1;
	if (optind < argc) {
		die_msg("unexpected argument '%s'", argv[optind]);
		return -1;
	}
	return 0;
}

bool ioam_resolve_pin_dir(const struct ioam_prog *p, struct ioam_args *a)
{
	if (a->pin_dir)
		return true;
	if (!require_arg(a->instance, "--instance"))
		return false;
	if (!a->instance[0] || strchr(a->instance, '/') || !strcmp(a->instance, ".") ||
	    !strcmp(a->instance, "..") || strlen(a->instance) > 200) {
		die_msg("--instance: '%s' is not a usable name (no '/', not empty, <= 200 chars)", a->instance);
		return false;
	}
	snprintf(a->pin_dir_buf, sizeof(a->pin_dir_buf), "%s/%s/%s", IOAM_PIN_ROOT, a->instance, p->name);
	a->pin_dir = a->pin_dir_buf;
	return true;
}

bool ioam_parse_sids(const char *text, struct altmark_sidlist_key *key)
{
	struct in6_addr travel[ALTMARK_MAX_SIDS];
	char buf[64 * ALTMARK_MAX_SIDS], *save = NULL, *tok;
	unsigned int n = 0;

	memset(key, 0, sizeof(*key));
	if (!text || !*text || strlen(text) >= sizeof(buf)) {
		die_msg("--sids: expected 1..%d comma-separated IPv6 addresses, got '%s'", ALTMARK_MAX_SIDS,
			text ? text : "");
		return false;
	}
	strcpy(buf, text);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (n == ALTMARK_MAX_SIDS) {
			die_msg("--sids: more than %d SIDs in '%s'", ALTMARK_MAX_SIDS, text);
			return false;
		}
		if (inet_pton(AF_INET6, tok, &travel[n]) != 1) {
			die_msg("--sids: '%s' is not an IPv6 address", tok);
			return false;
		}
		n++;
	}
	if (!n) {
		die_msg("--sids: no SID in '%s'", text);
		return false;
	}
	key->nsids = n;
	for (unsigned int i = 0; i < n; i++)
		key->sids[i] = travel[n - 1 - i];
	return true;
}

void ioam_print_sids_json(const struct altmark_sidlist_key *key)
{
	char text[INET6_ADDRSTRLEN];

	putchar('[');
	for (int i = (int)key->nsids - 1, first = 1; i >= 0 && i < ALTMARK_MAX_SIDS; i--, first = 0) {
		inet_ntop(AF_INET6, &key->sids[i], text, sizeof(text));
		printf("%s\"%s\"", first ? "" : ", ", text);
	}
	putchar(']');
}

uint64_t ioam_tai_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_TAI, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

int ioam_tai_offset(const struct ioam_args *a, int32_t *offset_s)
{
	if (a->have_tai_offset) {
		*offset_s = (int32_t)a->tai_offset;
		return 0;
	}
	return host_tai_utc_offset(offset_s);
}

int ioam_find_flow_id(int flows_fd, size_t value_size, uint32_t flow_id, struct altmark_sidlist_key *key_out)
{
	struct altmark_sidlist_key key, next;
	uint8_t value[512];
	void *prev = NULL;

	if (value_size > sizeof(value))
		return -EINVAL;
	while (!bpf_map_get_next_key(flows_fd, prev, &next)) {
		uint32_t id;

		key = next;
		prev = &key;
		if (bpf_map_lookup_elem(flows_fd, &key, value))
			continue;   /* deleted meanwhile */
		memcpy(&id, value, sizeof(id));
		if (id == flow_id) {
			*key_out = key;
			return 1;
		}
	}
	return 0;
}

int ioam_run_stats(void *args, const void *prog)
{
	const struct ioam_prog *p = prog;
	struct ioam_args *a = args;

	if (!ioam_resolve_pin_dir(p, a))
		return EXIT_USAGE;
	return print_counters(a->pin_dir, p->stats_map, p->counter_names, p->n_counters, a->json) ? EXIT_FAIL
												   : EXIT_OK;
}

static const char *verdict_name(bool tc, int32_t retval)
{
	static const char *const xdp[] = { "XDP_ABORTED", "XDP_DROP", "XDP_PASS", "XDP_TX", "XDP_REDIRECT" };

	if (!tc)
		return retval >= 0 && retval < 5 ? xdp[retval] : "unknown";
	switch (retval) {
	case -1: return "TC_ACT_UNSPEC";
	case 0: return "TC_ACT_OK";
	case 2: return "TC_ACT_SHOT";
	default: return "unknown";
	}
}

static int hex_nibble(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* BPF_PROG_TEST_RUN of <pin dir>/prog on --hex FRAME; one JSON line (retval signed: TC_ACT_UNSPEC is -1). */
int ioam_run_test_run(void *args, const void *prog)
{
	const struct ioam_prog *p = prog;
	struct ioam_args *a = args;
	size_t hex_len, len;
	unsigned char *in = NULL, *out = NULL;
	int prog_fd, err = EXIT_FAIL;
	bool tc = p->is_tc;

	if (!ioam_resolve_pin_dir(p, a) || !require_arg(a->hex, "--hex"))
		return EXIT_USAGE;
	hex_len = strlen(a->hex);
	len = hex_len / 2;
	if (hex_len % 2 || !len) {
		die_msg("--hex: expected an even, non-zero number of hex digits, got %zu", hex_len);
		return EXIT_USAGE;
	}
	in = malloc(len);
	out = malloc(len + 1024);   /* room for what ioam_tx inserts */
	if (!in || !out)
		goto out;
	for (size_t i = 0; i < len; i++) {
		int hi = hex_nibble(a->hex[2 * i]), lo = hex_nibble(a->hex[2 * i + 1]);

		if (hi < 0 || lo < 0) {
			die_msg("--hex: not a hex digit at position %zu", 2 * i);
			err = EXIT_USAGE;
			goto out;
		}
		in[i] = (unsigned char)(hi << 4 | lo);
	}
	/* ioam_rx's instance may have two entries: --hook tc picks the TC one; without --hook, the XDP
	 * one when there is one */
	{
		char path[PATH_MAX];
		const char *pin = PROG_PIN_NAME;

		snprintf(path, sizeof(path), "%s/%s", a->pin_dir, IOAM_RX_TC_PIN);
		if (a->hook != IOAM_HOOK_XDP && access(path, F_OK) == 0) {
			snprintf(path, sizeof(path), "%s/%s", a->pin_dir, PROG_PIN_NAME);
			if (a->hook == IOAM_HOOK_TC || access(path, F_OK) != 0)
				pin = IOAM_RX_TC_PIN;
		}
		prog_fd = open_pinned(a->pin_dir, pin);
	}
	if (prog_fd < 0)
		goto out;
	{
		struct bpf_prog_info info = {};
		__u32 info_len = sizeof(info);

		/* ioam_rx's instance may be either: its pinned program's type names the verdicts */
		if (!bpf_obj_get_info_by_fd(prog_fd, &info, &info_len) && info.type == BPF_PROG_TYPE_SCHED_CLS)
			tc = true;
	}
	LIBBPF_OPTS(bpf_test_run_opts, opts, .data_in = in, .data_size_in = len, .data_out = out,
		    .data_size_out = len + 1024, .repeat = (int)a->repeat);
	if (bpf_prog_test_run_opts(prog_fd, &opts)) {
		die_msg("BPF_PROG_TEST_RUN failed: %s", strerror(errno));
	} else {
		printf("{\"retval\": %d, \"action\": \"%s\", \"duration_ns\": %u, \"data_out\": \"", (int32_t)opts.retval,
		       verdict_name(tc, (int32_t)opts.retval), opts.duration);
		for (uint32_t i = 0; i < opts.data_size_out && i < len + 1024; i++)
			printf("%02x", out[i]);
		printf("\"}\n");
		err = EXIT_OK;
	}
	close(prog_fd);
out:
	free(in);
	free(out);
	return err;
}

int ioam_main(const struct ioam_prog *p, int argc, char **argv)
{
	struct ioam_args a;
	const char *cmd;
	int rc;

	if (argc < 2) {
		fputs(p->usage, stderr);
		return EXIT_USAGE;
	}
	cmd = argv[1];
	if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
		fputs(p->usage, stdout);
		return EXIT_OK;
	}
	if (parse_args(p, argc - 1, argv + 1, &a))
		return EXIT_USAGE;
	rc = run_subcommand(p->commands, cmd, &a, p);
	if (rc < 0) {
		fputs(p->usage, stderr);
		return EXIT_USAGE;
	}
	return rc;
}
