"""The in-line IOAM route program ioam_lwt on A's policy route in netlab line5 (real kernels).

The line5 in-line tests of test_ioam_lab.py (every packet, 1 in 10, the MTU boundary) run on both
inserters (the `inserter` fixture). Here what only the route program has: the route it takes over
and gives back, the kernel's seg6 encapsulation for the packets it does not instrument (byte for
byte what the seg6 route sends), sequence numbers exact when two CPUs forward the flow at once, the
filter, and the routes it refuses.

Ground truth: the frames captured on R's r0 with the plain seg6 route, the datagrams sent (sequence
number in the payload) and the route table as `ip -6 route show` prints it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.collectors.collectors_pcap import capture
from tests.datapath.altmark_env import Capture, Receiver, expect_all, retry_on_path_loss, send_udp, udp_sender
from tests.datapath.ioam_env import IOAM_LWT, IOAM_RX, LWT_COUNTERS, PIN_ROOT, POLICY, delta, dump, flow, run, stats
from tests.datapath.ioam_fixtures import A_ROUTE, A_SEG6, LAB_IF_IDS, a_route, route_args, route_program
from tests.datapath.test_ioam_lab import H2_ADDR, as_sent_by_a, by_seq, ioam_flow

CPUS = sorted(os.sched_getaffinity(0))


@contextlib.contextmanager
def every_packet_on_the_route(io_lab):
    """The route program on A's policy route, flow 7 sampling every packet, B's ring emptied first;
    yields H2's receiver, closed after the route is given back."""
    dump(io_lab.rx_inst)
    rx = Receiver(io_lab.lab.ns("H2"), H2_ADDR)
    try:
        with route_program(io_lab), ioam_flow(io_lab, every=1):
            yield rx
    finally:
        rx.close()


def test_route_taken_over_and_given_back(io_lab):
    assert a_route(io_lab).startswith(A_SEG6), "line5's policy route as the test expects it"
    with route_program(io_lab):
        shown = a_route(io_lab)
        assert shown.startswith(f"{A_ROUTE}  encap bpf in ") and " dev a0 " in shown, shown
        (route,) = json.loads(run(IOAM_LWT, "list-routes", "--instance", io_lab.tx_inst, "--json").stdout)["routes"]
        a0 = int(io_lab.lab.run("A", ["cat", "/sys/class/net/a0/ifindex"], check=True).stdout)
        # the kernel's seg6 encap takes A's address on a0 as the source (no `ip sr tunsrc` in line5)
        assert route == {
            "prefix": A_ROUTE,
            "oif": a0,
            "mtu": 1500,
            "tunsrc": "fc00:12::1",
            "sids": POLICY,
            "flow_sids": POLICY,  # the flow the route's packets count in: its own SID list unless steered
            "trace_nodes": 0,  # the flow's trace size
            "fixed_next_hop": False,
            "paused": False,
        }
        assert sorted(stats(IOAM_LWT, io_lab.tx_inst)) == sorted(LWT_COUNTERS)
    # route_program checked: the seg6 route back as it was, no pins
    with route_program(io_lab, ("--fixed-next-hop",)):
        # line5: A reaches R's locator fc00:2::/64 via fc00:12::2 on a0
        assert a_route(io_lab) == f"{A_ROUTE}  encap bpf in prog:[*fsobj] via fc00:12::2 dev a0 metric 1024 pref medium"


