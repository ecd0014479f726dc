#!/usr/bin/env python3
"""Writes stamp_timestamp.json, stamp_error_estimate.json, stamp_auth_packet.json and
stamp_hmac.json in this directory from the RFC definitions, independently of
segscope_schemas (plain integer arithmetic, byte slicing at the offsets of the
RFC figures, brute force over every Error Estimate, the stdlib hmac module for
the one STAMP packet HMAC; RFC 4231 results are copied from the RFC).

usage: python3 schemas/vectors/make_stamp_base_vectors.py   (rewrites the files)
"""

from __future__ import annotations

import hashlib
import hmac
import json
from fractions import Fraction
from pathlib import Path

HERE = Path(__file__).resolve().parent
NTP_UNIX = 2_208_988_800  # RFC 5905 §6: 70 years incl. 17 leap days
NS = 10**9
TAI_UTC_2020 = 37  # IERS: TAI-UTC since 2017-01-01
UNIX_2020 = 1_577_836_800  # 2020-01-01T00:00:00Z
NTP_WRAP_UNIX = (1 << 32) - NTP_UNIX  # 2036-02-07T06:28:16Z, NTP era 1 begins


def be(v: int, n: int) -> str:
    return v.to_bytes(n, "big").hex()


# ---------------------------------------------------------------- timestamps
def ts_vec(name, rfc, fmt, sec, frac, off, ref_tai_ns, tai_ns=None, encode_exact=True, valid=True, note=""):
    v = {
        "name": name,
        "rfc": rfc,
        "format": fmt,
        "hex": be(sec, 4) + be(frac, 4),
        "sec": sec,
        "frac": frac,
        "tai_utc_offset_s": off,
        "ref_tai_ns": ref_tai_ns,
        "valid": valid,
    }
    if valid:
        v["tai_ns"] = tai_ns
        v["encode_exact"] = encode_exact
    if note:
        v["note"] = note
    return v


NTP_RFC = "RFC 8762 §4.2.1; RFC 5905 §6 (seconds since 1900-01-01 UTC, fraction 2^-32 s)"
PTP_RFC = "RFC 8762 §4.2.1; RFC 8186 §2.3 / IEEE 1588 (TAI seconds, low 32 bits, + nanoseconds)"
t2020 = (UNIX_2020 + TAI_UTC_2020) * NS
timestamps = [
    ts_vec(
        "ntp_unix_epoch",
        NTP_RFC,
        "ntp",
        NTP_UNIX,
        0,
        0,
        NS,
        0,
        note="1970-01-01T00:00:00Z = NTP 2208988800 (0x83aa7e80)",
    ),
    ts_vec(
        "ntp_2020_half_second",
        NTP_RFC,
        "ntp",
        UNIX_2020 + NTP_UNIX,
        1 << 31,
        TAI_UTC_2020,
        t2020 + 10 * NS,
        t2020 + NS // 2,
        note="2020-01-01T00:00:00.5Z, TAI-UTC 37 s; 0.5 s = 2^31",
    ),
    ts_vec(
        "ntp_one_ns",
        NTP_RFC,
        "ntp",
        UNIX_2020 + NTP_UNIX,
        4,
        TAI_UTC_2020,
        t2020,
        t2020 + 1,
        note="1 ns = 4.294967296 units -> 4 (nearest); 4 units = 0.93 ns -> 1 ns",
    ),
    ts_vec(
        "ntp_999999999_ns",
        NTP_RFC,
        "ntp",
        UNIX_2020 + NTP_UNIX,
        0xFFFFFFFC,
        TAI_UTC_2020,
        t2020,
        t2020 + NS - 1,
        note="999999999 ns * 2^32/10^9 = 4294967291.7 -> 0xfffffffc",
    ),
    ts_vec(
        "ntp_max_fraction_carries",
        NTP_RFC,
        "ntp",
        UNIX_2020 + NTP_UNIX,
        0xFFFFFFFF,
        TAI_UTC_2020,
        t2020,
        t2020 + NS,
        encode_exact=False,
        note="0xffffffff = 999999999.77 ns -> nearest ns is the next second; re-encodes as frac 0",
    ),
    ts_vec(
        "ntp_era1_after_wrap",
        NTP_RFC + "; RFC 5905 §6 eras",
        "ntp",
        0,
        1 << 30,
        TAI_UTC_2020,
        (NTP_WRAP_UNIX + TAI_UTC_2020 + 5) * NS,
        (NTP_WRAP_UNIX + TAI_UTC_2020) * NS + NS // 4,
        note="2036-02-07T06:28:16.25Z: era 1, seconds field 0; reference 5 s later",
    ),
    ts_vec(
        "ntp_era0_last_second",
        NTP_RFC + "; RFC 5905 §6 eras",
        "ntp",
        0xFFFFFFFF,
        0,
        TAI_UTC_2020,
        (NTP_WRAP_UNIX + TAI_UTC_2020 + 10) * NS,
        (NTP_WRAP_UNIX - 1 + TAI_UTC_2020) * NS,
        note="last second of era 0 with a reference already in era 1",
    ),
    ts_vec(
        "ntp_tai_utc_offset_zero",
        NTP_RFC,
        "ntp",
        UNIX_2020 + NTP_UNIX,
        0,
        0,
        t2020,
        UNIX_2020 * NS,
        note="TAI-UTC 0 (kernel default when never set): TAI ns = UTC ns",
    ),
    ts_vec(
        "ptp_2020_half_second",
        PTP_RFC,
        "ptp",
        UNIX_2020 + TAI_UTC_2020,
        500_000_000,
        TAI_UTC_2020,
        t2020,
        t2020 + NS // 2,
        note="PTP is TAI: no offset applied",
    ),
    ts_vec("ptp_max_nsec", PTP_RFC, "ptp", 0x5E0BE125, 999_999_999, 0, 0x5E0BE125 * NS, 0x5E0BE125 * NS + NS - 1),
    ts_vec(
        "ptp_after_32bit_wrap",
        PTP_RFC,
        "ptp",
        1,
        250,
        0,
        4_294_967_294 * NS,
        (1 << 32) * NS + NS + 250,
        note="seconds field wrapped (2106); reference just before the wrap",
    ),
    ts_vec(
        "ptp_nsec_too_big",
        PTP_RFC,
        "ptp",
        UNIX_2020,
        NS,
        0,
        t2020,
        valid=False,
        note="nanoseconds field 10^9 is malformed (IEEE 1588: < 10^9)",
    ),
]

