/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The librdkafka producer of the node-side streamers (stamp_streamer.c, altmark_collector.c):
 * one configuration and one produce loop, so both deliver the same way.
 *
 * Why these settings: enable.idempotence + acks=all mean a retry can neither duplicate nor
 * reorder the records of one key (a session or a flow); lz4 and 1 MB batches keep the broker
 * cost per record low; the large local queue (1 GiB, or SEGSCOPE_KAFKA_QUEUE_KBYTES) and a
 * 10-minute message timeout absorb a broker outage of minutes without dropping; a full queue
 * makes kafka_produce_retry() serve delivery reports and try again (counted), never drop: the
 * ring buffer behind it fills instead, and the BPF program counts what it cannot store
 * (drop_ringbuf_full, by name, on the pipeline dashboard). Security (TLS, SASL) comes from
 * kafka_security.h: a tool calls kafka_security_load() after its arguments, and a refusal stops it.
 */
#include <stdlib.h>
#ifndef SEGSCOPE_KAFKA_PRODUCER_H
#define SEGSCOPE_KAFKA_PRODUCER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <librdkafka/rdkafka.h>

#include "kafka_security.h"   /* SEGSCOPE_KAFKA_*: TLS, SASL; refusals */

static inline int kafka_conf_set(rd_kafka_conf_t *conf, const char *prog, const char *k, const char *v)
{
	char err[256];

	if (rd_kafka_conf_set(conf, k, v, err, sizeof(err)) != RD_KAFKA_CONF_OK) {
		fprintf(stderr, "%s: kafka config %s=%s: %s\n", prog, k, v, err);
		return -1;
	}
	return 0;
}

/* A producer to `brokers` whose delivery reports go to on_delivery(.., opaque).
 * message_max_bytes: 0 keeps librdkafka's default. NULL (message printed) on error. */
static inline rd_kafka_t *kafka_producer_new(const char *prog, const char *brokers,
					     const char *message_max_bytes,
					     void (*on_delivery)(rd_kafka_t *, const rd_kafka_message_t *, void *),
					     void *opaque)
{
	static const char *const settings[][2] = {
		{ "enable.idempotence", "true" },
		{ "acks", "all" },
		{ "linger.ms", "5" },
		{ "compression.codec", "lz4" },
		{ "batch.size", "1000000" },
		{ "queue.buffering.max.messages", "1000000" },
		{ "queue.buffering.max.kbytes", "1048576" },
		{ "message.timeout.ms", "600000" },
	};
	const char *queue_kbytes = getenv("SEGSCOPE_KAFKA_QUEUE_KBYTES");
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	rd_kafka_t *rk;
	char err[512];

	if (kafka_conf_set(conf, prog, "bootstrap.servers", brokers) < 0)
		goto fail;
	for (size_t i = 0; i < sizeof(settings) / sizeof(settings[0]); i++)
		if (kafka_conf_set(conf, prog, settings[i][0], settings[i][1]) < 0)
			goto fail;
	if (message_max_bytes && kafka_conf_set(conf, prog, "message.max.bytes", message_max_bytes) < 0)
		goto fail;
	if (queue_kbytes && *queue_kbytes &&
	    kafka_conf_set(conf, prog, "queue.buffering.max.kbytes", queue_kbytes) < 0)
		goto fail;   /* the message names SEGSCOPE_KAFKA_QUEUE_KBYTES' value and librdkafka's range */
	if (kafka_security_apply(conf, prog) < 0)
		goto fail;
	rd_kafka_conf_set_error_cb(conf, kafka_on_error);
	rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
	rd_kafka_conf_set_opaque(conf, opaque);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
	if (!rk)
		fprintf(stderr, "%s: rd_kafka_new: %s\n", prog, err);
	return rk;   /* conf is freed by rd_kafka_new only on success */
fail:
	rd_kafka_conf_destroy(conf);
	return NULL;
}

/*
 * A fatal producer error. librdkafka's idempotent producer gives up for good on some broker
 * answers (OUT_OF_ORDER_SEQUENCE_NUMBER): Debian's librdkafka 2.0.2 raises it when a broker dies
 * with a batch in flight and comes back without it (fixed upstream in 2.3.0). From then on every
 * message fails; a streamer that kept the instance would lose everything after a broker crash.
 * So the messages a fatal error fails are kept (not counted failed), the instance is replaced,
 * and the new one (a new producer id) sends them again in their order. A message the broker had
 * written before the error arrives twice; the processors drop duplicates (same session and
 * sender_seq; same flow and block), and `records_resent` bounds how many there can be.
 */
