"""The in-line processor's settings (processors/inline/config.py): defaults from the registry,
the health port, and settings refused with the variable and the fix."""

from __future__ import annotations

import pytest

from processors.inline.config import InlineConfig
from processors.worker import ConfigError
from segscope_schemas import names


def test_defaults():
    cfg = InlineConfig.from_env({"SEGSCOPE_TAI_UTC_OFFSET_S": "37"})
    assert (cfg.records_topic, cfg.app_id, cfg.paths_topic) == (
        names.TOPIC_IOAM_RECORDS,
        names.GROUP_INLINE,
        names.TOPIC_PATHS,
    )
    assert cfg.health_address() == ("127.0.0.1", 9644)
    assert (cfg.grace_s, cfg.idle_s, cfg.retention_s, cfg.tai_utc_offset_s) == (0.5, 2.0, 15.0, 37)
    assert cfg.datadir == f".run/processors/{names.GROUP_INLINE}"


@pytest.mark.parametrize(
    "env,variable",
    [
        ({"SEGSCOPE_INLINE_GRACE_S": "16"}, "SEGSCOPE_INLINE_GRACE_S"),
        (
            {"SEGSCOPE_TOPIC_METRICS_NEWEST": "segscope.metrics.newest", "SEGSCOPE_INLINE_RETENTION_S": "8"},
            "SEGSCOPE_SUMMARY_INTERVAL_S",
        ),
        ({"SEGSCOPE_INLINE_RETENTION_S": "ten"}, "SEGSCOPE_INLINE_RETENTION_S"),
        ({"SEGSCOPE_INLINE_FLUSH_INTERVAL_S": "0"}, "SEGSCOPE_INLINE_FLUSH_INTERVAL_S"),
        ({"SEGSCOPE_INLINE_HEALTH": "nowhere"}, "SEGSCOPE_INLINE_HEALTH"),
    ],
)
def test_bad_settings_name_their_variable(env, variable):
    with pytest.raises(ConfigError) as e:
        InlineConfig.from_env({"SEGSCOPE_TAI_UTC_OFFSET_S": "37", **env})
    assert variable in str(e.value)
