"""Independent oracle for the XDP STAMP programs: what must happen to one Ethernet frame.

Written from datapath/README.md ("Counters (every packet lands in exactly one)", "Reply
construction") and the RFCs, not from the BPF C code: the parser below is plain Python over
bytes. For each frame it names the one counter that must move and the XDP action, and it lists
the RFC defects the frame has even when the documented checks let it through (RFC 8200 §3
version and Payload Length, RFC 8200 §8.1 / RFC 768 UDP checksum, RFC 4291 §2.5.2/§2.5.3/§2.7
source address), so a test can tell "reflected as documented" from "reflected although malformed".
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from segscope_schemas.stamp_test_packet import ptp_to_ns  # the contract's 32-bit widening rule

ETH_LEN = 14
IP6_LEN = 40
L4_NO_SRH = ETH_LEN + IP6_LEN
STAMP_BASE_LEN = 44
STAMP_AUTH_BASE_LEN = 112
NTP_UNIX_OFFSET_S = 2_208_988_800  # 1900-01-01 to 1970-01-01
ETH_P_IPV6 = b"\x86\xdd"
EXT_HEADERS_NOT_PARSED = {0, 43, 44, 60}  # HBH, routing (a 2nd one), fragment, destination options
EE_Z = 0x4000
ZERO16 = bytes(16)
LOOPBACK16 = bytes(15) + b"\x01"

PASS, DROP, TX = "XDP_PASS", "XDP_DROP", "XDP_TX"
REFUSED = "refused"  # BPF_PROG_TEST_RUN itself rejects the frame (shorter than Ethernet)


@dataclass
class ReflectorSession:
    sids: list[bytes]  # return SIDs in visiting order
    ntp: bool = False  # NTP timestamps (Z = 0), else PTPv2 truncated (Z = 1)
    stateful: bool = False  # own sequence counter from 0, else the sender's number
    tlv_echo: bool = True  # TLVs after the base packet reflected unchanged, else user space
    authenticated: bool = False  # HMAC mode: always user space
    next_seq: int = 0  # stateful: the next reply's sequence number


@dataclass
class ReflectorConfig:
    port: int
    addresses: set[bytes]
    sessions: dict[tuple[bytes, int], ReflectorSession]  # (sender or ZERO16 = any, ssid) -> session
    err_est: int
    per_session_modes: bool = True  # the datapath knows TLV/authenticated sessions (per-session counters)


@dataclass
class CollectorConfig:
    port: int
    sessions: dict[int, tuple[int, bool]]  # ssid -> (sender UDP port, active)


@dataclass
class Transport:
    """Where the UDP header is, after the optional final SRH."""

    outcome: str  # ok | other_ext | bad_srh | srh_not_final | not_udp | short_udp
    srh_len: int = 0
    udp_off: int = 0


@dataclass
class Verdict:
    counter: str  # the one counter this frame must bump (REFUSED: none)
    action: str
    defects: list[str] = field(default_factory=list)  # RFC defects of a frame that is reflected/collected
    session: ReflectorSession | None = None  # reflector: the matched session
    transport: Transport | None = None


def ones_sum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def udp6_checksum_ok(src: bytes, dst: bytes, udp: bytes) -> bool:
    """RFC 8200 §8.1: pseudo-header {src, final dst, upper-layer length, 17} + datagram sums to 0xffff."""
    pseudo = src + dst + struct.pack("!I3xB", len(udp), 17)
    return ones_sum(pseudo + udp) == 0xFFFF


def udp6_checksum_is_partial(src: bytes, dst: bytes, udp: bytes) -> bool:
    """The checksum field holds only the folded pseudo-header sum: a sender whose checksum offload
    was never completed (a kernel socket behind a veth). The programs accept it (README)."""
    pseudo = src + dst + struct.pack("!I3xB", len(udp), 17)
    return struct.unpack_from("!H", udp, 6)[0] == ones_sum(pseudo)


def udp6_checksum(src: bytes, dst: bytes, udp_zero_csum: bytes) -> int:
    pseudo = src + dst + struct.pack("!I3xB", len(udp_zero_csum), 17)
    c = (~ones_sum(pseudo + udp_zero_csum)) & 0xFFFF
    return c or 0xFFFF


def parse_transport(f: bytes) -> Transport:
    """IPv6 next header -> optional SRH (type 4, must be final) -> UDP, as the README documents."""
    nexthdr, l4, srh_len = f[20], L4_NO_SRH, 0
    if nexthdr == 43:
        if len(f) < l4 + 8:
            return Transport("bad_srh")  # even the fixed routing header is cut off
        nh, hdrlen, rtype, segleft, last = f[l4 : l4 + 5]
        if rtype != 4:
            return Transport("other_ext")  # not an SRH: the stack's business
        srh_len = (hdrlen + 1) * 8
        # RFC 8754 §2: Last Entry indexes the segment list, which must fit in Hdr Ext Len;
        # Segments Left <= Last Entry
        if (last + 1) * 2 > hdrlen or segleft > last or l4 + srh_len > len(f):
            return Transport("bad_srh")
        # final also with Segments Left 1 when the destination already is segments[0]: the last
        # micro-SID of a NEXT-C-SID container shifted in (RFC 9800); the End would only copy it
        at_final = segleft == 1 and f[38:54] == f[l4 + 8 : l4 + 24]
        if segleft != 0 and not at_final:
            return Transport("srh_not_final")
        nexthdr, l4 = nh, l4 + srh_len
    if nexthdr in EXT_HEADERS_NOT_PARSED:
        return Transport("other_ext")
    if nexthdr != 17:
        return Transport("not_udp")
    if len(f) < l4 + 8:
        return Transport("short_udp")
    return Transport("ok", srh_len, l4)


UDP_CSUM_MAX_LEN = 1500  # longest UDP datagram whose checksum the programs verify (README)


def ipv6_header_ok(f: bytes) -> bool:
    """RFC 8200 §3: version 6, Payload Length within the frame (more bytes after it = padding, allowed)."""
    plen = struct.unpack_from("!H", f, 18)[0]
    return f[14] >> 4 == 6 and L4_NO_SRH + plen <= len(f)


def stamp_payload_ok(f: bytes, t: Transport) -> bool:
    """UDP length within the IPv6 payload (after the SRH) and at least 8 + a 44-byte STAMP base packet."""
    udp_len = struct.unpack_from("!H", f, t.udp_off + 4)[0]
    plen = struct.unpack_from("!H", f, 18)[0]
    return udp_len >= 8 + STAMP_BASE_LEN and t.srh_len + udp_len <= plen


def src_ok(src: bytes) -> bool:
    """RFC 4291: not multicast (ff00::/8), loopback (::1) or unspecified (::)."""
    return src[0] != 0xFF and src not in (ZERO16, LOOPBACK16)


def cheap_checks(f: bytes, t: Transport) -> str | None:
    """The README's checks of a STAMP packet/reply after the port, in order: the drop counter, or None."""
    if not ipv6_header_ok(f):
        return "drop_malformed_ipv6"
    if not stamp_payload_ok(f, t):
        return "drop_malformed_short"
    if not src_ok(f[22:38]):
        return "drop_malformed_src_addr"
    if f[t.udp_off + 6 : t.udp_off + 8] == b"\0\0":
        return "drop_malformed_udp_csum"
    return None


