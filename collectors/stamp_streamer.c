// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * stamp_streamer: a pinned ring buffer of fixed-size records -> Kafka.
 *
 * --records stamp (the default): the STAMP collector's `stamp_records`
 * (64-byte stamp_record, stamp_batch "SSB1", topic segscope.stamp.records).
 * --records ioam: the in-line extractor's `ioam_records` (256-byte ioam_record,
 * ioam_batch "IOB1", topic segscope.ioam.records, key "<node>/<flow_id>").
 * One program for both, so both kinds reach Kafka the same way (batching,
 * idempotent producer, counters, drain on exit); the per-record callback is
 * specialised per kind at compile time, so the STAMP path does the same work
 * as before the IOAM kind existed.
 *
 * Each ring_buffer__poll() hands us the records that were ready; they are
 * held for up to --linger-ms (from the first record held) and then sent as
 * one Kafka message per key, cut early at --max-batch records. STAMP: the key
 * is the node (--key node, the default) or "<node>/<ssid>" (--key session);
 * IOAM: "<node>/<flow_id>" (--key flow, the only one: the IOAM.md contract).
 * Either way a session's or flow's records stay in one partition, in order. Why linger and one key per node: a delay worker pays ~0.7 ms
 * of CPU per Kafka message (Faust), so a router with 10 sessions at 10 pps
 * sent 100 one-record messages a second that cost 70 ms of a worker core; with
 * the defaults it sends 5 (docs/capacity.md).
 *
 * Nothing is dropped silently: a full librdkafka queue blocks the loop (the
 * BPF side then counts ring-buffer-full drops), delivery failures are counted
 * per record, and the exit code says whether anything was lost.
 *
 * Every --stats-interval seconds the counters go to the metrics topic as
 * InfluxDB line protocol, together with the collector's per-CPU counters
 * when --datapath-stats names its pinned stats array.
 *
 * --copy-fd N also writes every batch, as produced, to file descriptor N
 * (the node agent reads its results from there: this is the product path,
 * ring buffer -> Kafka in C, with the agent beside it, not in front of it).
 * The copy never slows the Kafka path: a batch that does not fit into the
 * pipe's free space is not copied, and counted (records_copy_dropped).
 * --no-kafka streams to the copy only (an agent without --kafka).
 *
 * Kafka security (TLS, SASL) from SEGSCOPE_KAFKA_* (kafka_security.h, docs/security.md): a setting
 * that cannot be used exits 2; Kafka refusing the login or an ACL stops the streamer, exit 3.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <librdkafka/rdkafka.h>

#include "stamp_record.h"
#include "stamp_batch.h"
#include "ioam_record.h"
#include "ioam_batch.h"
#include "segscope_names.h"
#include "cli.h"
#include "kafka_producer.h"
#include "tether.h"
#include "stamp_collector.h"   /* datapath/: collector_counter_names */

#define MAX_GROUPS        64      /* distinct keys (SSIDs, flows) held at once before flushing */
#define MAX_COUNTER_NAMES 64

/* What a ring buffer holds: how its records are framed, named and keyed. */
enum record_kind { RECORDS_STAMP, RECORDS_IOAM };

struct record_kind_desc {
	const char *name;        /* --records value, the `records` tag of segscope_streamer */
	const char *magic;       /* batch envelope magic */
	uint16_t size;           /* bytes per record */
	const char *topic;       /* default --topic */
	const char *program;     /* the datapath program whose stats --datapath-stats reads */
	const char *ring;        /* the pinned ring buffer's name */
	uint32_t max_batch;      /* default --max-batch (a message stays well under message.max.bytes) */
};

static const struct record_kind_desc record_kinds[] = {
	[RECORDS_STAMP] = { "stamp", STAMP_BATCH_MAGIC, STAMP_RECORD_SIZE, SEGSCOPE_TOPIC_STAMP_RECORDS,
			    "stamp_collector", "stamp_records", 4096 },
	[RECORDS_IOAM] = { "ioam", IOAM_BATCH_MAGIC, IOAM_RECORD_SIZE, SEGSCOPE_TOPIC_IOAM_RECORDS,
			   "ioam_rx", "ioam_records", 1024 },
};

enum key_mode { KEY_NODE, KEY_SESSION, KEY_FLOW };

