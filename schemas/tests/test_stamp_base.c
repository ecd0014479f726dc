// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * test_stamp_base: the STAMP base wire formats in C —
 * stamp_timestamp.h, stamp_error_estimate.h, stamp_auth_packet.h, stamp_hmac.h —
 * against the vectors in schemas/vectors/stamp_{timestamp,error_estimate,
 * auth_packet,hmac}.json (written from the RFCs by make_stamp_base_vectors.py),
 * plus property checks of the stated bounds on pseudo-random inputs and the
 * HMAC key table (rotation, validity windows, error codes).
 *
 * usage: test_stamp_base [VECTOR_DIR]     (default schemas/vectors)
 * Last line: "N passed, M failed"; exit 1 if anything failed.
 *        test_stamp_base --hmac         reads "KEYHEX DATAHEX" lines on stdin and prints
 *                                       the full HMAC-SHA-256 of each (cross-check with hashlib)
 */
#include <arpa/inet.h>
#include <inttypes.h>
#include <stddef.h>

#include "mini_json.h"
#include "stamp_auth_packet.h"
#include "stamp_error_estimate.h"
#include "stamp_hmac.h"
#include "stamp_timestamp.h"

static int passed, failed;

#define CHECK(cond, ...)                                   \
	do {                                                   \
		if (cond) {                                        \
			passed++;                                      \
		} else {                                           \
			failed++;                                      \
			printf("FAIL %s:%d: ", __func__, __LINE__);    \
			printf(__VA_ARGS__);                           \
			printf("\n");                                  \
		}                                                  \
	} while (0)

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static uint64_t rnd(void)   /* xorshift64*: deterministic */
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545f4914f6cdd1dULL;
}

static struct mj *load(const char *dir, const char *name)
{
	char path[512];

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	return mj_load(path);
}

/* ------------------------------------------------------------ timestamps */

static void test_timestamp_vectors(const char *dir)
{
	struct mj *doc = load(dir, "stamp_timestamp.json"), *v;

	for (v = mj_get(doc, "vectors")->child; v; v = v->next) {
		const char *name = mj_str(v, "name");
		enum stamp_ts_format fmt = strcmp(mj_str(v, "format"), "ptp") ? STAMP_TS_NTP : STAMP_TS_PTP;
		struct stamp_timestamp ts, enc;
		int32_t off = (int32_t)mj_i64(v, "tai_utc_offset_s");
		uint64_t ref = mj_u64(v, "ref_tai_ns");
		__u64 got = 0;   /* __u64 is unsigned long long: no uint64_t * aliasing */
		int err;

		CHECK(mj_hex(mj_str(v, "hex"), (uint8_t *)&ts, sizeof(ts)) == 8, "%s: 8 bytes", name);
		CHECK(ntohl(ts.sec) == mj_u64(v, "sec") && ntohl(ts.frac) == mj_u64(v, "frac"),
		      "%s: sec/frac at offsets 0/4", name);
		err = stamp_ts_to_tai_ns(fmt, &ts, off, ref, &got);
		if (!mj_u64(v, "valid")) {
			CHECK(err == -STAMP_TS_EINVAL, "%s: want -EINVAL, got %d", name, err);
			continue;
		}
		CHECK(err == 0 && got == mj_u64(v, "tai_ns"), "%s: tai_ns want %" PRIu64 " got %" PRIu64 " (%d)",
		      name, mj_u64(v, "tai_ns"), (uint64_t)got, err);
		err = stamp_ts_from_tai_ns(fmt, mj_u64(v, "tai_ns"), off, &enc);
		if (mj_u64(v, "encode_exact"))
			CHECK(err == 0 && !memcmp(&enc, &ts, 8), "%s: re-encode gives the vector bytes", name);
		else
			CHECK(err == 0 && memcmp(&enc, &ts, 8), "%s: re-encode differs as documented", name);
	}
}

