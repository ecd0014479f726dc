"""The egress edge's verdict on a frame, written from the documents, not from the program:
RFC 8200 §4.2-§4.4 (options headers, routing header), RFC 8754 §2 (SRH), RFC 9197 §4.4 / §4.6
(Pre-allocated Trace, Edge-to-Edge), RFC 9486 §2-§3 (the IPv6 options, 4n alignment) and
schemas/IOAM.md ("What the egress accepts": the order of the checks and the counter of each, the
segscope trace and E2E types, the bound of 16 options per header, the record's fields).

verdict(frame) names the one stats counter the frame must land in and, for a recorded frame, the
ioam_record it must produce (receive time aside: the test checks that against its clock).
"""

from __future__ import annotations

from dataclasses import dataclass

REFUSED = "(refused by BPF_PROG_TEST_RUN)"  # frames shorter than an Ethernet header: EINVAL
ETH, IP6 = 14, 40
NEXT_HOP_BY_HOP, NEXT_ROUTING, NEXT_DEST_OPTS = 0, 43, 60
SRH_TYPE = 4
MAX_SIDS = 6  # the flow key holds 6 (datapath/altmark.h)
HBH_IOAM, DEST_IOAM = 0x31, 0x11  # RFC 9486 §5 (IANA)
PREALLOCATED_TRACE, EDGE_TO_EDGE = 0, 3  # RFC 9197 §8.1 IOAM Option-Type registry
SEGSCOPE_TRACE_TYPE = 0xF00000  # bits 0..3: hop limit + node id, if ids, seconds, subseconds
SEGSCOPE_E2E_TYPE = 0xB000  # bits 0, 2, 3: 64-bit sequence number, seconds, subseconds
ENTRY_BYTES = 16  # 4 four-octet words for that trace type (NodeLen 4)
RECORD_NODES = 12
OVERFLOW = 0x8  # the first of the four trace flags (RFC 9197 §4.4.1)


@dataclass(frozen=True)
class Flow:
    flow_id: int
    namespace: int


@dataclass
class Verdict:
    counter: str
    record: dict | None = None


class Stop(Exception):
    def __init__(self, counter: str):
        self.counter = counter


def _u16(b: bytes, i: int) -> int:
    return b[i] << 8 | b[i + 1]


def _u32(b: bytes, i: int) -> int:
    return _u16(b, i) << 16 | _u16(b, i + 2)


def option_offset(pkt: bytes, start: int, wanted: int) -> int | None:
    """RFC 8200 §4.2 TLVs of the options header at pkt[start:], walked to its end (the header must
    lie inside pkt). Padding (Pad1 = one zero byte, PadN = type 1 + length + zero bytes) may run
    for 7 bytes at most (RFC 4942 §2.1.9.5, as the Linux kernel enforces); at most 16 options.
    Returns the first `wanted` option's offset from pkt's start, or None if there is none."""
    if start + 2 > len(pkt):
        raise Stop("pass_truncated")
    end = start + (pkt[start + 1] + 1) * 8
    if end > len(pkt):
        raise Stop("pass_truncated")
    found = None
    run = 0
    options = 0
    i = start + 2
    while i < end:
        options += 1
        if options > 16:
            raise Stop("pass_bad_length")
        kind = pkt[i]
        if kind == 0:
            run += 1
            i += 1
        else:
            if i + 1 >= end:
                raise Stop("pass_bad_length")
            size = pkt[i + 1] + 2
            if i + size > end:
                raise Stop("pass_bad_length")
            if kind == 1:
                run += size
                if pkt[i + 2 : i + size] != bytes(size - 2):
                    raise Stop("pass_bad_length")
            else:
                run = 0
                if kind == wanted and found is None:
                    if (i - start) % 4:  # RFC 9486 §3: 4n from the header (which is 8n from IPv6)
                        raise Stop("pass_bad_length")
                    found = i
            i += size
        if run > 7:
            raise Stop("pass_bad_length")
    return found


def _trace(pkt: bytes) -> dict:
    """The Hop-by-Hop header right after the IPv6 header and its first IOAM option."""
    at = option_offset(pkt, ETH + IP6, HBH_IOAM)
    if at is None:
        raise Stop("pass_no_trace")
    data_len = pkt[at + 1]
    if data_len < 2:
        raise Stop("pass_bad_length")
    if pkt[at + 3] != PREALLOCATED_TRACE:
        raise Stop("pass_unknown_type")
    if data_len < 10:
        raise Stop("pass_bad_length")
    node_len = pkt[at + 6] >> 3
    flags = (pkt[at + 6] & 0b111) << 1 | pkt[at + 7] >> 7
    remaining = pkt[at + 7] & 0x7F
    trace_type = _u32(pkt, at + 8) >> 8
    list_len = data_len - 10
    if 4 * remaining > list_len:
        raise Stop("pass_bad_length")
    if trace_type != SEGSCOPE_TRACE_TYPE:
        raise Stop("pass_unknown_type")
    if node_len != 4 or list_len % ENTRY_BYTES or remaining % 4 or list_len == 0:
        raise Stop("pass_bad_length")
    slots = list_len // ENTRY_BYTES
    filled = slots - remaining // 4
    first = at + 12 + 4 * remaining
    return {
        "namespace": _u16(pkt, at + 4),
        "flags": flags,
        "trace_type": trace_type,
        "slots": slots,
        "filled": filled,
        "entries": pkt[first : first + ENTRY_BYTES * min(filled, RECORD_NODES)],
    }


