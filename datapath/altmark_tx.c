// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Loader of the alternate-marking colourer altmark_tx.bpf.c (TC egress,
 * clsact, attached with libbpf's bpf_tc_hook_create/bpf_tc_attach: libbpf
 * 1.1 has no tcx). Flows, stats and the command line: altmark_loader.c.
 *
 *   altmark_tx attach --dev IF --instance NAME [--netns NS] [--pin-dir DIR]
 *   altmark_tx add-flow --instance NAME --sids A,B --flow-id N --method dscp|rfc9343 --period-ms P ...
 *   altmark_tx detach --dev IF --instance NAME [--netns NS]
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include "altmark.h"
#include "altmark_loader.h"
#include "altmark_tx.skel.h"
#include "loader_util.h"

const char *loader_name = "altmark_tx";

/* Our filter's place in the clsact egress chain: fixed, so detach finds it again. */
#define ALTMARK_TC_HANDLE   0xa17
#define ALTMARK_TC_PRIORITY 0xa17

static int attach_tc(const char *netns, const char *dev, int prog_fd)
{
	return tc_egress_attach(netns, dev, prog_fd, ALTMARK_TC_HANDLE, ALTMARK_TC_PRIORITY);
}

static int cmd_attach(struct altmark_args *a)
{
	struct altmark_tx_bpf *skel;
	int err;

	if (prepare_pin_dir(a->netns, a->pin_dir, "altmark_tx"))
		return EXIT_FAIL;
	skel = altmark_tx_bpf__open_and_load();
	if (!skel) {
		die_msg("cannot load BPF program (verifier log above): %s", strerror(errno));
		unpin_dir(a->pin_dir);
		return EXIT_FAIL;
	}
	err = pin_object(skel->obj, skel->progs.altmark_tx, a->pin_dir);
	if (!err)
		err = attach_tc(a->netns, a->dev, bpf_program__fd(skel->progs.altmark_tx));
	if (err)
		unpin_dir(a->pin_dir);
	else
		printf("altmark_tx attached to %s egress%s%s, pins in %s\n", a->dev,
		       a->netns ? " in netns " : "", a->netns ? a->netns : "", a->pin_dir);
	altmark_tx_bpf__destroy(skel);
	return err ? EXIT_FAIL : EXIT_OK;
}

/* Detach our pinned program from dev's egress if it is the filter there (loader_util.h). */
static int tc_detach_if_ours(struct altmark_args *a, uint32_t *our_id)
{
	return tc_egress_detach_if_ours(a->netns, a->dev, a->pin_dir, ALTMARK_TC_HANDLE, ALTMARK_TC_PRIORITY, our_id);
}

static int cmd_detach(struct altmark_args *a)
{
	uint32_t our_id = 0;
	int r = tc_detach_if_ours(a, &our_id), rc = 0;

	if (r == -ENODEV || (r < 0 && !our_id))   /* no such device, or no pins (said) */
		return EXIT_FAIL;
	if (r < 0)
		rc = r;
	else if (r == 0)
		die_msg("warning: program %u pinned in %s is not attached to %s egress; removing pins only",
			our_id, a->pin_dir, a->dev);
	/* the clsact qdisc stays: other filters (or tc users) may share it */
	if (unpin_dir(a->pin_dir))
		rc = rc ? rc : -EIO;
	return rc ? EXIT_FAIL : EXIT_OK;
}

static int cmd_attach_dev(struct altmark_args *a)
{
	int prog_fd = open_pinned(a->pin_dir, PROG_PIN_NAME), err;

	if (prog_fd < 0)
		return prog_fd;
	err = attach_tc(a->netns, a->dev, prog_fd);
	close(prog_fd);
	if (!err)
		printf("altmark_tx (pinned in %s) also attached to %s egress\n", a->pin_dir, a->dev);
	return err;
}

static int cmd_detach_dev(struct altmark_args *a)
{
	uint32_t our_id = 0;
	int r = tc_detach_if_ours(a, &our_id);

	if (r == 0)
		die_msg("--dev: program %u pinned in %s is not attached to %s egress", our_id, a->pin_dir, a->dev);
	return r == 1 ? 0 : r == 0 || r == -ENODEV ? -ENOENT : r;
}

int main(int argc, char **argv)
{
	static const struct altmark_prog prog = {
		.name = "altmark_tx",
		.is_rx = false,
		.attach = cmd_attach,
		.detach = cmd_detach,
		.attach_dev = cmd_attach_dev,
		.detach_dev = cmd_detach_dev,
		.counter_names = altmark_tx_counter_names,
		.n_counters = AMTX_NR_COUNTERS,
	};

	return altmark_main(&prog, argc, argv);
}
