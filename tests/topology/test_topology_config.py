"""Settings of the topology processor (processors/topology/config.py)."""

from __future__ import annotations

import pytest

from processors.topology.config import ConfigError, TopologyConfig


def test_defaults_follow_the_contract():
    c = TopologyConfig.from_env({})
    assert (c.bootstrap, c.topology_topic, c.metrics_topic, c.deadletter_topic) == (
        "127.0.0.1:19092",
        "segscope.topology",
        "segscope.metrics",
        "segscope.deadletter",
    )
    assert (c.arango_url, c.arango_db, c.arango_user, c.arango_auth, c.mode) == (
        "http://127.0.0.1:8529",
        "segscope",
        "root",
        "basic",
        "own",
    )
    assert (c.protocol_id, c.domain_id, c.flush_interval_s) == (200, 0, 1.0)
    assert c.datadir == ".run/processors/segscope-topology"
    # Jalapeno's collections as igp-graph's code creates them (the edges are named like the graph)
    assert (c.jalapeno_nodes, c.jalapeno_edges) == ("igp_node", "igpv6_graph")
    # ip-graph's copies (cmd/ip-graph --ipv6-graph)
    assert c.jalapeno_ip_edges == "ipv6_graph"
    # refreshed well within igp-graph's rewrites; expired after 10 refreshes; ArangoDB's batch size
    assert (c.refresh_s, c.stale_after_s, c.batch_size) == (30.0, 300.0, 1000)
    # a single-hop STAMP delay gives a link's delay until the in-line one is 30 s newer
    assert c.stamp_precedence_s == 30.0
    # the optional outputs to Jalapeno's Kafka are off
    assert (c.jalapeno_kafka, c.jalapeno_link_events_topic, c.jalapeno_telemetry_topic) == ("", "", "")
    assert c.jalapeno_telemetry_measurements == "stamp_delay,altmark_loss"
    c = TopologyConfig.from_env({"SEGSCOPE_TOPOLOGY_JALAPENO_EDGES": "igpv6_graph_edge"})
    assert c.jalapeno_edges == "igpv6_graph_edge"


def test_jalapeno_mode_defaults_to_the_jalapeno_database_unless_told():
    assert TopologyConfig.from_env({"SEGSCOPE_TOPOLOGY_MODE": "jalapeno"}).arango_db == "jalapeno"
    assert (
        TopologyConfig.from_env({"SEGSCOPE_TOPOLOGY_MODE": "jalapeno", "SEGSCOPE_ARANGO_DB": "jal2"}).arango_db
        == "jal2"
    )
    assert TopologyConfig.from_env({"SEGSCOPE_KAFKA": "h:1"}).bootstrap == "h:1"


@pytest.mark.parametrize(
    "env,needle",
    [
        ({"SEGSCOPE_TOPOLOGY_MODE": "both"}, "SEGSCOPE_TOPOLOGY_MODE"),
        ({"SEGSCOPE_ARANGO_AUTH": "token"}, "SEGSCOPE_ARANGO_AUTH"),
        ({"SEGSCOPE_TOPOLOGY_PROTOCOL_ID": "x"}, "SEGSCOPE_TOPOLOGY_PROTOCOL_ID"),
        ({"SEGSCOPE_TOPOLOGY_FLUSH_INTERVAL_S": "soon"}, "SEGSCOPE_TOPOLOGY_FLUSH_INTERVAL_S"),
        ({"SEGSCOPE_TOPOLOGY_STAMP_PRECEDENCE_S": "0"}, "SEGSCOPE_TOPOLOGY_STAMP_PRECEDENCE_S=0.0: use an age > 0"),
        ({"SEGSCOPE_TOPOLOGY_STAMP_PRECEDENCE_S": "half"}, "SEGSCOPE_TOPOLOGY_STAMP_PRECEDENCE_S"),
        # with the summary, the delay and in-line workers' lines come up to an interval apart
        (
            {"SEGSCOPE_TOPIC_METRICS_NEWEST": "s.n", "SEGSCOPE_TOPOLOGY_STAMP_PRECEDENCE_S": "10"},
            "SEGSCOPE_SUMMARY_INTERVAL_S=10.0 must be below SEGSCOPE_TOPOLOGY_STAMP_PRECEDENCE_S=10.0",
        ),
        # own mode annotates no igpv6_graph edge: a link events topic would silently send nothing
        (
            {"SEGSCOPE_TOPOLOGY_JALAPENO_LINK_EVENTS_TOPIC": "gobmp.parsed.ls_link_events"},
            "SEGSCOPE_TOPOLOGY_JALAPENO_LINK_EVENTS_TOPIC='gobmp.parsed.ls_link_events' is only used in jalapeno "
            "mode .* set SEGSCOPE_TOPOLOGY_MODE=jalapeno",
        ),
    ],
)
def test_bad_settings_name_the_variable(env, needle):
    with pytest.raises(ConfigError, match=needle):
        TopologyConfig.from_env(env)


def test_link_events_are_accepted_in_jalapeno_mode():
    c = TopologyConfig.from_env(
        {
            "SEGSCOPE_TOPOLOGY_MODE": "jalapeno",
            "SEGSCOPE_TOPOLOGY_JALAPENO_LINK_EVENTS_TOPIC": "gobmp.parsed.ls_link_events",
        }
    )
    assert c.jalapeno_link_events_topic == "gobmp.parsed.ls_link_events"
    # telemetry is line protocol, useful in both modes
    assert TopologyConfig.from_env({"SEGSCOPE_TOPOLOGY_JALAPENO_TELEMETRY_TOPIC": "t"}).jalapeno_telemetry_topic == "t"
