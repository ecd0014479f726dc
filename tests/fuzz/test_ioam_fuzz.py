"""Fuzzing the in-line IOAM extractor ioam_rx (XDP) through BPF_PROG_TEST_RUN against an
independent oracle (ioam_oracle.py, written from the RFCs and schemas/IOAM.md); and its TC ingress
entry (`attach --hook tc`) against the XDP one on the same frames (test_tc_entry_matches_xdp).

>= 100 000 frames (a fifth in `make test-quick`, tests/budget.py; SEGSCOPE_FUZZ_FRAMES, seed
SEGSCOPE_FUZZ_SEED, time bound SEGSCOPE_FUZZ_SECONDS):
instrumented packets of monitored and unmonitored flows (AltMark DOH or not, 1..15 slots, empty
and full traces, overflow, foreign option layouts, trailers), every length of three of them, and
mutants aimed at the option and header fields (lengths, types, namespaces, next headers,
nanoseconds, Payload Length) or at random bytes. Per frame: the verdict is XDP_PASS and the frame
leaves unchanged, the counters moved by exactly {oracle counter: 1}, and the ring buffer got one
record equal to the oracle's (receive time within the run) for a recorded frame, nothing otherwise.
"""

from __future__ import annotations

import collections
import errno
import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from segscope_schemas.ioam_record import IOAM_RECORD_DTYPE
from tests.budget import fuzz_count
from tests.fuzz.bpf_testrun import PinnedProgram, RingReader
from tests.fuzz.ioam_frames import FLOWS, FLOWS_CLI, frames
from tests.fuzz.ioam_oracle import REFUSED, verdict
from tests.fuzz.report import SUMMARY
from tests.fuzz.test_xdp_fuzz import dmesg_lines, kernel_complaints
from tests.isolation import own_name

pytestmark = pytest.mark.datapath

REPO = Path(__file__).resolve().parents[2]
IOAM_RX = REPO / "build" / "datapath" / "ioam_rx"
FRAMES = fuzz_count("SEGSCOPE_FUZZ_FRAMES", 100_000)
TC_FRAMES = fuzz_count("SEGSCOPE_FUZZ_TC_FRAMES", 20_000)  # the differential: two test runs and the oracle per frame
SEED = int(os.environ.get("SEGSCOPE_FUZZ_SEED", "862"))
# a hang guard, not a speed check: 100 000 frames take ~15 s on a quiet 2-core machine, minutes under load
SECONDS = float(os.environ.get("SEGSCOPE_FUZZ_SECONDS", "600"))
PREFIX = os.environ.get("SEGSCOPE_IOAM_FUZZ_PREFIX") or own_name("ioamfz")
NODE_ID, TAI_OFFSET = 9, 37
COUNTERS = [
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


def rx(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([str(IOAM_RX), *args], capture_output=True, text=True)
    if check and p.returncode:
        raise AssertionError(f"ioam_rx {' '.join(args)} -> {p.returncode}: {p.stderr}")
    return p


@pytest.fixture(scope="module")
def ioam_rx_target(bpffs):
    if os.geteuid() != 0:
        pytest.fail("the XDP fuzz test needs root (BPF_PROG_TEST_RUN, netns, bpffs)")
    subprocess.run(["make", "-s", "-C", str(REPO / "datapath")], check=True)
    ns = inst = PREFIX
    dev = f"{PREFIX}0"
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "add", dev, "type", "veth", "peer", "name", f"{PREFIX}1"], check=True)
        rx("attach", "--netns", ns, "--dev", dev, "--instance", inst, "--node-id", str(NODE_ID))
        rx("set-tai-offset", "--instance", inst, "--tai-offset", str(TAI_OFFSET))
        for sids, fid, namespace in FLOWS_CLI:
            rx(
                "add-flow",
                "--instance",
                inst,
                "--sids",
                ",".join(sids),
                "--flow-id",
                str(fid),
                "--namespace-id",
                str(namespace),
            )
        yield inst, Path("/sys/fs/bpf/segscope") / inst / "ioam_rx"
    finally:
        rx("detach", "--netns", ns, "--dev", dev, "--instance", inst, check=False)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture(scope="module")
