"""ioam_rx (XDP extraction at the egress edge) through BPF_PROG_TEST_RUN of the real program:
every packet class lands in exactly one stats counter, only packets of a monitored flow with both
valid options give a record, and every record carries exactly what the test put in the frame (the
frames are written from schemas/IOAM.md by tests/datapath/ioam_env.py), the test run's clock
window and the loader's configuration; the ring buffer full case; the loader's command line."""

from __future__ import annotations

import contextlib
import struct
import time

import numpy as np

from segscope_schemas.ioam_record import IOAM_RECORD_DTYPE
from tests.datapath.altmark_env import inner_udp, srh
from tests.datapath.ioam_env import (
    IOAM_RX,
    NS_PER_S,
    PIN_ROOT,
    POLICY,
    RX_COUNTERS,
    TRACE_TYPE,
    XDP_PASS,
    Node,
    Trace,
    altmark_doh,
    delta,
    dump,
    e2e_doh,
    flow,
    instrumented,
    list_flows,
    outer,
    run,
    stats,
)
from tests.fuzz.bpf_testrun import RingReader

NS = 123
OTHER = ["fc00:9::1", "fc00:9::2", "fc00:9::3"]
TAI_OFFSET = 37  # io_testrun attaches ioam_rx with --tai-offset 37 --node-id 9
NODE_ID = 9
LO_IFINDEX = 1  # an XDP test run arrives on the loopback device of the caller's namespace


def nodes(n: int, base: int = 100) -> list[Node]:
    """n filled entries, newest first (wire order): distinct values in every field."""
    return [Node(64 - i, base + i, 10 + i, 20 + i, 1_795_000_000 + i, 1000 * i + 7) for i in range(n)]


@contextlib.contextmanager
def rx_flows(inst: str):
    run(
        IOAM_RX, "add-flow", "--instance", inst, "--sids", ",".join(POLICY), "--flow-id", "7", "--namespace-id", str(NS)
    )
    run(IOAM_RX, "add-flow", "--instance", inst, "--sids", ",".join(OTHER), "--flow-id", "8", "--namespace-id", "200")
    try:
        yield
    finally:
        for fid in ("7", "8"):
            run(IOAM_RX, "del-flow", "--instance", inst, "--flow-id", fid, check=False)


def good(
    slots: int = 4,
    filled: int = 2,
    travel: list[str] = POLICY,
    ns: int = NS,
    doh: bytes | None = None,
    seq: int = 41,
    sec: int = 1_795_000_100,
    nsec: int = 123_456_789,
    **trace_kw,
) -> tuple[bytes, dict]:
    """A valid instrumented packet and what its record must hold."""
    t = Trace(60 if doh else 43, ns, slots, nodes(filled), **trace_kw)
    frame = instrumented(t, e2e_doh(41, ns, seq, sec, nsec), travel=travel, doh=doh, hlim=61)
    want = {
        "tx_tai_ns": sec * NS_PER_S + nsec,
        "seq": seq,
        "namespace_id": ns,
        "slots": slots,
        "filled": filled,
        "trace_type": TRACE_TYPE,
        "trace_flags": t.flags,
        "hop_limit": 61,
        "entries": nodes(filled)[:12],
    }
    return frame, want


def with_plen(frame: bytes, plen: int) -> bytes:
    return frame[:18] + struct.pack("!H", plen) + frame[20:]


def bad_trace(**kw) -> bytes:
    kw.setdefault("filled", [Node(64, 1, 2, 3, 4, 5)])
    return instrumented(Trace(43, NS, kw.pop("slots", 2), kw.pop("filled"), **kw), e2e_doh(41, NS, 1, 2, 3))


