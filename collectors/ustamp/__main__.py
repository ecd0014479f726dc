"""CLI: python -m collectors.ustamp reflector|sender ... (exit 0 ok, 1 runtime failure, 2 bad arguments)."""

from __future__ import annotations

import argparse
import ipaddress
import json
import sys

from segscope_schemas import names
from segscope_schemas.stamp_tlv import SENDER_FLAGS, encode_tlv
from segscope_schemas.version import VERSION_LINE

from .clock import TimestampFormat
from .netutil import enter_netns, parse_sids
from .sessions import (
    ANY_SENDER,
    SessionConfigError,
    SessionTable,
    base_sender_session,
    session_from_cli,
    sessions_from_file,
)


def die(msg: str, code: int = 2) -> None:
    print(f"ustamp: {msg}", file=sys.stderr)
    sys.exit(code)


def _ipv6(flag: str, text: str) -> str:
    try:
        return str(ipaddress.IPv6Address(text))
    except ValueError:
        die(f"{flag}: not an IPv6 address: {text!r}")


def _tlv(text: str) -> bytes:
    """--tlv TYPE:HEXVALUE[:FLAGS] -> one raw TLV (RFC 8972 §4 header + value); FLAGS default U=1,
    as RFC 8972 §4 has the Session-Sender send them (the reflector clears U for Types it knows)."""
    parts = text.split(":")
    try:
        tlv_type = int(parts[0], 0)
        value = bytes.fromhex(parts[1]) if len(parts) > 1 else b""
        flags = int(parts[2], 0) if len(parts) > 2 else SENDER_FLAGS
        if not (0 <= tlv_type <= 255 and 0 <= flags <= 255 and len(value) <= 0xFFFF):
            raise ValueError("out of range")
    except (ValueError, IndexError) as exc:
        die(f"--tlv: expected TYPE:HEXVALUE[:FLAGS], got {text!r} ({exc})")
    return encode_tlv(tlv_type, value, flags)


# replies per sendmmsg(): one T3 read per call; 16 bounds how early T3 gets under a flood (about
# 16 kernel sends) for a few % of throughput against 64 (bench/reflector_userspace_vs_xdp.py)
SEND_BATCH_DEFAULT = 16


