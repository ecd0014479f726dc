"""Settings of the loss processor, from environment variables (processors/worker.py says why
environment; `python -m processors.loss --help` lists them with their defaults)."""

from __future__ import annotations

from dataclasses import dataclass

from processors.delay.aggregate import host_tai_utc_offset_s
from processors.worker import ConfigError, EnvConfig, processor_env
from segscope_schemas import names

ENV = {
    **processor_env("loss", "blocks_topic", "SEGSCOPE_TOPIC_ALTMARK_BLOCKS", names.TOPIC_ALTMARK_BLOCKS),
    # a block waits this long (from its first record) for its other side, then it is
    # published complete=false (missing_tx / missing_rx); it is overwritten if the side comes later
    "timeout_s": ("SEGSCOPE_LOSS_TIMEOUT_S", "10.0"),
    "retention_s": ("SEGSCOPE_LOSS_RETENTION_S", "300.0"),
    "flush_interval_s": ("SEGSCOPE_LOSS_FLUSH_INTERVAL_S", "1.0"),
    "max_lines_per_message": ("SEGSCOPE_LOSS_MAX_LINES_PER_MESSAGE", "2000"),
    "datadir": ("SEGSCOPE_LOSS_DATADIR", ".run/processors/{app_id}"),
    "tai_utc_offset_s": ("SEGSCOPE_TAI_UTC_OFFSET_S", "host"),
}


@dataclass(frozen=True)
class LossConfig(EnvConfig):
    bootstrap: str
    blocks_topic: str
    metrics_topic: str
    deadletter_topic: str
    paths_topic: str
    app_id: str
    health: str
    timeout_s: float
    retention_s: float
    flush_interval_s: float
    max_lines_per_message: int
    datadir: str
    tai_utc_offset_s: int

    ENV = ENV

    @classmethod
    def adjust(cls, raw, env):
        if raw["tai_utc_offset_s"] == "host":
            raw["tai_utc_offset_s"] = str(host_tai_utc_offset_s())
        return raw

    def validate(self) -> None:
        if not 0 < self.timeout_s <= self.retention_s:
            raise ConfigError(
                f"need 0 < {ENV['timeout_s'][0]} <= {ENV['retention_s'][0]} (got {self.timeout_s}, {self.retention_s})"
            )
        if self.flush_interval_s <= 0 or self.max_lines_per_message < 1:
            raise ConfigError(f"{ENV['flush_interval_s'][0]} must be > 0 and {ENV['max_lines_per_message'][0]} >= 1")
