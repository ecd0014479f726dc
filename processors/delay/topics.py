"""Create Kafka topics that do not exist yet (confluent-kafka AdminClient), as this program's Kafka
principal (segscope_kafka): a refusal (login, ACL) raises KafkaRefused at once, naming the fix."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from segscope_kafka import RefusalWatch, from_env, kafka_config, metadata
from segscope_schemas.names import TOPIC_PARTITIONS


def ensure_topics(
    bootstrap: str,
    topics: list[str],
    partitions: int | None = None,
    replication: int = 1,
    timeout_s: float = 30.0,
    config: dict[str, str] | None = None,
) -> list[str]:
    """Create the missing ones among `topics` (with topic `config`, e.g. cleanup.policy), each with
    `partitions`, else its registry partition count (schemas/names.toml), else 1; return the names
    that were created. A deployment creates them first with its own counts (segscope-topics)."""
    watch = RefusalWatch(from_env())
    admin = AdminClient(kafka_config({"bootstrap.servers": bootstrap}, error_cb=watch))
    existing = set(metadata(admin, watch, timeout_s).topics)
    missing = [t for t in dict.fromkeys(topics) if t not in existing]
    if not missing:
        return []
    new = [NewTopic(t, partitions or TOPIC_PARTITIONS.get(t, 1), replication, config=config or {}) for t in missing]
    futures = admin.create_topics(new, operation_timeout=timeout_s)
    created = []
    for name, fut in futures.items():
        try:
            fut.result(timeout=timeout_s)
            created.append(name)
        except KafkaException as e:
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # lost a race: fine
                watch.note(e.args[0].code(), e.args[0].str(), name)
                watch.raise_if_refused()  # e.g. no ACL to create it: KafkaRefused naming the fix
                raise
    return created
