"""Mergeable delay distributions: the bucket scheme of the `stamp_delay_histogram` measurement.

A per-second p99 cannot be averaged into an hourly p99; bucket counts can be summed. The buckets
are OpenTelemetry's exponential histogram buckets at scale 4 over delays in nanoseconds: bucket
i holds delays d with 2^(i/16) < d <= 2^((i+1)/16) ns, so each bucket is 4.4 % wide and a
quantile read back at a bucket's geometric middle is within 2.2 % of the true value (relative,
on top of the rank error of any histogram: at most one bucket). Delays <= 1 ns, including the
negative ones a clock disagreement gives, share the field `low`; delays above 2^35 ns (34 s)
share `high`. Field names are `b<i>` (b0 .. b559), the same in the raw data and in every rollup
(the continuous queries sum field by field), so one query reads any retention policy.

Wire form (schemas/metrics.md): one line per node, session, second and direction, sparse (only
buckets that hold a delay are written), integer fields:
    stamp_delay_histogram,node=A,ssid=1,path=fc00:2::e,direction=forward b330=12i,b331=80i,b332=8i 1795306905000000000
"""

from __future__ import annotations

import math

import numpy as np

SCALE = 4
PER_OCTAVE = 1 << SCALE  # 16 buckets per doubling
MAX_INDEX = 35 * PER_OCTAVE - 1  # b559: up to 2^35 ns
LOW = "low"
HIGH = "high"
MEASUREMENT = "stamp_delay_histogram"


def field_names() -> list[str]:
    """Every field a stamp_delay_histogram point can have, in bucket order."""
    return [LOW] + [f"b{i}" for i in range(MAX_INDEX + 1)] + [HIGH]


def bucket_bounds_ns(i: int) -> tuple[float, float]:
    """(lower, upper] of bucket b<i> in ns."""
    return 2.0 ** (i / PER_OCTAVE), 2.0 ** ((i + 1) / PER_OCTAVE)


def bucket_indexes(delays_ns: np.ndarray) -> np.ndarray:
    """Bucket index per delay: -1 for `low` (<= 1 ns), MAX_INDEX + 1 for `high`, else i.
    ceil(log2(d) * 16) - 1, corrected by one where floating point rounding put an exact power
    on the wrong side (upper bounds are inclusive)."""
    d = np.asarray(delays_ns, dtype=np.float64)
    out = np.full(d.shape, -1, dtype=np.int64)
    pos = d > 1.0
    if pos.any():
        v = d[pos]
        i = np.ceil(np.log2(v) * PER_OCTAVE).astype(np.int64) - 1
        # exact checks against the bounds the docstring promises
        i = np.where(v > np.exp2((i + 1) / PER_OCTAVE), i + 1, i)
        i = np.where(v <= np.exp2(i / PER_OCTAVE), i - 1, i)
        out[pos] = np.minimum(i, MAX_INDEX + 1)
    return out


def counts(delays_ns: np.ndarray) -> dict[str, int]:
    """The sparse fields of one point: {field name: delays in that bucket}, buckets in order."""
    idx = bucket_indexes(delays_ns)
    if idx.size == 0:
        return {}
    values, n = np.unique(idx, return_counts=True)
    out = {}
    for i, c in zip(values.tolist(), n.tolist()):
        out[LOW if i < 0 else HIGH if i > MAX_INDEX else f"b{i}"] = c
    return out


_FIELD_NAMES = field_names()  # index i + 1 -> name (low at 0, high at MAX_INDEX + 2)


def fields_text(delays_ns: np.ndarray) -> str:
    """The line-protocol field set of one point, `b330=12i,b331=80i`: counts() as text, buckets
    in order, via one bincount (the delay processor writes one per second and direction)."""
    idx = bucket_indexes(delays_ns)
    n = np.bincount(idx + 1)
    nz = np.flatnonzero(n)
    return ",".join(f"{_FIELD_NAMES[i]}={c}i" for i, c in zip(nz.tolist(), n[nz].tolist()))


def is_bucket(name: str) -> bool:
    return name in (LOW, HIGH) or (name[:1] == "b" and name[1:].isdigit())


def _order(name: str) -> int:
    return -1 if name == LOW else MAX_INDEX + 1 if name == HIGH else int(name[1:])


def quantile_us(fields: dict[str, float], q: float) -> float | None:
    """The q-quantile (0 < q <= 1) in µs of summed bucket counts {field: count} (fields that are
    not buckets, e.g. `time`, and None values are ignored). The rank is the nearest-rank
    ceil(q * N); the value is the geometric middle of the bucket holding it (0 for `low`, the
    lower bound for `high`). None when there is no count."""
    buckets = sorted((_order(k), float(v)) for k, v in fields.items() if v and is_bucket(k))
    total = sum(c for _, c in buckets)
    if total <= 0:
        return None
    rank = max(1.0, math.ceil(q * total))
    seen = 0.0
    for i, c in buckets:
        seen += c
        if seen >= rank:
            if i < 0:
                return 0.0
            if i > MAX_INDEX:
                return 2.0 ** (35) / 1000.0
            lo, hi = bucket_bounds_ns(i)
            return math.sqrt(lo * hi) / 1000.0
    return None  # unreachable: seen == total >= rank


def merge(points: list[dict[str, float]]) -> dict[str, float]:
    """Sum bucket counts of several points (seconds, sessions, workers) into one distribution."""
    out: dict[str, float] = {}
    for p in points:
        for k, v in p.items():
            if v and is_bucket(k):
                out[k] = out.get(k, 0.0) + float(v)
    return out


# Vectors: delay (ns) -> field. 1000 ns = 2^9.97: ceil(159.45) - 1 = 159; 2^10 ns exactly is the
# inclusive upper bound of b159; one ns more is b160.
VECTORS = [(-5, LOW), (0, LOW), (1, LOW), (2, "b15"), (3, "b25"), (1000, "b159"), (1024, "b159"), (1025, "b160"),
           (2_000_000, "b334"), (2**35, "b559"), (2**35 + 1, HIGH)]  # fmt: skip
