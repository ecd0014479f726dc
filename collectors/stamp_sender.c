// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * stamp_sender: STAMP Session-Sender (RFC 8762 §4.2.1, unauthenticated, with
 * the RFC 8972 SSID) over an SRv6 path.
 *
 * A plain UDP socket; the SRv6 segment list is a sticky IPV6_RTHDR option
 * holding a type-4 SRH, so the kernel builds the SRH for every packet.
 * T1 is CLOCK_TAI read immediately before sendto(), written as PTPv2
 * truncated (Z=1). Packets are paced on CLOCK_MONOTONIC absolute deadlines
 * (start + i * interval) so the long-run rate is exact even when a single
 * sleep overshoots. At the end one JSON summary line goes to stdout.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/timex.h>
#include <time.h>
#include <unistd.h>

#include "stamp_test_packet.h"
#include "cli.h"

#define MAX_SEGS 16
#define SRH_TYPE_SEGMENT_ROUTING 4

/* Type-4 SRH as the kernel expects it in IPV6_RTHDR (RFC 8754 §2). */
struct srh {
	uint8_t  nexthdr;        /* filled by the kernel */
	uint8_t  hdrlen;         /* 8-octet units, not counting the first 8 */
	uint8_t  type;           /* 4 */
	uint8_t  segments_left;
	uint8_t  last_entry;     /* "first_segment" in linux/seg6.h */
	uint8_t  flags;
	uint16_t tag;
	struct in6_addr segments[MAX_SEGS + 1];
};

struct sender_opts {
	const char *netns;
	struct in6_addr src, dst;
	struct in6_addr segs[MAX_SEGS];   /* in visiting order */
	int nsegs;
	int sport;                        /* -1: 50000 + ssid */
	int dport;
	long ssid;
	double rate_pps;
	long long count;                  /* -1: unlimited */
	double duration_s;                /* <0: unlimited */
	long padding;
};

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig)
{
	(void)sig;
	stop_requested = 1;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: stamp_sender [--netns NS] --src ADDR --dst ADDR [--segs SID1,SID2,...]\n"
		"                    [--sport P] [--dport 862] --ssid N --rate PPS\n"
		"                    [--count N] [--duration SEC] [--padding BYTES]\n"
		"At least one of --count/--duration. Prints one JSON summary line on exit.\n");
}

static double parse_positive(const char *flag, const char *s)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !(v > 0) || v > 1e9)
		die_arg(flag, "expected a positive number", s);
	return v;
}

static void parse_addr(const char *flag, const char *s, struct in6_addr *out)
{
	if (inet_pton(AF_INET6, s, out) != 1)
		die_arg(flag, "not an IPv6 address", s);
}

static void parse_segs(const char *s, struct sender_opts *o)
{
	char *copy = strdup(s), *save = NULL, *tok;

	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (o->nsegs == MAX_SEGS)
			die_arg("--segs", "too many SIDs (max 16)", s);
		parse_addr("--segs", tok, &o->segs[o->nsegs++]);
	}
	if (o->nsegs == 0)
		die_arg("--segs", "empty SID list", s);
	free(copy);
}

static void parse_args(int argc, char **argv, struct sender_opts *o)
{
	cli_prog = "stamp_sender";
	cli_usage = usage;
	enum { O_NETNS = 1, O_SRC, O_DST, O_SEGS, O_SPORT, O_DPORT, O_SSID, O_RATE,
	       O_COUNT, O_DURATION, O_PADDING, O_HELP };
	static const struct option longopts[] = {
		{ "netns", required_argument, NULL, O_NETNS },
		{ "src", required_argument, NULL, O_SRC },
		{ "dst", required_argument, NULL, O_DST },
		{ "segs", required_argument, NULL, O_SEGS },
		{ "sport", required_argument, NULL, O_SPORT },
		{ "dport", required_argument, NULL, O_DPORT },
		{ "ssid", required_argument, NULL, O_SSID },
		{ "rate", required_argument, NULL, O_RATE },
		{ "count", required_argument, NULL, O_COUNT },
		{ "duration", required_argument, NULL, O_DURATION },
		{ "padding", required_argument, NULL, O_PADDING },
		{ "help", no_argument, NULL, O_HELP },
		{ 0 },
	};
	bool have_src = false, have_dst = false;
	int c;

	memset(o, 0, sizeof(*o));
	o->sport = -1;
	o->dport = STAMP_PORT;
	o->ssid = -1;
	o->count = -1;
	o->duration_s = -1;

	opterr = 0;
	while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		switch (c) {
		case O_NETNS: o->netns = optarg; break;
		case O_SRC: parse_addr("--src", optarg, &o->src); have_src = true; break;
		case O_DST: parse_addr("--dst", optarg, &o->dst); have_dst = true; break;
		case O_SEGS: parse_segs(optarg, o); break;
		case O_SPORT: o->sport = parse_int("--sport", optarg, 1, 65535); break;
		case O_DPORT: o->dport = parse_int("--dport", optarg, 1, 65535); break;
		case O_SSID: o->ssid = parse_int("--ssid", optarg, 1, 65535); break;
		case O_RATE: o->rate_pps = parse_positive("--rate", optarg); break;
		case O_COUNT: o->count = parse_int("--count", optarg, 1, INT64_MAX); break;
		case O_DURATION: o->duration_s = parse_positive("--duration", optarg); break;
		case O_PADDING: o->padding = parse_int("--padding", optarg, 0, 9000); break;
		case O_HELP: usage(stdout); exit(0);
		default:
			die_arg(argv[optind - 1], "unknown flag or missing value", NULL);
		}
	}
	if (optind < argc)
		die_arg(argv[optind], "unexpected argument", NULL);
	if (!have_src)
		die_arg("--src", "required", NULL);
	if (!have_dst)
		die_arg("--dst", "required", NULL);
	if (o->ssid < 0)
		die_arg("--ssid", "required (1..65535)", NULL);
	if (o->rate_pps <= 0)
		die_arg("--rate", "required (packets per second)", NULL);
	if (o->count < 0 && o->duration_s < 0)
		die_arg("--count/--duration", "give at least one", NULL);
	if (o->sport < 0) {
		if (50000 + o->ssid > 65535)
			die_arg("--sport", "default 50000+ssid exceeds 65535; give --sport", NULL);
		o->sport = 50000 + o->ssid;
	}
}

