/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * STAMP integrity protection (RFC 8762 §4.4): HMAC-SHA-256 (RFC 2104, FIPS
 * 180-4) truncated to its first 128 bits (as in RFC 4868), a key table with
 * key ids and rotation, and a constant-time verify. User space only.
 *
 * Self-contained SHA-256 (no OpenSSL dependency), checked against the RFC 4231
 * HMAC-SHA-256 test cases 1-4 (schemas/vectors/stamp_hmac.json) and against
 * Python's hashlib on random inputs (tests/schemas/test_stamp_auth_packet.py).
 *
 * Key ids are local names: the STAMP base packet carries no key id, so the
 * verifier tries every key valid at the packet's arrival time (the current one
 * and the previous ones still in their grace window) and reports which matched.
 * Python mirror: segscope_schemas/stamp_hmac.py.
 */
#ifndef SEGSCOPE_STAMP_HMAC_H
#define SEGSCOPE_STAMP_HMAC_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define STAMP_SHA256_LEN      32
#define STAMP_SHA256_BLOCK    64
#define STAMP_HMAC_LEN        16   /* RFC 8762 §4.4: truncated to 128 bits */
#define STAMP_HMAC_KEY_MAX    64   /* longer keys would be hashed first (RFC 2104); refused */
#define STAMP_HMAC_KEYS_MAX   8
#define STAMP_HMAC_FOREVER    UINT64_MAX

/* ---- SHA-256 (FIPS 180-4) ---- */

struct stamp_sha256 {
	uint32_t h[8];
	uint64_t len;                    /* bytes hashed so far */
	uint8_t buf[STAMP_SHA256_BLOCK];
	size_t fill;
};

