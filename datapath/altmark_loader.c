// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Shared part of the alternate-marking loaders (see altmark_loader.h):
 * arguments, flows (add/del/list with slot allocation), stats.
 *
 * Slots: a flow's per-CPU counters live at altmark_counters[slot * 2 + colour].
 * add-flow takes the flow's current slot when the same key is reinstalled,
 * else the lowest slot no flow of this program uses; it zeroes the slot's
 * counters before the flow entry (re)appears, so a new flow never inherits
 * old counts, and records installed_tai_ns (the block the collector marks
 * partial).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include "altmark_loader.h"
#include "loader_util.h"

enum { OPT_NETNS = 256, OPT_DEV, OPT_INSTANCE, OPT_PIN_DIR, OPT_SIDS, OPT_FLOW_ID, OPT_FLOWMON_ID,
       OPT_METHOD, OPT_PERIOD_MS, OPT_DMARK_EVERY, OPT_L_BIT, OPT_D_BIT, OPT_JSON };

static const struct option long_opts[] = {
	{ "netns", required_argument, NULL, OPT_NETNS },
	{ "dev", required_argument, NULL, OPT_DEV },
	{ "instance", required_argument, NULL, OPT_INSTANCE },
	{ "pin-dir", required_argument, NULL, OPT_PIN_DIR },
	{ "sids", required_argument, NULL, OPT_SIDS },
	{ "flow-id", required_argument, NULL, OPT_FLOW_ID },
	{ "flowmon-id", required_argument, NULL, OPT_FLOWMON_ID },
	{ "method", required_argument, NULL, OPT_METHOD },
	{ "period-ms", required_argument, NULL, OPT_PERIOD_MS },
	{ "dmark-every", required_argument, NULL, OPT_DMARK_EVERY },
	{ "dscp-l-bit", required_argument, NULL, OPT_L_BIT },
	{ "dscp-d-bit", required_argument, NULL, OPT_D_BIT },
	{ "json", no_argument, NULL, OPT_JSON },
	{ "help", no_argument, NULL, 'h' },
	{},
};

static const char *const method_names[] = { "dscp", "rfc9343" };

static void usage(const struct altmark_prog *p, FILE *f)
{
	fprintf(f,
		"usage:\n"
		"  %1$s attach --dev IF --instance NAME [--netns NS] [--pin-dir DIR]\n"
		"  %1$s detach --dev IF --instance NAME [--netns NS] [--pin-dir DIR]\n"
		"  %1$s attach-dev|detach-dev --dev IF --instance NAME [--netns NS]   (one more device / off one)\n"
		"  %1$s add-flow --instance NAME %2$s --flow-id N --method dscp|rfc9343\n"
		"      --period-ms P [--dmark-every N] [--dscp-l-bit B --dscp-d-bit B]\n"
		"  %1$s del-flow --instance NAME (--sids A,B,..%3$s | --flow-id N)\n"
		"  %1$s list-flows --instance NAME [--json]\n"
		"  %1$s stats --instance NAME [--json]\n"
		"%5$s"
		"--sids: the policy's SIDs in travel order (as in `ip route ... encap seg6 segs A,B`), <= %4$d;\n"
		"pins in " ALTMARK_PIN_ROOT "/NAME/%1$s unless --pin-dir.\n"
		"%6$s",
		p->name, p->is_rx ? "(--sids A,B,.. [dscp] | --flowmon-id N [rfc9343])" : "--sids A,B,..",
		p->is_rx ? " | --flowmon-id N" : "", ALTMARK_MAX_SIDS,
		p->chain ? "  altmark_rx chain --instance NAME [--netns NS]   (JSON: the instance's XDP chain per device)\n"
			 : "",
		p->chain ? "attach joins the XDP chain of IF (<instance>/xdp_chain): altmark_rx sees every packet\n"
			   "first, then ioam_rx, stamp_collector, stamp_reflector of the instance on that device.\n"
			 : "");
}

