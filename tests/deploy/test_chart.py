"""helm/segscope: lint, schema validation of every rendering, kube-score, and the properties an
operator relies on (least privilege, no default password, replicas = partitions, mTLS material
that verifies, dashboards as shipped). No cluster: everything offline (tests/deploy/k8s.py)."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import time

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from processors.topology.config import TopologyConfig
from segscope_schemas.version import __version__
from tests.deploy.k8s import (
    CHART,
    CRD_KINDS,
    EXAMPLES,
    REPO,
    by_kind,
    containers,
    helm_template,
    helm_template_text,
    kube_score_critical,
    kubeconform,
    run,
    tool,
)

VARIANTS = [[]] + [["-f", str(p)] for p in EXAMPLES]
VARIANT_IDS = ["defaults"] + [p.stem for p in EXAMPLES]


def test_examples_exist():
    assert {p.stem for p in EXAMPLES} == {"dev", "prod", "jalapeno"}


@pytest.mark.parametrize("args", VARIANTS, ids=VARIANT_IDS)
def test_lint_strict(args):
    out = run([tool("helm"), "lint", "--strict", str(CHART), *args])
    assert "0 chart(s) failed" in out.stdout


@pytest.mark.parametrize("args", VARIANTS, ids=VARIANT_IDS)
def test_rendering_is_valid_kubernetes(args):
    text = helm_template_text(*args)
    summary = kubeconform(text)
    n = len([d for d in yaml.safe_load_all(text) if d])
    crds = len([d for d in yaml.safe_load_all(text) if d and d["kind"] in CRD_KINDS])
    assert f"Valid: {n - crds}, Invalid: 0, Errors: 0" in summary, summary


def test_kubeconform_catches_a_bad_field():
    """The validation can fail: an unknown field in a rendered Deployment is refused."""
    text = helm_template_text().replace("terminationGracePeriodSeconds: 30", "terminationGracePeriodSecondz: 30", 1)
    out = run(
        [tool("kubeconform"), "-strict", "-kubernetes-version", "1.33.0", "-schema-location",
         str(REPO / ".local" / "k8s-schemas"), "-"],
        stdin=text, check=False,
    )  # fmt: skip
    assert out.returncode != 0 and "terminationGracePeriodSecondz" in out.stdout


@pytest.mark.parametrize("args", VARIANTS, ids=VARIANT_IDS)
def test_kube_score_has_no_unjustified_critical(args):
    """Two checks are off, on purpose:
    - CPU limits (--ignore-container-cpu-limit): CFS throttling delays the sender's timestamps and
      the processors' flushes; requests give each its share (test_every_container_has_requests).
    - container-image-pull-policy: images are versioned (appVersion) and pulled IfNotPresent by
      default; `image.pullPolicy: Always` is one value away for those who want it.
    The remaining user-id findings are silenced per object with a kube-score/ignore annotation and
    a comment beside it (the agent is root with three capabilities; bundled images run as their
    own user)."""
    critical = kube_score_critical(helm_template_text(*args))
    assert not critical, "\n".join(critical)


def test_every_container_has_requests_and_memory_limit():
    for doc, _, c, _ in containers(helm_template()):
        r = c.get("resources", {})
        where = f"{doc['kind']}/{doc['metadata']['name']} {c['name']}"
        assert {"cpu", "memory", "ephemeral-storage"} <= set(r.get("requests", {})), where
        assert {"memory", "ephemeral-storage"} <= set(r.get("limits", {})), where


def test_agent_least_privilege():
    docs = helm_template()
    ds = by_kind(docs, "DaemonSet")["segscope-agent"]
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["automountServiceAccountToken"] is False
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["BPF", "NET_ADMIN", "PERFMON"]}
    assert sc["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert "/sys/fs/bpf" in mounts and mounts["/sys/kernel/btf"]["readOnly"] is True
    assert mounts["/sys/fs/bpf"].get("mountPropagation") != "Bidirectional"  # that would need privileged
    paths = {v["name"]: v.get("hostPath", {}).get("path") for v in pod["volumes"]}
    assert paths["bpffs"] == "/sys/fs/bpf" and paths["btf"] == "/sys/kernel/btf"
    # the probes hit the agent's real health endpoints
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert "--health=0.0.0.0:9640" in c["args"]
    # PID 1 is the supervisor: an agent that dies is restarted in the container, its data path adopted
    assert c["command"] == ["segscope-agent-supervise", "--", "segscope-agent"]


def test_everything_but_the_agent_runs_as_non_root():
    for doc, pod, c, _ in containers(helm_template()):
        if doc["metadata"]["name"] == "segscope-agent":
            continue
        sc = c["securityContext"]
        where = f"{doc['metadata']['name']}/{c['name']}"
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0, where
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}, where
        assert sc["readOnlyRootFilesystem"] is True, where
        assert not pod.get("hostNetwork"), where


def _secret_values(docs, name):
    return {k: base64.b64decode(v).decode() for k, v in by_kind(docs, "Secret")[name]["data"].items()}


def test_no_default_password():
    """Every password is generated (differs between two renderings, 32 characters) unless given;
    values.yaml itself carries none."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert all(v == "" for k, v in values["credentials"].items() if k.endswith("Password"))
    a = _secret_values(helm_template(), "segscope-credentials")
    b = _secret_values(helm_template(), "segscope-credentials")
    passwords = [k for k in a if k.endswith("-password")]
    assert len(passwords) == 5
    for k in passwords:
        assert len(a[k]) == 32 and a[k] != b[k], k
    given = _secret_values(helm_template("--set", "credentials.grafanaAdminPassword=s3cret-x"), "segscope-credentials")
    assert given["grafana-admin-password"] == "s3cret-x"
    docs = helm_template("--set", "credentials.existingSecret=mine")
    assert "segscope-credentials" not in by_kind(docs, "Secret")
    refs = {
        e["valueFrom"]["secretKeyRef"]["name"]
        for _, _, c, _ in containers(docs)
        for e in c.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert refs == {"mine"}


def test_secret_keys_match_what_pods_read():
    docs = helm_template()
    keys = set(by_kind(docs, "Secret")["segscope-credentials"]["data"])
    read = {
        e["valueFrom"]["secretKeyRef"]["key"]
        for _, _, c, _ in containers(docs)
        for e in c.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert read <= keys and read, read - keys


@pytest.mark.parametrize("stamp,blocks,ioam", [(1, 3, 2), (5, 2, 7)])
def test_processor_replicas_follow_partitions(stamp, blocks, ioam):
    docs = helm_template(
        "--set", f"topics.stampRecordsPartitions={stamp}", "--set", f"topics.altmarkBlocksPartitions={blocks}",
        "--set", f"topics.ioamRecordsPartitions={ioam}",
    )  # fmt: skip
    deps = by_kind(docs, "Deployment")
    assert deps["segscope-delay"]["spec"]["replicas"] == stamp
    assert deps["segscope-loss"]["spec"]["replicas"] == blocks
    assert deps["segscope-inline"]["spec"]["replicas"] == ioam
    assert deps["segscope-topology"]["spec"]["replicas"] == 1
    for name in ("segscope-delay", "segscope-loss", "segscope-inline", "segscope-topology"):
        init = deps[name]["spec"]["template"]["spec"]["initContainers"][0]
        assert init["command"] == ["segscope-topics"]
        assert f"--partitions=segscope.stamp.records={stamp}" in init["args"]
        assert f"--partitions=segscope.altmark.blocks={blocks}" in init["args"]
        assert f"--partitions=segscope.ioam.records={ioam}" in init["args"]
    # the topics tool takes the rendered partitions (the registry's names)
    from services.kafka.topics import parse_partitions

    args = [a.split("=", 1)[1] for a in init["args"] if a.startswith("--partitions=")]
    assert parse_partitions(args)["segscope.ioam.records"] == ioam


def test_inline_processor_deployment():
    """The in-line processor: its command, health port and probes, the reorder window in its
    environment (accepted by its settings), a PodDisruptionBudget; off with processors.inline.enabled."""
    from processors.inline.config import InlineConfig

    docs = helm_template("--set", "processors.inline.reorderWindowSeconds=20")
    dep = by_kind(docs, "Deployment")["segscope-inline"]
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["segscope-inline-processor"]
    assert "--health=0.0.0.0:9644" in c["args"] and c["ports"][0]["containerPort"] == 9644
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz" and c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True and c["securityContext"]["runAsNonRoot"] is True
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["SEGSCOPE_INLINE_RETENTION_S"] == "20"
    cfg = InlineConfig.from_env({"SEGSCOPE_TAI_UTC_OFFSET_S": "37", **{k: v for k, v in env.items() if v is not None}})
    assert cfg.retention_s == 20.0
    assert "segscope-inline-processor" in by_kind(docs, "PodDisruptionBudget")
    off = helm_template("--set", "processors.inline.enabled=false")
    assert "segscope-inline" not in by_kind(off, "Deployment")
    assert "segscope-inline-processor" not in by_kind(off, "PodDisruptionBudget")


def test_controller_run_deployment():
    """`segscope-controller run` as a Deployment instead of a drift CronJob: two replicas (Kafka leader
    election on the chart's Kafka), mutual TLS to the agents with the controller's certificate, health
    port and probes, spread over nodes, a PodDisruptionBudget; the apply Job stays; one replica: no PDB."""
    from controller.__main__ import parser

    intent = "version: 1\nnodes: {}\n"
    docs = helm_template("--set", f"controller.intent={intent}")
    assert "CronJob" not in {d["kind"] for d in docs} and "segscope-apply" in by_kind(docs, "Job")
    dep = by_kind(docs, "Deployment")["segscope-controller"]
    spec = dep["spec"]["template"]["spec"]
    c = spec["containers"][0]
    assert dep["spec"]["replicas"] == 2 and spec.get("restartPolicy", "Always") == "Always"
    assert c["command"] == ["segscope-controller"] and c["args"][:2] == ["run", "/etc/segscope/intent/intent.yaml"]
    assert {"--kafka=$(SEGSCOPE_KAFKA_BOOTSTRAP)", "--leader-election=kafka", "--replica=$(POD_NAME)",
            "--interval=30", "--health=0.0.0.0:9645"} <= set(c["args"])  # fmt: skip
    assert {e["configMapRef"]["name"] for e in c["envFrom"]} == {"segscope-endpoints"}
    tls = next(v for v in spec["volumes"] if v["name"] == "tls")
    assert tls["secret"]["secretName"] == "segscope-controller-tls"  # mTLS to the agents, as the Job
    assert c["ports"][0]["containerPort"] == 9645
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz" and c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True and c["securityContext"]["runAsNonRoot"] is True
    assert spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    selector = dep["spec"]["selector"]["matchLabels"]
    job_labels = by_kind(docs, "Job")["segscope-apply"]["spec"]["template"]["metadata"]["labels"]
    assert not selector.items() <= job_labels.items(), "the Deployment would select the apply Job's pod"
    assert "segscope-controller-run" in by_kind(docs, "PodDisruptionBudget")
    one = helm_template("--set", f"controller.intent={intent}", "--set", "controller.replicas=1")
    assert "segscope-controller-run" not in by_kind(one, "PodDisruptionBudget")
    # the arguments are the controller's own (argparse exits 2 on one it does not know)
    args = parser().parse_args(
        [a.replace("$(SEGSCOPE_KAFKA_BOOTSTRAP)", "k:9092").replace("$(POD_NAME)", "p") for a in c["args"]]
    )
    assert (args.command, args.kafka, args.leader_election, args.replica, args.interval) == (
        "run",
        "k:9092",
        "kafka",
        "p",
        30,
    )
    none = helm_template("--set", "controller.intent=")
    assert "segscope-controller" not in by_kind(none, "Deployment")


def test_values_schema_names_the_bad_field():
    for setting, field in (
        ("tls.mode=bogus", "/tls/mode"),
        ("topics.stampRecordsPartitions=0", "/topics/stampRecordsPartitions"),
        ("agent.capabilities=SYS_ADMIN", "agent"),
        ("kafka.bootstrap=no-port", "/kafka/bootstrap"),
    ):
        out = run([tool("helm"), "template", "x", str(CHART), "--set", setting], check=False)
        assert out.returncode != 0 and field in out.stderr, (setting, out.stderr)


def _topology_env(*args: str) -> dict[str, str]:
    topo = by_kind(helm_template(*args), "Deployment")["segscope-topology"]["spec"]["template"]["spec"]
    return {e["name"]: e.get("value") for e in topo["containers"][0]["env"]}


def test_topology_settings_reach_the_processors_environment():
    # the defaults are processors/topology/config.py's (the processor would use them anyway)
    env = _topology_env()
    assert {k: v for k, v in env.items() if k.startswith(("SEGSCOPE_TOPOLOGY_", "SEGSCOPE_ARANGO_BATCH"))} == {
        "SEGSCOPE_TOPOLOGY_MODE": "own",
        "SEGSCOPE_TOPOLOGY_PROTOCOL_ID": "200",
        "SEGSCOPE_TOPOLOGY_DOMAIN_ID": "0",
        "SEGSCOPE_TOPOLOGY_REFRESH_S": "30",
        "SEGSCOPE_TOPOLOGY_STALE_AFTER_S": "300",
        "SEGSCOPE_ARANGO_BATCH_SIZE": "1000",
        "SEGSCOPE_TOPOLOGY_JALAPENO_NODES": "igp_node",
        "SEGSCOPE_TOPOLOGY_JALAPENO_EDGES": "igpv6_graph",
        "SEGSCOPE_TOPOLOGY_JALAPENO_IP_EDGES": "ipv6_graph",
        "SEGSCOPE_TOPOLOGY_JALAPENO_KAFKA": "",
        "SEGSCOPE_TOPOLOGY_JALAPENO_LINK_EVENTS_TOPIC": "",
        "SEGSCOPE_TOPOLOGY_JALAPENO_TELEMETRY_TOPIC": "",
        "SEGSCOPE_TOPOLOGY_JALAPENO_TELEMETRY_MEASUREMENTS": "stamp_delay,altmark_loss",
    }
    env = _topology_env(
        "-f", str(CHART / "examples" / "jalapeno.yaml"),
        "--set", "processors.topology.refreshSeconds=10",
        "--set", "processors.topology.staleAfterSeconds=120",
        "--set", "processors.topology.jalapeno.kafka=broker.other:9092",
        "--set", "processors.topology.jalapeno.linkEventsTopic=gobmp.parsed.ls_link_events",
        "--set", "processors.topology.jalapeno.ipEdges=",
        "--set", "processors.topology.jalapeno.telemetryMeasurements=*",
    )  # fmt: skip
    assert (env["SEGSCOPE_TOPOLOGY_MODE"], env["SEGSCOPE_TOPOLOGY_JALAPENO_TELEMETRY_TOPIC"]) == (
        "jalapeno",
        "jalapeno.telemetry",
    )
    assert (env["SEGSCOPE_TOPOLOGY_REFRESH_S"], env["SEGSCOPE_TOPOLOGY_STALE_AFTER_S"]) == ("10", "120")
    assert env["SEGSCOPE_TOPOLOGY_JALAPENO_KAFKA"] == "broker.other:9092"
    assert env["SEGSCOPE_TOPOLOGY_JALAPENO_LINK_EVENTS_TOPIC"] == "gobmp.parsed.ls_link_events"
    assert env["SEGSCOPE_TOPOLOGY_JALAPENO_IP_EDGES"] == ""
    assert env["SEGSCOPE_TOPOLOGY_JALAPENO_TELEMETRY_MEASUREMENTS"] == "*"
    # and the processor accepts what the chart renders
    cfg = TopologyConfig.from_env({k: v for k, v in env.items() if v is not None})
    assert (cfg.refresh_s, cfg.jalapeno_ip_edges, cfg.telemetry_measurements()) == (10.0, "", None)


def test_summary_topic_reaches_the_four_processors_only_when_enabled():
    """processors.topology.summary: the same two variables in the delay, loss, in-line and topology
    processors (processors/newest.py), which accept what the chart renders; off by default. An
    interval not below the in-line reorder window is refused (the worker would refuse it)."""
    from processors.delay.config import DelayConfig
    from processors.inline.config import InlineConfig
    from processors.loss.config import LossConfig
    from segscope_schemas.names import TOPIC_METRICS_NEWEST

    def envs(*args: str) -> dict[str, dict[str, str]]:
        deps = by_kind(helm_template(*args), "Deployment")
        out = {}
        for name in ("delay", "loss", "inline", "topology"):
            container = deps[f"segscope-{name}"]["spec"]["template"]["spec"]["containers"][0]
            out[name] = {e["name"]: e.get("value") for e in container["env"]}
        return out

    assert not any("SEGSCOPE_TOPIC_METRICS_NEWEST" in env for env in envs().values())
    on = envs(
        "--set", "processors.topology.summary.enabled=true", "--set", "processors.topology.summary.intervalSeconds=5"
    )
    for name, config in (("delay", DelayConfig), ("loss", LossConfig), ("inline", InlineConfig),
                         ("topology", TopologyConfig)):  # fmt: skip
        env = on[name]
        assert (env["SEGSCOPE_TOPIC_METRICS_NEWEST"], env["SEGSCOPE_SUMMARY_INTERVAL_S"]) == (TOPIC_METRICS_NEWEST, "5")
        cfg = config.from_env({"SEGSCOPE_TAI_UTC_OFFSET_S": "37", **{k: v for k, v in env.items() if v is not None}})
        assert (cfg.newest_topic, cfg.summary_interval_s) == (TOPIC_METRICS_NEWEST, 5.0)
    assert (
        TopologyConfig.from_env({k: v for k, v in on["topology"].items() if v}).measures_topic() == TOPIC_METRICS_NEWEST
    )
    bad = run([tool("helm"), "template", "x", str(CHART), "--set", "processors.topology.summary.enabled=true",
               "--set", "processors.inline.reorderWindowSeconds=10"], check=False)  # fmt: skip
    assert bad.returncode != 0 and "processors.inline.reorderWindowSeconds" in bad.stderr, bad.stderr


def test_influx_setup_full_rollups_only_or_none(capsys):
    def init_containers(*args: str) -> list[dict]:
        """Telegraf's InfluxDB init containers (its first one waits for Kafka, whatever the database)."""
        spec = by_kind(helm_template(*args), "Deployment")["segscope-telegraf"]["spec"]["template"]["spec"]
        assert spec["initContainers"][0]["name"] == "kafka-wait"
        return spec["initContainers"][1:]

    (full,) = init_containers()
    assert full["name"] == "influx-setup" and "--rollups-only" not in full["args"]
    assert "--raw-retention=30d" in full["args"]
    assert {"SEGSCOPE_INFLUX_WRITER_USER", "SEGSCOPE_INFLUX_READER_USER"} <= {e["name"] for e in full["env"]}
    (only,) = init_containers("-f", str(CHART / "examples" / "jalapeno.yaml"))
    assert only["command"] == ["segscope-influx-setup"] and "--rollups-only" in only["args"]
    assert not [a for a in only["args"] if a.startswith("--raw-retention")]  # autogen is Jalapeno's
    assert "--rollup-1m-retention=400d" in only["args"]
    assert {e["name"] for e in only["env"]} == {"SEGSCOPE_INFLUX_ADMIN_USER", "SEGSCOPE_INFLUX_ADMIN_PASSWORD"}
    assert all(e["valueFrom"]["secretKeyRef"]["optional"] is True for e in only["env"])
    assert init_containers("--set", "influxdb.setup=false") == []
    # the tool takes the rendered args (a renamed flag fails here, not in the pod): it gets as far as
    # the server (none listens on port 9: exit 1, not argparse's 2)
    from services.influxdb import setup

    for init in (full, only):
        args = [
            a.replace("$(SEGSCOPE_INFLUX_URL)", "http://127.0.0.1:9").replace("$(SEGSCOPE_INFLUX_DB)", "mdt_db")
            for a in init["args"]
        ]
        env = {"SEGSCOPE_INFLUX_ADMIN_USER": "admin", "SEGSCOPE_INFLUX_ADMIN_PASSWORD": "pw"}
        code = setup.main([a if not a.startswith("--timeout=") else "--timeout=0" for a in args], env=env)
        assert code == 1 and "/ping did not answer" in capsys.readouterr().err, init["name"]


@pytest.mark.parametrize(
    "settings,message",
    [
        (["influxdb.rollupsOnly=true"], "influxdb.setup and influxdb.rollupsOnly are both true"),
        (["processors.topology.refreshSeconds=0"], "/processors/topology/refreshSeconds"),
        (["processors.topology.jalapeno.edges=a b"], "/processors/topology/jalapeno/edges"),
        (["processors.topology.jalapeno.kafka=no-port"], "/processors/topology/jalapeno/kafka"),
        (["processors.topology.jalapeno.unknown=x"], "unknown"),
        (["processors.topology.staleAfterSeconds=30"], "staleAfterSeconds=30 must exceed"),
        (["processors.topology.jalapeno.linkEventsTopic=x"], "only used in jalapeno mode"),
        (
            ["processors.topology.summary.enabled=true", "processors.topology.jalapeno.telemetryTopic=j.t"],
            "leave telemetryTopic empty",
        ),
        (
            ["processors.topology.summary.enabled=true", "processors.topology.refreshSeconds=5"],
            "summary.intervalSeconds=10 must be below processors.topology.refreshSeconds=5",
        ),
        (["processors.topology.summary.intervalSeconds=30"], "/processors/topology/summary/intervalSeconds"),
    ],
)
def test_bad_topology_settings_are_refused_by_name(settings, message):
    args = [a for s in settings for a in ("--set", s)]
    out = run([tool("helm"), "template", "x", str(CHART), *args], check=False)
    assert out.returncode != 0 and message in out.stderr, (settings, out.stderr)


def test_external_endpoint_required_when_not_bundled():
    out = run([tool("helm"), "template", "x", str(CHART), "--set", "kafka.bundled=false"], check=False)
    assert out.returncode != 0 and "kafka.bootstrap is required" in out.stderr


def test_endpoints_bundled_and_external():
    ep = by_kind(helm_template(), "ConfigMap")["segscope-endpoints"]["data"]
    assert ep["SEGSCOPE_KAFKA_BOOTSTRAP"] == "segscope-kafka:9092"
    assert ep["SEGSCOPE_INFLUX_URL"] == "http://segscope-influxdb:8086"
    ep = by_kind(helm_template("-f", str(CHART / "examples" / "jalapeno.yaml")), "ConfigMap")["segscope-endpoints"]
    assert ep["data"]["SEGSCOPE_KAFKA_BOOTSTRAP"] == "broker.jalapeno:9092"
    assert ep["data"]["SEGSCOPE_ARANGO_DB"] == "jalapeno" and ep["data"]["SEGSCOPE_INFLUX_DB"] == "mdt_db"


def _pem(docs, name, key):
    return base64.b64decode(by_kind(docs, "Secret")[name]["data"][key])


def test_generated_mtls_material_verifies():
    """The agent's certificate names tls.agentServerName, both leaf certificates are signed by the
    CA shipped beside them, and the controller's may authenticate as a client."""
    docs = helm_template("--set", "tls.agentServerName=agents.example")
    ca = x509.load_pem_x509_certificate(_pem(docs, "segscope-agent-tls", "ca.crt"))
    assert _pem(docs, "segscope-controller-tls", "ca.crt") == _pem(docs, "segscope-agent-tls", "ca.crt")
    agent = x509.load_pem_x509_certificate(_pem(docs, "segscope-agent-tls", "tls.crt"))
    ctl = x509.load_pem_x509_certificate(_pem(docs, "segscope-controller-tls", "tls.crt"))
    for cert in (agent, ctl):
        cert.verify_directly_issued_by(ca)
    sans = agent.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["agents.example"]
    eku = ctl.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in eku


def test_certificates_from_values(tmp_path):
    """tls.mode values: the operator's PEMs land in the Secrets unchanged; a missing one is named."""
    from controller.pki import make_pki

    p = make_pki(tmp_path, ["segscope-agent"])
    files = {
        "caCrt": p["ca"], "agentCrt": p["agent-segscope-agent.pem"], "agentKey": p["agent-segscope-agent.key"],
        "controllerCrt": p["controller.pem"], "controllerKey": p["controller.key"],
    }  # fmt: skip
    args = ["--set", "tls.mode=values"] + [a for k, f in files.items() for a in ("--set-file", f"tls.values.{k}={f}")]
    docs = helm_template(*args)
    assert _pem(docs, "segscope-agent-tls", "tls.key") == files["agentKey"].read_bytes()
    assert _pem(docs, "segscope-controller-tls", "tls.crt") == files["controllerCrt"].read_bytes()
    assert _pem(docs, "segscope-controller-tls", "ca.crt") == files["caCrt"].read_bytes()
    out = run([tool("helm"), "template", "x", str(CHART), *args[:-2]], check=False)  # no controllerKey
    assert out.returncode != 0 and "tls.values.controllerKey is required" in out.stderr


def test_cert_manager_mode():
    docs = helm_template("--set", "tls.mode=certManager")
    certs = by_kind(docs, "Certificate")
    assert certs["segscope-agent"]["spec"]["secretName"] == "segscope-agent-tls"
    assert certs["segscope-agent"]["spec"]["dnsNames"] == ["segscope-agent"]
    assert "client auth" in certs["segscope-controller"]["spec"]["usages"]
    assert certs["segscope-agent"]["spec"]["issuerRef"]["name"] == "segscope-ca"  # the chart's own CA
    assert "segscope-agent-tls" not in by_kind(docs, "Secret")  # cert-manager writes it
    docs = helm_template("--set", "tls.mode=certManager", "--set", "tls.certManager.issuerRef.name=corp",
                         "--set", "tls.certManager.issuerRef.kind=ClusterIssuer")  # fmt: skip
    assert by_kind(docs, "Issuer") == {}
    assert by_kind(docs, "Certificate")["segscope-controller"]["spec"]["issuerRef"]["kind"] == "ClusterIssuer"


def test_grafana_provisioning_is_generated_from_dashboards():
    docs = helm_template()
    cms = by_kind(docs, "ConfigMap")
    dash = cms["segscope-dashboards"]["data"]
    on_disk = {p.name: p.read_text() for p in (REPO / "dashboards").glob("*.json")}
    assert dash.keys() == on_disk.keys() and on_disk
    for name, text in on_disk.items():
        assert json.loads(dash[name]) == json.loads(text), name
    for kind in ("datasources", "dashboards"):
        files = {p.name: p.read_text() for p in (REPO / "dashboards" / "provisioning" / kind).glob("*.yaml")}
        assert {k: yaml.safe_load(v) for k, v in cms[f"segscope-grafana-{kind}"]["data"].items()} == {
            k: yaml.safe_load(v) for k, v in files.items()
        }
    # the provider's path is where the Deployment mounts the dashboards
    provider = yaml.safe_load(next(iter(cms["segscope-grafana-dashboards"]["data"].values())))
    grafana = by_kind(docs, "Deployment")["segscope-grafana"]["spec"]["template"]["spec"]["containers"][0]
    mounts = {m["name"]: m["mountPath"] for m in grafana["volumeMounts"]}
    assert provider["providers"][0]["options"]["path"] == mounts["dashboards"]


def test_telegraf_config_is_the_local_stacks():
    cm = by_kind(helm_template(), "ConfigMap")["segscope-telegraf"]["data"]["telegraf.conf"]
    assert cm.strip() == (REPO / "services" / "telegraf" / "telegraf.conf").read_text().strip()


def test_chart_version_is_segscopes():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == __version__
    images = {c["image"] for _, _, c, _ in containers(helm_template()) if "/segscope-" in c["image"]}
    assert images and all(i.endswith(f":{__version__}") for i in images), images


def test_network_policies_cover_every_pod():
    docs = helm_template()
    deny = by_kind(docs, "NetworkPolicy")["segscope-default-deny"]["spec"]
    assert deny["policyTypes"] == ["Ingress"] and "ingress" not in deny
    sel = deny["podSelector"]["matchLabels"]
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet"):
            labels = d["spec"]["template"]["metadata"]["labels"]
            assert sel.items() <= labels.items(), d["metadata"]["name"]
    docs = helm_template("--set", "networkPolicy.routerCIDRs={2001:db8::/32}")
    kafka = by_kind(docs, "NetworkPolicy")["segscope-kafka"]["spec"]["ingress"][0]["from"]
    assert {"ipBlock": {"cidr": "2001:db8::/32"}} in kafka


def test_helm_package(tmp_path):
    """The chart packages with the symlinked files resolved (dashboards/, telegraf.conf)."""
    # into this session's tmp_path: a fixed /tmp path would be shared by concurrent runs
    out = run([tool("helm"), "package", str(CHART), "--destination", str(tmp_path)])
    tgz = re.search(r"saved it to: (\S+)", out.stdout).group(1)
    names = subprocess.run(["tar", "tzf", tgz], capture_output=True, text=True, check=True).stdout.split()
    assert "segscope/files/telegraf.conf" in names
    assert "segscope/files/dashboards/overview.json" in names
    assert "segscope/files/dashboards/provisioning/alerting/segscope.yaml" in names


def test_chart_commands_are_entry_points():
    """Every segscope program a rendered container runs is a console script `pip install .` makes
    (tests/packaging runs each with --version and --help); the rest are the images' own."""
    import tomllib

    scripts = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"])
    docs = helm_template("-f", str(CHART / "examples" / "dev.yaml"))
    commands = {c["command"][0] for _, _, c, _ in containers(docs) if c.get("command")}
    ours = {c for c in commands if c.startswith("segscope-")}
    assert ours <= scripts, ours - scripts
    assert ours >= {"segscope-agent-supervise", "segscope-delay-processor", "segscope-topics", "segscope-influx-setup",
                    "segscope-controller"}  # fmt: skip
    assert commands - ours == {"telegraf", "influxd", "/opt/kafka/bin/kafka-storage.sh",
                               "/opt/kafka/bin/kafka-server-start.sh"}  # fmt: skip


def test_chart_names_are_the_registrys():
    """The chart writes topic and group names (Helm cannot read schemas/names.toml): they must be
    the registry's, or a renamed topic would split the deployment from the code."""
    from segscope_schemas.names import (
        GROUP_TELEGRAF,
        TOPIC_ALTMARK_BLOCKS,
        TOPIC_ALTMARK_BY_FLOW,
        TOPIC_IOAM_RECORDS,
        TOPIC_METRICS,
        TOPIC_STAMP_RECORDS,
    )

    docs = helm_template()
    deps = by_kind(docs, "Deployment")
    topics_args = deps["segscope-delay"]["spec"]["template"]["spec"]["initContainers"][0]["args"]
    named = {a.split("=")[1] for a in topics_args if a.startswith("--partitions=")}
    assert named == {TOPIC_STAMP_RECORDS, TOPIC_ALTMARK_BLOCKS, TOPIC_ALTMARK_BY_FLOW, TOPIC_IOAM_RECORDS}
    env = {
        e["name"]: e.get("value") for e in deps["segscope-telegraf"]["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["SEGSCOPE_TOPIC_METRICS"] == TOPIC_METRICS and env["SEGSCOPE_TELEGRAF_GROUP"] == GROUP_TELEGRAF


def test_apply_job_is_deleted_by_helm_once_it_succeeded():
    """helm uninstall never deletes hook objects: the apply Job (a post-install/post-upgrade hook)
    must be deleted by helm as soon as it succeeded, or it and its pod outlive the release; a failed
    one is kept for its logs until the next install/upgrade replaces it, or its TTL ends."""
    docs = helm_template("--set", "controller.intent=version: 1\nnodes: {}\n")
    job = by_kind(docs, "Job")["segscope-apply"]
    notes = job["metadata"]["annotations"]
    assert notes["helm.sh/hook"] == "post-install,post-upgrade"
    assert set(notes["helm.sh/hook-delete-policy"].split(",")) == {"before-hook-creation", "hook-succeeded"}
    assert 0 < job["spec"]["ttlSecondsAfterFinished"] <= 3600  # kustomize has no hooks: the TTL removes it


@pytest.mark.parametrize("args", VARIANTS, ids=VARIANT_IDS)
def test_telegraf_waits_for_kafka_in_an_init_container(args):
    """Telegraf exits when its Kafka input cannot start (no broker answers): while a bundled Kafka
    starts, that is a crash loop. Its first init container waits for Kafka with Telegraf's own login
    (a refused one ends the pod with the reason, as Telegraf itself does)."""
    spec = by_kind(helm_template(*args), "Deployment")["segscope-telegraf"]["spec"]["template"]["spec"]
    wait = spec["initContainers"][0]
    assert wait["name"] == "kafka-wait" and wait["command"] == ["segscope-kafka"]
    assert wait["args"] == ["check", "--bootstrap=$(SEGSCOPE_KAFKA_BOOTSTRAP)", "--timeout=300"]
    assert {e["configMapRef"]["name"] for e in wait["envFrom"]} == {"segscope-endpoints"}
    kafka_env = {e["name"]: e for e in wait.get("env", [])}
    secured = any(c["name"] == "kafka-config" for c in spec["initContainers"])
    if secured:  # the same login as the config Telegraf runs with
        config = next(c for c in spec["initContainers"] if c["name"] == "kafka-config")
        assert kafka_env == {e["name"]: e for e in config["env"]}
        assert wait["volumeMounts"] == [m for m in config["volumeMounts"] if m["name"].startswith("kafka-")]
    else:
        assert not kafka_env and "volumeMounts" not in wait
    assert wait["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_kafka_wait_fails_when_no_broker_answers(capsys):
    """The init container's command, as the chart calls it: it exits non-zero (the pod does not go
    on to start Telegraf) when nothing answers within its timeout."""
    from segscope_kafka.__main__ import main
    from tests.isolation import closed_port

    t0 = time.monotonic()
    assert main(["check", f"--bootstrap=127.0.0.1:{closed_port(29999)}", "--timeout=2"]) == 1
    assert 1.5 < time.monotonic() - t0 < 15, "it waited for the timeout, not returned at the first refusal"
    assert "did not answer within 2 s" in capsys.readouterr().err
