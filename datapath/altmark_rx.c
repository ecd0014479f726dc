// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Loader of the alternate-marking counter altmark_rx.bpf.c (XDP, native,
 * always XDP_PASS). Flows, stats and the command line: altmark_loader.c.
 *
 *   altmark_rx attach --dev IF --instance NAME [--netns NS] [--pin-dir DIR] [--chain]
 *   altmark_rx add-flow --instance NAME --sids A,B --flow-id N --method dscp --period-ms P
 *   altmark_rx add-flow --instance NAME --flowmon-id N --method rfc9343 --period-ms P
 *   altmark_rx detach --dev IF --instance NAME [--netns NS]
 *
 * Chaining (one native XDP program per device): a STAMP reflector/collector
 * of the same instance runs behind altmark_rx through the prog array
 * altmark_rx_next (`stamp_reflector attach ... --behind altmark_rx`). Either
 * order works: attach --chain finds the instance's STAMP program already on
 * the device, puts it into the slot and swaps itself in atomically (without
 * --chain it refuses, as it always did); detach with a
 * program in the slot hands the device back to it atomically. No packet
 * misses the STAMP program in either swap (by construction).
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

const char *loader_name = "altmark_rx";

static const char *const chainable[] = { "stamp_reflector", "stamp_collector" };

/*
 * The STAMP program of this instance that dev runs now, if any: its name and
 * an fd of it (1), none (0), error (<0). Another program on dev is left to
 * the attach, which refuses it as before.
 */
static int stamp_on_dev(const struct altmark_args *a, const char **name, int *fd)
{
	const char *slash = strrchr(a->pin_dir, '/');
	char path[PATH_MAX];
	uint32_t attached;

	if (xdp_attached_id(a->netns, a->dev, &attached))
		return -1;
	for (unsigned int i = 0; slash && attached && i < sizeof(chainable) / sizeof(chainable[0]); i++) {
		/* the instance's other programs are our pin dir's siblings: <instance>/<program> */
		snprintf(path, sizeof(path), "%.*s/%s", (int)(slash - a->pin_dir), a->pin_dir, chainable[i]);
		if (pinned_prog_id(path) != attached)
			continue;
		*fd = open_pinned(path, PROG_PIN_NAME);
		*name = chainable[i];
		return *fd < 0 ? -1 : 1;
	}
	return 0;
}

/* dev runs the instance's STAMP program: slot it behind us, then swap us in for it. */
static int take_over(struct altmark_rx_bpf *skel, const struct altmark_args *a, const char *name, int stamp_fd)
{
	uint32_t zero = 0;
	int err = pin_object(skel->obj, skel->progs.altmark_rx, a->pin_dir);

	if (!err && bpf_map_update_elem(bpf_map__fd(skel->maps.altmark_rx_next), &zero, &stamp_fd, BPF_ANY)) {
		err = -errno;
		die_msg("cannot put %s into altmark_rx_next: %s", name, strerror(errno));
	}
	if (!err)
		err = xdp_replace(a->netns, a->dev, bpf_program__fd(skel->progs.altmark_rx), stamp_fd);
	if (err)
		unpin_dir(a->pin_dir);
	else
		printf("%s (already on %s) now runs behind altmark_rx\n", name, a->dev);
	return err;
}

static int cmd_attach(struct altmark_args *a)
{
	struct altmark_rx_bpf *skel;
	const char *stamp_name = NULL;
	int err, stamp_fd = -1, found;

	if (prepare_pin_dir(a->netns, a->pin_dir, "altmark_rx"))
		return EXIT_FAIL;
	found = stamp_on_dev(a, &stamp_name, &stamp_fd);
	if (found > 0 && !a->chain) {
		/* as before: the device's program is not replaced unless asked */
		die_msg("--dev: %s already runs %s of instance %s; add --chain to put it behind altmark_rx "
			"(atomic swap), or detach it first", a->dev, stamp_name, a->instance ? a->instance : a->pin_dir);
		close(stamp_fd);
		found = -1;
	}
	if (found < 0) {
		unpin_dir(a->pin_dir);
		return EXIT_FAIL;
	}
	skel = altmark_rx_bpf__open_and_load();
	if (!skel) {
		die_msg("cannot load BPF program (verifier log above): %s", strerror(errno));
		unpin_dir(a->pin_dir);
		if (stamp_fd >= 0)
			close(stamp_fd);
		return EXIT_FAIL;
	}
	if (found)
		err = take_over(skel, a, stamp_name, stamp_fd);
	else
		err = pin_and_attach(skel->obj, skel->progs.altmark_rx, a->netns, a->dev, a->pin_dir);
	if (!err)
		printf("altmark_rx attached to %s (XDP native)%s%s, pins in %s\n", a->dev,
		       a->netns ? " in netns " : "", a->netns ? a->netns : "", a->pin_dir);
	if (stamp_fd >= 0)
		close(stamp_fd);
	altmark_rx_bpf__destroy(skel);
	return err ? EXIT_FAIL : EXIT_OK;
}

/*
 * A program in our slot gets the device back (atomic swap) before our pins
 * go: removing the pins empties the prog array, which would stop it.
 */
static int hand_back(struct altmark_args *a, uint32_t next_id)
{
	uint32_t attached;
	int our_fd, next_fd, err;

	our_fd = open_pinned(a->pin_dir, PROG_PIN_NAME);
	if (our_fd < 0)
		return -1;
	next_fd = bpf_prog_get_fd_by_id(next_id);
	if (next_fd < 0) {
		die_msg("cannot open program %u of altmark_rx_next: %s", next_id, strerror(errno));
		close(our_fd);
		return -1;
	}
	err = xdp_attached_id(a->netns, a->dev, &attached);
	if (!err && attached == pinned_prog_id(a->pin_dir)) {
		err = xdp_replace(a->netns, a->dev, next_fd, our_fd);
		if (!err)
			printf("program %u (chained behind altmark_rx) now attached to %s directly\n", next_id, a->dev);
	} else if (!err) {
		die_msg("--dev: altmark_rx of %s is not the XDP program of %s (attached: %u); not detached",
			a->pin_dir, a->dev, attached);
		err = -EINVAL;
	}
	close(next_fd);
	close(our_fd);
	if (!err && unpin_dir(a->pin_dir))
		err = -EIO;
	return err;
}

static int cmd_detach(struct altmark_args *a)
{
	int64_t next_id = chain_next_id(a->pin_dir);

	if (next_id > 0)
		return hand_back(a, (uint32_t)next_id) ? EXIT_FAIL : EXIT_OK;
	return detach_and_unpin(a->netns, a->dev, a->pin_dir) ? EXIT_FAIL : EXIT_OK;
}

/* attach-dev / detach-dev: the same XDP program (flows, counters, chain slot) on more devices */
static int cmd_attach_dev(struct altmark_args *a) { return attach_dev_pinned(a->netns, a->dev, a->pin_dir); }
static int cmd_detach_dev(struct altmark_args *a) { return detach_dev_pinned(a->netns, a->dev, a->pin_dir); }

int main(int argc, char **argv)
{
	static const struct altmark_prog prog = {
		.name = "altmark_rx",
		.is_rx = true,
		.attach = cmd_attach,
		.detach = cmd_detach,
		.attach_dev = cmd_attach_dev,
		.detach_dev = cmd_detach_dev,
		.counter_names = altmark_rx_counter_names,
		.n_counters = AMRX_NR_COUNTERS,
	};

	return altmark_main(&prog, argc, argv);
}
