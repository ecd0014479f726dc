/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The tether between a data-path process and the node's agent (--agent-dir DIR --adopt-timeout S).
 *
 * A data-path process the agent starts (stamp_sender, stamp_streamer, altmark_collector) outlives
 * the agent: an agent that is killed, restarted or upgraded leaves the measurement running, and the
 * next agent of the node adopts the process (agent/keeper.py: by pid and start time, from the
 * agent's state in DIR). A process that no agent adopts within S seconds stops itself, as on
 * SIGTERM (drain, flush, summary), and says so.
 *
 * Whether an agent runs: every agent of the node holds an exclusive flock(2) on DIR/agent.lock for
 * as long as it runs; the kernel lets go of it when the agent dies, SIGKILL included. About once
 * a second the process asks for a shared lock on the same file without waiting: refused means an
 * agent runs (a fresh one counts too: nothing ties the process to the agent that started it);
 * granted means none runs (the lock is let go at once). So there is no parent pid to watch and
 * nothing to renew.
 *
 * Saying so: one line on stderr, and one JSON line appended to DIR/orphans.jsonl
 * {"program","pid","what","unadopted_s","realtime_ns"}, which the next agent of the node reads
 * and counts (orphans_stopped in segscope_agent, schemas/metrics.md).
 */
#ifndef SEGSCOPE_COLLECTORS_TETHER_H
#define SEGSCOPE_COLLECTORS_TETHER_H

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

#define TETHER_TIMEOUT_MAX_S 86400

struct tether {
	const char *dir;        /* --agent-dir; NULL: not tethered (started by hand) */
	double timeout_s;       /* --adopt-timeout */
	int fd;                 /* DIR/agent.lock, read-only */
	double alone_since;     /* monotonic seconds since when no agent runs; 0: an agent runs */
	double next_check;      /* monotonic seconds of the next look */
	bool orphaned;          /* stopped itself: no agent adopted it in time */
	const char *prog;
	char what[96];          /* what this process does, e.g. "ssid 5" (in the report) */
};

static double tether_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void tether_init(struct tether *t, const char *prog)
{
	memset(t, 0, sizeof(*t));
	t->fd = -1;
	t->prog = prog;
}

/* For the programs' option parsers: --agent-dir and --adopt-timeout. */
static void tether_set_dir(struct tether *t, const char *dir)
{
	if (!*dir)
		die_arg("--agent-dir", "empty directory", NULL);
	t->dir = dir;
}

static void tether_set_timeout(struct tether *t, const char *s)
{
	char *end;

	errno = 0;
	t->timeout_s = strtod(s, &end);
	if (errno || end == s || *end || !(t->timeout_s >= 0.1) || t->timeout_s > TETHER_TIMEOUT_MAX_S)
		die_arg("--adopt-timeout", "expected seconds in 0.1..86400", s);
}

/* After parsing: both flags or neither; opens DIR/agent.lock (the agent made it first). */
static void tether_open(struct tether *t, const char *what)
{
	char path[PATH_MAX];

	snprintf(t->what, sizeof(t->what), "%s", what ? what : "");
	if (!t->dir && t->timeout_s == 0)
		return;
	if (!t->dir)
		die_arg("--adopt-timeout", "needs --agent-dir (where the agent's lock is)", NULL);
	if (t->timeout_s == 0)
		die_arg("--agent-dir", "needs --adopt-timeout (how long to wait for an agent)", NULL);
	snprintf(path, sizeof(path), "%s/agent.lock", t->dir);
	t->fd = open(path, O_RDONLY | O_CLOEXEC);
	if (t->fd < 0) {
		char why[PATH_MAX + 64];

		snprintf(why, sizeof(why), "cannot open %s: %s", path, strerror(errno));
		die_arg("--agent-dir", why, NULL);
	}
	t->next_check = tether_now();
}

/* Does an agent run now? */
static bool tether_agent_runs(struct tether *t)
{
	if (flock(t->fd, LOCK_SH | LOCK_NB) == 0) {
		flock(t->fd, LOCK_UN);
		return false;
	}
	return errno == EWOULDBLOCK || errno == EINTR;   /* EINTR: ask again at the next look */
}

static void tether_report(struct tether *t, double alone_s)
{
	char path[PATH_MAX], line[512];
	struct timespec rt;
	int fd, n;

	clock_gettime(CLOCK_REALTIME, &rt);
	fprintf(stderr, "%s: %s%sno agent adopted this process within %.0f s (none has run for %.1f s); "
		"stopping\n", t->prog, t->what, *t->what ? ": " : "", t->timeout_s, alone_s);
	snprintf(path, sizeof(path), "%s/orphans.jsonl", t->dir);
	n = snprintf(line, sizeof(line),
		     "{\"program\":\"%s\",\"pid\":%d,\"what\":\"%s\",\"unadopted_s\":%.3f,\"realtime_ns\":%llu}\n",
		     t->prog, (int)getpid(), t->what, alone_s,
		     (unsigned long long)rt.tv_sec * 1000000000ULL + (unsigned long long)rt.tv_nsec);
	fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0 || write(fd, line, n) != n)   /* one write: lines of several processes never mix */
		fprintf(stderr, "%s: cannot record the stop in %s: %s\n", t->prog, path, strerror(errno));
	if (fd >= 0)
		close(fd);
}

/* Call often (cheap: one comparison until a look is due, about once a second). True once this
 * process has been without an agent for timeout_s: it has said so; the caller stops as on SIGTERM. */
static bool tether_orphaned(struct tether *t, double now)
{
	double every;

	if (t->fd < 0 || t->orphaned || now < t->next_check)
		return t->orphaned;
	every = t->timeout_s / 4 < 1.0 ? t->timeout_s / 4 : 1.0;
	t->next_check = now + every;
	if (tether_agent_runs(t)) {
		t->alone_since = 0;
		return false;
	}
	if (t->alone_since == 0)
		t->alone_since = now;
	if (now - t->alone_since >= t->timeout_s) {
		t->orphaned = true;
		tether_report(t, now - t->alone_since);
	}
	return t->orphaned;
}

#endif /* SEGSCOPE_COLLECTORS_TETHER_H */
