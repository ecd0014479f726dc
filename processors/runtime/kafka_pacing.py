"""Failed metadata updates paced: aiokafka without its busy loop while no broker answers.

aiokafka's producer sender (aiokafka/producer/sender.py, `_sender_routine`) waits on a metadata
update whenever a partition's leader is unknown, "and wait backoff time", says its comment, but it
waits only for the update. With the broker down the update fails at once (connection refused), so
the loop turns again: measured here, over 2 000 metadata attempts and 6 000 ERROR lines a second
on a full core, from a delay worker whose Kafka had stopped, until Kafka came back.

Every caller waits on the one metadata synchroniser (AIOKafkaClient._md_synchronizer). A failed
update now returns only after a backoff that doubles from the client's retry_backoff_ms up to
MAX_BACKOFF_S and starts over at the first success, as the Java client's reconnect backoff does.
So each loop that waits on it is paced; a successful update is not delayed.
"""

from __future__ import annotations

import asyncio

from aiokafka.client import AIOKafkaClient

MAX_BACKOFF_S = 1.0

_installed = False


def install() -> None:
    """Wrap AIOKafkaClient._metadata_update (idempotent; before the first client is made)."""
    global _installed
    if _installed:
        return
    unpaced = AIOKafkaClient._metadata_update

    async def paced_metadata_update(self: AIOKafkaClient, cluster_metadata, topics) -> bool:
        ok = await unpaced(self, cluster_metadata, topics)
        if ok:
            self._segscope_failed_updates = 0
            return ok
        failures = getattr(self, "_segscope_failed_updates", 0)
        self._segscope_failed_updates = failures + 1
        await asyncio.sleep(min(MAX_BACKOFF_S, max(self._retry_backoff, 0.01) * 2 ** min(failures, 10)))
        return ok

    AIOKafkaClient._metadata_update = paced_metadata_update
    _installed = True
