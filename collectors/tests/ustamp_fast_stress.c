// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * White-box test of the ustamp fast path (collectors/ustamp_fast.c, included
 * here), built twice: with AddressSanitizer + UndefinedBehaviorSanitizer and
 * with ThreadSanitizer (make -C collectors ustamp-fast-tests; run by
 * tests/ustamp/test_ustamp_fast_c.py inside a fresh network namespace, on ::1).
 *
 *   - the per-session sender table: LRU order and bound, counts, no entry
 *     created by a reply;
 *   - session tables: exact before any-sender lookup, duplicates and too many
 *     SIDs refused;
 *   - the workers under concurrency: 4 workers with packet steering, sender
 *     threads flooding one stateful session while the main thread takes
 *     numbers from the same counter (what Python's path does), publishes new
 *     tables, reads counters and drains the queue to Python: every stateful
 *     number is handed out exactly once, received = the sum of the outcomes,
 *     every datagram handed over is popped once, no data race (TSan), no
 *     memory error (ASan).
 * Prints one JSON line of figures; exit 1 on any failed check.
 */
#include "../ustamp_fast.c"

#include <netinet/in.h>

#define SENDERS 3
#define PER_SENDER 40000
#define TLV_EVERY 16           /* one datagram in 16 carries a TLV: the queue to Python */
#define TEST_PORT 48620
#define STATEFUL_SSID 1

static int failures;

#define CHECK(cond, ...)                                                        \
	do {                                                                    \
		if (!(cond)) {                                                  \
			failures++;                                             \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);    \
			fprintf(stderr, __VA_ARGS__);                           \
			fputc('\n', stderr);                                    \
		}                                                               \
	} while (0)

static void addr_of(uint8_t *a, unsigned int i)
{
	memset(a, 0, 16);
	a[0] = 0xfc;
	a[14] = (uint8_t)(i >> 8);
	a[15] = (uint8_t)i;
}

static void test_peer_table(void)
{
	struct ufast_sstate *s = ufast_sstate_new();
	struct ufast_peer_view v;
	uint8_t a[16];

	for (unsigned int i = 0; i < UFAST_MAX_PEERS + 10; i++) {
		addr_of(a, i);
		ufast_peer_received(s, a, 1000, &v);
		CHECK(v.rx_count == 1 && v.tx_count == 0, "peer %u: rx %u tx %u", i, v.rx_count, v.tx_count);
	}
	CHECK(ufast_sstate_peers_forgotten(s) == 10, "forgotten %lu", (unsigned long)ufast_sstate_peers_forgotten(s));
	addr_of(a, 9);
	CHECK(!ufast_peer_get(s, a, 1000, &v), "the 10th oldest sender is still remembered");
	addr_of(a, 10);
	CHECK(ufast_peer_get(s, a, 1000, &v) && v.rx_count == 1, "sender 10 lost");
	ufast_peer_received(s, a, 1000, &v);   /* 10 is now the most recently seen */
	CHECK(v.rx_count == 2, "rx %u", v.rx_count);
	addr_of(a, 60000);
	ufast_peer_received(s, a, 1000, &v);   /* full: forgets the oldest, 11 (not 10) */
	addr_of(a, 11);
	CHECK(!ufast_peer_get(s, a, 1000, &v), "sender 11 should have been forgotten");
	addr_of(a, 10);
	CHECK(ufast_peer_get(s, a, 1000, &v) && v.rx_count == 2, "sender 10 forgotten instead of 11");
	ufast_peer_replied(s, a, 1000, 77, 5, 6);
	CHECK(ufast_peer_get(s, a, 1000, &v) && v.tx_count == 1 && v.prev_seq == 77 && v.prev_t3_sec == 5 &&
		      v.prev_t3_frac == 6, "replied not recorded");
	CHECK(ufast_peer_get(s, a, 1001, &v) == 0, "another port is another sender");
	ufast_peer_replied(s, a, 1001, 1, 1, 1);   /* a reply never creates a sender */
	CHECK(ufast_peer_get(s, a, 1001, &v) == 0, "a reply created a sender");
	ufast_sstate_put(s);
}

static void test_tables(void)
{
	struct ufast_table *t = ufast_table_new(3);
	struct ufast_sstate *s1 = ufast_sstate_new(), *s2 = ufast_sstate_new();
	uint8_t any[16] = { 0 }, sender[16], sids[17 * 16] = { 0 };
	struct in6_addr a;

	addr_of(sender, 1);
	CHECK(!ufast_table_add(t, any, 5, 0, 0, sids, s1), "any-sender session refused");
	CHECK(!ufast_table_add(t, sender, 5, UFAST_SESS_NTP, 2, sids, s2), "exact session refused");
	CHECK(ufast_table_add(t, sender, 5, 0, 0, sids, s2) == -EINVAL, "duplicate accepted");
	CHECK(ufast_table_add(t, sender, 6, 0, 17, sids, s2) == -EINVAL, "17 SIDs accepted");
	CHECK(!t->any_authenticated, "no authenticated session yet");
	CHECK(!ufast_table_add(t, any, 7, UFAST_SESS_AUTHENTICATED, 0, sids, s1), "authenticated refused");
	CHECK(t->any_authenticated, "authenticated session not noted");
	memcpy(&a, sender, 16);
	CHECK(lookup_session(t, &a, 5) && lookup_session(t, &a, 5)->state == s2, "exact lookup");
	addr_of(sender, 2);
	memcpy(&a, sender, 16);
	CHECK(lookup_session(t, &a, 5) && lookup_session(t, &a, 5)->state == s1, "any-sender lookup");
	CHECK(!lookup_session(t, &a, 6), "unknown SSID found");
	CHECK(lookup_session(t, &a, 5)->srh_len == 0, "any-sender session has an SRH");
	memcpy(&a, sender, 16);
	ufast_sstate_put(s1);   /* the table holds its own references */
	ufast_sstate_put(s2);
	ufast_table_free(t);
}

