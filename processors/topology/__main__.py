"""python -m processors.topology: run the topology processor's Faust worker with the right options.

Flags override the environment variables of processors.topology.config.py; the worker always
runs without Faust's web server (it would bind 0.0.0.0:6066).
"""

from __future__ import annotations

from processors.runtime.config import run_worker
from processors.topology.config import ENV, TopologyConfig


def main(argv: list[str] | None = None) -> None:
    run_worker("processors.topology", __doc__, ENV, TopologyConfig.from_env, argv)


if __name__ == "__main__":
    main()
