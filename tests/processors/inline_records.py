"""Hand-built ioam_records for the in-line processor's tests and benchmark: a packet's way is given
as the nodes it met (ingress edge, transit nodes that fill, egress edge) with the time it left or
reached each, and the records carry exactly that (trace entries in wire order, UTC s + µs)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from segscope_schemas import ioam_record as ir

NS = 1_000_000_000
TAI_UTC = 37  # TAI - UTC in the records and the aggregators of the tests


@dataclass(frozen=True)
class Hop:
    """A node that fills its trace entry: IOAM node id, the interfaces it received / sends on (IOAM
    ids), and the hop limit it writes (for a transit node: the one it forwards with)."""

    node_id: int
    ingress_if: int
    egress_if: int
    hop_limit: int


def records(
    flow_id: int,
    seq: np.ndarray,
    tx_ns: np.ndarray,
    rx_ns: np.ndarray,
    ingress: Hop,
    transit: list[tuple[Hop, np.ndarray]],
    egress_node_id: int = 99,
    arrival_hop_limit: int | None = None,
    ifindex: int = 5,
    slots: int | None = None,
    tai_utc_offset_s: int = TAI_UTC,
) -> np.ndarray:
    """One record per packet: seq, transmit (TAI ns), receive (TAI ns); `transit` the nodes that
    filled, in path order, each with its receive times (TAI ns, truncated to µs in the entry as the
    kernel does). arrival_hop_limit default: the last filler's (no router after it)."""
    n = len(seq)
    r = np.zeros(n, dtype=ir.IOAM_RECORD_DTYPE)
    filled = 1 + len(transit)
    r["flow_id"] = flow_id
    r["seq"] = seq
    r["tx_tai_ns"] = tx_ns
    r["rx_tai_ns"] = rx_ns
    r["node_id"] = egress_node_id
    r["ifindex"] = ifindex
    r["namespace_id"] = 1
    r["slots"] = slots or filled
    r["filled"] = filled
    r["trace_type"] = ir.IOAM_TRACE_TYPE
    last = transit[-1][0].hop_limit if transit else ingress.hop_limit
    r["hop_limit"] = last if arrival_hop_limit is None else arrival_hop_limit
    r["tai_utc_offset_s"] = tai_utc_offset_s
    nodes = [(ingress, np.asarray(tx_ns, dtype=np.int64))] + [(h, np.asarray(t, dtype=np.int64)) for h, t in transit]
    for k, (hop, t) in enumerate(nodes):  # path order k -> wire entry filled - 1 - k
        e = r["entries"][:, filled - 1 - k]
        utc = t - tai_utc_offset_s * NS
        e["hop_limit_node_id"] = (hop.hop_limit << 24) | hop.node_id
        e["ingress_if_id"] = hop.ingress_if
        e["egress_if_id"] = hop.egress_if
        e["ts_sec"] = utc // NS
        e["ts_subsec"] = (utc % NS) // 1000
    return r


def entry_time_ns(t_ns: np.ndarray, tai_utc_offset_s: int = TAI_UTC) -> np.ndarray:
    """The TAI ns a trace entry gives back for a receive at t_ns (the µs truncation of UTC)."""
    utc = np.asarray(t_ns, dtype=np.int64) - tai_utc_offset_s * NS
    return (utc // 1000) * 1000 + tai_utc_offset_s * NS


class LiveFlows:
    """Flows sent in real time the way an egress streamer sends them (one message per flow and
    tick, key <egress>/<flow_id>), with packets lost on the way: what was sent, what arrived and
    in which second, for exact accounting afterwards."""

    A = Hop(1, 0xFFFF, 11, 64)
    R1 = Hop(7, 70, 71, 63)
    R2 = Hop(8, 80, 81, 62)

    def __init__(self, egress: str, flows: list[int], drop: float, seed: int) -> None:
        self.egress, self.flows, self.drop = egress, flows, drop
        self.rng = np.random.default_rng(seed)
        self.next_seq = {f: 0 for f in flows}
        self.received: dict[int, dict[int, int]] = {f: {} for f in flows}  # flow -> TAI second -> packets
        self.lost: dict[int, int] = {f: 0 for f in flows}
        self.batch_seq = 0

    def tick(self, now_tai_ns: int, per_flow: int, spacing_ns: int, last: bool = False) -> list[tuple[bytes, bytes]]:
        """One message per flow with the next per_flow packets, sent from now_tai_ns every
        spacing_ns; `last`: none of them lost (the end of a flow is only known from a later packet)."""
        out = []
        for f in self.flows:
            seq = np.arange(self.next_seq[f], self.next_seq[f] + per_flow)
            self.next_seq[f] += per_flow
            keep = np.ones(per_flow, dtype=bool) if last else self.rng.random(per_flow) >= self.drop
            keep[0] |= seq[0] == 0  # the first packet arrives: the accounting starts at it
            self.lost[f] += int(np.count_nonzero(~keep))
            seq = seq[keep]
            if len(seq) == 0:
                continue
            tx = now_tai_ns + np.flatnonzero(keep).astype(np.int64) * spacing_ns
            t1 = tx + self.rng.integers(100_000, 300_000, len(seq))
            t2 = t1 + self.rng.integers(200_000, 600_000, len(seq))
            rx = t2 + self.rng.integers(50_000, 150_000, len(seq))
            recs = records(f, seq, tx, rx, self.A, [(self.R1, t1), (self.R2, t2)], tai_utc_offset_s=TAI_UTC)
            for s, c in zip(*np.unique(tx // NS, return_counts=True)):
                self.received[f][int(s)] = self.received[f].get(int(s), 0) + int(c)
            out.append((f"{self.egress}/{f}".encode(), ir.encode_batch(recs, self.egress, self.batch_seq)))
            self.batch_seq += 1
        return out

    def sent(self, flow: int) -> int:
        """Packets sent: seqs 0 .. next - 1."""
        return self.next_seq[flow]
