"""Alternate-marking loss join: the pure, Kafka-free core of the loss processor.

Input: the records of one decoded altmark_batch (numpy array of ALTMARK_BLOCK_DTYPE, from
segscope_schemas.altmark_block.decode_batch) plus the node name of the batch, and the
processor's clock `now_ns` (any monotonic-enough ns clock; only differences are used).
Output: InfluxDB line-protocol lines `altmark_loss,flow=..,method=..,tx_node=..,rx_node=..`
(see schemas/metrics.md and schemas/ALTMARK.md), one per (flow, block) each time what is
known about the block changes.

Design (why it looks like this):
- A record carries the packets/bytes of ONE block (a delta, computed by the collector from
  per-colour datapath snapshots, see altmark_counter_delta), so the joiner never sees a
  cumulative counter and a counter wrap cannot reach it. Loss of a block = tx - rx.
- Join key: (flow_id, method, period_ms, block_index). Both edges derive block_index from
  CLOCK_TAI and the period; a period change on one side only never joins (the block ends
  incomplete, never a wrong number). period_ms is a tag, so two blocks of one flow with
  different periods that start at the same instant are two points, not one overwriting the other.
- A block is published when both sides are present, or when `timeout_s` has passed since its
  first record arrived (then `complete=false` with the side that arrived and a reason).
  Blocks stay in memory for `retention_s` after their first record; whenever what is known
  changes (late side, restart evidence) the block is published again with the same
  measurement, tags and timestamp, so InfluxDB overwrites the point (idempotent sink). A
  record for a block already evicted is dropped and counted (late_records_dropped).
- Only numbers that are right are published as `lost`: a block is `complete=false` when a
  side is missing (missing_tx / missing_rx), when a record says its counts do not cover the
  block (F_PARTIAL: the agent or datapath started during it -> partial_block), when the same
  node reports the same block under two boot ids (agent_restart: counters reset mid-block),
  when the same side of a block is reported differently (conflicting_records: same node and
  boot, other counts; conflicting_nodes: two nodes claim the same side), or when rx > tx
  (rx_exceeds_tx: colouring/clock trouble, not negative loss). The first such reason wins.
- An exact duplicate (same node, flow, direction, block, boot, counts) is counted
  (duplicate_records) and ignored, so replays never double-count.
- Tags must not change between re-emissions, but a missing side's node is unknown: the joiner
  uses the node last seen on that side of the same flow ("unknown" if never seen).
- Double marking (RFC 9341): each record carries the number of D-marked packets its edge saw
  in the block and the sum of their CLOCK_TAI timestamps. A complete block whose two sides saw
  the same number n > 0 of D-marked packets gets `dmark_packets=n` and the mean one-way delay
  of real traffic `dmark_delay_mean_us = int64(rx_sum - tx_sum mod 2^64) / n / 1000`. Different
  counts (a D-marked packet was lost or the block is not comparable) give no delay field and
  count `dmark_mismatch`; blocks without any D-marked packet (double marking off) count nothing.
- Vectorised (processors/delay/aggregate.py is the model): the open blocks are columns of numpy
  arrays (one row per block, both sides side by side), and ingest() classifies and stores a whole
  batch with array operations (new block, skipped, late, side filled, duplicate, conflict). A flow
  series (flow_id, method, period_ms) gets a number from a sorted array (np.searchsorted, new ones
  added in bulk); what is known per series is columns too: its final_upto and evicted_upto marks,
  the node last written to flow_nodes per side (so flow_nodes is written only when a node
  changes), its tags and its path (kept while flow_path_version() says paths did not change). A
  block key is one Python int, series << 45 | block_index, made by numpy; a dict maps it to the
  block's row: one C-level dict lookup per record, the only per-record Python left. Per line:
  the f-string of its fields (timestamps and loss ratios are formatted once per distinct value).
  A batch holding the same side of one block twice (a replay packed with its original) is taken
  record by record, so the outcome is always the sequential one.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from itertools import repeat

import numpy as np

from processors.delay.aggregate import counters_line as _counters_line
from processors.delay.aggregate import escape_tag, format_float
from segscope_schemas.altmark_block import (
    ALTMARK_BLOCK_DTYPE,
    DIR_RX,
    DIR_TX,
    F_KNOWN,
    F_PARTIAL,
    FLOWMONID_MAX,
    METHOD_NAMES,
    METHOD_RFC9343,
    NS_PER_MS,
    check_records,
)

MEASUREMENT = "altmark_loss"
NS_PER_S = 1_000_000_000
UNKNOWN_NODE = "unknown"
# Batches up to this size are checked record by record in plain Python: collectors send one
# flow's records per message (usually 1), and the vectorised check_records costs ~100 us of
# numpy call overhead per call whatever the size.
SMALL_BATCH = 32
U64_MASK = (1 << 64) - 1


def record_problem(r: dict) -> str:
    """check_records() for one record as a dict of Python ints: "" or the first problem, same
    order and names (tests/processors/test_loss_record_check.py compares the two)."""
    direction, method, colour, index = r["direction"], r["method"], r["colour"], r["block_index"]
    if direction != DIR_TX and direction != DIR_RX:
        return "bad_direction"
    if method not in METHOD_NAMES:
        return "bad_method"
    if colour > 1:
        return "bad_colour"
    period_ns = r["period_ms"] * NS_PER_MS
    if not period_ns:
        return "zero_period"
    start = r["block_start_ns"]
    if start % period_ns or start // period_ns != index:
        return "bad_block_start"
    if colour != index & 1:
        return "colour_mismatch"
    if method == METHOD_RFC9343 and r["flow_id"] > FLOWMONID_MAX:
        return "flow_id_too_big"
    if r["flags"] & ~F_KNOWN:
        return "unknown_flags"
    return ""


@dataclass
class Counters:
    """Monotonic counters of the loss processor, published as segscope_processor,processor=loss."""

    records_in: int = 0  # records in well-formed batches (incl. invalid, duplicate, late)
    batches_in: int = 0  # well-formed altmark_batch messages
    malformed_batches: int = 0  # messages sent to the dead-letter topic (counted by the app)
    invalid_records: int = 0  # records failing check_records (dropped; reasons from ingest())
    duplicate_records: int = 0  # exact copies of a record already held (ignored)
    conflicting_records: int = 0  # same block and side reported with other counts or by another node
    partial_records: int = 0  # records with F_PARTIAL (their block is published incomplete)
    agent_restarts: int = 0  # new boot_ids seen per (node, direction) after its first one
    late_records_dropped: int = 0  # records for blocks already evicted (older than retention)
    replayed_records_skipped: int = 0  # replayed after a restart, of blocks already final before it
    points_out: int = 0  # altmark_loss lines emitted (re-emissions included)
    points_reemitted: int = 0  # lines for a block that had been emitted before
    blocks_complete: int = 0  # lines with complete=true
    blocks_incomplete: int = 0  # lines with complete=false
    rx_exceeds_tx: int = 0  # joined blocks with rx > tx (published incomplete)
    dmark_delays: int = 0  # complete blocks published with a double-marking delay
    dmark_mismatch: int = 0  # complete blocks with D-marked packets but tx != rx count (no delay)
    processing_errors: int = 0  # well-formed batches the app failed on (counted by the app)
    rekeyed_batches_out: int = 0  # altmark_batch messages the repartition stage produced (by flow)
    rekeyed_batches_in: int = 0  # altmark_batch messages the join stage consumed (by flow)
    blocks_handed_over: int = 0  # open blocks forgotten when their partition went to another worker
    path_unknown: int = 0  # blocks published with path=unknown (no tx-side record on segscope.paths yet)

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


FlowKey = tuple[int, int, int]  # flow_id, method, period_ms

# A block's problem (the first one noted wins), as stored in LossJoiner._problem.
PROBLEM_NAMES = (None, "partial_block", "agent_restart", "conflicting_nodes", "conflicting_records")
P_PARTIAL, P_RESTART, P_CONFLICTING_NODES, P_CONFLICTING_RECORDS = 1, 2, 3, 4
SIDES = (DIR_TX, DIR_RX)  # row 0 of the side columns: tx, row 1: rx


def loss_tags(flow_id: int, method: int, period_ms: int, tx_node: str, rx_node: str) -> str:
    """Measurement and tags of an altmark_loss line: with the timestamp, the point's identity (they
    never change between re-emissions of a block). tx_node, rx_node: escaped tag values."""
    return (
        f"{MEASUREMENT},flow={flow_id},method={METHOD_NAMES[method]},period_ms={period_ms},"
        f"tx_node={tx_node},rx_node={rx_node}"
    )


def loss_fields(
    tx_packets: int | None,
    rx_packets: int | None,
    tx_bytes: int,
    rx_bytes: int,
    reason: str | None,
    dmark: tuple[int, float] | None,
    newest_ns: int | None = None,
) -> str:
    """The field set of an altmark_loss line: a side's packets None when it is missing; reason None
    for a complete block; dmark (D-marked packets, mean delay in us) or None; newest_ns (the block's
    end in UTC ns: no packet of the block was sent later) or None for no such field."""
    newest = "" if newest_ns is None else f",newest_ns={newest_ns}i"
    if reason is None:
        lost = tx_packets - rx_packets
        ratio = f"loss_ratio={format_float(lost / tx_packets)}," if tx_packets else ""  # none without traffic
        dm = "" if dmark is None else f"dmark_packets={dmark[0]}i,dmark_delay_mean_us={format_float(dmark[1])},"
        return (
            f"tx_packets={tx_packets}i,rx_packets={rx_packets}i,lost={lost}i,{ratio}tx_bytes={tx_bytes}i,"
            f'rx_bytes={rx_bytes}i,{dm}complete=true,reason="ok"{newest}'
        )
    out = []
    if tx_packets is not None:
        out.append(f"tx_packets={tx_packets}i")
    if rx_packets is not None:
        out.append(f"rx_packets={rx_packets}i")
    if tx_packets is not None:
        out.append(f"tx_bytes={tx_bytes}i")
    if rx_packets is not None:
        out.append(f"rx_bytes={rx_bytes}i")
    out.append(f'complete=false,reason="{reason}"{newest}')
    return ",".join(out)


# the decimal text of 0 .. 2^16 - 1: most blocks' packet counts and losses are below 2^16 (a flow
# under 65 k packets per block), and a gather of these is ~5x cheaper than uint64 tolist + str
_SMALL_INT_TEXT = np.array([str(i) for i in range(1 << 16)], dtype=object)


def _decimal(column: np.ndarray) -> list:
    """Each value of a uint64 column as its decimal text (a str, or an int an f-string writes so)."""
    top = int(column.max()) if len(column) else 0
    if top < len(_SMALL_INT_TEXT):
        return _SMALL_INT_TEXT[column.astype(np.intp)].tolist()
    if top < 1 << 63:
        return column.astype(np.int64).tolist()  # int64 tolist is cheaper than uint64's
    return column.tolist()


def _complete_lines(
    tags: list[str],
    tx_packets: np.ndarray,
    rx_packets: np.ndarray,
    tx_bytes: np.ndarray,
    rx_bytes: np.ndarray,
    newest: list[str],
    tails: list[str],
) -> list[str]:
    """Lines "<tags[i]> <fields><newest[i]><tails[i]>" for many complete blocks without double
    marking (rx <= tx), column-wise: fields as loss_fields(tx, rx, tx_bytes, rx_bytes, None, None)
    writes them; newest[i]: the ",newest_ns=<ns>i" field or ""; tails[i]: " <timestamp>" or ""."""
    tx = np.asarray(tx_packets, dtype=np.uint64)
    n = len(tx)
    lost = tx - np.asarray(rx_packets, dtype=np.uint64)
    # repr once per distinct ratio (blocks without loss all share "0.0"); none without traffic
    with_ratio = tx != 0
    exact = with_ratio & (tx < np.uint64(1 << 53))  # float64 division is Python's int / int only below 2^53
    ratio = np.full(n, "", dtype=object)
    at = np.flatnonzero(exact)
    if len(at):
        with np.errstate(divide="ignore", invalid="ignore"):
            quotient = lost[at].astype(np.float64) / tx[at].astype(np.float64)
        values, inverse = np.unique(quotient, return_inverse=True)
        texts = np.array([f"loss_ratio={q!r}," for q in values.tolist()], dtype=object)
        ratio[at] = texts[inverse.ravel()]
    for i in np.flatnonzero(with_ratio & ~exact).tolist():
        ratio[i] = f"loss_ratio={int(lost[i]) / int(tx[i])!r},"
    return [
        f'{h} tx_packets={a}i,rx_packets={b}i,lost={c}i,{r}tx_bytes={d}i,rx_bytes={e}i,complete=true,reason="ok"{z}{t}'
        for h, a, b, c, r, d, e, z, t in zip(
            tags,
            _decimal(tx),
            _decimal(np.asarray(rx_packets, dtype=np.uint64)),
            _decimal(lost),
            ratio.tolist(),
            _decimal(np.asarray(tx_bytes, dtype=np.uint64)),
            _decimal(np.asarray(rx_bytes, dtype=np.uint64)),
            newest,
            tails,
        )
    ]


def complete_fields(
    tx_packets: np.ndarray,
    rx_packets: np.ndarray,
    tx_bytes: np.ndarray,
    rx_bytes: np.ndarray,
    newest_ns: list[int] | None = None,
) -> list[str]:
    """loss_fields(tx, rx, tx_bytes, rx_bytes, None, None, newest_ns) for many complete blocks
    without double marking (rx <= tx), column-wise: the common line of a flush is made by the same
    code (_complete_lines; test_loss_join_differential.py checks that the two agree; a field added
    to loss_fields must be added there too)."""
    n = len(tx_packets)
    newest = [""] * n if newest_ns is None else [f",newest_ns={x}i" for x in newest_ns]
    return [
        line[1:] for line in _complete_lines([""] * n, tx_packets, rx_packets, tx_bytes, rx_bytes, newest, [""] * n)
    ]


def dmark_delay_us(tx_sum: int, rx_sum: int, n: int) -> float:
    """Mean one-way delay of n D-marked packets from the two edges' timestamp sums (mod 2^64, signed)."""
    diff = (rx_sum - tx_sum) & U64_MASK
    if diff >= 1 << 63:
        diff -= 1 << 64  # signed: clocks may disagree
    return diff / n / 1000


