"""Raw configuration throughput of ONE agent (agent) over one persistent mutual-TLS
connection, by RPC style. (bench/config_ops.py measures the same from the controller.)

    .local/venv/bin/python bench/agent_ops.py [--prefix agtb] [--n 2000] [--batch 1000] [--json]

A throwaway netns <prefix>-bench with a veth (d0) is the "node"; the agent runs with fresh test
certificates (tests/agent/agent_env.py). Per style it creates N SRv6 policies (seg6 encap, two
SIDs), replaces each one's SID list (UpdatePolicy: hitless NLM_F_REPLACE) and removes them:
  unary      one blocking call at a time (what seed 002 measured: 357 op/s remote)
  pipelined  unary calls with up to --inflight outstanding on the same channel (futures)
  stream     Srv6Service.StreamOperations: one operation per message, one result per message
  batch      Srv6Service.ApplyBatch with --batch operations per call
Every result is checked (a failed operation fails the benchmark) and the kernel's route count
is compared with what should be there after each phase.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "schemas" / "python")]

from segscope_proto.segscope.agent.v1 import srv6_pb2 as pb  # noqa: E402
from segscope_proto.segscope.agent.v1 import srv6_pb2_grpc
from tests.agent.agent_env import start_agent  # noqa: E402

SEGS_A, SEGS_B = ["fc00::1", "fc00::2"], ["fc00::3", "fc00::2"]


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def dest(i: int) -> str:
    return f"fd01:{i >> 16:x}:{i & 0xFFFF:x}::/64"


def op(kind: str, i: int) -> pb.Srv6Operation:
    if kind == "create":
        return pb.Srv6Operation(
            create_policy=pb.CreatePolicyRequest(
                policy=pb.Policy(destination=dest(i), mode=pb.ENCAP_MODE_ENCAP, segments=SEGS_A, device="d0")
            )
        )
    if kind == "update":
        return pb.Srv6Operation(
            update_policy=pb.UpdatePolicyRequest(
                policy=pb.Policy(destination=dest(i), mode=pb.ENCAP_MODE_ENCAP, segments=SEGS_B, device="d0")
            )
        )
    return pb.Srv6Operation(remove_policy=pb.RemovePolicyRequest(destination=dest(i)))


def run_unary(stub, kind: str, n: int, inflight: int) -> None:
    method = {"create": stub.CreatePolicy, "update": stub.UpdatePolicy, "remove": stub.RemovePolicy}[kind]
    reqs = [getattr(op(kind, i), op(kind, i).WhichOneof("op")) for i in range(n)]
    if inflight <= 1:
        for r in reqs:
            method(r, timeout=30)
        return
    window: deque = deque()
    for r in reqs:
        window.append(method.future(r, timeout=30))
        if len(window) >= inflight:
            window.popleft().result()
    while window:
        window.popleft().result()


def run_stream(stub, kind: str, n: int) -> None:
    bad = [r for r in stub.StreamOperations((op(kind, i) for i in range(n)), timeout=300) if r.code]
    if bad:
        raise SystemExit(f"stream {kind}: {len(bad)} failed, first: {bad[0].message}")


def run_batch(stub, kind: str, n: int, batch: int) -> None:
    for k in range(0, n, batch):
        r = stub.ApplyBatch(
            pb.ApplyBatchRequest(operations=[op(kind, i) for i in range(k, min(n, k + batch))]), timeout=300
        )
        if r.failed:
            first = next(x for x in r.results if x.code)
            raise SystemExit(f"batch {kind}: {r.failed} failed, first: {first.message}")


def count_routes(ns: str) -> int:
    return sum(1 for line in sh("ip", "-n", ns, "-6", "route").splitlines() if line.startswith("fd01:"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefix", default="agtb", help="netns prefix (default agtb)")
    ap.add_argument("--n", type=int, default=2000, help="operations per phase for unary/pipelined/stream")
    ap.add_argument("--n-batch", type=int, default=20000, help="operations per phase for batch")
    ap.add_argument("--batch", type=int, default=1000, help="operations per ApplyBatch call")
    ap.add_argument("--inflight", type=int, default=32, help="outstanding calls in the pipelined style")
    ap.add_argument("--log-level", default="INFO", help="agent log level (INFO logs every change)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    a = ap.parse_args()
    ns = f"{a.prefix}-bench"
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    sh("ip", "netns", "add", ns)
    agent = None
    results: dict[str, dict[str, float]] = {}
    try:
        sh("ip", "-n", ns, "link", "add", "d0", "type", "veth", "peer", "name", "d1")
        sh("ip", "-n", ns, "link", "set", "d0", "up")
        sh("ip", "-n", ns, "link", "set", "d1", "up")
        sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.seg6_enabled=1")
        agent = start_agent(ns, "bench", tempfile.mkdtemp(prefix=f"{a.prefix}-bench-"), log_level=a.log_level)
        with agent.channel() as ch:
            stub = srv6_pb2_grpc.Srv6ServiceStub(ch)
            styles = [
                ("unary", a.n, lambda k, n: run_unary(stub, k, n, 1)),
                ("pipelined", a.n, lambda k, n: run_unary(stub, k, n, a.inflight)),
                ("stream", a.n, lambda k, n: run_stream(stub, k, n)),
                ("batch", a.n_batch, lambda k, n: run_batch(stub, k, n, a.batch)),
            ]
            for style, n, fn in styles:
                results[style] = {}
                for kind, expect in (("create", n), ("update", n), ("remove", 0)):
                    t0 = time.perf_counter()
                    fn(kind, n)
                    dt = time.perf_counter() - t0
                    got = count_routes(ns)
                    if got != expect:
                        raise SystemExit(f"{style} {kind}: {got} routes in the kernel, expected {expect}")
                    results[style][kind] = round(n / dt)
    finally:
        if agent is not None:
            agent.stop()
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    load = Path("/proc/loadavg").read_text().split()[0]
    if a.json:
        print(
            json.dumps(
                {
                    "ops_per_s": results,
                    "loadavg_1m": float(load),
                    "n": a.n,
                    "n_batch": a.n_batch,
                    "batch": a.batch,
                    "inflight": a.inflight,
                    "log_level": a.log_level,
                }
            )
        )
        return
    print(f"agent configuration ops/s over one mTLS connection (load average {load}, 2 vCPUs shared)")
    print(f"{'style':<10} {'create':>8} {'update':>8} {'remove':>8}")
    for style, r in results.items():
        print(f"{style:<10} {r['create']:>8} {r['update']:>8} {r['remove']:>8}")


if __name__ == "__main__":
    main()
