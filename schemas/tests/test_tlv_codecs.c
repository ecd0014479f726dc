// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Decodes every STAMP TLV vector (schemas/vectors/stamp_tlv*.json) with the
 * C headers, checks every expected field, re-encodes valid ones and compares
 * with the vector bytes, runs the reflector-rule vectors through
 * stamp_tlv_reflect. Prints "N passed, M failed"; exit 1 on any failure.
 * Usage: test_tlv_codecs <vectors dir>
 *        test_tlv_codecs --fuzz <iterations> <seed>
 * The fuzz mode feeds random and mutated TLV areas, each in a heap buffer of
 * exactly its size (so ASan sees any read past it), to every decoder and to
 * stamp_tlv_reflect, and checks: a reflected packet differs from the input
 * only in TLV flag bytes, decoders succeed only on buffers whose re-encoding
 * is identical, and every packet lands in exactly one outcome counter.
 */
#include <ctype.h>
#include <dirent.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stamp_tlvs.h"

/* ---- a small JSON reader (objects, arrays, strings, integers, true/false/null) ---- */
enum jt { J_NULL, J_BOOL, J_INT, J_STR, J_ARR, J_OBJ };
struct jv {
	enum jt t;
	long long i;
	char *s;
	struct jv *items;   /* array elements or object values */
	char **keys;        /* object keys */
	int n;
};

static const char *jp;
static int jerr;

static void jws(void) { while (*jp && isspace((unsigned char)*jp)) jp++; }

static int jparse(struct jv *v);

static char *jstring(void)
{
	const char *start = ++jp;
	char *s;

	while (*jp && *jp != '"') {
		if (*jp == '\\')   /* vectors use no escapes beyond \" and \\ */
			jp++;
		jp++;
	}
	if (!*jp) { jerr = 1; return NULL; }
	s = strndup(start, jp - start);
	jp++;
	return s;
}

static int jparse(struct jv *v)
{
	memset(v, 0, sizeof(*v));
	jws();
	if (*jp == '{' || *jp == '[') {
		int obj = *jp == '{';
		jp++;
		v->t = obj ? J_OBJ : J_ARR;
		jws();
		if (*jp == (obj ? '}' : ']')) { jp++; return 0; }
		for (;;) {
			v->items = realloc(v->items, sizeof(*v->items) * (v->n + 1));
			if (obj) {
				v->keys = realloc(v->keys, sizeof(*v->keys) * (v->n + 1));
				jws();
				if (*jp != '"') return jerr = 1;
				v->keys[v->n] = jstring();
				jws();
				if (*jp++ != ':') return jerr = 1;
			}
			if (jparse(&v->items[v->n++])) return 1;
			jws();
			if (*jp == ',') { jp++; continue; }
			if (*jp == (obj ? '}' : ']')) { jp++; return 0; }
			return jerr = 1;
		}
	}
	if (*jp == '"') { v->t = J_STR; v->s = jstring(); return jerr; }
	if (!strncmp(jp, "true", 4)) { v->t = J_BOOL; v->i = 1; jp += 4; return 0; }
	if (!strncmp(jp, "false", 5)) { v->t = J_BOOL; jp += 5; return 0; }
	if (!strncmp(jp, "null", 4)) { v->t = J_NULL; jp += 4; return 0; }
	if (*jp == '-' || isdigit((unsigned char)*jp)) {
		char *end;
		v->t = J_INT;
		v->i = strtoll(jp, &end, 10);
		jp = end;
		return 0;
	}
	return jerr = 1;
}

static void jfree(struct jv *v)
{
	for (int k = 0; k < v->n; k++) {
		jfree(&v->items[k]);
		if (v->keys)
			free(v->keys[k]);
	}
	free(v->items);
	free(v->keys);
	free(v->s);
}

static const struct jv *jget(const struct jv *o, const char *key)
{
	for (int k = 0; o && o->t == J_OBJ && k < o->n; k++)
		if (!strcmp(o->keys[k], key))
			return &o->items[k];
	return NULL;
}

