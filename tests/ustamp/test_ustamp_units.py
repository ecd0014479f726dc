"""ustamp pieces without a network: clocks/formats, Error Estimate, TLV rules, session config errors."""

from __future__ import annotations

import json
import subprocess

import pytest
from ustamp_env import ENV, PY, REPO

from collectors.ustamp import tlvs
from collectors.ustamp.clock import ClockState, TimestampFormat, decode_ts, encode_ts, error_estimate
from collectors.ustamp.sessions import SessionConfigError, SessionTable, session_from_cli, sessions_from_file

NS = 1_000_000_000


def test_ntp_and_ptp_wire_values():
    # RFC 5905: NTP era 0 starts 2208988800 s before the Unix epoch; fraction = 2^32 * subsecond.
    # TAI - UTC = 37 s: TAI 1700000037.5 s is UTC 1700000000.5 s.
    tai = (1_700_000_000 + 37) * NS + NS // 2
    assert encode_ts(tai, TimestampFormat.NTP, 37) == (1_700_000_000 + 2_208_988_800, 0x8000_0000)
    # PTPv2 truncated (RFC 8762 §4.2.1): 32 low bits of TAI seconds, nanoseconds
    assert encode_ts(tai, TimestampFormat.PTP, 37) == ((1_700_000_037) & 0xFFFFFFFF, 500_000_000)


@pytest.mark.parametrize("fmt", list(TimestampFormat))
def test_timestamps_round_trip_and_widen(fmt):
    for tai in (1_795_000_000 * NS + 123_456_789, 4_294_967_290 * NS + 999_999_999, 4_294_967_301 * NS + 1):
        sec, frac = encode_ts(tai, fmt, 37)
        for ref in (tai, tai + 5 * NS, tai - 5 * NS):  # reference (T4) a little later or earlier
            back = decode_ts(sec, frac, fmt, 37, ref)
            assert abs(back - tai) <= (1 if fmt == TimestampFormat.NTP else 0), (fmt, tai, ref, back)


def test_error_estimate_from_clock_state():
    # 1 s = 128 * 2^-32 * 2^25 s (RFC 4656 §4.1.2): Scale 25, Multiplier 128. Synchronised clocks
    # report esterror, unsynchronised ones maxerror (a bound), S follows the sync state, Z the format.
    synced = ClockState(state=0, status=0, maxerror_us=16_000, esterror_us=1_000_000, tai_offset_s=37, synced=True)
    assert error_estimate(synced, TimestampFormat.PTP) == 0x8000 | 0x4000 | 25 << 8 | 128
    unsynced = ClockState(state=5, status=0x40, maxerror_us=1_000_000, esterror_us=1, tai_offset_s=0, synced=False)
    assert error_estimate(unsynced, TimestampFormat.NTP) == 25 << 8 | 128


BASE = bytes(44)  # the TLV area starts after the 44-byte base packet (RFC 8972 §4)


def ctx(**kw):
    args = dict(
        sender_addr="fc00:1::1",
        sender_port=50001,
        local_addr="fc00:3::1",
        local_port=862,
        received_tclass=0,
        clock_synced=False,
        rx_count=3,
        tx_count=3,
    )
    args.update(kw)
    return tlvs.TlvContext(**args)


def reflect(area_hex: str, **kw) -> tlvs.TlvResult:
    res = tlvs.reflect(BASE + bytes.fromhex(area_hex), 44, ctx(**kw))
    assert len(res.reply_area) == len(bytes.fromhex(area_hex))  # the reply keeps the length
    return res


# Each area below is written from the RFC figure: Flags(8) Type(8) Length(16) Value.
def test_unknown_tlv_echoed_with_u_flag():
    res = reflect("00c80004deadbeef80c90000")  # type 200, 201: unassigned
    assert res.reply_area == bytes.fromhex("80c80004deadbeef80c90000")
    assert (res.unrecognized, res.malformed, res.handled) == (2, 0, 0)


def test_overrunning_tlv_gets_m_flag_and_rest_is_copied():
    res = reflect("00c80002abcd800100100102")  # Extra Padding claims 16 bytes, has 2
    assert res.reply_area == bytes.fromhex("80c80002abcd400100100102")
    assert (res.unrecognized, res.malformed) == (1, 1)


