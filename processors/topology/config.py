"""Settings of the topology processor, from environment variables (processors/runtime/config.py says
why environment; `python -m processors.topology --help` lists them with their defaults)."""

from __future__ import annotations

from dataclasses import dataclass

from processors.newest import newest_env
from processors.runtime.config import ConfigError, EnvConfig, processor_env
from segscope_schemas import names

ENV = {
    **processor_env("topology", "topology_topic", "SEGSCOPE_TOPIC_TOPOLOGY", names.TOPIC_TOPOLOGY),
    "flush_interval_s": ("SEGSCOPE_TOPOLOGY_FLUSH_INTERVAL_S", "1.0"),
    "datadir": ("SEGSCOPE_TOPOLOGY_DATADIR", ".run/processors/{app_id}"),
    "arango_url": ("SEGSCOPE_ARANGO_URL", "http://127.0.0.1:8529"),
    "arango_user": ("SEGSCOPE_ARANGO_USER", "root"),
    "arango_password": ("SEGSCOPE_ARANGO_PASSWORD", ""),
    "arango_db": ("SEGSCOPE_ARANGO_DB", "segscope"),  # "jalapeno" by default in jalapeno mode
    "arango_auth": ("SEGSCOPE_ARANGO_AUTH", "basic"),  # basic | jwt
    "mode": ("SEGSCOPE_TOPOLOGY_MODE", "own"),  # own | jalapeno
    "protocol_id": ("SEGSCOPE_TOPOLOGY_PROTOCOL_ID", "200"),
    "domain_id": ("SEGSCOPE_TOPOLOGY_DOMAIN_ID", "0"),
    # jalapeno mode: Jalapeno's collections (igp-graph's names by default; schemas/topology.md)
    "jalapeno_nodes": ("SEGSCOPE_TOPOLOGY_JALAPENO_NODES", "igp_node"),
    "jalapeno_edges": ("SEGSCOPE_TOPOLOGY_JALAPENO_EDGES", "igpv6_graph"),
    # ip-graph's copies of the igpv6_graph edges (cmd/ip-graph --ipv6-graph); "" = leave it alone
    "jalapeno_ip_edges": ("SEGSCOPE_TOPOLOGY_JALAPENO_IP_EDGES", "ipv6_graph"),
    # gobmp-arango's SRv6 SIDs (with their SID structure): uSID containers of routers without an
    # agent are expanded from them; "" = do not read them
    "jalapeno_sids": ("SEGSCOPE_TOPOLOGY_JALAPENO_SIDS", "ls_srv6_sid"),
    # jalapeno mode: every annotation rewritten this often (igp-graph rewrites the TE fields from
    # each BGP-LS update); both modes: stale fields removed this often
    "refresh_s": ("SEGSCOPE_TOPOLOGY_REFRESH_S", "30"),
    # an edge measurement older than this is removed from the edge (0 = never)
    "stale_after_s": ("SEGSCOPE_TOPOLOGY_STALE_AFTER_S", "300"),
    # a single-hop STAMP delay gives a link's delay unless the link's in-line delay is newer by more
    # than this (schemas/topology.md, "Link delay: STAMP and in-line")
    "stamp_precedence_s": ("SEGSCOPE_TOPOLOGY_STAMP_PRECEDENCE_S", "30"),
    "batch_size": ("SEGSCOPE_ARANGO_BATCH_SIZE", "1000"),
    # Jalapeno's Kafka ("" = segscope's, SEGSCOPE_KAFKA) for the two optional outputs below
    "jalapeno_kafka": ("SEGSCOPE_TOPOLOGY_JALAPENO_KAFKA", ""),
    # gobmp.parsed.ls_link_events-style events for each annotated igpv6_graph edge; "" = off
    # (processors/topology/link_events.py; gobmp-arango's name is gobmp.parsed.ls_link_events)
    "jalapeno_link_events_topic": ("SEGSCOPE_TOPOLOGY_JALAPENO_LINK_EVENTS_TOPIC", ""),
    # segscope.metrics lines forwarded as line protocol to Jalapeno's telegraf-egress topic;
    # "" = off (processors/topology/telemetry.py; Jalapeno's name is jalapeno.telemetry)
    "jalapeno_telemetry_topic": ("SEGSCOPE_TOPOLOGY_JALAPENO_TELEMETRY_TOPIC", ""),
    # which measurements to forward, comma-separated; "*" = every line
    "jalapeno_telemetry_measurements": (
        "SEGSCOPE_TOPOLOGY_JALAPENO_TELEMETRY_MEASUREMENTS",
        "stamp_delay,altmark_loss",
    ),
    # the delay and loss processors' summary (processors/newest.py): when set, the measurements are read
    # from it instead of segscope.metrics (the newest point of each series every summary interval)
    **newest_env(),
}


