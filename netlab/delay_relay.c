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
 *  - --keep-awake: one SCHED_IDLE spinning thread per CPU, named "keep-awake".
 *    On VMs whose idle vCPUs halt (HLT, no cpuidle polling), the host takes
 *    milliseconds to wake a halted vCPU for our timer: measured here, an idle
 *    2-vCPU VM released frames 8 ms late on average (max 100 ms); with the
 *    spinners 0.2 us (max 11 us). SCHED_IDLE threads run only when nothing else
 *    wants the CPU, but only among the tasks of their own task group: with
 *    autogroup scheduling a relay started in a session of its own is a group
 *    of its own, and its spinners take a full fair share from everything else
 *    (measured: a CPU-bound job ran 3x slower beside six such relays). The
 *    launcher therefore moves the spinners into an idle cpu cgroup
 *    (netlab/keep_awake.py); `ip netns exec` hides /sys/fs/cgroup from us.
 *  - A bounded FIFO per direction; a full queue drops and counts the frame.
 *  - Optional loss per direction (--a-to-b-loss / --b-to-a-loss percent, or
 *    "loss <a_to_b_pct> <b_to_a_pct>" on the control socket): a frame is dropped
 *    when a xorshift64* draw falls under the threshold (1e-6 resolution), before
 *    it is queued. Drops are counted in total and per IPv6 Traffic Class of the
 *    outer header (alternate marking colours DSCP bits: a test reads the drops
 *    per colour from that). In the relay, loss hits every frame of the link,
 *    also those a node's XDP program sends (nftables on the node cannot see them).
 *  - Optional reordering per direction (--a-to-b-reorder / --b-to-a-reorder SPEC,
 *    or "reorder <a_to_b_spec> <b_to_a_spec>" on the control socket), SPEC one of
 *    off, every:K:HOLD_US (the K-th, 2K-th, ... frame of each flow) or
 *    random:PCT:HOLD_US (each frame with probability PCT %): a selected frame is
 *    held back HOLD_US longer than the delay in a second FIFO, so frames that
 *    arrive after it within HOLD_US overtake it. Both FIFOs are released in due
 *    order (a merge of their heads).
 *  - Per flow accounting. A flow is the outer IPv6 (source, destination, flow
 *    label), RFC 6437's flow; non-IPv6 frames share the flow (::, ::, 0). Each
 *    frame gets its flow's arrival index when queued; at release, a frame is
 *    counted reordered when a frame of its flow that arrived after it was
 *    released before it: exactly RFC 4737's Type-P-Reordered (s < NextExp) with
 *    the relay's arrival order as the sending order, i.e. what a receiver counts
 *    from the sender's sequence numbers when nothing before the relay reorders
 *    and nothing after it reorders or loses. Only frames sent without error count as released (a frame whose
 *    send failed never arrives, so it cannot make a later one look reordered).
 *  - Counters per direction and per flow, the injected delay of every released
 *    frame (sum: its mean is exact even when the delay changed or frames were
 *    held), and the measured release lateness (actual send time - due time)
 *    with a log histogram (32 buckets per power of two, <= 3.2 % wide) for
 *    percentiles, printed as JSON on SIGUSR1 and on exit and written to the
 *    stats file. A unix SOCK_SEQPACKET control socket takes
 *    "delay <a_to_b_us> <b_to_a_us>", "loss ...", "reorder ..." and "stats".
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
#include <stdarg.h>
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
#define FLOW_CAPACITY 4096       /* flows tracked per direction; later flows are counted untracked */
#define FLOW_INDEX_SLOTS (2 * FLOW_CAPACITY)   /* open-addressing index, never more than half full */
#define FLOWS_LISTED 256         /* flows per direction in the stats JSON (first seen first) */
#define NO_FLOW UINT32_MAX
#define LAT_SUB_BITS 5           /* lateness histogram: 32 buckets per power of two */
#define LAT_SUB (1 << LAT_SUB_BITS)
#define LAT_MAX_LOG2 40          /* lateness >= 2^41 ns (~37 min) lands in the last bucket */
#define LAT_BUCKETS (LAT_SUB + (LAT_MAX_LOG2 - LAT_SUB_BITS + 1) * LAT_SUB)
#define STATS_BYTES (512 * 1024) /* fits 2 x (256 flows + the full histogram + 256 TCs) */
#define DEFAULT_QUEUE_FRAMES 4096
#define RX_BURST 64              /* frames read per direction per wake-up (fairness) */
#define NSEC_PER_SEC 1000000000LL
#define RELAY_CLOCK CLOCK_REALTIME   /* same clock as SO_TIMESTAMPNS, see arrival_ns() */

