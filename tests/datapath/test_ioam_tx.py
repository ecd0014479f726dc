"""ioam_tx (TC insertion at the ingress edge) through BPF_PROG_TEST_RUN of the real program: the
bytes it inserts (against schemas/IOAM.md), every packet class with exact stats and per-flow
counters, the sampling rules, the filter, the MTU boundary, and the loader's command line.

Ground truth is what each test builds: the frames (tests/datapath/ioam_env.py writes them from the
IOAM.md tables), the device MTU, the clock read around each run, the flow the test installs."""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct
import time

import pytest

from tests.datapath.altmark_env import srh
from tests.datapath.ioam_env import (
    HBH_OPT,
    IF_ID_NONE,
    IOAM_TX,
    NS_PER_S,
    PIN_ROOT,
    POLICY,
    TC_ACT_UNSPEC,
    TRACE_TYPE,
    TX_COUNTERS,
    Node,
    Trace,
    altmark_doh,
    decode_e2e,
    decode_hbh,
    delta,
    e2e_doh,
    encapped,
    flow,
    inner_packet,
    list_flows,
    outer,
    parse_instrumented,
    run,
    srh_with_tlv,
    stats,
    strip_ioam,
)
from tests.datapath.ioam_fixtures import skb_ctx

TAI_OFFSET = 37  # io_testrun attaches with --tai-offset 37
NS = 123
NODE = 0xABCDE
FLOW_COUNTERS = ("seen", "sampled", "instrumented", "skipped_mtu", "skipped_gso", "skipped_other", "next_seq")


@contextlib.contextmanager
def tx_flow(inst: str, sids: list[str], flow_id: int, *extra: str, trace_nodes: int = 4, every: int | None = 1):
    sample = ["--sample-every", str(every)] if every is not None else []
    run(
        IOAM_TX,
        "add-flow",
        "--instance",
        inst,
        "--sids",
        ",".join(sids),
        "--flow-id",
        str(flow_id),
        "--namespace-id",
        str(NS),
        "--node-id",
        str(NODE),
        "--trace-nodes",
        str(trace_nodes),
        *sample,
        *extra,
    )
    try:
        yield
    finally:
        run(IOAM_TX, "del-flow", "--instance", inst, "--flow-id", str(flow_id), check=False)


def flow_counters(inst: str, flow_id: int) -> dict[str, int]:
    f = flow(IOAM_TX, inst, flow_id)
    return {k: f[k] for k in FLOW_COUNTERS}


def check_instrumented(frame, out, slots, seq, t0, t1, in_if=IF_ID_NONE, out_if=IF_ID_NONE, doh=b""):
    """out is frame with the two options inserted exactly as IOAM.md draws them."""
    assert strip_ioam(out) == frame, "only the HBH and the E2E DOH may be added"
    p = parse_instrumented(out)
    assert len(out) == len(frame) + 48 + 16 * slots
    assert p["plen"] == struct.unpack_from("!H", frame, 18)[0] + 48 + 16 * slots
    assert p["doh"] == doh
    h = decode_hbh(p["hbh"])
    assert h["next_header"] == (60 if doh else 43)
    assert h["hdr_ext_len"] == (16 + 16 * slots) // 8 - 1
    assert (h["opt_type"], h["opt_len"], h["ioam_type"], h["namespace"]) == (HBH_OPT, 10 + 16 * slots, 0, NS)
    assert (h["node_len"], h["flags"], h["remaining"], h["trace_type"], h["reserved"]) == (
        4,
        0,
        4 * (slots - 1),
        TRACE_TYPE,
        0,
    )
    assert all(e == Node(0, 0, 0, 0, 0, 0) for e in h["entries"][:-1]), "empty slots are zero"
    mine = h["entries"][-1]
    hop_limit = frame[14 + 7]
    assert (mine.hop_limit, mine.node_id, mine.in_if, mine.out_if) == (hop_limit, NODE, in_if, out_if)
    e = decode_e2e(p["e2e"])
    assert e["next_header"] == 41 and e["hdr_ext_len"] == 3 and e["padn"] == (1, 0) and e["tail"] == b"\x01\x02\x00\x00"
    assert (e["opt_type"], e["opt_len"], e["ioam_type"], e["namespace"], e["e2e_type"]) == (0x11, 22, 3, NS, 0xB000)
    assert e["seq"] == seq
    tx_ns = e["sec"] * NS_PER_S + e["nsec"]
    assert t0 <= tx_ns <= t1 and e["nsec"] < NS_PER_S
    # the trace entry is the same instant in the kernel's format: UTC seconds + microseconds
    assert mine.sec * 1_000_000 + mine.subsec == (tx_ns - TAI_OFFSET * NS_PER_S) // 1000
    assert mine.subsec < 1_000_000
    return e


