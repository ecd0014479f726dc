"""Telegraf (built by `make setup` into .local/bin/telegraf with the kafka_consumer input and
influxdb output only) with telegraf.conf from this folder: it consumes the metrics topic as
consumer group GROUP_TELEGRAF and writes InfluxDB. The topic, group and database come from the
name registry through the environment (telegraf.conf reads ${SEGSCOPE_...}); the Kafka security of
the telegraf role, when the stack's Kafka has it, is rendered into the run dir's copy (0600,
segscope_kafka/telegraf.py). Ready = the group has a member assigned the metrics topic."""

from __future__ import annotations

import os
from pathlib import Path

from segscope_kafka import from_env
from segscope_kafka.telegraf import write_config
from segscope_schemas.names import GROUP_TELEGRAF, TOPIC_METRICS
from services.supervise import Service, StackError

HERE = Path(__file__).resolve().parent
TELEGRAF_BIN = HERE.parent.parent / ".local" / "bin" / "telegraf"


class Telegraf(Service):
    name = "telegraf"
    config_file = "telegraf.conf"
    ready_timeout = 60.0
    stop_timeout = 15.0

    def __init__(self, run_dir, say, kafka, influxdb) -> None:
        super().__init__(run_dir, say)
        self.kafka = kafka
        self.influxdb = influxdb

    def check_ready(self, timeout: float) -> bool:
        admin = self.kafka.admin()  # keep a reference: a collected client never completes futures
        future = admin.describe_consumer_groups([GROUP_TELEGRAF], request_timeout=timeout)[GROUP_TELEGRAF]
        group = future.result(timeout=timeout + 1)
        for member in group.members:
            assignment = member.assignment.topic_partitions if member.assignment else []
            if any(tp.topic == TOPIC_METRICS for tp in assignment):
                return True
        return False

    def start(self) -> None:
        if not os.access(TELEGRAF_BIN, os.X_OK):
            raise StackError(f"telegraf: {TELEGRAF_BIN} missing; run `make setup`")
        for dep in (self.kafka, self.influxdb):
            if dep.running_pid() is None:
                raise StackError(
                    f"telegraf: needs {dep.name} of this stack running (run dir {self.run_dir}); start it first"
                )
        self.dir.mkdir(parents=True, exist_ok=True)
        # A copy in the run dir: the running config sits next to the log, and the path in the
        # command line tells this stack's Telegraf apart from another stack's. With a secured Kafka
        # it holds the telegraf role's login (mode 0600), never the command line or the environment.
        write_config(HERE / "telegraf.conf", self.config_path, from_env(self.kafka.client_env("telegraf")))
        env = dict(
            os.environ,
            SEGSCOPE_KAFKA_BOOTSTRAP=self.kafka.bootstrap,
            SEGSCOPE_TOPIC_METRICS=TOPIC_METRICS,
            SEGSCOPE_TELEGRAF_GROUP=GROUP_TELEGRAF,
            SEGSCOPE_INFLUX_URL=self.influxdb.url,
            SEGSCOPE_INFLUX_DB=self.influxdb.db,
            SEGSCOPE_INFLUX_USER="",  # the local InfluxDB runs without auth
            SEGSCOPE_INFLUX_PASSWORD="",
            SEGSCOPE_TELEGRAF_HEALTH="127.0.0.1:0",  # any free port: only the chart probes it
        )
        pid = self.spawn([str(TELEGRAF_BIN), "--strict-env-handling", "--config", str(self.config_path)], env=env)
        self.wait_ready(self.ready_timeout, pid)
