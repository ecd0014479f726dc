// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * print_layouts: offsetof/sizeof of every field of the wire structs, as the C
 * compiler sees them, printed as one JSON object. tests/schemas compares it
 * with the Python mirrors (numpy dtype, struct formats).
 */
#include <stddef.h>
#include <stdio.h>

#include "stamp_batch.h"
#include "stamp_record.h"
#include "stamp_test_packet.h"

static const char *sep;

static void begin(const char *name, size_t size, int first)
{
	printf("%s\"%s\":{\"size\":%zu,\"fields\":{", first ? "" : ",", name, size);
	sep = "";
}

static void field(const char *name, size_t off, size_t size)
{
	printf("%s\"%s\":[%zu,%zu]", sep, name, off, size);
	sep = ",";
}

static void end(void)
{
	printf("}}");
}

#define FIELD(type, member, name) field(name, offsetof(type, member), sizeof(((type *)0)->member))

int main(void)
{
	printf("{");
	begin("stamp_record", sizeof(struct stamp_record), 1);
	FIELD(struct stamp_record, t1_ns, "t1_ns");
	FIELD(struct stamp_record, t2_ns, "t2_ns");
	FIELD(struct stamp_record, t3_ns, "t3_ns");
	FIELD(struct stamp_record, t4_ns, "t4_ns");
	FIELD(struct stamp_record, sender_seq, "sender_seq");
	FIELD(struct stamp_record, reflector_seq, "reflector_seq");
	FIELD(struct stamp_record, ssid, "ssid");
	FIELD(struct stamp_record, sender_err_est, "sender_err_est");
	FIELD(struct stamp_record, reflector_err_est, "reflector_err_est");
	FIELD(struct stamp_record, sender_ttl, "sender_ttl");
	FIELD(struct stamp_record, reply_hop_limit, "reply_hop_limit");
	FIELD(struct stamp_record, ifindex, "ifindex");
	FIELD(struct stamp_record, flags, "flags");
	FIELD(struct stamp_record, reserved, "reserved");
	end();

	begin("stamp_batch_header", sizeof(struct stamp_batch_header), 0);
	FIELD(struct stamp_batch_header, magic, "magic");
	FIELD(struct stamp_batch_header, header_size, "header_size");
	FIELD(struct stamp_batch_header, record_size, "record_size");
	FIELD(struct stamp_batch_header, record_count, "record_count");
	FIELD(struct stamp_batch_header, flags, "flags");
	FIELD(struct stamp_batch_header, batch_seq, "batch_seq");
	FIELD(struct stamp_batch_header, node, "node");
	end();

	begin("stamp_sender_packet", sizeof(struct stamp_sender_packet), 0);
	FIELD(struct stamp_sender_packet, seq, "seq");
	FIELD(struct stamp_sender_packet, ts.sec, "ts_sec");
	FIELD(struct stamp_sender_packet, ts.frac, "ts_frac");
	FIELD(struct stamp_sender_packet, err_est, "err_est");
	FIELD(struct stamp_sender_packet, ssid, "ssid");
	FIELD(struct stamp_sender_packet, mbz, "mbz");
	end();

	begin("stamp_reflector_packet", sizeof(struct stamp_reflector_packet), 0);
	FIELD(struct stamp_reflector_packet, seq, "seq");
	FIELD(struct stamp_reflector_packet, ts.sec, "ts_sec");
	FIELD(struct stamp_reflector_packet, ts.frac, "ts_frac");
	FIELD(struct stamp_reflector_packet, err_est, "err_est");
	FIELD(struct stamp_reflector_packet, ssid, "ssid");
	FIELD(struct stamp_reflector_packet, rx_ts.sec, "rx_sec");
	FIELD(struct stamp_reflector_packet, rx_ts.frac, "rx_frac");
	FIELD(struct stamp_reflector_packet, sender_seq, "sender_seq");
	FIELD(struct stamp_reflector_packet, sender_ts.sec, "sender_ts_sec");
	FIELD(struct stamp_reflector_packet, sender_ts.frac, "sender_ts_frac");
	FIELD(struct stamp_reflector_packet, sender_err_est, "sender_err_est");
	FIELD(struct stamp_reflector_packet, mbz1, "mbz1");
	FIELD(struct stamp_reflector_packet, sender_ttl, "sender_ttl");
	FIELD(struct stamp_reflector_packet, mbz2, "mbz2");
	end();
	printf("}\n");
	return 0;
}