static int enter_netns(const char *name)
{
	char path[256];
	int fd;

	snprintf(path, sizeof(path), "/run/netns/%s", name);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "stamp_sender: --netns: open %s: %s\n", path, strerror(errno));
		return -1;
	}
	if (setns(fd, CLONE_NEWNET) < 0) {
		fprintf(stderr, "stamp_sender: --netns: setns %s: %s\n", path, strerror(errno));
		close(fd);
		return -1;
	}
	close(fd);
	return 0;
}

/*
 * Linux's ipv6_push_rthdr4() copies segments[1..last_entry] from this option,
 * writes the socket's destination into segments[0] and sends the packet to
 * segments[segments_left]. So the SIDs go in reverse visiting order into
 * segments[n..1] and segments_left = last_entry = n: the first SID visited
 * is segments[n], the final destination is segments[0].
 */
static int set_srh(int fd, const struct sender_opts *o)
{
	struct srh srh;
	int n = o->nsegs;
	socklen_t len = 8 + (n + 1) * sizeof(struct in6_addr);

	memset(&srh, 0, sizeof(srh));
	srh.type = SRH_TYPE_SEGMENT_ROUTING;
	srh.hdrlen = (n + 1) * 2;
	srh.segments_left = n;
	srh.last_entry = n;
	srh.segments[0] = o->dst;
	for (int i = 0; i < n; i++)
		srh.segments[n - i] = o->segs[i];
	if (setsockopt(fd, IPPROTO_IPV6, IPV6_RTHDR, &srh, len) < 0) {
		fprintf(stderr, "stamp_sender: setsockopt(IPV6_RTHDR, %d SIDs): %s\n", n, strerror(errno));
		return -1;
	}
	return 0;
}

