"""The processors' runtime, under the names the processors imported before it was split into
processors/runtime/ (one module per concern: runtime/__init__.py lists them)."""

from processors.runtime.acks import InOrderAcks, ack_offsets
from processors.runtime.clock import ActiveClock
from processors.runtime.commits import ExactCommits, rewind_uncommitted
from processors.runtime.config import (
    HEALTH_PORTS,
    SESSION_TIMEOUT_S,
    ConfigError,
    EnvConfig,
    env_number,
    faust_app_settings,
    processor_env,
    run_worker,
    worker_instance,
)
from processors.runtime.deadletters import dead_letter, decode_or_dead_letter
from processors.runtime.health import ProcessorHealth, escape_instance
from processors.runtime.intake import BatchIntake
from processors.runtime.lease import HeartbeatLease
from processors.runtime.moves import PartitionMoves
from processors.runtime.topics import once_led, read_progress, read_topic, watermarks

__all__ = [
    "HEALTH_PORTS",
    "SESSION_TIMEOUT_S",
    "ActiveClock",
    "BatchIntake",
    "ConfigError",
    "EnvConfig",
    "ExactCommits",
    "HeartbeatLease",
    "InOrderAcks",
    "PartitionMoves",
    "ProcessorHealth",
    "ack_offsets",
    "dead_letter",
    "decode_or_dead_letter",
    "env_number",
    "escape_instance",
    "faust_app_settings",
    "once_led",
    "processor_env",
    "read_progress",
    "read_topic",
    "rewind_uncommitted",
    "run_worker",
    "watermarks",
    "worker_instance",
]
