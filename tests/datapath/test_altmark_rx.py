"""altmark_rx (XDP counter at the egress edge): every packet class through BPF_PROG_TEST_RUN of the
real program (exact stats and per-(slot, colour) counters, colour taken from the packet), the
loader's CLI, and per-packet cost independent of the number of flows. The end-to-end counts
(TX == RX == sent, through the netlab line) are in test_altmark_tx.py."""

from __future__ import annotations

import os
import struct

import pytest

from tests.datapath.altmark_env import (
    METHOD_DSCP,
    POLICY,
    RX,
    a6,
    delta,
    doh,
    encapped,
    eth,
    flows,
    inner_udp,
    ioam_e2e_doh,
    ioam_hbh,
    ipv6_hdr,
    list_flows,
    run,
    sidlist_key,
    srh,
    stats,
    tai_ns,
)

XDP_PASS = 2
FLOWMON = 0xABCDE
CUSTOM = ["fc00:9::1", "fc00:9::2", "fc00:9::3"]


@pytest.fixture(scope="module")
def rx_flows(am_testrun):
    inst = am_testrun.inst
    with flows(
        [
            (RX, inst, ["--sids", ",".join(POLICY), "--flow-id", "7", "--method", "dscp", "--period-ms", "200"]),
            (RX, inst, ["--flowmon-id", str(FLOWMON), "--method", "rfc9343", "--period-ms", "200"]),
            (
                RX,
                inst,
                [
                    "--sids",
                    ",".join(CUSTOM),
                    "--flow-id",
                    "9",
                    "--method",
                    "dscp",
                    "--period-ms",
                    "1000",
                    "--dscp-l-bit",
                    "3",
                    "--dscp-d-bit",
                    "5",
                ],
            ),
        ]
    ):
        slots = {f["flow_id"]: f["slot"] for f in list_flows(RX, inst)}
        yield am_testrun, slots


def _doh_padded(flowmon: int, colour: int, dmark: bool, nexthdr: int) -> bytes:
    """16-byte DOH: PadN(2) + AltMark + PadN(2): the option is found after padding."""
    base = doh(flowmon, colour, dmark)[2:]  # type, len, data (6 bytes)
    return bytes([nexthdr, 1, 1, 2, 0, 0]) + base + bytes([1, 2, 0, 0])


def _frame(ext: bytes, outer_next: int, tclass: int = 0, dst: str = "fc00:3::d6") -> bytes:
    body = ext + inner_udp(b"p" * 40)
    return eth() + ipv6_hdr("fc00:12::1", dst, outer_next, len(body), tclass=tclass) + body


