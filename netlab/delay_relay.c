// SPDX-License-Identifier: MIT
/*
 * delay_relay — transparent L2 relay between two interfaces that delays every
 * frame by a fixed, per-direction amount.
 *
 * netlab splices it into a link:  A(a0) <-> [ra  relay  rb] <-> R(r0).
 * Frames are forwarded byte for byte (the MACs stay those of a0 and r0), so
 * the endpoints keep their static neighbour entries for each other.
 *
 * Design (why it is built this way):
 *  - AF_PACKET raw sockets bound to each side, PACKET_IGNORE_OUTGOING so the
 *    relay never sees its own transmissions, promiscuous so frames for the far
 *    MAC are accepted, PACKET_QDISC_BYPASS so transmit skips the qdisc layer.
 *  - Arrival time = kernel receive timestamp (SO_TIMESTAMPNS, CLOCK_REALTIME);
 *    a frame is released at arrival + delay, scheduled on CLOCK_REALTIME too.
 *    (A clock step would shift queued frames; nothing here steps the clock.)
 *  - One thread, one ppoll() whose timeout is the earliest release time; the
 *    timer slack is set to 1 ns so the kernel does not batch our wake-ups.
 *    A short optional spin (--spin-ns) trades CPU for wake-up jitter.
 *  - --keep-awake: one SCHED_IDLE spinning thread per CPU. On VMs whose idle
 *    vCPUs halt (HLT, no cpuidle polling), the host takes milliseconds to wake
 *    a halted vCPU for our timer: measured here, an idle 2-vCPU VM released
 *    frames 8 ms late on average (max 100 ms); with the spinners 0.2 us (max
 *    11 us). SCHED_IDLE threads run only when nothing else wants the CPU and
 *    are preempted on every wake-up, so they cost the other programs nothing.
 *  - A bounded FIFO per direction; a full queue drops and counts the frame.
 *  - Optional loss per direction (--a-to-b-loss / --b-to-a-loss percent, or
 *    "loss <a_to_b_pct> <b_to_a_pct>" on the control socket): a frame is dropped
 *    when a xorshift64* draw falls under the threshold (1e-6 resolution), before
 *    it is queued. Drops are counted in total and per IPv6 Traffic Class of the
 *    outer header (alternate marking colours DSCP bits: a test reads the drops
 *    per colour from that). In the relay, loss hits every frame of the link,
 *    also those a node's XDP program sends (nftables on the node cannot see them).
 *  - Counters per direction, plus the measured release lateness (actual send
 *    time - due time), printed as JSON on SIGUSR1 and on exit and written to
 *    the stats file. A unix SOCK_SEQPACKET control socket takes
 *    "delay <a_to_b_us> <b_to_a_us>" and "stats".
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <math.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define SLOT_BYTES 2048          /* veth MTU 1500 + L2 header; larger frames are counted */
#define DEFAULT_QUEUE_FRAMES 4096
#define RX_BURST 64              /* frames read per direction per wake-up (fairness) */
#define NSEC_PER_SEC 1000000000LL
#define RELAY_CLOCK CLOCK_REALTIME   /* same clock as SO_TIMESTAMPNS, see arrival_ns() */

struct frame {
	int64_t due_ns;          /* release time, RELAY_CLOCK */
	uint32_t len;
	uint8_t data[SLOT_BYTES];
};

struct fifo {
	struct frame *slots;
	uint32_t capacity, head, count;
};

struct direction_stats {
	uint64_t received, forwarded, dropped_queue_full, dropped_oversize, send_errors;
	uint64_t dropped_socket;  /* kernel drops before we read (rcvbuf full): PACKET_STATISTICS */
	uint64_t max_queue_depth;
	uint64_t dropped_loss;             /* injected loss (--*-loss, "loss ..." on the control socket) */
	uint64_t dropped_loss_by_tc[256];  /* the same, by the outer IPv6 Traffic Class (0: not IPv6) */
	/* lateness = actual send time - due time, ns; tells how exact the relay is */
	uint64_t late_count;
	double late_sum_ns, late_sumsq_ns;
	int64_t late_max_ns;
	uint64_t late_hist[8];   /* <1us <5us <10us <20us <50us <100us <1ms >=1ms */
};

