"""BatchIntake: how a processor reads its input topics: Faust's consumer (group membership,
fetching, rebalances, commits) without Faust's per-event machinery, the messages of each fetch
handed to the processor as one batch per topic.

Why: with small messages Faust's work per message was the processor's cost. Measured on the delay
worker (bench/processor_records.py, 20-record messages): ~0.2 ms of CPU per message against
~36 µs for the decoding and aggregation itself. Per message Faust's fetch loop runs the hand-over
under `wait_first(callback, suspend_flow.wait())` (two tasks and an asyncio.wait), the conductor
makes an Event and queues it on the agent's channel, the stream takes it off again through its
iterator chain, and an ack takes the ack lock and calls the sensors; the processors then held,
acked and checked every message on its own. Here:

- the fetch loop (Consumer._drain_messages, replaced on the app's consumer) takes the records of
  one fetch (up to broker_max_poll_records), keeps Faust's rules for each (flow stopped or
  generation changed: stop handing over; an offset below the read offset: dropped as already
  read, as Faust does after a seek back; the read offset moves on), and hands each message to
  the consumer's callback as Faust does (the conductor, which looks up the partition's handler),
  awaited directly: the handler of an intake topic only appends the message to that topic's
  batch, it never blocks, so there is nothing for the suspend-flow race to cancel;
- then it calls the processor's handler once per topic with that topic's batch (offset order
  within each partition), in this task: a slow handler holds the next fetch back (the only
  buffer is one fetch), and nothing is processed while a rebalance is under way (the batch of a
  fetch the rebalance cut short is let go: it was not processed, not acked, and is read again
  from the committed offset like everything else after a rebalance; counted);
- the processors hold and ack whole batches (runtime/acks.py InOrderAcks) and ExactCommits
  decides what is committed, exactly as before.

Left out of Faust's loop, on purpose: the per-message sensors and `track_message` (the
processors' own counters say what they read; nothing waits for Faust's unacked set:
stream_wait_empty is off), gap tracking (ExactCommits leaves gaps out: our topics have none)
and commit_every (acked offsets are committed by the commit timer, every
broker_commit_interval). The liveness check Faust runs per partition (its livelock detector) is
fed once per fetch (Monitor.stream_inbound_time).

Topics that are not an intake's (none in the delay, loss and in-line processors) keep Faust's
hand-over.
"""

from __future__ import annotations

import asyncio
import logging
from time import monotonic
from typing import Awaitable, Callable

log = logging.getLogger("segscope.worker")

Handler = Callable[[list], Awaitable[None]]


