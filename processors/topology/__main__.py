"""python -m processors.topology: run the topology processor's Faust worker with the right options.

Flags override the environment variables of processors.topology.config.py; the worker always
runs without Faust's web server (it would bind 0.0.0.0:6066).
"""
from __future__ import annotations

import argparse
import os
import sys

from processors.topology.config import ENV


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m processors.topology", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, (var, default) in ENV.items():
        ap.add_argument("--" + name.replace("_", "-"), dest=name, default=None,
                        help=f"(env {var}, default {os.environ.get(var, default)})")
    ap.add_argument("-l", "--loglevel", default="info", choices=["crit", "error", "warn", "info", "debug"])
    args = ap.parse_args(argv)
    for name, (var, _) in ENV.items():
        value = getattr(args, name)
        if value is not None:
            os.environ[var] = value
    from processors.topology.app import app  # after the environment is final
    sys.argv = [sys.argv[0], "worker", "--without-web", "-l", args.loglevel]
    app.main()


if __name__ == "__main__":
    main()
