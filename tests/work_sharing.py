"""Work sharing between the test command's parallel groups (a pytest plugin, `-p tests.work_sharing`).

The runner (scripts/test_groups.py) splits the suite into units (a module, or the modules
[together] ties) and gives each group its share, balanced by the durations recorded in
tests/durations.json. A recorded duration is one run's: on a loaded runner a group's share took
696 s and another's 829 s, and the whole phase waits for the slowest. So every group collects
every unit, runs its own share in its order, and then takes units another group has not started
yet: the smallest unit of the share with the most recorded seconds left. No group idles while
another still has units it has not started.

A unit is run by the group that claims it first: a file of the claims directory made with O_EXCL,
which holds the group's name. A group claims its next unit just before the last test of the
current one, so that pytest's `nextitem` (which decides what module fixtures to tear down) is
always the test that really runs next.

The plan file (SEGSCOPE_TEST_UNITS) is JSON: {"units": {unit: [module, ...]}, "order": {group:
[unit, ...]}, "seconds": {unit: s}, "claims": dir}. What each group ran is written to
<group dir>/units.json (its own units and those it took).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

PLAN_VAR = "SEGSCOPE_TEST_UNITS"


def claim_file(claims: Path, unit: str) -> Path:
    return claims / re.sub(r"[^A-Za-z0-9_.-]", "_", unit)


def claim(claims: Path, unit: str, group: str) -> bool:
    """True when this group now owns `unit` (no other group claimed it before)."""
    try:
        fd = os.open(claim_file(claims, unit), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(group)
    return True


def claimed(claims: Path, unit: str) -> bool:
    return claim_file(claims, unit).exists()


def next_unit(plan: dict, group: str, claims: Path) -> tuple[str, bool] | None:
    """(unit, taken from another group) this group runs next, claimed; None when none is left.
    Its own units first, in its order; then the smallest unclaimed unit of the group with the most
    recorded seconds not yet claimed."""
    for unit in plan["order"].get(group, []):
        if not claimed(claims, unit) and claim(claims, unit, group):
            return unit, False
    while True:
        left = {
            other: [u for u in units if not claimed(claims, u)]
            for other, units in plan["order"].items()
            if other != group
        }
        left = {g: us for g, us in left.items() if us}
        if not left:
            return None
        seconds = plan["seconds"]
        richest = max(sorted(left), key=lambda g: sum(seconds.get(u, 0.0) for u in left[g]))
        # its smallest unit: the owner may be about to start the others, and a small one overshoots least
        unit = min(reversed(left[richest]), key=lambda u: seconds.get(u, 0.0))
        if claim(claims, unit, group):
            return unit, True


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session):
    plan_file = os.environ.get(PLAN_VAR)
    if not plan_file:
        return None  # pytest's own loop
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        raise session.Interrupted(f"{session.testsfailed} error(s) during collection")
    if session.config.option.collectonly:
        return True
    plan = json.loads(Path(plan_file).read_text())
    group = os.environ.get("SEGSCOPE_TEST_GROUP", "g?")
    claims = Path(plan["claims"])
    # the plan's modules are paths from the runner's working directory, ours too
    unit_of = {os.path.realpath(m): u for u, mods in plan["units"].items() for m in mods}
    items_of: dict[str, list[pytest.Item]] = {}
    for item in session.items:  # in the collection order (conftest: packaging and deploy last)
        items_of.setdefault(unit_of.get(os.path.realpath(str(item.path)), ""), []).append(item)
    ran: dict[str, list[str]] = {"own": [], "taken": []}

    def take() -> list[pytest.Item]:
        while True:
            got = next_unit(plan, group, claims)
            if got is None:
                return []
            unit, taken = got
            ran["taken" if taken else "own"].append(unit)
            if items_of.get(unit):
                return items_of[unit]  # a unit with no test left after -k / deselection: the next

    current = take()
    try:
        while current:
            following: list[pytest.Item] = []
            for i, item in enumerate(current):
                if i == len(current) - 1:
                    following = take()
                nextitem = current[i + 1] if i + 1 < len(current) else (following[0] if following else None)
                item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
                if session.shouldfail:
                    raise session.Failed(session.shouldfail)
                if session.shouldstop:
                    raise session.Interrupted(session.shouldstop)
            current = following
    finally:
        group_dir = os.environ.get("SEGSCOPE_TEST_GROUP_DIR")
        if group_dir:
            Path(group_dir).mkdir(parents=True, exist_ok=True)
            (Path(group_dir) / "units.json").write_text(json.dumps(ran, indent=1) + "\n")
    return True
