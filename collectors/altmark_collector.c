// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * altmark_collector: pinned alternate-marking maps -> one altmark_block record
 * per (flow, direction, block) -> Kafka (topic segscope.altmark.blocks).
 *
 * The datapath (datapath/altmark.h) keeps cumulative per-(flow slot, colour)
 * per-CPU counters and never resets them. For every installed flow, at TAI
 * time (k + 1) * T + margin the colour of block k is inactive and every packet
 * of block k has been counted on both edges (margin >= the path delay), so
 * the collector sums that colour's counters over the CPUs and emits
 * snapshot - previous snapshot of the same colour (modular,
 * altmark_counter_delta) as block k. A record is emitted for every closed
 * block, also with 0 packets.
 *
 * When is a block's delta exact? Its colour's previous snapshot must have
 * been taken while that colour was inactive and after the margin of the block
 * before it (so it is the exact start of block k), and the new snapshot must
 * be taken during block k + 1 (after k + 2 starts, the colour counts again).
 * Every snapshot remembers the one block it is a clean start for; anything
 * else gives F_PARTIAL: the block the flow was installed in, the first block
 * a collector sees without a baseline, blocks read late (a stalled collector),
 * a flow reinstalled in its slot. A flow's counters are zero when the loader
 * installs it (installed_tai_ns), so a flow seen in or right after its
 * install block needs no earlier snapshot.
 *
 * A slot reused by another flow never leaks counts: the collector keeps one
 * state per slot with the flow's identity (key, flow_id, installed_tai_ns,
 * period, method); a changed identity starts a new flow, and every counter
 * read is confirmed by looking the flow up again afterwards (a flow removed or
 * reinstalled between the scan and the read discards the read).
 *
 * Every --stats-interval seconds the counters go to the metrics topic as
 * segscope_altmark_collector line protocol. --stdout writes JSON lines instead
 * of Kafka (tests, debugging).
 *
 * Kafka security (TLS, SASL) from SEGSCOPE_KAFKA_* (kafka_security.h, docs/security.md): a setting
 * that cannot be used exits 2; Kafka refusing the login or an ACL stops the collector, exit 3.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <librdkafka/rdkafka.h>

#include "segscope_names.h"   /* schemas/names.toml: topic names */
#include "altmark.h"          /* datapath/: maps and structs */
#include "altmark_block.h"    /* schemas/c: record + AMB1 batch */
#include "cli.h"
#include "kafka_producer.h"
#include "tether.h"

#define MAX_INSTANCES   16
#define NS_PER_MS       1000000ULL
#define NS_PER_S        1000000000ULL
#define NO_BLOCK        UINT64_MAX   /* "a clean start for no block" */
#define MAX_BATCH_RECS  64           /* records of one flow emitted in one tick (catch-up) */

struct instance_opt {
	const char *pin_dir;
	const char *node;
	uint8_t direction;
};

struct collector_opts {
	struct instance_opt inst[MAX_INSTANCES];
	int ninst;
	const char *brokers;
	const char *topic;
	const char *metrics_topic;
	const char *node;
	double stats_interval_s;
	int64_t margin_ns;           /* < 0: T/2 per flow */
	uint64_t scan_interval_ns;
	int flush_timeout_ms;
	bool to_stdout;
	bool group_flows;            /* one message per instance and tick, key "<node>" */
	uint32_t max_batch;          /* records per message with group_flows */
	struct tether tether;        /* --agent-dir / --adopt-timeout (collectors/tether.h) */
};

/* Collector counters; published as segscope_altmark_collector fields (schemas/metrics.md). */
#define COUNTER_FIELDS(X) \
	X(ticks) X(scans) X(flows_added) X(flows_removed) X(flows_replaced) X(bad_flows) \
	X(slot_conflicts) X(flows_read) X(read_errors) X(reads_discarded) X(records_out) \
	X(records_partial) X(blocks_read_late) X(dmark_overflows) X(records_delivered) \
	X(records_failed) X(batches_produced) X(batches_delivered) X(batches_failed) \
	X(produce_errors) X(queue_full_retries) X(metrics_produced) X(metrics_failed) \
	X(map_reopens) X(margin_clamped) X(wake_late_us_sum) X(wake_late_us_max) X(read_us_sum) X(scan_us_sum) \
	X(producer_restarts) X(records_resent)

struct collector_counters {
#define X(f) uint64_t f;
	COUNTER_FIELDS(X)
#undef X
};

enum key_kind { KEY_SIDLIST = 1, KEY_FLOWMON = 2 };

/* What the collector knows about the flow in one slot of one instance. */
struct flow_state {
	uint8_t key_kind;
	union {
		struct altmark_sidlist_key sidlist;
		__u32 flowmon;
	} key;
	struct altmark_flow flow;            /* as scanned: identity + period */
	uint64_t next_block;                 /* next block to emit */
	uint64_t next_read_ns;               /* TAI time to emit next_block */
	uint64_t margin_ns;
	struct altmark_counter base[2];      /* last snapshot per colour */
	uint64_t clean_for[2];               /* block that base[c] is the exact start of, or NO_BLOCK */
};

struct instance {
	struct instance_opt o;
	char flows_path[512], flowmon_path[512], counters_path[512];
	int flows_fd, flowmon_fd, counters_fd;
	uint32_t flows_id, flowmon_id, counters_id;
	uint64_t boot_id;
	struct flow_state *slots;            /* ALTMARK_MAX_FLOWS */
	uint8_t *active;                     /* per slot: a flow is installed there (small: scanned every tick) */
	uint8_t *seen;                       /* per slot: found by the current scan */
	uint32_t nactive;
};