static int parse_args(const struct altmark_prog *p, int argc, char **argv, struct altmark_args *a)
{
	int opt;

	memset(a, 0, sizeof(*a));
	a->l_bit = ALTMARK_DSCP_L_BIT_DEFAULT;
	a->d_bit = ALTMARK_DSCP_D_BIT_DEFAULT;
	optind = 1;
	while ((opt = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
		switch (opt) {
		case OPT_NETNS: a->netns = optarg; break;
		case OPT_DEV: a->dev = optarg; break;
		case OPT_INSTANCE: a->instance = optarg; break;
		case OPT_PIN_DIR: a->pin_dir = optarg; break;
		case OPT_SIDS: a->sids = optarg; break;
		case OPT_METHOD: a->method = optarg; break;
		case OPT_JSON: a->json = true; break;
		case OPT_FLOW_ID:
			if (!parse_u64_arg("--flow-id", optarg, 0, UINT32_MAX, &a->flow_id))
				return -1;
			a->have_flow_id = true;
			break;
		case OPT_FLOWMON_ID:
			if (!parse_u64_arg("--flowmon-id", optarg, 0, ALTMARK_FLOWMONID_MAX, &a->flowmon_id))
				return -1;
			a->have_flowmon_id = true;
			break;
		case OPT_PERIOD_MS:
			/* tests use periods below the 1 s of production; the block record holds ms in u32 */
			if (!parse_u64_arg("--period-ms", optarg, 1, UINT32_MAX, &a->period_ms))
				return -1;
			a->have_period = true;
			break;
		case OPT_DMARK_EVERY:
			if (!parse_u64_arg("--dmark-every", optarg, 0, UINT32_MAX, &a->dmark_every))
				return -1;
			break;
		case OPT_L_BIT:
			if (!parse_u64_arg("--dscp-l-bit", optarg, 0, ALTMARK_DSCP_BITS - 1, &a->l_bit))
				return -1;
			a->have_l_bit = true;
			break;
		case OPT_D_BIT:
			if (!parse_u64_arg("--dscp-d-bit", optarg, 0, ALTMARK_DSCP_BITS - 1, &a->d_bit))
				return -1;
			a->have_d_bit = true;
			break;
		case 'h': usage(p, stdout); exit(EXIT_OK);
		default: usage(p, stderr); return -1;
		}
	}
	if (optind < argc) {
		die_msg("unexpected argument '%s'", argv[optind]);
		return -1;
	}
	return 0;
}

/* --pin-dir, else ALTMARK_PIN_ROOT/<instance>/<prog>. */
static bool resolve_pin_dir(const struct altmark_prog *p, struct altmark_args *a)
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
	snprintf(a->pin_dir_buf, sizeof(a->pin_dir_buf), "%s/%s/%s", ALTMARK_PIN_ROOT, a->instance, p->name);
	a->pin_dir = a->pin_dir_buf;
	return true;
}

/* "a,b,c" in travel order -> key in SRH wire order (sids[0] = c, the final segment). */
static bool parse_sids(const char *text, struct altmark_sidlist_key *key)
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

static void print_sids_json(const struct altmark_sidlist_key *key)
{
	char text[INET6_ADDRSTRLEN];

	putchar('[');
	for (int i = (int)key->nsids - 1, first = 1; i >= 0 && i < ALTMARK_MAX_SIDS; i--, first = 0) {
		inet_ntop(AF_INET6, &key->sids[i], text, sizeof(text));
		printf("%s\"%s\"", first ? "" : ", ", text);
	}
	putchar(']');
}

static uint64_t tai_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_TAI, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

struct flow_maps {
	int flows, flowmon, counters;   /* flowmon = -1 for altmark_tx */
};

static int open_maps(const struct altmark_prog *p, const char *dir, struct flow_maps *m)
{
	m->flows = open_pinned(dir, "altmark_flows");
	m->counters = m->flows < 0 ? -1 : open_pinned(dir, "altmark_counters");
	m->flowmon = (!p->is_rx || m->counters < 0) ? -1 : open_pinned(dir, "altmark_flowmon");
	if (m->flows < 0 || m->counters < 0 || (p->is_rx && m->flowmon < 0))
		return -1;
	return 0;
}

static void close_maps(struct flow_maps *m)
{
	if (m->flows >= 0)
		close(m->flows);
	if (m->flowmon >= 0)
		close(m->flowmon);
	if (m->counters >= 0)
		close(m->counters);
}

/* Calls fn for every flow of both maps (flowmon key or NULL). Stops at the first non-zero return. */
typedef int (*flow_fn)(const struct altmark_sidlist_key *key, const uint32_t *flowmon,
		       const struct altmark_flow *flow, void *ctx);

