"""In-line IOAM end to end in the netlab line5 network (H1 - A - R - B - H2), real kernels.

H1 sends kernel-socket UDP to H2 through A's policy `encap seg6 mode encap segs fc00:2::e,fc00:3::d6`.
ioam_tx on A's a0 (TC egress, after the encap) instruments sampled packets; R (End) is an IOAM
transit node: its kernel fills its trace entry (net.ipv6.ioam6_id=7, r0 id 70, r1 id 71,
namespace 123); ioam_rx on B's b0 (XDP, before End.DT6; one test with --hook tc, a TC ingress
filter) records them; End.DT6 decapsulates.

Ground truth: the datagrams the test sends (sequence number in the payload), the frames captured
on R's r0 (what left A) and H2's h2 (what H2 got) with and without the flow installed, the node and
interface ids the test configured, the device MTU."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import time

import pytest

from tests.datapath.altmark_env import (
    Capture,
    Receiver,
    expect_all,
    retry_on_path_loss,
    send_udp,
    udp_sender,
)
from tests.datapath.ioam_env import (
    ALTMARK_RX,
    ALTMARK_TX,
    IOAM_RX,
    IOAM_TX,
    NS_PER_S,
    POLICY,
    TRACE_TYPE,
    Node,
    decode_e2e,
    decode_hbh,
    delta,
    dump,
    flow,
    parse_instrumented,
    run,
    stats,
    strip_ioam,
    udp_seq,
)
from tests.datapath.ioam_fixtures import LAB_IF_IDS, LAB_NAMESPACE, LAB_NODES

H2_ADDR = "fd00:b::1"
CPU = sorted(os.sched_getaffinity(0))[0]
SLOTS = 4


def tai_utc_offset_s() -> int:
    """The kernel's TAI - UTC (what the loaders read with adjtimex when no --tai-offset is given)."""
    return round((time.clock_gettime_ns(time.CLOCK_TAI) - time.clock_gettime_ns(time.CLOCK_REALTIME)) / NS_PER_S)


@contextlib.contextmanager
def ioam_flow(io_lab, every: int = 1, flow_id: int = 7):
    run(
        io_lab.tx_tool, "add-flow", "--instance", io_lab.tx_inst, "--sids", ",".join(POLICY), "--flow-id", str(flow_id),
        "--namespace-id", str(LAB_NAMESPACE), "--node-id", str(LAB_NODES["A"]), "--trace-nodes", str(SLOTS),
        "--sample-every", str(every),
    )  # fmt: skip
    run(
        IOAM_RX, "add-flow", "--instance", io_lab.rx_inst, "--sids", ",".join(POLICY), "--flow-id", str(flow_id),
        "--namespace-id", str(LAB_NAMESPACE),
    )  # fmt: skip
    try:
        yield
    finally:
        run(io_lab.tx_tool, "del-flow", "--instance", io_lab.tx_inst, "--flow-id", str(flow_id), check=False)
        run(IOAM_RX, "del-flow", "--instance", io_lab.rx_inst, "--flow-id", str(flow_id), check=False)


def by_seq(frames: list[bytes]) -> dict[int, bytes]:
    out = {}
    for f in frames:
        seq = udp_seq(f)
        if seq is not None:
            out[seq] = f
    return out


def as_sent_by_a(frame: bytes) -> bytes:
    """A frame captured on R's r0 with R's End undone: the packet socket's copy shares its data with
    the packet R processes, and End rewrites the outer destination and Segments Left in place (an
    instrumented packet keeps them: the kernel's IOAM fill copies the data before it writes the
    trace). Every other byte is compared as captured."""
    f = bytearray(frame)
    off, nh = 54, f[20]
    while nh in (0, 60):
        nh, off = f[off], off + (f[off + 1] + 1) * 8
    assert nh == 43 and f[off + 2] == 4
    f[38:54] = socket.inet_pton(socket.AF_INET6, POLICY[0])
    f[off + 3] = len(POLICY) - 1
    return bytes(f)