struct streamer_opts {
	enum record_kind kind;         /* --records */
	const struct record_kind_desc *rk;
	const char *ringbuf_path;
	const char *brokers;
	const char *topic;
	const char *metrics_topic;
	const char *node;
	const char *datapath_stats_path;
	const char *stats_json_path;
	const char *counter_names[MAX_COUNTER_NAMES];
	int ncounter_names;
	double stats_interval_s;
	uint32_t max_batch;
	int flush_timeout_ms;
	int poll_timeout_ms;
	int linger_ms;                 /* --linger-ms: hold records up to this long to batch them */
	enum key_mode key;             /* --key: node (stamp), session (stamp, "<node>/<ssid>"), flow (ioam) */
	int copy_fd;                   /* --copy-fd: every batch also goes here; -1: none */
	bool no_kafka;                 /* --no-kafka: the copy only */
	bool no_metrics;               /* --no-metrics: counters to --stats-json only (the agent publishes them) */
	struct tether tether;          /* --agent-dir / --adopt-timeout (collectors/tether.h) */
};

/* Counters. Records are counted when they enter and when Kafka acknowledges them. */
struct streamer_counters {
	uint64_t records_in;
	uint64_t records_delivered;
	uint64_t records_failed;       /* delivery report with an error */
	uint64_t batches_produced;
	uint64_t batches_delivered;
	uint64_t batches_failed;
	uint64_t queue_full_retries;
	uint64_t malformed_records;    /* ring-buffer sample of the wrong size */
	uint64_t produce_errors;       /* rd_kafka_producev errors other than QUEUE_FULL (records counted failed) */
	uint64_t metrics_produced;
	uint64_t metrics_failed;
	uint64_t records_copied;       /* written to --copy-fd */
	uint64_t records_copy_dropped; /* not copied: the reader was behind (pipe full) or gone */
	uint64_t producer_restarts;    /* Kafka producers replaced after a fatal error (kafka_producer.h) */
	uint64_t records_resent;       /* records a replaced producer had not delivered, sent again */
};

/* The records held for one key (one SSID, one flow, or the whole node), behind room for the
 * batch header. */
struct record_group {
	uint32_t id;                   /* ssid (stamp --key session), flow_id (ioam), 0 (--key node) */
	uint32_t count;
	uint8_t *buf;                  /* header + max_batch records */
};

struct streamer {
	struct streamer_opts opts;
	struct streamer_counters c;
	rd_kafka_t *rk;
	rd_kafka_topic_t *records_topic;
	rd_kafka_topic_t *metrics_topic;
	struct kafka_resend resend;    /* messages a fatal producer error failed, for the next producer */
	struct ring_buffer *rb;
	int datapath_fd;
	uint32_t datapath_entries;
	int ncpus;
	uint64_t batch_seq;
	struct record_group groups[MAX_GROUPS];
	int ngroups;
	int last_group;                /* cache: consecutive records are usually the same SSID */
	double held_since;             /* monotonic time of the first record held; 0: none held */
	int copy_pipe_size;            /* bytes the copy pipe holds; 0: not a pipe (writes block) */
	/* stamp: records read per SSID, in --stats-json ("records_by_ssid"): the agent counts a
	 * session's replies across streamers (an agent restart replaces its streamer) from these */
	uint64_t *ssid_records;        /* 65536 entries; NULL for ioam */
};

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig)
{
	(void)sig;
	stop_requested = 1;
}

/* ---------------------------------------------------------------- options */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: stamp_streamer --ringbuf PATH --node NAME [--records stamp|ioam] [--brokers HOST:PORT]\n"
		"        [--topic " SEGSCOPE_TOPIC_STAMP_RECORDS " | " SEGSCOPE_TOPIC_IOAM_RECORDS "]\n"
		"        [--metrics-topic " SEGSCOPE_TOPIC_METRICS "]\n"
		"        [--max-batch 4096 (stamp) | 1024 (ioam)] [--stats-interval 1] [--stats-json PATH]\n"
		"        [--datapath-stats PATH [--datapath-counter-names a,b,c]]\n"
		"        [--flush-timeout-ms 10000] [--copy-fd N] [--no-kafka] [--no-metrics]\n"
		"        [--linger-ms 200] [--key node|session (stamp) | flow (ioam)]\n"
		"        [--agent-dir DIR --adopt-timeout S]\n"
		"--records: stamp_records (64-byte stamp_record, stamp_batch) or ioam_records\n"
		"  (256-byte ioam_record, ioam_batch, key \"<node>/<flow_id>\");\n"
		"--linger-ms: hold records up to this long (0: send what each poll brought);\n"
		"--key (stamp): Kafka key per node (one message per linger period) or per SSID (\"<node>/<ssid>\");\n"
		"--copy-fd N: every batch also to fd N (skipped and counted when the reader is behind);\n"
		"--no-kafka: to the copy only;\n"
		"--agent-dir/--adopt-timeout: started by the node agent, whose state is in DIR: stops by\n"
		"itself (drain, flush) once no agent has run for S seconds.\n"
		"SIGINT/SIGTERM: drain, flush, print counters as JSON; exit 1 if records were lost.\n");
}

