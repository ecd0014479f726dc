"""Hitless agent restarts where the agent is started by something else than a test: the Debian unit
(segscope-agent.service) and the agent container's supervisor (agent/supervise.py, PID 1).

One lab as test_agent_adoption.py's (netlab line5_bare, prefix `hlr`): agents on A, R and B with
Kafka, the Faust delay processor, Telegraf and InfluxDB; one STAMP session A -> B per test (100
packets/s, 30 s) applied through the controller. A's agent is replaced by:

- the unit: started as its ExecStart starts it (agent-launch with an agent.conf that does not say
  on_stop: the launcher's default applies) in a cgroup of its own, as systemd would; `systemctl
  restart` emulated from the unit file's own KillMode (process: SIGTERM to the main pid only;
  mixed / control-group: the rest of the cgroup is killed too) and the same ExecStart again in
  the same cgroup. With KillMode=mixed (the unit before) the sender dies with the agent and the
  first assertion after the stop fails.
- the supervisor as PID 1 of a new PID namespace (`unshare --pid --fork --mount-proc`, as a
  container's): the agent is killed with SIGKILL; the supervisor restarts it, the new agent adopts
  the sender, and the supervisor reaps the data-path processes the dead agent left when they end
  (no zombie). Then SIGTERM to PID 1: the supervisor passes it on, exits with the agent's status,
  and nothing of the namespace is left.

Accounting, each (as test_agent_adoption.py): the sender that ends the run is the one that started
it; sent = 3000; reflected = collected = records in Kafka (no duplicate) = records in InfluxDB
(forward, reverse, round trip), the missing sequence numbers no more than the lab's veths dropped,
never a run of more than 3.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.keeper import ProcRef
from scripts.results import StampSessionSpec, records_in_influx
from segscope_proto.segscope.agent.v1 import stamp_pb2
from segscope_schemas import names
from tests.agent.conftest import drop_counters, moved
from tests.agent.test_agent_adoption import (
    RATE,
    agent_line,
    collected,
    datapath_doc,
    handover_pipeline,
    intent,
    kafka_seqs,
    longest_run,
    sender_ref,
)
from tests.isolation import own_name

REPO = Path(__file__).resolve().parents[2]
PREFIX = os.environ.get("SEGSCOPE_RESTART_TEST_PREFIX") or own_name("hlr")
UNIT = REPO / "packaging" / "debian" / "agent" / "segscope-agent.service"
LAUNCHER = REPO / "packaging" / "debian" / "segscope_conf.py"
CGROUP_ROOT = Path("/sys/fs/cgroup/unified")
ADOPT_S = 15
DURATION_S, STOP_AFTER_S = 30, 8.0
ADOPTED_RE = re.compile(
    r"adopted the data path of the previous agent \(pid (\d+), version \S+; this is version \S+\) in (\d+) ms: (.*)"
)

pytestmark = [pytest.mark.e2e, pytest.mark.datapath]


# ------------------------------------------------------------------ the lab
@pytest.fixture(scope="module")
def pipe(stack, bpffs, tmp_path_factory):
    def remove_cgroups(pipe):
        for cg in pipe.cgroups:
            cg.remove()

    with handover_pipeline(stack, PREFIX, tmp_path_factory.mktemp("hlr"), ADOPT_S, remove_cgroups) as pipe:
        pipe.cgroups = []
        yield pipe


def replace_agent(pipe, node: str, proc: subprocess.Popen, log: Path) -> None:
    """`node`'s agent is now `proc` (logging to `log`): the pipeline's stop and checks reach it."""
    pipe.agents.procs[node], pipe.agents.logs[node] = proc, log
    pipe.agents._wait_serving(node, 60)


def stop_current(pipe, node: str, reset: bool = False) -> None:
    """The running agent of `node` stops (SIGTERM, handover: no session runs between tests). reset:
    its STAMP data path goes first (an agent in another PID namespace could not adopt it: the pids
    in datapath.json are this namespace's); the controller's next apply sets it up again."""
    if reset and pipe.ctl is not None:
        client = pipe.ctl.client(node)
        client.call(client.stamp, "Reset", stamp_pb2.ResetRequest())
    if pipe.agents.procs[node].poll() is None:
        assert pipe.agents.stop_node(node) == 0


def adopted_line(log: Path, after: int = 0) -> tuple[int, int, str] | None:
    found = ADOPTED_RE.findall(log.read_text(errors="replace")[after:])
    return (int(found[-1][0]), int(found[-1][1]), found[-1][2]) if found else None


def program_stats(pipe, node: str, prog: str) -> dict | None:
    """The loader's `stats --json` of one attached program, None when it is not attached."""
    pin = Path(names.BPFFS_PIN_ROOT) / pipe.lab.ns(node) / prog
    if not pin.exists():
        return None
    cmd = [str(REPO / "build" / "datapath" / prog), "stats", "--pin-dir", str(pin), "--json"]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def start_run(pipe, ssid: int):
    """Apply a session A -> B; the counters before it, for the accounting (each program's own: a
    reset A has no collector, B's reflector still counts what earlier tests reflected)."""
    refl, coll = program_stats(pipe, "B", "stamp_reflector"), program_stats(pipe, "A", "stamp_collector")
    before = (refl["reflected"] if refl else 0, collected(coll) if coll else 0)
    net_before = drop_counters(pipe.lab)
    since = time.time_ns()
    pipe.apply(intent(ssid))
    time.sleep(1.0)
    return before, net_before, since


def account(pipe, stack, ssid: int, sender_pid: int, before, net_before, since, label: str) -> dict:
    """The run ended; everything the sender sent is accounted for (module docstring)."""
    pipe.wait_stopped("A", ssid, timeout_s=DURATION_S + 30)
    ended = re.findall(rf"stamp_sender ssid {ssid} ended \(pid (\d+), adopted\)", pipe.agents.logs["A"].read_text())
    assert ended == [str(sender_pid)], (ended, sender_pid)
    summary = pipe.sender_summary("A", ssid)
    sent = summary["sent"]
    assert sent == RATE * DURATION_S and summary["send_errors"] == 0, summary
    stats = pipe.datapath_stats("A", "B")
    refl, coll = stats["stamp_reflector"], stats["stamp_collector"]
    reflected, got_back = refl["reflected"] - before[0], collected(coll) - before[1]
    assert sum(v for k, v in coll.items() if k.startswith("drop_")) == 0, coll
    net = moved(net_before, drop_counters(pipe.lab))
    net_lost = sum(v for k, v in net.items() if k.endswith(("rx_dropped", "tx_dropped")))
    seqs = kafka_seqs(stack.kafka_bootstrap, "A", ssid, got_back)
    missing = sorted(set(range(sent)) - set(seqs))
    print(f"[{label}] sent {sent}, reflected by B {reflected}, collected by A {got_back}, in Kafka {len(seqs)} "
          f"(distinct {len(set(seqs))}); missing {len(missing)} {missing[:10]}; lab veth drops {net_lost}")  # fmt: skip
    assert len(seqs) == len(set(seqs)) == got_back, "a record lost or sent twice between A's collector and Kafka"
    assert sent - got_back <= net_lost, (sent, reflected, got_back, net)
    assert longest_run(missing) <= 3, f"a gap: {missing}"
    if net_lost == 0:
        assert reflected == got_back == sent and sorted(seqs) == list(range(sent))
    spec = StampSessionSpec(ssid=ssid, rate_pps=RATE)
    got = {}
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        got = {d: records_in_influx(stack, spec, since, d) for d in ("forward", "reverse", "round_trip")}
        if min(got.values()) >= got_back:
            break
        time.sleep(1)
    print(f"[{label}] records in InfluxDB {got}")
    assert got == dict.fromkeys(got, got_back), (got, got_back, reflected)
    deadline, line = time.monotonic() + 30, {}
    while time.monotonic() < deadline:
        line = agent_line(pipe, "A")
        if line.get("senders_adopted") == 1:
            break
        time.sleep(1)
    assert line.get("senders_adopted") == 1, line
    assert line.get("handover_records_lost") == 0 and line.get("senders_ended_unadopted") == 0, line
    return {"sent": sent, "reflected": reflected, "collected": got_back, "missing": len(missing), "influx": got}


# ------------------------------------------------------------------ the Debian unit
def unit_service() -> configparser.SectionProxy:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(UNIT)
    return unit["Service"]


class UnitCgroup:
    """What systemd does with the unit's processes, on a cgroup v2 of the unit's own: every process
    the unit starts is in it, and a stop signals them after the unit's KillMode."""

    def __init__(self, name: str):
        self.path = CGROUP_ROOT / name
        self.remove()
        self.path.mkdir()

    def start(self, argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
        """argv as the unit's main process, in the cgroup (the shell joins it, then execs argv)."""
        join = f'echo $$ > {self.path / "cgroup.procs"} && exec "$@"'
        with open(log, "a") as out:
            return subprocess.Popen(["sh", "-c", join, "unit", *argv], stdout=out, stderr=subprocess.STDOUT,
                                    env=env, cwd="/", start_new_session=True)  # fmt: skip

    def pids(self) -> set[int]:
        try:
            return {int(p) for p in (self.path / "cgroup.procs").read_text().split()}
        except OSError:
            return set()

    def stop(self, kill_mode: str, main: subprocess.Popen, timeout_s: float) -> int:
        """systemd's stop: SIGTERM to the main process (all of them for control-group), then, the
        main process gone, SIGKILL to what is left unless KillMode=process."""
        others = self.pids() - {main.pid}
        os.kill(main.pid, signal.SIGTERM)
        if kill_mode == "control-group":
            for pid in others:
                os.kill(pid, signal.SIGTERM)
        try:
            code = main.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            main.kill()
            code = main.wait()
        if kill_mode in ("mixed", "control-group"):
            (self.path / "cgroup.kill").write_text("1")
        return code

    def remove(self) -> None:
        if self.path.exists():
            (self.path / "cgroup.kill").write_text("1")
            deadline = time.monotonic() + 10
            while self.pids() and time.monotonic() < deadline:
                time.sleep(0.1)
            self.path.rmdir()


def launch_env(prefix: Path) -> tuple[dict[str, str], Path]:
    """The installed layout the launcher execs into, from this checkout: /opt/segscope/agent/bin/
    segscope-agent (this tree's agent) and /usr/lib/segscope (this tree's build/)."""
    lib = prefix / "lib"
    lib.mkdir(parents=True, exist_ok=True)
    (lib / "agent-launch").unlink(missing_ok=True)
    (lib / "agent-launch").symlink_to(LAUNCHER)
    agent = prefix / "opt" / "agent" / "bin" / "segscope-agent"
    agent.parent.mkdir(parents=True, exist_ok=True)
    pypath = os.pathsep.join([str(REPO), str(REPO / "schemas" / "python")])
    agent.write_text(f'#!/bin/sh\ncd {REPO}\nPYTHONPATH={pypath} exec {sys.executable} -m agent "$@"\n')
    agent.chmod(0o755)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "SEGSCOPE_PREFIX": str(prefix / "opt"),
        "SEGSCOPE_LIB": str(REPO / "build"),
    }
    return env, lib


def exec_start(lib: Path, conf: Path) -> list[str]:
    """The unit's ExecStart with the installed paths replaced by this test's."""
    argv = unit_service()["ExecStart"].split()
    assert argv == ["/usr/lib/segscope/agent-launch", "/etc/segscope/agent.conf"], argv
    launcher = str(lib / "agent-launch")
    return [sys.executable, launcher, str(conf)]  # the launcher's #! is the agent venv's python


def test_debian_unit_restart_leaves_the_data_path_running(pipe, stack, tmp_path):
    ssid, lab = 91, pipe.lab
    service = unit_service()
    kill_mode = service.get("KillMode", "control-group")
    certs = pipe.agents.certs
    conf = tmp_path / "agent.conf"
    conf.write_text(  # no on_stop, no adopt_timeout: the launcher's defaults
        f"node = A\nlisten = {pipe.agents.addresses['A']}\ntls_cert = {certs}/agent-A.pem\n"
        f"tls_key = {certs}/agent-A.key\ntls_client_ca = {certs}/ca.pem\nkafka = {stack.kafka_bootstrap}\n"
        f"instance = {lab.ns('A')}\nextra_args = --netns {lab.ns('A')}\n"
    )
    env, lib = launch_env(tmp_path / "installed")
    argv = exec_start(lib, conf)
    check = subprocess.run([*argv[:2], "--check", *argv[2:]], env=env, capture_output=True, text=True)
    assert check.returncode == 0 and "--on-stop handover" in check.stdout, check
    cg = UnitCgroup(f"segscope-agent{PREFIX}.service")
    pipe.cgroups.append(cg)
    log = tmp_path / "unit.log"
    stop_current(pipe, "A")
    first = cg.start(argv, log, env)
    replace_agent(pipe, "A", first, log)

    before, net_before, since = start_run(pipe, ssid)
    sender = sender_ref(lab.ns("A"), ssid)
    # the agent rewrites datapath.json at every change: the streamer appears there once it runs
    streamer = ProcRef.from_json(
        wait_for(lambda: datapath_doc(lab.ns("A"))["stamp"].get("streamer"), 10, "the streamer in datapath.json")
    )
    assert sender.alive() and {sender.pid, streamer.pid} <= cg.pids(), (sender, streamer, cg.pids())
    time.sleep(STOP_AFTER_S - 1.0)

    # systemctl restart: the stop after the unit's KillMode, then ExecStart again in the same cgroup
    t0 = time.monotonic()
    assert cg.stop(kill_mode, first, float(service["TimeoutStopSec"].rstrip("s"))) == 0
    stop_s = time.monotonic() - t0
    time.sleep(0.3)
    assert sender.alive(), f"the sender died with its agent (KillMode={kill_mode})"
    assert streamer.alive(), f"the streamer died with its agent (KillMode={kill_mode})"
    mark = len(log.read_text(errors="replace"))
    second = cg.start(argv, log, env)
    replace_agent(pipe, "A", second, log)
    down_s = time.monotonic() - t0
    adopted = adopted_line(log, mark)
    assert adopted is not None, log.read_text()[-3000:]
    old_pid, adopt_ms, notes = adopted
    assert old_pid == first.pid and "1 senders running and adopted" in notes, adopted
    # the unit's processes, as systemd sees them: the adopted sender, the new agent and its streamer
    # (the adopted one is replaced: it drains the ring and goes)
    new_streamer = ProcRef.from_json(
        wait_for(lambda: datapath_doc(lab.ns("A"))["stamp"].get("streamer"), 10, "the new streamer in datapath.json")
    )
    assert {sender.pid, new_streamer.pid, second.pid} <= cg.pids(), (sender, new_streamer, cg.pids())
    print(f"\n[unit] KillMode={kill_mode}: stop {stop_s:.2f} s, agent down {down_s:.1f} s, "
          f"adopted in {adopt_ms} ms: {notes}")  # fmt: skip
    account(pipe, stack, ssid, sender.pid, before, net_before, since, "unit")


# ------------------------------------------------------------------ the container's supervisor
def pid_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def in_namespace(ns: str) -> dict[int, tuple[int, str, str]]:
    """Every process of PID namespace `ns`: outer pid -> (inner pid, state, command line)."""
    out = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        if pid_ns(int(p)) != ns:
            continue
        try:
            status = Path(f"/proc/{p}/status").read_text()
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        inner = int(re.search(r"^NSpid:.*\s(\d+)$", status, re.M).group(1))
        state = re.search(r"^State:\s+(\S)", status, re.M).group(1)
        out[int(p)] = (inner, state, cmd)
    return out


def outer_of(ns: str, inner: int) -> int | None:
    return next((o for o, (i, _, _) in in_namespace(ns).items() if i == inner), None)


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def agents_below(supervisor: int, ns: str) -> list[int]:
    """The supervisor's children that are agents (not the data-path processes it inherited)."""
    procs = in_namespace(ns)
    return [c for c in children(supervisor) if "-m agent " in procs.get(c, (0, "", ""))[2]]


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout_s:g} s")


