"""User-space STAMP Session-Sender and collector: test packets out, stamp_record per reply.

Sends like collectors/stamp_sender.c (UDP socket bound to [src]:sport, sticky IPV6_RTHDR type-4
SRH, absolute-deadline pacing, T1 = CLOCK_TAI right before sendto) and receives the replies on
the same socket: T4 = kernel receive time (SO_TIMESTAMPNS + TAI offset). Each reply becomes the
same `struct stamp_record` the XDP collector writes (STAMP_RECORD_DTYPE).

Modes (seed 000's "delay measurement mode", RFC 8762 §4):
  two-way   (default) T1..T4 from the exchange; the processor derives forward, reverse, round trip.
  one-way   the forward path only: records carry T1 and T2 (t3_ns = t4_ns = 0) and the flag
            STAMP_RECORD_F_ONE_WAY; the reply only transports T2 back and may take any path
            (no return SID list needed). Forward delay needs synchronised clocks (Error Estimate S).
  loopback  the Session-Sender is its own reflector: the SID list leads back to `--src`
            (e.g. A -> R(End) -> A), the socket receives its own test packet; records carry
            T1 and T4 only (t2_ns = t3_ns = 0), flag STAMP_RECORD_F_LOOPBACK; no clock sync needed.

Every received datagram lands in exactly one counter: records | malformed_reply | auth_failed_reply |
foreign_ssid | unknown_seq (a sequence number this run never sent) | duplicate (a second reply to one seq).
Authenticated mode (--auth-key-file): 112-byte packets (RFC 8762 §4.2.2/§4.3.2), HMAC signed after T1,
replies verified (failures counted, no record).
"""

from __future__ import annotations

import json
import select
import signal
import socket
import struct
import sys
import time
from typing import IO

import numpy as np

from segscope_schemas import stamp_test_packet as tp
from segscope_schemas import stamp_tlv as T
from segscope_schemas import stamp_tlv_hmac
from segscope_schemas.stamp_auth_packet import AUTH_LEN, AuthReflectorPacket, AuthSenderPacket
from segscope_schemas.stamp_hmac import HmacError
from segscope_schemas.stamp_record import (
    STAMP_RECORD_DTYPE,
    STAMP_RECORD_F_NTP,
    STAMP_RECORD_F_REFLECTOR_NTP,
    STAMP_RECORD_F_SRH,
)

from . import codec
from .auth import KeyRing
from .clock import TimestampFormat, clock_state, decode_ts, encode_ts, error_estimate, format_of, tai_ns
from .kafka_out import KafkaOut, counters_line, escape_tag
from .netutil import ANC_BUFSIZE, enable_rx_ancillary, parse_ancillary, srh_option

# Additive record flags (schemas/c/stamp_record.h has the same values).
try:
    from segscope_schemas.stamp_record import STAMP_RECORD_F_LOOPBACK, STAMP_RECORD_F_ONE_WAY
except ImportError:  # pragma: no cover - older schema checkout
    STAMP_RECORD_F_ONE_WAY, STAMP_RECORD_F_LOOPBACK = 0x4, 0x8

MODES = ("two-way", "one-way", "loopback")
NS = 1_000_000_000