struct frame {
	int64_t due_ns;          /* release time, RELAY_CLOCK */
	int64_t delay_ns;        /* injected: due - arrival (delay, plus the hold if held) */
	uint64_t flow_seq;       /* arrival index within its flow, from 0 */
	uint32_t flow;           /* index into the direction's flow table, NO_FLOW if untracked */
	uint32_t len;
	uint8_t data[SLOT_BYTES];
};

struct fifo {
	struct frame *slots;
	uint32_t capacity, head, count;
};

/* One IPv6 flow (RFC 6437: source, destination, flow label) in one direction. */
struct flow_key {
	uint8_t src[16], dst[16];
	uint32_t label;
};

struct flow {
	struct flow_key key;
	uint64_t received;       /* frames of the flow read by the relay, = dropped + arrived */
	uint64_t dropped_loss, dropped_queue_full, dropped_oversize;
	uint64_t arrived;        /* frames queued (after the drops), = the next arrival index */
	uint64_t next_expected;  /* RFC 4737 NextExp over arrival indexes of released frames */
	uint64_t released, send_errors, reordered, held;
	uint64_t delay_ns_sum;   /* injected delay of the released frames */
	uint64_t late_ns_sum;    /* release lateness of the released frames */
};

enum reorder_mode { REORDER_OFF, REORDER_EVERY, REORDER_RANDOM };

struct reorder_cfg {
	enum reorder_mode mode;
	uint64_t every;          /* REORDER_EVERY: hold the K-th, 2K-th, ... frame of each flow */
	uint64_t threshold;      /* REORDER_RANDOM: hold when draw % 1000000 < this */
	int64_t hold_ns;         /* extra delay of a held frame */
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
	int64_t late_min_ns;
	uint64_t late_log[LAT_BUCKETS];   /* for percentiles: see lat_bucket() */
	uint64_t injected_count;          /* frames forwarded, with their injected delay: */
	uint64_t injected_ns_sum;
	/* reordering (see the file comment for what counts as reordered) */
	uint64_t held, hold_queue_full, reordered, max_held_depth;
	uint64_t untracked_frames;        /* queued while the flow table was full: not judged */
	uint64_t untracked_arrived;       /* arrival counter for REORDER_EVERY on those */
};

