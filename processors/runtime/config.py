"""A processor's settings from the environment, its `python -m processors.<name>` command line and
the Faust settings every processor uses.

Environment variables are the one channel that works both for `faust -A processors.<name>.app
worker` (Faust imports the app module itself) and for `python -m processors.<name>`, which maps
its flags onto the same variables before importing the app. Each processor's config.py holds its
table ENV = {setting: (VARIABLE, default)}.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import socket
import sys
from typing import Callable

from processors.runtime import kafka_pacing
from processors.runtime.stopping import STOP_TIMEOUT_DEFAULT_S, STOP_TIMEOUT_VAR
from segscope_kafka import KafkaConfigError, faust_credentials
from segscope_kafka import from_env as kafka_security_from_env
from segscope_schemas import names
from segscope_schemas.health import HealthAddressError, parse_address
from segscope_schemas.version import VERSION_LINE

# each processor's health endpoint (segscope_schemas/health.py); SEGSCOPE_<NAME>_HEALTH overrides
HEALTH_PORTS = {"delay": 9641, "loss": 9642, "topology": 9643, "inline": 9644}


def worker_instance(environ: dict[str, str] | None = None) -> str:
    """The `instance` tag of this worker's segscope_processor / segscope_consumer lines:
    SEGSCOPE_INSTANCE (the pod name in Kubernetes, set by the Helm chart), else <hostname>-<pid>,
    which two workers on one host cannot share (schemas/metrics.md says what to set)."""
    env = os.environ if environ is None else environ
    return env.get("SEGSCOPE_INSTANCE", "").strip() or f"{socket.gethostname()}-{os.getpid()}"


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the variable and the fix."""


def env_number(env_table: dict[str, tuple[str, str]], raw: dict[str, str], name: str, kind):
    """raw[name] as `kind` (int, float), or ConfigError naming the variable and a valid value."""
    var = env_table[name][0]
    try:
        return kind(raw[name])
    except ValueError:
        raise ConfigError(
            f"environment variable {var}={raw[name]!r} is not a valid "
            f"{kind.__name__}; fix: set it to a number like {env_table[name][1]!r} "
            f"or unset it"
        ) from None


def processor_env(name: str, input_setting: str, input_var: str, input_topic: str) -> dict[str, tuple[str, str]]:
    """The settings every processor has: broker, its input topic, the metrics and dead-letter
    topics, its app id (also its consumer group id) and its Faust data dir. Topic and group
    defaults come from the name registry (schemas/names.toml)."""
    upper = name.upper()
    return {
        "bootstrap": ("SEGSCOPE_KAFKA_BOOTSTRAP", "127.0.0.1:19092"),
        input_setting: (input_var, input_topic),
        "metrics_topic": ("SEGSCOPE_TOPIC_METRICS", names.TOPIC_METRICS),
        "deadletter_topic": ("SEGSCOPE_TOPIC_DEADLETTER", names.TOPIC_DEADLETTER),
        "app_id": (f"SEGSCOPE_{upper}_APP_ID", names.GROUPS[name]),
        # HOST:PORT of /healthz /readyz /metrics /status; 0.0.0.0:PORT in a pod; 'off'; port 0 = any
        "health": (f"SEGSCOPE_{upper}_HEALTH", f"127.0.0.1:{HEALTH_PORTS[name]}"),
        # the `instance` tag of the worker's counters (worker_instance(); empty = <hostname>-<pid>)
        "instance": ("SEGSCOPE_INSTANCE", ""),
        # SID lists of the sessions and flows (schemas/paths.md), read whole by every worker
        "paths_topic": ("SEGSCOPE_TOPIC_PATHS", names.TOPIC_PATHS),
        # seconds a stop (SIGTERM, SIGINT) may take before the worker exits anyway (stopping.py)
        "stop_timeout_s": (STOP_TIMEOUT_VAR, STOP_TIMEOUT_DEFAULT_S),
    }