def tai() -> int:
    return time.clock_gettime_ns(time.CLOCK_TAI)


@pytest.mark.parametrize("slots", [1, 4, 12])
@pytest.mark.parametrize("with_doh", [False, True], ids=["srh", "altmark_doh_srh"])
def test_inserts_trace_and_e2e_as_iomd_draws_them(io_testrun, slots, with_doh):
    tr, fid = io_testrun, 10 + slots
    doh = altmark_doh(0x1234, 1) if with_doh else None
    frame = encapped(doh=doh)
    with tx_flow(tr.inst, POLICY, fid, trace_nodes=slots):
        for seq in range(3):
            t0 = tai()
            retval, out, _ = tr.tx_run(frame)
            t1 = tai()
            assert retval == TC_ACT_UNSPEC
            check_instrumented(frame, out, slots, seq, t0, t1, doh=doh or b"")
        assert flow_counters(tr.inst, fid) == dict.fromkeys(FLOW_COUNTERS, 0) | {
            "seen": 3,
            "sampled": 3,
            "instrumented": 3,
            "next_seq": 3,
        }


def test_interface_ids_from_the_map_of_the_devices(io_testrun):
    tr = io_testrun
    t0d, t1d = tr.devs["t0"], tr.devs["t1"]
    run(IOAM_TX, "set-if-id", "--instance", tr.inst, "--netns", tr.ns, "--dev", t0d, "--if-id", "11")
    run(IOAM_TX, "set-if-id", "--instance", tr.inst, "--netns", tr.ns, "--dev", t1d, "--if-id", "4660")
    frame = encapped()
    with tx_flow(tr.inst, POLICY, 20):
        ctx = skb_ctx(ifindex=tr.ifindex["t0"], ingress_ifindex=tr.ifindex["t1"])
        t0 = tai()
        _, out, _ = tr.tx_run(frame, ctx=ctx)
        check_instrumented(frame, out, 4, 0, t0, tai(), in_if=4660, out_if=11)
        # an ingress device without an id: 0xFFFF (RFC 9197 "unavailable")
        ctx = skb_ctx(ifindex=tr.ifindex["t0"], ingress_ifindex=tr.ifindex["m1"])
        t0 = tai()
        _, out, _ = tr.tx_run(frame, ctx=ctx)
        check_instrumented(frame, out, 4, 1, t0, tai(), in_if=IF_ID_NONE, out_if=11)


def _raw_flow(flow_id: int, trace_nodes: int, mode: int, every: int) -> bytes:
    """struct ioam_tx_flow (datapath/ioam.h) with inconsistent values the loader never writes."""
    head = struct.pack("<IIHBBIQQ", flow_id, NODE, NS, trace_nodes, mode, every, 0, 0)
    return head + bytes(72) + bytes(8 * 8)


def _put_raw_flow(inst: str, sids: list[str], value: bytes) -> None:
    from tests.datapath.altmark_env import _lib, sidlist_key
    from tests.fuzz.bpf_testrun import obj_get

    fd = obj_get(PIN_ROOT / inst / "ioam_tx" / "ioam_tx_flows")
    key = sidlist_key(sids)
    k, v = ctypes.create_string_buffer(key, len(key)), ctypes.create_string_buffer(value, len(value))
    try:
        assert _lib.bpf_map_update_elem(fd, k, v, 0) == 0
    finally:
        os.close(fd)


