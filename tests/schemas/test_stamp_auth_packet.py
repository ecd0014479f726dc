"""STAMP authenticated packets and HMAC (schemas/*/stamp_auth_packet.*, stamp_hmac.*).

Layouts from RFC 8762 §4.2.2/§4.3.2 with the RFC 8972 §3 SSID, HMAC per RFC 8762 §4.4
(HMAC-SHA-256 truncated to 128 bits over octets 0-95), RFC 4231 test cases.
"""

from __future__ import annotations

import pytest
from _stamp_base_c import load_vectors, run_c_test

from segscope_schemas import stamp_auth_packet as ap
from segscope_schemas import stamp_hmac as sh

AUTH = load_vectors("stamp_auth_packet")
HMAC = load_vectors("stamp_hmac")
NS = 10**9


def test_c_program_passes_every_check():
    r = run_c_test()
    assert r.failed == 0 and r.returncode == 0, r.stdout


def _encode_distinct(kind: str) -> tuple[bytes, dict]:
    """A packet whose every field holds a different value, so a misplaced field shows."""
    layout = AUTH["layouts"][kind]
    values = {}
    for i, f in enumerate(layout):
        if not f["field"].startswith("mbz") and f["field"] != "hmac":
            values[f["field"]] = (0x11 * (i + 1)) % (1 << (8 * f["size"])) or 1
    cls = ap.AuthSenderPacket if kind == "sender" else ap.AuthReflectorPacket
    mac = bytes(range(0xA0, 0xB0))
    return cls(**values, hmac=mac).encode(), dict(values, hmac=int.from_bytes(mac, "big"))


@pytest.mark.parametrize("kind", ["sender", "reflector"])
def test_python_layout_matches_the_rfc_figure(kind):
    buf, values = _encode_distinct(kind)
    assert len(buf) == ap.AUTH_LEN == 112
    covered = 0
    for f in AUTH["layouts"][kind]:
        chunk = buf[f["offset"] : f["offset"] + f["size"]]
        want = 0 if f["field"].startswith("mbz") else values[f["field"]]
        assert int.from_bytes(chunk, "big") == want, f"{kind}.{f['field']} at {f['offset']}"
        covered += f["size"]
    assert covered == 112
    assert AUTH["hmac_covers"] == {"offset": 0, "length": ap.AUTH_HMAC_OFFSET, "rfc": "RFC 8762 §4.4"}


@pytest.mark.parametrize("vec", AUTH["vectors"], ids=lambda v: v["name"])
def test_python_decodes_and_verifies_vector(vec):
    buf = bytes.fromhex(vec["hex"])
    table = sh.HmacKeyTable()
    table.add(42, bytes.fromhex(vec["key_hex"]))
    table.set_current(42)
    cls = ap.AuthSenderPacket if vec["kind"] == "sender" else ap.AuthReflectorPacket
    if not vec["valid"]:
        with pytest.raises(ap.MalformedAuthPacket, match="needs 112"):
            cls.decode(buf)
        with pytest.raises(ap.MalformedAuthPacket):
            ap.auth_verify(table, 1, buf)
        return
    pkt = cls.decode(buf)
    for name, want in vec["fields"].items():
        assert getattr(pkt, name) == want, name
    assert pkt.hmac.hex() == vec["hmac_hex"]
    if vec["hmac_ok"]:
        assert ap.auth_verify(table, 1, buf) == 42
        signed, key_id = ap.auth_sign(table, 1, buf[:96] + bytes(16))
        assert signed == buf and key_id == 42
        if "mbz" not in vec["name"]:  # MBZ is zero on encode: re-encoding is byte-identical
            assert pkt.encode() == buf
    else:
        with pytest.raises(sh.IntegrityError):
            ap.auth_verify(table, 1, buf)


