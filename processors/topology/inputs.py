"""InputReader: every topology worker reads ALL of its inputs itself (no consumer group).

The topology processor runs as N workers of one consumer group with one leader (README.md,
"N workers"): every worker keeps the whole document model warm, only the leader writes. So each
worker needs every node view and every measurement line, which a consumer group would split
between them. This reader assigns every partition of both topics (never subscribes, never
commits; confluent-kafka wants a group.id all the same, never joined) and hands the messages,
in batches, to the event loop through a bounded queue (a slow loop blocks the reader, it does
not grow memory).

Where reading starts, per topic:
  segscope.topology  the beginning: a node view is only re-published when the node changes or
                     every publisher period, and the model needs the newest view of every node;
  segscope.metrics   `lookback_s` before now (offsets by broker timestamp) when measurements
                     expire after stale_after_s: anything older is left out of the documents
                     anyway; the beginning when they never expire (lookback_s = 0).
The end offsets at start are noted: `caught_up` turns true once they were all read, and a
worker writes nothing before (a leader that had not read every view would delete documents of
nodes it has not met yet, and write them again a moment later).
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from dataclasses import dataclass

from processors.runtime.topics import once_led, watermarks

log = logging.getLogger("segscope.topology.inputs")


@dataclass(frozen=True)
class InputMessage:
    """One Kafka message, with the attributes processors.runtime.deadletters.dead_letter() reads."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


class InputReader:
    def __init__(self, bootstrap: str, topics: list[str], lookback_s: dict[str, float], max_batches: int = 64):
        """lookback_s: {topic: seconds before now to start at}; a topic not in it (or 0) starts at
        its beginning."""
        self.bootstrap, self.topics, self.lookback_s = bootstrap, topics, lookback_s
        self.batches: queue.Queue[list[InputMessage]] = queue.Queue(maxsize=max_batches)
        self.ends: dict[tuple[str, int], int] = {}  # (topic, partition) -> end offset at start, until read
        self.messages_read = 0
        self.read_errors = 0
        self._caught_up = threading.Event()
        self._marker_queued = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def caught_up(self) -> bool:
        return self._caught_up.is_set()

    def start(self, timeout_s: float = 30.0) -> None:
        """Assign every partition of the topics at their start offsets, then read in a daemon thread."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        from segscope_kafka import kafka_config

        self._consumer = c = Consumer(
            kafka_config(
                {
                    "bootstrap.servers": self.bootstrap,
                    "group.id": f"segscope-topology-inputs-{socket.gethostname()}-{os.getpid()}",  # never joined
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                }
            )
        )
        assign = []
        now_ms = int(time.time() * 1000)
        for topic in self.topics:
            parts = c.list_topics(topic, timeout=timeout_s).topics[topic].partitions
            if not parts:
                raise RuntimeError(f"topic {topic} does not exist (segscope-topics creates it)")
            lookback = self.lookback_s.get(topic, 0.0)
            starts = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(parts)]
            if lookback > 0:
                by_time = [TopicPartition(topic, p, now_ms - int(lookback * 1000)) for p in sorted(parts)]
                # offset -1 = no message that new: start at the end (nothing to read)
                starts = once_led(lambda t, q=by_time: c.offsets_for_times(q, timeout=t), topic, timeout_s)
            for tp in starts:
                low, high = watermarks(c, topic, tp.partition, timeout_s)
                begin = low if tp.offset < 0 and lookback <= 0 else (high if tp.offset < 0 else tp.offset)
                if high > begin:
                    self.ends[(topic, tp.partition)] = high
                assign.append(TopicPartition(topic, tp.partition, begin))
        c.assign(assign)
        if not self.ends:
            self._marker_queued = True
            self._caught_up.set()
        log.info("inputs: reading %s, %d messages to catch up on", self.topics, self._backlog(assign))
        self._thread = threading.Thread(target=self._run, name="topology-inputs", daemon=True)
        self._thread.start()

    def _backlog(self, assign) -> int:
        return sum(self.ends.get((tp.topic, tp.partition), tp.offset) - tp.offset for tp in assign)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                msgs = self._consumer.consume(num_messages=2000, timeout=0.2)
            except Exception:  # noqa: BLE001 - a bad poll must not end the thread; said, then retried
                self.read_errors += 1
                log.exception("reading %s failed", self.topics)
                self._stop.wait(1.0)
                continue
            batch = []
            for m in msgs:
                if m.error() is not None:
                    self.read_errors += 1
                    continue
                batch.append(InputMessage(m.topic(), m.partition(), m.offset(), m.key(), m.value()))
            if batch:
                self.messages_read += len(batch)
                while not self._stop.is_set():
                    try:
                        self.batches.put(batch, timeout=0.5)
                        break
                    except queue.Full:
                        continue
            self._note_progress(batch)

    def _note_progress(self, batch: list[InputMessage]) -> None:
        """Once every partition's end offset at start was read, queue the catch-up marker."""
        if self._marker_queued:
            return
        for m in batch:
            end = self.ends.get((m.topic, m.partition))
            if end is not None and m.offset + 1 >= end:
                del self.ends[(m.topic, m.partition)]
        if not self.ends and not self._marker_queued:
            self._marker_queued = True
            self.batches.put([])  # the marker: every message read before it is ahead of it in the queue

    def take(self, timeout_s: float) -> list[InputMessage] | None:
        """The next batch (blocking up to timeout_s; None if none). The empty batch queued when the
        start's end offsets were reached sets caught_up here, in the consuming thread, so that
        caught_up means "every message up to there was taken", not merely read."""
        try:
            batch = self.batches.get(timeout=timeout_s)
        except queue.Empty:
            return None
        if not batch:
            self._caught_up.set()  # the marker (the only empty batch ever queued)
        return batch

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        consumer = getattr(self, "_consumer", None)
        if consumer is not None:
            consumer.close()
            self._consumer = None
