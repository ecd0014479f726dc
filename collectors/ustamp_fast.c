// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * ustamp fast path: the per-packet path of the user-space STAMP
 * Session-Reflector in C, loaded by collectors/ustamp/fast.py (ctypes) into
 * the `python -m collectors.ustamp reflector` process. ustamp_fast.h has the
 * contract; collectors/ustamp/README.md the behaviour.
 *
 * N worker threads, each with its own UDP socket in one SO_REUSEPORT group on
 * [address]:port; a classic BPF program on the group picks the worker of each
 * datagram (ufast_steering). A worker reads up to `batch` datagrams with one
 * recvmmsg() (SO_TIMESTAMPNS = T2, IPV6_HOPLIMIT, IPV6_PKTINFO, IPV6_TCLASS
 * per datagram), answers the 44-byte base packets of unauthenticated
 * sessions itself and sends the replies with sendmmsg(): T3 = CLOCK_TAI read
 * right before each sendmmsg() of at most `send_batch` replies. Replies of
 * sessions with return SIDs get the session's SRH as the socket's sticky
 * IPV6_RTHDR (the kernel takes a type-4 SRH only that way), so a batch is
 * sent in runs that share one SRH, the installed one first.
 *
 * Everything else of a known session (TLVs, authenticated packets, IPv4
 * senders) goes with its receive metadata to a bounded queue that the
 * Python implementation (collectors/ustamp/reflector.py) drains: the same
 * code as the pure-Python reflector decides and answers those, from a socket
 * of the same group that the BPF program never selects.
 *
 * Session state that both sides touch lives here: the stateful Sequence
 * Number (one atomic counter per session, so numbers stay unique and gap-free
 * across workers and Python) and the per-sender Direct Measurement / Follow-Up
 * Telemetry state (a locked LRU table per session, updated by the workers for
 * every reply they send, so a later TLV packet of the same sender reports
 * counts that include the fast-path packets). Session tables are immutable
 * and replaced as a whole (SIGHUP): a worker announces the table it reads in
 * a hazard pointer, and the old table is freed when no worker holds it.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "stamp_test_packet.h"
#include "stamp_timestamp.h"
#include "srh_sockopt.h"
#include "ustamp_fast.h"

#define AUTH_BASE_LEN 112          /* RFC 8762 §4.2.2 authenticated base packet */
#define AUTH_SSID_OFF 26           /* RFC 8972 §3: its SSID */
#define BASE_SSID_OFF 14
#define REPLY_WORDS (STAMP_BASE_LEN / 4)
#define RX_CTRL_LEN 256            /* timestamp, hop limit, pktinfo, tclass */
#define TX_CTRL_LEN CMSG_SPACE(sizeof(struct in6_pktinfo))
/*
 * What a reply's msg_controllen says: the one cmsg without its trailing
 * padding (36 bytes). The kernel copies up to 36 bytes of control data onto
 * its stack in sendmsg() and kmallocs anything longer, once per datagram.
 */
#define TX_CTRL_USED CMSG_LEN(sizeof(struct in6_pktinfo))
#define IDLE_WAKEUP_MS 200         /* an idle worker looks at the stop flag this often */
#define SLOW_QUEUE_MAX_ENTRIES 8192
#define SLOW_QUEUE_MAX_BYTES (32u << 20)

#ifndef SO_MEMINFO
#define SO_MEMINFO 55
#endif
#define SK_MEMINFO_DROPS 8
#define SK_MEMINFO_VARS 9

static const char *const counter_names[UFAST_NR_COUNTERS] = {
	[UFAST_C_RECEIVED] = "received",
	[UFAST_C_REFLECTED] = "reflected",
	[UFAST_C_UNKNOWN_SESSION] = "unknown_session",
	[UFAST_C_MALFORMED_SHORT] = "malformed_short",
	[UFAST_C_AUTH_FAILED] = "auth_failed",
	[UFAST_C_SEND_ERROR] = "send_error",
	[UFAST_C_SLOW_PATH_QUEUE_FULL] = "slow_path_queue_full",
	[UFAST_C_NO_KERNEL_TIMESTAMP] = "no_kernel_timestamp",
	[UFAST_C_SLOW_PATH] = "slow_path",
	[UFAST_C_SRH_SWITCHES] = "srh_switches",
	[UFAST_C_BATCHES] = "batches",
};

/* ---- per-session state: stateful seq and the senders' LRU table ------------------------ */

struct peer {
	struct in6_addr addr;
	uint16_t port;
	uint32_t hash;
	struct ufast_peer_view v;
	int32_t newer, older;         /* LRU list; -1 = none */
	int32_t next_in_bucket;       /* chain; -1 = end */
};

struct ufast_sstate {
	_Atomic uint32_t next_seq;    /* Sequence Number of the next stateful reply */
	_Atomic int refs;             /* Python's handle + every table that holds it */
	pthread_mutex_t lock;         /* the peer table below */
	struct peer *peers;
	int32_t *buckets;
	uint32_t cap, n, nbuckets;
	int32_t newest, oldest;
	uint64_t peers_forgotten;     /* senders dropped by the UFAST_MAX_PEERS bound */
};

static uint32_t peer_hash(const struct in6_addr *a, uint16_t port)
{
	uint32_t w[4];
	uint64_t h;

	memcpy(w, a, sizeof(w));
	h = ((uint64_t)(w[0] ^ w[2]) << 32 | (w[1] ^ w[3])) ^ port;
	h *= 0x9E3779B97F4A7C15ULL;
	return (uint32_t)(h >> 32);
}

static void lru_unlink(struct ufast_sstate *s, int32_t i)
{
	struct peer *p = &s->peers[i];

	if (p->newer >= 0)
		s->peers[p->newer].older = p->older;
	else
		s->newest = p->older;
	if (p->older >= 0)
		s->peers[p->older].newer = p->newer;
	else
		s->oldest = p->newer;
	p->newer = p->older = -1;
}

static void lru_push_newest(struct ufast_sstate *s, int32_t i)
{
	struct peer *p = &s->peers[i];

	p->newer = -1;
	p->older = s->newest;
	if (s->newest >= 0)
		s->peers[s->newest].newer = i;
	s->newest = i;
	if (s->oldest < 0)
		s->oldest = i;
}

static void bucket_unlink(struct ufast_sstate *s, int32_t i)
{
	int32_t *link = &s->buckets[s->peers[i].hash & (s->nbuckets - 1)];

	while (*link != i)
		link = &s->peers[*link].next_in_bucket;
	*link = s->peers[i].next_in_bucket;
}

static void bucket_link(struct ufast_sstate *s, int32_t i)
{
	int32_t *head = &s->buckets[s->peers[i].hash & (s->nbuckets - 1)];

	s->peers[i].next_in_bucket = *head;
	*head = i;
}