static int64_t absdiff(uint64_t a, uint64_t b)
{
	return a > b ? (int64_t)(a - b) : (int64_t)(b - a);
}

static void test_timestamp_bounds(void)
{
	const int n = 200000;
	int i, enc_bad = 0, dec_bad = 0, rt_bad = 0, frt_bad = 0, ptp_bad = 0;
	int64_t worst_frt = 0;

	for (i = 0; i < n; i++) {
		uint32_t nsec = (uint32_t)(rnd() % STAMP_NS_PER_SEC), frac = (uint32_t)rnd(), f2, s2, sec;
		uint64_t tai = (uint64_t)(1500000000ULL + rnd() % 1000000000ULL) * STAMP_NS_PER_SEC + nsec;
		uint64_t ns = stamp_ntp_nsec_from_frac(frac), back;
		uint32_t fr = stamp_ntp_frac_from_nsec(nsec);

		/* |frac/2^32 - nsec/1e9| <= 2^-33 s  <=>  |frac*1e9 - nsec*2^32| <= 1e9/2 */
		if (absdiff((uint64_t)fr * STAMP_NS_PER_SEC, (uint64_t)nsec << 32) > (int64_t)STAMP_NS_PER_SEC / 2)
			enc_bad++;
		/* |ns - frac*1e9/2^32| <= 0.5 ns  <=>  |ns*2^32 - frac*1e9| <= 2^31 */
		if (absdiff(ns << 32, (uint64_t)frac * STAMP_NS_PER_SEC) > (1LL << 31))
			dec_bad++;
		/* TAI ns -> NTP -> TAI ns exact, reference up to a day away */
		stamp_ntp_from_tai_ns(tai, 37, &sec, &f2);
		back = stamp_ntp_to_tai_ns(sec, f2, 37, tai + (rnd() % 86400) * STAMP_NS_PER_SEC);
		if (back != tai)
			rt_bad++;
		/* NTP -> ns -> NTP within 2 units (ns is coarser than 2^-32 s) */
		s2 = stamp_ntp_frac_from_nsec(ns >= STAMP_NS_PER_SEC ? 0 : (uint32_t)ns);
		if (ns < STAMP_NS_PER_SEC) {
			int64_t d = absdiff(s2, frac);

			if (d > worst_frt)
				worst_frt = d;
			if (d > 2)
				frt_bad++;
		}
		stamp_ptp_from_tai_ns(tai, &sec, &f2);
		if (stamp_ptp_to_tai_ns(sec, f2, tai - (rnd() % 86400) * STAMP_NS_PER_SEC) != tai)
			ptp_bad++;
	}
	CHECK(!enc_bad, "%d ns->NTP conversions off by more than 2^-33 s", enc_bad);
	CHECK(!dec_bad, "%d NTP->ns conversions off by more than 0.5 ns", dec_bad);
	CHECK(!rt_bad, "%d TAI->NTP->TAI round trips not exact", rt_bad);
	CHECK(!frt_bad && worst_frt >= 1, "NTP->ns->NTP: %d over 2 units, worst %" PRId64, frt_bad, worst_frt);
	CHECK(!ptp_bad, "%d PTP round trips not exact", ptp_bad);
	CHECK(stamp_ntp_from_tai_ns(36ULL * STAMP_NS_PER_SEC, 37, &(uint32_t){ 0 }, &(uint32_t){ 0 }) ==
	      -STAMP_TS_ERANGE, "TAI before the UTC epoch refused");
	CHECK(stamp_ts_format_of(0x4001) == STAMP_TS_PTP && stamp_ts_format_of(0x8001) == STAMP_TS_NTP,
	      "format from the Z bit");
}

/* -------------------------------------------------------- error estimate */