struct sender_arg {
	int idx;
	uint64_t sent, replies;
	uint32_t *seqs;            /* reflector seqs of the stateful replies */
	uint64_t nseqs;
	uint64_t drops;
	_Atomic int done;
};

static void *sender_main(void *p)
{
	struct sender_arg *s = p;
	struct sockaddr_in6 dst = { .sin6_family = AF_INET6, .sin6_port = htons(TEST_PORT), .sin6_addr = IN6ADDR_LOOPBACK_INIT };
	int fd = socket(AF_INET6, SOCK_DGRAM, 0), big = 64 << 20;
	uint8_t pkt[64] = { 0 }, reply[2048];
	struct timeval tv = { .tv_sec = 1 };

	setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof(big));
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	for (uint32_t i = 0; i < PER_SENDER; i++) {
		size_t len = STAMP_BASE_LEN;

		pkt[0] = (uint8_t)(i >> 24), pkt[1] = (uint8_t)(i >> 16), pkt[2] = (uint8_t)(i >> 8), pkt[3] = (uint8_t)i;
		pkt[BASE_SSID_OFF + 1] = STATEFUL_SSID;
		if (i % TLV_EVERY == 0) {   /* an Extra Padding TLV: the datagram goes to "Python" */
			pkt[44] = 0x80, pkt[45] = 1, pkt[46] = 0, pkt[47] = 4;
			len += 8;
		}
		if (sendto(fd, pkt, len, 0, (struct sockaddr *)&dst, sizeof(dst)) == (ssize_t)len)
			s->sent++;
	}
	for (;;) {
		ssize_t n = recv(fd, reply, sizeof(reply), 0);

		if (n < 0)
			break;
		s->replies++;
		if (n == STAMP_BASE_LEN)
			s->seqs[s->nseqs++] = ntohl(*(uint32_t *)reply);
	}
	{
		uint32_t mem[SK_MEMINFO_VARS] = { 0 };
		socklen_t ml = sizeof(mem);

		getsockopt(fd, SOL_SOCKET, SO_MEMINFO, mem, &ml);
		s->drops = mem[SK_MEMINFO_DROPS];
	}
	close(fd);
	atomic_store(&s->done, 1);
	return NULL;
}

static struct ufast_table *make_table(struct ufast_sstate *stateful, int variant)
{
	struct ufast_table *t = ufast_table_new(2);
	uint8_t any[16] = { 0 }, sids[16] = { 0 };