/* Room for more senders: entries and buckets double (up to UFAST_MAX_PEERS). false: no memory. */
static bool peers_grow(struct ufast_sstate *s)
{
	uint32_t cap = s->cap ? s->cap * 2 : 8;
	struct peer *peers;
	int32_t *buckets;

	if (cap > UFAST_MAX_PEERS)
		cap = UFAST_MAX_PEERS;
	peers = realloc(s->peers, cap * sizeof(*peers));
	if (!peers)
		return false;
	s->peers = peers;
	buckets = malloc(2 * cap * sizeof(*buckets));
	if (!buckets)
		return false;
	free(s->buckets);
	s->buckets = buckets;
	s->nbuckets = 2 * cap;
	for (uint32_t i = 0; i < s->nbuckets; i++)
		s->buckets[i] = -1;
	for (uint32_t i = 0; i < s->n; i++)
		bucket_link(s, (int32_t)i);
	s->cap = cap;
	return true;
}

/*
 * This sender's entry, made the most recently used; created empty if `create`
 * (the least recently used sender is forgotten when the table is full). NULL
 * if not found (or no memory). Caller holds s->lock.
 */
static struct peer *peer_touch(struct ufast_sstate *s, const struct in6_addr *addr, uint16_t port, bool create)
{
	uint32_t h = peer_hash(addr, port);
	int32_t i;

	if (s->nbuckets) {
		for (i = s->buckets[h & (s->nbuckets - 1)]; i >= 0; i = s->peers[i].next_in_bucket) {
			struct peer *p = &s->peers[i];

			if (p->hash == h && p->port == port && !memcmp(&p->addr, addr, sizeof(*addr))) {
				if (create && s->newest != i) {
					lru_unlink(s, i);
					lru_push_newest(s, i);
				}
				return p;
			}
		}
	}
	if (!create)
		return NULL;
	if (s->n == s->cap && s->cap < UFAST_MAX_PEERS && !peers_grow(s))
		return NULL;
	if (s->n < s->cap) {
		i = (int32_t)s->n++;
	} else {   /* full: reuse the least recently seen sender's entry */
		i = s->oldest;
		lru_unlink(s, i);
		bucket_unlink(s, i);
		s->peers_forgotten++;
	}
	memset(&s->peers[i], 0, sizeof(s->peers[i]));
	s->peers[i].addr = *addr;
	s->peers[i].port = port;
	s->peers[i].hash = h;
	s->peers[i].newer = s->peers[i].older = -1;
	bucket_link(s, i);
	lru_push_newest(s, i);
	return &s->peers[i];
}

struct ufast_sstate *ufast_sstate_new(void)
{
	struct ufast_sstate *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	atomic_init(&s->next_seq, 0);
	atomic_init(&s->refs, 1);
	pthread_mutex_init(&s->lock, NULL);
	s->newest = s->oldest = -1;
	return s;
}

static void sstate_get(struct ufast_sstate *s)
{
	atomic_fetch_add(&s->refs, 1);
}

void ufast_sstate_put(struct ufast_sstate *s)
{
	if (!s || atomic_fetch_sub(&s->refs, 1) != 1)
		return;
	pthread_mutex_destroy(&s->lock);
	free(s->peers);
	free(s->buckets);
	free(s);
}

/* The next stateful Sequence Number (taken: every caller gets its own). */
uint32_t ufast_take_seq(struct ufast_sstate *s)
{
	return atomic_fetch_add(&s->next_seq, 1);
}

uint32_t ufast_peek_seq(struct ufast_sstate *s)
{
	return atomic_load(&s->next_seq);
}

/* A test packet of this sender reached the reply stage: count it; *out = its state now. */
void ufast_peer_received(struct ufast_sstate *s, const uint8_t *addr, uint16_t port, struct ufast_peer_view *out)
{
	struct peer *p;

	pthread_mutex_lock(&s->lock);
	p = peer_touch(s, (const struct in6_addr *)addr, port, true);
	if (p) {
		p->v.rx_count++;
		*out = p->v;
	} else {
		memset(out, 0, sizeof(*out));
	}
	pthread_mutex_unlock(&s->lock);
}

/* A reply went to this sender: R_TxC and the Follow-Up Telemetry of its next reply. */
void ufast_peer_replied(struct ufast_sstate *s, const uint8_t *addr, uint16_t port, uint32_t seq,
			uint32_t t3_sec, uint32_t t3_frac)
{
	struct peer *p;

	pthread_mutex_lock(&s->lock);
	p = peer_touch(s, (const struct in6_addr *)addr, port, false);
	if (p) {
		p->v.tx_count++;
		p->v.prev_seq = seq;
		p->v.prev_t3_sec = t3_sec;
		p->v.prev_t3_frac = t3_frac;
	}
	pthread_mutex_unlock(&s->lock);
}

/* This sender's state without counting anything; 0 if it is not remembered. */
int ufast_peer_get(struct ufast_sstate *s, const uint8_t *addr, uint16_t port, struct ufast_peer_view *out)
{
	struct peer *p;

	pthread_mutex_lock(&s->lock);
	p = peer_touch(s, (const struct in6_addr *)addr, port, false);
	if (p)
		*out = p->v;
	pthread_mutex_unlock(&s->lock);
	return p != NULL;
}

uint64_t ufast_sstate_peers_forgotten(struct ufast_sstate *s)
{
	uint64_t n;

	pthread_mutex_lock(&s->lock);
	n = s->peers_forgotten;
	pthread_mutex_unlock(&s->lock);
	return n;
}

/* ---- session tables ------------------------------------------------------------------------ */

struct session {
	struct in6_addr sender;       /* :: = any sender */
	uint16_t ssid;
	uint32_t flags;               /* UFAST_SESS_* */
	int srh_len;                  /* 0: no return SIDs (plain address swap) */
	struct srh_sockopt srh;       /* the sticky IPV6_RTHDR of its replies */
	struct ufast_sstate *state;
	bool used;
};

struct ufast_table {
	struct session *sessions;
	int n, cap;                   /* cap: open-addressing slots, a power of two >= 2n */
	bool any_authenticated;
};

static uint32_t session_hash(const struct in6_addr *sender, uint16_t ssid)
{
	return peer_hash(sender, ssid);
}

struct ufast_table *ufast_table_new(int n)
{
	struct ufast_table *t;
	int cap = 8;

	if (n < 0 || n > (1 << 20))
		return NULL;
	while (cap < 2 * n)
		cap *= 2;
	t = calloc(1, sizeof(*t));
	if (!t)
		return NULL;
	t->sessions = calloc((size_t)cap, sizeof(*t->sessions));
	if (!t->sessions) {
		free(t);
		return NULL;
	}
	t->cap = cap;
	return t;
}

void ufast_table_free(struct ufast_table *t)
{
	if (!t)
		return;
	for (int i = 0; i < t->cap; i++)
		if (t->sessions[i].used)
			ufast_sstate_put(t->sessions[i].state);
	free(t->sessions);
	free(t);
}

