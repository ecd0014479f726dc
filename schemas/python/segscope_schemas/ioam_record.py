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


IOAM_RECORD_F_KNOWN = IOAM_RECORD_F_OVERFLOW | IOAM_RECORD_F_TRUNCATED
US_PER_S = 1_000_000

# check_records() reasons, in the order they are tested (the first that applies is reported)
RECORD_PROBLEMS = (
    "zero_flow_id",  # flow ids are 1..2^32-1 (schemas/paths.md)
    "zero_timestamp",  # rx_tai_ns or tx_tai_ns is 0: a field the datapath did not fill
    "bad_trace_type",  # not 0xF00000: the entries would be read with the wrong layout
    "no_entries",  # filled == 0: the ingress edge always fills its own entry
    "filled_exceeds_slots",  # more entries filled than the trace had room for
    "truncated_mismatch",  # F_TRUNCATED set without more than 12 filled entries, or the reverse
    "unknown_flags",  # flag bits this reader does not know
    "zero_entry_timestamp",  # a copied entry with timestamp seconds 0 (not filled)
    "bad_subseconds",  # a copied entry's subseconds >= 10^6 (they are microseconds)
)


def entry_words(records: np.ndarray) -> np.ndarray:
    """The node entries of every record as host-order 32-bit words, shape (n, 12, 4), contiguous:
    [..., 0] hop limit << 24 | node id, [..., 1] ingress if id << 16 | egress if id, [..., 2]
    timestamp seconds, [..., 3] subseconds; wire order (entry 0 = the node nearest the egress).
    One copy and byte swap of the entries block: reading the big-endian fields one by one through
    the 256-byte record stride costs ten times as much."""
    n = len(records)
    if records.dtype != IOAM_RECORD_DTYPE:  # e.g. np.concatenate made the entries host order
        records = records.astype(IOAM_RECORD_DTYPE)
    raw = np.ascontiguousarray(records).view(np.uint8).reshape(n, IOAM_RECORD_SIZE)
    block = np.ascontiguousarray(raw[:, 64:]).view(">u4")
    return block.astype(np.uint32).reshape(n, IOAM_RECORD_MAX_NODES, 4)


def problem_codes(records: np.ndarray, words: np.ndarray | None = None) -> np.ndarray:
    """Per record 0 (usable) or 1 + the index in RECORD_PROBLEMS of its first problem (int8),
    vectorised. words: entry_words(records), if the caller has it already."""
    n = len(records)
    codes = np.zeros(n, dtype=np.int8)
    if n == 0:
        return codes
    if words is None:
        words = entry_words(records)
    filled = records["filled"]
    flags = records["flags"]
    lo, hi = int(filled.min()), int(filled.max())
    if (
        0 < lo
        and hi <= IOAM_RECORD_MAX_NODES
        and not flags.any()
        and (filled <= records["slots"]).all()
        and int(records["flow_id"].min()) > 0
        and int(records["rx_tai_ns"].min()) > 0
        and int(records["tx_tai_ns"].min()) > 0
        and (records["trace_type"] == IOAM_TRACE_TYPE).all()
    ):  # the usual batch: every record-level field is right; only the entries remain to check
        if lo == hi:
            ts = words[:, :lo, 2:4]
            if int(ts[:, :, 0].min()) > 0 and int(ts[:, :, 1].max()) < US_PER_S:
                return codes
    if lo == hi:  # the usual batch: one flow, one trace length
        c = min(lo, IOAM_RECORD_MAX_NODES)
        ts = words[:, :c, 2:4]
        if c and (int(ts[:, :, 0].min()) == 0 or int(ts[:, :, 1].max()) >= US_PER_S):
            zero_ts = (ts[:, :, 0] == 0).any(axis=1)
            bad_sub = (ts[:, :, 1] >= US_PER_S).any(axis=1)
        else:
            zero_ts = bad_sub = np.zeros(n, dtype=bool)
    else:
        in_trace = np.arange(IOAM_RECORD_MAX_NODES)[None, :] < np.minimum(filled, IOAM_RECORD_MAX_NODES)[:, None]
        zero_ts = ((words[:, :, 2] == 0) & in_trace).any(axis=1)
        bad_sub = ((words[:, :, 3] >= US_PER_S) & in_trace).any(axis=1)
    tests = (
        records["flow_id"] == 0,
        (records["rx_tai_ns"] == 0) | (records["tx_tai_ns"] == 0),
        records["trace_type"] != IOAM_TRACE_TYPE,
        filled == 0,
        filled > records["slots"],
        ((flags & IOAM_RECORD_F_TRUNCATED) != 0) != (filled > IOAM_RECORD_MAX_NODES),
        (flags & ~np.uint32(IOAM_RECORD_F_KNOWN)) != 0,
        zero_ts,
        bad_sub,
    )
    for code in range(len(tests), 0, -1):  # the earliest test is written last: it wins
        hit = tests[code - 1]
        if hit.any():
            codes[hit] = code
    return codes


def check_records(records: np.ndarray, words: np.ndarray | None = None) -> np.ndarray:
    """Per record "" (usable) or the first problem of RECORD_PROBLEMS (array of str)."""
    names = np.array(("",) + RECORD_PROBLEMS, dtype=object)
    return names[problem_codes(records, words)]
