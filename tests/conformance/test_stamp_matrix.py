"""STAMP conformance matrix: our senders against our reflectors, every mode, in one emulated SRv6 lab.

Lab: netlab/topologies/line5_two_paths.yaml (prefix `cmx`). Forward A -> R (End fc00:2::e) -> B,
return B -> R (End fc00:2::e2) -> A: the two directions use DIFFERENT SID lists, and R's per-SID
packet counters prove that every test packet and every reply took its own list.

Programs, all running at once for the whole module:
  B: XDP reflector on b0 (stamp_reflector) + the user-space reflector (ustamp, its fast engine: C
     workers for base packets, its Python code for the rest) on the same node and port, which
     answers what XDP leaves to user space (sessions XDP does not know, TLV sessions with
     `--tlv userspace`, authenticated sessions); and the pure-Python engine of ustamp (the
     reflector as it was before the fast engine) on a second address of B, fc00:3::2 (port 862
     too: the XDP collector takes replies from the STAMP port only), which XDP passes up;
  A: XDP collector on a0 (stamp_collector) for the C sender's sessions; the ustamp sender collects
     its own replies (its sessions are not active in the XDP collector, which passes them up).
Each case has its own SSID, so counters are compared as exact before/after deltas on all four
programs. All namespaces share one clock: T1 <= T2 <= T3 <= T4 must hold exactly.

Test ids read like a table row: sender -> reflector, format (sender/reflector when they differ),
reflector mode. Mixed formats are how most other implementations meet ours (they answer in NTP):
each side's timestamps are read in the format its own Error Estimate names (RFC 8762 §4.3.1).
  sender:    c+xdpcoll (build/collectors/stamp_sender, records from the XDP collector's ring buffer)
             ustamp    (python -m collectors.ustamp sender, records from its own socket)
  reflector: xdp | ustamp (fast engine) | ustamp-py (Python engine, fc00:3::2) | xdp-echo (TLVs echoed
             by XDP) | xdp>ustamp:tlv | xdp>ustamp:auth (punted to the fast engine, answered by its
             Python path)
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
from segscope_schemas.stamp_record import STAMP_RECORD_F_NTP, STAMP_RECORD_F_REFLECTOR_NTP, STAMP_RECORD_F_SRH
from segscope_schemas.stamp_timestamp import TsFormat
from tests.isolation import own_name

pytestmark = pytest.mark.datapath

PREFIX = own_name("cmx")
N = 20
EE_Z = 0x4000
# the Python engine's address on B: a socket bound to it wins over the fast engine's [::]:862
PY_ENGINE_ADDR = "fc00:3::2"
# how the fast engine spent its system calls: vary with batching, not with what the case sends
USER_NOISE_COUNTERS = {"batches", "srh_switches"}
# RFC 8972 §4.3 Timestamp Information (sync sources / methods 0, no sub-TLVs): a Type the
# user-space reflector understands (it fills the value in and clears U) and XDP echoes unchanged
TS_INFO_TLV = "3:00000000"
KEY_HEX = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"


@dataclass(frozen=True)
class Case:
    sender: str  # "c" (C sender + XDP collector) | "ustamp"
    reflector: str  # "xdp" | "ustamp" | "ustamp-py" | "xdp-echo" | "xdp>ustamp:tlv" | "xdp>ustamp:auth"
    fmt: str  # "ptp" | "ntp": the sender's format
    stateful: bool
    ssid: int
    refl_fmt: str = ""  # the reflector session's format, if not the sender's

    @property
    def reflector_fmt(self) -> str:
        return self.refl_fmt or self.fmt

    @property
    def id(self) -> str:
        sender = "c+xdpcoll" if self.sender == "c" else "ustamp"
        fmt = self.fmt if self.reflector_fmt == self.fmt else f"{self.fmt}/{self.reflector_fmt}"
        return f"{sender}->{self.reflector}-{fmt}-{'stateful' if self.stateful else 'stateless'}"

    @property
    def tlv(self) -> bool:
        return self.reflector in ("xdp-echo", "xdp>ustamp:tlv")

    @property
    def auth(self) -> bool:
        return self.reflector == "xdp>ustamp:auth"

    @property
    def dst(self) -> str:
        return PY_ENGINE_ADDR if self.reflector == "ustamp-py" else REFLECTOR_ADDR

    @property
    def xdp_session(self) -> list[str] | None:
        """add-session arguments of the XDP reflector (None: XDP does not know the SSID)."""
        if self.reflector in ("ustamp", "ustamp-py"):
            return None
        args = ["--ssid", str(self.ssid), "--return-sids", SID_RET, "--format", self.reflector_fmt]
        args += ["--stateful"] if self.stateful else []
        if self.reflector == "xdp-echo":
            args += ["--tlv", "echo"]
        if self.auth:
            args += ["--mode", "authenticated"]
        return args

    def ustamp_session(self, key_file: str) -> str | None:
        """--add-session of the ustamp reflector that answers the case (None: XDP answers alone)."""
        if self.reflector in ("xdp", "xdp-echo"):
            return None
        s = f"--ssid {self.ssid} --return-sids {SID_RET} --format {self.reflector_fmt}"
        s += " --stateful" if self.stateful else ""
        s += f" --mode authenticated --key-file {key_file}" if self.auth else ""
        return s


def _cases() -> list[Case]:
    rows = [
        (s, r, f, st)
        for s in ("c", "ustamp")
        for r in ("xdp", "ustamp", "ustamp-py")
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
    cases = [Case(s, r, f, st, 100 + i) for i, (s, r, f, st) in enumerate(rows)]
    mixed = [  # (sender, reflector, sender format, reflector format)
        ("c", "xdp", "ptp", "ntp"),
        ("c", "xdp", "ntp", "ptp"),
        ("c", "ustamp", "ptp", "ntp"),
        ("c", "ustamp", "ntp", "ptp"),
        ("ustamp", "xdp", "ptp", "ntp"),
        ("ustamp", "ustamp", "ntp", "ptp"),
        ("c", "ustamp-py", "ptp", "ntp"),
        ("ustamp", "ustamp-py", "ntp", "ptp"),
    ]
    cases += [Case(s, r, f, False, 160 + i, rf) for i, (s, r, f, rf) in enumerate(mixed)]
    return cases


CASES = _cases()

# interop cases outside the table (see the tests at the end)
SSID_CONTROL_CODE = 90  # ustamp only: the Return Path TLV is handled in user space
SSID_PARTIAL_TO_XDP = 91  # XDP reflector: a kernel-socket sender with checksum offload on
SSID_PARTIAL_TO_COLLECTOR = 92  # ustamp reflector with offload on, answering into the XDP collector
BASE_C_SENDER_PORT = 50000  # the C sender's SSID 0 (plain RFC 8762) session in the XDP collector


@dataclass
class Matrix:
    lab: object
    refl_pin: str
    coll_pin: str
    ustamp: UstampReflector  # fast engine, port 862
    ustamp_py: UstampReflector  # Python engine, [fc00:3::2]:862
    key_file: str

    def reflector_of(self, case: Case) -> UstampReflector:
        return self.ustamp_py if case.reflector == "ustamp-py" else self.ustamp


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
    user = user_py = None
    try:
        run_tool(XDP_REFLECTOR, "attach", "--netns", lab.ns("B"), "--dev", "b0", "--pin-dir", refl_pin)
        run_tool(XDP_REFLECTOR, "add-address", "--pin-dir", refl_pin, REFLECTOR_ADDR)
        # no set-err-est: `attach` itself fills the Error Estimate from the clock, the rule the
        # senders and ustamp use (the program sets Z per session); the cases check it
        run_tool(XDP_COLLECTOR, "attach", "--netns", lab.ns("A"), "--dev", "a0", "--pin-dir", coll_pin)
        sessions, sessions_py = [], []
        for case in CASES:
            if case.xdp_session:
                run_tool(XDP_REFLECTOR, "add-session", "--pin-dir", refl_pin, *case.xdp_session)
            if case.ustamp_session(str(key_file)):
                spec = ["--add-session", case.ustamp_session(str(key_file))]
                if case.reflector == "ustamp-py":
                    sessions_py += spec
                else:
                    sessions += spec
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
        run_tool(XDP_REFLECTOR, "add-session", "--pin-dir", refl_pin, "--ssid", str(SSID_PARTIAL_TO_XDP))
        for spec in (f"--ssid {SSID_CONTROL_CODE} --return-sids {SID_RET}", f"--ssid {SSID_PARTIAL_TO_COLLECTOR}"):
            sessions += ["--add-session", spec]
            sessions_py += ["--add-session", spec]
        port = str(50000 + SSID_PARTIAL_TO_COLLECTOR)
        run_tool(
            XDP_COLLECTOR, "activate", "--pin-dir", coll_pin, "--ssid", str(SSID_PARTIAL_TO_COLLECTOR), "--port", port
        )
        # the ustamp reflectors answer RFC 8762 senders too (--base-senders on, the default)
        user = UstampReflector(lab.ns("B"), "--engine", "fast", *sessions)
        assert user.ready["engine"] == "fast"
        lab.run("B", ["ip", "-6", "addr", "add", f"{PY_ENGINE_ADDR}/128", "dev", "lo", "nodad"], check=True)
        user_py = UstampReflector(lab.ns("B"), "--engine", "python", "--address", PY_ENGINE_ADDR, *sessions_py)
        assert user_py.ready["engine"] == "python"
        yield Matrix(lab, refl_pin, coll_pin, user, user_py, str(key_file))
    finally:
        for proc in (user, user_py):
            if proc:
                proc.kill()
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
        case.dst,
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
        case.dst,
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


# One-way delay bounds, on the lower decile (check_records): 100 µs where both timestamps of a
# direction come from C or the kernel (C sender T1 / kernel T2; XDP T3 / XDP T4; the fast engine's
# C T3 / kernel or XDP T4),
# 1 ms where Python takes one before its sendmsg (ustamp sender T1; T3 of the Python engine and of
# what the fast engine hands to Python: TLVs, authenticated packets) on these 2 shared cores. A timestamp read in the
# wrong format (NTP as PTP or back) is off by 2.2e18 ns.
ONE_WAY_LOW_BOUND_NS = 100_000
ONE_WAY_LOW_BOUND_PYTHON_NS = 1_000_000


def check_records(records: list[dict], case: Case, sender_err_est: int, a0_ifindex: int) -> None:
    """Every field of every record."""
    import statistics

    ntp = case.fmt == "ntp"
    refl_ntp = case.reflector_fmt == "ntp"
    reflector_err_est = ee.ee_from_clock(ee.clock_read(), TsFormat.NTP if refl_ntp else TsFormat.PTP)
    assert [r["sender_seq"] for r in records] == list(range(N))  # one reply each, in order
    for i, r in enumerate(records):
        assert r["ssid"] == case.ssid
        assert r["t1_ns"] <= r["t2_ns"] <= r["t3_ns"] <= r["t4_ns"], r  # one shared clock
        assert r["t4_ns"] - r["t1_ns"] < 1_000_000_000, r
        assert r["reflector_seq"] == i, r  # stateless: the sender's seq; stateful: own counter from 0
        assert r["sender_err_est"] == sender_err_est
        assert bool(r["sender_err_est"] & EE_Z) == (not ntp)
        assert bool(r["reflector_err_est"] & EE_Z) == (not refl_ntp)  # the reflector session's format
        assert r["reflector_err_est"] == reflector_err_est  # S/Scale/Multiplier: the clock's
        assert r["sender_ttl"] == 63  # 64 from A, -1 at R (End)
        assert r["reply_hop_limit"] == 254  # 255 from the reflector, -1 at R (End)
        assert r["ifindex"] == a0_ifindex
        want_flags = STAMP_RECORD_F_SRH | (STAMP_RECORD_F_NTP if ntp else 0)
        assert r["flags"] == want_flags | (STAMP_RECORD_F_REFLECTOR_NTP if refl_ntp else 0)
        assert r.get("reserved", 0) == 0  # (the XDP collector's dump leaves it out)
    # one-way delays in both directions: a timestamp read in the wrong format is off by 70 years
    forward = [r["t2_ns"] - r["t1_ns"] for r in records]
    reverse = [r["t4_ns"] - r["t3_ns"] for r in records]
    fwd_bound = ONE_WAY_LOW_BOUND_NS if case.sender == "c" else ONE_WAY_LOW_BOUND_PYTHON_NS
    c_t3 = case.reflector in ("xdp", "xdp-echo", "ustamp")
    rev_bound = ONE_WAY_LOW_BOUND_NS if c_t3 else ONE_WAY_LOW_BOUND_PYTHON_NS
    # the lower decile: which side takes a timestamp (C or the kernel against Python) and its format
    # show in every packet, a loaded runner's preemptions only in some (a median of 107-118 us was
    # seen for C/kernel timestamps at load 6-16, with a tenth of the packets under 20 us)
    assert abs(statistics.quantiles(forward, n=10)[0]) < fwd_bound, forward
    assert abs(statistics.quantiles(reverse, n=10)[0]) < rev_bound, reverse


def expected_deltas(case: Case) -> tuple[dict, dict, dict, dict]:
    """(XDP reflector, ustamp fast engine, ustamp Python engine, XDP collector) counter changes a case
    must cause, exactly."""
    xdp_refl = {
        "xdp": {"reflected": N},
        "xdp-echo": {"reflected": N},
        "ustamp": {"pass_unknown_session": N},
        "ustamp-py": {},  # not the XDP reflector's address: pass_not_local_addr, a noise counter
        "xdp>ustamp:tlv": {"pass_tlvs_to_userspace": N},
        "xdp>ustamp:auth": {"pass_authenticated_to_userspace": N},
    }[case.reflector]
    answered = {"received": N, "reflected": N}
    fast = {} if case.reflector in ("xdp", "xdp-echo", "ustamp-py") else dict(answered)
    if case.reflector == "xdp>ustamp:tlv":
        fast["tlv_handled"] = N
    if case.reflector in ("xdp>ustamp:tlv", "xdp>ustamp:auth"):
        fast["slow_path"] = N  # the C workers handed them to the Python code
    py = answered if case.reflector == "ustamp-py" else {}
    coll = {"collected": N} if case.sender == "c" else {"pass_unknown_session": N}
    return xdp_refl, fast, py, coll


def wait_ustamp(user: UstampReflector, want_received: int, timeout: float = 5.0) -> dict:
    """The C sender does not wait for replies: let a user-space reflector's count settle."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        c = user.counters()
        if c["received"] >= want_received or time.monotonic() > deadline:
            return c
        time.sleep(0.05)


