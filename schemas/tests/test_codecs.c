// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * test_codecs: decodes every vector in schemas/vectors/ with the C headers
 * and checks it against expectations.txt (written by make_vectors.py from the
 * same data as the .json files). Fields are reached through the C structs
 * (offsetof/sizeof), so a layout change in a header fails here.
 *
 * usage: test_codecs [VECTOR_DIR]     (default schemas/vectors)
 * Last line: "N passed, M failed"; exit 1 if anything failed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stamp_batch.h"
#include "stamp_record.h"
#include "stamp_test_packet.h"

struct field {
	const char *name;
	size_t offset, size;
};

#define F(type, member, name) { name, offsetof(type, member), sizeof(((type *)0)->member) }

static const struct field record_fields[] = {
	F(struct stamp_record, t1_ns, "t1_ns"), F(struct stamp_record, t2_ns, "t2_ns"),
	F(struct stamp_record, t3_ns, "t3_ns"), F(struct stamp_record, t4_ns, "t4_ns"),
	F(struct stamp_record, sender_seq, "sender_seq"),
	F(struct stamp_record, reflector_seq, "reflector_seq"),
	F(struct stamp_record, ssid, "ssid"),
	F(struct stamp_record, sender_err_est, "sender_err_est"),
	F(struct stamp_record, reflector_err_est, "reflector_err_est"),
	F(struct stamp_record, sender_ttl, "sender_ttl"),
	F(struct stamp_record, reply_hop_limit, "reply_hop_limit"),
	F(struct stamp_record, ifindex, "ifindex"), F(struct stamp_record, flags, "flags"),
	F(struct stamp_record, reserved, "reserved"),
	{ 0 },
};

static const struct field sender_fields[] = {
	F(struct stamp_sender_packet, seq, "seq"),
	F(struct stamp_sender_packet, ts.sec, "ts_sec"), F(struct stamp_sender_packet, ts.frac, "ts_frac"),
	F(struct stamp_sender_packet, err_est, "err_est"), F(struct stamp_sender_packet, ssid, "ssid"),
	{ 0 },
};

static const struct field reflector_fields[] = {
	F(struct stamp_reflector_packet, seq, "seq"),
	F(struct stamp_reflector_packet, ts.sec, "ts_sec"),
	F(struct stamp_reflector_packet, ts.frac, "ts_frac"),
	F(struct stamp_reflector_packet, err_est, "err_est"),
	F(struct stamp_reflector_packet, ssid, "ssid"),
	F(struct stamp_reflector_packet, rx_ts.sec, "rx_sec"),
	F(struct stamp_reflector_packet, rx_ts.frac, "rx_frac"),
	F(struct stamp_reflector_packet, sender_seq, "sender_seq"),
	F(struct stamp_reflector_packet, sender_ts.sec, "sender_ts_sec"),
	F(struct stamp_reflector_packet, sender_ts.frac, "sender_ts_frac"),
	F(struct stamp_reflector_packet, sender_err_est, "sender_err_est"),
	F(struct stamp_reflector_packet, sender_ttl, "sender_ttl"),
	{ 0 },
};

static int failures;

static void fail(const char *vec, const char *fmt, const char *a, uint64_t want, uint64_t got)
{
	printf("FAIL %s: ", vec);
	printf(fmt, a, want, got);
	printf("\n");
	failures++;
}

static const struct field *find_field(const struct field *t, const char *name)
{
	for (; t->name; t++)
		if (strcmp(t->name, name) == 0)
			return t;
	return NULL;
}

/* Read a 1/2/4/8-byte field; big_endian for wire packets, host (LE) for records. */
static uint64_t read_field(const uint8_t *base, const struct field *f, int big_endian)
{
	uint64_t v = 0;

	for (size_t i = 0; i < f->size; i++) {
		size_t idx = big_endian ? i : f->size - 1 - i;
		v = (v << 8) | base[f->offset + idx];
	}
	return v;
}

