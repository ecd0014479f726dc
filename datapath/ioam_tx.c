// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Loader of the in-line IOAM insertion ioam_tx.bpf.c (TC egress, clsact,
 * handle/priority 0xa18: after altmark_tx at 0xa17, which must see the packet
 * before the Hop-by-Hop header is in front of its SRH). Pins in
 * /sys/fs/bpf/segscope/<instance>/ioam_tx/. Commands: see usage below and
 * datapath/README.md.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include "ioam_loader.h"
#include "ioam_tx.skel.h"

const char *loader_name = "ioam_tx";

#define IOAM_TC_HANDLE   0xa18
#define IOAM_TC_PRIORITY 0xa18   /* altmark_tx is 0xa17: it runs first */

static const char usage[] =
	"usage:\n"
	"  ioam_tx attach|detach --dev IF --instance NAME [--netns NS] [--pin-dir DIR] [--tai-offset S]\n"
	"  ioam_tx attach-dev|detach-dev --dev IF --instance NAME [--netns NS]   (one more device / off one)\n"
	"  ioam_tx add-flow --instance NAME --sids A,B,.. --flow-id N --namespace-id NS --node-id ID\n"
	"      --trace-nodes K (--sample-every N | --sample-interval-us M)\n"
	"      [--match-src PFX/LEN] [--match-dst PFX/LEN] [--match-proto N] [--match-sport N] [--match-dport N]\n"
	"  ioam_tx del-flow --instance NAME (--sids A,B,.. | --flow-id N)\n"
	"  ioam_tx list-flows --instance NAME [--json]\n"
	"  ioam_tx stats --instance NAME [--json]\n"
	"  ioam_tx set-if-id --instance NAME [--netns NS] --dev IF --if-id N\n"
	"  ioam_tx set-tai-offset --instance NAME [--tai-offset S]   (TAI-UTC; default from adjtimex)\n"
	"  ioam_tx test-run --instance NAME --hex FRAME [--repeat N]\n"
	"--sids: the policy's SIDs in travel order (as in `ip route ... encap seg6 segs A,B`), <= 6;\n"
	"--trace-nodes: trace slots, this node's included (1..12); --sample-every 1..65535: packet k of the\n"
	"flow is instrumented iff k % N == 0; --sample-interval-us: one packet per M us at most.\n"
	"Pins in " IOAM_PIN_ROOT "/NAME/ioam_tx unless --pin-dir.\n";

static int write_config(int fd, const struct ioam_args *a)
{
	struct ioam_tx_config cfg = {};

	if (ioam_tai_offset(a, &cfg.tai_utc_offset_s))
		return -1;
	return write_config_map(fd, &cfg, "ioam_tx_config");
}

static int run_attach(void *args, const void *prog)
{
	struct ioam_args *a = args;
	struct ioam_tx_bpf *skel;
	int err;

	if (!require_arg(a->dev, "--dev") || !ioam_resolve_pin_dir(prog, a))
		return EXIT_USAGE;
	if (prepare_pin_dir(a->netns, a->pin_dir, "ioam_tx"))
		return EXIT_FAIL;
	skel = ioam_tx_bpf__open_and_load();
	if (!skel) {
		die_msg("cannot load BPF program (verifier log above): %s", strerror(errno));
		unpin_dir(a->pin_dir);
		return EXIT_FAIL;
	}
	/* the config is in place before the program sees a packet */
	err = write_config(bpf_map__fd(skel->maps.ioam_tx_config), a);
	if (!err)
		err = pin_object(skel->obj, skel->progs.ioam_tx, a->pin_dir);
	if (!err)
		err = tc_egress_attach(a->netns, a->dev, bpf_program__fd(skel->progs.ioam_tx), IOAM_TC_HANDLE,
				       IOAM_TC_PRIORITY);
	if (err)
		unpin_dir(a->pin_dir);
	else
		printf("ioam_tx attached to %s egress%s%s, pins in %s\n", a->dev, a->netns ? " in netns " : "",
		       a->netns ? a->netns : "", a->pin_dir);
	ioam_tx_bpf__destroy(skel);
	return err ? EXIT_FAIL : EXIT_OK;
}