static int for_each_flow(const struct flow_maps *m, flow_fn fn, void *ctx)
{
	struct altmark_sidlist_key key, next;
	struct altmark_flow flow;
	uint32_t fm, fm_next;
	void *prev = NULL;
	int rc;

	while (!bpf_map_get_next_key(m->flows, prev, &next)) {
		key = next;
		prev = &key;
		if (bpf_map_lookup_elem(m->flows, &key, &flow))
			continue;   /* deleted meanwhile */
		if ((rc = fn(&key, NULL, &flow, ctx)))
			return rc;
	}
	if (m->flowmon < 0)
		return 0;
	prev = NULL;
	while (!bpf_map_get_next_key(m->flowmon, prev, &fm_next)) {
		fm = fm_next;
		prev = &fm;
		if (bpf_map_lookup_elem(m->flowmon, &fm, &flow))
			continue;
		if ((rc = fn(NULL, &fm, &flow, ctx)))
			return rc;
	}
	return 0;
}

struct slot_scan {
	uint8_t *used;                         /* ALTMARK_MAX_FLOWS */
	const struct altmark_sidlist_key *key; /* the flow being added (NULL: flowmon) */
	uint32_t flowmon, flow_id;
	int64_t own_slot;                      /* slot of the same key already installed, or -1 */
	bool flow_id_taken;
};

static int scan_slot(const struct altmark_sidlist_key *key, const uint32_t *flowmon,
		     const struct altmark_flow *flow, void *ctx)
{
	struct slot_scan *s = ctx;
	bool same = s->key ? key && !memcmp(key, s->key, sizeof(*key)) : flowmon && *flowmon == s->flowmon;

	if (flow->slot < ALTMARK_MAX_FLOWS)
		s->used[flow->slot] = 1;
	if (same)
		s->own_slot = flow->slot;
	else if (flow->flow_id == s->flow_id)
		s->flow_id_taken = true;
	return 0;
}

static int zero_counters(int fd, uint32_t slot)
{
	int ncpu = libbpf_num_possible_cpus();
	struct altmark_counter *zeros = calloc(ncpu > 0 ? ncpu : 1, sizeof(*zeros));
	int err = 0;

	if (!zeros)
		return -ENOMEM;
	for (uint32_t colour = 0; colour < 2 && !err; colour++) {
		uint32_t idx = slot * 2 + colour;

		if (bpf_map_update_elem(fd, &idx, zeros, BPF_ANY))
			err = -errno;
	}
	free(zeros);
	return err;
}