static void test_error_estimate_vectors(const char *dir)
{
	struct mj *doc = load(dir, "stamp_error_estimate.json"), *v;

	for (v = mj_get(doc, "decode")->child; v; v = v->next) {
		const char *name = mj_str(v, "name");
		uint8_t b[2];
		struct stamp_ee_fields f;
		int err;

		mj_hex(mj_str(v, "hex"), b, 2);
		err = stamp_ee_unpack((uint16_t)(b[0] << 8 | b[1]), &f);
		CHECK(f.s == mj_u64(v, "S") && f.z == mj_u64(v, "Z") && f.scale == mj_u64(v, "scale") &&
		      f.multiplier == mj_u64(v, "multiplier"), "%s: fields", name);
		if (!mj_u64(v, "valid")) {
			CHECK(err == -STAMP_EE_EINVAL, "%s: multiplier 0 refused", name);
			continue;
		}
		CHECK(err == 0 && stamp_ee_to_error_ns(f.scale, f.multiplier) == mj_u64(v, "error_ns"),
		      "%s: error_ns want %" PRIu64 " got %" PRIu64, name, mj_u64(v, "error_ns"),
		      (uint64_t)stamp_ee_to_error_ns(f.scale, f.multiplier));
		CHECK(stamp_ee_pack(f.s, f.z, f.scale, f.multiplier) == (b[0] << 8 | b[1]), "%s: re-pack", name);
	}
	for (v = mj_get(doc, "encode")->child; v; v = v->next) {
		const char *name = mj_str(v, "name");
		uint8_t scale, mult;

		stamp_ee_from_error_ns(mj_u64(v, "error_ns"), &scale, &mult);
		CHECK(scale == mj_u64(v, "scale") && mult == mj_u64(v, "multiplier"),
		      "%s: want (%" PRIu64 ",%" PRIu64 ") got (%u,%u)", name, mj_u64(v, "scale"),
		      mj_u64(v, "multiplier"), scale, mult);
		CHECK(stamp_ee_to_error_ns(scale, mult) == mj_u64(v, "encoded_error_ns"), "%s: encoded ns", name);
	}
	for (v = mj_get(doc, "clock")->child; v; v = v->next) {
		const char *name = mj_str(v, "name");
		struct stamp_clock_state cs = {
			.state = (int)mj_i64(v, "state"), .status = (int)mj_i64(v, "status"),
			.maxerror_us = (long)mj_i64(v, "maxerror_us"), .esterror_us = (long)mj_i64(v, "esterror_us"),
		};
		enum stamp_ts_format fmt = strcmp(mj_str(v, "format"), "ptp") ? STAMP_TS_NTP : STAMP_TS_PTP;
		uint8_t b[2];

		cs.synced = stamp_clock_synced(cs.state, cs.status, cs.maxerror_us);
		mj_hex(mj_str(v, "hex"), b, 2);
		CHECK(cs.synced == (int)mj_u64(v, "S"), "%s: S", name);
		CHECK(stamp_clock_error_ns(&cs) == mj_u64(v, "error_ns"), "%s: error_ns", name);
		CHECK(stamp_ee_from_clock(&cs, fmt) == (b[0] << 8 | b[1]), "%s: Error Estimate 0x%04x", name,
		      stamp_ee_from_clock(&cs, fmt));
	}
}

/* value of (scale, mult) * 2^32 in ns units: mult * 1e9 * 2^scale (128-bit) */
static unsigned __int128 ee_val(unsigned scale, unsigned mult)
{
	return (unsigned __int128)mult * STAMP_NS_PER_SEC << scale;
}

static void test_error_estimate_bounds(void)
{
	int i, low = 0, not_min = 0;

	for (i = 0; i < 100000; i++) {
		uint64_t err = rnd() >> (rnd() % 64);
		unsigned __int128 want = (unsigned __int128)err << 32;
		uint8_t s, m;

		stamp_ee_from_error_ns(err, &s, &m);
		if (ee_val(s, m) < want || stamp_ee_to_error_ns(s, m) < err)
			low++;
		/* minimal: one multiplier less is below, and one scale less needs > 255 */
		if (m > 1 && ee_val(s, m - 1) >= want)
			not_min++;
		if (s > 0 && (want + ee_val(s - 1, 1) - 1) / ee_val(s - 1, 1) <= 255 && err)
			not_min++;
	}
	CHECK(!low, "%d encodings understate the error", low);
	CHECK(!not_min, "%d encodings not the smallest >= the error", not_min);
}

