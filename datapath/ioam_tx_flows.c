// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * The flow commands of the two in-line IOAM inserters, ioam_tx (TC egress) and ioam_lwt (the
 * route program): both keep their flows in a map named ioam_tx_flows (struct ioam_tx_flow), their
 * interface ids in ioam_if_ids and TAI-UTC in ioam_tx_config, each in its own pin directory.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <bpf/bpf.h>
#include "ioam_loader.h"
#include "ioam_tx_flows.h"

int ioam_tx_write_config(int fd, const struct ioam_args *a)
{
	struct ioam_tx_config cfg = {};

	if (ioam_tai_offset(a, &cfg.tai_utc_offset_s))
		return -1;
	return write_config_map(fd, &cfg, "ioam_tx_config");
}

/* "PFX/LEN" -> masked prefix and mask; false after a message naming the flag. */
bool ioam_parse_prefix(const char *flag, const char *text, __u8 addr[16], __u8 mask[16], __u8 *len_out)
{
	char buf[INET6_ADDRSTRLEN + 8], *slash, *end;
	long len;

	if (strlen(text) >= sizeof(buf))
		goto bad;
	strcpy(buf, text);
	slash = strchr(buf, '/');
	if (!slash)
		goto bad;
	*slash = '\0';
	len = strtol(slash + 1, &end, 10);
	if (!slash[1] || *end || len < 0 || len > 128 || inet_pton(AF_INET6, buf, addr) != 1)
		goto bad;
	for (int i = 0; i < 16; i++) {
		int bits = len - 8 * i;

		mask[i] = bits >= 8 ? 0xff : bits <= 0 ? 0 : (__u8)(0xff << (8 - bits));
		addr[i] &= mask[i];
	}
	*len_out = (__u8)len;
	return true;
bad:
	die_msg("%s: expected an IPv6 prefix ADDR/LEN (LEN 0..128), got '%s'", flag, text);
	return false;
}

static bool build_match(const struct ioam_args *a, struct ioam_match *m)
{
	memset(m, 0, sizeof(*m));
	if (a->match_src) {
		if (!ioam_parse_prefix("--match-src", a->match_src, m->src, m->src_mask, &m->src_len))
			return false;
		m->fields |= IOAM_MATCH_SRC;
	}
	if (a->match_dst) {
		if (!ioam_parse_prefix("--match-dst", a->match_dst, m->dst, m->dst_mask, &m->dst_len))
			return false;
		m->fields |= IOAM_MATCH_DST;
	}
	if (a->have_match_proto) {
		m->proto = (__u8)a->match_proto;
		m->fields |= IOAM_MATCH_PROTO;
	}
	if ((a->have_match_sport || a->have_match_dport) && a->have_match_proto && a->match_proto != IPPROTO_TCP &&
	    a->match_proto != IPPROTO_UDP) {
		die_msg("--match-sport/--match-dport: ports need --match-proto 6 (TCP) or 17 (UDP), got %llu",
			(unsigned long long)a->match_proto);
		return false;
	}
	if (a->have_match_sport) {
		m->sport = (__u16)a->match_sport;
		m->fields |= IOAM_MATCH_SPORT;
	}
	if (a->have_match_dport) {
		m->dport = (__u16)a->match_dport;
		m->fields |= IOAM_MATCH_DPORT;
	}
	return true;
}