static int cmd_add_flow(const struct altmark_prog *p, struct altmark_args *a)
{
	struct altmark_sidlist_key key;
	struct altmark_flow flow = {};
	struct flow_maps m = { -1, -1, -1 };
	struct slot_scan scan = { .own_slot = -1 };
	bool by_flowmon;
	int method, rc = EXIT_FAIL;
	int64_t slot = -1;

	if (!resolve_pin_dir(p, a))
		return EXIT_USAGE;
	if (!require_arg(a->method, "--method"))
		return EXIT_USAGE;
	method = parse_choice_arg("--method", a->method, method_names, 2);
	if (method < 0)
		return EXIT_USAGE;
	method += ALTMARK_METHOD_DSCP;
	if (!a->have_period) {
		die_msg("missing required --period-ms");
		return EXIT_USAGE;
	}
	/* rx rfc9343 flows are found by FlowMonID (the option in the packet), everything else by SID list */
	by_flowmon = p->is_rx && method == ALTMARK_METHOD_RFC9343;
	if (by_flowmon) {
		if (!a->have_flowmon_id && !a->have_flow_id) {
			die_msg("missing required --flowmon-id (an rfc9343 flow at rx is keyed by its FlowMonID)");
			return EXIT_USAGE;
		}
		if (a->have_flowmon_id && a->have_flow_id && a->flowmon_id != a->flow_id) {
			die_msg("--flow-id %llu differs from --flowmon-id %llu: an rfc9343 flow's id is its FlowMonID",
				(unsigned long long)a->flow_id, (unsigned long long)a->flowmon_id);
			return EXIT_USAGE;
		}
		if (!a->have_flow_id)
			a->flow_id = a->flowmon_id;
	} else {
		if (a->have_flowmon_id && !p->is_rx) {
			die_msg("--flowmon-id: altmark_tx takes the FlowMonID from --flow-id");
			return EXIT_USAGE;
		}
		if (a->have_flowmon_id) {
			die_msg("--flowmon-id: only for --method rfc9343 (dscp flows are keyed by --sids)");
			return EXIT_USAGE;
		}
		if (!require_arg(a->sids, "--sids") || !parse_sids(a->sids, &key))
			return EXIT_USAGE;
		if (!a->have_flow_id) {
			die_msg("missing required --flow-id");
			return EXIT_USAGE;
		}
	}
	if (method == ALTMARK_METHOD_RFC9343 && a->flow_id > ALTMARK_FLOWMONID_MAX) {
		die_msg("--flow-id: %llu does not fit the 20-bit FlowMonID of rfc9343 (max %u)",
			(unsigned long long)a->flow_id, ALTMARK_FLOWMONID_MAX);
		return EXIT_USAGE;
	}
	if (method == ALTMARK_METHOD_DSCP && a->l_bit == a->d_bit) {
		die_msg("--dscp-d-bit: must differ from --dscp-l-bit (both %llu)", (unsigned long long)a->l_bit);
		return EXIT_USAGE;
	}
	if (method == ALTMARK_METHOD_RFC9343 && (a->have_l_bit || a->have_d_bit)) {
		die_msg("--dscp-l-bit/--dscp-d-bit: only for --method dscp");
		return EXIT_USAGE;
	}
	if (open_maps(p, a->pin_dir, &m))
		goto out;
	scan.used = calloc(ALTMARK_MAX_FLOWS, 1);
	if (!scan.used)
		goto out;
	scan.key = by_flowmon ? NULL : &key;
	scan.flowmon = (uint32_t)a->flow_id;
	scan.flow_id = (uint32_t)a->flow_id;
	for_each_flow(&m, scan_slot, &scan);
	if (scan.flow_id_taken) {
		die_msg("--flow-id: %llu is already used by another flow of %s; del-flow it first",
			(unsigned long long)a->flow_id, a->pin_dir);
		goto out;
	}
	slot = scan.own_slot;
	for (uint32_t s = 0; slot < 0 && s < ALTMARK_MAX_FLOWS; s++)
		if (!scan.used[s])
			slot = s;
	if (slot < 0) {
		die_msg("all %d flow slots of %s are in use", ALTMARK_MAX_FLOWS, a->pin_dir);
		goto out;
	}
	flow.flow_id = (uint32_t)a->flow_id;
	flow.slot = (uint32_t)slot;
	flow.period_ns = a->period_ms * 1000000ULL;
	flow.method = (uint8_t)method;
	flow.dscp_l_bit = method == ALTMARK_METHOD_DSCP ? (uint8_t)a->l_bit : 0;
	flow.dscp_d_bit = method == ALTMARK_METHOD_DSCP ? (uint8_t)a->d_bit : 0;
	flow.dmark_every = (uint32_t)a->dmark_every;
	/* reinstall: the old entry goes first, so nothing counts into the slot while it is zeroed */
	if (by_flowmon)
		bpf_map_delete_elem(m.flowmon, &scan.flowmon);
	else
		bpf_map_delete_elem(m.flows, &key);
	if (zero_counters(m.counters, flow.slot)) {
		die_msg("cannot zero the counters of slot %u: %s", flow.slot, strerror(errno));
		goto out;
	}
	flow.installed_tai_ns = tai_now_ns();
	if (by_flowmon ? bpf_map_update_elem(m.flowmon, &scan.flowmon, &flow, BPF_NOEXIST)
		       : bpf_map_update_elem(m.flows, &key, &flow, BPF_NOEXIST)) {
		die_msg("cannot install the flow in %s: %s", a->pin_dir, strerror(errno));
		goto out;
	}
	printf("flow %u (%s) installed in slot %u of %s\n", flow.flow_id, method_names[method - 1], flow.slot,
	       a->pin_dir);
	rc = EXIT_OK;
out:
	free(scan.used);
	close_maps(&m);
	return rc;
}

struct del_ctx {
	uint32_t flow_id;
	struct altmark_sidlist_key key;
	uint32_t flowmon;
	bool found, is_flowmon;
};

static int find_by_id(const struct altmark_sidlist_key *key, const uint32_t *flowmon,
		      const struct altmark_flow *flow, void *ctx)
{
	struct del_ctx *d = ctx;

	if (flow->flow_id != d->flow_id)
		return 0;
	d->found = true;
	d->is_flowmon = flowmon != NULL;
	if (key)
		d->key = *key;
	else
		d->flowmon = *flowmon;
	return 1;
}