def ioam_rx_tc_target(ioam_rx_target):
    """ioam_rx's TC ingress entry (--hook tc) on the veth's other end, beside the XDP one: the same
    namespace, node id, TAI offset and flows, its own pins."""
    ns, inst, dev = PREFIX, f"{PREFIX}tc", f"{PREFIX}1"
    rx("attach", "--netns", ns, "--dev", dev, "--instance", inst, "--node-id", str(NODE_ID), "--hook", "tc",
       "--tai-offset", str(TAI_OFFSET))  # fmt: skip
    try:
        for sids, fid, namespace in FLOWS_CLI:
            rx("add-flow", "--instance", inst, "--sids", ",".join(sids), "--flow-id", str(fid),
               "--namespace-id", str(namespace))  # fmt: skip
        yield inst, Path("/sys/fs/bpf/segscope") / inst / "ioam_rx"
    finally:
        rx("detach", "--netns", ns, "--dev", dev, "--instance", inst, check=False)


def record_problems(raw: bytes, want: dict, t0: int, t1: int) -> list[str]:
    rec = np.frombuffer(raw, dtype=IOAM_RECORD_DTYPE)[0]
    out = []
    if not t0 <= int(rec["rx_tai_ns"]) <= t1:
        out.append(f"rx_tai_ns {int(rec['rx_tai_ns'])} outside the run [{t0}, {t1}]")
    got = {k: int(rec[k]) for k in want if k != "entries"}
    if got != {k: v for k, v in want.items() if k != "entries"}:
        out.append(f"record fields {got}, oracle {dict((k, v) for k, v in want.items() if k != 'entries')}")
    if rec["entries"].tobytes() != want["entries"]:
        out.append("record entries differ from the trace's newest filled ones")
    return out


