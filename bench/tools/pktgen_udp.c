// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * pktgen_udp: rate-controlled traffic for forwarding-capacity (PDR) trials.
 * Sends exactly rate * seconds packets, paced on CLOCK_MONOTONIC absolute
 * deadlines (one deadline per batch; batches of at most --batch packets and
 * at most 100 us worth of the rate, so low rates are not sent as bursts), as a
 * deterministic mix of
 *   - plain UDP data packets (payload --payload bytes, sequence number inside) to --data-dst
 *     (packet mode: or round-robin over --data-dsts K consecutive addresses from --data-dst on,
 *     so that K routes / SRv6 policies share the load), and
 *   - STAMP Session-Sender test packets (RFC 8762 base packet, 44 bytes, SSID
 *     RFC 8972) to --stamp-dst, carrying a type-4 SRH (RFC 8754) built by the
 *     kernel from a sticky IPV6_RTHDR option: SID list --stamp-segs (visiting
 *     order) then the destination; with no SIDs the SRH holds the destination
 *     only, segments_left 0.
 * The STAMP share is exact over the run: after k packets, floor(k * share)
 * of them were STAMP packets (spread evenly, not in bursts).
 *
 *   pktgen_udp --src ADDR --data-dst ADDR --rate PPS [--seconds 1.0]
 *              [--stamp-dst ADDR --stamp-share F [--stamp-segs A,B] [--ssid 1]]
 *              [--data-port 9] [--sport 40000] [--stamp-sport 40001]
 *              [--payload 44] [--batch 16] [--netns NS] [--cpu N]
 *              [--dev IF --src-mac MAC --dst-mac MAC [--data-dsts K]]
 *
 * Socket mode (default): UDP sockets, the sender's kernel builds IPv6/SRH/UDP.
 * Packet mode (--dev): the same packets as complete Ethernet frames on an
 * AF_PACKET socket with PACKET_QDISC_BYPASS (checksums computed here; STAMP
 * frames get seq, T1 and checksum per packet, data frames are identical), so
 * the generator costs a fraction of a socket send and outruns the device
 * under test, as a hardware traffic generator does.
 *
 * Prints one JSON line:
 *   {"sent": N, "data_sent": D, "stamp_sent": S, "target_pps": R, "seconds": T,
 *    "offered_pps": N/T, "late_batches": L, "send_errors": E, "xmit_drops": X, "data_dsts": K}
 * xmit_drops: frames the first veth reported dropped (packet mode, ENOBUFS).
 * "seconds" is the time from the first send to the end of the last one; if the
 * sender could not keep the rate, offered_pps < target_pps (the caller checks).
 * "sent" counts what the kernel accepted; ENOBUFS from a full veth ring is not
 * an error for UDP sockets without IPV6_RECVERR (the packet counts as sent and
 * is lost in the device under test, which is what a trial measures).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <math.h>
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
#include "srh_sockopt.h"

#define MAX_BATCH   256
#define MAX_SEGS    8
#define MAX_PAYLOAD 1400
#define MAX_DATA_DSTS 64

struct gen_opts {
	const char *netns;
	struct in6_addr src, data_dst, stamp_dst;
	struct in6_addr segs[MAX_SEGS];
	int nsegs, have_stamp_dst, cpu;
	const char *dev;                  /* packet mode: AF_PACKET on this device */
	uint8_t src_mac[6], dst_mac[6];
	unsigned long long data_port, sport, stamp_sport, ssid, payload, batch, data_dsts;
	double rate, seconds, share;
};

#define FRAME_MAX (14 + 40 + 8 + 16 * (MAX_SEGS + 1) + 8 + MAX_PAYLOAD)