def _cases(tr):
    """(name, frame, ctx, stats counter, flow whose counters move, their deltas)"""
    other = ["fc00:9::1", "fc00:9::2"]
    m0 = tr.ifindex["m0"]  # MTU 1280
    grow4 = 48 + 16 * 4
    ra_hbh = bytes([43, 0, 5, 2, 0, 0, 1, 0])  # Router Alert + PadN(0): not IOAM
    doh_pad = bytes([41, 0, 1, 4, 0, 0, 0, 0])  # a DOH after the SRH without IOAM
    ioam_hbh = Trace(43, NS, 2, [Node(64, 1, 1, 1, 1, 1)]).pack()
    return [
        ("ipv4", bytes.fromhex("020000000002020000000001") + b"\x08\x00" + bytes(40), None, "pass_not_ipv6", None, {}),
        # (an IPv6 frame shorter than its header: the kernel refuses such a TC test run, EINVAL)
        ("arp", bytes.fromhex("020000000002020000000001") + b"\x08\x06" + bytes(28), None, "pass_not_ipv6", None, {}),
        ("plain_ipv6", outer(inner_packet(b"q" * 20)[40:], 17), None, "pass_no_srh", None, {}),
        (
            "routing_type_2",
            outer(bytes([41, 2, 2, 1, 0, 0, 0, 0]) + bytes(16) + inner_packet(b"q"), 43),
            None,
            "pass_no_srh",
            None,
            {},
        ),
        (
            "doh_then_udp",
            outer(bytes([17, 0, 1, 4, 0, 0, 0, 0]) + inner_packet(b"q")[40:], 60),
            None,
            "pass_no_srh",
            None,
            {},
        ),
        ("too_many_sids", encapped([f"fc00:8::{i}" for i in range(1, 8)]), None, "pass_too_many_sids", None, {}),
        ("srh_hdrlen_short", outer(srh(POLICY, hdrlen=2) + inner_packet(b"q"), 43), None, "pass_malformed", None, {}),
        (
            "srh_segleft_beyond",
            outer(srh(POLICY, segleft=3) + inner_packet(b"q"), 43),
            None,
            "pass_malformed",
            None,
            {},
        ),
        ("srh_truncated", encapped()[: 14 + 40 + 8 + 20], None, "pass_malformed", None, {}),
        ("hbh_past_payload", outer(bytes([43, 9]) + bytes(6), 0) + srh(POLICY), None, "pass_malformed", None, {}),
        ("unmonitored", encapped(["fc00:2::e", "fc00:3::d7"]), None, "pass_unmonitored", None, {}),
        ("filtered_dport", encapped(other, dport=9001), None, "pass_filtered", None, {}),
        (
            "sampled",
            encapped(other),
            None,
            "instrumented",
            31,
            {"seen": 1, "sampled": 1, "instrumented": 1, "next_seq": 1},
        ),
        (
            "gso",
            encapped(other),
            skb_ctx(gso_segs=2, gso_size=1000),
            "skip_gso",
            31,
            {"seen": 1, "sampled": 1, "skipped_gso": 1},
        ),
        (
            "already_ioam_hbh",
            outer(ioam_hbh + srh(other) + inner_packet(b"x" * 32), 0, dst=other[0]),
            None,
            "skip_already_ioam",
            31,
            {"seen": 1, "sampled": 1, "skipped_other": 1},
        ),
        (
            "already_ioam_e2e",
            outer(srh(other, nexthdr=60) + e2e_doh(41, NS, 5, 1, 2) + inner_packet(b"x" * 32), 43, dst=other[0]),
            None,
            "skip_already_ioam",
            31,
            {"seen": 1, "sampled": 1, "skipped_other": 1},
        ),
        (
            "other_hbh",
            outer(ra_hbh + srh(other) + inner_packet(b"x" * 32), 0, dst=other[0]),
            None,
            "skip_other_ext",
            31,
            {"seen": 1, "sampled": 1, "skipped_other": 1},
        ),
        (
            "doh_after_srh",
            outer(srh(other, nexthdr=60) + doh_pad + inner_packet(b"x" * 32), 43, dst=other[0]),
            None,
            "skip_other_ext",
            31,
            {"seen": 1, "sampled": 1, "skipped_other": 1},
        ),
        (
            "srh_tlvs_move_257",  # the DOH + SRH block is 264 bytes: more than ioam_tx moves (256)
            outer(srh_with_tlv(other, 224) + inner_packet(b"x" * 32), 43, dst=other[0]),
            None,
            "skip_too_long",
            31,
            {"seen": 1, "sampled": 1, "skipped_other": 1},
        ),
        (
            "srh_tlvs_move_256",
            outer(srh_with_tlv(other, 216) + inner_packet(b"x" * 32), 43, dst=other[0]),
            None,
            "instrumented",
            31,
            {"seen": 1, "sampled": 1, "instrumented": 1, "next_seq": 1},
        ),
        (
            "mtu_exactly_full",  # after the insertion the frame is MTU + Ethernet exactly: fits
            encapped(other, payload=b"m" * (1280 - grow4 - 40 - 40 - 40 - 8)),
            skb_ctx(ifindex=m0),
            "instrumented",
            31,
            {"seen": 1, "sampled": 1, "instrumented": 1, "next_seq": 1},
        ),
        (
            "mtu_one_byte_over",
            encapped(other, payload=b"m" * (1280 - grow4 - 40 - 40 - 40 - 8 + 1)),
            skb_ctx(ifindex=m0),
            "skip_mtu",
            31,
            {"seen": 1, "sampled": 1, "skipped_mtu": 1},
        ),
    ]