def user_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in counter_delta(before, after).items() if k not in USER_NOISE_COUNTERS}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_matrix(matrix, case):
    m = matrix
    refl0, coll0, sids0 = xdp_stats(XDP_REFLECTOR, m.refl_pin), xdp_stats(XDP_COLLECTOR, m.coll_pin), sid_packets(m.lab)
    user0, py0 = m.ustamp.counters(), m.ustamp_py.counters()

    records, sender_err_est = (send_c if case.sender == "c" else send_ustamp)(m, case)
    check_records(records, case, sender_err_est, m.lab.ifindex("A", "a0"))

    want_refl, want_fast, want_py, want_coll = expected_deltas(case)
    user1 = wait_ustamp(m.ustamp, user0["received"] + want_fast.get("received", 0))
    py1 = wait_ustamp(m.ustamp_py, py0["received"] + want_py.get("received", 0))
    assert counter_delta(refl0, xdp_stats(XDP_REFLECTOR, m.refl_pin)) == want_refl
    assert user_delta(user0, user1) == want_fast
    assert user_delta(py0, py1) == want_py
    assert counter_delta(coll0, xdp_stats(XDP_COLLECTOR, m.coll_pin)) == want_coll
    sids1 = sid_packets(m.lab)
    assert sids1[SID_FWD] - sids0[SID_FWD] == N, "forward list [fc00:2::e]"
    assert sids1[SID_RET] - sids0[SID_RET] == N, "return list [fc00:2::e2]"