class EnvConfig:
    """Base of the processors' settings dataclasses. A subclass declares ENV = {setting:
    (VARIABLE, default)} and one dataclass field per setting; from_env() reads the variables,
    converts each by the field's declared type (str, int, float; a bad number is a ConfigError
    naming the variable), fills `{app_id}` in datadir, applies the SEGSCOPE_KAFKA alias, then
    calls the subclass's adjust() (derived values) and validate() (cross-setting rules)."""

    ENV: dict[str, tuple[str, str]] = {}

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None):
        env = os.environ if environ is None else environ
        raw = {name: env.get(var, default) for name, (var, default) in cls.ENV.items()}
        if "bootstrap" in cls.ENV and cls.ENV["bootstrap"][0] not in env and "SEGSCOPE_KAFKA" in env:
            raw["bootstrap"] = env["SEGSCOPE_KAFKA"]  # short alias
        raw = cls.adjust(raw, env)
        values = {}
        for f in dataclasses.fields(cls):
            kind = {"int": int, "float": float}.get(f.type if isinstance(f.type, str) else f.type.__name__)
            values[f.name] = env_number(cls.ENV, raw, f.name, kind) if kind else raw[f.name]
        if "datadir" in values:
            values["datadir"] = values["datadir"].format(app_id=values.get("app_id", ""))
        cfg = cls(**values)
        cfg.validate()
        if "health" in cls.ENV:
            cfg.health_address()
        return cfg

    @classmethod
    def adjust(cls, raw: dict[str, str], env) -> dict[str, str]:
        """Derive raw settings from others before conversion (default: none)."""
        return raw

    def validate(self) -> None:
        """Raise ConfigError for settings that are valid alone but not together (default: none)."""

    def health_address(self) -> tuple[str, int] | None:
        """The health endpoint's (host, port), or None when it is 'off'."""
        try:
            return parse_address(self.health, f"environment variable {self.ENV['health'][0]}")
        except HealthAddressError as e:
            raise ConfigError(str(e)) from None


def run_worker(
    package: str,
    doc: str,
    env_table: dict[str, tuple[str, str]],
    check: Callable[[], object] | None = None,
    argv: list[str] | None = None,
) -> None:
    """Parse one flag per setting (--blocks-topic for blocks_topic, ...), export the flags given
    as the settings' environment variables, refuse bad settings before Faust starts (`check`,
    e.g. Config.from_env), then run `<package>.app`'s worker without Faust's web server (it
    would bind 0.0.0.0:6066)."""
    ap = argparse.ArgumentParser(
        prog=f"python -m {package}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--version", action="version", version=VERSION_LINE)
    for name, (var, default) in env_table.items():
        ap.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            default=None,
            help=f"(env {var}, default {os.environ.get(var, default)})",
        )
    ap.add_argument("-l", "--loglevel", default="info", choices=["crit", "error", "warn", "info", "debug"])
    args = ap.parse_args(argv)
    for name, (var, _) in env_table.items():
        value = getattr(args, name)
        if value is not None:
            os.environ[var] = value
    if check is not None:
        try:
            check()
            kafka_security_from_env()  # SEGSCOPE_KAFKA_* (segscope_kafka): TLS, SASL
        except (ConfigError, KafkaConfigError) as e:
            ap.error(str(e))
    app = importlib.import_module(f"{package}.app").app  # after the environment is final
    sys.argv = [sys.argv[0], "worker", "--without-web", "-l", args.loglevel]
    app.main()


# a worker killed with -9 leaves its consumer group after this (HeartbeatLease relies on it too)
SESSION_TIMEOUT_S = 6.0


def faust_app_settings(bootstrap: str, datadir: str) -> dict:
    """Faust settings every segscope processor uses: raw bytes in and out (the wire formats are
    our own, schemas/), in-memory tables (state is rebuilt from the topics), one local broker
    replica, no web server (it would bind 0.0.0.0:6066), new consumer groups read from the start
    (a new processor sees what was published before it), small producer linger."""
    kafka_pacing.install()  # before the app makes its first Kafka client
    return dict(
        broker=";".join(f"kafka://{h.strip()}" for h in bootstrap.split(",")),
        # a stop on SIGTERM that waits for an unreachable Kafka ends at SEGSCOPE_STOP_TIMEOUT_S
        Worker="processors.runtime.stopping:Worker",
        store="memory://",
        key_serializer="raw",
        value_serializer="raw",
        topic_replication_factor=1,
        topic_partitions=1,
        datadir=datadir,
        web_enabled=False,
        consumer_auto_offset_reset="earliest",
        # a worker killed with -9 leaves the group after the session timeout; 6 s (the broker's
        # minimum) instead of Faust's 60 s lets the restarted one take its partitions over soon
        broker_session_timeout=SESSION_TIMEOUT_S,
        broker_heartbeat_interval=2.0,
        # the processors hold input unacked until its results are final (crash safety); a stop or
        # rebalance must not wait for those acks: what is not acked is replayed by the next owner
        stream_wait_empty=False,
        # acked offsets are committed every second (Faust: 2.8 s): less to replay after a crash
        broker_commit_interval=1.0,
        producer_linger_ms=5,
        # TLS / SASL from SEGSCOPE_KAFKA_* (segscope_kafka); None: PLAINTEXT
        broker_credentials=faust_credentials(),
    )
