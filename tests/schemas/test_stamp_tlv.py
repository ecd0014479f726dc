"""STAMP TLVs (schemas/*/stamp_tlv*): RFC vectors in Python and C, round trips, reflector rules.

Vectors: schemas/vectors/stamp_tlv*.json, hex typed from the RFC 8972 / RFC 9503 figures.
Randomized parts use a fixed seed and are cross-checked against the C headers by writing them
as vector files for build/schemas/test_tlv_codecs (Python and C must agree byte for byte).
"""

from __future__ import annotations

import json
import random
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from segscope_schemas import stamp_tlv as st
from segscope_schemas import stamp_tlv_access_report as ar
from segscope_schemas import stamp_tlv_class_of_service as cos
from segscope_schemas import stamp_tlv_dest_node_addr as dna
from segscope_schemas import stamp_tlv_direct_measurement as dm
from segscope_schemas import stamp_tlv_extra_padding as pad
from segscope_schemas import stamp_tlv_follow_up_telemetry as fut
from segscope_schemas import stamp_tlv_hmac as hm
from segscope_schemas import stamp_tlv_location as loc
from segscope_schemas import stamp_tlv_return_path as rp
from segscope_schemas import stamp_tlv_timestamp_info as tsi
from segscope_schemas import stamp_tlvs

REPO = Path(__file__).resolve().parents[2]
VECTORS = REPO / "schemas" / "vectors"
C_TEST = REPO / "build" / "schemas" / "test_tlv_codecs"
C_TEST_ASAN = REPO / "build" / "schemas" / "test_tlv_codecs_asan"

CLASSES = {
    "stamp_tlv_extra_padding": pad.ExtraPadding,
    "stamp_tlv_location": loc.Location,
    "stamp_tlv_timestamp_info": tsi.TimestampInfo,
    "stamp_tlv_class_of_service": cos.ClassOfService,
    "stamp_tlv_direct_measurement": dm.DirectMeasurement,
    "stamp_tlv_access_report": ar.AccessReport,
    "stamp_tlv_follow_up_telemetry": fut.FollowUpTelemetry,
    "stamp_tlv_hmac": hm.Hmac,
    "stamp_tlv_dest_node_addr": dna.DestNodeAddr,
    "stamp_tlv_return_path": rp.ReturnPath,
}


def _hex(s: str) -> bytes:
    return bytes.fromhex(s.replace(" ", ""))


def _norm(v):
    """Vector field values compared with hex spacing/case removed."""
    if isinstance(v, str):
        return v.replace(" ", "").lower()
    if isinstance(v, list):
        return [_norm(x) for x in v]
    if isinstance(v, dict):
        return {k: _norm(x) for k, x in v.items()}
    return v


def _subs(tlvs: list[st.TLV]) -> list[dict]:
    return [{"flags": t.flags, "type": t.type, "value": t.value.hex()} for t in tlvs]


def py_fields(element: str, obj) -> dict:
    """The decoded object in the vector-file field vocabulary."""
    if element == "stamp_tlv_extra_padding":
        return {"flags": obj.flags, "length": len(obj.padding), "padding": obj.padding.hex()}
    if element == "stamp_tlv_location":
        return {"flags": obj.flags, "dst_port": obj.dst_port, "src_port": obj.src_port, "sub_tlvs": _subs(obj.sub_tlvs)}
    if element == "stamp_tlv_timestamp_info":
        return {
            "flags": obj.flags,
            "sync_src_in": obj.sync_src_in,
            "ts_in": obj.ts_in,
            "sync_src_out": obj.sync_src_out,
            "ts_out": obj.ts_out,
            "sub_tlvs": _subs(obj.sub_tlvs),
        }
    if element == "stamp_tlv_hmac":
        return {"flags": obj.flags, "hmac": obj.hmac.hex()}
    if element == "stamp_tlv_dest_node_addr":
        return {"flags": obj.flags, "family": obj.family, "address": obj.address.hex()}
    if element == "stamp_tlv_return_path":
        ra = obj.return_address
        cc = obj.control_code
        return {
            "flags": obj.flags,
            "control_code": -1 if cc is None else cc,
            "reply_requested": int(obj.reply_requested),
            "return_family": dna.family_of(ra) if ra else 0,
            "return_address": ra.hex() if ra else "",
            "segments": [s.hex() for s in obj.segments],
            "labels": obj.labels,
            "sub_count": len(obj.sub_tlvs),
        }
    return dict(vars(obj))


def _files() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(VECTORS.glob("stamp_tlv*.json"))}


