"""segscope controller: python -m controller validate|diff|apply|status|run FILE [--json]

run: keep every node at the intent until SIGTERM/SIGINT (controller/README.md, "run"): watch the
agents, repair what one lost within seconds of it coming back, never touch what it does not own,
report each repair; with --kafka, one leader among its replicas.

Exit codes:
  0  ok (validate: the file is valid; diff: nothing to do; apply: every call succeeded and every
     program it started is running;
     status: every agent answered)
  1  an agent could not be reached or refused a call (the message names node, call, gRPC code),
     or a program the apply started exited with an error (node, session and the program's message)
  2  the intent file is invalid (every problem printed as FILE:LINE:COLUMN: path: what. Fix: how)
  3  diff only: there are changes to apply
  4  run only: Kafka refused this replica (its login, TLS or ACLs: the message names the
     SEGSCOPE_KAFKA_* setting to check), or those settings are unusable; retrying cannot fix it
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from controller.agents import AgentError
from controller.core import Controller
from controller.intent import IntentError, load_intent
from controller.steering import describe_candidates, render_candidates

EXIT_OK, EXIT_AGENT, EXIT_INVALID, EXIT_CHANGES, EXIT_KAFKA_REFUSED = 0, 1, 2, 3, 4


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=False))


def cmd_validate(args, intent) -> int:
    if args.json:
        _print_json(
            {
                "valid": True,
                "file": args.file,
                "nodes": sorted(intent.nodes),
                "local_sids": len(intent.local_sids),
                "policies": len(intent.policies),
                "stamp_sessions": len(intent.stamp_sessions),
                "flows": len(intent.flows),
                "inline_monitors": len(intent.inline_monitors),
                "steering": [describe_candidates(s) for s in intent.steering],
            }
        )
    else:
        print(
            f"{args.file}: valid ({len(intent.nodes)} nodes, {len(intent.local_sids)} local SIDs, "
            f"{len(intent.policies)} policies, {len(intent.stamp_sessions)} STAMP sessions, "
            f"{len(intent.flows)} flows, {len(intent.inline_monitors)} in-line monitors)"
        )
        for s in intent.steering:
            print("\n".join(render_candidates(describe_candidates(s))))
    return EXIT_OK


def cmd_diff(args, intent) -> int:
    with Controller(intent, connect_timeout_s=args.timeout) as ctl:
        ops = ctl.plan()
    if args.json:
        _print_json({"changes": len(ops), "ops": [op.to_json() for op in ops]})
    elif ops:
        print(f"{len(ops)} change(s):")
        for op in ops:
            print("  " + op.describe())
    else:
        print("no changes: the agents already match the intent")
    return EXIT_CHANGES if ops else EXIT_OK


def cmd_apply(args, intent) -> int:
    with Controller(intent, connect_timeout_s=args.timeout) as ctl:
        result = ctl.apply(batch=args.batch)
    if args.json:
        _print_json(result.to_json())
    else:
        if not result.ops:
            print("no changes: the agents already match the intent")
        for op, rpcs in result.done:
            print(f"  done    {op.describe()}  [{', '.join(rpcs)}]")
        if result.failed:
            op, exc = result.failed
            print(f"  FAILED  {op.describe()}\n          {exc}", file=sys.stderr)
            left = len(result.ops) - len(result.done) - 1
            if left:
                print(f"  {left} later operation(s) not attempted", file=sys.stderr)
        for err in result.program_errors:
            print(f"  FAILED  {err}", file=sys.stderr)
        mutating = sum(n for calls in result.mutating_calls.values() for n in calls.values())
        reads = sum(n for calls in result.calls.values() for n in calls.values()) - mutating
        print(
            f"{len(result.done)}/{len(result.ops)} operation(s) applied with {mutating} changing RPC(s) "
            f"and {reads} read RPC(s) over {len(result.calls)} channel(s) in {result.seconds:.2f} s"
        )
    return EXIT_OK if result.ok else EXIT_AGENT


def cmd_status(args, intent) -> int:
    from controller.status import collect, render

    with Controller(intent, connect_timeout_s=args.timeout) as ctl:
        status = collect(ctl, args.influx_url, args.influx_db, args.window, args.repairs_window)
    if args.json:
        _print_json(status)
    else:
        print(render(status))
    return EXIT_OK if all(n["reachable"] for n in status["nodes"].values()) else EXIT_AGENT


def cmd_run(args, intent) -> int:
    import logging
    import signal
    import socket
    import threading

    from controller.leader import KafkaLeadership, NoElection
    from controller.reconcile import Reconciler

    logging.basicConfig(
        level=args.log_level,
        stream=sys.stderr,
        format="%(asctime)s controller[%(threadName)s] %(levelname)s %(name)s: %(message)s",
    )
    replica = args.replica or f"{socket.gethostname()}-{os.getpid()}"
    election = args.leader_election or ("kafka" if args.kafka else "none")
    stop = threading.Event()
    watch = None
    if args.kafka:  # SEGSCOPE_KAFKA_* (segscope_kafka), as every program of segscope reads them
        from segscope_kafka import KafkaConfigError, RefusalWatch, from_env

        try:
            sec = from_env()
        except KafkaConfigError as e:
            print(f"controller run: {e}", file=sys.stderr)
            return EXIT_KAFKA_REFUSED
        # a refusal (wrong password, CA, missing ACL) is said once and stops the replica: retrying
        # cannot fix it, and a replica that never joins the election would stand by silently
        watch = RefusalWatch(sec, on_refused=lambda _msg: stop.set(), program="controller run")
        logging.getLogger("segscope.controller.run").info("Kafka %s", sec.describe())
    if election == "kafka":
        if not args.kafka:
            print("error: --leader-election kafka needs --kafka BROKERS", file=sys.stderr)
            return EXIT_INVALID
        leadership = KafkaLeadership(args.kafka, replica, error_cb=watch)
    else:
        leadership = NoElection()
    rec = Reconciler(
        args.file,
        leadership,
        replica=replica,
        interval_s=args.interval,
        kafka=args.kafka,
        stats_interval_s=args.stats_interval,
        health=args.health,
        kafka_error_cb=watch,
    )
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    logging.getLogger("segscope.controller.run").info(
        "run %s: replica %s, leader election %s, %d nodes, every node reconciled every %g s",
        args.file,
        replica,
        election,
        len(intent.nodes),
        args.interval,
    )
    rec.run(stop)
    if watch is not None and watch.refused:
        print(f"controller run: stopped, Kafka refused this replica: {watch.refused}", file=sys.stderr)
        return EXIT_KAFKA_REFUSED
    return EXIT_OK


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m controller", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--version", action="version", version=f"segscope {segscope_version()}")
    ap.add_argument("command", choices=("validate", "diff", "apply", "status", "run"))
    ap.add_argument("file", help="intent YAML (controller/README.md)")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    ap.add_argument(
        "--batch",
        action="store_true",
        help="apply: send each run of SRv6 operations of one kind on one node as one ApplyBatch call",
    )
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for each agent's TLS channel")
    ap.add_argument(
        "--influx-url",
        default=os.environ.get("SEGSCOPE_INFLUX_URL", "http://127.0.0.1:18086"),
        help="status: InfluxDB v1 HTTP API (default $SEGSCOPE_INFLUX_URL, else http://127.0.0.1:18086)",
    )
    ap.add_argument("--influx-db", default=os.environ.get("SEGSCOPE_INFLUX_DB", "segscope"), help="status: database")
    ap.add_argument(
        "--window", type=float, default=60.0, help="status: seconds of loss blocks summed per flow (default 60)"
    )
    ap.add_argument(
        "--repairs-window", type=float, default=3600.0, help="status: seconds of `run`'s repairs listed (default 3600)"
    )
    run = ap.add_argument_group("run")
    run.add_argument(
        "--interval", type=float, default=30.0, help="run: every node is reconciled at least this often (s, default 30)"
    )
    run.add_argument(
        "--kafka",
        default=os.environ.get("SEGSCOPE_KAFKA"),
        help="run: Kafka bootstrap HOST:PORT (default $SEGSCOPE_KAFKA): leader election among replicas, "
        "repairs and counters on segscope.metrics",
    )
    run.add_argument(
        "--leader-election",
        choices=("kafka", "none"),
        help="run: kafka (the default with --kafka): one replica of the group leads; none: this one always does",
    )
    run.add_argument("--replica", help="run: this replica's name in logs and metrics (default HOSTNAME-PID)")
    run.add_argument("--health", help="run: HOST:PORT for HTTP /healthz /readyz /metrics /status (default off)")
    run.add_argument("--stats-interval", type=float, default=2.0, help="run: seconds between counter lines (default 2)")
    run.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.interval < 1:
        ap.error(f"--interval: {args.interval:g} must be >= 1 second")
    if args.window <= 0:
        ap.error(f"--window: {args.window:g} must be > 0 seconds")
    try:
        intent = load_intent(args.file)
    except IntentError as exc:
        if args.json:
            _print_json({"valid": False, "file": args.file, "errors": exc.lines})
        else:
            for line in exc.lines:
                print(line, file=sys.stderr)
            print(f"{len(exc.lines)} problem(s) in {args.file}", file=sys.stderr)
        return EXIT_INVALID
    handler = {"validate": cmd_validate, "diff": cmd_diff, "apply": cmd_apply, "status": cmd_status, "run": cmd_run}[
        args.command
    ]
    try:
        return handler(args, intent)
    except AgentError as exc:
        if args.json:
            _print_json({"error": str(exc), "node": exc.node, "call": exc.call, "code": exc.code})
        else:
            print(f"error: {exc}", file=sys.stderr)
        return EXIT_AGENT
    except OSError as exc:  # TLS material unreadable
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_AGENT


def segscope_version() -> str:
    from segscope_schemas.version import __version__

    return __version__


if __name__ == "__main__":
    sys.exit(main())
