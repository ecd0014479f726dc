"""The tether of the user-space reflector to the node's agent (--agent-dir DIR --adopt-timeout S):
collectors/tether.h's rules, in Python.

The agent runs the reflector so that it outlives the agent: a killed, restarted or upgraded agent
leaves it answering, and the next agent of the node adopts it (agent/keeper.py: by pid and start
time, from DIR/datapath.json). Whether an agent runs: every agent holds an exclusive flock(2) on
DIR/agent.lock while it runs; about once a second the reflector asks for a shared lock on it without
waiting (refused: an agent runs, whichever). Without an agent for S seconds it stops as on SIGTERM
and says so: one line on stderr and one JSON line appended to DIR/orphans.jsonl, which the next
agent reads and counts (orphans_stopped)."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sys
import time

PROGRAM = "ustamp_reflector"
TIMEOUT_MAX_S = 86400.0


class TetherError(ValueError):
    """A bad --agent-dir / --adopt-timeout (the message names the flag)."""


class Tether:
    def __init__(self, agent_dir: str | None, timeout_s: float | None, what: str = ""):
        self.dir, self.timeout_s, self.what = agent_dir, timeout_s or 0.0, what
        self.fd = -1
        self.alone_since = 0.0  # monotonic seconds since when no agent runs; 0: one runs
        self.next_check = 0.0
        self.orphaned = False
        if agent_dir is None and timeout_s is None:
            return
        if agent_dir is None:
            raise TetherError("--adopt-timeout: needs --agent-dir (where the agent's lock is)")
        if timeout_s is None:
            raise TetherError("--agent-dir: needs --adopt-timeout (how long to wait for an agent)")
        if not 0.1 <= timeout_s <= TIMEOUT_MAX_S:
            raise TetherError(f"--adopt-timeout: expected seconds in 0.1..86400, got {timeout_s:g}")
        path = os.path.join(agent_dir, "agent.lock")
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise TetherError(f"--agent-dir: cannot open {path}: {e.strerror}") from None
        self.next_check = time.monotonic()

    def agent_runs(self) -> bool:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            return e.errno in (errno.EWOULDBLOCK, errno.EINTR)  # EINTR: ask again at the next look
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        return False

    def orphaned_now(self, now: float | None = None) -> bool:
        """Call often (cheap until a look is due). True once no agent has run for timeout_s: it has
        said so; the caller stops as on SIGTERM."""
        now = time.monotonic() if now is None else now
        if self.fd < 0 or self.orphaned or now < self.next_check:
            return self.orphaned
        self.next_check = now + min(1.0, self.timeout_s / 4)
        if self.agent_runs():
            self.alone_since = 0.0
            return False
        if self.alone_since == 0.0:
            self.alone_since = now
        if now - self.alone_since >= self.timeout_s:
            self.orphaned = True
            self._report(now - self.alone_since)
        return self.orphaned

    def _report(self, alone_s: float) -> None:
        print(
            f"{PROGRAM}: {self.what}{': ' if self.what else ''}no agent adopted this process within "
            f"{self.timeout_s:.0f} s (none has run for {alone_s:.1f} s); stopping",
            file=sys.stderr,
            flush=True,
        )
        line = json.dumps(
            {
                "program": PROGRAM,
                "pid": os.getpid(),
                "what": self.what,
                "unadopted_s": round(alone_s, 3),
                "realtime_ns": time.time_ns(),
            },  # fmt: skip
            separators=(",", ":"),
        )
        path = os.path.join(self.dir, "orphans.jsonl")
        try:  # one write: lines of several processes never mix
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, (line + "\n").encode())
            finally:
                os.close(fd)
        except OSError as e:
            print(f"{PROGRAM}: cannot record the stop in {path}: {e.strerror}", file=sys.stderr, flush=True)