FILES = _files()
CODEC_CASES = [(el, v) for el, doc in FILES.items() if el in CLASSES for v in doc["vectors"] if "kind" not in v]
REFLECTOR_CASES = [(el, v) for el, doc in FILES.items() for v in doc["vectors"] if v.get("kind") == "reflector"]
AREA_CASES = [v for v in FILES["stamp_tlv"]["vectors"] if v["kind"] == "area"]
REFLECT_CASES = [v for v in FILES["stamp_tlv"]["vectors"] if v["kind"] == "reflect"]
N_VECTORS = sum(len(doc["vectors"]) for doc in FILES.values())


def test_every_tlv_has_a_vector_file_with_valid_and_malformed_cases():
    assert set(CLASSES) <= set(FILES)
    for el in CLASSES:
        doc = FILES[el]
        assert doc["type"] == __import__(f"segscope_schemas.{el}", fromlist=["TYPE"]).TYPE
        kinds = {v["valid"] for v in doc["vectors"] if "kind" not in v}
        assert kinds == {True, False}, f"{el} needs valid and malformed vectors"
        assert all(v["cite"].startswith(("RFC", "IANA", "decoder")) for v in doc["vectors"]), el


@pytest.mark.parametrize("element,vec", CODEC_CASES, ids=[f"{e}:{v['name']}" for e, v in CODEC_CASES])
def test_codec_vector_python(element, vec):
    cls = CLASSES[element]
    raw = _hex(vec["hex"])
    if vec["valid"]:
        obj = cls.decode(raw)
        assert py_fields(element, obj) == _norm(vec["fields"])
        assert obj.encode() == raw
    else:
        with pytest.raises(st.MalformedTLV) as exc:
            cls.decode(raw)
        assert exc.value.kind == vec["error"]
        # and the reflector's table calls it malformed (M flag) when the header itself fits
        if vec["error"] in ("length", "value"):
            flags, t, length = struct.unpack_from("!BBH", raw)
            assert stamp_tlvs.value_check(t, raw[4 : 4 + length]) is False


@pytest.mark.parametrize("base_len", [0, st.BASE_LEN_UNAUTH, st.BASE_LEN_AUTH])
@pytest.mark.parametrize("vec", AREA_CASES, ids=[v["name"] for v in AREA_CASES])
def test_area_vector_python(vec, base_len):
    packet = bytes(base_len) + _hex(vec["hex"])
    if "error" in vec:
        with pytest.raises(st.MalformedTLV) as exc:
            st.parse_tlvs(packet, base_len)
        assert exc.value.kind == vec["error"]
    else:
        got = [[t.flags, t.type, t.length] for t in st.parse_tlvs(packet, base_len)]
        assert got == vec["tlvs"]
        assert all(t.offset >= base_len for t in st.parse_tlvs(packet, base_len))


def _base(base_len: int) -> bytes:
    return struct.pack("!I", 1) + bytes(base_len - 4)


@pytest.mark.parametrize("vec", REFLECT_CASES, ids=[v["name"] for v in REFLECT_CASES])
def test_reflect_vector_python(vec):
    base_len = vec["base_len"]
    packet = _base(base_len) + _hex(vec["hex"])
    calls = []

    def verify(text: bytes, mac: bytes) -> bool:
        calls.append((text, mac))
        return vec["hmac_ok"]

    out, res = stamp_tlvs.reflect(packet, base_len, verify if "hmac_ok" in vec else None)
    assert bytes(out[base_len:]) == _hex(vec["out"])
    assert bytes(out[:base_len]) == packet[:base_len]
    assert res.tlvs == vec["tlvs"] and res.unknown == vec["unknown"]
    assert (res.malformed_at if res.malformed_at is not None else -1) == vec["malformed_at"]
    assert res.integrity_failed == vec["integrity_failed"]
    assert (res.error or "ok") == vec["error"]
    if "hmac_text" in vec:
        assert [c[0] for c in calls] == [_hex(vec["hmac_text"])]
        assert hm.covered_text(packet, base_len, res.hmac_offset) == _hex(vec["hmac_text"])


def _vec(element: str, name: str, key: str):
    return next(v for v in FILES[element]["vectors"] if v["name"] == name)[key]