struct collector {
	struct collector_opts opts;
	struct collector_counters c;
	struct instance inst[MAX_INSTANCES];
	rd_kafka_t *rk;
	rd_kafka_topic_t *blocks_topic, *metrics_topic;
	struct kafka_resend resend;          /* messages a fatal producer error failed, for the next producer */
	int ncpus;
	struct altmark_counter *percpu;      /* ncpus values of one counters entry */
	uint64_t batch_seq;
	uint8_t *batch;                      /* header + room for max(MAX_BATCH_RECS, --max-batch) records */
	uint32_t nbatched;                   /* records in batch, not shipped yet */
};

static volatile sig_atomic_t stop_requested;
static bool quiet_open;   /* retrying maps that are gone: say it once, not at every scan */

static void on_signal(int sig)
{
	(void)sig;
	stop_requested = 1;
}

static uint64_t clock_ns(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (uint64_t)ts.tv_sec * NS_PER_S + ts.tv_nsec;
}

/* ---------------------------------------------------------------- options */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: altmark_collector --node NAME (--tx-pin-dir DIR[@NODE] | --rx-pin-dir DIR[@NODE])...\n"
		"        [--brokers 127.0.0.1:19092] [--topic " SEGSCOPE_TOPIC_ALTMARK_BLOCKS "]\n"
		"        [--metrics-topic " SEGSCOPE_TOPIC_METRICS "] [--stats-interval 1] [--margin-ms T/2]\n"
		"        [--scan-interval-ms 500] [--flush-timeout-ms 10000] [--stdout]\n"
		"        [--group-flows [--max-batch 4096]] [--agent-dir DIR --adopt-timeout S]\n"
		"DIR: pinned maps of one program instance, e.g. /sys/fs/bpf/segscope/<instance>/altmark_tx\n"
		"(altmark_flows, altmark_counters; rx also altmark_flowmon). @NODE overrides --node for\n"
		"that instance's records. --stdout: JSON lines on stdout instead of Kafka.\n"
		"Default: one message per flow and tick, key \"<node>/<flow_id>\". --group-flows: one\n"
		"message per instance and tick with every flow's records (cut at --max-batch), key \"<node>\".\n"
		"--agent-dir/--adopt-timeout: started by the node agent, whose state is in DIR: stops by\n"
		"itself (as on SIGTERM) once no agent has run for S seconds.\n"
		"SIGINT/SIGTERM: flush, print counters as JSON; exit 1 if records were lost.\n");
}

static void check_node(const char *flag, const char *node)
{
	if (!*node)
		die_arg(flag, "empty node name", node);
	if (strlen(node) > ALTMARK_BATCH_NODE_LEN)
		die_arg(flag, "node longer than 32 bytes", node);
	for (const char *p = node; *p; p++)   /* goes into a line-protocol tag and a Kafka key */
		if (*p == ',' || *p == ' ' || *p == '=' || *p == '/' || *p == '\\' || *p == '"')
			die_arg(flag, "node must not contain , space = / \\ or \"", node);
}

static void add_instance(struct collector_opts *o, const char *flag, char *arg, uint8_t dir)
{
	struct instance_opt *io;
	char *at = strrchr(arg, '@');

	if (o->ninst == MAX_INSTANCES)
		die_arg(flag, "too many instances (max 16)", arg);
	io = &o->inst[o->ninst++];
	io->direction = dir;
	io->node = NULL;
	if (at) {
		*at = '\0';
		check_node(flag, at + 1);
		io->node = at + 1;
	}
	if (!*arg)
		die_arg(flag, "empty directory", NULL);
	io->pin_dir = arg;
}

