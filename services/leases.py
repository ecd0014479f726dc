"""Cross-run coordination on one run dir: an flock so `up`/`down` calls take turns, and lease
files so several users (pytest sessions, a CLI `up`) share one stack and the last user to leave
stops what the users started."""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from services.supervise import proc_state


class RunDirLock:
    """Re-entrant (per object) exclusive flock on <run_dir>/.lock."""

    def __init__(self, run_dir: Path, say: Callable[[str], None]) -> None:
        self.run_dir = run_dir
        self.say = say
        self._depth = 0

    @contextmanager
    def held(self) -> Iterator[None]:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / ".lock", "w") as lock_file:
            if self._depth == 0:
                try:
                    fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    self.say(f"waiting for another up/down on {self.run_dir}")
                    fcntl.flock(lock_file, fcntl.LOCK_EX)
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1


class Leases:
    """<run_dir>/leases/<pid> while a process uses the stack; leases/started.json lists the
    services that lease holders started (and so the last holder stops)."""

    def __init__(self, run_dir: Path) -> None:
        self.dir = run_dir / "leases"
        self.mine = self.dir / str(os.getpid())

    def take(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.mine.write_text(f"{os.getpid()}\n")

    def release(self) -> None:
        self.mine.unlink(missing_ok=True)

    def holders(self, exclude_mine: bool = False) -> list[int]:
        """PIDs of live lease holders; leases of dead processes are removed."""
        live = []
        for lease in self.dir.glob("[0-9]*"):
            if exclude_mine and lease == self.mine:
                continue
            if proc_state(int(lease.name)) in (None, "Z", "X"):
                lease.unlink(missing_ok=True)
            else:
                live.append(int(lease.name))
        return live

    def remember_started(self, names: set[str]) -> set[str]:
        """Add names to the record of services that lease holders started; return the record."""
        record = self.dir / "started.json"
        try:
            known = set(json.loads(record.read_text()))
        except (OSError, ValueError):
            known = set()
        known |= names
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(sorted(known)))
        return known

    def forget_started(self) -> None:
        (self.dir / "started.json").unlink(missing_ok=True)
