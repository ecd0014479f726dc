"""Settings of the delay processor, from environment variables (defaults per the issue-3 contract).

Environment is the one channel that works both for `faust -A processors.delay.app worker`
(which imports the module itself) and for `python -m processors.delay` (which maps its
command-line flags onto these variables before importing the app).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from processors.worker import ConfigError, env_number  # noqa: F401 (ConfigError: part of this module's API)

from processors.delay.aggregate import host_tai_utc_offset_s

ENV = {
    "bootstrap": ("SEGSCOPE_KAFKA_BOOTSTRAP", "127.0.0.1:19092"),
    "records_topic": ("SEGSCOPE_TOPIC_STAMP_RECORDS", "segscope.stamp.records"),
    "metrics_topic": ("SEGSCOPE_TOPIC_METRICS", "segscope.metrics"),
    "deadletter_topic": ("SEGSCOPE_TOPIC_DEADLETTER", "segscope.deadletter"),
    "app_id": ("SEGSCOPE_DELAY_APP_ID", "segscope-delay"),          # also the consumer group id
    "grace_s": ("SEGSCOPE_DELAY_GRACE_S", "2.0"),
    "retention_s": ("SEGSCOPE_DELAY_RETENTION_S", "60.0"),
    "flush_interval_s": ("SEGSCOPE_DELAY_FLUSH_INTERVAL_S", "1.0"),
    "max_lines_per_message": ("SEGSCOPE_DELAY_MAX_LINES_PER_MESSAGE", "2000"),
    "datadir": ("SEGSCOPE_DELAY_DATADIR", ".run/processors/{app_id}"),
    # TAI - UTC in seconds for point timestamps; "host" = what this host's kernel says
    # (right where a PTP/NTP daemon maintains it; set 37 explicitly where none does)
    "tai_utc_offset_s": ("SEGSCOPE_TAI_UTC_OFFSET_S", "host"),
}


def _number(raw: dict[str, str], name: str, kind):
    return env_number(ENV, raw, name, kind)


@dataclass(frozen=True)
class DelayConfig:
    bootstrap: str
    records_topic: str
    metrics_topic: str
    deadletter_topic: str
    app_id: str
    grace_s: float
    retention_s: float
    flush_interval_s: float
    max_lines_per_message: int
    datadir: str
    tai_utc_offset_s: int

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "DelayConfig":
        env = os.environ if environ is None else environ
        raw = {name: env.get(var, default) for name, (var, default) in ENV.items()}
        if ENV["bootstrap"][0] not in env and "SEGSCOPE_KAFKA" in env:
            raw["bootstrap"] = env["SEGSCOPE_KAFKA"]   # short alias
        return cls(
            bootstrap=raw["bootstrap"],
            records_topic=raw["records_topic"],
            metrics_topic=raw["metrics_topic"],
            deadletter_topic=raw["deadletter_topic"],
            app_id=raw["app_id"],
            grace_s=_number(raw, "grace_s", float),
            retention_s=_number(raw, "retention_s", float),
            flush_interval_s=_number(raw, "flush_interval_s", float),
            max_lines_per_message=_number(raw, "max_lines_per_message", int),
            datadir=raw["datadir"].format(app_id=raw["app_id"]),
            tai_utc_offset_s=(host_tai_utc_offset_s() if raw["tai_utc_offset_s"] == "host"
                              else _number(raw, "tai_utc_offset_s", int)),
        )