static void parse_args(int argc, char **argv, struct collector_opts *o)
{
	cli_prog = "altmark_collector";
	cli_usage = usage;
	enum { O_TX = 1, O_RX, O_NODE, O_BROKERS, O_TOPIC, O_MTOPIC, O_INTERVAL, O_MARGIN,
	       O_SCAN, O_FLUSH, O_STDOUT, O_GROUP, O_MAXBATCH, O_AGENT_DIR, O_ADOPT_TIMEOUT, O_HELP };
	static const struct option longopts[] = {
		{ "tx-pin-dir", required_argument, NULL, O_TX },
		{ "rx-pin-dir", required_argument, NULL, O_RX },
		{ "node", required_argument, NULL, O_NODE },
		{ "brokers", required_argument, NULL, O_BROKERS },
		{ "topic", required_argument, NULL, O_TOPIC },
		{ "metrics-topic", required_argument, NULL, O_MTOPIC },
		{ "stats-interval", required_argument, NULL, O_INTERVAL },
		{ "margin-ms", required_argument, NULL, O_MARGIN },
		{ "scan-interval-ms", required_argument, NULL, O_SCAN },
		{ "flush-timeout-ms", required_argument, NULL, O_FLUSH },
		{ "stdout", no_argument, NULL, O_STDOUT },
		{ "group-flows", no_argument, NULL, O_GROUP },
		{ "max-batch", required_argument, NULL, O_MAXBATCH },
		{ "agent-dir", required_argument, NULL, O_AGENT_DIR },
		{ "adopt-timeout", required_argument, NULL, O_ADOPT_TIMEOUT },
		{ "help", no_argument, NULL, O_HELP },
		{ 0 },
	};
	char *end;
	int c;

	memset(o, 0, sizeof(*o));
	tether_init(&o->tether, "altmark_collector");
	o->brokers = "127.0.0.1:19092";
	o->topic = SEGSCOPE_TOPIC_ALTMARK_BLOCKS;
	o->metrics_topic = SEGSCOPE_TOPIC_METRICS;
	o->stats_interval_s = 1.0;
	o->margin_ns = -1;
	o->scan_interval_ns = 500 * NS_PER_MS;
	o->flush_timeout_ms = 10000;
	o->max_batch = 4096;

	opterr = 0;
	while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		switch (c) {
		case O_TX: add_instance(o, "--tx-pin-dir", optarg, ALTMARK_DIR_TX); break;
		case O_RX: add_instance(o, "--rx-pin-dir", optarg, ALTMARK_DIR_RX); break;
		case O_NODE: check_node("--node", optarg); o->node = optarg; break;
		case O_BROKERS: o->brokers = optarg; break;
		case O_TOPIC: o->topic = optarg; break;
		case O_MTOPIC: o->metrics_topic = optarg; break;
		case O_INTERVAL:
			errno = 0;
			o->stats_interval_s = strtod(optarg, &end);
			if (errno || end == optarg || *end || !(o->stats_interval_s >= 0.01))
				die_arg("--stats-interval", "expected seconds >= 0.01", optarg);
			break;
		case O_MARGIN:
			o->margin_ns = parse_int("--margin-ms", optarg, 0, 3600 * 1000) * (int64_t)NS_PER_MS;
			break;
		case O_SCAN:
			o->scan_interval_ns = parse_int("--scan-interval-ms", optarg, 1, 3600 * 1000) * NS_PER_MS;
			break;
		case O_FLUSH: o->flush_timeout_ms = parse_int("--flush-timeout-ms", optarg, 0, 600000); break;
		case O_STDOUT: o->to_stdout = true; break;
		case O_GROUP: o->group_flows = true; break;
		case O_MAXBATCH: o->max_batch = parse_int("--max-batch", optarg, MAX_BATCH_RECS, 1 << 17); break;
		case O_AGENT_DIR: tether_set_dir(&o->tether, optarg); break;
		case O_ADOPT_TIMEOUT: tether_set_timeout(&o->tether, optarg); break;
		case O_HELP: usage(stdout); exit(0);
		default:
			die_arg(argv[optind - 1], "unknown flag or missing value", NULL);
		}
	}
	if (optind < argc)
		die_arg(argv[optind], "unexpected argument", NULL);
	if (!o->node)
		die_arg("--node", "required", NULL);
	if (!o->ninst)
		die_arg("--tx-pin-dir/--rx-pin-dir", "at least one pinned instance is required", NULL);
	for (int i = 0; i < o->ninst; i++)
		if (!o->inst[i].node)
			o->inst[i].node = o->node;
	tether_open(&o->tether, "altmark blocks");
}

/* ------------------------------------------------------------------ kafka */

/* msg_opaque: record count << 1, low bit set for metrics messages */
static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
	struct collector *s = opaque;
	uintptr_t tag = (uintptr_t)m->_private;
	uint64_t records = tag >> 1;

	if (kafka_keep_for_resend(rk, m, &s->resend))
		return;   /* the producer failed for good: the next one sends it (kafka_recover_producer) */
	if (m->err)   /* a refusal (ACL, login) stops the tool; other errors are counted and retried */
		kafka_note_refusal("altmark_collector", m->err, rd_kafka_err2str(m->err), rd_kafka_topic_name(m->rkt));
	if (tag & 1) {
		if (m->err) {
			s->c.metrics_failed++;
			fprintf(stderr, "altmark_collector: metrics delivery failed: %s\n", rd_kafka_err2str(m->err));
		}
		return;
	}
	if (m->err) {
		if (s->c.batches_failed++ == 0 || (s->c.batches_failed & 1023) == 0)
			fprintf(stderr, "altmark_collector: delivery failed (%" PRIu64 " batches so far): %s\n",
				s->c.batches_failed, rd_kafka_err2str(m->err));
		s->c.records_failed += records;
	} else {
		s->c.records_delivered += records;
		s->c.batches_delivered++;
	}
}

static int kafka_open(struct collector *s)
{
	s->rk = kafka_producer_new("altmark_collector", s->opts.brokers, NULL, on_delivery, s);
	if (!s->rk)
		return -1;
	s->blocks_topic = rd_kafka_topic_new(s->rk, s->opts.topic, NULL);
	s->metrics_topic = rd_kafka_topic_new(s->rk, s->opts.metrics_topic, NULL);
	return 0;
}

static int kafka_produce(struct collector *s, rd_kafka_topic_t *t, const void *val, size_t len,
			 const char *key, size_t keylen, uintptr_t tag)
{
	return kafka_produce_or_keep(s->rk, t, "altmark_collector", val, len, key, keylen, (void *)tag,
				     &s->c.queue_full_retries, &s->resend);
}

static int kafka_reopen(void *ctx)
{
	return kafka_open(ctx);
}

/* The producer failed for good (kafka_producer.h): replace it and send again what it had not
 * delivered. False if no new producer could be made (the tool stops; the kept records counted failed). */
static bool kafka_recover_producer(struct collector *s)
{
	return kafka_recover(&s->rk, &s->blocks_topic, &s->metrics_topic, "altmark_collector", kafka_reopen, s,
			     &s->resend,
			     (struct kafka_recovery_counts){ &s->c.producer_restarts, &s->c.records_resent,
							     &s->c.records_failed, &s->c.queue_full_retries });
}

/* ------------------------------------------------------------ pinned maps */

