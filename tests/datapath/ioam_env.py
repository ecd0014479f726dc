"""Helpers for the in-line IOAM datapath tests (ioam_tx / ioam_rx).

Frames are written with struct from schemas/IOAM.md (the tables there, not the C code): an
encapsulated packet as A's `encap seg6 mode encap` writes it, and an instrumented one as the
ingress edge must write it (HBH trace + [DOH] + SRH + E2E DOH). Real programs in the real kernel
through their loaders; resources carry the prefixes below so the suite runs beside others.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.datapath.altmark_env import eth, inner_udp, ipv6_hdr, srh
from tests.isolation import own_name

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "build" / "datapath"
IOAM_TX = BUILD / "ioam_tx"
IOAM_RX = BUILD / "ioam_rx"
IOAM_LWT = BUILD / "ioam_lwt"
ALTMARK_TX = BUILD / "altmark_tx"
ALTMARK_RX = BUILD / "altmark_rx"
PIN_ROOT = Path("/sys/fs/bpf/segscope")
PREFIX = os.environ.get("SEGSCOPE_IOAM_TEST_PREFIX") or own_name("ioamdp")

TX_COUNTERS = [
    "pass_not_ipv6",
    "pass_no_srh",
    "pass_too_many_sids",
    "pass_malformed",
    "pass_unmonitored",
    "pass_bad_flow",
    "pass_filtered",
    "pass_not_sampled",
    "skip_gso",
    "skip_already_ioam",
    "skip_other_ext",
    "skip_too_long",
    "skip_mtu",
    "skip_adjust_failed",
    "instrumented",
]
LWT_COUNTERS = [
    "drop_not_ipv6",
    "drop_no_route",
    "drop_encap_failed",
    "pass_unmonitored",
    "pass_bad_flow",
    "pass_filtered",
    "pass_not_sampled",
    "skip_gso",
    "skip_too_long",
    "skip_mtu",
    "skip_push_failed",
    "instrumented",
]
RX_COUNTERS = [
    "pass_not_ipv6",
    "pass_no_hbh",
    "pass_truncated",
    "pass_bad_length",
    "pass_no_trace",
    "pass_unknown_type",
    "pass_no_srh",
    "pass_too_many_sids",
    "pass_malformed_srh",
    "pass_unmonitored",
    "pass_unknown_namespace",
    "pass_no_e2e",
    "pass_bad_timestamp",
    "pass_ringbuf_full",
    "recorded",
    "recorded_truncated",
]

TC_ACT_UNSPEC = -1
XDP_PASS = 2
HBH_OPT, DOH_OPT = 0x31, 0x11
TRACE_TYPE, E2E_TYPE = 0xF00000, 0xB000
IF_ID_NONE = 0xFFFF
NS_PER_S = 1_000_000_000

# the line5 policy A -> B (travel order)
POLICY = ["fc00:2::e", "fc00:3::d6"]


def run(tool: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([str(tool), *args], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"{tool.name} {' '.join(args)} -> {p.returncode}: {p.stderr}")
    return p


def stats(tool: Path, instance: str) -> dict[str, int]:
    return json.loads(run(tool, "stats", "--instance", instance, "--json").stdout)


def list_flows(tool: Path, instance: str) -> list[dict]:
    return json.loads(run(tool, "list-flows", "--instance", instance, "--json").stdout)["flows"]


def flow(tool: Path, instance: str, flow_id: int) -> dict:
    return next(f for f in list_flows(tool, instance) if f["flow_id"] == flow_id)


def dump(instance: str, count: int = 0, timeout_ms: int = 300) -> list[dict]:
    args = ["dump", "--instance", instance, "--timeout-ms", str(timeout_ms)]
    if count:
        args += ["--count", str(count)]
    p = run(IOAM_RX, *args, check=bool(count))
    return [json.loads(line) for line in p.stdout.splitlines() if line.strip()]


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


# ---------------------------------------------------------------- wire formats (schemas/IOAM.md)


@dataclass
class Node:
    """One 16-byte node entry of a 0xF00000 trace (host order)."""

    hop_limit: int
    node_id: int
    in_if: int
    out_if: int
    sec: int
    subsec: int

    def pack(self) -> bytes:
        return struct.pack(
            "!IHHII", self.hop_limit << 24 | self.node_id, self.in_if, self.out_if, self.sec, self.subsec
        )

    @classmethod
    def unpack(cls, b: bytes) -> Node:
        hn, i, o, s, us = struct.unpack("!IHHII", b)
        return cls(hn >> 24, hn & 0xFFFFFF, i, o, s, us)


@dataclass
class Trace:
    """The HBH with the trace option as the ingress writes it; fields overridable for bad ones."""

    next_header: int
    namespace: int
    slots: int
    filled: list[Node] = field(default_factory=list)  # newest first (wire order)
    flags: int = 0
    trace_type: int = TRACE_TYPE
    node_len: int = 4
    remaining: int | None = None  # 4-octet units; default: slots - filled entries
    opt_len: int | None = None
    ioam_type: int = 0
    pre_pad: bytes = b"\x01\x00"  # PadN(2): the option 4n-aligned
    opt_type: int = HBH_OPT
    data: bytes | None = None  # the node data list as given (for lengths that are no whole entries)
    post: bytes = b""  # options after the trace (before the padding to 8n)

    def pack(self) -> bytes:
        rem = 4 * (self.slots - len(self.filled)) if self.remaining is None else self.remaining
        data = bytes(16 * (self.slots - len(self.filled))) + b"".join(n.pack() for n in self.filled)
        data = data if self.data is None else self.data
        opt_len = 10 + len(data) if self.opt_len is None else self.opt_len
        body = (
            struct.pack("!BBBB", self.opt_type, opt_len, 0, self.ioam_type)
            + struct.pack("!HBB", self.namespace, self.node_len << 3 | self.flags >> 1, (self.flags & 1) << 7 | rem)
            + struct.pack("!I", self.trace_type << 8)
            + data
        )
        opts = self.pre_pad + body + self.post
        total = 2 + len(opts)
        pad = (-total) % 8
        if pad == 1:
            opts += b"\x00"
        elif pad:
            opts += bytes([1, pad - 2]) + bytes(pad - 2)
        return bytes([self.next_header, (2 + len(opts)) // 8 - 1]) + opts


def e2e_doh(
    next_header: int,
    namespace: int,
    seq: int,
    sec: int,
    nsec: int,
    e2e_type: int = E2E_TYPE,
    opt_len: int = 22,
    ioam_type: int = 3,
) -> bytes:
    """The 32-byte Destination Options header with the E2E option (schemas/IOAM.md)."""
    opt = struct.pack("!BBBBHHQII", DOH_OPT, opt_len, 0, ioam_type, namespace, e2e_type, seq, sec, nsec)
    return bytes([next_header, 3, 1, 0]) + opt + bytes([1, 2, 0, 0])


def altmark_doh(flowmon: int, colour: int, next_header: int = 43) -> bytes:
    return struct.pack("!BBBBI", next_header, 0, 0x12, 4, flowmon << 12 | (0x800 if colour else 0))


def outer(body: bytes, first_nh: int, dst: str = "fc00:2::e", hlim: int = 63, tclass: int = 0) -> bytes:
    return eth() + ipv6_hdr("fc00:12::1", dst, first_nh, len(body), tclass=tclass, hlim=hlim) + body


def encapped(travel: list[str] = POLICY, payload: bytes = b"x" * 32, doh: bytes | None = None, **inner) -> bytes:
    """Outer IPv6 + [AltMark DOH] + SRH + inner IPv6/UDP, as A's seg6 encap (+ altmark_tx) writes it."""
    body = srh(travel) + (inner_packet(payload, **inner))
    if doh is not None:
        return outer(doh + body, 60, dst=travel[0])
    return outer(body, 43, dst=travel[0])


