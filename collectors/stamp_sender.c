// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * stamp_sender: STAMP Session-Sender (RFC 8762 §4.2.1, unauthenticated, with
 * the RFC 8972 SSID) over an SRv6 path.
 *
 * A plain UDP socket; the SRv6 segment list is a sticky IPV6_RTHDR option
 * holding a type-4 SRH, so the kernel builds the SRH for every packet.
 * A uSID container as the destination without an SRH (--final-dst) goes out
 * on a raw socket instead: the kernel's UDP socket would checksum for the
 * container, but the reflector checks the checksum for the address the
 * container has after its last shift (RFC 8200 §8.1: the final destination),
 * so the sender writes the UDP header and that checksum itself.
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
#include <linux/filter.h>
#include <sys/socket.h>
#include <sys/timex.h>
#include <time.h>
#include <unistd.h>

#include "stamp_test_packet.h"
#include "srh_sockopt.h"
#include "stamp_timestamp.h"
#include "stamp_error_estimate.h"
#include "stamp_tlv.h"
#include "cli.h"
#include "tether.h"

#define MAX_SEGS 16
#define MAX_PACKET 9000      /* UDP payload bytes: base packet + padding or TLVs */
#define TAI_OFFSET_MAX 1000  /* |TAI-UTC| seconds accepted, as the XDP loaders */

struct sender_opts {
	const char *netns;
	struct in6_addr src, dst;
	struct in6_addr segs[MAX_SEGS];   /* in visiting order */
	bool have_final;                  /* --final-dst: dst is a container, no SRH */
	struct in6_addr final_dst;        /* what dst becomes after its last shift */
	int nsegs;
	int sport;                        /* -1: 50000 + ssid */
	int dport;
	long ssid;
	double rate_pps;
	long long count;                  /* -1: unlimited */
	double duration_s;                /* <0: unlimited */
	long padding;
	enum stamp_ts_format format;
	bool tai_offset_given;
	int tai_offset_s;                 /* TAI-UTC for NTP timestamps */
	uint8_t tlvs[MAX_PACKET];         /* raw TLVs, wire order */
	size_t tlv_len;
	int ntlvs;
	const char *stats_file;           /* --stats-file: live counters, rewritten every second */
	struct tether tether;             /* --agent-dir / --adopt-timeout (collectors/tether.h) */
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
		"usage: stamp_sender [--netns NS] --src ADDR --dst ADDR [--segs SID1,SID2,... | --final-dst ADDR]\n"
		"                    [--sport P] [--dport 862] --ssid N --rate PPS\n"
		"                    [--count N] [--duration SEC] [--padding BYTES]\n"
		"                    [--format ptp|ntp] [--tai-offset S] [--tlv TYPE:HEX[:FLAGS]]...\n"
		"                    [--stats-file PATH] [--agent-dir DIR --adopt-timeout S]\n"
		"At least one of --count/--duration. Prints one JSON summary line on exit;\n"
		"--final-dst: --dst is a uSID container sent without an SRH, ADDR the address it has after\n"
		"its last shift (the reflector's); the UDP checksum is computed for ADDR (raw socket).\n"
		"--stats-file: {\"sent\":N,\"send_errors\":N} rewritten every second while sending;\n"
		"--agent-dir/--adopt-timeout: started by the node agent, whose state is in DIR: stops by\n"
		"itself (\"orphaned\":true in the summary) once no agent has run for S seconds.\n");
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