int ioam_tx_add_flow(void *args, const void *prog)
{
	struct ioam_args *a = args;
	struct altmark_sidlist_key key, other;
	struct ioam_tx_flow flow = {};
	int fd, r, rc = EXIT_FAIL;

	if (!ioam_resolve_pin_dir(prog, a))
		return EXIT_USAGE;
	if (!require_arg(a->sids, "--sids") || !ioam_parse_sids(a->sids, &key))
		return EXIT_USAGE;
	if (!a->have_flow_id || !a->have_namespace_id || !a->have_node_id || !a->have_trace_nodes) {
		die_msg("missing required %s", !a->have_flow_id ? "--flow-id" : !a->have_namespace_id ? "--namespace-id"
					       : !a->have_node_id ? "--node-id" : "--trace-nodes");
		return EXIT_USAGE;
	}
	if (a->have_sample_every == a->have_sample_interval) {
		die_msg("--sample-every / --sample-interval-us: give exactly one of them");
		return EXIT_USAGE;
	}
	if (!build_match(a, &flow.match))
		return EXIT_USAGE;
	flow.flow_id = (__u32)a->flow_id;
	flow.namespace_id = (__u16)a->namespace_id;
	flow.node_id = (__u32)a->node_id;
	flow.trace_nodes = (__u8)a->trace_nodes;
	flow.sample_mode = a->have_sample_every ? IOAM_SAMPLE_EVERY : IOAM_SAMPLE_INTERVAL;
	flow.sample_every = (__u32)a->sample_every;
	flow.sample_interval_ns = a->sample_interval_us * 1000ULL;
	fd = open_pinned(a->pin_dir, "ioam_tx_flows");
	if (fd < 0)
		return EXIT_FAIL;
	r = ioam_find_flow_id(fd, sizeof(flow), flow.flow_id, &other);
	if (r > 0 && memcmp(&other, &key, sizeof(key))) {
		die_msg("--flow-id: %u is already used by another flow of %s; del-flow it first", flow.flow_id,
			a->pin_dir);
		goto out;
	}
	/* a flow reinstalled restarts from 0: sampling position, counters and sequence number (from
	 * --first-seq: a monitor that moves here from another program goes on with its numbers) */
	flow.next_seq = a->first_seq;
	flow.installed_tai_ns = ioam_tai_now_ns();
	if (bpf_map_update_elem(fd, &key, &flow, BPF_ANY)) {
		die_msg("cannot install the flow in %s: %s", a->pin_dir, strerror(errno));
		goto out;
	}
	printf("flow %u installed in %s\n", flow.flow_id, a->pin_dir);
	rc = EXIT_OK;
out:
	close(fd);
	return rc;
}

int ioam_tx_del_flow(void *args, const void *prog)
{
	struct ioam_args *a = args;
	struct altmark_sidlist_key key;
	int fd, rc = EXIT_FAIL;

	if (!ioam_resolve_pin_dir(prog, a))
		return EXIT_USAGE;
	if (a->sids) {
		if (!ioam_parse_sids(a->sids, &key))
			return EXIT_USAGE;
	} else if (!a->have_flow_id) {
		die_msg("missing required --sids or --flow-id");
		return EXIT_USAGE;
	}
	fd = open_pinned(a->pin_dir, "ioam_tx_flows");
	if (fd < 0)
		return EXIT_FAIL;
	if (!a->sids && ioam_find_flow_id(fd, sizeof(struct ioam_tx_flow), (uint32_t)a->flow_id, &key) <= 0) {
		die_msg("--flow-id: no flow %llu in %s", (unsigned long long)a->flow_id, a->pin_dir);
		goto out;
	}
	if (bpf_map_delete_elem(fd, &key)) {
		die_msg("%s: no such flow in %s", a->sids ? "--sids" : "--flow-id", a->pin_dir);
		goto out;
	}
	printf("flow deleted from %s\n", a->pin_dir);
	rc = EXIT_OK;
out:
	close(fd);
	return rc;
}

static void print_prefix(const char *name, const __u8 addr[16], __u8 len)
{
	char text[INET6_ADDRSTRLEN];

	inet_ntop(AF_INET6, addr, text, sizeof(text));
	printf(", \"%s\": \"%s/%u\"", name, text, len);
}

