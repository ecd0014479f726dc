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


INLINE_GOOD = json.loads(pr.VECTORS[4][1])
IOAM_GOOD = json.loads(pr.VECTORS[5][1])


def test_ioam_interfaces_may_be_given_as_bare_ids():
    value = json.dumps({**IOAM_GOOD, "interfaces": {"r1": 71, "r0": 70}}).encode()
    rec = pr.decode(b"ioam/R", value)
    got = [(i.device, i.if_id, i.ifindex, i.prefixes) for i in rec.interfaces]
    assert got == [("r0", 70, None, ()), ("r1", 71, None, ())]
    assert pr.path_tag(pr.decode(*pr.VECTORS[4][:2])) == "fc00:2::e,fc00:3::d6"


@pytest.mark.parametrize(
    "key,value,reason",
    [
        (b"inline/A/7/tx", json.dumps({**INLINE_GOOD, "trace_nodes": 13}).encode(), "bad_field"),
        (b"inline/A/7/tx", json.dumps({**INLINE_GOOD, "sampling": 0}).encode(), "bad_field"),
        (
            b"inline/A/7/tx",
            json.dumps({k: v for k, v in INLINE_GOOD.items() if k != "sampling"}).encode(),
            "missing_field",
        ),
        (b"inline/A/7/up", None, None),  # the key is well-formed: a tombstone of a side name the value would refuse
        (b"ioam/", None, "bad_key"),
        (b"ioam/R/1", None, "bad_key"),
        (b"ioam/S", pr.VECTORS[5][1], "key_mismatch"),
        (b"ioam/R", json.dumps({**IOAM_GOOD, "node_id": 1 << 24}).encode(), "bad_field"),
        (b"ioam/R", json.dumps({**IOAM_GOOD, "interfaces": {"r0": 70, "r1": 70}}).encode(), "bad_field"),
        (b"ioam/R", json.dumps({**IOAM_GOOD, "interfaces": {"r0": 65535}}).encode(), "bad_field"),
        (b"ioam/R", json.dumps({**IOAM_GOOD, "interfaces": {"r0": {"id": 1, "ifindex": 0}}}).encode(), "bad_field"),
        (b"ioam/R", json.dumps({**IOAM_GOOD, "namespaces": ["1"]}).encode(), "bad_field"),
        (b"ioam/R", json.dumps({**IOAM_GOOD, "kind": "flow"}).encode(), "bad_field"),
        (b"flow/R/7/tx", pr.VECTORS[5][1], "key_mismatch"),
    ],
)
def test_malformed_inline_and_ioam_records_are_refused(key, value, reason):
    if reason is None:
        assert pr.decode(key, value) is None
        return
    with pytest.raises(pr.MalformedPathRecord) as e:
        pr.decode(key, value)
    assert e.value.reason == reason


def test_encode_refuses_what_decode_would_refuse():
    with pytest.raises(pr.MalformedPathRecord):
        pr.encode(pr.PathRecord.stamp("a/b", 1, "sender", [], [], 1))


@pytest.mark.parametrize(
    "change",
    [
        {"sample_interval_us": 5},  # both rules at once
        {"sampling": 0},  # none (no interval either)
        {"sample_interval_us": -1, "sampling": 0},
        {"trace_nodes": 0},  # a tx side sizes the trace
    ],
)
def test_a_tx_inline_record_has_one_sampling_rule_and_a_trace_size(change):
    with pytest.raises(pr.MalformedPathRecord) as e:
        pr.decode(b"inline/A/7/tx", json.dumps({**INLINE_GOOD, **change}).encode())
    assert e.value.reason == "bad_field"


def test_rx_inline_records_may_leave_the_ingress_parameters_out():
    rx = pr.decode(*pr.VECTORS[-1][:2])
    assert (rx.role, rx.trace_nodes, rx.sampling, rx.sample_interval_us) == ("rx", 0, 0, 0)
    # and the interval rule reads back (records without it are "1 in N" ones, as before)
    tx = pr.decode(*pr.VECTORS[-2][:2])
    assert (tx.sampling, tx.sample_interval_us) == (0, 1000)
    assert pr.decode(*pr.VECTORS[4][:2]).sample_interval_us == 0
