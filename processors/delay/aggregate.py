"""Per-second STAMP delay aggregation: the pure, Kafka-free core of the delay processor.

Input: the records of one decoded stamp_batch (numpy array of STAMP_RECORD_DTYPE,
from segscope_schemas.stamp_record.decode_batch) plus the node name of the batch.
Output: InfluxDB line-protocol lines `stamp_delay,node=..,ssid=..,path=..,direction=..` and
`stamp_delay_histogram` with the same tags (see schemas/metrics.md), one each per closed
(node, ssid, second) and direction.

Design (why it looks like this):
- ingest() is the per-Kafka-message path. It does a handful of vectorised numpy
  operations on the whole batch (delays, second index, grouping) and only appends
  array slices to per-second accumulators; no per-record Python work. Statistics
  are computed once, when a second is closed (flush()), for all the seconds one flush
  closes together: their records are merged, grouped by (second, direction), sorted and
  reduced in one pass of numpy operations (merge_seconds, direction_values,
  direction_fields), because at ~100 records per session-second numpy's per-call overhead,
  not the arithmetic, was the cost of calling it per second and direction. The numbers
  are bit for bit those of the per-second numpy calls (np.percentile, mean,
  delay_histogram.fields_text); tests/processors/test_delay_aggregate_differential.py
  checks the lines against the earlier aggregator.
- A second s (TAI seconds, s = floor(T1 / 1e9)) closes when the session's
  watermark passes (s + 1) * 1e9 + grace. The watermark is the largest T1 seen for
  the session, or the CLOCK_TAI wall clock once the session has been idle (no
  records) for `idle` (at least grace), so the last second of a session that stops is
  flushed. Two settings because they guard against different things: grace is data
  time (how far a session's records are out of T1 order: they arrive in T4 order, so
  about the largest round trip), idle is wall-clock time (it must exceed the gap between
  a slow session's records plus the input's lag, or a lagging worker closes seconds
  before their records arrive and re-emits them). A small grace makes results fresh;
  a record later than it re-opens its second (re-emitted, counted), it is not lost.
- Closed seconds stay in memory for `retention` (data time) after their end. A late
  record for such a second re-opens it, and the next flush re-emits the full,
  updated aggregate with the same measurement, tags and timestamp, so InfluxDB
  overwrites the earlier point (idempotent sink). Records older than the retention
  horizon are dropped and counted (late_records_dropped). A session idle for `retention`
  (wall clock) has all its seconds evicted, and its horizon stops after the newest second it
  had records for: records that come later for a second after it (an agent cut off from Kafka
  for longer than the retention delivers what it held) make a new, whole second.
- Duplicates (same session and sender_seq already seen in that second, e.g. after
  a streamer replay) are removed when a second is merged, keeping the first copy,
  and counted (duplicate_records).
- The watermark never runs more than `max_future` ahead of CLOCK_TAI now, so one record
  with a wild T1 cannot close and evict a session's seconds; such records are kept in
  their (far-future) second and counted (future_records).
- Negative delays (clock trouble, e.g. T2 < T1) and absurd ones (|delay| above
  `absurd_threshold`) are kept in the statistics and counted, never dropped silently.
- The `path` tag (the session's SID list) comes from `path_of(node, ssid)` (the worker's
  PathBook, processors/paths.py) when a second is first emitted and stays with that second, so
  a re-emission never lands in another series; `unknown` when path_of does not know it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Callable

import numpy as np

from segscope_schemas import delay_histogram
from segscope_schemas.batch_envelope import join_records
from segscope_schemas.stamp_record import STAMP_RECORD_F_LOOPBACK, STAMP_RECORD_F_ONE_WAY

NS_PER_S = 1_000_000_000
NS_PER_US = 1_000.0

DIRECTIONS = ("forward", "reverse", "round_trip")
MEASUREMENT = "stamp_delay"
HISTOGRAM = delay_histogram.MEASUREMENT  # stamp_delay_histogram
UNKNOWN_PATH = "unknown"


def host_tai_utc_offset_s() -> int:
    """TAI - UTC as this host's kernel knows it (set by a PTP/NTP daemon; 0 if nobody set it)."""
    return round((time.clock_gettime_ns(time.CLOCK_TAI) - time.time_ns()) / NS_PER_S)


def clock_tai_ns() -> int:
    """CLOCK_TAI now, the clock the datapath stamps T1..T4 with."""
    return time.clock_gettime_ns(time.CLOCK_TAI)


# ---------------------------------------------------------------------------
# line protocol helpers
# ---------------------------------------------------------------------------

_TAG_ESCAPES = str.maketrans({",": r"\,", "=": r"\=", " ": r"\ ", "\n": r"\ ", "\r": r"\ ", "\t": r"\ "})


