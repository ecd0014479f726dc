// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Loader of the alternate-marking counter altmark_rx.bpf.c (XDP, native,
 * always passes the packet on). Flows, stats and the command line:
 * altmark_loader.c.
 *
 *   altmark_rx attach --dev IF --instance NAME [--netns NS] [--pin-dir DIR]
 *   altmark_rx add-flow --instance NAME --sids A,B --flow-id N --method dscp --period-ms P
 *   altmark_rx add-flow --instance NAME --flowmon-id N --method rfc9343 --period-ms P
 *   altmark_rx detach --dev IF --instance NAME [--netns NS]
 *   altmark_rx chain --instance NAME [--netns NS]
 *
 * The program runs in the XDP chain of the instance (xdp_chain.h,
 * <instance>/xdp_chain), first of the roles: the in-line IOAM extractor and
 * the STAMP collector and reflector of the instance run after it on the same
 * device, attached before or after it.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include "altmark.h"
#include "altmark_loader.h"
#include "altmark_rx.skel.h"
#include "loader_util.h"
#include "xdp_chain.h"

const char *loader_name = "altmark_rx";

static int cmd_attach(struct altmark_args *a)
{
	struct altmark_rx_bpf *skel;
	struct xdp_chain chain;
	char inst[PATH_MAX];
	int err;

	if (prepare_pin_dir(a->netns, a->pin_dir, "altmark_rx"))
		return EXIT_FAIL;
	skel = altmark_rx_bpf__open();
	if (!skel) {
		die_msg("cannot open BPF object: %s", strerror(errno));
		unpin_dir(a->pin_dir);
		return EXIT_FAIL;
	}
	/* the chain is locked from here to its close: no other loader of the instance changes it meanwhile */
	err = xdp_member_instance_dir(a->pin_dir, inst, sizeof(inst)) ? xdp_chain_open(&chain, inst, true) : -EINVAL;
	if (err) {
		unpin_dir(a->pin_dir);
		altmark_rx_bpf__destroy(skel);
		return EXIT_FAIL;
	}
	err = xdp_chain_reuse_maps(&chain, skel->obj);
	if (!err) {
		err = altmark_rx_bpf__load(skel);
		if (err)
			die_msg("cannot load BPF program (verifier log above): %s", strerror(-err));
	}
	if (!err)
		err = xdp_member_attach(&chain, skel->obj, skel->progs.altmark_rx, a->netns, a->dev, a->pin_dir,
					XDP_CHAIN_ALTMARK_RX);
	else
		unpin_dir(a->pin_dir);
	xdp_chain_close(&chain);
	if (!err)
		printf("altmark_rx attached to %s (XDP native)%s%s, pins in %s\n", a->dev,
		       a->netns ? " in netns " : "", a->netns ? a->netns : "", a->pin_dir);
	altmark_rx_bpf__destroy(skel);
	return err ? EXIT_FAIL : EXIT_OK;
}

/* detach, attach-dev, detach-dev, chain: the XDP chain's member commands (loader_util.c) */
static int cmd_detach(struct altmark_args *a)
{
	return member_subcommand("detach", a->netns, a->dev, a->pin_dir, XDP_CHAIN_ALTMARK_RX);
}

static int cmd_attach_dev(struct altmark_args *a)
{
	return member_subcommand("attach-dev", a->netns, a->dev, a->pin_dir, XDP_CHAIN_ALTMARK_RX) ? -1 : 0;
}

static int cmd_detach_dev(struct altmark_args *a)
{
	return member_subcommand("detach-dev", a->netns, a->dev, a->pin_dir, XDP_CHAIN_ALTMARK_RX) ? -1 : 0;
}

static int cmd_chain(struct altmark_args *a)
{
	return member_subcommand("chain", a->netns, a->dev, a->pin_dir, XDP_CHAIN_ALTMARK_RX);
}

int main(int argc, char **argv)
{
	static const struct altmark_prog prog = {
		.name = "altmark_rx",
		.is_rx = true,
		.attach = cmd_attach,
		.detach = cmd_detach,
		.attach_dev = cmd_attach_dev,
		.detach_dev = cmd_detach_dev,
		.chain = cmd_chain,
		.counter_names = altmark_rx_counter_names,
		.n_counters = AMRX_NR_COUNTERS,
	};

	return altmark_main(&prog, argc, argv);
}
