"""stamp_record and stamp_batch: mirror of schemas/c/stamp_record.h and stamp_batch.h.

A Kafka message on `segscope.stamp.records` is a 56-byte header followed by
N 64-byte records. decode_batch() turns one message into a numpy structured
array in one step (np.frombuffer, no per-record Python work).
"""

from __future__ import annotations

import numpy as np

from segscope_schemas import batch_envelope
from segscope_schemas.batch_envelope import BatchHeader, MalformedBatch  # noqa: F401  (re-exported)

_HEADER = batch_envelope._HEADER  # the shared header layout (the layout tests compare it with C)

STAMP_RECORD_SIZE = 64
STAMP_BATCH_MAGIC = b"SSB1"
STAMP_BATCH_HEADER_SIZE = 56
STAMP_BATCH_NODE_LEN = 32

STAMP_RECORD_F_NTP = 0x1
STAMP_RECORD_F_SRH = 0x2
STAMP_RECORD_F_ONE_WAY = 0x4  # one-way mode: T1, T2 only (t3_ns = t4_ns = 0)
STAMP_RECORD_F_LOOPBACK = 0x8  # loopback mode: T1, T4 only (t2_ns = t3_ns = 0)
# the reflector's T2/T3 were NTP on the wire (its Error Estimate's Z = 0); F_NTP is the sender's (T1)
STAMP_RECORD_F_REFLECTOR_NTP = 0x10

# Same names, order and offsets as struct stamp_record (checked by tests against the C compiler).
STAMP_RECORD_DTYPE = np.dtype(
    [
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
    ]
)
assert STAMP_RECORD_DTYPE.itemsize == STAMP_RECORD_SIZE


def encode_batch(records: np.ndarray, node: str, batch_seq: int, flags: int = 0) -> bytes:
    """Encode records (STAMP_RECORD_DTYPE array) as one Kafka message value."""
    return batch_envelope.encode(records, STAMP_RECORD_DTYPE, STAMP_BATCH_MAGIC, node, batch_seq, flags)


def message_length(header: bytes | memoryview) -> int:
    """Whole batch length from its first 56 bytes (for a byte stream of batches)."""
    return batch_envelope.message_length(header, STAMP_BATCH_MAGIC, STAMP_RECORD_SIZE)


def decode_header(buf: bytes | memoryview) -> BatchHeader:
    return batch_envelope.decode_header(buf, STAMP_BATCH_MAGIC, STAMP_RECORD_SIZE)


def decode_batch(buf: bytes | memoryview) -> tuple[BatchHeader, np.ndarray]:
    """Validate and decode one message: (header, records array view, zero copy)."""
    return batch_envelope.decode(buf, STAMP_RECORD_DTYPE, STAMP_BATCH_MAGIC)
