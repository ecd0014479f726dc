"""Settings of the loss processor, from environment variables (defaults per the issue-5 contract).

Same channel as processors/delay: environment works for `faust -A processors.loss.app worker`
and for `python -m processors.loss` (which maps its flags onto these variables first).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from processors.worker import ConfigError, env_number  # noqa: F401 (ConfigError: part of this module's API)

from processors.delay.aggregate import host_tai_utc_offset_s

ENV = {
    "bootstrap": ("SEGSCOPE_KAFKA_BOOTSTRAP", "127.0.0.1:19092"),
    "blocks_topic": ("SEGSCOPE_TOPIC_ALTMARK_BLOCKS", "segscope.altmark.blocks"),
    "metrics_topic": ("SEGSCOPE_TOPIC_METRICS", "segscope.metrics"),
    "deadletter_topic": ("SEGSCOPE_TOPIC_DEADLETTER", "segscope.deadletter"),
    "app_id": ("SEGSCOPE_LOSS_APP_ID", "segscope-loss"),             # also the consumer group id
    # a block waits this long (from its first record) for its other side, then it is
    # published complete=false (missing_tx / missing_rx); it is overwritten if the side comes later
    "timeout_s": ("SEGSCOPE_LOSS_TIMEOUT_S", "10.0"),
    "retention_s": ("SEGSCOPE_LOSS_RETENTION_S", "300.0"),
    "flush_interval_s": ("SEGSCOPE_LOSS_FLUSH_INTERVAL_S", "1.0"),
    "max_lines_per_message": ("SEGSCOPE_LOSS_MAX_LINES_PER_MESSAGE", "2000"),
    "datadir": ("SEGSCOPE_LOSS_DATADIR", ".run/processors/{app_id}"),
    "tai_utc_offset_s": ("SEGSCOPE_TAI_UTC_OFFSET_S", "host"),
}


def _number(raw: dict[str, str], name: str, kind):
    return env_number(ENV, raw, name, kind)


@dataclass(frozen=True)
class LossConfig:
    bootstrap: str
    blocks_topic: str
    metrics_topic: str
    deadletter_topic: str
    app_id: str
    timeout_s: float
    retention_s: float
    flush_interval_s: float
    max_lines_per_message: int
    datadir: str
    tai_utc_offset_s: int

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "LossConfig":
        env = os.environ if environ is None else environ
        raw = {name: env.get(var, default) for name, (var, default) in ENV.items()}
        if ENV["bootstrap"][0] not in env and "SEGSCOPE_KAFKA" in env:
            raw["bootstrap"] = env["SEGSCOPE_KAFKA"]   # short alias
        cfg = cls(
            bootstrap=raw["bootstrap"],
            blocks_topic=raw["blocks_topic"],
            metrics_topic=raw["metrics_topic"],
            deadletter_topic=raw["deadletter_topic"],
            app_id=raw["app_id"],
            timeout_s=_number(raw, "timeout_s", float),
            retention_s=_number(raw, "retention_s", float),
            flush_interval_s=_number(raw, "flush_interval_s", float),
            max_lines_per_message=_number(raw, "max_lines_per_message", int),
            datadir=raw["datadir"].format(app_id=raw["app_id"]),
            tai_utc_offset_s=(host_tai_utc_offset_s() if raw["tai_utc_offset_s"] == "host"
                              else _number(raw, "tai_utc_offset_s", int)),
        )
        if not 0 < cfg.timeout_s <= cfg.retention_s:
            raise ConfigError(f"need 0 < {ENV['timeout_s'][0]} <= {ENV['retention_s'][0]} "
                              f"(got {cfg.timeout_s}, {cfg.retention_s})")
        if cfg.flush_interval_s <= 0 or cfg.max_lines_per_message < 1:
            raise ConfigError(f"{ENV['flush_interval_s'][0]} must be > 0 and "
                              f"{ENV['max_lines_per_message'][0]} >= 1")
        return cfg
