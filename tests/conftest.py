"""Suite-wide fixtures: the local service stack (Kafka, InfluxDB, Telegraf) and bpffs.

The whole suite runs as root (netns, XDP, bpffs); it stops at once with a clear message otherwise.

`stack` is one session-wide services.stack.Stack, by default on the real ports (Kafka 19092,
InfluxDB 18086) and run dir .run/services. Set SEGSCOPE_STACK_PORT_BASE and SEGSCOPE_STACK_RUN_DIR
to run the suite against an isolated stack (e.g. while another run uses the default ports).
If the stack cannot start, every test that uses it errors with the reason (and the log to read).
Several pytest sessions may share the stack (Stack.shared: a lock around up/down and one lease
per session): the last session to finish stops the services that sessions started; services that
were already running before (a manual `python -m services.stack up`) are left running.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# before anything imports grpc: the test process forks (Popen) while its gRPC channels are busy;
# gRPC core's fork handlers are off, as in the agent and the controller (agent/__init__.py says why)
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import pytest

from services.stack import Stack, StackError
from tests.isolation import cgroup_cpu_s

REPO = Path(__file__).resolve().parents[1]
BPFFS = Path("/sys/fs/bpf")


def pytest_sessionstart(session: pytest.Session) -> None:
    # Processors the tests start answer health probes on any free port (their fixed defaults would
    # collide with a running demo or with each other); tests of the endpoint set their own.
    for name in ("DELAY", "LOSS", "TOPOLOGY", "INLINE"):
        os.environ.setdefault(f"SEGSCOPE_{name}_HEALTH", "127.0.0.1:0")
    if os.geteuid() != 0:
        pytest.exit(
            "segscope tests must run as root (network namespaces, eBPF, bpffs): "
            "run `sudo .local/venv/bin/pytest ...` or `make test` as root",
            returncode=2,
        )


def _stack_from_env() -> Stack:
    port_base = os.environ.get("SEGSCOPE_STACK_PORT_BASE")
    run_dir = os.environ.get("SEGSCOPE_STACK_RUN_DIR")
    # fresh: a stack this session starts gets empty topics and an empty database
    return Stack(run_dir=run_dir or None, port_base=int(port_base) if port_base else None, fresh=True)


@pytest.fixture(scope="session")
def stack():
    """Kafka + InfluxDB + Telegraf, ready (Telegraf's consumer group has a member), for the session."""
    if os.environ.get("SEGSCOPE_TEST_QUICK"):
        # `make test-quick` promises no services: a module that needs them is not a quick one
        pytest.fail("this test uses the service stack: remove its module from [quick] in tests/schedule.toml")
    stack = _stack_from_env()
    session = stack.shared()
    try:
        session.__enter__()
    except StackError as exc:
        pytest.fail(f"service stack did not start: {exc}", pytrace=False)
    print(
        f"\n[stack] up in {stack.last_up_seconds:.1f} s "
        f"(started: {','.join(sorted(stack.started)) or 'none, all reused'})",
        file=sys.stderr,
    )
    try:
        yield stack
    finally:
        session.__exit__(None, None, None)


def _bpffs_mounted() -> bool:
    with open("/proc/mounts") as mounts:
        return any(line.split()[1:3] == [str(BPFFS), "bpf"] for line in mounts)


@pytest.fixture(scope="session")
def bpffs() -> Path:
    """/sys/fs/bpf with a bpf filesystem on it (it is not mounted at boot on these machines)."""
    if not _bpffs_mounted():
        subprocess.run(["mount", "-t", "bpf", "bpf", str(BPFFS)], check=True)
    return BPFFS


# what runs last in a group, in this order: each waits for something built in the background while
# the group's other tests run
LAST = (
    REPO / "tests" / "packaging",  # the Debian root, the .debs, the pip venv (tests/packaging/prepare.py)
    REPO / "tests" / "deploy",  # helm, kustomize, kubeconform, kube-score (scripts/k8s_tools.sh)
)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """tests/packaging/ and tests/deploy/ run last: what they need is built in the background while
    everything else runs (scripts/test_groups.py, scripts/test.sh)."""

    def rank(item: pytest.Item) -> int:
        path = Path(str(item.path))
        return next((i + 1 for i, folder in enumerate(LAST) if path.is_relative_to(folder)), 0)

    items.sort(key=rank)  # stable: the order is kept otherwise


# CPU seconds per module: the runner (scripts/test_groups.py) puts each group in a cgroup of its own,
# so that what a test's processes use (its stacks, agents, labs, daemons) is counted; each test's
# setup, call and teardown are added to its module, in .run/test-groups/<group>/cpu.json
_CPU_CGROUP = os.environ.get("SEGSCOPE_TEST_CPU_CGROUP")
_cpu_by_module: dict[str, float] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if not _CPU_CGROUP:
        yield
        return
    before = cgroup_cpu_s(Path(_CPU_CGROUP))
    yield
    path = Path(str(item.path))
    module = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
    _cpu_by_module[module] = _cpu_by_module.get(module, 0.0) + cgroup_cpu_s(Path(_CPU_CGROUP)) - before
    if nextitem is None or nextitem.path != item.path:  # the module's teardown is in: write it out
        _write_cpu()


def _write_cpu() -> None:
    group_dir = os.environ.get("SEGSCOPE_TEST_GROUP_DIR")
    if group_dir:
        out = Path(group_dir) / "cpu.json"
        out.write_text(json.dumps({k: round(v, 1) for k, v in sorted(_cpu_by_module.items())}, indent=1) + "\n")