	sids[15] = 1;   /* ::1: a return "SID" that is us, so the replies still come back */
	ufast_table_add(t, any, STATEFUL_SSID, UFAST_SESS_STATEFUL | (variant & 1 ? UFAST_SESS_NTP : 0), variant & 2 ? 1 : 0,
			sids, stateful);
	return t;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

static void test_workers(void)
{
	uint8_t lo[16] = { 0 };
	char err[256] = "";
	struct ufast *u;
	struct ufast_sstate *stateful = ufast_sstate_new();
	struct sender_arg args[SENDERS];
	pthread_t threads[SENDERS];
	uint32_t *taken = calloc(SENDERS * PER_SENDER, sizeof(uint32_t)), *all;
	uint64_t ntaken = 0, popped = 0, publishes = 0, total = 0, counters[UFAST_NR_COUNTERS];
	uint8_t *buf = malloc(UFAST_MAX_DATAGRAM);
	struct ufast_rx_meta meta;
	int running;

	lo[15] = 1;
	u = ufast_open(lo, TEST_PORT, 4, UFAST_STEER_PACKET, 64, 16, 0, err, sizeof(err));
	CHECK(u != NULL, "ufast_open: %s", err);
	if (!u)
		return;
	ufast_set_clock(u, 37, STAMP_EE_Z | 1, 1);
	ufast_publish(u, make_table(stateful, 0));
	CHECK(ufast_start(u) == 0, "start");
	for (int i = 0; i < SENDERS; i++) {
		args[i] = (struct sender_arg){ .idx = i, .seqs = calloc(PER_SENDER, sizeof(uint32_t)) };
		pthread_create(&threads[i], NULL, sender_main, &args[i]);
	}
	/* meanwhile, what Python does: its own numbers, new tables, counters, the queue */
	do {
		running = 0;
		for (int k = 0; k < 64; k++) {
			int n = ufast_slow_pop(u, buf, UFAST_MAX_DATAGRAM, &meta);

			if (n < 0)
				break;
			popped++;
			CHECK(n == STAMP_BASE_LEN + 8 && meta.peer_port && meta.rx_realtime_ns > 0, "handed over: %d bytes", n);
			taken[ntaken++] = ufast_take_seq(stateful);   /* Python answers it: one number */
		}
		ufast_publish(u, make_table(stateful, (int)(publishes++ & 3)));
		ufast_counters(u, counters);
		CHECK(counters[UFAST_C_RECEIVED] >= counters[UFAST_C_REFLECTED], "received < reflected");
		for (int i = 0; i < SENDERS; i++)
			running += !atomic_load(&args[i].done);
		if (running)
			usleep(500);
	} while (running);
	for (int i = 0; i < SENDERS; i++)
		pthread_join(threads[i], NULL);
	ufast_stop(u);
	while (ufast_slow_pop(u, buf, UFAST_MAX_DATAGRAM, &meta) >= 0) {
		popped++;
		taken[ntaken++] = ufast_take_seq(stateful);
	}
	ufast_counters(u, counters);
	{
		uint64_t sent = 0, drops = ufast_socket_drops(u), n = ntaken, receiver_drops = 0;

		for (int i = 0; i < SENDERS; i++) {
			sent += args[i].sent;
			n += args[i].nseqs;
			receiver_drops += args[i].drops;
		}
		all = malloc(n * sizeof(uint32_t));
		memcpy(all, taken, ntaken * sizeof(uint32_t));
		total = ntaken;
		for (int i = 0; i < SENDERS; i++) {
			memcpy(all + total, args[i].seqs, args[i].nseqs * sizeof(uint32_t));
			total += args[i].nseqs;
		}
		qsort(all, total, sizeof(uint32_t), cmp_u32);
		for (uint64_t i = 0; i < total; i++)
			if (all[i] != i) {
				CHECK(0, "stateful numbers: position %lu holds %u", (unsigned long)i, all[i]);
				break;
			}
		CHECK(ufast_peek_seq(stateful) == total, "counter at %u, %lu numbers seen", ufast_peek_seq(stateful),
		      (unsigned long)total);
		CHECK(receiver_drops == 0, "the senders' sockets dropped %lu replies", (unsigned long)receiver_drops);
		CHECK(counters[UFAST_C_RECEIVED] + counters[UFAST_C_SLOW_PATH] + drops == sent,
		      "received %lu + handed %lu + socket drops %lu != sent %lu", (unsigned long)counters[UFAST_C_RECEIVED],
		      (unsigned long)counters[UFAST_C_SLOW_PATH], (unsigned long)drops, (unsigned long)sent);
		CHECK(counters[UFAST_C_RECEIVED] == counters[UFAST_C_REFLECTED] + counters[UFAST_C_SLOW_PATH_QUEUE_FULL],
		      "received %lu != reflected %lu + queue full %lu", (unsigned long)counters[UFAST_C_RECEIVED],
		      (unsigned long)counters[UFAST_C_REFLECTED], (unsigned long)counters[UFAST_C_SLOW_PATH_QUEUE_FULL]);
		CHECK(popped == counters[UFAST_C_SLOW_PATH], "popped %lu, handed %lu", (unsigned long)popped,
		      (unsigned long)counters[UFAST_C_SLOW_PATH]);
		CHECK(n - ntaken == counters[UFAST_C_REFLECTED], "replies seen %lu, reflected %lu",
		      (unsigned long)(n - ntaken), (unsigned long)counters[UFAST_C_REFLECTED]);
		for (int w = 0; w < 4; w++) {
			uint64_t wc[UFAST_NR_COUNTERS];

			ufast_worker_counters(u, w, wc);
			CHECK(wc[UFAST_C_REFLECTED] > 0, "worker %d answered nothing", w);
		}
		printf("{\"sent\": %lu, \"reflected\": %lu, \"handed_to_python\": %lu, \"queue_full\": %lu, "
		       "\"socket_drops\": %lu, \"publishes\": %lu, \"stateful_numbers\": %lu, \"srh_switches\": %lu}\n",
		       (unsigned long)sent, (unsigned long)counters[UFAST_C_REFLECTED],
		       (unsigned long)counters[UFAST_C_SLOW_PATH], (unsigned long)counters[UFAST_C_SLOW_PATH_QUEUE_FULL],
		       (unsigned long)drops, (unsigned long)publishes, (unsigned long)total,
		       (unsigned long)counters[UFAST_C_SRH_SWITCHES]);
	}
	ufast_close(u);
	ufast_sstate_put(stateful);
	for (int i = 0; i < SENDERS; i++)
		free(args[i].seqs);
	free(taken);
	free(all);
	free(buf);
}

int main(void)
{
	test_peer_table();
	test_tables();
	test_workers();
	if (failures)
		fprintf(stderr, "%d checks failed\n", failures);
	return failures ? 1 : 0;
}
