"""segscope-topics: create segscope's Kafka topics on any cluster, with the partition counts and the
replication the deployment asks for; grow a topic that has fewer partitions. Idempotent, and safe
to run from several pods at once (the Helm chart runs it as an init container of every processor,
so the input topics have as many partitions as there are processor replicas before any starts).

    segscope-topics --bootstrap kafka:9092 [--partitions segscope.stamp.records=4 ...]
                    [--replication 3] [--timeout 120] [--check]

Every topic of the name registry (schemas/names.toml) is ensured, with its registry partition count
unless --partitions names it. --check only reports and exits 1 when a topic is missing or short.
Kafka security (TLS, SASL) from SEGSCOPE_KAFKA_* (segscope_kafka, docs/security.md); the principal
needs CREATE and ALTER on the topics (the admin role). Exit codes: 0 every topic ready, 1 a topic
missing or short (--check) or an error (named; a refusal by Kafka names the setting to check),
2 a bad flag or Kafka setting.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
import time

from segscope_kafka import KafkaConfigError, KafkaRefused, RefusalWatch, from_env, kafka_config, metadata
from segscope_schemas.names import TOPIC_CONFIG, TOPIC_PARTITIONS
from segscope_schemas.version import VERSION_LINE


def parse_partitions(items: list[str]) -> dict[str, int]:
    """['<topic>=4'] -> {'<topic>': 4, the other registry topics: their registry count}; every
    name must be a registry topic (schemas/names.toml)."""
    wanted = dict(TOPIC_PARTITIONS)
    for item in items:
        name, sep, count = item.partition("=")
        if not sep or not count.isdigit() or int(count) < 1:
            raise ValueError(f"--partitions {item!r}: expected TOPIC=N with N >= 1")
        if name not in wanted:
            raise ValueError(f"--partitions {item!r}: {name!r} is not a segscope topic (one of {', '.join(wanted)})")
        wanted[name] = int(count)
    return wanted


def admin_client(bootstrap: str):
    """(AdminClient as this program's principal, the RefusalWatch of its error callback)."""
    from confluent_kafka.admin import AdminClient

    watch = RefusalWatch(from_env())
    return AdminClient(kafka_config({"bootstrap.servers": bootstrap, "log_level": 2}, error_cb=watch)), watch


def _wait_metadata(admin, timeout_s: float, watch: RefusalWatch | None = None) -> dict:
    """Topic metadata once the cluster answers (a pod may start before its broker); KafkaRefused
    as soon as Kafka refuses the login (waiting cannot fix that)."""
    from confluent_kafka import KafkaException

    try:
        return metadata(admin, watch or RefusalWatch(from_env()), timeout_s).topics
    except KafkaException as exc:
        raise RuntimeError(f"Kafka did not answer within {timeout_s:.0f} s: {exc}") from exc


def ensure(bootstrap: str, wanted: dict[str, int], replication: int, timeout_s: float, say=print) -> dict[str, int]:
    """Create missing topics and grow short ones; return {topic: partitions} as the cluster has them."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewPartitions, NewTopic

    admin, watch = admin_client(bootstrap)
    topics = _wait_metadata(admin, timeout_s, watch)
    # topic configs of the registry (segscope.paths: cleanup.policy=compact) are set at creation
    create = [
        NewTopic(n, num_partitions=p, replication_factor=replication, config=TOPIC_CONFIG.get(n) or {})
        for n, p in wanted.items()
        if n not in topics
    ]
    grow = [NewPartitions(n, p) for n, p in wanted.items() if n in topics and len(topics[n].partitions) < p]
    benign = {KafkaError.TOPIC_ALREADY_EXISTS, KafkaError.INVALID_PARTITIONS}  # another pod won the race
    deadline = time.monotonic() + timeout_s
    for futures in (admin.create_topics(create) if create else {}, admin.create_partitions(grow) if grow else {}):
        for name, future in futures.items():
            try:
                future.result(timeout=max(1.0, deadline - time.monotonic()))
                say(f"segscope-topics: {name}: {'created' if name in {t.topic for t in create} else 'grown'}")
            except concurrent.futures.TimeoutError as exc:
                raise RuntimeError(f"{name}: Kafka did not create it within {timeout_s:.0f} s") from exc
            except KafkaException as exc:
                if exc.args[0].code() not in benign:
                    refused = watch.note(exc.args[0].code(), exc.args[0].str(), name)
                    raise (KafkaRefused(refused) if refused else RuntimeError(f"{name}: {exc.args[0].str()}")) from exc
    # a broker that has just started answers metadata from a cache the controller updates a moment
    # after it acknowledged the creation: read until the topics show (or the time is up)
    while True:
        have = current(admin, wanted, max(1.0, deadline - time.monotonic()), watch)
        if all(have[n] >= p for n, p in wanted.items()) or time.monotonic() >= deadline:
            return have
        time.sleep(0.2)


def current(admin, wanted: dict[str, int], timeout_s: float, watch: RefusalWatch | None = None) -> dict[str, int]:
    topics = _wait_metadata(admin, timeout_s, watch)
    return {n: len(topics[n].partitions) if n in topics else 0 for n in wanted}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="segscope-topics", description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", action="version", version=VERSION_LINE)
    ap.add_argument("--bootstrap", required=True, help="Kafka bootstrap HOST:PORT")
    ap.add_argument("--partitions", action="append", default=[], metavar="TOPIC=N", help="partitions of one topic")
    ap.add_argument("--replication", type=int, default=1, help="replication factor of created topics (default 1)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the cluster (default 120)")
    ap.add_argument("--check", action="store_true", help="only report; exit 1 when a topic is missing or short")
    args = ap.parse_args(argv)
    try:
        wanted = parse_partitions(args.partitions)
    except ValueError as exc:
        ap.error(str(exc))
    try:
        from_env()  # a Kafka setting that cannot be used: named, exit 2
    except KafkaConfigError as exc:
        ap.error(str(exc))
    try:
        if args.check:
            admin, watch = admin_client(args.bootstrap)
            have = current(admin, wanted, args.timeout, watch)
        else:
            have = ensure(args.bootstrap, wanted, args.replication, args.timeout)
    except (RuntimeError, KafkaRefused) as exc:
        print(f"segscope-topics: ERROR: {exc}", file=sys.stderr)
        return 1
    short = {n: (have[n], p) for n, p in wanted.items() if have[n] < p}
    for name, parts in have.items():
        print(f"{name:28s} {parts:3d} partitions (wanted {wanted[name]})")
    if short:
        print(f"segscope-topics: missing or short: {', '.join(short)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