class BatchIntake:
    def __init__(self, app, counts: dict | None = None) -> None:
        """counts: where `input_batches` and `messages_released_at_rebalance` are counted (the
        processor's PartitionMoves.counts, on its segscope_processor line)."""
        self.app = app
        self.topics: dict[str, object] = {}  # name -> the Faust topic (subscribed through the conductor)
        self.handlers: dict[str, Handler] = {}
        self.batches: dict[str, list] = {}  # name -> messages of the fetch being handed over
        self.counts = counts if counts is not None else {}
        self.counts.setdefault("messages_released_at_rebalance", 0)
        self.counts.setdefault("input_batches", 0)  # handler calls: one per topic and fetch
        self.installed = False

    def take(self, topic, handler: Handler) -> None:
        """Read `topic` (an app.topic(...)) in batches: `await handler(messages)` after each fetch
        that brought messages of it."""
        name = topic.get_topic_name()
        self.topics[name] = topic
        self.handlers[name] = handler
        self.batches[name] = []

    def install(self) -> None:
        """Subscribe the topics and take over the consumer's fetch loop; call it in the app's
        on_first_start (before the consumer's fetcher and the conductor start)."""
        if self.installed:
            return
        app = self.app
        conductor = app.topics
        build_handler = conductor._build_handler

        def _build_handler(tp, channels):
            if tp.topic in self.batches:
                return self._handler_for(tp.topic)
            return build_handler(tp, channels)

        conductor._build_handler = _build_handler  # the conductor's per-partition callback
        for topic in self.topics.values():
            conductor.add(topic)
        app.consumer._drain_messages = self.drain
        self.installed = True

    def _handler_for(self, name: str):
        batch_of = self.batches

        async def hand_over(message) -> None:
            batch_of[name].append(message)

        return hand_over

    def release(self) -> int:
        """Let go of the messages handed over and not processed (a rebalance began)."""
        released = 0
        for name, batch in self.batches.items():
            released += len(batch)
            self.batches[name] = []
        self.counts["messages_released_at_rebalance"] += released
        return released

    async def process(self) -> None:
        for name, batch in self.batches.items():
            if batch:
                self.batches[name] = []
                self.counts["input_batches"] += 1
                await self.handlers[name](batch)

    async def drain(self, fetcher) -> None:
        """Consumer._drain_messages: the fetch loop the Fetcher service runs."""
        from faust.transport.consumer import CONSUMER_FETCHING

        app = self.app
        consumer = app.consumer
        callback = consumer.callback  # the conductor's on_message (a test may wrap it)
        consumer_should_stop = consumer._stopped.is_set
        fetcher_should_stop = fetcher._stopped.is_set
        read_offset = consumer._read_offset
        to_message = consumer._to_message
        intake_topics = self.batches
        monitor = app.monitor
        self.release()  # a fetcher restarted after a crash: what the last one left is read again
        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                consumer.diag.set_flag(CONSUMER_FETCHING)
                records, active = await consumer._wait_next_records(1.0)
                await asyncio.sleep(0)  # a loop of empty fetches must still let others run
                if records is None or consumer.should_stop:
                    continue
                if not consumer.flow_active:
                    # as Faust's getmany: records fetched while the flow stopped are dropped and
                    # the partitions go back to their committed offsets
                    try:
                        await consumer.perform_seek()
                    except Exception as e:  # noqa: BLE001 - Faust logs and goes on here too
                        log.warning("exception performing seek when flow not active %r", e)
                    continue
                generation = app.consumer_generation_id
                buffered = consumer._buffered_partitions
                handed = 0
                for tp, tp_records in records.items():
                    if not consumer.flow_active or app.consumer_generation_id != generation:
                        break
                    if active is not None and tp not in active and tp not in buffered:
                        continue
                    monitor.track_tp_end_offset(tp, consumer.highwater(tp))
                    ours = tp.topic in intake_topics
                    if ours:
                        monitor.stream_inbound_time[tp] = monotonic()  # Faust's livelock check
                    for record in tp_records:
                        if not consumer.flow_active or app.consumer_generation_id != generation:
                            break
                        offset = record.offset
                        last = read_offset[tp]
                        if last is not None and offset < last:
                            continue  # read before a seek back to an earlier offset: Faust drops it too
                        message = to_message(tp, record)
                        if ours:
                            await callback(message)
                            handed += 1
                        else:
                            await consumer.wait_first(callback(message), consumer.suspend_flow.wait())
                        read_offset[tp] = offset
                if not handed:
                    pass
                elif consumer.flow_active and app.consumer_generation_id == generation:
                    await self.process()
                else:
                    self.release()
                consumer.diag.unset_flag(CONSUMER_FETCHING)
        except consumer.consumer_stopped_errors:
            if app.should_stop:
                log.info("Broker stopped consumer, shutting down...")
                return
            raise
        except asyncio.CancelledError:
            if app.should_stop:
                log.info("Consumer shutting down for user cancel.")
                return
            raise
        except Exception as exc:
            # a processor's handler failed outside its own error handling: crash the worker (its
            # input is not acked; a restarted worker reads it again) instead of fetching no more
            log.exception("intake failed: %r", exc)
            await app.crash(exc)
            raise
        finally:
            consumer.diag.unset_flag(CONSUMER_FETCHING)
