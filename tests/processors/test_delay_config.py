"""Settings of the delay processor come from the environment, with the contract's defaults."""
from processors.delay.config import DelayConfig


def test_defaults_follow_the_contract():
    c = DelayConfig.from_env({})
    assert (c.bootstrap, c.records_topic, c.metrics_topic, c.deadletter_topic) == (
        "127.0.0.1:19092", "segscope.stamp.records", "segscope.metrics", "segscope.deadletter")
    assert c.grace_s == 2.0 and c.retention_s == 60.0 and c.flush_interval_s == 1.0
    assert c.datadir == ".run/processors/segscope-delay"


def test_environment_overrides_and_alias():
    assert DelayConfig.from_env({"SEGSCOPE_KAFKA": "127.0.0.1:1"}).bootstrap == "127.0.0.1:1"
    c = DelayConfig.from_env({"SEGSCOPE_KAFKA": "127.0.0.1:1", "SEGSCOPE_KAFKA_BOOTSTRAP": "127.0.0.1:2",
                              "SEGSCOPE_TOPIC_METRICS": "m", "SEGSCOPE_DELAY_GRACE_S": "0.5",
                              "SEGSCOPE_DELAY_APP_ID": "x"})
    assert c.bootstrap == "127.0.0.1:2" and c.metrics_topic == "m" and c.grace_s == 0.5
    assert c.datadir == ".run/processors/x"
