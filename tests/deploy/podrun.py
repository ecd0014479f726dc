"""Run a container of the rendered chart on this machine, as the kubelet would: its command and
args with $(VAR) expanded from its env, envFrom ConfigMaps, Secret keys and the downward API; its
ConfigMap, Secret and emptyDir volumes as directories; hostPath as the host path; its
securityContext's capabilities as the process's bounding set. Only two things are translated,
both the pod network's doing: the cluster's service names become local addresses (`endpoints`),
and a root-namespace process gets free ports for its container ports (`ports`). A renamed flag,
a missing variable or a wrong mount path then fails here, not in a cluster.

The command is looked up in `COMMANDS` (the images' programs): segscope's entry points from
pyproject.toml run from this checkout, Telegraf from .local/bin, influxd from Debian, Kafka's
scripts as the jars' main classes. A container whose image runs its own entrypoint (Grafana,
ArangoDB) has no `command` and cannot run here.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KAFKA_LIB = REPO / ".local" / "kafka" / "lib"
VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def entry_points() -> dict[str, str]:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return data["project"]["scripts"]


def _java(main_class: str, env: dict[str, str]) -> list[str]:
    heap = env.get("KAFKA_HEAP_OPTS", "-Xmx512m").split()
    log4j = REPO / "services" / "kafka" / "log4j2.properties"
    return [
        shutil.which("java") or "java", *heap, "-XX:TieredStopAtLevel=1", f"-Dlog4j2.configurationFile={log4j}",
        "-cp", f"{KAFKA_LIB}/*", main_class,
    ]  # fmt: skip


def command_for(cmd0: str, env: dict[str, str]) -> list[str]:
    scripts = entry_points()
    if cmd0 in scripts:
        module, func = scripts[cmd0].split(":")
        code = f"import sys; sys.argv[0] = {cmd0!r}; from {module} import {func}; sys.exit({func}())"
        return [sys.executable, "-c", code]
    if cmd0 == "telegraf":
        return [str(REPO / ".local" / "bin" / "telegraf")]
    if cmd0 == "influxd":
        return [shutil.which("influxd") or "/usr/bin/influxd"]
    if cmd0 == "/opt/kafka/bin/kafka-storage.sh":
        return _java("kafka.tools.StorageTool", env)
    if cmd0 == "/opt/kafka/bin/kafka-server-start.sh":
        return _java("kafka.Kafka", env)
    raise KeyError(f"no local program for the image command {cmd0!r}")


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: a defined variable is replaced, an undefined one is kept."""
    return VAR.sub(lambda m: env.get(m.group(1), m.group(0)), value)


@dataclass
class Container:
    workload: str
    name: str
    argv: list[str]
    env: dict[str, str]
    capabilities: list[str] | None  # securityContext add list when ALL is dropped
    ports: dict[int, int] = field(default_factory=dict)  # container port -> local port
    mounts: dict[str, Path] = field(default_factory=dict)


def find(docs: list[dict], workload: str, container: str) -> tuple[dict, dict, dict]:
    for d in docs:
        if d["metadata"]["name"] != workload or d["kind"] not in (
            "Deployment",
            "StatefulSet",
            "DaemonSet",
            "Job",
            "CronJob",
        ):
            continue
        spec = d["spec"]
        pod = spec["jobTemplate"]["spec"]["template"]["spec"] if d["kind"] == "CronJob" else spec["template"]["spec"]
        for c in pod.get("initContainers", []) + pod["containers"]:
            if c["name"] == container:
                return d, pod, c
    raise KeyError(f"{workload}/{container} is not in the rendering")


def _object(docs, kind, name) -> dict:
    for d in docs:
        if d["kind"] == kind and d["metadata"]["name"] == name:
            return d
    raise KeyError(f"{kind} {name} is not in the rendering (a pod refers to it)")


def _translate(value: str, endpoints: dict[str, str]) -> str:
    for cluster, local in endpoints.items():
        value = value.replace(cluster, local)
    return value