def test_every_packet_class_counted_once(io_testrun):
    tr = io_testrun
    other = ["fc00:9::1", "fc00:9::2"]
    with tx_flow(tr.inst, other, 31, "--match-dport", "9000"):
        for name, frame, ctx, counter, fid, moved in _cases(tr):
            before, fbefore = stats(IOAM_TX, tr.inst), flow_counters(tr.inst, 31)
            retval, out, _ = tr.tx_run(frame, ctx=ctx)
            assert retval == TC_ACT_UNSPEC, name
            assert delta(before, stats(IOAM_TX, tr.inst)) == {counter: 1}, name
            assert delta(fbefore, flow_counters(tr.inst, 31)) == (moved if fid else {}), name
            if counter == "instrumented":
                assert strip_ioam(out) == frame, name
            else:
                assert out == frame, f"{name}: a packet not instrumented leaves unchanged"


def test_inconsistent_flow_entry_counted(io_testrun):
    tr, sids = io_testrun, ["fc00:7::1"]
    for value in (_raw_flow(41, 0, 1, 1), _raw_flow(41, 13, 1, 1), _raw_flow(41, 4, 1, 0), _raw_flow(41, 4, 9, 1)):
        _put_raw_flow(tr.inst, sids, value)
        before = stats(IOAM_TX, tr.inst)
        frame = encapped(sids)
        retval, out, _ = tr.tx_run(frame)
        assert retval == TC_ACT_UNSPEC and out == frame
        assert delta(before, stats(IOAM_TX, tr.inst)) == {"pass_bad_flow": 1}
    run(IOAM_TX, "del-flow", "--instance", tr.inst, "--sids", ",".join(sids))


def test_sample_every_n_is_global_across_cpus(io_testrun):
    """--sample-every 7: packet k of the flow is instrumented iff k % 7 == 0, whichever CPU it runs
    on (the test alternates CPUs): a per-CPU rule would instrument other packets."""
    tr, n, every = io_testrun, 45, 7
    cpus = sorted(os.sched_getaffinity(0))
    frame = encapped()
    old = os.sched_getaffinity(0)
    try:
        with tx_flow(tr.inst, POLICY, 40, every=every):
            before = stats(IOAM_TX, tr.inst)
            seqs = []
            for k in range(n):
                os.sched_setaffinity(0, {cpus[k % len(cpus)]})
                _, out, _ = tr.tx_run(frame)
                if k % every == 0:
                    seqs.append(decode_e2e(parse_instrumented(out)["e2e"])["seq"])
                else:
                    assert out == frame, f"packet {k} must not be sampled"
            assert seqs == list(range(len(seqs)))
            sampled = len(range(0, n, every))
            assert delta(before, stats(IOAM_TX, tr.inst)) == {"instrumented": sampled, "pass_not_sampled": n - sampled}
            assert flow_counters(tr.inst, 40) == dict.fromkeys(FLOW_COUNTERS, 0) | {
                "seen": n,
                "sampled": sampled,
                "instrumented": sampled,
                "next_seq": sampled,
            }
    finally:
        os.sched_setaffinity(0, old)