@pytest.mark.parametrize("sender", ["H1", "A"], ids=["forwarded", "sent-by-a"])
@pytest.mark.parametrize("extra", [(), ("--fixed-next-hop",)], ids=["kernel-encap", "fixed-next-hop"])
def test_packets_not_instrumented_leave_a_as_with_the_seg6_route(io_lab, extra, sender):
    """Without a flow every packet gets the kernel's seg6 encapsulation from the program (or, with
    --fixed-next-hop, the header the program builds; for a packet A sends itself, the seg6 route's
    copy the program re-routes it to): the frames on r0 are byte for byte those of the plain seg6
    route (same socket: same flow label)."""
    lab, n = io_lab.lab, 30
    sock = udp_sender(lab.ns(sender))

    def attempt():
        r0, rx = Capture(lab.ns("R"), "r0"), Receiver(lab.ns("H2"), H2_ADDR)
        try:
            send_udp(lab.ns(sender), H2_ADDR, n, CPUS[:1], sock=sock)
            base = by_seq(r0.frames(n))
            with route_program(io_lab, extra):
                before = stats(IOAM_LWT, io_lab.tx_inst)
                send_udp(lab.ns(sender), H2_ADDR, n, CPUS[:1], sock=sock)
                got = by_seq(r0.frames(n))
                d = delta(before, stats(IOAM_LWT, io_lab.tx_inst))
            datagrams = rx.drain(2 * n)
        finally:
            r0.close()
            rx.close()
        for what, frames in (("baseline", base), ("program", got)):
            expect_all(f"frames on r0 ({what})", len(frames), n)
        expect_all("datagrams at H2", len(datagrams), 2 * n)
        return base, got, d

    try:
        base, got, d = retry_on_path_loss(attempt)
    finally:
        sock.close()
    for seq in range(n):
        assert as_sent_by_a(got[seq]) == as_sent_by_a(base[seq]), f"seq {seq}"
    assert d == {"pass_unmonitored": n}


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs")
def test_sequence_numbers_exact_when_two_cpus_forward_the_flow(io_lab):
    """Two senders on two CPUs at once (on veth A forwards on the sender's CPU), every packet
    sampled: the E2E sequence numbers are 0..2n-1, each once (one atomic add per number)."""
    lab, n = io_lab.lab, 400

    def attempt():
        with every_packet_on_the_route(io_lab) as rx:
            senders = [
                threading.Thread(target=send_udp, args=(lab.ns("H1"), H2_ADDR, n, [cpu]), kwargs={"seq0": k * n})
                for k, cpu in enumerate(CPUS[:2])
            ]
            for t in senders:
                t.start()
            for t in senders:
                t.join()
            got = rx.drain(2 * n)
            records = dump(io_lab.rx_inst, count=len(got), timeout_ms=3000)
            f = flow(IOAM_LWT, io_lab.tx_inst, 7)
        expect_all("datagrams at H2", len(got), 2 * n)
        return records, f

    records, f = retry_on_path_loss(attempt)
    assert sorted(r["seq"] for r in records) == list(range(2 * n))
    assert (f["seen"], f["instrumented"], f["next_seq"]) == (2 * n, 2 * n, 2 * n)


def test_a_paused_route_only_encapsulates_and_its_flow_stands_still(io_lab):
    """attach-route --paused in place: the route's packets take the kernel's seg6 encap
    (pass_unmonitored, every one delivered, none recorded) and the flow's next_seq stands where it
    was; attached again without it, the numbering goes on. What the agent relies on to hand a
    monitor to ioam_tx on TC with its next sequence number."""
    lab, n = io_lab.lab, 50
    route = route_args(io_lab)

    def attempt():
        with every_packet_on_the_route(io_lab) as rx:
            send_udp(lab.ns("H1"), H2_ADDR, n, CPUS[:1])
            run(IOAM_LWT, "attach-route", *route, "--paused")
            listed = json.loads(run(IOAM_LWT, "list-routes", "--instance", io_lab.tx_inst, "--json").stdout)
            before = stats(IOAM_LWT, io_lab.tx_inst)
            send_udp(lab.ns("H1"), H2_ADDR, n, CPUS[:1], seq0=n)
            paused = delta(before, stats(IOAM_LWT, io_lab.tx_inst)), flow(IOAM_LWT, io_lab.tx_inst, 7)
            run(IOAM_LWT, "attach-route", *route)
            send_udp(lab.ns("H1"), H2_ADDR, n, CPUS[:1], seq0=2 * n)
            got = rx.drain(3 * n)
            records = dump(io_lab.rx_inst, count=2 * n, timeout_ms=3000)
            f = flow(IOAM_LWT, io_lab.tx_inst, 7)
        expect_all("datagrams at H2", len(got), 3 * n)
        return [r["paused"] for r in listed["routes"]], paused, records, f

    listed, (d, f_paused), records, f = retry_on_path_loss(attempt)
    assert listed == [True] and d == {"pass_unmonitored": n}
    assert (f_paused["seen"], f_paused["instrumented"], f_paused["next_seq"]) == (n, n, n)
    assert [r["seq"] for r in records] == list(range(2 * n))  # on from n after the pause
    assert (f["seen"], f["instrumented"], f["next_seq"]) == (2 * n, 2 * n, 2 * n)


