"""The manifests run: every container the chart renders (examples/dev.yaml) is started on this
machine with exactly its command, args, environment, mounts and capabilities
(tests/deploy/podrun.py), and together they measure delay end to end:

    netlab line5_bare (A - R - B), one "router" netns per node
    agents A, R, B   segscope-agent with the DaemonSet's args, in the node's netns (hostNetwork),
                     with only CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON (setpriv bounding set)
    Kafka            the bundled StatefulSet's server.properties, format init container first
    InfluxDB         the bundled StatefulSet's influxdb.conf (authentication on)
    topics, influx-setup, kafka-wait   the init containers, run to completion
    delay, loss, topology processors, Telegraf   the Deployments' containers
    controller       the Job (apply) and the Deployment (run, two replicas) with the chart's generated
                     mTLS files

The intent is controller/examples/demo_line5.yaml with its TLS block as the chart mounts it
(${SEGSCOPE_TLS_DIR}, server_name ${SEGSCOPE_AGENT_SERVER_NAME}) and the agents' management
addresses. Pod networking: each node netns gets a management veth to the root namespace
(10.77.N.0/24); the cluster's service names become the local addresses (podrun's `endpoints`).
Grafana and ArangoDB run their images' own entrypoints and are not installable here: their
containers are listed, not run (test_only_grafana_and_arangodb_do_not_run).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import requests
import yaml

from netlab import Lab, teardown
from tests.deploy import podrun
from tests.deploy.k8s import CHART, REPO, by_kind, containers, helm_template
from tests.isolation import own_name

pytestmark = [pytest.mark.datapath, pytest.mark.e2e]

PREFIX = own_name("dpl")
NODES = ("A", "R", "B")
TOPOLOGY = REPO / "netlab" / "topologies" / "line5_bare.yaml"
INLINE_FLOW = 4377
KAFKA_IP = "10.77.1.1"  # the root side of A's management link: "the Kafka pod's IP"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def test_intent(mgmt_ip: dict[str, str]) -> str:
    """demo_line5.yaml with the chart's TLS layout and the agents' management addresses."""
    intent = yaml.safe_load((REPO / "controller" / "examples" / "demo_line5.yaml").read_text())
    tls = {
        "ca": "${SEGSCOPE_TLS_DIR}/ca.crt",
        "cert": "${SEGSCOPE_TLS_DIR}/tls.crt",
        "key": "${SEGSCOPE_TLS_DIR}/tls.key",
        "server_name": "${SEGSCOPE_AGENT_SERVER_NAME}",
    }
    for node in NODES:
        intent["nodes"][node] = {"agent": f"{mgmt_ip[node]}:50051", "tls": tls}
    for s in intent["stamp_sessions"]:
        s["rate_pps"] = 50
    # in-line measurement of the H1 -> H2 policy: EnableIoam on A, R and B goes through the agent's
    # --sysctl-net mount of the chart (a container's own /proc/sys is read-only)
    intent["inline_monitors"] = [
        {
            "flow_id": INLINE_FLOW,
            "ingress": {"node": "A", "dev": "a0"},
            "egress": {"node": "B", "dev": "b0"},
            "segs": ["fc00:2::e", "fc00:3::d6"],
            "sampling": {"every": 10},
            "transit": ["R"],
        }
    ]
    return yaml.safe_dump(intent, sort_keys=False)


test_intent.__test__ = False  # a helper, not a test


def wait_http(url: str, timeout: float, code: int = 200, auth=None) -> requests.Response:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = requests.get(url, timeout=2, auth=auth)
            if last.status_code == code:
                return last
        except requests.RequestException as exc:
            last = exc
        time.sleep(0.3)
    raise AssertionError(f"{url}: no {code} within {timeout} s (last: {last})")


class Deployment:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: dict[str, object] = {}
        self.logs = root / "logs"
        self.logs.mkdir()
        self.results: dict[str, int] = {}

    def log(self, name: str) -> str:
        p = self.logs / f"{name}.log"
        return p.read_text(errors="replace")[-3000:] if p.exists() else ""

    def run(self, c: podrun.Container, name: str, netns: str | None = None, timeout: float = 120) -> int:
        rc = podrun.run_to_end(c, self.logs / f"{name}.log", timeout=timeout, netns=netns).returncode
        self.results[name] = rc
        assert rc == 0, f"{name} exited {rc}:\n{self.log(name)}"
        return rc

    def start(self, c: podrun.Container, name: str, netns: str | None = None) -> None:
        self.procs[name] = podrun.start(c, self.logs / f"{name}.log", netns=netns)

    def alive(self, name: str) -> None:
        proc = self.procs[name]
        assert proc.poll() is None, f"{name} exited {proc.returncode}:\n{self.log(name)}"

    def stop_all(self) -> dict[str, int]:
        codes = {}
        for name in reversed(list(self.procs)):  # agents and processors before Kafka
            codes[name] = podrun.stop(self.procs[name])
        return codes


@pytest.fixture(scope="module")
def deployed(bpffs, tmp_path_factory):
    root = tmp_path_factory.mktemp("manifests")
    teardown(PREFIX)
    mgmt_ip = {node: f"10.77.{i + 1}.2" for i, node in enumerate(NODES)}
    intent_file = root / "intent.yaml"
    intent_file.write_text(test_intent(mgmt_ip))
    docs = helm_template("-f", str(CHART / "examples" / "dev.yaml"), "--set-file", f"controller.intent={intent_file}")
    kafka_port, ctl_port, influx_port, influx_rpc = free_port(), free_port(), free_port(), free_port()
    endpoints = {
        # the cluster's service names and bind addresses -> this machine (the "pod network")
        "segscope-kafka:9092": f"{KAFKA_IP}:{kafka_port}",
        "PLAINTEXT://:9092": f"PLAINTEXT://{KAFKA_IP}:{kafka_port}",
        "CONTROLLER://:9093": f"CONTROLLER://127.0.0.1:{ctl_port}",
        "localhost:9093": f"127.0.0.1:{ctl_port}",
        "http://segscope-influxdb:8086": f"http://127.0.0.1:{influx_port}",
        'bind-address = ":8086"': f'bind-address = "127.0.0.1:{influx_port}"',
        "127.0.0.1:8088": f"127.0.0.1:{influx_rpc}",
        "http://segscope-arangodb:8529": f"http://127.0.0.1:{free_port()}",  # nothing listens: no ArangoDB here
    }
    d = Deployment(root)
    d.docs, d.mgmt_ip, d.endpoints = docs, mgmt_ip, endpoints
    d.influx_url = f"http://127.0.0.1:{influx_port}"
    d.kafka = f"{KAFKA_IP}:{kafka_port}"
    lab = Lab.up(TOPOLOGY, prefix=PREFIX)
    d.lab = lab
    links = []
    try:
        for i, node in enumerate(NODES):  # management veths: root 10.77.N.1 <-> node netns 10.77.N.2
            host, inner = f"{PREFIX}m{node}", f"{PREFIX}mi{node}"
            sh("ip", "link", "add", host, "type", "veth", "peer", "name", inner)
            links.append(host)
            sh("ip", "link", "set", inner, "netns", lab.ns(node))
            sh("ip", "addr", "add", f"10.77.{i + 1}.1/24", "dev", host)
            sh("ip", "link", "set", host, "up")
            ns = ["ip", "-n", lab.ns(node)]
            sh(*ns, "addr", "add", f"{mgmt_ip[node]}/24", "dev", inner)
            sh(*ns, "link", "set", inner, "up")
            sh(*ns, "link", "set", "lo", "up")
            sh(*ns, "route", "add", "10.77.0.0/16", "via", f"10.77.{i + 1}.1")

        def prep(workload, container, **kw):
            return podrun.prepare(docs, workload, container, root / "pods", endpoints=endpoints, **kw)

        # Kafka: the StatefulSet's init container formats, then the broker starts
        d.run(prep("segscope-kafka", "format"), "kafka-format")
        d.start(prep("segscope-kafka", "kafka"), "kafka")
        # InfluxDB with the chart's config (auth on)
        d.start(prep("segscope-influxdb", "influxdb"), "influxdb")
        wait_http(f"{d.influx_url}/ping", 30, code=204)
        # the init containers: topics (every processor has the same one), then InfluxDB's users
        d.run(prep("segscope-delay", "topics"), "topics", timeout=180)
        d.run(prep("segscope-telegraf", "influx-setup"), "influx-setup")
        # Telegraf's wait for Kafka, with its login: passes once the broker answers
        d.run(prep("segscope-telegraf", "kafka-wait"), "kafka-wait")
        d.ports = {}
        for workload, container, port in (
            ("segscope-telegraf", "telegraf", 8080),
            ("segscope-delay", "delay", 9641),
            ("segscope-loss", "loss", 9642),
            ("segscope-inline", "inline", 9644),
            ("segscope-topology", "topology", 9643),
            ("segscope-freshness", "freshness", 0),
        ):
            d.ports[container] = free_port()
            d.start(prep(workload, container, ports={port: d.ports[container]} if port else {}), container)
        # the agents, each in its router's netns with the DaemonSet's capabilities only
        for node in NODES:
            c = prep("segscope-agent", "agent", node_name=node)
            assert c.capabilities == ["BPF", "NET_ADMIN", "PERFMON"]
            d.start(c, f"agent-{node}", netns=lab.ns(node))
        for node in NODES:
            try:
                wait_http(f"http://{mgmt_ip[node]}:9640/readyz", 30)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{d.log(f'agent-{node}')}") from None
        for name in ("delay", "loss", "inline"):
            wait_http(f"http://127.0.0.1:{d.ports[name]}/readyz", 60)
        d.prep = prep
        yield d
    finally:
        d.exit_codes = d.stop_all()
        lab.down()
        for host in links:
            subprocess.run(["ip", "link", "del", host], capture_output=True)


def test_kafka_runs_from_the_charts_config(deployed):
    d = deployed
    from confluent_kafka.admin import AdminClient

    topics = AdminClient({"bootstrap.servers": d.kafka}).list_topics(timeout=10).topics
    # examples/dev.yaml: one partition each; the topics init container made them
    assert len(topics["segscope.stamp.records"].partitions) == 1
    assert len(topics["segscope.altmark.blocks"].partitions) == 1
    assert "created" in d.log("topics")


def test_influxdb_has_auth_and_the_users(deployed):
    d = deployed
    anon = requests.post(f"{d.influx_url}/query", data={"q": "SHOW DATABASES"}, timeout=5)
    assert anon.status_code == 401
    creds = by_kind(d.docs, "Secret")["segscope-credentials"]["data"]
    import base64

    dec = {k: base64.b64decode(v).decode() for k, v in creds.items()}
    reader = (dec["influxdb-reader-user"], dec["influxdb-reader-password"])
    r = requests.post(f"{d.influx_url}/query", data={"q": "SHOW DATABASES"}, auth=reader, timeout=5)
    assert r.status_code == 200 and ["segscope"] in r.json()["results"][0]["series"][0]["values"]
    # the reader may not write
    w = requests.post(f"{d.influx_url}/write", params={"db": "segscope"}, data="m v=1", auth=reader, timeout=5)
    assert w.status_code == 403
    d.reader = reader


def test_influx_setup_reruns_and_rotates_a_password(deployed):
    """Re-running the init container with a changed Secret value changes the password (the
    old one is refused); running it again with the old value restores Telegraf's access."""
    d = deployed
    c = d.prep("segscope-telegraf", "influx-setup")
    user, old = c.env["SEGSCOPE_INFLUX_WRITER_USER"], c.env["SEGSCOPE_INFLUX_WRITER_PASSWORD"]

    def write(password: str) -> int:
        return requests.post(
            f"{d.influx_url}/write",
            params={"db": "segscope"},
            data="setup_check v=1i",
            auth=(user, password),
            timeout=5,
        ).status_code

    assert write(old) == 204
    c.env["SEGSCOPE_INFLUX_WRITER_PASSWORD"] = "rotated-" + old[:12]
    d.run(c, "influx-setup-rotate")
    assert write(old) == 401 and write("rotated-" + old[:12]) == 204
    c.env["SEGSCOPE_INFLUX_WRITER_PASSWORD"] = old
    d.run(c, "influx-setup-restore")
    assert write(old) == 204


