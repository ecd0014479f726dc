"""What the Faust processors (delay, loss, topology, inline) share: settings from the environment and
the `python -m processors.<name>` command line.

Environment variables are the one channel that works both for `faust -A processors.<name>.app
worker` (Faust imports the app module itself) and for `python -m processors.<name>`, which maps
its flags onto the same variables before importing the app. Each processor's config.py holds its
table ENV = {setting: (VARIABLE, default)}.
"""

from __future__ import annotations

import argparse
import base64
import bisect
import dataclasses
import importlib
import json
import logging
import os
import socket
import sys
import time
from typing import Awaitable, Callable

from segscope_kafka import KafkaConfigError, faust_credentials, kafka_config
from segscope_kafka import from_env as kafka_security_from_env
from segscope_schemas import names
from segscope_schemas.health import Health, HealthAddressError, parse_address
from segscope_schemas.version import VERSION_LINE

log = logging.getLogger("segscope.worker")

# each processor's health endpoint (segscope_schemas/health.py); SEGSCOPE_<NAME>_HEALTH overrides
HEALTH_PORTS = {"delay": 9641, "loss": 9642, "topology": 9643, "inline": 9644}


def worker_instance(environ: dict[str, str] | None = None) -> str:
    """The `instance` tag of this worker's segscope_processor / segscope_consumer lines:
    SEGSCOPE_INSTANCE (the pod name in Kubernetes, set by the Helm chart), else <hostname>-<pid>,
    which two workers on one host cannot share (schemas/metrics.md says what to set)."""
    env = os.environ if environ is None else environ
    return env.get("SEGSCOPE_INSTANCE", "").strip() or f"{socket.gethostname()}-{os.getpid()}"


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the variable and the fix."""


def env_number(env_table: dict[str, tuple[str, str]], raw: dict[str, str], name: str, kind):
    """raw[name] as `kind` (int, float), or ConfigError naming the variable and a valid value."""
    var = env_table[name][0]
    try:
        return kind(raw[name])
    except ValueError:
        raise ConfigError(
            f"environment variable {var}={raw[name]!r} is not a valid "
            f"{kind.__name__}; fix: set it to a number like {env_table[name][1]!r} "
            f"or unset it"
        ) from None


def processor_env(name: str, input_setting: str, input_var: str, input_topic: str) -> dict[str, tuple[str, str]]:
    """The settings every processor has: broker, its input topic, the metrics and dead-letter
    topics, its app id (also its consumer group id) and its Faust data dir. Topic and group
    defaults come from the name registry (schemas/names.toml)."""
    upper = name.upper()
    return {
        "bootstrap": ("SEGSCOPE_KAFKA_BOOTSTRAP", "127.0.0.1:19092"),
        input_setting: (input_var, input_topic),
        "metrics_topic": ("SEGSCOPE_TOPIC_METRICS", names.TOPIC_METRICS),
        "deadletter_topic": ("SEGSCOPE_TOPIC_DEADLETTER", names.TOPIC_DEADLETTER),
        "app_id": (f"SEGSCOPE_{upper}_APP_ID", names.GROUPS[name]),
        # HOST:PORT of /healthz /readyz /metrics /status; 0.0.0.0:PORT in a pod; 'off'; port 0 = any
        "health": (f"SEGSCOPE_{upper}_HEALTH", f"127.0.0.1:{HEALTH_PORTS[name]}"),
        # the `instance` tag of the worker's counters (worker_instance(); empty = <hostname>-<pid>)
        "instance": ("SEGSCOPE_INSTANCE", ""),
        # SID lists of the sessions and flows (schemas/paths.md), read whole by every worker
        "paths_topic": ("SEGSCOPE_TOPIC_PATHS", names.TOPIC_PATHS),
    }


class EnvConfig:
    """Base of the processors' settings dataclasses. A subclass declares ENV = {setting:
    (VARIABLE, default)} and one dataclass field per setting; from_env() reads the variables,
    converts each by the field's declared type (str, int, float; a bad number is a ConfigError
    naming the variable), fills `{app_id}` in datadir, applies the SEGSCOPE_KAFKA alias, then
    calls the subclass's adjust() (derived values) and validate() (cross-setting rules)."""

    ENV: dict[str, tuple[str, str]] = {}

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None):
        env = os.environ if environ is None else environ
        raw = {name: env.get(var, default) for name, (var, default) in cls.ENV.items()}
        if "bootstrap" in cls.ENV and cls.ENV["bootstrap"][0] not in env and "SEGSCOPE_KAFKA" in env:
            raw["bootstrap"] = env["SEGSCOPE_KAFKA"]  # short alias
        raw = cls.adjust(raw, env)
        values = {}
        for f in dataclasses.fields(cls):
            kind = {"int": int, "float": float}.get(f.type if isinstance(f.type, str) else f.type.__name__)
            values[f.name] = env_number(cls.ENV, raw, f.name, kind) if kind else raw[f.name]
        if "datadir" in values:
            values["datadir"] = values["datadir"].format(app_id=values.get("app_id", ""))
        cfg = cls(**values)
        cfg.validate()
        if "health" in cls.ENV:
            cfg.health_address()
        return cfg

    @classmethod
    def adjust(cls, raw: dict[str, str], env) -> dict[str, str]:
        """Derive raw settings from others before conversion (default: none)."""
        return raw

    def validate(self) -> None:
        """Raise ConfigError for settings that are valid alone but not together (default: none)."""

    def health_address(self) -> tuple[str, int] | None:
        """The health endpoint's (host, port), or None when it is 'off'."""
        try:
            return parse_address(self.health, f"environment variable {self.ENV['health'][0]}")
        except HealthAddressError as e:
            raise ConfigError(str(e)) from None