struct direction {
	const char *name;        /* "a_to_b" or "b_to_a" */
	int rx_fd, tx_fd;
	int64_t delay_ns;
	uint64_t loss_threshold;   /* drop when draw % 1000000 < this (0: no loss) */
	struct reorder_cfg reorder;
	struct fifo queue;         /* frames in arrival order */
	struct fifo held;          /* frames held back for reordering, in arrival order */
	struct flow *flows;        /* FLOW_CAPACITY, in first-seen order */
	uint32_t n_flows;
	int32_t *flow_index;       /* FLOW_INDEX_SLOTS, -1 = empty */
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

/* The frame's flow: outer IPv6 source, destination and flow label (zeros if not IPv6). */
static struct flow_key flow_key_of(const uint8_t *frame, uint32_t len)
{
	struct flow_key key;
	memset(&key, 0, sizeof(key));
	if (len >= 14 + 40 && frame[12] == 0x86 && frame[13] == 0xdd) {
		key.label = ((uint32_t)(frame[15] & 0x0f) << 16) | ((uint32_t)frame[16] << 8) | frame[17];
		memcpy(key.src, frame + 22, 16);
		memcpy(key.dst, frame + 38, 16);
	}
	return key;
}

static uint32_t flow_hash(const struct flow_key *key)
{
	uint32_t h = 2166136261u;   /* FNV-1a */
	const uint8_t *p = (const uint8_t *)key;
	for (size_t i = 0; i < sizeof(*key); i++)
		h = (h ^ p[i]) * 16777619u;
	return h;
}

/* Index of the frame's flow, created on first sight; NO_FLOW once the table is full. */
static uint32_t flow_of(struct direction *d, const uint8_t *frame, uint32_t len)
{
	struct flow_key key = flow_key_of(frame, len);
	for (uint32_t slot = flow_hash(&key) % FLOW_INDEX_SLOTS;; slot = (slot + 1) % FLOW_INDEX_SLOTS) {
		int32_t at = d->flow_index[slot];
		if (at < 0) {
			if (d->n_flows == FLOW_CAPACITY)
				return NO_FLOW;
			d->flow_index[slot] = (int32_t)d->n_flows;
			d->flows[d->n_flows].key = key;
			return d->n_flows++;
		}
		if (memcmp(&d->flows[at].key, &key, sizeof(key)) == 0)
			return (uint32_t)at;
	}
}

/* "off", "every:K:HOLD_US" or "random:PCT:HOLD_US" -> cfg; 0 if valid. */
static int parse_reorder(const char *spec, struct reorder_cfg *cfg)
{
	double a, hold_us;
	char tail;
	if (strcmp(spec, "off") == 0) {
		*cfg = (struct reorder_cfg){ .mode = REORDER_OFF };
		return 0;
	}
	if (sscanf(spec, "every:%lf:%lf%c", &a, &hold_us, &tail) == 2 && a >= 1 && a <= 1e9 &&
	    a == floor(a) && hold_us > 0 && hold_us < 1e7) {
		*cfg = (struct reorder_cfg){ .mode = REORDER_EVERY, .every = (uint64_t)a,
					     .hold_ns = llround(hold_us * 1000.0) };
		return 0;
	}
	if (sscanf(spec, "random:%lf:%lf%c", &a, &hold_us, &tail) == 2 && a >= 0 && a <= 100 &&
	    hold_us > 0 && hold_us < 1e7) {
		*cfg = (struct reorder_cfg){ .mode = REORDER_RANDOM, .threshold = loss_threshold(a),
					     .hold_ns = llround(hold_us * 1000.0) };
		return 0;
	}
	return -1;
}

/* Whether the frame with this arrival index (in its flow) is held back. */
static bool reorder_selects(struct direction *d, uint64_t arrival_index)
{
	switch (d->reorder.mode) {
	case REORDER_EVERY:
		return (arrival_index + 1) % d->reorder.every == 0;
	case REORDER_RANDOM:
		return d->reorder.threshold && rng_next() % 1000000 < d->reorder.threshold;
	default:
		return false;
	}
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
		/* the flow first, so that every drop is counted per flow too (a truncated
		 * oversize frame still has its headers) */
		const uint8_t *data = full ? discard : slot->data;
		uint32_t flow = flow_of(d, data, (uint32_t)(n < SLOT_BYTES ? n : SLOT_BYTES));
		struct flow *fl = flow == NO_FLOW ? NULL : &d->flows[flow];
		d->stats.received++;
		if (fl)
			fl->received++;
		if (full) {
			d->stats.dropped_queue_full++;
			if (fl)
				fl->dropped_queue_full++;
			continue;
		}
		if (n > SLOT_BYTES) {
			d->stats.dropped_oversize++;
			if (fl)
				fl->dropped_oversize++;
			continue;
		}
		if (d->loss_threshold && rng_next() % 1000000 < d->loss_threshold) {
			d->stats.dropped_loss++;
			d->stats.dropped_loss_by_tc[traffic_class(slot->data, (uint32_t)n)]++;
			if (fl)
				fl->dropped_loss++;
			continue;
		}
		int64_t arrival = arrival_ns(&msg);
		uint64_t index;
		if (!fl) {
			d->stats.untracked_frames++;
			index = d->stats.untracked_arrived++;
		} else {
			index = fl->arrived++;
		}
		struct fifo *target = q;
		struct frame *f = slot;
		int64_t delay = d->delay_ns;
		if (reorder_selects(d, index)) {
			struct fifo *h = &d->held;
			if (h->count == h->capacity) {
				d->stats.hold_queue_full++;   /* goes in order instead */
			} else {
				target = h;
				f = &h->slots[(h->head + h->count) % h->capacity];
				memcpy(f->data, slot->data, (size_t)n);
				delay += d->reorder.hold_ns;
				d->stats.held++;
				if (fl)
					fl->held++;
			}
		}
		f->len = (uint32_t)n;
		f->delay_ns = delay;
		f->due_ns = arrival + delay;
		f->flow = flow;
		f->flow_seq = index;
		target->count++;
		if (q->count > d->stats.max_queue_depth)
			d->stats.max_queue_depth = q->count;
		if (d->held.count > d->stats.max_held_depth)
			d->stats.max_held_depth = d->held.count;
	}
}