def test_ioam_rx_fuzz(ioam_rx_target):
    inst, pin = ioam_rx_target
    prog = PinnedProgram(pin / "prog", pin / "ioam_rx_stats", len(COUNTERS))
    ring = RingReader(pin / "ioam_records")
    outcomes, kinds, failures = collections.Counter(), collections.Counter(), []
    dmesg0 = dmesg_lines()
    try:
        ring.drain()
        before = last = prog.counters()
        n = refused = 0
        t_start = time.monotonic()
        for i, (kind, frame) in enumerate(frames(FRAMES, SEED)):
            if time.monotonic() - t_start > SECONDS:
                break
            n += 1
            for part in kind.split("+"):
                kinds[part.split(":")[0]] += 1
            v = verdict(frame, FLOWS, NODE_ID, TAI_OFFSET)
            t0 = time.clock_gettime_ns(time.CLOCK_TAI)
            res = prog.run(frame)
            t1 = time.clock_gettime_ns(time.CLOCK_TAI)
            now = prog.counters()
            moved = {COUNTERS[k]: now[k] - last[k] for k in range(len(COUNTERS)) if now[k] != last[k]}
            last = now
            recs = ring.drain()
            problems = []
            if v.counter == REFUSED:
                refused += 1
                if res.err != errno.EINVAL or moved or recs:
                    problems.append(f"expected EINVAL, nothing counted: err {res.err}, {moved}, {len(recs)} records")
            elif res.err:
                problems.append(f"test run failed: {os.strerror(res.err)}")
            else:
                if res.action != "XDP_PASS" or res.data_out != frame:
                    problems.append(f"{res.action}, frame changed: {res.data_out != frame}")
                if moved != {v.counter: 1}:
                    problems.append(f"counters moved {moved}, oracle {v.counter}")
                if v.record is None and recs:
                    problems.append(f"{len(recs)} records for a frame the oracle does not record ({v.counter})")
                if v.record is not None:
                    if len(recs) != 1:
                        problems.append(f"{len(recs)} records, oracle 1")
                    else:
                        problems += record_problems(recs[0], v.record, t0, t1)
            outcomes[v.counter] += 1
            if problems and len(failures) < 10:
                failures.append(f"frame #{i} ({kind}, {len(frame)} B): {'; '.join(problems)}\n    {frame.hex()}")
        seconds = time.monotonic() - t_start
        after = prog.counters()
    finally:
        ring.close()
    SUMMARY.append(f"[fuzz] ioam_rx: {n} frames in {seconds:.1f} s ({n / max(seconds, 1e-9):.0f}/s), seed {SEED}")
    SUMMARY.append(
        "[fuzz] ioam_rx frames by origin/mutator: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
    )
    SUMMARY.extend(f"[fuzz] ioam_rx   {k:34s} {v:7d}" for k, v in sorted(outcomes.items()))
    assert n >= FRAMES, f"only {n} of {FRAMES} frames within {SECONDS} s"
    assert not failures, "frames disagree with the oracle; first ones:\n" + "\n".join(failures)
    deltas = {c: after[k] - before[k] for k, c in enumerate(COUNTERS)}
    assert sum(deltas.values()) == n - refused, "every frame the kernel ran is in exactly one counter"
    assert {c: v for c, v in deltas.items() if v} == {k: v for k, v in outcomes.items() if k != REFUSED}
    stats = json.loads(rx("stats", "--instance", inst, "--json").stdout)
    assert [stats[c] for c in COUNTERS] == after, "the loader's stats are the counters"
    # every class of IOAM.md's list was reached by the campaign
    assert {c for c in COUNTERS if c != "pass_ringbuf_full"} <= set(outcomes), set(COUNTERS) - set(outcomes)
    assert outcomes["recorded"] > 1000
    assert not kernel_complaints(dmesg0)


TC_ACT_UNSPEC = 0xFFFFFFFF  # -1 as the test run's u32 retval: the next filter, or the stack
# a TC test run's struct __sk_buff: arriving on the loopback device (ingress_ifindex at offset 36), as an
# XDP test run does; without it the skb's ingress ifindex is 0
SKB_CTX = bytes(36) + (1).to_bytes(4, "little") + bytes(192 - 40)


def skb_run_refuses(frame: bytes) -> bool:
    """An skb test run refuses (EINVAL) an IPv6 frame shorter than its IPv6 header and an IPv4 one
    shorter than its IPv4 header, before any program runs; an XDP test run takes them."""
    ethertype = frame[12:14] if len(frame) >= 14 else b""
    return (ethertype == b"\x86\xdd" and len(frame) < 54) or (ethertype == b"\x08\x00" and len(frame) < 34)


