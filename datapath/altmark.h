/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Alternate marking (RFC 9341 / RFC 9343): shared between
 * altmark_tx.bpf.c (TC egress colourer at the ingress edge), altmark_rx.bpf.c
 * (XDP counter at the egress edge), their loaders altmark_tx.c / altmark_rx.c
 * and the block collector (collectors/altmark_collector.c), which reads the
 * pinned maps /sys/fs/bpf/segscope/<instance>/altmark_{tx,rx}/:
 *
 *   altmark_flows     HASH  struct altmark_sidlist_key -> struct altmark_flow
 *                           (TX: every flow; RX: dscp flows)
 *   altmark_flowmon   HASH  __u32 FlowMonID -> struct altmark_flow (RX only: rfc9343 flows)
 *   altmark_counters  PERCPU_ARRAY, ALTMARK_MAX_FLOWS * 2 entries of struct altmark_counter,
 *                     index slot * 2 + colour; cumulative, never reset by the programs
 *   altmark_stats     PERCPU_ARRAY of __u64, ALTMARK_*_NR_COUNTERS entries: every packet
 *                     the program sees lands in exactly one of them
 *
 * Record format for the collector's output: schemas/c/altmark_block.h.
 */
#ifndef SEGSCOPE_ALTMARK_H
#define SEGSCOPE_ALTMARK_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#include <netinet/in.h>
#endif

#include "altmark_block.h"   /* ALTMARK_METHOD_*, ALTMARK_FLOWMONID_MAX */

#define ALTMARK_MAX_SIDS   6
#define ALTMARK_MAX_FLOWS  65536          /* slots; counters have 2 entries per slot */
#define ALTMARK_NR_COUNTERS (ALTMARK_MAX_FLOWS * 2)

/* Default DSCP bit positions of the dscp method (bit 0 = LSB of the 6-bit DSCP,
 * i.e. Traffic Class bit 0x04; bit 1 = Traffic Class 0x08). */
#define ALTMARK_DSCP_L_BIT_DEFAULT 0
#define ALTMARK_DSCP_D_BIT_DEFAULT 1
#define ALTMARK_DSCP_BITS          6

/*
 * RFC 9343 Alternate-Marking option in an 8-byte IPv6 Destination Options
 * header. Option type 0x12 (IANA "Destination Options and Hop-by-Hop
 * Options": 0x12 = AltMark, act 00 = skip if unknown, chg 0 = data does not
 * change en route), Opt Data Len 4, then FlowMonID (20) | L | D | reserved (10).
 */
#define ALTMARK_OPT_TYPE       0x12
#define ALTMARK_OPT_DATA_LEN   4
#define ALTMARK_DOH_LEN        8        /* next header, hdr ext len 0, type, len, 32-bit data */
#define ALTMARK_OPT_L_FLAG     0x800    /* in the host-order 32-bit option data */
#define ALTMARK_OPT_D_FLAG     0x400
#define ALTMARK_OPT_FLOWMON_SHIFT 12

#define IPPROTO_HOPOPTS_HDR    0
#define IPPROTO_ROUTING_HDR    43
#define IPPROTO_DSTOPTS_HDR    60
#define IPPROTO_IPV6_ENCAP     41     /* IPv6-in-IPv6: the inner packet right after the outer header */
#define IPV6_SRH_TYPE          4

/* Key of altmark_flows (both programs). */
struct altmark_sidlist_key {
	__u32 nsids;                            /* SRH last_entry + 1, 1..ALTMARK_MAX_SIDS */
	__u32 pad;                              /* 0 */
	struct in6_addr sids[ALTMARK_MAX_SIDS]; /* SRH wire order (sids[0] = final segment); unused = 0 */
};

/* Value of altmark_flows and altmark_flowmon. */
struct altmark_flow {
	__u32 flow_id;          /* FlowMonID (rfc9343, <= 0xFFFFF) or controller flow id (dscp) */
	__u32 slot;             /* counters index = slot * 2 + colour */
	__u64 period_ns;        /* colour period T (>= 1 s in production; tests may use less) */
	__u64 installed_tai_ns; /* CLOCK_TAI when installed: that block is partial */
	__u8  method;           /* ALTMARK_METHOD_DSCP / ALTMARK_METHOD_RFC9343 */
	__u8  dscp_l_bit;       /* dscp: DSCP bit index 0..5 carrying the colour */
	__u8  dscp_d_bit;       /* dscp: DSCP bit index of the delay mark */
	__u8  pad;
	__u32 dmark_every;      /* TX: D-mark one packet in N; 0 = no double marking */
};

/* Value of altmark_counters (PERCPU_ARRAY): cumulative, never reset by the datapath. */
struct altmark_counter {
	__u64 packets;
	__u64 bytes;            /* IPv6 length (40 + payload_len) of the outer packet as marked */
	__u64 dmark_packets;    /* D-marked packets */
	__u64 dmark_ts_sum_ns;  /* sum of their CLOCK_TAI ns timestamps (mod 2^64) */
};