def prepare(
    docs: list[dict],
    workload: str,
    container: str,
    root: Path,
    *,
    node_name: str = "node-1",
    endpoints: dict[str, str] | None = None,
    ports: dict[int, int] | None = None,
) -> Container:
    endpoints = endpoints or {}
    doc, pod, c = find(docs, workload, container)
    env: dict[str, str] = {}
    for src in c.get("envFrom", []):
        cm = _object(docs, "ConfigMap", src["configMapRef"]["name"])
        env.update({k: _translate(str(v), endpoints) for k, v in cm.get("data", {}).items()})
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = _translate(expand(str(e["value"]), env), endpoints)
            continue
        vf = e["valueFrom"]
        if "secretKeyRef" in vf:
            ref = vf["secretKeyRef"]
            env[e["name"]] = base64.b64decode(_object(docs, "Secret", ref["name"])["data"][ref["key"]]).decode()
        elif "configMapKeyRef" in vf:
            ref = vf["configMapKeyRef"]
            env[e["name"]] = _object(docs, "ConfigMap", ref["name"])["data"][ref["key"]]
        elif vf.get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
            env[e["name"]] = node_name
        elif vf.get("fieldRef", {}).get("fieldPath") == "metadata.name":  # the pod's name: one pod here
            env[e["name"]] = f"{workload}-0"
        else:
            raise KeyError(f"{workload}/{container}: env {e['name']}: {vf} is not supported here")
    ports = dict(ports or {})
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for claim in doc["spec"].get("volumeClaimTemplates", []):  # a StatefulSet's persistent volume
        volumes[claim["metadata"]["name"]] = {"name": claim["metadata"]["name"], "emptyDir": {}}
    mounts: dict[str, Path] = {}
    for m in c.get("volumeMounts", []):
        v = volumes[m["name"]]
        if "hostPath" in v:
            mounts[m["mountPath"]] = Path(v["hostPath"]["path"])
        elif any(k in v for k in ("configMap", "secret", "emptyDir")):
            # one directory per pod volume: an init container and the main one share it
            mounts[m["mountPath"]] = root / workload / m["name"]
            mounts[m["mountPath"]].mkdir(parents=True, exist_ok=True)
        else:
            raise KeyError(f"{workload}/{container}: volume {m['name']} kind not supported here")

    paths = sorted((p for p in mounts if p != str(mounts[p])), key=len, reverse=True)
    moved = re.compile(r"(?<![\w/])(" + "|".join(map(re.escape, paths)) + r')(?=/|$|\s|")') if paths else None

    def local(value: str) -> str:
        """The pod's view -> this machine's: services, mount paths, ports."""
        value = _translate(expand(value, env), endpoints)
        if moved:  # one pass, longest mount path first: a replaced path is never replaced again
            value = moved.sub(lambda m: str(mounts[m.group(1)]), value)
        for cport, lport in ports.items():
            value = re.sub(rf":{cport}\b", f":{lport}", value)
        return value

    for m in c.get("volumeMounts", []):
        v = volumes[m["name"]]
        target = mounts[m["mountPath"]]
        if "configMap" in v:  # config files see the same pod-to-host translation as the args
            for key, text in _object(docs, "ConfigMap", v["configMap"]["name"]).get("data", {}).items():
                (target / key).write_text(local(text))
        elif "secret" in v:
            for key, b64 in _object(docs, "Secret", v["secret"]["secretName"])["data"].items():
                (target / key).write_bytes(base64.b64decode(b64))
                (target / key).chmod(v["secret"].get("defaultMode", 0o644))

    env = {k: local(v) for k, v in env.items()}
    args = [local(a) for a in c.get("command", []) + c.get("args", [])]
    if not c.get("command"):
        raise KeyError(f"{workload}/{container}: the image's own entrypoint runs (no command)")
    argv = command_for(c["command"][0], env) + args[1:]
    if "--" in args[1:]:  # a wrapper's command (segscope-agent-supervise -- segscope-agent ...): the same lookup
        cut = args.index("--", 1)
        if cut + 1 < len(args) and args[cut + 1] in entry_points():
            inner = command_for(args[cut + 1], env) + args[cut + 2 :]
            argv = command_for(c["command"][0], env) + args[1 : cut + 1] + inner
    sc = c.get("securityContext", {})
    caps = sc.get("capabilities", {})
    added = caps.get("add", []) if "ALL" in caps.get("drop", []) else None
    return Container(workload, container, argv, env, added, ports, mounts)


def base_env() -> dict[str, str]:
    """What an image's environment gives every program: PATH, and here the checkout on PYTHONPATH
    (the image has segscope installed)."""
    return {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "PYTHONPATH": f"{REPO}:{REPO / 'schemas' / 'python'}",
        "SEGSCOPE_BUILD_DIR": str(REPO / "build"),
        "HOME": "/tmp",
    }


def wrap(c: Container, netns: str | None = None) -> list[str]:
    """The argv with the pod's network namespace (nsenter: only the network, so /sys/fs/bpf stays
    the host's bpffs as with the hostPath mount) and its capabilities as the bounding set."""
    argv = list(c.argv)
    if c.capabilities is not None:
        caps = ",".join(["-all"] + [f"+{cap.lower()}" for cap in c.capabilities])
        argv = ["setpriv", f"--bounding-set={caps}", "--inh-caps=-all", "--", *argv]
    if netns:
        argv = ["nsenter", f"--net=/run/netns/{netns}", "--", *argv]
    return argv


def run_to_end(c: Container, log: Path, timeout: float = 120, netns: str | None = None) -> subprocess.CompletedProcess:
    with open(log, "w") as f:
        return subprocess.run(wrap(c, netns), env={**base_env(), **c.env}, stdout=f, stderr=subprocess.STDOUT,
                              timeout=timeout)  # fmt: skip


def start(c: Container, log: Path, netns: str | None = None) -> subprocess.Popen:
    f = open(log, "w")  # noqa: SIM115 - closed by stop()
    proc = subprocess.Popen(
        wrap(c, netns), env={**base_env(), **c.env}, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
    )
    proc.log_file = f
    return proc


def stop(proc: subprocess.Popen, timeout: float = 20) -> int:
    import signal

    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log_file = getattr(proc, "log_file", None)
    if log_file:
        log_file.close()
    return proc.returncode
