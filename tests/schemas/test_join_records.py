"""batch_envelope.join_records: the records of several decoded batches as one array."""

from __future__ import annotations

import numpy as np

from segscope_schemas.altmark_block import ALTMARK_BLOCK_DTYPE
from segscope_schemas.batch_envelope import join_records
from segscope_schemas.stamp_record import STAMP_RECORD_DTYPE, decode_batch, encode_batch


def test_joined_records_are_those_of_each_batch_in_order():
    rng = np.random.default_rng(3)
    batches = []
    for size in (3, 0, 20, 1):
        r = np.zeros(size, dtype=STAMP_RECORD_DTYPE)
        r["t1_ns"] = rng.integers(0, 2**62, size)
        r["ssid"] = rng.integers(0, 2**16, size)
        r["sender_seq"] = rng.integers(0, 2**32, size)
        batches.append(decode_batch(encode_batch(r, "n", 1))[1])  # read-only views of the message bytes
    joined = join_records(batches)
    assert joined.dtype == STAMP_RECORD_DTYPE and len(joined) == 24
    assert joined.tobytes() == np.concatenate(batches).tobytes()


def test_a_strided_part_is_joined_by_its_records_not_its_memory():
    r = np.zeros(6, dtype=ALTMARK_BLOCK_DTYPE)
    r["flow_id"] = np.arange(6)
    joined = join_records([r[::2], r[1:2]])  # every other record: not contiguous
    assert joined["flow_id"].tolist() == [0, 2, 4, 1]


def test_one_part_is_returned_as_it_is():
    r = np.zeros(2, dtype=ALTMARK_BLOCK_DTYPE)
    assert join_records([r]) is r
