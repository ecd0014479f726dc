"""Settings of the delay processor, from environment variables (processors/runtime/config.py says why
environment; `python -m processors.delay --help` lists them with their defaults)."""

from __future__ import annotations

from dataclasses import dataclass

from processors.delay.aggregate import host_tai_utc_offset_s
from processors.newest import check_newest, newest_env
from processors.runtime.config import (  # noqa: F401 (ConfigError: this module's API)
    ConfigError,
    EnvConfig,
    processor_env,
)
from segscope_schemas import names

ENV = {
    **processor_env("delay", "records_topic", "SEGSCOPE_TOPIC_STAMP_RECORDS", names.TOPIC_STAMP_RECORDS),
    # a second is published once the session's newest T1 is this far past the second's end (data
    # time: records come in T4 order, so this is about the largest round trip that still lands in
    # time; a later record re-opens the second and it is published again, counted seconds_reemitted)
    "grace_s": ("SEGSCOPE_DELAY_GRACE_S", "0.5"),
    # a session without records for this long (wall clock) has its open seconds closed by the clock
    # (a session that stopped); must exceed a slow session's packet gap plus the input's lag
    "idle_s": ("SEGSCOPE_DELAY_IDLE_S", "2.0"),
    "retention_s": ("SEGSCOPE_DELAY_RETENTION_S", "60.0"),
    # how often closed seconds are looked for and published: up to this much is added to freshness
    "flush_interval_s": ("SEGSCOPE_DELAY_FLUSH_INTERVAL_S", "0.25"),
    "max_lines_per_message": ("SEGSCOPE_DELAY_MAX_LINES_PER_MESSAGE", "2000"),
    "datadir": ("SEGSCOPE_DELAY_DATADIR", ".run/processors/{app_id}"),
    # TAI - UTC in seconds for point timestamps; "host" = what this host's kernel says
    # (right where a PTP/NTP daemon maintains it; set 37 explicitly where none does)
    "tai_utc_offset_s": ("SEGSCOPE_TAI_UTC_OFFSET_S", "host"),
    # the newest stamp_delay line of each series every interval, for the topology processor (processors/newest.py)
    **newest_env(),
}


@dataclass(frozen=True)
class DelayConfig(EnvConfig):
    bootstrap: str
    records_topic: str
    metrics_topic: str
    deadletter_topic: str
    paths_topic: str
    app_id: str
    health: str
    stop_timeout_s: float
    grace_s: float
    idle_s: float
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
        if raw["tai_utc_offset_s"] == "host":
            raw["tai_utc_offset_s"] = str(host_tai_utc_offset_s())
        return raw

    def validate(self) -> None:
        check_newest(self, ENV, self.retention_s)