def test_probes_answer_on_every_long_running_container(deployed):
    d = deployed
    for name in ("telegraf", "delay", "loss", "inline", "topology", "freshness"):
        d.alive(name)
    # the Deployments' probes, on the ports the containers declare
    for doc in by_kind(d.docs, "Deployment").values():
        c = doc["spec"]["template"]["spec"]["containers"][0]
        if c["name"] not in d.ports:
            continue
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            if probe not in c or "httpGet" not in c[probe]:
                continue
            if c["name"] == "topology" and probe == "readinessProbe":
                continue  # ready needs ArangoDB, which cannot run here (checked below)
            wait_http(f"http://127.0.0.1:{d.ports[c['name']]}{c[probe]['httpGet']['path']}", 30)
    status = requests.get(f"http://127.0.0.1:{d.ports['topology']}/status", timeout=5).json()
    assert status["alive"] is True


def test_controller_job_applies_the_intent_over_mtls(deployed):
    d = deployed
    job = d.prep("segscope-apply", "controller")
    assert job.argv[-2] == "apply"
    d.run(job, "controller-apply", timeout=120)
    assert "seg6local" in d.lab.run("R", ["ip", "-6", "route"]).stdout
    assert "encap seg6" in d.lab.run("A", ["ip", "-6", "route"]).stdout
    # IOAM enabled by the chart's agents through their sysctl mount: R's node id and its devices
    from controller.intent import default_ioam_id

    sysctl = d.lab.run("R", ["sysctl", "-n", "net.ipv6.ioam6_id", "net.ipv6.conf.r0.ioam6_enabled"]).stdout.split()
    assert sysctl == [str(default_ioam_id("R")), "1"], d.log("agent-R")


