"""The cluster DNS of the local single-node cluster (scripts/cluster.sh), in place of CoreDNS, which
the Go module proxy does not serve: A records for

    <service>.<namespace>.svc.<domain>            the ClusterIP, or for a headless Service its
                                                  ready endpoints' addresses
    <hostname>.<service>.<namespace>.svc.<domain> a StatefulSet pod behind its governing Service

read from the API server every `--poll` seconds. Every other name is NXDOMAIN (no upstream: the
machine reaches no resolver), AAAA of a known name is an empty answer. UDP only, which is what the
resolvers in the images (glibc) use for these short answers.

    python -m cluster.dns --listen 172.30.0.1:53 --server https://172.30.0.1:6443 \
        --ca ca.crt --cert admin.crt --key admin.key
"""

from __future__ import annotations

import argparse
import socket
import struct
import threading
import time

import requests

TYPE_A, TYPE_AAAA, CLASS_IN = 1, 28, 1
FLAG_RESPONSE_AA_RD_RA = 0x8580
RCODE_NXDOMAIN = 3
TTL_S = 5


def records(services: dict, slices: dict, domain: str) -> dict[str, list[str]]:
    """Name -> IPv4 addresses, from a Service list and an EndpointSlice list of the API."""
    names: dict[str, list[str]] = {}
    headless: set[str] = set()
    for svc in services.get("items", []):
        meta, spec = svc["metadata"], svc.get("spec", {})
        name = f"{meta['name']}.{meta['namespace']}.svc.{domain}"
        if spec.get("clusterIP") in (None, "", "None"):
            headless.add(name)
            names[name] = []
        else:
            names[name] = [spec["clusterIP"]]
    for sl in slices.get("items", []):
        svc = sl["metadata"].get("labels", {}).get("kubernetes.io/service-name")
        if not svc or sl.get("addressType") != "IPv4":
            continue
        base = f"{svc}.{sl['metadata']['namespace']}.svc.{domain}"
        for ep in sl.get("endpoints") or []:
            if not (ep.get("conditions") or {}).get("ready", False):
                continue
            if ep.get("hostname"):
                names[f"{ep['hostname']}.{base}"] = list(ep["addresses"])
            if base in headless:
                names[base].extend(ep["addresses"])
    return names


def parse_question(packet: bytes) -> tuple[str, int, int]:
    """The first question's (name, type, end offset) of a DNS query."""
    labels, pos = [], 12
    while packet[pos]:
        length = packet[pos]
        labels.append(packet[pos + 1 : pos + 1 + length].decode("ascii", "replace").lower())
        pos += 1 + length
    qtype = struct.unpack_from("!H", packet, pos + 1)[0]
    return ".".join(labels), qtype, pos + 5


def answer(packet: bytes, names: dict[str, list[str]]) -> bytes:
    qid = packet[:2]
    name, qtype, end = parse_question(packet)
    question = packet[12:end]
    addresses = names.get(name.rstrip("."))
    if addresses is None:
        header = qid + struct.pack("!HHHHH", FLAG_RESPONSE_AA_RD_RA | RCODE_NXDOMAIN, 1, 0, 0, 0)
        return header + question
    rrs = []
    if qtype == TYPE_A:
        for ip in addresses:
            rrs.append(struct.pack("!HHHIH", 0xC00C, TYPE_A, CLASS_IN, TTL_S, 4) + socket.inet_aton(ip))
    header = qid + struct.pack("!HHHHH", FLAG_RESPONSE_AA_RD_RA, 1, len(rrs), 0, 0)
    return header + question + b"".join(rrs)


class Names:
    """The current name table, refreshed from the API server in a thread."""

    def __init__(self, server: str, tls: tuple[str, str], ca: str, domain: str) -> None:
        self.session = requests.Session()
        self.session.cert, self.session.verify = tls, ca
        # requests lets REQUESTS_CA_BUNDLE (and proxy variables) of the environment override the
        # session's own CA: the API server is signed by the cluster's CA alone, and is local.
        self.session.trust_env = False
        self.server, self.domain = server, domain
        self.table: dict[str, list[str]] = {}

    def refresh(self) -> None:
        svcs = self.session.get(f"{self.server}/api/v1/services", timeout=5).json()
        slices = self.session.get(f"{self.server}/apis/discovery.k8s.io/v1/endpointslices", timeout=5).json()
        self.table = records(svcs, slices, self.domain)

    def poll(self, every_s: float) -> None:
        while True:
            try:
                self.refresh()
            except (requests.RequestException, ValueError, KeyError) as e:
                print(f"cluster dns: refresh failed: {e}", flush=True)
            time.sleep(every_s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", required=True, help="IP:PORT to answer on")
    ap.add_argument("--server", required=True, help="the API server's URL")
    ap.add_argument("--ca", required=True)
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--domain", default="cluster.local")
    ap.add_argument("--poll", type=float, default=1.0, help="seconds between refreshes")
    args = ap.parse_args(argv)
    names = Names(args.server, (args.cert, args.key), args.ca, args.domain)
    threading.Thread(target=names.poll, args=(args.poll,), daemon=True).start()
    host, port = args.listen.rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((host, int(port)))
    print(f"cluster dns: answering on {args.listen} for *.svc.{args.domain}", flush=True)
    while True:
        packet, peer = sock.recvfrom(512)
        try:
            sock.sendto(answer(packet, names.table), peer)
        except (IndexError, struct.error):
            continue  # not a query we can parse: no answer, the client retries or gives up
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
