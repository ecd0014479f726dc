"""ioam_rx's TC ingress entry (`attach --hook tc`) on non-linear skbs: real frames over a veth.

BPF_PROG_TEST_RUN hands a TC program a linear skb (and refuses a frame above about 3.7 KB: one
page less the skb's headroom and shared info), and the other tests' traffic is small, so its
bpf_skb_pull_data (pull_headers in datapath/ioam_rx.bpf.c) is reached only here. The frames leave
an AF_PACKET socket with PACKET_VNET_HDR: the kernel (net/packet/af_packet.c, packet_snd and
packet_alloc_skb) puts max(vnet hdr_len, Ethernet header) bytes in the skb's head and the rest in
page fragments once the frame and the device's headroom reach a page, and a veth without XDP or
GRO hands that skb to its peer as it is. (Without PACKET_VNET_HDR, hdr_len is 0: a frame this large
arrives with its Ethernet header alone linear too, measured on 6.18.) So the test picks where the
linear part ends (SPLITS), or puts the whole frame in the head (hdr_len = the frame's length: a
linear skb, the reference). The frames are 5000 and 8900 bytes (a 9000-byte MTU on both ends).

Per frame and per split, observed independently of ioam_rx: a test-only TC program
(datapath/skb_linear_probe.bpf.c) at a priority before ioam_rx's filter reports the skb's linear
length, skb->len and page fragments (the skb really was non-linear as sent), the same program after
it reports what ioam_rx's pull made linear; a packet socket of the frame's ethertype on the
receiving device (delivered after TC ingress: __netif_receive_skb_core, ptype_specific) gets the
frame byte for byte. Run twice: alone, and with a tap on the receiving device (an ETH_P_ALL packet
socket, as tcpdump opens: delivered before TC ingress, it keeps a clone, so ioam_rx pulls a cloned
skb; the probe sees it cloned before and unshared after, and the tap's copy is the frame as sent).
Asserted: ioam_rx's counters moved by exactly the oracle's one counter (tests/fuzz/ioam_oracle.py,
written from the RFCs and schemas/IOAM.md), the ring buffer got the oracle's record or none, and
the counters and the record (receive time aside) are the same for every split as for the linear
reference. Frames: instrumented packets with a large inner payload (recorded ones and foreign or
malformed ones: unknown namespaces, a trace option running past its header, an E2E option of the
wrong length, the IPv6 payload ending in the HBH or the SRH, no HBH, IPv4) and every hand-written
vector of test_ioam_rx.py with a trailer to 5000 bytes (the oracle's verdict on the padded frame).
"""

from __future__ import annotations

import os
import select
import socket
import struct
import subprocess
import time
from typing import NamedTuple

import numpy as np
import pytest

from segscope_schemas.ioam_record import IOAM_RECORD_DTYPE
from tests.datapath.altmark_env import inner_udp, srh
from tests.datapath.dp_env import in_netns
from tests.datapath.ioam_env import (
    BUILD,
    IOAM_RX,
    PIN_ROOT,
    RX_COUNTERS,
    Node,
    Trace,
    altmark_doh,
    e2e_doh,
    instrumented,
    outer,
    run,
)
from tests.datapath.test_ioam_rx import _cases
from tests.fuzz.bpf_testrun import PinnedProgram, RingReader
from tests.fuzz.ioam_frames import FLOWS, FLOWS_CLI, OTHER, POLICY, SIX, UNMONITORED
from tests.fuzz.ioam_oracle import verdict
from tests.isolation import own_name

pytestmark = pytest.mark.datapath

PREFIX = os.environ.get("SEGSCOPE_IOAM_NONLINEAR_PREFIX") or own_name("iorxnl")
SEND_NS, RECV_NS = f"{PREFIX}s", f"{PREFIX}r"
SEND_DEV, RECV_DEV = f"{PREFIX}s0", f"{PREFIX}r0"
INST = PREFIX  # ioam_rx's pins: PIN_ROOT/INST/ioam_rx
PROBE_DIR = PIN_ROOT / f"{PREFIX}probe"
PROBE_OBJ = BUILD / "skb_linear_probe.bpf.o"
MTU = 9000
NODE_ID, TAI_OFFSET = 9, 37
NS = 123

