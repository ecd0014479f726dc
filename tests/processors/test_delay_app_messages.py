"""The per-message path of the Faust app (decode, fold, dead letter) on message objects.

The Kafka round trip is covered by test_delay_worker.py; this checks the dead-letter
document for every kind of bad input, including the ones that are hard to produce there.
"""

from __future__ import annotations

import base64
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
    letter, touched = app_mod.handle_message(message(encode_batch(recs, "A", 1)))
    assert letter is None
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
    raw, touched = app_mod.handle_message(message(value))
    letter = json.loads(raw)
    assert touched == {}
    assert letter["reason"] == reason and letter["detail"]
    assert (letter["source_topic"], letter["partition"], letter["offset"]) == ("segscope.stamp.records", 1, 7)
    assert base64.b64decode(letter["key_b64"]) == b"A/1"
    assert letter["value_b64"] == (None if value is None else base64.b64encode(value).decode())
    assert app_mod.aggregator.counters.malformed_batches == before + 1


def test_records_of_wrong_shape_are_a_processing_error_not_a_crash(monkeypatch):
    def explode(node, records, now_tai_ns=None):
        raise RuntimeError("boom")

    monkeypatch.setattr(app_mod.aggregator, "ingest", explode)
    before = app_mod.aggregator.counters.processing_errors
    letter = json.loads(
        app_mod.handle_message(message(encode_batch(np.zeros(1, dtype=STAMP_RECORD_DTYPE), "A", 1), key=None))[0]
    )
    assert letter["reason"] == "processing_error" and "boom" in letter["detail"]
    assert letter["key_b64"] is None
    assert app_mod.aggregator.counters.processing_errors == before + 1
