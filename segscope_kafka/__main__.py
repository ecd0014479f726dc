"""segscope-kafka: check a program's Kafka security settings, render Telegraf's config, print the ACLs.

segscope-kafka check [--bootstrap HOST:PORT] [--prefix SEGSCOPE_KAFKA_]
    the settings in this environment (never a secret); with --bootstrap, log in once.
    Exit 0 ok, 1 refused or unreachable, 2 a setting is unusable (the message names it).
segscope-kafka telegraf-config --template telegraf.conf --out /run/telegraf/telegraf.conf
    Telegraf's config with the kafka_consumer security options (file mode 0600).
segscope-kafka acls [--principal agent=User:agent ...] [--bootstrap BROKER:9093]
    the kafka-acls commands that grant each role what its programs do.
"""

from __future__ import annotations

import argparse
import sys

from segscope_kafka.settings import ENV_PREFIX, SETTINGS, KafkaConfigError, from_env


def main(argv: list[str] | None = None) -> int:
    from segscope_schemas.version import VERSION_LINE

    ap = argparse.ArgumentParser(
        prog="segscope-kafka",
        description=__doc__.split("\n\n")[0],
        epilog="settings: " + "; ".join(f"{ENV_PREFIX}{k}: {v}" for k, v in SETTINGS.items()),
    )
    ap.add_argument("--version", action="version", version=VERSION_LINE)
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="check the settings (and, with --bootstrap, the login)")
    c.add_argument("--bootstrap", help="Kafka bootstrap HOST:PORT to log in to once")
    c.add_argument("--prefix", default=ENV_PREFIX, help=f"variable prefix (default {ENV_PREFIX})")
    c.add_argument("--timeout", type=float, default=15.0, help="seconds to wait for Kafka (default 15)")
    t = sub.add_parser("telegraf-config", help="render Telegraf's config with the Kafka security options")
    t.add_argument("--template", required=True, help="services/telegraf/telegraf.conf (or the chart's copy)")
    t.add_argument("--out", required=True, help="where to write it (mode 0600)")
    a = sub.add_parser("acls", help="print the kafka-acls commands of every role")
    a.add_argument("--principal", action="append", default=[], metavar="ROLE=User:NAME")
    a.add_argument("--bootstrap", default="BROKER:9093")
    args = ap.parse_args(argv)

    if args.command == "acls":
        from segscope_kafka.acls import ROLES, kafka_acls_commands

        principals = {r: f"User:segscope-{r}" for r in ROLES if r != "admin"}
        for item in args.principal:
            role, sep, principal = item.partition("=")
            if not sep or role not in principals:
                ap.error(f"--principal {item!r}: expected ROLE=User:NAME with ROLE one of {', '.join(principals)}")
            principals[role] = principal
        print("\n".join(kafka_acls_commands(principals, args.bootstrap)))
        return 0
    try:
        sec = from_env(prefix=getattr(args, "prefix", ENV_PREFIX))
        if args.command == "telegraf-config":
            from segscope_kafka.telegraf import write_config

            out = write_config(args.template, args.out, sec)
            print(f"segscope-kafka: {out}: Kafka {sec.describe()}", file=sys.stderr)
            return 0
    except KafkaConfigError as e:
        print(f"segscope-kafka: {e}", file=sys.stderr)
        return 2
    print(f"segscope-kafka: settings ok: {sec.describe()}")
    if not args.bootstrap:
        return 0
    from segscope_kafka.refusal import KafkaRefused, login_check

    try:
        if not login_check(args.bootstrap, sec, args.timeout):
            print(f"segscope-kafka: {args.bootstrap} did not answer within {args.timeout:g} s", file=sys.stderr)
            return 1
    except KafkaRefused as e:
        print(f"segscope-kafka: {e}", file=sys.stderr)
        return 1
    print(f"segscope-kafka: logged in to {args.bootstrap}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