static long long jint(const struct jv *o, const char *key, long long dflt)
{
	const struct jv *v = jget(o, key);
	return v && (v->t == J_INT || v->t == J_BOOL) ? v->i : dflt;
}

static const char *jstr(const struct jv *o, const char *key)
{
	const struct jv *v = jget(o, key);
	return v && v->t == J_STR ? v->s : NULL;
}

/* hex with optional spaces -> bytes; returns length or -1 */
static int unhex(const char *s, __u8 *out, int cap)
{
	int n = 0, hi = -1;

	for (; s && *s; s++) {
		int d;
		if (isspace((unsigned char)*s)) continue;
		if (!isxdigit((unsigned char)*s)) return -1;
		d = isdigit((unsigned char)*s) ? *s - '0' : (tolower((unsigned char)*s) - 'a' + 10);
		if (hi < 0) { hi = d; continue; }
		if (n >= cap) return -1;
		out[n++] = (__u8)(hi << 4 | d);
		hi = -1;
	}
	return hi < 0 ? n : -1;
}

/* ---- checks ---- */
static int passed, failed;
static char why[512];
static int bad;

static void miss(const char *fmt, ...)
{
	va_list ap;
	if (bad) return;   /* keep the first reason */
	bad = 1;
	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
}

static void want_int(const struct jv *f, const char *key, long long got)
{
	const struct jv *v = jget(f, key);
	if (!v) { miss("vector lacks field %s", key); return; }
	if (v->i != got) miss("%s = %lld, expected %lld", key, got, v->i);
}

static void want_bytes(const struct jv *f, const char *key, const __u8 *got, int len)
{
	__u8 exp[4096];
	int n = unhex(jstr(f, key), exp, sizeof(exp));
	if (n < 0) { miss("vector field %s is not hex", key); return; }
	if (n != len || memcmp(exp, got, len)) miss("%s differs (%d vs %d bytes)", key, len, n);
}

/* sub_tlvs: [{flags,type,value}] against a raw sub-TLV area */
static void want_subs(const struct jv *f, const __u8 *area, size_t len)
{
	const struct jv *arr = jget(f, "sub_tlvs");
	struct stamp_tlv_view s;
	size_t off = 0;
	int k = 0;

	if (!arr || arr->t != J_ARR) { miss("vector lacks sub_tlvs"); return; }
	while (stamp_tlv_next(area, len, &off, &s) == 1) {
		if (k >= arr->n) { miss("more sub-TLVs than expected"); return; }
		want_int(&arr->items[k], "flags", s.flags);
		want_int(&arr->items[k], "type", s.type);
		want_bytes(&arr->items[k], "value", s.value, s.length);
		k++;
	}
	if (k != arr->n) miss("%d sub-TLVs, expected %d", k, arr->n);
}

static void want_list_bytes(const struct jv *f, const char *key, const __u8 *p, unsigned n, int item)
{
	const struct jv *arr = jget(f, key);
	__u8 exp[64];
	if (!arr || arr->t != J_ARR) { miss("vector lacks %s", key); return; }
	if ((unsigned)arr->n != n) { miss("%s: %u items, expected %d", key, n, arr->n); return; }
	for (unsigned k = 0; k < n; k++)
		if (unhex(arr->items[k].s, exp, sizeof(exp)) != item || memcmp(exp, p + k * item, item))
			miss("%s[%u] differs", key, k);
}