struct batch_bufs {
	uint8_t data[MAX_BATCH][MAX_PAYLOAD];
	uint8_t data_frame[MAX_DATA_DSTS][FRAME_MAX], stamp_frame[MAX_BATCH][FRAME_MAX];
	size_t data_frame_len, stamp_frame_len, stamp_payload_off, stamp_csum_off;
	uint32_t stamp_csum_base;          /* pseudo-header + UDP header sum, payload excluded */
	struct sockaddr_ll ll;
	struct stamp_sender_packet stamp[MAX_BATCH];
	struct iovec data_iov[MAX_BATCH], stamp_iov[MAX_BATCH];
	struct mmsghdr data_msg[MAX_BATCH], stamp_msg[MAX_BATCH];
};

static uint64_t clock_ns(clockid_t clk)
{
	struct timespec ts;

	clock_gettime(clk, &ts);
	return ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

static void sleep_until_ns(uint64_t when)
{
	struct timespec ts = { .tv_sec = when / 1000000000ULL, .tv_nsec = when % 1000000000ULL };

	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

static int fail_usage(const char *what, const char *value)
{
	fprintf(stderr, "pktgen_udp: %s: bad value '%s'\n", what, value ? value : "");
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

static int parse_real(const char *what, const char *text, double min, double max, double *out)
{
	char *end;

	errno = 0;
	*out = strtod(text, &end);
	if (errno || *end || !*text || !(*out >= min && *out <= max))
		return fail_usage(what, text);
	return 0;
}

static int parse_mac(const char *what, const char *text, uint8_t mac[6])
{
	unsigned int b[6];
	char tail;

	if (sscanf(text, "%x:%x:%x:%x:%x:%x%c", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5], &tail) != 6)
		return fail_usage(what, text);
	for (int i = 0; i < 6; i++) {
		if (b[i] > 0xff)
			return fail_usage(what, text);
		mac[i] = b[i];
	}
	return 0;
}

static int parse_segs(const char *text, struct gen_opts *o)
{
	char buf[MAX_SEGS * 48], *tok, *save = NULL;

	if (strlen(text) >= sizeof(buf))
		return fail_usage("--stamp-segs", text);
	strcpy(buf, text);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (o->nsegs == MAX_SEGS || inet_pton(AF_INET6, tok, &o->segs[o->nsegs]) != 1)
			return fail_usage("--stamp-segs (at most 8 IPv6 SIDs)", tok);
		o->nsegs++;
	}
	return 0;
}

static int parse_args(int argc, char **argv, struct gen_opts *o)
{
	static const struct option opts[] = {
		{ "src", required_argument, NULL, 's' }, { "data-dst", required_argument, NULL, 'd' },
		{ "stamp-dst", required_argument, NULL, 'D' }, { "stamp-share", required_argument, NULL, 'f' },
		{ "stamp-segs", required_argument, NULL, 'S' }, { "ssid", required_argument, NULL, 'i' },
		{ "data-port", required_argument, NULL, 'p' }, { "sport", required_argument, NULL, 'P' },
		{ "stamp-sport", required_argument, NULL, 'Q' }, { "payload", required_argument, NULL, 'l' },
		{ "rate", required_argument, NULL, 'r' }, { "seconds", required_argument, NULL, 't' },
		{ "batch", required_argument, NULL, 'b' }, { "netns", required_argument, NULL, 'N' },
		{ "cpu", required_argument, NULL, 'c' }, { "dev", required_argument, NULL, 'I' },
		{ "src-mac", required_argument, NULL, 'm' }, { "dst-mac", required_argument, NULL, 'M' },
		{ "data-dsts", required_argument, NULL, 'K' }, {},
	};
	const char *src = NULL, *data_dst = NULL, *stamp_dst = NULL;
	unsigned long long cpu;
	int opt, have_src_mac = 0, have_dst_mac = 0;

	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		int rc = 0;

		switch (opt) {
		case 's': src = optarg; break;
		case 'd': data_dst = optarg; break;
		case 'D': stamp_dst = optarg; break;
		case 'N': o->netns = optarg; break;
		case 'S': rc = parse_segs(optarg, o); break;
		case 'f': rc = parse_real("--stamp-share", optarg, 0.0, 1.0, &o->share); break;
		case 'r': rc = parse_real("--rate", optarg, 1.0, 1e8, &o->rate); break;
		case 't': rc = parse_real("--seconds", optarg, 0.01, 60.0, &o->seconds); break;
		case 'i': rc = parse_num("--ssid", optarg, 0, 65535, &o->ssid); break;
		case 'p': rc = parse_num("--data-port", optarg, 1, 65535, &o->data_port); break;
		case 'P': rc = parse_num("--sport", optarg, 1, 65535, &o->sport); break;
		case 'Q': rc = parse_num("--stamp-sport", optarg, 1, 65535, &o->stamp_sport); break;
		case 'l': rc = parse_num("--payload", optarg, 8, MAX_PAYLOAD, &o->payload); break;
		case 'b': rc = parse_num("--batch", optarg, 1, MAX_BATCH, &o->batch); break;
		case 'c': rc = parse_num("--cpu", optarg, 0, 1023, &cpu); o->cpu = (int)cpu; break;
		case 'I': o->dev = optarg; break;
		case 'm': rc = parse_mac("--src-mac", optarg, o->src_mac); have_src_mac = 1; break;
		case 'M': rc = parse_mac("--dst-mac", optarg, o->dst_mac); have_dst_mac = 1; break;
		case 'K': rc = parse_num("--data-dsts", optarg, 1, MAX_DATA_DSTS, &o->data_dsts); break;
		default: return 2;
		}
		if (rc)
			return rc;
	}
	if (optind < argc)
		return fail_usage("unexpected argument", argv[optind]);
	if (!src || inet_pton(AF_INET6, src, &o->src) != 1)
		return fail_usage("--src", src);
	if (!data_dst || inet_pton(AF_INET6, data_dst, &o->data_dst) != 1)
		return fail_usage("--data-dst", data_dst);
	if (stamp_dst) {
		if (inet_pton(AF_INET6, stamp_dst, &o->stamp_dst) != 1)
			return fail_usage("--stamp-dst", stamp_dst);
		o->have_stamp_dst = 1;
	}
	if (o->share > 0 && !o->have_stamp_dst)
		return fail_usage("--stamp-share > 0 needs --stamp-dst", "");
	if (o->rate == 0)
		return fail_usage("--rate", "(missing)");
	if (o->dev && (!have_src_mac || !have_dst_mac))
		return fail_usage("--dev needs --src-mac and --dst-mac", o->dev);
	if (o->data_dsts > 1 && !o->dev)
		return fail_usage("--data-dsts > 1 needs packet mode (--dev)", "");
	if (o->data_dsts > 1 && (uint16_t)(o->data_dst.s6_addr[14] << 8 | o->data_dst.s6_addr[15]) + o->data_dsts > 0x10000)
		return fail_usage("--data-dsts: the last 16 bits of --data-dst would wrap", data_dst);
	return 0;
}

