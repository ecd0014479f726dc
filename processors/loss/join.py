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
  arrays (one row per block, both sides side by side), a dict maps a block key to its row, and
  ingest() classifies and stores a whole batch with array operations (new block, skipped, late,
  side filled, duplicate, conflict). Only what line protocol needs is per block in Python:
  formatting the line (loss_fields/loss_line) and the key <-> row bookkeeping. A batch holding
  the same side of one block twice (a replay packed with its original) is taken record by record,
  so the outcome is always the sequential one.
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


BlockKey = tuple[int, int, int, int]  # flow_id, method, period_ms, block_index
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


def complete_fields(
    tx_packets: np.ndarray,
    rx_packets: np.ndarray,
    tx_bytes: np.ndarray,
    rx_bytes: np.ndarray,
    newest_ns: list[int] | None = None,
) -> list[str]:
    """loss_fields(tx, rx, tx_bytes, rx_bytes, None, None) for many complete blocks without double
    marking (rx <= tx), column-wise: the common line of a flush (test_loss_join_differential.py
    checks that the two agree; a field added to loss_fields must be added here too)."""
    tx = np.asarray(tx_packets, dtype=np.uint64)
    lost = tx - np.asarray(rx_packets, dtype=np.uint64)
    exact = tx < np.uint64(1 << 53)  # float64 division is Python's int / int only below 2^53
    with np.errstate(divide="ignore", invalid="ignore"):
        quotient = (lost.astype(np.float64) / tx.astype(np.float64)).tolist()
    lost_l, tx_l = lost.tolist(), tx.tolist()
    if not exact.all():
        for i in np.flatnonzero(~exact).tolist():
            quotient[i] = lost_l[i] / tx_l[i]
    ratio = [f"loss_ratio={q!r}," if t else "" for q, t in zip(quotient, tx_l)]
    newest = [""] * len(tx_l) if newest_ns is None else [f",newest_ns={x}i" for x in newest_ns]
    return [
        f'tx_packets={a}i,rx_packets={b}i,lost={c}i,{r}tx_bytes={d}i,rx_bytes={e}i,complete=true,reason="ok"{z}'
        for a, b, c, r, d, e, z in zip(
            tx_l,
            np.asarray(rx_packets).tolist(),
            lost_l,
            ratio,
            np.asarray(tx_bytes).tolist(),
            np.asarray(rx_bytes).tolist(),
            newest,
        )
    ]