/* Histogram bucket of a lateness: exact below 32 ns, then 32 per power of two. */
static int lat_bucket(int64_t late)
{
	uint64_t v = late < 0 ? 0 : (uint64_t)late;
	if (v < LAT_SUB)
		return (int)v;
	int e = 63 - __builtin_clzll(v);
	if (e > LAT_MAX_LOG2)
		return LAT_BUCKETS - 1;
	return LAT_SUB + (e - LAT_SUB_BITS) * LAT_SUB + (int)((v >> (e - LAT_SUB_BITS)) & (LAT_SUB - 1));
}

/* Largest lateness in bucket b (the last bucket is open: reported as its lower bound). */
static int64_t lat_bucket_upper(int b)
{
	if (b < LAT_SUB)
		return b;
	int e = (b - LAT_SUB) / LAT_SUB + LAT_SUB_BITS, sub = (b - LAT_SUB) % LAT_SUB;
	int64_t lower = (int64_t)(LAT_SUB + sub) << (e - LAT_SUB_BITS);
	return b == LAT_BUCKETS - 1 ? lower : lower + ((int64_t)1 << (e - LAT_SUB_BITS)) - 1;
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
	s->late_log[lat_bucket(late)]++;
	if (!s->late_count || late < s->late_min_ns)
		s->late_min_ns = late;
	s->late_count++;
	s->late_sum_ns += (double)late;
	s->late_sumsq_ns += (double)late * (double)late;
	if (late > s->late_max_ns)
		s->late_max_ns = late;
}

/* The FIFO whose head is due first (the in-order queue on a tie), NULL if both are empty. */
static struct fifo *first_due(struct direction *d)
{
	struct fifo *q = &d->queue, *h = &d->held;
	if (!h->count)
		return q->count ? q : NULL;
	if (!q->count)
		return h;
	return h->slots[h->head].due_ns < q->slots[q->head].due_ns ? h : q;
}

/* Account one released frame: injected delay, and its flow's RFC 4737 state. */
static void account_release(struct direction *d, const struct frame *f, int64_t late)
{
	d->stats.injected_count++;
	d->stats.injected_ns_sum += (uint64_t)f->delay_ns;
	if (f->flow == NO_FLOW)
		return;
	struct flow *fl = &d->flows[f->flow];
	fl->released++;
	fl->delay_ns_sum += (uint64_t)f->delay_ns;
	fl->late_ns_sum += late > 0 ? (uint64_t)late : 0;
	if (f->flow_seq < fl->next_expected) {
		fl->reordered++;            /* a later arrival of its flow went out before it */
		d->stats.reordered++;
	} else {
		fl->next_expected = f->flow_seq + 1;
	}
}

