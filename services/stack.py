"""Local segscope services: Kafka (KRaft), InfluxDB 1.x and Telegraf, run as plain processes.

    .local/venv/bin/python -m services.stack up|down|status [--only kafka,influxdb,telegraf]
                                                           [--run-dir DIR] [--port-base N]
                                                           [--kafka-security plaintext|sasl_ssl]

Each service gets a directory under the run dir (default .run/services) with its rendered
config, a PID file, a log file and its data. Default endpoints (port_base None):

    Kafka     127.0.0.1:19092 (controller 19093)
    InfluxDB  http://127.0.0.1:18086 (rpc 18088), database from schemas/names.toml
    Telegraf  consumer group GROUP_TELEGRAF on the metrics topic -> InfluxDB

With a port base N (for a second, isolated stack): Kafka N, controller N+1, InfluxDB HTTP N+2,
InfluxDB rpc N+3.

Python API:

    with Stack(run_dir=".run/sv-x", port_base=29000) as stack:     # up() ... down()
        stack.kafka_bootstrap, stack.influx_url, stack.influx_db
        stack.influx_write(["m,t=a v=1i 1700000000000000000"])
        stack.influx_query("SELECT * FROM m")   # -> [{"time": 1700000000000000000, "t": "a", "v": 1}]

`up` is idempotent: a service whose PID is alive and which answers is reused. A service started
from stopped keeps its data (Kafka's topics and offsets, InfluxDB's database), also after a crash;
fresh=True (`--fresh`) wipes it first (the tests start so: empty topics, an empty database).
`status` says Kafka is ready only when every registry topic has a serving leader.
kafka_security="sasl_ssl" (`--kafka-security sasl_ssl`) starts Kafka with a SASL_SSL listener, ACLs and
a user per role (services/kafka/security.py); stack.kafka_env(role) gives a program of that role its
SEGSCOPE_KAFKA_* settings, and Telegraf logs in as the telegraf role.
Progress goes to stderr, one line per step with its duration.

This file only orders the services and holds the CLI; each service's start and readiness is in
services/<service>/<service>.py, process supervision in supervise.py, run-dir locking in leases.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from segscope_schemas.names import GROUP_TELEGRAF, TOPIC_METRICS, TOPIC_PARTITIONS
from segscope_schemas.version import VERSION_LINE
from services.influxdb.influxdb import InfluxDB
from services.kafka.kafka import Kafka
from services.leases import Leases, RunDirLock
from services.supervise import Service, StackError, port_open
from services.telegraf.telegraf import Telegraf

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RUN_DIR = REPO_ROOT / ".run" / "services"

SERVICE_NAMES = ("kafka", "influxdb", "telegraf")  # start order; stop order is the reverse
# plaintext: no TLS, no login, no ACLs; sasl_ssl: services/kafka/security.py (a user per role, ACLs)
KAFKA_SECURITY_MODES = ("plaintext", "sasl_ssl")
# re-exported for callers of this module (the registry is the one place they are defined)
METRICS_TOPIC = TOPIC_METRICS
TELEGRAF_GROUP = GROUP_TELEGRAF
__all__ = [
    "Stack",
    "StackError",
    "Ports",
    "SERVICE_NAMES",
    "TOPIC_PARTITIONS",
    "METRICS_TOPIC",
    "TELEGRAF_GROUP",
    "port_open",
    "main",
]


@dataclass(frozen=True)
class Ports:
    kafka: int
    kafka_controller: int
    influx_http: int
    influx_rpc: int

    @classmethod
    def for_base(cls, port_base: int | None) -> "Ports":
        if port_base is None:
            return cls(kafka=19092, kafka_controller=19093, influx_http=18086, influx_rpc=18088)
        return cls(kafka=port_base, kafka_controller=port_base + 1, influx_http=port_base + 2, influx_rpc=port_base + 3)


class Stack:
    """Kafka + InfluxDB + Telegraf under one run dir and one set of ports."""

    def __init__(
        self,
        run_dir: str | os.PathLike | None = None,
        port_base: int | None = None,
        *,
        fresh: bool = False,
        quiet: bool = False,
        kafka_security: str | None = None,
    ) -> None:
        self.run_dir = Path(run_dir).resolve() if run_dir else DEFAULT_RUN_DIR
        self.port_base = port_base
        self.ports = Ports.for_base(port_base)
        self.fresh = fresh
        self.quiet = quiet
        self.kafka_security = (kafka_security or "plaintext").lower()
        if self.kafka_security not in KAFKA_SECURITY_MODES:
            raise StackError(f"kafka_security={kafka_security!r}: use one of {', '.join(KAFKA_SECURITY_MODES)}")
        kafka = Kafka(
            self.run_dir,
            self._say,
            self.ports.kafka,
            self.ports.kafka_controller,
            fresh=fresh,
            security=self.kafka_security == "sasl_ssl",
        )
        influxdb = InfluxDB(self.run_dir, self._say, self.ports.influx_http, self.ports.influx_rpc, keep_data=not fresh)
        self.services: dict[str, Service] = {
            "kafka": kafka,
            "influxdb": influxdb,
            "telegraf": Telegraf(self.run_dir, self._say, kafka, influxdb),
        }
        self.kafka_bootstrap = kafka.bootstrap
        self.influx_url = influxdb.url
        self.influx_db = influxdb.db
        self.started: set[str] = set()  # services this object started (not reused)
        self.last_up_seconds: float | None = None  # wall time of the last up() / down()
        self.last_down_seconds: float | None = None
        self._lock = RunDirLock(self.run_dir, self._say)
        self._leases = Leases(self.run_dir)

    # ------------------------------------------------------------------ paths and PIDs
    def service_dir(self, name: str) -> Path:
        return self.services[name].dir

    def log_path(self, name: str) -> Path:
        return self.services[name].log_path

    def pid_path(self, name: str) -> Path:
        return self.services[name].pid_path

    def read_pid(self, name: str) -> int | None:
        return self.services[name].read_pid()

    def running_pid(self, name: str) -> int | None:
        return self.services[name].running_pid()

    def _say(self, msg: str) -> None:
        if not self.quiet:
            print(f"[stack] {msg}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ public API
    def up(self, only: Iterable[str] | None = None) -> "Stack":
        """Start (or reuse) the selected services in dependency order and wait until ready.

        Holds the run dir's lock, so concurrent `up`/`down` calls on one run dir (two test
        sessions, a CLI call) take turns instead of racing for the same ports and PID files."""
        with self._lock.held():
            return self._up(self._select(only))

    def down(self, only: Iterable[str] | None = None) -> None:
        """Stop the selected services by PID (SIGTERM, then SIGKILL after a timeout)."""
        with self._lock.held():
            self._down(self._select(only))

    @contextmanager
    def shared(self, only: Iterable[str] | None = None) -> Iterator["Stack"]:
        """up() for one of several concurrent users (e.g. pytest sessions) of the same run dir.

        Each user holds a lease file (its PID) while inside the block. The last user to leave
        stops the services that any user started; services that were already running before the
        first user came (a manual `up`) keep running. If up() fails, what it started is stopped."""
        selected = self._select(only)
        with self._lock.held():
            try:
                self._up(selected)
            except BaseException:
                if not self._leases.holders(exclude_mine=True):
                    self._down(set(self.started))
                raise
            self._leases.take()
            self._leases.remember_started(self.started)
        try:
            yield self
        finally:
            with self._lock.held():
                self._leases.release()
                if not self._leases.holders(exclude_mine=True):
                    self._down(self._leases.remember_started(set()) | self.started)
                    self._leases.forget_started()

    def lease_holders(self) -> list[int]:
        """PIDs of live processes inside Stack.shared() on this run dir."""
        return self._leases.holders()

    def status(self) -> dict[str, dict]:
        """Per service: pid (or None), alive, ready (answers its readiness check), log path."""
        result: dict[str, dict] = {}
        for name, svc in self.services.items():
            pid = svc.running_pid()
            result[name] = {
                "pid": pid,
                "alive": pid is not None,
                "ready": pid is not None and svc.ready(timeout=3.0),
                "log": str(svc.log_path),
            }
        if result["kafka"]["ready"]:
            try:
                unusable = self.services["kafka"].topics_unusable()
            except Exception as exc:  # noqa: BLE001 - any client error: not usable
                unusable = [f"({exc})"]
            if unusable:  # the broker answers, but producers to these topics would fail
                result["kafka"]["ready"] = False
                result["kafka"]["topics_unusable"] = unusable
        result["kafka"]["bootstrap"] = self.kafka_bootstrap
        result["influxdb"]["url"] = self.influx_url
        result["influxdb"]["database"] = self.influx_db
        result["telegraf"]["consumer_group"] = TELEGRAF_GROUP
        return result

    def kafka_env(self, role: str = "admin") -> dict[str, str]:
        """The SEGSCOPE_KAFKA_* settings of a program of `role` (agent, processor, telegraf, admin)
        on this stack's Kafka: {} when it is plaintext."""
        return self.services["kafka"].client_env(role)

    def endpoints(self) -> dict:
        out = {
            "kafka_bootstrap": self.kafka_bootstrap,
            "influx_url": self.influx_url,
            "influx_db": self.influx_db,
            "run_dir": str(self.run_dir),
        }
        sec = self.services["kafka"].security
        if sec is not None:
            from segscope_kafka.acls import ROLES

            out["kafka_security"] = self.kafka_security
            # `set -a; . FILE; set +a` gives a shell the settings of a program of that role
            out["kafka_client_settings"] = {r: str(sec.role_dir(r) / "kafka.env") for r in ROLES}
        return out

    def __enter__(self) -> "Stack":
        try:
            return self.up()
        except BaseException:
            self.down(only=self.started)
            raise

    def __exit__(self, *exc_info) -> None:
        self.down()

    def influx_query(self, query: str, db: str | None = None, timeout: float = 10.0) -> list[dict]:
        """InfluxQL via /query (epoch=ns); rows of every series as dicts (columns + GROUP BY tags)."""
        return self.services["influxdb"].query(query, db=db, timeout=timeout)

    def influx_query_settled(self, query: str, db: str | None = None, settle_s: float = 1.0) -> list[dict]:
        """InfluxQL rows of points that were completely written (see InfluxDB.query_settled): for
        asserting every field of rows a running writer is still adding to."""
        return self.services["influxdb"].query_settled(query, db=db, settle_s=settle_s)

    def influx_write(
        self, lines: str | Iterable[str], db: str | None = None, precision: str = "ns", timeout: float = 10.0
    ) -> None:
        """Line protocol via /write; raises StackError with InfluxDB's message on rejection."""
        self.services["influxdb"].write(lines, db=db, precision=precision, timeout=timeout)

    # ------------------------------------------------------------------ ordering
    @staticmethod
    def _select(only: Iterable[str] | None) -> set[str]:
        if only is None:
            return set(SERVICE_NAMES)
        names = {n.strip() for n in only if n.strip()}
        unknown = names - set(SERVICE_NAMES)
        if unknown:
            raise StackError(f"unknown service(s) {sorted(unknown)}; known: {', '.join(SERVICE_NAMES)}")
        return names

    def _up(self, selected: set[str]) -> "Stack":
        t_total = time.monotonic()
        for name in selected:
            self.service_dir(name).mkdir(parents=True, exist_ok=True)
        restarted: set[str] = set()
        for name in SERVICE_NAMES:
            if name not in selected:
                continue
            svc = self.services[name]
            if name == "telegraf" and restarted & {"kafka", "influxdb"}:
                # Telegraf's group offsets and output target lived in the old data dirs.
                self._stop(name)
            if not svc.reuse():
                t0 = time.monotonic()
                try:
                    svc.start()
                except BaseException:
                    self._stop(name)  # never leave a half-started process behind
                    raise
                restarted.add(name)
                self.started.add(name)
                self._say(f"{name}: ready in {time.monotonic() - t0:.1f} s (pid {svc.read_pid()}, log {svc.log_path})")
            # Topics and database exist before Telegraf joins, so it never sees them missing.
            svc.after_ready()
        self.last_up_seconds = time.monotonic() - t_total
        self._say(f"up: {','.join(n for n in SERVICE_NAMES if n in selected)} in {self.last_up_seconds:.1f} s")
        return self

    def _down(self, selected: set[str]) -> None:
        t_total = time.monotonic()
        for name in reversed(SERVICE_NAMES):
            if name in selected:
                self._stop(name)
        self.last_down_seconds = time.monotonic() - t_total
        self._say(f"down: {self.last_down_seconds:.1f} s")

    def _stop(self, name: str) -> None:
        self.services[name].stop()
        self.started.discard(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.stack", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=VERSION_LINE)
    parser.add_argument("command", choices=("up", "down", "status"))
    parser.add_argument("--only", help="comma-separated subset of: " + ",".join(SERVICE_NAMES))
    parser.add_argument("--run-dir", help=f"state directory (default {DEFAULT_RUN_DIR.relative_to(REPO_ROOT)})")
    parser.add_argument(
        "--port-base",
        type=int,
        help="Kafka N, controller N+1, InfluxDB N+2, rpc N+3 (default: 19092/19093/18086/18088)",
    )
    parser.add_argument(
        "--fresh", action="store_true", help="up: wipe the data of each service started from stopped (topics, database)"
    )
    parser.add_argument(
        "--if-unused", action="store_true", help="down: do nothing while a test session holds a lease on the run dir"
    )
    parser.add_argument(
        "--kafka-security",
        choices=KAFKA_SECURITY_MODES,
        default=os.environ.get("SEGSCOPE_STACK_KAFKA_SECURITY", "plaintext"),
        help="Kafka's listener: plaintext (default), or sasl_ssl: TLS, SASL, ACLs and a user per role "
        "(services/kafka/security.py; env SEGSCOPE_STACK_KAFKA_SECURITY)",
    )
    args = parser.parse_args(argv)
    only = args.only.split(",") if args.only else None
    try:
        stack = Stack(
            run_dir=args.run_dir, port_base=args.port_base, fresh=args.fresh, kafka_security=args.kafka_security
        )
    except StackError as exc:
        print(f"[stack] ERROR: {exc}", file=sys.stderr)
        return 2
    try:
        if args.command == "up":
            stack.up(only)
            print(json.dumps(stack.endpoints(), indent=2))
            return 0
        if args.command == "down":
            users = stack.lease_holders()
            if users and args.if_unused:
                print(f"[stack] down skipped: sessions {users} still use {stack.run_dir}", file=sys.stderr)
                return 0
            if users:
                print(f"[stack] warning: stopping services that sessions {users} still use", file=sys.stderr)
            stack.down(only)
            return 0
        status = stack.status()
        print(json.dumps(status, indent=2))
        selected = Stack._select(only)
        return 0 if all(status[n]["ready"] for n in selected) else 1
    except StackError as exc:
        print(f"[stack] ERROR: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