static uint32_t map_id_of(int fd)
{
	struct bpf_map_info info = { 0 };
	__u32 len = sizeof(info);

	return bpf_obj_get_info_by_fd(fd, &info, &len) < 0 ? 0 : info.id;
}

/* Open a pinned map and check its shape; -1 (message printed) when it is not what we need. */
static int open_map(const char *path, enum bpf_map_type type, uint32_t key_size, uint32_t value_size,
		    bool optional, uint32_t *id)
{
	struct bpf_map_info info = { 0 };
	__u32 len = sizeof(info);
	int fd = bpf_obj_get(path);

	if (fd < 0) {
		if (!(optional && errno == ENOENT) && !quiet_open)
			fprintf(stderr, "altmark_collector: bpf_obj_get %s: %s\n", path, strerror(errno));
		return -1;
	}
	if (bpf_obj_get_info_by_fd(fd, &info, &len) < 0 || info.type != type ||
	    info.key_size != key_size || info.value_size != value_size) {
		fprintf(stderr, "altmark_collector: %s is not the map of datapath/altmark.h "
			"(type %u key %u value %u, want type %u key %u value %u)\n", path, info.type,
			info.key_size, info.value_size, type, key_size, value_size);
		close(fd);
		return -1;
	}
	*id = info.id;
	return fd;
}

static void close_instance_maps(struct instance *in)
{
	if (in->flows_fd >= 0)
		close(in->flows_fd);
	if (in->flowmon_fd >= 0)
		close(in->flowmon_fd);
	if (in->counters_fd >= 0)
		close(in->counters_fd);
	in->flows_fd = in->flowmon_fd = in->counters_fd = -1;
}

static uint64_t random_boot_id(void)
{
	uint64_t v = 0;

	while (getrandom(&v, sizeof(v), 0) != sizeof(v) || v == 0)
		;
	return v;
}

/* (Re)open an instance's maps; forgets every flow (a new map has new counters) and takes a new boot_id. */
static int open_instance(struct instance *in)
{
	close_instance_maps(in);
	in->flows_fd = open_map(in->flows_path, BPF_MAP_TYPE_HASH, sizeof(struct altmark_sidlist_key),
				sizeof(struct altmark_flow), false, &in->flows_id);
	in->counters_fd = open_map(in->counters_path, BPF_MAP_TYPE_PERCPU_ARRAY, sizeof(__u32),
				   sizeof(struct altmark_counter), false, &in->counters_id);
	in->flowmon_id = 0;
	if (in->o.direction == ALTMARK_DIR_RX)   /* rfc9343 flows of the rx program */
		in->flowmon_fd = open_map(in->flowmon_path, BPF_MAP_TYPE_HASH, sizeof(__u32),
					  sizeof(struct altmark_flow), true, &in->flowmon_id);
	if (in->flows_fd < 0 || in->counters_fd < 0)
		return -1;
	memset(in->active, 0, ALTMARK_MAX_FLOWS);
	in->nactive = 0;
	in->boot_id = random_boot_id();
	return 0;
}

/* Did the loader replace the pinned maps (detach + attach)? Compare the ids behind the paths. */
static bool instance_maps_replaced(const struct instance *in)
{
	const char *paths[] = { in->flows_path, in->counters_path, in->flowmon_path };
	const uint32_t ids[] = { in->flows_id, in->counters_id, in->flowmon_id };

	for (int i = 0; i < 3; i++) {
		int fd = bpf_obj_get(paths[i]);
		uint32_t id = 0;

		if (fd >= 0) {
			id = map_id_of(fd);
			close(fd);
		}
		if (id != ids[i])
			return true;
	}
	return false;
}

/* ----------------------------------------------------------------- blocks */

static uint64_t flow_margin_ns(struct collector *s, uint64_t period_ns)
{
	if (s->opts.margin_ns < 0)
		return period_ns / 2;
	if ((uint64_t)s->opts.margin_ns >= period_ns) {   /* would read while the colour is active again */
		s->c.margin_clamped++;
		return period_ns / 2;
	}
	return s->opts.margin_ns;
}

static bool same_flow(const struct altmark_flow *a, const struct altmark_flow *b)
{
	return a->flow_id == b->flow_id && a->slot == b->slot && a->period_ns == b->period_ns &&
	       a->installed_tai_ns == b->installed_tai_ns && a->method == b->method;
}

/* Look the flow up again: is the slot still this installation? */
static bool flow_still_installed(const struct instance *in, const struct flow_state *st)
{
	struct altmark_flow now;
	int fd = st->key_kind == KEY_SIDLIST ? in->flows_fd : in->flowmon_fd;

	if (bpf_map_lookup_elem(fd, &st->key, &now) < 0)
		return false;
	return same_flow(&now, &st->flow);
}

/* Sum one counters entry (slot * 2 + colour) over the CPUs. */
static int read_colour(struct collector *s, const struct instance *in, uint32_t slot, unsigned int colour,
		       struct altmark_counter *sum)
{
	__u32 key = slot * 2 + colour;

	memset(sum, 0, sizeof(*sum));
	if (bpf_map_lookup_elem(in->counters_fd, &key, s->percpu) < 0)
		return -1;
	for (int cpu = 0; cpu < s->ncpus; cpu++) {
		sum->packets += s->percpu[cpu].packets;
		sum->bytes += s->percpu[cpu].bytes;
		sum->dmark_packets += s->percpu[cpu].dmark_packets;
		sum->dmark_ts_sum_ns += s->percpu[cpu].dmark_ts_sum_ns;
	}
	return 0;
}

