/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * ustamp fast path: the C per-packet path of the user-space STAMP
 * Session-Reflector (collectors/ustamp_fast.c, built as
 * build/collectors/libustamp_fast.so and driven by collectors/ustamp/fast.py
 * through ctypes). This header is the contract between the two: every struct
 * here is mirrored field by field in fast.py (a test checks the sizes).
 *
 * Worker threads, one SO_REUSEPORT socket each, answer the base packets of
 * unauthenticated sessions (44 bytes, no TLVs) with recvmmsg/sendmmsg. Every
 * other datagram of a known session (TLVs, authenticated packets) is handed,
 * with its receive metadata, to the Python implementation through a bounded
 * queue (ufast_slow_pop); nothing is decided twice and nothing is dropped
 * without a counter.
 */
#ifndef SEGSCOPE_USTAMP_FAST_H
#define SEGSCOPE_USTAMP_FAST_H

#include <stdint.h>

#define UFAST_MAX_WORKERS   64
#define UFAST_MAX_SIDS      16      /* return SIDs per session, as the XDP reflector and ustamp */
#define UFAST_MAX_BATCH     256     /* datagrams per recvmmsg */
#define UFAST_MAX_DATAGRAM  65536   /* every UDP payload fits: nothing is ever truncated */
#define UFAST_MAX_PEERS     4096    /* senders remembered per session (sessions.py MAX_PEERS_PER_SESSION) */

/* Session flags (ufast_table_set). */
#define UFAST_SESS_STATEFUL      0x1   /* own Sequence Number counter (RFC 8762 §4.3.1) */
#define UFAST_SESS_NTP           0x2   /* NTP timestamps (else PTPv2 truncated) */
#define UFAST_SESS_AUTHENTICATED 0x4   /* RFC 8762 §4.2.2: every packet goes to Python */

/* How the kernel spreads datagrams over the workers' sockets (SO_ATTACH_REUSEPORT_CBPF). */
enum ufast_steering {
	UFAST_STEER_SESSION = 0,   /* hash of (source address, SSID): a session's replies stay in order */
	UFAST_STEER_PACKET = 1,    /* any datagram to any worker: one session can use every worker */
};

/*
 * Counters of the fast path. `received` counts the datagrams whose outcome a
 * worker decided, each in exactly one of reflected, unknown_session,
 * malformed_short, auth_failed, send_error, slow_path_queue_full (the Python
 * queue was full: no reply). A datagram handed to Python counts `slow_path`
 * here and `received` + its outcome in Python, so the sum of both sides keeps
 * the reflector's rule: received = the sum of the outcomes. srh_switches
 * (setsockopt IPV6_RTHDR calls) and batches (recvmmsg calls that returned
 * datagrams) say how the workers spent their system calls. Names:
 * ufast_counter_name().
 */
enum ufast_counter {
	UFAST_C_RECEIVED,
	UFAST_C_REFLECTED,
	UFAST_C_UNKNOWN_SESSION,
	UFAST_C_MALFORMED_SHORT,
	UFAST_C_AUTH_FAILED,
	UFAST_C_SEND_ERROR,
	UFAST_C_SLOW_PATH_QUEUE_FULL,
	UFAST_C_NO_KERNEL_TIMESTAMP,
	UFAST_C_SLOW_PATH,
	UFAST_C_SRH_SWITCHES,
	UFAST_C_BATCHES,
	UFAST_NR_COUNTERS,
};

/* Receive metadata of a datagram handed to Python (netutil.RxMeta and the peer tuple). */
struct ufast_rx_meta {
	int64_t  rx_realtime_ns;   /* SO_TIMESTAMPNS (CLOCK_REALTIME), -1 if the kernel gave none */
	int32_t  hop_limit;        /* IPV6_HOPLIMIT, -1 if none */
	int32_t  tclass;           /* IPV6_TCLASS */
	uint32_t ifindex;          /* IPV6_PKTINFO: arrival interface */
	uint32_t peer_scope_id;    /* the sender's sin6_scope_id */
	uint8_t  local_addr[16];   /* IPV6_PKTINFO: the address it was sent to */
	uint8_t  peer_addr[16];
	uint16_t peer_port;        /* host order */
	uint8_t  has_local_addr;
	uint8_t  worker;           /* which worker read it (for tests and logs) */
};

/* One sender's state in a session (Direct Measurement, Follow-Up Telemetry). */
struct ufast_peer_view {
	uint32_t rx_count;
	uint32_t tx_count;
	uint32_t prev_seq;
	uint32_t prev_t3_sec;
	uint32_t prev_t3_frac;
};

struct ufast;          /* the reflector: sockets, workers, slow-path queue */
struct ufast_table;    /* an immutable session table, published as a whole */
struct ufast_sstate;   /* run-time state of one session, shared by every table that has it */

#endif /* SEGSCOPE_USTAMP_FAST_H */