IORX_TC_PRIO = 0xA19  # ioam_rx's filter (datapath/ioam_rx.c, IORX_TC_HANDLE)
PROBE_BEFORE_PRIO, PROBE_AFTER_PRIO = 1, 0xB00
STAGE_BEFORE, STAGE_AFTER = 1, 2

SOL_PACKET, PACKET_VNET_HDR = 263, 15
ETH_P_ALL, ETH_P_IP, ETH_P_IPV6 = 0x0003, 0x0800, 0x86DD
SO_RCVBUFFORCE = 33
L4_OFF = 14 + 40
# where the skb's linear part ends as sent: behind the Ethernet header; behind the IPv6 header; inside the
# trace option's header (after its Namespace-ID); 200, inside the E2E option of a 4-slot trace, inside the
# node data of a longer one
SPLITS = (14, 54, 65, 200)


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if check and p.returncode:
        raise AssertionError(f"{' '.join(cmd)} -> {p.returncode}: {p.stderr}")
    return p


def in_ns(ns: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    """nsenter, not `ip netns exec`: the latter mounts a new /sys, without the bpffs pins."""
    return sh("nsenter", f"--net=/run/netns/{ns}", *cmd, check=check)


def vnet_hdr(linear: int) -> bytes:
    """struct virtio_net_hdr: no checksum offload, VIRTIO_NET_HDR_GSO_NONE, hdr_len = the bytes the
    kernel puts in the skb's head (a packet socket's header is legacy virtio: the host's byte order)."""
    return struct.pack("=BBHHHH", 0, 0, linear, 0, 0, 0)


def pulled(frame: bytes, linear: int) -> int:
    """What datapath/README.md ("XDP or TC ingress") says the TC entry makes linear: the Ethernet
    and IPv6 headers and, for an IPv6 packet with a Hop-by-Hop header, the IPv6 payload (as far as
    the frame goes); what already is linear stays."""
    want = min(len(frame), L4_OFF)
    if len(frame) >= L4_OFF and frame[12:14] == b"\x86\xdd" and frame[20] == 0:
        want = min(len(frame), L4_OFF + struct.unpack_from("!H", frame, 18)[0])
    return max(linear, want)


class SkbView(NamedTuple):
    """One event of the probe (struct skb_linear_event)."""

    stage: int
    linear: int  # data_end - data
    len: int  # skb->len
    ifindex: int
    nr_frags: int
    cloned: int


def expected_views(frame: bytes, linear: int, tap: bool, ifindex: int) -> list[SkbView]:
    """What the probe must see before and after ioam_rx (nr_frags as 0 or 1: some or none): as
    sent, and after the pull; a tap's clone shares the skb's data until the pull copies its head
    (pskb_expand_head: no longer cloned), an skb not pulled stays as it came."""
    n, after = len(frame), pulled(frame, linear)
    return [
        SkbView(STAGE_BEFORE, linear, n, ifindex, int(linear < n), int(tap)),
        SkbView(STAGE_AFTER, after, n, ifindex, int(after < n), int(tap and after == linear)),
    ]


class Link:
    """The sending socket, the receiving packet sockets, the probe's and ioam_rx's outputs."""

    def __init__(self, recv_ifindex: int):
        self.recv_ifindex = recv_ifindex
        with in_netns(SEND_NS):
            self.tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
            self.tx.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
            self.tx.bind((SEND_DEV, 0))
        self.rx = {}
        with in_netns(RECV_NS):
            for ethertype in (ETH_P_IPV6, ETH_P_IP):
                s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ethertype))
                s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 1 << 22)
                s.bind((RECV_DEV, ethertype))
                s.setblocking(False)
                self.rx[ethertype] = s
        self.tap = None
        self.probe = RingReader(PROBE_DIR / "maps" / "skb_linear_events")
        pin = PIN_ROOT / INST / "ioam_rx"
        self.counters = PinnedProgram(pin / "prog_tc", pin / "ioam_rx_stats", len(RX_COUNTERS)).counters
        self.records = RingReader(pin / "ioam_records")

    def open_tap(self) -> None:
        """An ETH_P_ALL packet socket on the receiving device (what tcpdump opens): a tap, delivered
        before TC ingress, that keeps a clone, so ioam_rx's pull meets a cloned skb and unshares it."""
        with in_netns(RECV_NS):
            self.tap = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            self.tap.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 1 << 22)
            self.tap.bind((RECV_DEV, ETH_P_ALL))
            self.tap.setblocking(False)

    def close_tap(self) -> None:
        if self.tap is not None:
            self.tap.close()
            self.tap = None

    def drain(self) -> None:
        self.probe.drain()
        self.records.drain()
        for s in [*self.rx.values(), *([self.tap] if self.tap else [])]:
            while True:
                try:
                    s.recv(65536)
                except BlockingIOError:
                    break

    def send(self, frame: bytes, linear: int) -> dict:
        """One frame with hdr_len `linear`; what the receiver, the probe and ioam_rx saw of it."""
        before = self.counters()
        t0 = time.clock_gettime_ns(time.CLOCK_TAI)
        assert self.tx.send(vnet_hdr(linear) + frame) == 10 + len(frame)
        sock = self.rx[struct.unpack_from("!H", frame, 12)[0]]
        ready, _, _ = select.select([sock], [], [], 2.0)
        got = sock.recv(65536) if ready else None
        tapped = None  # the tap's copy, if a tap is open
        if self.tap is not None and select.select([self.tap], [], [], 2.0)[0]:
            tapped = self.tap.recv(65536)
        t1 = time.clock_gettime_ns(time.CLOCK_TAI)  # TC ingress ran before the socket got the frame
        after = self.counters()
        seen = {
            "received": got,
            "probe": [SkbView(*struct.unpack("<IIIIBBxx", e)) for e in self.probe.drain()],
            "moved": {RX_COUNTERS[i]: after[i] - before[i] for i in range(len(after)) if after[i] != before[i]},
            "records": self.records.drain(),
            "window": (t0, t1),
        }
        if self.tap is not None:
            seen["tapped"] = tapped
        return seen

    def close(self) -> None:
        self.close_tap()
        self.probe.close()
        self.records.close()
        self.tx.close()
        for s in self.rx.values():
            s.close()


