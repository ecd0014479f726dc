/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * stamp_batch: the Kafka message value on topic `segscope.stamp.records`.
 * One message = one streamer poll's records of ONE session (Kafka key
 * "<node>/<ssid>", so a session's records stay ordered in one partition).
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

#include <stdint.h>
#include <string.h>
#include <errno.h>
#include "stamp_record.h"

#define STAMP_BATCH_MAGIC "SSB1"
#define STAMP_BATCH_HEADER_SIZE 56
#define STAMP_BATCH_NODE_LEN 32

struct stamp_batch_header {
	char     magic[4];
	uint16_t header_size;
	uint16_t record_size;
	uint32_t record_count;
	uint32_t flags;
	uint64_t batch_seq;
	char     node[STAMP_BATCH_NODE_LEN];
} __attribute__((packed));

_Static_assert(sizeof(struct stamp_batch_header) == STAMP_BATCH_HEADER_SIZE, "stamp_batch_header size");

/* Write a header for `count` records; returns header size. */
static inline size_t stamp_batch_encode_header(void *buf, const char *node,
					       uint32_t count, uint64_t batch_seq)
{
	struct stamp_batch_header *h = buf;

	memset(h, 0, sizeof(*h));
	memcpy(h->magic, STAMP_BATCH_MAGIC, 4);
	h->header_size = STAMP_BATCH_HEADER_SIZE;
	h->record_size = STAMP_RECORD_SIZE;
	h->record_count = count;
	h->batch_seq = batch_seq;
	strncpy(h->node, node, STAMP_BATCH_NODE_LEN); /* NUL-padded, not necessarily terminated */
	return sizeof(*h);
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
	struct stamp_batch_header h;

	if (len < STAMP_BATCH_HEADER_SIZE)
		return -EMSGSIZE;
	memcpy(&h, buf, sizeof(h));
	if (memcmp(h.magic, STAMP_BATCH_MAGIC, 4) != 0 ||
	    h.header_size < STAMP_BATCH_HEADER_SIZE || h.record_size != STAMP_RECORD_SIZE)
		return -EBADMSG;
	if ((uint64_t)h.header_size + (uint64_t)h.record_count * h.record_size != len)
		return -EMSGSIZE;
	if (hdr_out)
		*hdr_out = h;
	*records = (const struct stamp_record *)((const char *)buf + h.header_size);
	return h.record_count;
}

#endif /* SEGSCOPE_STAMP_BATCH_H */
