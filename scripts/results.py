"""Demo helper: read what the pipeline wrote to InfluxDB back, for the demo table and the e2e assertions.

Points of `stamp_delay` are per session, direction and second (schemas/metrics.md); this
module folds them into one summary per direction. The overall mean is the count-weighted
mean of the per-second means (exact); min/max are exact; p50/p99 over the whole run are
not derivable from per-second percentiles, so the summary reports the median of the
per-second p50s and the largest per-second p99 and says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class StampSessionSpec:
    """One STAMP session the demo runs (and the e2e test reads back): who sends, over which SID lists."""

    ssid: int = 1
    sender_node: str = "A"
    segs: list[str] = field(default_factory=lambda: ["fc00:2::e"])  # forward SID list
    return_segs: list[str] = field(default_factory=lambda: ["fc00:2::e"])  # return SID list
    rate_pps: int = 100


DIRECTIONS = ("forward", "reverse", "round_trip")


def delay_points(stack, spec, since_ns: int, settled: bool = False) -> list[dict]:
    """The session's stamp_delay points; settled: only points written completely (InfluxDB 1.x can
    return a point a writer is still adding fields to with some of them null)."""
    q = (
        f"SELECT * FROM \"stamp_delay\" WHERE \"ssid\" = '{spec.ssid}' AND \"node\" = '{spec.sender_node}' "
        f"AND time >= {since_ns - 2_000_000_000}"
    )
    return stack.influx_query_settled(q, settle_s=0.5) if settled else stack.influx_query(q)


def records_in_influx(stack, spec, since_ns: int, direction: str = "forward") -> int:
    """Records the session's points of one direction account for (a point still mid-write without
    its count yet adds nothing: a poll asks again)."""
    points = delay_points(stack, spec, since_ns)
    return sum(int(p["count"]) for p in points if p["direction"] == direction and p.get("count") is not None)


def wait_for_points(stack, spec, since_ns: int, expect_records: int, timeout_s: float = 60) -> int:
    """Wait until the forward points in InfluxDB account for expect_records records (or time out)."""
    deadline = time.monotonic() + timeout_s
    got = -1
    while time.monotonic() < deadline:
        got = records_in_influx(stack, spec, since_ns)
        if got >= expect_records:
            break
        time.sleep(1)
    return got


def read_delay_summary(stack, spec, since_ns: int) -> dict[str, dict]:
    out: dict[str, dict] = {}
    pts = delay_points(stack, spec, since_ns, settled=True)
    for d in DIRECTIONS:
        ps = [p for p in pts if p["direction"] == d]
        if not ps:
            continue
        n = sum(int(p["count"]) for p in ps)
        p50s = sorted(float(p["p50_us"]) for p in ps)
        out[d] = {
            "count": n,
            "seconds": len(ps),
            "mean_us": sum(float(p["mean_us"]) * int(p["count"]) for p in ps) / n,
            "min_us": min(float(p["min_us"]) for p in ps),
            "max_us": max(float(p["max_us"]) for p in ps),
            "p50_us": p50s[len(p50s) // 2],
            "p99_us": max(float(p["p99_us"]) for p in ps),
            "ipdv_mean_us": sum(float(p.get("ipdv_mean_us") or 0) * int(p["count"]) for p in ps) / n,
        }
    return out
