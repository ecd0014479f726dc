// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * flows_udp: constant-rate UDP traffic to many destinations at once, from one socket,
 * for the alternate-marking end-to-end test (tests/e2e/test_altmark_loss.py).
 *
 *   flows_udp --rate PPS --seconds S --flow DST[,TCLASS] [--flow ...]
 *             [--sport 41000] [--dport 9] [--payload 64] [--tick-us 1000] [--max-burst 32]
 *
 * Every flow gets exactly rate * seconds packets (rounded down), interleaved round-robin
 * (packet i of the run goes to flow i mod F at start + i / (F * rate)), so no flow is sent
 * as a burst. Each tick (default 1 ms) sends the packets that are due in one sendmmsg();
 * at most --max-burst packets go out per tick: a sender that fell behind (a busy vCPU) catches
 * up over several ticks instead of in one burst that could overflow a veth backlog queue and
 * lose packets outside of the test's loss injection. Each message carries its destination and an IPV6_TCLASS control message (the inner
 * Traffic Class, which must reach the far host unchanged). Payload: u32 flow index,
 * u32 reserved, u64 sequence number of the flow, zero padding.
 *
 * Prints one JSON line:
 *   {"flows": F, "rate_pps": R, "sent": N, "sent_per_flow": [..], "send_errors": E,
 *    "errno_last": X, "seconds": T, "late_ticks": L}
 * A packet the kernel refused (sendmmsg error) is counted in send_errors and NOT in sent,
 * so sent_per_flow is exactly what entered the network stack.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_FLOWS   256
#define MAX_BATCH   256
#define MAX_PAYLOAD 1200

struct flow {
	struct sockaddr_in6 dst;
	int tclass;
	uint64_t seq;
	uint64_t sent;
};

struct msg_slot {
	struct mmsghdr hdr;
	struct iovec iov;
	uint8_t payload[MAX_PAYLOAD];
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctrl;
	int flow;
};