def test_sample_interval(io_testrun):
    """--sample-interval-us M: a packet is sampled when M µs passed since the last sampled one. The
    program's decision time lies between the test's clock reads around the run and the E2E time."""
    tr, m_us = io_testrun, 20_000
    frame = encapped()
    with tx_flow(tr.inst, POLICY, 50, "--sample-interval-us", str(m_us), every=None):
        runs = []
        end = tai() + 300_000_000
        while tai() < end:
            t0 = tai()
            _, out, _ = tr.tx_run(frame)
            runs.append((t0, out))
            time.sleep(0.003)
        last_e2e, last_t0, sampled = None, None, 0
        for i, (t0, out) in enumerate(runs):
            if out == frame:
                assert last_e2e is not None, "the first packet is sampled"
                # not sampled: the decision came less than M after the last sampled one
                assert t0 < last_e2e + m_us * 1000, f"run {i}: {(t0 - last_e2e) / 1e3:.0f} us after, not sampled"
                continue
            e = decode_e2e(parse_instrumented(out)["e2e"])
            assert e["seq"] == sampled
            tx_ns = e["sec"] * NS_PER_S + e["nsec"]
            if last_t0 is not None:
                assert tx_ns - last_t0 >= m_us * 1000, f"run {i}: sampled {(tx_ns - last_t0) / 1e3:.0f} us after"
            last_e2e, last_t0, sampled = tx_ns, t0, sampled + 1
        assert 3 <= sampled <= 300 // 20 + 1  # never more often than every M; a few even on a loaded VM
        f = flow(IOAM_TX, tr.inst, 50)
        assert (f["seen"], f["sampled"], f["instrumented"]) == (len(runs), sampled, sampled)
        assert f["sample_interval_us"] == m_us


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("src", "fd00:a::1", True),
        ("src", "fd00:aa::1", False),
        ("dst", "fd00:b::7", True),
        ("dst", "fd00:c::1", False),
        ("sport", 40000, True),
        ("sport", 40001, False),
        ("dport", 9000, True),
        ("dport", 9001, False),
        ("proto", 6, False),
    ],
)
def test_filter_on_the_inner_packet(io_testrun, field, value, match):
    """--match-src fd00:a::/64 --match-dst fd00:b::/120 --match-proto 17 --match-sport 40000 --match-dport 9000:
    one field of the inner packet changed at a time."""
    tr = io_testrun
    kw = {"src": "fd00:a::1", "dst": "fd00:b::1", "sport": 40000, "dport": 9000, "proto": 17} | {field: value}
    frame = encapped(**kw)
    filt = ["--match-src", "fd00:a::/64", "--match-dst", "fd00:b::/120", "--match-proto", "17"]
    with tx_flow(tr.inst, POLICY, 60, *filt, "--match-sport", "40000", "--match-dport", "9000"):
        before = stats(IOAM_TX, tr.inst)
        _, out, _ = tr.tx_run(frame)
        assert delta(before, stats(IOAM_TX, tr.inst)) == {"instrumented" if match else "pass_filtered": 1}
        assert (out != frame) == match
        f = flow(IOAM_TX, tr.inst, 60)
        assert f["seen"] == int(match)
        assert f["match"] == {
            "fields": 0x1F,
            "src": "fd00:a::/64",
            "dst": "fd00:b::/120",
            "proto": 17,
            "sport": 40000,
            "dport": 9000,
        }


def test_filter_tcp_ports(io_testrun):
    tr = io_testrun
    with tx_flow(tr.inst, POLICY, 61, "--match-proto", "6", "--match-dport", "443"):
        for dport, proto, want in ((443, 6, "instrumented"), (443, 17, "pass_filtered"), (80, 6, "pass_filtered")):
            before = stats(IOAM_TX, tr.inst)
            tr.tx_run(encapped(proto=proto, dport=dport))
            assert delta(before, stats(IOAM_TX, tr.inst)) == {want: 1}, (dport, proto)


def test_reinstall_restarts_sequence_and_counters(io_testrun):
    tr, frame = io_testrun, encapped()
    with tx_flow(tr.inst, POLICY, 70):
        for _ in range(3):
            tr.tx_run(frame)
        assert flow(IOAM_TX, tr.inst, 70)["next_seq"] == 3
        with tx_flow(tr.inst, POLICY, 70, trace_nodes=2):
            assert flow_counters(tr.inst, 70) == dict.fromkeys(FLOW_COUNTERS, 0)
            _, out, _ = tr.tx_run(frame)
            assert decode_e2e(parse_instrumented(out)["e2e"])["seq"] == 0
            assert decode_hbh(parse_instrumented(out)["hbh"])["slots"] == 2