struct kafka_resend_msg {
	char *topic;
	void *val, *key;
	size_t len, keylen;
	void *opaque;
};

struct kafka_resend {
	struct kafka_resend_msg *v;
	size_t n, cap;
};

/* Keep one message for the next instance; false (counted failed by the caller) without memory. */
static inline bool kafka_keep_unsent(struct kafka_resend *r, const char *topic, const void *val, size_t len,
				     const void *key, size_t keylen, void *opaque)
{
	struct kafka_resend_msg *e;

	if (r->n == r->cap) {
		size_t cap = r->cap ? 2 * r->cap : 1024;
		void *v = realloc(r->v, cap * sizeof(*r->v));

		if (!v)
			return false;
		r->v = v, r->cap = cap;
	}
	e = &r->v[r->n];
	e->topic = strdup(topic);
	e->val = malloc(len ? len : 1);
	e->key = malloc(keylen ? keylen : 1);
	if (!e->topic || !e->val || !e->key) {
		free(e->topic), free(e->val), free(e->key);
		return false;
	}
	memcpy(e->val, val, len);
	if (keylen)
		memcpy(e->key, key, keylen);
	e->len = len, e->keylen = keylen, e->opaque = opaque;
	r->n++;
	return true;
}

/* In a delivery report: keep a message that failed because the instance hit a fatal error, for
 * the next instance (kafka_recover). True if kept: the caller counts it neither way. */
static inline bool kafka_keep_for_resend(rd_kafka_t *rk, const rd_kafka_message_t *m, struct kafka_resend *r)
{
	if (!m->err || rd_kafka_fatal_error(rk, NULL, 0) == RD_KAFKA_RESP_ERR_NO_ERROR)
		return false;
	return kafka_keep_unsent(r, rd_kafka_topic_name(m->rkt), m->payload, m->len, m->key, m->key_len,
				 m->_private);
}

/* The counters a replacement touches; a message's opaque is its record count << 1, low bit set
 * for a metrics message (both streamers tag their messages so). */
struct kafka_recovery_counts {
	uint64_t *producer_restarts, *records_resent, *records_failed, *queue_full_retries;
};

static inline int kafka_produce_retry(rd_kafka_t *rk, rd_kafka_topic_t *t, const char *prog,
				      const void *val, size_t len, const char *key, size_t keylen,
				      void *msg_opaque, uint64_t *queue_full_retries);

/* If the producer *rk failed for good: fail what it still holds (its delivery reports keep it in
 * r), destroy it and its two topics, open a new one with reopen(ctx) (which sets *rk and the
 * topics again) and send the kept messages there, in their order. False if no new producer could
 * be opened: the kept records are counted failed and the caller stops. */
static inline bool kafka_recover(rd_kafka_t **rk, rd_kafka_topic_t **data_topic, rd_kafka_topic_t **metrics_topic,
				 const char *prog, int (*reopen)(void *ctx), void *ctx, struct kafka_resend *r,
				 struct kafka_recovery_counts c)
{
	char reason[512] = "";

	if (!*rk || rd_kafka_fatal_error(*rk, reason, sizeof(reason)) == RD_KAFKA_RESP_ERR_NO_ERROR)
		return true;
	fprintf(stderr, "%s: kafka producer failed for good (%s): a new one sends what it had not delivered\n",
		prog, reason);
	rd_kafka_purge(*rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT | RD_KAFKA_PURGE_F_NON_BLOCKING);
	for (int i = 0; i < 1000 && rd_kafka_outq_len(*rk) > 0; i++)
		rd_kafka_poll(*rk, 10);   /* the delivery reports keep the messages (kafka_keep_for_resend) */
	rd_kafka_topic_destroy(*data_topic);
	rd_kafka_topic_destroy(*metrics_topic);
	rd_kafka_destroy(*rk);
	*rk = NULL;
	(*c.producer_restarts)++;
	bool opened = reopen(ctx) == 0;

