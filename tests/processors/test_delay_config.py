"""Settings of the delay processor come from the environment, with the contract's defaults."""

from processors.delay.config import DelayConfig


def test_defaults_follow_the_contract():
    c = DelayConfig.from_env({})
    assert (c.bootstrap, c.records_topic, c.metrics_topic, c.deadletter_topic) == (
        "127.0.0.1:19092",
        "segscope.stamp.records",
        "segscope.metrics",
        "segscope.deadletter",
    )
    assert c.grace_s == 0.5 and c.idle_s == 2.0 and c.retention_s == 60.0 and c.flush_interval_s == 0.25
    assert c.datadir == ".run/processors/segscope-delay"


def test_environment_overrides_and_alias():
    assert DelayConfig.from_env({"SEGSCOPE_KAFKA": "127.0.0.1:1"}).bootstrap == "127.0.0.1:1"
    c = DelayConfig.from_env(
        {
            "SEGSCOPE_KAFKA": "127.0.0.1:1",
            "SEGSCOPE_KAFKA_BOOTSTRAP": "127.0.0.1:2",
            "SEGSCOPE_TOPIC_METRICS": "m",
            "SEGSCOPE_DELAY_GRACE_S": "1.5",
            "SEGSCOPE_DELAY_APP_ID": "x",
        }
    )
    assert c.bootstrap == "127.0.0.1:2" and c.metrics_topic == "m" and c.grace_s == 1.5
    assert c.datadir == ".run/processors/x"


def test_bad_number_names_the_variable_and_the_fix():
    import pytest

    from processors.delay.config import ConfigError

    with pytest.raises(ConfigError, match=r"SEGSCOPE_DELAY_GRACE_S='two'.*fix: set it to a number"):
        DelayConfig.from_env({"SEGSCOPE_DELAY_GRACE_S": "two"})


def test_tai_utc_offset_from_env_or_host():
    import time

    assert DelayConfig.from_env({"SEGSCOPE_TAI_UTC_OFFSET_S": "37"}).tai_utc_offset_s == 37
    host = round((time.clock_gettime_ns(time.CLOCK_TAI) - time.time_ns()) / 1e9)
    assert DelayConfig.from_env({}).tai_utc_offset_s == host