def run_worker(
    package: str,
    doc: str,
    env_table: dict[str, tuple[str, str]],
    check: Callable[[], object] | None = None,
    argv: list[str] | None = None,
) -> None:
    """Parse one flag per setting (--blocks-topic for blocks_topic, ...), export the flags given
    as the settings' environment variables, refuse bad settings before Faust starts (`check`,
    e.g. Config.from_env), then run `<package>.app`'s worker without Faust's web server (it
    would bind 0.0.0.0:6066)."""
    ap = argparse.ArgumentParser(
        prog=f"python -m {package}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--version", action="version", version=VERSION_LINE)
    for name, (var, default) in env_table.items():
        ap.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            default=None,
            help=f"(env {var}, default {os.environ.get(var, default)})",
        )
    ap.add_argument("-l", "--loglevel", default="info", choices=["crit", "error", "warn", "info", "debug"])
    args = ap.parse_args(argv)
    for name, (var, _) in env_table.items():
        value = getattr(args, name)
        if value is not None:
            os.environ[var] = value
    if check is not None:
        try:
            check()
            kafka_security_from_env()  # SEGSCOPE_KAFKA_* (segscope_kafka): TLS, SASL
        except (ConfigError, KafkaConfigError) as e:
            ap.error(str(e))
    app = importlib.import_module(f"{package}.app").app  # after the environment is final
    sys.argv = [sys.argv[0], "worker", "--without-web", "-l", args.loglevel]
    app.main()


# a worker killed with -9 leaves its consumer group after this (HeartbeatLease relies on it too)
SESSION_TIMEOUT_S = 6.0


def faust_app_settings(bootstrap: str, datadir: str) -> dict:
    """Faust settings every segscope processor uses: raw bytes in and out (the wire formats are
    our own, schemas/), in-memory tables (state is rebuilt from the topics), one local broker
    replica, no web server (it would bind 0.0.0.0:6066), new consumer groups read from the start
    (a new processor sees what was published before it), small producer linger."""
    return dict(
        broker=";".join(f"kafka://{h.strip()}" for h in bootstrap.split(",")),
        store="memory://",
        key_serializer="raw",
        value_serializer="raw",
        topic_replication_factor=1,
        topic_partitions=1,
        datadir=datadir,
        web_enabled=False,
        consumer_auto_offset_reset="earliest",
        # a worker killed with -9 leaves the group after the session timeout; 6 s (the broker's
        # minimum) instead of Faust's 60 s lets the restarted one take its partitions over soon
        broker_session_timeout=SESSION_TIMEOUT_S,
        broker_heartbeat_interval=2.0,
        # the processors hold input unacked until its results are final (crash safety); a stop or
        # rebalance must not wait for those acks: what is not acked is replayed by the next owner
        stream_wait_empty=False,
        # acked offsets are committed every second (Faust: 2.8 s): less to replay after a crash
        broker_commit_interval=1.0,
        producer_linger_ms=5,
        # TLS / SASL from SEGSCOPE_KAFKA_* (segscope_kafka); None: PLAINTEXT
        broker_credentials=faust_credentials(),
    )


