"""segscope-agent-supervise [--backoff-max S] -- segscope-agent ARGS...

The agent container's PID 1 (helm/segscope agent DaemonSet, kustomize). In a container the main
process's death ends the container, and every process in it with it: an agent killed by a bug or
`kill -9` would take its data path (STAMP senders, stamp_streamer, altmark_collector) along, and
every session would have a gap. Under this supervisor an agent's death ends only the agent:

- it starts the agent, and starts it again when it exits abnormally (killed by a signal, or a
  non-zero status), after a backoff (0.5 s doubling to --backoff-max, back to 0.5 s once an agent
  ran --stable seconds); every restart is logged with its count and the agent's status, and the
  agent started gets the count (SEGSCOPE_AGENT_SUPERVISOR_RESTARTS), which it reports as the
  gauge supervisor_restarts (segscope_agent, /metrics);
- the new agent adopts the data path the dead one left (agent/README.md, "Restarts and adoption");
- it reaps every process that ends below it: the data-path processes become its children when
  their agent dies (PID 1 inherits orphans; not PID 1, it makes itself their subreaper), so
  without reaping they would stay zombies;
- SIGTERM / SIGINT are forwarded to the agent (the agent's --on-stop decides what stops), and the
  supervisor exits with the agent's status (128+N for signal N) once it has exited; asked to stop
  while no agent runs (in a backoff), it exits 0 at once. As PID 1 of the container its exit ends
  whatever still runs in it.
- an agent that exits 0 by itself (a SIGTERM sent to it directly) ends the supervisor with 0.

Signals are blocked and taken with sigtimedwait(2): nothing is lost between two looks, and the
agent starts with an empty signal mask (posix_spawn's setsigmask).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass

from segscope_schemas.version import VERSION_LINE

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
RESTARTS_ENV = "SEGSCOPE_AGENT_SUPERVISOR_RESTARTS"  # the restarts before this agent, for its gauges
WATCHED = {signal.SIGCHLD, *STOP_SIGNALS}


def log(text: str) -> None:
    print(f"segscope-agent-supervise: {text}", file=sys.stderr, flush=True)


def describe(status: int) -> str:
    """A wait status in words: `exit 2`, `killed by SIGKILL`."""
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit {os.WEXITSTATUS(status)}"


def exit_code(status: int) -> int:
    """The shell's convention: the exit status, or 128+N for a death by signal N."""
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


@dataclass
class Backoff:
    """0.5 s, 1 s, 2 s ... up to `max_s`; back to the start after an agent that ran `stable_s`."""

    min_s: float = 0.5
    max_s: float = 30.0
    stable_s: float = 60.0
    failures: int = 0  # in a row

    def next_delay(self, ran_s: float) -> float:
        self.failures = 1 if ran_s >= self.stable_s else self.failures + 1
        return min(self.max_s, self.min_s * 2 ** (self.failures - 1))


class Supervisor:
    def __init__(self, argv: list[str], backoff: Backoff):
        self.argv, self.backoff = argv, backoff
        self.agent_pid: int | None = None
        self.started = 0.0
        self.restarts = 0
        self.reaped = 0  # processes other than the agent: orphaned data-path processes
        self.stopping: int | None = None  # the stop signal received

    def spawn(self) -> None:
        # the agent reports how often it was restarted (segscope_agent supervisor_restarts, /metrics):
        # a crash loop is then visible where the node's other counters are, not only in this log
        env = {**os.environ, RESTARTS_ENV: str(self.restarts)}
        self.agent_pid = os.posix_spawn(self.argv[0], self.argv, env, setsigmask=())
        self.started = time.monotonic()
        log(f"agent started (pid {self.agent_pid}): {' '.join(self.argv)}")

    def reap(self) -> int | None:
        """Reap every ended child; the agent's wait status if the agent was one of them."""
        agent_status = None
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return agent_status
            if pid == 0:
                return agent_status
            if pid == self.agent_pid:
                agent_status, self.agent_pid = status, None
            else:
                self.reaped += 1
                log(f"reaped pid {pid} ({describe(status)}): a process its agent left ({self.reaped} so far)")

    def forward(self, sig: int) -> None:
        if self.agent_pid is not None:
            try:
                os.kill(self.agent_pid, sig)
            except ProcessLookupError:
                pass

    def run(self) -> int:
        signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)
        self.spawn()
        restart_at: float | None = None
        while True:
            timeout = 3600.0 if restart_at is None else max(0.0, restart_at - time.monotonic())
            info = signal.sigtimedwait(WATCHED, timeout)
            if info is not None and info.si_signo in STOP_SIGNALS:
                self.stopping = info.si_signo
                log(f"{signal.Signals(info.si_signo).name}: passed to the agent (pid {self.agent_pid})")
                self.forward(info.si_signo)
                if self.agent_pid is None:
                    return 0  # in a backoff: nothing runs that could be stopped
            status = self.reap()
            if status is not None:
                done = self.agent_ended(status)
                if done is not None:
                    return done
                restart_at = time.monotonic() + self.backoff.next_delay(time.monotonic() - self.started)
                log(f"restart {self.restarts + 1} in {restart_at - time.monotonic():.1f} s")
            if restart_at is not None and time.monotonic() >= restart_at and self.stopping is None:
                restart_at = None
                self.restarts += 1
                self.spawn()

    def agent_ended(self, status: int) -> int | None:
        """The supervisor's exit status if it is done, None to restart the agent."""
        ran_s = time.monotonic() - self.started
        log(f"agent {describe(status)} after {ran_s:.1f} s ({self.restarts} restarts so far)")
        if self.stopping is not None or status == 0:
            return exit_code(status)
        return None


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="segscope-agent-supervise",
        description="Run the agent as a container's PID 1: restart it when it dies (its data path "
        "stays and is adopted), reap orphans, pass SIGTERM/SIGINT on.",
    )
    p.add_argument("--version", action="version", version=VERSION_LINE)
    p.add_argument("--backoff-max", type=float, default=30.0, help="longest wait before a restart, s (default 30)")
    p.add_argument(
        "--stable", type=float, default=60.0, help="an agent that ran this long resets the backoff, s (default 60)"
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the agent's command line")
    a = p.parse_args(argv)
    if a.command[:1] == ["--"]:
        a.command = a.command[1:]
    if not a.command:
        p.error("no command: segscope-agent-supervise -- segscope-agent ARGS...")
    found = shutil.which(a.command[0])
    if found is None:
        p.error(f"{a.command[0]}: no such program (not a file, not on PATH)")
    a.command[0] = found
    if not 0.5 <= a.backoff_max <= 3600:
        p.error(f"--backoff-max: {a.backoff_max:g} out of range 0.5..3600 s")
    return a


def become_subreaper() -> None:
    """Not PID 1 (a test, a container with its own init): orphans below us come to us all the same
    (prctl PR_SET_CHILD_SUBREAPER), so the reaping and the counts are the same."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        log(f"cannot become a subreaper ({os.strerror(ctypes.get_errno())}): orphans go to PID 1")


def main(argv: list[str] | None = None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if os.getpid() != 1:
        become_subreaper()
    return Supervisor(a.command, Backoff(max_s=a.backoff_max, stable_s=a.stable)).run()


if __name__ == "__main__":
    sys.exit(main())
