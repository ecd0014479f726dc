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

#include <stdint.h>
#include <stdio.h>
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

/* Produce one message (copied); on a full local queue serve delivery reports and retry,
 * counting each retry in *queue_full_retries. -1 (message printed) on any other error. */
static inline int kafka_produce_retry(rd_kafka_t *rk, rd_kafka_topic_t *t, const char *prog,
				      const void *val, size_t len, const char *key, size_t keylen,
				      void *msg_opaque, uint64_t *queue_full_retries)
{
	for (;;) {
		if (rd_kafka_produce(t, RD_KAFKA_PARTITION_UA, RD_KAFKA_MSG_F_COPY, (void *)val, len,
				     key, keylen, msg_opaque) == 0)
			return 0;
		rd_kafka_resp_err_t e = rd_kafka_last_error();

		if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL) {
			fprintf(stderr, "%s: produce to %s: %s\n", prog, rd_kafka_topic_name(t),
				rd_kafka_err2str(e));
			return -1;
		}
		(*queue_full_retries)++;
		rd_kafka_poll(rk, 10);
	}
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
