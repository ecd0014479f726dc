"""User-space STAMP Session-Reflector (RFC 8762 §4.3, RFC 8972 SSID + TLVs) on a UDP socket.

One socket on [address]:port (default [::]:862). Per received datagram:
  T2 = kernel receive time (SO_TIMESTAMPNS, CLOCK_REALTIME + adjtimex TAI offset),
  Ses-Sender TTL = IPV6_HOPLIMIT, our address = IPV6_PKTINFO (used as the reply's source),
  session = (sender, ssid) or (::, ssid); none -> counted `unknown_session`, no reply.
Reply: 44-byte reflector packet + the reflected TLV area, hop limit 255, an IPV6_RTHDR type-4 SRH
when the session has return SIDs (sticky
option, see _install_srh; else plain address swap), T3 written right before sendmsg().

Every received datagram lands in exactly one outcome counter:
  reflected | unknown_session | malformed_short | no_reply_requested | auth_failed | auth_no_key |
  send_error | internal_error (an exception in ustamp itself: first traceback on stderr; 0 in the fuzz)
(no_reply_requested: an RFC 9503 Return Path TLV with Control Code "No Reply Requested";
auth_failed: an authenticated session's packet whose HMAC no valid key reproduces, or an
unauthenticated packet for it; auth_no_key: no key valid for signing the reply).
Authenticated sessions (RFC 8762 §4.2.2/§4.3.2): 112-byte packets, SSID at octet 26, HMAC over
octets 0-95 verified on receipt and computed over the reply after T3; HMAC TLV re-signed.
TLV counters (tlv_unrecognized, tlv_malformed, tlv_handled, tlv_unsupported) count TLVs, not
packets; return_path_from_tlv counts replies sent where a Return Path TLV said (ustamp/tlvs.py).
"""

from __future__ import annotations

import json
import select
import signal
import socket
import struct
import sys
import time
import traceback

from segscope_schemas import stamp_tlv_hmac
from segscope_schemas.stamp_auth_packet import AUTH_LEN
from segscope_schemas.stamp_hmac import HmacError

from . import codec, tlvs
from .auth import AUTH_SSID_OFF
from .clock import TimestampFormat, clock_state, encode_ts, error_estimate, tai_ns
from .kafka_out import KafkaOut, counters_line, escape_tag
from .netutil import (
    ANC_BUFSIZE,
    RxMeta,
    enable_rx_ancillary,
    hoplimit_cmsg,
    parse_ancillary,
    pktinfo_cmsg,
    socket_drops,
    srh_option,
    tclass_cmsg,
)
from .sessions import Session, SessionTable

OUTCOMES = (
    "reflected",
    "unknown_session",
    "malformed_short",
    "no_reply_requested",
    "auth_failed",
    "auth_no_key",
    "send_error",
    "internal_error",
)
REPLY_HOP_LIMIT = 255
MAX_DATAGRAM = 65535