/* The block a snapshot of `colour` taken at `now` is the exact start of, or NO_BLOCK. */
static uint64_t clean_start_for(const struct flow_state *st, unsigned int colour, uint64_t now)
{
	uint64_t cur = now / st->flow.period_ns;

	if ((cur & 1) != colour && now >= cur * st->flow.period_ns + st->margin_ns)
		return cur + 1;
	return NO_BLOCK;
}

static void schedule(struct flow_state *st)
{
	st->next_read_ns = (st->next_block + 1) * st->flow.period_ns + st->margin_ns;
}

/*
 * A flow appears (new, or its slot got another installation). Its counters
 * were zero at installed_tai_ns, so if that is in the current or the previous
 * block, zero baselines taken "at install" are exact and the install block is
 * emitted (partial). Otherwise baselines are snapshots taken now.
 */
static void start_flow(struct collector *s, struct instance *in, struct flow_state *st, uint64_t now)
{
	uint64_t T = st->flow.period_ns;
	uint64_t cur = now / T, installed = st->flow.installed_tai_ns / T;

	st->margin_ns = flow_margin_ns(s, T);
	if (installed + 1 >= cur && installed <= cur) {
		unsigned int c = installed & 1;

		memset(st->base, 0, sizeof(st->base));
		st->clean_for[c] = NO_BLOCK;              /* installed mid-block */
		st->clean_for[c ^ 1] = installed + 1;     /* nothing of that colour before install */
		st->next_block = installed;
	} else {
		for (unsigned int c = 0; c < 2; c++) {
			if (read_colour(s, in, st->flow.slot, c, &st->base[c]) < 0) {
				s->c.read_errors++;
				st->clean_for[c] = NO_BLOCK;
				continue;
			}
			st->clean_for[c] = clean_start_for(st, c, now);
		}
		st->next_block = cur;                     /* partial: no baseline before now */
	}
	schedule(st);
}

static void fill_record(const struct instance *in, const struct flow_state *st, uint64_t k,
			const struct altmark_counter *delta, bool partial, struct altmark_block *b)
{
	memset(b, 0, sizeof(*b));
	b->block_index = k;
	b->block_start_ns = k * st->flow.period_ns;
	b->packets = delta->packets;
	b->bytes = delta->bytes;
	b->boot_id = in->boot_id;
	b->flow_id = st->flow.flow_id;
	b->period_ms = st->flow.period_ns / NS_PER_MS;
	b->direction = in->o.direction;
	b->colour = k & 1;
	b->method = st->flow.method;
	b->flags = partial ? ALTMARK_BLOCK_F_PARTIAL : 0;
	b->dmark_packets = delta->dmark_packets;
	b->dmark_ts_sum_ns = delta->dmark_ts_sum_ns;
}

static void print_record_json(const struct instance *in, const struct altmark_block *b)
{
	printf("{\"node\":\"%s\",\"direction\":\"%s\",\"flow_id\":%u,\"method\":%u,\"period_ms\":%u,"
	       "\"block_index\":%" PRIu64 ",\"block_start_ns\":%" PRIu64 ",\"colour\":%u,"
	       "\"packets\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"dmark_packets\":%u,"
	       "\"dmark_ts_sum_ns\":%" PRIu64 ",\"flags\":%u,\"partial\":%s,\"boot_id\":%" PRIu64 "}\n",
	       in->o.node, b->direction == ALTMARK_DIR_TX ? "tx" : "rx", b->flow_id, b->method,
	       b->period_ms, (uint64_t)b->block_index, (uint64_t)b->block_start_ns, b->colour,
	       (uint64_t)b->packets, (uint64_t)b->bytes, b->dmark_packets, (uint64_t)b->dmark_ts_sum_ns,
	       b->flags, (b->flags & ALTMARK_BLOCK_F_PARTIAL) ? "true" : "false", (uint64_t)b->boot_id);
}

/* Send the batched records of one instance: key "<node>/<flow_id>", or "<node>" for grouped flows. */
static void ship_batch(struct collector *s, const struct instance *in, uint32_t flow_id)
{
	char key[ALTMARK_BATCH_NODE_LEN + 16];
	int keylen;
	uint32_t n = s->nbatched;
	size_t len = ALTMARK_BATCH_HEADER_SIZE + (size_t)n * ALTMARK_BLOCK_SIZE;

	if (!n)
		return;
	s->nbatched = 0;

	s->c.records_out += n;
	if (s->opts.to_stdout) {
		const struct altmark_block *recs = (const void *)(s->batch + ALTMARK_BATCH_HEADER_SIZE);

		for (uint32_t i = 0; i < n; i++)
			print_record_json(in, &recs[i]);
		s->c.records_delivered += n;   /* written is delivered here */
		s->c.batches_produced++;
		s->c.batches_delivered++;
		return;
	}
	if (s->opts.group_flows)
		keylen = snprintf(key, sizeof(key), "%s", in->o.node);
	else
		keylen = altmark_kafka_key(key, sizeof(key), in->o.node, flow_id);
	altmark_batch_encode_header(s->batch, in->o.node, n, s->batch_seq++);
	if (kafka_produce(s, s->blocks_topic, s->batch, len, key, keylen, (uintptr_t)n << 1) == 0) {
		s->c.batches_produced++;
	} else {
		s->c.produce_errors++;
		s->c.records_failed += n;
	}
}