def baseline_and_measured(io_lab, n, every=1, payload_len=64):
    """The same n datagrams (one socket: same ports and flow label) sent twice, without and with
    the flow: frames on R's r0 and H2's h2 by sequence number, the datagrams H2's socket got, and
    the records ioam_rx wrote for the second round."""
    lab = io_lab.lab
    sock = udp_sender(lab.ns("H1"))
    try:

        def attempt():
            dump(io_lab.rx_inst)  # an empty ring
            r0, h2 = Capture(lab.ns("R"), "r0"), Capture(lab.ns("H2"), "h2")
            rx = Receiver(lab.ns("H2"), H2_ADDR)
            try:
                send_udp(lab.ns("H1"), H2_ADDR, n, [CPU], payload_len=payload_len, sock=sock)
                base_r0, base_h2 = by_seq(r0.frames(n)), by_seq(h2.frames(n))
                with ioam_flow(io_lab, every):
                    before_tx, before_rx = stats(io_lab.tx_tool, io_lab.tx_inst), stats(IOAM_RX, io_lab.rx_inst)
                    send_udp(lab.ns("H1"), H2_ADDR, n, [CPU], payload_len=payload_len, sock=sock)
                    got_r0, got_h2 = by_seq(r0.frames(n)), by_seq(h2.frames(n))
                    datagrams = rx.drain(2 * n)
                    n_rec = len(range(0, n, every))
                    records = dump(io_lab.rx_inst, count=n_rec, timeout_ms=3000) if n_rec else []
                    d_tx = delta(before_tx, stats(io_lab.tx_tool, io_lab.tx_inst))
                    d_rx = delta(before_rx, stats(IOAM_RX, io_lab.rx_inst))
                    tx_flow = flow(io_lab.tx_tool, io_lab.tx_inst, 7)
            finally:
                for c in (r0, h2, rx):
                    c.close()
            for what, got in (("r0 baseline", base_r0), ("h2 baseline", base_h2), ("r0", got_r0), ("h2", got_h2)):
                expect_all(f"frames on {what}", len(got), n)
            expect_all("datagrams at H2", len(datagrams), 2 * n)
            return base_r0, base_h2, got_r0, got_h2, datagrams, records, d_tx, d_rx, tx_flow

        return retry_on_path_loss(attempt)
    finally:
        sock.close()


def check_path(rec: dict, r0_frame: bytes, offset_s: int) -> None:
    """One record against the frame that left A: A's entry as inserted, R's filled by R's kernel."""
    p = parse_instrumented(r0_frame)
    hop_limit_at_r = r0_frame[14 + 7]
    e2e = decode_e2e(p["e2e"])
    mine = decode_hbh(p["hbh"])["entries"][-1]
    assert rec["seq"] == e2e["seq"] and rec["tx_tai_ns"] == e2e["sec"] * NS_PER_S + e2e["nsec"]
    assert (rec["namespace_id"], rec["slots"], rec["filled"], rec["trace_type"]) == (
        LAB_NAMESPACE,
        SLOTS,
        2,
        TRACE_TYPE,
    )
    assert (rec["flow_id"], rec["node_id"], rec["tai_utc_offset_s"], rec["flags"], rec["trace_flags"]) == (
        7,
        LAB_NODES["B"],
        offset_s,
        0,
        0,
    )
    assert rec["hop_limit"] == hop_limit_at_r - 1  # R forwarded it
    r_entry, a_entry = (Node(**{k: e[v] for k, v in ENTRY_KEYS.items()}) for e in rec["entries"])
    assert a_entry == mine, "A's entry arrives as A wrote it"
    assert (a_entry.hop_limit, a_entry.node_id, a_entry.in_if, a_entry.out_if) == (
        hop_limit_at_r,
        LAB_NODES["A"],
        LAB_IF_IDS[("A", "ah")],
        LAB_IF_IDS[("A", "a0")],
    )
    # R's kernel: its node id, the hop limit after its decrement, r0 in; the egress id is the one of
    # the device of the route the kernel has when it reads the HBH: for R's End SID that is the
    # seg6local route (`fc00:2::e/128 ... dev r0` in line5), not r1, which the packet leaves by after End
    assert (r_entry.hop_limit, r_entry.node_id, r_entry.in_if, r_entry.out_if) == (
        hop_limit_at_r - 1,
        LAB_NODES["R"],
        LAB_IF_IDS[("R", "r0")],
        LAB_IF_IDS[("R", "r0")],
    )
    # timestamps increase along the path (UTC microseconds; the record's receive time is TAI ns)
    a_us, r_us = a_entry.sec * 1_000_000 + a_entry.subsec, r_entry.sec * 1_000_000 + r_entry.subsec
    rx_us = (rec["rx_tai_ns"] - offset_s * NS_PER_S) // 1000
    assert a_us == (rec["tx_tai_ns"] - offset_s * NS_PER_S) // 1000
    assert a_us <= r_us <= rx_us, (a_us, r_us, rx_us)