static uint8_t *load_hex(const char *dir, const char *name, size_t *len)
{
	char path[1024];
	FILE *f;
	uint8_t *buf;
	size_t cap = 1 << 16, n = 0;
	unsigned int byte;

	snprintf(path, sizeof(path), "%s/%s.hex", dir, name);
	f = fopen(path, "r");
	if (!f)
		return NULL;
	buf = malloc(cap);
	while (fscanf(f, "%2x", &byte) == 1) {
		if (n == cap)
			buf = realloc(buf, cap *= 2);
		buf[n++] = byte;
	}
	fclose(f);
	*len = n;
	return buf;
}

static uint64_t u64(const char *s)
{
	return strtoull(s, NULL, 10);
}

/* key=value tokens of one expectations line, after "kind name" */
struct kv {
	char *key, *val;
};

static int split_kv(char *rest, struct kv *out, int max)
{
	int n = 0;

	for (char *tok = strtok(rest, " \n"); tok && n < max; tok = strtok(NULL, " \n")) {
		char *eq = strchr(tok, '=');

		if (!eq)
			continue;
		*eq = 0;
		out[n++] = (struct kv){ tok, eq + 1 };
	}
	return n;
}

static const char *kv_get(const struct kv *kv, int n, const char *key)
{
	for (int i = 0; i < n; i++)
		if (strcmp(kv[i].key, key) == 0)
			return kv[i].val;
	return NULL;
}

static void check_batch(const char *name, const uint8_t *buf, size_t len, struct kv *kv, int n)
{
	const struct stamp_record *recs;
	struct stamp_batch_header h;
	const char *err = kv_get(kv, n, "error");
	int64_t got = stamp_batch_decode(buf, len, &recs, &h);

	if (err) {
		int64_t want = strcmp(err, "EBADMSG") == 0 ? -EBADMSG : -EMSGSIZE;

		if (got != want)
			fail(name, "%s: want %" PRId64 " got %" PRId64, "error", want, got);
		return;
	}
	if (got < 0) {
		fail(name, "%s: valid vector rejected (want %" PRIu64 ", got %" PRIu64 ")", "decode", 0, got);
		return;
	}
	if ((uint64_t)got != u64(kv_get(kv, n, "record_count")))
		fail(name, "%s: want %" PRIu64 " got %" PRIu64, "record_count", u64(kv_get(kv, n, "record_count")), got);
	if (h.header_size != u64(kv_get(kv, n, "header_size")))
		fail(name, "%s: want %" PRIu64 " got %" PRIu64, "header_size", u64(kv_get(kv, n, "header_size")), h.header_size);
	if (h.flags != u64(kv_get(kv, n, "flags")))
		fail(name, "%s: want %" PRIu64 " got %" PRIu64, "flags", u64(kv_get(kv, n, "flags")), h.flags);
	if (h.batch_seq != u64(kv_get(kv, n, "batch_seq")))
		fail(name, "%s: want %" PRIu64 " got %" PRIu64, "batch_seq", u64(kv_get(kv, n, "batch_seq")), h.batch_seq);
	if (strncmp(h.node, kv_get(kv, n, "node"), STAMP_BATCH_NODE_LEN) != 0)
		fail(name, "%s mismatch (%" PRIu64 "/%" PRIu64 ")", "node", 0, 0);

	/* records: rN.field=value, read through struct stamp_record */
	for (int i = 0; i < n; i++) {
		char fname[64];
		unsigned idx;

		if (sscanf(kv[i].key, "r%u.%63s", &idx, fname) != 2)
			continue;
		const struct field *f = find_field(record_fields, fname);

		if (!f || idx >= (unsigned)got) {
			fail(name, "unknown record field %s (%" PRIu64 "/%" PRIu64 ")", kv[i].key, idx, got);
			continue;
		}
		uint64_t v = read_field((const uint8_t *)&recs[idx], f, 0);

		if (v != u64(kv[i].val))
			fail(name, "%s: want %" PRIu64 " got %" PRIu64, kv[i].key, u64(kv[i].val), v);
	}

	/* the encoder must reproduce a standard header byte for byte */
	if (h.header_size == STAMP_BATCH_HEADER_SIZE && h.flags == 0) {
		uint8_t enc[STAMP_BATCH_HEADER_SIZE];
		char node[STAMP_BATCH_NODE_LEN + 1] = { 0 };

		memcpy(node, h.node, STAMP_BATCH_NODE_LEN);
		stamp_batch_encode_header(enc, node, h.record_count, h.batch_seq);
		if (memcmp(enc, buf, sizeof(enc)) != 0)
			fail(name, "%s: re-encoded header differs (%" PRIu64 "/%" PRIu64 ")", "encode", 0, 0);
	}
}