def decode_or_dead_letter(message, decode: Callable, counters) -> tuple:
    """(header, records, None) of one input message, or (None, None, its dead letter) for a
    tombstone or a batch `decode` refuses (MalformedBatch), counted in counters.malformed_batches."""
    from segscope_schemas.batch_envelope import MalformedBatch

    try:
        if message.value is None:
            raise MalformedBatch("null_value", "message has no value (tombstone)")
        header, records = decode(message.value)
    except MalformedBatch as e:
        counters.malformed_batches += 1
        return None, None, dead_letter(e.reason, e.detail, message)
    return header, records, None


def dead_letter(reason: str, detail: str, message) -> bytes:
    """JSON dead letter (segscope.deadletter) that keeps the original key and value (base64),
    with where the message came from, so nothing is lost."""
    key, value = message.key, message.value
    return json.dumps(
        {
            "reason": reason,
            "detail": detail,
            "source_topic": message.topic,
            "partition": message.partition,
            "offset": message.offset,
            "key_b64": None if key is None else base64.b64encode(key).decode(),
            "value_b64": None if value is None else base64.b64encode(value).decode(),
        }
    ).encode()


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


class ProcessorHealth:
    """A processor worker's health endpoint and consumer-lag lines.

    Liveness: a 1 s Faust timer of its own ticks (so it stays alive while a flush waits on an
    unreachable Kafka). Readiness: the last counters line published to segscope.metrics was
    acknowledged within stale_after_s. Counters: the processor's own segscope_processor line and
    one segscope_consumer line per assigned input partition, the same lines it publishes on
    segscope.metrics (schemas/metrics.md)."""

    def __init__(self, app, processor: str, cfg: EnvConfig, stale_after_s: float = 15.0):
        self.app, self.processor, self.cfg = app, processor, cfg
        self.instance = worker_instance()
        self.health = Health(f"processor-{processor}", stale_after_s=stale_after_s)

        async def heartbeat() -> None:
            self.health.tick()

        heartbeat.__name__ = heartbeat.__qualname__ = f"{processor}_health_heartbeat"
        app.timer(interval=1.0)(heartbeat)

    def serve(self) -> None:
        """Bind the endpoint (at worker start); a port in use stops the worker with the fix."""
        address = self.cfg.health_address()
        if address is None:
            return
        try:
            host, port = self.health.serve(address, f"environment variable {self.cfg.ENV['health'][0]}")
        except HealthAddressError as e:
            raise ConfigError(str(e)) from None
        import logging

        logging.getLogger(f"segscope.{self.processor}").info(
            "%s processor: health on http://%s:%d/healthz (/readyz /metrics /status)", self.processor, host, port
        )

    def consumer_lines(self, ts_ns: int) -> list[str]:
        """segscope_consumer,processor=P,instance=I,topic=T,partition=N highwater=,lag_messages=,uncommitted_messages=

        lag_messages: messages in the partition this worker has not read yet; uncommitted_messages:
        messages after the group's committed offset (read but held until their results are final,
        plus the lag) - what a restarted worker would replay."""
        consumer = getattr(self.app, "_consumer", None)
        if consumer is None:
            return []
        out = []
        read = getattr(consumer, "_read_offset", {})
        committed = getattr(consumer, "_committed_offset", {})
        try:
            assigned = sorted(consumer.assignment())
        except Exception:  # noqa: BLE001 - not started or rebalancing: nothing to report now
            return []
        for tp in assigned:
            if tp.topic.endswith("-__assignor-__leader"):
                continue  # Faust's own leader-election topic, not input
            try:
                hw = consumer.highwater(tp)
            except Exception:  # noqa: BLE001
                hw = None
            if hw is None:
                continue  # no fetch answered yet
            last_read = read.get(tp)
            done = committed.get(tp)
            lag = hw - (last_read + 1) if last_read is not None else (hw - done if done is not None else hw)
            held = hw - done if done is not None else hw
            out.append(
                f"segscope_consumer,processor={self.processor},instance={escape_instance(self.instance)},"
                f"topic={tp.topic},partition={tp.partition} "
                f"highwater={hw}i,lag_messages={max(lag, 0)}i,uncommitted_messages={max(held, 0)}i {ts_ns}"
            )
        return out

    async def publish(self, topic, key: bytes, counters_line: str, ts_ns: int, problem: str = "") -> None:
        """Send the counters line and the consumer lines to segscope.metrics; ready once acknowledged
        unless `problem` says why not (e.g. the processor's own sink fails). Not awaited to
        delivery: a stop during a Kafka outage must not hang on it."""
        lines = [counters_line, *self.consumer_lines(ts_ns)]
        self.health.set_lines("counters", lines)
        fut = await topic.send(key=key, value="\n".join(lines).encode())

        def delivered(f) -> None:
            if f.cancelled():
                return
            if f.exception() is None:
                self.health.ok()
                if problem:
                    self.health.not_ready(problem)
            else:
                self.health.not_ready(f"publishing to Kafka failed: {f.exception()!r}")

        fut.add_done_callback(delivered)


