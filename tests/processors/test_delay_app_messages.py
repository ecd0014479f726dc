"""The batch path of the Faust app (decode, fold, dead letter) on message objects.

The Kafka round trip is covered by test_delay_worker.py; this checks the dead-letter
document for every kind of bad input, including the ones that are hard to produce there.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest

import processors.delay.app as app_mod  # noqa: E402  (a Faust App object; nothing connects until it runs)
from segscope_schemas.stamp_record import STAMP_RECORD_DTYPE, encode_batch


def message(value, key=b"A/1", offset=7):
    return SimpleNamespace(topic="segscope.stamp.records", partition=1, offset=offset, key=key, value=value)


def test_good_batch_is_folded_and_produces_no_letter():
    agg = app_mod.aggregator
    before = agg.counters.records_in
    recs = np.zeros(3, dtype=STAMP_RECORD_DTYPE)
    recs["t1_ns"] = 1_700_000_000 * 10**9
    recs["t2_ns"] = recs["t1_ns"] + 1000
    recs["t3_ns"] = recs["t2_ns"]
    recs["t4_ns"] = recs["t3_ns"] + 1000
    recs["sender_seq"] = [1, 2, 3]
    recs["ssid"] = [4, 4, 9]
    recs["t1_ns"][2] += 2 * 10**9  # session 9's record is two seconds later
    letters, touched = app_mod.handle_messages([message(encode_batch(recs, "A", 1))])
    assert letters == []
    assert agg.counters.records_in == before + 3
    # the seconds the message's offset waits for: its input is committed once they are evicted
    assert touched == {("A", 4): 1_700_000_000, ("A", 9): 1_700_000_002}
    assert not app_mod.message_finished(touched)


@pytest.mark.parametrize(
    "value,reason",
    [
        (b"", "short_header"),
        (b"XXXX" + bytes(52), "bad_magic"),
        (encode_batch(np.zeros(2, dtype=STAMP_RECORD_DTYPE), "A", 1)[:-1], "length_mismatch"),
        (None, "null_value"),
    ],
)
def test_bad_messages_become_dead_letters_with_the_original_bytes(value, reason):
    before = app_mod.aggregator.counters.malformed_batches
    letters, touched = app_mod.handle_messages([message(value)])
    [(_, raw)] = letters
    letter = json.loads(raw)
    assert touched == {}
    assert letter["reason"] == reason and letter["detail"]
    assert (letter["source_topic"], letter["partition"], letter["offset"]) == ("segscope.stamp.records", 1, 7)
    assert base64.b64decode(letter["key_b64"]) == b"A/1"
    assert letter["value_b64"] == (None if value is None else base64.b64encode(value).decode())
    assert app_mod.aggregator.counters.malformed_batches == before + 1


def test_records_of_wrong_shape_are_a_processing_error_not_a_crash(monkeypatch):
    def explode(parts, now_tai_ns=None):
        raise RuntimeError("boom")

    monkeypatch.setattr(app_mod.aggregator, "ingest_parts", explode)
    before = app_mod.aggregator.counters.processing_errors
    [(_, raw)] = app_mod.handle_messages(
        [message(encode_batch(np.zeros(1, dtype=STAMP_RECORD_DTYPE), "A", 1), key=None)]
    )[0]
    letter = json.loads(raw)
    assert letter["reason"] == "processing_error" and "boom" in letter["detail"]
    assert letter["key_b64"] is None
    assert app_mod.aggregator.counters.processing_errors == before + 1


def stamp_records(ssid: int, first_second: int, seqs: list[int]) -> np.ndarray:
    recs = np.zeros(len(seqs), dtype=STAMP_RECORD_DTYPE)
    recs["t1_ns"] = first_second * 10**9 + np.arange(len(seqs)) * 10**6
    recs["t2_ns"] = recs["t1_ns"] + 1000
    recs["t3_ns"] = recs["t2_ns"]
    recs["t4_ns"] = recs["t3_ns"] + 1000
    recs["sender_seq"] = seqs
    recs["ssid"] = ssid
    return recs


def test_a_batch_of_several_nodes_is_folded_in_one_call_and_one_bad_message_is_found():
    """The messages of a fetch go to the aggregator in one call (several nodes and sessions); when
    that call fails, the messages are folded one by one and only the one it fails on is a dead
    letter: the others are counted once."""
    agg = app_mod.aggregator
    s = 1_700_000_100
    good = [
        message(encode_batch(stamp_records(1, s, [1, 2]), "B", 1), offset=1),
        message(encode_batch(stamp_records(2, s + 1, [5]), "C", 1), offset=2),
        message(encode_batch(stamp_records(1, s + 3, [9]), "B", 2), offset=3),
    ]
    before = dataclasses.replace(agg.counters)
    letters, touched = app_mod.handle_messages(good)
    assert letters == []
    assert touched == {("B", 1): s + 3, ("C", 2): s + 1}
    assert agg.counters.records_in == before.records_in + 4
    assert agg.counters.batches_in == before.batches_in + 3
    assert sorted(agg.sessions[("B", 1)].seconds) == [s, s + 3]

    poison = encode_batch(stamp_records(7, s, [1]), "POISON", 1)
    original = agg.ingest_parts

    def fails_on_poison(parts, now_tai_ns=None):
        if any(node == "POISON" for node, _ in parts):
            raise RuntimeError("cannot fold POISON")
        return original(parts, now_tai_ns)

    batch = [message(encode_batch(stamp_records(3, s, [1, 2, 3]), "D", 1), offset=4), message(poison, offset=5)]
    before = dataclasses.replace(agg.counters)
    agg.ingest_parts = fails_on_poison
    try:
        letters, touched = app_mod.handle_messages(batch)
    finally:
        del agg.ingest_parts
    [(bad, raw)] = letters
    assert bad.offset == 5 and json.loads(raw)["reason"] == "processing_error"
    assert touched == {("D", 3): s}
    assert agg.counters.records_in == before.records_in + 3  # the failed call's count was rolled back
    assert agg.counters.processing_errors == before.processing_errors + 1
