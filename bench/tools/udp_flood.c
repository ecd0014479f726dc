// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * udp_flood: send STAMP Session-Sender test packets (RFC 8762 base packet,
 * 44 bytes) as fast as one thread can, with sendmmsg batches, for a bounded
 * time and count. For benchmarks on this machine's own network namespaces only.
 *
 *   udp_flood --src ADDR --dst ADDR [--port 862] [--sport 40000] [--ssid 1]
 *             [--seconds 3] [--max-packets N] [--batch 64] [--netns NS]
 *             [--padding-tlv BYTES]
 *
 * --padding-tlv appends an RFC 8972 Extra Padding TLV (Type 1, U flag set as a
 * sender sends it) with BYTES zero octets of value: packets with a TLV area,
 * which a reflector handles on its full path (the user-space reflector's Python
 * code, the XDP reflector's pass to user space).
 *
 * Prints one JSON line: {"sent": N, "seconds": S, "pps": P, "send_errors": E}.
 * Sequence numbers count up; T1 (PTP, CLOCK_TAI) is taken once per batch.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "stamp_test_packet.h"

#define MAX_BATCH 256
#define MAX_PADDING 1400
#define TLV_HDR_LEN 4
#define TLV_TYPE_EXTRA_PADDING 1
#define TLV_FLAG_U 0x80

/* One test packet: the base packet and, with --padding-tlv, the TLV after it. */
struct flood_packet {
	struct stamp_sender_packet base;
	uint8_t tlv[TLV_HDR_LEN + MAX_PADDING];
} __attribute__((packed));

static uint64_t clock_ns(clockid_t clk)
{
	struct timespec ts;

	clock_gettime(clk, &ts);
	return ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

static int fail_usage(const char *what, const char *value)
{
	fprintf(stderr, "udp_flood: %s: bad value '%s'\n", what, value ? value : "");
	return 2;
}

static int parse_num(const char *what, const char *text, unsigned long long min,
		     unsigned long long max, unsigned long long *out)
{
	char *end;

	errno = 0;
	*out = strtoull(text, &end, 0);
	if (errno || *end || !*text || *out < min || *out > max)
		return fail_usage(what, text);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "src", required_argument, NULL, 's' }, { "dst", required_argument, NULL, 'd' },
		{ "port", required_argument, NULL, 'p' }, { "sport", required_argument, NULL, 'P' },
		{ "ssid", required_argument, NULL, 'i' }, { "seconds", required_argument, NULL, 't' },
		{ "max-packets", required_argument, NULL, 'n' }, { "batch", required_argument, NULL, 'b' },
		{ "netns", required_argument, NULL, 'N' }, { "padding-tlv", required_argument, NULL, 'T' }, {},
	};
	unsigned long long port = STAMP_PORT, sport = 40000, ssid = 1, seconds = 3, max_packets = 100000000,
			   batch = 64, padding = 0, has_padding = 0;
	const char *src = NULL, *dst = NULL, *netns = NULL;
	struct sockaddr_in6 src_sa = { .sin6_family = AF_INET6 }, dst_sa = { .sin6_family = AF_INET6 };
	static struct flood_packet pkts[MAX_BATCH];
	struct mmsghdr msgs[MAX_BATCH];
	struct iovec iovs[MAX_BATCH];
	uint64_t sent = 0, errors = 0, start, deadline, elapsed;
	uint32_t seq = 0;
	int opt, fd;

	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		int rc = 0;

		switch (opt) {
		case 's': src = optarg; break;
		case 'd': dst = optarg; break;
		case 'N': netns = optarg; break;
		case 'p': rc = parse_num("--port", optarg, 1, 65535, &port); break;
		case 'P': rc = parse_num("--sport", optarg, 1, 65535, &sport); break;
		case 'i': rc = parse_num("--ssid", optarg, 0, 65535, &ssid); break;
		case 't': rc = parse_num("--seconds", optarg, 1, 60, &seconds); break;
		case 'n': rc = parse_num("--max-packets", optarg, 1, 1ULL << 40, &max_packets); break;
		case 'b': rc = parse_num("--batch", optarg, 1, MAX_BATCH, &batch); break;
		case 'T': rc = parse_num("--padding-tlv", optarg, 0, MAX_PADDING, &padding); has_padding = 1; break;
		default: return 2;
		}
		if (rc)
			return rc;
	}
	if (!src || inet_pton(AF_INET6, src, &src_sa.sin6_addr) != 1)
		return fail_usage("--src", src);
	if (!dst || inet_pton(AF_INET6, dst, &dst_sa.sin6_addr) != 1)
		return fail_usage("--dst", dst);
	if (netns) {
		char path[256];
		int nsfd;

		snprintf(path, sizeof(path), "/run/netns/%s", netns);
		nsfd = open(path, O_RDONLY);
		if (nsfd < 0 || setns(nsfd, CLONE_NEWNET)) {
			fprintf(stderr, "udp_flood: --netns: cannot enter %s: %s\n", path, strerror(errno));
			return 1;
		}
		close(nsfd);
	}
	src_sa.sin6_port = htons(sport);
	dst_sa.sin6_port = htons(port);
	fd = socket(AF_INET6, SOCK_DGRAM, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&src_sa, sizeof(src_sa)) ||
	    connect(fd, (struct sockaddr *)&dst_sa, sizeof(dst_sa))) {
		fprintf(stderr, "udp_flood: socket/bind/connect %s -> %s: %s\n", src, dst, strerror(errno));
		return 1;
	}
	memset(pkts, 0, sizeof(pkts));
	memset(msgs, 0, sizeof(msgs));
	for (unsigned int i = 0; i < batch; i++) {
		pkts[i].base.err_est = htons(STAMP_EE_Z);
		pkts[i].base.ssid = htons(ssid);
		pkts[i].tlv[0] = TLV_FLAG_U;
		pkts[i].tlv[1] = TLV_TYPE_EXTRA_PADDING;
		pkts[i].tlv[2] = (uint8_t)(padding >> 8);
		pkts[i].tlv[3] = (uint8_t)padding;
		iovs[i].iov_base = &pkts[i];
		iovs[i].iov_len = sizeof(pkts[i].base) + (has_padding ? TLV_HDR_LEN + padding : 0);
		msgs[i].msg_hdr.msg_iov = &iovs[i];
		msgs[i].msg_hdr.msg_iovlen = 1;
	}
	start = clock_ns(CLOCK_MONOTONIC);
	deadline = start + seconds * 1000000000ULL;
	while (sent < max_packets && clock_ns(CLOCK_MONOTONIC) < deadline) {
		unsigned int n = batch;
		uint32_t sec, nsec;
		int rc;

		if (max_packets - sent < n)
			n = max_packets - sent;
		stamp_ptp_from_ns(clock_ns(CLOCK_TAI), &sec, &nsec);
		for (unsigned int i = 0; i < n; i++) {
			pkts[i].base.seq = htonl(seq + i);
			pkts[i].base.ts.sec = htonl(sec);
			pkts[i].base.ts.frac = htonl(nsec);
		}
		rc = sendmmsg(fd, msgs, n, 0);
		if (rc < 0) {
			errors++;
			if (errno != ENOBUFS && errno != EAGAIN && errno != ECONNREFUSED) {
				fprintf(stderr, "udp_flood: sendmmsg: %s\n", strerror(errno));
				return 1;
			}
			continue;
		}
		sent += rc;
		seq += rc;
	}
	elapsed = clock_ns(CLOCK_MONOTONIC) - start;
	printf("{\"sent\": %llu, \"seconds\": %.3f, \"pps\": %.0f, \"send_errors\": %llu}\n",
	       (unsigned long long)sent, elapsed / 1e9, sent / (elapsed / 1e9), (unsigned long long)errors);
	close(fd);
	return 0;
}