static void parse_counter_names(struct streamer_opts *o, const char *s)
{
	char *copy = strdup(s), *save = NULL, *tok;

	o->ncounter_names = 0;
	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (o->ncounter_names == MAX_COUNTER_NAMES)
			die_arg("--datapath-counter-names", "too many names", s);
		for (const char *p = tok; *p; p++)   /* line-protocol field keys: keep them plain */
			if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_'))
				die_arg("--datapath-counter-names", "names may hold only [a-z0-9_]", tok);
		o->counter_names[o->ncounter_names++] = tok;   /* copy is kept for the process lifetime */
	}
}

static void parse_args(int argc, char **argv, struct streamer_opts *o)
{
	cli_prog = "stamp_streamer";
	cli_usage = usage;
	enum { O_RINGBUF = 1, O_NODE, O_BROKERS, O_TOPIC, O_MTOPIC, O_MAXBATCH, O_INTERVAL,
	       O_STATSJSON, O_DPSTATS, O_DPNAMES, O_FLUSH, O_COPYFD, O_NOKAFKA, O_NOMETRICS, O_LINGER, O_KEY,
	       O_RECORDS, O_AGENT_DIR, O_ADOPT_TIMEOUT, O_HELP };
	static const struct option longopts[] = {
		{ "ringbuf", required_argument, NULL, O_RINGBUF },
		{ "node", required_argument, NULL, O_NODE },
		{ "brokers", required_argument, NULL, O_BROKERS },
		{ "topic", required_argument, NULL, O_TOPIC },
		{ "metrics-topic", required_argument, NULL, O_MTOPIC },
		{ "max-batch", required_argument, NULL, O_MAXBATCH },
		{ "stats-interval", required_argument, NULL, O_INTERVAL },
		{ "stats-json", required_argument, NULL, O_STATSJSON },
		{ "datapath-stats", required_argument, NULL, O_DPSTATS },
		{ "datapath-counter-names", required_argument, NULL, O_DPNAMES },
		{ "flush-timeout-ms", required_argument, NULL, O_FLUSH },
		{ "copy-fd", required_argument, NULL, O_COPYFD },
		{ "no-kafka", no_argument, NULL, O_NOKAFKA },
		{ "no-metrics", no_argument, NULL, O_NOMETRICS },
		{ "linger-ms", required_argument, NULL, O_LINGER },
		{ "key", required_argument, NULL, O_KEY },
		{ "records", required_argument, NULL, O_RECORDS },
		{ "agent-dir", required_argument, NULL, O_AGENT_DIR },
		{ "adopt-timeout", required_argument, NULL, O_ADOPT_TIMEOUT },
		{ "help", no_argument, NULL, O_HELP },
		{ 0 },
	};
	const char *key_arg = NULL, *names_arg = NULL;
	char *end;
	int c;

	memset(o, 0, sizeof(*o));
	tether_init(&o->tether, "stamp_streamer");
	o->kind = RECORDS_STAMP;
	o->brokers = "127.0.0.1:19092";
	o->metrics_topic = SEGSCOPE_TOPIC_METRICS;
	o->stats_interval_s = 1.0;
	o->flush_timeout_ms = 10000;
	o->poll_timeout_ms = 100;
	o->linger_ms = 200;
	o->copy_fd = -1;

	opterr = 0;
	while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		switch (c) {
		case O_RINGBUF: o->ringbuf_path = optarg; break;
		case O_NODE: o->node = optarg; break;
		case O_BROKERS: o->brokers = optarg; break;
		case O_TOPIC: o->topic = optarg; break;
		case O_MTOPIC: o->metrics_topic = optarg; break;
		case O_MAXBATCH: o->max_batch = parse_int("--max-batch", optarg, 1, 1 << 20); break;
		case O_RECORDS:
			if (strcmp(optarg, "stamp") == 0)
				o->kind = RECORDS_STAMP;
			else if (strcmp(optarg, "ioam") == 0)
				o->kind = RECORDS_IOAM;
			else
				die_arg("--records", "expected stamp or ioam", optarg);
			break;
		case O_INTERVAL:
			errno = 0;
			o->stats_interval_s = strtod(optarg, &end);
			if (errno || end == optarg || *end || !(o->stats_interval_s >= 0.01))
				die_arg("--stats-interval", "expected seconds >= 0.01", optarg);
			break;
		case O_STATSJSON: o->stats_json_path = optarg; break;
		case O_DPSTATS: o->datapath_stats_path = optarg; break;
		case O_DPNAMES: names_arg = optarg; break;
		case O_FLUSH: o->flush_timeout_ms = parse_int("--flush-timeout-ms", optarg, 0, 600000); break;
		case O_COPYFD: o->copy_fd = parse_int("--copy-fd", optarg, 1, 1023); break;
		case O_NOKAFKA: o->no_kafka = true; break;
		case O_NOMETRICS: o->no_metrics = true; break;
		case O_LINGER: o->linger_ms = parse_int("--linger-ms", optarg, 0, 10000); break;
		case O_KEY: key_arg = optarg; break;
		case O_AGENT_DIR: tether_set_dir(&o->tether, optarg); break;
		case O_ADOPT_TIMEOUT: tether_set_timeout(&o->tether, optarg); break;
		case O_HELP: usage(stdout); exit(0);
		default:
			die_arg(argv[optind - 1], "unknown flag or missing value", NULL);
		}
	}
	if (optind < argc)
		die_arg(argv[optind], "unexpected argument", NULL);
	o->rk = &record_kinds[o->kind];
	if (!o->topic)
		o->topic = o->rk->topic;
	if (!o->max_batch)
		o->max_batch = o->rk->max_batch;
	/* --key after --records: its meaning depends on the kind, whatever the flags' order */
	if (o->kind == RECORDS_STAMP) {
		if (!key_arg || strcmp(key_arg, "node") == 0)
			o->key = KEY_NODE;
		else if (strcmp(key_arg, "session") == 0)
			o->key = KEY_SESSION;
		else
			die_arg("--key", "expected node or session with --records stamp", key_arg);
	} else {
		if (key_arg && strcmp(key_arg, "flow") != 0)
			die_arg("--key", "with --records ioam the key is always flow (\"<node>/<flow_id>\", schemas/IOAM.md)",
				key_arg);
		o->key = KEY_FLOW;
	}
	if (names_arg) {
		parse_counter_names(o, names_arg);
	} else if (o->kind == RECORDS_STAMP) {
		/* default counter names: the collector's own table (datapath/stamp_collector.h) */
		for (int i = 0; i < COLL_NR_COUNTERS; i++)
			o->counter_names[o->ncounter_names++] = collector_counter_names[i];
	}   /* ioam without names: counter_<i> (the agent reads ioam_rx's counters itself) */
	if (o->no_kafka && o->copy_fd < 0)
		die_arg("--no-kafka", "needs --copy-fd (the records must go somewhere)", NULL);
	if (o->copy_fd >= 0 && fcntl(o->copy_fd, F_GETFD) < 0)
		die_arg("--copy-fd", "not an open file descriptor", NULL);
	if (!o->ringbuf_path)
		die_arg("--ringbuf", o->kind == RECORDS_STAMP ? "required (pinned stamp_records ring buffer)"
							      : "required (pinned ioam_records ring buffer)", NULL);
	if (!o->node || !*o->node)
		die_arg("--node", "required", NULL);
	if (strlen(o->node) > BATCH_NODE_LEN)
		die_arg("--node", "longer than 32 bytes", o->node);
	for (const char *p = o->node; *p; p++)   /* goes into a line-protocol tag and a Kafka key */
		if (*p == ',' || *p == ' ' || *p == '=' || *p == '/' || *p == '\\')
			die_arg("--node", "must not contain , space = / or \\", o->node);
	tether_open(&o->tether, o->rk->ring);
}

