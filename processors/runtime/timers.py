"""every(): a processor's periodic coroutine on one asyncio.sleep per tick, in place of Faust's
app.timer for timers that tick often.

Why: a Faust timer (mode's Timer over Service.sleep) sleeps through
asyncio.wait_for(stopped.wait(), timeout): every tick makes a task for the event wait, a timeout
handle and a waiter, and cancels and awaits the task again, several turns of the event loop.
Measured on the 2-core test machine: ~140 µs of CPU per tick against ~60 µs for an asyncio.sleep;
the loss worker's own timers tick 18 times a second (clock reading every 0.1 s, flush and ack
every 0.25 s), CPU a waiting worker burns and a busy one pays besides its work (docs/benchmarks.md,
"Fresh flows: idle timers, runs, paths in one call").

Kept from app.timer: the first run one interval after the app's tasks start, a full interval of
sleep after each run (a long run is never followed by a burst of catch-up runs; mode's Timer only
corrects its sleeps' own lateness, a few ms, left out here), no run once the app is stopping, and
the app's handling of a task's exception (started with app.task: mode's _execute_task crashes the
app).
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable


def every(app, interval_s: float) -> Callable[[Callable[[], Awaitable[None]]], Callable[[], Awaitable[None]]]:
    """Decorator: run `await fun()` every interval_s seconds while the app runs (app.timer's rules,
    above); returns fun unchanged (a test or a stop path may still call it directly)."""
    if interval_s <= 0:
        raise ValueError(f"every(): the interval must be above 0 s (got {interval_s!r})")

    def register(fun: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        async def ticks() -> None:
            while True:
                await asyncio.sleep(interval_s)
                if app.should_stop:
                    return
                await fun()

        ticks.__name__ = ticks.__qualname__ = f"every_{fun.__name__}"
        app.task(ticks)
        return fun

    return register
