"""The STAMP pipeline set up through the controller, for scripts/demo.py and tests/e2e.

One agent per node (python -m
agent, --kafka so the sender's agent streams its collector's records to
`segscope.stamp.records`), the intent applied by controller.core.Controller over one mTLS channel
per agent, and the Faust delay processor downstream (Kafka -> InfluxDB through Telegraf); with
flows in the intent, the loss processor too (`start_processor("loss")`).

    with ControlledPipeline(lab, stack, run_dir) as pipe:
        pipe.start()                                    # agents + delay processor
        result = pipe.apply(intent)                     # controller.core.ApplyResult
        pipe.wait_stopped("A", ssid, timeout_s=...)     # a finite run (duration_s) has ended
        pipe.sender_summary("A", ssid)                  # the stamp_sender's own JSON summary
        pipe.datapath_stats("A", "B")                   # reflector / collector counters
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from controller.core import ApplyResult, Controller
from controller.intent import Intent
from controller.launch import AgentSet
from segscope_proto.segscope.agent.v1 import stamp_pb2
from segscope_schemas.names import BPFFS_PIN_ROOT

REPO = Path(__file__).resolve().parent.parent
BPFFS_ROOT = Path(BPFFS_PIN_ROOT)
# "exited N" for a sender this agent started, "ended (pid N, adopted)" for one it adopted
SENDER_EXIT_RE = re.compile(r"stamp_sender ssid (\d+) (?:exited (-?\d+)|ended[^{]*?): (\{.*?\})(?: stderr:.*)?$", re.M)


class PipelineError(RuntimeError):
    pass


class ControlledPipeline:
    def __init__(
        self,
        lab,
        stack,
        run_dir: str | Path,
        nodes: tuple[str, ...] = ("A", "R", "B"),
        agent_args: list[str] | None = None,
    ):
        self.lab, self.stack = lab, stack
        self.agent_args = agent_args or []  # extra arguments of every agent (e.g. --on-stop handover)
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.nodes = nodes
        self.agents: AgentSet | None = None
        self.ctl: Controller | None = None
        self.processors: dict[str, subprocess.Popen] = {}
        self._saved_env: dict[str, str | None] = {}

    def __enter__(self) -> "ControlledPipeline":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ start / stop
    def _set_env(self, values: dict[str, str]) -> None:
        for key, value in values.items():  # restored by stop()
            self._saved_env.setdefault(key, os.environ.get(key))
            os.environ[key] = value

    def kafka_env(self, role: str) -> dict[str, str]:
        """SEGSCOPE_KAFKA_* of a program of `role` on the stack's Kafka ({} when it is plaintext)."""
        return self.stack.kafka_env(role) if hasattr(self.stack, "kafka_env") else {}

    def start_agents(self) -> AgentSet:
        # the agents (and the C tools they start) log in to Kafka as the agent role
        self._set_env(self.kafka_env("agent"))
        self.agents = AgentSet.start(
            self.lab,
            list(self.nodes),
            self.run_dir / "agents",
            kafka=self.stack.kafka_bootstrap,
            extra_args=self.agent_args,
        )
        self._set_env(self.agents.env)  # the intent file reads these
        return self.agents

    def start_processor(self, kind: str = "delay") -> None:
        """`python -m processors.<kind>` (delay or loss), logging to <run dir>/<kind>-processor.log."""
        log = open(self.run_dir / f"{kind}-processor.log", "w")
        self.processors[kind] = subprocess.Popen(
            [sys.executable, "-m", f"processors.{kind}"],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,
            env={**os.environ, "SEGSCOPE_KAFKA": self.stack.kafka_bootstrap, **self.kafka_env("processor")},
        )
        log.close()

    def start(self) -> None:
        self.start_agents()
        self.start_processor()

    def stop(self) -> dict[str, int]:
        codes: dict[str, int] = {}
        if self.ctl:
            self.ctl.close()
            self.ctl = None
        if self.agents:
            # SIGTERM: each agent stops its senders, flushes Kafka, detaches its datapath (Reset)
            codes.update({f"agent-{n}": c for n, c in self.agents.stop().items()})
        for kind, proc in self.processors.items():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                codes[f"{kind}-processor"] = proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                codes[f"{kind}-processor"] = proc.wait()
        self.processors.clear()
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env.clear()
        return codes

    # ------------------------------------------------------------------ the controller
    def apply(self, intent: Intent) -> ApplyResult:
        if self.ctl is None:
            self.ctl = Controller(intent)
        else:
            self.ctl.set_intent(intent)
        result = self.ctl.apply()
        if not result.ok:
            op, exc = result.failed
            raise PipelineError(f"apply failed at `{op.describe()}`: {exc}")
        return result

    def session_status(self, node: str, ssid: int, role: int = stamp_pb2.STAMP_ROLE_SENDER):
        client = self.ctl.client(node)
        # through AgentClient.call: a read, retried once when the transport broke under it
        for st in client.call(client.stamp, "ListStampSessions", stamp_pb2.ListStampSessionsRequest()).sessions:
            if st.session.role == role and st.session.ssid == ssid:
                return st
        return None

    def wait_stopped(self, node: str, ssid: int, timeout_s: float, progress=None, total_s: float = 0) -> None:
        """Wait until a finite sender run has ended (the agent reports STOPPED)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            st = self.session_status(node, ssid)
            if st is not None and st.state == stamp_pb2.STAMP_SESSION_STATE_STOPPED:
                return
            if progress:
                progress(min(time.monotonic() - t0, total_s), total_s)
            time.sleep(0.5)
        raise PipelineError(f"sender session {ssid} on {node} still not stopped after {timeout_s:g} s")

    def sender_summary(self, node: str, ssid: int, timeout_s: float = 10.0) -> dict:
        """The stamp_sender's own JSON summary ({"sent": .., "send_errors": .., ...}) of the last run of
        `ssid`, as the agent logged it when the sender exited."""
        deadline = time.monotonic() + timeout_s
        while True:
            runs = [
                m
                for m in SENDER_EXIT_RE.finditer(self.agents.logs[node].read_text(errors="replace"))
                if int(m.group(1)) == ssid
            ]
            if runs:
                return json.loads(runs[-1].group(3))
            if time.monotonic() > deadline:
                raise PipelineError(f"no stamp_sender exit line for ssid {ssid} in {self.agents.logs[node]}")
            time.sleep(0.2)

    def datapath_stats(
        self, sender: str, reflector: str, settle_s: float = 0.5, timeout_s: float = 5.0
    ) -> dict[str, dict[str, int]]:
        """Reflector and collector counters, once they have stopped changing for settle_s: a
        sender that has just exited still has replies in flight (the injected delay, the relay)."""
        deadline = time.monotonic() + timeout_s
        last = self._read_datapath_stats(sender, reflector)
        while time.monotonic() < deadline:
            time.sleep(settle_s)
            now = self._read_datapath_stats(sender, reflector)
            if now == last:
                break
            last = now
        return last

    def _read_datapath_stats(self, sender: str, reflector: str) -> dict[str, dict[str, int]]:
        out = {}
        for prog, node in (("stamp_reflector", reflector), ("stamp_collector", sender)):
            pin = BPFFS_ROOT / self.lab.ns(node) / prog
            r = subprocess.run(
                [str(REPO / "build" / "datapath" / prog), "stats", "--pin-dir", str(pin), "--json"],
                capture_output=True,
                text=True,
            )
            if r.returncode != 0:
                raise PipelineError(f"{prog} stats --pin-dir {pin}: {r.stderr.strip()}")
            out[prog] = json.loads(r.stdout)
        return out
