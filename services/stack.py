"""Local segscope services: Kafka (KRaft), InfluxDB 1.x and Telegraf, run as plain processes.

    .local/venv/bin/python -m services.stack up|down|status [--only kafka,influxdb,telegraf]
                                                           [--run-dir DIR] [--port-base N]

Each service gets a directory under the run dir (default .run/services) with its rendered
config, a PID file, a log file and its data. Default endpoints (port_base None):

    Kafka     127.0.0.1:19092 (controller 19093)
    InfluxDB  http://127.0.0.1:18086 (rpc 18088), database "segscope"
    Telegraf  consumer group "segscope-telegraf" on segscope.metrics -> InfluxDB

With a port base N (for a second, isolated stack): Kafka N, controller N+1, InfluxDB HTTP N+2,
InfluxDB rpc N+3.

Python API:

    with Stack(run_dir=".run/sv-x", port_base=29000) as stack:     # up() ... down()
        stack.kafka_bootstrap, stack.influx_url, stack.influx_db
        stack.influx_write(["m,t=a v=1i 1700000000000000000"])
        stack.influx_query("SELECT * FROM m")   # -> [{"time": 1700000000000000000, "t": "a", "v": 1}]

`up` is idempotent: a service whose PID is alive and which answers is reused. A service that is
started from stopped gets a fresh data directory (tests want empty topics and an empty database).
Progress goes to stderr, one line per step with its duration.
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import json
import os
import shutil
import signal
import socket
import string
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import requests

REPO_ROOT = Path(__file__).resolve().parent.parent
SERVICES_DIR = REPO_ROOT / "services"
KAFKA_LIB_DIR = REPO_ROOT / ".local" / "kafka" / "lib"
TELEGRAF_BIN = REPO_ROOT / ".local" / "bin" / "telegraf"
DEFAULT_RUN_DIR = REPO_ROOT / ".run" / "services"

SERVICE_NAMES = ("kafka", "influxdb", "telegraf")   # start order; stop order is the reverse
TOPIC_PARTITIONS = {
    "segscope.stamp.records": 2,
    "segscope.metrics": 1,
    "segscope.deadletter": 1,
    "segscope.altmark.blocks": 2,   # altmark_batch (schemas/ALTMARK.md), key "<node>/<flow_id>"
    "segscope.topology": 1,         # node views from the agents (issue 6), key "<node>"
}
METRICS_TOPIC = "segscope.metrics"
TELEGRAF_GROUP = "segscope-telegraf"
INFLUX_DB = "segscope"

# Seconds. Start-up times were measured at 5-10 s for Kafka on a loaded 2-core host; leave room.
READY_TIMEOUT = {"kafka": 90.0, "influxdb": 45.0, "telegraf": 60.0}
STOP_TIMEOUT = {"kafka": 30.0, "influxdb": 15.0, "telegraf": 15.0}
KAFKA_JVM_OPTS = ["-Xms512m", "-Xmx512m", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true"]


class StackError(RuntimeError):
    """A service could not be started, reached or stopped; the message names the log to read."""


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
        return cls(kafka=port_base, kafka_controller=port_base + 1,
                   influx_http=port_base + 2, influx_rpc=port_base + 3)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


def _port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _proc_state(pid: int) -> str | None:
    """Single-letter state from /proc/<pid>/stat, or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _proc_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _kafka_cluster_id() -> str:
    """Random KRaft cluster id (what `StorageTool random-uuid` prints) without a JVM launch."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):       # Kafka refuses ids that look like CLI options
            return cid


class Stack:
    """Kafka + InfluxDB + Telegraf under one run dir and one set of ports."""

    def __init__(self, run_dir: str | os.PathLike | None = None, port_base: int | None = None,
                 *, keep_influx_data: bool = False, quiet: bool = False) -> None:
        self.run_dir = Path(run_dir).resolve() if run_dir else DEFAULT_RUN_DIR
        self.port_base = port_base
        self.ports = Ports.for_base(port_base)
        self.keep_influx_data = keep_influx_data
        self.quiet = quiet
        self.kafka_bootstrap = f"127.0.0.1:{self.ports.kafka}"
        self.influx_url = f"http://127.0.0.1:{self.ports.influx_http}"
        self.influx_db = INFLUX_DB
        self.started: set[str] = set()              # services this object started (not reused)
        self.last_up_seconds: float | None = None   # wall time of the last up() / down()
        self.last_down_seconds: float | None = None
        self._children: dict[str, subprocess.Popen] = {}
        self._lock_depth = 0

    # ------------------------------------------------------------------ paths and PIDs
    def service_dir(self, name: str) -> Path:
        return self.run_dir / name

    def log_path(self, name: str) -> Path:
        return self.service_dir(name) / f"{name}.log"

    def pid_path(self, name: str) -> Path:
        return self.service_dir(name) / f"{name}.pid"

    def _config_path(self, name: str) -> Path:
        file_name = {"kafka": "server.properties", "influxdb": "influxd.conf",
                     "telegraf": "telegraf.conf"}[name]
        return self.service_dir(name) / file_name

    def read_pid(self, name: str) -> int | None:
        try:
            return int(self.pid_path(name).read_text().strip())
        except (OSError, ValueError):
            return None

    def _is_ours(self, name: str, pid: int) -> bool:
        """PID alive (not a zombie) and its command line names this stack's config file.

        The config path is unique per run dir, so a recycled PID or another stack's process
        is never mistaken for ours."""
        child = self._children.get(name)
        if child is not None and child.pid == pid:
            # Our own child: ask the kernel via waitpid. Its /proc cmdline can still be empty
            # right after Popen returns (execve has not yet set up the new argument pages).
            return child.poll() is None
        state = _proc_state(pid)
        if state is None or state in ("Z", "X"):
            return False
        return str(self._config_path(name)) in _proc_cmdline(pid)

    def running_pid(self, name: str) -> int | None:
        pid = self.read_pid(name)
        return pid if pid is not None and self._is_ours(name, pid) else None

    # ------------------------------------------------------------------ output
    def _say(self, msg: str) -> None:
        if not self.quiet:
            print(f"[stack] {msg}", file=sys.stderr, flush=True)

    def _fail(self, name: str, what: str) -> StackError:
        log = self.log_path(name)
        return StackError(f"{name}: {what}; see {log}\n--- last lines of {log.name} ---\n{_tail(log)}")

    # ------------------------------------------------------------------ public API
    def up(self, only: Iterable[str] | None = None) -> "Stack":
        """Start (or reuse) the selected services in dependency order and wait until ready.

        Holds the run dir's lock, so concurrent `up`/`down` calls on one run dir (two test
        sessions, a CLI call) take turns instead of racing for the same ports and PID files."""
        with self._locked():
            return self._up(self._select(only))

    def down(self, only: Iterable[str] | None = None) -> None:
        """Stop the selected services by PID (SIGTERM, then SIGKILL after a timeout)."""
        with self._locked():
            self._down(self._select(only))

    @contextmanager
    def shared(self, only: Iterable[str] | None = None) -> Iterator["Stack"]:
        """up() for one of several concurrent users (e.g. pytest sessions) of the same run dir.

        Each user holds a lease file (its PID) while inside the block. The last user to leave
        stops the services that any user started; services that were already running before the
        first user came (a manual `up`) keep running. If up() fails, what it started is stopped."""
        selected = self._select(only)
        lease = self._leases_dir() / str(os.getpid())
        with self._locked():
            try:
                self._up(selected)
            except BaseException:
                if not self._other_leases(lease):
                    self._down(set(self.started))
                raise
            lease.parent.mkdir(parents=True, exist_ok=True)
            lease.write_text(f"{os.getpid()}\n")
            self._remember_started(self.started)
        try:
            yield self
        finally:
            with self._locked():
                lease.unlink(missing_ok=True)
                if not self._other_leases(lease):
                    self._down(self._remember_started(set()) | self.started)
                    (self._leases_dir() / "started.json").unlink(missing_ok=True)

    def _up(self, selected: set[str]) -> "Stack":
        t_total = time.monotonic()
        for name in selected:
            self.service_dir(name).mkdir(parents=True, exist_ok=True)
        restarted: set[str] = set()
        for name in SERVICE_NAMES:
            if name not in selected:
                continue
            if name == "telegraf" and restarted & {"kafka", "influxdb"}:
                # Telegraf's group offsets and output target lived in the old data dirs.
                self._stop("telegraf")
            if not self._reuse(name):
                t0 = time.monotonic()
                try:
                    {"kafka": self._start_kafka, "influxdb": self._start_influxdb,
                     "telegraf": self._start_telegraf}[name]()
                except BaseException:
                    self._stop(name)       # never leave a half-started process behind
                    raise
                restarted.add(name)
                self.started.add(name)
                self._say(f"{name}: ready in {time.monotonic() - t0:.1f} s "
                          f"(pid {self.read_pid(name)}, log {self.log_path(name)})")
            # Topics and database exist before Telegraf joins, so it never sees them missing.
            if name == "kafka":
                self._ensure_topics()
            elif name == "influxdb":
                self._ensure_database()
        self.last_up_seconds = time.monotonic() - t_total
        self._say(f"up: {','.join(n for n in SERVICE_NAMES if n in selected)} "
                  f"in {self.last_up_seconds:.1f} s")
        return self

    def _down(self, selected: set[str]) -> None:
        t_total = time.monotonic()
        for name in reversed(SERVICE_NAMES):
            if name in selected:
                self._stop(name)
        self.last_down_seconds = time.monotonic() - t_total
        self._say(f"down: {self.last_down_seconds:.1f} s")

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / ".lock", "w") as lock_file:
            if self._lock_depth == 0:
                try:
                    fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    self._say(f"waiting for another up/down on {self.run_dir}")
                    fcntl.flock(lock_file, fcntl.LOCK_EX)
            self._lock_depth += 1
            try:
                yield
            finally:
                self._lock_depth -= 1

    def _leases_dir(self) -> Path:
        return self.run_dir / "leases"

    def lease_holders(self) -> list[int]:
        """PIDs of live processes inside Stack.shared() on this run dir."""
        return self._other_leases(None)

    def _other_leases(self, mine: Path | None) -> list[int]:
        """PIDs of other live lease holders; leases of dead processes are removed."""
        others = []
        for lease in self._leases_dir().glob("[0-9]*"):
            if lease == mine:
                continue
            if _proc_state(int(lease.name)) in (None, "Z", "X"):
                lease.unlink(missing_ok=True)
            else:
                others.append(int(lease.name))
        return others

    def _remember_started(self, names: set[str]) -> set[str]:
        """Add names to the run dir's record of services that lease holders started; return it."""
        record = self._leases_dir() / "started.json"
        try:
            known = set(json.loads(record.read_text()))
        except (OSError, ValueError):
            known = set()
        known |= names
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(sorted(known)))
        return known

    def status(self) -> dict[str, dict]:
        """Per service: pid (or None), alive, ready (answers its readiness check), log path."""
        result: dict[str, dict] = {}
        for name in SERVICE_NAMES:
            pid = self.running_pid(name)
            result[name] = {
                "pid": pid,
                "alive": pid is not None,
                "ready": pid is not None and self._ready(name, timeout=3.0),
                "log": str(self.log_path(name)),
            }
        result["kafka"]["bootstrap"] = self.kafka_bootstrap
        result["influxdb"]["url"] = self.influx_url
        result["influxdb"]["database"] = self.influx_db
        result["telegraf"]["consumer_group"] = TELEGRAF_GROUP
        return result

    def endpoints(self) -> dict[str, str]:
        return {"kafka_bootstrap": self.kafka_bootstrap, "influx_url": self.influx_url,
                "influx_db": self.influx_db, "run_dir": str(self.run_dir)}

    def __enter__(self) -> "Stack":
        try:
            return self.up()
        except BaseException:
            self.down(only=self.started)
            raise

    def __exit__(self, *exc_info) -> None:
        self.down()

    # ------------------------------------------------------------------ InfluxDB helpers
    def influx_query(self, query: str, db: str | None = None, timeout: float = 10.0) -> list[dict]:
        """Run InfluxQL via /query (epoch=ns); rows of every series as dicts (columns + GROUP BY tags)."""
        resp = requests.post(f"{self.influx_url}/query",
                             params={"db": db or self.influx_db, "epoch": "ns"},
                             data={"q": query}, timeout=timeout)
        try:
            body = resp.json()
        except ValueError:
            raise StackError(f"InfluxDB query {query!r}: HTTP {resp.status_code}: {resp.text[:300]}")
        if resp.status_code != 200 or "error" in body:
            raise StackError(f"InfluxDB query {query!r}: HTTP {resp.status_code}: {body}")
        rows: list[dict] = []
        for result in body.get("results", []):
            if "error" in result:
                raise StackError(f"InfluxDB query {query!r}: {result['error']}")
            for series in result.get("series", []):
                tags = series.get("tags", {})
                for values in series.get("values", []):
                    row = dict(zip(series["columns"], values))
                    row.update(tags)
                    rows.append(row)
        return rows

    def influx_write(self, lines: str | Iterable[str], db: str | None = None,
                     precision: str = "ns", timeout: float = 10.0) -> None:
        """Write line protocol via /write; raises StackError with InfluxDB's message on rejection."""
        body = lines if isinstance(lines, str) else "\n".join(lines)
        resp = requests.post(f"{self.influx_url}/write",
                             params={"db": db or self.influx_db, "precision": precision},
                             data=body.encode(), timeout=timeout)
        if resp.status_code != 204:
            raise StackError(f"InfluxDB write: HTTP {resp.status_code}: {resp.text[:300]}")

    # ------------------------------------------------------------------ internals: common
    @staticmethod
    def _select(only: Iterable[str] | None) -> set[str]:
        if only is None:
            return set(SERVICE_NAMES)
        names = {n.strip() for n in only if n.strip()}
        unknown = names - set(SERVICE_NAMES)
        if unknown:
            raise StackError(f"unknown service(s) {sorted(unknown)}; known: {', '.join(SERVICE_NAMES)}")
        return names

    def _reuse(self, name: str) -> bool:
        """True when a running instance of `name` answers; a hung one is stopped."""
        pid = self.running_pid(name)
        if pid is None:
            self.pid_path(name).unlink(missing_ok=True)
            return False
        # It may still be starting (e.g. an `up` a moment ago): give it a short grace period.
        if self._wait_ready(name, timeout=10.0, pid=pid, raise_on_timeout=False):
            self._say(f"{name}: reusing pid {pid}")
            return True
        self._say(f"{name}: pid {pid} does not answer; restarting it")
        self._stop(name)
        return False

    def _check_ports_free(self, name: str, ports: Iterable[int]) -> None:
        for port in ports:
            if _port_open(port):
                raise StackError(f"{name}: 127.0.0.1:{port} is already in use by a process that is "
                                 f"not this stack's {name} (run dir {self.run_dir}); "
                                 f"see `ss -ltnp | grep {port}`")

    def _render(self, template: Path, out: Path, **values: object) -> None:
        text = string.Template(template.read_text()).substitute({k: str(v) for k, v in values.items()})
        out.write_text(text)

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> int:
        """Start argv in its own session (survives the CLI; not hit by the terminal's Ctrl-C)."""
        with open(self.log_path(name), "ab") as log:
            log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(argv)}\n".encode())
            log.flush()
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=self.service_dir(name), env=env, start_new_session=True)
        self._children[name] = proc
        self.pid_path(name).write_text(f"{proc.pid}\n")
        return proc.pid

    def _wait_ready(self, name: str, timeout: float, pid: int,
                    raise_on_timeout: bool = True) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if not self._is_ours(name, pid):
                if raise_on_timeout:
                    raise self._fail(name, f"process {pid} exited during start-up")
                return False
            if self._ready(name, timeout=min(5.0, max(0.5, deadline - time.monotonic()))):
                return True
            if time.monotonic() >= deadline:
                if raise_on_timeout:
                    raise self._fail(name, f"not ready within {timeout:.0f} s (pid {pid} still running)")
                return False
            time.sleep(0.25)

    def _ready(self, name: str, timeout: float) -> bool:
        try:
            if name == "kafka":
                return self._kafka_ready(timeout)
            if name == "influxdb":
                return self._influx_ready(timeout)
            return self._telegraf_consuming(timeout)
        except Exception:                 # any client error just means "not ready yet"
            return False

    def _stop(self, name: str) -> None:
        pid = self.read_pid(name)
        child = self._children.pop(name, None)
        if pid is None or not self._is_ours(name, pid):
            if child is not None:
                child.poll()              # reap a child that already exited
            self.pid_path(name).unlink(missing_ok=True)
            return
        t0 = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        how = "SIGTERM"
        if not self._wait_gone(name, pid, child, STOP_TIMEOUT[name]):
            os.kill(pid, signal.SIGKILL)
            how = f"SIGKILL after {STOP_TIMEOUT[name]:.0f} s"
            if not self._wait_gone(name, pid, child, 10.0):
                raise self._fail(name, f"pid {pid} survived SIGKILL")
        self.pid_path(name).unlink(missing_ok=True)
        self.started.discard(name)
        self._say(f"{name}: stopped pid {pid} ({how}) in {time.monotonic() - t0:.1f} s")

    def _wait_gone(self, name: str, pid: int, child: subprocess.Popen | None, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if child is not None:
                try:
                    child.wait(timeout=0.1)
                    return True
                except subprocess.TimeoutExpired:
                    continue
            if not self._is_ours(name, pid):
                return True
            time.sleep(0.1)
        return False

    # ------------------------------------------------------------------ internals: Kafka
    def _admin(self):
        from confluent_kafka.admin import AdminClient
        # log_level 2 keeps librdkafka's "connection refused" chatter out of stderr while polling.
        return AdminClient({"bootstrap.servers": self.kafka_bootstrap, "log_level": 2,
                            "socket.connection.setup.timeout.ms": 3000})

    def _kafka_ready(self, timeout: float) -> bool:
        if not _port_open(self.ports.kafka):
            return False
        metadata = self._admin().list_topics(timeout=timeout)
        return bool(metadata.brokers)

    def _start_kafka(self) -> None:
        jars = sorted(KAFKA_LIB_DIR.glob("kafka_2.13-*.jar"))
        if not jars:
            raise StackError(f"kafka: no jars in {KAFKA_LIB_DIR}; run `make setup`")
        java = shutil.which("java")
        if java is None:
            raise StackError("kafka: `java` not found on PATH (Java 17+ is needed); run `make setup`")
        self._check_ports_free("kafka", (self.ports.kafka, self.ports.kafka_controller))
        svc = self.service_dir("kafka")
        data_dir = svc / "data"
        shutil.rmtree(data_dir, ignore_errors=True)      # fresh topics every start from stopped
        data_dir.mkdir(parents=True)
        props = self._config_path("kafka")
        self._render(SERVICES_DIR / "kafka" / "server.properties", props,
                     KAFKA_PORT=self.ports.kafka, CONTROLLER_PORT=self.ports.kafka_controller,
                     DATA_DIR=data_dir)
        log4j = svc / "log4j2.properties"
        shutil.copyfile(SERVICES_DIR / "kafka" / "log4j2.properties", log4j)
        classpath = f"{KAFKA_LIB_DIR}/*"

        t0 = time.monotonic()
        fmt = subprocess.run(
            [java, "-Xmx256m", "-XX:TieredStopAtLevel=1", f"-Dlog4j2.configurationFile={log4j}",
             "-Dlog4j2.level=WARN", "-cp", classpath, "kafka.tools.StorageTool", "format",
             "-t", _kafka_cluster_id(), "-c", str(props)],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180)
        with open(self.log_path("kafka"), "a") as log:
            log.write(f"\n=== storage format (rc {fmt.returncode})\n{fmt.stdout}{fmt.stderr}")
        if fmt.returncode != 0:
            raise self._fail("kafka", f"storage format failed with rc {fmt.returncode}")
        self._say(f"kafka: storage formatted in {time.monotonic() - t0:.1f} s")

        pid = self._spawn("kafka", [java, *KAFKA_JVM_OPTS, f"-Dlog4j2.configurationFile={log4j}",
                                    "-cp", classpath, "kafka.Kafka", str(props)])
        self._wait_ready("kafka", READY_TIMEOUT["kafka"], pid)

    def _ensure_topics(self) -> None:
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import NewTopic
        t0 = time.monotonic()
        admin = self._admin()
        existing = set(admin.list_topics(timeout=10).topics)
        wanted = [NewTopic(name, num_partitions=parts, replication_factor=1)
                  for name, parts in TOPIC_PARTITIONS.items() if name not in existing]
        if wanted:
            for name, future in admin.create_topics(wanted, request_timeout=30).items():
                try:
                    future.result(timeout=40)
                except KafkaException as exc:
                    if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                        raise self._fail("kafka", f"creating topic {name} failed: {exc}")
        # Wait until every topic has a leader for every partition, so producers don't race it.
        deadline = time.monotonic() + 30
        while True:
            topics = admin.list_topics(timeout=10).topics
            missing = [n for n, parts in TOPIC_PARTITIONS.items()
                       if n not in topics or len(topics[n].partitions) < parts
                       or any(p.leader < 0 for p in topics[n].partitions.values())]
            if not missing:
                # The metadata can name a leader before that broker serves the partition
                # (NOT_LEADER_FOR_PARTITION right after a fresh start): ask it for offsets.
                missing = self._partitions_not_served()
            if not missing:
                break
            if time.monotonic() > deadline:
                raise self._fail("kafka", f"topics {missing} have no serving leader after 30 s")
            time.sleep(0.2)
        self._say(f"kafka: topics {', '.join(TOPIC_PARTITIONS)} ready "
                  f"({len(wanted)} created) in {time.monotonic() - t0:.1f} s")

    def _partitions_not_served(self) -> list[str]:
        """Topic partitions whose leader does not answer an offsets request yet."""
        from confluent_kafka import Consumer, KafkaException, TopicPartition
        consumer = Consumer({"bootstrap.servers": self.kafka_bootstrap, "group.id": "segscope-stack-ready",
                             "enable.auto.commit": False})
        try:
            not_served = []
            for name, parts in TOPIC_PARTITIONS.items():
                for p in range(parts):
                    try:
                        consumer.get_watermark_offsets(TopicPartition(name, p), timeout=5)
                    except KafkaException:
                        not_served.append(f"{name}[{p}]")
            return not_served
        finally:
            consumer.close()

    # ------------------------------------------------------------------ internals: InfluxDB
    def _influx_ready(self, timeout: float) -> bool:
        return requests.get(f"{self.influx_url}/ping", timeout=timeout).status_code == 204

    def _start_influxdb(self) -> None:
        influxd = shutil.which("influxd") or "/usr/bin/influxd"
        if not Path(influxd).exists():
            raise StackError("influxdb: `influxd` not found (Debian package influxdb); run `make setup`")
        self._check_ports_free("influxdb", (self.ports.influx_http, self.ports.influx_rpc))
        data_dir = self.service_dir("influxdb") / "data"
        if not self.keep_influx_data:
            shutil.rmtree(data_dir, ignore_errors=True)
        data_dir.mkdir(parents=True, exist_ok=True)
        conf = self._config_path("influxdb")
        self._render(SERVICES_DIR / "influxdb" / "influxd.conf", conf,
                     HTTP_PORT=self.ports.influx_http, RPC_PORT=self.ports.influx_rpc, DATA_DIR=data_dir)
        pid = self._spawn("influxdb", [influxd, "run", "-config", str(conf)])
        self._wait_ready("influxdb", READY_TIMEOUT["influxdb"], pid)

    def _ensure_database(self) -> None:
        self.influx_query(f'CREATE DATABASE "{self.influx_db}"')   # no-op when it exists

    # ------------------------------------------------------------------ internals: Telegraf
    def _telegraf_consuming(self, timeout: float) -> bool:
        """True when the consumer group has a member that is assigned segscope.metrics."""
        admin = self._admin()           # keep a reference: a collected client never completes futures
        future = admin.describe_consumer_groups([TELEGRAF_GROUP], request_timeout=timeout)[TELEGRAF_GROUP]
        group = future.result(timeout=timeout + 1)
        for member in group.members:
            assignment = member.assignment.topic_partitions if member.assignment else []
            if any(tp.topic == METRICS_TOPIC for tp in assignment):
                return True
        return False

    def _start_telegraf(self) -> None:
        if not os.access(TELEGRAF_BIN, os.X_OK):
            raise StackError(f"telegraf: {TELEGRAF_BIN} missing; run `make setup`")
        for dep in ("kafka", "influxdb"):
            if self.running_pid(dep) is None:
                raise StackError(f"telegraf: needs {dep} of this stack running "
                                 f"(run dir {self.run_dir}); start it first")
        conf = self._config_path("telegraf")
        self.service_dir("telegraf").mkdir(parents=True, exist_ok=True)
        # A copy in the run dir: the running config sits next to the log, and the path in the
        # command line tells this stack's Telegraf apart from another stack's.
        shutil.copyfile(SERVICES_DIR / "telegraf" / "telegraf.conf", conf)
        env = dict(os.environ,
                   SEGSCOPE_KAFKA_BOOTSTRAP=self.kafka_bootstrap,
                   SEGSCOPE_INFLUX_URL=self.influx_url,
                   SEGSCOPE_INFLUX_DB=self.influx_db)
        pid = self._spawn("telegraf", [str(TELEGRAF_BIN), "--strict-env-handling", "--config", str(conf)], env=env)
        self._wait_ready("telegraf", READY_TIMEOUT["telegraf"], pid)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.stack", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("up", "down", "status"))
    parser.add_argument("--only", help="comma-separated subset of: " + ",".join(SERVICE_NAMES))
    parser.add_argument("--run-dir", help=f"state directory (default {DEFAULT_RUN_DIR.relative_to(REPO_ROOT)})")
    parser.add_argument("--port-base", type=int,
                        help="Kafka N, controller N+1, InfluxDB N+2, rpc N+3 (default: 19092/19093/18086/18088)")
    parser.add_argument("--keep-influx-data", action="store_true",
                        help="keep InfluxDB's data dir when starting it from stopped")
    parser.add_argument("--if-unused", action="store_true",
                        help="down: do nothing while a test session holds a lease on the run dir")
    args = parser.parse_args(argv)
    only = args.only.split(",") if args.only else None
    stack = Stack(run_dir=args.run_dir, port_base=args.port_base, keep_influx_data=args.keep_influx_data)
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