/* Emit every block of the flow whose read time has come; one Kafka message for them. */
static void emit_due_blocks(struct collector *s, struct instance *in, struct flow_state *st)
{
	struct altmark_block *recs = (void *)(s->batch + ALTMARK_BATCH_HEADER_SIZE);
	uint32_t n = 0;
	uint64_t t0 = clock_ns(CLOCK_MONOTONIC);

	/* grouped: make room for this flow's catch-up records; per flow: the batch is empty here */
	if (s->nbatched + MAX_BATCH_RECS > (s->opts.group_flows ? s->opts.max_batch : MAX_BATCH_RECS))
		ship_batch(s, in, 0);
	recs += s->nbatched;

	for (;;) {
		uint64_t now = clock_ns(CLOCK_TAI);
		uint64_t k = st->next_block, cur = now / st->flow.period_ns;
		unsigned int colour = k & 1;
		struct altmark_counter snap, delta;
		bool partial;

		if (now < st->next_read_ns || n == MAX_BATCH_RECS)
			break;
		s->c.flows_read++;
		if (read_colour(s, in, st->flow.slot, colour, &snap) < 0) {
			s->c.read_errors++;
			break;
		}
		if (!flow_still_installed(in, st)) {   /* removed/reinstalled since the scan */
			s->c.reads_discarded++;
			in->active[st->flow.slot] = 0;
			in->nactive--;
			break;
		}
		partial = st->clean_for[colour] != k || cur != k + 1 ||
			  st->flow.installed_tai_ns / st->flow.period_ns >= k;
		if (cur != k + 1)
			s->c.blocks_read_late++;
		delta.packets = altmark_counter_delta(st->base[colour].packets, snap.packets, 64);
		delta.bytes = altmark_counter_delta(st->base[colour].bytes, snap.bytes, 64);
		delta.dmark_packets = altmark_counter_delta(st->base[colour].dmark_packets, snap.dmark_packets, 64);
		delta.dmark_ts_sum_ns = altmark_counter_delta(st->base[colour].dmark_ts_sum_ns,
							      snap.dmark_ts_sum_ns, 64);
		if (delta.dmark_packets > UINT16_MAX) {  /* the record's field is 16 bits: no delay then */
			s->c.dmark_overflows++;
			delta.dmark_packets = 0;
			delta.dmark_ts_sum_ns = 0;
		}
		st->base[colour] = snap;
		st->clean_for[colour] = clean_start_for(st, colour, now);
		fill_record(in, st, k, &delta, partial, &recs[n++]);
		if (partial)
			s->c.records_partial++;
		st->next_block = k + 1;
		schedule(st);
	}
	s->nbatched += n;
	if (!s->opts.group_flows)
		ship_batch(s, in, st->flow.flow_id);
	s->c.read_us_sum += (clock_ns(CLOCK_MONOTONIC) - t0) / 1000;
}

/* One flows-map entry of the scan: new flow, same flow, or another installation in the slot. */
static void scan_entry(struct collector *s, struct instance *in, uint8_t kind, const void *key,
		       const struct altmark_flow *f, uint64_t now)
{
	struct flow_state *st;
	size_t key_size = kind == KEY_SIDLIST ? sizeof(struct altmark_sidlist_key) : sizeof(__u32);

	if (f->slot >= ALTMARK_MAX_FLOWS || f->period_ns < NS_PER_MS || f->period_ns % NS_PER_MS ||
	    (f->method != ALTMARK_METHOD_DSCP && f->method != ALTMARK_METHOD_RFC9343)) {
		s->c.bad_flows++;   /* the record could not express it; the datapath counts pass_bad_slot */
		return;
	}
	st = &in->slots[f->slot];
	if (in->active[f->slot] && st->key_kind == kind && !memcmp(&st->key, key, key_size) &&
	    same_flow(&st->flow, f)) {
		if (in->seen[f->slot]) {
			s->c.slot_conflicts++;
			return;
		}
		in->seen[f->slot] = 1;
		return;
	}
	if (in->active[f->slot]) {
		if (in->seen[f->slot]) {   /* two entries claim one slot in one scan: keep the first */
			s->c.slot_conflicts++;
			return;
		}
		s->c.flows_replaced++;   /* another installation: its counts start from its install */
	} else {
		s->c.flows_added++;
		in->nactive++;
	}
	memset(st, 0, sizeof(*st));
	in->active[f->slot] = in->seen[f->slot] = 1;
	st->key_kind = kind;
	memcpy(&st->key, key, key_size);
	st->flow = *f;
	start_flow(s, in, st, now);
}

/* Whole flows map in a few syscalls (BPF_MAP_LOOKUP_BATCH); -1 if the kernel refuses batching. */
static int scan_map_batch(struct collector *s, struct instance *in, int fd, uint8_t kind, uint64_t now)
{
	enum { CHUNK = 1024 };
	static union { struct altmark_sidlist_key sidlist; __u32 flowmon; } keys[CHUNK];
	static struct altmark_flow values[CHUNK];
	size_t key_size = kind == KEY_SIDLIST ? sizeof(struct altmark_sidlist_key) : sizeof(__u32);
	__u64 token = 0;   /* the hash map's batch position (a bucket index) */
	bool first = true;

	for (;;) {
		__u32 n = CHUNK;
		int err = bpf_map_lookup_batch(fd, first ? NULL : &token, &token, keys, values, &n, NULL);

		if (err < 0 && errno != ENOENT)
			return first ? -1 : -2;
		for (__u32 i = 0; i < n; i++)   /* keys are packed key_size apart */
			scan_entry(s, in, kind, (const uint8_t *)keys + i * key_size, &values[i], now);
		if (err < 0)   /* ENOENT: no more entries */
			return 0;
		first = false;
	}
}