def escape_tag(value: str) -> str:
    """Escape a tag key or value for line protocol (comma, equals sign, space).

    Line protocol cannot carry newlines or tabs in a tag at all; they become escaped
    spaces so one odd node name cannot split a line or drop the point. An empty tag
    value is not allowed by InfluxDB, so it becomes "unknown". A trailing backslash
    would escape the following separator, so it is doubled.
    """
    if value == "":
        return "unknown"
    escaped = value.translate(_TAG_ESCAPES)
    if escaped.endswith("\\") and not escaped.endswith("\\\\"):
        escaped += "\\"
    return escaped


def format_float(x: float) -> str:
    """Shortest exact decimal form of a float field (repr round-trips)."""
    return repr(float(x))


# ---------------------------------------------------------------------------
# counters
# ---------------------------------------------------------------------------


@dataclass
class Counters:
    """Monotonic counters of the processor, published as measurement segscope_processor."""

    records_in: int = 0  # records in well-formed batches (incl. duplicates and late ones)
    batches_in: int = 0  # well-formed stamp_batch messages
    malformed_batches: int = 0  # messages sent to the dead-letter topic
    duplicate_records: int = 0  # records removed as duplicates (same session, second, sender_seq)
    late_records_dropped: int = 0  # records older than the retention horizon of their session
    replayed_records_skipped: int = 0  # replayed after a restart, of seconds already final before it
    points_out: int = 0  # stamp_delay lines emitted (3 per closed second, re-emits included)
    negative_delays: int = 0  # delay values < 0 (one record can add up to 3, one per direction)
    absurd_delays: int = 0  # delay values with |delay| > absurd_threshold (kept, like negatives)
    seconds_reemitted: int = 0  # closed seconds emitted again because late records arrived
    processing_errors: int = 0  # well-formed batches the processor failed on (sent to dead letters)
    future_records: int = 0  # records with T1 beyond CLOCK_TAI now + max_future (kept; do not move the watermark)
    path_unknown: int = 0  # stamp_delay points emitted with path=unknown (no segscope.paths record yet)
    histogram_points_out: int = 0  # stamp_delay_histogram lines emitted (re-emits included)

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


# ---------------------------------------------------------------------------
# per-second accumulator
# ---------------------------------------------------------------------------


# A direction a record cannot measure (see mark_partial_records); never a real delay.
NOT_MEASURED = np.iinfo(np.int64).min
# Row 3 of the per-record array: the timestamp error bound of the record's one-way delays, ns
# (sender + reflector Error Estimate, RFC 8762 §4.2.1), or UNSYNCHRONIZED when either side's
# S bit is clear (its clock is not synchronized to UTC: no bound).
CLOCK_ERROR_ROW = 3
UNSYNCHRONIZED = -1
# Row 4: the record's sender_seq (int64), so that a chunk of records is one array to merge.
SEQ_ROW = 4
ROWS = 5


_CLOCK_TABLE: np.ndarray | None = None
_MAX_ERROR_NS = 86_400 * 10**9  # a day: any larger estimate is just "huge"


def _clock_table() -> np.ndarray:
    """Error in ns of every 16-bit Error Estimate (segscope_schemas.stamp_error_estimate's exact
    ee_to_error_ns, capped at a day), UNSYNCHRONIZED where the S bit is clear: built once, then
    two gathers per record instead of arithmetic per record."""
    global _CLOCK_TABLE
    if _CLOCK_TABLE is None:
        from segscope_schemas.stamp_error_estimate import ee_to_error_ns

        table = np.empty(1 << 16, dtype=np.int64)
        for ee in range(1 << 16):
            synced = ee & 0x8000
            table[ee] = min(ee_to_error_ns((ee >> 8) & 0x3F, ee & 0xFF), _MAX_ERROR_NS) if synced else UNSYNCHRONIZED
        _CLOCK_TABLE = table
    return _CLOCK_TABLE


def clock_error_ns(sender_ee: np.ndarray, reflector_ee: np.ndarray) -> np.ndarray:
    """Per record: sender + reflector error in ns (Multiplier * 2^(Scale-32) s each, RFC 8762
    §4.2.1), or UNSYNCHRONIZED when either side's clock is not synchronized."""
    table = _clock_table()
    a, b = table[sender_ee], table[reflector_ee]
    out = a + b
    out[(a == UNSYNCHRONIZED) | (b == UNSYNCHRONIZED)] = UNSYNCHRONIZED
    return out


