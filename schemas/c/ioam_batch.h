/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * ioam_batch: the Kafka message value on topic `segscope.ioam.records`: the shared
 * envelope (batch_envelope.h) with magic "IOB1" and 256-byte ioam_records, key
 * "<node>/<flow_id>" (the egress node), so one flow's records stay ordered in one
 * partition (schemas/IOAM.md). Python mirror: segscope_schemas/ioam_record.py.
 */
#ifndef SEGSCOPE_IOAM_BATCH_H
#define SEGSCOPE_IOAM_BATCH_H

#include "batch_envelope.h"
#include "ioam_record.h"

#define IOAM_BATCH_MAGIC "IOB1"

static inline size_t ioam_batch_encode_header(void *buf, const char *node, uint32_t count, uint64_t batch_seq)
{
	return batch_encode_header(buf, IOAM_BATCH_MAGIC, IOAM_RECORD_SIZE, node, count, batch_seq);
}

static inline int64_t ioam_batch_decode(const void *buf, size_t len, const struct ioam_record **records,
					struct batch_header *hdr_out)
{
	return batch_decode(buf, len, IOAM_BATCH_MAGIC, IOAM_RECORD_SIZE, (const void **)records, hdr_out);
}

#endif /* SEGSCOPE_IOAM_BATCH_H */
