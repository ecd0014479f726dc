"""How much work a fuzz campaign does: the full count in `make test` (CI), a fifth of it in
`make test-quick` (the runner sets SEGSCOPE_TEST_QUICK=1), which promises the quick tests in under
three minutes. A quick campaign keeps the same seeds, oracles and assertions (their thresholds
scale with the count); the full run still does every frame. An explicit environment variable
(SEGSCOPE_FUZZ_FRAMES, ...) wins over both.

    FRAMES = fuzz_count("SEGSCOPE_FUZZ_FRAMES", 100_000)   # 100 000, or 20 000 in quick mode
"""

from __future__ import annotations

import os

QUICK_SHARE = 5  # a quick campaign is 1/QUICK_SHARE of the full one


def quick() -> bool:
    return bool(os.environ.get("SEGSCOPE_TEST_QUICK"))


def fuzz_count(env_name: str, full: int) -> int:
    """The campaign's count: $env_name if set, else `full` (or full / QUICK_SHARE in quick mode)."""
    given = os.environ.get(env_name)
    if given:
        return int(given)
    return full // QUICK_SHARE if quick() else full
