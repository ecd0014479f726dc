"""STAMP conformance matrix: our senders against our reflectors, every mode, in one emulated SRv6 lab.

Lab: netlab/topologies/line5_two_paths.yaml (prefix `cmx`). Forward A -> R (End fc00:2::e) -> B,
return B -> R (End fc00:2::e2) -> A: the two directions use DIFFERENT SID lists, and R's per-SID
packet counters prove that every test packet and every reply took its own list.

Programs, all running at once for the whole module:
  B: XDP reflector on b0 (stamp_reflector) + the user-space reflector (ustamp) on the same node,
     which answers what XDP leaves to user space (sessions XDP does not know, TLV sessions with
     `--tlv userspace`, authenticated sessions);
  A: XDP collector on a0 (stamp_collector) for the C sender's sessions; the ustamp sender collects
     its own replies (its sessions are not active in the XDP collector, which passes them up).
Each case has its own SSID, so counters are compared as exact before/after deltas on all four
programs. All namespaces share one clock: T1 <= T2 <= T3 <= T4 must hold exactly.

Test ids read like a table row: sender -> reflector, format, reflector mode.
  sender:    c+xdpcoll (build/collectors/stamp_sender, records from the XDP collector's ring buffer)
             ustamp    (python -m collectors.ustamp sender, records from its own socket)
  reflector: xdp | ustamp | xdp-echo (TLVs echoed by XDP) | xdp>ustamp:tlv | xdp>ustamp:auth (punted)
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from conformance_env import (
    C_SENDER,
    REFLECTOR_ADDR,
    SENDER_ADDR,
    SID_FWD,
    SID_RET,
    TOPOLOGY,
    XDP_COLLECTOR,
    XDP_REFLECTOR,
    UstampReflector,
    build,
    counter_delta,
    run_tool,
    run_ustamp_sender,
    sid_packets,
    xdp_stats,
)

from segscope_schemas import stamp_error_estimate as ee
from segscope_schemas.stamp_record import STAMP_RECORD_F_NTP, STAMP_RECORD_F_SRH
from segscope_schemas.stamp_timestamp import TsFormat

pytestmark = pytest.mark.datapath

PREFIX = "cmx"
N = 20
EE_Z = 0x4000
# RFC 8972 §4.3 Timestamp Information (sync sources / methods 0, no sub-TLVs): a Type the
# user-space reflector understands (it fills the value in and clears U) and XDP echoes unchanged
TS_INFO_TLV = "3:00000000"
KEY_HEX = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"


@dataclass(frozen=True)
class Case:
    sender: str  # "c" (C sender + XDP collector) | "ustamp"
    reflector: str  # "xdp" | "ustamp" | "xdp-echo" | "xdp>ustamp:tlv" | "xdp>ustamp:auth"
    fmt: str  # "ptp" | "ntp"
    stateful: bool
    ssid: int

    @property
    def id(self) -> str:
        sender = "c+xdpcoll" if self.sender == "c" else "ustamp"
        return f"{sender}->{self.reflector}-{self.fmt}-{'stateful' if self.stateful else 'stateless'}"

    @property
    def tlv(self) -> bool:
        return self.reflector in ("xdp-echo", "xdp>ustamp:tlv")

    @property
    def auth(self) -> bool:
        return self.reflector == "xdp>ustamp:auth"

    @property
    def xdp_session(self) -> list[str] | None:
        """add-session arguments of the XDP reflector (None: XDP does not know the SSID)."""
        if self.reflector == "ustamp":
            return None
        args = ["--ssid", str(self.ssid), "--return-sids", SID_RET, "--format", self.fmt]
        args += ["--stateful"] if self.stateful else []
        if self.reflector == "xdp-echo":
            args += ["--tlv", "echo"]
        if self.auth:
            args += ["--mode", "authenticated"]
        return args

    def ustamp_session(self, key_file: str) -> str | None:
        """--add-session of the ustamp reflector (None: XDP answers alone)."""
        if self.reflector in ("xdp", "xdp-echo"):
            return None
        s = f"--ssid {self.ssid} --return-sids {SID_RET} --format {self.fmt}"
        s += " --stateful" if self.stateful else ""
        s += f" --mode authenticated --key-file {key_file}" if self.auth else ""
        return s


def _cases() -> list[Case]:
    rows = [
        (s, r, f, st)
        for s in ("c", "ustamp")
        for r in ("xdp", "ustamp")
        for f in ("ptp", "ntp")
        for st in (False, True)
    ]
    rows += [
        ("c", "xdp>ustamp:tlv", "ptp", False),
        ("ustamp", "xdp>ustamp:tlv", "ntp", True),
        ("c", "xdp-echo", "ntp", True),
        ("ustamp", "xdp-echo", "ptp", False),
        ("ustamp", "xdp>ustamp:auth", "ptp", False),
        ("ustamp", "xdp>ustamp:auth", "ntp", True),
    ]
    return [Case(s, r, f, st, 100 + i) for i, (s, r, f, st) in enumerate(rows)]


CASES = _cases()


@dataclass
class Matrix:
    lab: object
    refl_pin: str
    coll_pin: str
    ustamp: UstampReflector
    key_file: str


@pytest.fixture(scope="module")
def matrix(bpffs, tmp_path_factory):
    from netlab.lab import Lab, teardown

    build()
    teardown(PREFIX)
    lab = Lab.up(TOPOLOGY, PREFIX)
    refl_pin = f"/sys/fs/bpf/segscope/{lab.ns('B')}/stamp_reflector"
    coll_pin = f"/sys/fs/bpf/segscope/{lab.ns('A')}/stamp_collector"
    key_file = tmp_path_factory.mktemp("cmx") / "keys.json"
    key_file.write_text(json.dumps({"keys": [{"id": 1, "key_hex": KEY_HEX}]}))
    user = None
    try:
        run_tool(XDP_REFLECTOR, "attach", "--netns", lab.ns("B"), "--dev", "b0", "--pin-dir", refl_pin)
        run_tool(XDP_REFLECTOR, "add-address", "--pin-dir", refl_pin, REFLECTOR_ADDR)
        # no set-err-est: `attach` itself fills the Error Estimate from the clock, the rule the
        # senders and ustamp use (the program sets Z per session); the cases check it
        run_tool(XDP_COLLECTOR, "attach", "--netns", lab.ns("A"), "--dev", "a0", "--pin-dir", coll_pin)
        sessions = []
        for case in CASES:
            if case.xdp_session:
                run_tool(XDP_REFLECTOR, "add-session", "--pin-dir", refl_pin, *case.xdp_session)
            if case.ustamp_session(str(key_file)):
                sessions += ["--add-session", case.ustamp_session(str(key_file))]
            if case.sender == "c":
                run_tool(
                    XDP_COLLECTOR,
                    "activate",
                    "--pin-dir",
                    coll_pin,
                    "--ssid",
                    str(case.ssid),
                    "--port",
                    str(50000 + case.ssid),
                    "--format",
                    case.fmt,
                )
        user = UstampReflector(lab.ns("B"), *sessions)
        yield Matrix(lab, refl_pin, coll_pin, user, str(key_file))
    finally:
        if user:
            user.kill()
        for tool, node, dev, pin in ((XDP_REFLECTOR, "B", "b0", refl_pin), (XDP_COLLECTOR, "A", "a0", coll_pin)):
            run_tool(tool, "detach", "--netns", lab.ns(node), "--dev", dev, "--pin-dir", pin, check=False)
        lab.down()


def send_c(m: Matrix, case: Case) -> tuple[list[dict], int]:
    """C sender on A; its replies are records in the XDP collector's ring buffer."""
    args = [
        "--netns",
        m.lab.ns("A"),
        "--src",
        SENDER_ADDR,
        "--dst",
        REFLECTOR_ADDR,
        "--segs",
        SID_FWD,
        "--ssid",
        str(case.ssid),
        "--rate",
        "500",
        "--count",
        str(N),
        "--format",
        case.fmt,
    ]
    if case.tlv:
        args += ["--tlv", TS_INFO_TLV]
    summary = json.loads(run_tool(C_SENDER, *args).stdout)
    assert summary["sent"] == N and summary["send_errors"] == 0 and summary["format"] == case.fmt
    assert summary["length"] == 44 + (8 if case.tlv else 0)
    dump = run_tool(XDP_COLLECTOR, "dump", "--pin-dir", m.coll_pin, "--count", str(N), "--timeout-ms", "5000")
    records = [json.loads(l) for l in dump.stdout.splitlines() if l.startswith("{")]
    return records, summary["error_estimate"]