class Sender:
    def __init__(
        self,
        src: str,
        dst: str,
        ssid: int,
        segs: list[str],
        sport: int,
        dport: int,
        fmt: TimestampFormat,
        mode: str,
        padding: int = 0,
        tlvs: bytes = b"",
        keys: KeyRing | None = None,
    ):
        if mode not in MODES:
            raise ValueError(f"--mode: expected one of {', '.join(MODES)}, got {mode!r}")
        self.src, self.dst, self.ssid, self.mode, self.fmt = src, dst, ssid, mode, fmt
        self.dport = dport
        self.sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        enable_rx_ancillary(self.sock, rthdr=True)
        self.sock.bind((src, sport))
        if segs:
            self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RTHDR, srh_option(dst, segs))
        self.sock.setblocking(False)
        self.keys = keys  # authenticated mode (RFC 8762 §4.2.2) when set
        self.base_len = AUTH_LEN if keys else tp.STAMP_BASE_LEN
        self.payload = bytearray(self.base_len + padding) + tlvs
        # RFC 8972 §4.8: in authenticated mode an HMAC TLV covers the seq and the TLVs before it
        self.hmac_tlv_off = None
        if keys and tlvs:
            for t in T.iter_tlvs(bytes(self.payload), self.base_len + padding):
                if t.type == T.TYPE_HMAC and t.length == 16:
                    self.hmac_tlv_off = t.offset
                    break
        self.tlv_off = self.base_len + padding
        st = clock_state()
        self.tai_offset_s = st.tai_offset_s
        self.err_est = error_estimate(st, fmt)
        self.sent_seqs = 0  # seqs 0..sent_seqs-1 were attempted
        self.seen = bytearray()  # 1 per seq already turned into a record
        self.records: list[tuple] = []
        self.counters = {
            "sent": 0,
            "send_errors": 0,
            "received": 0,
            "records": 0,
            "malformed_reply": 0,
            "auth_failed_reply": 0,
            "foreign_ssid": 0,
            "unknown_seq": 0,
            "duplicate": 0,
            "tlv_u_flag_replies": 0,
            "tlv_m_flag_replies": 0,
            "tlv_i_flag_replies": 0,
            "tlv_hmac_bad_replies": 0,
            "no_kernel_timestamp": 0,
        }

    # -- send -----------------------------------------------------------------

    def send_one(self) -> None:
        seq = self.sent_seqs
        self.sent_seqs += 1
        self.seen.append(0)
        struct.pack_into("!I", self.payload, 0, seq)
        ts_off = 16 if self.keys else 4  # Timestamp, then Error Estimate and SSID
        struct.pack_into("!HH", self.payload, ts_off + 8, self.err_est, self.ssid)
        t1 = tai_ns()
        sec, frac = encode_ts(t1, self.fmt, self.tai_offset_s)
        struct.pack_into("!II", self.payload, ts_off, sec, frac)
        if self.keys:
            try:
                self.keys.sign_packet(self.payload, t1)
                if self.hmac_tlv_off is not None:
                    text = stamp_tlv_hmac.covered_text(self.payload, self.tlv_off, self.hmac_tlv_off)
                    self.payload[self.hmac_tlv_off + 4 : self.hmac_tlv_off + 20] = self.keys.sign(text, t1)
            except HmacError as exc:
                if self.counters["send_errors"] == 0:
                    print(f"ustamp sender: seq {seq}: cannot sign: {exc}", file=sys.stderr)
                self.counters["send_errors"] += 1
                return
        try:
            self.sock.sendto(self.payload, (self.dst, self.dport, 0, 0))
            self.counters["sent"] += 1
        except OSError as exc:
            if self.counters["send_errors"] == 0:
                print(f"ustamp sender: sendto seq {seq}: {exc}", file=sys.stderr)
            self.counters["send_errors"] += 1

    # -- receive --------------------------------------------------------------

    def drain(self) -> None:
        while True:
            try:
                data, anc, _flags, _peer = self.sock.recvmsg(65535, ANC_BUFSIZE)
            except BlockingIOError:
                return
            self.counters["received"] += 1
            self.counters[self._collect(data, anc)] += 1

    def _collect(self, data: bytes, anc) -> str:
        meta = parse_ancillary(anc)
        if meta.rx_realtime_ns is None:
            self.counters["no_kernel_timestamp"] += 1
            t4 = tai_ns()
        else:
            t4 = meta.rx_realtime_ns + self.tai_offset_s * NS
        if len(data) < self.base_len:
            return "malformed_reply"
        if self.keys and not self.keys.verify_packet(data, tai_ns()):
            return "auth_failed_reply"  # RFC 8762 §4.4: discard
        if self.mode == "loopback":
            pkt = (AuthSenderPacket if self.keys else tp.SenderPacket).decode(data)
            seq, ssid = pkt.seq, pkt.ssid
        else:
            refl = (AuthReflectorPacket if self.keys else tp.ReflectorPacket).decode(data)
            seq, ssid = refl.sender_seq, refl.ssid
        if ssid != self.ssid:
            return "foreign_ssid"
        if seq >= self.sent_seqs:
            return "unknown_seq"
        if self.seen[seq]:
            return "duplicate"
        self.seen[seq] = 1
        flags = (STAMP_RECORD_F_NTP if self.fmt == TimestampFormat.NTP else 0) | (
            STAMP_RECORD_F_SRH if meta.rthdr else 0
        )
        hop = meta.hop_limit if meta.hop_limit is not None else 0
        if self.mode == "loopback":
            t1 = decode_ts(pkt.ts_sec, pkt.ts_frac, self.fmt, self.tai_offset_s, t4)
            rec = (
                t1,
                0,
                0,
                t4,
                seq,
                0,
                ssid,
                pkt.err_est,
                0,
                hop,
                hop,
                meta.ifindex,
                flags | STAMP_RECORD_F_LOOPBACK,
                0,
            )
        else:
            rfmt = format_of(refl.err_est)
            if rfmt == TimestampFormat.NTP:  # the reflector's own format (its Z bit), RFC 8762 §4.3.1
                flags |= STAMP_RECORD_F_REFLECTOR_NTP
            t1 = decode_ts(refl.sender_ts_sec, refl.sender_ts_frac, self.fmt, self.tai_offset_s, t4)
            t2 = decode_ts(refl.rx_sec, refl.rx_frac, rfmt, self.tai_offset_s, t4)
            t3 = decode_ts(refl.ts_sec, refl.ts_frac, rfmt, self.tai_offset_s, t4)
            if self.mode == "one-way":
                t3 = t4 = 0
                flags |= STAMP_RECORD_F_ONE_WAY
            rec = (
                t1,
                t2,
                t3,
                t4,
                seq,
                refl.seq,
                ssid,
                refl.sender_err_est,
                refl.err_est,
                refl.sender_ttl,
                hop,
                meta.ifindex,
                flags,
                0,
            )
            if len(data) > self.base_len:
                tlvs, _tail = codec.split_tlvs(data[self.base_len :])
                if (
                    self.hmac_tlv_off is not None
                    and len(data) >= self.hmac_tlv_off + 20
                    and not self.keys.verify(
                        stamp_tlv_hmac.covered_text(data, self.tlv_off, self.hmac_tlv_off),
                        data[self.hmac_tlv_off + 4 : self.hmac_tlv_off + 20],
                        tai_ns(),
                    )
                ):
                    self.counters["tlv_hmac_bad_replies"] += 1
                for flag, name in (
                    (codec.TLV_F_U, "tlv_u_flag_replies"),
                    (codec.TLV_F_M, "tlv_m_flag_replies"),
                    (codec.TLV_F_I, "tlv_i_flag_replies"),
                ):
                    if any(t.flags & flag for t in tlvs) or (flag == codec.TLV_F_M and _tail):
                        self.counters[name] += 1
        self.records.append(rec)
        return "records"

    def take_records(self) -> np.ndarray:
        recs = np.array(self.records, dtype=STAMP_RECORD_DTYPE)
        self.records.clear()
        return recs

    def metrics_line(self, node: str) -> str:
        """`segscope_datapath,node=..,program=ustamp_sender,ssid=..` with the counters (metrics topic)."""
        c = {k: v for k, v in self.summary().items() if isinstance(v, int)}
        c.pop("ssid", None)
        return counters_line(f"segscope_datapath,node={escape_tag(node)},program=ustamp_sender,ssid={self.ssid}", c)

    def summary(self) -> dict:
        c = dict(self.counters)
        c["lost"] = self.sent_seqs - sum(self.seen)
        return {"ssid": self.ssid, "mode": self.mode, "format": self.fmt.value, "error_estimate": self.err_est, **c}


