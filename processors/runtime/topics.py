"""Reading a topic outside the consumer group: its offsets (waiting out a leader election) and
every value up to its end, e.g. a processor's progress topic at each assignment."""

from __future__ import annotations

import json
import logging
import time

from segscope_kafka import kafka_config

log = logging.getLogger("segscope.worker")


def once_led(call, what: str, timeout_s: float):
    """call(timeout) -> its result, for a read of a topic's offsets. A topic created a moment ago
    (every worker's ensure_topics at start; seen in a full test run: the topology worker died) may have no
    leader yet: the broker answers NOT_LEADER_FOR_PARTITION or LEADER_NOT_AVAILABLE until the
    election ends, so those are retried until timeout_s; any other error is raised."""
    from confluent_kafka import KafkaError, KafkaException

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call(max(1.0, deadline - time.monotonic()))
        except KafkaException as e:
            code = e.args[0].code() if e.args else None
            retriable = code in (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE)
            if not retriable or time.monotonic() >= deadline:
                raise
            log.info("%s has no leader yet (%s); retrying", what, e.args[0].name())
            time.sleep(0.2)


def watermarks(consumer, topic: str, partition: int, timeout_s: float) -> tuple[int, int]:
    """(low, high) offsets of one partition, waiting out a leader election (once_led)."""
    from confluent_kafka import TopicPartition

    tp = TopicPartition(topic, partition)
    return once_led(lambda t: consumer.get_watermark_offsets(tp, timeout=t), f"{topic}[{partition}]", timeout_s)


def read_topic(bootstrap: str, topic: str, group_id: str) -> list[tuple[bytes | None, bytes]]:
    """Every (key, value) of a topic up to its end now, oldest first per partition (no commit)."""
    from confluent_kafka import Consumer, TopicPartition

    out: list[tuple[bytes | None, bytes]] = []
    c = Consumer(kafka_config({"bootstrap.servers": bootstrap, "group.id": group_id, "enable.auto.commit": False}))
    try:
        for p in c.list_topics(topic, timeout=10).topics[topic].partitions:
            low, high = watermarks(c, topic, p, 10)
            if high <= low:
                continue
            c.assign([TopicPartition(topic, p, low)])
            pos = low
            while pos < high:
                for m in c.consume(num_messages=10000, timeout=1.0):
                    if m.error() is None:
                        out.append((m.key(), m.value()))
                    pos = m.offset() + 1
    finally:
        c.close()
    return out


def read_progress(bootstrap: str, topic: str, group_id: str) -> list[dict]:
    """Every JSON value of a processor's progress topic, oldest first (read once, at start).

    The delay and loss processors write there, before they ack input, how far their results are
    final (processors/delay/app.py explains why); a restarted worker seeds itself from it."""
    return [json.loads(value) for _, value in read_topic(bootstrap, topic, group_id)]
