/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Shared between stamp_collector.bpf.c (XDP Session-Sender receive side) and
 * its loader stamp_collector.c. Records themselves: schemas/c/stamp_record.h.
 */
#ifndef SEGSCOPE_STAMP_COLLECTOR_H
#define SEGSCOPE_STAMP_COLLECTOR_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

#define COLLECTOR_MAX_SESSIONS        1024
#define COLLECTOR_DEFAULT_RINGBUF_SIZE (8u << 20)

#define COLL_SESS_F_NTP 0x1   /* the session's timestamps are NTP (else PTPv2 truncated) */

/* Value of `stamp_sessions` (hash, key = __u16 ssid in host order). */
struct collector_session {
	__u16 sender_port;  /* local UDP port of the Session-Sender (host order) */
	__u8  active;       /* 1 = collect replies, 0 = let them pass to the stack */
	__u8  flags;        /* COLL_SESS_F_* */
};

/* Single entry of `collector_config` (array, key 0). */
struct collector_config {
	/* TAI - UTC in seconds (struct timex.tai at attach, or set-tai-offset):
	 * NTP timestamps (UTC) are converted to TAI ns in the record. */
	__s32 tai_utc_offset_s;
	__u32 pad;
};

/* Every packet the program sees lands in exactly one of these. */
enum collector_counter {
	COLL_PASS_NOT_IPV6 = 0,        /* not IPv6, or frame shorter than Ethernet + IPv6 header */
	COLL_PASS_OTHER_EXT_HEADER,    /* an extension header we do not parse */
	COLL_PASS_SRH_NOT_FINAL,       /* SRH with segments_left > 0 (transit) */
	COLL_PASS_NOT_UDP,             /* transport is not UDP */
	COLL_PASS_NOT_STAMP_REPLY,     /* UDP, but src port is not the STAMP port */
	COLL_PASS_UNKNOWN_SESSION,     /* STAMP reply for an SSID not in stamp_sessions */
	COLL_PASS_INACTIVE_SESSION,    /* SSID known but inactive */
	COLL_PASS_PORT_MISMATCH,       /* SSID active, but UDP dst port is not its sender port */
	COLL_DROP_MALFORMED_SHORT,     /* STAMP reply with truncated UDP (frame or IPv6 payload) or payload < 44 bytes */
	COLL_DROP_MALFORMED_SRH,       /* truncated or inconsistent SRH */
	COLL_DROP_RINGBUF_FULL,        /* record could not be reserved: reply consumed, record lost, counted */
	COLL_COLLECTED,                /* record submitted, reply consumed (XDP_DROP) */
	COLL_DROP_MALFORMED_IPV6,      /* STAMP reply: IPv6 version != 6 or Payload Length beyond the frame */
	COLL_DROP_MALFORMED_SRC_ADDR,  /* STAMP reply: source ::, ::1 or multicast */
	COLL_DROP_MALFORMED_UDP_CSUM,  /* STAMP reply: UDP checksum zero, or (to be collected) wrong */
	COLL_PASS_TOO_LONG_TO_VERIFY,  /* to be collected, UDP datagram > UDP_CSUM_MAX_LEN: left to the stack */
	COLL_COLLECTED_PARTIAL_CSUM,   /* collected; the reply's checksum was the pseudo-header sum only (a
					* kernel-socket reflector behind a veth); --partial-csum drop: counted
					* drop_malformed_udp_csum instead */
	COLL_NR_COUNTERS,
};

static const char *const collector_counter_names[COLL_NR_COUNTERS] = {
	[COLL_PASS_NOT_IPV6]         = "pass_not_ipv6",
	[COLL_PASS_OTHER_EXT_HEADER] = "pass_other_ext_header",
	[COLL_PASS_SRH_NOT_FINAL]    = "pass_srh_not_final",
	[COLL_PASS_NOT_UDP]          = "pass_not_udp",
	[COLL_PASS_NOT_STAMP_REPLY]  = "pass_not_stamp_reply",
	[COLL_PASS_UNKNOWN_SESSION]  = "pass_unknown_session",
	[COLL_PASS_INACTIVE_SESSION] = "pass_inactive_session",
	[COLL_PASS_PORT_MISMATCH]    = "pass_port_mismatch",
	[COLL_DROP_MALFORMED_SHORT]  = "drop_malformed_short",
	[COLL_DROP_MALFORMED_SRH]    = "drop_malformed_srh",
	[COLL_DROP_RINGBUF_FULL]     = "drop_ringbuf_full",
	[COLL_COLLECTED]             = "collected",
	[COLL_DROP_MALFORMED_IPV6]   = "drop_malformed_ipv6",
	[COLL_DROP_MALFORMED_SRC_ADDR] = "drop_malformed_src_addr",
	[COLL_DROP_MALFORMED_UDP_CSUM] = "drop_malformed_udp_csum",
	[COLL_PASS_TOO_LONG_TO_VERIFY] = "pass_too_long_to_verify",
	[COLL_COLLECTED_PARTIAL_CSUM] = "collected_partial_csum",
};

#endif /* SEGSCOPE_STAMP_COLLECTOR_H */
