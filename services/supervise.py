"""One supervised service process: its directory, config, PID file and log under the run dir;
start in its own session, readiness polling, stop by PID (SIGTERM, then SIGKILL).

services/kafka, services/influxdb and services/telegraf each subclass Service with what only
that service knows (how to start it, when it is ready, what it needs once ready);
services/stack.py orders them.
"""

from __future__ import annotations

import os
import signal
import socket
import string
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterable


class StackError(RuntimeError):
    """A service could not be started, reached or stopped; the message names the log to read."""


def tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def proc_state(pid: int) -> str | None:
    """Single-letter state from /proc/<pid>/stat, or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def proc_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class Service:
    """Base of one service of the stack. Subclasses set name, config_file and the timeouts
    and implement start() and check_ready(); after_ready() is for what must exist before the
    next service starts (topics, the database)."""

    name = ""
    config_file = ""
    ready_timeout = 60.0  # seconds; start-up was measured at 5-10 s for Kafka on a loaded 2-core host
    stop_timeout = 15.0

    def __init__(self, run_dir: Path, say: Callable[[str], None]) -> None:
        self.run_dir = run_dir
        self.say = say
        self._child: subprocess.Popen | None = None

    # -- paths and PIDs
    @property
    def dir(self) -> Path:
        return self.run_dir / self.name

    @property
    def log_path(self) -> Path:
        return self.dir / f"{self.name}.log"

    @property
    def pid_path(self) -> Path:
        return self.dir / f"{self.name}.pid"

    @property
    def config_path(self) -> Path:
        return self.dir / self.config_file

    def read_pid(self) -> int | None:
        try:
            return int(self.pid_path.read_text().strip())
        except (OSError, ValueError):
            return None

    def is_ours(self, pid: int) -> bool:
        """PID alive (not a zombie) and its command line names this run dir's config file.

        The config path is unique per run dir, so a recycled PID or another stack's process
        is never mistaken for ours."""
        if self._child is not None and self._child.pid == pid:
            # Our own child: ask the kernel via waitpid. Its /proc cmdline can still be empty
            # right after Popen returns (execve has not yet set up the new argument pages).
            return self._child.poll() is None
        state = proc_state(pid)
        if state is None or state in ("Z", "X"):
            return False
        return str(self.config_path) in proc_cmdline(pid)

    def running_pid(self) -> int | None:
        pid = self.read_pid()
        return pid if pid is not None and self.is_ours(pid) else None

    # -- what a subclass provides
    def start(self) -> None:
        raise NotImplementedError

    def check_ready(self, timeout: float) -> bool:
        raise NotImplementedError

    def after_ready(self) -> None:
        """Called after start or reuse, before the next service starts."""

    # -- lifecycle
    def fail(self, what: str) -> StackError:
        log = self.log_path
        return StackError(f"{self.name}: {what}; see {log}\n--- last lines of {log.name} ---\n{tail(log)}")

    def ready(self, timeout: float) -> bool:
        try:
            return self.check_ready(timeout)
        except Exception:  # any client error just means "not ready yet"
            return False

    def reuse(self) -> bool:
        """True when a running instance answers; a hung one is stopped."""
        pid = self.running_pid()
        if pid is None:
            self.pid_path.unlink(missing_ok=True)
            return False
        # It may still be starting (e.g. an `up` a moment ago): give it a short grace period.
        if self.wait_ready(timeout=10.0, pid=pid, raise_on_timeout=False):
            self.say(f"{self.name}: reusing pid {pid}")
            return True
        self.say(f"{self.name}: pid {pid} does not answer; restarting it")
        self.stop()
        return False

    def check_ports_free(self, ports: Iterable[int], grace_s: float = 5.0) -> None:
        """Each port free, waiting up to grace_s: a process of ours that was just killed releases
        its sockets when it has exited, a moment after the signal."""
        deadline = time.monotonic() + grace_s
        for port in ports:
            while port_open(port) and time.monotonic() < deadline:
                time.sleep(0.1)
            if port_open(port):
                raise StackError(
                    f"{self.name}: 127.0.0.1:{port} is already in use by a process that is "
                    f"not this stack's {self.name} (run dir {self.run_dir}); "
                    f"see `ss -ltnp | grep {port}`"
                )

    @staticmethod
    def render(template: Path, out: Path, **values: object) -> None:
        text = string.Template(template.read_text()).substitute({k: str(v) for k, v in values.items()})
        out.write_text(text)

    def spawn(self, argv: list[str], env: dict[str, str] | None = None) -> int:
        """Start argv in its own session (survives the CLI; not hit by the terminal's Ctrl-C)."""
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(argv)}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                env=env,
                start_new_session=True,
            )
        self._child = proc
        self.pid_path.write_text(f"{proc.pid}\n")
        return proc.pid

    def wait_ready(self, timeout: float, pid: int, raise_on_timeout: bool = True) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if not self.is_ours(pid):
                if raise_on_timeout:
                    raise self.fail(f"process {pid} exited during start-up")
                return False
            if self.ready(timeout=min(5.0, max(0.5, deadline - time.monotonic()))):
                return True
            if time.monotonic() >= deadline:
                if raise_on_timeout:
                    raise self.fail(f"not ready within {timeout:.0f} s (pid {pid} still running)")
                return False
            time.sleep(0.25)

    def stop(self) -> bool:
        """Stop by PID; True when a process was stopped."""
        pid = self.read_pid()
        child, self._child = self._child, None
        if pid is None or not self.is_ours_or_child(pid, child):
            if child is not None:
                child.poll()  # reap a child that already exited
            self.pid_path.unlink(missing_ok=True)
            return False
        t0 = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        how = "SIGTERM"
        if not self._wait_gone(pid, child, self.stop_timeout):
            os.kill(pid, signal.SIGKILL)
            how = f"SIGKILL after {self.stop_timeout:.0f} s"
            if not self._wait_gone(pid, child, 10.0):
                raise self.fail(f"pid {pid} survived SIGKILL")
        self.pid_path.unlink(missing_ok=True)
        self.say(f"{self.name}: stopped pid {pid} ({how}) in {time.monotonic() - t0:.1f} s")
        return True

    def is_ours_or_child(self, pid: int, child: subprocess.Popen | None) -> bool:
        if child is not None and child.pid == pid:
            return child.poll() is None
        return self.is_ours(pid)

    def _wait_gone(self, pid: int, child: subprocess.Popen | None, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if child is not None:
                try:
                    child.wait(timeout=0.1)
                    return True
                except subprocess.TimeoutExpired:
                    continue
            if not self.is_ours(pid):
                return True
            time.sleep(0.1)
        return False