def test_loader_cli(io_testrun):
    inst = io_testrun.inst
    base = ["add-flow", "--instance", inst, "--sids", "fc00:5::1", "--flow-id", "80", "--namespace-id", "1"]
    base += ["--node-id", "1", "--trace-nodes", "2"]
    usage = [
        (base, "--sample-every"),  # neither sampling flag
        (base + ["--sample-every", "2", "--sample-interval-us", "5"], "--sample-every"),
        (base + ["--sample-every", "0"], "--sample-every"),
        (base + ["--sample-every", "65536"], "--sample-every"),
        (base + ["--sample-interval-us", "0"], "--sample-interval-us"),
        (base[:-2] + ["--trace-nodes", "13", "--sample-every", "1"], "--trace-nodes"),
        (base[:-2] + ["--trace-nodes", "0", "--sample-every", "1"], "--trace-nodes"),
        (base[:-2] + ["--sample-every", "1"], "--trace-nodes"),
        (base + ["--sample-every", "1", "--node-id", "16777216"], "--node-id"),
        (base + ["--sample-every", "1", "--namespace-id", "65536"], "--namespace-id"),
        (base + ["--sample-every", "1", "--match-src", "fd00::1"], "--match-src"),
        (base + ["--sample-every", "1", "--match-dst", "fd00::/129"], "--match-dst"),
        (base + ["--sample-every", "1", "--match-proto", "256"], "--match-proto"),
        (base + ["--sample-every", "1", "--match-proto", "1", "--match-dport", "5"], "--match-dport"),
        (base + ["--sample-every", "1", "--match-sport", "65536"], "--match-sport"),
        (["add-flow", "--instance", inst, "--sids", "fc00::g", "--flow-id", "1"], "--sids"),
        (["del-flow", "--instance", inst], "--flow-id"),
        (["set-if-id", "--instance", inst, "--dev", "x"], "--if-id"),
        (["set-if-id", "--instance", inst, "--dev", "x", "--if-id", "65536"], "--if-id"),
        (["set-tai-offset", "--instance", inst, "--tai-offset", "1001"], "--tai-offset"),
        (["attach", "--instance", inst], "--dev"),
        (["stats", "--instance", "a/b"], "--instance"),
        (["test-run", "--instance", inst, "--hex", "abc"], "--hex"),
        (["frobnicate", "--instance", inst], "frobnicate"),
    ]
    for args, flag in usage:
        p = run(IOAM_TX, *args, check=False)
        assert p.returncode == 2 and flag in p.stderr, (args, p.returncode, p.stderr)
    failing = [
        (["stats", "--instance", "ioamdp_nosuch"], "cannot open"),
        (["del-flow", "--instance", inst, "--flow-id", "999"], "no flow 999"),
        (["set-if-id", "--instance", inst, "--netns", io_testrun.ns, "--dev", "nosuch0", "--if-id", "1"], "--dev"),
        (["attach", "--instance", inst, "--dev", "x", "--netns", "ioamdp_nosuch"], "--netns"),
    ]
    for args, text in failing:
        p = run(IOAM_TX, *args, check=False)
        assert p.returncode == 1 and text in p.stderr, (args, p.returncode, p.stderr)
    with tx_flow(inst, POLICY, 81):
        p = run(IOAM_TX, *base[:4], "fc00:5::9", "--flow-id", "81", *base[7:], "--sample-every", "1", check=False)
        assert p.returncode == 1 and "--flow-id: 81 is already used" in p.stderr
        assert [f["flow_id"] for f in list_flows(IOAM_TX, inst)] == [81]
        run(IOAM_TX, "del-flow", "--instance", inst, "--sids", ",".join(POLICY))
        assert list_flows(IOAM_TX, inst) == []
    assert list(stats(IOAM_TX, inst)) == TX_COUNTERS
    out = run(IOAM_TX, "test-run", "--instance", inst, "--hex", encapped().hex()).stdout
    assert '"retval": -1, "action": "TC_ACT_UNSPEC"' in out
