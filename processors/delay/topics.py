"""Create Kafka topics that do not exist yet (confluent-kafka AdminClient)."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic


def ensure_topics(
    bootstrap: str,
    topics: list[str],
    partitions: int = 1,
    replication: int = 1,
    timeout_s: float = 30.0,
    config: dict[str, str] | None = None,
) -> list[str]:
    """Create the missing ones among `topics` (with topic `config`, e.g. cleanup.policy);
    return the names that were created."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    missing = [t for t in dict.fromkeys(topics) if t not in existing]
    if not missing:
        return []
    new = [NewTopic(t, partitions, replication, config=config or {}) for t in missing]
    futures = admin.create_topics(new, operation_timeout=timeout_s)
    created = []
    for name, fut in futures.items():
        try:
            fut.result(timeout=timeout_s)
            created.append(name)
        except KafkaException as e:
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # lost a race: fine
                raise
    return created
