"""The loss joiner as it was before the vectorised line formatting and int-keyed block index
(processors/loss/join.py at b12db7a, unchanged but for this docstring): the reference that
tests/processors/test_loss_join_differential.py runs side by side with the current joiner on
random input; every line and counter must be the same. The line format (loss_tags, loss_fields)
is imported from the current joiner: one definition of the fields."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from processors.delay.aggregate import counters_line as _counters_line
from processors.delay.aggregate import escape_tag
from processors.loss.join import loss_fields, loss_tags  # the line format: one definition
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
            new = np.zeros(shape + (capacity,), dtype=dtype)
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
        self._last_line: list[str | None] = getattr(self, "_last_line", []) + [None] * (capacity - old)
        # the block's `path` tag, fixed at its first publication (a re-publication stays in its series)
        self._path_tag: list[str | None] = getattr(self, "_path_tag", []) + [None] * (capacity - old)
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
        get = self.blocks.get
        rows = np.fromiter((get(k, -1) for k in keys), dtype=np.intp, count=len(keys))
        new = np.flatnonzero(rows < 0)
        if len(new):
            drop = self._place_new_blocks(keys, new.tolist(), rows, now_ns)
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

    def _place_new_blocks(self, keys: list[BlockKey], new: list[int], rows: np.ndarray, now_ns: int):
        """Rows for the records of blocks not open: skipped (final before a restart), late (evicted)
        or a new block. Sets rows[i] (-1 = dropped); returns None when nothing was dropped."""
        c = self.counters
        final_upto, evicted_upto = self.final_upto, self.evicted_upto
        blocks, free = self.blocks, self._free
        if len(free) < len(new):
            self._alloc(max(2 * self._capacity, self._capacity + len(new)))
            free = self._free
        placed, at, firsts = [], [], []
        dropped = False
        for i in new:
            key = keys[i]
            row = blocks.get(key)  # the other side of the block, earlier in this batch
            if row is None:
                flow, index = key[:3], key[3]
                if final_upto and index <= final_upto.get(flow, -1):  # published by the worker before a restart
                    c.replayed_records_skipped += 1
                    dropped = True
                    continue
                if evicted_upto and index <= evicted_upto.get(flow, -1):
                    c.late_records_dropped += 1
                    dropped = True
                    continue
                row = blocks[key] = free.pop()
                firsts.append(key)
                at.append(row)
            placed.append(i)
        if not placed:
            return True
        rows[placed] = [blocks[keys[i]] for i in placed]
        if at:
            flow_id, method, period_ms, index = zip(*firsts)
            self._flow[at], self._method[at], self._period[at], self._index[at] = flow_id, method, period_ms, index
            self._first_seen[at] = now_ns
            self._used[at] = True
            self._dirty[at] = True
            self._emitted[at] = self._last_complete[at] = self._last_rx_exceeds[at] = False
            self._problem[at] = 0
            self._has[:, at] = False
        return True if dropped else None

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
        """Compute the lines of `rows`; append those that differ from the block's last line."""
        c = self.counters
        has_tx, has_rx = self._has[0, rows], self._has[1, rows]
        tx_packets, rx_packets = self._packets[0, rows], self._packets[1, rows]
        reason = self._problem[rows].astype(np.int8)
        reason[(reason == 0) & ~has_tx] = -1  # missing_tx
        reason[(reason == 0) & ~has_rx] = -2  # missing_rx
        rx_exceeds = (reason == 0) & (rx_packets > tx_packets)
        reason[rx_exceeds] = -3
        c.rx_exceeds_tx += int(np.count_nonzero(rx_exceeds & ~self._last_rx_exceeds[rows]))
        reason_names = {0: None, -1: "missing_tx", -2: "missing_rx", -3: "rx_exceeds_tx"}
        reason_names.update((i, name) for i, name in enumerate(PROBLEM_NAMES) if i)
        names, known, tag_of, tags_cache = self._node_names, self.flow_nodes, self._tag, self._tags_cache
        if len(tags_cache) > 1_000_000:  # flows come and go: do not grow without end
            tags_cache.clear()
        period = self._period[rows]
        ts = (self._index[rows].astype(object) * period.astype(object) * 1_000_000 - self.tai_utc_offset_ns).tolist()
        last_line, path_tag = self._last_line, self._path_tag
        columns = zip(
            rows.tolist(),
            self._flow[rows].tolist(),
            self._method[rows].tolist(),
            period.tolist(),
            has_tx.tolist(),
            has_rx.tolist(),
            self._node[0, rows].tolist(),
            self._node[1, rows].tolist(),
            tx_packets.tolist(),
            rx_packets.tolist(),
            self._bytes[0, rows].tolist(),
            self._bytes[1, rows].tolist(),
            reason.tolist(),
            self._dm_n[0, rows].tolist(),
            self._dm_n[1, rows].tolist(),
            self._last_complete[rows].tolist(),
            ts,
        )
        for row, flow, method, period_ms, htx, hrx, ntx, nrx, ptx, prx, btx, brx, why, dtx, drx, was_done, t in columns:
            dmark = None
            if why == 0 and (dtx or drx):
                first_time = not was_done  # counted once per block, not per re-emission
                if dtx == drx:
                    dmark = (dtx, dmark_delay_us(int(self._dm_sum[0, row]), int(self._dm_sum[1, row]), dtx))
                    c.dmark_delays += first_time
                else:
                    c.dmark_mismatch += first_time
            tx_node = names[ntx] if htx else known.get((flow, method, DIR_TX), UNKNOWN_NODE)
            rx_node = names[nrx] if hrx else known.get((flow, method, DIR_RX), UNKNOWN_NODE)
            path = path_tag[row]
            if path is None:
                path = path_tag[row] = self.loss_path_tag(flow, None if tx_node == UNKNOWN_NODE else tx_node)
            series = (flow, method, period_ms, tx_node, rx_node, path)
            tags = tags_cache.get(series)
            if tags is None:
                tags = loss_tags(flow, method, period_ms, tag_of(tx_node), tag_of(rx_node)) + f",path={path}"
                tags_cache[series] = tags
            end = t + period_ms * 1_000_000  # the block's end (UTC): its newest_ns
            fields_s = loss_fields(ptx if htx else None, prx if hrx else None, btx, brx, reason_names[why], dmark, end)
            line = f"{tags} {fields_s} {t}"
            if line != last_line[row]:
                c.points_out += 1
                if last_line[row] is not None:
                    c.points_reemitted += 1
                if why == 0:
                    c.blocks_complete += 1
                else:
                    c.blocks_incomplete += 1
                last_line[row] = line
                if not was_done or why != 0:
                    self._last_complete[row] = why == 0
                if why == -3 or self._last_rx_exceeds[row]:
                    self._last_rx_exceeds[row] = why == -3
                lines.append(line)
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
        blocks, last_line = self.blocks, self._last_line
        path_tag = self._path_tag
        for key, row in zip(keys, rows.tolist()):
            del blocks[key]
            last_line[row] = None
            path_tag[row] = None
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