static int run_detach(void *args, const void *prog)
{
	struct ioam_args *a = args;
	uint32_t our_id = 0;
	int r, rc = 0;

	if (!require_arg(a->dev, "--dev") || !ioam_resolve_pin_dir(prog, a))
		return EXIT_USAGE;
	r = tc_egress_detach_if_ours(a->netns, a->dev, a->pin_dir, IOAM_TC_HANDLE, IOAM_TC_PRIORITY, &our_id);
	if (r == -ENODEV || (r < 0 && !our_id))   /* no such device, or no pins (said) */
		return EXIT_FAIL;
	if (r < 0)
		rc = r;
	else if (r == 0)
		die_msg("warning: program %u pinned in %s is not attached to %s egress; removing pins only", our_id,
			a->pin_dir, a->dev);
	if (unpin_dir(a->pin_dir))
		rc = rc ? rc : -EIO;
	return rc ? EXIT_FAIL : EXIT_OK;
}

static int run_dev(struct ioam_args *a, const void *prog, bool attach)
{
	uint32_t our_id = 0;
	int prog_fd, r;

	if (!require_arg(a->dev, "--dev") || !ioam_resolve_pin_dir(prog, a))
		return EXIT_USAGE;
	if (attach) {
		prog_fd = open_pinned(a->pin_dir, PROG_PIN_NAME);
		if (prog_fd < 0)
			return EXIT_FAIL;
		r = tc_egress_attach(a->netns, a->dev, prog_fd, IOAM_TC_HANDLE, IOAM_TC_PRIORITY);
		close(prog_fd);
		if (!r)
			printf("ioam_tx (pinned in %s) also attached to %s egress\n", a->pin_dir, a->dev);
		return r ? EXIT_FAIL : EXIT_OK;
	}
	r = tc_egress_detach_if_ours(a->netns, a->dev, a->pin_dir, IOAM_TC_HANDLE, IOAM_TC_PRIORITY, &our_id);
	if (r == 0)
		die_msg("--dev: program %u pinned in %s is not attached to %s egress", our_id, a->pin_dir, a->dev);
	return r == 1 ? EXIT_OK : EXIT_FAIL;
}

static int run_attach_dev(void *a, const void *p) { return run_dev(a, p, true); }
static int run_detach_dev(void *a, const void *p) { return run_dev(a, p, false); }

/* "PFX/LEN" -> masked prefix and mask; false after a message naming the flag. */
static bool parse_prefix(const char *flag, const char *text, __u8 addr[16], __u8 mask[16], __u8 *len_out)
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
		if (!parse_prefix("--match-src", a->match_src, m->src, m->src_mask, &m->src_len))
			return false;
		m->fields |= IOAM_MATCH_SRC;
	}
	if (a->match_dst) {
		if (!parse_prefix("--match-dst", a->match_dst, m->dst, m->dst_mask, &m->dst_len))
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

static int run_add_flow(void *args, const void *prog)
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
	/* a flow reinstalled restarts from 0: sampling position, counters and sequence number */
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

static int run_del_flow(void *args, const void *prog)
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

static int run_list_flows(void *args, const void *prog)
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
		printf("{\"program\": \"ioam_tx\", \"pin_dir\": \"%s\", \"flows\": [", a->pin_dir);
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

static int run_set_if_id(void *args, const void *prog)
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

static int run_set_tai_offset(void *args, const void *prog)
{
	struct ioam_args *a = args;
	int fd, err;

	if (!ioam_resolve_pin_dir(prog, a))
		return EXIT_USAGE;
	fd = open_pinned(a->pin_dir, "ioam_tx_config");
	if (fd < 0)
		return EXIT_FAIL;
	err = write_config(fd, a);
	close(fd);
	return err ? EXIT_FAIL : EXIT_OK;
}

static const struct loader_cmd commands[] = {
	{"attach", run_attach},
	{"detach", run_detach},
	{"attach-dev", run_attach_dev},
	{"detach-dev", run_detach_dev},
	{"add-flow", run_add_flow},
	{"del-flow", run_del_flow},
	{"list-flows", run_list_flows},
	{"stats", ioam_run_stats},
	{"set-if-id", run_set_if_id},
	{"set-tai-offset", run_set_tai_offset},
	{"test-run", ioam_run_test_run},
	{NULL, NULL},
};

int main(int argc, char **argv)
{
	static const struct ioam_prog prog = {
		.name = "ioam_tx",
		.commands = commands,
		.usage = usage,
		.counter_names = ioam_tx_counter_names,
		.n_counters = IOTX_NR_COUNTERS,
		.stats_map = "ioam_tx_stats",
		.is_tc = true,
	};

	return ioam_main(&prog, argc, argv);
}
