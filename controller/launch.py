"""Start one agent per node of a netlab lab, with a fresh lab PKI, for the demo and the benchmark.

    agents = AgentSet.start(lab, ["A", "R", "B"], run_dir, kafka="127.0.0.1:19092")
    os.environ.update(agents.env)      # SEGSCOPE_AGENT_<node>, SEGSCOPE_CERTS for the intent file
    ...
    agents.stop()

Each agent runs in the root namespace as `python -m agent --node N --netns <lab ns>
--listen 127.0.0.1:PORT --tls-cert/--tls-key/--tls-client-ca ...` and manages its node's
namespace; `start` returns once every agent's health service says SERVING
over mutual TLS.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from controller.pki import make_pki

REPO = Path(__file__).resolve().parent.parent


class LaunchError(RuntimeError):
    pass


@dataclass
class AgentSet:
    certs: Path
    addresses: dict[str, str]
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)
    spawn_args: dict[str, tuple] = field(default_factory=dict)  # node -> _spawn's arguments (respawn)

    @property
    def env(self) -> dict[str, str]:
        out = {f"SEGSCOPE_AGENT_{node}": addr for node, addr in self.addresses.items()}
        out["SEGSCOPE_CERTS"] = str(self.certs)
        return out

    @classmethod
    def start(
        cls,
        lab,
        nodes: list[str],
        run_dir: str | Path,
        base_port: int | None = None,
        kafka: str | None = None,
        extra_args: list[str] | None = None,
        ready_timeout_s: float = 30.0,
    ) -> "AgentSet":
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        certs = run_dir / "certs"
        make_pki(certs, nodes)
        # port 0: the kernel picks a free port and the agent logs it ("listening on port N"), so
        # two runs never collide; a base_port gives fixed, predictable addresses instead
        agents = cls(
            certs=certs, addresses={n: f"127.0.0.1:{base_port + i if base_port else 0}" for i, n in enumerate(nodes)}
        )
        try:
            for node in nodes:
                agents._spawn(lab, node, run_dir, kafka, extra_args or [])
            for node in nodes:
                agents._wait_listening(node, ready_timeout_s)
                agents._wait_serving(node, ready_timeout_s)
        except BaseException:
            agents.stop()
            raise
        return agents

    def kill(self, node: str) -> int:
        """SIGKILL one agent (a crash: no cleanup). Its data-path processes outlive it and wait for
        the next agent (agent/README.md, "Restarts and adoption"); with --adopt-timeout 0 they die
        with it (PDEATHSIG)."""
        proc = self.procs[node]
        proc.kill()
        return proc.wait()

    def stop_node(self, node: str, timeout_s: float = 30.0) -> int:
        """SIGTERM one agent and wait (with --on-stop handover: an upgrade's first half)."""
        proc = self.procs[node]
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        return proc.wait(timeout=timeout_s)

    def respawn(self, node: str, ready_timeout_s: float = 30.0, env: dict[str, str] | None = None) -> None:
        """Start `node`'s agent again on the same address, with the same arguments (and `env` on
        top of this process's environment); its log continues in the same file (after a marker line)."""
        if self.procs[node].poll() is None:
            raise LaunchError(f"agent {node} is still running (pid {self.procs[node].pid})")
        lab, run_dir, kafka, extra = self.spawn_args[node]
        self._spawn(lab, node, run_dir, kafka, extra, append=True, env=env)
        self._wait_serving(node, ready_timeout_s)

    def _spawn(
        self,
        lab,
        node: str,
        run_dir: Path,
        kafka: str | None,
        extra: list[str],
        append: bool = False,
        env: dict[str, str] | None = None,
    ) -> None:
        self.spawn_args[node] = (lab, run_dir, kafka, extra)
        cmd = [
            sys.executable,
            "-m",
            "agent",
            "--node",
            node,
            "--netns",
            lab.ns(node),
            "--listen",
            self.addresses[node],
            "--tls-cert",
            str(self.certs / f"agent-{node}.pem"),
            "--tls-key",
            str(self.certs / f"agent-{node}.key"),
            "--tls-client-ca",
            str(self.certs / "ca.pem"),
            "--instance",
            lab.ns(node),
        ]
        if kafka:
            cmd += ["--kafka", kafka]
        cmd += extra
        log_path = run_dir / f"agent-{node}.log"
        log = open(log_path, "a" if append else "w")
        if append:
            log.write("--- agent restarted ---\n")
            log.flush()
        env = {
            **os.environ,
            **(env or {}),
            "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "schemas" / "python")]),
        }
        self.procs[node] = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True
        )
        self.logs[node] = log_path
        log.close()

    def _wait_listening(self, node: str, timeout_s: float) -> None:
        if not self.addresses[node].endswith(":0"):
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = re.search(r"listening on port (\d+)", self.logs[node].read_text(errors="replace"))
            if found:
                self.addresses[node] = f"127.0.0.1:{found.group(1)}"
                return
            if self.procs[node].poll() is not None:
                raise LaunchError(
                    f"agent {node} exited ({self.procs[node].returncode}): {self.logs[node].read_text()[-2000:]}"
                )
            time.sleep(0.05)
        raise LaunchError(f"agent {node} did not report its port within {timeout_s:g} s; log {self.logs[node]}")

    def _wait_serving(self, node: str, timeout_s: float) -> None:
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        creds = grpc.ssl_channel_credentials(
            (self.certs / "ca.pem").read_bytes(),
            (self.certs / "controller.key").read_bytes(),
            (self.certs / "controller.pem").read_bytes(),
        )
        deadline = time.monotonic() + timeout_s
        last = ""
        with grpc.secure_channel(self.addresses[node], creds) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                proc = self.procs[node]
                if proc.poll() is not None:
                    raise LaunchError(f"agent {node} exited ({proc.returncode}): {self.logs[node].read_text()[-2000:]}")
                try:
                    reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                    last = f"status {reply.status}"
                except grpc.RpcError as exc:
                    last = f"{exc.code().name}: {exc.details()}"
                time.sleep(0.1)
        raise LaunchError(
            f"agent {node} at {self.addresses[node]} not SERVING after {timeout_s:g} s ({last}); log {self.logs[node]}"
        )

    def stop(self, timeout_s: float = 15.0) -> dict[str, int]:
        codes = {}
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for node, proc in self.procs.items():
            try:
                codes[node] = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                codes[node] = proc.wait()
        self.procs.clear()
        return codes
