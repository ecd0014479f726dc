// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * ringbuf_gen: loads ringbuf_gen.bpf.o, pins (or reuses) its ring buffer at
 * --pin, and fills it with --count synthetic stamp_records (--records ioam:
 * ioam_records, ringbuf_gen.h says what each holds) by
 * BPF_PROG_TEST_RUN (repeat = --chunk per call). With --count 0 it only
 * creates and pins the ring, so a consumer can attach before any record is
 * written. Prints one JSON line: generated, throttled, rb_full, elapsed_s.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "ringbuf_gen.h"
#include "ringbuf_gen.skel.h"

struct gen_opts {
	const char *pin;
	unsigned long long count;
	unsigned n_ssids, first_ssid, start_seq, chunk, malformed_every, per_run, kind;
	unsigned long long ring_size;
	double timeout_s;
};

static void die_arg(const char *flag, const char *why, const char *value)
{
	fprintf(stderr, "ringbuf_gen: %s: %s%s%s\n", flag, why, value ? ": " : "", value ? value : "");
	fprintf(stderr, "usage: ringbuf_gen --pin PATH [--count N] [--ssids K] [--first-ssid S]\n"
			"                   [--start-seq Q] [--chunk C] [--ring-size BYTES] [--timeout SEC]\n"
			"                   [--malformed-every N] [--per-run 1..64] [--records stamp|ioam]\n"
			"(--records ioam: --ssids/--first-ssid are the flows and their first flow_id)\n");
	exit(2);
}

static unsigned long long parse_u(const char *flag, const char *s, unsigned long long lo,
				  unsigned long long hi)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		die_arg(flag, "out of range or not a number", s);
	return v;
}

static void parse_args(int argc, char **argv, struct gen_opts *o)
{
	static const struct option longopts[] = {
		{ "pin", required_argument, NULL, 'p' },
		{ "count", required_argument, NULL, 'n' },
		{ "ssids", required_argument, NULL, 'k' },
		{ "first-ssid", required_argument, NULL, 's' },
		{ "start-seq", required_argument, NULL, 'q' },
		{ "chunk", required_argument, NULL, 'c' },
		{ "ring-size", required_argument, NULL, 'r' },
		{ "timeout", required_argument, NULL, 't' },
		{ "malformed-every", required_argument, NULL, 'm' },
		{ "per-run", required_argument, NULL, 'b' },
		{ "records", required_argument, NULL, 'R' },
		{ 0 },
	};
	int c;

	*o = (struct gen_opts){ .n_ssids = 1, .first_ssid = 1, .per_run = 1, .chunk = 65536,
				.ring_size = RINGBUF_GEN_DEFAULT_SIZE, .timeout_s = 60 };
	opterr = 0;
	while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		switch (c) {
		case 'p': o->pin = optarg; break;
		case 'n': o->count = parse_u("--count", optarg, 0, 1ULL << 40); break;
		case 'k': o->n_ssids = parse_u("--ssids", optarg, 1, 65535); break;
		case 's': o->first_ssid = parse_u("--first-ssid", optarg, 1, 65535); break;
		case 'q': o->start_seq = parse_u("--start-seq", optarg, 0, 0xffffffffULL); break;
		case 'c': o->chunk = parse_u("--chunk", optarg, 1, 1 << 24); break;
		case 'r': o->ring_size = parse_u("--ring-size", optarg, 4096, 1ULL << 30); break;
		case 'm': o->malformed_every = parse_u("--malformed-every", optarg, 0, 1 << 30); break;
		case 'b': o->per_run = parse_u("--per-run", optarg, 1, RINGBUF_GEN_MAX_PER_RUN); break;
		case 't': o->timeout_s = parse_u("--timeout", optarg, 1, 3600); break;
		case 'R':
			if (strcmp(optarg, "stamp") == 0)
				o->kind = RINGBUF_GEN_STAMP;
			else if (strcmp(optarg, "ioam") == 0)
				o->kind = RINGBUF_GEN_IOAM;
			else
				die_arg("--records", "expected stamp or ioam", optarg);
			break;
		default: die_arg(argv[optind - 1], "unknown flag or missing value", NULL);
		}
	}
	if (!o->pin)
		die_arg("--pin", "required", NULL);
	if (o->first_ssid + o->n_ssids - 1 > 65535)
		die_arg("--ssids", "first_ssid + ssids - 1 exceeds 65535", NULL);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* An existing pin is reused by libbpf only if max_entries matches: take it from the pin. */
