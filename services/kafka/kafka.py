"""Kafka (KRaft, one broker that is also its controller) from the Maven Central jars that
`make setup` puts in .local/kafka/lib (pom.xml beside this file), with server.properties and
log4j2.properties from this folder. Ready = the broker answers a metadata request; then every
topic of the name registry (schemas/names.toml) is created with its partition count and
waited for until each partition's leader serves it. With security=True the listener is SASL_SSL
with ACLs, a user per role (security.py); client_env(role) gives a program's SEGSCOPE_KAFKA_*."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

from segscope_schemas.names import TOPIC_CONFIG, TOPIC_PARTITIONS
from services.kafka.security import StackKafkaSecurity
from services.supervise import Service, StackError, port_open

HERE = Path(__file__).resolve().parent
KAFKA_LIB_DIR = HERE.parent.parent / ".local" / "kafka" / "lib"
KAFKA_JVM_OPTS = ["-Xms512m", "-Xmx512m", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true"]


def kafka_cluster_id() -> str:
    """Random KRaft cluster id (what `StorageTool random-uuid` prints) without a JVM launch."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):  # Kafka refuses ids that look like CLI options
            return cid


class Kafka(Service):
    name = "kafka"
    config_file = "server.properties"
    ready_timeout = 90.0
    stop_timeout = 30.0

    def __init__(
        self, run_dir, say, port: int, controller_port: int, fresh: bool = False, security: bool = False
    ) -> None:
        super().__init__(run_dir, say)
        self.port = port
        self.controller_port = controller_port
        self.fresh = fresh  # wipe the data dir (topics, offsets, cluster id) when starting
        self.bootstrap = f"127.0.0.1:{port}"
        # SASL_SSL, ACLs, a user per role (services/kafka/security.py); None: PLAINTEXT, no ACLs
        self.security = StackKafkaSecurity(self.dir) if security else None

    def client_env(self, role: str = "admin") -> dict[str, str]:
        """SEGSCOPE_KAFKA_* of a program of `role` (agent, processor, telegraf, admin); {} for PLAINTEXT."""
        return self.security.client_env(role) if self.security else {}

    def client_config(self, base: dict, role: str = "admin") -> dict:
        """A confluent-kafka config for this broker as `role`."""
        return {**base, **(self.security.security(role).librdkafka() if self.security else {})}

    def admin(self):
        from confluent_kafka.admin import AdminClient

        # log_level 2 keeps librdkafka's "connection refused" chatter out of stderr while polling.
        return AdminClient(
            self.client_config(
                {"bootstrap.servers": self.bootstrap, "log_level": 2, "socket.connection.setup.timeout.ms": 3000}
            )
        )

    def check_ready(self, timeout: float) -> bool:
        if not port_open(self.port):
            return False
        return bool(self.admin().list_topics(timeout=timeout).brokers)

    def start(self) -> None:
        jars = sorted(KAFKA_LIB_DIR.glob("kafka_2.13-*.jar"))
        if not jars:
            raise StackError(f"kafka: no jars in {KAFKA_LIB_DIR}; run `make setup`")
        java = shutil.which("java")
        if java is None:
            raise StackError("kafka: `java` not found on PATH (Java 17+ is needed); run `make setup`")
        self.check_ports_free((self.port, self.controller_port))
        data_dir = self.dir / "data"
        # The data survives a restart, and a crash (Kafka recovers its logs), unless fresh;
        # meta.properties says the dir was formatted, i.e. holds this cluster's id.
        reuse = not self.fresh and (data_dir / "meta.properties").exists()
        if not reuse:
            shutil.rmtree(data_dir, ignore_errors=True)
            data_dir.mkdir(parents=True)
        props = self.config_path
        listener = {"LISTENER": "PLAINTEXT", "CONTROLLER_PROTOCOL": "PLAINTEXT", "SECURITY": ""}
        if self.security:
            self.security.prepare(fresh=not reuse)  # the users' credentials live in the data dir
            listener = self.security.server_properties()
        props.touch(mode=0o600)
        os.chmod(props, 0o600)  # with security it holds passwords (the PLAIN users, the broker's login)
        self.render(
            HERE / "server.properties",
            props,
            KAFKA_PORT=self.port,
            CONTROLLER_PORT=self.controller_port,
            DATA_DIR=data_dir,
            **listener,
        )
        log4j = self.dir / "log4j2.properties"
        shutil.copyfile(HERE / "log4j2.properties", log4j)
        classpath = f"{KAFKA_LIB_DIR}/*"
        if reuse:
            self.say(f"kafka: keeping its data in {data_dir} (topics, offsets; --fresh wipes it)")
        else:
            self.format_storage(java, log4j, classpath, props)
        pid = self.spawn(
            [java, *KAFKA_JVM_OPTS, f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath, "kafka.Kafka", str(props)]
        )
        self.wait_ready(self.ready_timeout, pid)

    def format_storage(self, java: str, log4j: Path, classpath: str, props: Path) -> None:
        """KRaft storage format with a new cluster id (a new, empty cluster)."""
        t0 = time.monotonic()
        tool = ["kafka.tools.StorageTool", "format", "-t", kafka_cluster_id(), "-c", str(props)]
        argfile = self.dir / "format.args"
        if self.security:
            # the SCRAM users' passwords go in a 0600 argument file (`java @file`), never on the command line
            argfile.touch(mode=0o600)
            os.chmod(argfile, 0o600)
            argfile.write_text("\n".join([*tool, *self.security.format_arguments()]) + "\n")
            tool = [f"@{argfile}"]
        try:
            fmt = subprocess.run(
                [
                    java,
                    "-Xmx256m",
                    "-XX:TieredStopAtLevel=1",
                    f"-Dlog4j2.configurationFile={log4j}",
                    "-Dlog4j2.level=WARN",
                    "-cp",
                    classpath,
                    *tool,
                ],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=180,
            )
        finally:
            argfile.unlink(missing_ok=True)
        with open(self.log_path, "a") as log:
            log.write(f"\n=== storage format (rc {fmt.returncode})\n{fmt.stdout}{fmt.stderr}")
        if fmt.returncode != 0:
            raise self.fail(f"storage format failed with rc {fmt.returncode}")
        self.say(f"kafka: storage formatted in {time.monotonic() - t0:.1f} s")

    def topics_unusable(self) -> list[str]:
        """Registry topics that are missing, short of partitions, or without a serving leader."""
        topics = self.admin().list_topics(timeout=5).topics
        bad = [
            n
            for n, parts in TOPIC_PARTITIONS.items()
            if n not in topics
            or len(topics[n].partitions) < parts
            or any(p.leader < 0 for p in topics[n].partitions.values())
        ]
        return bad or self.partitions_not_served()

    def after_ready(self) -> None:
        self.ensure_topics()
        if self.security:
            t0 = time.monotonic()
            n = self.security.apply_acls(self.admin())
            self.say(f"kafka: SASL_SSL, {n} ACLs of the roles in place in {time.monotonic() - t0:.1f} s")

    def ensure_topics(self) -> None:
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import NewTopic

        t0 = time.monotonic()
        admin = self.admin()
        existing = set(admin.list_topics(timeout=10).topics)
        wanted = [
            NewTopic(name, num_partitions=parts, replication_factor=1, config=TOPIC_CONFIG.get(name) or {})
            for name, parts in TOPIC_PARTITIONS.items()
            if name not in existing
        ]
        if wanted:
            for name, future in admin.create_topics(wanted, request_timeout=30).items():
                try:
                    future.result(timeout=40)
                except KafkaException as exc:
                    if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                        raise self.fail(f"creating topic {name} failed: {exc}") from exc
        # Wait until every topic has a leader for every partition, so producers don't race it.
        deadline = time.monotonic() + 30
        while True:
            topics = admin.list_topics(timeout=10).topics
            missing = [
                n
                for n, parts in TOPIC_PARTITIONS.items()
                if n not in topics
                or len(topics[n].partitions) < parts
                or any(p.leader < 0 for p in topics[n].partitions.values())
            ]
            if not missing:
                # The metadata can name a leader before that broker serves the partition
                # (NOT_LEADER_FOR_PARTITION right after a fresh start): ask it for offsets.
                missing = self.partitions_not_served()
            if not missing:
                break
            if time.monotonic() > deadline:
                raise self.fail(f"topics {missing} have no serving leader after 30 s")
            time.sleep(0.2)
        self.say(
            f"kafka: topics {', '.join(TOPIC_PARTITIONS)} ready "
            f"({len(wanted)} created) in {time.monotonic() - t0:.1f} s"
        )

    def partitions_not_served(self) -> list[str]:
        """Topic partitions whose leader does not answer an offsets request yet."""
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        consumer = Consumer(
            self.client_config(
                {"bootstrap.servers": self.bootstrap, "group.id": "segscope-stack-ready", "enable.auto.commit": False}
            )
        )
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
