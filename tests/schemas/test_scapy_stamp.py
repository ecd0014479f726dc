"""Our STAMP base packets against Scapy's STAMP layer (scapy.contrib.stamp, Scapy 2.6.1).

Both directions: packets built with our encoders decode field by field identically in
Scapy, and packets built with Scapy decode identically with ours. Where Scapy reads the
RFC differently, the test pins Scapy's behaviour down and says why the RFC reading (ours)
wins; if a later Scapy fixes it, these tests fail and should be turned into comparisons.

Differences found in Scapy 2.6.1 (the RFC wins):
1. PTPv2 truncated timestamps (Z=1) are a UTCTimeField(fmt="Q"): one 64-bit count of
   seconds since 1970, not 32-bit seconds + 32-bit nanoseconds (RFC 8762 §4.2.1, RFC 8186
   §2.3). The raw value is (sec << 32) | nsec; show() of any real PTP timestamp raises
   OverflowError (it feeds ~6.8e18 "seconds" to datetime.timedelta).
2. Building with the constructor (ts=... together with err_estimate=ErrorEstimate(Z=1))
   converts ts with the NTP fixed-point rule (ts * 2^32): ts=12345 encodes seconds=12345,
   nanoseconds=0, while dissecting those bytes gives ts = 12345 << 32. Setting ts after
   construction encodes the raw 64-bit value. Not round-trip consistent.
3. NTP timestamps (Z=0): pkt.ts (i2h) adds the fraction as a Python float to the
   seconds, so the value is rounded to a double: ~2^-21 s (0.48 us) resolution at
   current dates. The raw field (getfieldval) is exact; we compare that.
4. TLV flags: FlagsField("UMIRRRRR") maps U to the least significant bit; RFC 8972 §4.2
   numbers U, M, I from the most significant bit (U = 0x80, M = 0x40, I = 0x20).
5. There is no authenticated-mode layer (RFC 8762 §4.2.2/§4.3.2); an authenticated
   packet fed to the unauthenticated layer is misread (SSID at octet 14 instead of 26).
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from scapy.contrib import stamp as sc
from scapy.layers.inet import UDP
from scapy.layers.inet6 import IPv6

from segscope_schemas import stamp_auth_packet as ap
from segscope_schemas import stamp_error_estimate as ee
from segscope_schemas import stamp_test_packet as tp
from segscope_schemas import stamp_timestamp as st
from segscope_schemas.stamp_timestamp import TsFormat

NS = 10**9
TAI_UTC = 37
T1 = (1_732_000_000 + TAI_UTC) * NS + 123_456_789  # a TAI instant with sub-us digits


def _ts(fmt: TsFormat, tai_ns: int) -> tuple[int, int]:
    return st.ntp_from_tai_ns(tai_ns, TAI_UTC) if fmt == TsFormat.NTP else st.ptp_from_tai_ns(tai_ns)


def _scapy_ts(pkt, name: str) -> tuple[int, int]:
    """(seconds, fraction-or-ns) from Scapy's raw 64-bit field value (differences 1 and 3)."""
    raw = pkt.getfieldval(name)
    return raw >> 32, raw & 0xFFFFFFFF


def _ee_fields(layer) -> tuple[int, int, int, int]:
    return layer.S, layer.Z, layer.scale, layer.multiplier


def _our_sender(fmt: TsFormat) -> tp.SenderPacket:
    sec, frac = _ts(fmt, T1)
    return tp.SenderPacket(
        seq=0x01020304, ts_sec=sec, ts_frac=frac, err_est=ee.ee_encode(True, fmt, 20_000), ssid=0xBEEF
    )


def _our_reflector(fmt: TsFormat) -> tp.ReflectorPacket:
    t2, t3 = T1 + 1_500_123, T1 + 1_520_777
    s1, f1 = _ts(fmt, T1)
    s2, f2 = _ts(fmt, t2)
    s3, f3 = _ts(fmt, t3)
    return tp.ReflectorPacket(
        seq=77,
        ts_sec=s3,
        ts_frac=f3,
        err_est=ee.ee_encode(False, fmt, 16 * NS),
        ssid=0xBEEF,
        rx_sec=s2,
        rx_frac=f2,
        sender_seq=76,
        sender_ts_sec=s1,
        sender_ts_frac=f1,
        sender_err_est=ee.ee_encode(True, fmt, 1_000),
        sender_ttl=61,
    )