def _reflect_one(element: str, raw: bytes, args: dict) -> bytes:
    """The generic RFC 8972 §4 rule, then the element's reflector helper."""
    flags, value = st.split_tlv(raw, raw[1])
    assert stamp_tlvs.value_check(raw[1], value) is True
    flags = st.reflected_flags(True, False, False)
    if element == "stamp_tlv_class_of_service":
        value = cos.reflect(value, args["received_tos"], bool(args["dscp1_applied"]))
    elif element == "stamp_tlv_location":
        h = {k: bytes.fromhex(args[k]) for k in ("mac", "src_ip", "dst_ip") if k in args}
        value = loc.reflect(
            value,
            args["dst_port"],
            args["src_port"],
            src_mac=h.get("mac"),
            src_ip=h.get("src_ip"),
            dst_ip=h.get("dst_ip"),
        )
    elif element == "stamp_tlv_direct_measurement":
        value = dm.reflect(value, args["r_rx"], args["r_tx"])
    elif element == "stamp_tlv_timestamp_info":
        value = tsi.reflect(value, args["sync_src_in"], args["ts_in"], args["sync_src_out"], args["ts_out"])
    elif element == "stamp_tlv_dest_node_addr":
        flags = dna.reflected_flags(flags, bool(args["address_is_ours"]))
    else:
        raise AssertionError(f"no reflector helper for {element}")
    return st.encode_tlv(raw[1], value, flags)


@pytest.mark.parametrize("element,vec", REFLECTOR_CASES, ids=[f"{e}:{v['name']}" for e, v in REFLECTOR_CASES])
def test_reflector_duty_vector_python(element, vec):
    out = _reflect_one(element, _hex(vec["in"]), vec["args"])
    assert out == _hex(vec["hex"])
    assert len(out) == len(_hex(vec["in"]))  # the reflected packet keeps its size


def test_reflector_duties_cover_every_tlv_with_reflector_fields():
    covered = {el for el, _ in REFLECTOR_CASES}
    assert covered == {
        "stamp_tlv_class_of_service",
        "stamp_tlv_location",
        "stamp_tlv_direct_measurement",
        "stamp_tlv_timestamp_info",
        "stamp_tlv_dest_node_addr",
    }


def test_decoders_reject_other_types_and_trailing_bytes():
    good = _hex(_vec("stamp_tlv_class_of_service", "sender_dscp1_af41", "hex"))
    for cls in CLASSES.values():
        if cls is cos.ClassOfService:
            continue
        with pytest.raises(st.MalformedTLV) as exc:
            cls.decode(good)
        assert exc.value.kind == "type"
    with pytest.raises(st.MalformedTLV) as exc:
        cos.ClassOfService.decode(good + b"\x00")
    assert exc.value.kind == "short"


# ---- C -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def c_test() -> Path:
    if shutil.which("make") is None or shutil.which("cc") is None:
        pytest.fail("make and cc are needed to build the C vector test")
    subprocess.run(
        ["make", "-C", str(REPO / "schemas"), "../build/schemas/test_tlv_codecs"],
        check=True,
        capture_output=True,
        text=True,
    )
    return C_TEST


def _run_c(binary: Path, vec_dir: Path) -> tuple[int, int, str]:
    proc = subprocess.run([str(binary), str(vec_dir)], capture_output=True, text=True, timeout=60)
    m = re.search(r"^(\d+) passed, (\d+) failed$", proc.stdout, re.M)
    assert m, proc.stdout + proc.stderr
    return int(m.group(1)), int(m.group(2)), proc.stdout


def test_c_decodes_every_vector(c_test):
    passed, failed, out = _run_c(c_test, VECTORS)
    assert failed == 0, out
    assert passed == N_VECTORS


@pytest.fixture(scope="module")
def c_test_asan() -> Path:
    subprocess.run(
        ["make", "-C", str(REPO / "schemas"), "../build/schemas/test_tlv_codecs_asan"],
        check=True,
        capture_output=True,
        text=True,
    )
    return C_TEST_ASAN