def escape_instance(value: str) -> str:
    """Line-protocol escaping of the instance tag value (a pod or host name rarely needs any)."""
    for ch in ("\\", ",", "=", " "):
        value = value.replace(ch, "\\" + ch)
    return value


class InOrderAcks:
    """Input messages held unacked until their results are final, acked per partition in offset
    order only: a message is acked when it and every earlier held message of its partition are
    finished.

    Why in order: Faust's commit (Consumer._new_offset, faust-streaming 0.11) takes the acked offsets
    of a partition and, when nothing was committed yet or the first unacked offset is the one right
    after the committed one, commits past that unacked message. A worker killed after such a commit
    would never see it again. With in-order acks the acked offsets never have a gap at the head.
    ExactCommits now replaces that commit rule (a message Faust never handed over leaves a gap
    in-order acks cannot prevent); in-order acks are still what lets it commit promptly."""

    def __init__(self) -> None:
        self.held: list = []  # (stream, event, state) in arrival order = offset order per partition

    def __len__(self) -> int:
        return len(self.held)

    def hold(self, stream, event, state) -> None:
        self.held.append((stream, event, state))

    def drop(self, partitions) -> int:
        """Drop the held messages of partitions this worker no longer owns (a rebalance moved them):
        they were never committed, so their new owner replays them. Returns how many."""
        keep = [h for h in self.held if h[1].message.tp not in partitions]
        dropped = len(self.held) - len(keep)
        self.held = keep
        return dropped

    async def ack_finished(self, finished: Callable[[object], bool]) -> None:
        blocked: set = set()
        keep = []
        for stream, event, state in self.held:
            tp = event.message.tp
            if tp not in blocked and finished(state):
                await stream.ack(event)
            else:
                blocked.add(tp)
                keep.append((stream, event, state))
        self.held = keep