/* Decode buf with the element's decoder; fill out with the re-encoded bytes. */
static int codec(const char *el, const __u8 *buf, int len, const struct jv *f, __u8 *out, int cap)
{
	int rc;
#define DECODE(name, T) T v; rc = stamp_tlv_##name##_decode(buf, len, &v); if (rc) return rc; \
	if (f) { want_int(f, "flags", v.flags);
#define ENCODE(name) } return stamp_tlv_##name##_encode(out, cap, &v);

	if (!strcmp(el, "stamp_tlv_extra_padding")) {
		DECODE(extra_padding, struct stamp_tlv_extra_padding)
		want_int(f, "length", v.length); want_bytes(f, "padding", v.padding, v.length);
		ENCODE(extra_padding)
	} else if (!strcmp(el, "stamp_tlv_location")) {
		DECODE(location, struct stamp_tlv_location)
		want_int(f, "dst_port", v.dst_port); want_int(f, "src_port", v.src_port);
		want_subs(f, v.sub_tlvs, v.sub_len);
		ENCODE(location)
	} else if (!strcmp(el, "stamp_tlv_timestamp_info")) {
		DECODE(timestamp_info, struct stamp_tlv_timestamp_info)
		want_int(f, "sync_src_in", v.sync_src_in); want_int(f, "ts_in", v.ts_in);
		want_int(f, "sync_src_out", v.sync_src_out); want_int(f, "ts_out", v.ts_out);
		want_subs(f, v.sub_tlvs, v.sub_len);
		ENCODE(timestamp_info)
	} else if (!strcmp(el, "stamp_tlv_class_of_service")) {
		DECODE(class_of_service, struct stamp_tlv_class_of_service)
		want_int(f, "dscp1", v.dscp1); want_int(f, "dscp2", v.dscp2);
		want_int(f, "ecn", v.ecn); want_int(f, "rp", v.rp);
		ENCODE(class_of_service)
	} else if (!strcmp(el, "stamp_tlv_direct_measurement")) {
		DECODE(direct_measurement, struct stamp_tlv_direct_measurement)
		want_int(f, "s_tx", v.s_tx); want_int(f, "r_rx", v.r_rx); want_int(f, "r_tx", v.r_tx);
		ENCODE(direct_measurement)
	} else if (!strcmp(el, "stamp_tlv_access_report")) {
		DECODE(access_report, struct stamp_tlv_access_report)
		want_int(f, "id", v.id); want_int(f, "return_code", v.return_code);
		ENCODE(access_report)
	} else if (!strcmp(el, "stamp_tlv_follow_up_telemetry")) {
		DECODE(follow_up_telemetry, struct stamp_tlv_follow_up_telemetry)
		want_int(f, "seq", v.seq); want_int(f, "ts_sec", v.ts_sec);
		want_int(f, "ts_frac", v.ts_frac); want_int(f, "ts_method", v.ts_method);
		ENCODE(follow_up_telemetry)
	} else if (!strcmp(el, "stamp_tlv_hmac")) {
		DECODE(hmac, struct stamp_tlv_hmac)
		want_bytes(f, "hmac", v.hmac, STAMP_TLV_HMAC_LEN);
		ENCODE(hmac)
	} else if (!strcmp(el, "stamp_tlv_dest_node_addr")) {
		DECODE(dest_node_addr, struct stamp_tlv_dest_node_addr)
		want_int(f, "family", v.family);
		want_bytes(f, "address", v.address, stamp_af_addr_len(v.family));
		ENCODE(dest_node_addr)
	} else if (!strcmp(el, "stamp_tlv_return_path")) {
		DECODE(return_path, struct stamp_tlv_return_path)
		want_int(f, "control_code", v.has_control_code ? (long long)v.control_code : -1);
		want_int(f, "reply_requested", v.reply_requested);
		want_int(f, "return_family", v.ret_family);
		want_bytes(f, "return_address", v.ret_address, v.ret_family ? stamp_af_addr_len(v.ret_family) : 0);
		want_list_bytes(f, "segments", v.segments, v.n_segments, 16);
		{
			const struct jv *labels = jget(f, "labels");
			if (!labels || labels->t != J_ARR || (unsigned)labels->n != v.n_labels)
				miss("labels count %u differs", v.n_labels);
			else
				for (unsigned k = 0; k < v.n_labels; k++)
					if ((long long)stamp_get_be32(v.labels + 4 * k) != labels->items[k].i)
						miss("labels[%u] differs", k);
		}
		want_int(f, "sub_count", stamp_tlv_count(v.sub_tlvs, v.sub_len, 0));
		ENCODE(return_path)
	}
	return -100;
#undef DECODE
#undef ENCODE
}

static void one_codec_vector(const char *el, const struct jv *vec)
{
	__u8 buf[4096], out[4096];
	int len = unhex(jstr(vec, "hex"), buf, sizeof(buf));
	int valid = (int)jint(vec, "valid", -1);
	const struct jv *f = jget(vec, "fields");
	int rc;

	if (len < 0) { miss("hex does not parse"); return; }
	rc = codec(el, buf, len, valid ? f : NULL, out, sizeof(out));
	if (rc == -100) { miss("no decoder for %s", el); return; }
	if (valid) {
		if (rc < 0) { miss("decode failed: %s", stamp_tlv_strerror(rc)); return; }
		if (rc != len || memcmp(out, buf, len)) miss("re-encoded bytes differ (%d vs %d)", rc, len);
	} else {
		const char *exp = jstr(vec, "error");
		if (rc >= 0) { miss("decoded, expected error %s", exp); return; }
		if (!exp || strcmp(exp, stamp_tlv_strerror(rc))) miss("error %s, expected %s", stamp_tlv_strerror(rc), exp);
	}
}

static void one_area_vector(const struct jv *vec)
{
	__u8 buf[4096];
	int len = unhex(jstr(vec, "hex"), buf, sizeof(buf));
	const struct jv *tl = jget(vec, "tlvs");
	const char *err = jstr(vec, "error");
	struct stamp_tlv_view t;
	size_t off = 0;
	int k = 0, rc;

	while ((rc = stamp_tlv_next(buf, len, &off, &t)) == 1) {
		if (tl && k < tl->n && tl->items[k].n == 3) {
			const struct jv *e = tl->items[k].items;
			if (e[0].i != t.flags || e[1].i != t.type || e[2].i != t.length)
				miss("TLV %d is (%u,%u,%u)", k, t.flags, t.type, t.length);
		}
		k++;
	}
	if (err) {
		if (rc == 0 || strcmp(err, stamp_tlv_strerror(rc)))
			miss("area ended with %s, expected %s", stamp_tlv_strerror(rc), err);
	} else {
		if (rc != 0) miss("area error %s", stamp_tlv_strerror(rc));
		if (!tl || k != tl->n) miss("%d TLVs, expected %d", k, tl ? tl->n : -1);
	}
}

/* A reflector duty: "in" through the generic flag rule and the element's helper -> "hex". */
static void one_reflector_vector(const char *el, const struct jv *vec)
{
	__u8 tlv[1024], exp[1024], mac[8], sip[16], dip[16], *val = tlv + STAMP_TLV_HDR_LEN;
	int n = unhex(jstr(vec, "in"), tlv, sizeof(tlv)), m = unhex(jstr(vec, "hex"), exp, sizeof(exp));
	const struct jv *a = jget(vec, "args");
	struct stamp_tlv_view t;

	if (n < STAMP_TLV_HDR_LEN || m < 0 || stamp_tlv_split(tlv, n, tlv[1], &t)) { miss("in is not one TLV"); return; }
	if (stamp_tlvs_value_check(t.type, t.value, t.length) != 1) { miss("in is not a valid TLV"); return; }
	tlv[0] = stamp_tlv_reflected_flags(1, 0, 0);
	if (!strcmp(el, "stamp_tlv_class_of_service")) {
		stamp_tlv_class_of_service_reflect(val, (__u8)jint(a, "received_tos", 0), (int)jint(a, "dscp1_applied", 0));
	} else if (!strcmp(el, "stamp_tlv_location")) {
		int has_mac = unhex(jstr(a, "mac"), mac, sizeof(mac)) == 6 && jstr(a, "mac");
		int slen = jstr(a, "src_ip") ? unhex(jstr(a, "src_ip"), sip, sizeof(sip)) : 0;
		int dlen = jstr(a, "dst_ip") ? unhex(jstr(a, "dst_ip"), dip, sizeof(dip)) : 0;
		if (stamp_tlv_location_reflect(val, t.length, (__u16)jint(a, "dst_port", 0), (__u16)jint(a, "src_port", 0),
					       has_mac ? mac : NULL, slen ? sip : NULL, dlen ? dip : NULL,
					       slen ? slen : dlen))
			miss("location reflect refused a valid TLV");
	} else if (!strcmp(el, "stamp_tlv_direct_measurement")) {
		stamp_tlv_direct_measurement_reflect(val, (__u32)jint(a, "r_rx", 0), (__u32)jint(a, "r_tx", 0));
	} else if (!strcmp(el, "stamp_tlv_timestamp_info")) {
		stamp_tlv_timestamp_info_reflect(val, (__u8)jint(a, "sync_src_in", 0), (__u8)jint(a, "ts_in", 0),
						 (__u8)jint(a, "sync_src_out", 0), (__u8)jint(a, "ts_out", 0));
	} else if (!strcmp(el, "stamp_tlv_dest_node_addr")) {
		tlv[0] = stamp_tlv_dest_node_addr_reflected_flags(tlv[0], (int)jint(a, "address_is_ours", 0));
	} else {
		miss("no reflector helper for %s", el);
		return;
	}
	if (m != n || memcmp(tlv, exp, n)) miss("reflected TLV differs");
}

struct verify_ctx { const struct jv *vec; int called; };

static int verify_cb(void *p, const __u8 *seq4, const __u8 *tlvs, size_t tlvs_len, const __u8 hmac[16])
{
	struct verify_ctx *c = p;
	__u8 exp[4096], got[4096];
	int n = unhex(jstr(c->vec, "hmac_text"), exp, sizeof(exp));

	(void)hmac;
	c->called++;
	memcpy(got, seq4, 4);
	memcpy(got + 4, tlvs, tlvs_len);
	if (n != (int)tlvs_len + 4 || memcmp(exp, got, n))
		miss("HMAC text given to verify differs from hmac_text");
	return (int)jint(c->vec, "hmac_ok", 0);
}

static void one_reflect_vector(const struct jv *vec)
{
	__u8 pkt[4096], exp[4096];
	int base = (int)jint(vec, "base_len", 44);
	int n = unhex(jstr(vec, "hex"), pkt + base, sizeof(pkt) - base);
	int m = unhex(jstr(vec, "out"), exp, sizeof(exp));
	struct verify_ctx ctx = { vec, 0 };
	struct stamp_tlv_reflect_result r;
	const char *err = jstr(vec, "error");

	memset(pkt, 0, base);
	pkt[3] = 1;   /* Sequence Number 1 */
	stamp_tlv_reflect(pkt, base + n, base, stamp_tlvs_value_check,
			  jget(vec, "hmac_ok") ? verify_cb : NULL, &ctx, &r);
	if (m != n || memcmp(pkt + base, exp, n)) miss("reflected TLV area differs");
	if (r.tlvs != jint(vec, "tlvs", -1)) miss("tlvs %d", r.tlvs);
	if (r.unknown != jint(vec, "unknown", -1)) miss("unknown %d", r.unknown);
	if (r.malformed_at != jint(vec, "malformed_at", -2)) miss("malformed_at %ld", r.malformed_at);
	if (r.integrity_failed != jint(vec, "integrity_failed", -1)) miss("integrity_failed %d", r.integrity_failed);
	if (!err || strcmp(err, stamp_tlv_strerror(r.error))) miss("error %s", stamp_tlv_strerror(r.error));
	if (jstr(vec, "hmac_text") && ctx.called != 1) miss("verify called %d times", ctx.called);
}

static void run_file(const char *path)
{
	FILE *fp = fopen(path, "r");
	static char text[1 << 20];
	size_t n;
	struct jv doc;
	const char *el;
	const struct jv *vecs;

	if (!fp) { printf("FAIL %s: cannot open\n", path); failed++; return; }
	n = fread(text, 1, sizeof(text) - 1, fp);
	fclose(fp);
	text[n] = 0;
	jp = text;
	jerr = 0;
	if (jparse(&doc) || jerr || !(el = jstr(&doc, "element")) || !(vecs = jget(&doc, "vectors"))) {
		printf("FAIL %s: not a vector file\n", path);
		failed++;
		jfree(&doc);
		return;
	}
	for (int k = 0; k < vecs->n; k++) {
		const struct jv *vec = &vecs->items[k];
		const char *kind = jstr(vec, "kind");

		bad = 0;
		if (kind && !strcmp(kind, "area"))
			one_area_vector(vec);
		else if (kind && !strcmp(kind, "reflect"))
			one_reflect_vector(vec);
		else if (kind && !strcmp(kind, "reflector"))
			one_reflector_vector(el, vec);
		else
			one_codec_vector(el, vec);
		if (bad) {
			failed++;
			printf("FAIL %s %s: %s\n", el, jstr(vec, "name"), why);
		} else {
			passed++;
			printf("ok   %s %s\n", el, jstr(vec, "name"));
		}
	}
	jfree(&doc);
}

/* ---- fuzz mode ---- */
static __u64 rng_state;

static __u32 rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (__u32)rng_state;
}

