"""Kafka security in the deployment files (values kafka.security, docs/security.md): the chart's prod
example and kustomize's prod overlay log every Kafka client in over SASL_SSL with its own role's
principal, the password a file from a Secret of that role, never a value in the pod spec; the
default (and dev) renderings stay PLAINTEXT. kubeconform of these renderings: test_chart.py and
test_kustomize.py."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from tests.deploy.k8s import CHART, containers, helm_template, kustomize_build_text, tool

PROD = ["-f", str(CHART / "examples" / "prod.yaml")]
# workload (without the release prefix) / container -> the role it logs in as
ROLES = {
    ("agent", "agent"): "agent",
    ("delay", "delay"): "processor",
    ("loss", "loss"): "processor",
    ("topology", "topology"): "processor",
    ("delay", "topics"): "admin",
    ("loss", "topics"): "admin",
    ("topology", "topics"): "admin",
    ("telegraf", "kafka-config"): "telegraf",
}


def role_of(container: str) -> str:
    """The role a container logs in as: the topics init container is admin, the processors and
    segscope-freshness (it writes segscope.metrics) are the processor role, `controller run` its own;
    Telegraf's containers (its config and its wait for Kafka) the telegraf role."""
    return {
        "agent": "agent",
        "topics": "admin",
        "kafka-config": "telegraf",
        "kafka-wait": "telegraf",
        "controller": "controller",
    }.get(container, "processor")


def kafka_clients(docs: list[dict]) -> dict[tuple[str, str], tuple[dict, dict]]:
    out = {}
    for doc, pod, c, _init in containers(docs):
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        if any(k.startswith("SEGSCOPE_KAFKA_") and k != "SEGSCOPE_KAFKA_BOOTSTRAP" for k in env):
            out[(doc["metadata"]["name"].split("-", 1)[1], c["name"])] = (pod, c)
    return out


def check_role(pod: dict, c: dict, role: str, secret: str) -> None:
    env = {e["name"]: e for e in c.get("env", [])}
    value = {k: e.get("value") for k, e in env.items()}
    assert value["SEGSCOPE_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert value["SEGSCOPE_KAFKA_SASL_USERNAME"] == f"segscope-{role}"
    assert value["SEGSCOPE_KAFKA_SSL_CA_FILE"] == "/etc/segscope/kafka/ca/ca.crt"
    assert "SEGSCOPE_KAFKA_SASL_PASSWORD" not in env  # a password is never a variable
    pw = value["SEGSCOPE_KAFKA_SASL_PASSWORD_FILE"]
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in pod["volumes"]}
    user = volumes[mounts[pw.rsplit("/", 1)[0]]]
    assert user["secret"]["secretName"] == secret and user["secret"]["defaultMode"] == 0o440
    assert volumes[mounts["/etc/segscope/kafka/ca"]]["secret"]["secretName"] == "kafka-cluster-ca"


def test_prod_example_logs_every_client_in_with_its_role():
    docs = helm_template(*PROD)
    clients = kafka_clients(docs)
    assert set(ROLES) <= set(clients), set(ROLES) - set(clients)
    for (_workload, container), (pod, c) in clients.items():
        check_role(pod, c, role_of(container), f"segscope-kafka-{role_of(container)}")
    mech = {
        k: {e["name"]: e.get("value") for e in c["env"]}["SEGSCOPE_KAFKA_SASL_MECHANISM"]
        for k, (_, c) in clients.items()
    }
    # the agent's C tools (Debian's librdkafka 2.0.2) log in with PLAIN over TLS; the rest with SCRAM
    assert mech[("agent", "agent")] == "PLAIN"
    assert {m for k, m in mech.items() if k[0] != "agent"} == {"SCRAM-SHA-512"}


def test_prod_telegraf_runs_the_rendered_config_from_memory():
    docs = helm_template(*PROD)
    tele = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-telegraf"))
    pod = tele["spec"]["template"]["spec"]
    init = {c["name"]: c for c in pod["initContainers"]}["kafka-config"]
    assert init["command"] == ["segscope-kafka"] and "--out=/run/telegraf/telegraf.conf" in init["args"]
    main = {c["name"]: c for c in pod["containers"]}["telegraf"]
    assert "--config=/run/telegraf/telegraf.conf" in main["args"]
    rendered = {v["name"]: v for v in pod["volumes"]}["rendered"]
    assert rendered["emptyDir"]["medium"] == "Memory"
    assert not any(e["name"].startswith("SEGSCOPE_KAFKA_SASL_PASSWORD") for e in main.get("env", []))


def test_default_and_dev_stay_plaintext():
    for args in ([], ["-f", str(CHART / "examples" / "dev.yaml")]):
        assert kafka_clients(helm_template(*args)) == {}


def test_values_have_no_password():
    values = yaml.safe_load((CHART / "values.yaml").read_text())["kafka"]["security"]
    assert values["protocol"] == "PLAINTEXT"
    assert all(set(u) == {"username", "secret", "mechanism"} and u["secret"] == "" for u in values["users"].values())
    prod = yaml.safe_load((CHART / "examples" / "prod.yaml").read_text())["kafka"]["security"]
    assert "password" not in yaml.safe_dump(prod).lower()


def test_a_missing_role_secret_is_named():
    r = subprocess.run(
        [tool("helm"), "template", "s", str(CHART), *PROD, "--set", "kafka.security.users.telegraf.secret="],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0
    assert "kafka.security.users.telegraf.secret is required with kafka.security.protocol=SASL_SSL" in r.stderr


@pytest.mark.parametrize("bad", ["kafka.security.protocol=TLS", "kafka.security.saslMechanism=GSSAPI"])
def test_schema_refuses_unknown_protocol_and_mechanism(bad):
    r = subprocess.run([tool("helm"), "template", "s", str(CHART), "--set", bad], capture_output=True, text=True)
    assert r.returncode != 0 and bad.split("=")[0].split(".")[-1] in r.stderr


def test_kustomize_prod_overlay_logs_every_client_in_with_its_role():
    docs = [d for d in yaml.safe_load_all(kustomize_build_text("prod")) if d]
    clients = kafka_clients(docs)
    assert set(ROLES) <= set(clients), set(ROLES) - set(clients)
    for (_workload, container), (pod, c) in clients.items():
        check_role(pod, c, role_of(container), f"segscope-kafka-{role_of(container)}")
