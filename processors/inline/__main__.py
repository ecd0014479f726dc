"""python -m processors.inline: run the in-line processor's Faust worker with the right options.

Flags override the environment variables of processors/inline/config.py; the worker always
runs without Faust's web server (it would bind 0.0.0.0:6066).
"""

from __future__ import annotations

from processors.inline.config import ENV, InlineConfig
from processors.runtime.config import run_worker


def main(argv: list[str] | None = None) -> None:
    run_worker("processors.inline", __doc__, ENV, InlineConfig.from_env, argv)


if __name__ == "__main__":
    main()