# ---- interop: what another implementation sends ------------------------------------------------
# Each user-space case runs against both engines of ustamp: "ustamp" (fast, behind the XDP
# reflector) and "ustamp-py" (Python, its own address).


def _plain_ustamp(m: Matrix, ssid: int, *extra: str, dst: str = REFLECTOR_ADDR) -> tuple[list[dict], dict]:
    """ustamp sender on A over plain IPv6 (no SRH), N packets; (records, summary)."""
    args = ["--src", SENDER_ADDR, "--dst", dst, "--ssid", str(ssid), "--rate", "500"]
    args += ["--count", str(N), "--wait", "2", *extra]
    records, summary, res = run_ustamp_sender(m.lab.ns("A"), *args)
    assert res.returncode == 0, res.stderr
    assert summary["sent"] == N and summary["send_errors"] == 0, summary
    return records, summary


def _user(m: Matrix, engine: str) -> UstampReflector:
    return m.ustamp_py if engine == "ustamp-py" else m.ustamp


def _snapshot(m: Matrix, engine: str = "ustamp") -> tuple[dict, dict, dict]:
    return xdp_stats(XDP_REFLECTOR, m.refl_pin), _user(m, engine).counters(), xdp_stats(XDP_COLLECTOR, m.coll_pin)


def _deltas(
    m: Matrix, before: tuple[dict, dict, dict], want_user_received: int = 0, engine: str = "ustamp"
) -> tuple[dict, dict, dict]:
    refl0, user0, coll0 = before
    user1 = wait_ustamp(_user(m, engine), user0["received"] + want_user_received)
    return (
        counter_delta(refl0, xdp_stats(XDP_REFLECTOR, m.refl_pin)),
        user_delta(user0, user1),
        counter_delta(coll0, xdp_stats(XDP_COLLECTOR, m.coll_pin)),
    )