def rewind_uncommitted(app, topics: set, sought: dict | None = None) -> None:
    """Read a partition the group never committed (or committed only offset 0) from its beginning
    after every rebalance, as `consumer_auto_offset_reset="earliest"` promises.

    Found here (faust-streaming 0.11 with aiokafka): while a rebalance has the flow stopped, Faust
    drops the records aiokafka fetched meanwhile and calls perform_seek() to go back to the
    committed offsets; aiokafka seeks only to committed offsets > 0, so a partition without one
    keeps its advanced position and the records fetched during the pause are never processed. A
    worker that gains such a partition (a worker joining or dying in the first retention_s of a
    group, before anything was acked) skipped everything before the end. Wrapping perform_seek
    (Faust calls it at each assignment and while the flow is stopped) seeks those partitions to
    their beginning instead; what the group read before is replayed and counted once there."""
    consumer = app.consumer
    if getattr(consumer, "_segscope_rewinds_uncommitted", False):
        return
    original = consumer.perform_seek

    async def perform_seek() -> None:
        await original()
        tps = [tp for tp in consumer.assignment() if tp.topic in topics and not consumer._committed_offset.get(tp)]
        if tps:
            # a concrete offset, not aiokafka's seek_to_beginning: that leaves the position unset
            # until the reset is done, and Faust's livelock check asserts on it meanwhile
            earliest = await consumer.earliest_offsets(*tps)
            for tp in tps:
                await consumer.seek(tp, earliest[tp])  # also clears Faust's read offset of tp
                if sought is not None:
                    sought[tp] = earliest[tp]  # ExactCommits: the first offset to ack there

    consumer.perform_seek = perform_seek
    consumer._segscope_rewinds_uncommitted = True


class ExactCommits:
    """Commit an offset only when every message before it was acked here, and fetch again a
    message Faust never handed to the streams.

    Found by churn (tests/processors/churn_stress.py, 1 of 13 runs with kills, joins and stops
    1.5 s apart): one collector message (offset 22) was never re-keyed, the worker re-keyed 13-21
    and 23-29, and the group committed 30. Two things in faust-streaming 0.15 meet there:
    - its fetch loop hands a message to the streams under `wait_first(callback, suspend_flow)`;
      when a rebalance starts meanwhile, the hand-over is cancelled and the message is marked
      read all the same. The seek to the committed offset after the rebalance should bring it
      back, but messages of the same fetch handed over after that seek mark later offsets read,
      and the re-fetched message is then dropped as already read;
    - its commit (Consumer._new_offset) commits the run of consecutive acked offsets from the
      lowest acked one. Knowing the committed offset c, it refuses only when that lowest one is
      above c + 1; but c is the next offset to read, not the last one read, so a message at c
      that was never acked is committed past. A message skipped right at c is lost for good.
    So _new_offset is replaced: the run must start at c itself (where rewind_uncommitted sought
    an uncommitted partition, at that offset). A partition of `topics` whose acked offsets start
    above c lost a message: it is counted (`partitions_refetched`) and read again from c (a seek,
    at most once per `retry_s` per offset). The processors count the messages read twice once,
    as after every rebalance (duplicate and final-horizon checks). Other topics just wait. If c
    is below the partition's first offset, retention deleted those messages before the group
    read them (a group stopped longer than the topic's retention; Kafka's offset reset skips
    them too): they are counted (`messages_expired_unread`) and the run starts at the first offset.

    Faust's gap filling (offsets a transactional or compacted topic skips) is left out: our
    topics are written by idempotent producers without transactions and are not compacted, so
    their offsets have no gaps."""

    def __init__(self, topics: set, counts: dict, retry_s: float = 3.0) -> None:
        self.topics, self.counts, self.retry_s = topics, counts, retry_s
        self.sought: dict = {}  # TP -> the offset rewind_uncommitted sought it to (nothing committed)
        self.refetched: dict = {}  # TP -> (offset, time.monotonic()) of the last seek back
        self.floor: dict = {}  # TP -> its first offset, where retention deleted offsets never read
        self.consumer = None

    def install(self, consumer) -> None:
        if self.consumer is consumer:
            return
        self.consumer = consumer
        consumer._new_offset = self.new_offset

    def start_of(self, tp) -> int | None:
        """The first offset this worker must ack in tp before it may commit anything there."""
        committed = self.consumer._committed_offset.get(tp)  # Faust: None for none and for 0
        known = [x for x in (committed or self.sought.get(tp), self.floor.get(tp)) if x is not None]
        return max(known) if known else None

    def new_offset(self, tp) -> int | None:
        """The offset to commit in tp: one past the run of acked offsets that starts at start_of(tp),
        those offsets forgotten; None when there is none."""
        consumer = self.consumer
        acked = consumer._acked[tp]
        if not acked:
            return None
        acked.sort()
        index = consumer._acked_index[tp]
        consumer._gap.pop(tp, None)
        start = self.start_of(tp)
        if start is not None:
            done = bisect.bisect_left(acked, start)  # acked below the committed offset: committed already
            if done:
                index.difference_update(acked[:done])
                del acked[:done]
            if not acked:
                return None
            if acked[0] != start:
                self.missing(tp, start)
                return None
        end = 1  # the run of consecutive offsets from acked[0]
        while end < len(acked) and acked[end] == acked[end - 1] + 1:
            end += 1
        index.difference_update(acked[:end])
        offset = acked[end - 1] + 1
        del acked[:end]
        return offset

    def missing(self, tp, offset: int) -> None:
        """Message `offset` of tp was never acked while later ones were: read tp again from it."""
        if tp.topic not in self.topics or tp not in self.consumer.assignment():
            return
        last = self.refetched.get(tp)
        now = time.monotonic()
        if last is not None and last[0] == offset and now - last[1] < self.retry_s:
            return
        self.refetched[tp] = (offset, now)
        import asyncio

        asyncio.get_running_loop().create_task(self.read_again(tp, offset))  # commit runs in the app's loop

    async def read_again(self, tp, offset: int) -> None:
        first = (await self.consumer.earliest_offsets(tp))[tp]
        if first > offset:
            self.floor[tp] = first
            self.counts["messages_expired_unread"] += first - offset
            log.warning("%s: messages %d..%d were deleted (topic retention) before this group read them", tp, offset,
                        first - 1)  # fmt: skip
            return
        self.counts["partitions_refetched"] += 1
        log.warning("%s: message %d was never handed over while later ones were: reading again from it", tp, offset)
        await self.consumer.seek(tp, offset)