def test_tc_entry_matches_xdp(ioam_rx_target, ioam_rx_tc_target):
    """The TC ingress entry and the XDP entry of ioam_rx on the same frames: the hand-written
    vectors of tests/datapath/test_ioam_rx.py (every counter, ring full aside), the fuzz seeds,
    truncations and mutants (foreign options, bad lengths, other next headers): for each, both
    leave the frame unchanged and pass it on, move the same one counter (the oracle's), and write
    the same record (the oracle's; the receive time aside) or none."""
    from tests.datapath.test_ioam_rx import _cases

    (xdp_inst, xdp_pin), (tc_inst, tc_pin) = ioam_rx_target, ioam_rx_tc_target
    progs = [
        PinnedProgram(pin / entry, pin / "ioam_rx_stats", len(COUNTERS))
        for pin, entry in ((xdp_pin, "prog"), (tc_pin, "prog_tc"))  # the XDP entry, the TC entry
    ]
    rings = [RingReader(pin / "ioam_records") for pin in (xdp_pin, tc_pin)]
    vectors = [(f"case:{name}", frame) for name, frame, *_ in _cases()]
    failures, outcomes, n, skipped = [], collections.Counter(), 0, 0
    try:
        for ring in rings:
            ring.drain()
        last = [p.counters() for p in progs]
        t_start = time.monotonic()
        for i, (kind, frame) in enumerate([*vectors, *frames(TC_FRAMES, SEED + 1)]):
            if time.monotonic() - t_start > SECONDS:
                break
            n += 1
            v = verdict(frame, FLOWS, NODE_ID, TAI_OFFSET)
            if skb_run_refuses(frame):
                skipped += 1  # not a TC program's input: the kernel's test run stops before it
                continue
            seen = []
            for k, (prog, ring) in enumerate(zip(progs, rings)):
                t0 = time.clock_gettime_ns(time.CLOCK_TAI)
                res = prog.run(frame, None if k == 0 else SKB_CTX)
                t1 = time.clock_gettime_ns(time.CLOCK_TAI)
                now = prog.counters()
                moved = {COUNTERS[c]: now[c] - last[k][c] for c in range(len(COUNTERS)) if now[c] != last[k][c]}
                last[k] = now
                recs = ring.drain()
                problems = []
                if v.counter == REFUSED:
                    if res.err != errno.EINVAL or moved or recs:
                        problems.append(f"expected EINVAL, nothing counted: err {res.err}, {moved}, {len(recs)}")
                elif res.err:
                    problems.append(f"test run failed: {os.strerror(res.err)}")
                else:
                    passed = res.action == "XDP_PASS" if k == 0 else res.retval == TC_ACT_UNSPEC
                    if not passed or res.data_out != frame:
                        problems.append(f"retval {res.retval}, frame changed: {res.data_out != frame}")
                    if moved != {v.counter: 1}:
                        problems.append(f"counters moved {moved}, oracle {v.counter}")
                    if len(recs) != (v.record is not None):
                        problems.append(f"{len(recs)} records, oracle {int(v.record is not None)}")
                    elif recs:
                        problems += record_problems(recs[0], v.record, t0, t1)
                seen.append((res.err, moved, [r[8:] for r in recs], problems))  # r[:8]: the receive time
            (xdp, tc), name = seen, ("xdp", "tc")
            problems = [f"{name[k]}: {p}" for k in (0, 1) for p in seen[k][3]]
            if xdp[:3] != tc[:3]:
                problems.append(f"the entries differ: xdp {xdp[:2]}, tc {tc[:2]}, records equal {xdp[2] == tc[2]}")
            outcomes[v.counter] += 1
            if problems and len(failures) < 10:
                failures.append(f"frame #{i} ({kind}, {len(frame)} B): {'; '.join(problems)}\n    {frame.hex()}")
        seconds = time.monotonic() - t_start
    finally:
        for ring in rings:
            ring.close()
    SUMMARY.append(
        f"[fuzz] ioam_rx TC vs XDP: {n} frames in {seconds:.1f} s, seed {SEED + 1}; {skipped} shorter than their "
        "IP header (an skb test run refuses them)"
    )
    assert n >= len(vectors) + TC_FRAMES, f"only {n} frames within {SECONDS} s"
    assert skipped < n / 10
    assert not failures, "the TC and XDP entries disagree (or with the oracle); first ones:\n" + "\n".join(failures)
    assert {c for c in COUNTERS if c != "pass_ringbuf_full"} <= set(outcomes), set(COUNTERS) - set(outcomes)
    assert outcomes["recorded"] > 100
    # the loader reads the TC instance's counters as the XDP one's
    xdp_stats, tc_stats = (json.loads(rx("stats", "--instance", i, "--json").stdout) for i in (xdp_inst, tc_inst))
    assert [tc_stats[c] for c in COUNTERS] == progs[1].counters()
    assert xdp_stats["recorded"] >= tc_stats["recorded"] > 100
