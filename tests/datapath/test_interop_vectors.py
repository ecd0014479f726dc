"""The XDP reflector and collector on schemas/vectors/stamp_interop.json: frames an independent
STAMP implementation sends, written from the RFC figures (make_interop_vectors.py), through
BPF_PROG_TEST_RUN. Each frame moves exactly the counter the vector names."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from tests.datapath.dp_env import (
    COLLECTOR,
    REFLECTOR,
    delta,
    parse_frame,
    prog_test_run,
    run_tool,
    stats,
    udp6_checksum,
)

pytestmark = pytest.mark.datapath

VECTORS = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "vectors" / "stamp_interop.json").read_text())
BY_PROGRAM = {p: [v for v in VECTORS["vectors"] if v["program"] == p] for p in ("reflector", "collector")}
EE_Z = 0x4000


@pytest.mark.parametrize("vec", BY_PROGRAM["reflector"], ids=lambda v: v["name"])
def test_reflector_vector(reflector, vec):
    d = reflector.refl_dir  # attached with the defaults: base senders on, partial checksums accepted
    before = stats(REFLECTOR, d)
    out = prog_test_run(REFLECTOR, d, bytes.fromhex(vec["frame"]))
    want = vec["expect"]
    assert (out["action"], delta(before, stats(REFLECTOR, d))) == (want["action"], {want["counter"]: 1})
    reply = parse_frame(out["data_out"])
    assert udp6_checksum(reply.src, reply.dst, reply.udp) == 0  # a full checksum, also for a partial one in
    seq, ee, ssid = struct.unpack_from("!I8xHH", reply.udp, 8)
    assert (seq, ssid, bool(ee & EE_Z)) == (want["reply_seq"], vec["ssid"], bool(want["reply_z"]))


def test_reflector_base_senders_off_and_partial_drop(veth):
    """The two defaults switched off at attach: SSID 0 goes to user space, a partial checksum is dropped."""
    from tests.datapath.dp_env import PIN_ROOT

    d = PIN_ROOT / veth.x_ns / "stamp_reflector"
    run_tool(REFLECTOR, "detach", "--netns", veth.x_ns, "--dev", veth.x_dev, "--pin-dir", str(d), check=False)
    run_tool(REFLECTOR, "attach", "--netns", veth.x_ns, "--dev", veth.x_dev, "--pin-dir", str(d),
             "--base-senders", "off", "--partial-csum", "drop")  # fmt: skip
    try:
        run_tool(REFLECTOR, "add-address", "--pin-dir", str(d), veth.x_addr)
        plain, partial = BY_PROGRAM["reflector"][0], BY_PROGRAM["reflector"][1]
        before = stats(REFLECTOR, d)
        assert prog_test_run(REFLECTOR, d, bytes.fromhex(plain["frame"]))["action"] == "XDP_PASS"
        assert delta(before, stats(REFLECTOR, d)) == {"pass_unknown_session": 1}
        run_tool(REFLECTOR, "add-session", "--pin-dir", str(d), "--ssid", "0")  # now a session, PTP
        before = stats(REFLECTOR, d)
        assert prog_test_run(REFLECTOR, d, bytes.fromhex(partial["frame"]))["action"] == "XDP_DROP"
        assert delta(before, stats(REFLECTOR, d)) == {"drop_malformed_udp_csum": 1}
    finally:
        run_tool(REFLECTOR, "detach", "--netns", veth.x_ns, "--dev", veth.x_dev, "--pin-dir", str(d), check=False)


@pytest.mark.parametrize("vec", BY_PROGRAM["collector"], ids=lambda v: v["name"])
def test_collector_vector(reflector_and_collector, vec):
    d = reflector_and_collector.coll_dir
    run_tool(COLLECTOR, "set-tai-offset", "--pin-dir", str(d), "--tai-offset", str(vec["tai_utc_offset_s"]))
    run_tool(COLLECTOR, "activate", "--pin-dir", str(d), "--ssid", str(vec["ssid"]),
             "--port", str(vec["sender_port"]), "--format", vec["sender_format"])  # fmt: skip
    before = stats(COLLECTOR, d)
    out = prog_test_run(COLLECTOR, d, bytes.fromhex(vec["frame"]))
    want = vec["expect"]
    assert (out["action"], delta(before, stats(COLLECTOR, d))) == (want["action"], {want["counter"]: 1})
    dump = run_tool(COLLECTOR, "dump", "--pin-dir", str(d), "--count", "1", "--timeout-ms", "2000")
    (rec,) = [json.loads(line) for line in dump.stdout.splitlines() if line.startswith("{")]
    assert (rec["t1_ns"], rec["t2_ns"], rec["t3_ns"]) == (want["t1_ns"], want["t2_ns"], want["t3_ns"])
    assert rec["t2_ns"] - rec["t1_ns"] == want["forward_ns"]
    assert bool(rec["flags"] & 0x10) == want["reflector_ntp"]  # STAMP_RECORD_F_REFLECTOR_NTP
    assert bool(rec["flags"] & 0x1) == (vec["sender_format"] == "ntp")  # STAMP_RECORD_F_NTP