def full_checksum_check(f: bytes, t: Transport) -> str | None:
    """Before reflecting / collecting: too long to verify (left to the stack), wrong checksum,
    "partial" (the pseudo-header sum only, accepted), or None (verifies)."""
    udp_len = struct.unpack_from("!H", f, t.udp_off + 4)[0]
    if udp_len > UDP_CSUM_MAX_LEN:
        return "pass_too_long_to_verify"
    udp = f[t.udp_off : t.udp_off + udp_len]
    if udp6_checksum_ok(f[22:38], f[38:54], udp):
        return None
    if udp6_checksum_is_partial(f[22:38], f[38:54], udp):
        return "partial"
    return "drop_malformed_udp_csum"


def rfc_defects(f: bytes, t: Transport) -> list[str]:
    """What a receiving IPv6/UDP stack must reject in a frame the documented checks accept."""
    defects = []
    src, dst = f[22:38], f[38:54]
    plen = struct.unpack_from("!H", f, 18)[0]
    udp_len = struct.unpack_from("!H", f, t.udp_off + 4)[0]
    if f[14] >> 4 != 6:
        defects.append("ip_version")  # RFC 8200 §3
    if L4_NO_SRH + plen > len(f):
        defects.append("ip_payload_len_beyond_frame")  # RFC 8200 §3: truncated packet
    elif plen < t.srh_len + udp_len:
        defects.append("ip_payload_len_short")  # UDP datagram longer than the IPv6 payload
    if src[0] == 0xFF:
        defects.append("ip_src_multicast")  # RFC 4291 §2.7
    elif src == LOOPBACK16:
        defects.append("ip_src_loopback")  # RFC 4291 §2.5.3
    elif src == ZERO16:
        defects.append("ip_src_unspecified")  # RFC 4291 §2.5.2: never a destination
    udp = f[t.udp_off : t.udp_off + udp_len]
    if udp[6:8] == b"\0\0":
        defects.append("udp_checksum_zero")  # RFC 8200 §8.1: mandatory in IPv6
    elif udp6_checksum_is_partial(src, dst, udp) and not udp6_checksum_ok(src, dst, udp):
        defects.append("udp_checksum_partial")  # offload never completed: payload unverified
    elif not udp6_checksum_ok(src, dst, udp):
        defects.append("udp_checksum")
    return defects