def test_direct_measurement_counters():
    # RFC 8972 §4.5: S_TxC | R_RxC | R_TxC, Length 12
    res = reflect("8005000c00000007" + "00000000" * 2, rx_count=9, tx_count=8)
    assert res.reply_area == bytes.fromhex("0005000c000000070000000900000008")


def test_location_ports_and_addresses():
    # RFC 8972 §4.2: Dst Port | Src Port | sub-TLVs; request sub-TLVs 7 (Source IP) and 4 (Dest IP), 16 bytes
    area = "8002002c0000000080070010" + "00" * 16 + "80040010" + "00" * 16
    res = reflect(area)
    import ipaddress

    src, dst = ipaddress.IPv6Address("fc00:1::1").packed.hex(), ipaddress.IPv6Address("fc00:3::1").packed.hex()
    assert res.reply_area.hex() == "0002002c035ec35100090010" + src + "00060010" + dst


def test_timestamp_info_class_of_service_follow_up():
    # §4.3 Sync In | Method In | Sync Out | Method Out; §4.4 DSCP1(6) DSCP2(6) EC(2) RP(2) Resv(16);
    # §4.7 Sequence Number | Follow-up Timestamp (8) | Timestamp M | Reserved(3)
    dscp1_ef = 46 << 10
    area = "8003000400000000" + f"80040004{dscp1_ef:04x}0000" + "80070010" + "00" * 16
    res = reflect(area, received_tclass=(10 << 2) | 1, prev_seq=5, prev_t3=(100, 200))
    got = res.reply_area
    # unsynchronised: Local free-running (5; 0 is Reserved in IANA's registry), SW local (2)
    assert got[:8] == bytes.fromhex("0003000405020502")
    word = int.from_bytes(got[12:14], "big")
    assert (word >> 10, (word >> 4) & 0x3F, (word >> 2) & 3, word & 3) == (46, 10, 1, 0)
    assert res.reply_tclass == 46 << 2
    assert got[16:] == bytes.fromhex("000700100000000500000064000000c802000000")


def test_destination_node_address_and_return_path():
    import ipaddress

    ours, other = ipaddress.IPv6Address("fc00:3::1").packed.hex(), ipaddress.IPv6Address("fc00:9::1").packed.hex()
    assert reflect("80090010" + ours).reply_area[0] == 0x00  # RFC 9503 §3: U = 0, it is us
    assert reflect("80090010" + other).reply_area[0] == 0x80  # U = 1: not the named node
    # RFC 9503 §4: Return Path TLV with an SRv6 Segment List sub-TLV (type 4) and a Return Address (2)
    sids = [ipaddress.IPv6Address(a).packed.hex() for a in ("fc00:2::e2", "fc00:2::e")]
    ret = ipaddress.IPv6Address("fc00:1::1").packed.hex()
    res = reflect("800a003800040020" + "".join(sids) + "00020010" + ret)
    assert res.return_sids == ["fc00:2::e2", "fc00:2::e"] and res.return_address == "fc00:1::1"
    assert not res.no_reply
    # RFC 9503 §4.1.1 Control Code Flags, Reply Request flag = bit 31 (the least significant):
    assert reflect("800a00080001000400000000").no_reply  # 0x0 No Reply Requested
    same = reflect("800a00080001000400000001")  # 0x1 Reply Requested on the Same Link
    assert same.same_link and not same.no_reply
    other = reflect("800a00080001000480000000")  # only an unassigned bit: the flag is 0, no reply
    assert other.no_reply
    too_long = reflect("800a011400040110" + "".join(sids) * 9)  # 18 SIDs: more than an SRH here takes
    assert too_long.return_sids is None and too_long.unsupported == ["srv6_segments_too_long"]


