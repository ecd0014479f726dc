"""ustamp pieces without a network: clocks/formats, Error Estimate, TLV rules, session config errors."""
from __future__ import annotations

import json
import subprocess

import pytest

from collectors.ustamp import codec
from collectors.ustamp.clock import ClockState, TimestampFormat, decode_ts, encode_ts, error_estimate
from collectors.ustamp.sessions import SessionConfigError, SessionTable, session_from_cli, sessions_from_file
from ustamp_env import ENV, PY, REPO

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
        for ref in (tai, tai + 5 * NS, tai - 5 * NS):     # reference (T4) a little later or earlier
            back = decode_ts(sec, frac, fmt, 37, ref)
            assert abs(back - tai) <= (1 if fmt == TimestampFormat.NTP else 0), (fmt, tai, ref, back)


def test_error_estimate_rule():
    # 1 s = 128 * 2^-32 * 2^25 s (RFC 4656 §4.1.2): Scale 25, Multiplier 128
    assert error_estimate(ClockState(True, 1_000_000, 0), TimestampFormat.PTP) == 0x8000 | 0x4000 | 25 << 8 | 128
    assert error_estimate(ClockState(False, 1_000_000, 0), TimestampFormat.NTP) == 25 << 8 | 128
    # zero error: smallest expressible estimate, Multiplier never 0
    assert error_estimate(ClockState(True, 0, 0), TimestampFormat.NTP) == 0x8000 | 1


def ctx():
    return codec.ReflectContext(None, "fc00:1::1", "fc00:3::1", 0)


def test_unknown_tlv_echoed_with_u_flag():
    # RFC 8972 §4: Flags(8) Type(8) Length(16) Value; type 200 is unassigned
    area = bytes.fromhex("00c80004deadbeef" "00c90000")
    out = codec.reflect_tlvs(area, ctx())
    assert out.reply_area == bytes.fromhex("80c80004deadbeef" "80c90000")
    assert (out.unrecognized, out.malformed) == (2, 0)


def test_overrunning_tlv_gets_m_flag_and_rest_is_copied():
    area = bytes.fromhex("00c80002abcd" "00c90010" "0102")      # second TLV claims 16 bytes, has 2
    out = codec.reflect_tlvs(area, ctx())
    assert out.reply_area == bytes.fromhex("80c80002abcd" "40c90010" "0102")
    assert (out.unrecognized, out.malformed) == (1, 1)
    assert len(out.reply_area) == len(area)


def test_session_specs_and_errors(tmp_path):
    s = session_from_cli("--ssid 5 --sender fc00:1::1 --return-sids fc00:2::e,fc00:2::e2 --format NTP --stateful")
    assert (s.ssid, s.sender, s.return_sids, s.format, s.stateful) == \
        (5, "fc00:1::1", ["fc00:2::e", "fc00:2::e2"], TimestampFormat.NTP, True)
    table = SessionTable([s, session_from_cli("--ssid 5")])
    assert table.lookup("fc00:1::1", 5) is s                      # exact sender first
    assert table.lookup("fc00:1::9", 5).sender == "::"            # then any sender
    assert table.lookup("fc00:1::1", 6) is None

    for spec, field in (("--ssid 0", "ssid"), ("--ssid 1 --sender nope", "sender"),
                        ("--ssid 1 --format tai", "format"), ("--ssid 1 --return-sids " + ",".join(["::1"] * 17),
                                                              "return_sids"),
                        ("--ssid 1 --bogus", "--bogus")):
        with pytest.raises(SessionConfigError, match=field):
            session_from_cli(spec)

    f = tmp_path / "s.yaml"
    f.write_text("sessions:\n  - {ssid: 3, return_sids: ['fc00:2::e'], format: ntp}\n  - {ssid: 4, colour: red}\n")
    with pytest.raises(SessionConfigError, match=r"sessions\[1\]: colour: unknown field"):
        sessions_from_file(f)
    f.write_text(json.dumps([{"ssid": 3, "format": "ntp"}, {"ssid": 4, "stateful": True}]))
    assert [(x.ssid, x.format, x.stateful) for x in sessions_from_file(f)] == \
        [(3, TimestampFormat.NTP, False), (4, TimestampFormat.PTP, True)]
    with pytest.raises(SessionConfigError, match="defined twice"):
        SessionTable([session_from_cli("--ssid 1"), session_from_cli("--ssid 1")])


@pytest.mark.parametrize("argv,needle", [
    (["reflector", "--add-session", "--ssid 70000"], "ssid: expected an integer 1..65535"),
    (["reflector"], "no sessions"),
    (["sender", "--src", "fc00:1::1", "--dst", "x", "--ssid", "1", "--rate", "1", "--count", "1"], "--dst: not an IPv6"),
    (["sender", "--src", "fc00:1::1", "--ssid", "1", "--rate", "1", "--count", "1", "--mode", "loopback"], "--segs"),
    (["sender", "--src", "fc00:1::1", "--dst", "::1", "--ssid", "1", "--rate", "1"], "--count/--duration"),
])
def test_cli_refuses_bad_arguments(argv, needle):
    res = subprocess.run([PY, "-m", "collectors.ustamp", *argv], cwd=REPO, env=ENV, capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == 2 and needle in res.stderr, (res.returncode, res.stderr)
