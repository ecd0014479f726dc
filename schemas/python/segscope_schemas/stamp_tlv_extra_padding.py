"""Extra Padding TLV, Type 1 (RFC 8972 §4.1). Mirror of schemas/c/stamp_tlv_extra_padding.h.

Value: padding of any length (Length = its size, may be 0). The sender fills it (pseudo-random
per RFC 8972 §4.1); the reflector returns it so the reply is as long as the request.
"""

from __future__ import annotations

from dataclasses import dataclass

from .stamp_tlv import TYPE_EXTRA_PADDING as TYPE
from .stamp_tlv import encode_tlv, split_tlv


@dataclass
class ExtraPadding:
    padding: bytes = b""
    flags: int = 0

    def encode(self) -> bytes:
        return encode_tlv(TYPE, self.padding, self.flags)

    @classmethod
    def decode(cls, buf: bytes) -> "ExtraPadding":
        flags, value = split_tlv(buf, TYPE)
        return cls(padding=value, flags=flags)


def value_ok(value: bytes) -> bool:
    return True  # any length is valid
