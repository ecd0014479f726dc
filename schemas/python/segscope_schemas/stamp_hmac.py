"""STAMP integrity protection (RFC 8762 §4.4): HMAC-SHA-256 truncated to 128 bits.

Mirror of schemas/c/stamp_hmac.h: ``hmac_sha256_128`` and a key table keyed by
key id with rotation (a current signing key, previous keys accepted until the
end of their validity window) and a constant-time verify. The base packet
carries no key id, so ``verify`` tries every key valid at ``now_ns``.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

HMAC_LEN = 16
HMAC_KEY_MAX = 64
HMAC_KEYS_MAX = 8
FOREVER = (1 << 64) - 1


class HmacError(Exception):
    """Base of the key table / verification errors."""


class NoKey(HmacError):
    """No usable key (none current, or none valid at that time)."""


class KeyExpired(HmacError):
    pass


class IntegrityError(HmacError):
    """No valid key reproduces the HMAC: the packet must be discarded (RFC 8762 §4.4)."""


def hmac_sha256(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


def hmac_sha256_128(key: bytes, msg: bytes) -> bytes:
    return hmac_sha256(key, msg)[:HMAC_LEN]


@dataclass
class HmacKey:
    id: int
    key: bytes
    not_before_ns: int = 0
    not_after_ns: int = FOREVER

    def valid(self, now_ns: int) -> bool:
        return self.not_before_ns <= now_ns < self.not_after_ns


class HmacKeyTable:
    def __init__(self) -> None:
        self.keys: dict[int, HmacKey] = {}
        self.current_id: int | None = None

    def add(self, key_id: int, key: bytes, not_before_ns: int = 0, not_after_ns: int = FOREVER) -> None:
        if not 0 <= key_id <= 0xFFFFFFFF:
            raise ValueError(f"key_id {key_id} is not a 32-bit unsigned integer")
        if not 0 < len(key) <= HMAC_KEY_MAX:
            raise ValueError(f"key {key_id}: length {len(key)} is not 1..{HMAC_KEY_MAX} bytes")
        if not_after_ns <= not_before_ns:
            raise ValueError(f"key {key_id}: validity window [{not_before_ns}, {not_after_ns}) is empty")
        if key_id in self.keys:
            raise ValueError(f"key_id {key_id} already present")
        if len(self.keys) >= HMAC_KEYS_MAX:
            raise ValueError(f"key table full ({HMAC_KEYS_MAX} keys)")
        self.keys[key_id] = HmacKey(key_id, bytes(key), not_before_ns, not_after_ns)

    def set_current(self, key_id: int) -> None:
        if key_id not in self.keys:
            raise KeyError(f"key_id {key_id} is not in the key table")
        self.current_id = key_id

    def remove(self, key_id: int) -> None:
        if key_id not in self.keys:
            raise KeyError(f"key_id {key_id} is not in the key table")
        del self.keys[key_id]
        if self.current_id == key_id:
            self.current_id = None

    def rotate(self, new_id: int, key: bytes, now_ns: int, grace_ns: int) -> None:
        """New key current from now_ns; the previous current one stays valid grace_ns more."""
        old = self.keys.get(self.current_id) if self.current_id is not None else None
        self.add(new_id, key, now_ns, FOREVER)
        if old is not None:
            old.not_after_ns = min(old.not_after_ns, min(now_ns + grace_ns, FOREVER))
        self.set_current(new_id)

    def sign(self, msg: bytes, now_ns: int) -> tuple[bytes, int]:
        """(128-bit HMAC with the current key, its id)."""
        k = self.keys.get(self.current_id) if self.current_id is not None else None
        if k is None:
            raise NoKey("no current HMAC key")
        if not k.valid(now_ns):
            raise KeyExpired(f"current key {k.id} is not valid at {now_ns} ns")
        return hmac_sha256_128(k.key, msg), k.id

    def verify(self, msg: bytes, mac: bytes, now_ns: int) -> int:
        """Key id whose HMAC matches (every valid key is tried, compare_digest each)."""
        valid = [k for k in self.keys.values() if k.valid(now_ns)]
        if not valid:
            raise NoKey(f"no HMAC key valid at {now_ns} ns")
        matched = None
        for k in valid:
            if hmac.compare_digest(hmac_sha256_128(k.key, msg), mac) and matched is None:
                matched = k.id
        if matched is None:
            raise IntegrityError("HMAC does not match any valid key")
        return matched