class HeartbeatLease:
    """Whether this worker is surely still a member of its consumer group, so it may publish the
    results of the partitions it was assigned.

    Why: the broker drops a member whose heartbeats stop for the session timeout (6 s) and gives
    its partitions to the others. A worker that stalls that long without dying (SIGSTOP, a paused
    VM, a starved host) runs again with its timers overdue: its flush fires before its consumer
    thread's next heartbeat learns it was dropped, and publishes the results it holds for
    partitions another worker owns now, e.g. blocks timed out without their rx side that the new
    owner has already joined. InfluxDB keeps whichever came last: the stale line. Found by
    stopping a loss worker for 9 s mid-stream (tests/processors/test_worker_stall.py).

    So publication needs a lease: the send time of the last heartbeat the coordinator answered
    (or of the last assignment) plus the session timeout, minus a margin for the publish itself.
    The broker cannot have dropped the member before that. Heartbeats go every 2 s, so a running
    worker always holds the lease; a stalled one loses it and publishes nothing until a heartbeat
    says it is still a member, or the rebalance it learns of instead revokes its partitions
    (PartitionMoves / Leadership then drop what they fed). What is left: a stall of more than the
    margin between the check and the send of one flush."""

    def __init__(self, session_timeout_s: float = SESSION_TIMEOUT_S, margin_s: float = 1.5) -> None:
        self.session_timeout_s, self.margin_s = session_timeout_s, margin_s
        self.renewed_at: float | None = None  # time.monotonic() of the last renewal's request
        self.installed = False
        self.held = 0  # flushes that did not publish because the lease had run out

    def renew(self, sent_at: float) -> None:
        # the heartbeat task runs in Faust's consumer thread: one float store, read by the main loop
        if self.renewed_at is None or sent_at > self.renewed_at:
            self.renewed_at = sent_at

    def valid(self, now: float | None = None) -> bool:
        if self.renewed_at is None:
            return False
        now = time.monotonic() if now is None else now
        return now - self.renewed_at < self.session_timeout_s - self.margin_s

    def allows_publishing(self) -> bool:
        """valid(), counting the flushes it holds back (the `publish_held_no_lease` counter)."""
        if self.valid():
            return True
        self.held += 1
        if self.held == 1 or self.held % 100 == 0:
            log.warning("no heartbeat answered for %.1f s: results held until the group says this worker is still a "
                        "member (held %d flushes)", time.monotonic() - (self.renewed_at or 0), self.held)  # fmt: skip
        return False

    def joined(self, app) -> None:
        """At every assignment: the group just synced, so this worker is a member now; and from
        then on every heartbeat the coordinator accepts renews the lease (install)."""
        self.install(app)
        self.renew(time.monotonic())

    def install(self, app) -> None:
        """Renew on every heartbeat the coordinator accepts (Faust's aiokafka consumer, in its own
        thread); called at an assignment, when the coordinator exists."""
        if self.installed:
            return
        coordinator = app.consumer._thread._ensure_consumer()._coordinator
        original = coordinator._do_heartbeat

        async def _do_heartbeat() -> bool:
            sent_at = time.monotonic()
            ok = await original()  # True also while the group rebalances: still a member until it rejoins
            if ok:
                self.renew(sent_at)
            return ok

        coordinator._do_heartbeat = _do_heartbeat
        self.installed = True