ENTRY_KEYS = {
    "hop_limit": "hop_limit",
    "node_id": "node_id",
    "in_if": "ingress_if_id",
    "out_if": "egress_if_id",
    "sec": "ts_sec",
    "subsec": "ts_subsec",
}


def test_every_packet_instrumented_recorded_and_delivered_unchanged(io_lab, inserter):
    every_packet_instrumented_recorded_and_delivered_unchanged(io_lab)


def b0_hooks(io_lab) -> tuple[bool, str]:
    """Whether b0 has an XDP program, and its TC ingress filters as `tc filter show` lists them."""
    lab = io_lab.lab
    xdp = "prog/xdp" in lab.run("B", ["ip", "link", "show", "dev", "b0"], check=True).stdout
    return xdp, lab.run("B", ["tc", "filter", "show", "dev", "b0", "ingress"], check=True).stdout


@contextlib.contextmanager
def rx_on_tc_ingress(io_lab):
    """ioam_rx's instance on B's b0 re-attached with --hook tc (a TC ingress filter, no XDP on b0),
    then back on XDP as the session's fixture attached it."""
    b = ["--netns", io_lab.lab.ns("B"), "--dev", "b0", "--instance", io_lab.rx_inst]
    run(IOAM_RX, "detach", *b)
    run(IOAM_RX, "attach", *b, "--node-id", str(LAB_NODES["B"]), "--hook", "tc")
    try:
        yield
    finally:
        run(IOAM_RX, "detach", *b, check=False)
        run(IOAM_RX, "attach", *b, "--node-id", str(LAB_NODES["B"]))
    assert b0_hooks(io_lab) == (True, ""), "b0 back on XDP, no TC ingress filter left"


def test_tc_ingress_hook_records_every_packet_as_xdp_does(io_lab):
    """ioam_rx attached with --hook tc, on real traffic (ioam_tx at A, R's kernel filling its
    entry): the same checks as on XDP, the same records, H2 gets what it got without measurement;
    the hook really is TC (no XDP program on b0, ioam_rx_tc the ingress filter)."""
    with rx_on_tc_ingress(io_lab):
        xdp, filters = b0_hooks(io_lab)
        assert not xdp and "ioam_rx_tc" in filters and "direct-action" in filters
        every_packet_instrumented_recorded_and_delivered_unchanged(io_lab)
        json_stats = stats(IOAM_RX, io_lab.rx_inst)
        assert json_stats["recorded"] >= 40 and not json_stats["pass_truncated"]


