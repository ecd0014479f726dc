"""Settings of the loss processor, from environment variables (processors/runtime/config.py says why
environment; `python -m processors.loss --help` lists them with their defaults)."""

from __future__ import annotations

from dataclasses import dataclass

from processors.delay.aggregate import host_tai_utc_offset_s
from processors.newest import check_newest, newest_env
from processors.runtime.config import ConfigError, EnvConfig, processor_env
from segscope_schemas import names

ENV = {
    **processor_env("loss", "blocks_topic", "SEGSCOPE_TOPIC_ALTMARK_BLOCKS", names.TOPIC_ALTMARK_BLOCKS),
    # a block waits this long (from its first record) for its other side, then it is
    # published complete=false (missing_tx / missing_rx); it is overwritten if the side comes later
    # the repartition stage re-sends every record to partition flow_partition(flow_id) of this topic
    # (processors/loss/keying.py); "{blocks_topic}" = the input topic's name
    "by_flow_topic": ("SEGSCOPE_TOPIC_ALTMARK_BY_FLOW", "{blocks_topic}.by_flow"),
    # partitions of the by-flow topic when the worker creates it; 0 = as many as the input topic.
    # Rule: partitions >= the most loss workers you will run (processors/loss/README.md)
    "by_flow_partitions": ("SEGSCOPE_LOSS_BY_FLOW_PARTITIONS", "0"),
    "timeout_s": ("SEGSCOPE_LOSS_TIMEOUT_S", "10.0"),
    "retention_s": ("SEGSCOPE_LOSS_RETENTION_S", "300.0"),
    "flush_interval_s": ("SEGSCOPE_LOSS_FLUSH_INTERVAL_S", "1.0"),
    "max_lines_per_message": ("SEGSCOPE_LOSS_MAX_LINES_PER_MESSAGE", "2000"),
    "datadir": ("SEGSCOPE_LOSS_DATADIR", ".run/processors/{app_id}"),
    "tai_utc_offset_s": ("SEGSCOPE_TAI_UTC_OFFSET_S", "host"),
    # the newest complete altmark_loss line of each series every interval, for topology (processors/newest.py)
    **newest_env(),
}


@dataclass(frozen=True)
class LossConfig(EnvConfig):
    bootstrap: str
    blocks_topic: str
    by_flow_topic: str
    by_flow_partitions: int
    metrics_topic: str
    deadletter_topic: str
    paths_topic: str
    app_id: str
    health: str
    stop_timeout_s: float
    timeout_s: float
    retention_s: float
    flush_interval_s: float
    max_lines_per_message: int
    datadir: str
    tai_utc_offset_s: int
    newest_topic: str
    summary_interval_s: float

    ENV = ENV

    @classmethod
    def adjust(cls, raw, env):
        raw["by_flow_topic"] = raw["by_flow_topic"].replace("{blocks_topic}", raw["blocks_topic"])
        if raw["tai_utc_offset_s"] == "host":
            raw["tai_utc_offset_s"] = str(host_tai_utc_offset_s())
        return raw

    def validate(self) -> None:
        if not 0 < self.timeout_s <= self.retention_s:
            raise ConfigError(
                f"need 0 < {ENV['timeout_s'][0]} <= {ENV['retention_s'][0]} (got {self.timeout_s}, {self.retention_s})"
            )
        if self.by_flow_partitions < 0:
            raise ConfigError(f"{ENV['by_flow_partitions'][0]} must be >= 0 (0: as many as the input topic)")
        if self.by_flow_topic == self.blocks_topic:
            raise ConfigError(f"{ENV['by_flow_topic'][0]} must differ from {ENV['blocks_topic'][0]}")
        if self.flush_interval_s <= 0 or self.max_lines_per_message < 1:
            raise ConfigError(f"{ENV['flush_interval_s'][0]} must be > 0 and {ENV['max_lines_per_message'][0]} >= 1")
        check_newest(self, ENV, self.retention_s)