def reflector_verdict(f: bytes, cfg: ReflectorConfig) -> Verdict:
    if len(f) < ETH_LEN:
        return Verdict(REFUSED, REFUSED)
    if len(f) < L4_NO_SRH or f[12:14] != ETH_P_IPV6:
        return Verdict("pass_not_ipv6", PASS)
    if f[38:54] not in cfg.addresses:
        return Verdict("pass_not_local_addr", PASS)
    t = parse_transport(f)
    early = {
        "other_ext": ("pass_other_ext_header", PASS),
        "bad_srh": ("drop_malformed_srh", DROP),
        "srh_not_final": ("pass_srh_not_final", PASS),
        "not_udp": ("pass_not_udp", PASS),
        "short_udp": ("drop_malformed_short", DROP),
    }
    if t.outcome in early:
        return Verdict(*early[t.outcome], transport=t)
    if struct.unpack_from("!H", f, t.udp_off + 2)[0] != cfg.port:
        return Verdict("pass_other_port", PASS, transport=t)
    bad = cheap_checks(f, t)
    if bad:
        return Verdict(bad, DROP, transport=t)
    payload = t.udp_off + 8
    payload_len = struct.unpack_from("!H", f, t.udp_off + 4)[0] - 8
    ssid14 = struct.unpack_from("!H", f, payload + 14)[0]
    sess = _session(cfg, f[22:38], ssid14)
    # RFC 8762 §4.2.2: an authenticated test packet (>= 112 bytes) has its SSID at offset 26 and
    # zeros at 14-15; asked when nothing matched at 14, or only SSID 0 (the base senders' session)
    if (sess is None or ssid14 == 0) and cfg.per_session_modes and payload_len >= STAMP_AUTH_BASE_LEN:
        auth = _session(cfg, f[22:38], struct.unpack_from("!H", f, payload + 26)[0])
        if auth is not None and auth.authenticated:
            return Verdict("pass_authenticated_to_userspace", PASS, transport=t)
    if sess is None:
        return Verdict("pass_unknown_session", PASS, transport=t)
    if cfg.per_session_modes and sess.authenticated:
        return Verdict("pass_authenticated_to_userspace", PASS, transport=t)
    if cfg.per_session_modes and payload_len > STAMP_BASE_LEN and not sess.tlv_echo:
        return Verdict("pass_tlvs_to_userspace", PASS, transport=t)
    bad = full_checksum_check(f, t)
    if bad == "partial":
        return Verdict("reflected_partial_csum", TX, rfc_defects(f, t), sess, t)
    if bad:
        return Verdict(bad, PASS if bad.startswith("pass_") else DROP, transport=t)
    return Verdict("reflected", TX, rfc_defects(f, t), sess, t)


def _session(cfg: ReflectorConfig, sender: bytes, ssid: int) -> ReflectorSession | None:
    """{sender, ssid} first, then the any-sender session {::, ssid}."""
    sess = cfg.sessions.get((sender, ssid))
    return sess if sess is not None else cfg.sessions.get((ZERO16, ssid))


def collector_verdict(f: bytes, cfg: CollectorConfig) -> Verdict:
    if len(f) < ETH_LEN:
        return Verdict(REFUSED, REFUSED)
    if len(f) < L4_NO_SRH or f[12:14] != ETH_P_IPV6:
        return Verdict("pass_not_ipv6", PASS)
    t = parse_transport(f)
    early = {
        "other_ext": ("pass_other_ext_header", PASS),
        "bad_srh": ("drop_malformed_srh", DROP),
        "srh_not_final": ("pass_srh_not_final", PASS),
        "not_udp": ("pass_not_udp", PASS),
        "short_udp": ("drop_malformed_short", DROP),
    }
    if t.outcome in early:
        return Verdict(*early[t.outcome], transport=t)
    sport, dport = struct.unpack_from("!HH", f, t.udp_off)
    if sport != cfg.port:
        return Verdict("pass_not_stamp_reply", PASS, transport=t)
    bad = cheap_checks(f, t)
    if bad:
        return Verdict(bad, DROP, transport=t)
    ssid = struct.unpack_from("!H", f, t.udp_off + 8 + 14)[0]
    sess = cfg.sessions.get(ssid)
    if sess is None:
        return Verdict("pass_unknown_session", PASS, transport=t)
    if not sess[1]:
        return Verdict("pass_inactive_session", PASS, transport=t)
    if dport != sess[0]:
        return Verdict("pass_port_mismatch", PASS, transport=t)
    bad = full_checksum_check(f, t)
    if bad == "partial":
        return Verdict("collected_partial_csum", DROP, rfc_defects(f, t), transport=t)
    if bad:
        return Verdict(bad, PASS if bad.startswith("pass_") else DROP, transport=t)
    return Verdict("collected", DROP, rfc_defects(f, t), transport=t)


