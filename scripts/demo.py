#!/usr/bin/env python3
"""segscope demo: a STAMP session and an alternate-marked flow over an emulated SRv6 network,
from XDP to InfluxDB, set up by the controller from an intent file, ending with the HTML report.

    make demo                       # what README.md tells a newcomer to run
    .local/venv/bin/python scripts/demo.py --duration 30 --keep-services

Steps: start Kafka, InfluxDB and Telegraf on 127.0.0.1; create H1-A-R-B-H2 in network
namespaces (netlab/topologies/line5_bare.yaml: addresses and plain routes, no SRv6) with 2 ms
injected on A->B and 1 ms on B->A; start one gRPC agent per SRv6 node (A, R, B; mutual TLS)
and the Faust delay processor; `controller apply` controller/examples/demo_line5.yaml: local
SIDs on A, R, B, the SRv6 policies of A and B, the XDP reflector on B and the XDP collector on
A with a STAMP session sending for --duration seconds (the sender's agent streams the
collected records to Kafka), and flow 7 (controller/examples/demo_pm.yaml): H1 pings H2 through
A's policy, the packets are coloured on A and counted on B per 1 s block, and nftables on R
drops --loss-pct % of them; read the per-second delays and the per-block loss back from InfluxDB
and print them next to the injected values, then `controller status`, then write the report
(`segscope-report`, dashboards/report.py) and print its path. Everything is stopped again at
the end, also on Ctrl-C (with --keep-services, Kafka/InfluxDB/Telegraf stay up so you can query them).
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "schemas" / "python")]

from controller.intent import load_intent  # noqa: E402
from controller.pipeline import ControlledPipeline  # noqa: E402
from controller.status import collect, render  # noqa: E402
from dashboards import report  # noqa: E402
from netlab import Lab, relay_lateness_us, teardown  # noqa: E402
from scripts.results import StampSessionSpec, read_delay_summary, wait_for_points  # noqa: E402
from services.stack import Stack  # noqa: E402

TOPOLOGY = REPO / "netlab" / "topologies" / "line5_bare.yaml"
INTENT = REPO / "controller" / "examples" / "demo_pm.yaml"
FLOW_ID, FLOW_SID = 7, "fc00:3::d6"  # the intent's flow; its packets' destination after R's End


def step(msg: str) -> float:
    print(f"==> {msg}", flush=True)
    return time.monotonic()


def done(t0: float, extra: str = "") -> None:
    print(f"    ok ({time.monotonic() - t0:.1f} s){' ' + extra if extra else ''}", flush=True)


_last_report = [-1.0]


def progress(elapsed: float, total: float) -> None:
    if not sys.stdout.isatty():  # a log file: one line every 5 s instead of a bar
        if elapsed - _last_report[0] >= 5 or elapsed >= total:
            _last_report[0] = elapsed
            print(f"    {elapsed:4.0f}/{total:.0f} s", flush=True)
        return
    width = 30
    n = int(width * elapsed / total) if total else width
    print(f"\r    [{'#' * n}{'.' * (width - n)}] {elapsed:4.0f}/{total:.0f} s", end="", flush=True)


def wait_for_blocks(stack, since_ns: int, until_ns: int, timeout_s: float = 60) -> dict:
    """Flow 7's blocks from since_ns to until_ns (the traffic), once a block after until_ns is in
    InfluxDB: the monitor keeps publishing (empty) blocks after the traffic, in block order."""
    window = f'"flow" = \'{FLOW_ID}\' AND time >= {since_ns} AND time <= {until_ns}'
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if stack.influx_query(f'SELECT count("reason") FROM "altmark_loss" WHERE "flow" = \'{FLOW_ID}\' '
                              f"AND time > {until_ns + 10**9}"):  # fmt: skip
            break
        time.sleep(1)
    rows = stack.influx_query(
        f'SELECT sum("tx_packets") AS tx, sum("lost") AS lost, count("lost") AS blocks FROM "altmark_loss" '
        f'WHERE {window} AND "complete" = true'
    )
    now = rows[0] if rows else {"tx": 0, "lost": 0, "blocks": 0}
    inc = stack.influx_query(f'SELECT "reason" FROM "altmark_loss" WHERE {window} AND "complete" = false')
    reasons: dict[str, int] = {}
    for r in inc:
        reasons[r["reason"]] = reasons.get(r["reason"], 0) + 1
    tx, lost = now["tx"] or 0, now["lost"] or 0
    return {"tx": tx, "lost": lost, "blocks": now["blocks"], "ratio": lost / tx if tx else 0.0,
            "incomplete": ", ".join(f"{k} {v}" for k, v in sorted(reasons.items())) or "none"}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=30, help="seconds of STAMP traffic (default 30)")
    ap.add_argument("--rate", type=int, default=100, help="test packets per second (default 100)")
    ap.add_argument("--fwd-delay-us", type=int, default=2000, help="delay injected A->B (default 2000)")
    ap.add_argument("--rev-delay-us", type=int, default=1000, help="delay injected B->A (default 1000)")
    ap.add_argument("--loss-pct", type=float, default=2.0, help="%% of flow 7's packets dropped on R (default 2)")
    ap.add_argument(
        "--keep-services",
        action="store_true",
        help="leave Kafka, InfluxDB and Telegraf running afterwards for your own queries",
    )
    ap.add_argument("--prefix", default="demo", help="netlab prefix (namespaces <prefix>-A ...; default demo)")
    args = ap.parse_args()

    # Ctrl-C and SIGTERM unwind through the finally blocks below.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))

    stack = Stack()
    lab = pipe = None
    try:
        t = step("starting Kafka, InfluxDB and Telegraf on 127.0.0.1")
        stack.up()
        done(t, f"kafka {stack.kafka_bootstrap}, influxdb {stack.influx_url}")

        t = step(
            f"creating the emulated network H1-A-R-B-H2, no SRv6 configured yet "
            f"({args.fwd_delay_us} us injected A->B, {args.rev_delay_us} us B->A)"
        )
        teardown(args.prefix)  # a previous run killed with SIGKILL may have left it
        lab = Lab.up(TOPOLOGY, prefix=args.prefix, delay_us={"ar": (args.fwd_delay_us, args.rev_delay_us)})
        done(t)

        pipe = ControlledPipeline(lab, stack, REPO / ".run" / args.prefix)
        t = step("starting a gRPC agent on A, R and B (mutual TLS) and the Faust delay and loss processors")
        agents = pipe.start_agents()
        pipe.start_processor("delay")
        pipe.start_processor("loss")
        done(t, ", ".join(f"{n} {a}" for n, a in agents.addresses.items()))

        t = step(f"nftables on R drops {args.loss_pct:g} % of flow {FLOW_ID}'s packets (destination {FLOW_SID})")
        loss = lab.add_loss("R", args.loss_pct, match=f"ip6 daddr {FLOW_SID}")
        done(t)

        # the intent file as written, with this run's rate and a finite run of --duration seconds
        intent = load_intent(INTENT)
        session = dataclasses.replace(intent.stamp_sessions[0], rate_pps=args.rate, duration_s=args.duration)
        intent.stamp_sessions[0] = session
        spec = StampSessionSpec(
            ssid=session.ssid,
            sender_node=session.sender.node,
            rate_pps=args.rate,
            segs=list(session.segs),
            return_segs=list(session.return_segs),
        )
        t = step(f"controller apply {INTENT.relative_to(REPO)} (rate {args.rate}/s, {args.duration:.0f} s)")
        t_start_ns = time.time_ns()  # points are stamped in UTC
        relay_before = lab.relay_stats("ar")
        result = pipe.apply(intent)
        for op, rpcs in result.done:
            print(f"      {op.describe()}  [{', '.join(rpcs)}]")
        mutating = sum(n for calls in result.mutating_calls.values() for n in calls.values())
        done(t, f"{len(result.done)} operations, {mutating} changing RPCs")

        t = step(
            f"STAMP session {spec.ssid}: {args.rate} packets/s for {args.duration:.0f} s "
            f"over SID list {','.join(spec.segs)} (return {','.join(spec.return_segs)}); "
            f"H1 pings H2 at 200 packets/s as flow {FLOW_ID}'s traffic"
        )
        ping = lab.popen("H1", ["ping", "-6", "-q", "-i", "0.005", "-w", f"{args.duration:.0f}", "fd00:b::1"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        pipe.wait_stopped(
            session.sender.node, session.ssid, timeout_s=args.duration + 30, progress=progress, total_s=args.duration
        )
        relay_after = lab.relay_stats("ar")
        ping.wait(timeout=30)
        t_traffic_end_ns = time.time_ns()
        dropped = lab.loss_counter(loss)
        if sys.stdout.isatty():
            print()
        summary = pipe.sender_summary(session.sender.node, session.ssid)
        done(t, f"sent {summary['sent']}, send errors {summary['send_errors']}")

        t = step("applying the same intent again: the controller finds nothing to do")
        again = pipe.apply(intent)
        done(t, f"{len(again.ops)} operations, changing RPCs: {again.mutating_calls or 'none'}")

        t = step("waiting for the last seconds to reach InfluxDB")
        stats = pipe.datapath_stats(session.sender.node, session.reflector.node)
        collected = stats["stamp_collector"].get("collected", 0)
        got = wait_for_points(stack, spec, t_start_ns, expect_records=collected, timeout_s=60)
        done(t, f"{got} records aggregated (collector saw {collected})")

        rows = read_delay_summary(stack, spec, t_start_ns)
        injected = {
            "forward": args.fwd_delay_us,
            "reverse": args.rev_delay_us,
            "round_trip": args.fwd_delay_us + args.rev_delay_us,
        }
        rl = relay_lateness_us(relay_before, relay_after)
        late = {"forward": rl["a_to_b"], "reverse": rl["b_to_a"], "round_trip": rl["a_to_b"] + rl["b_to_a"]}
        print()
        print(
            f"Measured delay per direction, session ssid={spec.ssid} (from InfluxDB, database "
            f"{stack.influx_db!r}, measurement stamp_delay)"
        )
        hdr = (
            f"{'direction':<11} {'injected':>9} {'relay late':>10} {'mean':>9} {'min':>9} {'p50':>9} "
            f"{'p99':>9} {'max':>9} {'samples':>8}"
        )
        print(hdr)
        print("-" * len(hdr))
        for d in ("forward", "reverse", "round_trip"):
            r = rows.get(d)
            if not r:
                print(f"{d:<11} {injected[d]:>7} us   (no data)")
                continue
            print(
                f"{d:<11} {injected[d]:>6} us {late[d]:>+7.0f} us {r['mean_us']:>6.0f} us "
                f"{r['min_us']:>6.0f} us {r['p50_us']:>6.0f} us {r['p99_us']:>6.0f} us {r['max_us']:>6.0f} us "
                f"{r['count']:>8}"
            )
        print(
            "mean - injected = the path's own latency (sender syscall, veth hops, SRv6 End on R,\n"
            "softirqs) + 'relay late': how late the delay emulator itself released frames on\n"
            "average, as it measured. min is the floor: nothing arrives before the injected delay."
        )
        print()
        q = (
            'SELECT mean("mean_us"), max("p99_us"), sum("count") FROM "stamp_delay" '
            'WHERE time > now() - 5m GROUP BY "direction", time(10s)'
        )
        t = step(
            f"waiting for flow {FLOW_ID}'s last blocks (the loss processor publishes a block once both edges reported)"
        )
        lost = wait_for_blocks(stack, t_start_ns, t_traffic_end_ns)
        done(t)
        print()
        print(
            f"Exact loss of flow {FLOW_ID} (alternate marking, measurement altmark_loss): "
            f"{lost['blocks']} complete blocks, {lost['tx']} packets sent, {lost['lost']} lost "
            f"({lost['ratio']:.2%}); nftables on R dropped {dropped} (the blocks at the flow's start and end are "
            f"incomplete: {lost['incomplete']})"
        )
        print()
        print(f"python -m controller status {INTENT.relative_to(REPO)}:")
        print(render(collect(pipe.ctl, stack.influx_url, stack.influx_db)))
        print()
        t = step("writing the report (segscope-report: what the Grafana dashboards show, in one HTML file)")
        influx = report.Influx(stack.influx_url, stack.influx_db)
        page = REPO / ".run" / args.prefix / "segscope-report.html"
        page.write_text(report.render_html(report.collect(influx, int(args.duration) + 120), influx))
        done(t)
        print(f"\nReport: {page}\n  open it in a browser, or: chromium --headless --screenshot {page}\n")
        print("Query it yourself (run the demo with --keep-services to keep InfluxDB up):")
        print(
            f"  curl -sG {stack.influx_url}/query --data-urlencode db={stack.influx_db} \\\n"
            f"       --data-urlencode 'q={q}'"
        )
        return 0
    except KeyboardInterrupt:
        print("\ninterrupted: cleaning up", flush=True)
        return 130
    finally:
        if pipe:
            pipe.stop()
        if lab:
            lab.down()
        if not args.keep_services:
            stack.down()


if __name__ == "__main__":
    sys.exit(main())
