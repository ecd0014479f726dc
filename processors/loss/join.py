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
- Records are few (one per flow, side and period), so the loop is plain Python over .tolist().
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

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
    path_unknown: int = 0  # blocks published with path=unknown (no tx-side record on segscope.paths yet)

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class Side:
    node: str
    boot_id: int
    packets: int
    bytes: int
    flags: int
    dmark_packets: int = 0
    dmark_ts_sum_ns: int = 0


@dataclass
class Block:
    first_seen_ns: int
    sides: dict[int, Side] = field(default_factory=dict)
    problem: str | None = None
    last_line: str | None = None
    path: str | None = None  # the path tag, fixed when the block is first published (loss_path_tag)
    dirty: bool = True  # changed since its line was last computed

    def note_problem(self, reason: str) -> None:
        self.dirty = True
        if self.problem is None:
            self.problem = reason


BlockKey = tuple[int, int, int, int]  # flow_id, method, period_ms, block_index
FlowKey = tuple[int, int, int]  # flow_id, method, period_ms


class LossJoiner:
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
        self.blocks: dict[BlockKey, Block] = {}
        self.evicted_upto: dict[FlowKey, int] = {}  # highest block_index evicted per flow
        self.final_upto: dict[FlowKey, int] = {}  # after a restart: blocks final before it (seed_final)
        self.flow_nodes: dict[tuple[int, int], dict[int, str]] = {}  # (flow, method) -> dir -> node
        self.boots: dict[tuple[str, int], set[int]] = {}  # (node, direction) -> boot_ids seen
        # flow_path(flow_id, tx_node) -> the tx side's path tag or None (the app: PathBook.path_for_flow)
        self.flow_path = lambda flow_id, tx_node: None

    # -- input -------------------------------------------------------------

    def ingest(self, node: str, records: np.ndarray, now_ns: int) -> dict[str, int]:
        """Take the records of one batch; returns {problem: count} of the invalid ones dropped."""
        records = np.asarray(records, dtype=ALTMARK_BLOCK_DTYPE)
        self.counters.batches_in += 1
        self.counters.records_in += len(records)
        rows = [dict(zip(ALTMARK_BLOCK_DTYPE.names, rec)) for rec in records.tolist()]
        if len(rows) <= SMALL_BATCH:
            problems = [record_problem(r) for r in rows]
        else:
            problems = check_records(records).tolist()
        invalid: dict[str, int] = {}
        for r, problem in zip(rows, problems):
            if problem:
                invalid[problem] = invalid.get(problem, 0) + 1
                self.counters.invalid_records += 1
                continue
            self._add(node, r, now_ns)
        return invalid

    def _add(self, node: str, r: dict, now_ns: int) -> None:
        key = (r["flow_id"], r["method"], r["period_ms"], r["block_index"])
        direction = r["direction"]
        self._note_boot(node, direction, r["boot_id"])
        block = self.blocks.get(key)
        if block is None:
            if key[3] <= self.final_upto.get(key[:3], -1):  # published by the worker before a restart
                self.counters.replayed_records_skipped += 1
                return
            if key[3] <= self.evicted_upto.get(key[:3], -1):
                self.counters.late_records_dropped += 1
                return
            block = self.blocks[key] = Block(first_seen_ns=now_ns)
        side = Side(node, r["boot_id"], r["packets"], r["bytes"], r["flags"], r["dmark_packets"], r["dmark_ts_sum_ns"])
        if r["flags"] & F_PARTIAL:
            self.counters.partial_records += 1
            block.note_problem("partial_block")
        held = block.sides.get(direction)
        if held is None:
            block.sides[direction] = side
            block.dirty = True
            self.flow_nodes.setdefault(key[:2], {})[direction] = node
        elif held == side:
            self.counters.duplicate_records += 1
        elif held.node != node:
            self.counters.conflicting_records += 1
            block.note_problem("conflicting_nodes")
        elif held.boot_id != side.boot_id:
            block.note_problem("agent_restart")
        else:
            self.counters.conflicting_records += 1
            block.note_problem("conflicting_records")

    def _note_boot(self, node: str, direction: int, boot_id: int) -> None:
        # a set, not the last value: a late record of the previous boot is not another restart
        seen = self.boots.setdefault((node, direction), set())
        if boot_id not in seen:
            if seen:
                self.counters.agent_restarts += 1
            seen.add(boot_id)

    # -- output ------------------------------------------------------------

    def flush(self, now_ns: int) -> list[str]:
        """Lines for blocks that became publishable or changed since last published; evicts old blocks."""
        lines = []
        for key in sorted(self.blocks):
            block = self.blocks[key]
            ready = len(block.sides) == 2 or now_ns - block.first_seen_ns >= self.timeout_ns
            if ready and (block.dirty or block.last_line is None):
                # a block's tags come from what is known when it changes, so an old block is
                # not re-published under another series when a later block teaches a node
                block.dirty = False
                line = self._line(key, block)
                if line != block.last_line:
                    self._count_emit(block, line)
                    block.last_line = line
                    lines.append(line)
        self._evict(now_ns)
        return lines

    def _count_emit(self, block: Block, line: str) -> None:
        self.counters.points_out += 1
        if block.last_line is not None:
            self.counters.points_reemitted += 1
        if ",complete=true," in line:
            self.counters.blocks_complete += 1
        else:
            self.counters.blocks_incomplete += 1

    def _evict(self, now_ns: int) -> None:
        for key in [k for k, b in self.blocks.items() if now_ns - b.first_seen_ns >= self.retention_ns]:
            del self.blocks[key]
            flow = key[:3]
            self.evicted_upto[flow] = max(self.evicted_upto.get(flow, -1), key[3])

    def _line(self, key: BlockKey, block: Block) -> str:
        flow_id, method, period_ms, index = key
        tx, rx = block.sides.get(DIR_TX), block.sides.get(DIR_RX)
        known = self.flow_nodes.get((flow_id, method), {})
        tags = (
            f"{MEASUREMENT},flow={flow_id},method={METHOD_NAMES[method]},period_ms={period_ms},"
            f"tx_node={escape_tag(tx.node if tx else known.get(DIR_TX, UNKNOWN_NODE))},"
            f"rx_node={escape_tag(rx.node if rx else known.get(DIR_RX, UNKNOWN_NODE))}"
        ) + self.loss_path_tag(flow_id, tx.node if tx else known.get(DIR_TX), block)
        reason = block.problem
        if reason is None and tx is None:
            reason = "missing_tx"
        if reason is None and rx is None:
            reason = "missing_rx"
        if reason is None and rx.packets > tx.packets:
            reason = "rx_exceeds_tx"
            if block.last_line is None or "rx_exceeds_tx" not in block.last_line:
                self.counters.rx_exceeds_tx += 1
        fields_out = []
        if tx:
            fields_out.append(f"tx_packets={tx.packets}i")
        if rx:
            fields_out.append(f"rx_packets={rx.packets}i")
        if reason is None:
            lost = tx.packets - rx.packets
            fields_out.append(f"lost={lost}i")
            if tx.packets:  # a block without traffic has no loss ratio
                fields_out.append(f"loss_ratio={format_float(lost / tx.packets)}")
        if tx:
            fields_out.append(f"tx_bytes={tx.bytes}i")
        if rx:
            fields_out.append(f"rx_bytes={rx.bytes}i")
        if reason is None:
            fields_out += self._dmark_fields(
                tx, rx, first_time=block.last_line is None or ",complete=true," not in block.last_line
            )
        fields_out.append("complete=true" if reason is None else "complete=false")
        fields_out.append(f'reason="{reason or "ok"}"')
        ts = index * period_ms * 1_000_000 - self.tai_utc_offset_ns  # block start, TAI -> UTC
        return f"{tags} {','.join(fields_out)} {ts}"

    def loss_path_tag(self, flow_id: int, tx_node: str | None, block: Block) -> str:
        """`,path=<tx side's SID list>`: fixed at the block's first publication, so a re-publication
        stays in its series; `unknown` (counted) while no segscope.paths record names the flow."""
        if block.path is None:
            path = self.flow_path(flow_id, tx_node)
            block.path = UNKNOWN_NODE if path is None else escape_tag(path)
            if path is None:
                self.counters.path_unknown += 1
        return f",path={block.path}"

    def _dmark_fields(self, tx: Side, rx: Side, first_time: bool) -> list[str]:
        """Double-marking delay of a complete block (counted once per block, not per re-emission)."""
        n = tx.dmark_packets
        if n and n == rx.dmark_packets:
            diff = (rx.dmark_ts_sum_ns - tx.dmark_ts_sum_ns) & U64_MASK
            if diff >= 1 << 63:
                diff -= 1 << 64  # signed: clocks may disagree
            if first_time:
                self.counters.dmark_delays += 1
            return [f"dmark_packets={n}i", f"dmark_delay_mean_us={format_float(diff / n / 1000)}"]
        if (tx.dmark_packets or rx.dmark_packets) and first_time:
            self.counters.dmark_mismatch += 1
        return []

    # -- introspection -----------------------------------------------------

    def open_blocks(self) -> int:
        return len(self.blocks)

    def counters_line(self, ts_ns: int) -> str:
        return _counters_line(self.counters, "loss", ts_ns, {"open_blocks": self.open_blocks()})
