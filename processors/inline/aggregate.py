"""Per-second in-line IOAM aggregation: the pure, Kafka-free core of the in-line processor.

Input: the records of one decoded ioam_batch (numpy array of IOAM_RECORD_DTYPE, from
segscope_schemas.ioam_record.decode_batch) and the batch's node (the egress edge). Output:
InfluxDB line protocol (schemas/metrics.md): per flow and TAI second of the packets' transmit time
`inline_delay` + `inline_delay_histogram` (one-way delay rx - tx of the sampled packets),
`inline_loss` (from the E2E sequence numbers) and one `inline_hop_delay` per hop of the path
(processors/inline/hops.py names the hops).

Design (processors/delay/aggregate.py is the model; the statistics are its code):
- ingest() is the per-message path: a handful of numpy operations per flow of the batch (check,
  reordered flags, signature ids, transit times), then array chunks appended to the (flow, second)
  accumulators. A chunk holds one row per field and one column per record: seq, rx, tx, flags,
  signature id, then the transit nodes' receive times (TAI ns) in path order. No per-record Python.
- A second closes when the flow's watermark (largest tx seen, or CLOCK_TAI once the flow has been
  idle for idle_s) passes its end + grace_s; it stays in memory retention_s (data time) after its
  end, and a record arriving for it meanwhile re-opens it: the next flush emits the whole second
  again with the same identity, InfluxDB overwrites (the delay processor's rules). Later records
  are dropped and counted (late_records_dropped).
- Copies: a record read twice (a replay after a restart or rebalance: same seq and rx time) is
  dropped and counted (duplicate_records); a packet the network delivered twice (same seq, another
  rx time) is a duplicate of the flow: counted in inline_loss `duplicated`, its first arrival is
  the one measured.
- Loss: seq and tx time both grow with every sampled packet at the ingress, so the seqs of a
  second follow those of the second before. The received seqs of a second, taken above the last
  seq accounted before it, account for everything up to its highest: lost = the seqs in between
  never received, attributed to the second of the next seq received (the packet that shows the
  gap); received + lost = highest - previous highest, so over a flow every seq up to the highest
  received is counted exactly once. The accounting starts at the smallest seq of the first second
  the processor holds of a flow (it cannot tell packets lost at the start from packets sent before
  it ran) and continues, across restarts, from the progress the processor writes (base_seq). A
  seq is lost when it was not received within the reorder window: until its second is evicted
  (retention_s of data time after its end); until then a late arrival turns it into received
  (and reordered) and the seconds it changes are emitted again. A received seq at or below the
  accounted one (the monitor was re-installed and started from 0 again, or the ingress clock
  stepped) is not accounted (`seqs_not_accounted`, counted when its second is final): neither
  received, nor lost, nor reordered.
- A record refused by ioam_record.problem_codes, or whose transmit time is more than max_future_s
  beyond CLOCK_TAI (it would hold its second, and the input behind it, open until then), is not
  taken: ingest() returns the count per reason for the caller's dead letter.
- Reordered (RFC 4737): a packet whose seq is below the highest seq received before it, in the
  order the egress received them (the input order of the flow: one partition, streamer order),
  flagged at ingest.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from processors.delay.aggregate import (
    NS_PER_S,
    UNKNOWN_PATH,
    clock_tai_ns,
    direction_fields,
    escape_tag,
    format_float,
)
from processors.inline import hops as hp
from segscope_schemas.batch_envelope import join_records
from segscope_schemas.ioam_record import (
    IOAM_RECORD_F_TRUNCATED,
    IOAM_RECORD_MAX_NODES,
    RECORD_PROBLEMS,
    entry_words,
    problem_codes,
)

DELAY = "inline_delay"
HISTOGRAM = "inline_delay_histogram"
HOP_DELAY = "inline_hop_delay"
LOSS = "inline_loss"

SEQ, RX, TX, FLAGS, SIG, FIRST_TRANSIT = hp.SEQ, hp.RX, hp.TX, hp.FLAGS, hp.SIG, hp.FIRST_TRANSIT
F_REORDERED = 1  # FLAGS row: the seq was below the highest received before it
F_COUNTED = 2  # FLAGS row: emitted before (its negative and absurd delays were counted then)
_SIG_WORDS = 5 + 2 * IOAM_RECORD_MAX_NODES
# the reasons a record is refused: check_records' and one of the processor's own
PROBLEMS = RECORD_PROBLEMS + ("future_timestamp",)  # tx beyond CLOCK_TAI now + max_future_s
FUTURE_CODE = len(PROBLEMS)


@dataclass
class Counters:
    """Monotonic counters of the in-line processor, published as segscope_processor,processor=inline."""

    records_in: int = 0  # records in well-formed ioam_batch messages (invalid, duplicate, late included)
    batches_in: int = 0  # well-formed ioam_batch messages
    malformed_batches: int = 0  # messages that are not an ioam_batch (dead-lettered)
    invalid_records: int = 0  # records failing check_records (dropped; their message dead-lettered)
    duplicate_records: int = 0  # records read twice (same flow, seq and rx time): dropped
    late_records_dropped: int = 0  # records for a second already evicted (older than the retention)
    replayed_records_skipped: int = 0  # replayed after a restart, of seconds already final before it
    future_records: int = 0  # of invalid_records: tx beyond CLOCK_TAI now + max_future_s (future_timestamp)
    processing_errors: int = 0  # well-formed batches the app failed on (dead-lettered)
    points_out: int = 0  # inline_delay lines (re-emissions included)
    histogram_points_out: int = 0  # inline_delay_histogram lines
    loss_points_out: int = 0  # inline_loss lines
    hop_points_out: int = 0  # inline_hop_delay lines (measured, not measured and spans)
    hop_points_not_measured: int = 0  # of those, measured=false
    seconds_reemitted: int = 0  # closed seconds emitted again (late records, or a loss change)
    negative_delays: int = 0  # one-way delays < 0 (the edges' clocks disagree)
    absurd_delays: int = 0  # one-way delays with |delay| > absurd_threshold (kept)
    negative_hop_delays: int = 0  # hop delays < 0 (two nodes' clocks disagree; kept)
    truncated_records: int = 0  # records without their ingress entry (F_TRUNCATED): no hop delays
    hop_limit_inconsistent_records: int = 0  # records whose hop limits do not fall along the trace
    hop_from_if_unresolved: int = 0  # inline_hop_delay points with from_if=unknown at a transit node
    seqs_not_accounted: int = 0  # received seqs at or below the accounted one (final seconds only)
    path_unknown: int = 0  # inline_delay points with path=unknown

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class LossFields:
    received: int = 0
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    bursts: int = 0
    burst_max: int = 0
    not_accounted: int = 0
    last_seq: int | None = None  # the highest seq accounted up to the end of this second

    def text(self) -> str:
        total = self.received + self.lost
        ratio = f",loss_ratio={format_float(self.lost / total)}" if total else ""
        return (
            f"received={self.received}i,lost={self.lost}i,duplicated={self.duplicated}i,reordered={self.reordered}i,"
            f"loss_bursts={self.bursts}i,loss_burst_max={self.burst_max}i{ratio}"
        )


class SecondAccumulator:
    """The records of one (flow, second): merged (distinct (seq, rx), sorted) + chunks not merged yet."""

    __slots__ = ("second", "merged", "pending", "newest_tx_ns", "emitted", "dirty", "tags", "hop_tags", "plans",
                 "loss", "loss_emitted", "seqs", "duplicated", "reordered_flags")  # fmt: skip

    def __init__(self, second: int):
        self.second = second
        self.merged: np.ndarray | None = None  # rows SEQ.. x distinct (seq, rx), sorted by seq then rx
        self.pending: list[np.ndarray] = []
        self.newest_tx_ns = -1
        self.emitted = False
        self.dirty = False
        self.tags: str | None = None  # flow,ingress,egress,path: fixed at the first emission
        self.hop_tags: str | None = None  # flow,path of the hop lines
        self.plans: dict[int, hp.Plan] = {}  # signature id -> plan, fixed when first used here
        self.loss: LossFields | None = None
        self.loss_emitted: LossFields | None = None
        self.seqs: np.ndarray | None = None  # distinct seqs received in the second, sorted
        self.duplicated = 0
        self.reordered_flags: np.ndarray | None = None  # per seq of `seqs`: flagged reordered at ingest


@dataclass
class FlowState:
    node: str  # the egress edge (batch node)
    flow_id: int
    watermark_ns: int = -1  # largest tx seen
    last_ingest_tai_ns: int = 0  # wall clock (CLOCK_TAI) of the last batch with records
    horizon_s: int = -(2**62)  # seconds below were evicted: their records are dropped
    final_below_s: int = -(2**62)  # seconds below were final before a restart (progress)
    base_seq: int | None = None  # the highest seq accounted in evicted (final) seconds
    final_s: int = -(2**62)  # the horizon at the last eviction of a second: what progress says is final
    max_seq_seen: int = -(2**63)  # the highest seq ingested: the reordered flag
    seconds: dict[int, SecondAccumulator] = field(default_factory=dict)


class InlineAggregator:
    def __init__(
        self,
        grace_s: float = 0.5,
        retention_s: float = 10.0,
        idle_s: float | None = 2.0,
        absurd_threshold_s: float = 10.0,
        max_future_s: float = 10.0,
        tai_utc_offset_s: int = 0,
        book: hp.Book | None = None,
    ):
        """book: what names nodes, interfaces and paths (processors/paths.py PathBook); without it
        every name comes from the ids and path=unknown. idle_s: wall-clock silence after which a
        flow's seconds close by the clock (at least grace_s)."""
        if grace_s < 0 or retention_s < grace_s:
            raise ValueError("need 0 <= grace_s <= retention_s")
        self.grace_ns = int(grace_s * NS_PER_S)
        self.idle_ns = max(self.grace_ns, int((idle_s or 0) * NS_PER_S))
        self.retention_ns = int(retention_s * NS_PER_S)
        self.absurd_threshold_ns = int(absurd_threshold_s * NS_PER_S)
        self.max_future_ns = int(max_future_s * NS_PER_S)
        self.tai_utc_offset_s = int(tai_utc_offset_s)
        self.book = book or hp.NoBook()
        self.flows: dict[tuple[str, int], FlowState] = {}
        self.final_seeds: dict[tuple[str, int], tuple[int, int]] = {}  # (final_below_s, base_seq) of flows not seen
        self.signatures: list[hp.Signature] = []
        self._signature_ids: dict[bytes, int] = {}
        self.counters = Counters()

    # -- per message ------------------------------------------------------

    def ingest(
        self, node: str, records: np.ndarray, now_tai_ns: int | None = None
    ) -> tuple[dict[str, int], dict[tuple[str, int], int]]:
        """Fold one ioam_batch's records into the accumulators. Returns (the problems of the records
        it refused: reason -> count, the caller dead-letters the message; per flow (node, flow_id)
        the latest second the records were added to, which the caller's acks wait for)."""
        invalid, touched = self.ingest_parts(node, [records], now_tai_ns)
        return invalid[0], touched

    def ingest_parts(
        self, node: str, parts: list[np.ndarray], now_tai_ns: int | None = None
    ) -> tuple[list[dict[str, int]], dict[tuple[str, int], int]]:
        """Fold the records of several ioam_batches of one node (in the order the egress received
        them) in one pass: the numpy work is per call and flow, not per batch. Returns (per batch,
        the problems of the records refused: reason -> count; per flow the latest second the
        records were added to)."""
        self.counters.batches_in += len(parts)
        records = join_records(parts)
        n = len(records)
        self.counters.records_in += n
        invalid: list[dict[str, int]] = [{} for _ in parts]
        if n == 0:
            return invalid, {}
        if now_tai_ns is None:
            now_tai_ns = clock_tai_ns()
        words = entry_words(records)
        codes = problem_codes(records, words)
        # a transmit time beyond the clock + max_future would hold its second open, and the
        # messages behind it unacked, until the wall clock reaches it: refused like a bad field
        future = records["tx_tai_ns"] > np.uint64(now_tai_ns + self.max_future_ns)
        if future.any():
            codes[future & (codes == 0)] = FUTURE_CODE
        if codes.any():
            bad = codes != 0
            part_of = np.repeat(np.arange(len(parts)), [len(p) for p in parts])[bad]
            width = len(PROBLEMS) + 1
            keys, counts = np.unique(part_of * width + codes[bad], return_counts=True)
            for key, count in zip(keys.tolist(), counts.tolist()):
                invalid[key // width][PROBLEMS[key % width - 1]] = count
            self.counters.invalid_records += int(np.count_nonzero(bad))
            self.counters.future_records += int(np.count_nonzero(codes == FUTURE_CODE))
            records, words = records[~bad], words[~bad]
            if len(records) == 0:
                return invalid, {}
        touched: dict[tuple[str, int], int] = {}
        flow = records["flow_id"]
        if flow[0] == flow[-1] and (len(flow) <= 2 or flow.min() == flow.max()):
            self._ingest_flow(node, int(flow[0]), records, words, now_tai_ns, touched)
        else:
            for f in np.unique(flow).tolist():
                sel = flow == f
                self._ingest_flow(node, f, records[sel], words[sel], now_tai_ns, touched)
        return invalid, touched

    def seed_final(self, node: str, flow_id: int, final_below_s: int, base_seq: int | None) -> None:
        """After a restart or a rebalance: the seconds of this flow below final_below_s were final
        (evicted) at an earlier owner, with every seq up to base_seq accounted. Applied when the
        flow's records arrive (never creates a flow: processors/delay/aggregate.py seed_final says why)."""
        key = (node, flow_id)
        old = self.final_seeds.get(key)
        if old is None or final_below_s > old[0]:
            self.final_seeds[key] = (final_below_s, base_seq)
        st = self.flows.get(key)
        if st is not None and final_below_s > st.final_below_s:
            st.final_below_s = final_below_s
            if base_seq is not None and (st.base_seq is None or base_seq > st.base_seq):
                st.base_seq = base_seq

    def _flow(self, node: str, flow_id: int) -> FlowState:
        key = (node, flow_id)
        st = self.flows.get(key)
        if st is None:
            st = self.flows[key] = FlowState(node, flow_id)
            seed = self.final_seeds.get(key)
            if seed is not None:
                st.final_below_s, st.base_seq = seed
        return st

    def _signature_rows(self, records: np.ndarray, words: np.ndarray, filled: np.ndarray) -> np.ndarray:
        """Per record: its signature id (what hops.Signature holds), new ones decoded once. words:
        entry_words(records)."""
        n = len(records)
        lo, hi = int(filled.min()), int(filled.max())
        c = min(hi, IOAM_RECORD_MAX_NODES)
        sig = np.zeros((n, 5 + 2 * c), dtype=np.uint32)
        sig[:, 0] = records["node_id"]
        sig[:, 1] = records["hop_limit"]
        sig[:, 2] = records["ifindex"]
        sig[:, 3] = records["flags"] & IOAM_RECORD_F_TRUNCATED
        sig[:, 4] = filled
        sig[:, 5:] = words[:, :c, :2].reshape(n, 2 * c)
        if lo != hi:  # entries beyond a record's own are not part of it
            sig[:, 5:] *= np.repeat(np.arange(c)[None, :] < np.minimum(filled, c)[:, None], 2, axis=1)
        if n == 1 or (sig[1:] == sig[0]).all():
            return np.full(n, self._signature_id(sig[0]), dtype=np.int64)
        rows = np.ascontiguousarray(sig).view(np.dtype((np.void, sig.dtype.itemsize * sig.shape[1]))).ravel()
        _, first, inverse = np.unique(rows, return_index=True, return_inverse=True)
        ids = np.array([self._signature_id(sig[i]) for i in first.tolist()], dtype=np.int64)
        return ids[inverse.ravel()]

    def _signature_id(self, words: np.ndarray) -> int:
        raw = words.tobytes().ljust(_SIG_WORDS * 4, b"\0")  # one key per signature, whatever the width
        sid = self._signature_ids.get(raw)
        if sid is None:
            w = words.tolist()
            copied = min(w[4], IOAM_RECORD_MAX_NODES)
            entries = tuple(
                hp.Entry(w[5 + 2 * j] & 0xFFFFFF, w[5 + 2 * j] >> 24, w[6 + 2 * j] >> 16, w[6 + 2 * j] & 0xFFFF)
                for j in reversed(range(copied))  # wire order is newest first: path order reverses it
            )
            sig = hp.Signature(entries, w[0], w[1], w[2], bool(w[3]))
            sid = self._signature_ids[raw] = len(self.signatures)
            self.signatures.append(sig)
        return sid

    def _ingest_flow(
        self, node: str, flow_id: int, records: np.ndarray, words: np.ndarray, now_tai_ns: int, touched: dict
    ) -> None:
        st = self._flow(node, flow_id)
        st.last_ingest_tai_ns = now_tai_ns
        n = len(records)
        seq = records["seq"].astype(np.int64)
        tx = records["tx_tai_ns"].astype(np.int64)
        # reordered: below the highest seq received before it (ingest order = the egress's order)
        highest = np.maximum.accumulate(seq)
        before = np.empty(n, dtype=np.int64)
        before[0] = st.max_seq_seen
        np.maximum(highest[:-1], st.max_seq_seen, out=before[1:])
        st.max_seq_seen = max(st.max_seq_seen, int(highest[-1]))
        filled = records["filled"]
        sig = self._signature_rows(records, words, filled)
        if sig[0] == sig[-1] and (n <= 2 or sig.min() == sig.max()):
            groups = [(int(sig[0]), None)]
        else:
            groups = [(int(s), sig == s) for s in np.unique(sig).tolist()]
        for sid, sel in groups:
            signature = self.signatures[sid]
            if signature.truncated:
                self.counters.truncated_records += n if sel is None else int(np.count_nonzero(sel))
            m = 0 if signature.truncated else len(signature.entries) - 1
            part = records if sel is None else records[sel]
            g = len(part)
            chunk = np.empty((FIRST_TRANSIT + m, g), dtype=np.int64)
            chunk[SEQ] = seq if sel is None else seq[sel]
            chunk[RX] = part["rx_tai_ns"]
            chunk[TX] = tx if sel is None else tx[sel]
            np.less(chunk[SEQ], before if sel is None else before[sel], out=chunk[FLAGS], casting="unsafe")
            chunk[SIG] = sid
            if m:
                # transit node k (path order, 1..m) is wire entry m - k: entries 0..m-1 reversed
                ts = (words if sel is None else words[sel])[:, m - 1 :: -1, 2:4]
                times = chunk[FIRST_TRANSIT:]
                times[...] = ts[:, :, 0].T  # uint32 seconds -> int64, then scaled (no 32-bit overflow)
                times *= NS_PER_S
                times += ts[:, :, 1].T.astype(np.int64) * 1000
                times += part["tai_utc_offset_s"].astype(np.int64) * NS_PER_S
            last = self._add(st, chunk, chunk[TX] // NS_PER_S)
            if last is not None:
                key = (node, flow_id)
                touched[key] = max(touched.get(key, last), last)

    def _add(self, st: FlowState, chunk: np.ndarray, second: np.ndarray) -> int | None:
        """Append a chunk to its seconds' accumulators; the latest second it went to (None: none,
        every record was of a final or evicted second)."""
        if second[0] == second[-1] and (len(second) <= 2 or second.min() == second.max()):
            parts = [(int(second[0]), chunk)]
        else:
            parts = [(s, chunk[:, second == s]) for s in np.unique(second).tolist()]
        last = None
        for s, part in parts:
            if s < st.final_below_s:  # published complete by the worker before a restart
                self.counters.replayed_records_skipped += part.shape[1]
                continue
            if s < st.horizon_s:
                self.counters.late_records_dropped += part.shape[1]
                continue
            acc = st.seconds.get(s)
            if acc is None:
                acc = st.seconds[s] = SecondAccumulator(s)
            newest = int(part[TX].max())
            acc.newest_tx_ns = max(acc.newest_tx_ns, newest)
            st.watermark_ns = max(st.watermark_ns, newest)
            acc.pending.append(part)
            acc.dirty = True
            last = s
        return last

    # -- periodic ---------------------------------------------------------

    def flush(self, now_tai_ns: int | None = None) -> list[str]:
        """Close every second whose end + grace is behind its flow's watermark, evict those older than
        the retention; return the lines of what closed or changed."""
        if now_tai_ns is None:
            now_tai_ns = clock_tai_ns()
        out = _Emission()
        for st in self.flows.values():
            idle_ns = now_tai_ns - st.last_ingest_tai_ns
            wm = st.watermark_ns
            if idle_ns >= self.idle_ns:
                wm = max(wm, now_tai_ns)
            close_before = (wm - self.grace_ns) // NS_PER_S
            evict_wm = st.watermark_ns
            if idle_ns >= self.retention_ns:
                evict_wm = max(evict_wm, now_tai_ns)
            horizon = (evict_wm - self.retention_ns) // NS_PER_S
            self._close(st, max(close_before, horizon), out)
            if horizon > st.horizon_s:
                self._evict(st, horizon)
        return self._lines(out)

    def flush_all(self) -> list[str]:
        """Emit every second with records not emitted yet (a clean stop)."""
        out = _Emission()
        for st in self.flows.values():
            if st.seconds:
                self._close(st, max(st.seconds) + 1, out)
        return self._lines(out)

    def _close(self, st: FlowState, close_before: int, out: _Emission) -> None:
        """Merge the flow's dirty seconds below close_before, recompute the loss of every closed
        second from the first changed one on, and queue what must be (re-)emitted."""
        closing = [s for s in sorted(st.seconds) if s < close_before and st.seconds[s].dirty]
        if not closing:
            return
        for s in closing:
            self._merge(st.seconds[s])
        # loss: every closed second from the first that changed, in order (a change moves the next)
        ordered = sorted(s for s in st.seconds if s < close_before)
        first = ordered.index(closing[0])
        prev = st.base_seq
        if first > 0:
            prev = st.seconds[ordered[first - 1]].loss.last_seq
        elif prev is None:  # a new flow: the accounting starts at its smallest seq
            prev = int(st.seconds[ordered[0]].seqs[0]) - 1 if len(st.seconds[ordered[0]].seqs) else None
        changed_loss = []
        for s in ordered[first:]:
            acc = st.seconds[s]
            acc.loss = loss_of(acc, prev)
            prev = acc.loss.last_seq
            if not acc.dirty and acc.loss != acc.loss_emitted:
                changed_loss.append(acc)
        for s in closing:
            acc = st.seconds[s]
            acc.dirty = False
            out.whole.append((st, acc))
        out.loss_only += [(st, acc) for acc in changed_loss]

    def _merge(self, acc: SecondAccumulator) -> None:
        parts = ([acc.merged] if acc.merged is not None else []) + acc.pending
        acc.pending = []
        rows = max(p.shape[0] for p in parts)
        if any(p.shape[0] != rows for p in parts):  # signatures with fewer transit nodes: pad
            parts = [np.vstack([p, np.zeros((rows - p.shape[0], p.shape[1]), dtype=np.int64)]) for p in parts]
        data = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
        seq, rx = data[SEQ], data[RX]
        if len(seq) > 1 and not np.all((seq[1:] > seq[:-1]) | ((seq[1:] == seq[:-1]) & (rx[1:] > rx[:-1]))):
            order = np.lexsort((rx, seq))  # stable: what was merged before stays first of equals
            data = data[:, order]
            seq, rx = data[SEQ], data[RX]
            same = np.zeros(len(seq), dtype=bool)
            same[1:] = (seq[1:] == seq[:-1]) & (rx[1:] == rx[:-1])
            if same.any():  # the same record read twice (a replay): one copy
                self.counters.duplicate_records += int(np.count_nonzero(same))
                data = data[:, ~same]
                seq = data[SEQ]
        primary = _primary(seq)
        acc.merged = data
        acc.duplicated = len(seq) - int(np.count_nonzero(primary))
        kept = data if primary.all() else data[:, primary]
        acc.seqs = kept[SEQ]
        acc.reordered_flags = (kept[FLAGS] & F_REORDERED) != 0

    def _evict(self, st: FlowState, horizon: int) -> None:
        for s in sorted(s for s in st.seconds if s < horizon):
            acc = st.seconds.pop(s)
            if acc.loss is not None and acc.loss.last_seq is not None:
                st.base_seq = acc.loss.last_seq
                self.counters.seqs_not_accounted += acc.loss.not_accounted
            st.final_s = horizon
        st.horizon_s = horizon

    # -- lines -------------------------------------------------------------

    def _flow_tags(self, st: FlowState, acc: SecondAccumulator, plan: hp.Plan) -> None:
        path = UNKNOWN_PATH if plan.path is None else escape_tag(plan.path)
        acc.tags = f"flow={st.flow_id},ingress={escape_tag(plan.ingress)},egress={escape_tag(st.node)},path={path}"
        acc.hop_tags = f"flow={st.flow_id},path={path}"

    def _plan(self, st: FlowState, acc: SecondAccumulator, sid: int) -> hp.Plan:
        plan = acc.plans.get(sid)
        if plan is None:
            plan = acc.plans[sid] = hp.resolve(self.signatures[sid], st.node, st.flow_id, self.book)
        return plan

    def _lines(self, out: _Emission) -> list[str]:
        """The lines of the queued seconds: inline_delay + histogram and every inline_hop_delay of the
        seconds emitted whole, inline_loss of those and of the seconds whose loss alone changed. The
        statistics of all of them in two vectorised calls (direction_fields)."""
        if not out.whole and not out.loss_only:
            return []
        offset_ns = self.tai_utc_offset_s * NS_PER_S
        c = self.counters
        lines: list[str] = []
        e2e_values: list[np.ndarray] = []
        hop_values: list[np.ndarray] = []
        hop_owner: list[tuple[int, str]] = []
        not_measured: dict[tuple[int, str], int] = {}  # (second, hop tags) -> packets without its delay
        unresolved: set[str] = set()  # hop tags whose from_if is unknown at a transit node
        for i, (st, acc) in enumerate(out.whole):
            merged = acc.merged
            kept = merged if len(acc.seqs) == merged.shape[1] else merged[:, _primary(merged[SEQ])]
            new = (kept[FLAGS] & F_COUNTED) == 0  # not counted in an earlier emission
            merged[FLAGS] |= F_COUNTED
            if acc.tags is None:
                self._flow_tags(st, acc, self._plan(st, acc, int(kept[SIG, 0])))
            if acc.emitted:
                c.seconds_reemitted += 1
            acc.emitted = True
            e2e = kept[RX] - kept[TX]
            fresh = e2e[new]
            c.negative_delays += int(np.count_nonzero(fresh < 0))
            c.absurd_delays += int(np.count_nonzero(np.abs(fresh) > self.absurd_threshold_ns))
            e2e_values.append(e2e)
            sigs = kept[SIG]
            if sigs.min() == sigs.max():
                by_sig = [(int(sigs[0]), kept, new)]
            else:
                by_sig = [(s, kept[:, sigs == s], new[sigs == s]) for s in np.unique(sigs).tolist()]
            pieces: dict[str, list[np.ndarray]] = {}
            for sid, part, part_new in by_sig:
                plan = self._plan(st, acc, sid)
                if plan.hop_limit_inconsistent:
                    c.hop_limit_inconsistent_records += int(np.count_nonzero(part_new))
                for hop in plan.hops:
                    if hop.from_if_unresolved:
                        unresolved.add(hop.tags)
                    if hop.start is None:
                        key = (i, hop.tags)
                        not_measured[key] = not_measured.get(key, 0) + part.shape[1]
                        continue
                    pair = np.empty((2, part.shape[1]), dtype=np.int64)
                    pair[0] = part[SEQ]
                    np.subtract(part[hop.end], part[hop.start], out=pair[1])
                    c.negative_hop_delays += int(np.count_nonzero(pair[1][part_new] < 0))
                    pieces.setdefault(hop.tags, []).append(pair)
            for tags, parts in pieces.items():
                joined = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
                if len(parts) > 1:  # two signatures measured the same hop: back into seq order
                    joined = joined[:, np.argsort(joined[0], kind="stable")]
                hop_values.append(joined[1])
                hop_owner.append((i, tags))
        delay_text, histogram_text = _fields(e2e_values)
        hop_text, _ = _fields(hop_values, histograms=False)
        for (_, acc), fields_, hist in zip(out.whole, delay_text, histogram_text):
            ts = acc.second * NS_PER_S - offset_ns
            newest = f",newest_ns={acc.newest_tx_ns - offset_ns}i"
            lines.append(f"{DELAY},{acc.tags} {fields_}{newest} {ts}")
            lines.append(f"{HISTOGRAM},{acc.tags} {hist} {ts}")
            c.points_out += 1
            c.histogram_points_out += 1
            if acc.tags.endswith(f",path={UNKNOWN_PATH}"):
                c.path_unknown += 1
        hop_lines = [((i, tags), f"{fields_},measured=true") for (i, tags), fields_ in zip(hop_owner, hop_text)]
        measured = set(hop_owner)
        hop_lines += [(key, "measured=false") for key in not_measured if key not in measured]
        for (i, tags), fields_ in hop_lines:
            acc = out.whole[i][1]
            ts = acc.second * NS_PER_S - offset_ns
            lines.append(
                f"{HOP_DELAY},{acc.hop_tags},{tags} {fields_},unmeasured={not_measured.get((i, tags), 0)}i,"
                f"newest_ns={acc.newest_tx_ns - offset_ns}i {ts}"
            )
            c.hop_points_out += 1
            if fields_ == "measured=false":
                c.hop_points_not_measured += 1
            if tags in unresolved:
                c.hop_from_if_unresolved += 1
        c.seconds_reemitted += len(out.loss_only)
        for _, acc in out.whole + out.loss_only:
            ts = acc.second * NS_PER_S - offset_ns
            lines.append(f"{LOSS},{acc.tags} {acc.loss.text()},newest_ns={acc.newest_tx_ns - offset_ns}i {ts}")
            acc.loss_emitted = acc.loss
            c.loss_points_out += 1
        return lines

    def open_seconds(self) -> int:
        return sum(len(st.seconds) for st in self.flows.values())


@dataclass
class _Emission:
    whole: list = field(default_factory=list)  # (flow, second) emitted whole
    loss_only: list = field(default_factory=list)  # (flow, second) whose loss alone changed


def _primary(seq: np.ndarray) -> np.ndarray:
    first = np.ones(len(seq), dtype=bool)
    first[1:] = seq[1:] != seq[:-1]
    return first


def _fields(groups: list[np.ndarray], histograms: bool = True) -> tuple[list[str], list[str] | None]:
    """direction_fields of every group (each in seq order, non-empty), in one vectorised call."""
    if not groups:
        return [], []
    counts = np.array([len(g) for g in groups], dtype=np.int64)
    starts = np.cumsum(counts) - counts
    return direction_fields(np.concatenate(groups), starts, histograms)


def loss_of(acc: SecondAccumulator, prev: int | None) -> LossFields:
    """inline_loss of one second given the highest seq accounted before it (None: nothing yet)."""
    seqs = acc.seqs
    out = LossFields(duplicated=acc.duplicated, last_seq=prev)
    if prev is not None:
        taken = seqs[seqs > prev] if len(seqs) and seqs[0] <= prev else seqs
        out.not_accounted = len(seqs) - len(taken)
    else:
        taken = seqs
        prev = int(seqs[0]) - 1 if len(seqs) else None
    # reordered among the accounted seqs only: one at or below the accounted one (a re-installed
    # monitor counting from 0 again) is below the old sequence's highest, not reordered in its own
    out.reordered = int(np.count_nonzero(acc.reordered_flags[out.not_accounted :]))
    if len(taken) == 0:
        return out
    gaps = np.diff(taken, prepend=prev) - 1
    holes = gaps[gaps > 0]
    out.received = len(taken)
    out.lost = int(holes.sum())
    out.bursts = len(holes)
    out.burst_max = int(holes.max()) if len(holes) else 0
    out.last_seq = int(taken[-1])
    return out