def _dst(engine: str) -> str:
    return PY_ENGINE_ADDR if engine == "ustamp-py" else REFLECTOR_ADDR


@pytest.mark.parametrize("reflector", ["xdp", "ustamp", "ustamp-py"])
def test_rfc8762_sender_without_ssid_is_answered(matrix, reflector):
    """A plain RFC 8762 sender leaves bytes 14-15 zero (no RFC 8972 SSID). Every reflector answers it
    by default from its {any sender, SSID 0} session: stateless, NTP (Z = 0 in the reply)."""
    m = matrix
    if reflector == "ustamp":  # the XDP reflector leaves SSID 0 to user space
        run_tool(XDP_REFLECTOR, "del-session", "--pin-dir", m.refl_pin, "--ssid", "0")
    engine = "ustamp" if reflector == "xdp" else reflector
    try:
        before = _snapshot(m, engine)
        records, summary = _plain_ustamp(m, 0, "--sport", "40000", dst=_dst(reflector))
        refl, user, coll = _deltas(m, before, 0 if reflector == "xdp" else N, engine)
    finally:
        if reflector == "ustamp":
            run_tool(XDP_REFLECTOR, "add-session", "--pin-dir", m.refl_pin, "--ssid", "0", "--format", "ntp")
    assert summary["received"] == summary["records"] == N and summary["lost"] == 0, summary
    for i, r in enumerate(records):
        assert r["ssid"] == 0 and r["reflector_seq"] == i  # stateless: the sender's numbers
        assert not r["reflector_err_est"] & EE_Z  # the reflector answered in NTP
        assert r["flags"] == STAMP_RECORD_F_REFLECTOR_NTP  # PTP sender, NTP reflector, no SRH
        assert r["t1_ns"] <= r["t2_ns"] <= r["t3_ns"] <= r["t4_ns"], r
    if reflector == "xdp":
        assert (refl, user) == ({"reflected": N}, {})
    elif reflector == "ustamp":
        assert (refl, user) == ({"pass_unknown_session": N}, {"received": N, "reflected": N})
    else:
        assert (refl, user) == ({}, {"received": N, "reflected": N})
    assert coll == {"pass_unknown_session": N}  # the XDP collector has no SSID 0 session here