def agent_argv(pipe, node: str) -> list[str]:
    lab, certs = pipe.lab, pipe.agents.certs
    return [
        sys.executable, "-m", "agent", "--node", node, "--netns", lab.ns(node), "--listen", pipe.agents.addresses[node],
        "--tls-cert", str(certs / f"agent-{node}.pem"), "--tls-key", str(certs / f"agent-{node}.key"),
        "--tls-client-ca", str(certs / "ca.pem"), "--instance", lab.ns(node), "--kafka", pipe.stack.kafka_bootstrap,
        *pipe.agent_args,
    ]  # fmt: skip


def test_supervisor_restarts_a_killed_agent_and_stops_everything_on_sigterm(pipe, stack, tmp_path):
    ssid, lab = 92, pipe.lab
    log = tmp_path / "pod.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "schemas" / "python")])}
    stop_current(pipe, "A", reset=True)
    with open(log, "w") as out:
        pod = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--mount-proc", "--", sys.executable, "-m", "agent.supervise",
             "--", *agent_argv(pipe, "A")],
            stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True,
        )  # fmt: skip
    try:
        supervisor = wait_for(lambda: children(pod.pid)[:1], 10, "the supervisor")[0]
        ns = pid_ns(supervisor)
        assert ns != pid_ns(os.getpid()) and in_namespace(ns)[supervisor][0] == 1, "the supervisor is not PID 1"
        replace_agent(pipe, "A", pod, log)

        before, net_before, since = start_run(pipe, ssid)
        sender = sender_ref(lab.ns("A"), ssid)  # its pid inside the namespace, as the agents know it
        sender_outer = outer_of(ns, sender.pid)
        (agent_outer,) = agents_below(supervisor, ns)
        agent_inner = in_namespace(ns)[agent_outer][0]
        time.sleep(STOP_AFTER_S - 1.0)

        mark = len(log.read_text(errors="replace"))
        os.kill(agent_outer, signal.SIGKILL)  # a crash: no cleanup, no handover
        t0 = time.monotonic()
        time.sleep(0.3)
        procs = in_namespace(ns)
        assert sender_outer in procs and procs[sender_outer][1] != "Z", "the sender died with its agent"
        new_agent = wait_for(lambda: set(agents_below(supervisor, ns)) - {agent_outer}, 15, "a new agent")
        pipe.agents._wait_serving("A", 60)
        down_s = time.monotonic() - t0
        adopted = wait_for(lambda: adopted_line(log, mark), 10, "the adoption line")
        old_pid, adopt_ms, notes = adopted
        said = log.read_text(errors="replace")[mark:]
        assert "agent killed by SIGKILL" in said and "restart 1 in 0.5 s" in said, said[-2000:]
        assert old_pid == agent_inner and "1 senders running and adopted" in notes, adopted
        # the orphans are the supervisor's children now
        assert sender_outer in children(supervisor), (sender_outer, children(supervisor))
        print(f"\n[supervisor] agent down {down_s:.1f} s (new pid {new_agent}), adopted in {adopt_ms} ms: {notes}")
        numbers = account(pipe, stack, ssid, sender.pid, before, net_before, since, "supervisor")
        # the restart is a counter of the node, not only a log line (segscope_agent via Kafka, InfluxDB)
        wait_for(lambda: agent_line(pipe, "A").get("supervisor_restarts") == 1, 30,
                 "supervisor_restarts = 1 in the new agent's segscope_agent point")  # fmt: skip

        # the sender ended (the run is over): reaped by PID 1, no zombie anywhere in the namespace
        wait_for(lambda: f"reaped pid {sender.pid} (exit 0)" in log.read_text(errors="replace"), 10,
                 "the supervisor reaping the adopted sender")  # fmt: skip
        time.sleep(1.0)
        zombies = {p: v for p, v in in_namespace(ns).items() if v[1] == "Z"}
        assert zombies == {}, zombies
        left_before = in_namespace(ns)
        print(f"[supervisor] {numbers}; processes in the namespace before SIGTERM: "
              f"{sorted(v[2][:60] for v in left_before.values())}")  # fmt: skip

        # SIGTERM to PID 1: passed to the agent, the supervisor exits with its status, nothing is left
        os.kill(supervisor, signal.SIGTERM)
        code = pod.wait(timeout=40)
        assert code == 0, log.read_text()[-2000:]
        assert "SIGTERM: passed to the agent" in log.read_text()
        wait_for(lambda: not in_namespace(ns), 10, "every process of the namespace gone")
    finally:
        if pod.poll() is None:
            os.killpg(pod.pid, signal.SIGKILL)
            pod.wait()
        # A's agent as the fixture started it, for the module's cleanup
        pipe.agents.respawn("A")