def _cases() -> list[tuple[str, bytes, str, int | None, dict | None]]:
    """(name, frame, counter, flow id recorded, record fields)"""
    f_base, w_base = good()
    f_doh, w_doh = good(doh=altmark_doh(0x1234, 1))
    f_full, w_full = good(slots=4, filled=4)
    f_none, w_none = good(slots=3, filled=0)
    f_12, w_12 = good(slots=12, filled=12)
    f_over, w_over = good(slots=2, filled=2, flags=0x8)
    f_other, w_other = good(travel=OTHER, ns=200, seq=2**64 - 1, sec=2**32 - 1, nsec=999_999_999)
    f_14, w_14 = good(slots=14, filled=14)
    # PadN(2), the trace, 13 more options and one of 6 bytes: 16 in all, the most the walk takes
    f_16, w_16 = good(post=b"\x1e\x00" * 13 + b"\x1e\x04" + bytes(4))
    hbh = f_base[54 : 54 + 16 + 16 * 4]
    e2e_only = outer(
        srh(POLICY, nexthdr=60, segleft=0) + e2e_doh(41, NS, 1, 2, 3) + inner_udp(b"z"), 43, dst=POLICY[-1]
    )
    return [
        ("ipv4", bytes.fromhex("020000000002020000000001") + b"\x08\x00" + bytes(40), "pass_not_ipv6", None, None),
        ("short_ipv6", f_base[:44], "pass_not_ipv6", None, None),
        (
            "srv6_without_ioam",
            outer(srh(POLICY, segleft=0) + inner_udp(b"z"), 43, dst=POLICY[-1]),
            "pass_no_hbh",
            None,
            None,
        ),
        ("e2e_without_trace", e2e_only, "pass_no_hbh", None, None),
        ("frame_ends_in_hbh", f_base[: 54 + 40], "pass_truncated", None, None),
        ("payload_ends_in_hbh", with_plen(f_base, 40), "pass_truncated", None, None),
        ("frame_ends_in_srh", f_base[: 54 + len(hbh) + 20], "pass_truncated", None, None),
        ("frame_ends_in_e2e", f_base[: 54 + len(hbh) + 40 + 20], "pass_truncated", None, None),
        ("frame_ends_in_altmark_doh", f_doh[: 54 + len(hbh) + 4], "pass_truncated", None, None),
        ("padding_8_bytes", bad_trace(pre_pad=b"\x01\x06" + bytes(6)), "pass_bad_length", None, None),
        ("padn_content", bad_trace(pre_pad=b"\x01\x02\x00\x07" + b"\x01\x02\x00\x00"), "pass_bad_length", None, None),
        ("misaligned_option", bad_trace(pre_pad=b"\x01\x01\x00"), "pass_bad_length", None, None),
        # 17 options in the HBH: one more than the walk takes (16 exactly is recorded, below)
        ("seventeen_options", bad_trace(post=b"\x1e\x00" * 14 + b"\x1e\x02" + bytes(2)), "pass_bad_length", None, None),
        ("remaining_beyond_data", bad_trace(remaining=12), "pass_bad_length", None, None),
        ("remaining_not_entries", bad_trace(remaining=2), "pass_bad_length", None, None),
        ("node_len_3", bad_trace(node_len=3), "pass_bad_length", None, None),
        ("data_not_entries", bad_trace(data=bytes(20), remaining=0), "pass_bad_length", None, None),
        ("no_slot", bad_trace(slots=0, filled=[], data=b"", remaining=0), "pass_bad_length", None, None),
        (
            "e2e_len_21",
            instrumented(Trace(43, NS, 2, nodes(1)), e2e_doh(41, NS, 1, 2, 0x300, opt_len=21)),
            "pass_bad_length",
            None,
            None,
        ),
        (
            "hbh_only_padding",
            outer(bytes([43, 0, 1, 4, 0, 0, 0, 0]) + srh(POLICY, segleft=0) + inner_udp(b"z"), 0),
            "pass_no_trace",
            None,
            None,
        ),
        (
            "hbh_router_alert",
            outer(bytes([43, 0, 5, 2, 0, 0, 1, 0]) + srh(POLICY, segleft=0) + inner_udp(b"z"), 0),
            "pass_no_trace",
            None,
            None,
        ),
        ("ioam_option_type_2", bad_trace(ioam_type=2), "pass_unknown_type", None, None),
        ("trace_type_f80000", bad_trace(trace_type=0xF80000), "pass_unknown_type", None, None),
        (
            "e2e_type_8000",
            instrumented(Trace(43, NS, 2, nodes(1)), e2e_doh(41, NS, 1, 2, 3, e2e_type=0x8000)),
            "pass_unknown_type",
            None,
            None,
        ),
        (
            "e2e_ioam_type_2",
            instrumented(Trace(43, NS, 2, nodes(1)), e2e_doh(41, NS, 1, 2, 3, ioam_type=2)),
            "pass_unknown_type",
            None,
            None,
        ),
        ("hbh_then_udp", outer(Trace(17, NS, 2, nodes(1)).pack() + inner_udp(b"z")[40:], 0), "pass_no_srh", None, None),
        ("too_many_sids", good(travel=[f"fc00:8::{i}" for i in range(1, 8)])[0], "pass_too_many_sids", None, None),
        (
            "srh_segleft_beyond",
            outer(Trace(43, NS, 2, nodes(1)).pack() + srh(POLICY, nexthdr=60, segleft=3) + e2e_doh(41, NS, 1, 2, 3), 0),
            "pass_malformed_srh",
            None,
            None,
        ),
        ("unmonitored", good(travel=["fc00:2::e", "fc00:3::d7"])[0], "pass_unmonitored", None, None),
        ("trace_namespace_124", good(ns=124)[0], "pass_unknown_namespace", None, None),
        (
            "e2e_namespace_124",
            instrumented(Trace(43, NS, 2, nodes(1)), e2e_doh(41, 124, 1, 2, 3)),
            "pass_unknown_namespace",
            None,
            None,
        ),
        ("no_e2e", instrumented(Trace(43, NS, 2, nodes(1)), None), "pass_no_e2e", None, None),
        (
            "doh_without_e2e",
            instrumented(Trace(43, NS, 2, nodes(1)), bytes([41, 0, 1, 4, 0, 0, 0, 0])),
            "pass_no_e2e",
            None,
            None,
        ),
        ("e2e_nsec_1e9", good(nsec=NS_PER_S)[0], "pass_bad_timestamp", None, None),
        ("recorded", f_base, "recorded", 7, w_base),
        ("recorded_after_altmark_doh", f_doh, "recorded", 7, w_doh),
        ("recorded_full", f_full, "recorded", 7, w_full),
        ("recorded_empty", f_none, "recorded", 7, w_none),
        ("recorded_12", f_12, "recorded", 7, w_12),
        ("recorded_overflow", f_over, "recorded", 7, w_over | {"flags": 1}),
        ("recorded_other_flow_extremes", f_other, "recorded", 8, w_other),
        ("recorded_trailer", f_base + bytes(6), "recorded", 7, w_base),
        ("recorded_14_of_14", f_14, "recorded_truncated", 7, w_14 | {"flags": 2}),
        ("recorded_16_options", f_16, "recorded", 7, w_16),
    ]


