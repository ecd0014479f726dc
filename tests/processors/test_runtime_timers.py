"""processors/runtime/timers.py every(): a processor's periodic coroutine on one asyncio.sleep per
tick, with app.timer's rules: first run one interval after start, a full interval of sleep after
each run (no catch-up burst after a long run), no run once the app is stopping, an exception
leaves the task (the app's task runner crashes the app). A real (not started) Faust app: its
app.task list holds the timer task, run here in an event loop."""

from __future__ import annotations

import asyncio
import time

import faust
import pytest

from processors.runtime.timers import every


def new_app() -> faust.App:
    # never started: no broker is contacted; app.task only records the task
    return faust.App("test-runtime-timers", broker="kafka://127.0.0.1:9", store="memory://", web_enabled=False)


def test_runs_every_interval_after_each_run_and_stops_with_the_app():
    app = new_app()
    starts: list[float] = []

    @every(app, 0.1)
    async def tick() -> None:
        starts.append(time.monotonic())
        if len(starts) == 2:
            await asyncio.sleep(0.25)  # a run longer than the interval: no catch-up run after it

    assert len(app._app_tasks) == 1

    async def run() -> float:
        t0 = time.monotonic()
        task = asyncio.ensure_future(app._app_tasks[0]())
        while len(starts) < 4:
            await asyncio.sleep(0.01)
        app._stopped.set()  # the app stops: the task runs tick no more and returns
        await asyncio.wait_for(task, 1.0)
        return t0

    t0 = asyncio.run(run())
    assert len(starts) == 4
    assert starts[0] - t0 >= 0.1  # the first run one interval after the start, as app.timer
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert gaps[0] >= 0.1
    assert gaps[1] >= 0.25 + 0.1  # the long run, then a full interval
    assert gaps[2] >= 0.1


def test_no_run_when_the_app_stops_during_the_sleep():
    app = new_app()
    runs = []

    @every(app, 0.2)
    async def tick() -> None:
        runs.append(1)

    async def run() -> None:
        task = asyncio.ensure_future(app._app_tasks[0]())
        await asyncio.sleep(0.05)
        app._stopped.set()
        await asyncio.wait_for(task, 1.0)

    asyncio.run(run())
    assert runs == []


def test_an_exception_leaves_the_task():
    app = new_app()

    @every(app, 0.01)
    async def tick() -> None:
        raise RuntimeError("flush failed")

    with pytest.raises(RuntimeError, match="flush failed"):
        asyncio.run(app._app_tasks[0]())


def test_the_decorated_function_is_returned_unchanged():
    app = new_app()

    async def flush() -> None:
        pass

    assert every(app, 1.0)(flush) is flush


@pytest.mark.parametrize("interval", [0, -1.0])
def test_bad_interval_rejected(interval):
    with pytest.raises(ValueError, match="interval"):
        every(new_app(), interval)