def inner_packet(
    payload: bytes,
    src: str = "fd00:a::1",
    dst: str = "fd00:b::1",
    proto: int = 17,
    sport: int = 40000,
    dport: int = 9000,
) -> bytes:
    if proto == 17:
        l4 = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload
    elif proto == 6:
        l4 = struct.pack("!HHIIBBHHH", sport, dport, 1, 0, 5 << 4, 0x10, 1000, 0, 0) + payload
    else:
        l4 = payload
    return ipv6_hdr(src, dst, proto, len(l4)) + l4


def instrumented(
    trace: Trace,
    e2e: bytes | None,
    travel: list[str] = POLICY,
    doh: bytes | None = None,
    payload: bytes = b"y" * 24,
    hlim: int = 61,
) -> bytes:
    """An instrumented packet at the egress: IPv6 | HBH | [DOH] | SRH | [E2E] | inner."""
    s = srh(travel, nexthdr=60 if e2e is not None else 41, segleft=0)
    body = trace.pack() + (doh or b"") + s + (e2e or b"") + inner_udp(payload)
    return outer(body, 0, dst=travel[-1], hlim=hlim)


def parse_instrumented(frame: bytes) -> dict:
    """Split a frame ioam_tx wrote into its headers (offsets from IOAM.md); raises on a wrong layout."""
    ip = frame[14:54]
    assert ip[6] == 0, "outer next header must be Hop-by-Hop"
    plen = struct.unpack_from("!H", ip, 4)[0]
    off = 54
    hbh_len = (frame[off + 1] + 1) * 8
    hbh = frame[off : off + hbh_len]
    off += hbh_len
    nh = hbh[0]
    doh = b""
    if nh == 60:
        doh = frame[off : off + (frame[off + 1] + 1) * 8]
        nh = doh[0]
        off += len(doh)
    assert nh == 43, f"the header after HBH [DOH] must be the SRH, got {nh}"
    srh_len = (frame[off + 1] + 1) * 8
    srh_b = frame[off : off + srh_len]
    off += srh_len
    assert srh_b[0] == 60, "the SRH must be followed by the E2E DOH"
    e2e = frame[off : off + 32]
    off += 32
    return {"ip": ip, "plen": plen, "hbh": hbh, "doh": doh, "srh": srh_b, "e2e": e2e, "inner": frame[off:]}