def every_packet_instrumented_recorded_and_delivered_unchanged(io_lab) -> None:
    n = 40
    base_r0, base_h2, got_r0, got_h2, datagrams, records, d_tx, d_rx, tx_flow = baseline_and_measured(io_lab, n)
    offset = tai_utc_offset_s()
    # what left A: the baseline frame with exactly the two options inserted
    for seq in range(n):
        assert got_r0[seq] == as_sent_by_a(got_r0[seq]), "an instrumented packet reaches R unprocessed"
        assert strip_ioam(got_r0[seq]) == as_sent_by_a(base_r0[seq]), f"seq {seq}"
        assert decode_e2e(parse_instrumented(got_r0[seq])["e2e"])["seq"] == seq
    # what H2 got: byte for byte what it got without in-line measurement
    assert got_h2 == base_h2
    assert sorted(struct.unpack_from("!Q", d)[0] for d, _ in datagrams) == sorted(list(range(n)) * 2)
    # one record per packet, in order, each with A's and R's entries
    assert [r["seq"] for r in records] == list(range(n))
    for rec in records:
        check_path(rec, got_r0[rec["seq"]], offset)
    assert d_tx.get("instrumented") == n and d_rx.get("recorded") == n
    assert (tx_flow["seen"], tx_flow["sampled"], tx_flow["instrumented"], tx_flow["next_seq"]) == (n, n, n, n)


def test_one_in_ten_sampled_by_the_documented_rule(io_lab, inserter):
    """--sample-every 10: packet k of the flow (one sender, one CPU: the send order) is
    instrumented iff k % 10 == 0, with E2E sequence number k / 10."""
    n, every = 95, 10
    base_r0, base_h2, got_r0, got_h2, _, records, d_tx, d_rx, tx_flow = baseline_and_measured(io_lab, n, every)
    offset = tai_utc_offset_s()
    for seq in range(n):
        if seq % every:
            assert as_sent_by_a(got_r0[seq]) == as_sent_by_a(base_r0[seq]), f"seq {seq} must leave A unchanged"
        else:
            assert strip_ioam(got_r0[seq]) == as_sent_by_a(base_r0[seq])
            assert decode_e2e(parse_instrumented(got_r0[seq])["e2e"])["seq"] == seq // every
    assert got_h2 == base_h2
    assert [r["seq"] for r in records] == list(range(10))
    for rec in records:
        check_path(rec, got_r0[rec["seq"] * every], offset)
    assert d_tx.get("instrumented") == 10 and d_tx.get("pass_not_sampled") == n - 10 and d_rx.get("recorded") == 10
    assert (tx_flow["seen"], tx_flow["sampled"], tx_flow["next_seq"]) == (n, 10, 10)


def test_mtu_sized_packets_pass_uninstrumented_and_counted(io_lab, inserter):
    """a0 has MTU 1500; the encapsulation adds 80 bytes (IPv6 + SRH of 2 SIDs), ioam_tx 112 (trace
    of 4 slots + E2E). A packet that leaves A at 1388 bytes fits after the insertion; 1389 and the
    full 1500 do not: they go out unchanged, are delivered and counted."""
    lab = io_lab.lab
    sizes = {1260: "instrumented", 1261: "skip_mtu", 1372: "skip_mtu"}  # UDP payload -> outer IPv6 = 128 + payload

    def attempt():
        dump(io_lab.rx_inst)
        r0, rx = Capture(lab.ns("R"), "r0"), Receiver(lab.ns("H2"), H2_ADDR)
        try:
            with ioam_flow(io_lab):
                before = stats(io_lab.tx_tool, io_lab.tx_inst)
                for i, size in enumerate(sizes):
                    send_udp(lab.ns("H1"), H2_ADDR, 1, [CPU], payload_len=size, seq0=i)
                frames, got = by_seq(r0.frames(3)), rx.drain(3)
                d = delta(before, stats(io_lab.tx_tool, io_lab.tx_inst))
                f = flow(io_lab.tx_tool, io_lab.tx_inst, 7)
                records = dump(io_lab.rx_inst, count=1, timeout_ms=3000)
        finally:
            r0.close()
            rx.close()
        expect_all("frames on r0", len(frames), 3)
        expect_all("datagrams at H2", len(got), 3)
        return frames, got, d, f, records

    frames, got, d, f, records = retry_on_path_loss(attempt)
    for i, (size, outcome) in enumerate(sizes.items()):
        ip_len = 40 + struct.unpack_from("!H", frames[i], 18)[0]
        if outcome == "instrumented":
            assert frames[i][20] == 0 and ip_len == 128 + size + 112 == 1500
        else:
            assert frames[i][20] == 43 and ip_len == 128 + size, f"{size}: unchanged"
    assert sorted(len(dg) for dg, _ in got) == sorted(sizes)
    assert d.get("instrumented") == 1 and d.get("skip_mtu") == 2
    assert (f["sampled"], f["instrumented"], f["skipped_mtu"], f["next_seq"]) == (3, 1, 2, 1)
    assert [r["seq"] for r in records] == [0]


