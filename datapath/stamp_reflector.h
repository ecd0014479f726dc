/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Shared between stamp_reflector.bpf.c (XDP STAMP Session-Reflector) and its
 * loader stamp_reflector.c: map key/value layouts and the outcome counters.
 */
#ifndef SEGSCOPE_STAMP_REFLECTOR_H
#define SEGSCOPE_STAMP_REFLECTOR_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

#define REFLECTOR_MAX_RETURN_SIDS 8
#define REFLECTOR_MAX_ADDRESSES   64
#define REFLECTOR_MAX_SESSIONS    1024

/* Key of `reflector_sessions`: sender address (all zero = any sender) + SSID. */
struct reflector_session_key {
	__u8  sender[16];
	__u16 ssid;     /* host order */
	__u16 pad;      /* zero */
};

/*
 * Value of `reflector_sessions`. return_sids[0..n_return_sids) are the SIDs the
 * reply visits, in visiting order; the sender's address is appended by the
 * reflector as the final segment. n_return_sids = 0: plain address swap.
 */
struct reflector_session {
	__u32 n_return_sids;
	__u32 pad;
	__u8  return_sids[REFLECTOR_MAX_RETURN_SIDS][16];
};

/* Single entry of `reflector_config` (array, key 0), writable at run time. */
struct reflector_config {
	/* Error Estimate for the reply, host order; Z (PTP) is forced to 1 by the
	 * program. User space sets S (synchronised) + scale/multiplier. */
	__u16 err_est;
	__u16 pad;
	__u32 pad2;
};

/* Every packet the program sees lands in exactly one of these. */
enum reflector_counter {
	REFL_PASS_NOT_IPV6 = 0,       /* not IPv6, or frame shorter than Ethernet + IPv6 header */
	REFL_PASS_NOT_LOCAL_ADDR,     /* IPv6 dst not in reflector_addresses */
	REFL_PASS_OTHER_EXT_HEADER,   /* an extension header we do not parse (HBH, dest opts, frag, non-SRH routing) */
	REFL_PASS_SRH_NOT_FINAL,      /* SRH with segments_left > 0: the kernel's SRv6 processing handles it */
	REFL_PASS_NOT_UDP,            /* transport is not UDP */
	REFL_PASS_OTHER_PORT,         /* UDP, but dst port is not the STAMP port */
	REFL_PASS_UNKNOWN_SESSION,    /* STAMP to us, no session {sender, ssid} nor {::, ssid}: left to user space */
	REFL_DROP_MALFORMED_SHORT,    /* STAMP port + our address, but truncated UDP or payload < 44 bytes */
	REFL_DROP_MALFORMED_SRH,      /* SRH for us that is truncated or inconsistent */
	REFL_DROP_ADJUST_FAILED,      /* bpf_xdp_adjust_head failed or packet too short after it */
	REFL_REFLECTED,               /* XDP_TX of a STAMP reply */
	REFL_NR_COUNTERS,
};

static const char *const reflector_counter_names[REFL_NR_COUNTERS] = {
	[REFL_PASS_NOT_IPV6]         = "pass_not_ipv6",
	[REFL_PASS_NOT_LOCAL_ADDR]   = "pass_not_local_addr",
	[REFL_PASS_OTHER_EXT_HEADER] = "pass_other_ext_header",
	[REFL_PASS_SRH_NOT_FINAL]    = "pass_srh_not_final",
	[REFL_PASS_NOT_UDP]          = "pass_not_udp",
	[REFL_PASS_OTHER_PORT]       = "pass_other_port",
	[REFL_PASS_UNKNOWN_SESSION]  = "pass_unknown_session",
	[REFL_DROP_MALFORMED_SHORT]  = "drop_malformed_short",
	[REFL_DROP_MALFORMED_SRH]    = "drop_malformed_srh",
	[REFL_DROP_ADJUST_FAILED]    = "drop_adjust_failed",
	[REFL_REFLECTED]             = "reflected",
};

#endif /* SEGSCOPE_STAMP_REFLECTOR_H */