struct direction {
	const char *name;        /* "a_to_b" or "b_to_a" */
	int rx_fd, tx_fd;
	int64_t delay_ns;
	uint64_t loss_threshold;   /* drop when draw % 1000000 < this (0: no loss) */
	struct fifo queue;
	struct direction_stats stats;
};

static volatile sig_atomic_t stop_requested, dump_requested;
static struct direction dirs[2];
static const char *stats_path;
static int64_t spin_ns;
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng_next(void)   /* xorshift64*: fast, good enough for a loss draw */
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545f4914f6cdd1dull;
}

static uint64_t loss_threshold(double pct)
{
	return (uint64_t)llround(pct * 10000.0);   /* percent -> parts per million */
}

/* The outer IPv6 Traffic Class of an Ethernet frame, 0 for anything else. */
static uint8_t traffic_class(const uint8_t *frame, uint32_t len)
{
	if (len < 16 || frame[12] != 0x86 || frame[13] != 0xdd)
		return 0;
	return (uint8_t)(((frame[14] & 0x0f) << 4) | (frame[15] >> 4));
}

static int64_t now_ns(clockid_t clock)
{
	struct timespec ts;
	clock_gettime(clock, &ts);
	return (int64_t)ts.tv_sec * NSEC_PER_SEC + ts.tv_nsec;
}

static void on_signal(int sig)
{
	if (sig == SIGUSR1)
		dump_requested = 1;
	else
		stop_requested = 1;
}

static int open_packet_socket(const char *ifname)
{
	int ifindex = if_nametoindex(ifname);
	if (!ifindex) {
		fprintf(stderr, "delay_relay: no interface %s: %s\n", ifname, strerror(errno));
		return -1;
	}
	int fd = socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, htons(ETH_P_ALL));
	if (fd < 0) {
		perror("delay_relay: socket(AF_PACKET)");
		return -1;
	}
	int one = 1;
	struct sockaddr_ll addr = {
		.sll_family = AF_PACKET,
		.sll_protocol = htons(ETH_P_ALL),
		.sll_ifindex = ifindex,
	};
	struct packet_mreq promisc = { .mr_ifindex = ifindex, .mr_type = PACKET_MR_PROMISC };
	int rcvbuf = 4 << 20;
	if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 ||
	    setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof(one)) < 0 ||
	    setsockopt(fd, SOL_PACKET, PACKET_ADD_MEMBERSHIP, &promisc, sizeof(promisc)) < 0 ||
	    setsockopt(fd, SOL_PACKET, PACKET_QDISC_BYPASS, &one, sizeof(one)) < 0 ||
	    setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof(one)) < 0 ||
	    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf)) < 0) {
		fprintf(stderr, "delay_relay: setting up %s: %s\n", ifname, strerror(errno));
		close(fd);
		return -1;
	}
	return fd;
}

/*
 * Kernel rx timestamp of the message. The whole relay schedules on CLOCK_REALTIME,
 * the clock SO_TIMESTAMPNS uses: converting to RELAY_CLOCK would need two clock
 * reads whose gap (a vCPU preempted between them) made frames leave a few us early.
 */
static int64_t arrival_ns(struct msghdr *msg)
{
	int64_t now = now_ns(RELAY_CLOCK);
	for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
			struct timespec ts;
			memcpy(&ts, CMSG_DATA(c), sizeof(ts));
			int64_t rx = (int64_t)ts.tv_sec * NSEC_PER_SEC + ts.tv_nsec;
			if (rx <= now && now - rx < NSEC_PER_SEC)   /* ignore a clock step */
				return rx;
		}
	}
	return now;
}

static void receive_burst(struct direction *d)
{
	static uint8_t discard[65536];
	char control[CMSG_SPACE(sizeof(struct timespec)) * 2];

	for (int i = 0; i < RX_BURST; i++) {
		struct fifo *q = &d->queue;
		bool full = q->count == q->capacity;
		struct frame *slot = full ? NULL : &q->slots[(q->head + q->count) % q->capacity];
		struct iovec iov = {
			.iov_base = full ? discard : slot->data,
			.iov_len = full ? sizeof(discard) : SLOT_BYTES,
		};
		struct msghdr msg = {
			.msg_iov = &iov, .msg_iovlen = 1,
			.msg_control = control, .msg_controllen = sizeof(control),
		};
		ssize_t n = recvmsg(d->rx_fd, &msg, MSG_TRUNC);
		if (n < 0)
			return;          /* EAGAIN: nothing more for now */
		d->stats.received++;
		if (full) {
			d->stats.dropped_queue_full++;
			continue;
		}
		if (n > SLOT_BYTES) {
			d->stats.dropped_oversize++;
			continue;
		}
		if (d->loss_threshold && rng_next() % 1000000 < d->loss_threshold) {
			d->stats.dropped_loss++;
			d->stats.dropped_loss_by_tc[traffic_class(slot->data, (uint32_t)n)]++;
			continue;
		}
		slot->len = (uint32_t)n;
		slot->due_ns = arrival_ns(&msg) + d->delay_ns;
		q->count++;
		if (q->count > d->stats.max_queue_depth)
			d->stats.max_queue_depth = q->count;
	}
}