/* Send every frame whose release time has come, in due order across both FIFOs. */
static void release_due(struct direction *d)
{
	struct fifo *q;
	while ((q = first_due(d))) {
		struct frame *f = &q->slots[q->head];
		int64_t now = now_ns(RELAY_CLOCK);
		if (f->due_ns > now) {
			if (f->due_ns - now > spin_ns)
				return;
			while (now_ns(RELAY_CLOCK) < f->due_ns)
				;        /* short spin: the ppoll wake-up came early on purpose */
			now = now_ns(RELAY_CLOCK);
		}
		int64_t late = now - f->due_ns;
		if (send(d->tx_fd, f->data, f->len, 0) == (ssize_t)f->len) {
			d->stats.forwarded++;
			account_release(d, f, late);
		} else {
			d->stats.send_errors++;
			if (f->flow != NO_FLOW)
				d->flows[f->flow].send_errors++;
		}
		record_lateness(&d->stats, late);
		q->head = (q->head + 1) % q->capacity;
		q->count--;
	}
}

static int64_t next_due_ns(void)
{
	int64_t next = INT64_MAX;
	for (int i = 0; i < 2; i++) {
		struct fifo *q = first_due(&dirs[i]);
		if (q && q->slots[q->head].due_ns < next)
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

/* Appends to a fixed buffer; once it would overflow, nothing more is written (see format_stats). */
struct out {
	char *buf;
	size_t size, len;
	bool overflow;
};

static void __attribute__((format(printf, 2, 3))) put(struct out *o, const char *fmt, ...)
{
	if (o->overflow)
		return;
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(o->buf + o->len, o->size - o->len, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= o->size - o->len) {
		o->overflow = true;
		o->buf[o->len] = 0;
		return;
	}
	o->len += (size_t)n;
}

static const char *reorder_mode_name(enum reorder_mode mode)
{
	return mode == REORDER_EVERY ? "every" : mode == REORDER_RANDOM ? "random" : "off";
}

/* Lateness (ns) at quantile q of a histogram: the upper bound of the bucket it falls in. */
static int64_t lat_quantile(const struct direction_stats *s, double q)
{
	if (!s->late_count)
		return 0;
	uint64_t rank = (uint64_t)ceil(q * (double)s->late_count), seen = 0;
	if (rank < 1)
		rank = 1;
	for (int b = 0; b < LAT_BUCKETS; b++) {
		seen += s->late_log[b];
		if (seen >= rank)
			return lat_bucket_upper(b);
	}
	return s->late_max_ns;
}

static void format_direction(struct out *o, struct direction *d)
{
	struct direction_stats *s = &d->stats;
	double mean = s->late_count ? s->late_sum_ns / s->late_count : 0;
	double var = s->late_count ? s->late_sumsq_ns / s->late_count - mean * mean : 0;
	put(o, ", \"%s\": {\"delay_us\": %.3f, \"received\": %llu, \"forwarded\": %llu, "
	    "\"dropped_queue_full\": %llu, \"dropped_oversize\": %llu, \"dropped_socket\": %llu, "
	    "\"send_errors\": %llu, \"loss_pct\": %.4f, \"dropped_loss\": %llu, "
	    "\"queued\": %u, \"max_queue_depth\": %llu, \"queue_capacity\": %u, "
	    "\"injected_ns\": {\"count\": %llu, \"sum\": %llu}, "
	    "\"lateness_ns\": {\"count\": %llu, \"mean\": %.0f, \"stddev\": %.0f, \"min\": %lld, \"max\": %lld, "
	    "\"p50\": %lld, \"p90\": %lld, \"p99\": %lld, \"p999\": %lld, \"sum\": %.0f, "
	    "\"hist_lt\": {\"1us\": %llu, \"5us\": %llu, \"10us\": %llu, \"20us\": %llu, "
	    "\"50us\": %llu, \"100us\": %llu, \"1ms\": %llu, \"inf\": %llu}, \"hist_log\": [",
	    d->name, d->delay_ns / 1000.0,
	    (unsigned long long)s->received, (unsigned long long)s->forwarded,
	    (unsigned long long)s->dropped_queue_full, (unsigned long long)s->dropped_oversize,
	    (unsigned long long)s->dropped_socket,
	    (unsigned long long)s->send_errors, d->loss_threshold / 10000.0,
	    (unsigned long long)s->dropped_loss, d->queue.count + d->held.count,
	    (unsigned long long)s->max_queue_depth, d->queue.capacity,
	    (unsigned long long)s->injected_count, (unsigned long long)s->injected_ns_sum,
	    (unsigned long long)s->late_count, mean, var > 0 ? sqrt(var) : 0,
	    (long long)s->late_min_ns, (long long)s->late_max_ns,
	    (long long)lat_quantile(s, 0.5), (long long)lat_quantile(s, 0.9),
	    (long long)lat_quantile(s, 0.99), (long long)lat_quantile(s, 0.999), s->late_sum_ns,
	    (unsigned long long)s->late_hist[0], (unsigned long long)s->late_hist[1],
	    (unsigned long long)s->late_hist[2], (unsigned long long)s->late_hist[3],
	    (unsigned long long)s->late_hist[4], (unsigned long long)s->late_hist[5],
	    (unsigned long long)s->late_hist[6], (unsigned long long)s->late_hist[7]);
	/* [upper bound ns, count] of every non-empty bucket: percentiles over any window by difference */
	for (int b = 0, first = 1; b < LAT_BUCKETS; b++) {
		if (!s->late_log[b])
			continue;
		put(o, "%s[%lld, %llu]", first ? "" : ", ", (long long)lat_bucket_upper(b),
		    (unsigned long long)s->late_log[b]);
		first = 0;
	}
	put(o, "]}, \"dropped_loss_by_tc\": {");
	for (int tc = 0, first = 1; tc < 256; tc++) {
		if (!s->dropped_loss_by_tc[tc])
			continue;
		put(o, "%s\"%d\": %llu", first ? "" : ", ", tc, (unsigned long long)s->dropped_loss_by_tc[tc]);
		first = 0;
	}
	put(o, "}, \"reorder\": {\"mode\": \"%s\", \"every\": %llu, \"pct\": %.4f, \"hold_us\": %.3f, "
	    "\"held\": %llu, \"hold_queue_full\": %llu, \"held_queued\": %u, \"max_held_depth\": %llu, "
	    "\"reordered\": %llu, \"untracked_frames\": %llu}",
	    reorder_mode_name(d->reorder.mode), (unsigned long long)d->reorder.every,
	    d->reorder.mode == REORDER_RANDOM ? d->reorder.threshold / 10000.0 : 0.0,
	    d->reorder.hold_ns / 1000.0, (unsigned long long)s->held,
	    (unsigned long long)s->hold_queue_full, d->held.count,
	    (unsigned long long)s->max_held_depth, (unsigned long long)s->reordered,
	    (unsigned long long)s->untracked_frames);
	uint32_t listed = d->n_flows < FLOWS_LISTED ? d->n_flows : FLOWS_LISTED;
	put(o, ", \"flows_tracked\": %u, \"flow_capacity\": %d, \"flows\": [", d->n_flows, FLOW_CAPACITY);
	for (uint32_t i = 0; i < listed; i++) {
		const struct flow *fl = &d->flows[i];
		char src[INET6_ADDRSTRLEN], dst[INET6_ADDRSTRLEN];
		inet_ntop(AF_INET6, fl->key.src, src, sizeof(src));
		inet_ntop(AF_INET6, fl->key.dst, dst, sizeof(dst));
		put(o, "%s{\"src\": \"%s\", \"dst\": \"%s\", \"flow_label\": %u, \"received\": %llu, "
		    "\"dropped_loss\": %llu, \"dropped_queue_full\": %llu, \"dropped_oversize\": %llu, "
		    "\"queued\": %llu, \"released\": %llu, \"send_errors\": %llu, "
		    "\"held\": %llu, \"reordered\": %llu, \"delay_ns_sum\": %llu, \"late_ns_sum\": %llu}",
		    i ? ", " : "", src, dst, fl->key.label, (unsigned long long)fl->received,
		    (unsigned long long)fl->dropped_loss, (unsigned long long)fl->dropped_queue_full,
		    (unsigned long long)fl->dropped_oversize,
		    (unsigned long long)(fl->arrived - fl->released - fl->send_errors),
		    (unsigned long long)fl->released, (unsigned long long)fl->send_errors,
		    (unsigned long long)fl->held,
		    (unsigned long long)fl->reordered, (unsigned long long)fl->delay_ns_sum,
		    (unsigned long long)fl->late_ns_sum);
	}
	put(o, "]}");
}

static int format_stats(char *buf, size_t size)
{
	collect_socket_drops();
	struct out o = { .buf = buf, .size = size };
	put(&o, "{\"pid\": %d", (int)getpid());
	for (int i = 0; i < 2; i++)
		format_direction(&o, &dirs[i]);
	put(&o, "}\n");
	if (o.overflow)   /* cannot happen with STATS_BYTES; a reader must never get half a JSON */
		snprintf(buf, size, "{\"error\": \"stats larger than %zu bytes\"}\n", size);
	return (int)strlen(buf);
}

/* Write the stats file atomically (tmp + rename) so readers never see half a file. */
static void dump_stats(bool to_stdout)
{
	static char buf[STATS_BYTES];
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

/* One request per connection: "delay <a_to_b_us> <b_to_a_us>", "loss <a_to_b_pct> <b_to_a_pct>",
 * "reorder <a_to_b_spec> <b_to_a_spec>" or "stats"; the reply is the stats JSON or {"error": ...}. */
static void serve_control(int listen_fd)
{
	static char reply[STATS_BYTES];
	int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
	if (fd < 0)
		return;
	struct timeval tv = { .tv_sec = 1 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	int sndbuf = 2 * STATS_BYTES;   /* one SEQPACKET message must fit the send buffer */
	if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &sndbuf, sizeof(sndbuf)) < 0)
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
	char req[256] = { 0 }, spec_a[64], spec_b[64];
	ssize_t n = recv(fd, req, sizeof(req) - 1, 0);
	double a_to_b, b_to_a;
	struct reorder_cfg cfg_a, cfg_b;
	if (n > 0 && sscanf(req, "delay %lf %lf", &a_to_b, &b_to_a) == 2 &&
	    a_to_b >= 0 && b_to_a >= 0 && a_to_b < 1e7 && b_to_a < 1e7) {
		dirs[0].delay_ns = (int64_t)llround(a_to_b * 1000.0);   /* microseconds */
		dirs[1].delay_ns = (int64_t)llround(b_to_a * 1000.0);
		format_stats(reply, sizeof(reply));
	} else if (n > 0 && sscanf(req, "loss %lf %lf", &a_to_b, &b_to_a) == 2 &&
		   a_to_b >= 0 && b_to_a >= 0 && a_to_b <= 100 && b_to_a <= 100) {
		dirs[0].loss_threshold = loss_threshold(a_to_b);   /* percent */
		dirs[1].loss_threshold = loss_threshold(b_to_a);
		format_stats(reply, sizeof(reply));
	} else if (n > 0 && sscanf(req, "reorder %63s %63s", spec_a, spec_b) == 2 &&
		   parse_reorder(spec_a, &cfg_a) == 0 && parse_reorder(spec_b, &cfg_b) == 0) {
		dirs[0].reorder = cfg_a;   /* frames already held keep their release time */
		dirs[1].reorder = cfg_b;
		format_stats(reply, sizeof(reply));
	} else if (n > 0 && strncmp(req, "stats", 5) == 0) {
		format_stats(reply, sizeof(reply));
	} else {
		snprintf(reply, sizeof(reply),
			 "{\"error\": \"expected 'delay <a_to_b_us> <b_to_a_us>' (0..1e7), "
			 "'loss <a_to_b_pct> <b_to_a_pct>' (0..100), "
			 "'reorder <a_to_b> <b_to_a>' (each off, every:K:HOLD_US or random:PCT:HOLD_US; "
			 "K >= 1 integer, 0 <= PCT <= 100, 0 < HOLD_US < 1e7) or 'stats'\"}\n");
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
	prctl(PR_SET_NAME, "keep-awake");  /* the launcher finds the spinners by this name */
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

	pthread_attr_t attr;
	struct sched_param sp = { .sched_priority = 0 };

	/* Born SCHED_OTHER (glibc's attributes take no SCHED_IDLE; the thread switches
	 * itself), never for a moment SCHED_FIFO like the main thread: an RT thread
	 * cannot join a cpu cgroup without RT runtime, so the launcher's move into the
	 * idle cgroup would fail if it came before that switch. */
	pthread_attr_init(&attr);
	pthread_attr_setinheritsched(&attr, PTHREAD_EXPLICIT_SCHED);
	pthread_attr_setschedpolicy(&attr, SCHED_OTHER);
	pthread_attr_setschedparam(&attr, &sp);
	sigfillset(&all);                 /* signals stay with the main thread */
	pthread_sigmask(SIG_BLOCK, &all, &old);
	for (long cpu = 0; cpu < ncpu && started < max; cpu++)
		if (pthread_create(&threads[started], &attr, keep_cpu_awake, (void *)cpu) == 0)
			started++;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_attr_destroy(&attr);
	return started;
}

static void usage(void)
{
	fprintf(stderr,
		"usage: delay_relay --if-a IF --if-b IF [--a-to-b-us N] [--b-to-a-us N]\n"
		"                   [--queue FRAMES] [--control PATH] [--stats PATH] [--spin-ns N] [--rt-prio N]\n"
		"                   [--keep-awake] [--a-to-b-loss PCT] [--b-to-a-loss PCT] [--seed N]\n"
		"                   [--a-to-b-reorder SPEC] [--b-to-a-reorder SPEC]\n"
		"SPEC: off | every:K:HOLD_US | random:PCT:HOLD_US\n");
}

int main(int argc, char **argv)
{
	const char *if_a = NULL, *if_b = NULL, *control_path = NULL;
	double a_to_b_us = 0, b_to_a_us = 0, a_to_b_loss = 0, b_to_a_loss = 0;
	long queue_frames = DEFAULT_QUEUE_FRAMES;
	int rt_prio = 0, keep_awake = 0, bad_reorder = 0;
	struct reorder_cfg reorder[2] = { { .mode = REORDER_OFF }, { .mode = REORDER_OFF } };
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
		{ "a-to-b-reorder", required_argument, NULL, 'R' },
		{ "b-to-a-reorder", required_argument, NULL, 'T' },
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
		case 'R': bad_reorder |= parse_reorder(optarg, &reorder[0]); break;
		case 'T': bad_reorder |= parse_reorder(optarg, &reorder[1]); break;
		default: usage(); return 2;
		}
	}
	if (!if_a || !if_b || bad_reorder || queue_frames < 1 || queue_frames > 1 << 20 ||
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
	dirs[0].reorder = reorder[0];
	dirs[1].reorder = reorder[1];
	if (rng_state == 0x9e3779b97f4a7c15ull)
		rng_state ^= (uint64_t)now_ns(CLOCK_MONOTONIC) ^ ((uint64_t)getpid() << 32);
	int fd_a = open_packet_socket(if_a), fd_b = open_packet_socket(if_b);
	if (fd_a < 0 || fd_b < 0)
		return 1;
	dirs[0].rx_fd = fd_a, dirs[0].tx_fd = fd_b;
	dirs[1].rx_fd = fd_b, dirs[1].tx_fd = fd_a;
	for (int i = 0; i < 2; i++) {
		dirs[i].queue.capacity = (uint32_t)queue_frames;
		dirs[i].held.capacity = (uint32_t)queue_frames;
		/* calloc of this size maps zero pages: the memory is used only as deep as queues grow */
		dirs[i].queue.slots = calloc(queue_frames, sizeof(struct frame));
		dirs[i].held.slots = calloc(queue_frames, sizeof(struct frame));
		dirs[i].flows = calloc(FLOW_CAPACITY, sizeof(struct flow));
		dirs[i].flow_index = malloc(FLOW_INDEX_SLOTS * sizeof(int32_t));
		if (dirs[i].flow_index)
			memset(dirs[i].flow_index, 0xff, FLOW_INDEX_SLOTS * sizeof(int32_t));   /* -1: empty */
		if (!dirs[i].queue.slots || !dirs[i].held.slots || !dirs[i].flows || !dirs[i].flow_index) {
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
