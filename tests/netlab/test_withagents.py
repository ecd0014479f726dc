"""`segscope-netlab up TOPOLOGY --agents` (netlab/withagents.py), as the README's "Try your own
topology" uses it: mesh8_two_paths with an agent per SRv6 node, a stack of its own, the
processors; the shipped intent applied from the printed environment (`source env.sh`), its two
STAMP sessions' delay in InfluxDB, the report; `down` leaves no namespace, process, pin or service.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest
import requests

from netlab.lab import RUN_ROOT

pytestmark = [pytest.mark.datapath, pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]
PY = str(REPO / ".local" / "venv" / "bin" / "python")
PREFIX = os.environ.get("SEGSCOPE_NETLAB_AGENTS_TEST_PREFIX", "nwa")
TOPOLOGY = "netlab/topologies/mesh8_two_paths.yaml"
INTENT = "controller/examples/mesh8_two_paths.yaml"
SRV6_NODES = {"A", "R1", "R2", "R3", "R4", "B"}


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def port_base() -> int:
    """Four free ports for the lab's own stack: next to this session's stack if it has a base."""
    base = os.environ.get("SEGSCOPE_STACK_PORT_BASE")
    candidates = [int(base) + 10] if base else []
    candidates += list(range(35900, 35990, 4))
    for b in candidates:
        if all(port_free(b + i) for i in range(4)):
            return b
    raise RuntimeError("no four free ports for the lab's stack")


def cli(*args: str, timeout: float = 420) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "netlab", *args], capture_output=True, text=True, cwd=REPO, timeout=timeout)


def sourced(command: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """command run by bash after `source env.sh`, as a person would."""
    env_sh = RUN_ROOT / PREFIX / "env.sh"
    path = f"{REPO / '.local' / 'venv' / 'bin'}:{os.environ['PATH']}"
    return subprocess.run(
        ["bash", "-c", f"source {env_sh} && {command}"],
        capture_output=True, text=True, cwd=REPO, timeout=timeout, env={**os.environ, "PATH": path},
    )  # fmt: skip


@pytest.fixture(scope="module")
def lab():
    base = port_base()
    t0 = time.monotonic()
    up = cli("up", TOPOLOGY, "--prefix", PREFIX, "--agents", "--port-base", str(base))
    print(f"\n[netlab] up --agents in {time.monotonic() - t0:.1f} s")
    try:
        assert up.returncode == 0, up.stderr[-4000:]
        yield {"base": base, "up": up, "state": json.loads((RUN_ROOT / PREFIX / "pipeline.json").read_text())}
    finally:
        cli("down", "--prefix", PREFIX)  # the last test checks that down leaves nothing; this is the safety net


def test_up_prints_the_environment_of_the_intent(lab):
    exports = dict(re.findall(r"^export (\w+)=(\S+)$", lab["up"].stdout, re.M))
    agents = {k.removeprefix("SEGSCOPE_AGENT_") for k in exports if k.startswith("SEGSCOPE_AGENT_")}
    assert agents == SRV6_NODES  # the hosts H1 and H2 get no agent
    assert exports["SEGSCOPE_KAFKA"] == f"127.0.0.1:{lab['base']}"
    assert exports["SEGSCOPE_INFLUX_URL"] == f"http://127.0.0.1:{lab['base'] + 2}"
    assert (Path(exports["SEGSCOPE_CERTS"]) / "controller.pem").is_file()
    written = (RUN_ROOT / PREFIX / "env.sh").read_text()
    assert all(f"export {k}={v}\n" in written for k, v in exports.items())


def test_apply_shipped_intent_then_delay_and_report(lab, tmp_path):
    apply = sourced(f"python -m controller apply {INTENT}")
    assert apply.returncode == 0, apply.stdout + apply.stderr
    again = sourced(f"python -m controller diff {INTENT}")
    assert again.returncode == 0, again.stdout + again.stderr  # 0: nothing left to do

    exports = dict(re.findall(r"^export (\w+)=(\S+)$", lab["up"].stdout, re.M))

    def sessions_with_rows() -> set[str]:
        q = 'SELECT count("mean_us") FROM stamp_delay WHERE time > now() - 5m GROUP BY "ssid"'
        reply = requests.get(
            f"{exports['SEGSCOPE_INFLUX_URL']}/query", params={"db": exports["SEGSCOPE_INFLUX_DB"], "q": q}, timeout=10
        ).json()
        series = reply.get("results", [{}])[0].get("series", [])
        return {s["tags"]["ssid"] for s in series if s["values"][0][1] >= 3}

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and sessions_with_rows() != {"1", "2"}:
        time.sleep(2)
    assert sessions_with_rows() == {"1", "2"}, (RUN_ROOT / PREFIX / "delay-processor.log").read_text()[-3000:]
    status = sourced(f"python -m controller status {INTENT} --json")
    assert status.returncode == 0, status.stderr
    report = tmp_path / "report.html"
    r = sourced(f"python -m dashboards.report --since 10m --out {report}", timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    text = report.read_text()
    assert "session 1 from A" in text and "session 2 from A" in text, text[:3000]


def running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_down_leaves_nothing(lab):
    state = lab["state"]
    pids = [info["pid"] for group in ("agents", "processors") for info in state[group].values()]
    assert len(pids) == len(SRV6_NODES) + 3
    stack_pids = []
    for name in ("kafka", "influxdb", "telegraf"):
        pid_file = Path(state["stack"]["run_dir"]) / name / f"{name}.pid"
        if pid_file.exists():
            stack_pids.append(int(pid_file.read_text().split()[0]))
    assert len(stack_pids) == 3 and sorted(state["stack"]["started"]) == ["influxdb", "kafka", "telegraf"]
    down = cli("down", "--prefix", PREFIX)
    assert down.returncode == 0, down.stderr
    report = json.loads(down.stdout)
    assert set(report["stopped"].values()) == {"stopped (SIGTERM)"}, report["stopped"]  # none had to be killed
    assert sorted(report["services_stopped"]) == ["influxdb", "kafka", "telegraf"]
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [ln for ln in netns.splitlines() if ln.startswith(f"{PREFIX}-")], netns
    # a process `down` saw end can stay in /proc for a moment (a zombie until init reaps it)
    deadline = time.monotonic() + 10
    while (alive := [pid for pid in pids + stack_pids if running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive, alive
    assert not list(Path("/sys/fs/bpf/segscope").glob(f"{PREFIX}-*"))
    assert all(port_free(lab["base"] + i) for i in (0, 2)), "Kafka or InfluxDB still listens"
    assert not (RUN_ROOT / PREFIX / "pipeline.json").exists()