def test_filter_leaves_other_packets_to_the_kernel_encap(io_lab):
    """A flow filtered on UDP port 9001: the test's datagrams (port 9000) are the flow's SID list but
    not its packets: counted pass_filtered, none instrumented, all delivered."""
    lab, n = io_lab.lab, 20

    def attempt():
        dump(io_lab.rx_inst)
        rx = Receiver(lab.ns("H2"), H2_ADDR)
        try:
            with route_program(io_lab):
                run(
                    IOAM_LWT, "add-flow", "--instance", io_lab.tx_inst, "--sids", ",".join(POLICY), "--flow-id", "8",
                    "--namespace-id", "123", "--node-id", "5", "--trace-nodes", "4", "--sample-every", "1",
                    "--match-proto", "17", "--match-dport", "9001",
                )  # fmt: skip
                before = stats(IOAM_LWT, io_lab.tx_inst)
                send_udp(lab.ns("H1"), H2_ADDR, n, CPUS[:1])
                got = rx.drain(n)
                d = delta(before, stats(IOAM_LWT, io_lab.tx_inst))
                f = flow(IOAM_LWT, io_lab.tx_inst, 8)
        finally:
            rx.close()
        expect_all("datagrams at H2", len(got), n)
        return d, f

    d, f = retry_on_path_loss(attempt)
    assert d == {"pass_filtered": n}
    assert (f["seen"], f["sampled"], f["next_seq"]) == (0, 0, 0)
    assert dump(io_lab.rx_inst) == []


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"--sids": "fc00:2::e,fc00:3::d7"}, "--prefix/--sids/--dev"),  # not the route's SIDs
        ({"--dev": "ah"}, "--prefix/--sids/--dev"),  # not the route's device
        ({"--prefix": "fd00:c::/64"}, "--prefix"),  # no such route
    ],
)
def test_attach_route_refuses_a_route_that_is_not_the_policy(io_lab, bad, field):
    lab, inst = io_lab.lab, io_lab.tx_inst
    args = {"--prefix": A_ROUTE, "--dev": "a0", "--sids": ",".join(POLICY)} | bad
    before = a_route(io_lab)
    p = run(
        IOAM_LWT, "attach-route", "--netns", lab.ns("A"), "--instance", inst,
        *[x for kv in args.items() for x in kv], check=False,
    )  # fmt: skip
    assert p.returncode == 1 and f"ioam_lwt: {field}:" in p.stderr, p.stderr
    assert a_route(io_lab) == before
    assert not (PIN_ROOT / inst / "ioam_lwt").exists(), "a refused route leaves no pins"
    assert IOAM_RX.exists()


