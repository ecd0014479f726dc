"""Settings of the in-line processor, from environment variables (processors/runtime/config.py says why
environment; `python -m processors.inline --help` lists them with their defaults)."""

from __future__ import annotations

from dataclasses import dataclass

from processors.delay.aggregate import host_tai_utc_offset_s
from processors.newest import check_newest, newest_env
from processors.runtime.config import ConfigError, EnvConfig, processor_env
from segscope_schemas import names

ENV = {
    **processor_env("inline", "records_topic", "SEGSCOPE_TOPIC_IOAM_RECORDS", names.TOPIC_IOAM_RECORDS),
    # a second is published once the flow's newest transmit time is this far past the second's end
    # (data time: how far the egress receives a flow's packets out of transmit order); a later record
    # re-opens the second and it is published again (seconds_reemitted)
    "grace_s": ("SEGSCOPE_INLINE_GRACE_S", "0.5"),
    # a flow without records for this long (wall clock) has its open seconds closed by the clock
    "idle_s": ("SEGSCOPE_INLINE_IDLE_S", "2.0"),
    # the reorder window: a second stays open to late packets this long (data time) after its end;
    # a seq not received by then is lost for good, and the input behind it is committed then; above
    # the summary interval (10 s) so that the summary can be turned on with its defaults
    "retention_s": ("SEGSCOPE_INLINE_RETENTION_S", "15.0"),
    # how often closed seconds are looked for and published: up to this much is added to freshness
    "flush_interval_s": ("SEGSCOPE_INLINE_FLUSH_INTERVAL_S", "0.25"),
    "max_lines_per_message": ("SEGSCOPE_INLINE_MAX_LINES_PER_MESSAGE", "2000"),
    "datadir": ("SEGSCOPE_INLINE_DATADIR", ".run/processors/{app_id}"),
    # TAI - UTC in seconds for point timestamps; "host" = what this host's kernel says
    "tai_utc_offset_s": ("SEGSCOPE_TAI_UTC_OFFSET_S", "host"),
    # the newest inline_hop_delay line of each series every interval, for the topology processor
    # (processors/newest.py; its model keeps the newest point of each hop)
    **newest_env(),
}


@dataclass(frozen=True)
class InlineConfig(EnvConfig):
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
        if not 0 <= self.grace_s <= self.retention_s:
            raise ConfigError(
                f"need 0 <= {ENV['grace_s'][0]} <= {ENV['retention_s'][0]} (got {self.grace_s}, {self.retention_s})"
            )
        if self.flush_interval_s <= 0 or self.max_lines_per_message < 1:
            raise ConfigError(f"{ENV['flush_interval_s'][0]} must be > 0 and {ENV['max_lines_per_message'][0]} >= 1")
        check_newest(self, ENV, self.retention_s)
