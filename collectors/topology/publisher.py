"""NodeViewPublisher: publish a node's topology view to Kafka on change and periodically.

A background thread rebuilds the view every `poll_s` (default 1 s; one netlink dump of links,
addresses, neighbours and routes, a few ms here) and compares its fingerprint with the last
published one: a change is published at once (within poll_s), an unchanged view again every
`interval_s` so a consumer that starts late, or lost its state, catches up. A cheap periodic
diff was chosen over netlink event subscription because it works the same in a foreign netns,
cannot miss an event during a reconnect, and coalesces bursts (e.g. an agent installing
100 routes) into one message.

Message: topic `segscope.topology`, key = node name (UTF-8), value = the view as JSON
(schemas/topology.md) with `seq` (per-publisher, from 1) and `reason` (start|change|periodic|
request) added. Counters: `counters()` and, when `metrics_topic` is set, a line
`segscope_topology_publisher,node=<node> ...` on that topic every interval (schemas/metrics.md).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from collectors.topology.view import NodeViewError, build_node_view, view_fingerprint
from segscope_schemas import names

log = logging.getLogger("segscope.topology.publisher")

COUNTER_NAMES = (
    "views_built",
    "build_errors",
    "views_published",
    "published_on_change",
    "published_periodic",
    "published_on_request",
    "delivery_errors",
    "bytes_published",
)


def _escape_tag(value: str) -> str:
    return (
        value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=").replace(" ", "\\ ").replace("\n", "\\ ")
        or "unknown"
    )


class NodeViewPublisher:
    """Publish build_node_view(node, netns) to Kafka.

    start() publishes once at once and starts the thread; stop() stops it and flushes the
    producer; publish_now() builds and publishes synchronously (returns the view published).
    set_section(name, value) adds a section netlink does not know (the agent's `stamp_sessions`
    and `flows`, topology.md); a changed section is published like any other change."""

    def __init__(
        self,
        node: str,
        netns: str | None,
        bootstrap: str,
        interval_s: float = 30.0,
        topic: str = names.TOPIC_TOPOLOGY,
        *,
        poll_s: float = 1.0,
        metrics_topic: str | None = names.TOPIC_METRICS,
        producer_conf: dict | None = None,
    ):
        if interval_s <= 0 or poll_s <= 0:
            raise ValueError(f"interval_s ({interval_s}) and poll_s ({poll_s}) must be > 0")
        self.node, self.netns, self.bootstrap = node, netns, bootstrap
        self.interval_s, self.poll_s = float(interval_s), float(poll_s)
        self.topic, self.metrics_topic = topic, metrics_topic
        self._producer_conf = {
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "acks": "all",
            "enable.idempotence": True,
            "message.timeout.ms": 600000,  # a Kafka outage of minutes is buffered, not lost
            **(producer_conf or {}),
        }
        self._producer = None
        self._lock = threading.Lock()  # one build+publish at a time (thread vs publish_now)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sections: dict[str, Any] = {}
        self._last_fingerprint: str | None = None
        self._last_publish = 0.0
        self._seq = 0
        self._counters = dict.fromkeys(COUNTER_NAMES, 0)
        self.last_error: str | None = None

    # -- public API (contract) ----------------------------------------------------------
    def start(self) -> "NodeViewPublisher":
        if self._thread is not None:
            return self
        self._ensure_producer()
        self._stop.clear()
        self._cycle(force_reason="start")
        self._thread = threading.Thread(target=self._run, name=f"topology-{self.node}", daemon=True)
        self._thread.start()
        return self

    def stop(self, flush_timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.poll_s + 10)
            self._thread = None
        if self._producer is not None:
            left = self._producer.flush(flush_timeout_s)
            if left:
                self._counters["delivery_errors"] += left
                log.warning("topology publisher %s: %d messages not delivered at stop", self.node, left)

    def publish_now(self) -> dict:
        """Build and publish the view now, whatever changed; returns it. Raises NodeViewError."""
        self._ensure_producer()
        with self._lock:
            view = self._build()
            if view is None:
                raise NodeViewError(self.last_error or "view could not be built")
            self._publish(view, "request")
        self._producer.flush(10)
        return view

    # -- extensions ---------------------------------------------------------------------
    def set_section(self, name: str, value: Any) -> None:
        """Add/replace an extra section of the view (e.g. "stamp_sessions"); published on change."""
        if name in ("schema", "version", "node", "netns", "generated_at_ns", "seq", "reason"):
            raise ValueError(f"section {name!r} is part of the view header and can't be set")
        with self._lock:
            self._sections[name] = value

    def counters(self) -> dict[str, int]:
        return dict(self._counters)

    # -- internals ----------------------------------------------------------------------
    def _ensure_producer(self) -> None:
        if self._producer is None:
            from confluent_kafka import Producer

            from segscope_kafka import kafka_config

            self._producer = Producer(kafka_config(self._producer_conf))

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self._cycle()
            except Exception:  # never let the thread die silently: count and keep going
                self._counters["build_errors"] += 1
                log.exception("topology publisher %s: cycle failed", self.node)

    def _cycle(self, force_reason: str | None = None) -> None:
        with self._lock:
            view = self._build()
            if view is None:
                return
            fingerprint = view_fingerprint(view)
            due = time.monotonic() - self._last_publish >= self.interval_s
            if force_reason:
                self._publish(view, force_reason)
            elif fingerprint != self._last_fingerprint:
                self._publish(view, "change")
            elif due:
                self._publish(view, "periodic")
        self._producer.poll(0)

    def _build(self) -> dict | None:
        try:
            view = build_node_view(self.node, self.netns, extra=self._sections)
        except NodeViewError as e:
            self._counters["build_errors"] += 1
            self.last_error = str(e)
            log.warning("topology publisher %s: %s", self.node, e)
            return None
        self._counters["views_built"] += 1
        return view

    def _on_delivery(self, err, _msg) -> None:
        if err is not None:
            self._counters["delivery_errors"] += 1
            self.last_error = f"delivery failed: {err}"
            log.warning("topology publisher %s: %s", self.node, self.last_error)

    def _publish(self, view: dict, reason: str) -> None:
        self._seq += 1
        view["seq"], view["reason"] = self._seq, reason
        value = json.dumps(view, sort_keys=True).encode()
        self._producer.produce(self.topic, key=self.node.encode(), value=value, on_delivery=self._on_delivery)
        self._last_fingerprint = view_fingerprint(view)
        self._last_publish = time.monotonic()
        self._counters["views_published"] += 1
        self._counters["bytes_published"] += len(value)
        counter = {
            "change": "published_on_change",
            "periodic": "published_periodic",
            "request": "published_on_request",
        }.get(reason)
        if counter:
            self._counters[counter] += 1
        if self.metrics_topic and reason in ("start", "periodic"):
            self._producer.produce(
                self.metrics_topic, key=b"topology", value=self.counters_line().encode(), on_delivery=self._on_delivery
            )

    def counters_line(self) -> str:
        fields = ",".join(f"{k}={v}i" for k, v in self._counters.items())
        return f"segscope_topology_publisher,node={_escape_tag(self.node)} {fields} {time.time_ns()}"