@dataclass(frozen=True)
class TopologyConfig(EnvConfig):
    bootstrap: str
    topology_topic: str
    metrics_topic: str
    deadletter_topic: str
    app_id: str
    health: str
    stop_timeout_s: float
    flush_interval_s: float
    datadir: str
    arango_url: str
    arango_user: str
    arango_password: str
    arango_db: str
    arango_auth: str
    mode: str
    protocol_id: int
    domain_id: int
    jalapeno_nodes: str
    jalapeno_edges: str
    jalapeno_ip_edges: str
    jalapeno_sids: str
    refresh_s: float
    stale_after_s: float
    stamp_precedence_s: float
    batch_size: int
    jalapeno_kafka: str
    jalapeno_link_events_topic: str
    jalapeno_telemetry_topic: str
    jalapeno_telemetry_measurements: str
    newest_topic: str
    summary_interval_s: float

    ENV = ENV

    @classmethod
    def adjust(cls, raw, env):
        if raw["mode"] == "jalapeno" and ENV["arango_db"][0] not in env:
            raw["arango_db"] = "jalapeno"
        return raw

    def validate(self) -> None:
        if self.arango_auth not in ("basic", "jwt"):
            raise ConfigError(f"{ENV['arango_auth'][0]}={self.arango_auth!r}: use 'basic' or 'jwt'")
        if self.mode not in ("own", "jalapeno"):
            raise ConfigError(f"{ENV['mode'][0]}={self.mode!r}: use 'own' or 'jalapeno'")
        if self.refresh_s <= 0:
            raise ConfigError(f"{ENV['refresh_s'][0]}={self.refresh_s}: use a period > 0 s, e.g. 30")
        if self.stale_after_s < 0:
            raise ConfigError(f"{ENV['stale_after_s'][0]}={self.stale_after_s}: use an age >= 0 s (0 = never)")
        if self.stamp_precedence_s <= 0:
            raise ConfigError(
                f"{ENV['stamp_precedence_s'][0]}={self.stamp_precedence_s}: use an age > 0 s, e.g. 30"
                " (a running session's newest point is a few seconds behind the in-line one)"
            )
        if self.stale_after_s and self.stale_after_s <= self.refresh_s:
            raise ConfigError(
                f"{ENV['stale_after_s'][0]}={self.stale_after_s} must exceed {ENV['refresh_s'][0]}={self.refresh_s}"
                " (a value is expired only at a refresh), e.g. 10 x the refresh period"
            )
        if (
            self.jalapeno_telemetry_topic
            and not self.telemetry_measurements()
            and self.jalapeno_telemetry_measurements != "*"
        ):
            raise ConfigError(
                f"{ENV['jalapeno_telemetry_measurements'][0]} is empty: "
                "list measurements (e.g. stamp_delay,altmark_loss) or '*'"
            )
        if self.jalapeno_link_events_topic and self.mode != "jalapeno":
            # the events name igpv6_graph edges, which own mode never writes: nothing would be sent
            raise ConfigError(
                f"{ENV['jalapeno_link_events_topic'][0]}={self.jalapeno_link_events_topic!r} is only used in "
                f"jalapeno mode ({ENV['mode'][0]}={self.mode!r}): set {ENV['mode'][0]}=jalapeno, "
                f"or unset {ENV['jalapeno_link_events_topic'][0]}"
            )
        if self.newest_topic:
            self.check_summary()
        if self.batch_size < 1:
            raise ConfigError(f"{ENV['batch_size'][0]}={self.batch_size}: use a batch size >= 1, e.g. 1000")
        if self.jalapeno_kafka:  # Jalapeno's own cluster: its own security settings (jalapeno_kafka.py)
            from processors.topology.jalapeno_kafka import JALAPENO_SECURITY_PREFIX
            from segscope_kafka import KafkaConfigError, from_env

            try:
                from_env(prefix=JALAPENO_SECURITY_PREFIX)
            except KafkaConfigError as e:
                raise ConfigError(str(e)) from None

    def check_summary(self) -> None:
        topic = f"{ENV['newest_topic'][0]}={self.newest_topic!r}"
        if self.newest_topic in (self.metrics_topic, self.topology_topic):
            raise ConfigError(f"{topic} is an input topic already: use its own topic, e.g. segscope.metrics.newest")
        if self.jalapeno_telemetry_topic:
            # the forwarding sends every line it reads: from the summary, one point per series and interval
            raise ConfigError(
                f"{topic} and {ENV['jalapeno_telemetry_topic'][0]}={self.jalapeno_telemetry_topic!r}: the "
                "telemetry forwarding needs every segscope.metrics line, the summary holds one per series and "
                f"interval; unset {ENV['jalapeno_telemetry_topic'][0]} (forward with a Telegraf or MirrorMaker "
                f"of segscope.metrics instead) or unset {ENV['newest_topic'][0]}"
            )
        if self.summary_interval_s >= self.stamp_precedence_s:
            # the delay and in-line workers' summaries come up to an interval apart: a running STAMP
            # session's newest point can be that much older than the in-line one
            raise ConfigError(
                f"{ENV['summary_interval_s'][0]}={self.summary_interval_s} must be below "
                f"{ENV['stamp_precedence_s'][0]}={self.stamp_precedence_s} (else a running STAMP session "
                "can lose the link's delay to the in-line one between two summaries): lower the one or raise the other"
            )
        if not 0 < self.summary_interval_s < self.refresh_s:
            raise ConfigError(
                f"{ENV['summary_interval_s'][0]}={self.summary_interval_s} must be below "
                f"{ENV['refresh_s'][0]}={self.refresh_s} (the measured values are that much older): "
                "lower the one or raise the other"
            )

    def measures_topic(self) -> str:
        """Where the stamp_delay / altmark_loss lines are read: the summary when there is one."""
        return self.newest_topic or self.metrics_topic

    def telemetry_measurements(self) -> frozenset[str] | None:
        """The measurements to forward to jalapeno.telemetry; None = all."""
        if self.jalapeno_telemetry_measurements.strip() == "*":
            return None
        return frozenset(m.strip() for m in self.jalapeno_telemetry_measurements.split(",") if m.strip())