class ActiveClock:
    """A monotonic clock (ns) that leaves out the time the worker could not consume: stalls of
    the process (a gap of more than stall_s between two readings, all of it but the reading
    interval: the app reads it every 0.1 s)
    and rebalance pauses (it stands still from revoke to assignment).

    Why: a block's (or second's) timeout says "its other side did not come in timeout_s", and
    that is only evidence while the worker was reading. After a 9 s stall, or a rebalance that
    waited 6 s for a dead member, the other side is in the input the worker is about to read
    (or replay): timed out by the wall clock, the block would be published incomplete and
    corrected a moment later, a false missing_rx in InfluxDB meanwhile."""

    def __init__(self, stall_s: float = 1.0, reading_interval_s: float = 0.1) -> None:
        self.stall_ns = int(stall_s * 1e9)
        self.interval_ns = int(reading_interval_s * 1e9)  # of a stall, this much is counted
        self.left_out_ns = 0  # stalls and pauses so far
        self.last_ns = time.monotonic_ns()  # the last reading
        self.paused_at: int | None = None  # the active time a pause stopped at

    def now_ns(self) -> int:
        now = time.monotonic_ns()
        gap = now - self.last_ns
        if gap > self.stall_ns:
            self.left_out_ns += gap - self.interval_ns
        self.last_ns = now
        active = now - self.left_out_ns
        return active if self.paused_at is None else self.paused_at

    def pause(self) -> None:
        if self.paused_at is None:
            self.paused_at = self.now_ns()

    def resume(self) -> None:
        if self.paused_at is not None:
            stopped_at, self.paused_at = self.paused_at, None
            self.left_out_ns += self.now_ns() - stopped_at


def _tps(partitions) -> str:
    """topic[p, ...] for a log line."""
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return " ".join(f"{t}{sorted(ps)}" for t, ps in sorted(by_topic.items())) or "nothing"


