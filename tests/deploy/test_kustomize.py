"""kustomize/: the generated parts match the chart, every overlay builds and validates, and each
overlay says what its README promises (bundled or external endpoints, replicas = partitions,
namespace, TLS source)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import yaml

from tests.deploy.k8s import OVERLAYS, REPO, by_kind, containers, kube_score_critical, kubeconform, run, tool


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, list[dict]]:
    """Every overlay built from a copy of kustomize/ with freshly generated lab secrets."""
    root = tmp_path_factory.mktemp("kustomize") / "kustomize"
    shutil.copytree(REPO / "kustomize", root, ignore=shutil.ignore_patterns("secrets"))
    for overlay in ("dev", "jalapeno"):
        secrets_dir = root / "overlays" / overlay / "secrets"
        subprocess.run(
            [sys.executable, str(REPO / "scripts" / "kustomize_secrets.py"), str(secrets_dir)],
            check=True,
            capture_output=True,
        )
    out = {}
    for overlay in OVERLAYS:
        text = run([tool("kustomize"), "build", str(root / "overlays" / overlay)]).stdout
        kubeconform(text)
        out[overlay] = [d for d in yaml.safe_load_all(text) if d]
        out[f"{overlay}.yaml"] = text
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kube_score_has_no_unjustified_critical(built, overlay):
    """The chart's kube-score policy (tests/deploy/test_chart.py says why two checks are off)."""
    critical = kube_score_critical(built[f"{overlay}.yaml"])
    assert not critical, "\n".join(critical)


def test_generated_parts_match_the_chart():
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "render_kustomize.py"), "--check", "--helm", tool("helm")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr


def _topics_args(docs, name):
    return by_kind(docs, "Deployment")[name]["spec"]["template"]["spec"]["initContainers"][0]["args"]


def _partitions(docs, topic):
    arg = next(a for a in _topics_args(docs, "segscope-delay") if a.startswith(f"--partitions={topic}="))
    return int(arg.rsplit("=", 1)[1])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_replicas_follow_partitions(built, overlay):
    docs = built[overlay]
    deps = by_kind(docs, "Deployment")
    assert deps["segscope-delay"]["spec"]["replicas"] == _partitions(docs, "segscope.stamp.records")
    assert deps["segscope-loss"]["spec"]["replicas"] == _partitions(docs, "segscope.altmark.blocks")
    for name in ("segscope-loss", "segscope-topology"):  # every processor creates the same topics
        assert _topics_args(docs, name) == _topics_args(docs, "segscope-delay")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_reference_resolves(built, overlay):
    """Every ConfigMap and Secret a pod reads exists in the build (after kustomize's hash
    suffixes), except the Secrets the overlay's README says the operator provides."""
    docs = built[overlay]
    roles = ("agent", "processor", "controller", "telegraf", "admin")  # components/kafka-sasl-ssl lists them
    kafka = {f"segscope-kafka-{r}" for r in roles} | {"kafka-cluster-ca"}
    provided = {"prod": {"segscope-credentials"} | kafka, "jalapeno": {"segscope-credentials"}}.get(overlay, set())
    cert_manager = {d["spec"]["secretName"] for d in docs if d["kind"] == "Certificate"}
    have = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for doc, pod, c, _ in containers(docs):
        refs = [("ConfigMap", e["configMapRef"]["name"]) for e in c.get("envFrom", [])]
        for e in c.get("env", []):
            vf = e.get("valueFrom", {})
            if "secretKeyRef" in vf:
                refs.append(("Secret", vf["secretKeyRef"]["name"]))
        for v in pod.get("volumes", []):
            if "configMap" in v:
                refs.append(("ConfigMap", v["configMap"]["name"]))
            if "secret" in v:
                refs.append(("Secret", v["secret"]["secretName"]))
        for kind, name in refs:
            if kind == "Secret" and (name in provided or name in cert_manager):
                continue
            assert (kind, name) in have, f"{overlay}: {doc['metadata']['name']} reads missing {kind} {name}"


def test_dev_is_self_contained(built):
    docs = built["dev"]
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} == {"segscope"}
    sts = by_kind(docs, "StatefulSet")
    assert set(sts) == {"segscope-kafka", "segscope-influxdb", "segscope-arangodb"}
    assert "segscope-grafana" in by_kind(docs, "Deployment")
    assert by_kind(docs, "Deployment")["segscope-delay"]["spec"]["replicas"] == 1
    ep = next(d for d in docs if d["metadata"]["name"] == "segscope-endpoints")["data"]
    assert ep["SEGSCOPE_KAFKA_BOOTSTRAP"] == "segscope-kafka:9092"
    assert "segscope-apply" in by_kind(docs, "Job") and "segscope-controller" in by_kind(docs, "Deployment")
    assert "CronJob" not in {d["kind"] for d in docs}  # `controller run` replaced the drift CronJob


