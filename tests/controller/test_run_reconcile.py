"""`controller run`: a controller that keeps the nodes at the intent, with a second replica.

One lab for the module (netlab line5_bare, prefix `rcn`, SEGSCOPE_RUN_TEST_PREFIX), agents on A,
R and B with Kafka, and the `stack` fixture (Kafka for the leader election and the repairs'
lines, Telegraf and InfluxDB for `status`). The intent: controller/examples/demo_line5.yaml's SRv6
objects and STAMP session (ssid 1, running until stopped) plus the alternate-marking flow 7 A -> B
of line5_loss.yaml. Replicas run as `python -m controller run FILE --kafka ... --health ...`.

- a reboot of A (agent and its data-path processes killed, its programs and pins, its state dir
  and its SRv6 routes gone, the agent started again): within 5 s of the new agent's start the
  session and the flow run again on A with no `apply`, and the repair is reported (log, the
  /metrics counter, `status`);
- a second replica stands by (no RPC at all) while the first leads, and takes over after a kill -9
  of the first; then it repairs a restart of A's agent whose senders died;
- what the controller does not own (a policy added by hand on A) is left alone, while drift of
  what it owns (R's End SID deleted by hand) is repaired at the periodic reconcile.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from agent.keeper import ProcRef
from controller.agents import AgentClient
from controller.intent import load_intent
from controller.launch import AgentSet
from netlab import Lab, teardown
from segscope_proto.segscope.agent.v1 import flowmon_pb2, srv6_pb2, stamp_pb2
from segscope_schemas import names
from tests.isolation import own_name

REPO = Path(__file__).resolve().parents[2]
PREFIX = os.environ.get("SEGSCOPE_RUN_TEST_PREFIX") or own_name("rcn")  # tagged per test group (tests/isolation.py)
TOPOLOGY = REPO / "netlab" / "topologies" / "line5_bare.yaml"
INTERVAL_S = 5  # the periodic reconcile (drift without a restart)
REPAIR_BUDGET_S = 5.0

pytestmark = [pytest.mark.e2e, pytest.mark.datapath]


def write_intent(path: Path) -> None:
    doc = yaml.safe_load((REPO / "controller" / "examples" / "demo_line5.yaml").read_text())
    certs = "${SEGSCOPE_CERTS}"
    for node in doc["nodes"].values():
        node["tls"] = {"ca": f"{certs}/ca.pem", "cert": f"{certs}/controller.pem", "key": f"{certs}/controller.key"}
    doc["stamp_sessions"][0]["rate_pps"] = 50
    doc["flows"] = [
        {
            "flow_id": 7,
            "ingress": {"node": "A", "dev": "a0"},
            "egress": {"node": "B", "dev": "b0"},
            "segs": ["fc00:2::e", "fc00:3::d6"],
            "method": "dscp",
            "period_ms": 1000,
        }
    ]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


class Replica:
    def __init__(self, name: str, intent: Path, run_dir: Path, kafka: str, env: dict[str, str]):
        self.name = name
        self.log_path = run_dir / f"run-{name}.log"
        cmd = [sys.executable, "-m", "controller", "run", str(intent), "--kafka", kafka, "--replica", name,
               "--health", "127.0.0.1:0", "--interval", str(INTERVAL_S), "--stats-interval", "1"]  # fmt: skip
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True, env=env
            )
        deadline = time.monotonic() + 30
        while not (m := re.search(r"controller health on http://127.0.0.1:(\d+)/", self.log())):
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log()[-3000:]
            time.sleep(0.1)
        self.port = int(m.group(1))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5).read().decode()
        return {
            m.group(1): float(m.group(2))
            for m in re.finditer(r"^segscope_controller_(\w+)\{[^}]*\} (\S+)$", text, re.M)
        }

    def wait_metrics(self, ok, timeout_s: float = 15.0) -> dict[str, float]:
        """The counters once ok(counters) holds (they are a line the replica refreshes every second)."""
        deadline = time.monotonic() + timeout_s
        while not ok(m := self.metrics()):
            assert time.monotonic() < deadline, m
            time.sleep(0.2)
        return m

    def wait_log(self, pattern: str, timeout_s: float) -> float:
        """Seconds until `pattern` appears in the log (AssertionError after timeout_s)."""
        t0 = time.monotonic()
        while not re.search(pattern, self.log()):
            assert time.monotonic() - t0 < timeout_s, (
                f"{self.name}: no {pattern!r} in {timeout_s} s:\n{self.log()[-3000:]}"
            )
            assert self.proc.poll() is None, self.log()[-3000:]
            time.sleep(0.05)
        return time.monotonic() - t0

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                return self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode


@pytest.fixture(scope="module")
def world(stack, bpffs, tmp_path_factory):
    teardown(PREFIX)
    run_dir = tmp_path_factory.mktemp("rcn")
    lab = Lab.up(TOPOLOGY, prefix=PREFIX)
    saved = dict(os.environ)
    agents = None
    replicas: dict[str, Replica] = {}
    intent_path = run_dir / "intent.yaml"
    write_intent(intent_path)
    w = {"lab": lab, "intent": intent_path, "run_dir": run_dir, "replicas": replicas}
    try:
        agents = w["agents"] = AgentSet.start(lab, ["A", "R", "B"], run_dir / "agents", kafka=stack.kafka_bootstrap)
        os.environ.update(agents.env)
        w["env"] = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'schemas' / 'python'}"}
        yield w
    finally:
        codes = {n: r.stop() for n, r in replicas.items()}
        if agents is not None:
            try:  # the measurement down through the controller (apply removes what run never would)
                subprocess.run([sys.executable, "-m", "controller", "apply", str(_empty_intent(w))], env=w.get("env"),
                               cwd=REPO, capture_output=True, timeout=120)  # fmt: skip
            finally:
                agents.stop()
        os.environ.clear()
        os.environ.update(saved)
        lab.down()
        left = subprocess.run(["ps", "-eo", "stat,args"], capture_output=True, text=True).stdout.splitlines()
        left = [x for x in left if not x.startswith("Z") and (f"/{PREFIX}-" in x or f"--netns {PREFIX}-" in x)]
        assert left == [], f"processes outlived the test: {left}"
        print(f"\n[run] replicas' exit codes {codes}")


def _empty_intent(w: dict) -> Path:
    """The intent without measurement (and without routes): apply takes the lab back to bare."""
    path = w["run_dir"] / "empty.yaml"
    doc = yaml.safe_load(w["intent"].read_text())
    for k in ("local_sids", "policies", "stamp_sessions", "flows"):
        doc[k] = []
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def a_state(w) -> dict:
    """What runs on A: the sender of ssid 1 (state, pid), flow 7's TX side, the policy, A's SID."""
    c = AgentClient(load_intent(w["intent"]).nodes["A"])
    try:
        sess = c.stamp.ListStampSessions(stamp_pb2.ListStampSessionsRequest(), timeout=5).sessions
        flows = c.flowmon.ListFlowMonitors(flowmon_pb2.ListFlowMonitorsRequest(), timeout=5).monitors
        pols = c.srv6.ListPolicies(srv6_pb2.ListPoliciesRequest(), timeout=5).policies
        sids = c.srv6.ListLocalSids(srv6_pb2.ListLocalSidsRequest(), timeout=5).local_sids
    finally:
        c.close()
    s1 = next((s for s in sess if s.session.ssid == 1 and s.session.role == stamp_pb2.STAMP_ROLE_SENDER), None)
    doc = json.loads((Path("/run/segscope") / w["lab"].ns("A") / "datapath.json").read_text())
    sessions = (doc.get("stamp") or {}).get("sessions", [])
    pid = next((sd["sender"] for sd in sessions if sd["spec"]["ssid"] == 1 and sd.get("sender")), None)
    return {
        "running": s1 is not None and s1.state == stamp_pb2.STAMP_SESSION_STATE_RUNNING,
        "sender": ProcRef.from_json(pid),
        "flow_tx": any(m.monitor.flow_id == 7 and m.monitor.side == flowmon_pb2.FLOW_MONITOR_SIDE_TX for m in flows),
        "policy": any(p.destination == "fd00:b::/64" for p in pols),
        "sid": any(s.local_sid.sid == "fc00:1::d6" for s in sids),
    }


def a_runs(st: dict) -> bool:
    return st["running"] and st["sender"] is not None and st["sender"].alive() and st["flow_tx"] and st["policy"]


def agent_starts(agents: AgentSet, node: str) -> list[float]:
    """Wall-clock times at which the agents of `node` started serving (their own log lines)."""
    found = re.findall(rf"^(\S+ \S+) agent\[{node}\] INFO segscope.agent: agent \S+ for node {node} .*listening on",
                       agents.logs[node].read_text(errors="replace"), re.M)  # fmt: skip
    return [dt.datetime.strptime(t, "%Y-%m-%d %H:%M:%S,%f").timestamp() for t in found]


def respawn(w, node: str) -> float:
    """Start `node`'s agent again; returns when it started serving (its log line, written just after
    its health service says SERVING, so wait for it)."""
    n = len(agent_starts(w["agents"], node))
    w["agents"].respawn(node)
    deadline = time.monotonic() + 10
    while len(starts := agent_starts(w["agents"], node)) <= n:
        assert time.monotonic() < deadline, w["agents"].logs[node].read_text()[-2000:]
        time.sleep(0.02)
    return starts[-1]


def kill_agent_and_children(w, node: str) -> list[int]:
    inst = w["lab"].ns(node)
    doc = json.loads((Path("/run/segscope") / inst / "datapath.json").read_text())
    refs = [
        ProcRef.from_json(doc["stamp"].get("streamer")),
        ProcRef.from_json((doc.get("flowmon") or {}).get("collector")),
    ]
    refs += [ProcRef.from_json(sd.get("sender")) for sd in doc["stamp"]["sessions"]]
    w["agents"].kill(node)
    killed = []
    for r in refs:
        if r is not None and r.alive():
            os.kill(r.pid, signal.SIGKILL)
            killed.append(r.pid)
    return killed


def test_run_repairs_a_rebooted_node_within_5_s(world, stack):
    w = world
    r1 = w["replicas"]["r1"] = Replica("r1", w["intent"], w["run_dir"], stack.kafka_bootstrap, w["env"])
    r1.wait_log(r"leads from now on", 30)
    deadline = time.monotonic() + 60
    while not a_runs(a_state(w)):
        assert time.monotonic() < deadline, r1.log()[-3000:]
        time.sleep(0.5)
    before = r1.wait_metrics(lambda m: m["leader"] == 1 and m["repairs"] >= 8 and m["agents_up"] == 3)

    # the reboot of A: processes, programs, pins, state dir (/run is a tmpfs) and its SRv6 routes gone
    lab, inst = w["lab"], w["lab"].ns("A")
    killed = kill_agent_and_children(w, "A")
    assert len(killed) == 3, killed  # the streamer, the collector, the sender
    build = REPO / "build" / "datapath"
    pins = Path(names.BPFFS_PIN_ROOT) / inst
    subprocess.run([str(build / "stamp_collector"), "detach", "--netns", inst, "--dev", "a0", "--pin-dir",
                    str(pins / "stamp_collector")], check=True, capture_output=True)  # fmt: skip
    subprocess.run([str(build / "altmark_tx"), "detach", "--dev", "a0", "--instance", inst, "--netns", inst],
                   check=True, capture_output=True)  # fmt: skip
    subprocess.run(["rm", "-rf", str(pins), f"/run/segscope/{inst}"], check=True)
    for route in (["fd00:b::/64"], ["fc00:1::d6"]):
        lab.run("A", ["ip", "-6", "route", "del", *route], check=True)
    assert "xdp" not in lab.run("A", ["ip", "link", "show", "a0"], check=True).stdout
    time.sleep(1.0)

    started = respawn(w, "A")
    deadline = time.monotonic() + 30
    while not a_runs(st := a_state(w)):
        assert time.monotonic() < deadline, (st, r1.log()[-3000:])
        time.sleep(0.05)
    took = time.time() - started
    print(f"\n[run] A rebooted: session, flow, policy and SID back {took:.2f} s after the new agent started")
    assert st["sid"]
    assert took <= REPAIR_BUDGET_S, r1.log()[-3000:]
    r1.wait_log(r"repair on A: create .*flow monitor TX tx 7 .*agent_back", 5)  # logged once the call returned
    log = r1.log()
    repairs = re.findall(r"repair on A: (.*) \[(.*)\] \(agent_back, ([\d.]+) s after the agent came back", log)
    rpcs = {rpc for _, calls, _ in repairs for rpc in calls.split(", ")}
    assert {"CreatePolicy", "CreateLocalSid", "Init", "CreateStampSession", "StartStampSession",
            "StartFlowMonitor"} <= rpcs, repairs  # fmt: skip
    print(f"[run] repairs: {[(what.split()[0], calls, after) for what, calls, after in repairs]}")
    after = r1.wait_metrics(lambda m: m["repairs"] - before["repairs"] >= len(repairs))
    assert after["repairs"] - before["repairs"] == len(repairs) and after["repair_errors"] == 0, after

    # status: the repairs, from InfluxDB (segscope.metrics -> Telegraf)
    deadline, out = time.monotonic() + 40, {}
    while time.monotonic() < deadline:
        cmd = [sys.executable, "-m", "controller", "status", str(w["intent"]), "--json"]
        res = subprocess.run(cmd + ["--influx-url", stack.influx_url], env=w["env"], cwd=REPO, capture_output=True,
                             text=True, timeout=60)  # fmt: skip
        out = json.loads(res.stdout)
        if len([r for r in out["run"]["repairs"] if r["node"] == "A" and r["reason"] == "agent_back"]) >= len(repairs):
            break
        time.sleep(1)
    back = [r for r in out["run"]["repairs"] if r["node"] == "A" and r["reason"] == "agent_back"]
    assert len(back) == len(repairs) and all(r["ok"] for r in back), out["run"]
    assert any(r["replica"] == "r1" and r["leader"] for r in out["run"]["replicas"]), out["run"]
    text = subprocess.run(
        [sys.executable, "-m", "controller", "status", str(w["intent"]), "--influx-url", stack.influx_url],
        env=w["env"], cwd=REPO, capture_output=True, text=True, timeout=60,
    ).stdout  # fmt: skip
    assert re.search(r"controller run: \d replica\(s\) seen in the last minute, leader r1", text), text
    assert re.search(r"A\s+start\s+stamp_sender\s+sender 1\s+\[StartStampSession\] agent_back", text), text


def test_second_replica_stands_by_then_takes_over(world, stack):
    w = world
    r1 = w["replicas"].get("r1")
    if r1 is None or r1.proc.poll() is not None:
        pytest.skip("needs test_run_repairs_a_rebooted_node_within_5_s's leader")
    r2 = w["replicas"]["r2"] = Replica("r2", w["intent"], w["run_dir"], stack.kafka_bootstrap, w["env"])
    r2.wait_log(r"standby: replica r2 waits", 30)
    reconciles = r1.metrics()["reconciles"]
    r1.wait_metrics(lambda m: m["reconciles"] > reconciles, INTERVAL_S + 10)  # the leader works meanwhile
    m2 = r2.metrics()
    assert m2["leader"] == 0 and m2["rpcs"] == 0 and m2["repairs"] == 0, m2  # not one call to an agent
    assert r1.metrics()["leader"] == 1

    r1.kill()
    failover = r2.wait_log(r"leader: replica r2 leads from now on", 30)
    print(f"\n[run] r1 killed (SIGKILL): r2 leads {failover:.1f} s later")

    # A's agent and its children killed, the agent started again (pins and routes stay): the new
    # agent adopts the roles, the session is FAILED (its sender died); r2 starts it again
    r2.wait_log(r"replica r2 leads: watching", 10)
    time.sleep(1.0)
    old = a_state(w)["sender"]
    kill_agent_and_children(w, "A")
    time.sleep(1.0)
    started = respawn(w, "A")
    deadline = time.monotonic() + 30
    while not (a_runs(st := a_state(w)) and st["sender"] != old):
        assert time.monotonic() < deadline, (st, r2.log()[-3000:])
        time.sleep(0.05)
    took = time.time() - started
    print(f"[run] r2 restarted A's session {took:.2f} s after A's agent started")
    assert took <= REPAIR_BUDGET_S, r2.log()[-3000:]
    assert re.search(r"repair on A: start .*\[StartStampSession\] \(agent_back", r2.log()), r2.log()[-3000:]
    m2 = r2.wait_metrics(lambda m: m["repairs"] >= 1)
    assert m2["leader"] == 1 and m2["take_overs"] == 1, m2


def test_run_leaves_alone_what_it_does_not_own(world, stack):
    w = world
    leader = next((r for r in w["replicas"].values() if r.proc.poll() is None), None)
    if leader is None:
        leader = w["replicas"]["r3"] = Replica("r3", w["intent"], w["run_dir"], stack.kafka_bootstrap, w["env"])
        leader.wait_log(r"leads from now on", 30)
    lab = w["lab"]
    lab.run("A", ["ip", "-6", "route", "add", "fd00:99::/64", "encap", "seg6", "mode", "encap", "segs", "fc00:2::e",
                  "dev", "a0"], check=True)  # fmt: skip
    lab.run("R", ["ip", "-6", "route", "del", "fc00:2::e"], check=True)  # drift of what the intent owns
    t0 = time.monotonic()
    leader.wait_log(r"repair on R: create .*local SID fc00:2::e", INTERVAL_S + 10)
    print(f"\n[run] R's deleted End SID re-created {time.monotonic() - t0:.1f} s later (periodic reconcile)")
    leader.wait_log(r"left alone on A: policy \('fd00:99::/64', 254\)", 5)
    assert "fd00:99::/64" in lab.run("A", ["ip", "-6", "route"], check=True).stdout
    leader.wait_metrics(lambda m: m["left_alone"] >= 1, 5)
    diff = subprocess.run([sys.executable, "-m", "controller", "diff", str(w["intent"])], env=w["env"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert diff.returncode == 3 and re.search(r"remove\s+A\s+policy fd00:99::/64", diff.stdout), diff.stdout
    lab.run("A", ["ip", "-6", "route", "del", "fd00:99::/64"], check=True)
