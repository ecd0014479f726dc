"""Property-based fuzzing of the Python wire decoders (hypothesis, derandomized for CI).

Properties, per decoder: arbitrary and mutated input raises only the module's documented error
class (MalformedBatch / MalformedPacket / MalformedAuthPacket / MalformedTLV), never anything else;
encode -> decode round trips for valid values; decode -> encode gives back the input bytes where
the layout has no don't-care bits; decoding a memoryview slice of a bigger buffer gives the same
result as decoding a copy (no read outside the slice).

Two engines, the same properties:
- hypothesis (structured strategies, derandomized): SEGSCOPE_FUZZ_EXAMPLES examples in total (default
  3000, split over the tests below). Hypothesis costs ~2-4 ms per example on this shared 2-core VM,
  so 100 k of them would take minutes;
- a seeded random/mutation loop (test_decoders_bulk): SEGSCOPE_FUZZ_DECODER_INPUTS inputs (default
  100000, seed SEGSCOPE_FUZZ_SEED) spread over every decoder, ~10 us each.
`make test-quick` runs a fifth of both budgets (tests/budget.py).
"""

from __future__ import annotations

import collections
import importlib
import os
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from segscope_schemas import stamp_record as rec_mod
from segscope_schemas import stamp_test_packet as pkt_mod
from tests.budget import fuzz_count
from tests.fuzz.report import SUMMARY

TOTAL = fuzz_count("SEGSCOPE_FUZZ_EXAMPLES", 3000)
BULK = fuzz_count("SEGSCOPE_FUZZ_DECODER_INPUTS", 100_000)
SEED = int(os.environ.get("SEGSCOPE_FUZZ_SEED", "862"))
# share of the total per test (sums to 1.0)
SHARE = {
    "batch_random": 0.10,
    "batch_mutated": 0.15,
    "batch_roundtrip": 0.05,
    "batch_slice": 0.05,
    "packet_random": 0.10,
    "packet_roundtrip": 0.05,
    "auth_packet": 0.05,
    "tlv_area": 0.15,
    "tlv_roundtrip": 0.05,
    "tlv_modules": 0.25,
}
HISTOGRAM: collections.Counter = collections.Counter()


def budget(name: str) -> settings:
    return settings(
        max_examples=max(10, int(TOTAL * SHARE[name])),
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )


def outcome(name: str, fn, *args, errors: tuple[type[Exception], ...]):
    """Call fn; count ok / documented error (by reason); let any other exception fail the test."""
    try:
        result = fn(*args)
    except errors as e:
        HISTOGRAM[f"{name}: {type(e).__name__}:{getattr(e, 'reason', getattr(e, 'kind', ''))}"] += 1
        return None
    HISTOGRAM[f"{name}: ok"] += 1
    return result


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    total = sum(HISTOGRAM.values())
    lines = [f"[fuzz] decoders: {total} inputs (hypothesis budget {TOTAL}, bulk loop {BULK})"]
    lines += [f"[fuzz]   {k:60s} {v:7d}" for k, v in sorted(HISTOGRAM.items())]
    SUMMARY.extend(lines)


# ---- stamp_batch / stamp_record ---------------------------------------------------------


def records_strategy(max_n: int = 8):
    raw = st.binary(min_size=0, max_size=max_n * rec_mod.STAMP_RECORD_SIZE)
    return raw.map(
        lambda b: np.frombuffer(
            b[: len(b) - len(b) % rec_mod.STAMP_RECORD_SIZE], dtype=rec_mod.STAMP_RECORD_DTYPE
        ).copy()
    )


node_names = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\0"), max_size=10).filter(
    lambda s: len(s.encode()) <= rec_mod.STAMP_BATCH_NODE_LEN
)


@budget("batch_random")
@given(st.binary(max_size=400) | st.binary(max_size=40).map(lambda b: rec_mod.STAMP_BATCH_MAGIC + b))
def test_batch_random_bytes(buf):
    outcome("decode_batch(random)", rec_mod.decode_batch, buf, errors=(rec_mod.MalformedBatch,))


def _mutate(data: st.DataObject, buf: bytes) -> bytes:
    op = data.draw(st.sampled_from(["flip", "truncate", "extend", "field"]))
    b = bytearray(buf)
    if op == "flip" and b:
        for _ in range(data.draw(st.integers(1, 8))):
            i = data.draw(st.integers(0, len(b) - 1))
            b[i] ^= 1 << data.draw(st.integers(0, 7))
    elif op == "truncate":
        b = b[: data.draw(st.integers(0, len(b)))]
    elif op == "extend":
        b += data.draw(st.binary(min_size=1, max_size=130))
    else:  # a header field lie: header_size, record_size, record_count
        off, fmt = data.draw(st.sampled_from([(4, "<H"), (6, "<H"), (8, "<I")]))
        if len(b) >= off + struct.calcsize(fmt):
            val = data.draw(st.integers(0, 2 ** (8 * struct.calcsize(fmt)) - 1))
            struct.pack_into(fmt, b, off, val)
    return bytes(b)


