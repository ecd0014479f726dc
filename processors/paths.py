"""PathBook: every STAMP session's, flow monitor's and in-line monitor's SID list and every node's
IOAM identity, from `segscope.paths` (schemas/paths.md), for the `path` tag of stamp_delay,
altmark_loss and the inline_* measurements, and the node and interface names of in-line hops.

Every processor worker reads the whole topic itself (start(): assign all partitions, read from the
beginning to the end, then follow in a background thread). Not a Faust agent: the processors'
input is split over N workers of one consumer group, and a group would split this topic the same
way, while each worker needs every path. The consumer never subscribes and never commits, so it is
in no group (confluent-kafka insists on a group.id all the same).

    book = PathBook(bootstrap, names.TOPIC_PATHS)
    book.start()                           # blocks until the topic's current end was read
    book.path_for_session("A", 1)          # "fc00:2::e" or None (not known)
    book.path_for_flow(7, tx_node="A")     # the tx side's path, or None
    book.paths_for_flows([(7, "A"), (8, None)])  # the same for many flows, the lock taken once
    book.inline_tx(7, tx_node="A")         # the in-line monitor's tx record (PathRecord), or None
    book.node_name(7)                      # "R": the node whose ioam/<node> record has node id 7
    book.stop()

apply(key, value) is the Kafka-free core (tests feed it directly).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

from processors.runtime.topics import watermarks
from segscope_schemas import path_record as pr

log = logging.getLogger("segscope.paths")

# a deleted session's last seconds are emitted after its tombstone arrived (grace, late records):
# keep its path that long, well beyond the processors' retention (60 s delay, 300 s loss)
FORGET_AFTER_S = 600.0


class PathBook:
    def __init__(self, bootstrap: str = "", topic: str = "", forget_after_s: float = FORGET_AFTER_S, clock=None):
        self.bootstrap, self.topic = bootstrap, topic
        self.forget_after_s = forget_after_s
        self.clock = clock or time.monotonic
        self.lock = threading.Lock()
        self.sessions: dict[tuple[str, int], str] = {}  # (node, ssid) of a sender -> path tag
        self.flows: dict[int, dict[str, tuple[int, str]]] = {}  # flow_id -> tx node -> (ts_ns, tag)
        self.inline_flows: dict[int, dict[str, pr.PathRecord]] = {}  # flow_id -> tx node -> its inline record
        self.ioam_nodes: dict[str, pr.IoamNode] = {}  # node name -> its ioam/<node> record
        self.node_names: dict[int, str] = {}  # IOAM node id -> node name (the newest record claiming it)
        self.sid_owners: dict[str, str] = {}  # local SID -> the node whose ioam record lists it
        self.deleted: dict[str, float] = {}  # key -> clock() when its tombstone arrived
        self.records = 0  # messages read (tombstones included)
        self.version = 0  # changes after every change of what path_for_flow answers (callers cache by it)
        self.malformed = 0  # messages that did not decode (ignored)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer = None

    # -- lookups (any thread) ---------------------------------------------------------------------

    def path_for_session(self, node: str, ssid: int) -> str | None:
        """The forward path tag of the sender session (node, ssid), None if no record says it."""
        return self.sessions.get((node, ssid))

    def path_for_flow(self, flow_id: int, tx_node: str | None = None) -> str | None:
        """The path tag of the flow's tx side: tx_node's record if there is one, else the newest
        tx record of the flow (any node); None if none."""
        with self.lock:  # the reader thread may be changing the flow's entries
            return self._flow_path_locked(flow_id, tx_node)

    def paths_for_flows(self, flows: list[tuple[int, str | None]]) -> list[str | None]:
        """path_for_flow(flow_id, tx_node) of each (flow_id, tx_node), the lock taken once: a fresh
        loss worker's first flush asks for every new flow at once (10 000 calls, each taking the
        lock, were a tenth of that flush)."""
        with self.lock:
            return [self._flow_path_locked(flow_id, tx_node) for flow_id, tx_node in flows]

    def _flow_path_locked(self, flow_id: int, tx_node: str | None) -> str | None:
        by_node = self.flows.get(flow_id)
        if not by_node:
            return None
        if tx_node is not None and tx_node in by_node:
            return by_node[tx_node][1]
        return max(by_node.values())[1]

    def inline_tx(self, flow_id: int, tx_node: str | None = None) -> pr.PathRecord | None:
        """The in-line monitor's tx-side record of the flow (its ingress): tx_node's if there is one,
        else the newest of the flow (any node); None if none."""
        with self.lock:
            by_node = self.inline_flows.get(flow_id)
            if not by_node:
                return None
            if tx_node is not None and tx_node in by_node:
                return by_node[tx_node]
            return max(by_node.values(), key=lambda r: (r.ts_ns, r.node))

    def node_name(self, node_id: int) -> str | None:
        """The name of the node with this IOAM node id (its ioam/<node> record), None if none says it."""
        return self.node_names.get(node_id)

    def ioam_node(self, name: str) -> pr.IoamNode | None:
        return self.ioam_nodes.get(name)

    def sid_owner(self, sid: str) -> str | None:
        """The node that lists `sid` among its local SIDs in its ioam record, None if none does."""
        return self.sid_owners.get(sid)

    def _index_ioam(self) -> None:
        """node_names and sid_owners from ioam_nodes (newest record wins a conflict)."""
        names: dict[int, str] = {}
        owners: dict[str, str] = {}
        for rec in sorted(self.ioam_nodes.values(), key=lambda r: (r.ts_ns, r.node)):
            names[rec.node_id] = rec.node
            for sid in rec.sids:
                owners[sid] = rec.node
        self.node_names, self.sid_owners = names, owners

    # -- the core ---------------------------------------------------------------------------------

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        """Take one message of the topic (in offset order)."""
        self.records += 1
        try:
            rec = pr.decode(key, value)
        except pr.MalformedPathRecord as e:
            self.malformed += 1
            if self.malformed <= 10 or self.malformed % 1000 == 0:
                log.warning("path record %r ignored (%d so far): %s", key, self.malformed, e)
            return
        k = key.decode()
        with self.lock:
            if rec is None:
                self.deleted[k] = self.clock()  # keep the path for the session's last seconds
            elif rec.kind == pr.IOAM:
                self.deleted.pop(k, None)
                self.ioam_nodes[rec.node] = rec
                self._index_ioam()
            else:
                self.deleted.pop(k, None)
                tag = pr.path_tag(rec)
                if rec.kind == pr.STAMP and rec.role == "sender":
                    self.sessions[(rec.node, rec.ident)] = tag
                elif rec.kind == pr.FLOW and rec.role == "tx":
                    self.flows.setdefault(rec.ident, {})[rec.node] = (rec.ts_ns, tag)
                elif rec.kind == pr.INLINE and rec.role == "tx":
                    self.inline_flows.setdefault(rec.ident, {})[rec.node] = rec
            self._forget()
            self.version += 1

    def _forget(self) -> None:
        now = self.clock()
        for k in [k for k, t in self.deleted.items() if now - t >= self.forget_after_s]:
            del self.deleted[k]
            if k.startswith(pr.IOAM + "/"):
                if self.ioam_nodes.pop(k.split("/", 1)[1], None) is not None:
                    self._index_ioam()
                continue
            kind, node, ident, role = k.split("/")
            if kind == pr.INLINE and role == "tx":
                by_inline = self.inline_flows.get(int(ident), {})
                by_inline.pop(node, None)
                if not by_inline:
                    self.inline_flows.pop(int(ident), None)
            elif kind == pr.STAMP and role == "sender":
                self.sessions.pop((node, int(ident)), None)
            elif kind == pr.FLOW and role == "tx":
                by_node = self.flows.get(int(ident), {})
                by_node.pop(node, None)
                if not by_node:
                    self.flows.pop(int(ident), None)

    # -- Kafka ------------------------------------------------------------------------------------

    def start(self, timeout_s: float = 30.0) -> None:
        """Read the topic up to its end now (the worker then knows every path published before it
        started), then follow it in a daemon thread. The topic must exist (ensure_topics)."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        from segscope_kafka import kafka_config

        self._consumer = c = Consumer(
            kafka_config(
                {
                    "bootstrap.servers": self.bootstrap,
                    "group.id": f"segscope-paths-{socket.gethostname()}-{os.getpid()}",  # never joined
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                }
            )
        )
        parts = c.list_topics(self.topic, timeout=timeout_s).topics[self.topic].partitions
        if not parts:
            raise RuntimeError(f"topic {self.topic} does not exist (segscope-topics creates it)")
        ends = {}
        for p in parts:
            low, high = watermarks(c, self.topic, p, timeout_s)
            if high > low:
                ends[p] = high
        c.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in parts])
        deadline = time.monotonic() + timeout_s
        while ends:
            if time.monotonic() > deadline:
                raise RuntimeError(f"reading {self.topic} to its end took more than {timeout_s:.0f} s")
            for m in c.consume(num_messages=10000, timeout=0.5):
                if m.error() is None:
                    self.apply(m.key(), m.value())
                    if m.offset() + 1 >= ends.get(m.partition(), 0):
                        ends.pop(m.partition(), None)
        log.info(
            "paths: %d sessions, %d flows known from %s (%d records)",
            len(self.sessions),
            len(self.flows),
            self.topic,
            self.records,
        )
        self._thread = threading.Thread(target=self._follow, name="paths", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                for m in self._consumer.consume(num_messages=1000, timeout=0.5):
                    if m.error() is None:
                        self.apply(m.key(), m.value())
            except Exception:  # noqa: BLE001 - a bad poll must not end the thread; said, then retried
                log.exception("reading %s failed", self.topic)
                self._stop.wait(1.0)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