static void test_clock_live(void)
{
	struct stamp_clock_state cs = { 0 };
	uint16_t ee;

	CHECK(stamp_clock_read(&cs) == 0, "adjtimex readable");
	ee = stamp_ee_from_clock(&cs, STAMP_TS_PTP);
	CHECK(!!(ee & STAMP_EE_S) == cs.synced && (ee & STAMP_EE_Z) && STAMP_EE_MULT(ee) != 0,
	      "live Error Estimate 0x%04x matches the clock (synced=%d)", ee, cs.synced);
	CHECK(stamp_ee_to_error_ns(STAMP_EE_SCALE(ee), STAMP_EE_MULT(ee)) >= stamp_clock_error_ns(&cs),
	      "live Error Estimate not below the clock's error");
	printf("clock: state=%d status=0x%x maxerror=%ldus esterror=%ldus tai=%d synced=%d ee=0x%04x\n",
	       cs.state, cs.status, cs.maxerror_us, cs.esterror_us, cs.tai_offset_s, cs.synced, ee);
}

/* ------------------------------------------------------------ auth packet */

struct field {
	const char *name;
	size_t offset, size;
};

#define F(type, member, name) { name, offsetof(type, member), sizeof(((type *)0)->member) }

static const struct field sender_fields[] = {
	F(struct stamp_auth_sender_packet, seq, "seq"), F(struct stamp_auth_sender_packet, mbz0, "mbz0"),
	F(struct stamp_auth_sender_packet, ts.sec, "ts_sec"),
	F(struct stamp_auth_sender_packet, ts.frac, "ts_frac"),
	F(struct stamp_auth_sender_packet, err_est, "err_est"),
	F(struct stamp_auth_sender_packet, ssid, "ssid"), F(struct stamp_auth_sender_packet, mbz1, "mbz1"),
	F(struct stamp_auth_sender_packet, hmac, "hmac"), { 0 },
};

static const struct field reflector_fields[] = {
	F(struct stamp_auth_reflector_packet, seq, "seq"),
	F(struct stamp_auth_reflector_packet, mbz0, "mbz0"),
	F(struct stamp_auth_reflector_packet, ts.sec, "ts_sec"),
	F(struct stamp_auth_reflector_packet, ts.frac, "ts_frac"),
	F(struct stamp_auth_reflector_packet, err_est, "err_est"),
	F(struct stamp_auth_reflector_packet, ssid, "ssid"),
	F(struct stamp_auth_reflector_packet, mbz1, "mbz1"),
	F(struct stamp_auth_reflector_packet, rx_ts.sec, "rx_sec"),
	F(struct stamp_auth_reflector_packet, rx_ts.frac, "rx_frac"),
	F(struct stamp_auth_reflector_packet, mbz2, "mbz2"),
	F(struct stamp_auth_reflector_packet, sender_seq, "sender_seq"),
	F(struct stamp_auth_reflector_packet, mbz3, "mbz3"),
	F(struct stamp_auth_reflector_packet, sender_ts.sec, "sender_ts_sec"),
	F(struct stamp_auth_reflector_packet, sender_ts.frac, "sender_ts_frac"),
	F(struct stamp_auth_reflector_packet, sender_err_est, "sender_err_est"),
	F(struct stamp_auth_reflector_packet, mbz4, "mbz4"),
	F(struct stamp_auth_reflector_packet, sender_ttl, "sender_ttl"),
	F(struct stamp_auth_reflector_packet, mbz5, "mbz5"),
	F(struct stamp_auth_reflector_packet, hmac, "hmac"), { 0 },
};