@budget("batch_mutated")
@given(records_strategy(), node_names, st.integers(0, 2**64 - 1), st.data())
def test_batch_mutated(recs, node, seq, data):
    buf = _mutate(data, rec_mod.encode_batch(recs, node, seq))
    got = outcome("decode_batch(mutated)", rec_mod.decode_batch, buf, errors=(rec_mod.MalformedBatch,))
    if got is not None:
        hdr, out = got
        # accepted: the declared records fill the buffer exactly after the header
        assert hdr.header_size + len(out) * rec_mod.STAMP_RECORD_SIZE == len(buf)


@budget("batch_roundtrip")
@given(records_strategy(), node_names, st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1))
def test_batch_roundtrip(recs, node, seq, flags):
    buf = rec_mod.encode_batch(recs, node, seq, flags)
    hdr, out = outcome("decode_batch(valid)", rec_mod.decode_batch, buf, errors=())
    assert (hdr.record_count, hdr.flags, hdr.batch_seq, hdr.node) == (len(recs), flags, seq, node)
    assert out.tobytes() == recs.tobytes()
    assert rec_mod.encode_batch(out, hdr.node, hdr.batch_seq, hdr.flags) == buf


@budget("batch_slice")
@given(records_strategy(4), st.binary(max_size=70), st.binary(max_size=70), st.data())
def test_batch_memoryview_slice(recs, before, after, data):
    """decode of a slice of a bigger buffer: same as decoding a copy, and views stay inside the slice."""
    msg = (
        _mutate(data, rec_mod.encode_batch(recs, "n", 1))
        if data.draw(st.booleans())
        else rec_mod.encode_batch(recs, "n", 1)
    )
    big = bytearray(before + msg + after)
    view = memoryview(big)[len(before) : len(before) + len(msg)]
    a = outcome("decode_batch(slice)", rec_mod.decode_batch, view, errors=(rec_mod.MalformedBatch,))
    try:
        b = rec_mod.decode_batch(bytes(msg))
    except rec_mod.MalformedBatch as e:
        assert a is None, f"slice decoded, copy raised {e}"
        return
    assert a is not None and a[0] == b[0] and a[1].tobytes() == b[1].tobytes()
    if len(a[1]):  # the record view lies inside the slice's memory
        base = np.frombuffer(big, dtype=np.uint8).ctypes.data
        start = a[1].ctypes.data - base
        assert len(before) <= start and start + a[1].nbytes <= len(before) + len(msg)


# ---- base test packets ------------------------------------------------------------------


@budget("packet_random")
@given(st.binary(max_size=120))
def test_packets_random_bytes(buf):
    for cls in (pkt_mod.SenderPacket, pkt_mod.ReflectorPacket):
        p = outcome(f"{cls.__name__}.decode", cls.decode, buf, errors=(pkt_mod.MalformedPacket,))
        assert (p is None) == (len(buf) < pkt_mod.STAMP_BASE_LEN)
        if p is not None:  # the decoder reads the first 44 bytes only; encode zeroes the MBZ fields
            enc = p.encode()
            assert len(enc) == pkt_mod.STAMP_BASE_LEN and cls.decode(enc) == p
            assert cls.decode(memoryview(buf)[: pkt_mod.STAMP_BASE_LEN]) == p


u32, u16, u8 = st.integers(0, 2**32 - 1), st.integers(0, 2**16 - 1), st.integers(0, 255)


@budget("packet_roundtrip")
@given(st.tuples(u32, u32, u32, u16, u16), st.tuples(u32, u32, u32, u16, u16, u32, u32, u32, u32, u32, u16, u8))
def test_packets_roundtrip(s, r):
    sp = pkt_mod.SenderPacket(*s)
    assert pkt_mod.SenderPacket.decode(sp.encode()) == sp
    rp = pkt_mod.ReflectorPacket(*r)
    assert pkt_mod.ReflectorPacket.decode(rp.encode()) == rp
    HISTOGRAM["packets: round trips"] += 2


