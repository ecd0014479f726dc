"""Wire codec of ustamp: base packets from segscope_schemas, TLVs through a registry.

The base packets (RFC 8762 §4.2.1/§4.3.1 + RFC 8972 SSID, 44 bytes) are encoded/decoded by
schemas/python/segscope_schemas/stamp_test_packet.py. Everything after the base packet is the
RFC 8972 §4 TLV area: Flags(8: U M I + 5 reserved) Type(8) Length(16) Value(Length).

TLV handling is a registry: `TLV_HANDLERS[type] = handler(tlv: Tlv, ctx: ReflectContext) -> bytes`
returns the TLV the reflector puts in its reply (header included). A type without a handler
is "unrecognized": echoed with the U flag set (RFC 8972 §4). A TLV whose Length runs past the
end of the packet is "malformed": the reflector sets M on it and copies the rest of the packet
unprocessed. Wire modules for single TLVs (segscope_schemas.stamp_tlv_*) register themselves
through `register_tlv()` when they are importable, see `load_schema_plugins()`.
"""
from __future__ import annotations

import importlib
import pkgutil
import struct
from dataclasses import dataclass, field
from typing import Callable

from segscope_schemas import stamp_test_packet as tp

BASE_LEN = tp.STAMP_BASE_LEN
TLV_HDR = struct.Struct("!BBH")
TLV_F_U = 0x80    # unrecognized (set by the reflector)
TLV_F_M = 0x40    # malformed (set by the reflector)
TLV_F_I = 0x20    # integrity check failed (set by the reflector)

# Offsets inside the 44-byte reflector packet (RFC 8762 §4.3.1)
REFL_TS_OFF = 4          # Timestamp (T3): seconds, fraction
REFL_RX_TS_OFF = 16      # Receive Timestamp (T2)


class Malformed(ValueError):
    """A test packet the reflector must not reflect; `reason` is the counter name."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass
class Tlv:
    flags: int
    type: int
    value: bytes

    def encode(self) -> bytes:
        return TLV_HDR.pack(self.flags, self.type, len(self.value)) + self.value


@dataclass
class ReflectContext:
    """What a TLV handler may need: the session and the addresses of this exchange."""
    session: object
    sender_addr: str
    local_addr: str
    t2_ns: int


@dataclass
class TlvOutcome:
    reply_area: bytes
    unrecognized: int = 0
    malformed: int = 0
    handled: int = 0


TlvHandler = Callable[[Tlv, ReflectContext], bytes]
TLV_HANDLERS: dict[int, TlvHandler] = {}


def register_tlv(tlv_type: int, handler: TlvHandler) -> None:
    TLV_HANDLERS[tlv_type] = handler


def load_schema_plugins() -> list[str]:
    """Import segscope_schemas.stamp_tlv* modules that offer `ustamp_register(register_tlv)`.

    The TLV wire modules are written in parallel; each one that provides the hook plugs its
    reflector behaviour in here without changes to ustamp. Returns the modules loaded."""
    import segscope_schemas
    loaded = []
    for mod in pkgutil.iter_modules(segscope_schemas.__path__):
        if not mod.name.startswith("stamp_tlv"):
            continue
        module = importlib.import_module(f"segscope_schemas.{mod.name}")
        hook = getattr(module, "ustamp_register", None)
        if hook is not None:
            hook(register_tlv)
            loaded.append(mod.name)
    return loaded


def split_tlvs(area: bytes) -> tuple[list[Tlv], bytes]:
    """TLVs of a TLV area, and the malformed tail (b'' if every TLV is whole)."""
    tlvs, off = [], 0
    while off < len(area):
        if len(area) - off < TLV_HDR.size:
            return tlvs, area[off:]
        flags, tlv_type, length = TLV_HDR.unpack_from(area, off)
        if off + TLV_HDR.size + length > len(area):
            return tlvs, area[off:]
        tlvs.append(Tlv(flags, tlv_type, area[off + TLV_HDR.size: off + TLV_HDR.size + length]))
        off += TLV_HDR.size + length
    return tlvs, b""


def reflect_tlvs(area: bytes, ctx: ReflectContext) -> TlvOutcome:
    """The reply's TLV area for the test packet's TLV area (RFC 8972 §4)."""
    tlvs, tail = split_tlvs(area)
    out = TlvOutcome(b"")
    parts = []
    for tlv in tlvs:
        handler = TLV_HANDLERS.get(tlv.type)
        if handler is None:
            out.unrecognized += 1
            parts.append(Tlv(tlv.flags | TLV_F_U, tlv.type, tlv.value).encode())
        else:
            out.handled += 1
            parts.append(handler(tlv, ctx))
    if tail:
        out.malformed += 1
        if len(tail) >= 1:       # M on the broken TLV's flags, rest copied unprocessed
            tail = bytes([tail[0] | TLV_F_M]) + tail[1:]
        parts.append(tail)
    out.reply_area = b"".join(parts)
    return out


@dataclass
class SenderTest:
    packet: tp.SenderPacket
    tlv_area: bytes = field(default=b"")


def decode_sender(payload: bytes) -> SenderTest:
    if len(payload) < BASE_LEN:
        raise Malformed("malformed_short", f"{len(payload)} bytes, base packet needs {BASE_LEN}")
    return SenderTest(tp.SenderPacket.decode(payload), payload[BASE_LEN:])


def encode_reply_base(seq: int, err_est: int, ssid: int, rx_sec: int, rx_frac: int,
                      sender: tp.SenderPacket, sender_ttl: int) -> bytearray:
    """44-byte reflector packet with T3 = 0: patch it with `stamp_t3` right before sending."""
    return bytearray(tp.ReflectorPacket(seq, 0, 0, err_est, ssid, rx_sec, rx_frac, sender.seq,
                                        sender.ts_sec, sender.ts_frac, sender.err_est,
                                        sender_ttl).encode())


def stamp_t3(reply: bytearray, sec: int, frac: int) -> None:
    struct.pack_into("!II", reply, REFL_TS_OFF, sec, frac)