static const struct field *find_field(const struct field *t, const char *name)
{
	for (; t->name; t++)
		if (!strcmp(t->name, name))
			return t;
	return NULL;
}

static uint64_t read_be(const uint8_t *p, size_t n)
{
	uint64_t v = 0;

	while (n--)
		v = v << 8 | *p++;
	return v;
}

static void test_auth_layouts(struct mj *doc)
{
	const char *kinds[] = { "sender", "reflector" };
	const struct field *tables[] = { sender_fields, reflector_fields };
	int k;

	for (k = 0; k < 2; k++) {
		struct mj *f;
		int n = 0, m = 0;

		for (f = mj_get(mj_get(doc, "layouts"), kinds[k])->child; f; f = f->next, n++) {
			const struct field *c = find_field(tables[k], mj_str(f, "field"));

			CHECK(c && c->offset == mj_u64(f, "offset") && c->size == mj_u64(f, "size"),
			      "%s.%s at offset %" PRIu64 " size %" PRIu64, kinds[k], mj_str(f, "field"),
			      mj_u64(f, "offset"), mj_u64(f, "size"));
		}
		while (tables[k][m].name)
			m++;
		CHECK(n == m, "%s: %d RFC fields, %d struct fields", kinds[k], n, m);
	}
	CHECK(mj_u64(mj_get(doc, "hmac_covers"), "length") == STAMP_AUTH_HMAC_OFFSET, "HMAC covers 0..95");
}

static void test_auth_vectors(const char *dir)
{
	struct mj *doc = load(dir, "stamp_auth_packet.json"), *v;

	test_auth_layouts(doc);
	for (v = mj_get(doc, "vectors")->child; v; v = v->next) {
		const char *name = mj_str(v, "name");
		int is_sender = !strcmp(mj_str(v, "kind"), "sender");
		const struct field *table = is_sender ? sender_fields : reflector_fields;
		struct stamp_hmac_keytab tab = { 0 };
		uint8_t pkt[256], key[64], copy[STAMP_AUTH_LEN];
		size_t len = mj_hex(mj_str(v, "hex"), pkt, sizeof(pkt));
		size_t klen = mj_hex(mj_str(v, "key_hex"), key, sizeof(key));
		uint32_t id = 0;
		struct mj *f;
		int err;

		CHECK(len == mj_u64(v, "length"), "%s: length", name);
		stamp_hmac_keytab_add(&tab, 42, key, klen, 0, STAMP_HMAC_FOREVER);
		stamp_hmac_keytab_set_current(&tab, 42);
		err = stamp_auth_verify(&tab, 1, pkt, len, &id);
		if (!mj_u64(v, "valid")) {
			CHECK(err == -EMSGSIZE, "%s: short packet refused (%d)", name, err);
			continue;
		}
		for (f = mj_get(v, "fields")->child; f; f = f->next) {
			const struct field *c = find_field(table, f->key);

			CHECK(c && read_be(pkt + c->offset, c->size) == f->u, "%s: field %s", name, f->key);
		}
		if (mj_u64(v, "hmac_ok")) {
			CHECK(err == 0 && id == 42, "%s: HMAC verifies (%d)", name, err);
			memcpy(copy, pkt, sizeof(copy));
			memset(copy + STAMP_AUTH_HMAC_OFFSET, 0, STAMP_AUTH_HMAC_LEN);
			CHECK(stamp_auth_sign(&tab, 1, copy, sizeof(copy), &id) == 0 && !memcmp(copy, pkt, 112),
			      "%s: signing reproduces the packet", name);
		} else {
			CHECK(err == -EBADMSG, "%s: integrity failure detected (%d)", name, err);
		}
	}
}

/* ------------------------------------------------------------------ hmac */

