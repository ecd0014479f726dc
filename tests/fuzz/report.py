"""Lines the fuzz tests want shown after the run (frame/example counts, per-outcome histograms).

conftest.py prints them in pytest's terminal summary, so they appear without -s. (A module of its
own: pytest imports conftest.py under another name than `tests.fuzz.conftest`.)
"""

SUMMARY: list[str] = []