/* ------------------------------------------------------------------ kafka */

/* msg_opaque: record count << 1, low bit set for metrics messages */
static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
	struct streamer *s = opaque;
	uintptr_t tag = (uintptr_t)m->_private;
	uint64_t records = tag >> 1;

	if (kafka_keep_for_resend(rk, m, &s->resend))
		return;   /* the producer failed for good: the next one sends it (kafka_recover_producer) */
	if (m->err)   /* a refusal (ACL, login) stops the tool; other errors are counted and retried */
		kafka_note_refusal("stamp_streamer", m->err, rd_kafka_err2str(m->err), rd_kafka_topic_name(m->rkt));
	if (tag & 1) {
		if (m->err) {
			s->c.metrics_failed++;
			fprintf(stderr, "stamp_streamer: metrics delivery failed: %s\n", rd_kafka_err2str(m->err));
		}
		return;
	}
	if (m->err) {
		if (s->c.batches_failed++ == 0 || (s->c.batches_failed & 1023) == 0)
			fprintf(stderr, "stamp_streamer: delivery failed (%llu batches so far): %s\n",
				(unsigned long long)s->c.batches_failed, rd_kafka_err2str(m->err));
		s->c.records_failed += records;
	} else {
		s->c.records_delivered += records;
		s->c.batches_delivered++;
	}
}

static int kafka_open(struct streamer *s)
{
	s->rk = kafka_producer_new("stamp_streamer", s->opts.brokers, "8000000", on_delivery, s);
	if (!s->rk)
		return -1;
	s->records_topic = rd_kafka_topic_new(s->rk, s->opts.topic, NULL);
	s->metrics_topic = rd_kafka_topic_new(s->rk, s->opts.metrics_topic, NULL);
	return 0;
}