def record_json(rec) -> str:
    return json.dumps({name: int(rec[name]) for name in STAMP_RECORD_DTYPE.names})


def run(
    sender: Sender,
    rate_pps: float,
    count: int | None,
    duration_s: float | None,
    wait_s: float,
    out: IO[str] | None,
    kafka: KafkaOut | None,
    batch_interval_s: float,
) -> dict:
    stop = False

    def on_stop(_sig, _frm):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGTERM, on_stop)
    interval = 1.0 / rate_pps
    start = time.monotonic()
    end = start + duration_s if duration_s is not None else float("inf")
    next_flush = start + batch_interval_s
    next_stats = start + 1.0
    i = 0
    sending = True
    drain_until = None

    def flush_records() -> None:
        recs = sender.take_records()
        if out is not None:
            for r in recs:
                out.write(record_json(r) + "\n")
            out.flush()
        if kafka is not None:
            kafka.produce_records(sender.ssid, recs)

    while not stop:
        now = time.monotonic()
        if sending:
            deadline = start + i * interval
            if (count is not None and i >= count) or deadline >= end:
                sending = False
                drain_until = now + wait_s
                continue
            if now >= deadline:
                sender.send_one()
                i += 1
                continue
            wake = deadline
        else:
            if now >= drain_until or sender.sent_seqs == sum(sender.seen):
                break
            wake = drain_until
        readable, _, _ = select.select([sender.sock], [], [], max(0.0, min(wake, next_flush) - now))
        if readable:
            sender.drain()
        if time.monotonic() >= next_flush:
            next_flush += batch_interval_s
            flush_records()
            if kafka is not None and time.monotonic() >= next_stats:
                next_stats += 1.0
                kafka.produce_metrics(sender.metrics_line(kafka.node))
    sender.drain()
    flush_records()
    if kafka is not None:
        kafka.produce_metrics(sender.metrics_line(kafka.node))
    result = sender.summary()
    result["duration_s"] = round(time.monotonic() - start, 6)
    result["rate_pps"] = rate_pps
    if kafka is not None:
        left = kafka.flush()
        result["kafka"] = dict(kafka.counters, undelivered=left)
    return result