static void scan_map(struct collector *s, struct instance *in, int fd, uint8_t kind, uint64_t now)
{
	union { struct altmark_sidlist_key sidlist; __u32 flowmon; } key, next;
	struct altmark_flow f;
	void *prev = NULL;

	while (bpf_map_get_next_key(fd, prev, &next) == 0) {
		key = next;
		prev = &key;
		if (bpf_map_lookup_elem(fd, &key, &f) < 0)
			continue;   /* deleted between the two calls */
		scan_entry(s, in, kind, &key, &f, now);
	}
}

static void scan_instance(struct collector *s, struct instance *in, uint64_t now)
{
	if (in->flows_fd < 0 || instance_maps_replaced(in)) {
		bool was_open = in->flows_fd >= 0;

		if (was_open) {
			s->c.map_reopens++;
			s->c.flows_removed += in->nactive;
			fprintf(stderr, "altmark_collector: %s: maps replaced, reopening (new boot_id)\n",
				in->o.pin_dir);
		}
		quiet_open = !was_open;
		if (open_instance(in) < 0) {   /* program detached: retry at every scan */
			if (was_open)
				fprintf(stderr, "altmark_collector: %s: maps gone, retrying at every scan\n",
					in->o.pin_dir);
			quiet_open = false;
			close_instance_maps(in);
			memset(in->active, 0, ALTMARK_MAX_FLOWS);
			in->nactive = 0;
			return;
		}
		quiet_open = false;
	}
	memset(in->seen, 0, ALTMARK_MAX_FLOWS);
	if (scan_map_batch(s, in, in->flows_fd, KEY_SIDLIST, now) == -1)
		scan_map(s, in, in->flows_fd, KEY_SIDLIST, now);
	if (in->flowmon_fd >= 0 && scan_map_batch(s, in, in->flowmon_fd, KEY_FLOWMON, now) == -1)
		scan_map(s, in, in->flowmon_fd, KEY_FLOWMON, now);
	for (uint32_t i = 0; i < ALTMARK_MAX_FLOWS; i++) {
		if (in->active[i] && !in->seen[i]) {
			in->active[i] = 0;
			in->nactive--;
			s->c.flows_removed++;
		}
	}
}

/* ---------------------------------------------------------------- metrics */

static int format_counters_lp(struct collector *s, char *buf, size_t n, uint64_t ts)
{
	int len = snprintf(buf, n, "segscope_altmark_collector,node=%s ", s->opts.node);
	const char *sep = "";
	uint64_t flows = 0;

	for (int i = 0; i < s->opts.ninst; i++)
		flows += s->inst[i].nactive;
#define X(f) len += snprintf(buf + len, n - len, "%s" #f "=%" PRIu64 "i", sep, s->c.f); sep = ",";
	COUNTER_FIELDS(X)
#undef X
	len += snprintf(buf + len, n - len, ",flows=%" PRIu64 "i,kafka_queue_len=%di %" PRIu64, flows,
			s->rk ? rd_kafka_outq_len(s->rk) : 0, ts);
	return len;
}

static int format_counters_json(struct collector *s, char *buf, size_t n, bool final)
{
	int len = snprintf(buf, n, "{\"counters\":{\"node\":\"%s\"", s->opts.node);
	uint64_t flows = 0;

	for (int i = 0; i < s->opts.ninst; i++)
		flows += s->inst[i].nactive;
#define X(f) len += snprintf(buf + len, n - len, ",\"" #f "\":%" PRIu64, s->c.f);
	COUNTER_FIELDS(X)
#undef X
	len += snprintf(buf + len, n - len, ",\"flows\":%" PRIu64 ",\"batch_seq\":%" PRIu64
			",\"kafka_queue_len\":%d},\"final\":%s}", flows, s->batch_seq,
			s->rk ? rd_kafka_outq_len(s->rk) : 0, final ? "true" : "false");
	return len;
}

static void publish_stats(struct collector *s, bool final)
{
	char buf[4096];
	int len;

	if (s->opts.to_stdout) {
		format_counters_json(s, buf, sizeof(buf), final);
		printf("%s\n", buf);
		fflush(stdout);
		return;
	}
	len = format_counters_lp(s, buf, sizeof(buf), clock_ns(CLOCK_REALTIME));
	if (kafka_produce(s, s->metrics_topic, buf, len, s->opts.node, strlen(s->opts.node), 1) == 0)
		s->c.metrics_produced++;
	else
		s->c.metrics_failed++;
}

/* ------------------------------------------------------------------- main */

static void sleep_until_tai(uint64_t t)
{
	struct timespec ts = { .tv_sec = t / NS_PER_S, .tv_nsec = t % NS_PER_S };

	/* absolute on CLOCK_TAI: no drift from computing intervals; EINTR = a signal, loop rechecks */
	clock_nanosleep(CLOCK_TAI, TIMER_ABSTIME, &ts, NULL);
}

