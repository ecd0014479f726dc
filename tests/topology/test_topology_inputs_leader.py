"""InputReader at start: a topic created a moment before (ensure_topics) may have no leader yet.
Seen in a full test run: the topology worker died on NOT_LEADER_FOR_PARTITION from
get_watermark_offsets. Kafka cannot be made to hold an election open on demand, so the retry rule
is checked on the call it wraps, with librdkafka's own error objects."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from processors.worker import once_led


def answers(*outcomes):
    """A call that raises or returns the outcomes in order; .calls counts them."""

    def call(timeout):
        assert timeout >= 1.0
        call.calls += 1
        out = outcomes[min(call.calls - 1, len(outcomes) - 1)]
        if isinstance(out, int):
            raise KafkaException(KafkaError(out))
        return out

    call.calls = 0
    return call


def test_no_leader_yet_is_retried_until_the_answer():
    call = answers(KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, (0, 7))
    assert once_led(call, "t[0]", timeout_s=10) == (0, 7) and call.calls == 3


def test_other_errors_are_raised_at_once_and_no_leader_only_until_the_timeout():
    call = answers(KafkaError.UNKNOWN_TOPIC_OR_PART)
    with pytest.raises(KafkaException):
        once_led(call, "t[0]", timeout_s=10)
    assert call.calls == 1
    call = answers(KafkaError.NOT_LEADER_FOR_PARTITION)
    t0 = time.monotonic()
    with pytest.raises(KafkaException):
        once_led(call, "t[0]", timeout_s=0.5)
    assert 0.4 <= time.monotonic() - t0 < 3 and call.calls >= 2