static struct flow flows[MAX_FLOWS];
static struct msg_slot slots[MAX_BATCH];

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static void sleep_until(uint64_t t_ns)
{
	struct timespec ts = { .tv_sec = t_ns / 1000000000ull, .tv_nsec = t_ns % 1000000000ull };

	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

static int parse_flow(const char *arg, struct flow *f, int dport)
{
	char addr[INET6_ADDRSTRLEN + 1];
	const char *comma = strchr(arg, ',');
	size_t len = comma ? (size_t)(comma - arg) : strlen(arg);

	if (len == 0 || len >= sizeof(addr))
		return -1;
	memcpy(addr, arg, len);
	addr[len] = '\0';
	memset(f, 0, sizeof(*f));
	f->dst.sin6_family = AF_INET6;
	f->dst.sin6_port = htons(dport);
	if (inet_pton(AF_INET6, addr, &f->dst.sin6_addr) != 1)
		return -1;
	if (comma) {
		char *end;
		long tc = strtol(comma + 1, &end, 0);

		if (*end || tc < 0 || tc > 255)
			return -1;
		f->tclass = (int)tc;
	}
	return 0;
}

static void usage(const char *prog)
{
	fprintf(stderr, "usage: %s --rate PPS --seconds S --flow DST[,TCLASS] [--flow ...] "
		"[--sport 41000] [--dport 9] [--payload 64] [--tick-us 1000] [--max-burst 32]\n", prog);
	exit(2);
}

/* Fill slot s with the next packet of flow fi. */
static void prepare(struct msg_slot *s, int fi, size_t payload)
{
	struct flow *f = &flows[fi];
	struct cmsghdr *cm;
	uint32_t idx = (uint32_t)fi;

	memset(s->payload, 0, payload);
	memcpy(s->payload, &idx, sizeof(idx));
	memcpy(s->payload + 8, &f->seq, sizeof(f->seq));
	s->iov.iov_base = s->payload;
	s->iov.iov_len = payload;
	memset(&s->hdr, 0, sizeof(s->hdr));
	s->hdr.msg_hdr.msg_name = &f->dst;
	s->hdr.msg_hdr.msg_namelen = sizeof(f->dst);
	s->hdr.msg_hdr.msg_iov = &s->iov;
	s->hdr.msg_hdr.msg_iovlen = 1;
	s->hdr.msg_hdr.msg_control = s->ctrl.buf;
	s->hdr.msg_hdr.msg_controllen = sizeof(s->ctrl.buf);
	cm = CMSG_FIRSTHDR(&s->hdr.msg_hdr);
	cm->cmsg_level = IPPROTO_IPV6;
	cm->cmsg_type = IPV6_TCLASS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &f->tclass, sizeof(int));
	s->flow = fi;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "rate", required_argument, NULL, 'r' },
		{ "seconds", required_argument, NULL, 's' },
		{ "flow", required_argument, NULL, 'f' },
		{ "sport", required_argument, NULL, 'S' },
		{ "dport", required_argument, NULL, 'D' },
		{ "payload", required_argument, NULL, 'p' },
		{ "tick-us", required_argument, NULL, 't' },
		{ "max-burst", required_argument, NULL, 'b' },
		{ NULL, 0, NULL, 0 },
	};
	const char *flow_args[MAX_FLOWS];
	double rate = 0, seconds = 0;
	int nflows = 0, sport = 41000, dport = 9, opt;
	size_t payload = 64;
	uint64_t tick_ns = 1000000, max_burst = 32;

	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (opt) {
		case 'r': rate = atof(optarg); break;
		case 's': seconds = atof(optarg); break;
		case 'f':
			if (nflows == MAX_FLOWS) {
				fprintf(stderr, "at most %d flows\n", MAX_FLOWS);
				return 2;
			}
			flow_args[nflows++] = optarg;
			break;
		case 'S': sport = atoi(optarg); break;
		case 'D': dport = atoi(optarg); break;
		case 'p': payload = (size_t)atol(optarg); break;
		case 't': tick_ns = (uint64_t)atol(optarg) * 1000ull; break;
		case 'b': max_burst = (uint64_t)atol(optarg); break;
		default: usage(argv[0]);
		}
	}
	if (rate <= 0 || seconds <= 0 || nflows == 0 || payload < 16 || payload > MAX_PAYLOAD || tick_ns == 0 ||
	    max_burst == 0 || max_burst > MAX_BATCH)
		usage(argv[0]);
	for (int i = 0; i < nflows; i++) {
		if (parse_flow(flow_args[i], &flows[i], dport)) {
			fprintf(stderr, "bad --flow %s (want IPV6[,TCLASS 0..255])\n", flow_args[i]);
			return 2;
		}
	}

	int fd = socket(AF_INET6, SOCK_DGRAM, 0);
	struct sockaddr_in6 src = { .sin6_family = AF_INET6, .sin6_port = htons(sport), .sin6_addr = in6addr_any };

	if (fd < 0 || bind(fd, (struct sockaddr *)&src, sizeof(src))) {
		perror("socket/bind");
		return 1;
	}

	uint64_t per_flow = (uint64_t)(rate * seconds);
	uint64_t total = per_flow * (uint64_t)nflows;
	double interval_ns = 1e9 / (rate * nflows);
	uint64_t next = 0, send_errors = 0, late_ticks = 0, sent = 0;
	int errno_last = 0;
	uint64_t start = now_ns(), tick = start, first_send = 0, last_send = 0;

	while (next < total) {
		uint64_t now = now_ns();
		uint64_t due = (uint64_t)((double)(now - start) / interval_ns) + 1;   /* packets due by now */

		if (due > total)
			due = total;
		if (due > next + max_burst)
			due = next + max_burst;
		if (now > tick + 2 * tick_ns)
			late_ticks++;
		while (next < due) {
			int n = 0;

			while (next < due && n < MAX_BATCH) {
				prepare(&slots[n], (int)(next % (uint64_t)nflows), payload);
				flows[next % (uint64_t)nflows].seq++;
				n++;
				next++;
			}
			struct mmsghdr hdrs[MAX_BATCH];
			int done = 0;

			for (int i = 0; i < n; i++)
				hdrs[i] = slots[i].hdr;
			while (done < n) {
				int r = sendmmsg(fd, hdrs + done, (unsigned)(n - done), 0);

				if (r < 0) {
					/* the first message of the rest failed: count it, go on with the others */
					errno_last = errno;
					send_errors++;
					done++;
					continue;
				}
				for (int i = done; i < done + r; i++)
					flows[slots[i].flow].sent++;
				sent += (uint64_t)r;
				done += r;
			}
			if (!first_send)
				first_send = now_ns();
			last_send = now_ns();
		}
		tick += tick_ns;
		if (tick <= now_ns())      /* behind: still pause, so the receive path drains in between */
			tick = now_ns() + tick_ns / 4;
		sleep_until(tick);
	}

	printf("{\"flows\": %d, \"rate_pps\": %.3f, \"sent\": %llu, \"sent_per_flow\": [", nflows, rate,
	       (unsigned long long)sent);
	for (int i = 0; i < nflows; i++)
		printf("%s%llu", i ? ", " : "", (unsigned long long)flows[i].sent);
	printf("], \"send_errors\": %llu, \"errno_last\": %d, \"seconds\": %.6f, \"late_ticks\": %llu}\n",
	       (unsigned long long)send_errors, errno_last, (double)(last_send - first_send) / 1e9,
	       (unsigned long long)late_ticks);
	close(fd);
	return 0;
}
