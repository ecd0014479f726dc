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
#include "ioam_tx_flows.h"

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
	"      [--first-seq S]   (the first E2E sequence number, default 0)\n"
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
	err = ioam_tx_write_config(bpf_map__fd(skel->maps.ioam_tx_config), a);
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

/* detach, attach-dev, detach-dev: the TC egress filter's member commands (loader_util.c) */
static int run_member(const char *cmd, void *args, const void *prog)
{
	struct ioam_args *a = args;

	if (!require_arg(a->dev, "--dev") || !ioam_resolve_pin_dir(prog, a))
		return EXIT_USAGE;
	return tc_member_subcommand("ioam_tx", cmd, a->netns, a->dev, a->pin_dir, false, IOAM_TC_HANDLE,
				    IOAM_TC_PRIORITY);
}

static int run_detach(void *a, const void *p) { return run_member("detach", a, p); }
static int run_attach_dev(void *a, const void *p) { return run_member("attach-dev", a, p); }
static int run_detach_dev(void *a, const void *p) { return run_member("detach-dev", a, p); }

static const struct loader_cmd commands[] = {
	{"attach", run_attach},
	{"detach", run_detach},
	{"attach-dev", run_attach_dev},
	{"detach-dev", run_detach_dev},
	{"add-flow", ioam_tx_add_flow},
	{"del-flow", ioam_tx_del_flow},
	{"list-flows", ioam_tx_list_flows},
	{"stats", ioam_run_stats},
	{"set-if-id", ioam_tx_set_if_id},
	{"set-tai-offset", ioam_tx_set_tai_offset},
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
