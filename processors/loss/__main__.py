"""python -m processors.loss: run the loss processor's Faust worker with the right options.

Flags override the environment variables of processors/loss/config.py; the worker always
runs without Faust's web server (it would bind 0.0.0.0:6066).
"""
from __future__ import annotations

import argparse
import os
import sys

from processors.loss.config import ENV, ConfigError, LossConfig


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m processors.loss", description=__doc__,
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
    try:
        LossConfig.from_env()          # refuse bad settings before Faust starts
    except ConfigError as e:
        ap.error(str(e))
    from processors.loss.app import app  # after the environment is final
    sys.argv = [sys.argv[0], "worker", "--without-web", "-l", args.loglevel]
    app.main()


if __name__ == "__main__":
    main()