static void test_hmac_vectors(const char *dir)
{
	struct mj *doc = load(dir, "stamp_hmac.json"), *v;

	for (v = mj_get(doc, "vectors")->child; v; v = v->next) {
		uint8_t key[256], data[256], want[32], got[32];
		size_t kl = mj_hex(mj_str(v, "key_hex"), key, sizeof(key));
		size_t dl = mj_hex(mj_str(v, "data_hex"), data, sizeof(data));

		mj_hex(mj_str(v, "hmac_sha256"), want, 32);
		stamp_hmac_sha256(key, kl, data, dl, got);
		CHECK(!memcmp(got, want, 32), "%s: HMAC-SHA-256", mj_str(v, "name"));
		mj_hex(mj_str(v, "hmac_sha256_128"), want, 16);
		stamp_hmac_sha256_128(key, kl, data, dl, got);
		CHECK(!memcmp(got, want, 16), "%s: truncated to 128 bits", mj_str(v, "name"));
	}
}

static void test_keytab(void)
{
	const uint8_t k1[] = "key-one-0123456789", k2[] = "key-two-0123456789", big[65] = { 0 };
	struct stamp_hmac_keytab t = { 0 };
	uint8_t msg[96] = { 1, 2, 3 }, mac1[16], mac2[16];
	const uint64_t s = STAMP_NS_PER_SEC, t0 = 1000 * s;
	uint32_t id = 0;
	int i;

	CHECK(stamp_hmac_sign(&t, t0, msg, 96, mac1, &id) == -ENOKEY, "sign without a current key");
	CHECK(stamp_hmac_verify(&t, t0, msg, 96, mac1, &id) == -ENOKEY, "verify with an empty table");
	CHECK(stamp_hmac_keytab_add(&t, 1, k1, sizeof(k1), 0, STAMP_HMAC_FOREVER) == 0, "add key 1");
	CHECK(stamp_hmac_keytab_add(&t, 1, k2, sizeof(k2), 0, STAMP_HMAC_FOREVER) == -EEXIST, "dup id");
	CHECK(stamp_hmac_keytab_add(&t, 9, big, sizeof(big), 0, 1) == -EINVAL, "65-byte key refused");
	CHECK(stamp_hmac_keytab_add(&t, 9, k1, 0, 0, 1) == -EINVAL, "empty key refused");
	CHECK(stamp_hmac_keytab_add(&t, 9, k1, 4, 5, 5) == -EINVAL, "empty window refused");
	CHECK(stamp_hmac_keytab_set_current(&t, 7) == -ENOENT, "unknown current id");
	CHECK(stamp_hmac_keytab_set_current(&t, 1) == 0, "current = 1");
	CHECK(stamp_hmac_sign(&t, t0, msg, 96, mac1, &id) == 0 && id == 1, "sign with key 1");
	/* rotation at t0+10 s with a 5 s grace for key 1 */
	CHECK(stamp_hmac_keytab_rotate(&t, 2, k2, sizeof(k2), t0 + 10 * s, 5 * s) == 0, "rotate to 2");
	CHECK(stamp_hmac_sign(&t, t0 + 11 * s, msg, 96, mac2, &id) == 0 && id == 2, "sign with key 2");
	CHECK(memcmp(mac1, mac2, 16), "different keys, different HMACs");
	CHECK(stamp_hmac_verify(&t, t0 + 14 * s, msg, 96, mac1, &id) == 0 && id == 1, "old key in grace");
	CHECK(stamp_hmac_verify(&t, t0 + 15 * s, msg, 96, mac1, &id) == -EBADMSG, "old key after grace");
	CHECK(stamp_hmac_verify(&t, t0 + 15 * s, msg, 96, mac2, &id) == 0 && id == 2, "new key");
	CHECK(stamp_hmac_verify(&t, t0 + 9 * s, msg, 96, mac2, &id) == -EBADMSG, "new key before its window");
	msg[95] ^= 1;
	CHECK(stamp_hmac_verify(&t, t0 + 12 * s, msg, 96, mac2, &id) == -EBADMSG, "tampered message");
	msg[95] ^= 1;
	CHECK(stamp_hmac_keytab_remove(&t, 2) == 0 && !t.has_current, "remove current key");
	CHECK(stamp_hmac_sign(&t, t0 + 12 * s, msg, 96, mac2, &id) == -ENOKEY, "no current after removal");
	CHECK(stamp_hmac_keytab_remove(&t, 2) == -ENOENT, "remove twice");
	CHECK(stamp_hmac_keytab_set_current(&t, 1) == 0 &&
	      stamp_hmac_sign(&t, t0 + 20 * s, msg, 96, mac2, &id) == -EKEYEXPIRED, "expired current key");
	CHECK(stamp_hmac_verify(&t, t0 + 20 * s, msg, 96, mac1, &id) == -ENOKEY, "no key valid then");
	for (i = 10; i < 10 + STAMP_HMAC_KEYS_MAX - 1; i++)
		stamp_hmac_keytab_add(&t, (uint32_t)i, k1, 4, 0, STAMP_HMAC_FOREVER);
	CHECK(stamp_hmac_keytab_add(&t, 99, k1, 4, 0, STAMP_HMAC_FOREVER) == -ENOSPC, "table full");
	CHECK(stamp_hmac_equal(mac1, mac1, 16) && !stamp_hmac_equal(mac1, mac2, 16), "equal()");
}