/*
 * Add a session: sender (16 bytes, :: = any), SSID, UFAST_SESS_* flags,
 * n_sids return SIDs (16 bytes each, visiting order), its state (the table
 * takes a reference). 0, or -EINVAL (bad argument, duplicate, table full).
 */
int ufast_table_add(struct ufast_table *t, const uint8_t *sender, uint16_t ssid, uint32_t flags, int n_sids,
		    const uint8_t *sids, struct ufast_sstate *state)
{
	struct in6_addr addr;
	uint32_t slot;
	struct session *s;

	if (!t || !state || n_sids < 0 || n_sids > UFAST_MAX_SIDS || 2 * (t->n + 1) > t->cap)
		return -EINVAL;
	memcpy(&addr, sender, sizeof(addr));
	for (slot = session_hash(&addr, ssid) & (uint32_t)(t->cap - 1); t->sessions[slot].used;
	     slot = (slot + 1) & (uint32_t)(t->cap - 1)) {
		if (t->sessions[slot].ssid == ssid && !memcmp(&t->sessions[slot].sender, &addr, sizeof(addr)))
			return -EINVAL;
	}
	s = &t->sessions[slot];
	s->sender = addr;
	s->ssid = ssid;
	s->flags = flags;
	s->srh_len = 0;
	if (n_sids) {
		struct in6_addr segs[UFAST_MAX_SIDS];

		memcpy(segs, sids, (size_t)n_sids * sizeof(struct in6_addr));
		s->srh_len = srh_sockopt_build(&s->srh, &in6addr_any, segs, n_sids);
		if (s->srh_len < 0)
			return -EINVAL;
	}
	s->state = state;
	sstate_get(state);
	s->used = true;
	t->n++;
	t->any_authenticated |= !!(flags & UFAST_SESS_AUTHENTICATED);
	return 0;
}

static const struct session *lookup_exact(const struct ufast_table *t, const struct in6_addr *sender, uint16_t ssid)
{
	uint32_t mask = (uint32_t)(t->cap - 1);

	for (uint32_t slot = session_hash(sender, ssid) & mask; t->sessions[slot].used; slot = (slot + 1) & mask) {
		const struct session *s = &t->sessions[slot];

		if (s->ssid == ssid && !memcmp(&s->sender, sender, sizeof(*sender)))
			return s;
	}
	return NULL;
}

/* (sender, ssid), then (::, ssid): the lookup order of sessions.py and the XDP reflector. */
static const struct session *lookup_session(const struct ufast_table *t, const struct in6_addr *sender, uint16_t ssid)
{
	const struct session *s = lookup_exact(t, sender, ssid);

	return s ? s : lookup_exact(t, &in6addr_any, ssid);
}

/* ---- the queue to Python --------------------------------------------------------------------- */

struct slow_entry {
	uint8_t *data;
	uint32_t len;
	struct ufast_rx_meta meta;
};

struct slow_queue {
	pthread_mutex_t lock;
	struct slow_entry *ring;
	uint32_t head, count;
	size_t bytes;
	int efd;                      /* eventfd: Python's select() wakes up on it */
};

/* ---- the reflector --------------------------------------------------------------------------- */

struct worker {
	struct ufast *u;
	int idx;
	int fd;
	pthread_t thread;
	bool started;
	_Atomic(struct ufast_table *) hazard;   /* the table this worker reads now, or NULL */
	_Atomic uint32_t counters_seq;          /* seqcount: odd while counters are written */
	_Atomic uint64_t counters[UFAST_NR_COUNTERS];
	int srh_len;                            /* the socket's sticky IPV6_RTHDR (0: none) */
	struct srh_sockopt srh;
	int reported_errno;                     /* the last send errno printed (one line per new errno) */
	/* receive batch */
	struct mmsghdr *rx;
	struct iovec *rx_iov;
	struct sockaddr_in6 *rx_name;
	uint8_t *rx_ctrl;
	uint8_t *rx_buf;
	/* replies of a batch */
	uint32_t (*reply)[REPLY_WORDS];
	const struct session **reply_sess;
	uint8_t *reply_done;
	uint8_t *reply_has_src;                 /* an IPV6_PKTINFO source in its tx_ctrl slot */
	struct mmsghdr *tx;
	struct iovec *tx_iov;
	struct sockaddr_in6 *tx_name;
	uint8_t *tx_ctrl;
	int *run;                               /* reply indexes of one sendmmsg() */
};

struct ufast {
	int nworkers;
	int batch, send_batch;
	uint16_t port;
	struct worker workers[UFAST_MAX_WORKERS];
	_Atomic(struct ufast_table *) table;
	_Atomic uint64_t clock;       /* tai_offset_s << 32 | ee_ptp << 16 | ee_ntp */
	_Atomic bool stop;
	struct slow_queue slow;
	bool running;
};

static void set_err(char *err, size_t errlen, const char *fmt, const char *what, int e)
{
	if (err && errlen)
		snprintf(err, errlen, fmt, what, strerror(e));
}

const char *ufast_counter_name(int i)
{
	return i >= 0 && i < UFAST_NR_COUNTERS ? counter_names[i] : NULL;
}

int ufast_nr_counters(void)
{
	return UFAST_NR_COUNTERS;
}

int ufast_sizeof_rx_meta(void)
{
	return (int)sizeof(struct ufast_rx_meta);
}

int ufast_sizeof_peer_view(void)
{
	return (int)sizeof(struct ufast_peer_view);
}

/* Tai-UTC offset and the Error Estimates per format (host order, Z set per format). */
void ufast_set_clock(struct ufast *u, int32_t tai_offset_s, uint16_t ee_ptp, uint16_t ee_ntp)
{
	atomic_store(&u->clock, (uint64_t)(uint32_t)tai_offset_s << 32 | (uint64_t)ee_ptp << 16 | ee_ntp);
}

/*
 * The steering program (classic BPF, run by the kernel on the UDP payload of
 * each datagram for the group): returns the worker index.
 */
