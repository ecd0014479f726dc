"""cluster/dns.py, the local cluster's DNS: the names it builds from the API's Services and
EndpointSlices, and its answers on the wire (parsed back here as a resolver would)."""

from __future__ import annotations

import http.server
import json
import socket
import ssl
import struct
import subprocess
import threading
from pathlib import Path

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


def make_ca_and_server_cert(where: Path) -> None:
    """A CA of its own and a server certificate for 127.0.0.1 that it signs, as cluster.sh makes them."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=where)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
            "-days", "1", "-subj", "/CN=test-cluster-ca")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=api")
    (where / "tls.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "tls.crt", "-days", "1", "-extfile", "tls.ext")  # fmt: skip


def serve_api(where: Path) -> http.server.HTTPServer:
    """An HTTPS server answering the two lists the DNS reads."""

    class Api(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(SERVICES if self.path == "/api/v1/services" else SLICES).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Api)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(where / "tls.crt", where / "tls.key")
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_reads_the_api_with_the_clusters_ca_whatever_the_environments_bundle(tmp_path, monkeypatch):
    """This machine exports REQUESTS_CA_BUNDLE (the system's CAs); requests prefers it to a session's
    own CA, and the DNS then failed every refresh against the cluster's API server."""
    make_ca_and_server_cert(tmp_path)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    server = serve_api(tmp_path)
    try:
        names = dns.Names(
            f"https://127.0.0.1:{server.server_port}",
            (str(tmp_path / "tls.crt"), str(tmp_path / "tls.key")),
            str(tmp_path / "ca.crt"),
            "cluster.local",
        )
        names.refresh()
    finally:
        server.shutdown()
    assert names.table["segscope-kafka.segscope.svc.cluster.local"] == ["10.96.4.7"]