@budget("auth_packet")
@given(st.binary(max_size=200))
def test_auth_packet_random_bytes(buf):
    auth = pytest.importorskip("segscope_schemas.stamp_auth_packet")
    for cls in (auth.AuthSenderPacket, auth.AuthReflectorPacket):
        p = outcome(f"{cls.__name__}.decode", cls.decode, buf, errors=(auth.MalformedAuthPacket,))
        assert (p is None) == (len(buf) < auth.AUTH_LEN)
        if p is not None:
            assert cls.decode(p.encode()) == p


# ---- TLVs (RFC 8972 / RFC 9503) ----------------------------------------------------------


def tlv_mod():
    return pytest.importorskip("segscope_schemas.stamp_tlv")


@budget("tlv_area")
@given(st.binary(max_size=160), st.integers(0, 60))
def test_tlv_area_random(buf, offset):
    t = tlv_mod()
    tlvs = outcome("parse_tlvs(random)", t.parse_tlvs, buf, offset, errors=(t.MalformedTLV,))
    if offset > len(buf):
        assert tlvs is None
    if tlvs is not None:  # accepted: the TLVs tile the area exactly and re-encode to it
        assert b"".join(x.encode() for x in tlvs) == bytes(buf[offset:])
        assert t.parse_tlvs(memoryview(buf), offset) == tlvs


@budget("tlv_roundtrip")
@given(st.lists(st.tuples(u8, u8, st.binary(max_size=40)), max_size=6), st.binary(max_size=44))
def test_tlv_area_roundtrip(items, base):
    t = tlv_mod()
    area = b"".join(t.encode_tlv(typ, val, flags) for flags, typ, val in items)
    tlvs = outcome("parse_tlvs(valid)", t.parse_tlvs, base + area, len(base), errors=())
    assert [(x.flags, x.type, x.value) for x in tlvs] == [(f, ty, v) for f, ty, v in items]


def _tlv_classes():
    """(module name, Type, class) for every per-TLV module present: stamp_tlv_<element>.py."""
    t = pytest.importorskip("segscope_schemas.stamp_tlv")
    out = []
    pkg_dir = os.path.dirname(t.__file__)
    for fn in sorted(os.listdir(pkg_dir)):
        if not (fn.startswith("stamp_tlv_") and fn.endswith(".py")):
            continue
        mod = importlib.import_module(f"segscope_schemas.{fn[:-3]}")
        for obj in vars(mod).values():
            if (
                isinstance(obj, type)
                and obj.__module__ == mod.__name__
                and hasattr(obj, "decode")
                and hasattr(obj, "encode")
                and hasattr(mod, "TYPE")
            ):
                out.append((fn[:-3], mod.TYPE, obj))
    return out


@budget("tlv_modules")
@given(st.data())
def test_tlv_modules_decode(data):
    t = tlv_mod()
    classes = _tlv_classes()
    assert classes, "stamp_tlv is present but no stamp_tlv_<element> module with TYPE and a decoder"
    name, typ, cls = data.draw(st.sampled_from(classes))
    # mostly the right Type with a consistent Length (reaches the value checks), sometimes anything
    value = data.draw(
        st.binary(max_size=80)
        | st.lists(st.tuples(u8, u8, st.binary(max_size=20)), max_size=4).map(
            lambda subs: bytes(4) + b"".join(t.encode_tlv(ty, v, f) for f, ty, v in subs)
        )
    )
    buf = t.encode_tlv(typ, value, data.draw(u8)) if data.draw(st.integers(0, 9)) else data.draw(st.binary(max_size=90))
    got = outcome(f"{name}.decode", cls.decode, buf, errors=(t.MalformedTLV,))
    if got is not None:
        again = cls.decode(got.encode())
        assert again == got  # decode o encode o decode = decode
        assert cls.decode(memoryview(buf)) == got


# ---- bulk: seeded random and mutated inputs through every decoder -------------------------