static const char *const ELEMENTS[] = {
	"stamp_tlv_extra_padding", "stamp_tlv_location", "stamp_tlv_timestamp_info",
	"stamp_tlv_class_of_service", "stamp_tlv_direct_measurement", "stamp_tlv_access_report",
	"stamp_tlv_follow_up_telemetry", "stamp_tlv_hmac", "stamp_tlv_dest_node_addr",
	"stamp_tlv_return_path",
};

static int fuzz_verify(void *ctx, const __u8 *seq4, const __u8 *tlvs, size_t n, const __u8 hmac[16])
{
	(void)ctx; (void)seq4; (void)tlvs; (void)n;
	return hmac[0] & 1;   /* pseudo-random verdict from the data */
}

/* A TLV area: a few plausible TLVs (known types, right-ish lengths), then mutations. */
static int make_area(__u8 *a, int cap)
{
	static const int lens[] = { 0, 4, 4, 4, 12, 4, 16, 16, 16, 20 };
	int n = 0, k, count = rnd() % 5;

	for (k = 0; k < count && n + 4 + 40 < cap; k++) {
		int type = rnd() % 12, len;
		if (rnd() % 8 == 0)
			type = 11 + rnd() % 245;
		len = type >= 1 && type <= 10 ? lens[type - 1] : (int)(rnd() % 24);
		if (rnd() % 4 == 0)
			len = rnd() % 40;
		a[n] = rnd() % 4 ? 0x80 : (__u8)rnd();
		a[n + 1] = (__u8)type;
		stamp_put_be16(a + n + 2, (__u16)len);
		for (int b = 0; b < len; b++)
			a[n + 4 + b] = rnd() % 3 ? 0 : (__u8)rnd();
		if (type == STAMP_TLV_LOCATION && len >= 12) {     /* a plausible sub-TLV */
			a[n + 8] = 0; a[n + 9] = 1 + rnd() % 9; stamp_put_be16(a + n + 10, (__u16)(len - 8));
		}
		if (type == STAMP_TLV_RETURN_PATH && len >= 4) {
			a[n + 4] = 0; a[n + 5] = 1 + rnd() % 4; stamp_put_be16(a + n + 6, (__u16)(len - 4));
		}
		n += 4 + len;
	}
	for (k = rnd() % 4; k > 0; k--) {
		switch (rnd() % 3) {
		case 0: if (n) a[rnd() % n] = (__u8)rnd(); break;
		case 1: if (n) n = rnd() % n; break;
		default: for (int b = rnd() % 5; b > 0 && n < cap; b--) a[n++] = (__u8)rnd();
		}
	}
	return n;
}