class PartitionMoves:
    """What a worker does when its consumer group rebalances (a worker joins, leaves or dies).

    A Kafka rebalance moves partitions between live workers. The worker that loses a partition
    still holds, in memory, the open results (seconds, blocks) of the keys that partition carries
    and the unacked messages that fed them; their new owner replays those messages (never
    committed) and computes the same results from scratch. If the old owner kept them, it would
    publish them again later from the part it had (an idle session closes by the wall clock),
    and InfluxDB would keep whichever came last. So:

    - on revoke (every member of the group, before the new assignment), `paused` is set under
      `lock`, after any flush in progress ended: the flush timer publishes nothing until the
      assignment is known;
    - on assignment, under the same lock: the partitions this worker lost are passed to
      `on_lost(partitions)` (drop the state they fed without publishing; `take_keys` gives the
      result keys `seen` on them), their held messages are forgotten, then `await on_assigned()`
      runs (re-read the progress topic: the old owner wrote there, before it acked anything, what
      it had made final; its revoke flushed its producer first) and the pause ends;
    - a message of a lost partition that Faust fetched before the rebalance and hands over after
      it is skipped (`moved_away`).

    One mechanism for every processor: the delay processor (one input topic, result keys =
    sessions) and the loss processor (two stages, the collector topic and the by-flow topic,
    each with its held messages; its state is dropped by flow partition).

    Partitions that stay assigned are replayed from their committed offset too (Kafka's eager
    rebalance resets every position); the processors count those records once (duplicate and
    final-horizon checks).
    """

    def __init__(self, app, pending: dict[str, InOrderAcks], on_lost: Callable[[set], int],
                 on_assigned: Callable[[], Awaitable[None]], clock: ActiveClock | None = None) -> None:  # fmt: skip
        """pending: the held (unacked) messages of each input topic this guards; clock: the
        processor's timeout clock, stopped from revoke to assignment."""
        import asyncio

        self.pending, self.on_lost, self.on_assigned, self.clock = pending, on_lost, on_assigned, clock
        self.lock = asyncio.Lock()
        self.paused = False
        self.owned: set = set()  # partitions (TP) of the input topics this worker owns
        self.lost: set = set()  # partitions it owned before the last assignment and not since
        self.key_partition: dict = {}  # result key (session, flow) -> the TP its records came on
        self.lease = HeartbeatLease()  # publish only while surely still a member (a stall past the session)
        self.counts = {
            "rebalances": 0,
            "publish_held_no_lease": 0,
            "partitions_lost": 0,
            "keys_dropped": 0,
            "messages_forgotten": 0,
            "messages_of_moved_partitions": 0,
            "partitions_refetched": 0,
            "messages_expired_unread": 0,
        }
        self.commits = ExactCommits(set(pending), self.counts)  # no commit past a message never acked
        app.on_partitions_revoked.connect(self._revoked)
        app.on_partitions_assigned.connect(self._assigned)

    def moved_away(self, tp) -> bool:
        """True for a message of a partition this worker lost: one Faust had fetched before the
        rebalance and hands over after it. Skip it (no ingest, no ack): its new owner replays
        it. Ingesting it would recreate the dropped state, and acking it would commit an offset
        of a partition another worker is still working through (Kafka checks the generation of
        a commit, not who owns the partition), losing that worker's unfinished results."""
        if tp in self.lost:
            self.counts["messages_of_moved_partitions"] += 1
            return True
        return False

    def seen(self, keys, tp) -> None:
        """The keys a message fed, and the partition it came on."""
        for key in keys:
            self.key_partition[key] = tp

    def take_keys(self, partitions: set) -> set:
        """The result keys last seen on these partitions, forgotten here."""
        keys = {k for k, tp in self.key_partition.items() if tp in partitions}
        for k in keys:
            del self.key_partition[k]
        return keys

    def may_publish(self) -> bool:
        """Whether a flush may publish (call it under `lock`): not while a rebalance is under way
        (which keys stay here is not known yet), nor after a stall that may have cost this worker
        its membership (HeartbeatLease: another worker may own these keys now)."""
        if self.paused:
            return False
        if not self.lease.allows_publishing():
            self.counts["publish_held_no_lease"] += 1
            return False
        return True

    async def _revoked(self, sender, revoked, **kwargs) -> None:
        async with self.lock:
            self.paused = True
            if self.clock is not None:
                self.clock.pause()

    async def _assigned(self, sender, assigned, **kwargs) -> None:
        rewind_uncommitted(sender, set(self.pending), self.commits.sought)
        self.commits.install(sender.consumer)
        self.lease.joined(sender)
        async with self.lock:
            now = {tp for tp in assigned if tp.topic in self.pending}
            lost = self.owned - now
            self.owned = now
            self.lost = (self.lost | lost) - now
            self.counts["rebalances"] += 1
            if lost:
                dropped = self.on_lost(lost)
                self.counts["partitions_lost"] += len(lost)
                self.counts["keys_dropped"] += dropped
                for topic, held in self.pending.items():
                    self.counts["messages_forgotten"] += held.drop({tp for tp in lost if tp.topic == topic})
                log.info("rebalance: partitions %s moved away, %d keys dropped", _tps(lost), dropped)
            await self.on_assigned()
            self.paused = False
            if self.clock is not None:
                self.clock.resume()
            log.info("rebalance: own %s", _tps(now))