	for (size_t i = 0; i < r->n; i++) {
		struct kafka_resend_msg *e = &r->v[i];
		uintptr_t tag = (uintptr_t)e->opaque;
		int rc = -1;

		if (opened) {
			bool data = strcmp(e->topic, rd_kafka_topic_name(*data_topic)) == 0;

			rc = kafka_produce_retry(*rk, data ? *data_topic : *metrics_topic, prog, e->val, e->len,
						 e->key, e->keylen, e->opaque, c.queue_full_retries);
		}

		if (!(tag & 1))
			*(rc == 0 ? c.records_resent : c.records_failed) += tag >> 1;
		free(e->topic), free(e->val), free(e->key);
	}
	r->n = 0;
	return opened;
}

/* Test hook: SEGSCOPE_KAFKA_TEST_FATAL_AFTER=N raises librdkafka's own test fatal error
 * (rd_kafka_test_fatal_error, an OUT_OF_ORDER_SEQUENCE_NUMBER) once, after the N-th message
 * produced, so the recovery above is tested on a real broker. Unset: nothing. */
static inline void kafka_test_fatal_hook(rd_kafka_t *rk)
{
	static long after = -2;

	if (after == -2) {
		const char *v = getenv("SEGSCOPE_KAFKA_TEST_FATAL_AFTER");

		after = v && *v ? atol(v) : -1;
	}
	if (after < 0)
		return;
	if (after-- == 0)
		rd_kafka_test_fatal_error(rk, RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER, "SEGSCOPE_KAFKA_TEST_FATAL_AFTER");
}

/* Produce one message (copied); on a full local queue serve delivery reports and retry,
 * counting each retry in *queue_full_retries. KAFKA_PRODUCE_FATAL when the instance has failed
 * for good (keep the message for the next one), -1 (message printed) on any other error. */
#define KAFKA_PRODUCE_FATAL (-2)
static inline int kafka_produce_retry(rd_kafka_t *rk, rd_kafka_topic_t *t, const char *prog,
				      const void *val, size_t len, const char *key, size_t keylen,
				      void *msg_opaque, uint64_t *queue_full_retries)
{
	for (;;) {
		if (rd_kafka_produce(t, RD_KAFKA_PARTITION_UA, RD_KAFKA_MSG_F_COPY, (void *)val, len,
				     key, keylen, msg_opaque) == 0) {
			kafka_test_fatal_hook(rk);
			return 0;
		}
		rd_kafka_resp_err_t e = rd_kafka_last_error();

		if (e == RD_KAFKA_RESP_ERR__FATAL)
			return KAFKA_PRODUCE_FATAL;
		if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL) {
			fprintf(stderr, "%s: produce to %s: %s\n", prog, rd_kafka_topic_name(t),
				rd_kafka_err2str(e));
			return -1;
		}
		(*queue_full_retries)++;
		rd_kafka_poll(rk, 10);
	}
}

/* kafka_produce_retry, and a message the failed-for-good producer refuses is kept for the next
 * one (kafka_recover) and counts as produced; -1 only on other errors or without memory. */
static inline int kafka_produce_or_keep(rd_kafka_t *rk, rd_kafka_topic_t *t, const char *prog, const void *val,
					size_t len, const char *key, size_t keylen, void *msg_opaque,
					uint64_t *queue_full_retries, struct kafka_resend *r)
{
	int rc = kafka_produce_retry(rk, t, prog, val, len, key, keylen, msg_opaque, queue_full_retries);

	if (rc == KAFKA_PRODUCE_FATAL)
		rc = kafka_keep_unsent(r, rd_kafka_topic_name(t), val, len, key, keylen, msg_opaque) ? 0 : -1;
	return rc;
}

/* After a refusal: drop what is queued (its delivery reports count it failed), so the tool exits
 * now instead of after its flush timeout; returns KAFKA_EXIT_REFUSED, or 0 when there was none. */
static inline int kafka_refused_purge(rd_kafka_t *rk)
{
	if (!kafka_refusal[0])
		return 0;
	if (rk) {
		rd_kafka_purge(rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
		rd_kafka_poll(rk, 0);
	}
	return KAFKA_EXIT_REFUSED;
}

#endif /* SEGSCOPE_KAFKA_PRODUCER_H */
