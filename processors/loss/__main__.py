"""python -m processors.loss: run the loss processor's Faust worker with the right options.

Flags override the environment variables of processors/loss/config.py; the worker always
runs without Faust's web server (it would bind 0.0.0.0:6066).
"""

from __future__ import annotations

from processors.loss.config import ENV, LossConfig
from processors.runtime.config import run_worker


def main(argv: list[str] | None = None) -> None:
    run_worker("processors.loss", __doc__, ENV, LossConfig.from_env, argv)


if __name__ == "__main__":
    main()
