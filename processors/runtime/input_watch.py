"""InputWatch: whether a worker can read its input right now, from its consumer's fetch answers.

Why: the processors close and evict a silent session's (flow's) seconds by the wall clock, and
that silence is only evidence while the worker can read. During a Kafka outage every session is
silent because the consumer is, not the sender: the agents' clients hold their records and deliver
them when the broker is back. Measured on a loaded machine: the broker back 14 s after it went
down, the first flush after the outage evicted by the wall clock (its session idle for 14 s, past
the 5 s retention of the test) just before the held records arrived, and 975 of them were dropped
as late. While the input is stale the processors hold their idle clocks, as after a rebalance
(hold_idle_clocks), so the held records arrive to seconds that are still open.

The evidence: aiokafka stamps each partition with the time of its last fetch answer (also an
empty one: a caught-up partition is answered at least every fetch_max_wait, 1.5 s in Faust). The
input is stale when one of the worker's input partitions has not been answered for more than
stale_after_s (since its assignment, for one never answered). One stale partition holds every
session of the worker: sessions are not mapped to partitions here, and a hold only delays the
close of a session that really stopped.
"""

from __future__ import annotations

import logging
import time
from typing import Iterable

from processors.runtime.timers import every

log = logging.getLogger("segscope.worker")

STALE_AFTER_S = 4.0  # more than twice Faust's fetch_max_wait (1.5 s): a caught-up partition is answered by then


class InputWatch:
    def __init__(self, app, topics: Iterable[str], stale_after_s: float = STALE_AFTER_S) -> None:
        """topics: the worker's input topics (its other partitions, e.g. Faust's leader topic, are
        not watched)."""
        self.app = app
        self.topics = set(topics)
        self.stale_after_ms = int(stale_after_s * 1000)
        self.stale_now = False
        # on the processor's segscope_processor line: how often and how long its input was stale
        self.counts = {"input_stalls": 0, "input_stale_ms": 0}
        self._stale_since: float | None = None  # counted up to here
        self._episode_since = 0.0  # when the current (or last) stale episode began
        self._assigned_at: dict = {}  # partition -> ms this watch first saw it assigned
        self.answered_again_at = 0.0  # wall-clock s the last stale episode ended

    def oldest_answer_ms(self) -> int | None:
        """Wall-clock ms of the oldest last fetch answer among the input partitions assigned (for
        one not answered since its assignment: when this watch first saw it assigned); None when
        none is assigned (or the consumer is not running)."""
        try:
            consumer = self.app.consumer._thread._ensure_consumer()  # the aiokafka consumer
            assigned = [tp for tp in consumer.assignment() if tp.topic in self.topics]
            answered = {tp: consumer.last_poll_timestamp(tp) for tp in assigned}
        except Exception:  # noqa: BLE001 - not started, stopping or between assignments: nothing to watch
            return None
        now_ms = int(time.time() * 1000)
        self._assigned_at = {tp: self._assigned_at.get(tp, now_ms) for tp in assigned}
        if not assigned:
            return None
        return min(ms if ms is not None else self._assigned_at[tp] for tp, ms in answered.items())

    def stale(self) -> bool:
        """Whether the input is stale now; counts the episodes and their length."""
        oldest = self.oldest_answer_ms()
        now = time.time()
        stale = oldest is not None and now * 1000 - oldest > self.stale_after_ms
        if stale and not self.stale_now:
            self.counts["input_stalls"] += 1
            self._stale_since = self._episode_since = now
            log.warning("input not answered for %.1f s: silence is no evidence until it is", now - oldest / 1000)
        elif not stale and self.stale_now:
            self.answered_again_at = now
            log.info("input answered again after %.1f s stale", now - self._episode_since)
        if self._stale_since is not None:
            self.counts["input_stale_ms"] += int((now - self._stale_since) * 1000)
            self._stale_since = now if stale else None
        self.stale_now = stale
        return stale


def hold_idle_clocks(states: Iterable, until_tai_ns: int) -> None:
    """No session (flow) counts as idle before until_tai_ns: their last_ingest_tai_ns moves there.
    After a rebalance and while the input is stale, their silence is the consumer's."""
    for st in states:
        if st.last_ingest_tai_ns < until_tai_ns:
            st.last_ingest_tai_ns = until_tai_ns


def hold_idle_clocks_while_stale(app, topics: Iterable[str], states, until_tai_ns) -> InputWatch:
    """An InputWatch of `topics`, read every second while the app runs; while the input is stale,
    the idle clocks of states() (sessions, flows) are held at until_tai_ns(): once the input answers
    again, the records held through the outage get that long to arrive (the clients that held them
    reconnect with a backoff of their own)."""
    watch = InputWatch(app, topics)

    @every(app, 1.0)
    async def hold_idle_clocks_while_input_stale() -> None:
        if watch.stale():
            hold_idle_clocks(states(), until_tai_ns())

    return watch