@contextlib.contextmanager
def altmark_on_both_edges(io_lab, method: str):
    """altmark_tx beside ioam_tx on a0; altmark_rx joins b0's XDP chain, where ioam_rx already runs
    (attached after it: the chain orders them by role, altmark_rx first)."""
    lab = io_lab.lab
    a, b = ["--netns", lab.ns("A"), "--dev", "a0"], ["--netns", lab.ns("B"), "--dev", "b0"]
    run(ALTMARK_TX, "attach", *a, "--instance", io_lab.tx_inst)
    run(ALTMARK_RX, "attach", *b, "--instance", io_lab.rx_inst)
    tx_flow = ["--sids", ",".join(POLICY), "--flow-id", "7", "--method", method, "--period-ms", "200"]
    rx_flow = tx_flow if method == "dscp" else ["--flowmon-id", "7", "--method", method, "--period-ms", "200"]
    run(ALTMARK_TX, "add-flow", "--instance", io_lab.tx_inst, *tx_flow)
    run(ALTMARK_RX, "add-flow", "--instance", io_lab.rx_inst, *rx_flow)
    try:
        with ioam_flow(io_lab):
            yield
    finally:
        run(ALTMARK_RX, "detach", *b, "--instance", io_lab.rx_inst, check=False)
        run(ALTMARK_TX, "detach", *a, "--instance", io_lab.tx_inst, check=False)


def altmark_packets(tool, inst) -> int:
    import json

    flows = json.loads(run(tool, "list-flows", "--instance", inst, "--json").stdout)["flows"]
    return sum(c["packets"] for c in flows[0]["counters"])


@pytest.mark.parametrize("method", ["dscp", "rfc9343"])
def test_with_alternate_marking_on_the_same_flow(io_lab, method):
    """altmark_tx then ioam_tx on a0 (TC priorities 0xa17, 0xa18: both see every packet, which
    needs altmark_tx's TC_ACT_UNSPEC), altmark_rx then ioam_rx on b0: the alternate-marking counts
    of both edges equal what was sent, and every packet is instrumented and recorded."""
    lab, n = io_lab.lab, 60
    am_stats_tx = "coloured_dscp" if method == "dscp" else "coloured_rfc9343"
    am_stats_rx = "counted_dscp" if method == "dscp" else "counted_rfc9343"

    def attempt():
        dump(io_lab.rx_inst)
        r0, rx = Capture(lab.ns("R"), "r0"), Receiver(lab.ns("H2"), H2_ADDR)
        try:
            with altmark_on_both_edges(io_lab, method):
                before = {t: stats(t, i) for t, i in ((ALTMARK_TX, io_lab.tx_inst), (ALTMARK_RX, io_lab.rx_inst))}
                send_udp(lab.ns("H1"), H2_ADDR, n, [CPU], gap_s=0.01)
                frames, got = by_seq(r0.frames(n)), rx.drain(n)
                records = dump(io_lab.rx_inst, count=n, timeout_ms=3000)
                d_am = {
                    t.name: delta(b, stats(t, i)) for (t, b), i in zip(before.items(), (io_lab.tx_inst, io_lab.rx_inst))
                }
                am = (altmark_packets(ALTMARK_TX, io_lab.tx_inst), altmark_packets(ALTMARK_RX, io_lab.rx_inst))
                f = flow(IOAM_TX, io_lab.tx_inst, 7)
        finally:
            r0.close()
            rx.close()
        expect_all("frames on r0", len(frames), n)
        expect_all("datagrams at H2", len(got), n)
        return frames, got, records, d_am, am, f

    frames, got, records, d_am, am, f = retry_on_path_loss(attempt)
    assert am == (n, n), "alternate marking: TX == RX == sent"
    assert d_am["altmark_tx"].get(am_stats_tx) == n and d_am["altmark_rx"].get(am_stats_rx) == n
    assert (f["instrumented"], f["next_seq"]) == (n, n)
    assert [r["seq"] for r in records] == list(range(n))
    offset = tai_utc_offset_s()
    colours = set()
    for frame in frames.values():
        p = parse_instrumented(frame)  # HBH first, then [AltMark DOH], SRH, E2E
        if method == "rfc9343":
            assert p["doh"][:4] == bytes([43, 0, 0x12, 4])
            colours.add(p["doh"][6] >> 3 & 1)  # L flag
        else:
            assert p["doh"] == b""
            colours.add((struct.unpack_from("!I", frame, 14)[0] >> 22) & 1)  # DSCP bit 0 = Traffic Class 0x04
    assert colours == {0, 1}, "600 ms of traffic spans blocks of both colours"
    for rec in records:
        check_path(rec, frames[rec["seq"]], offset)
    assert sorted(struct.unpack_from("!Q", d)[0] for d, _ in got) == list(range(n))