static const uint32_t stamp_sha256_k[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
	0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
	0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
	0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
	0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static inline uint32_t stamp_ror32(uint32_t x, int n)
{
	return (x >> n) | (x << (32 - n));
}

static inline void stamp_sha256_block(struct stamp_sha256 *c, const uint8_t *p)
{
	uint32_t w[64], a, b, d, e, f, g, h, cc, t1, t2;
	int i;

	for (i = 0; i < 16; i++)
		w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
		       (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
	for (i = 16; i < 64; i++) {
		uint32_t s0 = stamp_ror32(w[i - 15], 7) ^ stamp_ror32(w[i - 15], 18) ^ (w[i - 15] >> 3);
		uint32_t s1 = stamp_ror32(w[i - 2], 17) ^ stamp_ror32(w[i - 2], 19) ^ (w[i - 2] >> 10);

		w[i] = w[i - 16] + s0 + w[i - 7] + s1;
	}
	a = c->h[0]; b = c->h[1]; cc = c->h[2]; d = c->h[3];
	e = c->h[4]; f = c->h[5]; g = c->h[6]; h = c->h[7];
	for (i = 0; i < 64; i++) {
		t1 = h + (stamp_ror32(e, 6) ^ stamp_ror32(e, 11) ^ stamp_ror32(e, 25)) +
		     ((e & f) ^ (~e & g)) + stamp_sha256_k[i] + w[i];
		t2 = (stamp_ror32(a, 2) ^ stamp_ror32(a, 13) ^ stamp_ror32(a, 22)) +
		     ((a & b) ^ (a & cc) ^ (b & cc));
		h = g; g = f; f = e; e = d + t1;
		d = cc; cc = b; b = a; a = t1 + t2;
	}
	c->h[0] += a; c->h[1] += b; c->h[2] += cc; c->h[3] += d;
	c->h[4] += e; c->h[5] += f; c->h[6] += g; c->h[7] += h;
}

static inline void stamp_sha256_init(struct stamp_sha256 *c)
{
	static const uint32_t iv[8] = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
					0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 };

	memcpy(c->h, iv, sizeof(iv));
	c->len = 0;
	c->fill = 0;
}

static inline void stamp_sha256_update(struct stamp_sha256 *c, const void *data, size_t n)
{
	const uint8_t *p = data;

	c->len += n;
	while (n) {
		size_t take = STAMP_SHA256_BLOCK - c->fill;

		if (take > n)
			take = n;
		memcpy(c->buf + c->fill, p, take);
		c->fill += take;
		p += take;
		n -= take;
		if (c->fill == STAMP_SHA256_BLOCK) {
			stamp_sha256_block(c, c->buf);
			c->fill = 0;
		}
	}
}

static inline void stamp_sha256_final(struct stamp_sha256 *c, uint8_t out[STAMP_SHA256_LEN])
{
	uint64_t bits = c->len * 8;
	uint8_t pad = 0x80, zero = 0, lenbe[8];
	int i;

	stamp_sha256_update(c, &pad, 1);
	while (c->fill != STAMP_SHA256_BLOCK - 8)
		stamp_sha256_update(c, &zero, 1);
	for (i = 0; i < 8; i++)
		lenbe[i] = (uint8_t)(bits >> (56 - 8 * i));
	stamp_sha256_update(c, lenbe, 8);
	for (i = 0; i < 8; i++) {
		out[4 * i] = (uint8_t)(c->h[i] >> 24);
		out[4 * i + 1] = (uint8_t)(c->h[i] >> 16);
		out[4 * i + 2] = (uint8_t)(c->h[i] >> 8);
		out[4 * i + 3] = (uint8_t)c->h[i];
	}
}

/* ---- HMAC-SHA-256 (RFC 2104) ---- */

/* Full 32-byte HMAC-SHA-256. Keys longer than the block are hashed first. */
static inline void stamp_hmac_sha256(const uint8_t *key, size_t key_len, const void *msg,
				     size_t msg_len, uint8_t out[STAMP_SHA256_LEN])
{
	uint8_t k[STAMP_SHA256_BLOCK] = { 0 }, pad[STAMP_SHA256_BLOCK], inner[STAMP_SHA256_LEN];
	struct stamp_sha256 c;
	int i;

	if (key_len > STAMP_SHA256_BLOCK) {
		stamp_sha256_init(&c);
		stamp_sha256_update(&c, key, key_len);
		stamp_sha256_final(&c, k);
	} else if (key_len) {
		memcpy(k, key, key_len);
	}
	for (i = 0; i < STAMP_SHA256_BLOCK; i++)
		pad[i] = k[i] ^ 0x36;
	stamp_sha256_init(&c);
	stamp_sha256_update(&c, pad, sizeof(pad));
	stamp_sha256_update(&c, msg, msg_len);
	stamp_sha256_final(&c, inner);
	for (i = 0; i < STAMP_SHA256_BLOCK; i++)
		pad[i] = k[i] ^ 0x5c;
	stamp_sha256_init(&c);
	stamp_sha256_update(&c, pad, sizeof(pad));
	stamp_sha256_update(&c, inner, sizeof(inner));
	stamp_sha256_final(&c, out);
}

/* RFC 8762 §4.4: HMAC-SHA-256 truncated to the first 128 bits. */
static inline void stamp_hmac_sha256_128(const uint8_t *key, size_t key_len, const void *msg,
					 size_t msg_len, uint8_t out[STAMP_HMAC_LEN])
{
	uint8_t full[STAMP_SHA256_LEN];

	stamp_hmac_sha256(key, key_len, msg, msg_len, full);
	memcpy(out, full, STAMP_HMAC_LEN);
}

/* Constant-time comparison: time depends on n only. 1 if equal. */
static inline int stamp_hmac_equal(const uint8_t *a, const uint8_t *b, size_t n)
{
	volatile uint8_t diff = 0;
	size_t i;

	for (i = 0; i < n; i++)
		diff |= a[i] ^ b[i];
	return diff == 0;
}

/* ---- key table with rotation ---- */

struct stamp_hmac_key {
	uint32_t id;
	uint8_t len;
	uint8_t key[STAMP_HMAC_KEY_MAX];
	uint64_t not_before_ns;   /* valid from (inclusive), TAI ns */
	uint64_t not_after_ns;    /* valid until (exclusive); STAMP_HMAC_FOREVER = open */
};

struct stamp_hmac_keytab {
	struct stamp_hmac_key keys[STAMP_HMAC_KEYS_MAX];
	unsigned int n;
	uint32_t current_id;      /* key used to sign */
	int has_current;
};

static inline int stamp_hmac_key_valid(const struct stamp_hmac_key *k, uint64_t now_ns)
{
	return now_ns >= k->not_before_ns && now_ns < k->not_after_ns;
}

static inline struct stamp_hmac_key *stamp_hmac_keytab_find(struct stamp_hmac_keytab *t, uint32_t id)
{
	unsigned int i;

	for (i = 0; i < t->n; i++)
		if (t->keys[i].id == id)
			return &t->keys[i];
	return NULL;
}

/*
 * Adds a key. -EINVAL: empty or longer than 64 bytes, or an empty window;
 * -EEXIST: id already present; -ENOSPC: table full.
 */
static inline int stamp_hmac_keytab_add(struct stamp_hmac_keytab *t, uint32_t id, const uint8_t *key,
					size_t len, uint64_t not_before_ns, uint64_t not_after_ns)
{
	struct stamp_hmac_key *k;

	if (!len || len > STAMP_HMAC_KEY_MAX || not_after_ns <= not_before_ns)
		return -EINVAL;
	if (stamp_hmac_keytab_find(t, id))
		return -EEXIST;
	if (t->n >= STAMP_HMAC_KEYS_MAX)
		return -ENOSPC;
	k = &t->keys[t->n++];
	memset(k, 0, sizeof(*k));
	k->id = id;
	k->len = (uint8_t)len;
	memcpy(k->key, key, len);
	k->not_before_ns = not_before_ns;
	k->not_after_ns = not_after_ns;
	return 0;
}

/* Selects the signing key. -ENOENT if the id is not in the table. */
static inline int stamp_hmac_keytab_set_current(struct stamp_hmac_keytab *t, uint32_t id)
{
	if (!stamp_hmac_keytab_find(t, id))
		return -ENOENT;
	t->current_id = id;
	t->has_current = 1;
	return 0;
}

/* Removes a key (wiping it). -ENOENT if absent; removing the current one unsets it. */
static inline int stamp_hmac_keytab_remove(struct stamp_hmac_keytab *t, uint32_t id)
{
	struct stamp_hmac_key *k = stamp_hmac_keytab_find(t, id);
	unsigned int i = k ? (unsigned int)(k - t->keys) : 0;

	if (!k)
		return -ENOENT;
	for (; i + 1 < t->n; i++)
		t->keys[i] = t->keys[i + 1];
	t->n--;
	memset(&t->keys[t->n], 0, sizeof(t->keys[t->n]));
	if (t->has_current && t->current_id == id)
		t->has_current = 0;
	return 0;
}

/*
 * Rotation: adds new_id valid from now_ns, makes it current, and keeps the
 * previous current key acceptable for grace_ns more (its not_after becomes
 * now + grace) so packets signed just before the switch still verify.
 */
static inline int stamp_hmac_keytab_rotate(struct stamp_hmac_keytab *t, uint32_t new_id,
					   const uint8_t *key, size_t len, uint64_t now_ns,
					   uint64_t grace_ns)
{
	struct stamp_hmac_key *old = t->has_current ? stamp_hmac_keytab_find(t, t->current_id) : NULL;
	int err = stamp_hmac_keytab_add(t, new_id, key, len, now_ns, STAMP_HMAC_FOREVER);

	if (err)
		return err;
	if (old) {
		uint64_t until = now_ns + grace_ns < now_ns ? STAMP_HMAC_FOREVER : now_ns + grace_ns;

		old = stamp_hmac_keytab_find(t, t->current_id);
		if (until < old->not_after_ns)
			old->not_after_ns = until;
	}
	return stamp_hmac_keytab_set_current(t, new_id);
}

/*
 * Signs msg with the current key. 0 and *key_id, -ENOKEY if no current key,
 * -EKEYEXPIRED if it is outside its validity window at now_ns.
 */
static inline int stamp_hmac_sign(struct stamp_hmac_keytab *t, uint64_t now_ns, const void *msg,
				  size_t len, uint8_t out[STAMP_HMAC_LEN], uint32_t *key_id)
{
	struct stamp_hmac_key *k = t->has_current ? stamp_hmac_keytab_find(t, t->current_id) : NULL;

	if (!k)
		return -ENOKEY;
	if (!stamp_hmac_key_valid(k, now_ns))
		return -EKEYEXPIRED;
	stamp_hmac_sha256_128(k->key, k->len, msg, len, out);
	if (key_id)
		*key_id = k->id;
	return 0;
}

/*
 * Verifies a 128-bit HMAC against every key valid at now_ns (all of them are
 * computed and compared in constant time, no early exit). 0 and *key_id of the
 * match; -EBADMSG if none matched; -ENOKEY if no key is valid at now_ns.
 */
static inline int stamp_hmac_verify(const struct stamp_hmac_keytab *t, uint64_t now_ns,
				    const void *msg, size_t len, const uint8_t mac[STAMP_HMAC_LEN],
				    uint32_t *key_id)
{
	uint8_t want[STAMP_HMAC_LEN];
	int valid = 0, matched = 0;
	uint32_t id = 0;
	unsigned int i;

	for (i = 0; i < t->n; i++) {
		const struct stamp_hmac_key *k = &t->keys[i];
		int eq;

		if (!stamp_hmac_key_valid(k, now_ns))
			continue;
		valid = 1;
		stamp_hmac_sha256_128(k->key, k->len, msg, len, want);
		eq = stamp_hmac_equal(want, mac, STAMP_HMAC_LEN);
		if (eq && !matched) {
			matched = 1;
			id = k->id;
		}
	}
	if (!valid)
		return -ENOKEY;
	if (!matched)
		return -EBADMSG;
	if (key_id)
		*key_id = id;
	return 0;
}

#endif /* SEGSCOPE_STAMP_HMAC_H */
