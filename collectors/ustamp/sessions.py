"""Reflector sessions: the same model as the XDP reflector's `add-session`.

A session is keyed by (sender address, SSID); sender `::` matches any sender (looked up
after the exact key, like datapath/stamp_reflector). SSID 0 is a plain RFC 8762 sender (no SSID:
its bytes 14-15 are MBZ); `base_sender_session()` is the default {::, 0} session for them.
Per-sender state (Direct Measurement counters, Follow-Up Telemetry) lives in PeerState, one per
(sender address, sender port): a new sender of an any-sender session starts from zero. A session's
run-time state (that and the stateful Sequence Number) is its SessionState. Sources: a JSON or YAML file
(a list of objects, or {"sessions": [...]}) with keys ssid, sender, return_sids, format,
stateful, mode, key_file; or `--add-session "--ssid N [--sender ADDR] [--return-sids A,B]
[--format ptp|ntp] [--stateful] [--mode authenticated --key-file FILE]"` on the command line.
Errors name the field.
"""

from __future__ import annotations

import argparse
import collections
import ipaddress
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .auth import KeyFileError, KeyRing, load_key_ring
from .clock import TimestampFormat
from .netutil import parse_sids

ANY_SENDER = "::"
FIELDS = {"ssid", "sender", "return_sids", "format", "stateful", "mode", "key_file"}
MODES = ("unauthenticated", "authenticated")


# per-session bound on remembered senders (address, port): the oldest is forgotten first
MAX_PEERS_PER_SESSION = 4096


class SessionConfigError(ValueError):
    pass


@dataclass
class PeerState:
    """What RFC 8972 keeps per STAMP session, i.e. per sender (address, port) of a session entry."""

    rx_count: int = 0  # test packets received from this sender (Direct Measurement R_RxC)
    tx_count: int = 0  # replies sent to it (R_TxC)
    prev_seq: int = 0  # the previous reply's seq and T3 words (Follow-Up Telemetry)
    prev_t3: tuple[int, int] = (0, 0)


class SessionState:
    """Run-time state of one session, kept across SIGHUP while the session's settings do not change:
    the stateful Sequence Number and the per-sender state. The fast engine keeps the same state in C
    (fast.NativeSessionState, same methods), where its workers and this Python code share it."""

    def __init__(self) -> None:
        self.next_seq = 0  # stateful only: Sequence Number of the next reply (shared, as in the XDP reflector)
        self.peers: collections.OrderedDict[tuple[str, int], PeerState] = collections.OrderedDict()
        self.peers_forgotten = 0  # senders dropped from `peers` by the MAX_PEERS_PER_SESSION bound

    def peer_received(self, addr: str, port: int) -> PeerState:
        """Count a test packet of this sender that reached the reply stage; its state now (created
        empty on its first packet; the least recently seen sender is forgotten first)."""
        key = (addr, port)
        st = self.peers.get(key)
        if st is None:
            st = self.peers[key] = PeerState()
            if len(self.peers) > MAX_PEERS_PER_SESSION:
                self.peers.popitem(last=False)
                self.peers_forgotten += 1
        else:
            self.peers.move_to_end(key)
        st.rx_count += 1
        return st

    def seq_for_reply(self) -> int:
        """The stateful Sequence Number of the reply being built; replied() commits it (a reply that
        is not sent leaves no gap)."""
        return self.next_seq

    def replied(self, addr: str, port: int, peer: PeerState, seq: int, t3: tuple[int, int], stateful: bool) -> None:
        """A reply went out: R_TxC, the Follow-Up Telemetry of the next one, the stateful counter."""
        peer.tx_count += 1
        peer.prev_seq, peer.prev_t3 = seq, t3
        if stateful:
            self.next_seq = (self.next_seq + 1) & 0xFFFFFFFF


@dataclass
class Session:
    ssid: int
    sender: str = ANY_SENDER
    return_sids: list[str] = field(default_factory=list)
    format: TimestampFormat = TimestampFormat.PTP
    stateful: bool = False
    keys: Optional["KeyRing"] = None  # authenticated mode (RFC 8762 §4.2.2): the session's key ring
    key_file: str = ""
    state: SessionState = field(default_factory=SessionState, repr=False)

    @property
    def key(self) -> tuple[str, int]:
        return self.sender, self.ssid

    @property
    def authenticated(self) -> bool:
        return self.keys is not None

    def describe(self) -> dict:
        return {
            "ssid": self.ssid,
            "sender": self.sender,
            "return_sids": self.return_sids,
            "format": self.format.value,
            "stateful": self.stateful,
            "mode": MODES[self.authenticated],
            "key_file": self.key_file,
        }