def _cases(slots):
    """(name, frame, stats counter, (flow_id, colour, dmark) or None)"""
    return [
        ("dscp_colour0", encapped(tclass=0x00), "counted_dscp", (7, 0, False)),
        ("dscp_colour1", encapped(tclass=0x04), "counted_dscp", (7, 1, False)),
        ("dscp_colour1_dmark", encapped(tclass=0x0C), "counted_dscp", (7, 1, True)),
        ("dscp_colour0_dmark_ecn", encapped(tclass=0xBB), "counted_dscp", (7, 0, True)),  # 1011 1011: L=0 D=1
        ("custom_bits_colour1", encapped(CUSTOM, tclass=0x20), "counted_dscp", (9, 1, False)),
        ("custom_bits_dmark", encapped(CUSTOM, tclass=0x80 | 0x04), "counted_dscp", (9, 0, True)),
        ("doh_before_srh", _frame(doh(FLOWMON, 1, True) + srh(POLICY), 60), "counted_rfc9343", (FLOWMON, 1, True)),
        (
            "doh_after_srh",
            _frame(srh(POLICY, nexthdr=60) + doh(FLOWMON, 0, False, nexthdr=41), 43),
            "counted_rfc9343",
            (FLOWMON, 0, False),
        ),
        ("doh_padded_no_srh", _frame(_doh_padded(FLOWMON, 1, False, 41), 60), "counted_rfc9343", (FLOWMON, 1, False)),
        ("doh_other_srh", _frame(doh(FLOWMON, 0, True) + srh(CUSTOM), 60), "counted_rfc9343", (FLOWMON, 0, True)),
        ("unknown_flowmon", _frame(doh(0x12345, 1, False) + srh(POLICY), 60), "pass_unknown_flowmon", None),
        (
            "doh_without_altmark_dscp_flow",
            _frame(bytes([43, 0, 1, 4, 0, 0, 0, 0]) + srh(POLICY), 60, tclass=4),
            "counted_dscp",
            (7, 1, False),
        ),
        ("doh_truncated", _frame(bytes([43, 5, 1, 4, 0, 0, 0, 0]), 60)[: 14 + 40 + 20], "pass_malformed_doh", None),
        ("altmark_bad_len", _frame(bytes([43, 0, 0x12, 3, 0, 0, 0, 0]) + srh(POLICY), 60), "pass_malformed_doh", None),
        ("srh_hdrlen_short", encapped(ext=srh(POLICY, hdrlen=2)), "pass_malformed_srh", None),
        ("srh_segleft_beyond", encapped(ext=srh(POLICY, segleft=3)), "pass_malformed_srh", None),
        ("srh_truncated", encapped()[: 14 + 40 + 8 + 20], "pass_malformed_srh", None),
        ("srh_fixed_part_truncated", encapped()[: 14 + 40 + 4], "pass_malformed_srh", None),
        ("too_many_sids", encapped([f"fc00:8::{i}" for i in range(1, 8)]), "pass_too_many_sids", None),
        ("routing_type_2", encapped(ext=bytes([41, 2, 2, 1, 0, 0, 0, 0]) + a6("fc00:3::d6")), "pass_not_srh", None),
        ("unmonitored_sids", encapped(["fc00:2::e", "fc00:3::d7"]), "pass_unmonitored", None),
        # in-line IOAM (schemas/IOAM.md): a Hop-by-Hop header first, an E2E DOH after the SRH
        ("ioam_hbh_dscp", _frame(ioam_hbh(43) + srh(POLICY), 0, tclass=4), "counted_dscp", (7, 1, False)),
        (
            "ioam_hbh_dscp_e2e",
            _frame(ioam_hbh(43) + srh(POLICY, nexthdr=60) + ioam_e2e_doh(41), 0, tclass=0x0C),
            "counted_dscp",
            (7, 1, True),
        ),
        (
            "ioam_hbh_altmark_e2e",
            _frame(ioam_hbh(60, slots=12) + doh(FLOWMON, 1, True) + srh(POLICY, nexthdr=60) + ioam_e2e_doh(41), 0),
            "counted_rfc9343",
            (FLOWMON, 1, True),
        ),
        ("ioam_hbh_no_srh", _frame(ioam_hbh(41), 0), "pass_no_srh", None),
        ("hbh_truncated", _frame(ioam_hbh(43) + srh(POLICY), 0)[: 14 + 40 + 1], "pass_malformed_hbh", None),
        (
            "hbh_then_doh_truncated",
            _frame(ioam_hbh(60) + bytes([43, 5, 1, 4, 0, 0, 0, 0]), 0)[: 14 + 40 + 48 + 20],
            "pass_malformed_doh",
            None,
        ),
        ("plain_ipv6_udp", eth() + inner_udp(b"q" * 20), "pass_no_srh", None),
        ("ipv4", eth(0x0800) + bytes(40), "pass_not_ipv6", None),
        ("short_ipv6", eth() + bytes(30), "pass_not_ipv6", None),
    ]


