"""cluster/dns.py, the local cluster's DNS: the names it builds from the API's Services and
EndpointSlices, and its answers on the wire (parsed back here as a resolver would)."""

from __future__ import annotations

import socket
import struct

from cluster import dns

SERVICES = {
    "items": [
        {"metadata": {"name": "segscope-kafka", "namespace": "segscope"}, "spec": {"clusterIP": "10.96.4.7"}},
        {"metadata": {"name": "segscope-kafka-headless", "namespace": "segscope"}, "spec": {"clusterIP": "None"}},
    ]
}
SLICES = {
    "items": [
        {
            "metadata": {"namespace": "segscope", "labels": {"kubernetes.io/service-name": "segscope-kafka-headless"}},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.244.0.9"], "hostname": "segscope-kafka-0", "conditions": {"ready": True}},
                {"addresses": ["10.244.0.10"], "hostname": "segscope-kafka-1", "conditions": {"ready": False}},
            ],
        }
    ]
}


def query(name: str, qtype: int = dns.TYPE_A) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    return struct.pack("!HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + labels + b"\0" + struct.pack("!HH", qtype, 1)


def parse(reply: bytes) -> tuple[int, int, list[str]]:
    qid, flags, _, ancount, _, _ = struct.unpack_from("!HHHHHH", reply)
    _, _, pos = dns.parse_question(reply)
    addrs = []
    for _ in range(ancount):
        _, rtype, _, _, rdlen = struct.unpack_from("!HHHIH", reply, pos)
        pos += 12
        addrs.append(socket.inet_ntoa(reply[pos : pos + rdlen]))
        pos += rdlen
    return qid, flags & 0xF, addrs


def test_names_of_services_headless_services_and_statefulset_pods():
    names = dns.records(SERVICES, SLICES, "cluster.local")
    assert names["segscope-kafka.segscope.svc.cluster.local"] == ["10.96.4.7"]
    # headless: the ready endpoints only
    assert names["segscope-kafka-headless.segscope.svc.cluster.local"] == ["10.244.0.9"]
    assert names["segscope-kafka-0.segscope-kafka-headless.segscope.svc.cluster.local"] == ["10.244.0.9"]
    assert "segscope-kafka-1.segscope-kafka-headless.segscope.svc.cluster.local" not in names


def test_answers_on_the_wire():
    names = dns.records(SERVICES, SLICES, "cluster.local")
    assert parse(dns.answer(query("segscope-kafka.segscope.svc.cluster.local"), names)) == (0x1234, 0, ["10.96.4.7"])
    # a name of the search path that is not ours: NXDOMAIN, so the resolver tries the next suffix
    assert parse(dns.answer(query("segscope-kafka.svc.cluster.local"), names)) == (0x1234, dns.RCODE_NXDOMAIN, [])
    # AAAA of a known name: an empty answer, not an error (the pods resolve both families)
    aaaa = query("segscope-kafka.segscope.svc.cluster.local", dns.TYPE_AAAA)
    assert parse(dns.answer(aaaa, names)) == (0x1234, 0, [])