static void check_packet(const char *name, const struct field *table, const uint8_t *buf, size_t len,
			 struct kv *kv, int n)
{
	const char *err = kv_get(kv, n, "error");

	if (err) {   /* the only packet error: shorter than the 44-byte base */
		if (len >= STAMP_BASE_LEN)
			fail(name, "%s: want short packet, got %" PRIu64 " >= %" PRIu64, "length", len, STAMP_BASE_LEN);
		return;
	}
	if (len < STAMP_BASE_LEN) {
		fail(name, "%s: %" PRIu64 " < %" PRIu64, "length", len, STAMP_BASE_LEN);
		return;
	}
	for (int i = 0; i < n; i++) {
		const struct field *f = find_field(table, kv[i].key);

		if (!f) {
			fail(name, "unknown field %s (%" PRIu64 "/%" PRIu64 ")", kv[i].key, 0, 0);
			continue;
		}
		uint64_t v = read_field(buf, f, 1);

		if (v != u64(kv[i].val))
			fail(name, "%s: want %" PRIu64 " got %" PRIu64, kv[i].key, u64(kv[i].val), v);
	}
}

static void check_ptp(const char *name, struct kv *kv, int n)
{
	uint64_t want = u64(kv_get(kv, n, "expect_ns"));
	uint64_t got = stamp_ptp_to_ns((__u32)u64(kv_get(kv, n, "sec")), (__u32)u64(kv_get(kv, n, "nsec")),
				       u64(kv_get(kv, n, "ref_ns")));

	if (got != want)
		fail(name, "%s: want %" PRIu64 " got %" PRIu64, "ptp_to_ns", want, got);
}

int main(int argc, char **argv)
{
	const char *dir = argc > 1 ? argv[1] : "schemas/vectors";
	char path[1024], line[65536];
	int passed = 0, failed = 0;
	FILE *f;

	snprintf(path, sizeof(path), "%s/expectations.txt", dir);
	f = fopen(path, "r");
	if (!f) {
		fprintf(stderr, "test_codecs: %s: %s\n", path, strerror(errno));
		return 2;
	}
	while (fgets(line, sizeof(line), f)) {
		char kind[64], name[128];
		struct kv kv[256];
		int consumed, n, before = failures;
		uint8_t *buf = NULL;
		size_t len = 0;

		if (line[0] == '#' || sscanf(line, "%63s %127s %n", kind, name, &consumed) != 2)
			continue;
		n = split_kv(line + consumed, kv, 256);
		if (strcmp(kind, "ptp_to_ns") == 0) {
			check_ptp(name, kv, n);
		} else if (!(buf = load_hex(dir, name, &len))) {
			fail(name, "%s: missing .hex (%" PRIu64 "/%" PRIu64 ")", "file", 0, 0);
		} else if (strcmp(kind, "stamp_batch") == 0) {
			check_batch(name, buf, len, kv, n);
		} else if (strcmp(kind, "stamp_sender") == 0) {
			check_packet(name, sender_fields, buf, len, kv, n);
		} else if (strcmp(kind, "stamp_reflector") == 0) {
			check_packet(name, reflector_fields, buf, len, kv, n);
		} else {
			fail(name, "unknown kind %s (%" PRIu64 "/%" PRIu64 ")", kind, 0, 0);
		}
		free(buf);
		if (failures == before) {
			printf("ok   %s %s\n", kind, name);
			passed++;
		} else {
			failed++;
		}
	}
	fclose(f);
	printf("%d passed, %d failed\n", passed, failed);
	return failed || passed == 0 ? 1 : 0;
}