def _controller_metrics(port: int) -> dict[str, float]:
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {
        m.group(1): float(m.group(2)) for m in re.finditer(r"^segscope_controller_(\w+)\{[^}]*\} (\S+)$", text, re.M)
    }


def _wait(what: str, ok, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = ok()
        except requests.RequestException:
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.3)


def test_controller_run_repairs_drift_and_fails_over(deployed):
    """The Deployment's container (`segscope-controller run`), as two replicas: one leads (the
    chart's Kafka elects it), the other makes no call; R's End SID deleted by hand is re-created at
    the next reconcile; the leader SIGKILLed, the other leads and repairs the same drift again."""
    d = deployed
    ports, names_ = {}, {}
    for i in (0, 1):
        ports[i] = free_port()
        c = d.prep("segscope-controller", "controller", ports={9645: ports[i]})
        at = c.argv.index("run")
        assert c.argv[at + 1] == str(c.mounts["/etc/segscope/intent"] / "intent.yaml"), c.argv
        # one pod name per replica; a reconcile every 5 s here (the chart's default is 30)
        c.argv = [
            f"--replica=segscope-controller-{i}" if a.startswith("--replica=")
            else "--interval=5" if a.startswith("--interval=") else a
            for a in c.argv
        ]  # fmt: skip
        names_[i] = f"controller-run-{i}"
        d.start(c, names_[i])
    leaders = _wait(
        "one leader",
        lambda: [i for i in (0, 1) if _controller_metrics(ports[i]).get("leader") == 1]
        if sum(_controller_metrics(ports[i]).get("leader", 0) for i in (0, 1)) == 1
        else None,
        60,
    )
    leader, standby = leaders[0], 1 - leaders[0]
    # the first replica to join may lead until the second one's join rebalances the group: what
    # it called then is fine; from now on, as a standby, it must make no call (a reconcile is 5 s)
    calls = _controller_metrics(ports[standby])["rpcs"]
    time.sleep(6.0)
    assert _controller_metrics(ports[standby]).get("leader") == 0, d.log(names_[standby])
    assert _controller_metrics(ports[standby])["rpcs"] == calls, d.log(names_[standby])

    def end_sid_back() -> bool:
        return "fc00:2::e" in d.lab.run("R", ["ip", "-6", "route"]).stdout

    subprocess.run(["ip", "-n", d.lab.ns("R"), "-6", "route", "del", "fc00:2::e"], check=True)
    _wait("the End SID re-created by the leader", end_sid_back, 30)
    assert re.search(r"repair on R: create .*local SID fc00:2::e", d.log(names_[leader])), d.log(names_[leader])

    proc = d.procs.pop(names_[leader])  # SIGKILL: the other takes over after the session timeout
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    podrun.stop(proc)
    _wait("the standby leading", lambda: _controller_metrics(ports[standby]).get("leader") == 1, 30)
    subprocess.run(["ip", "-n", d.lab.ns("R"), "-6", "route", "del", "fc00:2::e"], check=True)
    _wait("the End SID re-created by the new leader", end_sid_back, 30)
    assert re.search(r"repair on R: create .*local SID fc00:2::e", d.log(names_[standby])), d.log(names_[standby])