def mark_partial_records(flags: np.ndarray, t1: np.ndarray, t4: np.ndarray, delays: np.ndarray) -> None:
    """Records of one-way and loopback sessions carry fewer timestamps (stamp_record.h):
    one-way has T1, T2 only (forward only); loopback has T1, T4 only (round trip = T4 - T1).
    The directions they cannot measure are set to NOT_MEASURED and left out of the stats."""
    one_way = (flags & STAMP_RECORD_F_ONE_WAY) != 0
    loopback = (flags & STAMP_RECORD_F_LOOPBACK) != 0
    delays[1:3, one_way] = NOT_MEASURED
    delays[:2, loopback] = NOT_MEASURED
    delays[2, loopback] = (t4 - t1)[loopback]


# np.percentile(d, [50, 99]) works with q / 100: these exact doubles.
_QUANTILES = tuple(np.true_divide([50.0, 99.0], 100).tolist())
# Below this sum of |delay| every partial sum of a direction's delays is an integer below 2^53, so
# the float64 mean (numpy sums pairwise) and the exact integer sum / count are the same double; at
# or above it (clock trouble: delays of years) the mean is computed the scalar way, as before.
_EXACT_SUM_LIMIT = 2.0**52
_HISTOGRAM_FIELDS = delay_histogram.field_names()  # bucket index + 1 -> field name (`low` at 0)
_BUCKET_FLOORS: np.ndarray | None = None


def bucket_floors() -> np.ndarray:
    """floors[k]: the smallest integer delay (ns) that delay_histogram.bucket_indexes puts in bucket
    k or above, for k = 0 .. MAX_INDEX + 1 (`high`), found by bisection on bucket_indexes itself, so
    that searchsorted(floors, d, "right") - 1 is bucket_indexes(d) for every integer d (it is
    non-decreasing in d): a binary search in 561 integers instead of a log2 and two exp2 per delay."""
    global _BUCKET_FLOORS
    if _BUCKET_FLOORS is None:
        k = np.arange(delay_histogram.MAX_INDEX + 2)
        lo = np.full(len(k), 1, dtype=np.int64)  # bucket_indexes(lo) < k (1 ns is `low`, -1)
        hi = np.full(len(k), np.iinfo(np.int64).max, dtype=np.int64)  # bucket_indexes(hi) >= k
        while np.any(hi - lo > 1):
            mid = lo + (hi - lo) // 2
            up = delay_histogram.bucket_indexes(mid) >= k
            hi = np.where(up, mid, hi)
            lo = np.where(up, lo, mid)
        _BUCKET_FLOORS = hi
    return _BUCKET_FLOORS


_PIECE_COUNTS = 64  # histogram_pieces() holds the text of counts below this
_HISTOGRAM_PIECES: list[str] | None = None


def histogram_pieces() -> list[str]:
    """`<field>=<count>i` for every histogram field and count below _PIECE_COUNTS, at field number *
    _PIECE_COUNTS + count (2 MB): a list lookup per bucket instead of formatting it."""
    global _HISTOGRAM_PIECES
    if _HISTOGRAM_PIECES is None:
        _HISTOGRAM_PIECES = [f"{name}={c}i" for name in _HISTOGRAM_FIELDS for c in range(_PIECE_COUNTS)]
    return _HISTOGRAM_PIECES


def bucket_indexes(delays_ns: np.ndarray) -> np.ndarray:
    """delay_histogram.bucket_indexes of int64 delays (-1: `low`, MAX_INDEX + 1: `high`), by table."""
    return np.searchsorted(bucket_floors(), delays_ns, "right") - 1


