"""The in-line IOAM route program ioam_lwt on A's policy route in netlab line5 (real kernels).

The line5 in-line tests of test_ioam_lab.py (every packet, 1 in 10, the MTU boundary) run on both
inserters (the `inserter` fixture). Here what only the route program has: the route it takes over
and gives back, the kernel's seg6 encapsulation for the packets it does not instrument (byte for
byte what the seg6 route sends), sequence numbers exact when two CPUs forward the flow at once, the
filter, and the routes it refuses.

Ground truth: the frames captured on R's r0 with the plain seg6 route, the datagrams sent (sequence
number in the payload) and the route table as `ip -6 route show` prints it."""

from __future__ import annotations

import json
import os
import shutil
import threading

import pytest

from tests.datapath.altmark_env import Capture, Receiver, expect_all, retry_on_path_loss, send_udp, udp_sender
from tests.datapath.ioam_env import IOAM_LWT, IOAM_RX, LWT_COUNTERS, PIN_ROOT, POLICY, delta, dump, flow, run, stats
from tests.datapath.ioam_fixtures import A_ROUTE, A_SEG6, a_route, route_program
from tests.datapath.test_ioam_lab import H2_ADDR, as_sent_by_a, by_seq, ioam_flow

CPUS = sorted(os.sched_getaffinity(0))


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
        }
        assert sorted(stats(IOAM_LWT, io_lab.tx_inst)) == sorted(LWT_COUNTERS)
    # route_program checked: the seg6 route back as it was, no pins
    with route_program(io_lab, ("--fixed-next-hop",)):
        # line5: A reaches R's locator fc00:2::/64 via fc00:12::2 on a0
        assert a_route(io_lab) == f"{A_ROUTE}  encap bpf in prog:[*fsobj] via fc00:12::2 dev a0 metric 1024 pref medium"


@pytest.mark.parametrize("extra", [(), ("--fixed-next-hop",)], ids=["kernel-encap", "fixed-next-hop"])
def test_packets_not_instrumented_leave_a_as_with_the_seg6_route(io_lab, extra):
    """Without a flow every packet gets the kernel's seg6 encapsulation from the program (or, with
    --fixed-next-hop, the header the program builds): the frames on r0 are byte for byte those of
    the plain seg6 route (same socket: same flow label)."""
    lab, n = io_lab.lab, 30
    sock = udp_sender(lab.ns("H1"))

    def attempt():
        r0, rx = Capture(lab.ns("R"), "r0"), Receiver(lab.ns("H2"), H2_ADDR)
        try:
            send_udp(lab.ns("H1"), H2_ADDR, n, CPUS[:1], sock=sock)
            base = by_seq(r0.frames(n))
            with route_program(io_lab, extra):
                before = stats(IOAM_LWT, io_lab.tx_inst)
                send_udp(lab.ns("H1"), H2_ADDR, n, CPUS[:1], sock=sock)
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
        dump(io_lab.rx_inst)
        rx = Receiver(lab.ns("H2"), H2_ADDR)
        try:
            with route_program(io_lab), ioam_flow(io_lab, every=1):
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
        finally:
            rx.close()
        expect_all("datagrams at H2", len(got), 2 * n)
        return records, f

    records, f = retry_on_path_loss(attempt)
    assert sorted(r["seq"] for r in records) == list(range(2 * n))
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


def test_packets_a_sends_itself_keep_the_seg6_route(io_lab):
    """lwt_in never sees what A sends itself: those packets take the copy of the seg6 route in
    table 3355 (rule `iif lo lookup 3355`) and arrive; the program counts none of them."""
    lab, n = io_lab.lab, 10

    def attempt():
        rx = Receiver(lab.ns("H2"), H2_ADDR)
        try:
            with route_program(io_lab):
                rules = lab.run("A", ["ip", "-6", "rule", "show"], check=True).stdout
                local = lab.run("A", ["ip", "-6", "route", "show", "table", "3355"], check=True).stdout
                before = stats(IOAM_LWT, io_lab.tx_inst)
                send_udp(lab.ns("A"), H2_ADDR, n, CPUS[:1])
                got = rx.drain(n)
                d = delta(before, stats(IOAM_LWT, io_lab.tx_inst))
        finally:
            rx.close()
        expect_all("datagrams from A at H2", len(got), n)
        return rules, local, d

    rules, local, d = retry_on_path_loss(attempt)
    assert "30055:\tfrom all iif lo lookup 3355" in rules, rules
    assert local.strip() == A_SEG6 + " metric 1024 pref medium", "a copy of the seg6 route"
    assert d == {}


def test_pins_lost_the_route_goes_on_and_is_given_back(io_lab):
    """The pins removed under an attached route (a crash that lost the bpffs state): the route holds
    the program and its maps, so every packet is still instrumented (records 0..n-1 at B);
    detach-route gives the seg6 route back without the pins (route_program checks it)."""
    lab, n = io_lab.lab, 20

    def attempt():
        dump(io_lab.rx_inst)
        rx = Receiver(lab.ns("H2"), H2_ADDR)
        try:
            with route_program(io_lab), ioam_flow(io_lab, every=1):
                shutil.rmtree(PIN_ROOT / io_lab.tx_inst / "ioam_lwt")
                send_udp(lab.ns("H1"), H2_ADDR, n, CPUS[:1])
                got = rx.drain(n)
                records = dump(io_lab.rx_inst, count=len(got), timeout_ms=3000)
        finally:
            rx.close()
        expect_all("datagrams at H2", len(got), n)
        return records

    records = retry_on_path_loss(attempt)
    assert [r["seq"] for r in records] == list(range(n))
