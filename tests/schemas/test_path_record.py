"""segscope.paths records (schemas/paths.md): the vectors both ways, and every malformed value is
refused with its reason (the PathBook counts them instead of crashing)."""

from __future__ import annotations

import json

import pytest

from segscope_schemas import path_record as pr


@pytest.mark.parametrize("key,value,record", pr.VECTORS)
def test_vectors_decode_and_encode_byte_for_byte(key, value, record):
    assert pr.decode(key, value) == record
    if record is not None:
        assert pr.encode(record) == (key, value)
    else:
        parts = key.decode().split("/")
        if parts[0] == pr.IOAM:
            assert pr.tombstone(pr.IOAM, parts[1]) == (key, None)
        else:
            kind, node, ident, role = parts
            assert pr.tombstone(kind, node, int(ident), role) == (key, None)


def test_path_tag_is_the_inventory_value():
    assert pr.path_tag(pr.decode(*pr.VECTORS[0][:2])) == "fc00:2::e"
    assert pr.path_tag(pr.decode(*pr.VECTORS[1][:2])) == "direct"  # no SIDs: as segscope_stamp_session
    assert pr.path_tag(pr.decode(*pr.VECTORS[2][:2])) == "fc00:2::e,fc00:3::d6"
    assert pr.path_tag(pr.PathRecord.flow("B", 7, "rx", [], "rfc9343", 100, 1)) == "flowmonid"


def test_same_route_ignores_only_the_publication_time():
    a = pr.PathRecord.stamp("A", 1, "sender", ["fc00:2::e"], [], 1)
    assert a.same_route(pr.PathRecord.stamp("A", 1, "sender", ["fc00:2::e"], [], 99))
    assert not a.same_route(pr.PathRecord.stamp("A", 1, "sender", ["fc00:3::e"], [], 1))
    assert not a.same_route(None)


GOOD = json.loads(pr.VECTORS[2][1])


@pytest.mark.parametrize(
    "key,value,reason",
    [
        (None, pr.VECTORS[2][1], "no_key"),
        (b"\xff", None, "bad_key"),
        (b"flow/A/x/tx", None, "bad_key"),
        (b"session/A/1/tx", None, "bad_key"),
        (b"flow/A/7", None, "bad_key"),
        (b"flow/A/7/tx", b"{not json", "bad_json"),
        (b"flow/A/7/tx", b"[1]", "not_an_object"),
        (b"flow/A/7/tx", json.dumps({**GOOD, "v": 2}).encode(), "unsupported_version"),
        (b"flow/A/7/tx", json.dumps({k: v for k, v in GOOD.items() if k != "path"}).encode(), "missing_field"),
        (b"flow/A/7/tx", json.dumps({**GOOD, "flow_id": "7"}).encode(), "bad_field"),
        (b"flow/A/7/tx", json.dumps({**GOOD, "path": "fc00::1"}).encode(), "bad_field"),
        (b"flow/A/7/tx", json.dumps({**GOOD, "path": ["a,b"]}).encode(), "bad_field"),
        (b"flow/A/7/tx", json.dumps({**GOOD, "method": "colour"}).encode(), "bad_field"),
        (b"flow/A/7/tx", json.dumps({**GOOD, "kind": "other"}).encode(), "bad_field"),
        (b"flow/A/8/tx", pr.VECTORS[2][1], "key_mismatch"),
        (b"stamp/A/70000/sender", json.dumps({**json.loads(pr.VECTORS[0][1]), "ssid": 70000}).encode(), "bad_field"),
    ],
)
def test_malformed_records_are_refused_with_their_reason(key, value, reason):
    with pytest.raises(pr.MalformedPathRecord) as e:
        pr.decode(key, value)
    assert e.value.reason == reason


def test_encode_refuses_what_decode_would_refuse():
    with pytest.raises(pr.MalformedPathRecord):
        pr.encode(pr.PathRecord.stamp("a/b", 1, "sender", [], [], 1))


INGRESS = json.loads(pr.VECTORS[4][1])
IOAM = json.loads(pr.VECTORS[6][1])


def _with(base: dict, **kw) -> bytes:
    return json.dumps({**base, **kw}).encode()


@pytest.mark.parametrize(
    "key,value,reason",
    [
        (b"inline/A/101", None, "bad_key"),
        (b"ioam/", None, "bad_key"),
        (b"ioam/R1/x", None, "bad_key"),
        (b"inline/A/101/ingress", _with(INGRESS, side="tx"), "bad_field"),
        (b"inline/A/101/ingress", _with(INGRESS, namespace=0), "bad_field"),
        (b"inline/A/101/ingress", _with(INGRESS, path=[]), "bad_field"),
        (b"inline/A/101/ingress", _with(INGRESS, trace_nodes=13), "bad_field"),
        (b"inline/A/101/ingress", _with(INGRESS, sample_interval_us=5), "bad_field"),  # two sampling modes
        (b"inline/A/101/ingress", _with(INGRESS, sample_every=0), "bad_field"),  # none
        (b"inline/A/101/ingress", _with(INGRESS, sample_every="100"), "bad_field"),
        (b"inline/A/101/egress", _with(INGRESS, side="egress"), "bad_field"),  # egress with ingress parameters
        (b"inline/A/102/ingress", pr.VECTORS[4][1], "key_mismatch"),
        (
            b"inline/A/101/ingress",
            json.dumps({k: v for k, v in INGRESS.items() if k != "namespace"}).encode(),
            "missing_field",
        ),
        (b"ioam/R1", _with(IOAM, node_id=0), "bad_field"),
        (b"ioam/R1", _with(IOAM, node_id=0xFFFFFF), "bad_field"),
        (b"ioam/R1", _with(IOAM, interfaces={"r1b": 0xFFFF}), "bad_field"),
        (b"ioam/R1", _with(IOAM, interfaces={"r1b": 5, "r1c": 5}), "bad_field"),
        (b"ioam/R1", _with(IOAM, interfaces=["r1b"]), "bad_field"),
        (b"ioam/R1", _with(IOAM, namespaces=[0]), "bad_field"),
        (b"ioam/R2", pr.VECTORS[6][1], "key_mismatch"),
    ],
)
def test_malformed_inline_and_ioam_records(key, value, reason):
    with pytest.raises(pr.MalformedPathRecord) as e:
        pr.decode(key, value)
    assert e.value.reason == reason, e.value


def test_inline_path_tag_and_same_route():
    rec = pr.decode(*pr.VECTORS[4][:2])
    assert pr.path_tag(rec) == "fc00:11::e,fc00:12::e,fc00:3::d6"
    assert rec.same_route(pr.PathRecord.inline("A", 101, "ingress", rec.path, 1, 4, 100, 0, 5))
    assert not rec.same_route(pr.PathRecord.inline("A", 101, "ingress", rec.path, 1, 4, 10, 0, 5))
    ioam = pr.decode(*pr.VECTORS[6][:2])
    assert dict(ioam.interfaces) == {"r1b": 12, "r1c": 13} and ioam.namespaces == (1, 7)
    assert not ioam.same_route(rec) and not rec.same_route(ioam)
    assert ioam.same_route(pr.IoamIdentity.of("R1", 0xABCDEF, {"r1b": 12, "r1c": 13}, [1, 7], 9))