def check_record(rec: np.void, fid: int, want: dict, t0: int, t1: int) -> None:
    assert t0 <= int(rec["rx_tai_ns"]) <= t1
    fields = {
        "flow_id": fid,
        "ifindex": LO_IFINDEX,
        "node_id": NODE_ID,
        "tai_utc_offset_s": TAI_OFFSET,
        "flags": 0,
        "reserved0": 0,
        "reserved1": 0,
    } | {k: v for k, v in want.items() if k != "entries"}
    assert {k: int(rec[k]) for k in fields} == fields
    got = [Node.unpack(rec["entries"][i].tobytes()) for i in range(min(want["filled"], 12))]
    assert got == want["entries"]
    assert not rec["entries"][len(got) :].tobytes().strip(b"\0"), "entries not copied are zero"


def test_every_packet_class_counted_once_recorded_exactly(io_testrun):
    tr = io_testrun
    ring = RingReader(PIN_ROOT / tr.inst / "ioam_rx" / "ioam_records")
    try:
        ring.drain()
        with rx_flows(tr.inst):
            for name, frame, counter, fid, want in _cases():
                before = stats(IOAM_RX, tr.inst)
                records = {f["flow_id"]: f["records"] for f in list_flows(IOAM_RX, tr.inst)}
                t0 = time.clock_gettime_ns(time.CLOCK_TAI)
                retval, out, _ = tr.rx.run(frame)
                t1 = time.clock_gettime_ns(time.CLOCK_TAI)
                assert retval == XDP_PASS and out == frame, name
                assert delta(before, stats(IOAM_RX, tr.inst)) == {counter: 1}, name
                got = ring.drain()
                after = {f["flow_id"]: f["records"] for f in list_flows(IOAM_RX, tr.inst)}
                if fid is None:
                    assert got == [] and after == records, name
                    continue
                assert len(got) == 1 and len(got[0]) == IOAM_RECORD_DTYPE.itemsize, name
                assert after == records | {fid: records[fid] + 1}, name
                check_record(np.frombuffer(got[0], dtype=IOAM_RECORD_DTYPE)[0], fid, want, t0, t1)
    finally:
        ring.close()