# ----------------------------------------------------------- error estimate
EE_RFC = "RFC 8762 §4.2.1; RFC 4656 §4.1.2 (S|Z|Scale 6|Multiplier 8, error = M*2^-32*2^Scale s); RFC 8186 §2.3 (Z)"


def ee_value_ns_ceil(scale: int, mult: int) -> int:
    v = Fraction(mult * NS * 2**scale, 2**32)
    return min(-(-v.numerator // v.denominator), 2**64 - 1)


def ee_decode_vec(name, s, z, scale, mult, note=""):
    word = s << 15 | z << 14 | scale << 8 | mult
    v = {
        "name": name,
        "rfc": EE_RFC,
        "hex": be(word, 2),
        "valid": mult != 0,
        "S": s,
        "Z": z,
        "scale": scale,
        "multiplier": mult,
    }
    if mult:
        v["error_ns"] = ee_value_ns_ceil(scale, mult)
    if note:
        v["note"] = note
    return v


def ee_best(err_ns: int) -> tuple[int, int]:
    """Brute force: the (scale, mult) with the smallest value >= err_ns (ties: smaller scale)."""
    best = None
    for scale in range(64):
        for mult in range(1, 256):
            val = Fraction(mult * 2**scale, 2**32)  # seconds
            if val * NS >= err_ns and (best is None or val < best[0]):
                best = (val, scale, mult)
    return best[1], best[2]


ee_decode = [
    ee_decode_vec("smallest_error_synced_ntp", 1, 0, 0, 1, "2^-32 s = 0.23 ns -> 1 ns rounded up"),
    ee_decode_vec("one_second_ptp", 0, 1, 25, 128, "128 * 2^-7 s = 1 s exactly"),
    ee_decode_vec("sixteen_seconds_unsynced", 0, 0, 29, 128, "NTP phase limit 16 s"),
    ee_decode_vec("microsecond_synced_ptp", 1, 1, 5, 135, "135 * 2^5 * 2^-32 s = 1005.83 ns"),
    ee_decode_vec("largest", 1, 1, 63, 255, "255 * 2^31 s does not fit u64 ns: saturates"),
    ee_decode_vec("multiplier_zero_invalid", 1, 0, 3, 0, "RFC 4656 §4.1.2: Multiplier MUST NOT be 0"),
]
ee_encode = []
for name, err in [
    ("zero", 0),
    ("one_ns", 1),
    ("one_us", 1_000),
    ("twenty_us", 20_000),
    ("one_ms", 1_000_000),
    ("one_s", NS),
    ("sixteen_s", 16 * NS),
    ("just_over_one_s", NS + 1),
    ("u64_max", 2**64 - 1),
]:
    scale, mult = ee_best(err)
    ee_encode.append(
        {
            "name": name,
            "rfc": EE_RFC,
            "error_ns": err,
            "scale": scale,
            "multiplier": mult,
            "encoded_error_ns": ee_value_ns_ceil(scale, mult),
        }
    )
STA_UNSYNC, STA_PLL, TIME_OK, TIME_ERROR = 0x40, 0x01, 0, 5
ee_clock = []
for name, state, status, maxe, este, fmt in [
    ("free_running_ntp", TIME_ERROR, STA_UNSYNC, 16_000_000, 16_000_000, "ntp"),
    ("ntp_synced_ptp_format", TIME_OK, STA_PLL, 1_500, 20, "ptp"),
    ("unsync_flag_wins_over_small_error", TIME_OK, STA_PLL | STA_UNSYNC, 100, 10, "ntp"),
    ("synced_zero_esterror_floor_1ns", TIME_OK, STA_PLL, 10, 0, "ntp"),
]:
    synced = state != TIME_ERROR and not status & STA_UNSYNC and maxe < 16_000_000
    err_ns = max((este if synced else maxe) * 1000, 1)
    scale, mult = ee_best(err_ns)
    word = int(synced) << 15 | (fmt == "ptp") << 14 | scale << 8 | mult
    ee_clock.append(
        {
            "name": name,
            "rfc": EE_RFC + "; adjtimex(2) STA_UNSYNC/TIME_ERROR/maxerror/esterror",
            "state": state,
            "status": status,
            "maxerror_us": maxe,
            "esterror_us": este,
            "format": fmt,
            "S": int(synced),
            "error_ns": err_ns,
            "hex": be(word, 2),
        }
    )

# ------------------------------------------------------------ auth packets
S422 = "RFC 8762 §4.2.2 Figure 2 + RFC 8972 §3"
S432 = "RFC 8762 §4.3.2 Figure 5 + RFC 8972 §3"
SENDER_LAYOUT = [
    ("seq", 0, 4),
    ("mbz0", 4, 12),
    ("ts_sec", 16, 4),
    ("ts_frac", 20, 4),
    ("err_est", 24, 2),
    ("ssid", 26, 2),
    ("mbz1", 28, 68),
    ("hmac", 96, 16),
]
REFLECTOR_LAYOUT = [
    ("seq", 0, 4),
    ("mbz0", 4, 12),
    ("ts_sec", 16, 4),
    ("ts_frac", 20, 4),
    ("err_est", 24, 2),
    ("ssid", 26, 2),
    ("mbz1", 28, 4),
    ("rx_sec", 32, 4),
    ("rx_frac", 36, 4),
    ("mbz2", 40, 8),
    ("sender_seq", 48, 4),
    ("mbz3", 52, 12),
    ("sender_ts_sec", 64, 4),
    ("sender_ts_frac", 68, 4),
    ("sender_err_est", 72, 2),
    ("mbz4", 74, 6),
    ("sender_ttl", 80, 1),
    ("mbz5", 81, 15),
    ("hmac", 96, 16),
]
for layout in (SENDER_LAYOUT, REFLECTOR_LAYOUT):  # contiguous, 112 bytes
    assert all(a[1] + a[2] == b[1] for a, b in zip(layout, layout[1:])) and layout[-1][1] + 16 == 112

KEY = b"segscope-stamp-key-1"
OTHER_KEY = b"segscope-stamp-key-0"


def build(layout, fields: dict, extra: dict | None = None) -> bytearray:
    buf = bytearray(112)
    for name, off, size in layout:
        if name in fields:
            buf[off : off + size] = fields[name].to_bytes(size, "big")
    for off, val in (extra or {}).items():
        buf[off] = val
    return buf


def auth_vec(name, kind, rfc, layout, fields, key, extra=None, tamper=None, truncate=None, note=""):
    buf = build(layout, fields, extra)
    buf[96:112] = hmac.new(key, bytes(buf[:96]), hashlib.sha256).digest()[:16]
    if tamper is not None:
        buf[tamper] ^= 0x01
        fields = {n: int.from_bytes(buf[o : o + sz], "big") for n, o, sz in layout if n in fields}
    if truncate:
        buf = buf[:truncate]
    v = {
        "name": name,
        "kind": kind,
        "rfc": rfc,
        "hex": bytes(buf).hex(),
        "length": len(buf),
        "valid": truncate is None,
        "fields": fields,
        "key_hex": KEY.hex(),
        "hmac_ok": tamper is None and key == KEY and truncate is None,
    }
    if truncate is None:
        v["hmac_hex"] = bytes(buf[96:112]).hex()
    if note:
        v["note"] = note
    return v


ntp_sec = UNIX_2020 + NTP_UNIX
snd = {"seq": 7, "ts_sec": ntp_sec, "ts_frac": 0x80000000, "err_est": 0x8587, "ssid": 0x1234}
refl = {
    "seq": 9,
    "ts_sec": ntp_sec,
    "ts_frac": 0x80100000,
    "err_est": 0x8587,
    "ssid": 0x1234,
    "rx_sec": ntp_sec,
    "rx_frac": 0x80080000,
    "sender_seq": 7,
    "sender_ts_sec": ntp_sec,
    "sender_ts_frac": 0x80000000,
    "sender_err_est": 0x8587,
    "sender_ttl": 64,
}
refl_ptp = dict(
    refl,
    ts_sec=UNIX_2020 + 37,
    ts_frac=500_300_000,
    err_est=0x4587,
    rx_sec=UNIX_2020 + 37,
    rx_frac=500_200_000,
    sender_ts_sec=UNIX_2020 + 37,
    sender_ts_frac=500_000_000,
    sender_err_est=0x4587,
    sender_ttl=255,
)
auth = [
    auth_vec("sender_ntp", "sender", S422, SENDER_LAYOUT, snd, KEY),
    auth_vec("reflector_ntp", "reflector", S432, REFLECTOR_LAYOUT, refl, KEY),
    auth_vec("reflector_ptp", "reflector", S432, REFLECTOR_LAYOUT, refl_ptp, KEY),
    auth_vec(
        "sender_mbz_nonzero_ignored",
        "sender",
        S422 + "; MBZ ignored on receipt",
        SENDER_LAYOUT,
        snd,
        KEY,
        extra={30: 0xAA, 95: 0x55},
        note="non-zero MBZ octets 30 and 95 are ignored by the decoder but covered by the HMAC",
    ),
    auth_vec(
        "sender_tampered_seq",
        "sender",
        S422 + "; RFC 8762 §4.4",
        SENDER_LAYOUT,
        snd,
        KEY,
        tamper=3,
        note="octet 3 flipped after signing: integrity check fails",
    ),
    auth_vec(
        "reflector_tampered_hmac",
        "reflector",
        S432 + "; RFC 8762 §4.4",
        REFLECTOR_LAYOUT,
        refl,
        KEY,
        tamper=111,
        note="last HMAC octet flipped",
    ),
    auth_vec(
        "sender_other_key",
        "sender",
        S422 + "; RFC 8762 §4.4",
        SENDER_LAYOUT,
        snd,
        OTHER_KEY,
        note="signed with a key not in the table: integrity check fails",
    ),
    auth_vec("sender_truncated", "sender", S422, SENDER_LAYOUT, snd, KEY, truncate=111),
]

# --------------------------------------------------------------------- hmac
R4231 = "RFC 4231 §4"
hmac_vecs = [
    {
        "name": "rfc4231_case1",
        "rfc": R4231 + ".2",
        "key_hex": "0b" * 20,
        "data_hex": b"Hi There".hex(),
        "hmac_sha256": "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7",
    },
    {
        "name": "rfc4231_case2",
        "rfc": R4231 + ".3",
        "key_hex": b"Jefe".hex(),
        "data_hex": b"what do ya want for nothing?".hex(),
        "hmac_sha256": "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
    },
    {
        "name": "rfc4231_case3",
        "rfc": R4231 + ".4",
        "key_hex": "aa" * 20,
        "data_hex": "dd" * 50,
        "hmac_sha256": "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe",
    },
    {
        "name": "rfc4231_case4",
        "rfc": R4231 + ".5",
        "key_hex": bytes(range(1, 26)).hex(),
        "data_hex": "cd" * 50,
        "hmac_sha256": "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b",
    },
]
first = auth[0]
hmac_vecs.append(
    {
        "name": "stamp_sender_ntp_octets_0_95",
        "rfc": "RFC 8762 §4.4 (first 96 octets)",
        "key_hex": KEY.hex(),
        "data_hex": first["hex"][:192],
        "hmac_sha256": hmac.new(KEY, bytes.fromhex(first["hex"][:192]), hashlib.sha256).hexdigest(),
    }
)
for v in hmac_vecs:
    v["hmac_sha256_128"] = v["hmac_sha256"][:32]  # RFC 8762 §4.4: truncated to 128 bits

out = {
    "stamp_timestamp.json": {"element": "stamp_timestamp", "vectors": timestamps},
    "stamp_error_estimate.json": {
        "element": "stamp_error_estimate",
        "decode": ee_decode,
        "encode": ee_encode,
        "clock": ee_clock,
    },
    "stamp_auth_packet.json": {
        "element": "stamp_auth_packet",
        "layouts": {
            "sender": [{"field": n, "offset": o, "size": s, "rfc": S422} for n, o, s in SENDER_LAYOUT],
            "reflector": [{"field": n, "offset": o, "size": s, "rfc": S432} for n, o, s in REFLECTOR_LAYOUT],
        },
        "hmac_covers": {"offset": 0, "length": 96, "rfc": "RFC 8762 §4.4"},
        "vectors": auth,
    },
    "stamp_hmac.json": {"element": "stamp_hmac", "vectors": hmac_vecs},
}
for fname, doc in out.items():
    (HERE / fname).write_text(json.dumps(doc, indent=1) + "\n")
    print("wrote", fname)
