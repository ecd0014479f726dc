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