static void match_existing_pin(struct gen_opts *o)
{
	struct bpf_map_info info = { 0 };
	__u32 len = sizeof(info);
	int fd = bpf_obj_get(o->pin);

	if (fd < 0)
		return;
	if (bpf_obj_get_info_by_fd(fd, &info, &len) == 0)
		o->ring_size = info.max_entries;
	close(fd);
}

static void mkdir_parents(const char *path)
{
	char *copy = strdup(path);
	char *dir = dirname(copy);

	for (char *p = dir + 1; *p; p++) {
		if (*p == '/') {
			*p = 0;
			mkdir(dir, 0700);
			*p = '/';
		}
	}
	mkdir(dir, 0700);
	free(copy);
}

int main(int argc, char **argv)
{
	struct gen_opts o;
	struct ringbuf_gen *skel;
	unsigned char pkt[64] = { 0 };
	double t0, deadline;
	int err;

	parse_args(argc, argv, &o);
	match_existing_pin(&o);
	mkdir_parents(o.pin);

	skel = ringbuf_gen__open();
	if (!skel) {
		fprintf(stderr, "ringbuf_gen: open skeleton: %s\n", strerror(errno));
		return 1;
	}
	skel->rodata->n_ssids = o.n_ssids;
	skel->rodata->first_ssid = o.first_ssid;
	skel->rodata->start_seq = o.start_seq;
	skel->rodata->high_water = o.ring_size / 2;
	skel->rodata->malformed_every = o.malformed_every;
	skel->rodata->per_run = o.per_run;
	skel->rodata->kind = o.kind;
	bpf_map__set_max_entries(skel->maps.stamp_records, o.ring_size);
	bpf_map__set_pin_path(skel->maps.stamp_records, o.pin);
	err = ringbuf_gen__load(skel);
	if (err) {
		fprintf(stderr, "ringbuf_gen: load (pin %s): %s\n", o.pin, strerror(-err));
		ringbuf_gen__destroy(skel);
		return 1;
	}
	skel->bss->limit = o.count;

	t0 = now_s();
	deadline = t0 + o.timeout_s;
	while (skel->bss->generated < o.count && now_s() < deadline) {
		unsigned long long before = skel->bss->generated;
		LIBBPF_OPTS(bpf_test_run_opts, topts, .data_in = pkt, .data_size_in = sizeof(pkt),
			    .repeat = o.chunk);

		err = bpf_prog_test_run_opts(bpf_program__fd(skel->progs.ringbuf_gen), &topts);
		if (err) {
			fprintf(stderr, "ringbuf_gen: BPF_PROG_TEST_RUN: %s\n", strerror(-err));
			break;
		}
		if (skel->bss->generated == before)
			usleep(200);   /* ring above high water: let the consumer catch up */
	}
	printf("{\"pin\":\"%s\",\"generated\":%llu,\"requested\":%llu,\"throttled\":%llu,\"rb_full\":%llu,"
	       "\"malformed\":%llu,\"ring_size\":%llu,\"elapsed_s\":%.6f}\n",
	       o.pin, (unsigned long long)skel->bss->generated, o.count,
	       (unsigned long long)skel->bss->throttled, (unsigned long long)skel->bss->rb_full,
	       (unsigned long long)skel->bss->malformed, o.ring_size, now_s() - t0);
	err = skel->bss->generated == o.count && skel->bss->rb_full == 0 ? 0 : 1;
	ringbuf_gen__destroy(skel);   /* the pinned ring stays */
	return err;
}