def make_session(
    where: str,
    ssid,
    sender=ANY_SENDER,
    return_sids=None,
    format="ptp",
    stateful=False,
    mode="unauthenticated",
    key_file=None,
) -> Session:
    if isinstance(ssid, bool) or not isinstance(ssid, int) or not 0 <= ssid <= 65535:
        raise SessionConfigError(
            f"{where}: ssid: expected an integer 0..65535 (0: RFC 8762 senders without an SSID), got {ssid!r}"
        )
    try:
        sender = str(ipaddress.IPv6Address(sender))
    except ValueError:
        raise SessionConfigError(f"{where}: sender: not an IPv6 address: {sender!r}") from None
    sids: list[str] = []
    if return_sids:
        text = return_sids if isinstance(return_sids, str) else ",".join(map(str, return_sids))
        try:
            sids = parse_sids(text, "return_sids")
        except ValueError as exc:
            raise SessionConfigError(f"{where}: {exc}") from None
    try:
        fmt = TimestampFormat(str(format).lower())
    except ValueError:
        raise SessionConfigError(f"{where}: format: expected ptp or ntp, got {format!r}") from None
    if not isinstance(stateful, bool):
        raise SessionConfigError(f"{where}: stateful: expected true or false, got {stateful!r}")
    if mode not in MODES:
        raise SessionConfigError(f"{where}: mode: expected unauthenticated or authenticated, got {mode!r}")
    keys = None
    if mode == "authenticated":
        if not key_file:
            raise SessionConfigError(f"{where}: key_file: required for an authenticated session")
        try:
            keys = load_key_ring(key_file)
        except KeyFileError as exc:
            raise SessionConfigError(f"{where}: key_file: {exc}") from None
    elif key_file:
        raise SessionConfigError(f"{where}: key_file: only for mode authenticated")
    return Session(ssid, sender, sids, fmt, stateful, keys, key_file or "")


def _cli_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="--add-session", add_help=False, exit_on_error=False)
    p.add_argument("--ssid", type=int, required=True)
    p.add_argument("--sender", default=ANY_SENDER)
    p.add_argument("--return-sids", default="")
    p.add_argument("--format", default="ptp")
    p.add_argument("--stateful", action="store_true")
    p.add_argument("--mode", default="unauthenticated")
    p.add_argument("--key-file")
    return p


def session_from_cli(spec: str) -> Session:
    where = f"--add-session {spec!r}"
    try:
        ns, extra = _cli_parser().parse_known_args(shlex.split(spec))
    except (argparse.ArgumentError, ValueError) as exc:
        raise SessionConfigError(f"{where}: {exc}") from None
    except SystemExit:
        raise SessionConfigError(f"{where}: --ssid is required") from None
    if extra:
        raise SessionConfigError(f"{where}: unknown argument {extra[0]!r}")
    return make_session(where, ns.ssid, ns.sender, ns.return_sids, ns.format, ns.stateful, ns.mode, ns.key_file)


def sessions_from_file(path: str | Path) -> list[Session]:
    path = Path(path)
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml

        doc = yaml.safe_load(text)
    else:
        doc = json.loads(text)
    if isinstance(doc, dict):
        doc = doc.get("sessions")
    if not isinstance(doc, list):
        raise SessionConfigError(f"{path}: expected a list of sessions or {{\"sessions\": [...]}}")
    out = []
    for i, item in enumerate(doc):
        where = f"{path}: sessions[{i}]"
        if not isinstance(item, dict):
            raise SessionConfigError(f"{where}: expected an object")
        unknown = set(item) - FIELDS
        if unknown:
            raise SessionConfigError(
                f"{where}: {sorted(unknown)[0]}: unknown field (known: {', '.join(sorted(FIELDS))})"
            )
        if "ssid" not in item:
            raise SessionConfigError(f"{where}: ssid: required")
        out.append(make_session(where, **item))
    return out


class SessionTable:
    def __init__(self, sessions: list[Session] = ()):
        self._by_key: dict[tuple[str, int], Session] = {}
        for s in sessions:
            self.add(s)

    def add(self, s: Session) -> None:
        if s.key in self._by_key:
            raise SessionConfigError(f"session ssid={s.ssid} sender={s.sender}: defined twice")
        self._by_key[s.key] = s

    @property
    def any_authenticated(self) -> bool:
        return any(s.authenticated for s in self._by_key.values())

    def reload_keys(self) -> None:
        """Re-read every authenticated session's key file (SIGHUP): a rotation without restart."""
        for s in self._by_key.values():
            if s.authenticated:
                s.keys = load_key_ring(s.key_file)

    def adopt_state(self, old: "SessionTable") -> None:
        """Carry the run-time state of sessions that did not change over from `old`."""
        for key, s in self._by_key.items():
            prev = old._by_key.get(key)
            if prev is not None and prev.describe() == s.describe():
                s.state = prev.state

    def has(self, sender: str, ssid: int) -> bool:
        return (sender, ssid) in self._by_key

    def lookup(self, sender: str, ssid: int) -> Session | None:
        return self._by_key.get((sender, ssid)) or self._by_key.get((ANY_SENDER, ssid))

    def __len__(self) -> int:
        return len(self._by_key)

    def __iter__(self):
        return iter(self._by_key.values())

    def describe(self) -> list[dict]:
        return [s.describe() for s in self._by_key.values()]


def base_sender_session() -> Session:
    """{::, ssid 0}: answers RFC 8762 senders that carry no SSID; stateless, NTP (RFC 8762's
    default format; the reply's Error Estimate Z bit says which one either way). The XDP
    reflector installs the same session at attach (--base-senders on)."""
    return Session(0, ANY_SENDER, [], TimestampFormat.NTP, False)
