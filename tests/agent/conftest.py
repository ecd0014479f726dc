"""Fixtures of the agent tests: one netlab line5_two_paths lab (prefix `agt`) for the session and
one agent per node (A, R, B) under mutual TLS, started with tests/agent/agent_env.py."""

from __future__ import annotations

import json
import os
import sys

import grpc
import pytest

from netlab import Lab
from netlab.lab import teardown
from segscope_proto.segscope.agent.v1 import flowmon_pb2_grpc, srv6_pb2_grpc, stamp_pb2_grpc
from tests.agent.agent_env import AgentHandle, make_test_pki, start_agent
from tests.isolation import own_name

# netns and bpffs instances of these tests start with it; another value runs a second copy of the
# suite beside one that runs (SEGSCOPE_AGENT_TEST_PREFIX)
PREFIX = os.environ.get("SEGSCOPE_AGENT_TEST_PREFIX") or own_name("agt")
TOPOLOGY = "netlab/topologies/line5_two_paths.yaml"


@pytest.fixture(scope="session")
def lab(bpffs):
    teardown(PREFIX)  # leftovers of an interrupted run of these tests (only the PREFIX-* lab)
    lab = Lab.up(TOPOLOGY, prefix=PREFIX)
    try:
        yield lab
    finally:
        lab.down()


@pytest.fixture(scope="session")
def pki(tmp_path_factory):
    return make_test_pki(tmp_path_factory.mktemp("agt-pki"))


@pytest.fixture(scope="session")
def agents(lab, pki, tmp_path_factory) -> dict[str, AgentHandle]:
    run_dir = tmp_path_factory.mktemp("agt-agents")
    out: dict[str, AgentHandle] = {}
    try:
        for node in ("A", "R", "B"):
            out[node] = start_agent(lab.ns(node), node, run_dir, pki=pki, instance=f"{PREFIX}-{node}")
        yield out
    finally:
        codes = {n: a.stop() for n, a in out.items()}
        sys.stderr.write(f"\n[agents] exit codes {codes}, logs in {run_dir}\n")


class Stubs:
    def __init__(self, channel: grpc.Channel):
        self.channel = channel
        self.srv6 = srv6_pb2_grpc.Srv6ServiceStub(channel)
        self.stamp = stamp_pb2_grpc.StampServiceStub(channel)
        self.flowmon = flowmon_pb2_grpc.FlowMonitorServiceStub(channel)


@pytest.fixture(scope="session")
def stubs(agents) -> dict[str, Stubs]:
    chans = {n: a.channel() for n, a in agents.items()}
    yield {n: Stubs(c) for n, c in chans.items()}
    for c in chans.values():
        c.close()


def ip(lab: Lab, node: str, *args: str) -> str:
    return lab.run(node, ["ip", *args], check=True).stdout


def rpc_error(fn, req) -> grpc.RpcError:
    """Call, expect a failure, return the RpcError."""
    try:
        fn(req, timeout=10)
    except grpc.RpcError as e:
        return e
    raise AssertionError(f"{fn} succeeded, an error was expected for {req}")


def expect_error(fn, req, code: grpc.StatusCode, field: str) -> str:
    e = rpc_error(fn, req)
    assert e.code() == code, f"{e.code()} {e.details()}"
    assert e.details().startswith(field), f"message {e.details()!r} does not start with {field!r}"
    return e.details()


def drop_counters(lab) -> dict[str, int]:
    """Every non-zero drop/discard/error counter of the path's nodes (nstat + link stats), to say
    WHERE packets went if the exact count ever differs."""
    out = {}
    # per-CPU backlog drops (global, not per netns): column 2 of /proc/net/softnet_stat
    with open("/proc/net/softnet_stat") as f:
        out["softnet:dropped"] = sum(int(line.split()[1], 16) for line in f)
    for node in ("H1", "A", "R", "B", "H2"):
        for line in lab.run(node, ["nstat", "-asz"], check=True).stdout.splitlines():
            parts = line.split()
            if (
                len(parts) >= 2
                and parts[1].isdigit()
                and any(k in parts[0] for k in ("Discard", "NoRoute", "Drop", "Err", "Trunc", "Fail"))
            ):
                out[f"{node}:{parts[0]}"] = int(parts[1])
        links = json.loads(lab.run(node, ["ip", "-s", "-j", "link"], check=True).stdout)
        for l in links:
            for d in ("rx", "tx"):
                st = l.get("stats64", {}).get(d, {})
                for k in ("dropped", "errors"):
                    out[f"{node}:{l['ifname']}:{d}_{k}"] = st.get(k, 0)
    return out


def link_rx_drops(moved: dict[str, int]) -> int:
    """Packets the lab's veths dropped on receive (per-CPU backlog overflow: the backlog is shared
    by the whole machine, so other load on this VM can fill it; each such drop shows as
    tx_dropped on the sending veth and rx_dropped on its peer)."""
    return sum(v for k, v in moved.items() if k.endswith(":rx_dropped"))


def moved(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
