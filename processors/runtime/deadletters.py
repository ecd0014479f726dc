"""Dead letters: an input message the processor cannot use goes to the dead-letter topic whole
(key and value in base64), with the reason and where it came from, so nothing is lost."""

from __future__ import annotations

import base64
import json
from typing import Callable

from segscope_schemas.batch_envelope import MalformedBatch


def decode_or_dead_letter(message, decode: Callable, counters) -> tuple:
    """(header, records, None) of one input message, or (None, None, its dead letter) for a
    tombstone or a batch `decode` refuses (MalformedBatch), counted in counters.malformed_batches."""
    try:
        if message.value is None:
            raise MalformedBatch("null_value", "message has no value (tombstone)")
        header, records = decode(message.value)
    except MalformedBatch as e:
        counters.malformed_batches += 1
        return None, None, dead_letter(e.reason, e.detail, message)
    return header, records, None


def dead_letter(reason: str, detail: str, message) -> bytes:
    """JSON dead letter (segscope.deadletter) that keeps the original key and value (base64),
    with where the message came from, so nothing is lost."""
    key, value = message.key, message.value
    return json.dumps(
        {
            "reason": reason,
            "detail": detail,
            "source_topic": message.topic,
            "partition": message.partition,
            "offset": message.offset,
            "key_b64": None if key is None else base64.b64encode(key).decode(),
            "value_b64": None if value is None else base64.b64encode(value).decode(),
        }
    ).encode()