def test_packets_a_sends_itself_are_instrumented_in_the_flows_sequence(io_lab):
    """lwt_in never sees what A sends itself: those packets find the program's lwt_xmit entry on the
    route's copy in table 3356 (rule `iif lo`), with the seg6 route's headroom. Every packet sampled,
    H1 and A sending in turn: one series of sequence numbers 0..3n-1 at B; in A's entry of its own
    packets no ingress interface and the hop limit one above a forwarded packet's (not forwarded)."""
    lab, n = io_lab.lab, 20

    def attempt():
        with every_packet_on_the_route(io_lab) as rx:
            rules = lab.run("A", ["ip", "-6", "rule", "show"], check=True).stdout
            local = lab.run("A", ["ip", "-6", "route", "show", "table", "3356"], check=True).stdout
            copy = lab.run("A", ["ip", "-6", "route", "show", "table", "3355"], check=True).stdout
            before = stats(IOAM_LWT, io_lab.tx_inst)
            for k, sender in enumerate(("H1", "A", "H1")):
                send_udp(lab.ns(sender), H2_ADDR, n, CPUS[:1], seq0=k * n)
            got = rx.drain(3 * n)
            records = dump(io_lab.rx_inst, count=3 * n, timeout_ms=3000)
            d = delta(before, stats(IOAM_LWT, io_lab.tx_inst))
            f = flow(IOAM_LWT, io_lab.tx_inst, 7)
        expect_all("datagrams from H1 and A at H2", len(got), 3 * n)
        return rules, local, copy, records, d, f

    rules, local, copy, records, d, f = retry_on_path_loss(attempt)
    assert "30054:\tfrom all fwmark 0x5e610a3 lookup 3355" in rules, rules
    assert "30055:\tfrom all iif lo lookup 3356" in rules, rules
    assert local.startswith(f"{A_ROUTE}  encap bpf xmit prog_local") and " dev a0 " in local, local
    assert copy.strip() == A_SEG6 + " metric 1024 pref medium", "the copy of the seg6 route"
    assert d == {"instrumented": 3 * n}
    assert (f["seen"], f["instrumented"], f["next_seq"]) == (3 * n, 3 * n, 3 * n)
    by_number = {r["seq"]: r for r in records}
    assert sorted(by_number) == list(range(3 * n))
    # A's entry (the trace's last) of every packet: hop limit, ingress and egress interface ids
    a_entry = {}
    for seq, r in by_number.items():
        e = r["entries"][-1]
        a_entry[seq] = (e["hop_limit"], e["ingress_if_id"], e["egress_if_id"])
    forwarded = {a_entry[seq] for seq in [*range(n), *range(2 * n, 3 * n)]}
    sent_by_a = {a_entry[seq] for seq in range(n, 2 * n)}
    a0, ah = LAB_IF_IDS[("A", "a0")], LAB_IF_IDS[("A", "ah")]
    hop = a_entry[0][0]
    assert forwarded == {(hop, ah, a0)}, forwarded
    assert sent_by_a == {(hop + 1, 0xFFFF, a0)}, sent_by_a  # not forwarded: no decrement, no ingress


def test_pins_without_the_local_entry_get_it_on_the_same_maps(io_lab):
    """An instance pinned before the lwt_xmit entry existed (prog, maps, no prog_local): attach-route
    loads the entry on the maps pinned there and pins it, so A's own packets count in the same flow.
    Forwarded packets 0..n-1 before, A's n..2n-1 after, one series at B."""
    lab, n = io_lab.lab, 10
    route = route_args(io_lab)
    pins = PIN_ROOT / io_lab.tx_inst / "ioam_lwt"

    def attempt():
        with every_packet_on_the_route(io_lab) as rx:
            send_udp(lab.ns("H1"), H2_ADDR, n, CPUS[:1])
            (pins / "prog_local").unlink()
            run(IOAM_LWT, "attach-route", *route)  # in place: the route and its copies again
            repinned = (pins / "prog_local").exists()
            send_udp(lab.ns("A"), H2_ADDR, n, CPUS[:1], seq0=n)
            got = rx.drain(2 * n)
            records = dump(io_lab.rx_inst, count=2 * n, timeout_ms=3000)
            f = flow(IOAM_LWT, io_lab.tx_inst, 7)
        expect_all("datagrams at H2", len(got), 2 * n)
        return repinned, records, f

    repinned, records, f = retry_on_path_loss(attempt)
    assert repinned
    assert [r["seq"] for r in records] == list(range(2 * n))
    assert (f["instrumented"], f["next_seq"]) == (2 * n, 2 * n), "the flow of the maps pinned before"


