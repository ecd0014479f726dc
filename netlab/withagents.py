"""`segscope-netlab up TOPOLOGY --prefix P --agents`: a lab with the whole pipeline on it, for
trying segscope on a topology of your own with one command.

    segscope-netlab up netlab/topologies/mesh8_two_paths.yaml --prefix mine --agents
    source .run/netlab/mine/env.sh       # SEGSCOPE_AGENT_<node>, SEGSCOPE_CERTS, SEGSCOPE_KAFKA, ...
    segscope-controller apply controller/examples/mesh8_two_paths.yaml
    segscope-netlab down --prefix mine   # processors, agents, the services it started, the lab

What `up --agents` starts, in this order (on any error, everything started so far is stopped):
  1. the lab (netlab.Lab.up)
  2. the service stack (Kafka, InfluxDB, Telegraf; services.stack): with --port-base N its own
     instance in .run/netlab/P/stack on ports N..N+3, else the default one (reused if it runs)
  3. one agent per SRv6 node (controller.launch.AgentSet: a fresh lab PKI in .run/netlab/P/agents/
     certs, mutual TLS, --kafka), each listening on a free port of 127.0.0.1
  4. the delay, loss and in-line processors (python -m processors.<name>)
and writes .run/netlab/P/env.sh (what the intent files' ${VAR}s read) and pipeline.json (the PIDs
`down` stops: each only if its command line is still the one started).

An SRv6 node is one with more than one link or a seg6 / seg6local route (every node if none is);
`--agents A,B,...` names them instead.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from .lab import RUN_ROOT, Lab, LabError, teardown
from .topology import Topology, load

REPO = Path(__file__).resolve().parent.parent
PROCESSORS = ("delay", "loss", "inline")


def srv6_nodes(topo: Topology) -> list[str]:
    """Nodes that route SRv6: more than one link, or a seg6 / seg6local route (hosts have one link
    and a default route); every node if none does."""
    links: dict[str, int] = {}
    for link in topo.links:
        for end in (link.a, link.b):
            links[end.node] = links.get(end.node, 0) + 1
    found = [
        name
        for name, node in topo.nodes.items()
        if links.get(name, 0) > 1 or any(r.seg6 or r.seg6local for r in node.routes)
    ]
    return found or list(topo.nodes)


def _state_path(prefix: str) -> Path:
    return RUN_ROOT / prefix / "pipeline.json"


def env_file(prefix: str) -> Path:
    return RUN_ROOT / prefix / "env.sh"


def up(
    topology: str,
    prefix: str,
    *,
    agents: str = "auto",
    delay_us: dict | None = None,
    ioam: bool = True,
    port_base: int | None = None,
    say=lambda msg: print(f"[netlab] {msg}", file=sys.stderr, flush=True),
) -> dict[str, str]:
    """Bring it all up; returns the environment the intent file needs (also in env.sh)."""
    from controller.launch import AgentSet
    from services.stack import Stack

    topo = load(topology)
    nodes = srv6_nodes(topo) if agents == "auto" else [n.strip() for n in agents.split(",") if n.strip()]
    unknown = [n for n in nodes if n not in topo.nodes]
    if unknown or not nodes:
        raise LabError(
            f"--agents: {', '.join(unknown) or 'no node'} not in {topology}; use nodes of: {', '.join(topo.nodes)}"
        )
    if _state_path(prefix).exists():
        raise LabError(f"{_state_path(prefix)} exists: a pipeline of prefix {prefix} runs; `down --prefix {prefix}`")
    run = RUN_ROOT / prefix
    t0 = time.monotonic()
    lab = Lab.up(topology, prefix, delay_us=delay_us or {}, ioam=ioam)
    state: dict = {"prefix": prefix, "agents": {}, "processors": {}, "stack": None}
    try:
        say(f"lab {prefix}: {len(topo.nodes)} nodes, {len(topo.links)} links ({time.monotonic() - t0:.1f} s)")
        run_dir = run / "stack" if port_base is not None else None
        stack = Stack(run_dir=run_dir, port_base=port_base, fresh=run_dir is not None, quiet=True)
        state["stack"] = {"run_dir": str(stack.run_dir), "port_base": port_base, "started": []}
        stack.up()
        state["stack"]["started"] = sorted(stack.started)
        _write_state(prefix, state)
        say(f"services: Kafka {stack.kafka_bootstrap}, InfluxDB {stack.influx_url} ({time.monotonic() - t0:.1f} s)")
        agent_set = AgentSet.start(lab, nodes, run / "agents", kafka=stack.kafka_bootstrap)
        for node, proc in agent_set.procs.items():
            state["agents"][node] = {
                "pid": proc.pid,
                "address": agent_set.addresses[node],
                "log": str(agent_set.logs[node]),
                "cmdline": _cmdline(proc.pid),
            }
        _write_state(prefix, state)
        say(f"agents: {', '.join(nodes)} serving mutual TLS ({time.monotonic() - t0:.1f} s)")
        for kind in PROCESSORS:
            log_path = run / f"{kind}-processor.log"
            env = {
                **os.environ,
                "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "schemas" / "python")]),
                "SEGSCOPE_KAFKA": stack.kafka_bootstrap,
                f"SEGSCOPE_{kind.upper()}_HEALTH": "127.0.0.1:0",
                f"SEGSCOPE_{kind.upper()}_DATADIR": str(run / "processors" / "{app_id}"),
            }
            argv = [sys.executable, "-m", f"processors.{kind}"]
            with open(log_path, "w") as log:
                proc = subprocess.Popen(
                    argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=REPO,
                    env=env,
                    start_new_session=True,
                )
            # what /proc shows once it has exec'd (read now, it could still be this process's fork)
            state["processors"][kind] = {"pid": proc.pid, "log": str(log_path), "cmdline": " ".join(argv)}
            _write_state(prefix, state)
        time.sleep(2)
        for kind, info in state["processors"].items():
            if not _alive(info):
                raise LabError(f"the {kind} processor exited at once: {Path(info['log']).read_text()[-2000:]}")
        env = {
            **agent_set.env,
            "SEGSCOPE_KAFKA": stack.kafka_bootstrap,
            "SEGSCOPE_INFLUX_URL": stack.influx_url,
            "SEGSCOPE_INFLUX_DB": stack.influx_db,
            "SEGSCOPE_NETLAB_PREFIX": prefix,
        }
        state["env"] = env
        _write_state(prefix, state)
        env_file(prefix).write_text(
            f"# segscope-netlab up {shlex.quote(str(topology))} --prefix {prefix} --agents: `source` this file\n"
            + "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
        )
        say(f"processors: {', '.join(PROCESSORS)}; up in {time.monotonic() - t0:.1f} s")
        return env
    except BaseException:
        say("up failed: stopping what it started")
        down(prefix)
        raise


def down(prefix: str) -> dict:
    """Stop the processors, the agents (SIGTERM: they detach their datapath), the services that
    `up` started, then remove the lab (netlab.teardown). Safe to repeat; works without the state
    file (then it is a plain netlab teardown)."""
    state_path = _state_path(prefix)
    state = json.loads(state_path.read_text()) if state_path.exists() else {}
    stopped: dict[str, str] = {}
    for group in ("processors", "agents"):
        running = {name: info for name, info in state.get(group, {}).items() if _alive(info)}
        for info in running.values():
            os.killpg(info["pid"], signal.SIGTERM)
        for name, info in state.get(group, {}).items():
            how = _wait_gone(info, timeout_s=30) if name in running else "was not running"
            stopped[f"{group[:-1]} {name}"] = how
    stack_info = state.get("stack")
    if stack_info and stack_info.get("started"):
        from services.stack import Stack

        Stack(run_dir=stack_info["run_dir"], port_base=stack_info["port_base"], quiet=True).down(
            only=stack_info["started"]
        )
    final = teardown(prefix)
    state_path.unlink(missing_ok=True)
    env_file(prefix).unlink(missing_ok=True)
    return {"down": prefix, "stopped": stopped, "services_stopped": (stack_info or {}).get("started", []),
            "relay_final_stats": final}  # fmt: skip


def _write_state(prefix: str, state: dict) -> None:
    path = _state_path(prefix)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(path)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _alive(info: dict) -> bool:
    """The process `up` started is still the one with that PID (its command line unchanged)."""
    return bool(info.get("cmdline")) and _cmdline(info["pid"]) == info["cmdline"]


def _wait_gone(info: dict, timeout_s: float) -> str:
    """Wait for it to exit after SIGTERM, SIGKILL its process group past timeout_s; how it ended."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(info):
            return "stopped (SIGTERM)"
        time.sleep(0.1)
    try:
        # before the kill, its threads' stacks into its log (python -m agent registers SIGUSR1 with
        # faulthandler): why it did not stop is then there to read
        os.kill(info["pid"], signal.SIGUSR1)
        time.sleep(0.5)
        os.killpg(info["pid"], signal.SIGKILL)
    except ProcessLookupError:
        pass
    while _alive(info) and time.monotonic() < deadline + 5:
        time.sleep(0.1)
    return "killed (SIGKILL after SIGTERM)"