/* The copy for the agent: whole batches or nothing, never blocking the Kafka path. */
static void copy_open(struct streamer *s)
{
	if (s->opts.copy_fd < 0)
		return;
	signal(SIGPIPE, SIG_IGN);   /* a reader that went away is EPIPE, counted */
	fcntl(s->opts.copy_fd, F_SETPIPE_SZ, 1 << 20);   /* best effort: pipe-max-size may be lower */
	s->copy_pipe_size = fcntl(s->opts.copy_fd, F_GETPIPE_SZ);
	if (s->copy_pipe_size < 0)
		s->copy_pipe_size = 0;
}

static void copy_batch(struct streamer *s, const uint8_t *buf, size_t len, uint32_t records)
{
	int queued = 0;
	size_t off = 0;

	if (s->opts.copy_fd < 0) {
		if (s->opts.no_kafka)
			s->c.records_copy_dropped += records;
		return;
	}
	if (s->copy_pipe_size > 0 && (ioctl(s->opts.copy_fd, FIONREAD, &queued) < 0 ||
				      (size_t)(s->copy_pipe_size - queued) < len)) {
		s->c.records_copy_dropped += records;   /* the reader is behind: no wait, no half batch */
		return;
	}
	while (off < len) {
		ssize_t n = write(s->opts.copy_fd, buf + off, len - off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			fprintf(stderr, "stamp_streamer: --copy-fd: %s; no more copies\n", strerror(errno));
			s->opts.copy_fd = -1;
			s->c.records_copy_dropped += records;
			return;
		}
		off += n;
	}
	s->c.records_copied += records;
}

static int kafka_produce(struct streamer *s, rd_kafka_topic_t *t, const void *val, size_t len,
			 const char *key, size_t keylen, uintptr_t tag)
{
	return kafka_produce_or_keep(s->rk, t, "stamp_streamer", val, len, key, keylen, (void *)tag,
				     &s->c.queue_full_retries, &s->resend);
}

static int kafka_reopen(void *ctx)
{
	return kafka_open(ctx);
}

/* The producer failed for good (kafka_producer.h): replace it and send again what it had not
 * delivered. False if no new producer could be made (the tool stops; the kept records counted failed). */
static bool kafka_recover_producer(struct streamer *s)
{
	return kafka_recover(&s->rk, &s->records_topic, &s->metrics_topic, "stamp_streamer", kafka_reopen, s,
			     &s->resend,
			     (struct kafka_recovery_counts){ &s->c.producer_restarts, &s->c.records_resent,
							     &s->c.records_failed, &s->c.queue_full_retries });
}

/* ------------------------------------------------------- batching records */

static void produce_group(struct streamer *s, struct record_group *g)
{
	char key[BATCH_NODE_LEN + 12];
	int keylen;
	size_t len;

	if (g->count == 0)
		return;
	if (s->opts.key != KEY_NODE)
		keylen = snprintf(key, sizeof(key), "%s/%u", s->opts.node, g->id);
	else
		keylen = snprintf(key, sizeof(key), "%s", s->opts.node);
	batch_encode_header(g->buf, s->opts.rk->magic, s->opts.rk->size, s->opts.node, g->count, s->batch_seq++);
	len = BATCH_HEADER_SIZE + (size_t)g->count * s->opts.rk->size;
	copy_batch(s, g->buf, len, g->count);
	if (!s->rk) {   /* --no-kafka */
		g->count = 0;
		return;
	}
	if (kafka_produce(s, s->records_topic, g->buf, len, key, keylen, (uintptr_t)g->count << 1) == 0) {
		s->c.batches_produced++;
	} else {
		s->c.produce_errors++;
		s->c.records_failed += g->count;
	}
	g->count = 0;
}

static void flush_groups(struct streamer *s)
{
	for (int i = 0; i < s->ngroups; i++)
		produce_group(s, &s->groups[i]);
	s->ngroups = 0;
	s->last_group = -1;
	s->held_since = 0;
}

static struct record_group *group_for(struct streamer *s, uint32_t id)
{
	struct record_group *g;

	if (s->last_group >= 0 && s->groups[s->last_group].id == id)
		return &s->groups[s->last_group];
	for (int i = 0; i < s->ngroups; i++) {
		if (s->groups[i].id == id) {
			s->last_group = i;
			return &s->groups[i];
		}
	}
	if (s->ngroups == MAX_GROUPS)    /* too many keys held at once: ship what we have */
		flush_groups(s);
	g = &s->groups[s->ngroups];
	if (!g->buf) {
		g->buf = malloc(BATCH_HEADER_SIZE + (size_t)s->opts.max_batch * s->opts.rk->size);
		if (!g->buf) {
			fprintf(stderr, "stamp_streamer: out of memory\n");
			exit(1);
		}
	}
	g->id = id;
	g->count = 0;
	s->last_group = s->ngroups++;
	return g;
}

