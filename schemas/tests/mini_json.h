/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * mini_json: just enough JSON for the test vectors in schemas/vectors/
 * (objects, arrays, strings with simple escapes, integers up to 64 bits
 * unsigned or signed, true/false/null). Test code only: aborts on bad input
 * with the byte offset, since a malformed vector file is a test failure.
 */
#ifndef SEGSCOPE_MINI_JSON_H
#define SEGSCOPE_MINI_JSON_H

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum mj_type { MJ_NULL, MJ_BOOL, MJ_INT, MJ_STR, MJ_ARR, MJ_OBJ };

struct mj {
	enum mj_type type;
	int neg;               /* MJ_INT: value is -u */
	uint64_t u;            /* MJ_INT magnitude, MJ_BOOL */
	char *str;             /* MJ_STR */
	char *key;             /* member name when inside an object */
	struct mj *child;      /* MJ_ARR / MJ_OBJ: first element */
	struct mj *next;       /* next sibling */
};

struct mj_parser {
	const char *s, *p;
};

static void mj_die(struct mj_parser *ps, const char *what)
{
	fprintf(stderr, "json: %s at byte %ld\n", what, (long)(ps->p - ps->s));
	exit(2);
}

static void mj_ws(struct mj_parser *ps)
{
	while (isspace((unsigned char)*ps->p))
		ps->p++;
}

static char *mj_string(struct mj_parser *ps)
{
	size_t cap = 64, n = 0;
	char *out = malloc(cap);

	if (*ps->p++ != '"')
		mj_die(ps, "expected string");
	while (*ps->p != '"') {
		char c = *ps->p++;

		if (!c)
			mj_die(ps, "unterminated string");
		if (c == '\\') {
			c = *ps->p++;
			if (c == 'n')
				c = '\n';
			else if (c == 't')
				c = '\t';
			else if (c == 'u') {   /* only what json.dumps writes for our text: BMP code points */
				unsigned int cp;

				if (sscanf(ps->p, "%4x", &cp) != 1)
					mj_die(ps, "bad \\u escape");
				ps->p += 4;
				if (n + 4 >= cap)
					out = realloc(out, cap *= 2);
				if (cp < 0x80) {
					out[n++] = (char)cp;
				} else if (cp < 0x800) {
					out[n++] = (char)(0xc0 | cp >> 6);
					out[n++] = (char)(0x80 | (cp & 0x3f));
				} else {
					out[n++] = (char)(0xe0 | cp >> 12);
					out[n++] = (char)(0x80 | ((cp >> 6) & 0x3f));
					out[n++] = (char)(0x80 | (cp & 0x3f));
				}
				continue;
			}
		}
		if (n + 1 >= cap)
			out = realloc(out, cap *= 2);
		out[n++] = c;
	}
	ps->p++;
	out[n] = 0;
	return out;
}

static struct mj *mj_value(struct mj_parser *ps)
{
	struct mj *v = calloc(1, sizeof(*v)), **tail;

	mj_ws(ps);
	if (*ps->p == '{' || *ps->p == '[') {
		char close = *ps->p == '{' ? '}' : ']';

		v->type = close == '}' ? MJ_OBJ : MJ_ARR;
		ps->p++;
		tail = &v->child;
		mj_ws(ps);
		if (*ps->p == close) {
			ps->p++;
			return v;
		}
		for (;;) {
			char *key = NULL;
			struct mj *c;

			mj_ws(ps);
			if (v->type == MJ_OBJ) {
				key = mj_string(ps);
				mj_ws(ps);
				if (*ps->p++ != ':')
					mj_die(ps, "expected ':'");
			}
			c = mj_value(ps);
			c->key = key;
			*tail = c;
			tail = &c->next;
			mj_ws(ps);
			if (*ps->p == ',') {
				ps->p++;
				continue;
			}
			if (*ps->p++ != close)
				mj_die(ps, "expected ',' or close");
			return v;
		}
	}
	if (*ps->p == '"') {
		v->type = MJ_STR;
		v->str = mj_string(ps);
		return v;
	}
	if (!strncmp(ps->p, "true", 4) || !strncmp(ps->p, "false", 5)) {
		v->type = MJ_BOOL;
		v->u = *ps->p == 't';
		ps->p += v->u ? 4 : 5;
		return v;
	}
	if (!strncmp(ps->p, "null", 4)) {
		ps->p += 4;
		return v;
	}
	if (*ps->p == '-' || isdigit((unsigned char)*ps->p)) {
		char *end;

		v->type = MJ_INT;
		v->neg = *ps->p == '-';
		errno = 0;
		v->u = strtoull(ps->p + v->neg, &end, 10);
		if (errno || *end == '.' || *end == 'e' || *end == 'E')
			mj_die(ps, "integer out of range or not an integer");
		ps->p = end;
		return v;
	}
	mj_die(ps, "unexpected character");
	return NULL;
}

static struct mj *mj_load(const char *path)
{
	FILE *f = fopen(path, "r");
	struct mj_parser ps;
	char *buf;
	long n;

	if (!f) {
		perror(path);
		exit(2);
	}
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	rewind(f);
	buf = malloc(n + 1);
	if (fread(buf, 1, n, f) != (size_t)n) {
		perror(path);
		exit(2);
	}
	buf[n] = 0;
	fclose(f);
	ps.s = ps.p = buf;
	return mj_value(&ps);
}

static struct mj *mj_get(const struct mj *obj, const char *key)
{
	struct mj *c;

	for (c = obj ? obj->child : NULL; c; c = c->next)
		if (c->key && !strcmp(c->key, key))
			return c;
	return NULL;
}

static uint64_t mj_u64(const struct mj *obj, const char *key)
{
	struct mj *v = mj_get(obj, key);

	if (!v || (v->type != MJ_INT && v->type != MJ_BOOL)) {
		fprintf(stderr, "json: missing integer '%s'\n", key);
		exit(2);
	}
	return v->neg ? (uint64_t)-(int64_t)v->u : v->u;
}

static int64_t mj_i64(const struct mj *obj, const char *key)
{
	return (int64_t)mj_u64(obj, key);
}

static const char *mj_str(const struct mj *obj, const char *key)
{
	struct mj *v = mj_get(obj, key);

	if (!v || v->type != MJ_STR) {
		fprintf(stderr, "json: missing string '%s'\n", key);
		exit(2);
	}
	return v->str;
}

/* Hex string -> bytes; returns the length. */
static size_t mj_hex(const char *hex, uint8_t *out, size_t cap)
{
	size_t n = strlen(hex) / 2, i;

	if (n > cap) {
		fprintf(stderr, "json: hex string longer than %zu bytes\n", cap);
		exit(2);
	}
	for (i = 0; i < n; i++) {
		unsigned int b;

		if (sscanf(hex + 2 * i, "%2x", &b) != 1) {
			fprintf(stderr, "json: bad hex '%s'\n", hex);
			exit(2);
		}
		out[i] = (uint8_t)b;
	}
	return n;
}

#endif /* SEGSCOPE_MINI_JSON_H */