def test_prod_uses_external_services_and_cert_manager(built):
    docs = built["prod"]
    assert not by_kind(docs, "StatefulSet") and "segscope-grafana" not in by_kind(docs, "Deployment")
    ep = next(d for d in docs if d["metadata"]["name"] == "segscope-endpoints")["data"]
    assert ep["SEGSCOPE_INFLUX_URL"].startswith("https://") and ep["SEGSCOPE_ARANGO_URL"].startswith("https://")
    assert by_kind(docs, "Deployment")["segscope-delay"]["spec"]["replicas"] == 4
    assert "--replication=3" in _topics_args(docs, "segscope-delay")
    certs = by_kind(docs, "Certificate")
    assert {c["spec"]["secretName"] for c in certs.values()} == {"segscope-agent-tls", "segscope-controller-tls"}
    telegraf = by_kind(docs, "Deployment")["segscope-telegraf"]["spec"]["template"]["spec"]
    # the users exist already: no influx-setup; Kafka's login is rendered (components/kafka-sasl-ssl)
    assert [c["name"] for c in telegraf["initContainers"]] == ["kafka-wait", "kafka-config"]
    assert "segscope-credentials" not in by_kind(docs, "Secret")  # the operator's, not in git


def test_jalapeno_uses_jalapenos_services(built):
    docs = built["jalapeno"]
    assert {d["metadata"].get("namespace") for d in docs} == {"jalapeno"}
    ep = next(d for d in docs if d["metadata"]["name"] == "segscope-endpoints")["data"]
    assert ep == {
        "SEGSCOPE_KAFKA_BOOTSTRAP": "broker.jalapeno:9092",
        "SEGSCOPE_INFLUX_URL": "http://influxdb-np.jalapeno:8086",
        "SEGSCOPE_INFLUX_DB": "mdt_db",
        "SEGSCOPE_ARANGO_URL": "http://arangodb.jalapeno:8529",
        "SEGSCOPE_ARANGO_DB": "jalapeno",
    }
    topo = by_kind(docs, "Deployment")["segscope-topology"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in topo["env"]}
    assert env["SEGSCOPE_TOPOLOGY_MODE"] == "jalapeno"
    assert env["SEGSCOPE_TOPOLOGY_JALAPENO_TELEMETRY_TOPIC"] == "jalapeno.telemetry"
    # Jalapeno's mdt_db gets segscope's rollups only: autogen and users are Jalapeno's
    wait, init = by_kind(docs, "Deployment")["segscope-telegraf"]["spec"]["template"]["spec"]["initContainers"]
    assert (wait["name"], init["name"]) == ("kafka-wait", "influx-rollups")  # Kafka first, then the rollups
    assert init["command"] == ["segscope-influx-setup"] and "--rollups-only" in init["args"]
    assert not [a for a in init["args"] if a.startswith("--raw-retention")]
    assert {e["name"] for e in init["env"]} == {"SEGSCOPE_INFLUX_ADMIN_USER", "SEGSCOPE_INFLUX_ADMIN_PASSWORD"}
    assert all(e["valueFrom"]["secretKeyRef"]["optional"] is True for e in init["env"])
    assert (env["SEGSCOPE_TOPOLOGY_JALAPENO_EDGES"], env["SEGSCOPE_TOPOLOGY_JALAPENO_IP_EDGES"]) == (
        "igpv6_graph",
        "ipv6_graph",
    )


def test_summary_component_sets_the_summary_in_the_three_processors(tmp_path):
    """kustomize/components/summary: the variables of processors.topology.summary.enabled (the chart's
    test says the same of Helm), accepted by each processor's settings."""
    from processors.delay.config import DelayConfig
    from processors.inline.config import InlineConfig
    from processors.loss.config import LossConfig
    from processors.topology.config import TopologyConfig
    from segscope_schemas.names import TOPIC_METRICS_NEWEST

    root = tmp_path / "kustomize"
    shutil.copytree(REPO / "kustomize", root, ignore=shutil.ignore_patterns("secrets", "overlays"))
    overlay = root / "overlays" / "summary"
    overlay.mkdir(parents=True)
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [../../base]\n"
        "components: [../../components/summary]\n"
    )
    text = run([tool("kustomize"), "build", str(overlay)]).stdout
    kubeconform(text)
    deps = by_kind([d for d in yaml.safe_load_all(text) if d], "Deployment")
    for name, config in (("delay", DelayConfig), ("loss", LossConfig), ("inline", InlineConfig),
                         ("topology", TopologyConfig)):  # fmt: skip
        env = {
            e["name"]: e.get("value")
            for e in deps[f"segscope-{name}"]["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        assert (env["SEGSCOPE_TOPIC_METRICS_NEWEST"], env["SEGSCOPE_SUMMARY_INTERVAL_S"]) == (
            TOPIC_METRICS_NEWEST,
            "10",
        )
        cfg = config.from_env({"SEGSCOPE_TAI_UTC_OFFSET_S": "37", **{k: v for k, v in env.items() if v is not None}})
        assert cfg.newest_topic == TOPIC_METRICS_NEWEST
    assert "SEGSCOPE_TOPIC_METRICS_NEWEST" not in str(deps["segscope-telegraf"])