def reflector_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="ustamp reflector", description="user-space STAMP Session-Reflector")
    p.add_argument("--netns", help="run inside /run/netns/NETNS")
    p.add_argument("--address", default="::", help="bind address (default ::)")
    p.add_argument("--port", type=int, default=862)
    p.add_argument("--sessions", help="JSON or YAML session file")
    p.add_argument(
        "--add-session",
        action="append",
        default=[],
        metavar="SPEC",
        help='"--ssid N [--sender ADDR] [--return-sids A,B] [--format ptp|ntp] [--stateful] '
        '[--mode authenticated --key-file FILE]"',
    )
    p.add_argument("--node", default="", help="node tag of the counter line")
    p.add_argument("--kafka", metavar="BROKERS", help="send counter lines to Kafka")
    p.add_argument("--metrics-topic", default=names.TOPIC_METRICS)
    p.add_argument("--stats-interval", type=float, default=1.0)
    p.add_argument(
        "--base-senders",
        default="on",
        choices=["on", "off"],
        help="on (default): answer RFC 8762 senders without an SSID (session {::, 0}, stateless, NTP) "
        "unless a session for SSID 0 is configured; off: count them unknown_session",
    )
    p.add_argument(
        "--engine",
        default="auto",
        choices=["auto", "fast", "python"],
        help="fast: C workers (build/collectors/libustamp_fast.so) answer base packets, Python the rest; "
        "python: everything in Python; auto (default): fast when the library is built (the ready line says which)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=0,
        help="fast engine: worker threads, one socket each (default: the CPUs this process may use, at most 8)",
    )
    p.add_argument(
        "--steering",
        default="session",
        choices=["session", "packet"],
        help="fast engine: session (default) = one worker per (sender, SSID), a session's replies stay in "
        "order; packet = any datagram to any worker, one session can use every worker (replies may reorder)",
    )
    p.add_argument("--batch", type=int, default=64, help="fast engine: datagrams per recvmmsg (1..256)")
    p.add_argument(
        "--send-batch",
        type=int,
        default=SEND_BATCH_DEFAULT,
        help=f"fast engine: replies per sendmmsg (1..256, default {SEND_BATCH_DEFAULT}); T3 is read once per "
        "call, right before it, so a reply's T3 is early by the time the kernel spends on the replies before it "
        "in the call (1: exact, a few %% fewer replies/s under a flood)",
    )
    p.add_argument(
        "--rcvbuf", type=int, default=0, help="fast engine: socket receive buffer bytes per worker (0: kernel default)"
    )
    p.add_argument(
        "--agent-dir",
        help="outlive the agent (collectors/ustamp/tether.py): DIR/agent.lock is held by the node's running agent",
    )
    p.add_argument(
        "--adopt-timeout",
        type=float,
        help="with --agent-dir: stop (and say so in DIR/orphans.jsonl) once no agent has run for this many seconds",
    )
    a = p.parse_args(argv)
    if not 1 <= a.port <= 65535:
        die(f"--port: expected 1..65535, got {a.port}")
    if not 0 <= a.workers <= 64:
        die(f"--workers: expected 1..64 (0: one per CPU), got {a.workers}")
    if not 1 <= a.batch <= 256:
        die(f"--batch: expected 1..256, got {a.batch}")
    if not 1 <= a.send_batch <= 256:
        die(f"--send-batch: expected 1..256, got {a.send_batch}")
    if not 0 <= a.rcvbuf <= 1 << 30:
        die(f"--rcvbuf: expected 0..{1 << 30} bytes, got {a.rcvbuf}")

    def load_sessions() -> SessionTable:
        sessions = sessions_from_file(a.sessions) if a.sessions else []
        sessions += [session_from_cli(spec) for spec in a.add_session]
        table = SessionTable(sessions)
        if a.base_senders == "on" and not table.has(ANY_SENDER, 0):
            table.add(base_sender_session())
        return table

    def reload_sessions() -> SessionTable:  # SIGHUP: errors keep the old configuration
        try:
            return load_sessions()
        except OSError as exc:
            raise ValueError(f"--sessions: {exc}") from None

    try:
        table = load_sessions()
    except (SessionConfigError, OSError, ValueError) as exc:
        die(str(exc))
    if not len(table):
        die("no sessions: give --sessions FILE or --add-session SPEC (or --base-senders on)")
    if a.kafka and not a.node:
        die("--node: required with --kafka")
    from .tether import Tether, TetherError

    try:
        tether = Tether(a.agent_dir, a.adopt_timeout, what=f"port {a.port}")
    except TetherError as exc:
        die(str(exc))
    from .kafka_out import KafkaOut
    from .reflector import Reflector

    engine = a.engine
    if engine != "python":
        from .fast import FastEngineUnavailable, load_library

        try:
            load_library()
            engine = "fast"
        except (FastEngineUnavailable, OSError) as exc:
            if engine == "fast":
                die(f"--engine fast: {exc}", 1)
            engine = "python"
    try:
        # Kafka first: librdkafka's threads start now and stay in our netns (setns() moves only
        # the calling thread), so the brokers are reached from here while the STAMP socket,
        # opened after setns(), lives in --netns.
        kafka = KafkaOut(a.kafka, a.node, metrics_topic=a.metrics_topic) if a.kafka else None
        if a.netns:
            enter_netns(a.netns)
        address = _ipv6("--address", a.address)
        if engine == "fast":
            from .fast import FastReflector

            refl = FastReflector(
                table,
                address,
                a.port,
                a.node,
                kafka,
                reload_sessions,
                workers=a.workers,
                steering=a.steering,
                batch=a.batch,
                send_batch=a.send_batch,
                rcvbuf=a.rcvbuf,
            )
        else:
            refl = Reflector(table, address, a.port, a.node, kafka, reload_sessions)
    except OSError as exc:
        die(f"setup: {exc}", 1)
    try:
        refl.run(a.stats_interval, tether)
    finally:
        refl.close()
    return 0