def dmark_delay_us(tx_sum: int, rx_sum: int, n: int) -> float:
    """Mean one-way delay of n D-marked packets from the two edges' timestamp sums (mod 2^64, signed)."""
    diff = (rx_sum - tx_sum) & U64_MASK
    if diff >= 1 << 63:
        diff -= 1 << 64  # signed: clocks may disagree
    return diff / n / 1000


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
        self.blocks: dict[BlockKey, int] = {}  # open block -> its row in the columns
        self.evicted_upto: dict[FlowKey, int] = {}  # highest block_index evicted per flow
        self.final_upto: dict[FlowKey, int] = {}  # after a restart: blocks final before it (seed_final)
        self.flow_nodes: dict[tuple[int, int, int], str] = {}  # (flow, method, direction) -> node last seen
        # flow_path(flow_id, tx_node) -> the tx side's path tag or None (the app: PathBook.path_for_flow)
        self.flow_path = lambda flow_id, tx_node: None
        self.boots: dict[tuple[str, int], set[int]] = {}  # (node, direction) -> boot_ids seen
        self.last_flush_ns: int | None = None  # the clock of the last flush (its evictions are done)
        self._node_names: list[str] = []  # node number -> name (the side columns hold numbers)
        self._node_numbers: dict[str, int] = {}
        self._tags: dict[str, str] = {}  # node name -> escaped tag value
        self._tags_cache: dict[tuple, str] = {}  # (flow, method, period, tx node, rx node) -> loss_tags()
        self._free: list[int] = []  # rows of evicted blocks, reused
        self._alloc(1024)

    def _alloc(self, capacity: int) -> None:
        """Grow the columns to `capacity` rows (new rows are free)."""
        old = getattr(self, "_capacity", 0)

        def grow(name: str, dtype, shape: tuple = ()) -> None:
            new = np.full(shape + (capacity,), None) if dtype is object else np.zeros(shape + (capacity,), dtype)
            if old:
                new[..., :old] = getattr(self, name)
            setattr(self, name, new)

        for name, dtype in (
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
        ):
            grow(name, dtype)
        for name, dtype in (("_has", bool), ("_node", np.int32)) + tuple((c, d) for c, _, d in self._SIDE_COLUMNS):
            grow(name, dtype, (2,))
        # the block's last published line (None: none yet), and its `path` tag, fixed at its first
        # publication (a re-publication stays in its series): object arrays, indexed by row
        grow("_last_line", object)
        grow("_path_tag", object)
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
        keys = list(
            zip(
                records["flow_id"].tolist(),
                records["method"].tolist(),
                records["period_ms"].tolist(),
                records["block_index"].tolist(),
            )
        )
        directions = records["direction"].tolist()
        if n > 1 and len(set(zip(keys, directions))) < n:
            # one side of a block twice in the batch: the second copy must see the first one
            for i in range(n):
                self._ingest(node, records[i : i + 1], keys[i : i + 1], now_ns)
        else:
            self._ingest(node, records, keys, now_ns)

    def _note_boots(self, node: str, records: np.ndarray) -> None:
        # a set, not the last value: a late record of the previous boot is not another restart
        direction, boot = records["direction"], records["boot_id"]
        for d in np.unique(direction).tolist():
            boots = set(np.unique(boot[direction == d]).tolist())
            seen = self.boots.setdefault((node, d), set())
            new = boots - seen
            if new:
                self.counters.agent_restarts += len(new) - (0 if seen else 1)
                seen |= new

    def _ingest(self, node: str, records: np.ndarray, keys: list[BlockKey], now_ns: int) -> None:
        """Records whose (block, side) pairs are all different."""
        c = self.counters
        self._note_boots(node, records)
        rows = np.fromiter(map(self.blocks.get, keys, repeat(-1)), dtype=np.intp, count=len(keys))
        new = np.flatnonzero(rows < 0)
        if len(new):
            drop = self._place_new_blocks(keys, new, records, rows, now_ns)
            if drop is not None:
                keep = rows >= 0
                records, rows = records[keep], rows[keep]
                if len(rows) == 0:
                    return
        side = records["direction"].astype(np.intp) - 1
        node_no = self._node_number(node)
        partial = (records["flags"] & F_PARTIAL) != 0
        c.partial_records += int(np.count_nonzero(partial))
        code = np.where(partial, P_PARTIAL, 0).astype(np.int8)
        held = self._has[side, rows]
        fill = ~held
        if fill.all():
            self._fill(node, node_no, records, side, rows)
        else:
            f = np.flatnonzero(fill)
            if len(f):
                self._fill(node, node_no, records[f], side[f], rows[f])
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

    def _place_new_blocks(self, keys: list[BlockKey], new: np.ndarray, records: np.ndarray, rows: np.ndarray, now_ns):
        """Rows for the records of blocks not open: skipped (final before a restart), late (evicted)
        or a new block. Sets rows[i] (-1 = dropped); returns None when nothing was dropped.
        Whether a record is skipped or late depends on its block only, so every record of such a
        block in the batch is dropped and counted, as one by one."""
        c = self.counters
        new_l = new.tolist()
        new_keys = [keys[i] for i in new_l] if len(new_l) < len(keys) else keys
        index = records["block_index"][new]
        dropped = np.zeros(len(new_l), dtype=bool)
        for upto, counter in (
            (self.final_upto, "replayed_records_skipped"),
            (self.evicted_upto, "late_records_dropped"),
        ):
            if upto:  # published by the worker before a restart / evicted: index <= the flow's mark
                flows = [k[:3] for k in new_keys]
                mark = np.fromiter(map(upto.get, flows, repeat(-1)), dtype=np.int64, count=len(flows))
                hit = ~dropped & (mark >= 0) & (index <= mark.astype(np.uint64))
                if hit.any():
                    setattr(c, counter, getattr(c, counter) + int(np.count_nonzero(hit)))
                    dropped |= hit
        if dropped.any():
            kept = np.flatnonzero(~dropped)
            if len(kept) == 0:
                return True
            new = new[kept]
            new_keys = [new_keys[i] for i in kept.tolist()]
        # one row per block: the first record of each block in the batch fills its key columns
        first = dict(zip(reversed(new_keys), reversed(new.tolist())))
        k = len(first)
        if len(self._free) < k:
            self._alloc(max(2 * self._capacity, self._capacity + k))
        free = self._free
        at = free[len(free) - k :]
        del free[len(free) - k :]
        self.blocks.update(zip(first, at))
        src = np.fromiter(first.values(), dtype=np.intp, count=k)
        first_records = records[src]
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
        rows[new] = np.fromiter(map(self.blocks.__getitem__, new_keys), dtype=np.intp, count=len(new_keys))
        return True if dropped.any() else None

    def _fill(self, node: str, node_no: int, records: np.ndarray, side: np.ndarray, rows: np.ndarray) -> None:
        """Store sides that were missing."""
        self._has[side, rows] = True
        self._node[side, rows] = node_no
        for column, field_name, _ in self._SIDE_COLUMNS:
            getattr(self, column)[side, rows] = records[field_name]
        self._dirty[rows] = True
        self.flow_nodes.update(
            dict.fromkeys(
                zip(records["flow_id"].tolist(), records["method"].tolist(), records["direction"].tolist()), node
            )
        )

    # -- output ------------------------------------------------------------

    def flush(self, now_ns: int) -> list[str]:
        """Lines for blocks that became publishable or changed since last published; evicts old blocks."""
        n = self._capacity
        used = self._used[:n]
        ready = used & ((self._has[0] & self._has[1]) | (now_ns - self._first_seen >= self.timeout_ns))
        rows = np.flatnonzero(ready & (self._dirty | ~self._emitted))
        lines: list[str] = []
        if len(rows):
            # in key order; a block's tags come from what is known when it changes, so an old block
            # is not re-published under another series when a later block teaches a node
            rows = rows[np.lexsort((self._index[rows], self._period[rows], self._method[rows], self._flow[rows]))]
            self._dirty[rows] = False
            self._lines(rows, lines)
        self._evict(now_ns)
        self.last_flush_ns = now_ns
        return lines

    def _lines(self, rows: np.ndarray, lines: list[str]) -> None:
        """Compute the lines of `rows`; append those that differ from the block's last line.
        Column-wise: the per-row Python left is the tag lookup and the string formatting."""
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
        row_l = rows.tolist()
        flow_l, method_l, period = self._flow[rows].tolist(), self._method[rows].tolist(), self._period[rows]
        period_l = period.tolist()
        # tags: the side's node, or the node last seen on that side of the flow (missing side)
        names = np.array(self._node_names + [None], dtype=object)
        tx_nodes = names[np.where(has_tx, self._node[0, rows], -1)].tolist()
        rx_nodes = names[np.where(has_rx, self._node[1, rows], -1)].tolist()
        known = self.flow_nodes
        for i in np.flatnonzero(~has_tx).tolist():
            tx_nodes[i] = known.get((flow_l[i], method_l[i], DIR_TX), UNKNOWN_NODE)
        for i in np.flatnonzero(~has_rx).tolist():
            rx_nodes[i] = known.get((flow_l[i], method_l[i], DIR_RX), UNKNOWN_NODE)
        path_tag = self._path_tag
        paths = path_tag[rows]
        for i in np.flatnonzero(paths == None).tolist():  # noqa: E711 - elementwise on an object array
            tx_node = tx_nodes[i]
            paths[i] = path_tag[row_l[i]] = self.loss_path_tag(flow_l[i], None if tx_node == UNKNOWN_NODE else tx_node)
        tags_cache, tag_of = self._tags_cache, self._tag
        if len(tags_cache) > 1_000_000:  # flows come and go: do not grow without end
            tags_cache.clear()
        series = list(zip(flow_l, method_l, period_l, tx_nodes, rx_nodes, paths.tolist()))
        tags = list(map(tags_cache.get, series))
        for i in [i for i, t in enumerate(tags) if t is None]:
            flow, method, period_ms, tx_node, rx_node, path = series[i]
            tags[i] = tags_cache[series[i]] = (
                loss_tags(flow, method, period_ms, tag_of(tx_node), tag_of(rx_node)) + f",path={path}"
            )
        off = self.tai_utc_offset_ns
        ts = (self._index[rows].astype(object) * period.astype(object) * 1_000_000 - off).tolist()
        ends = [t + p * 1_000_000 for t, p in zip(ts, period_l)]  # the blocks' ends (UTC): newest_ns
        # fields: complete blocks without double marking column-wise, the others one by one
        fields_l: list = [None] * n
        simple = complete & ~dmark
        at = np.flatnonzero(simple)
        if len(at):
            r = rows[at]
            for i, f in zip(
                at.tolist(),
                complete_fields(
                    tx_packets[at], rx_packets[at], self._bytes[0, r], self._bytes[1, r], [ends[i] for i in at.tolist()]
                ),
            ):
                fields_l[i] = f
        reason_names = {0: None, -1: "missing_tx", -2: "missing_rx", -3: "rx_exceeds_tx"}
        reason_names.update((i, name) for i, name in enumerate(PROBLEM_NAMES) if i)
        for i in np.flatnonzero(~simple).tolist():
            row, why = row_l[i], int(reason[i])
            dm = None
            if dmark[i] and dm_equal[i]:
                dm_n = int(dm_tx[i])
                dm = (dm_n, dmark_delay_us(int(self._dm_sum[0, row]), int(self._dm_sum[1, row]), dm_n))
            htx, hrx = bool(has_tx[i]), bool(has_rx[i])
            fields_l[i] = loss_fields(
                int(tx_packets[i]) if htx else None,
                int(rx_packets[i]) if hrx else None,
                int(self._bytes[0, row]),
                int(self._bytes[1, row]),
                reason_names[why],
                dm,
                ends[i],
            )
        new = np.array([f"{t} {f} {s}" for t, f, s in zip(tags, fields_l, ts)], dtype=object)
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
            lines.extend(new[ch].tolist())
        self._emitted[rows] = True  # (rows whose line did not change had been emitted before)

    def _evict(self, now_ns: int) -> None:
        old = np.flatnonzero(self._used & (now_ns - self._first_seen >= self.retention_ns))
        if len(old):
            evicted_upto = self.evicted_upto
            for key in self._release(old):
                flow = key[:3]
                if key[3] > evicted_upto.get(flow, -1):
                    evicted_upto[flow] = key[3]

    def _release(self, rows: np.ndarray) -> list[BlockKey]:
        """Free `rows`; returns their block keys."""
        keys = list(
            zip(
                self._flow[rows].tolist(),
                self._method[rows].tolist(),
                self._period[rows].tolist(),
                self._index[rows].tolist(),
            )
        )
        blocks = self.blocks
        for key in keys:
            del blocks[key]
        self._last_line[rows] = None
        self._path_tag[rows] = None
        self._used[rows] = False
        self._free.extend(rows.tolist())
        return keys

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
        return len(self.blocks)

    def counters_line(self, ts_ns: int) -> str:
        return _counters_line(self.counters, "loss", ts_ns, {"open_blocks": self.open_blocks()})