static double monotonic_s(void);

static int malformed_sample(struct streamer *s, size_t size)
{
	if (s->c.malformed_records++ == 0)
		fprintf(stderr, "stamp_streamer: ring-buffer sample of %zu bytes, expected %u (%s records)\n",
			size, s->opts.rk->size, s->opts.rk->name);
	return 0;
}

/* One record into its key's group. rec_size is a constant at both call sites, so each kind gets
 * its own copy with a fixed-size memcpy (the STAMP path costs what it did with one kind). */
static __attribute__((always_inline)) inline int hold_record(struct streamer *s, const void *data,
							     const size_t rec_size, uint32_t id)
{
	struct record_group *g;

	s->c.records_in++;
	if (s->held_since == 0)
		s->held_since = monotonic_s();
	g = group_for(s, id);
	memcpy(g->buf + BATCH_HEADER_SIZE + (size_t)g->count * rec_size, data, rec_size);
	if (++g->count == s->opts.max_batch)
		produce_group(s, g);
	return 0;
}

static int on_stamp_record(void *ctx, void *data, size_t size)
{
	struct streamer *s = ctx;
	const struct stamp_record *r = data;

	if (size != STAMP_RECORD_SIZE)
		return malformed_sample(s, size);
	if (s->ssid_records)
		s->ssid_records[r->ssid]++;
	return hold_record(s, r, STAMP_RECORD_SIZE, s->opts.key == KEY_SESSION ? r->ssid : 0);  /* node: one group */
}

static int on_ioam_record(void *ctx, void *data, size_t size)
{
	struct streamer *s = ctx;
	const struct ioam_record *r = data;

	if (size != IOAM_RECORD_SIZE)
		return malformed_sample(s, size);
	return hold_record(s, r, IOAM_RECORD_SIZE, r->flow_id);   /* key "<node>/<flow_id>" */
}

/* ---------------------------------------------------------------- metrics */

static uint64_t realtime_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

static double monotonic_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

#define COUNTER_FIELDS(X) \
	X(records_in) X(records_delivered) X(records_failed) X(batches_produced) \
	X(batches_delivered) X(batches_failed) X(queue_full_retries) X(malformed_records) \
	X(produce_errors) X(metrics_produced) X(metrics_failed) X(records_copied) X(records_copy_dropped) \
	X(producer_restarts) X(records_resent)

static int format_counters_lp(const struct streamer *s, char *buf, size_t n, uint64_t ts)
{
	int len = snprintf(buf, n, "segscope_streamer,node=%s,records=%s ", s->opts.node, s->opts.rk->name);
	const char *sep = "";

#define X(f) len += snprintf(buf + len, n - len, "%s" #f "=%llui", sep, (unsigned long long)s->c.f); sep = ",";
	COUNTER_FIELDS(X)
#undef X
	len += snprintf(buf + len, n - len, ",kafka_queue_len=%di %llu",
			s->rk ? rd_kafka_outq_len(s->rk) : 0, (unsigned long long)ts);
	return len;
}

static int format_counters_json(const struct streamer *s, char *buf, size_t n, bool final)
{
	int len = snprintf(buf, n, "{\"node\":\"%s\",\"records\":\"%s\"", s->opts.node, s->opts.rk->name);

#define X(f) len += snprintf(buf + len, n - len, ",\"" #f "\":%llu", (unsigned long long)s->c.f);
	COUNTER_FIELDS(X)
#undef X
	len += snprintf(buf + len, n - len, ",\"batch_seq\":%llu,\"kafka_queue_len\":%d,\"final\":%s}",
			(unsigned long long)s->batch_seq, s->rk ? rd_kafka_outq_len(s->rk) : 0, final ? "true" : "false");
	return len;
}

static int datapath_open(struct streamer *s)
{
	struct bpf_map_info info = { 0 };
	__u32 info_len = sizeof(info);

	s->datapath_fd = -1;
	if (!s->opts.datapath_stats_path)
		return 0;
	s->datapath_fd = bpf_obj_get(s->opts.datapath_stats_path);
	if (s->datapath_fd < 0) {
		fprintf(stderr, "stamp_streamer: --datapath-stats: bpf_obj_get %s: %s\n",
			s->opts.datapath_stats_path, strerror(errno));
		return -1;
	}
	if (bpf_obj_get_info_by_fd(s->datapath_fd, &info, &info_len) < 0 ||
	    info.type != BPF_MAP_TYPE_PERCPU_ARRAY || info.value_size != sizeof(__u64)) {
		fprintf(stderr, "stamp_streamer: --datapath-stats: %s is not a per-CPU array of u64\n",
			s->opts.datapath_stats_path);
		return -1;
	}
	s->datapath_entries = info.max_entries;
	s->ncpus = libbpf_num_possible_cpus();
	return 0;
}

