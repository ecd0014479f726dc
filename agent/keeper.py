"""What lets the node's data path outlive its agent (README.md, "Restarts and adoption").

The agent's state directory (--state-dir, default /run/segscope/<instance>) holds:

- `agent.lock`: the running agent holds an exclusive flock(2) on it. Its data-path processes
  (stamp_sender, stamp_streamer, altmark_collector, started with `--agent-dir DIR --adopt-timeout
  S`, collectors/tether.h) look at that lock about once a second: held = an agent runs, whichever;
  free for S seconds = no agent adopted them, they stop themselves and say so. A second agent of
  the same instance cannot take it: it refuses to start.
- `datapath.json`: the agent's data path as it is now, rewritten (write + rename) at every change:
  the STAMP roles and sessions, the flow monitor sides and flows, and for every process the agent
  runs its pid and its start time (/proc/PID/stat field 22, clock ticks since boot: a pid the
  kernel gave to another process since does not match). The next agent of the node reads it before
  it serves and adopts what still runs; identity comes from this file and the bpffs pins, never
  from a parent pid.
- `orphans.jsonl`: one line per process that stopped itself because no agent adopted it; the next
  agent logs and counts them (`orphans_stopped`, kept across agents in datapath.json).

`Adopted` is the handle of a process this agent did not start (a Popen look-alike over a pidfd:
signals and waits reach exactly that process, never one that got its pid later).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import select
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("segscope.agent.keeper")

FORMAT = 1  # datapath.json's layout; an agent adopts only the formats it knows
LOCK_WAIT_S = 5.0  # a data-path process holds a shared lock for microseconds at a time


class AgentLockError(RuntimeError):
    """Another agent of the same instance holds the lock."""


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks since boot) of a process, None if there is none."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) S ppid ..." - comm may hold spaces and parentheses: split after the last ')'
    rest = raw[raw.rfind(")") + 2 :].split()
    try:
        return rest[0], int(rest[19])
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True)
class ProcRef:
    """A process by pid and start time: what identifies it across agents."""

    pid: int
    start: int

    @classmethod
    def of(cls, pid: int) -> "ProcRef | None":
        st = _stat(pid)
        return None if st is None else cls(pid, st[1])

    def alive(self) -> bool:
        st = _stat(self.pid)
        return st is not None and st[1] == self.start and st[0] not in ("Z", "X")

    def cmdline(self) -> list[str]:
        try:
            return Path(f"/proc/{self.pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
        except OSError:
            return []

    def to_json(self) -> dict:
        return {"pid": self.pid, "start": self.start}

    @classmethod
    def from_json(cls, d: dict | None) -> "ProcRef | None":
        if not d:
            return None
        try:
            return cls(int(d["pid"]), int(d["start"]))
        except (KeyError, TypeError, ValueError):
            return None


class Adopted:
    """A running process another agent started: poll(), wait(), send_signal() like a Popen, through
    a pidfd opened while its identity was checked. Its exit status is not ours to read (it is not
    our child): returncode is None until it ends, then `ENDED` (callers look at what it wrote)."""

    ENDED = 0

    def __init__(self, ref: ProcRef, pidfd: int):
        self.ref, self.pid, self._fd = ref, ref.pid, pidfd
        self.returncode: int | None = None
        self.adopted = True

    def __del__(self):
        # closed only here: a thread that waits (the agent's reaper) and one that stops it (Reset)
        # both see the end, and a pidfd closed by one could be another file by the other's next look
        try:
            os.close(self._fd)
        except OSError:
            pass

    @classmethod
    def open(cls, ref: ProcRef | None) -> "Adopted | None":
        """The handle of `ref` if that very process still runs, else None."""
        if ref is None or not ref.alive():
            return None
        try:
            fd = os.pidfd_open(ref.pid)
        except OSError:
            return None
        if not ref.alive():  # it ended, and the pid may be another's, between the look and the open
            os.close(fd)
            return None
        return cls(ref, fd)

    def poll(self) -> int | None:
        if self.returncode is None and not self._wait(0):
            return None
        return self.returncode

    def _wait(self, timeout: float | None) -> bool:
        if self.returncode is not None:
            return True
        p = select.poll()
        p.register(self._fd, select.POLLIN)
        if p.poll(None if timeout is None else int(timeout * 1000)) or not self.ref.alive():
            self.returncode = self.ENDED
            return True
        return False

    def wait(self, timeout: float | None = None) -> int:
        if not self._wait(timeout):
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                signal.pidfd_send_signal(self._fd, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def signal_proc(p, sig: int) -> None:
    """SIGTERM/SIGKILL a child: its process group for one we started (its own session), the
    process itself through its pidfd for one we adopted."""
    if getattr(p, "adopted", False):
        p.send_signal(sig)
        return
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass


def stop_proc(p, timeout_s: float = 5.0) -> None:
    """SIGTERM, wait, SIGKILL after timeout_s."""
    if p is None or p.poll() is not None:
        return
    signal_proc(p, signal.SIGTERM)
    try:
        p.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        signal_proc(p, signal.SIGKILL)
        p.wait()


class Keeper:
    """The node's state directory: the lock, datapath.json and the orphan reports. With
    adopt_timeout_s == 0 (--adopt-timeout 0) the data path dies with the agent as before: no lock is
    taken (processes left by an adopting agent then stop themselves), nothing is written, nothing
    adopted."""

    def __init__(self, state_dir: Path, adopt_timeout_s: float, node: str, instance: str, version: str):
        self.dir = Path(state_dir)
        self.adopt_timeout_s = adopt_timeout_s
        self.node, self.instance, self.version = node, instance, version
        self._lock = threading.Lock()
        self._lock_fd: int | None = None
        self.parts: dict[str, dict] = {}
        self.orphans_stopped = 0  # data-path processes that stopped themselves unadopted, ever on this node
        self.previous: dict | None = None  # what the last agent left (load())
        self.writes = 0
        self.write_errors = 0

    @property
    def enabled(self) -> bool:
        return self.adopt_timeout_s > 0

    # -- the lock ----------------------------------------------------------------------------------
    def lock(self) -> None:
        """Take agent.lock (exclusive, for this process's lifetime; the kernel lets go at exit)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / "agent.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)  # never truncated, never removed
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EINTR):
                    os.close(fd)
                    raise
                if time.monotonic() > deadline:
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
                    os.close(fd)
                    raise AgentLockError(
                        f"another agent of instance {self.instance} runs (pid {holder}, {path} is locked); "
                        "one agent per node"
                    ) from None
                time.sleep(0.02)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def tether_args(self) -> list[str]:
        """What a data-path process gets so that it outlives the agent and waits for the next."""
        return ["--agent-dir", str(self.dir), "--adopt-timeout", f"{self.adopt_timeout_s:g}"]

    def run_dir(self, part: str) -> Path:
        d = self.dir / part
        d.mkdir(parents=True, exist_ok=True)
        return d

    # -- datapath.json -----------------------------------------------------------------------------
    @property
    def path(self) -> Path:
        return self.dir / "datapath.json"

    def load(self) -> dict | None:
        """What the previous agent of this node left, if this agent can adopt it: the same format,
        written since the machine booted. Sets orphans_stopped from it."""
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("adoption: %s unreadable (%s): nothing adopted", self.path, e)
            return None
        self.orphans_stopped += int(doc.get("orphans_stopped", 0) or 0)  # plus those just reported
        if doc.get("format") != FORMAT:
            log.warning(
                "adoption: %s has format %r, this agent (version %s) knows %d: nothing adopted",
                self.path,
                doc.get("format"),
                self.version,
                FORMAT,
            )
            self.previous = doc
            return None
        if doc.get("boot_id") != boot_id():
            log.info("adoption: %s is from before the machine booted: nothing to adopt", self.path)
            return None
        self.previous = doc
        return doc

    def leftovers(self) -> dict | None:
        """datapath.json as a previous agent left it (this agent adopts nothing: the file goes)."""
        try:
            doc = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        self.path.unlink(missing_ok=True)
        return doc if doc.get("boot_id") == boot_id() else None

    def put(self, part: str, doc: dict) -> None:
        """Replace one part (stamp, flowmon) and rewrite the file."""
        if not self.enabled:
            return
        with self._lock:
            self.parts[part] = doc
            self._write()

    def _write(self) -> None:
        doc = {
            "format": FORMAT,
            "agent_version": self.version,
            "agent_pid": os.getpid(),
            "node": self.node,
            "instance": self.instance,
            "boot_id": boot_id(),
            "written_ns": time.time_ns(),
            "adopt_timeout_s": self.adopt_timeout_s,
            "orphans_stopped": self.orphans_stopped,
            **self.parts,
        }
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(doc, indent=1))
            tmp.replace(self.path)
            self.writes += 1
        except OSError as e:
            self.write_errors += 1
            log.error("cannot write %s: %s (the next agent could not adopt what runs now)", self.path, e)

    def clear(self) -> None:
        """Nothing left to hand over (a clean stop): the next agent starts empty."""
        with self._lock:
            self.parts.clear()
            if self.enabled:
                self._write()

    # -- orphans.jsonl -----------------------------------------------------------------------------
    def take_orphan_reports(self) -> list[dict]:
        """The processes that stopped themselves since the last agent looked; counted, file emptied."""
        path = self.dir / "orphans.jsonl"
        taken = path.with_suffix(".taken")
        try:
            path.replace(taken)
        except FileNotFoundError:
            return []
        out = []
        for line in taken.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"program": "?", "line": line[:200]})
        taken.unlink(missing_ok=True)
        with self._lock:
            self.orphans_stopped += len(out)
        return out