def test_c_sanitized_vectors_and_100k_fuzz(c_test_asan):
    """ASan/UBSan build: the vectors, then 100k random/mutated TLV areas in exact-size buffers."""
    passed, failed, out = _run_c(c_test_asan, VECTORS)
    assert (passed, failed) == (N_VECTORS, 0), out
    proc = subprocess.run([str(c_test_asan), "--fuzz", "100000", "7"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    m = re.search(
        r"fuzz: (\d+) packets: clean (\d+), malformed (\d+), broken tail (\d+), integrity (\d+); "
        r"decoders: (\d+) decoded, (\d+) rejected, (\d+) bytes",
        proc.stdout,
    )
    assert m, proc.stdout
    total, clean, malformed, tail, integrity, decoded, rejected, differ = map(int, m.groups())
    assert total == 100000 == clean + malformed + tail + integrity
    assert min(clean, malformed, tail, integrity) > 1000  # every outcome exercised
    assert decoded > 1000 and decoded + rejected == 10 * total and differ == 0


# ---- randomized, fixed seed ----------------------------------------------------------------

RNG_SEED = 20260401


def _random_tlv(rng: random.Random):
    el = rng.choice(sorted(CLASSES))
    r = rng.randrange
    f = rng.choice([0, 0, st.FLAG_U, st.FLAG_M, st.FLAG_I, st.FLAG_U | st.FLAG_I])
    rb = lambda n: bytes(r(256) for _ in range(n))  # noqa: E731
    if el == "stamp_tlv_extra_padding":
        obj = pad.ExtraPadding(rb(r(0, 200)), f)
    elif el == "stamp_tlv_location":
        subs = []
        for _ in range(r(0, 4)):
            t = r(1, 10)  # every Location sub-TLV type
            subs.append(st.TLV(rng.choice([0, st.FLAG_U]), t, rb(loc.SUB_LENGTH[t])))
        obj = loc.Location(r(65536), r(65536), subs, f)
    elif el == "stamp_tlv_timestamp_info":
        subs = [st.TLV(0, r(256), rb(r(0, 12))) for _ in range(r(0, 3))]
        obj = tsi.TimestampInfo(r(256), r(256), r(256), r(256), subs, f)
    elif el == "stamp_tlv_class_of_service":
        obj = cos.ClassOfService(r(64), r(64), r(4), r(4), f)
    elif el == "stamp_tlv_direct_measurement":
        obj = dm.DirectMeasurement(r(2**32), r(2**32), r(2**32), f)
    elif el == "stamp_tlv_access_report":
        obj = ar.AccessReport(r(16), r(256), f)
    elif el == "stamp_tlv_follow_up_telemetry":
        obj = fut.FollowUpTelemetry(r(2**32), r(2**32), r(2**32), r(256), f)
    elif el == "stamp_tlv_hmac":
        obj = hm.Hmac(rb(16), f)
    elif el == "stamp_tlv_dest_node_addr":
        obj = dna.DestNodeAddr(rb(rng.choice([4, 16])), f)
    else:
        choice = r(4)
        if choice == 0:
            subs = [rp.control_code(r(2**32))]
        elif choice == 1:
            subs = [rp.return_address(rb(rng.choice([4, 16])))]
        elif choice == 2:
            subs = [rp.srv6_segments([rb(16) for _ in range(r(1, 8))])]
        else:
            subs = [st.TLV(0, rp.SUB_SR_MPLS_LABELS, rb(4 * r(1, 6)))]
        if choice != 0 and rng.random() < 0.3:
            subs.insert(0, rp.control_code(rng.choice([rp.CC_NO_REPLY, rp.CC_REPLY_SAME_LINK])))
        obj = rp.ReturnPath(subs, f)
    return el, obj


def test_random_round_trips_python_and_c(c_test, tmp_path):
    rng = random.Random(RNG_SEED)
    by_element: dict[str, list] = {}
    for i in range(600):
        el, obj = _random_tlv(rng)
        raw = obj.encode()
        back = CLASSES[el].decode(raw)
        assert back.encode() == raw
        assert py_fields(el, back) == py_fields(el, obj)
        by_element.setdefault(el, []).append(
            {
                "name": f"random_{i}",
                "cite": "randomized (Python encoder)",
                "hex": raw.hex(),
                "valid": True,
                "fields": py_fields(el, obj),
            }
        )
    for el, vecs in by_element.items():
        (tmp_path / f"{el}.json").write_text(json.dumps({"element": el, "vectors": vecs}))
    passed, failed, out = _run_c(c_test, tmp_path)
    assert (passed, failed) == (600, 0), out


def _mutated_area(rng: random.Random) -> bytes:
    area = b"".join(_random_tlv(rng)[1].encode() for _ in range(rng.randrange(0, 4)))
    if rng.random() < 0.3:
        area += st.encode_tlv(rng.randrange(11, 256), bytes(rng.randrange(0, 9)))  # unknown type
    area = bytearray(area)
    for _ in range(rng.randrange(0, 4)):
        op = rng.randrange(3)
        if op == 0 and area:
            area[rng.randrange(len(area))] = rng.randrange(256)
        elif op == 1 and area:
            del area[rng.randrange(len(area)) :]
        else:
            area += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 5)))
    return bytes(area)


