"""Authenticated mode (RFC 8762 §4.2.2/§4.3.2/§4.4 + RFC 8972 §3): 112-byte packets, HMAC-SHA-256-128.

Keys live in a key file (JSON or YAML; never on the command line, where `ps` would show them):

    {"keys": [{"id": 1, "key_hex": "00112233...", "not_before_ns": 0, "not_after_ns": null},
              {"id": 2, "key_hex": "...", "not_before_ns": 1790000000000000000}],
     "current": 2}                                   # optional

Signing uses `current` if given, else the valid key with the latest `not_before_ns` at that
moment; verification accepts every key valid at that moment. So a rotation is a new key with a
future `not_before_ns` and an end (`not_after_ns`) for the old one: both sides switch at the same
time and packets in flight during the grace window still verify. The reflector re-reads its key
files on SIGHUP. Packet layouts and HMAC: segscope_schemas.stamp_auth_packet / stamp_hmac.
"""

from __future__ import annotations

import json
from pathlib import Path

from segscope_schemas import stamp_hmac
from segscope_schemas.stamp_auth_packet import AUTH_HMAC_OFFSET, AUTH_LEN

AUTH_SSID_OFF = 26  # RFC 8972 §3: SSID of the authenticated base packets
FIELDS = {"keys", "current"}
KEY_FIELDS = {"id", "key_hex", "not_before_ns", "not_after_ns"}


class KeyFileError(ValueError):
    pass


class KeyRing:
    def __init__(self, table: stamp_hmac.HmacKeyTable, current: int | None, source: str):
        self.table, self.current, self.source = table, current, source

    def _signing_id(self, now_ns: int) -> int:
        if self.current is not None:
            return self.current
        valid = [k for k in self.table.keys.values() if k.valid(now_ns)]
        if not valid:
            raise stamp_hmac.NoKey(f"{self.source}: no key valid at {now_ns} ns")
        return max(valid, key=lambda k: (k.not_before_ns, k.id)).id

    def can_sign(self, now_ns: int) -> bool:
        """Is there a key to sign with at now_ns (the `current` key must be valid too)?"""
        try:
            key = self.table.keys[self._signing_id(now_ns)]
        except stamp_hmac.HmacError:
            return False
        return key.valid(now_ns)

    def sign(self, msg: bytes, now_ns: int) -> bytes:
        self.table.set_current(self._signing_id(now_ns))
        return self.table.sign(msg, now_ns)[0]

    def verify(self, msg: bytes, mac: bytes, now_ns: int) -> bool:
        try:
            self.table.verify(msg, mac, now_ns)
            return True
        except stamp_hmac.HmacError:
            return False

    def sign_packet(self, pkt: bytearray, now_ns: int) -> None:
        """HMAC of octets 0-95 into octets 96-111 (RFC 8762 §4.4)."""
        pkt[AUTH_HMAC_OFFSET:AUTH_LEN] = self.sign(bytes(pkt[:AUTH_HMAC_OFFSET]), now_ns)

    def verify_packet(self, pkt: bytes, now_ns: int) -> bool:
        return len(pkt) >= AUTH_LEN and self.verify(
            bytes(pkt[:AUTH_HMAC_OFFSET]), bytes(pkt[AUTH_HMAC_OFFSET:AUTH_LEN]), now_ns
        )


def load_key_ring(path: str | Path) -> KeyRing:
    """Read a key file; every problem is reported as `FILE: field: why`."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            doc = yaml.safe_load(text)
        else:
            doc = json.loads(text)
    except Exception as exc:  # noqa: BLE001 - any parse error is a config error
        raise KeyFileError(
            f"{path}: not valid {'YAML' if path.suffix in ('.yaml', '.yml') else 'JSON'}: {exc}"
        ) from None
    if not isinstance(doc, dict):
        raise KeyFileError(f"{path}: expected an object with `keys`")
    unknown = set(doc) - FIELDS
    if unknown:
        raise KeyFileError(f"{path}: {sorted(unknown)[0]}: unknown field (known: keys, current)")
    keys = doc.get("keys")
    if not isinstance(keys, list) or not keys:
        raise KeyFileError(f"{path}: keys: required, a non-empty list")
    table = stamp_hmac.HmacKeyTable()
    for i, k in enumerate(keys):
        where = f"{path}: keys[{i}]"
        if not isinstance(k, dict):
            raise KeyFileError(f"{where}: expected an object")
        unknown = set(k) - KEY_FIELDS
        if unknown:
            raise KeyFileError(f"{where}: {sorted(unknown)[0]}: unknown field (known: {', '.join(sorted(KEY_FIELDS))})")
        for field in ("id", "key_hex"):
            if field not in k:
                raise KeyFileError(f"{where}: {field}: required")
        try:
            secret = bytes.fromhex(k["key_hex"])
        except (TypeError, ValueError):
            raise KeyFileError(f"{where}: key_hex: not a hex string") from None
        nb = k.get("not_before_ns") or 0
        na = k.get("not_after_ns")
        try:
            table.add(k["id"], secret, nb, stamp_hmac.FOREVER if na is None else na)
        except (ValueError, TypeError) as exc:
            raise KeyFileError(f"{where}: {exc}") from None
    current = doc.get("current")
    if current is not None and current not in table.keys:
        raise KeyFileError(f"{path}: current: key id {current!r} is missing from keys")
    return KeyRing(table, current, str(path))
