"""A processor worker's health endpoint and its counters lines (segscope_processor,
segscope_consumer) on the metrics topic."""

from __future__ import annotations

import logging

from processors.runtime.config import ConfigError, EnvConfig, worker_instance
from segscope_schemas.health import Health, HealthAddressError


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