static void run(struct collector *s)
{
	uint64_t stats_ns = (uint64_t)(s->opts.stats_interval_s * 1e9);
	uint64_t now = clock_ns(CLOCK_TAI);
	uint64_t next_stats = now + stats_ns, next_scan = now, wake = now;

	while (!stop_requested && !kafka_refusal[0]) {
		uint64_t next = next_stats;

		now = clock_ns(CLOCK_TAI);
		if (now > wake) {   /* idle vCPUs wake late; the margin absorbs it, the counter shows it */
			uint64_t late_us = (now - wake) / 1000;

			s->c.wake_late_us_sum += late_us;
			if (late_us > s->c.wake_late_us_max)
				s->c.wake_late_us_max = late_us;
		}
		s->c.ticks++;
		uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
		if (tether_orphaned(&s->opts.tether, t0 / 1e9))
			break;   /* no agent: flush and stop as on SIGTERM */
		/* rescan before reading: a flow removed or reinstalled must not be read as the old one */
		for (int i = 0; i < s->opts.ninst; i++)
			scan_instance(s, &s->inst[i], now);
		s->c.scans++;
		s->c.scan_us_sum += (clock_ns(CLOCK_MONOTONIC) - t0) / 1000;
		next_scan = now + s->opts.scan_interval_ns;
		for (int i = 0; i < s->opts.ninst; i++) {
			struct instance *in = &s->inst[i];

			for (uint32_t slot = 0; slot < ALTMARK_MAX_FLOWS && in->flows_fd >= 0; slot++) {
				struct flow_state *st = &in->slots[slot];

				if (!in->active[slot])
					continue;
				emit_due_blocks(s, in, st);
				if (in->active[slot] && st->next_read_ns < next)
					next = st->next_read_ns;
			}
			ship_batch(s, in, 0);   /* grouped flows: the rest of this instance's tick */
		}
		if (s->rk)
			rd_kafka_poll(s->rk, 0);   /* serve delivery reports */
		if (!kafka_recover_producer(s))
			break;
		now = clock_ns(CLOCK_TAI);
		if (now >= next_stats) {
			publish_stats(s, false);
			next_stats += stats_ns;
			if (next_stats <= now)
				next_stats = now + stats_ns;
		}
		if (next_scan < next)
			next = next_scan;
		if (next_stats < next)
			next = next_stats;
		wake = next;
		fflush(stdout);
		if (!stop_requested)
			sleep_until_tai(next);
	}
}

int main(int argc, char **argv)
{
	static struct collector s;
	struct sigaction sa = { .sa_handler = on_signal };
	char json[4096];
	uint64_t lost;

	parse_args(argc, argv, &s.opts);
	if (!s.opts.to_stdout && kafka_security_load("altmark_collector") < 0)
		return 2;   /* the message names the SEGSCOPE_KAFKA_* variable and the fix */
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	s.ncpus = libbpf_num_possible_cpus();
	if (s.ncpus <= 0) {
		fprintf(stderr, "altmark_collector: libbpf_num_possible_cpus: %s\n", strerror(-s.ncpus));
		return 1;
	}
	s.percpu = calloc(s.ncpus, sizeof(*s.percpu));
	s.batch = malloc(ALTMARK_BATCH_HEADER_SIZE +
			 (size_t)(s.opts.max_batch > MAX_BATCH_RECS ? s.opts.max_batch : MAX_BATCH_RECS) *
			 ALTMARK_BLOCK_SIZE);
	for (int i = 0; i < s.opts.ninst; i++) {
		struct instance *in = &s.inst[i];

		in->o = s.opts.inst[i];
		in->flows_fd = in->flowmon_fd = in->counters_fd = -1;
		snprintf(in->flows_path, sizeof(in->flows_path), "%s/altmark_flows", in->o.pin_dir);
		snprintf(in->flowmon_path, sizeof(in->flowmon_path), "%s/altmark_flowmon", in->o.pin_dir);
		snprintf(in->counters_path, sizeof(in->counters_path), "%s/altmark_counters", in->o.pin_dir);
		in->slots = calloc(ALTMARK_MAX_FLOWS, sizeof(*in->slots));
		in->active = calloc(ALTMARK_MAX_FLOWS, 1);
		in->seen = calloc(ALTMARK_MAX_FLOWS, 1);
		if (!s.percpu || !s.batch || !in->slots || !in->active || !in->seen) {
			fprintf(stderr, "altmark_collector: out of memory\n");
			return 1;
		}
		if (open_instance(in) < 0)
			return 1;
	}
	if (!s.opts.to_stdout && kafka_open(&s) < 0)
		return 1;
	fprintf(stderr, "altmark_collector: %d instance(s) -> %s (node %s)\n", s.opts.ninst,
		s.opts.to_stdout ? "stdout" : s.opts.topic, s.opts.node);

	run(&s);

	publish_stats(&s, true);
	if (s.rk) {
		kafka_refused_purge(s.rk);   /* refused: what is queued is failed (counted), not waited for */
		rd_kafka_flush(s.rk, s.opts.flush_timeout_ms);
		if (rd_kafka_fatal_error(s.rk, NULL, 0) != RD_KAFKA_RESP_ERR_NO_ERROR && kafka_recover_producer(&s) && s.rk)
			rd_kafka_flush(s.rk, s.opts.flush_timeout_ms);   /* once: a second failure is counted */
	}
	format_counters_json(&s, json, sizeof(json), true);
	if (!s.opts.to_stdout)
		printf("%s\n", json);
	fflush(stdout);

	/* anything emitted and not acknowledged by Kafka is lost */
	lost = s.c.records_out - s.c.records_delivered;
	if (lost)
		fprintf(stderr, "altmark_collector: %" PRIu64 " records lost (failed %" PRIu64 ")\n", lost,
			s.c.records_failed);
	for (int i = 0; i < s.opts.ninst; i++)
		close_instance_maps(&s.inst[i]);
	if (s.rk) {
		rd_kafka_topic_destroy(s.blocks_topic);
		rd_kafka_topic_destroy(s.metrics_topic);
		rd_kafka_destroy(s.rk);
	}
	if (kafka_refusal[0]) {
		fprintf(stderr, "altmark_collector: stopped, Kafka refused this client: %s\n", kafka_refusal);
		return KAFKA_EXIT_REFUSED;
	}
	return lost ? 1 : 0;
}
