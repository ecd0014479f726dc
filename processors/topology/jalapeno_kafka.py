"""Producer to Jalapeno's Kafka (its own cluster or segscope's): link events (link_events.py)
and line protocol on jalapeno.telemetry (telemetry.py). Both off unless their topic is set.

Sends are asynchronous (librdkafka queues and retries); delivery failures are counted from the
delivery callbacks, so a Jalapeno Kafka that is away costs counters, never the processor.

Telemetry is forwarded once, by the leader of N workers (app.py), without gaps at a change of
leader or a restart: every worker holds the selected lines of the segscope.metrics messages it
read in the last HOLD_S seconds (`hold`); each forwarded message carries its source message as a
header (`segscope_source: <topic>:<partition>:<offset>`). A worker that becomes the leader reads
the telemetry topic back (`read_marks`: the newest source offset forwarded per partition) and
sends what it holds beyond those marks (`send_held`): the messages the standbys read while no
worker led (before the first assignment, between a leader's death and the rebalance) are sent
by the new leader, the ones the old leader sent are not sent again (a restarted worker re-reads
the metrics of its lookback window: the marks keep it from forwarding them twice). Only messages
still in the old leader's producer queue when it died (linger.ms) can be lost.

Security: segscope's settings (SEGSCOPE_KAFKA_*) when the output goes to segscope's Kafka; when
SEGSCOPE_TOPOLOGY_JALAPENO_KAFKA names Jalapeno's own cluster, its settings have the prefix
SEGSCOPE_TOPOLOGY_JALAPENO_KAFKA_ (..._SECURITY_PROTOCOL, ..._SASL_USERNAME, ...; docs/security.md).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass

from confluent_kafka import Producer

from processors.runtime.topics import once_led, watermarks
from processors.topology import link_events, telemetry
from segscope_kafka import ENV_PREFIX, kafka_config
from segscope_schemas import names

log = logging.getLogger("segscope.topology.jalapeno_kafka")

SOURCE_HEADER = "segscope_source"
# how long a worker holds lines it has not sent: longer than a leader change takes (the broker's
# session timeout, 6 s, and a rebalance) and a first assignment after start
HOLD_S = 30.0
# and at most this many lines (a worker catching up on its lookback window reads minutes of lines at once)
HOLD_MAX_LINES = 1_000_000
# the Kafka security settings of Jalapeno's own cluster (SEGSCOPE_TOPOLOGY_JALAPENO_KAFKA set)
JALAPENO_SECURITY_PREFIX = "SEGSCOPE_TOPOLOGY_JALAPENO_KAFKA_"


@dataclass
class JalapenoKafkaCounters:
    link_events_sent: int = 0
    telemetry_lines_sent: int = 0
    # lines a worker let go unsent after HOLD_S (or beyond HOLD_MAX_LINES) while it did not lead:
    # the leader of that time forwarded them
    telemetry_lines_unheld: int = 0
    # lines found already forwarded (by a previous leader or run) when this worker took over
    telemetry_lines_forwarded_before: int = 0
    telemetry_marks_read_errors: int = 0
    jalapeno_kafka_errors: int = 0


class JalapenoKafka:
    def __init__(
        self,
        bootstrap: str,
        link_events_topic: str = "",
        telemetry_topic: str = "",
        telemetry_measurements: frozenset[str] | None = frozenset(telemetry.DEFAULT_MEASUREMENTS),
        security_prefix: str = ENV_PREFIX,
    ):
        self.link_events_topic, self.telemetry_topic = link_events_topic, telemetry_topic
        self.telemetry_measurements = telemetry_measurements
        self.bootstrap = bootstrap
        self.security_prefix = security_prefix
        self.counters = JalapenoKafkaCounters()
        # (read at, source topic, partition, offset, key, lines) not sent yet, oldest first
        self.held: deque[tuple[float, str, int, int, bytes | None, list[str]]] = deque()
        self.held_lines = 0
        # (source topic, partition) -> newest source offset on the telemetry topic; None until read
        self.marks: dict[tuple[str, int], int] | None = None
        self.producer = Producer(
            kafka_config(
                {
                    "bootstrap.servers": bootstrap,
                    "linger.ms": 50,
                    "message.timeout.ms": 30000,
                    "client.id": names.GROUPS["topology"],  # the processor's name, as its group
                },
                prefix=security_prefix,
            )
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

    def forward_metrics(self, text: str, key: bytes | None = None, source: tuple[str, int, int] | None = None) -> int:
        """Forward the selected lines of one segscope.metrics message now; returns lines queued."""
        if not self.telemetry_topic:
            return 0
        return self._send(telemetry.select_lines(text, self.telemetry_measurements), key, source)

    def _send(self, lines: list[str], key: bytes | None, source: tuple[str, int, int] | None) -> int:
        headers = [(SOURCE_HEADER, ":".join(map(str, source)).encode())] if source is not None else None
        for message in telemetry.messages(lines):
            self.producer.produce(
                self.telemetry_topic, key=key, value=message, headers=headers, on_delivery=self._delivered
            )
        self.producer.poll(0)
        self.counters.telemetry_lines_sent += len(lines)
        return len(lines)

    # -- one copy from N workers (module docstring) ---------------------------------------
    def hold(self, text: str, key: bytes | None, source: tuple[str, int, int], now: float | None = None) -> int:
        """Hold the selected lines of one segscope.metrics message (every worker, leader or not);
        lines held longer than HOLD_S are let go (counted). Returns the lines held."""
        if not self.telemetry_topic:
            return 0
        now = time.monotonic() if now is None else now
        lines = telemetry.select_lines(text, self.telemetry_measurements)
        if lines:
            self.held.append((now, *source, key, lines))
            self.held_lines += len(lines)
        while self.held and (self.held[0][0] < now - HOLD_S or self.held_lines > HOLD_MAX_LINES):
            let_go = len(self.held.popleft()[5])
            self.held_lines -= let_go
            self.counters.telemetry_lines_unheld += let_go
        return len(lines)

    def send_held(self) -> int:
        """The leader: send what is held beyond the marks (nothing before read_marks)."""
        if self.marks is None:
            return 0
        sent = 0
        while self.held:
            _, topic, partition, offset, key, lines = self.held.popleft()
            self.held_lines -= len(lines)
            if offset <= self.marks.get((topic, partition), -1):
                self.counters.telemetry_lines_forwarded_before += len(lines)
                continue
            self.marks[(topic, partition)] = offset
            sent += self._send(lines, key, (topic, partition, offset))
        return sent

    def read_marks(self, since_s: float | None, timeout_s: float = 10.0) -> dict[tuple[str, int], int]:
        """Read the telemetry topic back from since_s seconds ago (None: its beginning) and note
        the newest source offset forwarded per (topic, partition) (blocking; the new leader runs
        it in an executor before it sends). A read that fails leaves every held message to send:
        a duplicate beats a loss."""
        from confluent_kafka import Consumer, TopicPartition

        marks: dict[tuple[str, int], int] = {}
        c = Consumer(
            kafka_config(
                {
                    "bootstrap.servers": self.bootstrap,
                    "group.id": f"{names.GROUPS['topology']}-marks",
                    "enable.auto.commit": False,
                },
                prefix=self.security_prefix,
            )
        )
        try:
            topic = self.telemetry_topic
            meta = c.list_topics(topic, timeout=timeout_s).topics.get(topic)
            parts = sorted(meta.partitions) if meta is not None and meta.error is None else []
            since_ms = 0 if since_s is None else int((time.time() - since_s) * 1000)
            by_time = [TopicPartition(topic, p, since_ms) for p in parts]
            # a telemetry topic created a moment ago may have no leader yet: wait it out (once_led)
            starts = once_led(lambda t: c.offsets_for_times(by_time, timeout=t), topic, timeout_s)
            for tp in starts:
                _, high = watermarks(c, topic, tp.partition, timeout_s)
                if tp.offset < 0 or tp.offset >= high:
                    continue
                c.assign([TopicPartition(topic, tp.partition, tp.offset)])
                pos = tp.offset
                deadline = time.monotonic() + timeout_s
                while pos < high and time.monotonic() < deadline:
                    for m in c.consume(num_messages=10000, timeout=1.0):
                        pos = m.offset() + 1
                        if m.error() is not None:
                            continue
                        for name, value in m.headers() or ():
                            if name == SOURCE_HEADER:
                                src_topic, _, rest = value.decode(errors="replace").partition(":")
                                part, _, off = rest.partition(":")
                                if part.isdigit() and off.isdigit():
                                    k = (src_topic, int(part))
                                    marks[k] = max(marks.get(k, -1), int(off))
                if pos < high:
                    raise TimeoutError(f"{topic}[{tp.partition}] not read back to {high} within {timeout_s} s")
        except Exception as e:  # noqa: BLE001 - Kafka away: send every held message (duplicates, no loss)
            self.counters.telemetry_marks_read_errors += 1
            log.warning("cannot read %s back (%r): forwarding every held line", self.telemetry_topic, e)
            marks = {}
        finally:
            c.close()
        self.marks = marks
        return marks

    def flush(self, timeout_s: float = 10.0) -> int:
        """Wait for queued messages; returns how many are still undelivered."""
        return self.producer.flush(timeout_s)
