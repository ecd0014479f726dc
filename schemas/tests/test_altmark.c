// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * test_altmark: schemas/c/altmark_block.h against schemas/vectors/altmark_block.json
 * (record decode + encode + check, batch decode + header encode, counter deltas).
 * Prints "N passed, M failed"; exit 1 on any failure.
 *   test_altmark <vectors dir>
 *   test_altmark --layouts      offsetof/sizeof of the structs as JSON (for tests/schemas)
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>

#include "altmark_block.h"
#include "mini_json.h"

static int passed, failed;

static void result(const char *what, const char *name, int ok, const char *detail)
{
	if (ok) {
		passed++;
		return;
	}
	failed++;
	printf("FAIL %s %s: %s\n", what, name, detail);
}

#define FIELD(type, member) \
	printf("%s\"%s\":[%zu,%zu]", sep, #member, offsetof(type, member), sizeof(((type *)0)->member)), sep = ","

static int print_layouts(void)
{
	const char *sep = "";

	printf("{\"altmark_block\":{\"size\":%zu,\"fields\":{", sizeof(struct altmark_block));
	FIELD(struct altmark_block, block_index);
	FIELD(struct altmark_block, block_start_ns);
	FIELD(struct altmark_block, packets);
	FIELD(struct altmark_block, bytes);
	FIELD(struct altmark_block, boot_id);
	FIELD(struct altmark_block, flow_id);
	FIELD(struct altmark_block, period_ms);
	FIELD(struct altmark_block, direction);
	FIELD(struct altmark_block, colour);
	FIELD(struct altmark_block, method);
	FIELD(struct altmark_block, reserved0);
	FIELD(struct altmark_block, flags);
	FIELD(struct altmark_block, dmark_packets);
	FIELD(struct altmark_block, dmark_ts_sum_ns);
	sep = "";
	printf("}},\"altmark_batch_header\":{\"size\":%zu,\"fields\":{", sizeof(struct altmark_batch_header));
	FIELD(struct altmark_batch_header, magic);
	FIELD(struct altmark_batch_header, header_size);
	FIELD(struct altmark_batch_header, record_size);
	FIELD(struct altmark_batch_header, record_count);
	FIELD(struct altmark_batch_header, flags);
	FIELD(struct altmark_batch_header, batch_seq);
	FIELD(struct altmark_batch_header, node);
	printf("}}}\n");
	return 0;
}

/* The record as the vector's "fields" say it is. */
static struct altmark_block expected_record(const struct mj *fields)
{
	struct altmark_block b = {
		.block_index = mj_u64(fields, "block_index"),
		.block_start_ns = mj_u64(fields, "block_start_ns"),
		.packets = mj_u64(fields, "packets"),
		.bytes = mj_u64(fields, "bytes"),
		.boot_id = mj_u64(fields, "boot_id"),
		.flow_id = (__u32)mj_u64(fields, "flow_id"),
		.period_ms = (__u32)mj_u64(fields, "period_ms"),
		.direction = (__u8)mj_u64(fields, "direction"),
		.colour = (__u8)mj_u64(fields, "colour"),
		.method = (__u8)mj_u64(fields, "method"),
		.reserved0 = (__u8)mj_u64(fields, "reserved0"),
		.flags = (__u16)mj_u64(fields, "flags"),
		.dmark_packets = (__u16)mj_u64(fields, "dmark_packets"),
		.dmark_ts_sum_ns = mj_u64(fields, "dmark_ts_sum_ns"),
	};
	return b;
}

static void test_record(const struct mj *v)
{
	const char *name = mj_str(v, "name");
	struct altmark_block want = expected_record(mj_get(v, "fields")), got;
	uint8_t raw[2 * ALTMARK_BLOCK_SIZE];
	size_t len = mj_hex(mj_str(v, "hex"), raw, sizeof(raw));
	char detail[128];

	result("record size", name, len == ALTMARK_BLOCK_SIZE, "hex is not 64 bytes");
	memcpy(&got, raw, sizeof(got));
	result("record decode", name, !memcmp(&got, &want, sizeof(got)), "fields differ");
	/* encode: the struct built from the fields is byte-identical to the vector */
	result("record encode", name, !memcmp(&want, raw, sizeof(want)), "bytes differ");
	snprintf(detail, sizeof(detail), "check says %s, vector says %s",
		 altmark_block_problem_name(altmark_block_check(&got)), mj_str(v, "check"));
	result("record check", name, !strcmp(altmark_block_problem_name(altmark_block_check(&got)),
					     mj_str(v, "check")), detail);
}

static const struct mj *find_record(const struct mj *records, const char *name)
{
	const struct mj *r;

	for (r = records->child; r; r = r->next)
		if (!strcmp(mj_str(r, "name"), name))
			return r;
	fprintf(stderr, "vector record %s missing\n", name);
	exit(2);
}

static void test_batch(const struct mj *v, const struct mj *records)
{
	static uint8_t raw[4096], enc[4096];
	const char *name = mj_str(v, "name");
	size_t len = mj_hex(mj_str(v, "hex"), raw, sizeof(raw)), off;
	const struct altmark_block *recs = NULL;
	struct altmark_batch_header hdr;
	int64_t n = altmark_batch_decode(raw, len, &recs, &hdr);
	const struct mj *r;
	char detail[128];
	int64_t i;

	if (mj_get(v, "error")) {
		int want = !strcmp(mj_str(v, "c_error"), "EMSGSIZE") ? -EMSGSIZE : -EBADMSG;

		snprintf(detail, sizeof(detail), "decode returned %" PRId64 ", want %d", n, want);
		result("batch error", name, n == want, detail);
		return;
	}
	snprintf(detail, sizeof(detail), "decode returned %" PRId64, n);
	result("batch count", name, n == (int64_t)mj_u64(v, "record_count"), detail);
	if (n < 0)
		return;
	result("batch seq", name, hdr.batch_seq == mj_u64(v, "batch_seq"), "batch_seq differs");
	result("batch node", name, !strncmp(hdr.node, mj_str(v, "node"), ALTMARK_BATCH_NODE_LEN),
	       "node differs");
	for (i = 0, r = mj_get(v, "records")->child; r && i < n; i++, r = r->next) {
		struct altmark_block want = expected_record(mj_get(find_record(records, r->str), "fields"));

		result("batch record", name, !memcmp(&recs[i], &want, sizeof(want)), r->str);
	}
	off = altmark_batch_encode_header(enc, mj_str(v, "node"), (uint32_t)n, mj_u64(v, "batch_seq"));
	memcpy(enc + off, recs, n * sizeof(*recs));
	result("batch encode", name, off + n * sizeof(*recs) == len && !memcmp(enc, raw, len), "bytes differ");
}

static void test_delta(const struct mj *v)
{
	char name[96];
	uint64_t got = altmark_counter_delta(mj_u64(v, "prev"), mj_u64(v, "cur"),
					     (unsigned int)mj_u64(v, "bits"));

	snprintf(name, sizeof(name), "%" PRIu64 "->%" PRIu64 "/%" PRIu64 " = %" PRIu64,
		 mj_u64(v, "prev"), mj_u64(v, "cur"), mj_u64(v, "bits"), got);
	result("delta", name, got == mj_u64(v, "delta"), "wrong delta");
}

static void test_dmark_delay(const struct mj *v)
{
	int ok;
	int64_t got = altmark_dmark_delay_ns((__u16)mj_u64(v, "tx_n"), mj_u64(v, "tx_sum"),
					     (__u16)mj_u64(v, "rx_n"), mj_u64(v, "rx_sum"), &ok);

	result("dmark delay", mj_str(v, "name"),
	       ok == (int)mj_u64(v, "ok") && got == mj_i64(v, "delay_ns"), "wrong delay");
}

static void test_kafka_key(void)
{
	char key[64];

	altmark_kafka_key(key, sizeof(key), "edge-A", 1048575);
	result("kafka key", "edge-A/1048575", !strcmp(key, "edge-A/1048575"), key);
}

int main(int argc, char **argv)
{
	char path[512];
	struct mj *root;
	const struct mj *v, *records;

	if (argc == 2 && !strcmp(argv[1], "--layouts"))
		return print_layouts();
	if (argc != 2) {
		fprintf(stderr, "usage: %s <vectors dir> | --layouts\n", argv[0]);
		return 2;
	}
	snprintf(path, sizeof(path), "%s/altmark_block.json", argv[1]);
	root = mj_load(path);
	records = mj_get(root, "records");
	for (v = records->child; v; v = v->next)
		test_record(v);
	for (v = mj_get(root, "batches")->child; v; v = v->next)
		test_batch(v, records);
	for (v = mj_get(root, "deltas")->child; v; v = v->next)
		test_delta(v);
	for (v = mj_get(root, "dmark_delays")->child; v; v = v->next)
		test_dmark_delay(v);
	test_kafka_key();
	printf("%d passed, %d failed\n", passed, failed);
	return failed || !passed;
}
