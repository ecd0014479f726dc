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

/* Authenticated base packets (RFC 8762 §4.2.2 + RFC 8972 §3): the SSID sits at
 * offset 26, the sender packet is 112 bytes. The XDP reflector does not do
 * HMAC; it recognises such sessions and leaves them to user space. */
#define STAMP_AUTH_BASE_LEN       112
#define STAMP_AUTH_SSID_OFF       26

/*
 * Value of `reflector_addresses` (array, one entry): the IPv6 addresses this
 * reflector answers for, addrs[0..n). A linear scan of a few addresses costs
 * the program ~5 ns where a hash lookup cost ~30 ns on this VM, on every
 * packet (foreign traffic included). The loader keeps addrs[0..n) compact.
 */
struct reflector_address_set {
	__u32 n;
	__u32 pad[3];
	__u8  addrs[REFLECTOR_MAX_ADDRESSES][16];
};

/* Key of `reflector_sessions`: sender address (all zero = any sender) + SSID. */
struct reflector_session_key {
	__u8  sender[16];
	__u16 ssid;     /* host order */
	__u16 pad;      /* zero */
};

/* reflector_session.flags: per-session modes (all zero = the base behaviour
 * except TLVs, which by default go to user space). */
#define REFL_SESS_F_NTP           0x1  /* NTP timestamps on the wire (Z = 0); else PTPv2 truncated (Z = 1) */
#define REFL_SESS_F_STATEFUL      0x2  /* RFC 8762 §4.3: own sequence counter (next_seq); else copy the sender's */
#define REFL_SESS_F_TLV_ECHO      0x4  /* test packets with TLVs: reflect, TLV area unchanged; else XDP_PASS to user space */
#define REFL_SESS_F_AUTHENTICATED 0x8  /* authenticated mode (HMAC): always XDP_PASS to user space */
#define REFL_SESS_F_ALL           0xf

/*
 * Value of `reflector_sessions`. return_sids[0..n_return_sids) are the SIDs the
 * reply visits, in visiting order; the sender's address is appended by the
 * reflector as the final segment. n_return_sids = 0: plain address swap.
 * next_seq: stateful sessions only, the Sequence Number of the next reply
 * (starts at 0, atomically incremented per reflected packet; shared by all
 * senders of a {::, ssid} session; add-session on an existing key resets it).
 */
struct reflector_session {
	__u32 n_return_sids;
	__u32 flags;        /* REFL_SESS_F_* */
	__u32 next_seq;
	__u32 pad;
	__u8  return_sids[REFLECTOR_MAX_RETURN_SIDS][16];
};

/* Single entry of `reflector_config` (array, key 0), writable at run time. */
struct reflector_config {
	/* Error Estimate for the reply, host order; Z is set by the program from
	 * the session's timestamp format. User space sets S (synchronised) +
	 * scale/multiplier. */
	__u16 err_est;
	__u16 pad;
	/* TAI - UTC in seconds (struct timex.tai at attach, or set-tai-offset):
	 * NTP timestamps are UTC, the program's clock is CLOCK_TAI. */
	__s32 tai_utc_offset_s;
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
	REFL_DROP_MALFORMED_SHORT,    /* STAMP port + our address, but truncated UDP (frame or IPv6 payload) or payload < 44 bytes */
	REFL_DROP_MALFORMED_SRH,      /* SRH for us that is truncated or inconsistent */
	REFL_DROP_ADJUST_FAILED,      /* bpf_xdp_adjust_head failed or packet too short after it */
	REFL_REFLECTED,               /* XDP_TX of a STAMP reply */
	REFL_PASS_TLVS_TO_USERSPACE,  /* session without --tlv echo, test packet longer than the base packet (TLVs) */
	REFL_PASS_AUTHENTICATED,      /* session in authenticated mode (HMAC is done in user space) */
	REFL_DROP_MALFORMED_IPV6,     /* STAMP port + our address: IPv6 version != 6 or Payload Length beyond the frame */
	REFL_DROP_MALFORMED_SRC_ADDR, /* ... source ::, ::1 or multicast */
	REFL_DROP_MALFORMED_UDP_CSUM, /* ... UDP checksum zero, or (reflection path) wrong */
	REFL_PASS_TOO_LONG_TO_VERIFY, /* reflection path, UDP datagram > UDP_CSUM_MAX_LEN: left to the stack */
	REFL_REFLECTED_PARTIAL_CSUM,  /* XDP_TX of a reply to a test packet whose checksum was the pseudo-header
				       * sum only (sender's checksum offload never done: veth, pods); the
				       * reply carries a full checksum. Attach --partial-csum drop counts
				       * these drop_malformed_udp_csum instead */
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
	[REFL_PASS_TLVS_TO_USERSPACE] = "pass_tlvs_to_userspace",
	[REFL_PASS_AUTHENTICATED]    = "pass_authenticated_to_userspace",
	[REFL_DROP_MALFORMED_IPV6]   = "drop_malformed_ipv6",
	[REFL_DROP_MALFORMED_SRC_ADDR] = "drop_malformed_src_addr",
	[REFL_DROP_MALFORMED_UDP_CSUM] = "drop_malformed_udp_csum",
	[REFL_PASS_TOO_LONG_TO_VERIFY] = "pass_too_long_to_verify",
	[REFL_REFLECTED_PARTIAL_CSUM] = "reflected_partial_csum",
};

#endif /* SEGSCOPE_STAMP_REFLECTOR_H */
