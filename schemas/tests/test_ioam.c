// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * test_ioam: the in-line IOAM C headers against schemas/vectors/ (written by
 * make_ioam_vectors.py): ioam_batch.h + ioam_record.h on ioam_batch_*.hex/.json
 * (decode, header encode, records field by field, Kafka key),
 * ioam_trace_option.h on ioam_trace_option.json and ioam_e2e_option.h on
 * ioam_e2e_option.json (decode with the error class, encode byte for byte).
 * Prints "N passed, M failed"; exit 1 on any failure.
 *   test_ioam <vectors dir>
 *   test_ioam --layouts      offsetof/sizeof of the structs as JSON (for tests/schemas)
 *   test_ioam --classify trace|e2e   one hex header per stdin line -> one result line
 *                            ("ok <fields>" or the error class), for the differential test
 *                            against the Python mirrors (tests/schemas/test_ioam.py)
 */
#include <dirent.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>

#include "ioam_batch.h"
#include "ioam_e2e_option.h"
#include "ioam_trace_option.h"
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

	printf("{\"ioam_record\":{\"size\":%zu,\"fields\":{", sizeof(struct ioam_record));
	FIELD(struct ioam_record, rx_tai_ns);
	FIELD(struct ioam_record, tx_tai_ns);
	FIELD(struct ioam_record, seq);
	FIELD(struct ioam_record, flow_id);
	FIELD(struct ioam_record, ifindex);
	FIELD(struct ioam_record, node_id);
	FIELD(struct ioam_record, namespace_id);
	FIELD(struct ioam_record, slots);
	FIELD(struct ioam_record, filled);
	FIELD(struct ioam_record, trace_type);
	FIELD(struct ioam_record, trace_flags);
	FIELD(struct ioam_record, hop_limit);
	FIELD(struct ioam_record, tai_utc_offset_s);
	FIELD(struct ioam_record, flags);
	FIELD(struct ioam_record, reserved0);
	FIELD(struct ioam_record, reserved1);
	FIELD(struct ioam_record, entries);
	sep = "";
	printf("}},\"ioam_node_entry\":{\"size\":%zu,\"fields\":{", sizeof(struct ioam_node_entry));
	FIELD(struct ioam_node_entry, hop_limit_node_id);
	FIELD(struct ioam_node_entry, ingress_if_id);
	FIELD(struct ioam_node_entry, egress_if_id);
	FIELD(struct ioam_node_entry, ts_sec);
	FIELD(struct ioam_node_entry, ts_subsec);
	sep = "";
	printf("}},\"ioam_batch_header\":{\"size\":%zu,\"fields\":{", sizeof(struct ioam_batch_header));
	FIELD(struct ioam_batch_header, magic);
	FIELD(struct ioam_batch_header, header_size);
	FIELD(struct ioam_batch_header, record_size);
	FIELD(struct ioam_batch_header, record_count);
	FIELD(struct ioam_batch_header, flags);
	FIELD(struct ioam_batch_header, batch_seq);
	FIELD(struct ioam_batch_header, node);
	printf("}}}\n");
	return 0;
}

static struct ioam_trace_node node_of(const struct mj *e)
{
	struct ioam_trace_node n = {
		.hop_limit = (__u8)mj_u64(e, "hop_limit"),
		.node_id = (__u32)mj_u64(e, "node_id"),
		.ingress_if_id = (__u16)mj_u64(e, "ingress_if_id"),
		.egress_if_id = (__u16)mj_u64(e, "egress_if_id"),
		.ts_sec = (__u32)mj_u64(e, "ts_sec"),
		.ts_subsec = (__u32)mj_u64(e, "ts_subsec"),
	};
	return n;
}

static int node_eq(const struct ioam_trace_node *a, const struct ioam_trace_node *b)
{
	return a->hop_limit == b->hop_limit && a->node_id == b->node_id && a->ingress_if_id == b->ingress_if_id &&
	       a->egress_if_id == b->egress_if_id && a->ts_sec == b->ts_sec && a->ts_subsec == b->ts_subsec;
}

