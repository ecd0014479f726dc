"""python -m processors.delay: run the delay processor's Faust worker with the right options.

Flags override the environment variables of processors/delay/config.py; the worker always
runs without Faust's web server (it would bind 0.0.0.0:6066).
"""

from __future__ import annotations

from processors.delay.config import ENV, DelayConfig
from processors.runtime.config import run_worker


def main(argv: list[str] | None = None) -> None:
    run_worker("processors.delay", __doc__, ENV, DelayConfig.from_env, argv)


if __name__ == "__main__":
    main()