/* segscope_datapath,node=..,program=stamp_collector|ioam_rx name=sum_over_cpus i,... */
static int format_datapath_lp(const struct streamer *s, char *buf, size_t n, uint64_t ts)
{
	uint64_t values[s->ncpus > 0 ? s->ncpus : 1];
	int len = snprintf(buf, n, "segscope_datapath,node=%s,program=%s ", s->opts.node, s->opts.rk->program);
	const char *sep = "";

	for (uint32_t key = 0; key < s->datapath_entries; key++) {
		uint64_t sum = 0;
		char fallback[32];
		const char *name = fallback;

		if (bpf_map_lookup_elem(s->datapath_fd, &key, values) < 0)
			return -1;
		for (int cpu = 0; cpu < s->ncpus; cpu++)
			sum += values[cpu];
		if (key < (uint32_t)s->opts.ncounter_names)
			name = s->opts.counter_names[key];
		else
			snprintf(fallback, sizeof(fallback), "counter_%u", key);
		len += snprintf(buf + len, n - len, "%s%s=%llui", sep, name, (unsigned long long)sum);
		sep = ",";
	}
	len += snprintf(buf + len, n - len, " %llu", (unsigned long long)ts);
	return len;
}

/* ,"records_by_ssid":{"5":120,...} (the SSIDs seen so far) into f */
static void write_ssid_records(const struct streamer *s, FILE *f)
{
	const char *sep = "";

	if (!s->ssid_records)
		return;
	fputs(",\"records_by_ssid\":{", f);
	for (uint32_t ssid = 0; ssid <= 0xffff; ssid++) {
		if (!s->ssid_records[ssid])
			continue;
		fprintf(f, "%s\"%u\":%llu", sep, ssid, (unsigned long long)s->ssid_records[ssid]);
		sep = ",";
	}
	fputc('}', f);
}

static void write_stats_json(const struct streamer *s, bool final)
{
	char buf[1024], tmp[4096];
	FILE *f;

	if (!s->opts.stats_json_path)
		return;
	format_counters_json(s, buf, sizeof(buf), final);
	snprintf(tmp, sizeof(tmp), "%s.tmp", s->opts.stats_json_path);
	f = fopen(tmp, "w");
	if (!f) {
		fprintf(stderr, "stamp_streamer: --stats-json %s: %s\n", tmp, strerror(errno));
		return;
	}
	buf[strlen(buf) - 1] = '\0';   /* the closing brace: the per-SSID counts go before it */
	fprintf(f, "%s", buf);
	write_ssid_records(s, f);
	fputs("}\n", f);
	fclose(f);
	rename(tmp, s->opts.stats_json_path);   /* readers never see a half-written file */
}

static void publish_stats(struct streamer *s)
{
	char buf[8192];
	uint64_t ts = realtime_ns();
	int len = format_counters_lp(s, buf, sizeof(buf), ts);

	if (s->datapath_fd >= 0) {
		buf[len++] = '\n';
		int dl = format_datapath_lp(s, buf + len, sizeof(buf) - len, ts);

		if (dl < 0) {
			fprintf(stderr, "stamp_streamer: reading %s: %s\n", s->opts.datapath_stats_path,
				strerror(errno));
			len--;
		} else {
			len += dl;
		}
	}
	if (s->rk && !s->opts.no_metrics) {
		if (kafka_produce(s, s->metrics_topic, buf, len, s->opts.node, strlen(s->opts.node), 1) == 0)
			s->c.metrics_produced++;
		else
			s->c.metrics_failed++;
	}
	write_stats_json(s, false);
}

/* ------------------------------------------------------------------- main */

static int ringbuf_open(struct streamer *s)
{
	int fd = bpf_obj_get(s->opts.ringbuf_path);

	if (fd < 0) {
		fprintf(stderr, "stamp_streamer: --ringbuf: bpf_obj_get %s: %s\n", s->opts.ringbuf_path,
			strerror(errno));
		return -1;
	}
	s->rb = ring_buffer__new(fd, s->opts.kind == RECORDS_IOAM ? on_ioam_record : on_stamp_record, s, NULL);
	if (!s->rb) {
		fprintf(stderr, "stamp_streamer: ring_buffer__new on %s: %s\n", s->opts.ringbuf_path,
			strerror(errno));
		return -1;
	}
	return 0;
}

