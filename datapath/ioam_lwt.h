/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * In-line IOAM on the route (ioam_lwt.bpf.c, an `encap bpf in` lightweight-tunnel program on the
 * monitored SRv6 policy's route) and its loader ioam_lwt.c. The program replaces the kernel's
 * `encap seg6 mode encap` route: every packet gets the kernel's own seg6 encapsulation
 * (bpf_lwt_push_encap(BPF_LWT_ENCAP_SEG6) with the route's SRH), except the sampled ones, which
 * get an outer header the program built: IPv6 | HBH (IOAM Pre-allocated Trace, this node's entry
 * filled) | SRH | DOH (IOAM E2E) — the same bytes ioam_tx writes on TC egress (schemas/IOAM.md).
 * Packets the node sends itself take the same program's lwt_xmit entry (ioam_lwt_local) on a copy
 * of the route in table 3356 that only they find (rule `iif lo lookup 3356`).
 * Programs and maps, pinned in /sys/fs/bpf/segscope/<instance>/ioam_lwt/ (prog: lwt_in,
 * prog_local: lwt_xmit):
 *
 *   ioam_lwt_routes LPM_TRIE  struct ioam_lwt_route_key -> struct ioam_lwt_route (per route)
 *   ioam_tx_flows   HASH      struct altmark_sidlist_key -> struct ioam_tx_flow (as ioam_tx)
 *   ioam_if_ids     HASH      __u32 ifindex -> __u16 IOAM interface id (as ioam_tx)
 *   ioam_tx_config  ARRAY[1]  struct ioam_tx_config (as ioam_tx)
 *   ioam_lwt_stats  PERCPU_ARRAY of __u64, IOLWT_NR_COUNTERS
 */
#ifndef SEGSCOPE_IOAM_LWT_H
#define SEGSCOPE_IOAM_LWT_H

#include "ioam.h"

#define IOAM_LWT_MAX_ROUTES   1024
#define IOAM_LWT_SRH_MAX      (8 + 16 * ALTMARK_MAX_SIDS)
/* the kernel's limit on a header bpf_lwt_push_encap(BPF_LWT_ENCAP_IP) pushes (LWT_BPF_MAX_HEADROOM) */
#define IOAM_LWT_MAX_HEADER   256
#define IOAM_LWT_SCRATCH      512

/*
 * struct ioam_lwt_route.flags: the route carries the first SID's next hop (`via GW dev D`, resolved
 * by attach-route --fixed-next-hop): every packet gets an outer header built by the program, pushed
 * as IP encap, and is forwarded by this route (BPF_OK) - no route lookup per packet. Without it the
 * kernel's seg6 encap (and its lookup of the first SID) serves the packets not instrumented, and the
 * instrumented ones are re-routed on their outer destination.
 */
#define IOAM_LWT_FIXED_NEXT_HOP 0x1
/*
 * The route only encapsulates (attach-route --paused): its packets take the kernel's seg6 encap,
 * counted pass_unmonitored, and its flow's sampling position and sequence number stand still. The
 * agent pauses a route before its monitor moves to ioam_tx on TC, reads the flow's next sequence
 * number once no packet can move it any more, and starts the TC flow there (add-flow --first-seq).
 */
#define IOAM_LWT_PAUSED 0x2

/*
 * Packets that must take the kernel's own seg6 encapsulation but cannot from the program get this
 * mark and are re-routed: the rule `fwmark IOAM_LWT_SEG6_MARK lookup 3355` (attach-route) gives them
 * the copy of the seg6 route there. Two kinds:
 *   - GSO packets: bpf_lwt_push_encap(SEG6) does not mark the packet's GSO type as tunnelled
 *     (iptunnel_handle_offloads, which the seg6 route calls), so the packet cannot be segmented later
 *     and is dropped at transmit (measured: a TCP flow with TSO on the sender stalls);
 *   - packets the node sends itself (ioam_lwt_local, lwt_xmit): an xmit program can push only an IP
 *     header, and the IP-encap helper cannot segment a GSO packet under an SRH.
 * The mark stays on the packet inside this node only (it is not sent, and crossing a network
 * namespace clears it).
 */
#define IOAM_LWT_SEG6_MARK 0x5e610a3

/* Key of ioam_lwt_routes: the route's destination prefix (LPM: the packet's inner destination finds it). */
struct ioam_lwt_route_key {
	__u32 prefixlen;
	__u8  addr[16];
};

/* Value of ioam_lwt_routes: what the route's seg6 encap was, written by attach-route. */
struct ioam_lwt_route {
	struct altmark_sidlist_key sids;  /* the route's SID list (SRH wire order) */
	/*
	 * The flow key in ioam_tx_flows: the SID list the monitor was started on. A policy steered to
	 * another SID list keeps it, so its packets count in the same flow (sampling position, sequence
	 * numbers) while they carry the new SRH.
	 */
	struct altmark_sidlist_key flow;
	__u32 trace_nodes;                /* trace slots for this route's path; 0: the flow's */
	__u32 oif;                        /* the route's device: the trace entry's egress interface */
	__u32 mtu;                        /* the route's MTU: an instrumented packet must fit */
	__u32 srh_len;                    /* 8 + 16 * nsids */
	__u32 flags;                      /* IOAM_LWT_FIXED_NEXT_HOP */
	__u8  tunsrc[16];                 /* the outer source the kernel's seg6 encap uses on this route */
	__u8  srh[IOAM_LWT_SRH_MAX];      /* the SRH of `encap seg6 mode encap segs ...` (next header 41) */
};

/* ioam_lwt stats, in check order: every packet lands in exactly one. */
enum ioam_lwt_counter {
	IOLWT_DROP_NOT_IPV6 = 0,    /* not an IPv6 packet (the route is IPv6): dropped, as seg6 encap would */
	IOLWT_DROP_NO_ROUTE,        /* no ioam_lwt_routes entry for the destination: no SRH to push, dropped */
	IOLWT_DROP_ENCAP_FAILED,    /* the kernel's seg6 encapsulation failed (no memory, no route): dropped */
	IOLWT_PASS_UNMONITORED,     /* SID list not in ioam_tx_flows: kernel seg6 encap */
	IOLWT_PASS_BAD_FLOW,        /* inconsistent flow entry: never from the loader */
	IOLWT_PASS_FILTERED,        /* the packet does not match the flow's filter */
	IOLWT_PASS_NOT_SAMPLED,     /* a packet of the flow the sampling rule leaves alone */
	IOLWT_SKIP_GSO,             /* sampled, GSO: kernel seg6 encap */
	IOLWT_SKIP_TOO_LONG,        /* sampled, IPv6 + HBH + SRH + E2E > 256 bytes (the helper's limit) */
	IOLWT_SKIP_MTU,             /* sampled, would exceed the route MTU: kernel seg6 encap */
	IOLWT_SKIP_PUSH_FAILED,     /* sampled, bpf_lwt_push_encap of the built header failed: kernel seg6 encap */
	IOLWT_INSTRUMENTED,         /* the built header (trace + E2E option) pushed */
	IOLWT_NR_COUNTERS,
};

static const char *const ioam_lwt_counter_names[IOLWT_NR_COUNTERS] = {
	[IOLWT_DROP_NOT_IPV6]     = "drop_not_ipv6",
	[IOLWT_DROP_NO_ROUTE]     = "drop_no_route",
	[IOLWT_DROP_ENCAP_FAILED] = "drop_encap_failed",
	[IOLWT_PASS_UNMONITORED]  = "pass_unmonitored",
	[IOLWT_PASS_BAD_FLOW]     = "pass_bad_flow",
	[IOLWT_PASS_FILTERED]     = "pass_filtered",
	[IOLWT_PASS_NOT_SAMPLED]  = "pass_not_sampled",
	[IOLWT_SKIP_GSO]          = "skip_gso",
	[IOLWT_SKIP_TOO_LONG]     = "skip_too_long",
	[IOLWT_SKIP_MTU]          = "skip_mtu",
	[IOLWT_SKIP_PUSH_FAILED]  = "skip_push_failed",
	[IOLWT_INSTRUMENTED]      = "instrumented",
};

#endif /* SEGSCOPE_IOAM_LWT_H */