static void record_lateness(struct direction_stats *s, int64_t late)
{
	static const int64_t bounds[] = { 1000, 5000, 10000, 20000, 50000, 100000, 1000000 };
	int bucket = 7;
	for (int i = 0; i < 7; i++) {
		if (late < bounds[i]) {
			bucket = i;
			break;
		}
	}
	s->late_hist[bucket]++;
	s->late_count++;
	s->late_sum_ns += (double)late;
	s->late_sumsq_ns += (double)late * (double)late;
	if (late > s->late_max_ns)
		s->late_max_ns = late;
}

/* Send every frame whose release time has come. */
static void release_due(struct direction *d)
{
	struct fifo *q = &d->queue;
	while (q->count) {
		struct frame *f = &q->slots[q->head];
		int64_t now = now_ns(RELAY_CLOCK);
		if (f->due_ns > now) {
			if (f->due_ns - now > spin_ns)
				return;
			while (now_ns(RELAY_CLOCK) < f->due_ns)
				;        /* short spin: the ppoll wake-up came early on purpose */
			now = now_ns(RELAY_CLOCK);
		}
		if (send(d->tx_fd, f->data, f->len, 0) == (ssize_t)f->len)
			d->stats.forwarded++;
		else
			d->stats.send_errors++;
		record_lateness(&d->stats, now - f->due_ns);
		q->head = (q->head + 1) % q->capacity;
		q->count--;
	}
}

static int64_t next_due_ns(void)
{
	int64_t next = INT64_MAX;
	for (int i = 0; i < 2; i++) {
		struct fifo *q = &dirs[i].queue;
		if (q->count && q->slots[q->head].due_ns < next)
			next = q->slots[q->head].due_ns;
	}
	return next;
}

/* PACKET_STATISTICS resets on every read, so accumulate. */
static void collect_socket_drops(void)
{
	for (int i = 0; i < 2; i++) {
		struct tpacket_stats st;
		socklen_t len = sizeof(st);
		if (getsockopt(dirs[i].rx_fd, SOL_PACKET, PACKET_STATISTICS, &st, &len) == 0)
			dirs[i].stats.dropped_socket += st.tp_drops;
	}
}