static void run(struct streamer *s)
{
	double next_stats = monotonic_s() + s->opts.stats_interval_s;

	while (!stop_requested && !kafka_refusal[0]) {
		int timeout_ms = s->opts.poll_timeout_ms;

		if (s->held_since > 0) {   /* wake up when the held records are due */
			int due_ms = (int)((s->held_since + s->opts.linger_ms / 1e3 - monotonic_s()) * 1e3) + 1;

			timeout_ms = due_ms < 0 ? 0 : (due_ms < timeout_ms ? due_ms : timeout_ms);
		}
		int n = ring_buffer__poll(s->rb, timeout_ms);

		if (n < 0 && n != -EINTR) {
			fprintf(stderr, "stamp_streamer: ring_buffer__poll: %s\n", strerror(-n));
			break;
		}
		if (s->held_since > 0 && (monotonic_s() - s->held_since) * 1e3 >= s->opts.linger_ms)
			flush_groups(s);
		if (tether_orphaned(&s->opts.tether, monotonic_s()))
			break;   /* no agent: drain and flush as on SIGTERM */
		if (s->rk)
			rd_kafka_poll(s->rk, 0);    /* serve delivery reports */
		if (!kafka_recover_producer(s))
			break;
		if (monotonic_s() >= next_stats) {
			publish_stats(s);
			next_stats += s->opts.stats_interval_s;
			if (next_stats < monotonic_s())
				next_stats = monotonic_s() + s->opts.stats_interval_s;
		}
	}
}

/* Drain what is left in the ring, then wait (bounded) for Kafka to acknowledge. */
static void shutdown_streamer(struct streamer *s)
{
	int n;

	while ((n = ring_buffer__consume(s->rb)) > 0)
		flush_groups(s);
	flush_groups(s);
	publish_stats(s);
	if (s->rk) {
		kafka_refused_purge(s->rk);   /* refused: what is queued is failed (counted), not waited for */
		rd_kafka_flush(s->rk, s->opts.flush_timeout_ms);
		if (s->rk && rd_kafka_fatal_error(s->rk, NULL, 0) != RD_KAFKA_RESP_ERR_NO_ERROR && kafka_recover_producer(s) && s->rk)
			rd_kafka_flush(s->rk, s->opts.flush_timeout_ms);   /* once: a second failure is counted */
	}
	write_stats_json(s, true);
}

int main(int argc, char **argv)
{
	struct streamer s = { .last_group = -1, .datapath_fd = -1 };
	struct sigaction sa = { .sa_handler = on_signal };
	char json[1024];
	uint64_t lost;

	parse_args(argc, argv, &s.opts);
	if (s.opts.kind == RECORDS_STAMP && s.opts.stats_json_path) {
		s.ssid_records = calloc(0x10000, sizeof(*s.ssid_records));
		if (!s.ssid_records) {
			fprintf(stderr, "stamp_streamer: out of memory\n");
			return 1;
		}
	}
	if (!s.opts.no_kafka && kafka_security_load("stamp_streamer") < 0)
		return 2;   /* the message names the SEGSCOPE_KAFKA_* variable and the fix */
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	if (ringbuf_open(&s) < 0 || datapath_open(&s) < 0 || (!s.opts.no_kafka && kafka_open(&s) < 0))
		return 1;
	copy_open(&s);
	fprintf(stderr, "stamp_streamer: %s -> %s topic %s (node %s, %s records)%s\n", s.opts.ringbuf_path,
		s.opts.no_kafka ? "(no kafka)" : s.opts.brokers, s.opts.topic, s.opts.node, s.opts.rk->name,
		s.opts.copy_fd >= 0 ? ", copy to the agent" : "");

	run(&s);
	shutdown_streamer(&s);

	format_counters_json(&s, json, sizeof(json), true);
	fprintf(s.opts.copy_fd == 1 ? stderr : stdout, "%s\n", json);   /* stdout may be the copy */
	fflush(stdout);

	/* anything that came in and was not acknowledged by Kafka (or, --no-kafka, copied) is lost */
	lost = s.opts.no_kafka ? s.c.malformed_records
			       : s.c.records_in - s.c.records_delivered + s.c.malformed_records;
	if (lost)
		fprintf(stderr, "stamp_streamer: %llu records lost (failed %llu, unacknowledged %llu, malformed %llu)\n",
			(unsigned long long)lost, (unsigned long long)s.c.records_failed,
			(unsigned long long)(s.c.records_in - s.c.records_delivered - s.c.records_failed),
			(unsigned long long)s.c.malformed_records);
	ring_buffer__free(s.rb);
	free(s.ssid_records);
	if (s.rk) {
		rd_kafka_topic_destroy(s.records_topic);
		rd_kafka_topic_destroy(s.metrics_topic);
		rd_kafka_destroy(s.rk);
	}
	if (kafka_refusal[0]) {
		fprintf(stderr, "stamp_streamer: stopped, Kafka refused this client: %s\n", kafka_refusal);
		return KAFKA_EXIT_REFUSED;
	}
	return lost ? 1 : 0;
}
