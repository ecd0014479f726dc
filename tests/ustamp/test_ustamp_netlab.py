"""ustamp in the emulated SRv6 network (netlab line5, prefix `ust`).

Forward path: A -> R (End fc00:2::e) -> B. Return path: B -> R (End fc00:2::e2, a second SID the
fixture adds on R) -> A, so forward and return use DIFFERENT SID lists; R's per-SID packet
counters prove which list each packet followed. All namespaces share one clock, so
T1 <= T2 <= T3 <= T4 holds exactly (NTP only loses sub-ns resolution).
"""

from __future__ import annotations

import subprocess
import time

import pytest
from ustamp_env import PY, REFLECTOR_ADDR, REPO, SENDER_ADDR, SID_FWD, SID_RET, ReflectorProc, run_sender, sid_packets

from segscope_schemas.stamp_record import (
    STAMP_RECORD_F_LOOPBACK,
    STAMP_RECORD_F_NTP,
    STAMP_RECORD_F_ONE_WAY,
    STAMP_RECORD_F_REFLECTOR_NTP,
    STAMP_RECORD_F_SRH,
)
from tests.isolation import own_name

pytestmark = pytest.mark.datapath

PREFIX = own_name("ust")
N = 20
EE_Z = 0x4000
XDP_REFLECTOR = REPO / "build" / "datapath" / "stamp_reflector"
C_SENDER = REPO / "build" / "collectors" / "stamp_sender"


@pytest.fixture(scope="module")
def lab():
    from netlab.lab import Lab, teardown

    for part in ("datapath", "collectors"):
        subprocess.run(["make", "-s", "-C", str(REPO / part)], check=True)
    teardown(PREFIX)
    lab = Lab.up("netlab/topologies/line5.yaml", PREFIX)
    try:
        lab.run(
            "R",
            ["ip", "-6", "route", "add", f"{SID_RET}/128", "encap", "seg6local", "action", "End", "count", "dev", "r1"],
            check=True,
        )
        yield lab
    finally:
        lab.down()


@pytest.fixture
def reflector(lab):
    """User-space reflector on B: PTP/NTP x stateless/stateful sessions returning via SID_RET."""
    ret = f"--return-sids {SID_RET}"
    r = ReflectorProc(
        lab.ns("B"),
        "--add-session",
        f"--ssid 1 {ret}",
        "--add-session",
        f"--ssid 2 {ret} --format ntp",
        "--add-session",
        f"--ssid 3 {ret} --stateful",
        "--add-session",
        f"--ssid 4 {ret} --format ntp --stateful",
        "--add-session",
        f"--ssid 5 --sender {SENDER_ADDR}",
    )  # no return SIDs: swap
    try:
        yield r
    finally:
        r.kill()


def sender_args(ssid: int, *extra: str, count: int = N, wait_s: float = 5) -> list[str]:
    """The sender stops early once every reply is in; wait_s only bounds a lossy run."""
    return [
        "--src",
        SENDER_ADDR,
        "--dst",
        REFLECTOR_ADDR,
        "--segs",
        SID_FWD,
        "--ssid",
        str(ssid),
        "--rate",
        "200",
        "--count",
        str(count),
        "--wait",
        str(wait_s),
        *extra,
    ]


