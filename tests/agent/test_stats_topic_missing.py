"""The agent's stats thread when its topic does not exist yet (a pod that starts before the
chart's topics Job-like init containers made them; the broker does not auto-create topics): each
tick is counted metrics_failed and the thread lives on, publishing once the topic exists. A dead
thread left the agent's /readyz failing for good."""

from __future__ import annotations

import time

from agent.metrics import AgentCounters, StatsPublisher
from tests.isolation import own_name


def wait_for(predicate, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def test_stats_thread_survives_a_missing_topic_and_publishes_once_it_exists(stack):
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = own_name("segscope.metrics.late")
    admin = AdminClient({"bootstrap.servers": stack.kafka_bootstrap})
    counters = AgentCounters()
    pub = StatsPublisher("late", stack.kafka_bootstrap, lambda: [], counters, interval_s=0.2, topic=topic)
    pub.start()
    try:
        # librdkafka holds the first lines up to topic.metadata.propagation.max.ms (30 s), then
        # fails them (delivery reports) and refuses the next produce() calls with _UNKNOWN_TOPIC
        assert wait_for(lambda: counters.snapshot()["metrics_failed"] >= 3, 90), counters.snapshot()
        assert pub._thread.is_alive(), "the stats thread died on a missing topic"
        admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(30)
        assert wait_for(lambda: counters.snapshot()["metrics_produced"] >= 3, 30), counters.snapshot()
    finally:
        pub.stop()
        admin.delete_topics([topic])[topic].result(30)
