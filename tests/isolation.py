"""Where a test puts a service stack of its own (beside the session `stack`), so that test groups
running in parallel (scripts/test_groups.py) never share one.

The runner gives each group a block of 100 ports (SEGSCOPE_TEST_PORT_BLOCK; the group's session
stack is at +0) and a directory (SEGSCOPE_TEST_GROUP_DIR). A test's extra stack takes a slot:
ports block + 10 * slot (Kafka, controller, InfluxDB, rpc: 4 ports) and a directory named after
it in the group's directory. Without a runner (plain pytest) the historical fixed ports and
.run/<name> apply, so a lone run behaves as before.

    run_dir, port_base = extra_stack("co-stack", slot=1, default_port_base=29000)

Slots in use (add a new one here, never reuse one: two modules of one group may run them together):
    1 co-stack      tests/collectors (Kafka of the streamer tests), tests/ustamp (shared by lease)
    2 co-outage     tests/collectors/test_stamp_streamer.py (Kafka stopped and restarted)
    3 sv-test-isolated  tests/services/test_stack.py (a second, isolated stack)
    4 sv-faults     tests/services/test_stack_faults.py (services killed and restarted)
    5 sec-stack     tests/e2e/test_kafka_security.py (SASL_SSL Kafka)
    6 nwa-stack     tests/netlab/test_withagents.py (`netlab up --agents --port-base`)
    7 k8s-cluster   tests/deploy/cluster_install.py (scripts/cluster.sh: etcd, API server, kubelet ... 10 ports)
    8 k8s-agent     tests/deploy/cluster_install.py (the agent pod's gRPC and health ports, the reflector's)
    9 (no stack)    closed_port(): a port nothing listens on
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _block() -> int | None:
    block = os.environ.get("SEGSCOPE_TEST_PORT_BLOCK")
    return int(block) if block else None


def group_dir() -> Path:
    """The group's own directory (.run/test-groups/<group>), or .run outside the runner."""
    return Path(os.environ.get("SEGSCOPE_TEST_GROUP_DIR") or REPO / ".run")


def extra_stack(name: str, slot: int, default_port_base: int) -> tuple[Path, int]:
    """(run dir, port base) of a test's own stack called `name` in slot `slot` (1-9)."""
    assert 1 <= slot <= 9, slot
    block = _block()
    return group_dir() / name, (default_port_base if block is None else block + 10 * slot)


def closed_port(default: int) -> int:
    """A loopback port no service of the group listens on (slot 9's last port)."""
    block = _block()
    return default if block is None else block + 99


def tag() -> str:
    """What the runner appends to this group's netlab prefixes, netns, veth and bpffs instance names
    (SEGSCOPE_TEST_TAG, `_<n>` from the group's port block: unique on the machine while the run
    lasts); empty outside the runner. Another checkout running the same tests on the same machine,
    with the historical names or another run's tag, then never meets ours (every lab's teardown
    removes only `<prefix>-*`)."""
    return os.environ.get("SEGSCOPE_TEST_TAG", "")


def own_name(base: str) -> str:
    """`base` with the group's tag: `own_name("agt")` is "agt" in a lone run, "agt_3" in group block 3."""
    return base + tag()


_ALONE_LOCK: list[int] = []  # the fd holding SEGSCOPE_TEST_ALONE_LOCK: kept until the process ends


def wait_until_alone(timeout_s: float = 3600.0, builds_stopped: bool = False) -> float:
    """Block until this group has the machine to itself; returns the seconds waited.

    The runner starts the [alone] groups (tests/schedule.toml, one per module) beside the last
    parallel groups, so that their stacks, labs and agents come up while those finish; a module of
    them calls this after its preparation and before its timed traffic. The runner creates
    SEGSCOPE_TEST_ALONE_FILE once every parallel group has ended; then the [alone] modules measure
    one at a time: each takes the lock SEGSCOPE_TEST_ALONE_LOCK (flock) and keeps it until its
    process ends, its teardown included (the others wait prepared, idle). Outside the runner (or in
    a parallel group) it returns at once.

    The test command's background builds run meanwhile on idle CPU time only; `builds_stopped`
    stops them while this process lives (SEGSCOPE_TEST_BUILDS_STOP gets its PID): for a module
    that measures packet rates, which a compile at idle priority on the other vCPU still slows."""
    path = os.environ.get("SEGSCOPE_TEST_ALONE_FILE")
    if not path:
        return 0.0
    t0 = time.monotonic()
    while not Path(path).exists():
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"the parallel test groups did not end within {timeout_s:.0f} s ({path} not created)")
        time.sleep(0.2)
    lock = os.environ.get("SEGSCOPE_TEST_ALONE_LOCK")
    if lock and not _ALONE_LOCK:
        fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() - t0 > timeout_s:
                    os.close(fd)
                    raise TimeoutError(f"another [alone] module held {lock} for {timeout_s:.0f} s") from None
                time.sleep(0.2)
        _ALONE_LOCK.append(fd)
    stop = os.environ.get("SEGSCOPE_TEST_BUILDS_STOP")
    if builds_stopped and stop:
        Path(stop).write_text(str(os.getpid()))
        time.sleep(1.0)  # the runner looks every 0.5 s
    return time.monotonic() - t0


def cgroup_cpu_s(path: Path | None) -> float:
    """CPU seconds used so far by the processes of cgroup `path` (v1 cpuacct or v2), and by those
    that have left it; 0 without one. The runner (scripts/test_groups.py) puts each group in one."""
    if path is None:
        return 0.0
    try:
        if (path / "cpuacct.usage").exists():
            return int((path / "cpuacct.usage").read_text()) / 1e9
        stat = dict(line.split() for line in (path / "cpu.stat").read_text().splitlines())
        return int(stat["usage_usec"]) / 1e6
    except (OSError, ValueError, KeyError):
        return 0.0