def test_ring_buffer_full_counted_and_passed(io_testrun):
    """A 4 KiB ring holds 15 records of 256 + 8 bytes: the 16th is counted, not recorded, passed."""
    tr, inst = io_testrun, f"{io_testrun.inst}rb"
    run(
        IOAM_RX,
        "attach",
        "--netns",
        tr.ns,
        "--dev",
        tr.devs["m1"],
        "--instance",
        inst,
        "--node-id",
        "3",
        "--ringbuf-size",
        "4096",
    )
    try:
        run(
            IOAM_RX,
            "add-flow",
            "--instance",
            inst,
            "--sids",
            ",".join(POLICY),
            "--flow-id",
            "7",
            "--namespace-id",
            str(NS),
        )
        prog = PIN_ROOT / inst / "ioam_rx" / "prog"
        from tests.datapath.altmark_env import TestRun

        rx = TestRun(prog)
        for k in range(16):
            assert rx.run(good(seq=k)[0])[0] == XDP_PASS
        assert {k: v for k, v in stats(IOAM_RX, inst).items() if v} == {"recorded": 15, "pass_ringbuf_full": 1}
        f = flow(IOAM_RX, inst, 7)
        assert (f["records"], f["ringbuf_full"]) == (15, 1)
        recs = dump(inst, count=15)
        assert [r["seq"] for r in recs] == list(range(15))
        assert rx.run(good(seq=16)[0])[0] == XDP_PASS  # room again
        assert [r["seq"] for r in dump(inst, count=1)] == [16]
        assert dump(inst) == []
    finally:
        run(IOAM_RX, "detach", "--netns", tr.ns, "--dev", tr.devs["m1"], "--instance", inst, check=False)


def test_dump_json_matches_the_record(io_testrun):
    tr = io_testrun
    frame, want = good(slots=3, filled=2, doh=altmark_doh(5, 0))
    with rx_flows(tr.inst):
        dump(tr.inst)  # empty the ring
        t0 = time.clock_gettime_ns(time.CLOCK_TAI)
        tr.rx.run(frame)
        (rec,) = dump(tr.inst, count=1)
    assert rec["rx_tai_ns"] >= t0
    entries = [
        Node(e["hop_limit"], e["node_id"], e["ingress_if_id"], e["egress_if_id"], e["ts_sec"], e["ts_subsec"])
        for e in rec["entries"]
    ]
    assert entries == want["entries"]
    assert {k: rec[k] for k in ("tx_tai_ns", "seq", "namespace_id", "slots", "filled", "trace_type", "hop_limit")} == {
        k: want[k] for k in ("tx_tai_ns", "seq", "namespace_id", "slots", "filled", "trace_type", "hop_limit")
    }
    assert (rec["flow_id"], rec["node_id"], rec["tai_utc_offset_s"], rec["flags"], rec["ifindex"]) == (7, 9, 37, 0, 1)


