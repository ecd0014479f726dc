/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * stamp_batch: the Kafka message value on topic `segscope.stamp.records`.
 * One message = the records one streamer held for up to --linger-ms: of one node (Kafka key
 * "<node>", the default) or of ONE session (--key session: key "<node>/<ssid>"); either way a
 * session's records stay ordered in one partition.
 *
 *   offset size field
 *   0      4    magic        "SSB1" (segscope stamp batch, layout 1)
 *   4      2    header_size  56 (a reader skips to header_size; later layouts may grow the header)
 *   6      2    record_size  64 (sizeof(struct stamp_record))
 *   8      4    record_count N
 *   12     4    flags        0
 *   16     8    batch_seq    per-streamer counter, +1 per message; with `node` it names a batch,
 *                            so a consumer can see replays/duplicates
 *   24     32   node         node name, UTF-8, NUL-padded
 *   56     N*64 records      struct stamp_record[N]
 *
 * Little-endian. A message whose length is not header_size + N*record_size is
 * malformed and goes to the dead-letter topic.
 */
#ifndef SEGSCOPE_STAMP_BATCH_H
#define SEGSCOPE_STAMP_BATCH_H

#include "batch_envelope.h"
#include "stamp_record.h"

#define STAMP_BATCH_MAGIC "SSB1"
#define STAMP_BATCH_HEADER_SIZE BATCH_HEADER_SIZE
#define STAMP_BATCH_NODE_LEN BATCH_NODE_LEN

/* The header is the shared envelope's (batch_envelope.h). */
#define stamp_batch_header batch_header

/* Write a header for `count` records; returns header size. */
static inline size_t stamp_batch_encode_header(void *buf, const char *node,
					       uint32_t count, uint64_t batch_seq)
{
	return batch_encode_header(buf, STAMP_BATCH_MAGIC, STAMP_RECORD_SIZE, node, count, batch_seq);
}

/*
 * Validate a message; on success point *records at the first record and
 * return the record count. Returns -EBADMSG (bad magic/sizes) or -EMSGSIZE
 * (length does not match the count).
 */
static inline int64_t stamp_batch_decode(const void *buf, size_t len,
					 const struct stamp_record **records,
					 struct stamp_batch_header *hdr_out)
{
	return batch_decode(buf, len, STAMP_BATCH_MAGIC, STAMP_RECORD_SIZE,
			    (const void **)records, hdr_out);
}

#endif /* SEGSCOPE_STAMP_BATCH_H */