def test_rfc8762_c_sender_without_ssid_into_the_xdp_collector(matrix):
    """The same from the C sender (--ssid 0), its replies collected by the XDP collector."""
    m = matrix
    port = str(BASE_C_SENDER_PORT)
    run_tool(XDP_COLLECTOR, "activate", "--pin-dir", m.coll_pin, "--ssid", "0", "--port", port)
    try:
        before = _snapshot(m)
        args = ["--netns", m.lab.ns("A"), "--src", SENDER_ADDR, "--dst", REFLECTOR_ADDR, "--ssid", "0"]
        args += ["--sport", port, "--rate", "500", "--count", str(N)]
        summary = json.loads(run_tool(C_SENDER, *args).stdout)
        dump = run_tool(XDP_COLLECTOR, "dump", "--pin-dir", m.coll_pin, "--count", str(N), "--timeout-ms", "5000")
    finally:
        run_tool(XDP_COLLECTOR, "deactivate", "--pin-dir", m.coll_pin, "--ssid", "0")
    records = [json.loads(line) for line in dump.stdout.splitlines() if line.startswith("{")]
    refl, user, coll = _deltas(m, before)
    assert summary["sent"] == N
    assert [r["sender_seq"] for r in records] == list(range(N))
    assert all(r["ssid"] == 0 and r["flags"] == STAMP_RECORD_F_REFLECTOR_NTP for r in records)
    assert (refl, user, coll) == ({"reflected": N}, {}, {"collected": N})