/* Long message (several blocks, 55/56/64-byte padding edges) against a fixed reference. */
static void test_sha256_edges(void)
{
	/* FIPS 180-2 appendix B.2: "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq" */
	const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
	static const uint8_t want[32] = {
		0x24, 0x8d, 0x6a, 0x61, 0xd2, 0x06, 0x38, 0xb8, 0xe5, 0xc0, 0x26, 0x93, 0x0c, 0x3e, 0x60, 0x39,
		0xa3, 0x3c, 0xe4, 0x59, 0x64, 0xff, 0x21, 0x67, 0xf6, 0xec, 0xed, 0xd4, 0x19, 0xdb, 0x06, 0xc1,
	};
	struct stamp_sha256 c;
	uint8_t got[32];

	stamp_sha256_init(&c);
	stamp_sha256_update(&c, m, strlen(m));
	stamp_sha256_final(&c, got);
	CHECK(!memcmp(got, want, 32), "SHA-256 of the FIPS 180-2 two-block message");
}

/* --hmac: one "KEYHEX DATAHEX" per line ('-' for empty) -> HMAC-SHA-256 hex per line */
static int hmac_filter(void)
{
	static char line[8192], khex[4096], dhex[4096];
	static uint8_t key[2048], data[2048];

	while (fgets(line, sizeof(line), stdin)) {
		uint8_t out[32];
		size_t kl, dl;
		int i;

		if (sscanf(line, "%4095s %4095s", khex, dhex) != 2)
			return 2;
		kl = strcmp(khex, "-") ? mj_hex(khex, key, sizeof(key)) : 0;
		dl = strcmp(dhex, "-") ? mj_hex(dhex, data, sizeof(data)) : 0;
		stamp_hmac_sha256(key, kl, data, dl, out);
		for (i = 0; i < 32; i++)
			printf("%02x", out[i]);
		printf("\n");
	}
	return 0;
}

int main(int argc, char **argv)
{
	const char *dir = argc > 1 ? argv[1] : "schemas/vectors";

	if (argc > 1 && !strcmp(argv[1], "--hmac"))
		return hmac_filter();

	test_timestamp_vectors(dir);
	test_timestamp_bounds();
	test_error_estimate_vectors(dir);
	test_error_estimate_bounds();
	test_clock_live();
	test_auth_vectors(dir);
	test_hmac_vectors(dir);
	test_keytab();
	test_sha256_edges();
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