static int enter_netns(const char *netns)
{
	char path[256];
	int nsfd;

	snprintf(path, sizeof(path), "/run/netns/%s", netns);
	nsfd = open(path, O_RDONLY);
	if (nsfd < 0 || setns(nsfd, CLONE_NEWNET)) {
		fprintf(stderr, "pktgen_udp: --netns: cannot enter %s: %s\n", path, strerror(errno));
		return -1;
	}
	close(nsfd);
	return 0;
}

/*
 * veth does not orphan the skb it forwards, so every packet still queued in
 * the lab counts against the generator socket's send buffer; with the default
 * (~208 KiB, a few hundred frames) sendmmsg() would block until the device
 * under test catches up, and the DUT's saturation would show up as a slower
 * generator instead of as loss. A traffic generator does not wait for the DUT.
 */
static void raise_sndbuf(int fd)
{
	int size = 64 << 20;

	if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &size, sizeof(size)))
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
}

static int open_socket(const struct in6_addr *src, int sport, const struct in6_addr *dst, int dport)
{
	struct sockaddr_in6 src_sa = { .sin6_family = AF_INET6, .sin6_addr = *src, .sin6_port = htons(sport) };
	struct sockaddr_in6 dst_sa = { .sin6_family = AF_INET6, .sin6_addr = *dst, .sin6_port = htons(dport) };
	int fd = socket(AF_INET6, SOCK_DGRAM, 0);

	if (fd >= 0)
		raise_sndbuf(fd);
	if (fd < 0 || bind(fd, (struct sockaddr *)&src_sa, sizeof(src_sa)) ||
	    connect(fd, (struct sockaddr *)&dst_sa, sizeof(dst_sa))) {
		fprintf(stderr, "pktgen_udp: socket/bind/connect port %d -> %d: %s\n", sport, dport, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

/* The SID list as an SRH on the socket (collectors/srh_sockopt.h says how Linux lays it out). */
static int set_srh(int fd, const struct gen_opts *o)
{
	int err = srh_sockopt_set(fd, &o->stamp_dst, o->segs, o->nsegs);

	if (err)
		fprintf(stderr, "pktgen_udp: setsockopt(IPV6_RTHDR, %d SIDs): %s\n", o->nsegs, strerror(-err));
	return err ? -1 : 0;
}

/* ---- packet mode: complete Ethernet frames on an AF_PACKET socket (no UDP/IPv6 stack cost in the
 * generator, so the generator outruns the device under test). */

static uint32_t sum16(const void *data, size_t len, uint32_t sum)
{
	const uint8_t *p = data;

	for (; len > 1; len -= 2, p += 2)
		sum += (uint32_t)p[0] << 8 | p[1];
	if (len)
		sum += (uint32_t)p[0] << 8;
	return sum;
}

static uint16_t fold(uint32_t sum)
{
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return (uint16_t)~sum ? (uint16_t)~sum : 0xffff;
}

/* Ethernet + IPv6 (+ SRH) + UDP headers; returns the offset of the UDP header. The UDP checksum's
 * pseudo-header uses the final destination (RFC 8200 §8.1), the SRH's segments[0]. */
static size_t build_headers(uint8_t *f, const struct gen_opts *o, const struct in6_addr *final_dst,
			    const struct in6_addr *segs, int nsegs, int sport, int dport, size_t payload,
			    uint32_t *csum_base)
{
	size_t srh_len = nsegs >= 0 ? 8 + 16 * (nsegs + 1) : 0, off = 14;
	uint16_t udp_len = 8 + payload;
	uint8_t *ip = f + 14;
	uint32_t sum = 0;

	memcpy(f, o->dst_mac, 6);
	memcpy(f + 6, o->src_mac, 6);
	f[12] = 0x86; f[13] = 0xdd;
	memset(ip, 0, 40);
	ip[0] = 0x60;
	ip[4] = (srh_len + udp_len) >> 8; ip[5] = (srh_len + udp_len) & 0xff;
	ip[6] = srh_len ? 43 : 17;
	ip[7] = 64;
	memcpy(ip + 8, &o->src, 16);
	off += 40;
	if (srh_len) {
		uint8_t *srh = f + off;

		srh[0] = 17; srh[1] = (srh_len - 8) / 8; srh[2] = SRH_TYPE_SEGMENT_ROUTING;
		srh[3] = nsegs; srh[4] = nsegs; srh[5] = 0; srh[6] = 0; srh[7] = 0;
		memcpy(srh + 8, final_dst, 16);
		for (int i = 0; i < nsegs; i++)               /* visiting order -> segments[n..1] */
			memcpy(srh + 8 + 16 * (nsegs - i), &segs[i], 16);
		memcpy(ip + 24, srh + 8 + 16 * nsegs, 16);    /* IPv6 dst = segments[segments_left] */
		off += srh_len;
	} else {
		memcpy(ip + 24, final_dst, 16);
	}
	f[off] = sport >> 8; f[off + 1] = sport & 0xff;
	f[off + 2] = dport >> 8; f[off + 3] = dport & 0xff;
	f[off + 4] = udp_len >> 8; f[off + 5] = udp_len & 0xff;
	f[off + 6] = f[off + 7] = 0;
	sum = sum16(&o->src, 16, sum);
	sum = sum16(final_dst, 16, sum);
	sum += udp_len + 17;
	sum = sum16(f + off, 8, sum);
	*csum_base = sum;
	return off;
}

static void set_udp_csum(uint8_t *frame, size_t udp_off, uint32_t base, size_t payload)
{
	uint16_t c = fold(sum16(frame + udp_off + 8, payload, base));

	frame[udp_off + 6] = c >> 8;
	frame[udp_off + 7] = c & 0xff;
}

static int open_packet_socket(struct gen_opts *o, struct batch_bufs *b)
{
	int fd = socket(AF_PACKET, SOCK_RAW, 0), one = 1;
	unsigned int ifindex = if_nametoindex(o->dev);
	struct stamp_sender_packet stamp = { .err_est = htons(STAMP_EE_Z), .ssid = htons(o->ssid) };
	uint32_t base;
	size_t off;

	if (fd < 0 || !ifindex) {
		fprintf(stderr, "pktgen_udp: AF_PACKET on %s: %s\n", o->dev, strerror(errno));
		return -1;
	}
	raise_sndbuf(fd);
	/* bypass the qdisc, as a NIC-level traffic generator would */
	setsockopt(fd, SOL_PACKET, PACKET_QDISC_BYPASS, &one, sizeof(one));
	b->ll = (struct sockaddr_ll){ .sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_IPV6),
				      .sll_ifindex = ifindex, .sll_halen = 6 };
	memcpy(b->ll.sll_addr, o->dst_mac, 6);
	for (unsigned int k = 0; k < o->data_dsts; k++) {
		/* destination k = --data-dst + k (in the last 16 bits; parse_args ruled out a wrap) */
		struct in6_addr dst = o->data_dst;
		uint16_t last = (dst.s6_addr[14] << 8 | dst.s6_addr[15]) + k;

		dst.s6_addr[14] = last >> 8;
		dst.s6_addr[15] = last & 0xff;
		off = build_headers(b->data_frame[k], o, &dst, NULL, -1, o->sport, o->data_port, o->payload, &base);
		memset(b->data_frame[k] + off + 8, 0, o->payload);
		set_udp_csum(b->data_frame[k], off, base, o->payload);
		b->data_frame_len = off + 8 + o->payload;
	}
	if (o->have_stamp_dst) {
		off = build_headers(b->stamp_frame[0], o, &o->stamp_dst, o->segs, o->nsegs, o->stamp_sport,
				    STAMP_PORT, sizeof(stamp), &b->stamp_csum_base);
		memcpy(b->stamp_frame[0] + off + 8, &stamp, sizeof(stamp));
		b->stamp_payload_off = off + 8;
		b->stamp_csum_off = off;
		b->stamp_frame_len = off + 8 + sizeof(stamp);
		for (unsigned int i = 1; i < MAX_BATCH; i++)
			memcpy(b->stamp_frame[i], b->stamp_frame[0], b->stamp_frame_len);
	}
	for (unsigned int i = 0; i < MAX_BATCH; i++) {
		/* data frames are identical (a static payload keeps the checksum valid without per-packet work) */
		b->data_iov[i] = (struct iovec){ .iov_base = b->data_frame[0], .iov_len = b->data_frame_len };
		b->stamp_iov[i] = (struct iovec){ .iov_base = b->stamp_frame[i], .iov_len = b->stamp_frame_len };
		b->data_msg[i].msg_hdr.msg_name = &b->ll;
		b->data_msg[i].msg_hdr.msg_namelen = sizeof(b->ll);
		b->stamp_msg[i].msg_hdr.msg_name = &b->ll;
		b->stamp_msg[i].msg_hdr.msg_namelen = sizeof(b->ll);
	}
	return fd;
}

static void fill_stamp_frames(struct batch_bufs *b, unsigned int n, uint32_t first_seq, uint32_t sec, uint32_t nsec)
{
	for (unsigned int i = 0; i < n; i++) {
		struct stamp_sender_packet *p = (void *)(b->stamp_frame[i] + b->stamp_payload_off);

		p->seq = htonl(first_seq + i);
		p->ts.sec = htonl(sec);
		p->ts.frac = htonl(nsec);
		set_udp_csum(b->stamp_frame[i], b->stamp_csum_off, b->stamp_csum_base, sizeof(*p));
	}
}

static void init_batch(struct batch_bufs *b, const struct gen_opts *o)
{
	memset(b, 0, sizeof(*b));
	for (unsigned int i = 0; i < MAX_BATCH; i++) {
		b->stamp[i].err_est = htons(STAMP_EE_Z);
		b->stamp[i].ssid = htons(o->ssid);
		b->data_iov[i] = (struct iovec){ .iov_base = b->data[i], .iov_len = o->payload };
		b->stamp_iov[i] = (struct iovec){ .iov_base = &b->stamp[i], .iov_len = sizeof(b->stamp[i]) };
		b->data_msg[i].msg_hdr.msg_iov = &b->data_iov[i];
		b->data_msg[i].msg_hdr.msg_iovlen = 1;
		b->stamp_msg[i].msg_hdr.msg_iov = &b->stamp_iov[i];
		b->stamp_msg[i].msg_hdr.msg_iovlen = 1;
	}
}

/*
 * sendmmsg until all n are handed to the kernel; returns how many were. A
 * packet socket gets ENOBUFS for a frame the veth dropped (the receiving CPU's
 * backlog was full): that frame was sent and lost in the device under test,
 * so it counts as sent (and in *xmit_drops), as for UDP sockets, where the
 * kernel hides ENOBUFS.
 */
static unsigned int send_all(int fd, struct mmsghdr *msgs, unsigned int n, uint64_t *errors, uint64_t *xmit_drops)
{
	unsigned int done = 0;

	while (done < n) {
		int rc = sendmmsg(fd, msgs + done, n - done, 0);

		if (rc < 0) {
			if (errno == ENOBUFS) {
				(*xmit_drops)++;
				done++;
				continue;
			}
			(*errors)++;
			if (errno != EAGAIN && errno != ECONNREFUSED && errno != EINTR) {
				fprintf(stderr, "pktgen_udp: sendmmsg: %s\n", strerror(errno));
				return done;
			}
			if (*errors > 1000000) {
				fprintf(stderr, "pktgen_udp: sendmmsg: too many transient errors\n");
				return done;
			}
			continue;
		}
		done += rc;
	}
	return done;
}

int main(int argc, char **argv)
{
	struct gen_opts o = { .data_port = 9, .sport = 40000, .stamp_sport = 40001, .ssid = 1,
			      .payload = 44, .batch = 16, .seconds = 1.0, .cpu = -1, .data_dsts = 1 };
	static struct batch_bufs b;
	uint64_t total, sent = 0, data_sent = 0, stamp_sent = 0, errors = 0, late = 0, xmit_drops = 0;
	uint64_t start, end, ns_per_pkt_num;
	int rc, data_fd, stamp_fd = -1;

	rc = parse_args(argc, argv, &o);
	if (rc)
		return rc;
	if (o.cpu >= 0) {
		cpu_set_t set;

		CPU_ZERO(&set);
		CPU_SET(o.cpu, &set);
		if (sched_setaffinity(0, sizeof(set), &set))
			fprintf(stderr, "pktgen_udp: --cpu %d: %s (continuing unpinned)\n", o.cpu, strerror(errno));
	}
	if (o.netns && enter_netns(o.netns))
		return 1;
	init_batch(&b, &o);
	if (o.dev) {
		data_fd = stamp_fd = open_packet_socket(&o, &b);
		if (data_fd < 0)
			return 1;
	} else {
		data_fd = open_socket(&o.src, o.sport, &o.data_dst, o.data_port);
		if (data_fd < 0)
			return 1;
		if (o.have_stamp_dst) {
			stamp_fd = open_socket(&o.src, o.stamp_sport, &o.stamp_dst, STAMP_PORT);
			if (stamp_fd < 0 || set_srh(stamp_fd, &o))
				return 1;
		}
	}
	total = (uint64_t)llround(o.rate * o.seconds);
	/* at most one batch per 100 us: low rates go out as single packets, not as bursts */
	if (o.batch > 1 && o.rate * 100e-6 < o.batch)
		o.batch = o.rate * 100e-6 < 1 ? 1 : (unsigned long long)(o.rate * 100e-6);
	ns_per_pkt_num = (uint64_t)llround(1e9 / o.rate * 1024);   /* 1/1024 ns resolution */
	start = clock_ns(CLOCK_MONOTONIC);
	while (sent < total) {
		uint64_t due = start + sent * ns_per_pkt_num / 1024;
		uint64_t n = o.batch < total - sent ? o.batch : total - sent;
		/* STAMP packets due so far: floor((sent + n) * share) */
		uint64_t stamp_target = (uint64_t)floor((double)(sent + n) * o.share + 1e-9);
		unsigned int n_stamp = stamp_target > stamp_sent ? stamp_target - stamp_sent : 0;
		unsigned int n_data, ok_data, ok_stamp = 0;
		uint32_t sec, nsec;

		if (n_stamp > n)
			n_stamp = n;
		n_data = n - n_stamp;
		if (clock_ns(CLOCK_MONOTONIC) > due + 1000000)
			late++;                          /* more than 1 ms behind schedule */
		else
			sleep_until_ns(due);
		stamp_ptp_from_ns(clock_ns(CLOCK_TAI), &sec, &nsec);
		if (o.dev) {
			fill_stamp_frames(&b, n_stamp, stamp_sent, sec, nsec);
			if (o.data_dsts > 1)        /* round robin: data packet j goes to destination j % K */
				for (unsigned int i = 0; i < n_data; i++)
					b.data_iov[i].iov_base = b.data_frame[(data_sent + i) % o.data_dsts];
		} else {
			for (unsigned int i = 0; i < n_data; i++)
				memcpy(b.data[i], &(uint64_t){ data_sent + i }, sizeof(uint64_t));
			for (unsigned int i = 0; i < n_stamp; i++) {
				b.stamp[i].seq = htonl(stamp_sent + i);
				b.stamp[i].ts.sec = htonl(sec);
				b.stamp[i].ts.frac = htonl(nsec);
			}
		}
		ok_data = send_all(data_fd, b.data_msg, n_data, &errors, &xmit_drops);
		if (n_stamp)
			ok_stamp = send_all(stamp_fd, b.stamp_msg, n_stamp, &errors, &xmit_drops);
		data_sent += ok_data;
		stamp_sent += ok_stamp;
		sent += ok_data + ok_stamp;
		if (ok_data < n_data || ok_stamp < n_stamp)
			break;                           /* a hard send error, already reported */
	}
	end = clock_ns(CLOCK_MONOTONIC);
	/* the last batch leaves at its due time, one interval before the schedule ends */
	if (sent == total && end - start < (uint64_t)(total * 1e9 / o.rate))
		end = start + (uint64_t)(total * 1e9 / o.rate);
	printf("{\"sent\": %llu, \"data_sent\": %llu, \"stamp_sent\": %llu, \"target_pps\": %.0f, "
	       "\"seconds\": %.6f, \"offered_pps\": %.0f, \"late_batches\": %llu, \"send_errors\": %llu, "
	       "\"xmit_drops\": %llu, \"data_dsts\": %llu}\n",
	       (unsigned long long)sent, (unsigned long long)data_sent, (unsigned long long)stamp_sent, o.rate,
	       (end - start) / 1e9, sent / ((end - start) / 1e9), (unsigned long long)late,
	       (unsigned long long)errors, (unsigned long long)xmit_drops, o.data_dsts);
	close(data_fd);
	if (stamp_fd >= 0 && stamp_fd != data_fd)
		close(stamp_fd);
	return sent == total ? 0 : 1;
}