class Reflector:
    def __init__(
        self,
        sessions: SessionTable,
        address: str = "::",
        port: int = 862,
        node: str = "",
        kafka: KafkaOut | None = None,
        load_sessions=None,
        reuse_port: bool = False,
    ):
        self.sessions = sessions
        self.load_sessions = load_sessions  # () -> SessionTable, for SIGHUP (None: keys only)
        self.node = node
        self.kafka = kafka
        self.counters = {
            "received": 0,
            **{k: 0 for k in OUTCOMES},
            "no_kernel_timestamp": 0,
            "tlv_unrecognized": 0,
            "tlv_malformed": 0,
            "tlv_handled": 0,
            "tlv_unsupported": 0,
            "tlv_integrity_failed": 0,
            "return_path_from_tlv": 0,
        }
        self.sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:  # the fast engine's group (fast.py): this socket only sends
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        enable_rx_ancillary(self.sock)
        self.sock.bind((address, port))
        self.port = self.sock.getsockname()[1]
        self.has_auth = sessions.any_authenticated
        self._installed_sids: tuple[str, ...] = ()
        self.refresh_clock()

    def refresh_clock(self) -> None:
        """The error estimates and TAI offset change slowly: read adjtimex once per interval."""
        st = clock_state()
        self.tai_offset_s = st.tai_offset_s
        self.clock_synced = st.synced
        self.err_est = {fmt: error_estimate(st, fmt) for fmt in TimestampFormat}

    # -- one datagram -------------------------------------------------------

    def handle(self, payload: bytes, ancdata, peer) -> str:
        return self.handle_meta(payload, parse_ancillary(ancdata), peer)

    def handle_meta(self, payload: bytes, meta: RxMeta, peer) -> str:
        """One datagram with its receive metadata; returns its outcome counter."""
        if meta.rx_realtime_ns is not None:
            t2 = meta.rx_realtime_ns + self.tai_offset_s * 1_000_000_000
        else:  # no kernel stamp (should not happen): read the clock, count it
            self.counters["no_kernel_timestamp"] += 1
            t2 = tai_ns()
        sender_addr, sender_port = peer[0], peer[1]
        if self.has_auth and len(payload) >= AUTH_LEN:
            # authenticated base packet (RFC 8762 §4.2.2): SSID at octet 26, HMAC over octets 0-95
            session = self.sessions.lookup(sender_addr, struct.unpack_from("!H", payload, AUTH_SSID_OFF)[0])
            if session is not None and session.authenticated:
                if not session.keys.verify_packet(payload, tai_ns()):
                    return "auth_failed"  # RFC 8762 §4.4: discard, no reply
                test = codec.decode_auth_sender(payload)
                return self._reply(session, test, payload, t2, meta, sender_addr, sender_port, peer[3])
        try:
            test = codec.decode_sender(payload)
        except codec.Malformed as exc:
            return exc.reason
        session = self.sessions.lookup(sender_addr, test.packet.ssid)
        if session is None:
            return "unknown_session"
        if session.authenticated:  # an unauthenticated packet for an authenticated session
            return "auth_failed"
        return self._reply(session, test, payload, t2, meta, sender_addr, sender_port, peer[3])

    def _reply(
        self,
        session: Session,
        test: codec.SenderTest,
        payload: bytes,
        t2: int,
        meta,
        sender_addr: str,
        sender_port: int,
        scope_id: int = 0,
    ) -> str:
        fmt = session.format
        state = session.state
        peer = state.peer_received(sender_addr, sender_port)
        auth = session.keys
        base_len = AUTH_LEN if auth else codec.BASE_LEN
        dst, sids, ifindex, tclass, res = sender_addr, session.return_sids, 0, None, None
        if test.tlv_area:
            ctx = tlvs.TlvContext(
                sender_addr,
                sender_port,
                meta.local_addr or "",
                self.port,
                meta.tclass,
                self.clock_synced,
                peer.rx_count,
                peer.tx_count + 1,
                peer.prev_seq,
                peer.prev_t3,
                (lambda text, mac: auth.verify(text, mac, tai_ns())) if auth else None,
            )
            res = tlvs.reflect(payload, base_len, ctx)
            self.counters["tlv_integrity_failed"] += int(res.integrity_failed)
            self.counters["tlv_unrecognized"] += res.unrecognized
            self.counters["tlv_malformed"] += res.malformed
            self.counters["tlv_handled"] += res.handled
            self.counters["tlv_unsupported"] += len(res.unsupported)
            if res.no_reply:  # RFC 9503 Return Path Control Code
                return "no_reply_requested"
            if res.return_address or res.return_sids is not None:
                self.counters["return_path_from_tlv"] += 1
            dst = res.return_address or dst
            sids = res.return_sids if res.return_sids is not None else sids
            ifindex = meta.ifindex if res.same_link else 0
            tclass = res.reply_tclass
        cmsgs = [hoplimit_cmsg(REPLY_HOP_LIMIT)]
        if meta.local_addr or ifindex:
            cmsgs.append(pktinfo_cmsg(meta.local_addr or "::", ifindex))
        if tclass is not None:
            cmsgs.append(tclass_cmsg(tclass))
        try:
            self._install_srh(sids)
        except (OSError, ValueError) as exc:
            print(f"ustamp reflector: setsockopt(IPV6_RTHDR, {sids}): {exc}", file=sys.stderr)
            return "send_error"
        if auth is not None and not auth.can_sign(tai_ns()):
            # before the stateful number is taken: a reply that cannot be signed costs no number
            print(f"ustamp reflector: ssid {session.ssid}: no key valid for signing now", file=sys.stderr)
            return "auth_no_key"
        # RFC 8762 §4.3: stateful = the session's own counter (shared with the fast engine's workers)
        seq = state.seq_for_reply() if session.stateful else test.packet.seq
        rx_sec, rx_frac = encode_ts(t2, fmt, self.tai_offset_s)
        sender_ttl = meta.hop_limit if meta.hop_limit is not None else 0
        reply = codec.encode_reply_base(
            seq,
            self.err_est[fmt],
            test.packet.ssid,
            rx_sec,
            rx_frac,
            test.packet,
            sender_ttl,
            authenticated=auth is not None,
        )
        if res is not None:
            reply += res.reply_area
        t3_words = encode_ts(tai_ns(), fmt, self.tai_offset_s)
        codec.stamp_t3(reply, *t3_words, authenticated=auth is not None)
        if auth is not None:  # sign after T3: the HMAC covers it (RFC 8762 §4.4)
            try:
                now = tai_ns()
                auth.sign_packet(reply, now)
                if res is not None and res.hmac_offset is not None and not res.integrity_failed:
                    text = stamp_tlv_hmac.covered_text(reply, base_len, res.hmac_offset)
                    reply[res.hmac_offset + 4 : res.hmac_offset + 20] = auth.sign(text, now)
            except HmacError as exc:
                print(f"ustamp reflector: ssid {session.ssid}: cannot sign: {exc}", file=sys.stderr)
                return "auth_no_key"
        try:
            self.sock.sendmsg([reply], cmsgs, 0, (dst, sender_port, 0, scope_id if dst == sender_addr else 0))
        except OSError as exc:
            print(f"ustamp reflector: sendmsg to [{dst}]:{sender_port}: {exc}", file=sys.stderr)
            return "send_error"
        state.replied(sender_addr, sender_port, peer, seq, t3_words, session.stateful)
        return "reflected"

    def _install_srh(self, sids: list[str]) -> None:
        """Make the socket's sticky IPV6_RTHDR the session's return path (or none).

        Linux accepts a type-4 SRH only as a sticky option (setsockopt), not as sendmsg()
        ancillary data (ip6_datagram_send_ctl knows type 2 only: EINVAL). The kernel writes the
        sendmsg() destination into segments[0], so one option serves every sender of a SID
        list; it is switched only when consecutive replies need different lists."""
        key = tuple(sids)
        if key == self._installed_sids:
            return
        if sids:
            self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RTHDR, srh_option("::", sids))
        else:
            self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RTHDR, b"")
        self._installed_sids = key

    # -- loop -----------------------------------------------------------------

    engine = "python"

    def snapshot(self) -> dict[str, int]:
        """The counters now; socket_drops: datagrams the kernel dropped at our socket (receive
        buffer full, bad checksum), which never reached `received`."""
        return {**self.counters, "socket_drops": socket_drops(self.sock)}

    def ready_event(self) -> dict:
        return {"event": "ready", "port": self.port, "sessions": self.sessions.describe(), "engine": self.engine}

    def dump_event(self) -> dict:
        return {"counters": self.snapshot()}

    def wait_fd(self) -> int:
        """What the loop waits on: readable = there is something for _drain()."""
        return self.sock.fileno()

    def shutdown(self) -> None:
        """After the loop, before the final counters."""

    def close(self) -> None:
        self.sock.close()

    def metrics_line(self) -> str:
        tags = f"segscope_datapath,node={escape_tag(self.node or 'unknown')},program=ustamp_reflector"
        return counters_line(tags, self.snapshot())

    def run(self, stats_interval_s: float = 1.0, tether=None) -> None:
        """Answer until SIGTERM/SIGINT, or until no agent has adopted this process within the
        tether's timeout (tether.py; it says so, the rest is as on SIGTERM)."""
        stop = False
        dump = False

        def on_stop(_sig, _frm):
            nonlocal stop
            stop = True

        def on_usr1(_sig, _frm):
            nonlocal dump
            dump = True

        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGUSR1, on_usr1)
        reload = False

        def on_hup(_sig, _frm):
            nonlocal reload
            reload = True

        signal.signal(signal.SIGHUP, on_hup)
        print(json.dumps(self.ready_event()), flush=True)
        next_stats = time.monotonic() + stats_interval_s
        wait_fd = self.wait_fd()
        while not stop:
            if tether is not None and tether.orphaned_now():
                break
            timeout = max(0.0, min(0.2, next_stats - time.monotonic()))
            readable, _, _ = select.select([wait_fd], [], [], timeout)
            if readable:
                self._drain()
            if reload:
                reload = False
                self.reload()
            if dump:
                dump = False
                print(json.dumps(self.dump_event()), flush=True)
            if time.monotonic() >= next_stats:
                next_stats += stats_interval_s
                self.refresh_clock()
                if self.kafka:
                    self.kafka.produce_metrics(self.metrics_line())
        self.shutdown()
        if self.kafka:
            self.kafka.produce_metrics(self.metrics_line())
            self.kafka.flush()
        final = {"counters": self.snapshot(), "final": True}
        if tether is not None and tether.orphaned:
            final["orphaned"] = True
        print(json.dumps(final), flush=True)

    def reload(self) -> None:
        """SIGHUP: re-read the session file and the key files. A session whose (sender, ssid) and
        settings are unchanged keeps its state (stateful seq, Direct Measurement counters); on any
        error the old configuration stays and stderr says why."""
        try:
            if self.load_sessions is None:
                self.sessions.reload_keys()
                print(json.dumps({"event": "keys_reloaded"}), flush=True)
                return
            new = self.load_sessions()
        except ValueError as exc:
            print(f"ustamp reflector: SIGHUP: {exc} (configuration unchanged)", file=sys.stderr)
            return
        new.adopt_state(self.sessions)
        self.install_sessions(new)
        print(json.dumps({"event": "reloaded", "sessions": new.describe()}), flush=True)

    def install_sessions(self, table: SessionTable) -> None:
        """Make `table` (its states adopted from the running one) the configuration."""
        self.sessions = table
        self.has_auth = table.any_authenticated

    def _drain(self) -> None:
        """Everything queued on the socket, without blocking."""
        while True:
            try:
                payload, ancdata, _flags, peer = self.sock.recvmsg(MAX_DATAGRAM, ANC_BUFSIZE, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            self.account(payload, parse_ancillary(ancdata), peer)

    def account(self, payload: bytes, meta: RxMeta, peer) -> None:
        """Handle one datagram and count it received and in its outcome."""
        self.counters["received"] += 1
        try:
            outcome = self.handle_meta(payload, meta, peer)
        except Exception:  # noqa: BLE001 - a bug must not stop the reflector; counted, logged
            if self.counters["internal_error"] == 0:
                traceback.print_exc()
            outcome = "internal_error"
        self.counters[outcome] += 1