def _bulk_decoders(rng):
    """(name, make() -> bytes, decode, documented errors, check(buf, result), make() is always valid)."""
    import random as _r  # noqa: F401  (rng is a random.Random)

    def batch():
        n = rng.randrange(5)
        recs = np.frombuffer(rng.randbytes(n * rec_mod.STAMP_RECORD_SIZE), dtype=rec_mod.STAMP_RECORD_DTYPE)
        return rec_mod.encode_batch(recs, rng.choice(["A", "demo-A", "é" * 16, ""]), rng.randrange(2**64))

    def batch_check(buf, res):
        hdr, recs = res
        assert hdr.header_size + len(recs) * rec_mod.STAMP_RECORD_SIZE == len(buf)

    decs = [("decode_batch", batch, rec_mod.decode_batch, (rec_mod.MalformedBatch,), batch_check, True)]
    for cls in (pkt_mod.SenderPacket, pkt_mod.ReflectorPacket):
        decs.append(
            (
                f"{cls.__name__}.decode",
                lambda: rng.randbytes(44 + rng.choice([0, 0, 4, 20])),
                cls.decode,
                (pkt_mod.MalformedPacket,),
                lambda buf, res, cls=cls: cls.decode(res.encode()) == res or pytest.fail("re-decode differs"),
                True,
            )
        )
    try:
        auth = importlib.import_module("segscope_schemas.stamp_auth_packet")
        for cls in (auth.AuthSenderPacket, auth.AuthReflectorPacket):
            decs.append(
                (
                    f"{cls.__name__}.decode",
                    lambda: rng.randbytes(112),
                    cls.decode,
                    (auth.MalformedAuthPacket,),
                    lambda buf, res, cls=cls: cls.decode(res.encode()) == res or pytest.fail("re-decode differs"),
                    True,
                )
            )
    except ImportError:
        pass
    try:
        t = importlib.import_module("segscope_schemas.stamp_tlv")
    except ImportError:
        return decs

    def area():
        return bytes(44) + b"".join(
            t.encode_tlv(rng.randrange(12), rng.randbytes(rng.choice([0, 4, 8, 12, 16, 20])), rng.randrange(256))
            for _ in range(rng.randrange(5))
        )

    def area_check(buf, res):
        assert b"".join(x.encode() for x in res) == bytes(buf[44:])

    decs.append(("parse_tlvs", area, lambda b: t.parse_tlvs(b, 44), (t.MalformedTLV,), area_check, True))
    for name, typ, cls in _tlv_classes():

        def make(typ=typ):
            subs = b"".join(
                t.encode_tlv(rng.randrange(16), rng.randbytes(rng.choice([4, 8, 12, 16])))
                for _ in range(rng.randrange(3))
            )
            value = rng.choice([rng.randbytes(rng.choice([0, 4, 8, 12, 16, 20, 24, 32])), bytes(4) + subs, subs])
            return t.encode_tlv(typ, value, rng.randrange(256))

        def check(buf, res, cls=cls):
            assert cls.decode(res.encode()) == res

        # make() is only plausible here (random values of the right Type), not always valid
        decs.append((f"{name}.decode", make, cls.decode, (t.MalformedTLV,), check, False))
    return decs


def _bulk_mutate(rng, b: bytes) -> bytes:
    op = rng.randrange(7)
    if op == 0 and b:
        b = bytearray(b)
        for _ in range(rng.randint(1, 6)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        return bytes(b)
    if op == 1:
        return b[: rng.randrange(len(b) + 1)]
    if op == 2:
        return b + rng.randbytes(rng.randint(1, 70))
    if op == 3 and len(b) >= 4:  # a 16/32-bit length-ish field anywhere in the first 64 bytes
        i = rng.randrange(min(len(b) - 1, 63))
        return b[:i] + rng.choice([b"\0\0", b"\xff\xff", rng.randbytes(2)]) + b[i + 2 :]
    if op == 4:
        return rng.randbytes(rng.randrange(130))
    return b


def _same(a, b) -> bool:
    """Equal decode results (numpy record arrays by bytes), or the same error with the same text."""
    if isinstance(a, Exception) or isinstance(b, Exception):
        return type(a) is type(b) and str(a) == str(b)
    if isinstance(a, tuple) and len(a) == 2 and isinstance(a[1], np.ndarray):
        return a[0] == b[0] and a[1].tobytes() == b[1].tobytes()
    return a == b


def test_decoders_bulk():
    import random

    rng = random.Random(SEED)
    decs = _bulk_decoders(rng)
    for i in range(BULK):
        name, make, decode, errors, check, make_valid = decs[i % len(decs)]
        valid = make()
        buf = valid if rng.random() < 0.15 else _bulk_mutate(rng, valid)
        if rng.random() < 0.3:  # a slice of a bigger buffer must decode like a copy
            pad = rng.randbytes(rng.randrange(1, 9))
            view = memoryview(pad + buf + pad)[len(pad) : len(pad) + len(buf)]
            try:
                a = decode(view)
            except errors as e:
                a = e
            try:
                b = decode(bytes(buf))
            except errors as e:
                b = e
            assert _same(a, b), f"{name}: slice -> {a!r}, copy -> {b!r} for {bytes(buf).hex()}"
        res = outcome(f"bulk {name}", decode, buf, errors=errors)
        if res is not None:
            check(buf, res)
        if buf is valid and make_valid:
            assert res is not None, f"{name}: a valid input was rejected: {buf.hex()}"