@pytest.fixture(scope="module")
def link(io_build):
    """SEND_NS:SEND_DEV -> RECV_NS:RECV_DEV, both MTU 9000 and without IPv6 (nothing but the test's
    frames on the link); ioam_rx --hook tc on RECV_DEV's ingress with the oracle's flows, the probe
    before and after it."""
    for ns in (SEND_NS, RECV_NS):
        sh("ip", "netns", "del", ns, check=False)
        sh("ip", "netns", "add", ns)
        in_ns(ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
    sh("rm", "-rf", str(PROBE_DIR))
    try:
        sh("ip", "link", "add", SEND_DEV, "mtu", str(MTU), "netns", SEND_NS, "type", "veth",
           "peer", "name", RECV_DEV, "mtu", str(MTU), "netns", RECV_NS)  # fmt: skip
        in_ns(SEND_NS, "ip", "link", "set", SEND_DEV, "up")
        in_ns(RECV_NS, "ip", "link", "set", RECV_DEV, "address", "02:00:00:00:00:02", "up")
        run(IOAM_RX, "attach", "--netns", RECV_NS, "--dev", RECV_DEV, "--instance", INST, "--hook", "tc",
            "--node-id", str(NODE_ID), "--tai-offset", str(TAI_OFFSET))  # fmt: skip
        for sids, fid, namespace in FLOWS_CLI:
            run(IOAM_RX, "add-flow", "--instance", INST, "--sids", ",".join(sids), "--flow-id", str(fid),
                "--namespace-id", str(namespace))  # fmt: skip
        PROBE_DIR.mkdir(parents=True)
        sh("bpftool", "prog", "loadall", str(PROBE_OBJ), str(PROBE_DIR / "prog"), "type", "classifier",
           "pinmaps", str(PROBE_DIR / "maps"))  # fmt: skip
        for prio, prog in ((PROBE_BEFORE_PRIO, "skb_linear_before"), (PROBE_AFTER_PRIO, "skb_linear_after")):
            in_ns(RECV_NS, "tc", "filter", "add", "dev", RECV_DEV, "ingress", "prio", str(prio), "handle", "1",
                  "bpf", "da", "object-pinned", str(PROBE_DIR / "prog" / prog))  # fmt: skip
        filters = in_ns(RECV_NS, "tc", "filter", "show", "dev", RECV_DEV, "ingress").stdout
        prios = [int(w.split()[0]) for w in filters.split(" pref ")[1:] if "handle" in w]
        names = [w.split(":[")[0].split()[-1] for w in filters.splitlines() if "handle" in w]
        assert list(zip(prios, names)) == [
            (PROBE_BEFORE_PRIO, "skb_linear_before"),
            (IORX_TC_PRIO, "ioam_rx_tc"),
            (PROBE_AFTER_PRIO, "skb_linear_after"),
        ], filters
        with in_netns(RECV_NS):
            ifindex = socket.if_nametoindex(RECV_DEV)
        lk = Link(ifindex)
        try:
            yield lk
        finally:
            lk.close()
    finally:
        run(IOAM_RX, "detach", "--netns", RECV_NS, "--dev", RECV_DEV, "--instance", INST, check=False)
        for ns in (SEND_NS, RECV_NS):
            sh("ip", "netns", "del", ns, check=False)
        sh("rm", "-rf", str(PROBE_DIR))


def nodes(n: int) -> list[Node]:
    return [Node(64 - i, 100 + i, 10 + i, 20 + i, 1_795_000_000 + i, 1000 * i + 7) for i in range(n)]


def big(trace: Trace, e2e: bytes | None, size: int, travel: list[str] = POLICY, doh: bytes | None = None) -> bytes:
    """An instrumented packet of `size` bytes: the inner UDP payload fills it, the IPv6 Payload
    Length covers it all (so the TC entry makes all of it linear)."""
    short = instrumented(trace, e2e, travel=travel, doh=doh, payload=b"")
    return instrumented(trace, e2e, travel=travel, doh=doh, payload=bytes(i & 0xFF for i in range(size - len(short))))


def with_plen(frame: bytes, plen: int) -> bytes:
    return frame[:18] + struct.pack("!H", plen) + frame[20:]


def large_cases() -> list[tuple[str, bytes]]:
    e2e = e2e_doh(41, NS, 0x0102030405060708, 1_795_000_100, 123_456_789)
    t = Trace(43, NS, 4, nodes(2))
    out = []
    for size in (5000, 8900):
        base = big(t, e2e, size)
        out += [
            (f"recorded_{size}", base),
            (f"recorded_after_altmark_doh_{size}", big(Trace(60, NS, 4, nodes(2)), e2e, size, doh=altmark_doh(5, 1))),
            (f"recorded_14_of_14_{size}", big(Trace(43, NS, 14, nodes(14)), e2e, size)),
            (f"recorded_other_flow_{size}", big(Trace(43, 200, 1, nodes(1)), e2e_doh(41, 200, 9, 2, 3), size, OTHER)),
            (f"recorded_six_sids_{size}", big(t, e2e, size, SIX)),
        ]
    size = 5000
    out += [
        ("trace_unknown_namespace", big(Trace(43, 124, 4, nodes(2)), e2e, size)),
        ("e2e_unknown_namespace", big(t, e2e_doh(41, 124, 1, 2, 3), size)),
        ("unmonitored", big(t, e2e, size, UNMONITORED)),
        ("no_e2e", big(t, None, size)),
        ("e2e_nsec_1e9", big(t, e2e_doh(41, NS, 1, 2, 1_000_000_000), size)),
        ("e2e_option_len_21", big(t, e2e_doh(41, NS, 1, 2, 3, opt_len=21), size)),
        # the trace option says 16 bytes more than its header holds: it runs past the HBH
        ("trace_option_truncated", big(Trace(43, NS, 2, nodes(1), opt_len=10 + 48), e2e, size)),
        ("trace_type_f80000", big(Trace(43, NS, 2, nodes(1), trace_type=0xF80000), e2e, size)),
        # the IPv6 payload ends inside the HBH; the rest of the frame is a trailer (it stays non-linear)
        ("payload_ends_in_hbh", with_plen(base, 40)),
        ("payload_ends_in_srh", with_plen(base, len(t.pack()) + 20)),
        ("srv6_without_ioam", outer(srh(POLICY, segleft=0) + inner_udp(bytes(size - 150)), 43, dst=POLICY[-1])),
        ("ipv4", bytes.fromhex("020000000002020000000001") + b"\x08\x00" + bytes(size - 14)),
    ]
    return out


def padded_vectors(size: int = 5000) -> list[tuple[str, bytes]]:
    """test_ioam_rx.py's hand-written vectors, zeros after them to `size` bytes."""
    return [(f"vector_{name}", frame + bytes(size - len(frame))) for name, frame, *_ in _cases()]


def problems_of(frame: bytes, linear: int, seen: dict, recv_ifindex: int) -> list[str]:
    out = []
    v = verdict(frame, FLOWS, NODE_ID, TAI_OFFSET)
    if seen["received"] != frame:
        got = seen["received"]
        out.append("the receiver did not get the frame" if got is None else f"the receiver got {len(got)} other bytes")
    if "tapped" in seen and seen["tapped"] != frame:
        out.append("the tap did not get the frame as sent")
    views = [v._replace(nr_frags=int(v.nr_frags > 0)) for v in seen["probe"]]
    want_views = expected_views(frame, linear, "tapped" in seen, recv_ifindex)
    if views != want_views:
        out.append(f"probe {views}, expected {want_views}")
    if seen["moved"] != {v.counter: 1}:
        out.append(f"counters moved {seen['moved']}, oracle {v.counter}")
    recs = seen["records"]
    if len(recs) != (v.record is not None):
        out.append(f"{len(recs)} records, oracle {int(v.record is not None)}")
    elif recs:
        rec = np.frombuffer(recs[0], dtype=IOAM_RECORD_DTYPE)[0]
        want = v.record | {"ifindex": recv_ifindex}
        got = {k: int(rec[k]) for k in want if k != "entries"}
        if got != {k: w for k, w in want.items() if k != "entries"}:
            out.append(f"record {got}, oracle {want}")
        if rec["entries"].tobytes() != want["entries"]:
            out.append("record entries differ from the oracle's")
        t0, t1 = seen["window"]
        if not t0 <= int(rec["rx_tai_ns"]) <= t1:
            out.append(f"rx_tai_ns {int(rec['rx_tai_ns'])} outside the send [{t0}, {t1}]")
    return out


@pytest.fixture(params=["alone", "with_tap"])
def tapped_link(link, request):
    """The link alone, or with a tap on the receiving device (ioam_rx then pulls a cloned skb)."""
    if request.param == "with_tap":
        link.open_tap()
    try:
        yield link
    finally:
        link.close_tap()


def test_nonlinear_skbs_give_what_linear_ones_give(tapped_link):
    """Every frame at every split: non-linear at TC ingress as sent, delivered unchanged (to the
    tap too), the oracle's counter and record, and the same counter and record as the frame sent
    linear."""
    link = tapped_link
    cases = large_cases() + padded_vectors()
    failures, outcomes, nonlinear, sends = [], {}, 0, 0
    link.drain()
    for name, frame in cases:
        assert len(frame) > 4096 and len(frame) <= MTU + 14, (name, len(frame))
        reference = None
        for linear in (len(frame), *SPLITS):  # the linear reference first
            seen = link.send(frame, linear)
            sends += 1
            problems = problems_of(frame, linear, seen, link.recv_ifindex)
            outcome = (seen["moved"], [r[8:] for r in seen["records"]])  # r[:8]: the receive time
            if reference is None:
                reference = outcome
            elif outcome != reference:
                problems.append(f"counters or record differ from the linear frame's: {outcome[0]}, {reference[0]}")
            first = seen["probe"][0] if seen["probe"] else None
            if first and first.stage == STAGE_BEFORE and first.linear < first.len and first.nr_frags > 0:
                nonlinear += 1  # the probe before ioam_rx saw it non-linear, in page fragments
            if problems:
                failures.append(f"{name} ({len(frame)} B) linear {linear}: {'; '.join(problems)}")
        counter = next(iter(reference[0]), "none")
        outcomes[counter] = outcomes.get(counter, 0) + 1
    assert not failures, f"{len(failures)} of {sends} sends disagree; the first ones:\n" + "\n".join(failures[:12])
    assert nonlinear == len(cases) * len(SPLITS)
    # the frames reach the recorded paths and the foreign / malformed ones
    want = {"recorded", "recorded_truncated", "pass_truncated", "pass_bad_length", "pass_unknown_namespace",
            "pass_unknown_type", "pass_unmonitored", "pass_no_e2e", "pass_bad_timestamp", "pass_no_hbh",
            "pass_not_ipv6", "pass_no_srh", "pass_too_many_sids", "pass_malformed_srh", "pass_no_trace"}  # fmt: skip
    assert want <= set(outcomes), want - set(outcomes)
    assert outcomes["recorded"] >= 10