def test_every_packet_class_counted_once_with_colour_from_the_packet(rx_flows):
    tr, slots = rx_flows
    os.sched_setaffinity(0, {0})
    try:
        flow_slot = {7: slots[7], 9: slots[9], FLOWMON: slots[FLOWMON]}
        for name, frame, counter, expect in _cases(slots):
            before_stats = stats(RX, tr.inst)
            before = {(f, c): tr.rx_maps.summed(s, c) for f, s in flow_slot.items() for c in (0, 1)}
            t0 = tai_ns()
            retval, out, _ = tr.rx.run(frame)
            t1 = tai_ns()
            assert retval == XDP_PASS, name
            assert out == frame, f"{name}: the counter must not change the packet"
            assert delta(before_stats, stats(RX, tr.inst)) == {counter: 1}, name
            changed = {
                k: tuple(a - b for a, b in zip(tr.rx_maps.summed(flow_slot[k[0]], k[1]), v)) for k, v in before.items()
            }
            changed = {k: v for k, v in changed.items() if any(v)}
            if expect is None:
                assert changed == {}, name
                continue
            fid, colour, dmark = expect
            assert list(changed) == [(fid, colour)], name
            pkts, nbytes, dm, ts = changed[(fid, colour)]
            assert (pkts, nbytes) == (1, 40 + struct.unpack_from("!H", frame, 18)[0]), name
            assert dm == int(dmark), name
            assert (t0 <= ts <= t1) if dmark else ts == 0, name
    finally:
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))


def test_loader_cli(rx_flows):
    tr, slots = rx_flows
    fl = {f["flow_id"]: f for f in list_flows(RX, tr.inst)}
    assert fl[7]["sids"] == POLICY and fl[7]["method"] == "dscp"
    assert (fl[7]["dscp_l_bit"], fl[7]["dscp_d_bit"]) == (0, 1)
    assert fl[FLOWMON]["flowmon_id"] == FLOWMON and fl[FLOWMON]["method"] == "rfc9343"
    assert (fl[9]["dscp_l_bit"], fl[9]["dscp_d_bit"], fl[9]["period_ms"]) == (3, 5, 1000)
    assert sorted(f["slot"] for f in fl.values()) == [0, 1, 2]  # lowest free slots
    assert all(abs(f["installed_tai_ns"] - tai_ns()) < 120e9 for f in fl.values())
    bad = [
        (
            ["add-flow", "--instance", tr.inst, "--flowmon-id", "1048576", "--method", "rfc9343", "--period-ms", "1"],
            "--flowmon-id",
        ),
        (
            [
                "add-flow",
                "--instance",
                tr.inst,
                "--sids",
                "fc00::1,zz",
                "--flow-id",
                "1",
                "--method",
                "dscp",
                "--period-ms",
                "1",
            ],
            "--sids",
        ),
        (
            [
                "add-flow",
                "--instance",
                tr.inst,
                "--sids",
                ",".join(f"fc00::{i}" for i in range(1, 8)),
                "--flow-id",
                "1",
                "--method",
                "dscp",
                "--period-ms",
                "1",
            ],
            "--sids",
        ),
        (
            [
                "add-flow",
                "--instance",
                tr.inst,
                "--sids",
                "fc00::1",
                "--flow-id",
                "1",
                "--method",
                "dscp",
                "--period-ms",
                "0",
            ],
            "--period-ms",
        ),
        (
            [
                "add-flow",
                "--instance",
                tr.inst,
                "--sids",
                "fc00::1",
                "--flow-id",
                "1",
                "--method",
                "red",
                "--period-ms",
                "10",
            ],
            "--method",
        ),
        (
            [
                "add-flow",
                "--instance",
                tr.inst,
                "--sids",
                "fc00::1",
                "--flow-id",
                "1",
                "--method",
                "dscp",
                "--period-ms",
                "10",
                "--dscp-l-bit",
                "6",
            ],
            "--dscp-l-bit",
        ),
        (
            [
                "add-flow",
                "--instance",
                tr.inst,
                "--sids",
                "fc00::1",
                "--flow-id",
                "1",
                "--method",
                "dscp",
                "--period-ms",
                "10",
                "--dscp-l-bit",
                "2",
                "--dscp-d-bit",
                "2",
            ],
            "--dscp-d-bit",
        ),
        (
            ["add-flow", "--instance", tr.inst, "--sids", "fc00::1", "--method", "dscp", "--period-ms", "10"],
            "--flow-id",
        ),
        (
            [
                "add-flow",
                "--instance",
                "a/b",
                "--sids",
                "fc00::1",
                "--flow-id",
                "1",
                "--method",
                "dscp",
                "--period-ms",
                "10",
            ],
            "--instance",
        ),
        (["stats", "--json"], "--instance"),
        (["attach", "--instance", tr.inst], "--dev"),
    ]
    for args, name in bad:
        p = run(RX, *args, check=False)
        assert p.returncode == 2 and name in p.stderr, (args, p.returncode, p.stderr)
    # a flow id used by another flow, and an unknown flow: failed commands (1), the message says which
    p = run(
        RX,
        "add-flow",
        "--instance",
        tr.inst,
        "--sids",
        "fc00::1",
        "--flow-id",
        "7",
        "--method",
        "dscp",
        "--period-ms",
        "10",
        check=False,
    )
    assert p.returncode == 1 and "--flow-id" in p.stderr and "already used" in p.stderr
    p = run(RX, "del-flow", "--instance", tr.inst, "--flow-id", "4242", check=False)
    assert p.returncode == 1 and "--flow-id" in p.stderr
    p = run(RX, "stats", "--instance", "amdp-does-not-exist", check=False)
    assert p.returncode == 1 and "cannot open" in p.stderr


