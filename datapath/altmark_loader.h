/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Command line and map handling shared by the two alternate-marking loaders
 * (altmark_tx.c: TC colourer, altmark_rx.c: XDP counter). Each loader only
 * brings its skeleton and its attach/detach; flows, slots, counters, stats
 * and the JSON outputs are the same code.
 */
#ifndef SEGSCOPE_ALTMARK_LOADER_H
#define SEGSCOPE_ALTMARK_LOADER_H

#include <stdbool.h>
#include <stdint.h>
#include "altmark.h"
#include "segscope_names.h"   /* schemas/names.toml */

#define ALTMARK_PIN_ROOT SEGSCOPE_BPFFS_PIN_ROOT

struct altmark_args {
	const char *netns, *dev, *instance, *pin_dir, *sids, *method;
	char pin_dir_buf[512];
	uint64_t flow_id, flowmon_id, period_ms, dmark_every, l_bit, d_bit;
	bool have_flow_id, have_flowmon_id, have_period, have_l_bit, have_d_bit, json;
};

struct altmark_prog {
	const char *name;            /* "altmark_tx" / "altmark_rx": pin subdirectory, messages */
	bool is_rx;                  /* has altmark_flowmon; rfc9343 flows keyed by FlowMonID */
	int (*attach)(struct altmark_args *a);
	int (*detach)(struct altmark_args *a);
	/* the attached program (same pins, flows, counters) on one more device / off one device */
	int (*attach_dev)(struct altmark_args *a);
	int (*detach_dev)(struct altmark_args *a);
	/* rx: print the instance's XDP chain (JSON); NULL for tx (TC, not in the chain). Exit code. */
	int (*chain)(struct altmark_args *a);
	const char *const *counter_names;
	unsigned int n_counters;
};

/* Parse argv (after the command word), run the command; returns the exit code. */
int altmark_main(const struct altmark_prog *prog, int argc, char **argv);

#endif /* SEGSCOPE_ALTMARK_LOADER_H */