static int attach_steering(int fd, int nworkers, int steering)
{
	struct sock_filter by_session[] = {
		/* A = the IPv6 source address folded to 32 bits, xor the SSID (payload octets 14-15) */
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, (uint32_t)SKF_NET_OFF + 8),
		BPF_STMT(BPF_MISC | BPF_TAX, 0),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, (uint32_t)SKF_NET_OFF + 12),
		BPF_STMT(BPF_ALU | BPF_XOR | BPF_X, 0),
		BPF_STMT(BPF_MISC | BPF_TAX, 0),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, (uint32_t)SKF_NET_OFF + 16),
		BPF_STMT(BPF_ALU | BPF_XOR | BPF_X, 0),
		BPF_STMT(BPF_MISC | BPF_TAX, 0),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, (uint32_t)SKF_NET_OFF + 20),
		BPF_STMT(BPF_ALU | BPF_XOR | BPF_X, 0),
		BPF_STMT(BPF_MISC | BPF_TAX, 0),
		BPF_STMT(BPF_LD | BPF_H | BPF_ABS, BASE_SSID_OFF),
		BPF_STMT(BPF_ALU | BPF_XOR | BPF_X, 0),
		/* mix (a multiplicative hash keeps its good bits on top), then pick a worker */
		BPF_STMT(BPF_ALU | BPF_MUL | BPF_K, 0x9E3779B1u),
		BPF_STMT(BPF_ALU | BPF_RSH | BPF_K, 16),
		BPF_STMT(BPF_ALU | BPF_MOD | BPF_K, (uint32_t)nworkers),
		BPF_STMT(BPF_RET | BPF_A, 0),
	};
	struct sock_filter by_packet[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, (uint32_t)SKF_AD_OFF + SKF_AD_RANDOM),
		BPF_STMT(BPF_ALU | BPF_MOD | BPF_K, (uint32_t)nworkers),
		BPF_STMT(BPF_RET | BPF_A, 0),
	};
	struct sock_fprog prog = steering == UFAST_STEER_PACKET
		? (struct sock_fprog){ .len = sizeof(by_packet) / sizeof(by_packet[0]), .filter = by_packet }
		: (struct sock_fprog){ .len = sizeof(by_session) / sizeof(by_session[0]), .filter = by_session };

	return setsockopt(fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &prog, sizeof(prog));
}

static int open_socket(const struct sockaddr_in6 *sa, int rcvbuf, char *err, size_t errlen)
{
	static const struct {
		int level, name, value;
		const char *what;
	} opts[] = {
		{ SOL_SOCKET, SO_REUSEADDR, 1, "SO_REUSEADDR" },
		{ SOL_SOCKET, SO_REUSEPORT, 1, "SO_REUSEPORT" },
		{ SOL_SOCKET, SO_TIMESTAMPNS, 1, "SO_TIMESTAMPNS" },
		{ IPPROTO_IPV6, IPV6_RECVHOPLIMIT, 1, "IPV6_RECVHOPLIMIT" },
		{ IPPROTO_IPV6, IPV6_RECVPKTINFO, 1, "IPV6_RECVPKTINFO" },
		{ IPPROTO_IPV6, IPV6_RECVTCLASS, 1, "IPV6_RECVTCLASS" },
		/* RFC 8762 §4.3: replies leave with hop limit 255 (sticky, not a cmsg per reply) */
		{ IPPROTO_IPV6, IPV6_UNICAST_HOPS, 255, "IPV6_UNICAST_HOPS" },
	};
	struct timeval idle = { .tv_sec = 0, .tv_usec = IDLE_WAKEUP_MS * 1000 };
	int fd = socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);

	if (fd < 0) {
		set_err(err, errlen, "%s: %s", "socket", errno);
		return -1;
	}
	for (size_t i = 0; i < sizeof(opts) / sizeof(opts[0]); i++) {
		if (setsockopt(fd, opts[i].level, opts[i].name, &opts[i].value, sizeof(int))) {
			set_err(err, errlen, "setsockopt %s: %s", opts[i].what, errno);
			close(fd);
			return -1;
		}
	}
	if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &idle, sizeof(idle))) {
		set_err(err, errlen, "setsockopt %s: %s", "SO_RCVTIMEO", errno);
		close(fd);
		return -1;
	}
	/* FORCE (root/CAP_NET_ADMIN) may exceed net.core.rmem_max; else the capped request */
	if (rcvbuf > 0 && setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof(rcvbuf)) &&
	    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf))) {
		set_err(err, errlen, "setsockopt %s: %s", "SO_RCVBUF", errno);
		close(fd);
		return -1;
	}
	if (bind(fd, (const struct sockaddr *)sa, sizeof(*sa))) {
		set_err(err, errlen, "%s: %s", "bind", errno);
		close(fd);
		return -1;
	}
	return fd;
}

static bool worker_alloc(struct worker *w, int batch)
{
	size_t b = (size_t)batch;

	w->rx = calloc(b, sizeof(*w->rx));
	w->rx_iov = calloc(b, sizeof(*w->rx_iov));
	w->rx_name = calloc(b, sizeof(*w->rx_name));
	w->rx_ctrl = calloc(b, RX_CTRL_LEN);
	w->rx_buf = malloc(b * UFAST_MAX_DATAGRAM);   /* untouched pages stay unbacked */
	w->reply = calloc(b, sizeof(*w->reply));
	w->reply_sess = calloc(b, sizeof(*w->reply_sess));
	w->reply_done = calloc(b, 1);
	w->reply_has_src = calloc(b, 1);
	w->tx = calloc(b, sizeof(*w->tx));
	w->tx_iov = calloc(b, sizeof(*w->tx_iov));
	w->tx_name = calloc(b, sizeof(*w->tx_name));
	w->tx_ctrl = calloc(b, TX_CTRL_LEN);
	w->run = calloc(b, sizeof(*w->run));
	return w->rx && w->rx_iov && w->rx_name && w->rx_ctrl && w->rx_buf && w->reply && w->reply_sess &&
	       w->reply_done && w->reply_has_src && w->tx && w->tx_iov && w->tx_name && w->tx_ctrl && w->run;
}

static void worker_free(struct worker *w)
{
	free(w->rx);
	free(w->rx_iov);
	free(w->rx_name);
	free(w->rx_ctrl);
	free(w->rx_buf);
	free(w->reply);
	free(w->reply_sess);
	free(w->reply_done);
	free(w->reply_has_src);
	free(w->tx);
	free(w->tx_iov);
	free(w->tx_name);
	free(w->tx_ctrl);
	free(w->run);
}

void ufast_close(struct ufast *u);

/* Can a socket without SO_REUSEADDR/SO_REUSEPORT bind there (nobody else holds the port)? */
static bool port_free(const struct sockaddr_in6 *sa)
{
	int fd = socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	bool free_port;

	if (fd < 0)
		return true;   /* the workers' own bind will say what is wrong */
	free_port = !bind(fd, (const struct sockaddr *)sa, sizeof(*sa)) || errno != EADDRINUSE;
	close(fd);
	return free_port;
}

/*
 * Open `nworkers` sockets on [addr]:port (16-byte address, port 0 = any
 * free port, the same for all) in one SO_REUSEPORT group with the steering
 * program. Python's own socket joins the group afterwards (never selected:
 * the program returns indexes < nworkers). NULL with *err set on failure.
 */
