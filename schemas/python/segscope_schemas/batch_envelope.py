"""The Kafka envelope every batched record stream shares: mirror of schemas/c/batch_envelope.h.

A message is a 56-byte little-endian header followed by N fixed-size records:

    offset size field
    0      4    magic        names the record kind and layout ("SSB1" stamp_record, "AMB1" altmark_block)
    4      2    header_size  56; a reader skips to header_size (later layouts may grow the header)
    6      2    record_size  size of one record
    8      4    record_count N
    12     4    flags        0
    16     8    batch_seq    per-producer counter, +1 per message (names a batch with `node`)
    24     32   node         node name, UTF-8, NUL-padded
    56     N*record_size     the records

The record modules (stamp_record, altmark_block) bind magic, record size and numpy dtype;
this module holds the one implementation of the header checks.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

import numpy as np

BATCH_HEADER_SIZE = 56
BATCH_NODE_LEN = 32
# A node's name: the key of its records (Kafka keys "<node>/<ssid>"), its Influx tag, its topology
# documents' keys. Kubernetes node names (RFC 1123: lowercase letters, digits, '-', '.') and the
# labs' names (A, R1, core_1) both fit; at most BATCH_NODE_LEN bytes, the batch header's field.
NODE_NAME_RE = re.compile(rf"^(?=.{{1,{BATCH_NODE_LEN}}}$)[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?$")
NODE_NAME_RULE = f"use 1-{BATCH_NODE_LEN} characters [A-Za-z0-9_.-], starting and ending with a letter, a digit or '_'"


def node_name_problem(name: object) -> str | None:
    """None if `name` is a valid node name, else what is wrong and how to fix it."""
    if isinstance(name, str) and NODE_NAME_RE.match(name):
        return None
    return f"node name {name!r} is not valid: {NODE_NAME_RULE}"


_HEADER = struct.Struct("<4sHHIIQ32s")
assert _HEADER.size == BATCH_HEADER_SIZE


class MalformedBatch(ValueError):
    """A message that is not a valid batch; `reason` is a short machine-readable code."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class BatchHeader:
    record_count: int
    flags: int
    batch_seq: int
    node: str
    header_size: int = BATCH_HEADER_SIZE


def encode(records: np.ndarray, dtype: np.dtype, magic: bytes, node: str, batch_seq: int, flags: int = 0) -> bytes:
    """Header + records (an array of `dtype`) as one Kafka message value."""
    records = np.ascontiguousarray(records, dtype=dtype)
    node_b = node.encode()
    if len(node_b) > BATCH_NODE_LEN:
        raise ValueError(f"node name longer than {BATCH_NODE_LEN} bytes: {node!r}")
    hdr = _HEADER.pack(magic, BATCH_HEADER_SIZE, dtype.itemsize, len(records), flags, batch_seq, node_b)
    return hdr + records.tobytes()


def decode_header(buf: bytes | memoryview, magic: bytes, record_size: int) -> BatchHeader:
    if len(buf) < BATCH_HEADER_SIZE:
        raise MalformedBatch("short_header", f"{len(buf)} bytes, header needs {BATCH_HEADER_SIZE}")
    got_magic, hsize, rsize, count, flags, seq, node = _HEADER.unpack_from(buf, 0)
    if got_magic != magic:
        raise MalformedBatch("bad_magic", f"magic {got_magic!r}, expected {magic!r}")
    if hsize < BATCH_HEADER_SIZE:
        raise MalformedBatch("bad_header_size", f"header_size {hsize} < {BATCH_HEADER_SIZE}")
    if rsize != record_size:
        raise MalformedBatch("bad_record_size", f"record_size {rsize}, expected {record_size}")
    if hsize + count * rsize != len(buf):
        raise MalformedBatch(
            "length_mismatch", f"{len(buf)} bytes for {count} records (expected {hsize + count * rsize})"
        )
    try:
        node_s = node.rstrip(b"\0").decode()
    except UnicodeDecodeError as e:
        raise MalformedBatch("bad_node", f"node name is not UTF-8: {e}") from None
    return BatchHeader(count, flags, seq, node_s, hsize)


def message_length(header: bytes | memoryview, magic: bytes, record_size: int) -> int:
    """Length of the whole batch from its first BATCH_HEADER_SIZE bytes: how a reader of a byte
    stream of batches (stamp_streamer --copy-fd) knows how much to read next."""
    if len(header) < BATCH_HEADER_SIZE:
        raise MalformedBatch("short_header", f"{len(header)} bytes, header needs {BATCH_HEADER_SIZE}")
    got_magic, hsize, rsize, count, _flags, _seq, _node = _HEADER.unpack_from(header, 0)
    if got_magic != magic:
        raise MalformedBatch("bad_magic", f"magic {got_magic!r}, expected {magic!r}")
    if hsize < BATCH_HEADER_SIZE or rsize != record_size:
        raise MalformedBatch("bad_header_size", f"header_size {hsize}, record_size {rsize}")
    return hsize + count * rsize


def decode(buf: bytes | memoryview, dtype: np.dtype, magic: bytes) -> tuple[BatchHeader, np.ndarray]:
    """Validate and decode one message: (header, records array view, zero copy)."""
    hdr = decode_header(buf, magic, dtype.itemsize)
    recs = np.frombuffer(buf, dtype=dtype, count=hdr.record_count, offset=hdr.header_size)
    return hdr, recs


def join_records(parts: list[np.ndarray]) -> np.ndarray:
    """The records of several decoded batches (one record dtype) as one array, in order.

    As bytes, not np.concatenate of the record arrays: numpy promotes the fields of structured
    arrays one array at a time (~40 µs each), which at 20 records per message cost more than all
    the rest of folding a fetch's messages; joined as uint8 it is a memory copy."""
    if len(parts) == 1:
        return parts[0]
    dtype = parts[0].dtype
    return np.concatenate([np.ascontiguousarray(p).view(np.uint8) for p in parts]).view(dtype)