def test_random_reflection_python_matches_c(c_test, tmp_path):
    """Mutated TLV areas: Python reflects them, the C reflector must write the same bytes."""
    rng = random.Random(RNG_SEED + 1)
    vecs = []
    flag_only = 0
    for i in range(500):
        area = _mutated_area(rng)
        base_len = rng.choice([st.BASE_LEN_UNAUTH, st.BASE_LEN_AUTH])
        packet = _base(base_len) + area
        hmac_ok = rng.random() < 0.5
        seen = []

        def check_hmac(text, mac, seen=seen, hmac_ok=hmac_ok):
            return seen.append(text) or hmac_ok

        out, res = stamp_tlvs.reflect(packet, base_len, check_hmac)
        assert len(out) == len(packet)
        # the reflector rewrites flag bytes only
        diff = [k for k in range(len(packet)) if out[k] != packet[k]]
        assert all(k - base_len in _header_offsets(area) for k in diff)
        flag_only += bool(diff)
        vec = {
            "kind": "reflect",
            "name": f"random_{i}",
            "cite": "randomized",
            "base_len": base_len,
            "hex": area.hex(),
            "out": bytes(out[base_len:]).hex(),
            "tlvs": res.tlvs,
            "unknown": res.unknown,
            "malformed_at": -1 if res.malformed_at is None else res.malformed_at,
            "integrity_failed": res.integrity_failed,
            "error": res.error or "ok",
            "hmac_ok": hmac_ok,
        }
        if seen:
            vec["hmac_text"] = seen[0].hex()
        vecs.append(vec)
    assert flag_only > 50  # the mutations exercised the rules, not only clean passes
    (tmp_path / "stamp_tlv.json").write_text(json.dumps({"element": "stamp_tlv", "vectors": vecs}))
    passed, failed, out = _run_c(c_test, tmp_path)
    assert (passed, failed) == (500, 0), out


def _header_offsets(area: bytes) -> set[int]:
    offs, off = set(), 0
    while len(area) - off >= 4:
        offs.add(off)
        off += 4 + struct.unpack_from("!H", area, off + 2)[0]
    return offs


def test_random_bytes_never_crash_the_python_decoders():
    rng = random.Random(RNG_SEED + 2)
    outcomes = {"ok": 0, "malformed": 0}
    for _ in range(3000):
        raw = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
        if len(raw) >= 2 and rng.random() < 0.8:
            raw = raw[:1] + bytes([rng.randrange(1, 11)]) + raw[2:]
        if len(raw) >= 4 and rng.random() < 0.5:
            raw = raw[:2] + struct.pack("!H", len(raw) - 4) + raw[4:]
        for cls in CLASSES.values():
            try:
                cls.decode(raw)
                outcomes["ok"] += 1
            except st.MalformedTLV:
                outcomes["malformed"] += 1
    assert outcomes["ok"] > 100 and outcomes["malformed"] > 1000


def test_reflect_with_the_real_hmac_sets_i_only_on_tampering():
    """stamp_hmac (RFC 8762 §4.4) plugged in as the verify callback: good HMAC clean, a flipped bit -> I."""
    from segscope_schemas import stamp_hmac

    key = bytes(range(32))
    base = _base(st.BASE_LEN_AUTH)
    tlvs = (
        cos.ClassOfService(34, flags=st.SENDER_FLAGS).encode() + dm.DirectMeasurement(7, flags=st.SENDER_FLAGS).encode()
    )
    mac = stamp_hmac.hmac_sha256_128(key, base[:4] + tlvs)
    packet = base + tlvs + hm.Hmac(mac, flags=st.SENDER_FLAGS).encode()

    def verify(text: bytes, got: bytes) -> bool:
        return stamp_hmac.hmac.compare_digest(stamp_hmac.hmac_sha256_128(key, text), got)

    out, res = stamp_tlvs.reflect(packet, st.BASE_LEN_AUTH, verify)
    assert not res.integrity_failed and res.tlvs == 3
    assert [t.flags for t in st.parse_tlvs(bytes(out), st.BASE_LEN_AUTH)] == [0, 0, 0]

    tampered = bytearray(packet)
    tampered[st.BASE_LEN_AUTH + 5] ^= 0x04  # a DSCP bit of the Class of Service TLV
    out, res = stamp_tlvs.reflect(bytes(tampered), st.BASE_LEN_AUTH, verify)
    assert res.integrity_failed
    assert [t.flags for t in st.parse_tlvs(bytes(out), st.BASE_LEN_AUTH)] == [st.FLAG_I] * 3

    tampered = bytearray(packet)
    tampered[3] ^= 1  # the Sequence Number is covered too (RFC 8972 §4.8)
    assert stamp_tlvs.reflect(bytes(tampered), st.BASE_LEN_AUTH, verify)[1].integrity_failed
