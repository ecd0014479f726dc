"""ioam_record and ioam_batch: mirror of schemas/c/ioam_record.h (wire formats: schemas/IOAM.md).

A Kafka message on `segscope.ioam.records` is the 56-byte batch envelope followed by N
256-byte records. decode_batch() turns one message into a numpy structured array in one step
(np.frombuffer, no per-record Python work). The node entries inside a record are as on the wire
(big-endian fields, newest node first): `entries_in_path_order()` gives them oldest first, with
host-order fields.
"""

from __future__ import annotations

import numpy as np

from segscope_schemas import batch_envelope
from segscope_schemas.batch_envelope import BatchHeader, MalformedBatch  # noqa: F401  (re-exported)

IOAM_RECORD_SIZE = 256
IOAM_RECORD_MAX_NODES = 12
IOAM_NODE_ENTRY_SIZE = 16
IOAM_BATCH_MAGIC = b"IOB1"

IOAM_RECORD_F_OVERFLOW = 0x1  # the trace's Overflow flag: a node found no room for its entry
IOAM_RECORD_F_TRUNCATED = 0x2  # more filled entries than the record holds: the oldest were not copied

IOAM_TRACE_TYPE = 0xF00000  # hop limit + node id, if ids (short), timestamp seconds, subseconds
IOAM_IF_ID_UNAVAILABLE = 0xFFFF

# One node entry as on the wire: big-endian fields (struct ioam_node_entry).
IOAM_NODE_ENTRY_DTYPE = np.dtype(
    [
        ("hop_limit_node_id", ">u4"),
        ("ingress_if_id", ">u2"),
        ("egress_if_id", ">u2"),
        ("ts_sec", ">u4"),
        ("ts_subsec", ">u4"),
    ]
)
assert IOAM_NODE_ENTRY_DTYPE.itemsize == IOAM_NODE_ENTRY_SIZE

# Same names, order and offsets as struct ioam_record (checked by tests against the C compiler).
IOAM_RECORD_DTYPE = np.dtype(
    [
        ("rx_tai_ns", "<u8"),
        ("tx_tai_ns", "<u8"),
        ("seq", "<u8"),
        ("flow_id", "<u4"),
        ("ifindex", "<u4"),
        ("node_id", "<u4"),
        ("namespace_id", "<u2"),
        ("slots", "u1"),
        ("filled", "u1"),
        ("trace_type", "<u4"),
        ("trace_flags", "u1"),
        ("hop_limit", "u1"),
        ("tai_utc_offset_s", "<i2"),
        ("flags", "<u4"),
        ("reserved0", "<u4"),
        ("reserved1", "<u8"),
        ("entries", IOAM_NODE_ENTRY_DTYPE, (IOAM_RECORD_MAX_NODES,)),
    ]
)
assert IOAM_RECORD_DTYPE.itemsize == IOAM_RECORD_SIZE


def encode_batch(records: np.ndarray, node: str, batch_seq: int, flags: int = 0) -> bytes:
    """Encode records (IOAM_RECORD_DTYPE array) as one Kafka message value."""
    return batch_envelope.encode(records, IOAM_RECORD_DTYPE, IOAM_BATCH_MAGIC, node, batch_seq, flags)


def message_length(header: bytes | memoryview) -> int:
    """Whole batch length from its first 56 bytes (for a byte stream of batches)."""
    return batch_envelope.message_length(header, IOAM_BATCH_MAGIC, IOAM_RECORD_SIZE)


def decode_header(buf: bytes | memoryview) -> BatchHeader:
    return batch_envelope.decode_header(buf, IOAM_BATCH_MAGIC, IOAM_RECORD_SIZE)


def decode_batch(buf: bytes | memoryview) -> tuple[BatchHeader, np.ndarray]:
    """Validate and decode one message: (header, records array view, zero copy)."""
    return batch_envelope.decode(buf, IOAM_RECORD_DTYPE, IOAM_BATCH_MAGIC)


def copied_entries(records: np.ndarray) -> np.ndarray:
    """How many entries each record holds: min(filled, IOAM_RECORD_MAX_NODES)."""
    return np.minimum(records["filled"], IOAM_RECORD_MAX_NODES)


# One node entry in host order (entries_in_path_order).
IOAM_NODE_HOST_DTYPE = np.dtype(
    [
        ("hop_limit", "u1"),
        ("node_id", "<u4"),
        ("ingress_if_id", "<u2"),
        ("egress_if_id", "<u2"),
        ("ts_sec", "<u4"),
        ("ts_subsec", "<u4"),
    ]
)


def entries_in_path_order(record: np.void) -> np.ndarray:
    """The entries one record holds, oldest first (the ingress edge, then each node the packet
    reached), host-order fields. A truncated record (IOAM_RECORD_F_TRUNCATED) holds the newest
    IOAM_RECORD_MAX_NODES only: its first entry here is not the ingress edge's."""
    n = int(min(int(record["filled"]), IOAM_RECORD_MAX_NODES))
    wire = record["entries"][:n][::-1]
    out = np.zeros(n, dtype=IOAM_NODE_HOST_DTYPE)
    hn = wire["hop_limit_node_id"].astype(np.uint32)
    out["hop_limit"] = hn >> 24
    out["node_id"] = hn & 0xFFFFFF
    for name in ("ingress_if_id", "egress_if_id", "ts_sec", "ts_subsec"):
        out[name] = wire[name]
    return out


def kafka_key(node: str, flow_id: int) -> bytes:
    """The message key on segscope.ioam.records: `<node>/<flow_id>` (the egress node)."""
    return f"{node}/{flow_id}".encode()