def test_packets_a_sends_get_the_seg6_routes_mtu_and_over_it_are_counted(io_lab):
    """The copy for A's own packets has the seg6 route's headroom, so A's socket sees a0's MTU less
    the outer IPv6 header and the SRH. A datagram that fills it exactly cannot also carry the trace:
    counted skip_mtu, sent with the kernel's encapsulation. One byte more is fragmented by A's stack
    (without the headroom it would go as one packet, too big once encapsulated): the first fragment
    skip_mtu, the second instrumented. Both datagrams delivered whole."""
    lab = io_lab.lab
    inner = 1500 - (40 + 8 + 16 * len(POLICY))  # a0's MTU less the outer IPv6 header and the SRH
    sizes = [inner - 48, inner - 48 + 1]  # UDP payloads (IPv6 40 + UDP 8)

    def attempt():
        rx = Receiver(lab.ns("H2"), H2_ADDR)
        try:
            with route_program(io_lab), ioam_flow(io_lab, every=1):
                before = stats(IOAM_LWT, io_lab.tx_inst)
                for size in sizes:
                    send_udp(lab.ns("A"), H2_ADDR, 1, CPUS[:1], payload_len=size)
                got = rx.drain(2)
                d = delta(before, stats(IOAM_LWT, io_lab.tx_inst))
                f = flow(IOAM_LWT, io_lab.tx_inst, 7)
        finally:
            rx.close()
        expect_all("the datagrams from A at H2", len(got), 2)
        return got, d, f

    got, d, f = retry_on_path_loss(attempt)
    assert sorted(len(g[0]) for g in got) == sizes
    assert d == {"skip_mtu": 2, "instrumented": 1}, d
    assert (f["sampled"], f["skipped_mtu"], f["instrumented"]) == (3, 2, 1)


def test_pins_lost_the_route_goes_on_and_is_given_back(io_lab):
    """The pins removed under an attached route (a crash that lost the bpffs state): the route holds
    the program and its maps, so every packet is still instrumented (records 0..n-1 at B);
    detach-route gives the seg6 route back without the pins (route_program checks it)."""
    lab, n = io_lab.lab, 20

    def attempt():
        with every_packet_on_the_route(io_lab) as rx:
            shutil.rmtree(PIN_ROOT / io_lab.tx_inst / "ioam_lwt")
            send_udp(lab.ns("H1"), H2_ADDR, n, CPUS[:1])
            got = rx.drain(n)
            records = dump(io_lab.rx_inst, count=len(got), timeout_ms=3000)
        expect_all("datagrams at H2", len(got), n)
        return records

    records = retry_on_path_loss(attempt)
    assert [r["seq"] for r in records] == list(range(n))


TCP_SERVER = r"""
import socket, sys
s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("fd00:b::1", 40009)); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); n = 0
while True:
    b = c.recv(1 << 16)
    if not b: break
    n += len(b)
print(n, flush=True)
"""
TCP_CLIENT = r"""
import socket, sys
s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 1000)  # segments fit a0's MTU with the encap
s.connect(("fd00:b::1", 40009)); data = b"z" * int(sys.argv[1]); s.sendall(data); s.close(); print(len(data))
"""


def frames_in(pcap: Path) -> list[bytes]:
    data, out, off = pcap.read_bytes(), [], 24
    while off + 16 <= len(data):
        caplen = int.from_bytes(data[off + 8 : off + 12], "little")
        out.append(data[off + 16 : off + 16 + caplen])
        off += 16 + caplen
    return out