struct ufast *ufast_open(const uint8_t *addr, uint16_t port, int nworkers, int steering, int batch, int send_batch,
			 int rcvbuf, char *err, size_t errlen)
{
	struct sockaddr_in6 sa = { .sin6_family = AF_INET6, .sin6_port = htons(port) };
	struct ufast *u;

	if (nworkers < 1 || nworkers > UFAST_MAX_WORKERS || batch < 1 || batch > UFAST_MAX_BATCH || send_batch < 1 ||
	    (steering != UFAST_STEER_SESSION && steering != UFAST_STEER_PACKET)) {
		set_err(err, errlen, "%s: %s", "ufast_open", EINVAL);
		return NULL;
	}
	u = calloc(1, sizeof(*u));
	if (!u) {
		set_err(err, errlen, "%s: %s", "ufast_open", ENOMEM);
		return NULL;
	}
	u->nworkers = nworkers;
	u->batch = batch;
	u->send_batch = send_batch < batch ? send_batch : batch;
	pthread_mutex_init(&u->slow.lock, NULL);
	u->slow.efd = -1;
	for (int i = 0; i < nworkers; i++)
		u->workers[i].fd = -1;
	u->slow.ring = calloc(SLOW_QUEUE_MAX_ENTRIES, sizeof(*u->slow.ring));
	u->slow.efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (!u->slow.ring || u->slow.efd < 0) {
		set_err(err, errlen, "%s: %s", "slow-path queue", u->slow.ring ? errno : ENOMEM);
		ufast_close(u);
		return NULL;
	}
	memcpy(&sa.sin6_addr, addr, sizeof(sa.sin6_addr));
	if (port && !port_free(&sa)) {
		/* joining someone else's SO_REUSEPORT group would split the traffic without a word */
		if (err && errlen)
			snprintf(err, errlen, "bind: port %u is already in use (another reflector?)", port);
		ufast_close(u);
		return NULL;
	}
	for (int i = 0; i < nworkers; i++) {
		struct worker *w = &u->workers[i];

		w->u = u;
		w->idx = i;
		if (!worker_alloc(w, batch)) {
			set_err(err, errlen, "%s: %s", "worker buffers", ENOMEM);
			ufast_close(u);
			return NULL;
		}
		w->fd = open_socket(&sa, rcvbuf, err, errlen);
		if (w->fd < 0) {
			ufast_close(u);
			return NULL;
		}
		if (i == 0) {   /* port 0: every other socket joins the port the first one got */
			socklen_t len = sizeof(sa);

			getsockname(w->fd, (struct sockaddr *)&sa, &len);
			u->port = ntohs(sa.sin6_port);
		}
	}
	if (attach_steering(u->workers[0].fd, nworkers, steering)) {
		set_err(err, errlen, "setsockopt %s: %s", "SO_ATTACH_REUSEPORT_CBPF", errno);
		ufast_close(u);
		return NULL;
	}
	return u;
}

int ufast_port(struct ufast *u)
{
	return u->port;
}

int ufast_slow_fd(struct ufast *u)
{
	return u->slow.efd;
}

int ufast_workers(struct ufast *u)
{
	return u->nworkers;
}

/* ---- one batch ------------------------------------------------------------------------------ */

struct rx_meta {
	int64_t rx_realtime_ns;
	int32_t hop_limit;
	int32_t tclass;
	uint32_t ifindex;
	bool has_local;
	struct in6_addr local;
};

static void parse_cmsgs(struct msghdr *mh, struct rx_meta *m)
{
	memset(m, 0, sizeof(*m));
	m->rx_realtime_ns = -1;
	m->hop_limit = -1;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_TIMESTAMPNS &&
		    c->cmsg_len >= CMSG_LEN(sizeof(struct timespec))) {
			struct timespec ts;

			memcpy(&ts, CMSG_DATA(c), sizeof(ts));
			m->rx_realtime_ns = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
		} else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_HOPLIMIT &&
			   c->cmsg_len >= CMSG_LEN(sizeof(int))) {
			memcpy(&m->hop_limit, CMSG_DATA(c), sizeof(int));
		} else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO &&
			   c->cmsg_len >= CMSG_LEN(sizeof(struct in6_pktinfo))) {
			struct in6_pktinfo pi;

			memcpy(&pi, CMSG_DATA(c), sizeof(pi));
			m->local = pi.ipi6_addr;
			m->ifindex = pi.ipi6_ifindex;
			m->has_local = true;
		} else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_TCLASS &&
			   c->cmsg_len >= CMSG_LEN(sizeof(int))) {
			memcpy(&m->tclass, CMSG_DATA(c), sizeof(int));
		}
	}
}

static uint64_t clock_ns(clockid_t clk)
{
	struct timespec ts;

	clock_gettime(clk, &ts);
	return (uint64_t)ts.tv_sec * STAMP_NS_PER_SEC + (uint64_t)ts.tv_nsec;
}

/* Timestamp words (big-endian) of a TAI time, as clock.encode_ts() writes them. */
static void ts_words(uint32_t *w, uint64_t tai_ns, bool ntp, int32_t tai_offset_s)
{
	uint32_t sec, frac;

	if (ntp) {
		if (stamp_ntp_from_tai_ns(tai_ns, tai_offset_s, &sec, &frac))
			sec = frac = 0;   /* before 1970: not a time this machine has */
	} else {
		stamp_ptp_from_tai_ns(tai_ns, &sec, &frac);
	}
	w[0] = htonl(sec);
	w[1] = htonl(frac);
}

/* Hand a datagram to Python. false: the queue is full (the caller counts it). */
static bool slow_push(struct ufast *u, const uint8_t *data, uint32_t len, const struct rx_meta *m,
		      const struct sockaddr_in6 *from, int worker)
{
	struct slow_queue *q = &u->slow;
	struct slow_entry *e;
	uint8_t *copy;

	pthread_mutex_lock(&q->lock);
	if (q->count == SLOW_QUEUE_MAX_ENTRIES || q->bytes + len > SLOW_QUEUE_MAX_BYTES) {
		pthread_mutex_unlock(&q->lock);
		return false;
	}
	pthread_mutex_unlock(&q->lock);
	copy = malloc(len ? len : 1);
	if (!copy)
		return false;
	memcpy(copy, data, len);
	pthread_mutex_lock(&q->lock);
	if (q->count == SLOW_QUEUE_MAX_ENTRIES || q->bytes + len > SLOW_QUEUE_MAX_BYTES) {
		pthread_mutex_unlock(&q->lock);
		free(copy);
		return false;
	}
	e = &q->ring[(q->head + q->count) % SLOW_QUEUE_MAX_ENTRIES];
	e->data = copy;
	e->len = len;
	memset(&e->meta, 0, sizeof(e->meta));
	e->meta.rx_realtime_ns = m->rx_realtime_ns;
	e->meta.hop_limit = m->hop_limit;
	e->meta.tclass = m->tclass;
	e->meta.ifindex = m->ifindex;
	e->meta.has_local_addr = m->has_local;
	if (m->has_local)
		memcpy(e->meta.local_addr, &m->local, 16);
	memcpy(e->meta.peer_addr, &from->sin6_addr, 16);
	e->meta.peer_port = ntohs(from->sin6_port);
	e->meta.peer_scope_id = from->sin6_scope_id;
	e->meta.worker = (uint8_t)worker;
	q->count++;
	q->bytes += len;
	pthread_mutex_unlock(&q->lock);
	return true;
}