def sender_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="ustamp sender", description="user-space STAMP Session-Sender + collector")
    p.add_argument("--netns")
    p.add_argument("--src", required=True)
    p.add_argument("--dst", help="reflector address (loopback mode: default --src)")
    p.add_argument("--segs", default="", help="SIDs in visiting order, comma-separated")
    p.add_argument("--sport", type=int, help="default 50000+ssid")
    p.add_argument("--dport", type=int, help="default 862 (loopback: --sport)")
    p.add_argument("--ssid", type=int, required=True)
    p.add_argument("--rate", type=float, required=True, help="packets per second")
    p.add_argument("--count", type=int)
    p.add_argument("--duration", type=float)
    p.add_argument("--format", default="ptp", choices=[f.value for f in TimestampFormat])
    p.add_argument("--mode", default="two-way", choices=["two-way", "one-way", "loopback"])
    p.add_argument("--padding", type=int, default=0)
    p.add_argument("--auth-key-file", help="authenticated mode: HMAC key file (see collectors/ustamp/auth.py)")
    p.add_argument("--tlv", action="append", default=[], help="TYPE:HEXVALUE[:FLAGS], appended after the base packet")
    p.add_argument("--wait", type=float, default=1.0, help="seconds to wait for replies after the last packet")
    p.add_argument("--output", default="jsonl", choices=["jsonl", "kafka", "none"])
    p.add_argument("--records-file", default="-", help="jsonl output file ('-' = stdout)")
    p.add_argument("--kafka", default="127.0.0.1:19092", metavar="BROKERS")
    p.add_argument("--topic", default=names.TOPIC_STAMP_RECORDS)
    p.add_argument(
        "--metrics-topic",
        default=names.TOPIC_METRICS,
        help="counter lines (program=ustamp_sender) every second and at the end, with --output kafka",
    )
    p.add_argument("--node", default="", help="node name (batch header, key <node>/<ssid>)")
    p.add_argument("--batch-interval", type=float, default=0.2)
    a = p.parse_args(argv)
    if not 0 <= a.ssid <= 65535:
        die(f"--ssid: expected 0..65535 (0: a plain RFC 8762 sender, no SSID), got {a.ssid}")
    if a.rate <= 0:
        die(f"--rate: expected a positive number, got {a.rate}")
    if a.count is None and a.duration is None:
        die("--count/--duration: give at least one")
    if a.count is not None and a.count < 1:
        die(f"--count: expected >= 1, got {a.count}")
    if not 0 <= a.padding <= 9000:
        die(f"--padding: expected 0..9000, got {a.padding}")
    src = _ipv6("--src", a.src)
    if a.dst is None and a.mode != "loopback":
        die("--dst: required (except in loopback mode)")
    dst = _ipv6("--dst", a.dst) if a.dst else src
    sport = a.sport if a.sport is not None else 50000 + a.ssid
    if not 1 <= sport <= 65535:
        die(f"--sport: {sport} out of range (default 50000+ssid); give --sport")
    dport = a.dport if a.dport is not None else (sport if a.mode == "loopback" else 862)
    try:
        segs = parse_sids(a.segs, "--segs") if a.segs else []
    except ValueError as exc:
        die(str(exc))
    if a.mode == "loopback" and not segs:
        die("--segs: loopback mode needs a SID list that leads back to --src")
    if a.output == "kafka" and not a.node:
        die("--node: required with --output kafka")
    tlvs = b"".join(_tlv(t) for t in a.tlv)
    keys = None
    if a.auth_key_file:
        from .auth import KeyFileError, load_key_ring

        try:
            keys = load_key_ring(a.auth_key_file)
        except KeyFileError as exc:
            die(f"--auth-key-file: {exc}")

    from .kafka_out import KafkaOut
    from .sender import Sender, run

    try:
        kafka = (
            KafkaOut(a.kafka, a.node, topic=a.topic, metrics_topic=a.metrics_topic) if a.output == "kafka" else None
        )  # before setns, see reflector_main
        if a.netns:
            enter_netns(a.netns)
        sender = Sender(src, dst, a.ssid, segs, sport, dport, TimestampFormat(a.format), a.mode, a.padding, tlvs, keys)
    except OSError as exc:
        die(f"setup: {exc}", 1)
    out = None
    if a.output == "jsonl":
        out = sys.stdout if a.records_file == "-" else open(a.records_file, "w")
    result = run(sender, a.rate, a.count, a.duration, a.wait, out, kafka, a.batch_interval)
    if out is not None and out is not sys.stdout:
        out.close()
    print(json.dumps({"summary": result}), flush=True)
    failed = result["send_errors"] > 0 or (
        kafka is not None and (result["kafka"]["undelivered"] or result["kafka"]["batches_failed"])
    )
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m collectors.ustamp reflector|sender [--help]")
        return 0 if argv else 2
    if argv[0] == "--version":
        print(VERSION_LINE)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "reflector":
        return reflector_main(rest)
    if cmd == "sender":
        return sender_main(rest)
    die(f"unknown command {cmd!r} (expected reflector or sender)")
    return 2


if __name__ == "__main__":
    sys.exit(main())