def test_stamp_delay_reaches_influxdb_through_the_charts_pipeline(deployed):
    """agent A (chart args) -> Kafka -> delay processor -> Telegraf (writer) -> InfluxDB (reader)."""
    d = deployed
    if not hasattr(d, "reader"):
        pytest.skip("needs test_influxdb_has_auth_and_the_users")
    q = 'SELECT count("mean_us") FROM "stamp_delay" WHERE "direction" = \'forward\''
    deadline = time.monotonic() + 60
    count = 0
    while time.monotonic() < deadline and count < 3:
        r = requests.post(f"{d.influx_url}/query", params={"db": "segscope"}, data={"q": q}, auth=d.reader, timeout=5)
        series = r.json()["results"][0].get("series")
        count = series[0]["values"][0][1] if series else 0
        time.sleep(1)
    assert count >= 3, (
        f"stamp_delay rows: {count}\n--- agent A\n{d.log('agent-A')}\n--- delay\n{d.log('delay')}\n"
        f"--- telegraf\n{d.log('telegraf')}"
    )
    # the agents' own counters came the same way (segscope_agent lines, per node)
    r = requests.post(
        f"{d.influx_url}/query",
        params={"db": "segscope"},
        data={"q": 'SHOW TAG VALUES FROM "segscope_agent" WITH KEY = "node"'},
        auth=d.reader,
        timeout=5,
    )
    nodes = {v[1] for v in r.json()["results"][0].get("series", [{"values": []}])[0]["values"]}
    assert nodes == set(NODES)