/*
 * The next datagram for Python: copies it into buf (buflen >= its length,
 * UFAST_MAX_DATAGRAM always is) and its metadata into *meta. Returns its
 * length, or -1 if the queue is empty.
 */
int ufast_slow_pop(struct ufast *u, uint8_t *buf, uint32_t buflen, struct ufast_rx_meta *meta)
{
	struct slow_queue *q = &u->slow;
	struct slow_entry e;

	pthread_mutex_lock(&q->lock);
	if (!q->count) {
		pthread_mutex_unlock(&q->lock);
		return -1;
	}
	e = q->ring[q->head];
	q->head = (q->head + 1) % SLOW_QUEUE_MAX_ENTRIES;
	q->count--;
	q->bytes -= e.len;
	pthread_mutex_unlock(&q->lock);
	memcpy(buf, e.data, e.len < buflen ? e.len : buflen);
	*meta = e.meta;
	free(e.data);
	return (int)e.len;
}

static struct ufast_table *hazard_acquire(struct worker *w)
{
	struct ufast_table *t;

	for (;;) {
		t = atomic_load(&w->u->table);
		atomic_store(&w->hazard, t);
		if (atomic_load(&w->u->table) == t)
			return t;
	}
}

static void hazard_release(struct worker *w)
{
	atomic_store(&w->hazard, NULL);
}

/*
 * Seqcount writer: odd while the counters change. Release stores (no fences:
 * ThreadSanitizer models these) keep every counter store after the odd
 * sequence and the even one after them.
 */
static void commit_counters(struct worker *w, const uint64_t *delta)
{
	uint32_t s = atomic_load_explicit(&w->counters_seq, memory_order_relaxed);

	atomic_store_explicit(&w->counters_seq, s + 1, memory_order_relaxed);
	for (int i = 0; i < UFAST_NR_COUNTERS; i++) {
		if (delta[i]) {
			uint64_t v = atomic_load_explicit(&w->counters[i], memory_order_relaxed);

			atomic_store_explicit(&w->counters[i], v + delta[i], memory_order_release);
		}
	}
	atomic_store_explicit(&w->counters_seq, s + 2, memory_order_release);
}

/* One worker's counters, read consistently (seqcount reader: acquire loads, no fences). */
static void worker_counters(struct worker *w, uint64_t *out)
{
	uint32_t s1, s2;

	do {
		s1 = atomic_load_explicit(&w->counters_seq, memory_order_acquire);
		for (int k = 0; k < UFAST_NR_COUNTERS; k++)
			out[k] = atomic_load_explicit(&w->counters[k], memory_order_acquire);
		s2 = atomic_load_explicit(&w->counters_seq, memory_order_acquire);
	} while ((s1 & 1) || s1 != s2);
}

/* Worker i's counters (UFAST_NR_COUNTERS values); -EINVAL for a worker that does not exist. */
int ufast_worker_counters(struct ufast *u, int i, uint64_t *out)
{
	if (i < 0 || i >= u->nworkers)
		return -EINVAL;
	worker_counters(&u->workers[i], out);
	return 0;
}

/* Sums of every worker's counters, each worker's read consistently. */
void ufast_counters(struct ufast *u, uint64_t *out)
{
	memset(out, 0, UFAST_NR_COUNTERS * sizeof(*out));
	for (int i = 0; i < u->nworkers; i++) {
		uint64_t snap[UFAST_NR_COUNTERS];

		worker_counters(&u->workers[i], snap);
		for (int k = 0; k < UFAST_NR_COUNTERS; k++)
			out[k] += snap[k];
	}
}

/* Datagrams the kernel dropped at the workers' sockets (receive buffer full, bad checksum). */
uint64_t ufast_socket_drops(struct ufast *u)
{
	uint64_t drops = 0;

	for (int i = 0; i < u->nworkers; i++) {
		uint32_t mem[SK_MEMINFO_VARS] = { 0 };
		socklen_t len = sizeof(mem);

		if (!getsockopt(u->workers[i].fd, SOL_SOCKET, SO_MEMINFO, mem, &len) &&
		    len > SK_MEMINFO_DROPS * sizeof(uint32_t))
			drops += mem[SK_MEMINFO_DROPS];
	}
	return drops;
}

static void report_send_error(struct worker *w, const struct sockaddr_in6 *to, int e)
{
	char addr[INET6_ADDRSTRLEN];

	if (e == w->reported_errno)
		return;   /* counted (send_error); one line per new errno, not one per datagram */
	w->reported_errno = e;
	inet_ntop(AF_INET6, &to->sin6_addr, addr, sizeof(addr));
	fprintf(stderr, "ustamp reflector: worker %d: sendmmsg to [%s]:%u: %s (counted as send_error)\n", w->idx,
		addr, ntohs(to->sin6_port), strerror(e));
}

static bool same_srh(const struct worker *w, const struct session *s)
{
	return w->srh_len == s->srh_len && (!s->srh_len || !memcmp(&w->srh, &s->srh, (size_t)s->srh_len));
}

/* Make the socket's sticky IPV6_RTHDR the session's return path (or none). */
static int install_srh(struct worker *w, const struct session *s, uint64_t *delta)
{
	int rc;

	if (same_srh(w, s))
		return 0;
	if (s->srh_len)
		rc = setsockopt(w->fd, IPPROTO_IPV6, IPV6_RTHDR, &s->srh, (socklen_t)s->srh_len);
	else
		rc = setsockopt(w->fd, IPPROTO_IPV6, IPV6_RTHDR, NULL, 0);
	if (rc)
		return -errno;
	w->srh_len = s->srh_len;
	if (s->srh_len)
		memcpy(&w->srh, &s->srh, (size_t)s->srh_len);
	delta[UFAST_C_SRH_SWITCHES]++;
	return 0;
}

/*
 * Send one run of replies (same SRH): T3 right before sendmmsg() into each,
 * a failed datagram counted and skipped. sent[i] says which went out.
 */
static void send_run(struct worker *w, int nrun, int32_t tai_offset_s, uint64_t *delta, uint8_t *sent)
{
	int done = 0;

	while (done < nrun) {
		int n = nrun - done;
		uint64_t t3;
		int rc;

		for (int k = 0; k < n; k++) {
			int r = w->run[done + k];

			w->tx[k].msg_hdr.msg_name = &w->tx_name[r];
			w->tx[k].msg_hdr.msg_namelen = sizeof(w->tx_name[r]);
			w->tx[k].msg_hdr.msg_iov = &w->tx_iov[r];
			w->tx[k].msg_hdr.msg_iovlen = 1;
			w->tx[k].msg_hdr.msg_control = w->reply_has_src[r] ? w->tx_ctrl + (size_t)r * TX_CTRL_LEN : NULL;
			w->tx[k].msg_hdr.msg_controllen = w->reply_has_src[r] ? TX_CTRL_USED : 0;
			w->tx[k].msg_hdr.msg_flags = 0;
		}
		t3 = clock_ns(CLOCK_TAI);   /* T3: the last thing before the datagrams leave */
		for (int k = 0; k < n; k++) {
			int r = w->run[done + k];

			ts_words(&w->reply[r][1], t3, w->reply_sess[r]->flags & UFAST_SESS_NTP, tai_offset_s);
		}
		rc = sendmmsg(w->fd, w->tx, (unsigned int)n, 0);
		if (rc < 0) {   /* the first one failed: count it, go on with the next */
			int r = w->run[done];

			delta[UFAST_C_SEND_ERROR]++;
			report_send_error(w, &w->tx_name[r], errno);
			done++;
			continue;
		}
		for (int k = 0; k < rc; k++)
			sent[w->run[done + k]] = 1;
		delta[UFAST_C_REFLECTED] += (uint64_t)rc;
		done += rc;
	}
}

