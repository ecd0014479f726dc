"""Kafka security of every segscope program: one set of settings (SEGSCOPE_KAFKA_*, secrets from
files), the client configs built from them, and a clear report when Kafka refuses a client.

    from segscope_kafka import kafka_config, faust_credentials
    Producer(kafka_config({"bootstrap.servers": b, "acks": "all"}))   # confluent-kafka
    faust.App(..., broker_credentials=faust_credentials())             # Faust / aiokafka

settings.py says what each variable holds; refusal.py what a refusal looks like; acls.py the
ACLs of each role; telegraf.py the rendered Telegraf config; docs/security.md all of it.
"""

from __future__ import annotations

from segscope_kafka.refusal import KafkaRefused, RefusalWatch, login_check, metadata, refusal_message
from segscope_kafka.settings import (
    ENV_PREFIX,
    MECHANISMS,
    PROTOCOLS,
    SETTINGS,
    KafkaConfigError,
    KafkaSecurity,
    from_env,
    kafka_config,
)


def faust_credentials(environ: dict[str, str] | None = None, prefix: str = ENV_PREFIX):
    """Faust's broker_credentials for this program (None: PLAINTEXT)."""
    return from_env(environ, prefix).faust_credentials()


__all__ = [
    "ENV_PREFIX",
    "MECHANISMS",
    "PROTOCOLS",
    "SETTINGS",
    "KafkaConfigError",
    "KafkaRefused",
    "KafkaSecurity",
    "RefusalWatch",
    "faust_credentials",
    "from_env",
    "kafka_config",
    "login_check",
    "metadata",
    "refusal_message",
]
