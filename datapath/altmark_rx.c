// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Loader of the alternate-marking counter altmark_rx.bpf.c (XDP, native,
 * always XDP_PASS). Flows, stats and the command line: altmark_loader.c.
 *
 *   altmark_rx attach --dev IF --instance NAME [--netns NS] [--pin-dir DIR]
 *   altmark_rx add-flow --instance NAME --sids A,B --flow-id N --method dscp --period-ms P
 *   altmark_rx add-flow --instance NAME --flowmon-id N --method rfc9343 --period-ms P
 *   altmark_rx detach --dev IF --instance NAME [--netns NS]
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <bpf/libbpf.h>
#include "altmark.h"
#include "altmark_loader.h"
#include "altmark_rx.skel.h"
#include "loader_util.h"

const char *loader_name = "altmark_rx";

static int cmd_attach(struct altmark_args *a)
{
	struct altmark_rx_bpf *skel;
	int err;

	if (prepare_pin_dir(a->netns, a->pin_dir, "altmark_rx"))
		return EXIT_FAIL;
	skel = altmark_rx_bpf__open_and_load();
	if (!skel) {
		die_msg("cannot load BPF program (verifier log above): %s", strerror(errno));
		unpin_dir(a->pin_dir);
		return EXIT_FAIL;
	}
	err = pin_and_attach(skel->obj, skel->progs.altmark_rx, a->netns, a->dev, a->pin_dir);
	if (!err)
		printf("altmark_rx attached to %s (XDP native)%s%s, pins in %s\n", a->dev,
		       a->netns ? " in netns " : "", a->netns ? a->netns : "", a->pin_dir);
	altmark_rx_bpf__destroy(skel);
	return err ? EXIT_FAIL : EXIT_OK;
}

static int cmd_detach(struct altmark_args *a)
{
	return detach_and_unpin(a->netns, a->dev, a->pin_dir) ? EXIT_FAIL : EXIT_OK;
}

int main(int argc, char **argv)
{
	static const struct altmark_prog prog = {
		.name = "altmark_rx",
		.is_rx = true,
		.attach = cmd_attach,
		.detach = cmd_detach,
		.counter_names = altmark_rx_counter_names,
		.n_counters = AMRX_NR_COUNTERS,
	};

	return altmark_main(&prog, argc, argv);
}