@pytest.mark.parametrize("sender,dev", [("H1", "h1"), ("A", "a0")], ids=["forwarded", "sent-by-a"])
def test_gso_packets_get_the_kernel_encap_counted_none_lost(io_lab, tmp_path, sender, dev):
    """A TCP sender on H1 with TSO/GSO on h1 (veth hands A the GSO packets whole), or on A itself with
    TSO/GSO on a0 (the stack hands the route its GSO packets): every packet of the flow sampled
    (1 in 1); the GSO ones get the kernel's seg6 encap, counted skip_gso in the stats and the flow,
    none instrumented (on R's r0 no frame over the MTU carries a Hop-by-Hop header), none dropped;
    the others instrumented, B's records 0..k-1; every byte arrives at H2."""
    lab, size = io_lab.lab, 4_000_000
    # netlab turns checksum offload off on every device (TSO needs it): on for this test only
    lab.run(sender, ["ethtool", "-K", dev, "tx", "on", "sg", "on", "tso", "on", "gso", "on"], check=True)
    assert "tcp-segmentation-offload: on" in lab.run(sender, ["ethtool", "-k", dev], check=True).stdout
    dump(io_lab.rx_inst)
    pcap = tmp_path / "r0.pcap"
    with contextlib.ExitStack() as undo, route_program(io_lab), ioam_flow(io_lab, every=1):
        undo.callback(lab.run, sender, ["ethtool", "-K", dev, "tx", "off"], check=True)
        if sender == "A":
            # H2's replies to A's address on a0 (line5 has no way back to it: B's policy ends in A's
            # End.DT6, which finds no local address in the main table), plain IPv6 via R
            back = ["fc00:12::/64", "via", "fc00:23::1"]
            lab.run("B", ["ip", "-6", "route", "add", *back], check=True)
            undo.callback(lab.run, "B", ["ip", "-6", "route", "del", *back], check=True)
        before = stats(IOAM_LWT, io_lab.tx_inst)
        server = lab.popen("H2", [sys.executable, "-c", TCP_SERVER], stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout.readline().strip() == "ready"
            with capture(lab.ns("R"), "r0", pcap, "ip6[6] == 0 and ip6[40] == 43"):
                # GSO packets given the seg6 encap through the helper were lost: the transfer stalled
                sent = lab.run(sender, [sys.executable, "-c", TCP_CLIENT, str(size)], check=True, timeout=30).stdout
                got = int(server.communicate(timeout=30)[0])
        finally:
            server.kill()
        d = delta(before, stats(IOAM_LWT, io_lab.tx_inst))
        f = flow(IOAM_LWT, io_lab.tx_inst, 7)
        records = dump(io_lab.rx_inst, count=f["instrumented"], timeout_ms=3000)
    assert int(sent) == got == size
    sys.stderr.write(f"\n[gso, {sender}] stats {d}\n")
    assert d.get("skip_gso", 0) > 0 and not [k for k in d if k.startswith("drop_")], d
    assert f["seen"] == f["sampled"] == sum(d.values())  # every packet of the flow, each counted once
    assert (f["skipped_gso"], f["instrumented"], f["skipped_mtu"], f["skipped_other"]) == (
        d["skip_gso"],
        d.get("instrumented", 0),
        0,
        0,
    )
    assert sorted(r["seq"] for r in records) == list(range(f["instrumented"]))
    # on R only the instrumented packets carry a Hop-by-Hop header before the SRH (the capture takes
    # only those: a capture of the whole transfer drops frames on a loaded runner)
    hbh = [fr for fr in frames_in(pcap) if fr[12:14] == b"\x86\xdd" and fr[14 + 6] == 0 and fr[14 + 40] == 43]
    assert len(hbh) == f["instrumented"]


@contextlib.contextmanager
def interval_flow(io_lab, m_us: int):
    """Flow 7 on the route program, one packet per m_us µs; B's ioam_rx records it."""
    run(
        IOAM_LWT, "add-flow", "--instance", io_lab.tx_inst, "--sids", ",".join(POLICY), "--flow-id", "7",
        "--namespace-id", "123", "--node-id", "5", "--trace-nodes", "4", "--sample-interval-us", str(m_us),
    )  # fmt: skip
    run(IOAM_RX, "add-flow", "--instance", io_lab.rx_inst, "--sids", ",".join(POLICY), "--flow-id", "7",
        "--namespace-id", "123")  # fmt: skip
    try:
        yield
    finally:
        run(IOAM_LWT, "del-flow", "--instance", io_lab.tx_inst, "--flow-id", "7", check=False)
        run(IOAM_RX, "del-flow", "--instance", io_lab.rx_inst, "--flow-id", "7", check=False)


PACED = r"""
import socket, sys, time
secs, m_s = float(sys.argv[1]), float(sys.argv[2]) / 1e6
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); n = 0; due = 0
last = None  # the sampling rule on the sender's own clock: the first packet at least M after the last sample
t0 = time.monotonic()
while time.monotonic() - t0 < secs:
    now = time.monotonic()
    if last is None or now - last >= m_s:
        due += 1; last = now
    for _ in range(5):
        s.sendto(b"x" * 64, ("fd00:b::1", 40011)); n += 1
    time.sleep(0.0005)
print(n, time.monotonic() - t0, due)
"""


def test_sample_interval_rate_on_the_route(io_lab):
    """--sample-interval-us 20000 with H1 sending far faster (thousands of packets a second for 3 s):
    instrumented packets at most 1e6/M = 50 per second of the sender's own clock (+1, the first
    packet), and as many as the sampling rule gives for the times H1 really sent (a sender that
    waits for a CPU leaves gaps with nothing to sample: in one full run 133 for 150 by the rate
    alone), within 5 % or 2; B records each one, sequence numbers 0..k-1."""
    lab, m_us = io_lab.lab, 20_000
    dump(io_lab.rx_inst)
    with route_program(io_lab), interval_flow(io_lab, m_us):
        out = lab.run("H1", [sys.executable, "-c", PACED, "3", str(m_us)], check=True).stdout.split()
        time.sleep(0.3)
        f = flow(IOAM_LWT, io_lab.tx_inst, 7)
        records = dump(io_lab.rx_inst, count=f["instrumented"], timeout_ms=3000)
    n, secs, due = int(out[0]), float(out[1]), int(out[2])
    rate_bound = secs * 1e6 / m_us + 1
    sys.stderr.write(
        f"\n[interval] {n} packets in {secs:.2f} s ({n / secs:.0f}/s): {f['instrumented']} sampled, "
        f"{due} by the rule on the sender's send times, at most {rate_bound:.1f} by the rate\n"
    )
    assert n / secs > 20 * 1e6 / m_us, "the sender is well above the sampling rate"
    assert f["seen"] == n and f["sampled"] == f["instrumented"]
    assert f["instrumented"] <= rate_bound, (f["instrumented"], rate_bound)
    assert abs(f["instrumented"] - due) <= max(2, 0.05 * due), (f["instrumented"], due)
    assert sorted(r["seq"] for r in records) == list(range(f["instrumented"]))


def test_sample_interval_below_the_gap_samples_every_packet(io_lab):
    """M = 1000 µs, packets 10 ms apart: every packet sampled and instrumented, B records each."""
    lab, n = io_lab.lab, 100
    dump(io_lab.rx_inst)
    rx = Receiver(lab.ns("H2"), H2_ADDR)
    try:
        with route_program(io_lab), interval_flow(io_lab, 1000):
            send_udp(lab.ns("H1"), H2_ADDR, n, CPUS[:1], gap_s=0.01)
            got = rx.drain(n)
            f = flow(IOAM_LWT, io_lab.tx_inst, 7)
            records = dump(io_lab.rx_inst, count=n, timeout_ms=3000)
    finally:
        rx.close()
    expect_all("datagrams at H2", len(got), n)
    assert (f["seen"], f["sampled"], f["instrumented"], f["next_seq"]) == (n, n, n, n)
    assert sorted(r["seq"] for r in records) == list(range(n))