def test_inline_delay_reaches_influxdb_through_the_charts_pipeline(deployed):
    """An ioam_batch on the chart's Kafka (what an egress streamer sends) -> the in-line processor
    (the chart's command, args and environment) -> Telegraf (writer) -> InfluxDB (reader): the
    one-way delays the records were built with."""
    d = deployed
    if not hasattr(d, "reader"):
        pytest.skip("needs test_influxdb_has_auth_and_the_users")
    import numpy as np
    from confluent_kafka import Producer

    from segscope_schemas import ioam_record as ir
    from segscope_schemas.names import TOPIC_IOAM_RECORDS
    from tests.processors.inline_records import NS, Hop, records

    second = time.clock_gettime_ns(time.CLOCK_TAI) // NS - 120
    tx = second * NS + np.arange(10, dtype=np.int64) * 50_000_000
    delays = np.arange(10, dtype=np.int64) * 1_000 + 2_000_000
    recs = records(4242, np.arange(10), tx, tx + delays, Hop(1, 0xFFFF, 11, 64), [])
    p = Producer({"bootstrap.servers": d.kafka})
    p.produce(TOPIC_IOAM_RECORDS, ir.encode_batch(recs, "B", 1), b"B/4242")
    assert p.flush(30) == 0
    q = 'SELECT "count", "sum_us" FROM "inline_delay" WHERE "flow" = \'4242\''
    want = [10, int(delays.sum()) / 1000]
    deadline, rows = time.monotonic() + 60, []
    while time.monotonic() < deadline and not (rows and rows[0][1:] == want):  # a point mid-write: read again
        r = requests.post(f"{d.influx_url}/query", params={"db": "segscope"}, data={"q": q}, auth=d.reader, timeout=5)
        rows = r.json()["results"][0].get("series", [{"values": []}])[0]["values"]
        time.sleep(1)
    assert rows and rows[0][1:] == want, f"{rows}\n--- inline\n{d.log('inline')}"


def test_freshness_reaches_influxdb(deployed):
    """segscope-freshness with the chart's args and the reader's credentials: its lines come back
    through Kafka and Telegraf (it reports every 10 s)."""
    d = deployed
    if not hasattr(d, "reader"):
        pytest.skip("needs test_influxdb_has_auth_and_the_users")
    deadline, series = time.monotonic() + 40, []
    while time.monotonic() < deadline and not series:
        r = requests.post(f"{d.influx_url}/query", params={"db": "segscope"}, auth=d.reader, timeout=5,
                          data={"q": 'SELECT last("query_errors") FROM "segscope_freshness_monitor"'})  # fmt: skip
        series = r.json()["results"][0].get("series", [])
        time.sleep(1)
    assert series and series[0]["values"][0][1] == 0, d.log("freshness")


def test_only_grafana_and_arangodb_do_not_run(deployed):
    """Every other container of the rendering ran above; these two run their images' entrypoints
    (no command), and neither server can be installed on this machine."""
    not_run = set()
    for doc, _, c, _ in containers(deployed.docs):
        try:
            deployed.prep(doc["metadata"]["name"], c["name"])
        except KeyError as exc:
            assert "own entrypoint" in str(exc), exc
            not_run.add(c["name"])
    assert not_run == {"grafana", "arangodb"}


def test_everything_stops_cleanly(deployed):
    """Runs last in this module: the processes still run here; the fixture's teardown stops them."""
    for name in deployed.procs:
        deployed.alive(name)