def _runs(*columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Runs of consecutive rows with equal values in every column (arrays of one length; object
    arrays compare by value): the position of each run's first row, and each row's run. A flush's
    rows are in key order, so the rows of one flow series are consecutive: a series' rows with the
    same tags and path make one run, and the per-row Python work is done once per run (a fresh
    worker's first flush: 10 blocks of every new flow, 10 rows per run), found in one pass where a
    sort (np.unique) cost ~5 ms per 100 000 rows. Rows with equal values that are not consecutive
    make several runs: the same answers, asked once more."""
    n = len(columns[0])
    head = np.ones(n, dtype=bool)
    if n > 1:
        step = head[1:]
        step[:] = False
        for column in columns:
            step |= column[1:] != column[:-1]
    return np.flatnonzero(head), np.cumsum(head) - 1


def _run_ends(values: np.ndarray) -> np.ndarray:
    """Positions of the last row of each run of equal consecutive values: the last occurrence of each
    value where equal values are consecutive (a flush's flow series); otherwise more positions, in
    ascending order, so a fancy assignment by them (the last one wins) still leaves each value's
    last occurrence."""
    n = len(values)
    end = np.ones(n, dtype=bool)
    if n > 1:
        np.not_equal(values[1:], values[:-1], out=end[:-1])
    return np.flatnonzero(end)


def _objects(values: list) -> np.ndarray:
    """values as a 1-d object array (np.array would make a string array, or 2-d from tuples)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


class _Marks(dict):
    """LossJoiner.final_upto: a dict others write (the app's progress seeds); any change flags the
    joiner to re-read it into its per-series column."""

    changed = True

    def __setitem__(self, key, value):
        self.changed = True
        super().__setitem__(key, value)

    def __delitem__(self, key):
        self.changed = True
        super().__delitem__(key)

    def __ior__(self, other):
        self.changed = True
        return super().__ior__(other)

    def update(self, *args, **kwargs):
        self.changed = True
        super().update(*args, **kwargs)

    def setdefault(self, key, default=None):
        self.changed = True
        return super().setdefault(key, default)

    def pop(self, *args):
        self.changed = True
        return super().pop(*args)

    def popitem(self):
        self.changed = True
        return super().popitem()

    def clear(self):
        self.changed = True
        super().clear()


def _ring_size(retention_ns: int) -> int:
    """Slots per flow series in LossJoiner._slot_rows: the blocks a series keeps open at T = 1 s
    (retention_s of them) and a margin, a power of two, 64 to 512 (2 KiB per series)."""
    want = retention_ns // NS_PER_S + 16
    return min(512, max(64, 1 << (int(want) - 1).bit_length()))


def _repeats(series: np.ndarray, index: np.ndarray, direction: np.ndarray | None = None) -> bool:
    """True when a (series, block index[, direction]) occurs twice."""
    columns = (index, series) if direction is None else (direction, index, series)
    order = np.lexsort(columns)
    same = np.ones(len(series) - 1, dtype=bool)
    for column in columns:
        c = column[order]
        same &= c[1:] == c[:-1]
    return bool(same.any())


def _grow(owner, specs, old: int, capacity: int) -> None:
    """Grow the columns `specs` ((attribute, dtype, leading shape, fill)) of owner from old to capacity."""
    for name, dtype, shape, fill in specs:
        new = np.full(shape + (capacity,), fill, dtype=dtype)
        if old:
            new[..., :old] = getattr(owner, name)
        setattr(owner, name, new)


class LossJoiner:
    # per-side columns (shape (2, capacity): row 0 tx, row 1 rx) and their record field
    _SIDE_COLUMNS = (
        ("_boot", "boot_id", np.uint64),
        ("_packets", "packets", np.uint64),
        ("_bytes", "bytes", np.uint64),
        ("_flags", "flags", np.uint16),
        ("_dm_n", "dmark_packets", np.uint16),
        ("_dm_sum", "dmark_ts_sum_ns", np.uint64),
    )
    # per flow series (flow_id, method, period_ms), indexed by its number: what the joiner knows of it
    _SERIES_COLUMNS = (
        ("_fn_flow", np.uint32, (), 0),
        ("_fn_method", np.uint8, (), 0),
        ("_fn_period", np.uint32, (), 0),
        ("_fn_fm", np.int64, (), 0),  # number of its (flow_id, method): the flow_nodes mirror's index
        ("_fn_final", np.int64, (), -1),  # final_upto of the series (-1: none)
        ("_fn_evicted", np.int64, (), -1),  # evicted_upto of the series (-1: none)
        ("_fn_tags", object, (), None),  # the series' tags last formatted, for nodes and path:
        ("_fn_tag_nodes", np.int64, (2,), -1),  # (tx node number, rx node number)
        ("_fn_tag_path", object, (), None),
        ("_fn_path", object, (), None),  # its path tag last looked up, for the tx node and version:
        ("_fn_path_node", np.int64, (), -1),
        ("_fn_path_version", object, (), None),
        ("_fn_path_unknown", bool, (), False),  # (flow_path said None)
        ("_fn_displaced", np.int64, (), -1),  # the highest block_index of its blocks in _displaced (-1: none)
    )

    _series_in_numpy = 1 << 19  # block keys of lower series numbers fit 64 bits (64 - 45)

    def __init__(self, timeout_s: float = 10.0, retention_s: float = 300.0, tai_utc_offset_s: int = 0):
        """timeout_s: how long a block waits for its other side (from its first record) before it is
        published incomplete; retention_s: how long a block is kept for late records; tai_utc_offset_s:
        TAI - UTC (37 since 2017), subtracted from block_start_ns so points are in UTC like stamp_delay."""
        if timeout_s <= 0 or retention_s < timeout_s:
            raise ValueError(f"need 0 < timeout_s <= retention_s (got {timeout_s}, {retention_s})")
        self.tai_utc_offset_ns = int(tai_utc_offset_s) * NS_PER_S
        self.timeout_ns = int(timeout_s * NS_PER_S)
        self.retention_ns = int(retention_s * NS_PER_S)
        self.counters = Counters()
        # Where an open block's row is: a block of flow series s and index i sits in slot
        # (s, i mod R) of _slot_rows, unless a newer block of s took that slot while it was still open
        # (more than R blocks of one series open: periods below retention_s / R); it is then in
        # _displaced. No per-record Python: a dict of every open block was a quarter of this
        # worker's time (docs/benchmarks.md, loss_records), its lookups missing the CPU caches.
        self._ring = _ring_size(self.retention_ns)
        self._slot_rows = np.full((0, self._ring), -1, dtype=np.int32)
        self._displaced: dict[int, int] = {}  # block key (_block_keys) -> row, of blocks out of their slot
        self.evicted_upto: dict[FlowKey, int] = {}  # highest block_index evicted per flow (written here only)
        self.final_upto = {}  # after a restart: blocks final before it (seed_final; others write it)
        # (flow, method, direction) -> node last seen. Others may only add keys (the app's progress
        # seeds, setdefault): the joiner writes a key only when its own last write for it differs.
        self.flow_nodes: dict[tuple[int, int, int], str] = {}
        # flow_path(flow_id, tx_node) -> the tx side's path tag or None (the app: PathBook.path_for_flow)
        self.flow_path = lambda flow_id, tx_node: None
        # flow_paths([(flow_id, tx_node), ...]) -> flow_path's answer for each, or None (what setting
        # flow_path makes it): ask flow_path one by one (the app: PathBook.paths_for_flows, one lock)
        self.flow_paths = None
        # flow_path_version() -> a number that changes whenever flow_path's answers may have changed
        # (the app: PathBook.version), so answers are kept per flow series until it does; None (what
        # setting flow_path makes it): ask flow_path at every block's first publication
        self.flow_path_version = lambda: 0
        self.boots: dict[tuple[str, int], set[int]] = {}  # (node, direction) -> boot_ids seen
        self.last_flush_ns: int | None = None  # the clock of the last flush (its evictions are done)
        # keep_complete (the app sets it when the summary topic is on, processors/newest.py): each flush
        # also lists (tags, timestamp ns, line) of the complete=true lines it returns in complete_out,
        # so the summary holds them without reading the lines again
        self.keep_complete = False
        self.complete_out: list[tuple[str, int, str]] = []
        self._node_names: list[str] = []  # node number -> name (the side columns hold numbers)
        self._node_numbers: dict[str, int] = {}
        self._tags: dict[str, str] = {}  # node name -> escaped tag value
        self._tags_cache: dict[tuple, str] = {}  # (flow, method, period, tx node, rx node, path) -> tags
        # flow series: per method, the sorted flow_id << 32 | period_ms of its series and their numbers
        self._series_index: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._series_count = 0
        self._series_capacity = 0
        self._fm_numbers: dict[tuple[int, int], int] = {}  # (flow_id, method) -> its number
        self._fm_node = np.full((2, 0), -1, dtype=np.int64)  # per side: the node last written to flow_nodes
        self._free: list[int] = []  # rows of evicted blocks, reused
        self._alloc(1024)

    @property
    def flow_path(self):
        return self._flow_path

    @flow_path.setter
    def flow_path(self, flow_path) -> None:
        self._flow_path = flow_path
        self.flow_path_version = None  # a new source: its answers are not known to be stable
        self.flow_paths = None  # a bulk form of the old source would answer for it

    @property
    def final_upto(self) -> dict[FlowKey, int]:
        return self._final_upto

    @final_upto.setter
    def final_upto(self, marks: dict[FlowKey, int]) -> None:
        self._final_upto = _Marks(marks)

    def _alloc(self, capacity: int) -> None:
        """Grow the block columns to `capacity` rows (new rows are free)."""
        old = getattr(self, "_capacity", 0)
        specs = [
            (name, dtype, (), None if dtype is object else 0)
            for name, dtype in (
                ("_fn", np.int64),  # the block's flow series
                ("_flow", np.uint32),
                ("_method", np.uint8),
                ("_period", np.uint32),
                ("_index", np.uint64),
                ("_first_seen", np.int64),
                ("_used", bool),
                ("_dirty", bool),
                ("_emitted", bool),  # a line was published (the old last_line is not None)
                ("_last_complete", bool),  # the last published line said complete=true
                ("_last_rx_exceeds", bool),  # the last published line said reason rx_exceeds_tx
                ("_problem", np.int8),
                # the block's last published line (None: none yet), and its `path` tag, fixed at its
                # first publication (a re-publication stays in its series)
                ("_last_line", object),
                ("_path_tag", object),
            )
        ]
        specs += [(name, dtype, (2,), 0) for name, dtype in (("_has", bool), ("_node", np.int32))]
        specs += [(c, d, (2,), 0) for c, _, d in self._SIDE_COLUMNS]
        _grow(self, specs, old, capacity)
        self._free.extend(range(capacity - 1, old - 1, -1))  # pop() hands out low rows first
        self._capacity = capacity

    def _node_number(self, node: str) -> int:
        number = self._node_numbers.get(node)
        if number is None:
            number = self._node_numbers[node] = len(self._node_names)
            self._node_names.append(node)
        return number

    def _tag(self, node: str) -> str:
        tag = self._tags.get(node)
        if tag is None:
            tag = self._tags[node] = escape_tag(node)
        return tag

    # -- flow series and block keys ----------------------------------------

    def _series_numbers(self, records: np.ndarray) -> np.ndarray:
        """The number of each record's flow series (flow_id, method, period_ms), new ones added:
        a sorted array per method and np.searchsorted, no per-record Python."""
        method = records["method"]
        hi = (records["flow_id"].astype(np.uint64) << np.uint64(32)) | records["period_ms"].astype(np.uint64)
        first = int(method[0])
        if (method == first).all():
            return self._series_of(first, hi)
        numbers = np.empty(len(records), dtype=np.int64)
        for m in np.unique(method).tolist():
            at = method == m
            numbers[at] = self._series_of(m, hi[at])
        return numbers

    def _series_of(self, method: int, hi: np.ndarray) -> np.ndarray:
        index = self._series_index.get(method)
        if index is not None:
            keys, numbers = index
            pos = np.searchsorted(keys, hi)
            np.minimum(pos, len(keys) - 1, out=pos)
            found = keys[pos] == hi
            if found.all():
                return numbers[pos]
            new = np.unique(hi[~found])
        else:
            keys, numbers = np.empty(0, np.uint64), np.empty(0, np.int64)
            new = np.unique(hi)
        first, k = self._series_count, len(new)
        if first + k > self._series_capacity:
            capacity = max(2 * self._series_capacity, first + k, 1024)
            _grow(self, self._SERIES_COLUMNS, self._series_capacity, capacity)
            fm_node = np.full((2, capacity), -1, dtype=np.int64)
            fm_node[:, : self._fm_node.shape[1]] = self._fm_node
            self._fm_node = fm_node
            slot_rows = np.full((capacity, self._ring), -1, dtype=np.int32)
            slot_rows[: len(self._slot_rows)] = self._slot_rows
            self._slot_rows = slot_rows
            self._series_capacity = capacity
        at = slice(first, first + k)
        flows = (new >> np.uint64(32)).astype(np.uint32)
        periods = (new & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        self._fn_flow[at], self._fn_method[at], self._fn_period[at] = flows, method, periods
        fm_numbers, final, evicted = self._fm_numbers, self.final_upto, self.evicted_upto
        flow_l = flows.tolist()
        # a new (flow_id, method) gets the next number
        self._fn_fm[at] = [fm_numbers.setdefault(pair, len(fm_numbers)) for pair in zip(flow_l, repeat(method))]
        if final or evicted:
            flow_keys = list(zip(flow_l, repeat(method), periods.tolist()))
            self._fn_final[at] = list(map(final.get, flow_keys, repeat(-1))) if final else -1
            self._fn_evicted[at] = list(map(evicted.get, flow_keys, repeat(-1))) if evicted else -1
        else:
            self._fn_final[at] = self._fn_evicted[at] = -1
        self._series_count += k
        keys = np.concatenate([keys, new])
        numbers = np.concatenate([numbers, np.arange(first, first + k, dtype=np.int64)])
        order = np.argsort(keys, kind="stable")
        keys, numbers = keys[order], numbers[order]
        self._series_index[method] = (keys, numbers)
        return numbers[np.searchsorted(keys, hi)]

    def _sync_final(self) -> None:
        """Re-read final_upto into the series column after someone changed it."""
        final = self.final_upto
        final.changed = False
        n = self._series_count
        if n:
            series = zip(self._fn_flow[:n].tolist(), self._fn_method[:n].tolist(), self._fn_period[:n].tolist())
            self._fn_final[:n] = [final.get(s, -1) for s in series]

    def _block_keys(self, series: np.ndarray, index: np.ndarray) -> tuple[list[int], np.ndarray | None]:
        """One Python int per block: series number << 45 | block_index (a checked record's block_index
        is below 2^45: block_index * period_ms * 10^6 < 2^64); and the keys as a uint64 array while
        they fit 64 bits (None beyond 2^19 flow series: then they are made by Python)."""
        if len(series) and int(series.max()) >= self._series_in_numpy:
            return [s << 45 | i for s, i in zip(series.tolist(), index.tolist())], None
        keys = (series.astype(np.uint64) << np.uint64(45)) | index
        return keys.tolist(), keys

    # -- input -------------------------------------------------------------

    def ingest(self, node: str, records: np.ndarray, now_ns: int) -> dict[str, int]:
        """Take the records of one batch; returns {problem: count} of the invalid ones dropped."""
        records = np.asarray(records, dtype=ALTMARK_BLOCK_DTYPE)
        self.counters.batches_in += 1
        self.counters.records_in += len(records)
        if len(records) == 0:
            return {}
        if len(records) <= SMALL_BATCH:
            problems = [record_problem(dict(zip(ALTMARK_BLOCK_DTYPE.names, r))) for r in records.tolist()]
            bad = [i for i, p in enumerate(problems) if p]
        else:
            checked = check_records(records)
            bad = np.flatnonzero(checked != "").tolist()
            problems = checked.tolist() if bad else []
        invalid: dict[str, int] = {}
        if bad:
            for i in bad:
                invalid[problems[i]] = invalid.get(problems[i], 0) + 1
            self.counters.invalid_records += len(bad)
            keep = np.ones(len(records), dtype=bool)
            keep[bad] = False
            records = records[keep]
        self.ingest_checked(node, records, now_ns)
        return invalid

    def ingest_checked(self, node: str, records: np.ndarray, now_ns: int) -> None:
        """Take records that passed check_records (the repartition stage checked them), without
        counting them as input again."""
        n = len(records)
        if n == 0:
            return
        index = records["block_index"]
        period_ns = records["period_ms"].astype(np.uint64) * np.uint64(NS_PER_MS)
        if not period_ns.all() or (index > np.uint64(U64_MASK) // np.maximum(period_ns, np.uint64(1))).any():
            # the block keys and timestamps below rely on block_index * period < 2^64
            raise ValueError("ingest_checked: records that fail check_records (zero_period, bad_block_start)")
        if self.final_upto.changed:
            self._sync_final()
        series = self._series_numbers(records)
        unique = n == 1 or not _repeats(series, index)  # no block twice in the batch
        if not unique and _repeats(series, index, records["direction"]):
            # one side of a block twice in the batch: the second copy must see the first one
            for i in range(n):
                self._ingest(node, records[i : i + 1], series[i : i + 1], now_ns, True)
        else:
            self._ingest(node, records, series, now_ns, unique)

    def _note_boots(self, node: str, records: np.ndarray) -> None:
        # a set, not the last value: a late record of the previous boot is not another restart
        direction, boot = records["direction"], records["boot_id"]
        first = int(direction[0])
        per_direction = (
            [(first, boot)] if (direction == first).all() else [(d, boot[direction == d]) for d in np.unique(direction)]
        )
        for d, boots_of in per_direction:
            b0 = int(boots_of[0])
            boots = {b0} if (boots_of == b0).all() else set(np.unique(boots_of).tolist())
            seen = self.boots.setdefault((node, int(d)), set())
            if boots <= seen:
                continue
            new = boots - seen
            self.counters.agent_restarts += len(new) - (0 if seen else 1)
            seen |= new

    def _ingest(self, node: str, records: np.ndarray, series: np.ndarray, now_ns: int, unique: bool) -> None:
        """Records whose (block, side) pairs are all different (unique: their blocks too)."""
        c = self.counters
        self._note_boots(node, records)
        rows = self._open_rows(series, records["block_index"])
        new = np.flatnonzero(rows < 0)
        if len(new):
            drop = self._place_new_blocks(series, new, records, rows, now_ns, unique)
            if drop is not None:
                keep = rows >= 0
                records, rows, series = records[keep], rows[keep], series[keep]
                if len(rows) == 0:
                    return
        side = records["direction"].astype(np.intp) - 1
        node_no = self._node_number(node)
        flags = records["flags"]
        partial = (flags & F_PARTIAL) != 0
        n_partial = int(np.count_nonzero(partial))
        c.partial_records += n_partial
        code = np.where(partial, P_PARTIAL, 0).astype(np.int8) if n_partial else np.zeros(len(rows), np.int8)
        held = self._has[side, rows]
        if not held.any():
            self._fill(node, node_no, records, side, rows, series)
        else:
            f = np.flatnonzero(~held)
            if len(f):
                self._fill(node, node_no, records[f], side[f], rows[f], series[f])
            h = np.flatnonzero(held)
            hs, hr, hrec = side[h], rows[h], records[h]
            same_node = self._node[hs, hr] == node_no
            same_boot = self._boot[hs, hr] == hrec["boot_id"]
            same_counts = np.ones(len(h), dtype=bool)
            for column, field_name, _ in self._SIDE_COLUMNS[1:]:
                same_counts &= getattr(self, column)[hs, hr] == hrec[field_name]
            duplicate = same_node & same_boot & same_counts
            conflict = np.select(
                [~same_node, ~same_boot, ~same_counts], [P_CONFLICTING_NODES, P_RESTART, P_CONFLICTING_RECORDS], 0
            )
            c.duplicate_records += int(np.count_nonzero(duplicate))
            c.conflicting_records += int(np.count_nonzero((conflict == P_CONFLICTING_NODES)))
            c.conflicting_records += int(np.count_nonzero((conflict == P_CONFLICTING_RECORDS)))
            code[h] = np.where(code[h] == 0, conflict, code[h])  # F_PARTIAL is noted first
        noted = np.flatnonzero(code)
        if len(noted):
            # first problem wins: per block the first record (batch order) that notes one
            block_rows, first = np.unique(rows[noted], return_index=True)
            self._dirty[block_rows] = True
            current = self._problem[block_rows]
            self._problem[block_rows] = np.where(current == 0, code[noted][first], current)

    def _place_new_blocks(
        self,
        series: np.ndarray,
        new: np.ndarray,
        records: np.ndarray,
        rows: np.ndarray,
        now_ns: int,
        unique: bool,
    ):
        """Rows for the records of blocks not open: skipped (final before a restart), late (evicted)
        or a new block. Sets rows[i] (-1 = dropped); returns None when nothing was dropped.
        Whether a record is skipped or late depends on its block only, so every record of such a
        block in the batch is dropped and counted, as one by one. unique: no block twice in records."""
        c = self.counters
        all_new = len(new) == len(records)
        new_series = series if all_new else series[new]
        index = records["block_index"] if all_new else records["block_index"][new]
        dropped = None
        skipped, late = (self._fn_final, "replayed_records_skipped"), (self._fn_evicted, "late_records_dropped")
        for marks, counter in (skipped, late):
            # published by the worker before a restart / evicted: index <= the series' mark
            mark = marks[new_series]
            hit = (mark >= 0) & (index <= mark.astype(np.uint64))
            if dropped is not None:
                hit &= ~dropped
            if hit.any():
                setattr(c, counter, getattr(c, counter) + int(np.count_nonzero(hit)))
                dropped = hit if dropped is None else dropped | hit
        if dropped is not None:
            kept = np.flatnonzero(~dropped)
            if len(kept) == 0:
                return True
            new = new[kept]
            all_new = False
        if unique:
            src = new  # every record is its block's first
        else:
            # one row per block: the first record of each block in the batch fills its key columns
            new_series, new_index = series[new], records["block_index"][new]
            order = np.lexsort((new, new_index, new_series))
            s_sorted, i_sorted = new_series[order], new_index[order]
            first = np.ones(len(new), dtype=bool)
            first[1:] = (s_sorted[1:] != s_sorted[:-1]) | (i_sorted[1:] != i_sorted[:-1])
            src = np.sort(new[order[first]])
        k = len(src)
        if len(self._free) < k:
            self._alloc(max(2 * self._capacity, self._capacity + k))
        free = self._free
        at_l = free[len(free) - k :]
        del free[len(free) - k :]
        at = np.array(at_l, dtype=np.intp)
        first_records = records[src]
        self._fn[at] = series[src]
        self._flow[at] = first_records["flow_id"]
        self._method[at] = first_records["method"]
        self._period[at] = first_records["period_ms"]
        self._index[at] = first_records["block_index"]
        self._first_seen[at] = now_ns
        self._used[at] = True
        self._dirty[at] = True
        self._emitted[at] = self._last_complete[at] = self._last_rx_exceeds[at] = False
        self._problem[at] = 0
        self._has[:, at] = False
        self._enter(at)
        if unique:
            rows[new] = at
        else:
            rows[new] = self._open_rows(series[new], records["block_index"][new])
        return True if dropped is not None else None

    def _slot(self, index: np.ndarray) -> np.ndarray:
        """The slot of each block index in its series' row of _slot_rows."""
        return (index & np.uint64(self._ring - 1)).astype(np.intp)

    def _open_rows(self, series: np.ndarray, index: np.ndarray) -> np.ndarray:
        """The row of each (flow series, block index)'s open block, -1 where none is open."""
        rows = self._slot_rows[series, self._slot(index)].astype(np.intp)
        held = np.maximum(rows, 0)
        found = (rows >= 0) & (self._fn[held] == series) & (self._index[held] == index)
        rows[~found] = -1
        if self._displaced:
            # only a series' blocks up to its highest displaced one can be out of their slot
            maybe = np.flatnonzero(~found & (index.astype(np.int64) <= self._fn_displaced[series]))
            if len(maybe):
                keys = self._block_keys(series[maybe], index[maybe])[0]
                rows[maybe] = list(map(self._displaced.get, keys, repeat(-1)))
        return rows

    def _enter(self, rows: np.ndarray) -> None:
        """Put new open blocks (their _fn and _index set) in their slots; a block that held one moves
        to _displaced (still open: a newer block of its series came within retention_s)."""
        series, slot = self._fn[rows], self._slot(self._index[rows])
        held = self._slot_rows[series, slot]
        out = held >= 0
        if out.any():
            self._displace(held[out].astype(np.intp))
        self._slot_rows[series, slot] = rows
        lost = self._slot_rows[series, slot] != rows  # two new blocks of one series on one slot
        if lost.any():
            self._displace(rows[lost])

    def _displace(self, rows: np.ndarray) -> None:
        series, index = self._fn[rows], self._index[rows]
        self._displaced.update(zip(self._block_keys(series, index)[0], rows.tolist()))
        np.maximum.at(self._fn_displaced, series, index.astype(np.int64))

    def _fill(
        self, node: str, node_no: int, records: np.ndarray, side: np.ndarray, rows: np.ndarray, series: np.ndarray
    ) -> None:
        """Store sides that were missing."""
        self._has[side, rows] = True
        self._node[side, rows] = node_no
        for column, field_name, _ in self._SIDE_COLUMNS:
            getattr(self, column)[side, rows] = records[field_name]
        self._dirty[rows] = True
        # flow_nodes: written only where the joiner's own last write for the (flow, method, side) differs
        fm = self._fn_fm[series]
        changed = np.flatnonzero(self._fm_node[side, fm] != node_no)
        if len(changed):
            self._fm_node[side[changed], fm[changed]] = node_no
            if len(changed) > 64:
                # one key per (flow, method, side), not per record: a fresh flow's blocks of a batch all
                # differ from the mirror (it is written above, after the comparison)
                changed = changed[np.unique(fm[changed] * 2 + side[changed], return_index=True)[1]]
            ch = records[changed]
            self.flow_nodes.update(
                dict.fromkeys(zip(ch["flow_id"].tolist(), ch["method"].tolist(), ch["direction"].tolist()), node)
            )

    # -- output ------------------------------------------------------------

    def flush(self, now_ns: int) -> list[str]:
        """Lines for blocks that became publishable or changed since last published; evicts old blocks."""
        n = self._capacity
        used = self._used[:n]
        ready = used & ((self._has[0] & self._has[1]) | (now_ns - self._first_seen >= self.timeout_ns))
        rows = np.flatnonzero(ready & (self._dirty | ~self._emitted))
        lines: list[str] = []
        self.complete_out = []
        if len(rows):
            # in key order; a block's tags come from what is known when it changes, so an old block
            # is not re-published under another series when a later block teaches a node
            rows = rows[np.lexsort((self._index[rows], self._period[rows], self._method[rows], self._flow[rows]))]
            self._dirty[rows] = False
            self._lines(rows, lines)
        self._evict(now_ns)
        self.last_flush_ns = now_ns
        return lines

    def _series_tags(self, rows: np.ndarray, has_tx: np.ndarray, has_rx: np.ndarray) -> list[str]:
        """The tags of each row's line: its series, its sides' nodes (a missing side: the node last
        seen on that side of the flow), its path (looked up at the block's first publication).
        Kept per flow series with the nodes and path they were made for."""
        series = self._fn[rows]
        sides = np.where([has_tx, has_rx], self._node[:, rows], -1).astype(np.int64)
        missing = np.flatnonzero(~(has_tx & has_rx)).tolist()
        if missing:
            known = self.flow_nodes
            flow_l, method_l = self._flow[rows].tolist(), self._method[rows].tolist()
            number = self._node_number
            for side, has, direction in ((0, has_tx, DIR_TX), (1, has_rx, DIR_RX)):
                for i in np.flatnonzero(~has).tolist():
                    sides[side, i] = number(known.get((flow_l[i], method_l[i], direction), UNKNOWN_NODE))
        path_tag = self._path_tag
        paths = path_tag[rows]
        fresh = np.flatnonzero(paths == None)  # noqa: E711 - elementwise on an object array
        if len(fresh):
            version = None if self.flow_path_version is None else self.flow_path_version()
            if version is None:
                names = self._node_names
                flows, tx_nodes, row_l = self._flow[rows].tolist(), sides[0].tolist(), rows.tolist()
                for i in fresh.tolist():
                    tx_node = names[tx_nodes[i]]
                    paths[i] = path_tag[row_l[i]] = self.loss_path_tag(
                        flows[i], None if tx_node == UNKNOWN_NODE else tx_node
                    )
            else:
                self._cached_paths(rows, series, sides[0], fresh, version, paths)
        tags = self._fn_tags[series]
        stale = np.flatnonzero(
            (self._fn_tag_nodes[0, series] != sides[0])
            | (self._fn_tag_nodes[1, series] != sides[1])
            | (self._fn_tag_path[series] != paths)
        )
        if len(stale):
            tags_cache = self._tags_cache
            if len(tags_cache) > 1_000_000:  # flows come and go: do not grow without end
                tags_cache.clear()
            s_st, tx_st, rx_st, path_st = series[stale], sides[0, stale], sides[1, stale], paths[stale]
            # rows with the same tags (series, nodes, path) as runs of consecutive rows: a row whose
            # path differs from the row before it in its series (it changed between blocks) starts a run
            rep, rep_of = _runs(s_st, tx_st, rx_st, path_st)
            made = self._made_tags(s_st[rep], tx_st[rep], rx_st[rep], path_st[rep])
            made_tags = _objects(made)[rep_of]
            tags[stale] = made_tags
            # what each series' tags were last made for: its last stale row's (as row by row)
            last = _run_ends(s_st)
            at = s_st[last]
            self._fn_tags[at] = made_tags[last]
            self._fn_tag_nodes[0, at], self._fn_tag_nodes[1, at] = tx_st[last], rx_st[last]
            self._fn_tag_path[at] = path_st[last]
        return tags.tolist()

    def _made_tags(self, series, tx_nodes, rx_nodes, paths) -> list[str]:
        """The tags of each (series, tx node, rx node, path): from the tags cache, or formatted."""
        tags_cache = self._tags_cache
        node_tags = [self._tag(name) for name in self._node_names]
        keys = list(zip(series.tolist(), tx_nodes.tolist(), rx_nodes.tolist(), paths.tolist()))
        made = list(map(tags_cache.get, keys))
        miss = [i for i, tag in enumerate(made) if tag is None]
        if miss:
            at = series[miss]
            columns = (self._fn_flow[at].tolist(), self._fn_method[at].tolist(), self._fn_period[at].tolist())
            for i, flow, method, period in zip(miss, *columns):
                key = keys[i]
                tag = tags_cache.get(key)  # the same key twice among the new ones
                if tag is None:
                    _, tx_no, rx_no, path = key
                    tag = tags_cache[key] = (
                        loss_tags(flow, method, period, node_tags[tx_no], node_tags[rx_no]) + f",path={path}"
                    )
                made[i] = tag
        return made

    def _cached_paths(
        self, rows: np.ndarray, series: np.ndarray, tx_nodes: np.ndarray, fresh: np.ndarray, version, paths
    ) -> None:
        """loss_path_tag() for the rows `fresh` (first publication), asked once per flow series and tx
        node while flow_path_version() stays `version`; sets paths[fresh] and the rows' path tags."""
        s, tx = series[fresh], tx_nodes[fresh]
        found = (self._fn_path_version[s] == version) & (self._fn_path_node[s] == tx)
        path_of, unknown = self._fn_path[s], self._fn_path_unknown[s]
        miss = np.flatnonzero(~found)
        if len(miss):
            names = self._node_names
            # once per run of one (series, tx node) among the rows, not per row; once per (flow, tx node)
            first, group = _runs(s[miss], tx[miss])
            one = miss[first]
            keys = list(zip(self._fn_flow[s[one]].tolist(), tx[one].tolist()))
            asked: dict[tuple[int, int], tuple[str, bool] | None] = dict.fromkeys(keys)  # -> (path tag, unknown)
            questions = [(flow, None if names[t] == UNKNOWN_NODE else names[t]) for flow, t in asked]
            if self.flow_paths is not None:
                answers = self.flow_paths(questions)
            else:
                flow_path = self.flow_path
                answers = [flow_path(flow, tx_node) for flow, tx_node in questions]
            escaped: dict[str, str] = {}  # flows share their paths
            for key, path in zip(list(asked), answers):
                if path is None:
                    asked[key] = (UNKNOWN_NODE, True)
                else:
                    tag = escaped.get(path)
                    if tag is None:
                        tag = escaped[path] = escape_tag(path)
                    asked[key] = (tag, False)
            got = [asked[key] for key in keys]
            got_path = [answer[0] for answer in got]
            got_unknown = [answer[1] for answer in got]
            path_of[miss] = _objects(got_path)[group]
            unknown[miss] = np.array(got_unknown, dtype=bool)[group]
            last = miss[_run_ends(s[miss])]
            at = s[last]
            self._fn_path[at], self._fn_path_node[at], self._fn_path_version[at] = path_of[last], tx[last], version
            self._fn_path_unknown[at] = unknown[last]
        self.counters.path_unknown += int(np.count_nonzero(unknown))
        paths[fresh] = path_of
        self._path_tag[rows[fresh]] = path_of

    def _block_starts(self, rows: np.ndarray) -> np.ndarray:
        """Each row's block start, TAI ns (uint64: < 2^64, ingest_checked)."""
        return self._index[rows] * (self._period[rows].astype(np.uint64) * np.uint64(NS_PER_MS))

    def _times(self, rows: np.ndarray, start: np.ndarray) -> tuple[list[str], list[str]]:
        """Per row: the line's timestamp (block start `start`, as UTC ns) and its ",newest_ns=<block
        end>i" field; formatted once per distinct (start, period): every flow's blocks start at the
        same instants."""
        period = self._period[rows]
        order = np.lexsort((period, start))
        s_sorted, p_sorted = start[order], period[order]
        head = np.empty(len(rows), dtype=bool)
        head[0] = True
        np.not_equal(s_sorted[1:], s_sorted[:-1], out=head[1:])
        head[1:] |= p_sorted[1:] != p_sorted[:-1]
        group = np.empty(len(rows), dtype=np.intp)
        group[order] = np.cumsum(head) - 1
        off = self.tai_utc_offset_ns
        ts_u, newest_u = [], []
        for s, p in zip(s_sorted[head].tolist(), p_sorted[head].tolist()):
            ts_u.append(f" {s - off}")
            newest_u.append(f",newest_ns={s + p * NS_PER_MS - off}i")
        return np.array(newest_u, dtype=object)[group].tolist(), np.array(ts_u, dtype=object)[group].tolist()

    def _lines(self, rows: np.ndarray, lines: list[str]) -> None:
        """Compute the lines of `rows`; append those that differ from the block's last line.
        Column-wise: the per-row Python left is the string formatting."""
        c = self.counters
        has_tx, has_rx = self._has[0, rows], self._has[1, rows]
        tx_packets, rx_packets = self._packets[0, rows], self._packets[1, rows]
        reason = self._problem[rows].astype(np.int8)
        reason[(reason == 0) & ~has_tx] = -1  # missing_tx
        reason[(reason == 0) & ~has_rx] = -2  # missing_rx
        rx_exceeds = (reason == 0) & (rx_packets > tx_packets)
        reason[rx_exceeds] = -3
        last_rx_exceeds = self._last_rx_exceeds[rows]
        c.rx_exceeds_tx += int(np.count_nonzero(rx_exceeds & ~last_rx_exceeds))
        was_done = self._last_complete[rows]
        complete = reason == 0
        # double marking, counted once per block (not per re-emission): the first complete line
        dm_tx, dm_rx = self._dm_n[0, rows], self._dm_n[1, rows]
        dmark = complete & ((dm_tx > 0) | (dm_rx > 0))
        dm_equal = dm_tx == dm_rx
        c.dmark_delays += int(np.count_nonzero(dmark & dm_equal & ~was_done))
        c.dmark_mismatch += int(np.count_nonzero(dmark & ~dm_equal & ~was_done))

        n = len(rows)
        tags = self._series_tags(rows, has_tx, has_rx)
        start = self._block_starts(rows)
        newest, ts = self._times(rows, start)
        new_l: list = [None] * n
        # complete blocks without double marking column-wise, the others one by one
        simple = complete & ~dmark
        at = np.flatnonzero(simple)
        if len(at) == n:
            new_l = _complete_lines(
                tags, tx_packets, rx_packets, self._bytes[0, rows], self._bytes[1, rows], newest, ts
            )
        elif len(at):
            r = rows[at]
            at_l = at.tolist()
            made = _complete_lines(
                [tags[i] for i in at_l],
                tx_packets[at],
                rx_packets[at],
                self._bytes[0, r],
                self._bytes[1, r],
                [newest[i] for i in at_l],
                [ts[i] for i in at_l],
            )
            for i, line in zip(at_l, made):
                new_l[i] = line
        if len(at) < n:
            reason_names = {0: None, -1: "missing_tx", -2: "missing_rx", -3: "rx_exceeds_tx"}
            reason_names.update((i, name) for i, name in enumerate(PROBLEM_NAMES) if i)
            row_l = rows.tolist()
            off = self.tai_utc_offset_ns
            for i in np.flatnonzero(~simple).tolist():
                row, why = row_l[i], int(reason[i])
                dm = None
                if dmark[i] and dm_equal[i]:
                    dm_n = int(dm_tx[i])
                    dm = (dm_n, dmark_delay_us(int(self._dm_sum[0, row]), int(self._dm_sum[1, row]), dm_n))
                htx, hrx = bool(has_tx[i]), bool(has_rx[i])
                end = int(self._index[row]) * int(self._period[row]) * NS_PER_MS + int(self._period[row]) * NS_PER_MS
                fields_ = loss_fields(
                    int(tx_packets[i]) if htx else None,
                    int(rx_packets[i]) if hrx else None,
                    int(self._bytes[0, row]),
                    int(self._bytes[1, row]),
                    reason_names[why],
                    dm,
                    end - off,
                )
                new_l[i] = f"{tags[i]} {fields_}{ts[i]}"
        new = np.empty(n, dtype=object)
        new[:] = new_l
        changed = new != self._last_line[rows]
        ch = np.flatnonzero(changed)
        if len(ch):
            crow = rows[ch]
            c.points_out += len(ch)
            c.points_reemitted += int(np.count_nonzero(self._emitted[crow]))
            done = complete[ch]
            n_done = int(np.count_nonzero(done))
            c.blocks_complete += n_done
            c.blocks_incomplete += len(ch) - n_done
            self._last_line[crow] = new[ch]
            # a block counts as done at its first complete line; a later incomplete line undoes it
            set_done = ~was_done[ch] | ~done
            self._last_complete[crow[set_done]] = done[set_done]
            exceeds = rx_exceeds[ch]
            set_exceeds = exceeds | last_rx_exceeds[ch]
            self._last_rx_exceeds[crow[set_exceeds]] = exceeds[set_exceeds]
            lines.extend(new_l if len(ch) == n else new[ch].tolist())
            if self.keep_complete and n_done:
                # the line timestamps as _times writes them; every block new and complete: no gathers
                utc = start - np.uint64(self.tai_utc_offset_ns)
                if n_done == n:
                    self.complete_out.extend(zip(tags, utc.astype(np.int64).tolist(), new_l))
                else:
                    pick = ch[done]
                    heads = [tags[i] for i in pick.tolist()]
                    self.complete_out.extend(zip(heads, utc[pick].astype(np.int64).tolist(), new[pick].tolist()))
        self._emitted[rows] = True  # (rows whose line did not change had been emitted before)

    def _evict(self, now_ns: int) -> None:
        old = np.flatnonzero(self._used & (now_ns - self._first_seen >= self.retention_ns))
        if len(old):
            series, index = self._fn[old], self._index[old]
            self._release(old)
            # per series the highest evicted block, where it is above the mark
            order = np.lexsort((index, series))
            s_sorted = series[order]
            last = np.empty(len(old), dtype=bool)
            last[-1] = True
            np.not_equal(s_sorted[1:], s_sorted[:-1], out=last[:-1])
            top_series, top_index = s_sorted[last], index[order][last]
            up = np.flatnonzero(top_index.astype(np.int64) > self._fn_evicted[top_series])
            if len(up):
                top_series, top_index = top_series[up], top_index[up]
                self._fn_evicted[top_series] = top_index
                self.evicted_upto.update(
                    zip(
                        zip(
                            self._fn_flow[top_series].tolist(),
                            self._fn_method[top_series].tolist(),
                            self._fn_period[top_series].tolist(),
                        ),
                        top_index.tolist(),
                    )
                )

    def _release(self, rows: np.ndarray) -> None:
        """Free `rows`."""
        series, index = self._fn[rows], self._index[rows]
        slot = self._slot(index)
        in_slot = self._slot_rows[series, slot] == rows
        self._slot_rows[series[in_slot], slot[in_slot]] = -1
        if not in_slot.all():
            displaced = self._displaced
            out = ~in_slot
            for key in self._block_keys(series[out], index[out])[0]:
                del displaced[key]
            if not displaced:
                self._fn_displaced[: self._series_count] = -1
        self._last_line[rows] = None
        self._path_tag[rows] = None
        self._used[rows] = False
        self._free.extend(rows.tolist())

    def loss_path_tag(self, flow_id: int, tx_node: str | None) -> str:
        """The escaped `path` tag value of a block: the tx side's SID list from segscope.paths
        (flow_path, the app's PathBook.path_for_flow), `unknown` (counted) while none names it."""
        path = self.flow_path(flow_id, tx_node)
        if path is None:
            self.counters.path_unknown += 1
            return UNKNOWN_NODE
        return escape_tag(path)

    def forget_flows(self, drop_flow) -> int:
        """Forget the open blocks of the flows for which drop_flow(flow_ids array) is True (their
        partition went to another worker, which replays their input); returns how many."""
        rows = np.flatnonzero(self._used)
        rows = rows[drop_flow(self._flow[rows])]
        if len(rows):
            self._release(rows)
            self.counters.blocks_handed_over += len(rows)
        return len(rows)

    # -- introspection -----------------------------------------------------

    def open_blocks(self) -> int:
        return int(np.count_nonzero(self._used))

    @property
    def blocks(self) -> dict[int, int]:
        """Every open block's key (_block_keys) -> its row (for tests and introspection: not cheap)."""
        rows = np.flatnonzero(self._used)
        return dict(zip(self._block_keys(self._fn[rows], self._index[rows])[0], rows.tolist()))

    def counters_line(self, ts_ns: int) -> str:
        return _counters_line(self.counters, "loss", ts_ns, {"open_blocks": self.open_blocks()})
