"""The agent's child processes (stamp_sender, the ring-buffer reader, altmark_collector): each
dies with the agent. A SIGKILLed agent runs no cleanup, so the kernel has to do it: every child is
started under `setpriv --pdeathsig TERM` (util-linux, always present on Debian), which sets
PR_SET_PDEATHSIG before exec; the child gets SIGTERM when the thread that started it exits, and
the agent starts children only from threads that live as long as it does (the gRPC pool, its
own reader threads). A child that would outlive the agent keeps its UDP port or its ring buffer
reader, and the next agent's `stamp_sender` fails with "Address already in use".

Each child also gets its own session (start_new_session): a Ctrl-C in the agent's terminal
reaches the agent, which stops its children in order."""

from __future__ import annotations

import os
import shutil
import subprocess

SETPRIV = shutil.which("setpriv") or "/usr/bin/setpriv"


def owned(cmd: list[str]) -> list[str]:
    """cmd run so that it receives SIGTERM when its parent dies."""
    return [SETPRIV, "--pdeathsig", "TERM", "--", *map(str, cmd)]


def spawn(cmd: list[str], **popen_kwargs) -> subprocess.Popen:
    """subprocess.Popen(owned(cmd), start_new_session=True, **popen_kwargs)."""
    popen_kwargs.setdefault("start_new_session", True)
    return subprocess.Popen(owned(cmd), **popen_kwargs)


def parent_alive() -> bool:
    """For a child that polls: False once the process that started it is gone (reparented)."""
    return os.getppid() != 1