@pytest.mark.parametrize("engine", ["ustamp", "ustamp-py"])
@pytest.mark.parametrize("code,answered", [(0x0, False), (0x1, True)], ids=["no-reply-0x0", "same-link-0x1"])
def test_return_path_control_code(matrix, code, answered, engine):
    """RFC 9503 §4.1.1: the Reply Request flag is bit 31 (the least significant) of the Control
    Code Flags: 0x0 No Reply Requested, 0x1 Reply Requested on the Same Link."""
    m = matrix
    before = _snapshot(m, engine)
    tlv = f"10:00010004{code:08x}"  # Return Path TLV with one Control Code sub-TLV
    records, summary = _plain_ustamp(m, SSID_CONTROL_CODE, "--tlv", tlv, "--wait", "1", dst=_dst(engine))
    refl, user, coll = _deltas(m, before, N, engine)
    # the XDP reflector does not know SSID 90, and passes fc00:3::2 up untouched
    assert refl == ({"pass_unknown_session": N} if engine == "ustamp" else {})
    handed = {"slow_path": N} if engine == "ustamp" else {}  # the fast engine's C workers hand TLVs over
    if answered:
        assert summary["records"] == N and len(records) == N
        assert user == {"received": N, "reflected": N, "tlv_handled": N, **handed}
    else:
        assert summary["records"] == 0 and records == []
        assert user == {"received": N, "no_reply_requested": N, "tlv_handled": N, **handed}
    assert coll == ({"pass_unknown_session": N} if answered else {})


def _tx_checksum_offload(m: Matrix, hops: tuple[tuple[str, str], ...], on: bool) -> None:
    """tx checksum offload on (off) on every egress of the path: a router whose egress device
    cannot offload completes the checksum in software, so a partial one only reaches the program
    when every hop before it can offload (a pod's veth straight into the node: one hop)."""
    import subprocess

    for node, dev in hops:
        cmd = ["ip", "netns", "exec", m.lab.ns(node), "ethtool", "-K", dev, "tx", "on" if on else "off"]
        subprocess.run(cmd, check=True, capture_output=True)


A_TO_B = (("A", "a0"), ("R", "r1"))  # egress devices from A's sender to B's XDP reflector
B_TO_A = (("B", "b0"), ("R", "r0"))


def test_kernel_socket_sender_with_checksum_offload(matrix):
    """A pod-style sender: a kernel UDP socket behind a veth with tx checksum offload ON hands its
    packets over with the pseudo-header sum in the checksum field (nobody completes it). The XDP
    reflector answers them, with a full checksum, and counts them reflected_partial_csum."""
    m = matrix
    before = _snapshot(m)
    _tx_checksum_offload(m, A_TO_B, True)
    try:
        records, summary = _plain_ustamp(m, SSID_PARTIAL_TO_XDP)
    finally:
        _tx_checksum_offload(m, A_TO_B, False)
    refl, user, coll = _deltas(m, before)
    assert summary["received"] == summary["records"] == N, summary  # the replies verified in A's kernel
    assert refl == {"reflected_partial_csum": N}
    assert user == {} and coll == {"pass_unknown_session": N}


@pytest.mark.parametrize("engine", ["ustamp", "ustamp-py"])
def test_kernel_socket_reflector_with_checksum_offload(matrix, engine):
    """The other way round: the user-space reflector (a kernel socket) behind a veth with offload
    on answers the C sender; the XDP collector takes the partial checksums (collected_partial_csum)."""
    m = matrix
    before = _snapshot(m, engine)
    ssid = SSID_PARTIAL_TO_COLLECTOR
    _tx_checksum_offload(m, B_TO_A, True)
    try:
        args = ["--netns", m.lab.ns("A"), "--src", SENDER_ADDR, "--dst", _dst(engine), "--ssid", str(ssid)]
        summary = json.loads(run_tool(C_SENDER, *args, "--rate", "500", "--count", str(N)).stdout)
        dump = run_tool(XDP_COLLECTOR, "dump", "--pin-dir", m.coll_pin, "--count", str(N), "--timeout-ms", "5000")
    finally:
        _tx_checksum_offload(m, B_TO_A, False)
    records = [json.loads(line) for line in dump.stdout.splitlines() if line.startswith("{")]
    refl, user, coll = _deltas(m, before, N, engine)
    assert summary["sent"] == N and [r["sender_seq"] for r in records] == list(range(N))
    assert refl == ({"pass_unknown_session": N} if engine == "ustamp" else {})
    assert user == {"received": N, "reflected": N}
    assert coll == {"collected_partial_csum": N}
