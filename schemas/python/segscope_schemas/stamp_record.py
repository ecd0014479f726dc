"""stamp_record and stamp_batch: mirror of schemas/c/stamp_record.h and stamp_batch.h.

A Kafka message on `segscope.stamp.records` is a 56-byte header followed by
N 64-byte records. decode_batch() turns one message into a numpy structured
array in one step (np.frombuffer, no per-record Python work).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

STAMP_RECORD_SIZE = 64
STAMP_BATCH_MAGIC = b"SSB1"
STAMP_BATCH_HEADER_SIZE = 56
STAMP_BATCH_NODE_LEN = 32

STAMP_RECORD_F_NTP = 0x1
STAMP_RECORD_F_SRH = 0x2
STAMP_RECORD_F_ONE_WAY = 0x4    # one-way mode: T1, T2 only (t3_ns = t4_ns = 0)
STAMP_RECORD_F_LOOPBACK = 0x8   # loopback mode: T1, T4 only (t2_ns = t3_ns = 0)

# Same names, order and offsets as struct stamp_record (checked by tests against the C compiler).
STAMP_RECORD_DTYPE = np.dtype([
    ("t1_ns", "<u8"),
    ("t2_ns", "<u8"),
    ("t3_ns", "<u8"),
    ("t4_ns", "<u8"),
    ("sender_seq", "<u4"),
    ("reflector_seq", "<u4"),
    ("ssid", "<u2"),
    ("sender_err_est", "<u2"),
    ("reflector_err_est", "<u2"),
    ("sender_ttl", "u1"),
    ("reply_hop_limit", "u1"),
    ("ifindex", "<u4"),
    ("flags", "<u4"),
    ("reserved", "<u8"),
])
assert STAMP_RECORD_DTYPE.itemsize == STAMP_RECORD_SIZE

_HEADER = struct.Struct("<4sHHIIQ32s")
assert _HEADER.size == STAMP_BATCH_HEADER_SIZE


class MalformedBatch(ValueError):
    """A message that is not a valid stamp_batch; `reason` is a short machine-readable code."""

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
    header_size: int = STAMP_BATCH_HEADER_SIZE


def encode_batch(records: np.ndarray, node: str, batch_seq: int, flags: int = 0) -> bytes:
    """Encode records (STAMP_RECORD_DTYPE array) as one Kafka message value."""
    records = np.ascontiguousarray(records, dtype=STAMP_RECORD_DTYPE)
    node_b = node.encode()
    if len(node_b) > STAMP_BATCH_NODE_LEN:
        raise ValueError(f"node name longer than {STAMP_BATCH_NODE_LEN} bytes: {node!r}")
    hdr = _HEADER.pack(STAMP_BATCH_MAGIC, STAMP_BATCH_HEADER_SIZE, STAMP_RECORD_SIZE,
                       len(records), flags, batch_seq, node_b)
    return hdr + records.tobytes()


def decode_header(buf: bytes | memoryview) -> BatchHeader:
    if len(buf) < STAMP_BATCH_HEADER_SIZE:
        raise MalformedBatch("short_header", f"{len(buf)} bytes, header needs {STAMP_BATCH_HEADER_SIZE}")
    magic, hsize, rsize, count, flags, seq, node = _HEADER.unpack_from(buf, 0)
    if magic != STAMP_BATCH_MAGIC:
        raise MalformedBatch("bad_magic", f"magic {magic!r}, expected {STAMP_BATCH_MAGIC!r}")
    if hsize < STAMP_BATCH_HEADER_SIZE:
        raise MalformedBatch("bad_header_size", f"header_size {hsize} < {STAMP_BATCH_HEADER_SIZE}")
    if rsize != STAMP_RECORD_SIZE:
        raise MalformedBatch("bad_record_size", f"record_size {rsize}, expected {STAMP_RECORD_SIZE}")
    if hsize + count * rsize != len(buf):
        raise MalformedBatch("length_mismatch",
                             f"{len(buf)} bytes for {count} records (expected {hsize + count * rsize})")
    try:
        node_s = node.rstrip(b"\0").decode()
    except UnicodeDecodeError as e:
        raise MalformedBatch("bad_node", f"node name is not UTF-8: {e}") from None
    return BatchHeader(count, flags, seq, node_s, hsize)


def decode_batch(buf: bytes | memoryview) -> tuple[BatchHeader, np.ndarray]:
    """Validate and decode one message: (header, records array view, zero copy)."""
    hdr = decode_header(buf)
    recs = np.frombuffer(buf, dtype=STAMP_RECORD_DTYPE, count=hdr.record_count, offset=hdr.header_size)
    return hdr, recs