static int format_stats(char *buf, size_t size)
{
	collect_socket_drops();
	int n = snprintf(buf, size, "{\"pid\": %d", (int)getpid());
	for (int i = 0; i < 2 && n < (int)size; i++) {
		struct direction *d = &dirs[i];
		struct direction_stats *s = &d->stats;
		double mean = s->late_count ? s->late_sum_ns / s->late_count : 0;
		double var = s->late_count ? s->late_sumsq_ns / s->late_count - mean * mean : 0;
		n += snprintf(buf + n, size - n,
			", \"%s\": {\"delay_us\": %.3f, \"received\": %llu, \"forwarded\": %llu, "
			"\"dropped_queue_full\": %llu, \"dropped_oversize\": %llu, \"dropped_socket\": %llu, "
			"\"send_errors\": %llu, \"loss_pct\": %.4f, \"dropped_loss\": %llu, "
			"\"queued\": %u, \"max_queue_depth\": %llu, \"queue_capacity\": %u, "
			"\"lateness_ns\": {\"count\": %llu, \"mean\": %.0f, \"stddev\": %.0f, \"max\": %lld, "
			"\"hist_lt\": {\"1us\": %llu, \"5us\": %llu, \"10us\": %llu, \"20us\": %llu, "
			"\"50us\": %llu, \"100us\": %llu, \"1ms\": %llu, \"inf\": %llu}}}",
			d->name, d->delay_ns / 1000.0,
			(unsigned long long)s->received, (unsigned long long)s->forwarded,
			(unsigned long long)s->dropped_queue_full, (unsigned long long)s->dropped_oversize,
			(unsigned long long)s->dropped_socket,
			(unsigned long long)s->send_errors, d->loss_threshold / 10000.0,
			(unsigned long long)s->dropped_loss, d->queue.count,
			(unsigned long long)s->max_queue_depth, d->queue.capacity,
			(unsigned long long)s->late_count, mean, var > 0 ? sqrt(var) : 0,
			(long long)s->late_max_ns,
			(unsigned long long)s->late_hist[0], (unsigned long long)s->late_hist[1],
			(unsigned long long)s->late_hist[2], (unsigned long long)s->late_hist[3],
			(unsigned long long)s->late_hist[4], (unsigned long long)s->late_hist[5],
			(unsigned long long)s->late_hist[6], (unsigned long long)s->late_hist[7]);
		/* "dropped_loss_by_tc": {"<tc>": n, ...} (non-zero only), inside this direction's object */
		if (n > 0 && n < (int)size)
			n--;   /* reopen the direction's object: drop its closing brace */
		n += snprintf(buf + n, size - n, ", \"dropped_loss_by_tc\": {");
		for (int tc = 0, first = 1; tc < 256 && n < (int)size; tc++) {
			if (!s->dropped_loss_by_tc[tc])
				continue;
			n += snprintf(buf + n, size - n, "%s\"%d\": %llu", first ? "" : ", ", tc,
				      (unsigned long long)s->dropped_loss_by_tc[tc]);
			first = 0;
		}
		if (n < (int)size)
			n += snprintf(buf + n, size - n, "}}");
	}
	if (n < (int)size)
		n += snprintf(buf + n, size - n, "}\n");
	return n;
}

/* Write the stats file atomically (tmp + rename) so readers never see half a file. */
static void dump_stats(bool to_stdout)
{
	char buf[8192];
	format_stats(buf, sizeof(buf));
	if (to_stdout) {
		fputs(buf, stdout);
		fflush(stdout);
	}
	if (!stats_path)
		return;
	char tmp[4352];
	snprintf(tmp, sizeof(tmp), "%s.tmp", stats_path);
	FILE *f = fopen(tmp, "w");
	if (!f)
		return;
	fputs(buf, f);
	fclose(f);
	rename(tmp, stats_path);
}

static int open_control_socket(const char *path)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof(addr.sun_path)) {
		fprintf(stderr, "delay_relay: control socket path too long: %s\n", path);
		return -1;
	}
	strcpy(addr.sun_path, path);
	unlink(path);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 || listen(fd, 4) < 0) {
		fprintf(stderr, "delay_relay: control socket %s: %s\n", path, strerror(errno));
		return -1;
	}
	return fd;
}

/* One request per connection: "delay <a_to_b_us> <b_to_a_us>" or "stats". */
static void serve_control(int listen_fd)
{
	int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
	if (fd < 0)
		return;
	struct timeval tv = { .tv_sec = 1 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	char req[256] = { 0 }, reply[8192];
	ssize_t n = recv(fd, req, sizeof(req) - 1, 0);
	double a_to_b_us, b_to_a_us;
	if (n > 0 && sscanf(req, "delay %lf %lf", &a_to_b_us, &b_to_a_us) == 2 &&
	    a_to_b_us >= 0 && b_to_a_us >= 0 && a_to_b_us < 1e7 && b_to_a_us < 1e7) {
		dirs[0].delay_ns = (int64_t)llround(a_to_b_us * 1000.0);
		dirs[1].delay_ns = (int64_t)llround(b_to_a_us * 1000.0);
		format_stats(reply, sizeof(reply));
	} else if (n > 0 && sscanf(req, "loss %lf %lf", &a_to_b_us, &b_to_a_us) == 2 &&
		   a_to_b_us >= 0 && b_to_a_us >= 0 && a_to_b_us <= 100 && b_to_a_us <= 100) {
		dirs[0].loss_threshold = loss_threshold(a_to_b_us);   /* here: percent */
		dirs[1].loss_threshold = loss_threshold(b_to_a_us);
		format_stats(reply, sizeof(reply));
	} else if (n > 0 && strncmp(req, "stats", 5) == 0) {
		format_stats(reply, sizeof(reply));
	} else {
		snprintf(reply, sizeof(reply),
			 "{\"error\": \"expected 'delay <a_to_b_us> <b_to_a_us>' (0..1e7), "
			 "'loss <a_to_b_pct> <b_to_a_pct>' (0..100) or 'stats'\"}\n");
	}
	send(fd, reply, strlen(reply), MSG_NOSIGNAL);
	close(fd);
}

/* --keep-awake: stop flag for the spinner threads, written once at exit. */
static volatile int awake_stop;

static void *keep_cpu_awake(void *arg)
{
	long cpu = (long)arg;
	cpu_set_t set;
	struct sched_param sp = { .sched_priority = 0 };

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
	pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp);
	while (!awake_stop)
		__builtin_ia32_pause();   /* spin: the vCPU never executes HLT while we run */
	return NULL;
}