def wait_for(predicate, timeout: float = 5.0, what: str = "condition"):
    """Poll until predicate() returns a truthy value (packets may still be in flight)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def check_records(
    records: list[dict], summary: dict, ssid: int, ntp: bool, srh: bool, first_reflector_seq: int | None, lab
) -> None:
    """Every field of every record. first_reflector_seq None = stateless (reflector seq = sender seq)."""
    assert summary["sent"] == N and summary["records"] == N and summary["lost"] == 0, summary
    assert summary["received"] == N and summary["send_errors"] == 0
    assert [r["sender_seq"] for r in records] == list(range(N))  # one reply each, in order
    a0 = lab.ifindex("A", "a0")
    for i, r in enumerate(records):
        assert r["t1_ns"] <= r["t2_ns"] <= r["t3_ns"] <= r["t4_ns"], r
        assert r["t4_ns"] - r["t1_ns"] < 1_000_000_000, r  # sane: < 1 s round trip
        assert r["ssid"] == ssid
        expect_rseq = i if first_reflector_seq is None else first_reflector_seq + i
        assert r["reflector_seq"] == expect_rseq, r
        assert r["sender_err_est"] == summary["error_estimate"]
        assert bool(r["sender_err_est"] & EE_Z) == (not ntp)
        assert bool(r["reflector_err_est"] & EE_Z) == (not ntp)  # reflector uses the session format
        assert r["sender_ttl"] == 63  # 64 from A, -1 at R (End)
        assert r["reply_hop_limit"] == 254  # 255 from the reflector, -1 at R
        assert r["ifindex"] == a0
        ntp_flags = STAMP_RECORD_F_NTP | STAMP_RECORD_F_REFLECTOR_NTP  # both sides in NTP
        assert r["flags"] == (ntp_flags if ntp else 0) | (STAMP_RECORD_F_SRH if srh else 0)
        assert r["reserved"] == 0
    t1s = [r["t1_ns"] for r in records]
    assert t1s == sorted(t1s)


@pytest.mark.parametrize("ssid,ntp,stateful", [(1, False, False), (2, True, False), (3, False, True), (4, True, True)])
def test_ustamp_sender_to_ustamp_reflector(lab, reflector, ssid, ntp, stateful):
    before = sid_packets(lab)
    records, summary, res = run_sender(lab.ns("A"), *sender_args(ssid, *(["--format", "ntp"] if ntp else [])))
    assert res.returncode == 0, res.stderr
    check_records(records, summary, ssid, ntp, srh=True, first_reflector_seq=0 if stateful else None, lab=lab)
    after = sid_packets(lab)
    assert after[SID_FWD] - before[SID_FWD] == N  # forward list [fc00:2::e]
    assert after[SID_RET] - before[SID_RET] == N  # return list [fc00:2::e2]
    if stateful:  # the reflector's own counter goes on: N..2N-1 in a second run (another port)
        records, summary, _ = run_sender(
            lab.ns("A"), *sender_args(ssid, "--sport", "40000", *(["--format", "ntp"] if ntp else []))
        )
        check_records(records, summary, ssid, ntp, srh=True, first_reflector_seq=N, lab=lab)
    c = reflector.counters()
    runs = 2 if stateful else 1
    assert c["received"] == c["reflected"] == runs * N
    assert c["unknown_session"] == c["malformed_short"] == c["send_error"] == 0


def test_address_swap_unknown_ssid_malformed_and_tlvs(lab, reflector):
    before = sid_packets(lab)
    records, summary, _ = run_sender(lab.ns("A"), *sender_args(5))  # session without return SIDs
    check_records(records, summary, 5, ntp=False, srh=False, first_reflector_seq=None, lab=lab)
    assert sid_packets(lab)[SID_RET] == before[SID_RET]  # reply routed plainly

    records, summary, _ = run_sender(lab.ns("A"), *sender_args(99, count=7, wait_s=0.5))
    assert summary["sent"] == 7 and summary["records"] == 0 and summary["lost"] == 7

    short = (
        "import socket; s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); "
        f"[s.sendto(bytes(n), ('{REFLECTOR_ADDR}', 862)) for n in (0, 1, 20, 43)]"
    )
    lab.run("A", [PY, "-c", short], check=True)
    wait_for(lambda: reflector.counters()["malformed_short"] >= 4)

    # an unknown TLV (type 200) is echoed with the U flag (RFC 8972 §4)
    records, summary, _ = run_sender(lab.ns("A"), *sender_args(1, "--tlv", "200:0badcafe", "--sport", "40001"))
    assert summary["records"] == N and summary["tlv_u_flag_replies"] == N

    c = reflector.counters()
    assert c["unknown_session"] == 7
    assert c["malformed_short"] == 4
    assert c["reflected"] == 2 * N
    assert c["tlv_unrecognized"] == N and c["tlv_malformed"] == 0
    assert c["received"] == c["reflected"] + c["unknown_session"] + c["malformed_short"] + c["send_error"]
    final = reflector.stop()
    assert final == c


def test_c_sender_to_ustamp_reflector(lab, reflector):
    before = sid_packets(lab)
    res = subprocess.run(
        [
            str(C_SENDER),
            "--netns",
            lab.ns("A"),
            "--src",
            SENDER_ADDR,
            "--dst",
            REFLECTOR_ADDR,
            "--segs",
            SID_FWD,
            "--ssid",
            "3",
            "--sport",
            "40003",
            "--rate",
            "200",
            "--count",
            str(N),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr
    # the C sender does not wait for replies: give the last ones time to arrive, then be exact
    wait_for(lambda: reflector.counters()["received"] >= N)
    wait_for(lambda: sid_packets(lab)[SID_RET] - before[SID_RET] >= N)
    c = reflector.counters()
    assert c["received"] == c["reflected"] == N
    after = sid_packets(lab)
    assert after[SID_FWD] - before[SID_FWD] == N and after[SID_RET] - before[SID_RET] == N


def test_one_way_and_loopback_modes(lab, reflector):
    records, summary, _ = run_sender(lab.ns("A"), *sender_args(1, "--mode", "one-way"))
    assert summary["records"] == N and [r["sender_seq"] for r in records] == list(range(N))
    for r in records:
        assert r["t1_ns"] <= r["t2_ns"] and r["t3_ns"] == 0 and r["t4_ns"] == 0
        assert r["flags"] == STAMP_RECORD_F_ONE_WAY | STAMP_RECORD_F_SRH and r["sender_ttl"] == 63

    before = sid_packets(lab)
    records, summary, _ = run_sender(
        lab.ns("A"),
        "--src",
        SENDER_ADDR,
        "--segs",
        SID_FWD,
        "--ssid",
        "77",
        "--mode",
        "loopback",
        "--rate",
        "200",
        "--count",
        str(N),
        "--format",
        "ntp",
    )
    assert summary["records"] == N and summary["lost"] == 0
    assert sid_packets(lab)[SID_FWD] - before[SID_FWD] == N  # A -> R (End) -> A
    for i, r in enumerate(records):
        assert r["sender_seq"] == i and r["ssid"] == 77
        assert r["t1_ns"] < r["t4_ns"] and r["t2_ns"] == 0 and r["t3_ns"] == 0
        assert r["flags"] == STAMP_RECORD_F_LOOPBACK | STAMP_RECORD_F_SRH | STAMP_RECORD_F_NTP
        assert r["reply_hop_limit"] == 63
    assert reflector.counters()["received"] == N  # loopback never reached B


def xdp(*args: str) -> subprocess.CompletedProcess:
    res = subprocess.run([str(XDP_REFLECTOR), *args], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, (args, res.stderr)
    return res


def test_ustamp_sender_to_xdp_reflector(lab, bpffs, tmp_path):
    """XDP reflector on B's b0 for SSIDs 30/31; SSID 32 is unknown to it, passed up to the
    user-space reflector on the same node (pass_unknown_session), which answers it; SSID 33 is
    authenticated: XDP hands it to user space (pass_authenticated_to_userspace), which does HMAC."""
    import json

    keys = write_keys(tmp_path / "keys.json", [KEY_A])
    pin = f"/sys/fs/bpf/segscope/{lab.ns('B')}/stamp_reflector"
    xdp("attach", "--netns", lab.ns("B"), "--dev", "b0", "--pin-dir", pin)
    user = None
    try:
        xdp("add-address", "--pin-dir", pin, REFLECTOR_ADDR)
        xdp("add-session", "--pin-dir", pin, "--ssid", "30", "--return-sids", SID_RET)
        xdp("add-session", "--pin-dir", pin, "--ssid", "31", "--return-sids", SID_RET, "--format", "ntp", "--stateful")
        xdp("add-session", "--pin-dir", pin, "--ssid", "33", "--mode", "authenticated")
        user = ReflectorProc(
            lab.ns("B"),
            "--add-session",
            f"--ssid 32 --return-sids {SID_RET}",
            "--add-session",
            f"--ssid 33 --return-sids {SID_RET} --mode authenticated --key-file {keys}",
        )
        before = sid_packets(lab)
        for ssid, ntp, stateful, auth in (
            (30, False, False, []),
            (31, True, True, []),
            (32, False, False, []),
            (33, False, False, ["--auth-key-file", keys]),
        ):
            records, summary, _ = run_sender(
                lab.ns("A"), *sender_args(ssid, *(["--format", "ntp"] if ntp else []), *auth)
            )
            check_records(records, summary, ssid, ntp, srh=True, first_reflector_seq=0 if stateful else None, lab=lab)
        after = sid_packets(lab)
        assert after[SID_FWD] - before[SID_FWD] == 4 * N and after[SID_RET] - before[SID_RET] == 4 * N
        stats = json.loads(xdp("stats", "--pin-dir", pin, "--json").stdout)
        assert stats["reflected"] == 2 * N
        assert stats["pass_unknown_session"] == N
        assert stats["pass_authenticated_to_userspace"] == N
        c = user.stop()
        assert c["received"] == c["reflected"] == 2 * N
    finally:
        if user:
            user.kill()
        subprocess.run(
            [str(XDP_REFLECTOR), "detach", "--netns", lab.ns("B"), "--dev", "b0", "--pin-dir", pin], capture_output=True
        )


@pytest.fixture(scope="module")
def kafka_bootstrap():
    """The collectors tests' own Kafka (tests/isolation.py slot 1: port base 29000, run dir
    .run/co-stack in a lone run), shared by lease: one broker for every test session of a group
    that needs an isolated one."""
    from services.stack import Stack
    from tests.isolation import extra_stack

    run_dir, port_base = extra_stack("co-stack", slot=1, default_port_base=29000)
    stack = Stack(run_dir=run_dir, port_base=port_base, fresh=True)
    with stack.shared(only=["kafka"]):
        yield stack.kafka_bootstrap


def consume(bootstrap: str, topic: str, until, timeout: float = 30.0) -> list:
    import uuid

    from confluent_kafka import Consumer

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"us-test-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([topic])
    msgs, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and not until(msgs):
            for m in c.consume(num_messages=1000, timeout=0.5):
                if m.error() is None:
                    msgs.append(m)
    finally:
        c.close()
    return msgs


def test_kafka_outputs(lab, kafka_bootstrap):
    """Sender records as stamp_batch (key <node>/<ssid>) and reflector counter lines, on fresh topics."""
    import uuid

    from confluent_kafka.admin import AdminClient, NewTopic

    from segscope_schemas.stamp_record import decode_batch

    tag = uuid.uuid4().hex[:8]
    records_topic, metrics_topic = f"us-records-{tag}", f"us-metrics-{tag}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for f in admin.create_topics([NewTopic(records_topic, 1, 1), NewTopic(metrics_topic, 1, 1)]).values():
        f.result(15)
    refl = ReflectorProc(
        lab.ns("B"),
        "--add-session",
        f"--ssid 6 --return-sids {SID_RET}",
        "--kafka",
        kafka_bootstrap,
        "--node",
        "usB",
        "--metrics-topic",
        metrics_topic,
        "--stats-interval",
        "0.5",
    )
    try:
        records, summary, res = run_sender(
            lab.ns("A"),
            *sender_args(
                6,
                "--output",
                "kafka",
                "--kafka",
                kafka_bootstrap,
                "--topic",
                records_topic,
                "--node",
                "usA",
                "--metrics-topic",
                metrics_topic,
            ),
        )
        assert res.returncode == 0, res.stderr
        assert records == []  # records went to Kafka, not stdout
        k = summary["kafka"]
        assert summary["records"] == N and k["records_delivered"] == N and k["undelivered"] == 0
        counters = refl.stop()
    finally:
        refl.kill()
    msgs = consume(
        kafka_bootstrap, records_topic, lambda ms: sum(decode_batch(m.value())[0].record_count for m in ms) >= N
    )
    assert len(msgs) == k["batches_delivered"]
    seqs, batch_seqs = [], []
    for m in msgs:
        assert m.key() == b"usA/6"
        hdr, recs = decode_batch(m.value())
        assert hdr.node == "usA"
        batch_seqs.append(hdr.batch_seq)
        seqs += [int(s) for s in recs["sender_seq"]]
        assert all(recs["ssid"] == 6) and all(recs["flags"] == STAMP_RECORD_F_SRH)
        assert all(recs["t1_ns"] <= recs["t2_ns"]) and all(recs["t3_ns"] <= recs["t4_ns"])
    assert seqs == list(range(N)) and batch_seqs == list(range(len(msgs)))

    # the delay processor's aggregator takes these batches unchanged
    from processors.delay.aggregate import DelayAggregator

    agg = DelayAggregator()
    all_recs = []
    for m in msgs:
        hdr, recs = decode_batch(m.value())
        agg.ingest(hdr.node, recs)
        all_recs.append(recs.copy())
    counts: dict[str, int] = {}
    for line in agg.flush_all():
        if line.startswith("stamp_delay,"):
            tags, fields, _ts = line.split(" ")
            assert "node=usA" in tags and "ssid=6" in tags
            direction = tags.split("direction=")[1]
            counts[direction] = counts.get(direction, 0) + int(
                dict(f.split("=") for f in fields.split(","))["count"][:-1]
            )
    assert counts == {"forward": N, "reverse": N, "round_trip": N}

    lines = [
        m.value().decode()
        for m in consume(
            kafka_bootstrap,
            metrics_topic,
            lambda ms: any(b"reflected=20i" in m.value() for m in ms)
            and any(b"program=ustamp_sender" in m.value() for m in ms),
        )
    ]
    sender_lines = [l for l in lines if "program=ustamp_sender" in l]
    assert sender_lines[-1].startswith("segscope_datapath,node=usA,program=ustamp_sender,ssid=6 ")
    sender_fields = dict(kv.split("=") for kv in sender_lines[-1].split(" ")[1].split(","))
    assert sender_fields["sent"] == sender_fields["records"] == f"{N}i" and sender_fields["lost"] == "0i"
    last = [l for l in lines if "program=ustamp_reflector" in l][-1]
    assert last.startswith("segscope_datapath,node=usB,program=ustamp_reflector ")
    fields = dict(kv.split("=") for kv in last.split(" ")[1].split(","))
    assert fields["received"] == fields["reflected"] == f"{counters['reflected']}i" == f"{N}i"
    # the fast engine's (the default) counters are in the line too: no drop at its sockets or queue
    assert fields["socket_drops"] == fields["slow_path_queue_full"] == fields["slow_path"] == "0i"
    assert 1 <= int(fields["batches"][:-1]) <= N


def test_return_path_tlv_steers_the_reply(lab, reflector):
    """RFC 9503 §4: session 5 has no return SIDs, the Return Path TLV's SRv6 Segment List sub-TLV
    [fc00:2::e2] makes the reflector return over it; Control Code 'No Reply Requested' suppresses it."""
    import ipaddress

    seglist = "00040010" + ipaddress.IPv6Address(SID_RET).packed.hex()  # sub-TLV 4, one SID
    before = sid_packets(lab)
    records, summary, _ = run_sender(lab.ns("A"), *sender_args(5, "--tlv", f"10:{seglist}"))
    assert summary["records"] == N and summary["tlv_u_flag_replies"] == 0 and summary["tlv_m_flag_replies"] == 0
    assert all(r["flags"] == STAMP_RECORD_F_SRH for r in records)  # the reply came with an SRH
    assert sid_packets(lab)[SID_RET] - before[SID_RET] == N  # ... through fc00:2::e2

    # Control Code Flags 0x0: the Reply Request flag (bit 31) clear, No Reply Requested (RFC 9503 §4.1.1)
    records, summary, _ = run_sender(lab.ns("A"), *sender_args(5, "--tlv", "10:0001000400000000", count=5, wait_s=0.5))
    assert summary["sent"] == 5 and summary["records"] == 0
    c = reflector.counters()
    assert c["reflected"] == N and c["return_path_from_tlv"] == N
    assert c["no_reply_requested"] == 5 and c["received"] == N + 5


KEY_A = {"id": 1, "key_hex": "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"}
KEY_B = {"id": 2, "key_hex": "b0b1b2b3b4b5b6b7b8b9babbbcbdbebf"}


def write_keys(path, keys, current=None):
    import json

    doc = {"keys": keys}
    if current is not None:
        doc["current"] = current
    path.write_text(json.dumps(doc))
    return str(path)


def test_authenticated_mode_and_key_rotation(lab, tmp_path):
    """RFC 8762 §4.2.2/§4.3.2/§4.4: 112-byte packets with HMAC; a wrong key is counted and not
    answered; the HMAC TLV (RFC 8972 §4.8) is verified and re-signed; SIGHUP rotates the keys."""
    import signal

    refl_keys = write_keys(tmp_path / "reflector.json", [KEY_A, KEY_B])
    r = ReflectorProc(
        lab.ns("B"),
        "--add-session",
        f"--ssid 40 --mode authenticated --key-file {refl_keys} --return-sids {SID_RET} --stateful",
    )
    try:
        dm = "5:" + "00000007" + "00" * 8  # Direct Measurement (RFC 8972 §4.5)
        hmac_tlv = "8:" + "00" * 16  # HMAC TLV, filled by the sender
        for i, current in enumerate((1, 2)):  # either valid key is accepted
            keys = write_keys(tmp_path / f"sender{current}.json", [KEY_A, KEY_B], current)
            records, summary, res = run_sender(
                lab.ns("A"), *sender_args(40, "--auth-key-file", keys, "--tlv", dm, "--tlv", hmac_tlv)
            )
            assert res.returncode == 0, res.stderr
            check_records(records, summary, 40, ntp=False, srh=True, first_reflector_seq=i * N, lab=lab)
            assert summary["auth_failed_reply"] == 0 and summary["tlv_hmac_bad_replies"] == 0
            assert summary["tlv_i_flag_replies"] == summary["tlv_u_flag_replies"] == 0
        wrong = write_keys(tmp_path / "wrong.json", [{"id": 9, "key_hex": "ff" * 16}])
        _, summary, _ = run_sender(lab.ns("A"), *sender_args(40, "--auth-key-file", wrong, count=5, wait_s=0.5))
        assert summary["records"] == 0
        _, summary, _ = run_sender(lab.ns("A"), *sender_args(40, count=3, wait_s=0.5))  # unauthenticated
        assert summary["records"] == 0
        c = r.counters()
        assert c["reflected"] == 2 * N and c["auth_failed"] == 5 + 3 and c["tlv_handled"] == 2 * 2 * N
        assert c["tlv_integrity_failed"] == 0

        write_keys(tmp_path / "reflector.json", [KEY_B])  # rotation: key 1 retired
        r.proc.send_signal(signal.SIGHUP)
        assert r.next_line()["event"] == "reloaded"
        keys1 = str(tmp_path / "sender1.json")
        _, summary, _ = run_sender(lab.ns("A"), *sender_args(40, "--auth-key-file", keys1, count=4, wait_s=0.5))
        assert summary["records"] == 0
        _, summary, _ = run_sender(
            lab.ns("A"), *sender_args(40, "--auth-key-file", str(tmp_path / "sender2.json"), count=4)
        )
        assert summary["records"] == 4
        c = r.stop()
        assert c["auth_failed"] == 8 + 4 and c["reflected"] == 2 * N + 4
        assert c["received"] == c["reflected"] + c["auth_failed"]
    finally:
        r.kill()


XDP_COLLECTOR = REPO / "build" / "datapath" / "stamp_collector"


def test_xdp_collector_with_ustamp_reflector(lab, bpffs, reflector):
    """Sender side in XDP (stamp_collector on A's a0 takes T4 and writes the records), reflector in
    user space: the mixed deployment for a far end without XDP. PTP stateless and NTP stateful."""
    import json

    pin = f"/sys/fs/bpf/segscope/{lab.ns('A')}/stamp_collector"
    subprocess.run(
        [str(XDP_COLLECTOR), "attach", "--netns", lab.ns("A"), "--dev", "a0", "--pin-dir", pin],
        check=True,
        capture_output=True,
    )
    try:
        for ssid, fmt in ((1, "ptp"), (4, "ntp")):
            subprocess.run(
                [
                    str(XDP_COLLECTOR),
                    "activate",
                    "--pin-dir",
                    pin,
                    "--ssid",
                    str(ssid),
                    "--port",
                    str(50000 + ssid),
                    "--format",
                    fmt,
                ],
                check=True,
                capture_output=True,
            )
        for ssid, fmt, _stateful in ((1, "ptp", False), (4, "ntp", True)):
            _, summary, _ = run_sender(lab.ns("A"), *sender_args(ssid, "--format", fmt, wait_s=0.5))
            assert summary["sent"] == N and summary["records"] == 0  # the replies were XDP_DROPped
            dump = subprocess.run(
                [str(XDP_COLLECTOR), "dump", "--pin-dir", pin, "--count", str(N), "--timeout-ms", "3000"],
                check=True,
                capture_output=True,
                text=True,
            )
            recs = [json.loads(l) for l in dump.stdout.splitlines() if l.startswith("{")]
            assert [r["sender_seq"] for r in recs] == list(range(N))
            ntp = fmt == "ntp"
            for i, r in enumerate(recs):
                assert r["t1_ns"] <= r["t2_ns"] <= r["t3_ns"] <= r["t4_ns"] < r["t1_ns"] + 1_000_000_000, r
                assert r["ssid"] == ssid and r["reflector_seq"] == i
                assert r["sender_ttl"] == 63 and r["reply_hop_limit"] == 254
                ntp_flags = STAMP_RECORD_F_NTP | STAMP_RECORD_F_REFLECTOR_NTP  # both sides in NTP
                assert r["flags"] == STAMP_RECORD_F_SRH | (ntp_flags if ntp else 0)
                assert bool(r["reflector_err_est"] & EE_Z) == (not ntp)
        stats = json.loads(
            subprocess.run(
                [str(XDP_COLLECTOR), "stats", "--pin-dir", pin, "--json"], check=True, capture_output=True, text=True
            ).stdout
        )
        assert stats["collected"] == 2 * N
        assert reflector.counters()["reflected"] == 2 * N
    finally:
        subprocess.run(
            [str(XDP_COLLECTOR), "detach", "--netns", lab.ns("A"), "--dev", "a0", "--pin-dir", pin], capture_output=True
        )


def test_sighup_reloads_the_session_file(lab, tmp_path):
    """Sessions change at run time like the XDP reflector's add-session/del-session: edit the file,
    SIGHUP. Unchanged sessions keep their state; a broken file leaves the configuration as it was."""
    import json
    import signal

    f = tmp_path / "sessions.json"
    f.write_text(json.dumps([{"ssid": 60, "stateful": True, "return_sids": [SID_RET]}]))
    r = ReflectorProc(lab.ns("B"), "--sessions", str(f))
    try:
        records, summary, _ = run_sender(lab.ns("A"), *sender_args(60))
        check_records(records, summary, 60, ntp=False, srh=True, first_reflector_seq=0, lab=lab)
        _, summary, _ = run_sender(lab.ns("A"), *sender_args(61, count=3, wait_s=0.5))
        assert summary["records"] == 0  # not configured yet

        f.write_text(
            json.dumps(
                [
                    {"ssid": 60, "stateful": True, "return_sids": [SID_RET]},
                    {"ssid": 61, "format": "ntp", "return_sids": [SID_RET]},
                ]
            )
        )
        r.proc.send_signal(signal.SIGHUP)
        # 0: the base senders' session (--base-senders on, the default)
        assert [s["ssid"] for s in r.next_line()["sessions"]] == [60, 61, 0]
        records, summary, _ = run_sender(lab.ns("A"), *sender_args(61, "--format", "ntp"))
        check_records(records, summary, 61, ntp=True, srh=True, first_reflector_seq=None, lab=lab)
        records, summary, _ = run_sender(lab.ns("A"), *sender_args(60, "--sport", "40060"))
        check_records(records, summary, 60, ntp=False, srh=True, first_reflector_seq=N, lab=lab)  # state kept

        f.write_text("[{\"ssid\": 70000}]")  # broken: old configuration stays
        r.proc.send_signal(signal.SIGHUP)
        records, summary, _ = run_sender(lab.ns("A"), *sender_args(61, "--format", "ntp", "--sport", "40061"))
        assert summary["records"] == N
        c = r.stop()
        assert c["reflected"] == 4 * N and c["unknown_session"] == 3
    finally:
        r.kill()
    assert "sessions[0]: ssid: expected an integer 0..65535" in r.proc.stderr.read()
