/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The Kafka envelope every batched record stream shares (stamp_batch,
 * altmark_batch): a 56-byte little-endian header, then N fixed-size records.
 *
 *   offset size field
 *   0      4    magic        names the record kind and layout ("SSB1", "AMB1")
 *   4      2    header_size  56 (a reader skips to header_size; later layouts may grow the header)
 *   6      2    record_size  size of one record
 *   8      4    record_count N
 *   12     4    flags        0
 *   16     8    batch_seq    per-producer counter, +1 per message; with `node` it names a batch
 *   24     32   node         node name, UTF-8, NUL-padded
 *   56     N*record_size     the records
 *
 * A message whose length is not header_size + N*record_size is malformed.
 * The record headers bind magic and record size in thin wrappers; this file
 * holds the one implementation. Python mirror: segscope_schemas/batch_envelope.py.
 */
#ifndef SEGSCOPE_BATCH_ENVELOPE_H
#define SEGSCOPE_BATCH_ENVELOPE_H

#include <errno.h>
#include <stdint.h>
#include <string.h>

#define BATCH_HEADER_SIZE 56
#define BATCH_NODE_LEN 32

struct batch_header {
	char     magic[4];
	uint16_t header_size;
	uint16_t record_size;
	uint32_t record_count;
	uint32_t flags;
	uint64_t batch_seq;
	char     node[BATCH_NODE_LEN];
} __attribute__((packed));

_Static_assert(sizeof(struct batch_header) == BATCH_HEADER_SIZE, "batch_header size");

/* Write a header for `count` records of `record_size`; returns the header size. */
static inline size_t batch_encode_header(void *buf, const char magic[4], uint16_t record_size,
					 const char *node, uint32_t count, uint64_t batch_seq)
{
	struct batch_header *h = buf;

	memset(h, 0, sizeof(*h));
	memcpy(h->magic, magic, 4);
	h->header_size = BATCH_HEADER_SIZE;
	h->record_size = record_size;
	h->record_count = count;
	h->batch_seq = batch_seq;
	strncpy(h->node, node, BATCH_NODE_LEN); /* NUL-padded, not necessarily terminated */
	return sizeof(*h);
}

/*
 * Validate a message; on success point *records at the first record and
 * return the record count. Returns -EBADMSG (bad magic/sizes) or -EMSGSIZE
 * (shorter than a header, or length does not match the count).
 */
static inline int64_t batch_decode(const void *buf, size_t len, const char magic[4],
				   uint16_t record_size, const void **records,
				   struct batch_header *hdr_out)
{
	struct batch_header h;

	if (len < BATCH_HEADER_SIZE)
		return -EMSGSIZE;
	memcpy(&h, buf, sizeof(h));
	if (memcmp(h.magic, magic, 4) != 0 ||
	    h.header_size < BATCH_HEADER_SIZE || h.record_size != record_size)
		return -EBADMSG;
	if ((uint64_t)h.header_size + (uint64_t)h.record_count * h.record_size != len)
		return -EMSGSIZE;
	if (hdr_out)
		*hdr_out = h;
	*records = (const char *)buf + h.header_size;
	return h.record_count;
}

#endif /* SEGSCOPE_BATCH_ENVELOPE_H */