/* The record as the vector's fields say it is (entries encoded to the wire with ioam_trace_node_encode). */
static struct ioam_record expected_record(const struct mj *f)
{
	struct ioam_record r;
	const struct mj *e;
	unsigned int i = 0;

	memset(&r, 0, sizeof(r));
	r.rx_tai_ns = mj_u64(f, "rx_tai_ns");
	r.tx_tai_ns = mj_u64(f, "tx_tai_ns");
	r.seq = mj_u64(f, "seq");
	r.flow_id = (__u32)mj_u64(f, "flow_id");
	r.ifindex = (__u32)mj_u64(f, "ifindex");
	r.node_id = (__u32)mj_u64(f, "node_id");
	r.namespace_id = (__u16)mj_u64(f, "namespace_id");
	r.slots = (__u8)mj_u64(f, "slots");
	r.filled = (__u8)mj_u64(f, "filled");
	r.trace_type = (__u32)mj_u64(f, "trace_type");
	r.trace_flags = (__u8)mj_u64(f, "trace_flags");
	r.hop_limit = (__u8)mj_u64(f, "hop_limit");
	r.tai_utc_offset_s = (__s16)mj_i64(f, "tai_utc_offset_s");
	r.flags = (__u32)mj_u64(f, "flags");
	r.reserved0 = (__u32)mj_u64(f, "reserved0");
	r.reserved1 = mj_u64(f, "reserved1");
	for (e = mj_get(f, "entries")->child; e && i < IOAM_RECORD_MAX_NODES; e = e->next, i++) {
		struct ioam_trace_node n = node_of(e);

		ioam_trace_node_encode((__u8 *)&r.entries[i], &n);
	}
	return r;
}

static size_t read_hex_file(const char *path, uint8_t *out, size_t cap)
{
	static char text[1 << 16];
	FILE *f = fopen(path, "r");
	size_t n;

	if (!f) {
		fprintf(stderr, "cannot open %s\n", path);
		exit(2);
	}
	n = fread(text, 1, sizeof(text) - 1, f);
	fclose(f);
	while (n && (text[n - 1] == '\n' || text[n - 1] == ' '))
		n--;
	text[n] = '\0';
	return mj_hex(text, out, cap);
}

