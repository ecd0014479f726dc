"""Settings of the topology processor, from environment variables (flags of `python -m
processors.topology` map onto them, as for processors/delay)."""
from __future__ import annotations

import os
from dataclasses import dataclass

from processors.worker import ConfigError, env_number  # noqa: F401 (ConfigError: part of this module's API)

ENV = {
    "bootstrap": ("SEGSCOPE_KAFKA_BOOTSTRAP", "127.0.0.1:19092"),
    "topology_topic": ("SEGSCOPE_TOPIC_TOPOLOGY", "segscope.topology"),
    "metrics_topic": ("SEGSCOPE_TOPIC_METRICS", "segscope.metrics"),
    "deadletter_topic": ("SEGSCOPE_TOPIC_DEADLETTER", "segscope.deadletter"),
    "app_id": ("SEGSCOPE_TOPOLOGY_APP_ID", "segscope-topology"),     # also the consumer group id
    "flush_interval_s": ("SEGSCOPE_TOPOLOGY_FLUSH_INTERVAL_S", "1.0"),
    "datadir": ("SEGSCOPE_TOPOLOGY_DATADIR", ".run/processors/{app_id}"),
    "arango_url": ("SEGSCOPE_ARANGO_URL", "http://127.0.0.1:8529"),
    "arango_user": ("SEGSCOPE_ARANGO_USER", "root"),
    "arango_password": ("SEGSCOPE_ARANGO_PASSWORD", ""),
    "arango_db": ("SEGSCOPE_ARANGO_DB", "segscope"),
    "arango_auth": ("SEGSCOPE_ARANGO_AUTH", "basic"),                # basic | jwt
    "mode": ("SEGSCOPE_TOPOLOGY_MODE", "own"),                      # own | jalapeno
    "protocol_id": ("SEGSCOPE_TOPOLOGY_PROTOCOL_ID", "200"),
    "domain_id": ("SEGSCOPE_TOPOLOGY_DOMAIN_ID", "0"),
}


@dataclass(frozen=True)
class TopologyConfig:
    bootstrap: str
    topology_topic: str
    metrics_topic: str
    deadletter_topic: str
    app_id: str
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

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "TopologyConfig":
        env = os.environ if environ is None else environ
        raw = {name: env.get(var, default) for name, (var, default) in ENV.items()}
        if ENV["bootstrap"][0] not in env and "SEGSCOPE_KAFKA" in env:
            raw["bootstrap"] = env["SEGSCOPE_KAFKA"]

        def number(name, kind):
            return env_number(ENV, raw, name, kind)
        if raw["arango_auth"] not in ("basic", "jwt"):
            raise ConfigError(f"{ENV['arango_auth'][0]}={raw['arango_auth']!r}: use 'basic' or 'jwt'")
        if raw["mode"] not in ("own", "jalapeno"):
            raise ConfigError(f"{ENV['mode'][0]}={raw['mode']!r}: use 'own' or 'jalapeno'")
        if raw["mode"] == "jalapeno" and ENV["arango_db"][0] not in env:
            raw["arango_db"] = "jalapeno"
        return cls(bootstrap=raw["bootstrap"], topology_topic=raw["topology_topic"],
                   metrics_topic=raw["metrics_topic"], deadletter_topic=raw["deadletter_topic"],
                   app_id=raw["app_id"], flush_interval_s=number("flush_interval_s", float),
                   datadir=raw["datadir"].format(app_id=raw["app_id"]), arango_url=raw["arango_url"],
                   arango_user=raw["arango_user"], arango_password=raw["arango_password"],
                   arango_db=raw["arango_db"], arango_auth=raw["arango_auth"], mode=raw["mode"], protocol_id=number("protocol_id", int),
                   domain_id=number("domain_id", int))
