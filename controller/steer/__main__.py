"""segscope-steer: steer SRv6 policies on what segscope measures (docs/steering.md).

    segscope-steer INTENT.yaml [--kafka HOST:PORT] [--dry-run] [--replica NAME]
                   [--policy-set NAME] [--leader-election kafka|none] [--log-level INFO]
                   [--health HOST:PORT]

Reads the `steering:` entries of the intent (the same file `segscope-controller` applies: it
creates the probe sessions), the candidates' stamp_delay points from `segscope.metrics`, and
replaces each steered policy's SID list on its node's agent when a candidate is better by the
entry's hysteresis. `--dry-run` (or `dry_run: true` in an entry) decides and reports, never calls.
Kafka security: the SEGSCOPE_KAFKA_* settings (docs/security.md), as the `controller` role. A
refused login or ACL stops the replica (exit 4): retrying cannot fix it, and a replica that never
joins the election would stand by silently.
Exit codes: 0 stopped by SIGTERM/SIGINT, 2 invalid intent or no `steering:` entry, 4 Kafka refused
this replica (password, CA, ACL).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading

from controller.intent import IntentError, load_intent

EXIT_INVALID = 2
EXIT_KAFKA_REFUSED = 4  # the same code as `segscope-controller run`


def _version() -> str:
    from segscope_schemas.version import __version__

    return __version__


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="segscope-steer", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--version", action="version", version=f"segscope {_version()}")
    ap.add_argument("file", help="intent YAML with `steering:` entries (controller/README.md)")
    ap.add_argument("--kafka", default=os.environ.get("SEGSCOPE_KAFKA", "127.0.0.1:9092"), help="bootstrap servers")
    ap.add_argument("--dry-run", action="store_true", help="decide and report only, for every entry")
    ap.add_argument("--replica", default=f"{socket.gethostname()}-{os.getpid()}", help="this replica's name")
    ap.add_argument("--policy-set", help="name of the set the replicas share a leader for (default: the file's stem)")
    ap.add_argument("--leader-election", choices=("kafka", "none"), default="kafka")
    ap.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    ap.add_argument(
        "--health",
        default=os.environ.get("SEGSCOPE_STEER_HEALTH", "off"),
        help="HOST:PORT for HTTP /healthz /readyz /metrics /status (default off)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    from pathlib import Path

    from controller.leader import KafkaLeadership, NoElection
    from controller.steer.service import SteerService
    from segscope_kafka import KafkaConfigError, RefusalWatch, from_env
    from segscope_kafka.acls import STEER_GROUP_PREFIX
    from segscope_schemas.health import HealthAddressError, parse_address

    args = parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        intent = load_intent(args.file)
    except IntentError as exc:
        for line in exc.lines:
            print(line, file=sys.stderr)
        return EXIT_INVALID
    if not intent.steering:
        print(f"{args.file}: no `steering:` entry. Fix: add one (docs/steering.md)", file=sys.stderr)
        return EXIT_INVALID
    try:
        health = parse_address(args.health, "--health")
        sec = from_env()
    except (HealthAddressError, KafkaConfigError) as e:
        print(f"segscope-steer: {e}", file=sys.stderr)
        return EXIT_INVALID
    stop = threading.Event()
    watch = RefusalWatch(sec, on_refused=lambda _msg: stop.set(), program="segscope-steer")
    logging.getLogger("segscope.steer").info("Kafka %s", sec.describe())
    policy_set = args.policy_set or Path(args.file).stem
    if args.leader_election == "kafka":
        group = f"{STEER_GROUP_PREFIX}.{policy_set}"
        leadership = KafkaLeadership(args.kafka, args.replica, group=group, error_cb=watch)
    else:
        leadership = NoElection()
    service = SteerService(
        intent, args.kafka, leadership, args.replica, dry_run=args.dry_run, health=health, kafka_error_cb=watch
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    logging.getLogger("segscope.steer").info(
        "replica %s steers %d policies of set %s%s",
        args.replica,
        len(intent.steering),
        policy_set,
        " (dry-run)" if args.dry_run else "",
    )
    service.run(stop)
    if watch.refused:
        print(f"segscope-steer: stopped, Kafka refused this replica: {watch.refused}", file=sys.stderr)
        return EXIT_KAFKA_REFUSED
    return 0


if __name__ == "__main__":
    sys.exit(main())