static void test_batch(const char *dir, const char *json_name)
{
	static uint8_t raw[1 << 15], enc[1 << 15];
	char path[768], detail[160], key[96];
	struct mj *v;
	const char *name;
	const struct ioam_record *recs = NULL;
	struct ioam_batch_header hdr;
	const struct mj *r;
	size_t len, off;
	int64_t n, i;

	snprintf(path, sizeof(path), "%s/%s", dir, json_name);
	v = mj_load(path);
	name = mj_str(v, "name");
	snprintf(path, sizeof(path), "%s/%s.hex", dir, name);
	len = read_hex_file(path, raw, sizeof(raw));
	result("batch length", name, len == mj_u64(v, "length"), "hex length differs from the vector's");
	n = ioam_batch_decode(raw, len, &recs, &hdr);
	if (!mj_get(v, "valid")->u) {
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
	result("batch node", name, !strncmp(hdr.node, mj_str(v, "node"), IOAM_BATCH_NODE_LEN), "node differs");
	for (i = 0, r = mj_get(v, "records")->child; r && i < n; i++, r = r->next) {
		struct ioam_record want = expected_record(r);

		result("batch record", name, !memcmp(&recs[i], &want, sizeof(want)), "record differs");
	}
	if (hdr.header_size == IOAM_BATCH_HEADER_SIZE) {
		off = ioam_batch_encode_header(enc, mj_str(v, "node"), (uint32_t)n, mj_u64(v, "batch_seq"));
		memcpy(enc + off, recs, n * sizeof(*recs));
		result("batch encode", name, off + n * sizeof(*recs) == len && !memcmp(enc, raw, len), "bytes differ");
	}
	if (n > 0) {
		ioam_kafka_key(key, sizeof(key), mj_str(v, "node"), recs[0].flow_id);
		result("kafka key", name, !strcmp(key, mj_str(v, "kafka_key")), key);
	}
}

static void test_trace_decode(const struct mj *v)
{
	static uint8_t raw[4096];
	const char *name = mj_str(v, "name");
	size_t len = mj_hex(mj_str(v, "hex"), raw, sizeof(raw));
	struct ioam_trace t;
	const struct mj *e;
	char detail[160];
	unsigned int i = 0;
	int err = ioam_trace_hbh_decode(raw, len, &t);

	if (mj_get(v, "error")) {
		snprintf(detail, sizeof(detail), "decode says %s, vector says %s", ioam_strerror(err), mj_str(v, "error"));
		result("trace error", name, !strcmp(ioam_strerror(err), mj_str(v, "error")), detail);
		return;
	}
	snprintf(detail, sizeof(detail), "decode says %s", ioam_strerror(err));
	result("trace decode", name, err == IOAM_OK, detail);
	if (err)
		return;
	result("trace fields", name,
	       t.next_header == mj_u64(v, "next_header") && t.namespace_id == mj_u64(v, "namespace_id") &&
	       t.node_len == mj_u64(v, "node_len") && t.flags == mj_u64(v, "flags") &&
	       t.remaining_len == mj_u64(v, "remaining_len") && t.trace_type == mj_u64(v, "trace_type") &&
	       t.slots == mj_u64(v, "slots") && t.filled == mj_u64(v, "filled"), "a header field differs");
	for (e = mj_get(v, "nodes")->child; e; e = e->next, i++) {
		struct ioam_trace_node want = node_of(e), got;

		if (i >= t.filled) {
			result("trace node", name, 0, "more nodes in the vector than filled");
			return;
		}
		ioam_trace_filled_node(&t, i, &got);
		result("trace node", name, node_eq(&got, &want), "node differs");
	}
	result("trace nodes", name, i == t.filled, "fewer nodes in the vector than filled");
}

static void test_trace_encode(const struct mj *v)
{
	uint8_t out[512], want[512];
	const char *name = mj_str(v, "name");
	const struct mj *first = mj_get(v, "first");
	struct ioam_trace_node n;
	int len;

	if (first->type == MJ_OBJ)
		n = node_of(first);
	len = ioam_trace_hbh_encode(out, sizeof(out), (__u8)mj_u64(v, "next_header"), (__u16)mj_u64(v, "namespace_id"),
				    (unsigned int)mj_u64(v, "slots"), first->type == MJ_OBJ ? &n : NULL);
	if (mj_get(v, "error")) {
		result("trace encode error", name, len < 0 && !strcmp(ioam_strerror(len), mj_str(v, "error")),
		       "encoder accepted it");
		return;
	}
	result("trace encode", name,
	       len == (int)mj_hex(mj_str(v, "hex"), want, sizeof(want)) && !memcmp(out, want, (size_t)len),
	       "bytes differ");
}

static void test_e2e_decode(const struct mj *v)
{
	uint8_t raw[512];
	const char *name = mj_str(v, "name");
	size_t len = mj_hex(mj_str(v, "hex"), raw, sizeof(raw));
	struct ioam_e2e e;
	char detail[160];
	int err = ioam_e2e_doh_decode(raw, len, &e);

	if (mj_get(v, "error")) {
		snprintf(detail, sizeof(detail), "decode says %s, vector says %s", ioam_strerror(err), mj_str(v, "error"));
		result("e2e error", name, !strcmp(ioam_strerror(err), mj_str(v, "error")), detail);
		return;
	}
	snprintf(detail, sizeof(detail), "decode says %s", ioam_strerror(err));
	result("e2e decode", name, err == IOAM_OK, detail);
	if (err)
		return;
	result("e2e fields", name,
	       e.next_header == mj_u64(v, "next_header") && e.namespace_id == mj_u64(v, "namespace_id") &&
	       e.e2e_type == mj_u64(v, "e2e_type") && e.seq == mj_u64(v, "seq") && e.ts_sec == mj_u64(v, "ts_sec") &&
	       e.ts_nsec == mj_u64(v, "ts_nsec"), "a field differs");
}

static void test_e2e_encode(const struct mj *v)
{
	uint8_t out[64], want[64];
	const char *name = mj_str(v, "name");
	int len = ioam_e2e_doh_encode(out, sizeof(out), (__u8)mj_u64(v, "next_header"), (__u16)mj_u64(v, "namespace_id"),
				      mj_u64(v, "seq"), (__u32)mj_u64(v, "ts_sec"), (__u32)mj_u64(v, "ts_nsec"));

	if (mj_get(v, "error")) {
		result("e2e encode error", name, len < 0 && !strcmp(ioam_strerror(len), mj_str(v, "error")),
		       "encoder accepted it");
		return;
	}
	result("e2e encode", name,
	       len == (int)mj_hex(mj_str(v, "hex"), want, sizeof(want)) && !memcmp(out, want, (size_t)len),
	       "bytes differ");
}

/* One line per input: "<error class>" or "ok" and the decoded fields (trace: and the filled nodes). */
static int classify(const char *what)
{
	static char line[1 << 14];
	static uint8_t raw[1 << 13];
	int trace = !strcmp(what, "trace");

	if (!trace && strcmp(what, "e2e")) {
		fprintf(stderr, "--classify trace|e2e\n");
		return 2;
	}
	while (fgets(line, sizeof(line), stdin)) {
		size_t len;
		int err;

		line[strcspn(line, "\n")] = '\0';
		len = mj_hex(line, raw, sizeof(raw));
		if (trace) {
			struct ioam_trace t;

			err = ioam_trace_hbh_decode(raw, len, &t);
			if (err) {
				printf("%s\n", ioam_strerror(err));
				continue;
			}
			printf("ok %u %zu %zu %u %u %u %u %u %u %u", t.next_header, t.hbh_len, t.opt_off, t.namespace_id,
			       t.node_len, t.flags, t.remaining_len, t.trace_type, t.slots, t.filled);
			for (unsigned int i = 0; i < t.filled; i++) {
				struct ioam_trace_node n;

				ioam_trace_filled_node(&t, i, &n);
				printf(" %u/%u/%u/%u/%u/%u", n.hop_limit, n.node_id, n.ingress_if_id, n.egress_if_id, n.ts_sec,
				       n.ts_subsec);
			}
			printf("\n");
		} else {
			struct ioam_e2e e;

			err = ioam_e2e_doh_decode(raw, len, &e);
			if (err)
				printf("%s\n", ioam_strerror(err));
			else
				printf("ok %u %zu %zu %u %u %llu %u %u\n", e.next_header, e.doh_len, e.opt_off, e.namespace_id,
				       e.e2e_type, (unsigned long long)e.seq, e.ts_sec, e.ts_nsec);
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	char path[512];
	const struct mj *v;
	struct mj *root;
	struct dirent *de;
	DIR *d;

	if (argc == 2 && !strcmp(argv[1], "--layouts"))
		return print_layouts();
	if (argc == 3 && !strcmp(argv[1], "--classify"))
		return classify(argv[2]);
	if (argc != 2) {
		fprintf(stderr, "usage: %s <vectors dir> | --layouts | --classify trace|e2e\n", argv[0]);
		return 2;
	}
	d = opendir(argv[1]);
	if (!d) {
		fprintf(stderr, "cannot open %s\n", argv[1]);
		return 2;
	}
	while ((de = readdir(d))) {
		size_t l = strlen(de->d_name);

		if (!strncmp(de->d_name, "ioam_batch_", 11) && l > 5 && !strcmp(de->d_name + l - 5, ".json"))
			test_batch(argv[1], de->d_name);
	}
	closedir(d);
	snprintf(path, sizeof(path), "%s/ioam_trace_option.json", argv[1]);
	root = mj_load(path);
	for (v = mj_get(root, "decode")->child; v; v = v->next)
		test_trace_decode(v);
	for (v = mj_get(root, "encode")->child; v; v = v->next)
		test_trace_encode(v);
	snprintf(path, sizeof(path), "%s/ioam_e2e_option.json", argv[1]);
	root = mj_load(path);
	for (v = mj_get(root, "decode")->child; v; v = v->next)
		test_e2e_decode(v);
	for (v = mj_get(root, "encode")->child; v; v = v->next)
		test_e2e_encode(v);
	printf("%d passed, %d failed\n", passed, failed);
	return failed || !passed;
}
