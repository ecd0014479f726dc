"""Producer to Jalapeno's Kafka (its own cluster or segscope's): link events (link_events.py)
and line protocol on jalapeno.telemetry (telemetry.py). Both off unless their topic is set.

Sends are asynchronous (librdkafka queues and retries); delivery failures are counted from the
delivery callbacks, so a Jalapeno Kafka that is away costs counters, never the processor.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from confluent_kafka import Producer

from processors.topology import link_events, telemetry
from segscope_schemas import names

log = logging.getLogger("segscope.topology.jalapeno_kafka")


@dataclass
class JalapenoKafkaCounters:
    link_events_sent: int = 0
    telemetry_lines_sent: int = 0
    jalapeno_kafka_errors: int = 0


class JalapenoKafka:
    def __init__(
        self,
        bootstrap: str,
        link_events_topic: str = "",
        telemetry_topic: str = "",
        telemetry_measurements: frozenset[str] | None = frozenset(telemetry.DEFAULT_MEASUREMENTS),
    ):
        self.link_events_topic, self.telemetry_topic = link_events_topic, telemetry_topic
        self.telemetry_measurements = telemetry_measurements
        self.counters = JalapenoKafkaCounters()
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 50,
                "message.timeout.ms": 30000,
                "client.id": names.GROUPS["topology"],  # the processor's name, as its group
            }
        )

    def _delivered(self, err, msg) -> None:
        if err is not None:
            self.counters.jalapeno_kafka_errors += 1
            log.warning("jalapeno kafka: delivery to %s failed: %s", msg.topic(), err)

    def link_events(self, collection: str, keys: list[str]) -> int:
        """One event per key (TopologySink's link_events hook); returns how many were queued."""
        if not self.link_events_topic:
            return 0
        for key in keys:
            k, v = link_events.link_event(collection, key)
            self.producer.produce(self.link_events_topic, key=k, value=v, on_delivery=self._delivered)
        self.producer.poll(0)
        self.counters.link_events_sent += len(keys)
        return len(keys)

    def forward_metrics(self, text: str, key: bytes | None = None) -> int:
        """Forward the selected lines of one segscope.metrics message; returns lines queued."""
        if not self.telemetry_topic:
            return 0
        lines = telemetry.select_lines(text, self.telemetry_measurements)
        for message in telemetry.messages(lines):
            self.producer.produce(self.telemetry_topic, key=key, value=message, on_delivery=self._delivered)
        self.producer.poll(0)
        self.counters.telemetry_lines_sent += len(lines)
        return len(lines)

    def flush(self, timeout_s: float = 10.0) -> int:
        """Wait for queued messages; returns how many are still undelivered."""
        return self.producer.flush(timeout_s)