def test_loader_cli(io_testrun):
    inst = io_testrun.inst

    def attach_x(dev: str, *extra: str) -> list[str]:  # attach of a second instance on io_testrun's netns
        return ["attach", "--instance", f"{inst}x", "--netns", io_testrun.ns, "--dev", dev, "--node-id", "1", *extra]

    usage = [
        (["add-flow", "--instance", inst, "--sids", ",".join(POLICY), "--flow-id", "3"], "--namespace-id"),
        (["add-flow", "--instance", inst, "--sids", ",".join(POLICY), "--namespace-id", "3"], "--flow-id"),
        (["add-flow", "--instance", inst, "--sids", "a,b", "--flow-id", "3", "--namespace-id", "1"], "--sids"),
        (["attach", "--instance", inst, "--dev", "x"], "--node-id"),
        (["attach", "--instance", inst, "--dev", "x", "--node-id", "1", "--ringbuf-size", "5000"], "--ringbuf-size"),
        (["attach", "--instance", inst, "--dev", "x", "--node-id", "1", "--behind", "stamp"], "--behind"),
        (["attach", "--instance", inst, "--dev", "x", "--node-id", "1", "--hook", "ebpf"], "--hook"),
        (["dump", "--instance", inst, "--count", "-1"], "--count"),
        (["del-flow", "--instance", inst], "--sids or --flow-id"),
    ]
    for args, flag in usage:
        p = run(IOAM_RX, *args, check=False)
        assert p.returncode == 2 and flag in p.stderr, (args, p.returncode, p.stderr)
    for args, text in [
        (["dump", "--instance", "ioamdp_nosuch"], "cannot open"),
        (["del-flow", "--instance", inst, "--flow-id", "999"], "no flow 999"),
        # one more device for an instance that was never attached
        (["attach-dev", "--instance", "ioamdp_nosuch", "--dev", "x"], "run attach first"),
        (["dump", "--instance", inst, "--count", "1", "--timeout-ms", "100"], "only 0 of --count 1"),
        # the device already runs ioam_rx of this instance
        (attach_x(io_testrun.devs["t1"]), "(xdp_chain), not the XDP chain of"),
        # a device that is not there is named, also where --hook auto asks its driver
        (attach_x("nosuch", "--hook", "tc"), "no interface 'nosuch'"),
        (attach_x("nosuch", "--hook", "auto"), "no interface 'nosuch'"),
    ]:
        p = run(IOAM_RX, *args, check=False)
        assert p.returncode == 1 and text in p.stderr, (args, p.returncode, p.stderr)
    assert not (PIN_ROOT / f"{inst}x").exists(), "a failed attach leaves no pins"
    with rx_flows(inst):
        p = run(
            IOAM_RX,
            "add-flow",
            "--instance",
            inst,
            "--sids",
            "fc00:1::1",
            "--flow-id",
            "7",
            "--namespace-id",
            "1",
            check=False,
        )
        assert p.returncode == 1 and "--flow-id: 7 is already used" in p.stderr
        flows = {f["flow_id"]: f for f in list_flows(IOAM_RX, inst)}
        assert flows[7]["sids"] == POLICY and flows[8]["sids"] == OTHER
        assert (flows[7]["namespace_id"], flows[8]["namespace_id"]) == (NS, 200)
    assert list(stats(IOAM_RX, inst)) == RX_COUNTERS
    out = run(IOAM_RX, "test-run", "--instance", inst, "--hex", good()[0].hex()).stdout
    assert '"action": "XDP_PASS"' in out


def test_alternate_sid_lists_record_in_one_flow(io_testrun):
    """add-flow --alternate: another SID list of flow 7 (a path its policy can be steered to). Its
    packets are recorded with flow id 7 and their own counter; the flow must exist, in the same
    namespace; del-flow --flow-id removes every SID list of the flow. Without --alternate the flow id
    stays one SID list's."""
    tr, steered = io_testrun, ["fc00:2::e", "fc00:2::e2", "fc00:3::d6"]
    add = ["add-flow", "--instance", tr.inst, "--sids", ",".join(steered), "--alternate"]
    ring = RingReader(PIN_ROOT / tr.inst / "ioam_rx" / "ioam_records")
    try:
        ring.drain()
        with rx_flows(tr.inst):
            for args, text in [
                (["--flow-id", "9", "--namespace-id", str(NS)], "--alternate: no flow 9"),
                (["--flow-id", "7", "--namespace-id", "200"], f"--namespace-id: flow 7 has namespace {NS}"),
            ]:
                p = run(IOAM_RX, *add, *args, check=False)
                assert p.returncode == 1 and text in p.stderr, (args, p.returncode, p.stderr)
            run(IOAM_RX, *add, "--flow-id", "7", "--namespace-id", str(NS))
            for travel, seq in ((POLICY, 5), (steered, 6)):
                retval, _, _ = tr.rx.run(good(travel=travel, seq=seq)[0])
                assert retval == XDP_PASS
            got = [np.frombuffer(r, dtype=IOAM_RECORD_DTYPE)[0] for r in ring.drain()]
            assert [(int(r["flow_id"]), int(r["seq"])) for r in got] == [(7, 5), (7, 6)]
            entries = sorted((tuple(f["sids"]), f["flow_id"], f["records"]) for f in list_flows(IOAM_RX, tr.inst))
            assert entries == sorted([(tuple(POLICY), 7, 1), (tuple(steered), 7, 1), (tuple(OTHER), 8, 0)])
            assert "2 SID lists" in run(IOAM_RX, "del-flow", "--instance", tr.inst, "--flow-id", "7").stdout
            assert [f["flow_id"] for f in list_flows(IOAM_RX, tr.inst)] == [8]
    finally:
        ring.close()
