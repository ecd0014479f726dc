"""The delay aggregator as it was before the flush computed the statistics of all closed
seconds in one vectorised pass (processors/delay/aggregate.py at 4edd64a, unchanged but for this
docstring): the reference that tests/processors/test_delay_aggregate_differential.py runs side by
side with the current aggregator on random input; every line and counter must be the same.

Original module docstring:

Per-second STAMP delay aggregation: the pure, Kafka-free core of the delay processor.

Input: the records of one decoded stamp_batch (numpy array of STAMP_RECORD_DTYPE,
from segscope_schemas.stamp_record.decode_batch) plus the node name of the batch.
Output: InfluxDB line-protocol lines `stamp_delay,node=..,ssid=..,path=..,direction=..` and
`stamp_delay_histogram` with the same tags (see schemas/metrics.md), one each per closed
(node, ssid, second) and direction.

Design (why it looks like this):
- ingest() is the per-Kafka-message path. It does a handful of vectorised numpy
  operations on the whole batch (delays, second index, grouping) and only appends
  array slices to per-second accumulators; no per-record Python work. Statistics
  are computed once, when a second is closed (flush()).
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


@dataclass
class DirectionStats:
    count: int
    sum_us: float  # exact: the int64 ns sum / 1000 (rollups weight means with it)
    min_us: float
    mean_us: float
    max_us: float
    p50_us: float
    p99_us: float
    ipdv_mean_us: float | None  # None when fewer than 2 packets: IPDV is undefined


# A direction a record cannot measure (see mark_partial_records); never a real delay.
NOT_MEASURED = np.iinfo(np.int64).min
# Row 3 of the per-record array: the timestamp error bound of the record's one-way delays, ns
# (sender + reflector Error Estimate, RFC 8762 §4.2.1), or UNSYNCHRONIZED when either side's
# S bit is clear (its clock is not synchronized to UTC: no bound).
CLOCK_ERROR_ROW = 3
UNSYNCHRONIZED = -1


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


def direction_stats(delays_ns: np.ndarray) -> DirectionStats:
    """Statistics of one direction; delays_ns must already be ordered by sender_seq.

    IPDV (RFC 3393 / RFC 5481): difference of one-way delay between consecutive
    packets; here "consecutive" means adjacent by sender_seq among the packets that
    arrived in this second. ipdv_mean_us is the mean of |D(i) - D(i-1)|.
    """
    p50, p99 = np.percentile(delays_ns, [50.0, 99.0])
    ipdv = None
    if len(delays_ns) >= 2:
        ipdv = float(np.abs(np.diff(delays_ns)).mean()) / NS_PER_US
    return DirectionStats(
        count=int(len(delays_ns)),
        sum_us=int(delays_ns.sum()) / NS_PER_US,
        min_us=int(delays_ns.min()) / NS_PER_US,
        mean_us=float(delays_ns.mean()) / NS_PER_US,
        max_us=int(delays_ns.max()) / NS_PER_US,
        p50_us=float(p50) / NS_PER_US,
        p99_us=float(p99) / NS_PER_US,
        ipdv_mean_us=ipdv,
    )


class SecondAccumulator:
    """Records of one (node, ssid, second): merged (deduped, sorted by sender_seq) + pending chunks."""

    __slots__ = ("second", "seq", "delays", "pending", "emitted", "dirty", "path", "newest_t1_ns")

    def __init__(self, second: int):
        self.second = second
        self.newest_t1_ns = -1  # the largest T1 of the second's records (TAI): the newest_ns field
        self.seq = np.empty(0, dtype=np.int64)
        self.delays = np.empty((4, 0), dtype=np.int64)  # rows: forward, reverse, round_trip, clock error
        self.pending: list[tuple[np.ndarray, np.ndarray]] = []
        self.emitted = False
        self.dirty = False
        self.path: str | None = None  # escaped path tag, fixed at the first emission

    def add(self, seq: np.ndarray, delays: np.ndarray) -> None:
        self.pending.append((seq, delays))
        self.dirty = True

    def merge(self, counters: Counters, absurd_threshold_ns: int) -> None:
        """Fold pending chunks into the merged arrays; drop and count duplicate sender_seq."""
        if not self.pending:
            return
        n_old = len(self.seq)
        seq = np.concatenate([self.seq] + [s for s, _ in self.pending])
        delays = np.concatenate([self.delays] + [d for _, d in self.pending], axis=1)
        self.pending.clear()
        # np.unique returns the first occurrence, and old (already merged) records come
        # first, so a replayed copy never replaces what was counted before.
        self.seq, keep = np.unique(seq, return_index=True)
        self.delays = delays[:, keep]
        counters.duplicate_records += len(seq) - len(keep)
        new = delays[:3, keep[keep >= n_old]]
        measured = new != NOT_MEASURED
        counters.negative_delays += int(np.count_nonzero((new < 0) & measured))
        counters.absurd_delays += int(np.count_nonzero((np.abs(new) > absurd_threshold_ns) & measured))

    def clock_fields(self) -> str:
        """`,error_estimate_max_us=..,unsynchronized=..i` of the second's records: the largest
        error bound of a synchronized record, and how many records had an unsynchronized side."""
        err = self.delays[CLOCK_ERROR_ROW]
        unsync = int(np.count_nonzero(err == UNSYNCHRONIZED))
        synced = err[err != UNSYNCHRONIZED]
        out = f",unsynchronized={unsync}i"
        if len(synced):
            out = f",error_estimate_max_us={format_float(float(synced.max()) / NS_PER_US)}" + out
        return out

    def measured(self) -> list[np.ndarray]:
        """Per direction the delays (ns, sender_seq order) of the records that measure it."""
        out = []
        for i in range(3):
            d = self.delays[i]
            out.append(d[d != NOT_MEASURED])
        return out

    def stats(self) -> list[DirectionStats | None]:
        """Per direction; None where no record of the second measures that direction."""
        return [direction_stats(d) if len(d) else None for d in self.measured()]


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
        self.sessions: dict[tuple[str, int], SessionState] = {}
        self.final_seeds: dict[tuple[str, int], int] = {}  # seed_final() of sessions not seen yet
        self.counters = Counters()

    # -- per message ------------------------------------------------------

    def ingest(self, node: str, records: np.ndarray, now_tai_ns: int | None = None) -> None:
        """Fold the records of one stamp_batch into the per-second accumulators."""
        n = len(records)
        self.counters.batches_in += 1
        self.counters.records_in += n
        if n == 0:
            return
        if now_tai_ns is None:
            now_tai_ns = clock_tai_ns()
        t1 = records["t1_ns"].astype(np.int64)
        t2 = records["t2_ns"].astype(np.int64)
        t3 = records["t3_ns"].astype(np.int64)
        t4 = records["t4_ns"].astype(np.int64)
        delays = np.empty((4, n), dtype=np.int64)
        delays[CLOCK_ERROR_ROW] = clock_error_ns(records["sender_err_est"], records["reflector_err_est"])
        np.subtract(t2, t1, out=delays[0])  # forward  T2 - T1
        np.subtract(t4, t3, out=delays[1])  # reverse  T4 - T3
        np.subtract(t4 - t1, t3 - t2, out=delays[2])  # round trip (T4-T1)-(T3-T2)
        flags = records["flags"]
        if flags.any():
            mark_partial_records(flags, t1, t4, delays)
        second = t1 // NS_PER_S
        seq = records["sender_seq"]
        ssid = records["ssid"]

        if (
            ssid[0] == ssid[-1]
            and second[0] == second[-1]
            and (n <= 2 or (ssid.min() == ssid.max() and second.min() == second.max()))
        ):
            # common case: one session, one second
            self._add_group(node, int(ssid[0]), int(second[0]), seq, delays, t1, now_tai_ns)
            return
        order = np.lexsort((second, ssid))
        ssid_o, second_o = ssid[order], second[order]
        cut = np.flatnonzero((np.diff(ssid_o) != 0) | (np.diff(second_o) != 0)) + 1
        bounds = np.concatenate(([0], cut, [n]))
        seq_o, delays_o, t1_o = seq[order], delays[:, order], t1[order]
        for a, b in zip(bounds[:-1], bounds[1:]):
            self._add_group(node, int(ssid_o[a]), int(second_o[a]), seq_o[a:b], delays_o[:, a:b], t1_o[a:b], now_tai_ns)

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
        seq: np.ndarray,
        delays: np.ndarray,
        seq_t1: np.ndarray,
        now_tai_ns: int,
    ) -> None:
        st = self._session(node, ssid)
        st.last_ingest_tai_ns = now_tai_ns
        if second > st.newest_s:
            st.newest_s = second
        if second < st.final_below_s:  # published complete by the worker before a restart
            self.counters.replayed_records_skipped += len(seq)
            return
        if second < st.horizon_s:
            self.counters.late_records_dropped += len(seq)
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
        acc.add(seq.astype(np.int64), delays)

    # -- periodic ---------------------------------------------------------

    def flush(self, now_tai_ns: int | None = None) -> list[str]:
        """Close every second whose end + grace is behind the watermark; return their lines.

        Also evicts seconds older than the retention window. Call it periodically (1 s).
        """
        if now_tai_ns is None:
            now_tai_ns = clock_tai_ns()
        lines: list[str] = []
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
                    self._emit(st, acc, lines)
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
                        self._emit(st, acc, lines)
                st.horizon_s = horizon
        return lines

    def flush_all(self) -> list[str]:
        """Emit every dirty second now (shutdown path)."""
        lines: list[str] = []
        for st in self.sessions.values():
            for s in sorted(st.seconds):
                acc = st.seconds[s]
                if acc.dirty:
                    self._emit(st, acc, lines)
        return lines

    def _emit(self, st: SessionState, acc: SecondAccumulator, lines: list[str]) -> None:
        acc.merge(self.counters, self.absurd_threshold_ns)
        if acc.emitted:
            self.counters.seconds_reemitted += 1
        acc.emitted = True
        acc.dirty = False
        if len(acc.seq) == 0:
            return
        if acc.path is None:
            path = self.path_of(st.node, st.ssid)
            acc.path = UNKNOWN_PATH if path is None else escape_tag(path)
        ts = (acc.second - self.tai_utc_offset_s) * NS_PER_S
        # newest_ns: how old the second's data is when it becomes visible (segscope-freshness)
        clock = acc.clock_fields() + f",newest_ns={acc.newest_t1_ns - self.tai_utc_offset_s * NS_PER_S}i"
        tags = f"{st.tags},path={acc.path},direction="
        for direction, d in zip(DIRECTIONS, acc.measured()):
            if len(d):
                lines.append(format_line(f"{MEASUREMENT},{tags}{direction}", direction_stats(d), ts, clock))
                lines.append(f"{HISTOGRAM},{tags}{direction} {delay_histogram.fields_text(d)} {ts}")
                self.counters.points_out += 1
                self.counters.histogram_points_out += 1
                if acc.path == UNKNOWN_PATH:
                    self.counters.path_unknown += 1

    def open_seconds(self) -> int:
        return sum(len(st.seconds) for st in self.sessions.values())


def format_line(series: str, d: DirectionStats, ts_ns: int, extra_fields: str = "") -> str:
    fields_ = (
        f"count={d.count}i,sum_us={format_float(d.sum_us)},min_us={format_float(d.min_us)},mean_us={format_float(d.mean_us)},"
        f"max_us={format_float(d.max_us)},p50_us={format_float(d.p50_us)},"
        f"p99_us={format_float(d.p99_us)}"
    )
    if d.ipdv_mean_us is not None:
        fields_ += f",ipdv_mean_us={format_float(d.ipdv_mean_us)}"
    return f"{series} {fields_}{extra_fields} {ts_ns}"


def counters_line(
    counters: Counters, processor: str, ts_ns: int, extra: dict[str, int] | None = None, instance: str = ""
) -> str:
    """segscope_processor,processor=P,instance=I (instance: the worker, processors/worker.py
    worker_instance(); omitted when empty, e.g. in tests of the pure core)."""
    values = counters.as_dict()
    if extra:
        values.update(extra)
    body = ",".join(f"{k}={v}i" for k, v in values.items())
    tags = f"processor={escape_tag(processor)}" + (f",instance={escape_tag(instance)}" if instance else "")
    return f"segscope_processor,{tags} {body} {ts_ns}"