def send_ustamp(m: Matrix, case: Case) -> tuple[list[dict], int]:
    args = [
        "--src",
        SENDER_ADDR,
        "--dst",
        REFLECTOR_ADDR,
        "--segs",
        SID_FWD,
        "--ssid",
        str(case.ssid),
        "--rate",
        "500",
        "--count",
        str(N),
        "--wait",
        "5",
        "--format",
        case.fmt,
    ]
    if case.tlv:
        args += ["--tlv", TS_INFO_TLV]
    if case.auth:
        args += ["--auth-key-file", m.key_file]
    records, summary, res = run_ustamp_sender(m.lab.ns("A"), *args)
    assert res.returncode == 0, res.stderr
    assert summary["sent"] == summary["received"] == summary["records"] == N, summary
    assert summary["lost"] == summary["send_errors"] == summary["malformed_reply"] == 0, summary
    # who answered a TLV: ustamp understands Timestamp Information (U cleared), XDP echoes U = 1
    assert summary["tlv_u_flag_replies"] == (N if case.reflector == "xdp-echo" else 0), summary
    assert summary["tlv_m_flag_replies"] == summary["tlv_i_flag_replies"] == 0
    if case.auth:
        assert summary["auth_failed_reply"] == 0
    return records, summary["error_estimate"]


