/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * ioam_batch: the Kafka message value on topic `segscope.ioam.records`. One
 * message = the ioam_records (ioam_record.h) one streamer of an egress node
 * held for up to its linger time; key "<node>/<flow_id>" (ioam_kafka_key), so
 * one flow's records stay ordered in one partition.
 *
 *   offset size  field
 *   0      4     magic        "IOB1" (segscope in-line IOAM batch, layout 1)
 *   4      2     header_size  56 (a reader skips to header_size; later layouts may grow the header)
 *   6      2     record_size  256 (sizeof(struct ioam_record))
 *   8      4     record_count N
 *   12     4     flags        0
 *   16     8     batch_seq    per-streamer counter, +1 per message
 *   24     32    node         node name, UTF-8, NUL-padded
 *   56     N*256 records      struct ioam_record[N]
 *
 * Little-endian (the node entries inside a record are as on the wire). A
 * message whose length is not header_size + N*record_size is malformed.
 * Python mirror: segscope_schemas/ioam_record.py (encode_batch, decode_batch,
 * kafka_key); vectors: schemas/vectors/ioam_batch_*.
 */
#ifndef SEGSCOPE_IOAM_BATCH_H
#define SEGSCOPE_IOAM_BATCH_H

#include <stdio.h>
#include "batch_envelope.h"
#include "ioam_record.h"

#define IOAM_BATCH_MAGIC "IOB1"
#define IOAM_BATCH_HEADER_SIZE BATCH_HEADER_SIZE
#define IOAM_BATCH_NODE_LEN BATCH_NODE_LEN

/* The header is the shared envelope's (batch_envelope.h). */
#define ioam_batch_header batch_header

/* Write a header for `count` records; returns header size. */
static inline size_t ioam_batch_encode_header(void *buf, const char *node, uint32_t count, uint64_t batch_seq)
{
	return batch_encode_header(buf, IOAM_BATCH_MAGIC, IOAM_RECORD_SIZE, node, count, batch_seq);
}

/*
 * Validate a message; on success point *records at the first record and
 * return the record count. Returns -EBADMSG (bad magic/sizes) or -EMSGSIZE
 * (length does not match the count).
 */
static inline int64_t ioam_batch_decode(const void *buf, size_t len, const struct ioam_record **records,
					struct ioam_batch_header *hdr_out)
{
	return batch_decode(buf, len, IOAM_BATCH_MAGIC, IOAM_RECORD_SIZE, (const void **)records, hdr_out);
}

/* The message key "<node>/<flow_id>"; returns snprintf's length. */
static inline int ioam_kafka_key(char *buf, size_t len, const char *node, uint32_t flow_id)
{
	return snprintf(buf, len, "%s/%u", node, flow_id);
}

#endif /* SEGSCOPE_IOAM_BATCH_H */
