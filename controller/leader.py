"""Which replica of `segscope-controller run` acts: leader election through Kafka.

Every replica joins the consumer group `segscope-controller` (schemas/names.toml) on the topic
`segscope-controller.leader`, which has one partition and no records. With a secured Kafka (TLS,
SASL: segscope_kafka, SEGSCOPE_KAFKA_*) the controller logs in as its own role, `controller`
(segscope_kafka/acls.py: its group, its leader topic and its lines on segscope.metrics, nothing
else). Kafka's group coordinator
assigns that partition to exactly one member: that replica leads, the others stand by (they make
no call to any agent). The same mechanism as the topology processors' leader (Faust's leader
partition, processors/topology/leadership.py), without Faust: a plain librdkafka consumer. It works
wherever segscope's Kafka is, the chart included; no shared volume, no Kubernetes API rights.

Hand-over:
- a replica that stops cleanly leaves the group (LeaveGroup): the other is assigned at once;
- a replica that dies (SIGKILL, a lost node) stops heartbeating: the coordinator drops it after
  the session timeout (6 s, the broker's minimum by default) and the other is assigned then.

Never two at once: the leader acts only while it holds the partition, and every change it makes to
an agent runs inside `acting()`, which a revoke waits for (an RPC in progress ends before the
partition moves). A leader that stalls (SIGSTOP, a frozen VM) may have been dropped meanwhile
without knowing it yet: after any gap of more than session timeout - 2 s between two polls it
acts again only after 3 heartbeat intervals of normal polling with the partition still assigned
(the heartbeat thread learns of a drop within one interval and the revoke follows); counted in
`stalls_fenced`. Left: a stall that begins inside `acting()`, between the check and the RPC.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from segscope_schemas import names

log = logging.getLogger("segscope.controller.leader")

SESSION_TIMEOUT_MS = 6000
HEARTBEAT_MS = 1000


class NoElection:
    """One replica (`--leader-election none`): always the leader."""

    replica = "single"

    def __init__(self) -> None:
        self.counts = {"take_overs": 1, "hand_overs": 0, "stalls_fenced": 0}
        self._lock = threading.Lock()

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def leading(self) -> bool:
        return True

    @contextlib.contextmanager
    def acting(self):
        with self._lock:
            yield True


class KafkaLeadership:
    """Leader = the member of the group that Kafka assigns partition 0 of the leader topic."""

    def __init__(
        self,
        bootstrap: str,
        replica: str,
        topic: str = names.TOPIC_CONTROLLER_LEADER,
        group: str = names.GROUP_CONTROLLER,
        session_timeout_ms: int = SESSION_TIMEOUT_MS,
        heartbeat_ms: int = HEARTBEAT_MS,
        client_config: dict | None = None,
        error_cb=None,
    ) -> None:
        self.bootstrap, self.replica, self.topic, self.group = bootstrap, replica, topic, group
        self.error_cb = error_cb  # a segscope_kafka.RefusalWatch: a refused login stops the replica
        self.session_timeout_s, self.heartbeat_s = session_timeout_ms / 1e3, heartbeat_ms / 1e3
        self.client_config = client_config or {}
        self._state = threading.Lock()  # _assigned, _probation_until
        self._act = threading.Lock()  # held while a change is made; a revoke waits for it
        self._assigned = False
        self._probation_until = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer = None
        self.joined_at: float | None = None
        self.led_since: float | None = None
        self.error: str | None = None  # the last Kafka error, for /readyz
        self.counts = {"take_overs": 0, "hand_overs": 0, "stalls_fenced": 0}

    # -- the consumer ------------------------------------------------------------------------------
    def start(self) -> None:
        from confluent_kafka import Consumer

        from segscope_kafka import kafka_config

        conf = {
            "bootstrap.servers": self.bootstrap,
            "group.id": self.group,
            "client.id": f"segscope-controller-{self.replica}",
            "group.instance.id": None,  # dynamic membership: a dead replica leaves on the session timeout
            "session.timeout.ms": int(self.session_timeout_s * 1000),
            "heartbeat.interval.ms": int(self.heartbeat_s * 1000),
            "enable.auto.commit": False,
            "auto.offset.reset": "latest",
            "partition.assignment.strategy": "range",
            **self.client_config,
        }
        # TLS / SASL from SEGSCOPE_KAFKA_*
        conf = kafka_config({k: v for k, v in conf.items() if v is not None}, error_cb=self.error_cb)
        self._consumer = Consumer(conf)
        self._consumer.subscribe(
            [self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_revoke
        )
        self._thread = threading.Thread(target=self._loop, name="leader-election", daemon=True)
        self._thread.start()
        log.info("replica %s joins group %s on %s (%s)", self.replica, self.group, self.topic, self.bootstrap)

    def _loop(self) -> None:
        last = time.monotonic()
        fence_gap = max(self.session_timeout_s - 2.0, self.heartbeat_s * 2)
        while not self._stop.is_set():
            msg = self._consumer.poll(0.2)  # assignment callbacks run in here
            now = time.monotonic()
            if now - last > fence_gap:
                with self._state:
                    self._probation_until = now + 3 * self.heartbeat_s
                    if self._assigned:
                        self.counts["stalls_fenced"] += 1
                log.warning(
                    "replica %s: %.1f s between two polls (a stall): no change until the group has been "
                    "steady for %.0f s",
                    self.replica,
                    now - last,
                    3 * self.heartbeat_s,
                )
            last = now
            if msg is not None and msg.error():
                self.error = str(msg.error())
                log.warning("leader election: %s", msg.error())
        try:
            self._consumer.close()  # LeaveGroup: the other replica is assigned at once
        except Exception as e:  # noqa: BLE001 - stopping anyway
            log.warning("leader election: close: %s", e)
        self._consumer = None  # destroyed in this thread, not by the garbage collection at exit

    def _on_assign(self, consumer, partitions) -> None:
        if self.joined_at is None:
            self.joined_at = time.monotonic()
        lead = any(p.topic == self.topic and p.partition == 0 for p in partitions)
        with self._state:
            was, self._assigned = self._assigned, lead
        self.error = None
        if lead and not was:
            self.led_since = time.monotonic()
            self.counts["take_overs"] += 1
            log.warning("leader: replica %s leads from now on (take-over %d)", self.replica, self.counts["take_overs"])
        elif not lead:
            log.info("standby: replica %s waits; another replica leads", self.replica)

    def _on_revoke(self, consumer, partitions) -> None:
        with self._act:  # a change in progress ends first: never two leaders acting at once
            with self._state:
                was, self._assigned = self._assigned, False
        if was:
            self.led_since = None
            self.counts["hand_overs"] += 1
            log.warning("replica %s no longer leads (the group rebalances)", self.replica)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)

    # -- what the reconciler asks ------------------------------------------------------------------
    def leading(self) -> bool:
        with self._state:
            return self._assigned and time.monotonic() >= self._probation_until

    @contextlib.contextmanager
    def acting(self):
        """`with leadership.acting() as ok:` - ok: this replica leads and may make one change now;
        a revoke waits until the block ends."""
        with self._act:
            yield self.leading()