def check_records(records: list[dict], case: Case, sender_err_est: int, a0_ifindex: int) -> None:
    """Every field of every record."""
    ntp = case.fmt == "ntp"
    reflector_err_est = ee.ee_from_clock(ee.clock_read(), TsFormat.NTP if ntp else TsFormat.PTP)
    assert [r["sender_seq"] for r in records] == list(range(N))  # one reply each, in order
    for i, r in enumerate(records):
        assert r["ssid"] == case.ssid
        assert r["t1_ns"] <= r["t2_ns"] <= r["t3_ns"] <= r["t4_ns"], r  # one shared clock
        assert r["t4_ns"] - r["t1_ns"] < 1_000_000_000, r
        assert r["reflector_seq"] == i, r  # stateless: the sender's seq; stateful: own counter from 0
        assert r["sender_err_est"] == sender_err_est
        assert bool(r["sender_err_est"] & EE_Z) == (not ntp)
        assert bool(r["reflector_err_est"] & EE_Z) == (not ntp)  # the session's format
        assert r["reflector_err_est"] == reflector_err_est  # S/Scale/Multiplier: the clock's
        assert r["sender_ttl"] == 63  # 64 from A, -1 at R (End)
        assert r["reply_hop_limit"] == 254  # 255 from the reflector, -1 at R (End)
        assert r["ifindex"] == a0_ifindex
        assert r["flags"] == STAMP_RECORD_F_SRH | (STAMP_RECORD_F_NTP if ntp else 0)
        assert r.get("reserved", 0) == 0  # (the XDP collector's dump leaves it out)


def expected_deltas(case: Case) -> tuple[dict, dict, dict]:
    """(XDP reflector, ustamp reflector, XDP collector) counter changes a case must cause, exactly."""
    xdp_refl = {
        "xdp": {"reflected": N},
        "xdp-echo": {"reflected": N},
        "ustamp": {"pass_unknown_session": N},
        "xdp>ustamp:tlv": {"pass_tlvs_to_userspace": N},
        "xdp>ustamp:auth": {"pass_authenticated_to_userspace": N},
    }[case.reflector]
    user = {} if case.reflector in ("xdp", "xdp-echo") else {"received": N, "reflected": N}
    if case.reflector == "xdp>ustamp:tlv":
        user["tlv_handled"] = N
    coll = {"collected": N} if case.sender == "c" else {"pass_unknown_session": N}
    return xdp_refl, user, coll


def wait_ustamp(m: Matrix, want_received: int, timeout: float = 5.0) -> dict:
    """The C sender does not wait for replies: let the user-space reflector's count settle."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        c = m.ustamp.counters()
        if c["received"] >= want_received or time.monotonic() > deadline:
            return c
        time.sleep(0.05)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_matrix(matrix, case):
    m = matrix
    refl0, user0 = xdp_stats(XDP_REFLECTOR, m.refl_pin), m.ustamp.counters()
    coll0, sids0 = xdp_stats(XDP_COLLECTOR, m.coll_pin), sid_packets(m.lab)

    records, sender_err_est = (send_c if case.sender == "c" else send_ustamp)(m, case)
    check_records(records, case, sender_err_est, m.lab.ifindex("A", "a0"))

    want_refl, want_user, want_coll = expected_deltas(case)
    user1 = wait_ustamp(m, user0["received"] + want_user.get("received", 0))
    assert counter_delta(refl0, xdp_stats(XDP_REFLECTOR, m.refl_pin)) == want_refl
    assert counter_delta(user0, user1) == want_user
    assert counter_delta(coll0, xdp_stats(XDP_COLLECTOR, m.coll_pin)) == want_coll
    sids1 = sid_packets(m.lab)
    assert sids1[SID_FWD] - sids0[SID_FWD] == N, "forward list [fc00:2::e]"
    assert sids1[SID_RET] - sids0[SID_RET] == N, "return list [fc00:2::e2]"