@pytest.mark.parametrize("fmt", list(TsFormat), ids=lambda f: f.name)
def test_scapy_decodes_our_sender_packet(fmt):
    ours = _our_sender(fmt)
    buf = ours.encode()
    p = sc.STAMPSessionSenderTestUnauthenticated(buf)
    assert p.seq == ours.seq and p.ssid == ours.ssid and p.mbz == 0 and p.tlv_objects == []
    assert _ee_fields(p.err_estimate) == tuple(vars(ee.ee_unpack(ours.err_est)).values())
    assert _scapy_ts(p, "ts") == (ours.ts_sec, ours.ts_frac)
    assert bytes(p) == buf


@pytest.mark.parametrize("fmt", list(TsFormat), ids=lambda f: f.name)
def test_scapy_decodes_our_reflector_packet(fmt):
    ours = _our_reflector(fmt)
    buf = ours.encode()
    p = sc.STAMPSessionReflectorTestUnauthenticated(buf)
    assert (p.seq, p.ssid, p.seq_sender, p.ttl_sender, p.mbz1, p.mbz2) == (
        ours.seq,
        ours.ssid,
        ours.sender_seq,
        ours.sender_ttl,
        0,
        0,
    )
    assert _ee_fields(p.err_estimate) == tuple(vars(ee.ee_unpack(ours.err_est)).values())
    assert _ee_fields(p.err_estimate_sender) == tuple(vars(ee.ee_unpack(ours.sender_err_est)).values())
    assert _scapy_ts(p, "ts") == (ours.ts_sec, ours.ts_frac)
    assert _scapy_ts(p, "ts_rx") == (ours.rx_sec, ours.rx_frac)
    assert _scapy_ts(p, "ts_sender") == (ours.sender_ts_sec, ours.sender_ts_frac)
    assert p.tlv_objects == [] and bytes(p) == buf


def test_udp_port_862_dispatches_to_the_right_scapy_layer():
    snd, refl = _our_sender(TsFormat.PTP).encode(), _our_reflector(TsFormat.PTP).encode()
    p = IPv6(bytes(IPv6(src="fc00:1::1", dst="fc00:3::1") / UDP(sport=50001, dport=862) / snd))
    assert (
        p.haslayer(sc.STAMPSessionSenderTestUnauthenticated)
        and p[sc.STAMPSessionSenderTestUnauthenticated].ssid == 0xBEEF
    )
    p = IPv6(bytes(IPv6(src="fc00:3::1", dst="fc00:1::1") / UDP(sport=862, dport=50001) / refl))
    r = p[sc.STAMPSessionReflectorTestUnauthenticated]
    assert r.seq_sender == 76 and _scapy_ts(r, "ts_rx") == (
        _our_reflector(TsFormat.PTP).rx_sec,
        _our_reflector(TsFormat.PTP).rx_frac,
    )


def test_scapy_built_sender_decodes_identically_with_ours():
    # NTP: Scapy takes seconds since 1900 as a number; .5 and .25 are exact in binary
    p = sc.STAMPSessionSenderTestUnauthenticated(
        seq=9,
        err_estimate=sc.ErrorEstimate(S=1, Z=0, scale=9, multiplier=168),
        ssid=4242,
        ts=Decimal(3_941_000_000) + Decimal("0.75"),
    )
    ours = tp.SenderPacket.decode(bytes(p))
    assert (ours.seq, ours.ssid, ours.ts_sec, ours.ts_frac) == (9, 4242, 3_941_000_000, 3 << 30)
    f = ee.ee_unpack(ours.err_est)
    assert (f.s, f.z, f.scale, f.multiplier) == (1, 0, 9, 168)
    assert ee.ee_to_error_ns(f.scale, f.multiplier) == 20_028
    # PTP: ts must be set after construction (difference 2), as Scapy's raw 64-bit value
    q = sc.STAMPSessionSenderTestUnauthenticated(
        seq=10, err_estimate=sc.ErrorEstimate(S=0, Z=1, scale=29, multiplier=128)
    )
    sec, nsec = st.ptp_from_tai_ns(T1)
    q.ts = (sec << 32) | nsec
    ours = tp.SenderPacket.decode(bytes(q))
    assert (ours.seq, ours.ssid, ours.ts_sec, ours.ts_frac) == (10, 1, sec, nsec)  # Scapy default SSID 1
    assert st.ts_to_tai_ns(st.ts_format_of(ours.err_est), bytes(q)[4:12], TAI_UTC, T1) == T1