def test_session_specs_and_errors(tmp_path):
    s = session_from_cli("--ssid 5 --sender fc00:1::1 --return-sids fc00:2::e,fc00:2::e2 --format NTP --stateful")
    assert (s.ssid, s.sender, s.return_sids, s.format, s.stateful) == (
        5,
        "fc00:1::1",
        ["fc00:2::e", "fc00:2::e2"],
        TimestampFormat.NTP,
        True,
    )
    table = SessionTable([s, session_from_cli("--ssid 5")])
    assert table.lookup("fc00:1::1", 5) is s  # exact sender first
    assert table.lookup("fc00:1::9", 5).sender == "::"  # then any sender
    assert table.lookup("fc00:1::1", 6) is None

    for spec, field in (
        ("--ssid -1", "ssid"),
        ("--ssid 1 --sender nope", "sender"),
        ("--ssid 1 --format tai", "format"),
        ("--ssid 1 --return-sids " + ",".join(["::1"] * 17), "return_sids"),
        ("--ssid 1 --bogus", "--bogus"),
    ):
        with pytest.raises(SessionConfigError, match=field):
            session_from_cli(spec)

    f = tmp_path / "s.yaml"
    f.write_text("sessions:\n  - {ssid: 3, return_sids: ['fc00:2::e'], format: ntp}\n  - {ssid: 4, colour: red}\n")
    with pytest.raises(SessionConfigError, match=r"sessions\[1\]: colour: unknown field"):
        sessions_from_file(f)
    f.write_text(json.dumps([{"ssid": 3, "format": "ntp"}, {"ssid": 4, "stateful": True}]))
    assert [(x.ssid, x.format, x.stateful) for x in sessions_from_file(f)] == [
        (3, TimestampFormat.NTP, False),
        (4, TimestampFormat.PTP, True),
    ]
    with pytest.raises(SessionConfigError, match="defined twice"):
        SessionTable([session_from_cli("--ssid 1"), session_from_cli("--ssid 1")])


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["reflector", "--add-session", "--ssid 70000"], "ssid: expected an integer 0..65535"),
        (["reflector", "--base-senders", "off"], "no sessions"),
        (
            ["sender", "--src", "fc00:1::1", "--dst", "x", "--ssid", "1", "--rate", "1", "--count", "1"],
            "--dst: not an IPv6",
        ),
        (
            ["sender", "--src", "fc00:1::1", "--ssid", "1", "--rate", "1", "--count", "1", "--mode", "loopback"],
            "--segs",
        ),
        (["sender", "--src", "fc00:1::1", "--dst", "::1", "--ssid", "1", "--rate", "1"], "--count/--duration"),
    ],
)
def test_cli_refuses_bad_arguments(argv, needle):
    res = subprocess.run(
        [PY, "-m", "collectors.ustamp", *argv], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=30
    )
    assert res.returncode == 2 and needle in res.stderr, (res.returncode, res.stderr)


def test_key_ring_rotation_by_validity_window(tmp_path):
    from collectors.ustamp.auth import KeyFileError, load_key_ring

    f = tmp_path / "k.json"
    f.write_text(
        json.dumps(
            {
                "keys": [
                    {"id": 1, "key_hex": "11" * 16, "not_after_ns": 2000},
                    {"id": 2, "key_hex": "22" * 16, "not_before_ns": 1000},
                ]
            }
        )
    )
    ring = load_key_ring(f)
    msg = b"x" * 96
    assert ring.sign(msg, 500) == ring.sign(msg, 999) != ring.sign(msg, 1000)  # key 2 signs from 1000
    assert ring.verify(msg, ring.sign(msg, 500), 1500)  # key 1 still accepted in the overlap
    assert not ring.verify(msg, ring.sign(msg, 500), 2000)  # ... and not after it
    for doc, needle in (
        ({"keys": []}, "keys: required"),
        ({"keys": [{"id": 1}]}, r"keys\[0\]: key_hex: required"),
        ({"keys": [{"id": 1, "key_hex": "zz"}]}, "key_hex: not a hex string"),
        ({"keys": [{"id": 1, "key_hex": "11"}], "current": 3}, "current: key id 3 is missing"),
        ({"keys": [{"id": 1, "key_hex": "11", "colour": 1}]}, "colour: unknown field"),
    ):
        f.write_text(json.dumps(doc))
        with pytest.raises(KeyFileError, match=needle):
            load_key_ring(f)
    with pytest.raises(SessionConfigError, match="key_file: required for an authenticated session"):
        session_from_cli("--ssid 1 --mode authenticated")
    with pytest.raises(SessionConfigError, match="key_file: only for mode authenticated"):
        session_from_cli(f"--ssid 1 --key-file {f}")


def test_cli_session_file_errors_name_the_field(tmp_path):
    f = tmp_path / "sessions.yaml"
    f.write_text("- {ssid: 1, return_sids: ['fc00:2::e']}\n- {ssid: 2, mode: authenticated}\n")
    res = subprocess.run(
        [PY, "-m", "collectors.ustamp", "reflector", "--sessions", str(f)],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 2
    assert "sessions[1]: key_file: required for an authenticated session" in res.stderr, res.stderr
