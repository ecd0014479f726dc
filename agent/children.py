"""The agent's child processes (stamp_sender, the ring-buffer reader, altmark_collector).

Two ways to run one:

- `spawn(cmd, outlive=tether_args)` (the default since hitless restarts, agent/keeper.py): the
  child outlives the agent. It gets `--agent-dir DIR --adopt-timeout S` (collectors/tether.h): it
  keeps measuring while no agent runs, the next agent of the node adopts it (by pid and start time,
  from DIR/datapath.json), and one that no agent adopts within S seconds stops itself and says so.
- `spawn(cmd)`: the child dies with the agent (--adopt-timeout 0, and children that cannot be
  adopted: an agent without Kafka's stamp streamer, whose only way out is the copy to the agent). A
  SIGKILLed agent runs no cleanup, so the kernel does it: the child is started under `setpriv
  --pdeathsig TERM` (util-linux, always present on Debian), which sets PR_SET_PDEATHSIG before exec;
  the child gets SIGTERM when the thread that started it exits, and the agent starts children only
  from threads that live as long as it does (the gRPC pool, its own reader threads).

Each child also gets its own session (start_new_session): a Ctrl-C in the agent's terminal
reaches the agent, which stops its children in order, and a signal to the agent's process group
never reaches them."""

from __future__ import annotations

import os
import shutil
import subprocess

SETPRIV = shutil.which("setpriv") or "/usr/bin/setpriv"


def owned(cmd: list[str]) -> list[str]:
    """cmd run so that it receives SIGTERM when its parent dies."""
    return [SETPRIV, "--pdeathsig", "TERM", "--", *map(str, cmd)]


def spawn(cmd: list[str], outlive: list[str] | None = None, **popen_kwargs) -> subprocess.Popen:
    """subprocess.Popen(owned(cmd), start_new_session=True, **popen_kwargs); with `outlive` (the
    keeper's tether arguments) the child is not tied to the agent: cmd + outlive instead."""
    popen_kwargs.setdefault("start_new_session", True)
    if outlive is not None:
        return subprocess.Popen([*map(str, cmd), *outlive], **popen_kwargs)
    return subprocess.Popen(owned(cmd), **popen_kwargs)


def parent_alive() -> bool:
    """For a child that polls: False once the process that started it is gone (reparented)."""
    return os.getppid() != 1
