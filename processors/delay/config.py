"""Settings of the delay processor, from environment variables (defaults per the issue-3 contract).

Environment is the one channel that works both for `faust -A processors.delay.app worker`
(which imports the module itself) and for `python -m processors.delay` (which maps its
command-line flags onto these variables before importing the app).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

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
}


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

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "DelayConfig":
        env = os.environ if environ is None else environ
        raw = {name: env.get(var, default) for name, (var, default) in ENV.items()}
        if ENV["bootstrap"][0] not in env and "SEGSCOPE_KAFKA" in env:
            raw["bootstrap"] = env["SEGSCOPE_KAFKA"]   # short alias (segscope/local.py uses it)
        return cls(
            bootstrap=raw["bootstrap"],
            records_topic=raw["records_topic"],
            metrics_topic=raw["metrics_topic"],
            deadletter_topic=raw["deadletter_topic"],
            app_id=raw["app_id"],
            grace_s=float(raw["grace_s"]),
            retention_s=float(raw["retention_s"]),
            flush_interval_s=float(raw["flush_interval_s"]),
            max_lines_per_message=int(raw["max_lines_per_message"]),
            datadir=raw["datadir"].format(app_id=raw["app_id"]),
        )
