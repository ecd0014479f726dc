"""CLI: python -m netlab up|down|status|exec|delay|loss|reorder|stats|check ..."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

from .lab import Lab, LabError, status
from .topology import TopologyError, load


def _parse_delay(text: str) -> tuple[str, tuple[float, float]]:
    try:
        link, values = text.split("=", 1)
        a_to_b, b_to_a = (float(v) for v in values.split(","))
        return link, (a_to_b, b_to_a)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write LINK=A_TO_B_US,B_TO_A_US, e.g. ar=2000,1000") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m netlab", description=__doc__)
    parser.add_argument("--version", action="version", version=f"segscope {segscope_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("up", help="create the lab described by TOPOLOGY")
    p.add_argument("topology")
    p.add_argument("--prefix", required=True)
    p.add_argument(
        "--delay",
        action="append",
        type=_parse_delay,
        default=[],
        help="LINK=A_TO_B_US,B_TO_A_US (puts a delay relay on that link)",
    )
    p.add_argument("--no-ioam", action="store_true", help="leave the topology's `ioam:` settings unapplied")
    p.add_argument(
        "--agents",
        nargs="?",
        const="auto",
        metavar="NODE,...",
        help="also start Kafka/InfluxDB/Telegraf, an agent per SRv6 node (or per NODE listed) with a fresh "
        "lab PKI and the processors; writes .run/netlab/PREFIX/env.sh for the intent file (netlab/withagents.py)",
    )
    p.add_argument(
        "--port-base",
        type=int,
        help="with --agents: a stack of its own on ports N..N+3 (default: the default stack, reused if it runs)",
    )
    p = sub.add_parser(
        "down", help="remove every namespace, relay and pin of PREFIX (state file optional), and what --agents started"
    )
    p.add_argument("--prefix", required=True)
    p = sub.add_parser("status", help="namespaces and relays of PREFIX, as JSON")
    p.add_argument("--prefix", required=True)
    p = sub.add_parser("exec", help="run a command in NODE: exec --prefix P NODE -- cmd ...")
    p.add_argument("--prefix", required=True)
    p.add_argument("node")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    p = sub.add_parser("delay", help="change a running relay: delay --prefix P LINK A_TO_B_US B_TO_A_US")
    p.add_argument("--prefix", required=True)
    p.add_argument("link")
    p.add_argument("a_to_b_us", type=float)
    p.add_argument("b_to_a_us", type=float)
    p = sub.add_parser("loss", help="change a relay's injected loss: loss --prefix P LINK A_TO_B_PCT B_TO_A_PCT")
    p.add_argument("--prefix", required=True)
    p.add_argument("link")
    p.add_argument("a_to_b_pct", type=float)
    p.add_argument("b_to_a_pct", type=float)
    p = sub.add_parser(
        "reorder",
        help="make a relay reorder: reorder --prefix P LINK A_TO_B B_TO_A, each off, every:K:HOLD_US "
        "(hold the K-th, 2K-th, ... frame of each flow HOLD_US longer) or random:PCT:HOLD_US",
    )
    p.add_argument("--prefix", required=True)
    p.add_argument("link")
    p.add_argument("a_to_b")
    p.add_argument("b_to_a")
    p = sub.add_parser("stats", help="a relay's counters as JSON: stats --prefix P LINK")
    p.add_argument("--prefix", required=True)
    p.add_argument("link")
    p = sub.add_parser("check", help="validate a topology file only")
    p.add_argument("topology")
    args = parser.parse_args(argv)

    try:
        if args.command == "up" and args.agents:
            from .withagents import env_file, up

            env = up(args.topology, args.prefix, agents=args.agents, delay_us=dict(args.delay),
                     ioam=not args.no_ioam, port_base=args.port_base)  # fmt: skip
            print("".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()), end="")
            print(f"# written to {env_file(args.prefix)}: source it, then `segscope-controller apply INTENT`")
        elif args.command == "up":
            if args.port_base is not None:
                parser.error("--port-base goes with --agents")
            lab = Lab.up(args.topology, args.prefix, delay_us=dict(args.delay), ioam=not args.no_ioam)
            print(json.dumps(status(args.prefix), indent=2))
            del lab  # relays keep running; `down` stops them by PID file
        elif args.command == "down":
            from .withagents import down

            print(json.dumps(down(args.prefix), indent=2))
        elif args.command == "status":
            print(json.dumps(status(args.prefix), indent=2))
        elif args.command == "exec":
            cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
            if not cmd:
                parser.error("exec needs a command after --")
            ns = f"{args.prefix}-{args.node}"
            os.execvp("ip", ["ip", "netns", "exec", ns] + cmd)
        elif args.command in ("delay", "loss", "reorder", "stats"):
            lab = Lab.attach(args.prefix)
            if args.command == "delay":
                reply = lab.set_delay(args.link, args.a_to_b_us, args.b_to_a_us)
            elif args.command == "loss":
                if not (0 <= args.a_to_b_pct <= 100 and 0 <= args.b_to_a_pct <= 100):
                    parser.error("loss: percentages must be in [0, 100]")
                reply = lab.set_loss(args.link, args.a_to_b_pct, args.b_to_a_pct)
            elif args.command == "reorder":
                reply = lab.set_reorder(args.link, args.a_to_b, args.b_to_a)
            else:
                reply = lab.relay_stats(args.link)
            print(json.dumps(reply, indent=2))
        elif args.command == "check":
            topo = load(args.topology)
            print(f"{args.topology}: ok ({len(topo.nodes)} nodes, {len(topo.links)} links)")
    except TopologyError as exc:
        print(exc, file=sys.stderr)
        return 2
    except LabError as exc:
        print(f"netlab: {exc}", file=sys.stderr)
        return 1
    return 0


def segscope_version() -> str:
    from segscope_schemas.version import __version__

    return __version__


if __name__ == "__main__":
    sys.exit(main())
