"""Kafka outputs: stamp_batch records (same topic/key/value as stamp_streamer) and counter lines."""

from __future__ import annotations

import time

import numpy as np

from segscope_schemas import names
from segscope_schemas.stamp_record import encode_batch

RECORDS_TOPIC = names.TOPIC_STAMP_RECORDS
METRICS_TOPIC = names.TOPIC_METRICS


def escape_tag(v: str) -> str:
    return v.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=").replace(" ", "\\ ")


def counters_line(measurement_tags: str, counters: dict[str, int], ts_ns: int | None = None) -> str:
    fields = ",".join(f"{k}={int(v)}i" for k, v in counters.items())
    return f"{measurement_tags} {fields} {ts_ns if ts_ns is not None else time.time_ns()}"


class KafkaOut:
    """One idempotent producer (acks=all) as stamp_streamer configures it; counts deliveries."""

    def __init__(self, brokers: str, node: str, topic: str = RECORDS_TOPIC, metrics_topic: str = METRICS_TOPIC):
        from confluent_kafka import Producer

        from segscope_kafka import kafka_config

        self.node, self.topic, self.metrics_topic = node, topic, metrics_topic
        self.producer = Producer(
            kafka_config(
                {
                    "bootstrap.servers": brokers,
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": 5,
                    "compression.type": "lz4",
                }
            )
        )
        self.batch_seq = 0
        self.counters = {
            "batches_produced": 0,
            "batches_delivered": 0,
            "batches_failed": 0,
            "records_produced": 0,
            "records_delivered": 0,
            "records_failed": 0,
            "metrics_produced": 0,
            "metrics_delivered": 0,
            "metrics_failed": 0,
        }

    def _on_delivery(self, kind: str, n: int):
        def cb(err, _msg):
            if err is None:
                self.counters[f"{kind}_delivered"] += 1
                if kind == "batches":
                    self.counters["records_delivered"] += n
            else:
                self.counters[f"{kind}_failed"] += 1
                if kind == "batches":
                    self.counters["records_failed"] += n

        return cb

    def _produce(self, topic: str, key: bytes | None, value: bytes, cb) -> None:
        while True:
            try:
                self.producer.produce(topic, value=value, key=key, on_delivery=cb)
                break
            except BufferError:  # queue full: wait, never drop
                self.producer.poll(0.1)
        self.producer.poll(0)

    def produce_records(self, ssid: int, records: np.ndarray) -> None:
        if len(records) == 0:
            return
        value = encode_batch(records, self.node, self.batch_seq)
        self.batch_seq += 1
        self.counters["batches_produced"] += 1
        self.counters["records_produced"] += len(records)
        self._produce(self.topic, f"{self.node}/{ssid}".encode(), value, self._on_delivery("batches", len(records)))

    def produce_metrics(self, line: str) -> None:
        self.counters["metrics_produced"] += 1
        self._produce(self.metrics_topic, None, line.encode(), self._on_delivery("metrics", 0))

    def flush(self, timeout_s: float = 10.0) -> int:
        """Remaining undelivered messages after the timeout (0 = everything acknowledged)."""
        return self.producer.flush(timeout_s)
