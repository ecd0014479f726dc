"""The user-space STAMP Session-Reflector as the agent runs it (StampReflectorMode USERSPACE, or AUTO
where the kernel or the driver refuses XDP): one `python -m collectors.ustamp reflector` child
(its fast engine: C workers answer base packets, its Python code the rest) on the reflector's UDP
port, its sessions in a JSON session file the agent rewrites, applied with SIGHUP.

The child prints JSON lines on stdout (collectors/ustamp/README.md): `ready`, `reloaded`,
`counters` (on SIGUSR1) and the final counters. Its stdout is a file next to the session file, not
a pipe (a child that outlives the agent must not write into a dead pipe); a reader thread follows
the file and hands the lines over through a queue, so every request waits for its own answer.
With the agent's --kafka the child publishes its own counter line
(`segscope_datapath,program=ustamp_reflector`, schemas/metrics.md) every stats interval. Its
stderr goes to a log file next to the session file (the last lines are quoted in errors).

Restarts (agent/keeper.py): with a state directory the child outlives the agent (`--agent-dir
--adopt-timeout`, collectors/ustamp/tether.py) and keeps answering; the next agent adopts it
(adopt(): a pidfd on it, the stdout file followed from its end) and drives it as its own.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc

from agent import children
from agent.fields import ApiError
from agent.keeper import Adopted, ProcRef, stop_proc

log = logging.getLogger("segscope.agent.stamp")

READY_TIMEOUT_S = 20.0
ANSWER_TIMEOUT_S = 10.0
FOLLOW_EVERY_S = 0.01  # how often the reader looks for new lines in the stdout file


class UserspaceReflector:
    """One running user-space reflector (start() ... stop())."""

    def __init__(
        self,
        repo: Path,
        netns: str | None,
        port: int,
        work_dir: Path,
        node: str,
        kafka: str | None,
        outlive: list[str] | None = None,
    ):
        self.repo, self.netns, self.port, self.node, self.kafka = repo, netns, port, node, kafka
        self.outlive = outlive  # the keeper's tether arguments; None: it dies with the agent
        self.sessions_file = work_dir / "ustamp_sessions.json"
        self.log_file = work_dir / "ustamp_reflector.log"
        self.out_file = work_dir / "ustamp_reflector.out"
        self.proc: subprocess.Popen | Adopted | None = None
        self.ref: ProcRef | None = None
        self.lines: queue.Queue = queue.Queue()
        self.ready: dict = {}
        self.last_counters: dict[str, int] = {}

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "collectors.ustamp", "reflector", "--port", str(self.port)]
        cmd += ["--sessions", str(self.sessions_file)]
        if self.netns:
            cmd += ["--netns", self.netns]
        if self.kafka:
            cmd += ["--kafka", self.kafka, "--node", self.node]
        return cmd

    def start(self) -> None:
        """Start it with no session yet (plain RFC 8762 senders are answered from the start, as the
        XDP reflector's attach does); raises ApiError with its stderr if it does not come up."""
        self._write_sessions([])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(self.repo), str(self.repo / "schemas" / "python")])}
        with open(self.log_file, "ab") as err, open(self.out_file, "wb") as out:
            self.proc = children.spawn(
                self.command(), outlive=self.outlive, stdout=out, stderr=err, cwd=self.repo, env=env
            )
        self.ref = ProcRef.of(self.proc.pid)
        self._follow(0)
        first = self._next(READY_TIMEOUT_S)
        if first is None or first.get("event") != "ready":
            self.kill()
            raise ApiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"reflector.mode: the user-space reflector did not start: {self.log_tail()}",
            )
        self.ready = first
        log.info(
            "user-space reflector (pid %d) on port %d: engine %s, %s workers",
            self.proc.pid,
            self.port,
            first.get("engine"),
            first.get("workers", 1),
        )

    def adopt(self, handle: Adopted, socket_drops_base: int) -> None:
        """Drive a reflector a previous agent started (still running: `handle`); its stdout file is
        followed from where it is now (what it said before was for the previous agent)."""
        self.proc, self.ref = handle, handle.ref
        try:
            offset = self.out_file.stat().st_size
        except OSError:
            offset = 0
        self._follow(offset)
        log.info("user-space reflector (pid %d) on port %d adopted", handle.pid, self.port)
        self.last_counters = {"socket_drops": socket_drops_base}

    def _follow(self, offset: int) -> None:
        threading.Thread(target=self._read, args=(self.ref, offset), name="ustamp-reflector", daemon=True).start()

    def _read(self, ref: ProcRef | None, offset: int) -> None:
        """Follow the stdout file from `offset` until the process has ended and all it wrote is read."""
        with open(self.out_file, "rb") as f:
            f.seek(offset)
            pending = b""
            while True:
                chunk = f.read()
                if chunk:
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        self._put(line)
                    continue
                if ref is None or not ref.alive():
                    pending += f.read()  # what it wrote between the last read and its end
                    for line in pending.split(b"\n"):
                        if line.strip():
                            self._put(line)
                    break
                time.sleep(FOLLOW_EVERY_S)
        self.lines.put(None)  # it exited

    def _put(self, line: bytes) -> None:
        try:
            self.lines.put(json.loads(line))
        except ValueError:
            log.warning("user-space reflector: unexpected output %r", line[:200])

    def _next(self, timeout: float) -> dict | None:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def log_tail(self) -> str:
        try:
            text = self.log_file.read_text(errors="replace").strip()
        except OSError:
            return "(no log)"
        return " | ".join(text.splitlines()[-3:]) or "(nothing on stderr)"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _write_sessions(self, sessions: list[dict]) -> None:
        tmp = self.sessions_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(sessions, indent=1))
        tmp.replace(self.sessions_file)  # the child never reads half a file

    def set_sessions(self, sessions: list[dict], what: str) -> None:
        """Make `sessions` (ustamp session-file objects) the running ones: rewrite the file, SIGHUP,
        wait for `reloaded`. A refused file (the child keeps its old sessions) raises ApiError
        naming `what` with the child's reason."""
        if not self.running():
            raise ApiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{what}: the user-space reflector is not running (exit {self.proc.poll() if self.proc else None}): "
                f"{self.log_tail()}; Reset and Init again",
            )
        self._drain()
        self._write_sessions(sessions)
        self.proc.send_signal(signal.SIGHUP)
        while True:
            line = self._next(ANSWER_TIMEOUT_S)
            if line is None:
                raise ApiError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"{what}: the user-space reflector did not take the sessions: {self.log_tail()}",
                )
            if line.get("event") == "reloaded":
                return

    def _drain(self) -> None:
        """Lines nobody asked for (a refused reload has none; left from a timed-out request)."""
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                return
            if line is None:
                self.lines.put(None)
                return

    def counters(self) -> dict[str, int]:
        """Its counters now (SIGUSR1); the last ones known if it does not answer."""
        if not self.running():
            return self.last_counters
        self._drain()
        self.proc.send_signal(signal.SIGUSR1)
        while True:
            line = self._next(ANSWER_TIMEOUT_S)
            if line is None:
                return self.last_counters
            if "counters" in line:
                self.last_counters = line["counters"]
                return self.last_counters

    def stop(self) -> dict[str, int]:
        """SIGTERM, its final counters (it answers what its workers had handed over first)."""
        if self.running():
            stop_proc(self.proc, ANSWER_TIMEOUT_S)
            while True:
                line = self._next(1.0)
                if line is None:
                    break
                if line.get("final"):
                    self.last_counters = line["counters"]
        self.proc = None
        return self.last_counters

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def snapshot(self) -> dict | None:
        """What datapath.json records of it (the next agent adopts it from this), None if not running."""
        if not self.running() or self.ref is None:
            return None
        return {**self.ref.to_json(), "cmd": self.command(), "port": self.port}