def test_reinstall_zeroes_counters_and_keeps_slot(rx_flows):
    tr, slots = rx_flows
    frame = encapped(tclass=0x04)
    for _ in range(3):
        tr.rx.run(frame)
    assert tr.rx_maps.summed(slots[7], 1)[0] >= 3
    before = list_flows(RX, tr.inst)
    run(
        RX,
        "add-flow",
        "--instance",
        tr.inst,
        "--sids",
        ",".join(POLICY),
        "--flow-id",
        "7",
        "--method",
        "dscp",
        "--period-ms",
        "200",
    )
    after = {f["flow_id"]: f for f in list_flows(RX, tr.inst)}
    assert after[7]["slot"] == slots[7]
    assert after[7]["installed_tai_ns"] > {f["flow_id"]: f for f in before}[7]["installed_tai_ns"]
    assert tr.rx_maps.summed(slots[7], 0) == (0, 0, 0, 0) == tr.rx_maps.summed(slots[7], 1)
    assert all(c["packets"] == 0 for c in after[7]["counters"])


def test_cost_independent_of_flow_count(rx_flows):
    """ns/packet of a counted dscp packet with the 3 flows of this module, then with 10 000 more."""
    tr, slots = rx_flows
    frame = encapped(tclass=0x04)
    one = min(tr.rx.run(frame, repeat=200_000)[2] for _ in range(3))
    keys = []
    try:
        for i in range(10_000):
            key = sidlist_key(["fc00:2::e", f"fc00:77::{i:x}"])
            tr.rx_maps.put_flow(key, struct.pack("<IIQQBBBBI", 100_000 + i, 100 + i, 10**9, 0, METHOD_DSCP, 0, 1, 0, 0))
            keys.append(key)
        many = min(tr.rx.run(frame, repeat=200_000)[2] for _ in range(3))
    finally:
        for key in keys:
            tr.rx_maps.del_flow(key)
    print(f"\naltmark_rx dscp counted: {one} ns/packet with 3 flows, {many} ns/packet with 10 003 flows")
    assert many <= one * 1.5 + 30, (one, many)


def test_inconsistent_flow_entry_counted_not_crashed(rx_flows):
    """A flow entry written by something else than the loader, with a slot beyond the counters or a
    DSCP bit beyond the 6 DSCP bits: pass_bad_slot, the packet passes, no counter is touched."""
    tr, _ = rx_flows
    for sids, value in (
        (["fc00:5::1", "fc00:5::2"], struct.pack("<IIQQBBBBI", 501, 70_000, 10**9, 0, METHOD_DSCP, 0, 1, 0, 0)),
        (["fc00:5::3"], struct.pack("<IIQQBBBBI", 502, 5, 10**9, 0, METHOD_DSCP, 6, 1, 0, 0)),
    ):
        key = sidlist_key(sids)
        tr.rx_maps.put_flow(key, value)
        try:
            before = stats(RX, tr.inst)
            frame = encapped(sids, tclass=0x04)
            retval, out, _ = tr.rx.run(frame)
            assert retval == XDP_PASS and out == frame
            assert delta(before, stats(RX, tr.inst)) == {"pass_bad_slot": 1}
        finally:
            tr.rx_maps.del_flow(key)