def _srh(pkt: bytes, off: int, nh: int) -> tuple[tuple[bytes, ...], int, int]:
    """[one DOH] then the SRH: (SID list in SRH order, its next header, offset after it)."""
    if nh == NEXT_DEST_OPTS:
        if off + 2 > len(pkt):
            raise Stop("pass_truncated")
        nh, off = pkt[off], off + (pkt[off + 1] + 1) * 8
        if off > len(pkt):
            raise Stop("pass_truncated")
    if nh != NEXT_ROUTING:
        raise Stop("pass_no_srh")
    if off + 8 > len(pkt):
        raise Stop("pass_truncated")
    if pkt[off + 2] != SRH_TYPE:
        raise Stop("pass_no_srh")
    size = (pkt[off + 1] + 1) * 8
    if off + size > len(pkt):
        raise Stop("pass_truncated")
    last_entry, left = pkt[off + 4], pkt[off + 3]
    if pkt[off + 1] < 2 * (last_entry + 1) or left > last_entry:  # RFC 8754 §2: room for every segment
        raise Stop("pass_malformed_srh")
    if last_entry + 1 > MAX_SIDS:
        raise Stop("pass_too_many_sids")
    sids = tuple(pkt[off + 8 + 16 * k : off + 24 + 16 * k] for k in range(last_entry + 1))
    return sids, pkt[off], off + size


def _e2e(pkt: bytes, off: int, flow: Flow) -> dict:
    at = option_offset(pkt, off, DEST_IOAM)
    if at is None:
        raise Stop("pass_no_e2e")
    data_len = pkt[at + 1]
    if data_len < 6:
        raise Stop("pass_bad_length")
    if pkt[at + 3] != EDGE_TO_EDGE or _u16(pkt, at + 6) != SEGSCOPE_E2E_TYPE:
        raise Stop("pass_unknown_type")
    if data_len != 22:
        raise Stop("pass_bad_length")
    if _u16(pkt, at + 4) != flow.namespace:
        raise Stop("pass_unknown_namespace")
    seq = _u32(pkt, at + 8) << 32 | _u32(pkt, at + 12)
    sec, nsec = _u32(pkt, at + 16), _u32(pkt, at + 20)
    if nsec >= 1_000_000_000:
        raise Stop("pass_bad_timestamp")
    return {"seq": seq, "tx_tai_ns": sec * 1_000_000_000 + nsec}


def verdict(frame: bytes, flows: dict[tuple[bytes, ...], Flow], node_id: int, tai_utc_offset_s: int) -> Verdict:
    if len(frame) < ETH:
        return Verdict(REFUSED)
    if len(frame) < ETH + IP6 or frame[12:14] != b"\x86\xdd":
        return Verdict("pass_not_ipv6")
    if frame[ETH + 6] != NEXT_HOP_BY_HOP:
        return Verdict("pass_no_hbh")
    # the IPv6 packet ends where its Payload Length says (or the frame, if that is shorter)
    pkt = frame[: ETH + IP6 + _u16(frame, ETH + 4)]
    try:
        trace = _trace(pkt)
        after_hbh = ETH + IP6 + (pkt[ETH + IP6 + 1] + 1) * 8
        sids, srh_next, after_srh = _srh(pkt, after_hbh, pkt[ETH + IP6])
        flow = flows.get(sids)
        if flow is None:
            raise Stop("pass_unmonitored")
        if trace["namespace"] != flow.namespace:
            raise Stop("pass_unknown_namespace")
        if srh_next != NEXT_DEST_OPTS:
            raise Stop("pass_no_e2e")
        e2e = _e2e(pkt, after_srh, flow)
    except Stop as s:
        return Verdict(s.counter)
    truncated = trace["filled"] > RECORD_NODES
    record = {
        "tx_tai_ns": e2e["tx_tai_ns"],
        "seq": e2e["seq"],
        "flow_id": flow.flow_id,
        "ifindex": 1,  # a test run arrives on the loopback device of the caller's namespace
        "node_id": node_id,
        "namespace_id": flow.namespace,
        "slots": trace["slots"],
        "filled": trace["filled"],
        "trace_type": trace["trace_type"],
        "trace_flags": trace["flags"],
        "hop_limit": frame[ETH + 7],
        "tai_utc_offset_s": tai_utc_offset_s,
        "flags": (1 if trace["flags"] & OVERFLOW else 0) | (2 if truncated else 0),
        "reserved0": 0,
        "reserved1": 0,
        "entries": trace["entries"] + bytes(16 * RECORD_NODES - len(trace["entries"])),
    }
    return Verdict("recorded_truncated" if truncated else "recorded", record)