# ---- checks of what came out -------------------------------------------------------------

NS = 1_000_000_000


def reply_problems(
    f: bytes,
    out: bytes,
    v: Verdict,
    cfg: ReflectorConfig,
    tai_before: int,
    tai_after: int,
    utc_before: int,
    utc_after: int,
) -> list[str]:
    """RFC 8762 §4.3.1 reflector packet + the README's reply construction, checked byte by byte."""
    p: list[str] = []
    t = v.transport
    sess = v.session
    sids = sess.sids
    n = len(sids)
    new_srh_len = 8 + 16 * (n + 1) if n else 0
    in_src, in_dst = f[22:38], f[38:54]
    if len(out) != len(f) - t.srh_len + new_srh_len:
        return [f"reply length {len(out)}, expected {len(f) - t.srh_len + new_srh_len}"]
    if out[0:6] != f[6:12] or out[6:12] != f[0:6] or out[12:14] != ETH_P_IPV6:
        p.append("ethernet addresses not swapped")
    if out[14:18] != f[14:18]:
        p.append("version/traffic class/flow label changed")
    plen_in = struct.unpack_from("!H", f, 18)[0]
    plen_out, nh_out, hlim_out = struct.unpack_from("!HBB", out, 18)
    if plen_out != (plen_in - t.srh_len + new_srh_len) & 0xFFFF:
        p.append(f"payload_len {plen_out} for {plen_in} in")
    # bytes after the IPv6 payload (link-layer padding) may come back, but no more and no fewer
    if not v.defects and len(out) - L4_NO_SRH - plen_out != len(f) - L4_NO_SRH - plen_in:
        p.append(f"payload_len {plen_out} but {len(out) - L4_NO_SRH} bytes follow ({plen_in}/{len(f) - L4_NO_SRH} in)")
    if nh_out != (43 if n else 17) or hlim_out != 255:
        p.append(f"next header {nh_out} / hop limit {hlim_out}")
    if out[22:38] != in_dst:
        p.append("source is not the reflector address")
    if out[38:54] != (sids[0] if n else in_src):
        p.append("destination is not the first return SID / the sender")
    if n:
        srh = out[54 : 54 + new_srh_len]
        if srh[:8] != bytes([17, 2 * (n + 1), 4, n, n, 0, 0, 0]):
            p.append(f"SRH header {srh[:8].hex()}")
        segs = [srh[8 + 16 * i : 24 + 16 * i] for i in range(n + 1)]
        if segs != [in_src] + sids[::-1]:
            p.append("SRH segment list is not [sender] + return SIDs reversed")
    u_in, u_out = t.udp_off, L4_NO_SRH + new_srh_len
    sport, dport, ulen, csum = struct.unpack_from("!HHHH", out, u_out)
    in_sport, in_dport, in_ulen = struct.unpack_from("!HHH", f, u_in)
    if (sport, dport, ulen) != (in_dport, in_sport, in_ulen):
        p.append("UDP ports not swapped or length changed")
    if not ({"udp_checksum", "udp_checksum_zero"} & set(v.defects)):
        if csum == 0 or not udp6_checksum_ok(out[22:38], in_src, out[u_out : u_out + ulen]):
            p.append(f"UDP checksum {csum:#06x} does not verify")
    sent, reply = f[u_in + 8 : u_in + 8 + 44], out[u_out + 8 : u_out + 8 + 44]
    (seq, t3s, t3n, ee, ssid, t2s, t2n, sseq, sts, stn, see, mbz1, ttl, mbz2) = struct.unpack("!IIIHHIIIIIHHB3s", reply)
    s_seq, s_ts, s_ee, s_ssid = struct.unpack_from("!I8sHH", sent)
    want_seq = sess.next_seq if sess.stateful else s_seq
    if seq != want_seq or sseq != s_seq:
        p.append(f"reflector seq {seq} / sender seq {sseq}, expected {want_seq} / {s_seq}")
    if sent[4:12] != reply[28:36] or see != s_ee or ssid != s_ssid:
        p.append("sender timestamp / error estimate / SSID not copied")
    want_ee = (cfg.err_est & ~EE_Z) if sess.ntp else (cfg.err_est | EE_Z)
    if ee != want_ee:
        p.append(f"error estimate {ee:#06x}, expected {want_ee:#06x}")
    if ttl != f[21] or mbz1 != 0 or mbz2 != bytes(3):
        p.append("Ses-Sender TTL / MBZ fields")
    if sess.ntp:  # RFC 5905 §6 era 0: seconds since 1900 (UTC), fraction in 2^-32 s
        t2 = (t2s - NTP_UNIX_OFFSET_S) * NS + (t2n * NS >> 32)
        t3 = (t3s - NTP_UNIX_OFFSET_S) * NS + (t3n * NS >> 32)
        lo, hi, clock = utc_before, utc_after, "CLOCK_REALTIME"
    elif t2n >= NS or t3n >= NS:
        return p + ["PTP timestamp nanoseconds >= 1e9"]
    else:
        t2, t3 = ptp_to_ns(t2s, t2n, tai_before), ptp_to_ns(t3s, t3n, tai_before)
        lo, hi, clock = tai_before, tai_after, "CLOCK_TAI"
    if not lo - 2 * 10**6 <= t2 <= t3 + 1 <= hi + 2 * 10**6:
        p.append(f"T2 {t2} / T3 {t3} outside the run [{lo}, {hi}] ({clock})")
    if out[u_out + 8 + 44 :] != f[u_in + 8 + 44 :]:
        p.append("bytes after the base packet (TLVs) changed")
    return p