static int cmd_del_flow(const struct altmark_prog *p, struct altmark_args *a)
{
	struct flow_maps m = { -1, -1, -1 };
	struct del_ctx d = {};
	int rc = EXIT_FAIL, err;

	if (!resolve_pin_dir(p, a))
		return EXIT_USAGE;
	if (a->sids) {
		if (!parse_sids(a->sids, &d.key))
			return EXIT_USAGE;
		d.found = true;
	} else if (a->have_flowmon_id && p->is_rx) {
		d.flowmon = (uint32_t)a->flowmon_id;
		d.found = d.is_flowmon = true;
	} else if (!a->have_flow_id) {
		die_msg("missing required --sids%s or --flow-id", p->is_rx ? ", --flowmon-id" : "");
		return EXIT_USAGE;
	}
	if (open_maps(p, a->pin_dir, &m))
		goto out;
	if (!d.found) {
		d.flow_id = (uint32_t)a->flow_id;
		for_each_flow(&m, find_by_id, &d);
		if (!d.found) {
			die_msg("--flow-id: no flow %u in %s", d.flow_id, a->pin_dir);
			goto out;
		}
	}
	err = d.is_flowmon ? bpf_map_delete_elem(m.flowmon, &d.flowmon) : bpf_map_delete_elem(m.flows, &d.key);
	if (err) {
		die_msg("%s: no such flow in %s", a->sids ? "--sids" : d.is_flowmon ? "--flowmon-id" : "--flow-id",
			a->pin_dir);
		goto out;
	}
	/* the slot's counters stay as they were until a new flow takes the slot (and zeroes them) */
	printf("flow deleted from %s\n", a->pin_dir);
	rc = EXIT_OK;
out:
	close_maps(&m);
	return rc;
}

struct list_ctx {
	int counters_fd, ncpu, n;
	struct altmark_counter *percpu;
	bool json;
};

static void sum_counter(struct list_ctx *l, uint32_t idx, struct altmark_counter *sum)
{
	memset(sum, 0, sizeof(*sum));
	if (bpf_map_lookup_elem(l->counters_fd, &idx, l->percpu))
		return;
	for (int cpu = 0; cpu < l->ncpu; cpu++) {
		sum->packets += l->percpu[cpu].packets;
		sum->bytes += l->percpu[cpu].bytes;
		sum->dmark_packets += l->percpu[cpu].dmark_packets;
		sum->dmark_ts_sum_ns += l->percpu[cpu].dmark_ts_sum_ns;
	}
}

static int list_one(const struct altmark_sidlist_key *key, const uint32_t *flowmon,
		    const struct altmark_flow *flow, void *ctx)
{
	struct list_ctx *l = ctx;
	struct altmark_counter c[2];
	const char *method = flow->method == ALTMARK_METHOD_DSCP ? "dscp"
			   : flow->method == ALTMARK_METHOD_RFC9343 ? "rfc9343" : "?";

	for (uint32_t colour = 0; colour < 2; colour++)
		sum_counter(l, flow->slot * 2 + colour, &c[colour]);
	if (!l->json) {
		printf("flow %u %s slot %u period %llu ms dmark_every %u colour0 %llu pkts colour1 %llu pkts\n",
		       flow->flow_id, method, flow->slot, (unsigned long long)(flow->period_ns / 1000000),
		       flow->dmark_every, (unsigned long long)c[0].packets, (unsigned long long)c[1].packets);
		return 0;
	}
	printf("%s{\"flow_id\": %u, \"method\": \"%s\", \"slot\": %u, \"period_ms\": %llu, \"period_ns\": %llu, "
	       "\"installed_tai_ns\": %llu, \"dmark_every\": %u, ",
	       l->n++ ? ", " : "", flow->flow_id, method, flow->slot,
	       (unsigned long long)(flow->period_ns / 1000000), (unsigned long long)flow->period_ns,
	       (unsigned long long)flow->installed_tai_ns, flow->dmark_every);
	if (flow->method == ALTMARK_METHOD_DSCP)
		printf("\"dscp_l_bit\": %u, \"dscp_d_bit\": %u, ", flow->dscp_l_bit, flow->dscp_d_bit);
	if (key) {
		printf("\"sids\": ");
		print_sids_json(key);
	} else {
		printf("\"flowmon_id\": %u", *flowmon);
	}
	printf(", \"counters\": [");
	for (int colour = 0; colour < 2; colour++)
		printf("%s{\"colour\": %d, \"packets\": %llu, \"bytes\": %llu, \"dmark_packets\": %llu, "
		       "\"dmark_ts_sum_ns\": %llu}", colour ? ", " : "", colour,
		       (unsigned long long)c[colour].packets, (unsigned long long)c[colour].bytes,
		       (unsigned long long)c[colour].dmark_packets, (unsigned long long)c[colour].dmark_ts_sum_ns);
	printf("]}");
	return 0;
}

