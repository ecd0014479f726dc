/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Command-line helpers shared by the collectors' C programs. A bad argument
 * is refused with a message naming the flag and what it expects, then the
 * program's usage, and exit code 2 — the same contract for every tool.
 * Each program sets cli_prog and cli_usage before parsing.
 */
#ifndef SEGSCOPE_COLLECTORS_CLI_H
#define SEGSCOPE_COLLECTORS_CLI_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

static const char *cli_prog = "segscope";
static void (*cli_usage)(FILE *f);

static void die_arg(const char *flag, const char *why, const char *value)
{
	fprintf(stderr, "%s: %s: %s%s%s\n", cli_prog, flag, why, value ? ": " : "", value ? value : "");
	if (cli_usage)
		cli_usage(stderr);
	exit(2);
}

static long long parse_int(const char *flag, const char *s, long long lo, long long hi)
{
	char *end;
	long long v;

	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi) {
		char why[96];

		snprintf(why, sizeof(why), "expected an integer in %lld..%lld", lo, hi);
		die_arg(flag, why, s);
	}
	return v;
}

#endif /* SEGSCOPE_COLLECTORS_CLI_H */
