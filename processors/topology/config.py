"""Settings of the topology processor, from environment variables (processors/worker.py says
why environment; `python -m processors.topology --help` lists them with their defaults)."""

from __future__ import annotations

from dataclasses import dataclass

from processors.worker import ConfigError, EnvConfig, processor_env
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
}


@dataclass(frozen=True)
class TopologyConfig(EnvConfig):
    bootstrap: str
    topology_topic: str
    metrics_topic: str
    deadletter_topic: str
    app_id: str
    health: str
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