static void print_flow(const struct altmark_sidlist_key *key, const struct ioam_tx_flow *f, bool json, bool first)
{
	const struct ioam_match *m = &f->match;

	if (!json) {
		printf("flow %u ns %u node %u trace %u sample %s %llu seen %llu sampled %llu instrumented %llu "
		       "skipped mtu %llu gso %llu other %llu next_seq %llu\n",
		       f->flow_id, f->namespace_id, f->node_id, f->trace_nodes,
		       f->sample_mode == IOAM_SAMPLE_EVERY ? "every" : "interval_us",
		       (unsigned long long)(f->sample_mode == IOAM_SAMPLE_EVERY ? f->sample_every
										: f->sample_interval_ns / 1000),
		       (unsigned long long)f->seen, (unsigned long long)f->sampled, (unsigned long long)f->instrumented,
		       (unsigned long long)f->skipped_mtu, (unsigned long long)f->skipped_gso,
		       (unsigned long long)f->skipped_other, (unsigned long long)f->next_seq);
		return;
	}
	printf("%s{\"flow_id\": %u, \"sids\": ", first ? "" : ", ", f->flow_id);
	ioam_print_sids_json(key);
	printf(", \"namespace_id\": %u, \"node_id\": %u, \"trace_nodes\": %u, ", f->namespace_id, f->node_id,
	       f->trace_nodes);
	if (f->sample_mode == IOAM_SAMPLE_EVERY)
		printf("\"sample_every\": %u", f->sample_every);
	else
		printf("\"sample_interval_us\": %llu", (unsigned long long)(f->sample_interval_ns / 1000));
	printf(", \"installed_tai_ns\": %llu, \"match\": {\"fields\": %u", (unsigned long long)f->installed_tai_ns,
	       m->fields);
	if (m->fields & IOAM_MATCH_SRC)
		print_prefix("src", m->src, m->src_len);
	if (m->fields & IOAM_MATCH_DST)
		print_prefix("dst", m->dst, m->dst_len);
	if (m->fields & IOAM_MATCH_PROTO)
		printf(", \"proto\": %u", m->proto);
	if (m->fields & IOAM_MATCH_SPORT)
		printf(", \"sport\": %u", m->sport);
	if (m->fields & IOAM_MATCH_DPORT)
		printf(", \"dport\": %u", m->dport);
	printf("}, \"seen\": %llu, \"sampled\": %llu, \"instrumented\": %llu, \"skipped_mtu\": %llu, "
	       "\"skipped_gso\": %llu, \"skipped_other\": %llu, \"next_seq\": %llu}",
	       (unsigned long long)f->seen, (unsigned long long)f->sampled, (unsigned long long)f->instrumented,
	       (unsigned long long)f->skipped_mtu, (unsigned long long)f->skipped_gso,
	       (unsigned long long)f->skipped_other, (unsigned long long)f->next_seq);
}

int ioam_tx_list_flows(void *args, const void *prog)
{
	struct ioam_args *a = args;
	struct altmark_sidlist_key key, next;
	struct ioam_tx_flow flow;
	void *prev = NULL;
	bool first = true;
	int fd;

	if (!ioam_resolve_pin_dir(prog, a))
		return EXIT_USAGE;
	fd = open_pinned(a->pin_dir, "ioam_tx_flows");
	if (fd < 0)
		return EXIT_FAIL;
	if (a->json)
		printf("{\"program\": \"%s\", \"pin_dir\": \"%s\", \"flows\": [", ((const struct ioam_prog *)prog)->name, a->pin_dir);
	while (!bpf_map_get_next_key(fd, prev, &next)) {
		key = next;
		prev = &key;
		if (bpf_map_lookup_elem(fd, &key, &flow))
			continue;   /* deleted meanwhile */
		print_flow(&key, &flow, a->json, first);
		first = false;
	}
	if (a->json)
		printf("]}\n");
	close(fd);
	return EXIT_OK;
}

int ioam_tx_set_if_id(void *args, const void *prog)
{
	struct ioam_args *a = args;
	__u32 ifindex;
	__u16 id;
	int fd, ifx, err;

	if (!ioam_resolve_pin_dir(prog, a) || !require_arg(a->dev, "--dev"))
		return EXIT_USAGE;
	if (!a->have_if_id) {
		die_msg("missing required --if-id");
		return EXIT_USAGE;
	}
	fd = open_pinned(a->pin_dir, "ioam_if_ids");   /* before entering --netns: the pins are in this one */
	if (fd < 0)
		return EXIT_FAIL;
	if (enter_netns(a->netns) || (ifx = resolve_ifindex(a->dev)) < 0) {
		close(fd);
		return EXIT_FAIL;
	}
	ifindex = (__u32)ifx;
	id = (__u16)a->if_id;
	err = bpf_map_update_elem(fd, &ifindex, &id, BPF_ANY);
	if (err)
		die_msg("update of ioam_if_ids failed: %s", strerror(errno));
	else
		printf("%s (ifindex %u) has IOAM interface id %u\n", a->dev, ifindex, id);
	close(fd);
	return err ? EXIT_FAIL : EXIT_OK;
}

int ioam_tx_set_tai_offset(void *args, const void *prog)
{
	struct ioam_args *a = args;
	int fd, err;

	if (!ioam_resolve_pin_dir(prog, a))
		return EXIT_USAGE;
	fd = open_pinned(a->pin_dir, "ioam_tx_config");
	if (fd < 0)
		return EXIT_FAIL;
	err = ioam_tx_write_config(fd, a);
	close(fd);
	return err ? EXIT_FAIL : EXIT_OK;
}