/* altmark_tx stats: every packet the TC program sees lands in exactly one. */
enum altmark_tx_counter {
	AMTX_PASS_NOT_IPV6 = 0,        /* not IPv6 (or shorter than Ethernet + IPv6 header) */
	AMTX_PASS_NO_SRH,              /* IPv6 whose next header is not a routing header (a DOH
					* without AltMark option included: SRH is looked for only
					* right after the IPv6 header) */
	AMTX_PASS_NOT_SRH,             /* routing header of another type than 4 (SRH) */
	AMTX_PASS_TOO_MANY_SIDS,       /* SRH with more than ALTMARK_MAX_SIDS segments */
	AMTX_PASS_MALFORMED_SRH,       /* truncated SRH, or hdr_ext_len / last_entry inconsistent */
	AMTX_PASS_UNMONITORED,         /* SRH whose SID list is not in altmark_flows */
	AMTX_PASS_ALREADY_MARKED,      /* the packet already carries an AltMark DOH after IPv6: not marked twice */
	AMTX_PASS_MARK_FAILED,         /* rfc9343: +8 bytes would exceed the device MTU, or
					* bpf_skb_adjust_room failed: passed unmarked */
	AMTX_PASS_BAD_SLOT,            /* flow entry with slot >= ALTMARK_MAX_FLOWS or bad method */
	AMTX_COLOURED_DSCP,            /* marked with the dscp method and counted */
	AMTX_COLOURED_RFC9343,         /* DOH inserted and counted */
	AMTX_PASS_GSO_NOT_MARKED,      /* rfc9343 flow, GSO packet (several on the wire): not marked,
					* not counted; altmark_rx sees its segments without AltMark
					* option, so both edges leave them out */
	AMTX_NR_COUNTERS,
};

static const char *const altmark_tx_counter_names[AMTX_NR_COUNTERS] = {
	[AMTX_PASS_NOT_IPV6]       = "pass_not_ipv6",
	[AMTX_PASS_NO_SRH]         = "pass_no_srh",
	[AMTX_PASS_NOT_SRH]        = "pass_not_srh",
	[AMTX_PASS_TOO_MANY_SIDS]  = "pass_too_many_sids",
	[AMTX_PASS_MALFORMED_SRH]  = "pass_malformed_srh",
	[AMTX_PASS_UNMONITORED]    = "pass_unmonitored",
	[AMTX_PASS_ALREADY_MARKED] = "pass_already_marked",
	[AMTX_PASS_MARK_FAILED]    = "pass_mark_failed",
	[AMTX_PASS_BAD_SLOT]       = "pass_bad_slot",
	[AMTX_COLOURED_DSCP]       = "coloured_dscp",
	[AMTX_COLOURED_RFC9343]    = "coloured_rfc9343",
	[AMTX_PASS_GSO_NOT_MARKED] = "pass_gso_not_marked",
};

/* altmark_rx stats: every packet the XDP program sees lands in exactly one (always XDP_PASS). */
enum altmark_rx_counter {
	AMRX_PASS_NOT_IPV6 = 0,        /* not IPv6 (or shorter than Ethernet + IPv6 header) */
	AMRX_PASS_NO_SRH,              /* IPv6 without SRH and without AltMark DOH */
	AMRX_PASS_NOT_SRH,             /* routing header of another type than 4 */
	AMRX_PASS_TOO_MANY_SIDS,       /* dscp lookup: SRH with more than ALTMARK_MAX_SIDS segments */
	AMRX_PASS_MALFORMED_SRH,       /* truncated SRH, or hdr_ext_len / last_entry inconsistent */
	AMRX_PASS_MALFORMED_DOH,       /* truncated Destination Options header / option */
	AMRX_PASS_UNMONITORED,         /* SRH whose SID list is not a dscp flow (and no AltMark option) */
	AMRX_PASS_UNKNOWN_FLOWMON,     /* AltMark option whose FlowMonID is not in altmark_flowmon */
	AMRX_PASS_BAD_SLOT,            /* flow entry with slot >= ALTMARK_MAX_FLOWS */
	AMRX_COUNTED_DSCP,             /* dscp flow counted */
	AMRX_COUNTED_RFC9343,          /* rfc9343 flow counted */
	AMRX_PASS_MALFORMED_HBH,       /* a Hop-by-Hop header (e.g. the in-line IOAM trace) cut off */
	AMRX_NR_COUNTERS,
};

static const char *const altmark_rx_counter_names[AMRX_NR_COUNTERS] = {
	[AMRX_PASS_NOT_IPV6]        = "pass_not_ipv6",
	[AMRX_PASS_NO_SRH]          = "pass_no_srh",
	[AMRX_PASS_NOT_SRH]         = "pass_not_srh",
	[AMRX_PASS_TOO_MANY_SIDS]   = "pass_too_many_sids",
	[AMRX_PASS_MALFORMED_SRH]   = "pass_malformed_srh",
	[AMRX_PASS_MALFORMED_DOH]   = "pass_malformed_doh",
	[AMRX_PASS_UNMONITORED]     = "pass_unmonitored",
	[AMRX_PASS_UNKNOWN_FLOWMON] = "pass_unknown_flowmon",
	[AMRX_PASS_BAD_SLOT]        = "pass_bad_slot",
	[AMRX_COUNTED_DSCP]         = "counted_dscp",
	[AMRX_COUNTED_RFC9343]      = "counted_rfc9343",
	[AMRX_PASS_MALFORMED_HBH]   = "pass_malformed_hbh",
};

#endif /* SEGSCOPE_ALTMARK_H */