def test_scapy_built_reflector_decodes_identically_with_ours():
    p = sc.STAMPSessionReflectorTestUnauthenticated(
        seq=5,
        err_estimate=sc.ErrorEstimate(S=1, Z=0, scale=0, multiplier=5),
        ssid=17,
        ts=Decimal(3_941_000_001) + Decimal("0.5"),
        ts_rx=Decimal(3_941_000_001) + Decimal("0.25"),
        seq_sender=4,
        err_estimate_sender=sc.ErrorEstimate(S=1, Z=0, scale=5, multiplier=135),
        ts_sender=Decimal(3_941_000_000) + Decimal("0.125"),
        ttl_sender=63,
    )
    ours = tp.ReflectorPacket.decode(bytes(p))
    assert (ours.seq, ours.ssid, ours.sender_seq, ours.sender_ttl) == (5, 17, 4, 63)
    assert (ours.ts_sec, ours.ts_frac) == (3_941_000_001, 1 << 31)
    assert (ours.rx_sec, ours.rx_frac) == (3_941_000_001, 1 << 30)
    assert (ours.sender_ts_sec, ours.sender_ts_frac) == (3_941_000_000, 1 << 29)
    assert ee.ee_to_error_ns(*(lambda f: (f.scale, f.multiplier))(ee.ee_unpack(ours.sender_err_est))) == 1006


# ---- the differences, pinned down -------------------------------------------------


def test_difference_1_scapy_reads_ptp_as_one_64bit_seconds_count():
    buf = _our_sender(TsFormat.PTP).encode()
    p = sc.STAMPSessionSenderTestUnauthenticated(buf)
    sec, nsec = st.ptp_from_tai_ns(T1)
    assert p.ts == (sec << 32) | nsec  # "seconds since 1970" per Scapy
    with pytest.raises(OverflowError):
        p.show(dump=True)


def test_difference_2_constructor_applies_ntp_scaling_to_ptp():
    built = bytes(sc.STAMPSessionSenderTestUnauthenticated(err_estimate=sc.ErrorEstimate(Z=1), ts=12345))
    assert built[4:12] == (12345).to_bytes(4, "big") + bytes(4)
    assert sc.STAMPSessionSenderTestUnauthenticated(built).ts == 12345 << 32


def test_difference_3_scapy_ntp_value_is_rounded_to_a_double():
    sec, frac = 3_941_000_000, (1 << 31) + 1  # .5 s + 0.23 ns
    buf = tp.SenderPacket(1, sec, frac, ee.ee_encode(True, TsFormat.NTP, 1), 1).encode()
    p = sc.STAMPSessionSenderTestUnauthenticated(buf)
    assert p.getfieldval("ts") == (sec << 32) | frac  # raw: exact
    assert p.ts == Decimal(sec) + Decimal("0.5")  # value: the 0.23 ns are gone
    assert tp.SenderPacket.decode(buf).ts_frac == frac  # ours keeps the exact field


def test_difference_4_tlv_flag_bit_order():
    u_per_rfc = bytes([0x80, 1, 0, 4]) + bytes(4)  # RFC 8972 §4: U is the MSB
    t = sc.STAMPTestTLV(u_per_rfc)
    assert (t.type, t.len) == (1, 4)
    assert not t.flags.U and int(t.flags) == 0x80  # Scapy calls 0x80 "R"
    assert bytes(sc.STAMPTestTLV(flags="U", type=1, len=0))[0] == 0x01


def test_difference_5_no_authenticated_layer():
    auth_classes = [n for n in dir(sc) if "Authenticated" in n and "Unauthenticated" not in n]
    assert auth_classes == []
    ours = ap.AuthSenderPacket(seq=3, ts_sec=1, ts_frac=2, err_est=0x8001, ssid=0xBEEF)
    p = sc.STAMPSessionSenderTestUnauthenticated(ours.encode())
    assert p.seq == 3 and p.ssid == 0 != ours.ssid  # Scapy reads MBZ octets 14-15
    assert p.getfieldval("ts") == 0  # and the 12-octet MBZ as the timestamp
