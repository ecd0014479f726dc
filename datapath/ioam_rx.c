// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Loader of the in-line IOAM extractor ioam_rx.bpf.c: native XDP, a member
 * of the node's XDP chain with role XDP_CHAIN_IOAM_RX (the default), or with
 * `attach --hook tc` a TC ingress classifier (clsact). Pins in
 * /sys/fs/bpf/segscope/<instance>/ioam_rx/, the ring buffer as
 * `ioam_records` (the agent's streamer reads it). Commands: see usage below
 * and datapath/README.md.
 *
 * XDP: devices are joined and left through the XDP chain (xdp_chain.h,
 * datapath/README.md "Chaining"): on any device of the node, with any of the
 * other members (altmark_rx before it, the STAMP programs after it), in any
 * order of attach. TC: the pinned program is the filter at IORX_TC_HANDLE /
 * IORX_TC_PRIORITY of each device's ingress, as ioam_tx's on egress. An
 * instance is one or the other (its pinned program's type says which); the
 * commands after attach find out by themselves.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <limits.h>
#include <unistd.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include "ioam_loader.h"
#include "ioam_rx.skel.h"
#include "xdp_chain.h"

const char *loader_name = "ioam_rx";

/* the TC ingress filter's place (--hook tc); altmark_rx has no TC mode, so nothing runs before it */
#define IORX_TC_HANDLE   0xa19
#define IORX_TC_PRIORITY 0xa19

static const char usage[] =
	"usage:\n"
	"  ioam_rx attach --dev IF --instance NAME --node-id ID [--netns NS] [--pin-dir DIR]\n"
	"      [--ringbuf-size BYTES] [--tai-offset S] [--hook xdp|tc]\n"
	"      (xdp, the default: joins the XDP chain of IF, <dirname DIR>/xdp_chain; tc: a clsact ingress filter)\n"
	"  ioam_rx detach --dev IF --instance NAME [--netns NS]\n"
	"  ioam_rx attach-dev|detach-dev --dev IF --instance NAME [--netns NS]   (one more device / off one)\n"
	"  ioam_rx chain --instance NAME [--netns NS]   (the XDP chain of the instance, JSON; XDP only)\n"
	"  ioam_rx add-flow --instance NAME --sids A,B,.. --flow-id N --namespace-id NS [--alternate]\n"
	"  ioam_rx del-flow --instance NAME (--sids A,B,.. | --flow-id N)   (--flow-id: all its SID lists)\n"
	"  ioam_rx list-flows --instance NAME [--json]\n"
	"  ioam_rx stats --instance NAME [--json]\n"
	"  ioam_rx dump --instance NAME [--count N] [--timeout-ms 2000]   (JSON line per record; consumes them)\n"
	"  ioam_rx set-tai-offset --instance NAME [--tai-offset S]   (TAI-UTC; default from adjtimex)\n"
	"  ioam_rx test-run --instance NAME --hex FRAME [--repeat N]\n"
	"--sids: the policy's SIDs in travel order, <= 6; --ringbuf-size: a power of two multiple of the page\n"
	"size (default 4 MiB). add-flow --alternate: one more SID list of flow N (a path its policy can be\n"
	"steered to): its packets are recorded in flow N; list-flows shows one line per SID list.\n"
	"--hook: native XDP on a physical NIC (it runs on the DMA buffer, before any skb); tc on a veth or a\n"
	"pod's interface, where native XDP switches the device's receive to NAPI and copies every skb into an\n"
	"xdp_buff (measured on a veth lab: an empty native XDP program cost 340-590 ns a packet more than an empty\n"
	"TC ingress filter; docs/benchmarks.md). The same records and counters either way; the commands after\n"
	"attach follow the instance's hook (its pinned program), and --hook there must match it.\n"
	"Pins in " IOAM_PIN_ROOT "/NAME/ioam_rx unless --pin-dir.\n";

static int write_config(int fd, const struct ioam_args *a, uint32_t node_id)
{
	struct ioam_rx_config cfg = { .node_id = node_id };
	int32_t off;

	if (ioam_tai_offset(a, &off))
		return -1;
	cfg.tai_utc_offset_s = (__s16)off;
	return write_config_map(fd, &cfg, "ioam_rx_config");
}

/* The hook of the instance's pinned program (IOAM_HOOK_TC for a TC classifier); -1: no pins (said). */
static int pinned_hook(const char *dir)
{
	struct bpf_prog_info info = {};
	__u32 len = sizeof(info);
	int fd = open_pinned(dir, PROG_PIN_NAME), err;

	if (fd < 0)
		return -1;
	err = bpf_obj_get_info_by_fd(fd, &info, &len);
	close(fd);
	if (err) {
		die_msg("cannot read the program pinned in %s: %s", dir, strerror(errno));
		return -1;
	}
	return info.type == BPF_PROG_TYPE_SCHED_CLS ? IOAM_HOOK_TC : IOAM_HOOK_XDP;
}

static const char *hook_name(int hook) { return hook == IOAM_HOOK_TC ? "tc" : "xdp"; }

/* attach --hook tc: load the TC entry alone, pin it with the maps, the filter on IF's ingress. */
static int attach_tc(struct ioam_args *a, struct ioam_rx_bpf *skel)
{
	int err;

	err = bpf_program__set_autoload(skel->progs.ioam_rx, false) ?:
	      bpf_map__set_max_entries(skel->maps.ioam_records, (__u32)a->ringbuf_size);
	if (!err) {
		err = ioam_rx_bpf__load(skel);
		if (err)
			die_msg("cannot load BPF program (verifier log above): %s", strerror(-err));
	}
	/* the config is in place before the program sees a packet */
	if (!err)
		err = write_config(bpf_map__fd(skel->maps.ioam_rx_config), a, (uint32_t)a->node_id) ?:
		      pin_object(skel->obj, skel->progs.ioam_rx_tc, a->pin_dir) ?:
		      tc_filter_attach(a->netns, a->dev, true, bpf_program__fd(skel->progs.ioam_rx_tc), IORX_TC_HANDLE,
				       IORX_TC_PRIORITY);
	if (err)
		unpin_dir(a->pin_dir);
	return err;
}

/* attach (--hook xdp, the default): the XDP entry alone, a member of IF's XDP chain. */
static int attach_xdp(struct ioam_args *a, struct ioam_rx_bpf *skel)
{
	struct xdp_chain chain;
	char inst[PATH_MAX];
	int err;

	/* the chain is locked from here to its close: no other loader of the instance changes it meanwhile */
	err = xdp_member_instance_dir(a->pin_dir, inst, sizeof(inst)) ? xdp_chain_open(&chain, inst, true) : -EINVAL;
	if (err) {
		unpin_dir(a->pin_dir);
		return err;
	}
	err = bpf_program__set_autoload(skel->progs.ioam_rx_tc, false) ?:
	      bpf_map__set_max_entries(skel->maps.ioam_records, (__u32)a->ringbuf_size) ?:
	      xdp_chain_reuse_maps(&chain, skel->obj);
	if (!err) {
		err = ioam_rx_bpf__load(skel);
		if (err)
			die_msg("cannot load BPF program (verifier log above): %s", strerror(-err));
	}
	/* the config is in place before the program sees a packet */
	if (!err)
		err = write_config(bpf_map__fd(skel->maps.ioam_rx_config), a, (uint32_t)a->node_id);
	if (!err)
		err = xdp_member_attach(&chain, skel->obj, skel->progs.ioam_rx, a->netns, a->dev, a->pin_dir,
					XDP_CHAIN_IOAM_RX);   /* removes the pins itself on failure */
	else
		unpin_dir(a->pin_dir);
	xdp_chain_close(&chain);
	return err;
}

static int run_attach(void *args, const void *prog)
{
	struct ioam_args *a = args;
	struct ioam_rx_bpf *skel;
	bool tc = a->hook == IOAM_HOOK_TC;
	int err;

	if (!require_arg(a->dev, "--dev") || !ioam_resolve_pin_dir(prog, a))
		return EXIT_USAGE;
	if (!a->have_node_id) {
		die_msg("missing required --node-id (this egress node's IOAM node id, into every record)");
		return EXIT_USAGE;
	}
	if (prepare_pin_dir(a->netns, a->pin_dir, "ioam_rx"))
		return EXIT_FAIL;
	skel = ioam_rx_bpf__open();
	if (!skel) {
		die_msg("cannot open BPF object: %s", strerror(errno));
		unpin_dir(a->pin_dir);
		return EXIT_FAIL;
	}
	err = tc ? attach_tc(a, skel) : attach_xdp(a, skel);
	if (!err)
		printf("ioam_rx attached to %s %s%s%s (node id %llu, ring %llu bytes), pins in %s\n", a->dev,
		       tc ? "TC ingress" : "XDP", a->netns ? " in netns " : "", a->netns ? a->netns : "",
		       (unsigned long long)a->node_id, (unsigned long long)a->ringbuf_size, a->pin_dir);
	ioam_rx_bpf__destroy(skel);
	return err ? EXIT_FAIL : EXIT_OK;
}

/* detach, attach-dev, detach-dev of a TC instance: its filter on --dev's ingress (loader_util.c), as ioam_tx's on egress. */
static int tc_member(const char *cmd, struct ioam_args *a)
{
	if (!require_arg(a->dev, "--dev"))
		return EXIT_USAGE;
	if (check_netns_exists(a->netns))
		return EXIT_FAIL;
	return tc_member_subcommand("ioam_rx", cmd, a->netns, a->dev, a->pin_dir, true, IORX_TC_HANDLE,
				    IORX_TC_PRIORITY);
}

/* detach, attach-dev, detach-dev, chain: the XDP chain's member commands (loader_util.c), or the TC filter's */
static int run_member(const char *cmd, void *args, const void *prog)
{
	struct ioam_args *a = args;
	int hook;

	if (!ioam_resolve_pin_dir(prog, a))
		return EXIT_USAGE;
	hook = pinned_hook(a->pin_dir);
	if (hook < 0)
		return EXIT_FAIL;
	if (a->hook && (int)a->hook != hook) {
		die_msg("--hook %s: the instance in %s is attached with --hook %s", hook_name(a->hook), a->pin_dir,
			hook_name(hook));
		return EXIT_USAGE;
	}
	if (hook == IOAM_HOOK_XDP)
		return member_subcommand(cmd, a->netns, a->dev, a->pin_dir, XDP_CHAIN_IOAM_RX);
	if (!strcmp(cmd, "chain")) {
		die_msg("chain: the instance in %s runs on TC ingress, in no XDP chain", a->pin_dir);
		return EXIT_USAGE;
	}
	return tc_member(cmd, a);
}

static int run_detach(void *a, const void *prog) { return run_member("detach", a, prog); }
static int run_attach_dev(void *a, const void *prog) { return run_member("attach-dev", a, prog); }
static int run_detach_dev(void *a, const void *prog) { return run_member("detach-dev", a, prog); }
static int run_chain(void *a, const void *prog) { return run_member("chain", a, prog); }

/*
 * Whether flow.flow_id may key `key`: a flow id names one flow, on one SID list, unless --alternate:
 * then `key` is one more SID list of that flow (a path a steer can move its policy to; the ingress
 * keeps its sequence numbers, so the records of every path make one series), in its namespace.
 */
static bool flow_id_free(int fd, const struct ioam_args *a, const struct altmark_sidlist_key *key,
			 const struct ioam_rx_flow *flow)
{
	struct altmark_sidlist_key other;
	struct ioam_rx_flow first;

	if (ioam_find_flow_id(fd, sizeof(*flow), flow->flow_id, &other) <= 0) {
		if (a->alternate)
			die_msg("--alternate: no flow %u in %s to add a SID list to; add-flow it without --alternate "
				"first", flow->flow_id, a->pin_dir);
		return !a->alternate;
	}
	if (!memcmp(&other, key, sizeof(*key)))
		return true;   /* this SID list of the flow again */
	if (!a->alternate) {
		die_msg("--flow-id: %u is already used by another flow of %s; del-flow it first, or give --alternate "
			"to add this SID list to it", flow->flow_id, a->pin_dir);
		return false;
	}
	if (bpf_map_lookup_elem(fd, &other, &first) || first.namespace_id != flow->namespace_id) {
		die_msg("--namespace-id: flow %u has namespace %u; its SID lists share it", flow->flow_id,
			first.namespace_id);
		return false;
	}
	return true;
}

static int run_add_flow(void *args, const void *prog)
{
	struct ioam_args *a = args;
	struct altmark_sidlist_key key;
	struct ioam_rx_flow flow = {};
	int fd, rc = EXIT_FAIL;

	if (!ioam_resolve_pin_dir(prog, a))
		return EXIT_USAGE;
	if (!require_arg(a->sids, "--sids") || !ioam_parse_sids(a->sids, &key))
		return EXIT_USAGE;
	if (!a->have_flow_id || !a->have_namespace_id) {
		die_msg("missing required %s", !a->have_flow_id ? "--flow-id" : "--namespace-id");
		return EXIT_USAGE;
	}
	flow.flow_id = (__u32)a->flow_id;
	flow.namespace_id = (__u16)a->namespace_id;
	fd = open_pinned(a->pin_dir, "ioam_rx_flows");
	if (fd < 0)
		return EXIT_FAIL;
	if (!flow_id_free(fd, a, &key, &flow))
		goto out;
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

/* del-flow --flow-id: every SID list of the flow (its own and its --alternate ones); closes fd. */
static int del_flow_id(int fd, const struct ioam_args *a)
{
	struct altmark_sidlist_key key;
	unsigned int deleted = 0;

	while (ioam_find_flow_id(fd, sizeof(struct ioam_rx_flow), (uint32_t)a->flow_id, &key) > 0 &&
	       !bpf_map_delete_elem(fd, &key))
		deleted++;
	close(fd);
	if (!deleted) {
		die_msg("--flow-id: no flow %llu in %s", (unsigned long long)a->flow_id, a->pin_dir);
		return EXIT_FAIL;
	}
	printf("flow deleted from %s (%u SID lists)\n", a->pin_dir, deleted);
	return EXIT_OK;
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
	fd = open_pinned(a->pin_dir, "ioam_rx_flows");
	if (fd < 0)
		return EXIT_FAIL;
	if (!a->sids)
		return del_flow_id(fd, a);
	if (bpf_map_delete_elem(fd, &key)) {
		die_msg("--sids: no such flow in %s", a->pin_dir);
		goto out;
	}
	printf("flow deleted from %s\n", a->pin_dir);
	rc = EXIT_OK;
out:
	close(fd);
	return rc;
}

static int run_list_flows(void *args, const void *prog)
{
	struct ioam_args *a = args;
	struct altmark_sidlist_key key, next;
	struct ioam_rx_flow f;
	void *prev = NULL;
	bool first = true;
	int fd;

	if (!ioam_resolve_pin_dir(prog, a))
		return EXIT_USAGE;
	fd = open_pinned(a->pin_dir, "ioam_rx_flows");
	if (fd < 0)
		return EXIT_FAIL;
	if (a->json)
		printf("{\"program\": \"ioam_rx\", \"pin_dir\": \"%s\", \"flows\": [", a->pin_dir);
	while (!bpf_map_get_next_key(fd, prev, &next)) {
		key = next;
		prev = &key;
		if (bpf_map_lookup_elem(fd, &key, &f))
			continue;
		if (!a->json) {
			printf("flow %u ns %u records %llu ringbuf_full %llu\n", f.flow_id, f.namespace_id,
			       (unsigned long long)f.records, (unsigned long long)f.ringbuf_full);
			continue;
		}
		printf("%s{\"flow_id\": %u, \"sids\": ", first ? "" : ", ", f.flow_id);
		ioam_print_sids_json(&key);
		printf(", \"namespace_id\": %u, \"installed_tai_ns\": %llu, \"records\": %llu, \"ringbuf_full\": %llu}",
		       f.namespace_id, (unsigned long long)f.installed_tai_ns, (unsigned long long)f.records,
		       (unsigned long long)f.ringbuf_full);
		first = false;
	}
	if (a->json)
		printf("]}\n");
	close(fd);
	return EXIT_OK;
}

static int run_set_tai_offset(void *args, const void *prog)
{
	struct ioam_args *a = args;
	struct ioam_rx_config cfg;
	uint32_t zero = 0;
	int fd, err;

	if (!ioam_resolve_pin_dir(prog, a))
		return EXIT_USAGE;
	fd = open_pinned(a->pin_dir, "ioam_rx_config");
	if (fd < 0)
		return EXIT_FAIL;
	err = bpf_map_lookup_elem(fd, &zero, &cfg);
	if (err)
		die_msg("lookup of ioam_rx_config failed: %s", strerror(errno));
	else
		err = write_config(fd, a, cfg.node_id);
	close(fd);
	return err ? EXIT_FAIL : EXIT_OK;
}

struct dump_state {
	uint64_t seen, wanted;
};

/* One record as a JSON line: every field, the copied entries (wire order, newest first) host order. */
static int print_record(void *ctx, void *data, size_t size)
{
	struct dump_state *st = ctx;
	const struct ioam_record *r = data;
	unsigned int n;

	if (size < sizeof(*r))
		return 0;
	n = r->filled < IOAM_RECORD_MAX_NODES ? r->filled : IOAM_RECORD_MAX_NODES;
	printf("{\"rx_tai_ns\": %llu, \"tx_tai_ns\": %llu, \"seq\": %llu, \"flow_id\": %u, \"ifindex\": %u, "
	       "\"node_id\": %u, \"namespace_id\": %u, \"slots\": %u, \"filled\": %u, \"trace_type\": %u, "
	       "\"trace_flags\": %u, \"hop_limit\": %u, \"tai_utc_offset_s\": %d, \"flags\": %u, \"entries\": [",
	       (unsigned long long)r->rx_tai_ns, (unsigned long long)r->tx_tai_ns, (unsigned long long)r->seq,
	       r->flow_id, r->ifindex, r->node_id, r->namespace_id, r->slots, r->filled, r->trace_type,
	       r->trace_flags, r->hop_limit, r->tai_utc_offset_s, r->flags);
	for (unsigned int i = 0; i < n; i++) {
		const struct ioam_node_entry *e = &r->entries[i];
		__u32 hn = ntohl(e->hop_limit_node_id);

		printf("%s{\"hop_limit\": %u, \"node_id\": %u, \"ingress_if_id\": %u, \"egress_if_id\": %u, "
		       "\"ts_sec\": %u, \"ts_subsec\": %u}", i ? ", " : "", hn >> 24, hn & IOAM_NODE_ID_MAX,
		       ntohs(e->ingress_if_id), ntohs(e->egress_if_id), ntohl(e->ts_sec), ntohl(e->ts_subsec));
	}
	printf("]}\n");
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

static int run_dump(void *args, const void *prog)
{
	struct ioam_args *a = args;
	struct dump_state st = { .wanted = a->count };
	struct ring_buffer *rb;
	uint64_t deadline;
	int fd, err = 0;

	if (!ioam_resolve_pin_dir(prog, a))
		return EXIT_USAGE;
	fd = open_pinned(a->pin_dir, "ioam_records");
	if (fd < 0)
		return EXIT_FAIL;
	rb = ring_buffer__new(fd, print_record, &st, NULL);
	if (!rb) {
		die_msg("ring_buffer__new on %s/ioam_records failed: %s", a->pin_dir, strerror(errno));
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
		die_msg("only %llu of --count %llu records within --timeout-ms %llu", (unsigned long long)st.seen,
			(unsigned long long)st.wanted, (unsigned long long)a->timeout_ms);
		return EXIT_FAIL;
	}
	return EXIT_OK;
}

static const struct loader_cmd commands[] = {
	{"attach", run_attach},
	{"detach", run_detach},
	{"attach-dev", run_attach_dev},
	{"detach-dev", run_detach_dev},
	{"chain", run_chain},
	{"add-flow", run_add_flow},
	{"del-flow", run_del_flow},
	{"list-flows", run_list_flows},
	{"stats", ioam_run_stats},
	{"dump", run_dump},
	{"set-tai-offset", run_set_tai_offset},
	{"test-run", ioam_run_test_run},
	{NULL, NULL},
};

int main(int argc, char **argv)
{
	static const struct ioam_prog prog = {
		.name = "ioam_rx",
		.commands = commands,
		.usage = usage,
		.counter_names = ioam_rx_counter_names,
		.n_counters = IORX_NR_COUNTERS,
		.stats_map = "ioam_rx_stats",
		.is_tc = false,
	};

	return ioam_main(&prog, argc, argv);
}
