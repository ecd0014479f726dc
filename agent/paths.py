"""PathPublisher: the agent's STAMP sessions and flow monitors with their SID lists, on the
compacted topic `segscope.paths` (schemas/paths.md), so the processors can tag stamp_delay and
altmark_loss with `path`.

changed() (the servicers' on_change hook) publishes at once what was created, changed (another SID
list, role, method, period) or deleted (a tombstone); a thread republishes every record every
`interval_s` (60 s), so a topic that lost records, or a reader that missed one, converges.
"""

from __future__ import annotations

import logging
import threading
import time

from segscope_schemas import names
from segscope_schemas import path_record as pr

log = logging.getLogger("segscope.agent.paths")


class PathPublisher:
    def __init__(self, node: str, bootstrap: str, records, interval_s: float = 60.0, topic: str = names.TOPIC_PATHS):
        """records: callable -> [PathRecord] the agent holds now (ts_ns = now)."""
        self.node, self.bootstrap, self.topic = node, bootstrap, topic
        self.records = records
        self.interval_s = interval_s
        self.lock = threading.Lock()
        self.published: dict[str, pr.PathRecord] = {}  # key -> last record sent
        self.failed = 0  # records Kafka refused or did not deliver (counted in segscope_agent)
        self.sent = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._producer = None

    def start(self) -> None:
        from confluent_kafka import Producer

        from segscope_kafka import kafka_config

        # idempotent, acks=all as the stats publisher: a retry neither loses nor reorders a record
        self._producer = Producer(
            kafka_config(
                {"bootstrap.servers": self.bootstrap, "linger.ms": 5, "enable.idempotence": True, "acks": "all"}
            )
        )
        self.publish(everything=True)
        self._thread = threading.Thread(target=self._loop, name="paths", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.publish(everything=True)

    def changed(self) -> None:
        """A session or flow monitor was created, changed or deleted: publish the difference now."""
        if self._producer is not None:
            self.publish(everything=False)

    def publish(self, everything: bool) -> None:
        try:
            now = {r.key: r for r in self.records()}
        except Exception:  # noqa: BLE001 - a failed read must not stop the thread; said, retried
            log.exception("path records unreadable")
            return
        with self.lock:
            for key, rec in now.items():
                if everything or not rec.same_route(self.published.get(key)):
                    try:
                        k, v = pr.encode(rec)
                    except pr.MalformedPathRecord as e:  # e.g. a node name with '/': said once
                        if key not in self.published:
                            log.warning("path record %s not publishable: %s", key, e)
                            self.published[key] = rec
                        continue
                    self._produce(k, v)
                    self.published[key] = rec
            for key in [k for k in self.published if k not in now]:
                self._produce(key.encode(), None)  # deleted: tombstone
                del self.published[key]
        self._producer.poll(0)

    def _produce(self, key: bytes, value: bytes | None) -> None:
        try:
            self._producer.produce(self.topic, value, key=key, on_delivery=self._delivered)
        except BufferError:
            self.failed += 1

    def _delivered(self, err, msg) -> None:
        if err:
            self.failed += 1
            log.warning("path record %r not delivered: %s", msg.key(), err)
        else:
            self.sent += 1

    def stop(self, flush_timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._producer is not None:
            left = self._producer.flush(flush_timeout_s)
            if left:  # the next agent publishes every path record of the node again at its start
                log.warning("path records: %d messages not delivered at stop (Kafka unreachable?)", left)


def stamp_records(node: str, sessions, role_name, ts_ns: int | None = None) -> list[pr.PathRecord]:
    """PathRecords of StampAgent.sessions ({(role, ssid): Session}); the caller holds its lock."""
    ts = time.time_ns() if ts_ns is None else ts_ns
    return [
        pr.PathRecord.stamp(node, ssid, role_name[role], s.spec.segments, s.spec.return_segments, ts)
        for (role, ssid), s in sorted(sessions.items())
    ]