def udp6_in_csum_errors(lab, node: str) -> int:
    text = lab.run(node, ["cat", "/proc/net/snmp6"], check=True).stdout
    return int(next(line.split()[1] for line in text.splitlines() if line.startswith("Udp6InCsumErrors")))


def test_checksum_offload_pending_at_the_sender(io_lab):
    """H1's veth with tx checksum offload on: A receives the datagrams with their UDP checksum not
    yet computed (CHECKSUM_PARTIAL), encapsulates and instruments them; the checksum is completed
    on the way and H2 accepts every datagram (no Udp6InCsumErrors)."""
    lab, n = io_lab.lab, 30
    lab.run("H1", ["ethtool", "-K", "h1", "tx", "on"], check=True)
    try:

        def attempt():
            dump(io_lab.rx_inst)
            rx, r0 = Receiver(lab.ns("H2"), H2_ADDR), Capture(lab.ns("R"), "r0")
            errors = udp6_in_csum_errors(lab, "H2")
            try:
                with ioam_flow(io_lab):
                    sent = send_udp(lab.ns("H1"), H2_ADDR, n, [CPU])
                    got, frames = rx.drain(n), by_seq(r0.frames(n))
                    records = dump(io_lab.rx_inst, count=n, timeout_ms=3000)
            finally:
                rx.close()
                r0.close()
            assert udp6_in_csum_errors(lab, "H2") == errors, "H2 dropped datagrams with a bad checksum"
            expect_all("datagrams at H2", len(got), n)
            expect_all("frames on r0", len(frames), n)
            return sent, got, records, frames

        sent, got, records, frames = retry_on_path_loss(attempt)
    finally:
        lab.run("H1", ["ethtool", "-K", "h1", "tx", "off"], check=True)
    assert sorted(struct.unpack_from("!Q", d)[0] for d, _ in got) == [s.seq for s in sent]
    assert [r["seq"] for r in records] == list(range(n))
    for seq, frame in frames.items():  # what left A: instrumented, the inner UDP checksum complete
        inner = parse_instrumented(frame)["inner"]
        assert udp6_checksum_ok(inner), f"seq {seq}: inner UDP checksum wrong after the insertion"


def udp6_checksum_ok(ip6_packet: bytes) -> bool:
    """RFC 8200 §8.1: the UDP checksum over the pseudo-header {src, dst, length, 17} and the datagram."""
    plen = struct.unpack_from("!H", ip6_packet, 4)[0]
    udp = ip6_packet[40 : 40 + plen]
    data = ip6_packet[8:40] + struct.pack("!IxxxB", len(udp), 17) + udp + (b"\0" if len(udp) % 2 else b"")
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total == 0xFFFF and struct.unpack_from("!H", udp, 6)[0] != 0