static int cmd_list_flows(const struct altmark_prog *p, struct altmark_args *a)
{
	struct flow_maps m = { -1, -1, -1 };
	struct list_ctx l = { .json = a->json };
	int rc = EXIT_FAIL;

	if (!resolve_pin_dir(p, a))
		return EXIT_USAGE;
	if (open_maps(p, a->pin_dir, &m))
		goto out;
	l.counters_fd = m.counters;
	l.ncpu = libbpf_num_possible_cpus();
	l.percpu = calloc(l.ncpu > 0 ? l.ncpu : 1, sizeof(*l.percpu));
	if (!l.percpu)
		goto out;
	if (a->json)
		printf("{\"program\": \"%s\", \"pin_dir\": \"%s\", \"flows\": [", p->name, a->pin_dir);
	for_each_flow(&m, list_one, &l);
	if (a->json)
		printf("]}\n");
	rc = EXIT_OK;
out:
	free(l.percpu);
	close_maps(&m);
	return rc;
}

/* Subcommand handlers of the dispatch table (args is struct altmark_args *, ctx the program). */
static int run_attach_detach(struct altmark_args *a, const struct altmark_prog *p, bool attach)
{
	if (!require_arg(a->dev, "--dev") || !resolve_pin_dir(p, a))
		return EXIT_USAGE;
	return attach ? p->attach(a) : p->detach(a);
}

static int run_dev(struct altmark_args *a, const struct altmark_prog *p, bool attach)
{
	if (!require_arg(a->dev, "--dev") || !resolve_pin_dir(p, a))
		return EXIT_USAGE;
	return (attach ? p->attach_dev(a) : p->detach_dev(a)) ? EXIT_FAIL : EXIT_OK;
}

static int run_attach_dev(void *a, const void *p) { return run_dev(a, p, true); }
static int run_detach_dev(void *a, const void *p) { return run_dev(a, p, false); }
static int run_attach(void *a, const void *p) { return run_attach_detach(a, p, true); }
static int run_detach(void *a, const void *p) { return run_attach_detach(a, p, false); }
static int run_add_flow(void *a, const void *p) { return cmd_add_flow(p, a); }
static int run_del_flow(void *a, const void *p) { return cmd_del_flow(p, a); }
static int run_list_flows(void *a, const void *p) { return cmd_list_flows(p, a); }

static int run_chain(void *args, const void *prog)
{
	const struct altmark_prog *p = prog;
	struct altmark_args *a = args;

	if (!p->chain) {
		die_msg("chain: %s is a TC program, not a member of the XDP chain", p->name);
		return EXIT_USAGE;
	}
	if (!resolve_pin_dir(p, a))
		return EXIT_USAGE;
	return p->chain(a);
}

static int run_stats(void *args, const void *prog)
{
	const struct altmark_prog *p = prog;
	struct altmark_args *a = args;

	if (!resolve_pin_dir(p, a))
		return EXIT_USAGE;
	return print_counters(a->pin_dir, "altmark_stats", p->counter_names, p->n_counters, a->json)
		? EXIT_FAIL : EXIT_OK;
}

static const struct loader_cmd commands[] = {
	{"attach", run_attach},
	{"detach", run_detach},
	{"attach-dev", run_attach_dev},
	{"detach-dev", run_detach_dev},
	{"add-flow", run_add_flow},
	{"del-flow", run_del_flow},
	{"list-flows", run_list_flows},
	{"stats", run_stats},
	{"chain", run_chain},
	{NULL, NULL},
};

int altmark_main(const struct altmark_prog *p, int argc, char **argv)
{
	struct altmark_args a;
	const char *cmd;
	int rc;

	if (argc < 2) {
		usage(p, stderr);
		return EXIT_USAGE;
	}
	cmd = argv[1];
	if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
		usage(p, stdout);
		return EXIT_OK;
	}
	if (parse_args(p, argc - 1, argv + 1, &a))
		return EXIT_USAGE;
	rc = run_subcommand(commands, cmd, &a, p);
	if (rc < 0) {
		usage(p, stderr);
		return EXIT_USAGE;
	}
	return rc;
}