/*
 * Bytes a decoder ignores on receipt (reserved fields, RFC 8972 §4.4/4.6/4.7)
 * and its encoder writes as zero: the only place a round trip may differ.
 */
static int reserved_byte(const char *el, int b, __u8 *mask)
{
	*mask = 0xff;
	if (!strcmp(el, "stamp_tlv_class_of_service"))
		return b == 6 || b == 7;
	if (!strcmp(el, "stamp_tlv_access_report")) {
		if (b == 4) { *mask = 0x0f; return 1; }   /* Resv nibble */
		return b == 6 || b == 7;
	}
	if (!strcmp(el, "stamp_tlv_follow_up_telemetry"))
		return b >= 17 && b <= 19;
	return 0;
}

static int fuzz(long iters, __u64 seed)
{
	long outcome[4] = { 0 }, decoded = 0, rejected = 0, bad_diff = 0, bad_rt = 0;
	__u8 area[512], out[1024];

	rng_state = seed ? seed : 1;
	for (long i = 0; i < iters; i++) {
		int base = rnd() % 2 ? STAMP_TLV_BASE_UNAUTH : STAMP_TLV_BASE_AUTH;
		int n = make_area(area, sizeof(area));
		__u8 *pkt = malloc(base + n), *orig = malloc(base + n + 1);
		struct stamp_tlv_reflect_result r;

		memset(pkt, 0, base);
		memcpy(pkt + base, area, n);
		memcpy(orig, pkt, base + n);
		stamp_tlv_reflect(pkt, base + n, base, stamp_tlvs_value_check, fuzz_verify, NULL, &r);
		/* exactly one outcome: clean, stopped at a malformed TLV, broken tail, integrity failure */
		if (r.integrity_failed)
			outcome[3]++;
		else if (r.error)
			outcome[2]++;
		else if (r.malformed_at >= 0)
			outcome[1]++;
		else
			outcome[0]++;
		/* only header flag bytes may change */
		{
			size_t off = base;
			struct stamp_tlv_view t;
			__u8 *hdr = calloc(base + n + 1, 1);
			while (stamp_tlv_next(orig, base + n, &off, &t) == 1)
				hdr[t.offset] = 1;
			if (off + 4 <= (size_t)(base + n))
				hdr[off] = 1;   /* the overrunning TLV's header */
			for (int b = 0; b < base + n; b++)
				if (pkt[b] != orig[b] && !hdr[b])
					bad_diff++;
			free(hdr);
		}
		/* every decoder on the whole area as one TLV, in an exact-size buffer */
		for (unsigned e = 0; e < sizeof(ELEMENTS) / sizeof(ELEMENTS[0]); e++) {
			__u8 *one = malloc(n ? n : 1);
			int rc;
			memcpy(one, area, n);
			rc = codec(ELEMENTS[e], one, n, NULL, out, sizeof(out));
			if (rc >= 0) {
				decoded++;
				if (rc != n) {
					bad_rt++;
				} else {
					for (int b = 0; b < n; b++) {
						__u8 m, diff = out[b] ^ one[b];
						if (diff && !(reserved_byte(ELEMENTS[e], b, &m) && !(diff & ~m) && !(out[b] & m)))
							bad_rt++;
					}
				}
			} else {
				rejected++;
			}
			free(one);
		}
		free(pkt);
		free(orig);
	}
	printf("fuzz: %ld packets: clean %ld, malformed %ld, broken tail %ld, integrity %ld; "
	       "decoders: %ld decoded, %ld rejected, %ld bytes re-encoded differently outside reserved fields; "
	       "%ld non-flag bytes changed by the reflector\n",
	       iters, outcome[0], outcome[1], outcome[2], outcome[3], decoded, rejected, bad_rt, bad_diff);
	if (outcome[0] + outcome[1] + outcome[2] + outcome[3] != iters || bad_diff || bad_rt || !decoded)
		failed++;
	else
		passed++;
	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}

int main(int argc, char **argv)
{
	const char *dir = argc > 1 ? argv[1] : "vectors";

	if (argc > 3 && !strcmp(argv[1], "--fuzz"))
		return fuzz(atol(argv[2]), strtoull(argv[3], NULL, 0));
	struct dirent **names;
	int n = scandir(dir, &names, NULL, alphasort);
	char path[4096];

	if (n < 0) { perror(dir); return 2; }
	for (int k = 0; k < n; k++) {
		const char *nm = names[k]->d_name;
		size_t l = strlen(nm);
		if (!strncmp(nm, "stamp_tlv", 9) && l > 5 && !strcmp(nm + l - 5, ".json")) {
			snprintf(path, sizeof(path), "%s/%s", dir, nm);
			run_file(path);
		}
		free(names[k]);
	}
	free(names);
	printf("%d passed, %d failed\n", passed, failed);
	return failed || !passed;
}