def decode_hbh(hbh: bytes) -> dict:
    """The trace fields of an HBH as IOAM.md draws it (PadN(2) then the option at offset 4)."""
    assert hbh[2:4] == b"\x01\x00"
    otype, olen, _res, itype, ns, b10, b11 = struct.unpack_from("!BBBBHBB", hbh, 4)
    ttype = struct.unpack_from("!I", hbh, 12)[0] >> 8
    slots = (olen - 10) // 16
    rem = b11 & 0x7F
    entries = [Node.unpack(hbh[16 + 16 * i : 32 + 16 * i]) for i in range(slots)]
    return {
        "next_header": hbh[0],
        "hdr_ext_len": hbh[1],
        "opt_type": otype,
        "opt_len": olen,
        "ioam_type": itype,
        "namespace": ns,
        "node_len": b10 >> 3,
        "flags": (b10 & 7) << 1 | b11 >> 7,
        "remaining": rem,
        "trace_type": ttype,
        "reserved": hbh[15],
        "slots": slots,
        "entries": entries,
    }


def decode_e2e(e2e: bytes) -> dict:
    nh, hlen, p0, p1, otype, olen, _res, itype, ns, etype, seq, sec, nsec = struct.unpack_from("!BBBBBBBBHHQII", e2e, 0)
    return {
        "next_header": nh,
        "hdr_ext_len": hlen,
        "padn": (p0, p1),
        "opt_type": otype,
        "opt_len": olen,
        "ioam_type": itype,
        "namespace": ns,
        "e2e_type": etype,
        "seq": seq,
        "sec": sec,
        "nsec": nsec,
        "tail": e2e[28:32],
    }


def strip_ioam(frame: bytes) -> bytes:
    """The frame as it was before ioam_tx: HBH and E2E DOH removed, next headers and length restored."""
    p = parse_instrumented(frame)
    srh_b = bytes([p["e2e"][0]]) + p["srh"][1:]
    body = p["doh"] + srh_b + p["inner"]
    ip = bytearray(p["ip"])
    ip[6] = p["hbh"][0]
    struct.pack_into("!H", ip, 4, p["plen"] - len(p["hbh"]) - 32)
    return frame[:14] + bytes(ip) + body


def srh_with_tlv(travel: list[str], tlv_len: int, nexthdr: int = 41) -> bytes:
    """An SRH with a PadN TLV (RFC 8754 §2.1.1) of tlv_len bytes after the segments."""
    base = srh(travel, nexthdr=nexthdr)
    tlvs = bytes([4, tlv_len - 2]) + bytes(tlv_len - 2)  # Pad TLV type 4 (PadN)
    out = bytearray(base + tlvs)
    out[1] = (len(out) - 8) // 8
    return bytes(out)


def udp_seq(frame: bytes, port: int = 9000) -> int | None:
    """The sequence number of a test datagram (first 8 payload bytes) in a frame: outer IPv6 and
    up to 8 extension headers (HBH, DOHs, SRH) before the inner IPv6/UDP, or a plain IPv6/UDP frame."""
    if len(frame) < 54 or frame[12:14] != b"\x86\xdd":
        return None
    off, nh = 54, frame[20]
    for _ in range(8):
        if nh in (0, 43, 60):
            if len(frame) < off + 2:
                return None
            nh, off = frame[off], off + (frame[off + 1] + 1) * 8
            continue
        if nh == 41 and len(frame) >= off + 40:
            nh, off = frame[off + 6], off + 40
            continue
        if nh == 17 and len(frame) >= off + 16 and struct.unpack_from("!H", frame, off + 2)[0] == port:
            return struct.unpack_from("!Q", frame, off + 8)[0]
        return None
    return None
