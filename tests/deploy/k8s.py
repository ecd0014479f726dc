"""Helpers of the deploy tests: the Kubernetes tools scripts/k8s_tools.sh builds into .local/bin, rendering
the chart and the overlays, and walking the rendered objects' containers."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "segscope"
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
OVERLAYS = ("dev", "prod", "jalapeno")
BIN = REPO / ".local" / "bin"
SCHEMAS = REPO / ".local" / "k8s-schemas"
KUBE_VERSION = "1.33.0"
# cert-manager's kinds: kubernetes-validate has no schemas for CRDs (test_chart checks their fields)
CRD_KINDS = ("Certificate", "Issuer")


BUILD_WAIT_S = 1200


def _build_running() -> bool:
    try:
        pid = int((BIN / ".k8s-tools.pid").read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    status = (BIN / ".k8s-tools.status").read_text().split() if (BIN / ".k8s-tools.status").exists() else []
    return not status or status[-1] == "building"


def tool(name: str) -> str:
    """A tool's path, once scripts/k8s_tools.sh (started in the background by scripts/test.sh)
    has built it."""
    deadline = time.monotonic() + BUILD_WAIT_S
    while _build_running() and time.monotonic() < deadline:
        time.sleep(1.0)
    status = BIN / ".k8s-tools.status"
    if status.exists() and status.read_text().strip().splitlines()[-1].startswith("failed"):
        log = (BIN / ".k8s-tools.log").read_text(errors="replace")[-3000:] if (BIN / ".k8s-tools.log").exists() else ""
        pytest.fail(f"scripts/k8s_tools.sh {status.read_text().strip().splitlines()[-1]}\n{log}")
    path = BIN / name
    if not os.access(path, os.X_OK) or not (SCHEMAS / f"v{KUBE_VERSION}-standalone-strict" / ".complete").exists():
        pytest.fail(f"{path} or {SCHEMAS} missing: run `bash scripts/k8s_tools.sh` (scripts/test.sh does)")
    return str(path)


def run(cmd: list[str], stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    home = Path(tempfile.gettempdir()) / "segscope-helm-home"
    for var, sub in (("HELM_CACHE_HOME", "cache"), ("HELM_CONFIG_HOME", "config"), ("HELM_DATA_HOME", "data")):
        env.setdefault(var, str(home / sub))
    out = subprocess.run(cmd, input=stdin, capture_output=True, text=True, env=env, timeout=120)
    if check and out.returncode != 0:
        what = " ".join(cmd[:3])
        pytest.fail(f"{what} ... failed (rc {out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out


def helm_template_text(*args: str, release: str = "segscope", namespace: str = "segscope") -> str:
    return run([tool("helm"), "template", release, str(CHART), "--namespace", namespace, *args]).stdout


def helm_template(*args: str, **kw) -> list[dict]:
    return [d for d in yaml.safe_load_all(helm_template_text(*args, **kw)) if d]


def kustomize_build_text(overlay: str) -> str:
    return run([tool("kustomize"), "build", str(REPO / "kustomize" / "overlays" / overlay)]).stdout


def kubeconform(text: str) -> str:
    out = run(
        [
            tool("kubeconform"), "-strict", "-summary", "-kubernetes-version", KUBE_VERSION,
            "-schema-location", str(SCHEMAS), "-skip", ",".join(CRD_KINDS), "-",
        ],
        stdin=text,
        check=False,
    )  # fmt: skip
    assert out.returncode == 0, f"kubeconform:\n{out.stdout}\n{out.stderr}"
    return out.stdout


def kube_score_critical(text: str) -> list[str]:
    """kube-score's critical findings, with CPU limits and imagePullPolicy Always not required
    (why: tests/deploy/test_chart.py::test_kube_score_has_no_unjustified_critical)."""
    out = run(
        [tool("kube-score"), "score", "--ignore-container-cpu-limit", "--ignore-test",
         "container-image-pull-policy", "--output-format", "ci", "-"],
        stdin=text, check=False,
    )  # fmt: skip
    assert "[OK]" in out.stdout, out.stdout[-2000:] + out.stderr  # kube-score did score the objects
    return [line for line in out.stdout.splitlines() if line.startswith("[CRITICAL]")]


def by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pod_spec(doc: dict) -> dict | None:
    spec = doc.get("spec", {})
    if doc["kind"] == "CronJob":
        return spec["jobTemplate"]["spec"]["template"]["spec"]
    if "template" in spec:
        return spec["template"]["spec"]
    return None


def containers(docs: list[dict]):
    """(workload doc, pod spec, container, is_init) for every container of every workload."""
    for d in docs:
        ps = pod_spec(d)
        if ps is None:
            continue
        for c in ps.get("initContainers", []):
            yield d, ps, c, True
        for c in ps["containers"]:
            yield d, ps, c, False