def ntp_to_tai_ns(sec: int, frac: int, tai_utc_offset_s: int, ref_tai_ns: int) -> int:
    """NTP (RFC 5905 §6: UTC seconds since 1900 + 2^-32 s) -> TAI ns as the README documents it:
    the 32-bit seconds take the era of the reference time (T4) within half an era, the fraction
    is rounded to the nearest nanosecond; unsigned 64-bit arithmetic like the program's."""
    m = (1 << 64) - 1
    ref_sec = (ref_tai_ns // NS - tai_utc_offset_s + NTP_UNIX_OFFSET_S) & m
    full = (ref_sec & ~0xFFFFFFFF) | sec
    ns = (frac * NS + 0x80000000) >> 32
    if full > ref_sec + 0x80000000 and full >= 1 << 32:
        full -= 1 << 32
    elif full + 0x80000000 < ref_sec:
        full += 1 << 32
    return ((full - NTP_UNIX_OFFSET_S + tai_utc_offset_s) * NS + ns) & m


def record_problems(f: bytes, rec, v: Verdict, tai_before: int, tai_after: int, tai_utc_offset_s: int = 0) -> list[str]:
    """struct stamp_record (schemas/c/stamp_record.h) from one collected reply. T1 is in the
    session's format (PTP here), T2 and T3 in the one the reply's Error Estimate Z bit names
    (RFC 8762 §4.3.1): Z = 0 NTP (record flag 0x10), Z = 1 PTPv2."""
    p: list[str] = []
    t = v.transport
    pl = f[t.udp_off + 8 : t.udp_off + 8 + 44]
    (seq, t3s, t3n, ee, ssid, t2s, t2n, sseq, sts, stn, see, _mbz1, ttl, _mbz2) = struct.unpack("!IIIHHIIIIIHHB3s", pl)
    t4 = int(rec["t4_ns"])
    if not tai_before <= t4 <= tai_after:
        p.append(f"t4 {t4} outside the run [{tai_before}, {tai_after}]")
    refl_ntp = not ee & EE_Z
    if refl_ntp:
        t2, t3 = ntp_to_tai_ns(t2s, t2n, tai_utc_offset_s, t4), ntp_to_tai_ns(t3s, t3n, tai_utc_offset_s, t4)
    else:
        t2, t3 = ptp_to_ns(t2s, t2n, t4), ptp_to_ns(t3s, t3n, t4)
    want = dict(
        t1_ns=ptp_to_ns(sts, stn, t4),
        t2_ns=t2,
        t3_ns=t3,
        sender_seq=sseq,
        reflector_seq=seq,
        ssid=ssid,
        sender_err_est=see,
        reflector_err_est=ee,
        sender_ttl=ttl,
        reply_hop_limit=f[21],
        flags=(2 if t.srh_len else 0) | (0x10 if refl_ntp else 0),
        reserved=0,
    )
    for k, w in want.items():
        if int(rec[k]) != w:
            p.append(f"record {k} = {int(rec[k])}, expected {w}")
    return p