/* One SCHED_IDLE spinner per online CPU; returns how many started. */
static int start_keep_awake(pthread_t *threads, int max)
{
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	int started = 0;
	sigset_t all, old;

	sigfillset(&all);                 /* signals stay with the main thread */
	pthread_sigmask(SIG_BLOCK, &all, &old);
	for (long cpu = 0; cpu < ncpu && started < max; cpu++)
		if (pthread_create(&threads[started], NULL, keep_cpu_awake, (void *)cpu) == 0)
			started++;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return started;
}

static void usage(void)
{
	fprintf(stderr,
		"usage: delay_relay --if-a IF --if-b IF [--a-to-b-us N] [--b-to-a-us N]\n"
		"                   [--queue FRAMES] [--control PATH] [--stats PATH] [--spin-ns N] [--rt-prio N]\n"
		"                   [--keep-awake] [--a-to-b-loss PCT] [--b-to-a-loss PCT] [--seed N]\n");
}

int main(int argc, char **argv)
{
	const char *if_a = NULL, *if_b = NULL, *control_path = NULL;
	double a_to_b_us = 0, b_to_a_us = 0, a_to_b_loss = 0, b_to_a_loss = 0;
	long queue_frames = DEFAULT_QUEUE_FRAMES;
	int rt_prio = 0, keep_awake = 0;
	static const struct option opts[] = {
		{ "if-a", required_argument, NULL, 'a' },
		{ "if-b", required_argument, NULL, 'b' },
		{ "a-to-b-us", required_argument, NULL, 'x' },
		{ "b-to-a-us", required_argument, NULL, 'y' },
		{ "queue", required_argument, NULL, 'q' },
		{ "control", required_argument, NULL, 'c' },
		{ "stats", required_argument, NULL, 's' },
		{ "spin-ns", required_argument, NULL, 'p' },
		{ "rt-prio", required_argument, NULL, 'r' },
		{ "keep-awake", no_argument, NULL, 'k' },
		{ "a-to-b-loss", required_argument, NULL, 'L' },
		{ "b-to-a-loss", required_argument, NULL, 'M' },
		{ "seed", required_argument, NULL, 'S' },
		{ 0 },
	};
	for (int opt; (opt = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
		switch (opt) {
		case 'a': if_a = optarg; break;
		case 'b': if_b = optarg; break;
		case 'x': a_to_b_us = atof(optarg); break;
		case 'y': b_to_a_us = atof(optarg); break;
		case 'q': queue_frames = atol(optarg); break;
		case 'c': control_path = optarg; break;
		case 's': stats_path = optarg; break;
		case 'p': spin_ns = atoll(optarg); break;
		case 'r': rt_prio = atoi(optarg); break;
		case 'k': keep_awake = 1; break;
		case 'L': a_to_b_loss = atof(optarg); break;
		case 'M': b_to_a_loss = atof(optarg); break;
		case 'S': rng_state = strtoull(optarg, NULL, 0) | 1; break;
		default: usage(); return 2;
		}
	}
	if (!if_a || !if_b || queue_frames < 1 || queue_frames > 1 << 20 ||
	    a_to_b_us < 0 || b_to_a_us < 0 || spin_ns < 0 || a_to_b_loss < 0 || a_to_b_loss > 100 ||
	    b_to_a_loss < 0 || b_to_a_loss > 100) {
		usage();
		return 2;
	}

	prctl(PR_SET_TIMERSLACK, 1UL);  /* hrtimer wake-ups exactly when asked */
	if (rt_prio > 0) {
		/* SCHED_FIFO: on a busy 2-core box the wake-up is not queued behind others.
		 * Safe: the loop always sleeps in ppoll between releases. */
		struct sched_param sp = { .sched_priority = rt_prio };
		if (sched_setscheduler(0, SCHED_FIFO, &sp) < 0)
			fprintf(stderr, "delay_relay: SCHED_FIFO %d: %s (continuing)\n", rt_prio, strerror(errno));
	}

	pthread_t awake_threads[256];
	int n_awake = keep_awake ? start_keep_awake(awake_threads, 256) : 0;

	dirs[0] = (struct direction){ .name = "a_to_b", .delay_ns = llround(a_to_b_us * 1000),
				      .loss_threshold = loss_threshold(a_to_b_loss) };
	dirs[1] = (struct direction){ .name = "b_to_a", .delay_ns = llround(b_to_a_us * 1000),
				      .loss_threshold = loss_threshold(b_to_a_loss) };
	if (rng_state == 0x9e3779b97f4a7c15ull)
		rng_state ^= (uint64_t)now_ns(CLOCK_MONOTONIC) ^ ((uint64_t)getpid() << 32);
	int fd_a = open_packet_socket(if_a), fd_b = open_packet_socket(if_b);
	if (fd_a < 0 || fd_b < 0)
		return 1;
	dirs[0].rx_fd = fd_a, dirs[0].tx_fd = fd_b;
	dirs[1].rx_fd = fd_b, dirs[1].tx_fd = fd_a;
	for (int i = 0; i < 2; i++) {
		dirs[i].queue.capacity = (uint32_t)queue_frames;
		dirs[i].queue.slots = calloc(queue_frames, sizeof(struct frame));
		if (!dirs[i].queue.slots) {
			perror("delay_relay: queue");
			return 1;
		}
	}
	int control_fd = -1;
	if (control_path && (control_fd = open_control_socket(control_path)) < 0)
		return 1;

	/* Signals are blocked except inside ppoll, so a flag can never be missed. */
	sigset_t blocked, during_poll;
	sigemptyset(&blocked);
	sigaddset(&blocked, SIGUSR1);
	sigaddset(&blocked, SIGTERM);
	sigaddset(&blocked, SIGINT);
	sigprocmask(SIG_BLOCK, &blocked, &during_poll);
	struct sigaction sa = { .sa_handler = on_signal };
	sigaction(SIGUSR1, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);

	dump_stats(false);
	fprintf(stderr, "delay_relay: ready %s<->%s a_to_b=%.1fus b_to_a=%.1fus queue=%ld\n",
		if_a, if_b, a_to_b_us, b_to_a_us, queue_frames);

	struct pollfd pfds[3] = {
		{ .fd = fd_a, .events = POLLIN },
		{ .fd = fd_b, .events = POLLIN },
		{ .fd = control_fd, .events = POLLIN },
	};
	while (!stop_requested) {
		int64_t next = next_due_ns();
		struct timespec timeout, *timeout_p = NULL;
		if (next != INT64_MAX) {
			int64_t wait = next - now_ns(RELAY_CLOCK) - spin_ns;
			if (wait < 0)
				wait = 0;
			timeout.tv_sec = wait / NSEC_PER_SEC;
			timeout.tv_nsec = wait % NSEC_PER_SEC;
			timeout_p = &timeout;
		}
		int ready = ppoll(pfds, control_fd >= 0 ? 3 : 2, timeout_p, &during_poll);
		if (ready < 0 && errno != EINTR) {
			perror("delay_relay: ppoll");
			break;
		}
		if (ready > 0) {
			if (pfds[0].revents & POLLIN)
				receive_burst(&dirs[0]);
			if (pfds[1].revents & POLLIN)
				receive_burst(&dirs[1]);
			if (control_fd >= 0 && (pfds[2].revents & POLLIN))
				serve_control(control_fd);
		}
		release_due(&dirs[0]);
		release_due(&dirs[1]);
		if (dump_requested) {
			dump_requested = 0;
			dump_stats(true);
		}
	}
	dump_stats(true);
	if (control_path)
		unlink(control_path);
	awake_stop = 1;
	for (int i = 0; i < n_awake; i++)
		pthread_join(awake_threads[i], NULL);
	return 0;
}