@pytest.mark.parametrize("vec", HMAC["vectors"], ids=lambda v: v["name"])
def test_hmac_vector(vec):
    key, data = bytes.fromhex(vec["key_hex"]), bytes.fromhex(vec["data_hex"])
    assert sh.hmac_sha256(key, data).hex() == vec["hmac_sha256"]
    assert sh.hmac_sha256_128(key, data).hex() == vec["hmac_sha256_128"]


def test_hmac_vectors_include_rfc4231_cases_1_to_4_and_a_stamp_packet():
    names = [v["name"] for v in HMAC["vectors"]]
    assert names[:4] == [f"rfc4231_case{i}" for i in range(1, 5)]
    stamp = HMAC["vectors"][4]
    sender = AUTH["vectors"][0]
    assert stamp["data_hex"] == sender["hex"][:192] and stamp["hmac_sha256_128"] == sender["hmac_hex"]


def test_key_rotation_with_grace_window():
    t = sh.HmacKeyTable()
    t0 = 1000 * NS
    msg = bytes(range(96))
    with pytest.raises(sh.NoKey):
        t.sign(msg, t0)
    t.add(1, b"key-one")
    t.set_current(1)
    mac1, kid = t.sign(msg, t0)
    assert kid == 1
    t.rotate(2, b"key-two", now_ns=t0 + 10 * NS, grace_ns=5 * NS)
    mac2, kid = t.sign(msg, t0 + 11 * NS)
    assert kid == 2 and mac2 != mac1
    assert t.verify(msg, mac1, t0 + 14 * NS) == 1  # old key still accepted in its grace
    with pytest.raises(sh.IntegrityError):
        t.verify(msg, mac1, t0 + 15 * NS)  # grace over
    assert t.verify(msg, mac2, t0 + 15 * NS) == 2
    with pytest.raises(sh.IntegrityError):
        t.verify(msg, mac2, t0 + 9 * NS)  # new key not valid yet
    with pytest.raises(sh.IntegrityError):
        t.verify(msg[:-1] + b"\x00", mac2, t0 + 12 * NS)  # tampered octet 95
    t.remove(2)
    assert t.current_id is None
    t.set_current(1)
    with pytest.raises(sh.KeyExpired):
        t.sign(msg, t0 + 20 * NS)
    with pytest.raises(sh.NoKey):
        t.verify(msg, mac1, t0 + 20 * NS)


def test_key_table_refuses_bad_configuration_naming_the_field():
    t = sh.HmacKeyTable()
    t.add(1, b"k")
    with pytest.raises(ValueError, match="key_id 1 already present"):
        t.add(1, b"k2")
    with pytest.raises(ValueError, match="length 65"):
        t.add(2, bytes(65))
    with pytest.raises(ValueError, match="length 0"):
        t.add(2, b"")
    with pytest.raises(ValueError, match="validity window"):
        t.add(2, b"k", 5, 5)
    with pytest.raises(KeyError, match="key_id 7"):
        t.set_current(7)
    for i in range(2, 2 + sh.HMAC_KEYS_MAX - 1):
        t.add(i, b"k")
    with pytest.raises(ValueError, match="full"):
        t.add(99, b"k")


def test_c_hmac_matches_hashlib_on_every_padding_edge():
    """The self-contained C SHA-256/HMAC against Python's hashlib: message lengths 0..200
    (every SHA-256 padding case: 55/56/63/64/119/120 ...) and key lengths 1..130 (keys
    longer than the 64-byte block are hashed first, RFC 2104)."""
    import random
    import subprocess

    from _stamp_base_c import BINARY

    run_c_test()  # builds the binary
    rng = random.Random(8)
    cases = [(rng.randbytes(1 + i % 130), rng.randbytes(i)) for i in range(201)]
    stdin = "".join(f"{k.hex()} {d.hex() or '-'}\n" for k, d in cases)
    out = subprocess.run(
        [str(BINARY), "--hmac"], input=stdin, capture_output=True, text=True, timeout=30, check=True
    ).stdout.split()
    assert out == [sh.hmac_sha256(k, d).hex() for k, d in cases]