static int hex_nibble(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/*
 * --tlv TYPE:HEX[:FLAGS]: one raw TLV (RFC 8972 §4: Flags, Type, Length,
 * Value) appended to o->tlvs. FLAGS defaults to U=1, which RFC 8972 §4 has
 * the Session-Sender send (the reflector clears it for Types it knows).
 * Same syntax as the ustamp sender's --tlv.
 */
static void parse_tlv(const char *s, struct sender_opts *o)
{
	char *copy = strdup(s), *type_s = copy, *hex, *flags_s, *end;
	size_t hex_len, value_len;
	long type, flags = STAMP_TLV_SENDER_FLAGS;
	uint8_t *out;
	int rc;

	hex = strchr(copy, ':');
	if (!hex)
		die_arg("--tlv", "expected TYPE:HEX[:FLAGS]", s);
	*hex++ = '\0';
	flags_s = strchr(hex, ':');
	if (flags_s)
		*flags_s++ = '\0';
	errno = 0;
	type = strtol(type_s, &end, 0);
	if (errno || end == type_s || *end || type < 0 || type > 255)
		die_arg("--tlv", "TYPE must be an integer in 0..255", s);
	if (flags_s) {
		flags = strtol(flags_s, &end, 0);
		if (errno || end == flags_s || *end || flags < 0 || flags > 255)
			die_arg("--tlv", "FLAGS must be an integer in 0..255", s);
	}
	hex_len = strlen(hex);
	if (hex_len % 2)
		die_arg("--tlv", "HEX value has an odd number of digits", s);
	value_len = hex_len / 2;
	out = o->tlvs + o->tlv_len;
	rc = stamp_tlv_put_header(out, sizeof(o->tlvs) - STAMP_BASE_LEN - o->tlv_len,
				  (uint8_t)flags, (uint8_t)type, value_len);
	if (rc < 0)
		die_arg("--tlv", "the TLVs make the packet longer than 9000 bytes", s);
	for (size_t i = 0; i < value_len; i++) {
		int hi = hex_nibble(hex[2 * i]), lo = hex_nibble(hex[2 * i + 1]);

		if (hi < 0 || lo < 0)
			die_arg("--tlv", "HEX value is not hexadecimal", s);
		out[rc + i] = (uint8_t)(hi << 4 | lo);
	}
	o->tlv_len += rc + value_len;
	o->ntlvs++;
	free(copy);
}

static void parse_args(int argc, char **argv, struct sender_opts *o)
{
	cli_prog = "stamp_sender";
	cli_usage = usage;
	enum { O_NETNS = 1, O_SRC, O_DST, O_SEGS, O_SPORT, O_DPORT, O_SSID, O_RATE,
	       O_COUNT, O_DURATION, O_PADDING, O_FORMAT, O_TAI_OFFSET, O_TLV, O_STATS_FILE, O_AGENT_DIR, O_ADOPT_TIMEOUT, O_FINAL_DST, O_HELP };
	static const struct option longopts[] = {
		{ "netns", required_argument, NULL, O_NETNS },
		{ "src", required_argument, NULL, O_SRC },
		{ "dst", required_argument, NULL, O_DST },
		{ "segs", required_argument, NULL, O_SEGS },
		{ "final-dst", required_argument, NULL, O_FINAL_DST },
		{ "sport", required_argument, NULL, O_SPORT },
		{ "dport", required_argument, NULL, O_DPORT },
		{ "ssid", required_argument, NULL, O_SSID },
		{ "rate", required_argument, NULL, O_RATE },
		{ "count", required_argument, NULL, O_COUNT },
		{ "duration", required_argument, NULL, O_DURATION },
		{ "padding", required_argument, NULL, O_PADDING },
		{ "format", required_argument, NULL, O_FORMAT },
		{ "tai-offset", required_argument, NULL, O_TAI_OFFSET },
		{ "tlv", required_argument, NULL, O_TLV },
		{ "stats-file", required_argument, NULL, O_STATS_FILE },
		{ "agent-dir", required_argument, NULL, O_AGENT_DIR },
		{ "adopt-timeout", required_argument, NULL, O_ADOPT_TIMEOUT },
		{ "help", no_argument, NULL, O_HELP },
		{ 0 },
	};
	bool have_src = false, have_dst = false;
	int c;

	memset(o, 0, sizeof(*o));
	tether_init(&o->tether, "stamp_sender");
	o->sport = -1;
	o->dport = STAMP_PORT;
	o->ssid = -1;
	o->count = -1;
	o->duration_s = -1;
	o->format = STAMP_TS_PTP;

	opterr = 0;
	while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		switch (c) {
		case O_NETNS: o->netns = optarg; break;
		case O_SRC: parse_addr("--src", optarg, &o->src); have_src = true; break;
		case O_DST: parse_addr("--dst", optarg, &o->dst); have_dst = true; break;
		case O_SEGS: parse_segs(optarg, o); break;
		case O_FINAL_DST: parse_addr("--final-dst", optarg, &o->final_dst); o->have_final = true; break;
		case O_SPORT: o->sport = parse_int("--sport", optarg, 1, 65535); break;
		case O_DPORT: o->dport = parse_int("--dport", optarg, 1, 65535); break;
		/* 0: a plain RFC 8762 sender (bytes 14-15 MBZ, no RFC 8972 SSID) */
		case O_SSID: o->ssid = parse_int("--ssid", optarg, 0, 65535); break;
		case O_RATE: o->rate_pps = parse_positive("--rate", optarg); break;
		case O_COUNT: o->count = parse_int("--count", optarg, 1, INT64_MAX); break;
		case O_DURATION: o->duration_s = parse_positive("--duration", optarg); break;
		case O_STATS_FILE: o->stats_file = optarg; break;
		case O_AGENT_DIR: tether_set_dir(&o->tether, optarg); break;
		case O_ADOPT_TIMEOUT: tether_set_timeout(&o->tether, optarg); break;
		case O_PADDING: o->padding = parse_int("--padding", optarg, 0, MAX_PACKET - STAMP_BASE_LEN); break;
		case O_FORMAT:
			if (!strcmp(optarg, "ptp"))
				o->format = STAMP_TS_PTP;
			else if (!strcmp(optarg, "ntp"))
				o->format = STAMP_TS_NTP;
			else
				die_arg("--format", "expected ptp or ntp", optarg);
			break;
		case O_TAI_OFFSET:
			o->tai_offset_s = parse_int("--tai-offset", optarg, -TAI_OFFSET_MAX, TAI_OFFSET_MAX);
			o->tai_offset_given = true;
			break;
		case O_TLV: parse_tlv(optarg, o); break;
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
	if (o->have_final && o->nsegs)
		die_arg("--final-dst", "only without --segs (with an SRH the kernel checksums for its last segment)",
			NULL);
	if (o->ssid < 0)
		die_arg("--ssid", "required (0..65535; 0: plain RFC 8762, no SSID)", NULL);
	if (o->rate_pps <= 0)
		die_arg("--rate", "required (packets per second)", NULL);
	if (o->count < 0 && o->duration_s < 0)
		die_arg("--count/--duration", "give at least one", NULL);
	if (o->padding && o->ntlvs)
		die_arg("--padding", "zero padding would be read as TLVs; with --tlv use an Extra Padding TLV (--tlv 1:00...)", NULL);
	if (o->sport < 0) {
		if (50000 + o->ssid > 65535)
			die_arg("--sport", "default 50000+ssid exceeds 65535; give --sport", NULL);
		o->sport = 50000 + o->ssid;
	}
	char what[32];

	snprintf(what, sizeof(what), "ssid %ld", o->ssid);
	tether_open(&o->tether, what);
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

/* The SID list as an SRH on the socket (collectors/srh_sockopt.h says how Linux lays it out). */
static int set_srh(int fd, const struct sender_opts *o)
{
	int err = srh_sockopt_set(fd, &o->dst, o->segs, o->nsegs);

	if (err)
		fprintf(stderr, "stamp_sender: setsockopt(IPV6_RTHDR, %d SIDs): %s\n", o->nsegs, strerror(-err));
	return err ? -1 : 0;
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

/* For --final-dst: a raw UDP socket whose packets the sender builds from the UDP header on. It
 * would also get a copy of every UDP packet the node receives: a filter that keeps none. */
static int open_raw_socket(const struct sender_opts *o)
{
	struct sockaddr_in6 sa = { .sin6_family = AF_INET6, .sin6_addr = o->src };
	struct sock_filter keep_none = BPF_STMT(BPF_RET | BPF_K, 0);
	struct sock_fprog prog = { .len = 1, .filter = &keep_none };
	int fd = socket(AF_INET6, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_UDP);

	if (fd < 0) {
		fprintf(stderr, "stamp_sender: raw socket (--final-dst): %s\n", strerror(errno));
		return -1;
	}
	if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof(prog)) < 0 ||
	    bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		char a[INET6_ADDRSTRLEN];

		inet_ntop(AF_INET6, &o->src, a, sizeof(a));
		fprintf(stderr, "stamp_sender: raw socket from %s: %s\n", a, strerror(errno));
		close(fd);
		return -1;
	}
	return fd;
}

static uint32_t sum16(uint32_t sum, const void *data, size_t len)
{
	const uint8_t *p = data;

	for (; len > 1; p += 2, len -= 2)
		sum += (uint32_t)p[0] << 8 | p[1];
	if (len)
		sum += (uint32_t)p[0] << 8;
	return sum;
}

/* The UDP header in front of the STAMP payload, its checksum over the IPv6 pseudo-header with the
 * final destination (RFC 8200 §8.1). */
static void write_udp_header(uint8_t *udp, size_t udp_len, const struct sender_opts *o)
{
	uint32_t sum = 0;
	uint8_t pseudo_tail[8] = { 0 };

	udp[0] = o->sport >> 8, udp[1] = o->sport & 0xff;
	udp[2] = o->dport >> 8, udp[3] = o->dport & 0xff;
	udp[4] = udp_len >> 8, udp[5] = udp_len & 0xff;
	udp[6] = udp[7] = 0;
	pseudo_tail[2] = udp_len >> 8, pseudo_tail[3] = udp_len & 0xff, pseudo_tail[7] = IPPROTO_UDP;
	sum = sum16(sum, &o->src, sizeof(o->src));
	sum = sum16(sum, &o->final_dst, sizeof(o->final_dst));
	sum = sum16(sum, pseudo_tail, sizeof(pseudo_tail));
	sum = sum16(sum, udp, udp_len);
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	sum = ~sum & 0xffff;
	if (sum == 0)   /* RFC 8200 §8.1: a computed zero is sent as all ones */
		sum = 0xffff;
	udp[6] = sum >> 8, udp[7] = sum & 0xff;
}

/*
 * Error Estimate (RFC 8762 §4.2.1) from the kernel clock: S iff adjtimex
 * says the clock is disciplined, Z from the format, Scale/Multiplier the
 * smallest value >= the estimated error (synchronised) or the maximum
 * error (free-running) — stamp_ee_from_clock(), the rule ustamp and the XDP
 * loaders share. If adjtimex fails, the largest error expressible, unsynced.
 */
static uint16_t current_error_estimate(enum stamp_ts_format fmt)
{
	struct stamp_clock_state cs;

	if (stamp_clock_read(&cs) < 0) {
		fprintf(stderr, "stamp_sender: adjtimex: %s (error estimate = max)\n", strerror(errno));
		return stamp_ee_pack(0, fmt, STAMP_EE_SCALE_MAX, STAMP_EE_MULT_MAX);
	}
	return stamp_ee_from_clock(&cs, fmt);
}

/* TAI-UTC the kernel knows (struct timex.tai; 0 if nobody set it). */
static int kernel_tai_offset(void)
{
	struct stamp_clock_state cs;

	if (stamp_clock_read(&cs) < 0) {
		fprintf(stderr, "stamp_sender: adjtimex: %s (TAI-UTC taken as 0; give --tai-offset)\n",
			strerror(errno));
		return 0;
	}
	return cs.tai_offset_s;
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

/* The session's wire settings, fixed for the run. */
struct wire_fmt {
	enum stamp_ts_format format;
	int tai_offset_s;
	uint16_t ssid;
	size_t udp_header;                /* 8: a raw socket, the sender writes the UDP header (--final-dst) */
	const struct sender_opts *opts;
};

/* buf: the UDP header's room (wf->udp_header bytes), then the STAMP payload; len: all of it */
static void send_one(int fd, const struct sockaddr_in6 *dst, uint8_t *buf, size_t len,
		     uint32_t seq, uint16_t err_est, const struct wire_fmt *wf, struct send_stats *st)
{
	struct stamp_sender_packet *p = (struct stamp_sender_packet *)(buf + wf->udp_header);
	struct timespec t1;

	p->seq = htonl(seq);
	p->err_est = htons(err_est);
	p->ssid = htons(wf->ssid);
	clock_gettime(CLOCK_TAI, &t1);
	/* only fails for an NTP time before 1970 UTC (a TAI clock < the offset) */
	if (stamp_ts_from_tai_ns(wf->format, ts_ns(&t1), wf->tai_offset_s, &p->ts) < 0)
		memset(&p->ts, 0, sizeof(p->ts));
	if (wf->udp_header)
		write_udp_header(buf, len, wf->opts);
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

/* The live counters for --stats-file: written to a temporary file and renamed over PATH, so a
 * reader never sees a half-written line. */
static void write_stats_file(const char *path, const struct send_stats *st)
{
	char tmp[4096];
	FILE *f;

	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "w");
	if (!f)
		return;
	fprintf(f, "{\"sent\":%llu,\"send_errors\":%llu}\n", (unsigned long long)st->sent,
		(unsigned long long)st->send_errors);
	if (fclose(f) == 0)
		rename(tmp, path);
}

int main(int argc, char **argv)
{
	struct sender_opts o;
	struct sockaddr_in6 dst = { .sin6_family = AF_INET6 };
	struct send_stats st = { 0 };
	struct sigaction sa = { .sa_handler = on_signal };   /* no SA_RESTART: sleeps return EINTR */
	uint64_t interval_ns, start, end_deadline = UINT64_MAX, t_end;
	uint16_t err_est;
	struct wire_fmt wf;
	size_t len;
	uint8_t *buf;
	int fd;

	parse_args(argc, argv, &o);
	if (o.netns && enter_netns(o.netns) < 0)
		return 1;
	fd = o.have_final ? open_raw_socket(&o) : open_socket(&o);
	if (fd < 0)
		return 1;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);

	dst.sin6_addr = o.dst;
	dst.sin6_port = o.have_final ? 0 : htons(o.dport);   /* raw: the port field must be 0 */
	wf.udp_header = o.have_final ? 8 : 0;
	wf.opts = &o;
	len = STAMP_BASE_LEN + o.padding + o.tlv_len;
	buf = calloc(1, wf.udp_header + len);
	memcpy(buf + wf.udp_header + STAMP_BASE_LEN, o.tlvs, o.tlv_len);
	len += wf.udp_header;
	wf.format = o.format;
	wf.ssid = (uint16_t)o.ssid;
	wf.tai_offset_s = o.tai_offset_given ? o.tai_offset_s : kernel_tai_offset();
	interval_ns = (uint64_t)(1e9 / o.rate_pps);
	if (interval_ns == 0)
		interval_ns = 1;
	err_est = current_error_estimate(o.format);

	start = now_ns(CLOCK_MONOTONIC);
	if (o.duration_s > 0)
		end_deadline = start + (uint64_t)(o.duration_s * 1e9);

	uint64_t next_stats = start;

	for (uint64_t i = 0; !stop_requested; i++) {
		uint64_t deadline = start + i * interval_ns;

		if (o.stats_file && deadline >= next_stats) {   /* at most once a second, off the send path */
			write_stats_file(o.stats_file, &st);
			next_stats = deadline + 1000000000ull;
		}
		struct timespec ts = ns_ts(deadline);

		if (o.count >= 0 && i >= (uint64_t)o.count)
			break;
		if (deadline >= end_deadline)
			break;
		if (tether_orphaned(&o.tether, deadline / 1e9))   /* no agent: stop as on SIGTERM */
			break;
		while (!stop_requested &&
		       clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
			;
		if (stop_requested)
			break;
		if ((i & 1023) == 1023)   /* the clock's error estimate drifts slowly */
			err_est = current_error_estimate(o.format);
		send_one(fd, &dst, buf, len, (uint32_t)i, err_est, &wf, &st);
	}
	t_end = now_ns(CLOCK_MONOTONIC);
	if (o.stats_file)
		write_stats_file(o.stats_file, &st);

	printf("{\"ssid\":%ld,\"sent\":%llu,\"send_errors\":%llu,\"first_seq\":0,",
	       o.ssid, (unsigned long long)st.sent, (unsigned long long)st.send_errors);
	if (st.attempts)
		printf("\"last_seq\":%llu,", (unsigned long long)(st.attempts - 1));
	else
		printf("\"last_seq\":null,");
	printf("\"duration_s\":%.6f,\"rate_pps\":%.3f,\"error_estimate\":%u,",
	       (t_end - start) / 1e9, o.rate_pps, err_est);
	printf("\"format\":\"%s\",\"tai_offset_s\":%d,\"length\":%zu,\"tlvs\":%d%s}\n",
	       o.format == STAMP_TS_NTP ? "ntp" : "ptp", wf.tai_offset_s, len - wf.udp_header, o.ntlvs,
	       o.tether.orphaned ? ",\"orphaned\":true" : "");
	fflush(stdout);
	close(fd);
	free(buf);
	return st.send_errors ? 1 : 0;
}