/* Send the batch's replies: the run that needs no SRH switch first, then one run per SRH. */
static void send_replies(struct worker *w, int nrep, int32_t tai_offset_s, uint64_t *delta, uint8_t *sent)
{
	int left = nrep;

	memset(w->reply_done, 0, (size_t)nrep);
	while (left) {
		const struct session *pick = NULL;
		int nrun = 0, rc;

		for (int r = 0; r < nrep && !pick; r++)
			if (!w->reply_done[r] && same_srh(w, w->reply_sess[r]))
				pick = w->reply_sess[r];
		for (int r = 0; r < nrep && !pick; r++)
			if (!w->reply_done[r])
				pick = w->reply_sess[r];
		rc = install_srh(w, pick, delta);
		if (rc) {   /* these replies cannot take their return path: counted, not sent */
			fprintf(stderr, "ustamp reflector: worker %d: setsockopt(IPV6_RTHDR): %s (counted as send_error)\n",
				w->idx, strerror(-rc));
			for (int r = 0; r < nrep; r++) {
				const struct session *s = w->reply_sess[r];

				if (!w->reply_done[r] && s->srh_len == pick->srh_len &&
				    (!s->srh_len || !memcmp(&s->srh, &pick->srh, (size_t)s->srh_len))) {
					w->reply_done[r] = 1;
					left--;
					delta[UFAST_C_SEND_ERROR]++;
				}
			}
			continue;
		}
		for (int r = 0; r < nrep; r++) {
			if (!w->reply_done[r] && same_srh(w, w->reply_sess[r])) {
				w->reply_done[r] = 1;
				w->run[nrun++] = r;
				left--;
				if (nrun == w->u->send_batch) {
					send_run(w, nrun, tai_offset_s, delta, sent);
					nrun = 0;
				}
			}
		}
		if (nrun)
			send_run(w, nrun, tai_offset_s, delta, sent);
	}
}

/* Per-sender state of every reply attempt (rx count; tx count, seq and T3 of the sent ones). */
static void update_peers(struct worker *w, int nrep, const uint8_t *sent)
{
	struct ufast_sstate *locked = NULL;

	for (int r = 0; r < nrep; r++) {
		struct ufast_sstate *s = w->reply_sess[r]->state;
		struct peer *p;

		if (s != locked) {
			if (locked)
				pthread_mutex_unlock(&locked->lock);
			pthread_mutex_lock(&s->lock);
			locked = s;
		}
		p = peer_touch(s, &w->tx_name[r].sin6_addr, ntohs(w->tx_name[r].sin6_port), true);
		if (!p)
			continue;
		p->v.rx_count++;
		if (sent[r]) {
			p->v.tx_count++;
			p->v.prev_seq = ntohl(w->reply[r][0]);
			p->v.prev_t3_sec = ntohl(w->reply[r][1]);
			p->v.prev_t3_frac = ntohl(w->reply[r][2]);
		}
	}
	if (locked)
		pthread_mutex_unlock(&locked->lock);
}

/* RFC 8762 §4.3.1 reflector packet from the sender's base packet `in` (T3 comes later). */
static void build_reply(uint32_t *out, const uint8_t *in, const struct session *s, uint64_t t2_tai,
			uint32_t ttl, uint64_t clk)
{
	bool ntp = s->flags & UFAST_SESS_NTP;
	int32_t tai_offset_s = (int32_t)(uint32_t)(clk >> 32);
	uint16_t ee = ntp ? (uint16_t)clk : (uint16_t)(clk >> 16);
	uint32_t in_w[REPLY_WORDS];
	uint32_t seq;

	memcpy(in_w, in, sizeof(in_w));
	seq = (s->flags & UFAST_SESS_STATEFUL) ? atomic_fetch_add(&s->state->next_seq, 1) : ntohl(in_w[0]);
	out[0] = htonl(seq);
	out[1] = out[2] = 0;
	out[3] = htonl((uint32_t)ee << 16 | (ntohl(in_w[3]) & 0xffff));   /* our Error Estimate, the SSID */
	ts_words(&out[4], t2_tai, ntp, tai_offset_s);
	out[6] = in_w[0];                                                 /* Session-Sender seq, T1, EE */
	out[7] = in_w[1];
	out[8] = in_w[2];
	out[9] = htonl(ntohl(in_w[3]) & 0xffff0000);
	out[10] = htonl((ttl & 0xff) << 24);
}

