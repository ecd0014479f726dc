"""A stop with a deadline: the worker class every processor runs (Faust's `Worker` setting).

On SIGTERM or SIGINT Faust stops its services in order: the final flush of what is open, the last
commit, the producer's flush. Each of them waits for Kafka. When Kafka is gone first, as in a
`helm uninstall` that deletes the broker's pod together with the processors', or a broker that
died, that stop never finishes: the worker sat there until Kubernetes' SIGKILL 30 s later.

Stopping later gains nothing: what the worker could not commit is replayed by the next owner of
its partitions (acks.py, commits.py), exactly as after a kill -9. So the stop gets a deadline,
SEGSCOPE_STOP_TIMEOUT_S (default 10 s, under Kubernetes' 30 s grace period; 0: none). Past it the
worker says what it was waiting for and exits with EXIT_STOP_DEADLINE.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

import faust

log = logging.getLogger(__name__)

STOP_TIMEOUT_VAR = "SEGSCOPE_STOP_TIMEOUT_S"
STOP_TIMEOUT_DEFAULT_S = "10"
EXIT_STOP_DEADLINE = 3  # the stop did not finish in time (processors/README.md: a worker's exit codes)

_armed: threading.Timer | None = None


def stop_timeout_s(environ: dict[str, str] | None = None) -> float:
    env = os.environ if environ is None else environ
    return float(env.get(STOP_TIMEOUT_VAR, STOP_TIMEOUT_DEFAULT_S))


def _expire(seconds: float, why: str) -> None:
    log.error(
        "stop not finished %.0f s after %s (waiting for Kafka?): exiting now; what was not committed "
        "is replayed by the next owner of the partitions",
        seconds,
        why,
    )
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(EXIT_STOP_DEADLINE)


def arm(seconds: float, why: str) -> None:
    """Exit the process `seconds` from now unless it ended before; once (a second signal keeps the
    first deadline)."""
    global _armed
    if _armed is None and seconds > 0:
        _armed = threading.Timer(seconds, _expire, args=(seconds, why))
        _armed.daemon = True  # a stop that finishes ends the process; the timer never holds it
        _armed.start()


class Worker(faust.Worker):
    """faust.Worker whose stop on a signal has the deadline above."""

    def _schedule_shutdown(self, signal) -> None:  # both SIGTERM and SIGINT come here (mode.Worker)
        arm(stop_timeout_s(), getattr(signal, "name", str(signal)))
        super()._schedule_shutdown(signal)