static int open_socket(const struct sender_opts *o)
{
	struct sockaddr_in6 sa = { .sin6_family = AF_INET6 };
	int fd = socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, IPPROTO_UDP);

	if (fd < 0) {
		fprintf(stderr, "stamp_sender: socket: %s\n", strerror(errno));
		return -1;
	}
	sa.sin6_addr = o->src;
	sa.sin6_port = htons(o->sport);
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		char a[INET6_ADDRSTRLEN];

		inet_ntop(AF_INET6, &o->src, a, sizeof(a));
		fprintf(stderr, "stamp_sender: bind [%s]:%d: %s\n", a, o->sport, strerror(errno));
		close(fd);
		return -1;
	}
	if (o->nsegs && set_srh(fd, o) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/*
 * RFC 4656 §4.1.2: error = Multiplier * 2^(-32) * 2^Scale seconds, Multiplier
 * non-zero. Pick the smallest Scale whose Multiplier (rounded up, so the
 * estimate never understates the error) fits in 8 bits.
 */
uint16_t error_estimate_from_us(long esterror_us, bool synced)
{
	/* error in units of 2^-32 s, rounded up */
	unsigned __int128 units = ((unsigned __int128)(esterror_us > 0 ? esterror_us : 0) << 32);
	uint64_t u = (uint64_t)((units + 999999) / 1000000);
	unsigned scale = 0;

	while (scale < 63 && ((u + (1ULL << scale) - 1) >> scale) > 255)
		scale++;
	uint64_t mult = (u + (1ULL << scale) - 1) >> scale;

	if (mult == 0)
		mult = 1;          /* zero is not allowed; 1 = the smallest error expressible */
	if (mult > 255)
		mult = 255;        /* beyond 2^63 * 255 * 2^-32 s: saturate */
	return (synced ? STAMP_EE_S : 0) | STAMP_EE_Z | (scale << 8) | (uint16_t)mult;
}

static uint16_t current_error_estimate(void)
{
	struct timex tx = { 0 };
	int state = adjtimex(&tx);

	if (state < 0) {
		fprintf(stderr, "stamp_sender: adjtimex: %s (error estimate = max)\n", strerror(errno));
		return STAMP_EE_Z | (63 << 8) | 255;
	}
	return error_estimate_from_us(tx.esterror, !(tx.status & STA_UNSYNC));
}

static inline uint64_t ts_ns(const struct timespec *ts)
{
	return (uint64_t)ts->tv_sec * STAMP_NS_PER_SEC + ts->tv_nsec;
}

static inline struct timespec ns_ts(uint64_t ns)
{
	struct timespec ts = { .tv_sec = ns / STAMP_NS_PER_SEC, .tv_nsec = ns % STAMP_NS_PER_SEC };
	return ts;
}

static uint64_t now_ns(clockid_t clk)
{
	struct timespec ts;

	clock_gettime(clk, &ts);
	return ts_ns(&ts);
}

struct send_stats {
	uint64_t sent, send_errors, attempts;
	int last_errno;
};

static void send_one(int fd, const struct sockaddr_in6 *dst, uint8_t *buf, size_t len,
		     uint32_t seq, uint16_t err_est, uint16_t ssid, struct send_stats *st)
{
	struct stamp_sender_packet *p = (struct stamp_sender_packet *)buf;
	struct timespec t1;
	uint32_t sec, nsec;

	p->seq = htonl(seq);
	p->err_est = htons(err_est);
	p->ssid = htons(ssid);
	clock_gettime(CLOCK_TAI, &t1);
	stamp_ptp_from_ns(ts_ns(&t1), &sec, &nsec);
	p->ts.sec = htonl(sec);
	p->ts.frac = htonl(nsec);
	st->attempts++;
	if (sendto(fd, buf, len, 0, (const struct sockaddr *)dst, sizeof(*dst)) == (ssize_t)len) {
		st->sent++;
		return;
	}
	st->send_errors++;
	if (errno != st->last_errno) {   /* report each new kind of error once, count all */
		fprintf(stderr, "stamp_sender: sendto seq %u: %s\n", seq, strerror(errno));
		st->last_errno = errno;
	}
}

int main(int argc, char **argv)
{
	struct sender_opts o;
	struct sockaddr_in6 dst = { .sin6_family = AF_INET6 };
	struct send_stats st = { 0 };
	struct sigaction sa = { .sa_handler = on_signal };   /* no SA_RESTART: sleeps return EINTR */
	uint64_t interval_ns, start, end_deadline = UINT64_MAX, t_end;
	uint16_t err_est;
	size_t len;
	uint8_t *buf;
	int fd;

	parse_args(argc, argv, &o);
	if (o.netns && enter_netns(o.netns) < 0)
		return 1;
	fd = open_socket(&o);
	if (fd < 0)
		return 1;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);

	dst.sin6_addr = o.dst;
	dst.sin6_port = htons(o.dport);
	len = STAMP_BASE_LEN + o.padding;
	buf = calloc(1, len);
	interval_ns = (uint64_t)(1e9 / o.rate_pps);
	if (interval_ns == 0)
		interval_ns = 1;
	err_est = current_error_estimate();

	start = now_ns(CLOCK_MONOTONIC);
	if (o.duration_s > 0)
		end_deadline = start + (uint64_t)(o.duration_s * 1e9);

	for (uint64_t i = 0; !stop_requested; i++) {
		uint64_t deadline = start + i * interval_ns;
		struct timespec ts = ns_ts(deadline);

		if (o.count >= 0 && i >= (uint64_t)o.count)
			break;
		if (deadline >= end_deadline)
			break;
		while (!stop_requested &&
		       clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
			;
		if (stop_requested)
			break;
		if ((i & 1023) == 1023)   /* the clock's error estimate drifts slowly */
			err_est = current_error_estimate();
		send_one(fd, &dst, buf, len, (uint32_t)i, err_est, (uint16_t)o.ssid, &st);
	}
	t_end = now_ns(CLOCK_MONOTONIC);

	printf("{\"ssid\":%ld,\"sent\":%llu,\"send_errors\":%llu,\"first_seq\":0,",
	       o.ssid, (unsigned long long)st.sent, (unsigned long long)st.send_errors);
	if (st.attempts)
		printf("\"last_seq\":%llu,", (unsigned long long)(st.attempts - 1));
	else
		printf("\"last_seq\":null,");
	printf("\"duration_s\":%.6f,\"rate_pps\":%.3f,\"error_estimate\":%u}\n",
	       (t_end - start) / 1e9, o.rate_pps, err_est);
	fflush(stdout);
	close(fd);
	free(buf);
	return st.send_errors ? 1 : 0;
}