static void process_batch(struct worker *w, int n)
{
	struct ufast *u = w->u;
	uint64_t delta[UFAST_NR_COUNTERS] = { 0 };
	uint8_t sent[UFAST_MAX_BATCH];
	uint64_t clk = atomic_load(&u->clock);
	int32_t tai_offset_s = (int32_t)(uint32_t)(clk >> 32);
	struct ufast_table *t = hazard_acquire(w);
	bool handed = false;
	int nrep = 0;

	delta[UFAST_C_BATCHES] = 1;
	for (int i = 0; i < n; i++) {
		const uint8_t *p = w->rx_buf + (size_t)i * UFAST_MAX_DATAGRAM;
		const struct sockaddr_in6 *from = &w->rx_name[i];
		uint32_t len = w->rx[i].msg_len;
		const struct session *s;
		struct rx_meta m;
		uint64_t t2;
		int r;

		parse_cmsgs(&w->rx[i].msg_hdr, &m);
		if (len < STAMP_BASE_LEN) {
			delta[UFAST_C_RECEIVED]++;
			delta[UFAST_C_MALFORMED_SHORT]++;
			continue;
		}
		if (len > STAMP_BASE_LEN || IN6_IS_ADDR_V4MAPPED(&from->sin6_addr)) {
			/* TLVs, authenticated packets, IPv4 senders: Python answers what a session wants */
			if (len >= AUTH_BASE_LEN && t->any_authenticated) {
				s = lookup_session(t, &from->sin6_addr, (uint16_t)(p[AUTH_SSID_OFF] << 8 | p[AUTH_SSID_OFF + 1]));
				if (s && (s->flags & UFAST_SESS_AUTHENTICATED))
					goto hand_over;
			}
			s = lookup_session(t, &from->sin6_addr, (uint16_t)(p[BASE_SSID_OFF] << 8 | p[BASE_SSID_OFF + 1]));
			if (!s) {
				delta[UFAST_C_RECEIVED]++;
				delta[UFAST_C_UNKNOWN_SESSION]++;
				continue;
			}
			if (s->flags & UFAST_SESS_AUTHENTICATED) {   /* an unauthenticated packet for it */
				delta[UFAST_C_RECEIVED]++;
				delta[UFAST_C_AUTH_FAILED]++;
				continue;
			}
hand_over:
			if (slow_push(u, p, len, &m, from, w->idx)) {
				delta[UFAST_C_SLOW_PATH]++;
				handed = true;
			} else {
				delta[UFAST_C_RECEIVED]++;
				delta[UFAST_C_SLOW_PATH_QUEUE_FULL]++;
			}
			continue;
		}
		s = lookup_session(t, &from->sin6_addr, (uint16_t)(p[BASE_SSID_OFF] << 8 | p[BASE_SSID_OFF + 1]));
		delta[UFAST_C_RECEIVED]++;
		if (!s) {
			delta[UFAST_C_UNKNOWN_SESSION]++;
			continue;
		}
		if (s->flags & UFAST_SESS_AUTHENTICATED) {
			delta[UFAST_C_AUTH_FAILED]++;
			continue;
		}
		if (m.rx_realtime_ns >= 0) {
			t2 = (uint64_t)(m.rx_realtime_ns + (int64_t)tai_offset_s * (int64_t)STAMP_NS_PER_SEC);
		} else {   /* no kernel stamp (should not happen): the clock now, counted */
			delta[UFAST_C_NO_KERNEL_TIMESTAMP]++;
			t2 = clock_ns(CLOCK_TAI);
		}
		r = nrep++;
		build_reply(w->reply[r], p, s, t2, m.hop_limit >= 0 ? (uint32_t)m.hop_limit : 0, clk);
		w->reply_sess[r] = s;
		w->tx_name[r] = *from;
		w->tx_name[r].sin6_flowinfo = 0;
		w->tx_iov[r].iov_base = w->reply[r];
		w->tx_iov[r].iov_len = STAMP_BASE_LEN;
		w->reply_has_src[r] = m.has_local;
		if (m.has_local) {   /* the reply's source = the address the test packet was sent to */
			struct cmsghdr *c = (struct cmsghdr *)(w->tx_ctrl + (size_t)r * TX_CTRL_LEN);
			struct in6_pktinfo pi = { .ipi6_addr = m.local, .ipi6_ifindex = 0 };

			c->cmsg_level = IPPROTO_IPV6;
			c->cmsg_type = IPV6_PKTINFO;
			c->cmsg_len = CMSG_LEN(sizeof(pi));
			memcpy(CMSG_DATA(c), &pi, sizeof(pi));
		}
	}
	if (nrep) {
		memset(sent, 0, (size_t)nrep);
		send_replies(w, nrep, tai_offset_s, delta, sent);
		update_peers(w, nrep, sent);
	}
	hazard_release(w);
	commit_counters(w, delta);
	if (handed) {
		uint64_t one = 1;

		if (write(u->slow.efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
			fprintf(stderr, "ustamp reflector: worker %d: eventfd: %s\n", w->idx, strerror(errno));
	}
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct ufast *u = w->u;

	for (int i = 0; i < u->batch; i++) {
		w->rx_iov[i].iov_base = w->rx_buf + (size_t)i * UFAST_MAX_DATAGRAM;
		w->rx_iov[i].iov_len = UFAST_MAX_DATAGRAM;
	}
	while (!atomic_load_explicit(&u->stop, memory_order_relaxed)) {
		int n;

		for (int i = 0; i < u->batch; i++) {
			struct msghdr *mh = &w->rx[i].msg_hdr;

			mh->msg_name = &w->rx_name[i];
			mh->msg_namelen = sizeof(w->rx_name[i]);
			mh->msg_iov = &w->rx_iov[i];
			mh->msg_iovlen = 1;
			mh->msg_control = w->rx_ctrl + (size_t)i * RX_CTRL_LEN;
			mh->msg_controllen = RX_CTRL_LEN;
			mh->msg_flags = 0;
		}
		/* blocks for the first datagram (at most IDLE_WAKEUP_MS), takes what is queued after it */
		n = recvmmsg(w->fd, w->rx, (unsigned int)u->batch, MSG_WAITFORONE, NULL);
		if (n <= 0) {
			if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
				fprintf(stderr, "ustamp reflector: worker %d: recvmmsg: %s\n", w->idx, strerror(errno));
				usleep(10000);
			}
			continue;
		}
		process_batch(w, n);
	}
	return NULL;
}

/* Publish a new session table (the reflector takes it); the old one is freed once no worker reads it. */
void ufast_publish(struct ufast *u, struct ufast_table *t)
{
	struct ufast_table *old = atomic_exchange(&u->table, t);

	if (!old)
		return;
	for (int i = 0; i < u->nworkers; i++)
		while (atomic_load(&u->workers[i].hazard) == old)
			sched_yield();   /* a worker is inside one batch: microseconds */
	ufast_table_free(old);
}

/* Start the workers (a table must be published). 0 or -errno. */
int ufast_start(struct ufast *u)
{
	sigset_t all, old;
	int rc = 0;

	if (!atomic_load(&u->table))
		return -EINVAL;
	/* workers take no signals: Python's handlers run in its main thread */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	for (int i = 0; i < u->nworkers; i++) {
		rc = -pthread_create(&u->workers[i].thread, NULL, worker_main, &u->workers[i]);
		if (rc)
			break;
		u->workers[i].started = true;
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	u->running = true;
	return rc;
}

/* Stop and join the workers (within IDLE_WAKEUP_MS); queued slow-path datagrams stay for ufast_slow_pop. */
void ufast_stop(struct ufast *u)
{
	atomic_store(&u->stop, true);
	for (int i = 0; i < u->nworkers; i++) {
		if (u->workers[i].started) {
			pthread_join(u->workers[i].thread, NULL);
			u->workers[i].started = false;
		}
	}
	u->running = false;
}

void ufast_close(struct ufast *u)
{
	if (!u)
		return;
	if (u->running)
		ufast_stop(u);
	for (int i = 0; i < u->nworkers; i++) {
		if (u->workers[i].fd >= 0)
			close(u->workers[i].fd);
		worker_free(&u->workers[i]);
	}
	ufast_table_free(atomic_load(&u->table));
	while (u->slow.ring && u->slow.count) {
		free(u->slow.ring[u->slow.head].data);
		u->slow.head = (u->slow.head + 1) % SLOW_QUEUE_MAX_ENTRIES;
		u->slow.count--;
	}
	free(u->slow.ring);
	if (u->slow.efd >= 0)
		close(u->slow.efd);
	pthread_mutex_destroy(&u->slow.lock);
	free(u);
}
