"""altmark_block and altmark_batch: mirror of schemas/c/altmark_block.h.

A Kafka message on `segscope.altmark.blocks` is a 56-byte header ("AMB1")
followed by N 64-byte records, one per (node, flow, direction, block).
decode_batch() turns one message into a numpy structured array in one step.
check_records() gives, per record, the first reason it is unusable ("" if none),
with the same names and order as altmark_block_check() in C.
"""

from __future__ import annotations

import numpy as np

from segscope_schemas import batch_envelope
from segscope_schemas.batch_envelope import BatchHeader, MalformedBatch  # noqa: F401  (re-exported)

_HEADER = batch_envelope._HEADER  # the shared header layout (the layout tests compare it with C)

ALTMARK_BLOCK_SIZE = 64
ALTMARK_BATCH_MAGIC = b"AMB1"
ALTMARK_BATCH_HEADER_SIZE = 56
ALTMARK_BATCH_NODE_LEN = 32

DIR_TX = 1
DIR_RX = 2
METHOD_DSCP = 1
METHOD_RFC9343 = 2
METHOD_NAMES = {METHOD_DSCP: "dscp", METHOD_RFC9343: "rfc9343"}
FLOWMONID_MAX = 0xFFFFF

F_PARTIAL = 0x1  # counts do not cover the whole block (agent/program started during it)
F_KNOWN = 0x1

NS_PER_MS = 1_000_000

# Same names, order and offsets as struct altmark_block (checked by tests against the C compiler).
ALTMARK_BLOCK_DTYPE = np.dtype(
    [
        ("block_index", "<u8"),
        ("block_start_ns", "<u8"),
        ("packets", "<u8"),
        ("bytes", "<u8"),
        ("boot_id", "<u8"),
        ("flow_id", "<u4"),
        ("period_ms", "<u4"),
        ("direction", "u1"),
        ("colour", "u1"),
        ("method", "u1"),
        ("reserved0", "u1"),
        ("flags", "<u2"),
        ("dmark_packets", "<u2"),  # double marking: D-marked packets in the block (delta, mod 2^16)
        ("dmark_ts_sum_ns", "<u8"),  # delta (mod 2^64) of the sum of their CLOCK_TAI ns timestamps
    ]
)
assert ALTMARK_BLOCK_DTYPE.itemsize == ALTMARK_BLOCK_SIZE

# Problem names in the order altmark_block_check() tests them.
PROBLEMS = (
    "bad_direction",
    "bad_method",
    "bad_colour",
    "zero_period",
    "bad_block_start",
    "colour_mismatch",
    "flow_id_too_big",
    "unknown_flags",
)


def block_index(tai_ns: int, period_ms: int) -> int:
    """Index of the block containing CLOCK_TAI time tai_ns (both edges agree without messaging)."""
    return tai_ns // (period_ms * NS_PER_MS)


def counter_delta(prev: int, cur: int, width_bits: int = 64) -> int:
    """Count between two snapshots of a width_bits-wide counter (modular: survives one wrap).

    Mirror of altmark_counter_delta(); a reset counter is not detectable from values alone
    (the collector sets F_PARTIAL when it knows the program/map was recreated)."""
    return (cur - prev) & ((1 << width_bits) - 1)


def dmark_delay_ns(tx_n: int, tx_sum: int, rx_n: int, rx_sum: int) -> int | None:
    """Mean one-way delay (ns) of a block from double marking, None when undefined.

    Mirror of altmark_dmark_delay_ns(): defined only when both edges saw the same number
    n > 0 of D-marked packets; the difference of the sums is taken mod 2^64 as signed."""
    if not tx_n or tx_n != rx_n:
        return None
    diff = (rx_sum - tx_sum) & ((1 << 64) - 1)
    if diff >= 1 << 63:
        diff -= 1 << 64
    return -((-diff) // tx_n) if diff < 0 else diff // tx_n  # C: truncation toward 0


def kafka_key(node: str, flow_id: int) -> bytes:
    return f"{node}/{flow_id}".encode()


def check_records(recs: np.ndarray) -> np.ndarray:
    """Per record: "" if usable, else the first problem name (same order as the C check)."""
    recs = np.asarray(recs, dtype=ALTMARK_BLOCK_DTYPE)
    out = np.full(len(recs), "", dtype=object)
    period_ns = recs["period_ms"].astype(np.uint64) * np.uint64(NS_PER_MS)
    safe_period = np.where(period_ns == 0, np.uint64(1), period_ns)
    start = recs["block_start_ns"]
    masks = (
        (recs["direction"] != DIR_TX) & (recs["direction"] != DIR_RX),
        (recs["method"] != METHOD_DSCP) & (recs["method"] != METHOD_RFC9343),
        recs["colour"] > 1,
        period_ns == 0,
        # division, not block_index * period: that product can overflow 64 bits
        (start % safe_period != 0) | (start // safe_period != recs["block_index"]),
        recs["colour"] != (recs["block_index"] & np.uint64(1)),
        (recs["method"] == METHOD_RFC9343) & (recs["flow_id"] > FLOWMONID_MAX),
        (recs["flags"] & np.uint16(~F_KNOWN & 0xFFFF)) != 0,
    )
    for name, mask in zip(reversed(PROBLEMS), reversed(masks)):  # first problem wins
        out[mask] = name
    return out


def encode_batch(records: np.ndarray, node: str, batch_seq: int, flags: int = 0) -> bytes:
    """Encode records (ALTMARK_BLOCK_DTYPE array) as one Kafka message value."""
    return batch_envelope.encode(records, ALTMARK_BLOCK_DTYPE, ALTMARK_BATCH_MAGIC, node, batch_seq, flags)


def decode_header(buf: bytes | memoryview) -> BatchHeader:
    return batch_envelope.decode_header(buf, ALTMARK_BATCH_MAGIC, ALTMARK_BLOCK_SIZE)


def decode_batch(buf: bytes | memoryview) -> tuple[BatchHeader, np.ndarray]:
    """Validate and decode one message: (header, records array view, zero copy)."""
    return batch_envelope.decode(buf, ALTMARK_BLOCK_DTYPE, ALTMARK_BATCH_MAGIC)