def direction_values(row: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The measured delays of one direction of every closed second.

    row: one delay row of the merged records, second i in columns bounds[i]:bounds[i + 1]
    (sender_seq order). Returns (values, starts, seconds): group j holds the delays of second
    seconds[j], values[starts[j]:starts[j + 1]] in sender_seq order; a second no record of which
    measures the direction has no group."""
    measured = row != NOT_MEASURED
    if measured.all():
        values = row
        counts = np.diff(bounds)
    else:
        values = row[measured]
        seen = np.zeros(len(row) + 1, dtype=np.int64)
        np.cumsum(measured, out=seen[1:])
        counts = seen[bounds[1:]] - seen[bounds[:-1]]
    seconds = np.flatnonzero(counts)
    starts = (np.cumsum(counts) - counts)[seconds]
    return values, starts, seconds


def sorted_within(values: np.ndarray, group: np.ndarray) -> np.ndarray:
    """values sorted within each group (group: non-decreasing ids 0..G-1, one per value). One sort
    of group * span + (value - smallest) when that fits in an int64 (delays within a few seconds of
    each other: always in practice), else a lexsort (a tenth the speed)."""
    smallest, largest = int(values.min()), int(values.max())
    span = largest - smallest + 1
    if span * (int(group[-1]) + 1) < 2**62:
        key = group * span + (values - smallest)
        key.sort()
        key -= group * span
        key += smallest
        return key
    return values[np.lexsort((values, group))]


def direction_fields(
    values: np.ndarray, starts: np.ndarray, histograms: bool = True
) -> tuple[list[str], list[str] | None]:
    """Per group of direction_values: the stamp_delay fields (count, sum, min, mean, max, p50, p99,
    IPDV) and the stamp_delay_histogram fields (None with histograms=False: the in-line
    processor's hop delays have none), as line-protocol text, all groups at once.

    The numbers are bit for bit what numpy gives per group (mean, np.percentile's linear
    interpolation, delay_histogram.fields_text): the same float operations on the same
    operands, elementwise. IPDV (RFC 3393 / RFC 5481): the mean of |D(i) - D(i-1)| between
    packets adjacent by sender_seq among those that arrived in the second; none below 2 packets."""
    total = len(values)
    counts = np.diff(np.append(starts, total))
    counts_f = counts.astype(np.float64)
    sums = np.add.reduceat(values, starts)
    steps = np.empty(total, dtype=np.int64)
    steps[1:] = np.abs(np.diff(values))
    steps[starts] = 0  # no step across two groups
    ipdv_sums = np.add.reduceat(steps, starts)
    means = sums.astype(np.float64) / counts_f
    ipdvs = ipdv_sums.astype(np.float64) / np.maximum(counts_f - 1, 1)
    inexact = np.flatnonzero(np.add.reduceat(np.abs(values.astype(np.float64)), starts) >= _EXACT_SUM_LIMIT)
    for j in inexact.tolist():
        d = values[starts[j] : starts[j] + counts[j]]
        means[j] = float(d.mean())
        if len(d) >= 2:
            ipdvs[j] = float(np.abs(np.diff(d)).mean())

    group = np.repeat(np.arange(len(starts)), counts)
    ordered = sorted_within(values, group)
    last = starts + counts - 1
    minimums, maximums = ordered[starts], ordered[last]
    quantiles = []
    top = (counts - 1).astype(np.float64)
    for q in _QUANTILES:  # numpy's _quantile, method "linear", on every group at once
        virtual = top * q
        above = virtual >= top  # one value: numpy takes index -1 for both neighbours
        floor = np.floor(virtual)
        previous = np.where(above, -1, floor).astype(np.intp)
        following = np.where(above, -1, floor + 1).astype(np.intp)
        gamma = virtual - previous
        a = ordered[starts + np.where(previous < 0, counts + previous, previous)]
        b = ordered[starts + np.where(following < 0, counts + following, following)]
        diff = b - a
        result = a + diff * gamma
        high = gamma >= 0.5
        result[high] = (b - diff * (1 - gamma))[high]
        quantiles.append(result)

    stats = zip(
        counts.tolist(),
        (sums.astype(np.float64) / NS_PER_US).tolist(),
        (minimums.astype(np.float64) / NS_PER_US).tolist(),
        (means / NS_PER_US).tolist(),
        (maximums.astype(np.float64) / NS_PER_US).tolist(),
        (quantiles[0] / NS_PER_US).tolist(),
        (quantiles[1] / NS_PER_US).tolist(),
        (ipdvs / NS_PER_US).tolist(),
    )
    fields_text = [
        f"count={c}i,sum_us={s!r},min_us={lo!r},mean_us={m!r},max_us={hi!r},p50_us={p50!r},p99_us={p99!r}"
        + (f",ipdv_mean_us={ipdv!r}" if c >= 2 else "")
        for c, s, lo, m, hi, p50, p99, ipdv in stats
    ]
    return fields_text, histogram_fields(ordered, starts) if histograms else None


def histogram_fields(ordered: np.ndarray, starts: np.ndarray) -> list[str]:
    """delay_histogram.fields_text of every group of `ordered` (sorted within each group), from the
    runs of equal bucket index (the table lookup keeps them in bucket order) instead of one
    bincount per group."""
    total = len(ordered)
    index = bucket_indexes(ordered) + 1  # field number: `low` 0, b<i> i + 1, `high` MAX_INDEX + 2
    run_start = np.zeros(total, dtype=bool)
    run_start[starts] = True
    run_start[1:] |= index[1:] != index[:-1]
    runs = np.flatnonzero(run_start)
    run_counts = np.diff(np.append(runs, total))
    field = index[runs]
    many = run_counts >= _PIECE_COUNTS
    table = histogram_pieces()
    pieces = [table[k] for k in np.where(many, 0, field * _PIECE_COUNTS + run_counts).tolist()]
    for j in np.flatnonzero(many).tolist():
        pieces[j] = f"{_HISTOGRAM_FIELDS[field[j]]}={run_counts[j]}i"
    first_run = np.searchsorted(runs, starts).tolist() + [len(runs)]
    return [",".join(pieces[a:b]) for a, b in zip(first_run[:-1], first_run[1:])]


class SecondAccumulator:
    """Records of one (node, ssid, second): merged (deduped, sorted by sender_seq) + pending chunks."""

    __slots__ = ("second", "rows", "pending", "emitted", "dirty", "path", "newest_t1_ns")

    def __init__(self, second: int):
        self.second = second
        self.newest_t1_ns = -1  # the largest T1 of the second's records (TAI): the newest_ns field
        # rows: forward, reverse, round_trip, clock error, sender_seq (merged records, one column each)
        self.rows = np.empty((ROWS, 0), dtype=np.int64)
        self.pending: list[np.ndarray] = []  # chunks of records (ROWS, n) not merged yet
        self.emitted = False
        self.dirty = False
        self.path: str | None = None  # escaped path tag, fixed at the first emission

    @property
    def seq(self) -> np.ndarray:
        return self.rows[SEQ_ROW]

    @property
    def delays(self) -> np.ndarray:
        return self.rows[:SEQ_ROW]

    def add(self, rows: np.ndarray) -> None:
        self.pending.append(rows)
        self.dirty = True


def merge_seconds(
    accs: list[SecondAccumulator], counters: Counters, absurd_threshold_ns: int
) -> tuple[np.ndarray, np.ndarray]:
    """Fold the pending chunks of every accumulator into its merged records, all in one pass: sorted
    by sender_seq, a duplicate sender_seq dropped and counted (duplicate_records) keeping the first
    copy (already merged records come first, so a replayed copy never replaces what was counted
    before); the new records' negative and absurd delays are counted.

    Returns (bounds, rows): accumulator i's merged records are columns bounds[i]:bounds[i + 1] of
    rows (ROWS rows); acc.rows are views of them."""
    chunks: list[np.ndarray] = []
    chunk_acc: list[int] = []
    chunk_old: list[bool] = []
    for i, acc in enumerate(accs):
        if acc.rows.shape[1]:  # emitted before: a late record re-opened it
            chunks.append(acc.rows)
            chunk_acc.append(i)
            chunk_old.append(True)
        chunks += acc.pending
        chunk_acc += [i] * len(acc.pending)
        chunk_old += [False] * len(acc.pending)
        acc.pending = []
    lengths = [c.shape[1] for c in chunks]
    second = np.repeat(np.array(chunk_acc, dtype=np.int64), lengths)
    old = np.repeat(np.array(chunk_old, dtype=bool), lengths)
    rows = np.concatenate(chunks, axis=1) if chunks else np.empty((ROWS, 0), dtype=np.int64)
    seq = rows[SEQ_ROW]
    n = len(seq)
    # the usual case, records in sender_seq order without duplicates, needs no sort
    if n > 1 and not np.all((seq[1:] > seq[:-1]) | (second[1:] != second[:-1])):
        order = np.lexsort((seq, second))  # stable: the first copy of a sender_seq stays first
        seq_o, second_o = seq[order], second[order]
        first = np.ones(n, dtype=bool)
        first[1:] = (seq_o[1:] != seq_o[:-1]) | (second_o[1:] != second_o[:-1])
        keep = order[first]
        counters.duplicate_records += n - len(keep)
        rows, second, old = rows[:, keep], second[keep], old[keep]
    new = rows[:3, ~old] if old.any() else rows[:3]
    not_measured = np.count_nonzero(new == NOT_MEASURED)  # negative, below -absurd: not a delay
    counters.negative_delays += int(np.count_nonzero(new < 0) - not_measured)
    absurd = np.count_nonzero(new > absurd_threshold_ns) + np.count_nonzero(new < -absurd_threshold_ns)
    counters.absurd_delays += int(absurd - not_measured)
    bounds = np.zeros(len(accs) + 1, dtype=np.int64)
    np.cumsum(np.bincount(second, minlength=len(accs)), out=bounds[1:])
    edges = bounds.tolist()
    for acc, a, b in zip(accs, edges[:-1], edges[1:]):
        acc.rows = rows[:, a:b]
    return bounds, rows


def clock_fields(errors: np.ndarray, bounds: np.ndarray) -> list[str | None]:
    """Per second (columns bounds[i]:bounds[i + 1] of the clock error row):
    `,error_estimate_max_us=..,unsynchronized=..i`, the largest error bound of a synchronized
    record and how many records had an unsynchronized side; None for a second without records."""
    lengths = np.diff(bounds)
    filled = np.flatnonzero(lengths)
    out: list[str | None] = [None] * len(lengths)
    if len(filled) == 0:
        return out
    first = bounds[filled]
    unsynchronized = np.add.reduceat((errors == UNSYNCHRONIZED).astype(np.int64), first)
    largest = np.maximum.reduceat(errors, first)  # a synchronized error is >= 0 > UNSYNCHRONIZED
    for i, u, e in zip(filled.tolist(), unsynchronized.tolist(), largest.tolist()):
        out[i] = (f",error_estimate_max_us={e / NS_PER_US!r}" if e != UNSYNCHRONIZED else "") + f",unsynchronized={u}i"
    return out


@dataclass
class SessionState:
    node: str
    ssid: int
    watermark_ns: int = -1  # max T1 seen
    last_ingest_tai_ns: int = 0  # wall clock (CLOCK_TAI) of the last batch with records
    horizon_s: int = -(2**62)  # seconds below this were evicted: their records are dropped
    final_below_s: int = -(2**62)  # seconds below this were final before a restart (seed_final)
    newest_s: int = -(2**62)  # the newest second records came for (also skipped or late ones)
    seconds: dict[int, SecondAccumulator] = field(default_factory=dict)
    tags: str = ""  # "node=..,ssid=.." (escaped)


# ---------------------------------------------------------------------------
# the aggregator
# ---------------------------------------------------------------------------


class DelayAggregator:
    def __init__(
        self,
        grace_s: float = 2.0,
        retention_s: float = 60.0,
        idle_s: float | None = None,
        absurd_threshold_s: float = 10.0,
        max_future_s: float = 10.0,
        tai_utc_offset_s: int = 0,
        path_of: Callable[[str, int], str | None] | None = None,
    ):
        """path_of(node, ssid): the session's path tag (unescaped), None if not known (e.g.
        PathBook.path_for_session); without it every point has path=unknown. idle_s: wall-clock
        silence after which a session's seconds close by the clock (None or less than grace_s:
        grace_s)."""
        if grace_s < 0 or retention_s < grace_s:
            raise ValueError("need 0 <= grace_s <= retention_s")
        self.grace_ns = int(grace_s * NS_PER_S)
        self.idle_ns = max(self.grace_ns, int((idle_s or 0) * NS_PER_S))
        self.retention_ns = int(retention_s * NS_PER_S)
        self.absurd_threshold_ns = int(absurd_threshold_s * NS_PER_S)
        self.max_future_ns = int(max_future_s * NS_PER_S)
        # Seconds are binned in TAI (the datapath's clock); points are written in UTC (what
        # InfluxDB's now() and Grafana's time picker use): TAI - UTC = 37 s since 2017.
        self.tai_utc_offset_s = int(tai_utc_offset_s)
        self.path_of = path_of or (lambda node, ssid: None)
        _clock_table()  # built here, at start, not in the middle of the first batch
        bucket_floors()  # likewise
        histogram_pieces()
        self.sessions: dict[tuple[str, int], SessionState] = {}
        self.final_seeds: dict[tuple[str, int], int] = {}  # seed_final() of sessions not seen yet
        self.counters = Counters()

    # -- per message ------------------------------------------------------

    def ingest(self, node: str, records: np.ndarray, now_tai_ns: int | None = None) -> dict[tuple[str, int], int]:
        """Fold the records of one stamp_batch into the per-second accumulators (ingest_parts)."""
        return self.ingest_parts([(node, records)], now_tai_ns)

    def ingest_parts(
        self, parts: list[tuple[str, np.ndarray]], now_tai_ns: int | None = None
    ) -> dict[tuple[str, int], int]:
        """Fold the records of several stamp_batches, [(node, records), ...], into the per-second
        accumulators in one pass: the numpy work is per call, not per batch, so a worker hands
        over all the messages of a fetch at once (at 20 records per message the per-call cost was
        most of the per-message cost). Returns per session (node, ssid) the latest second the
        records belong to (skipped ones included): what a message's ack waits for."""
        self.counters.batches_in += len(parts)
        if not parts:
            return {}
        records = join_records([r for _, r in parts])
        n = len(records)
        self.counters.records_in += n
        if n == 0:
            return {}
        if now_tai_ns is None:
            now_tai_ns = clock_tai_ns()
        t1 = records["t1_ns"].astype(np.int64)
        t2 = records["t2_ns"].astype(np.int64)
        t3 = records["t3_ns"].astype(np.int64)
        t4 = records["t4_ns"].astype(np.int64)
        delays = np.empty((ROWS, n), dtype=np.int64)
        delays[SEQ_ROW] = records["sender_seq"]
        delays[CLOCK_ERROR_ROW] = clock_error_ns(records["sender_err_est"], records["reflector_err_est"])
        np.subtract(t2, t1, out=delays[0])  # forward  T2 - T1
        np.subtract(t4, t3, out=delays[1])  # reverse  T4 - T3
        np.subtract(t4 - t1, t3 - t2, out=delays[2])  # round trip (T4-T1)-(T3-T2)
        flags = records["flags"]
        if flags.any():
            mark_partial_records(flags, t1, t4, delays)
        second = t1 // NS_PER_S
        ssid = records["ssid"]
        names = list(dict.fromkeys(node for node, _ in parts))
        touched: dict[tuple[str, int], int] = {}
        if (
            len(names) == 1
            and ssid[0] == ssid[-1]
            and second[0] == second[-1]
            and (n <= 2 or (ssid.min() == ssid.max() and second.min() == second.max()))
        ):
            # common case: one session, one second
            key = (names[0], int(ssid[0]))
            touched[key] = int(second[0])
            self._add_group(key[0], key[1], touched[key], delays, t1, now_tai_ns)
            return touched
        if len(names) == 1:
            node_no = np.zeros(n, dtype=np.int64)
        else:
            number = {name: i for i, name in enumerate(names)}
            node_no = np.repeat([number[node] for node, _ in parts], [len(r) for _, r in parts])
        order = np.lexsort((second, ssid, node_no))
        node_o, ssid_o, second_o = node_no[order], ssid[order], second[order]
        cut = np.flatnonzero((np.diff(node_o) != 0) | (np.diff(ssid_o) != 0) | (np.diff(second_o) != 0)) + 1
        bounds = np.concatenate(([0], cut, [n])).tolist()
        delays_o, t1_o = delays[:, order], t1[order]
        starts = bounds[:-1]
        for a, b, node_i, session, sec in zip(
            starts, bounds[1:], node_o[starts].tolist(), ssid_o[starts].tolist(), second_o[starts].tolist()
        ):
            key = (names[node_i], session)
            touched[key] = sec  # groups come in second order within a session: the last is the latest
            self._add_group(key[0], session, sec, delays_o[:, a:b], t1_o[a:b], now_tai_ns)
        return touched

    def seed_final(self, node: str, ssid: int, final_below_s: int) -> None:
        """After a restart or a rebalance: the seconds of this session below final_below_s were
        evicted (final and published) by an earlier owner. Replayed input may still hold a few of
        their records (a message spanning the boundary); they are skipped instead of making a
        partial second. The seed waits until the session's records arrive: a session is never
        created from a seed, because a worker of a group sees every session's progress, most of
        them owned by other workers, and an idle session's horizon follows the wall clock (its
        progress, written here, would then tell the real owner's successor to skip live data)."""
        key = (node, ssid)
        self.final_seeds[key] = max(self.final_seeds.get(key, -(2**62)), final_below_s)
        st = self.sessions.get(key)
        if st is not None:
            st.final_below_s = max(st.final_below_s, final_below_s)

    def _session(self, node: str, ssid: int) -> SessionState:
        key = (node, ssid)
        st = self.sessions.get(key)
        if st is None:
            st = SessionState(node=node, ssid=ssid, final_below_s=self.final_seeds.get(key, -(2**62)))
            st.tags = f"node={escape_tag(node)},ssid={ssid}"
            self.sessions[key] = st
        return st

    def _add_group(
        self,
        node: str,
        ssid: int,
        second: int,
        rows: np.ndarray,
        seq_t1: np.ndarray,
        now_tai_ns: int,
    ) -> None:
        st = self._session(node, ssid)
        st.last_ingest_tai_ns = now_tai_ns
        if second > st.newest_s:
            st.newest_s = second
        if second < st.final_below_s:  # published complete by the worker before a restart
            self.counters.replayed_records_skipped += rows.shape[1]
            return
        if second < st.horizon_s:
            self.counters.late_records_dropped += rows.shape[1]
            return
        max_t1 = int(seq_t1.max())
        acc = st.seconds.get(second)
        if acc is None:
            acc = st.seconds[second] = SecondAccumulator(second)
        if max_t1 > acc.newest_t1_ns:
            acc.newest_t1_ns = max_t1
        # One record with a wild T1 (clock trouble, corruption) must not close and evict
        # everything else: the watermark never runs ahead of the wall clock + max_future.
        limit = now_tai_ns + self.max_future_ns
        if max_t1 > limit:
            self.counters.future_records += int(np.count_nonzero(seq_t1 > limit))
            max_t1 = limit
        if max_t1 > st.watermark_ns:
            st.watermark_ns = max_t1
        acc.add(rows)

    # -- periodic ---------------------------------------------------------

    def flush(self, now_tai_ns: int | None = None) -> list[str]:
        """Close every second whose end + grace is behind the watermark; return their lines.

        Also evicts seconds older than the retention window. Call it periodically (1 s).
        The statistics of all seconds closed here are computed together (_emit).
        """
        if now_tai_ns is None:
            now_tai_ns = clock_tai_ns()
        closing: list[tuple[SessionState, SecondAccumulator]] = []
        for st in self.sessions.values():
            idle_ns = now_tai_ns - st.last_ingest_tai_ns
            wm = st.watermark_ns
            if idle_ns >= self.idle_ns:
                wm = max(wm, now_tai_ns)
            close_before = (wm - self.grace_ns) // NS_PER_S  # seconds s with (s+1)*1e9+grace <= wm
            for s in sorted(st.seconds):
                if s >= close_before:
                    break
                acc = st.seconds[s]
                if acc.dirty:
                    acc.dirty = False
                    closing.append((st, acc))
            # Eviction runs on data time (the watermark), so replayed old data is kept as
            # long as live data would be; only an idle session falls back to the wall clock.
            horizon = (st.watermark_ns - self.retention_ns) // NS_PER_S
            if idle_ns >= self.retention_ns:
                # all its seconds go, but the horizon stops after the newest one records came for:
                # a later second was never published, so records for it that come now (held by an
                # agent cut off from Kafka for longer than the retention) make it whole, not partial
                wall = (now_tai_ns - self.retention_ns) // NS_PER_S
                horizon = max(horizon, min(wall, st.newest_s + 1))
            if horizon > st.horizon_s:
                for s in [s for s in st.seconds if s < horizon]:
                    acc = st.seconds.pop(s)
                    if acc.dirty:  # never closed (cannot happen while retention >= grace), emit anyway
                        acc.dirty = False
                        closing.append((st, acc))
                st.horizon_s = horizon
        return self._emit(closing)

    def flush_all(self) -> list[str]:
        """Emit every dirty second now (shutdown path)."""
        closing: list[tuple[SessionState, SecondAccumulator]] = []
        for st in self.sessions.values():
            for s in sorted(st.seconds):
                acc = st.seconds[s]
                if acc.dirty:
                    acc.dirty = False
                    closing.append((st, acc))
        return self._emit(closing)

    def _emit(self, closing: list[tuple[SessionState, SecondAccumulator]]) -> list[str]:
        """The lines of the closed seconds, in order: per second and direction a stamp_delay and a
        stamp_delay_histogram line. One vectorised pass over all of them (merge, statistics,
        histograms, clock fields): per second only the line formatting is Python work."""
        if not closing:
            return []
        bounds, rows = merge_seconds([acc for _, acc in closing], self.counters, self.absurd_threshold_ns)
        edges = bounds.tolist()
        for (st, acc), a, b in zip(closing, edges[:-1], edges[1:]):
            if acc.emitted:
                self.counters.seconds_reemitted += 1
            acc.emitted = True
            if a < b and acc.path is None:
                path = self.path_of(st.node, st.ssid)
                acc.path = UNKNOWN_PATH if path is None else escape_tag(path)
        # per direction and second: (stamp_delay fields, histogram fields), None where not measured
        texts: list[list[tuple[str, str] | None]] = []
        for r in range(3):
            by_second: list[tuple[str, str] | None] = [None] * len(closing)
            values, starts, seconds = direction_values(rows[r], bounds)
            if len(values):
                for i, fields_ in zip(seconds.tolist(), zip(*direction_fields(values, starts))):
                    by_second[i] = fields_
            texts.append(by_second)
        clock_text = clock_fields(rows[CLOCK_ERROR_ROW], bounds)
        offset_ns = self.tai_utc_offset_s * NS_PER_S
        lines: list[str] = []
        for i, (st, acc) in enumerate(closing):
            if edges[i] == edges[i + 1]:
                continue
            ts = acc.second * NS_PER_S - offset_ns
            # newest_ns: how old the second's data is when it becomes visible (segscope-freshness)
            clock = f"{clock_text[i]},newest_ns={acc.newest_t1_ns - offset_ns}i"
            tags = f"{st.tags},path={acc.path},direction="
            points = 0
            for direction, by_second in zip(DIRECTIONS, texts):
                fields_ = by_second[i]
                if fields_ is not None:
                    lines.append(f"{MEASUREMENT},{tags}{direction} {fields_[0]}{clock} {ts}")
                    lines.append(f"{HISTOGRAM},{tags}{direction} {fields_[1]} {ts}")
                    points += 1
            self.counters.points_out += points
            self.counters.histogram_points_out += points
            if acc.path == UNKNOWN_PATH:
                self.counters.path_unknown += points
        return lines

    def open_seconds(self) -> int:
        return sum(len(st.seconds) for st in self.sessions.values())


def counters_line(
    counters: Counters, processor: str, ts_ns: int, extra: dict[str, int] | None = None, instance: str = ""
) -> str:
    """segscope_processor,processor=P,instance=I (instance: the worker, processors/runtime/config.py
    worker_instance(); omitted when empty, e.g. in tests of the pure core)."""
    values = counters.as_dict()
    if extra:
        values.update(extra)
    body = ",".join(f"{k}={v}i" for k, v in values.items())
    tags = f"processor={escape_tag(processor)}" + (f",instance={escape_tag(instance)}" if instance else "")
    return f"segscope_processor,{tags} {body} {ts_ns}"
