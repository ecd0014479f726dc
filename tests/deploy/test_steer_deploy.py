"""segscope-steer in the deployment files: the chart's Deployment (steer.enabled), the kustomize
components steer and steer-kafka-sasl-ssl. Offline, like test_chart.py; the rendered container runs
against a SASL_SSL Kafka in tests/e2e/test_kafka_security.py (test_chart_steer_runs_as_the_controller_role)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import yaml

from tests.deploy.k8s import (
    CHART,
    REPO,
    by_kind,
    helm_template,
    helm_template_text,
    kube_score_critical,
    kubeconform,
    run,
    tool,
)
from tests.deploy.test_kafka_security_render import check_role

INTENT = REPO / "controller" / "examples" / "tri3_steering.yaml"
ON = ["--set", "steer.enabled=true", "--set-file", f"controller.intent={INTENT}"]
PROD = ["-f", str(CHART / "examples" / "prod.yaml")]


def steer_container(docs: list[dict]) -> tuple[dict, dict, dict]:
    dep = by_kind(docs, "Deployment")["segscope-steer"]
    spec = dep["spec"]["template"]["spec"]
    return dep, spec, spec["containers"][0]


def test_off_by_default_and_needs_the_intent():
    assert "segscope-steer" not in by_kind(helm_template(), "Deployment")
    assert "segscope-steer" not in by_kind(helm_template("--set-file", f"controller.intent={INTENT}"), "Deployment")
    r = subprocess.run(
        [tool("helm"), "template", "s", str(CHART), "--set", "steer.enabled=true"], capture_output=True, text=True
    )
    assert r.returncode != 0 and "steer.enabled needs controller.enabled and controller.intent" in r.stderr


def test_steer_deployment():
    """Two replicas, the controller's intent ConfigMap and client certificate, health port and
    probes, non-root read-only, spread over nodes, a PDB; its args are the steer's own."""
    from controller.steer.__main__ import parser

    docs = helm_template(*ON)
    dep, spec, c = steer_container(docs)
    assert dep["spec"]["replicas"] == 2
    assert c["command"] == ["segscope-steer"] and c["args"][0] == "/etc/segscope/intent/intent.yaml"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["intent"]["configMap"]["name"] == "segscope-intent"
    assert "segscope-intent" in by_kind(docs, "ConfigMap")
    assert volumes["tls"]["secret"]["secretName"] == "segscope-controller-tls"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["SEGSCOPE_TLS_DIR"] == "/etc/segscope/tls" and env["SEGSCOPE_AGENT_SERVER_NAME"] == "segscope-agent"
    assert c["ports"][0]["containerPort"] == 9646 and "--health=0.0.0.0:9646" in c["args"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz" and c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    sc = c["securityContext"]
    assert (
        sc["readOnlyRootFilesystem"] is True and sc["runAsNonRoot"] is True and sc["capabilities"] == {"drop": ["ALL"]}
    )
    assert spec["automountServiceAccountToken"] is False
    assert spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert "segscope-steer" in by_kind(docs, "PodDisruptionBudget")
    args = parser().parse_args(
        [a.replace("$(SEGSCOPE_KAFKA_BOOTSTRAP)", "k:9092").replace("$(POD_NAME)", "p") for a in c["args"]]
    )
    assert (args.kafka, args.leader_election, args.replica, args.policy_set, args.dry_run) == (
        "k:9092",
        "kafka",
        "p",
        "intent",
        False,
    )
    # the steer and the controller's Deployment select different pods
    ctl = by_kind(docs, "Deployment")["segscope-controller"]["spec"]["selector"]["matchLabels"]
    assert ctl != dep["spec"]["selector"]["matchLabels"]


def test_dry_run_one_replica_and_policy_set():
    docs = helm_template(
        *ON, "--set", "steer.dryRun=true", "--set", "steer.replicas=1", "--set", "steer.policySet=core"
    )
    dep, _, c = steer_container(docs)
    assert dep["spec"]["replicas"] == 1 and "--dry-run" in c["args"] and "--policy-set=core" in c["args"]
    assert "segscope-steer" not in by_kind(docs, "PodDisruptionBudget")  # one replica: a PDB would block drains


def test_schema_refuses_a_bad_policy_set():
    r = subprocess.run(
        [tool("helm"), "template", "s", str(CHART), *ON, "--set", "steer.policySet=a b"],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0 and "policySet" in r.stderr


def test_prod_rendering_logs_in_as_the_controller_role_and_validates():
    text = helm_template_text(*PROD, *ON)
    kubeconform(text)
    critical = kube_score_critical(text)
    assert not critical, "\n".join(critical)
    docs = [d for d in yaml.safe_load_all(text) if d]
    _, spec, c = steer_container(docs)
    check_role(spec, c, "controller", "segscope-kafka-controller")


def test_kustomize_components(tmp_path):
    """The prod overlay with components/steer and steer-kafka-sasl-ssl: valid, the steer reads the
    overlay's generated intent (hashed name) and logs in as the controller role."""
    root = tmp_path / "kustomize"
    shutil.copytree(REPO / "kustomize", root, ignore=shutil.ignore_patterns("secrets"))
    overlay = root / "overlays" / "prod" / "kustomization.yaml"
    k = yaml.safe_load(overlay.read_text())
    k["components"] += ["../../components/steer", "../../components/steer-kafka-sasl-ssl"]
    overlay.write_text(yaml.safe_dump(k, sort_keys=False))
    text = run([tool("kustomize"), "build", str(root / "overlays" / "prod")]).stdout
    kubeconform(text)
    docs = [d for d in yaml.safe_load_all(text) if d]
    _, spec, c = steer_container(docs)
    intent_cm = next(v for v in spec["volumes"] if v["name"] == "intent")["configMap"]["name"]
    assert intent_cm.startswith("segscope-intent-") and intent_cm in by_kind(docs, "ConfigMap")
    assert next(v for v in spec["volumes"] if v["name"] == "tls")["secret"]["secretName"] == "segscope-controller-tls"
    check_role(spec, c, "controller", "segscope-kafka-controller")
    assert "segscope-steer" in by_kind(docs, "PodDisruptionBudget")
    # off in every shipped overlay: it changes routes
    for name in ("dev", "prod", "jalapeno"):
        shipped = yaml.safe_load((REPO / "kustomize" / "overlays" / name / "kustomization.yaml").read_text())
        assert not [c for c in shipped.get("components", []) if "steer" in c], name


def test_generated_components_match_the_chart():
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "render_kustomize.py"), "--check", "--helm", tool("helm")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr
