"""A small private PKI for a lab: one CA, a server certificate per agent, a client certificate for
the controller (mutual TLS). For the demo, tests and benchmark; a real network brings its own.

    python -m controller.pki DIR --nodes A,R,B
    -> DIR/ca.pem, DIR/ca.key, DIR/agent-<node>.pem/.key (SAN: 127.0.0.1, ::1, localhost, <node>),
       DIR/controller.pem/.key (client auth)
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(cn: str) -> x509.Name:
    return x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "segscope lab"), x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    )


def _write_key(path: Path, key) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    os.chmod(path, 0o600)


def _cert(subject: str, key, issuer: x509.Name, issuer_key, *, ca: bool, usage=None, sans=()) -> x509.Certificate:
    now = dt.datetime.now(dt.timezone.utc)
    b = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if usage:
        b = b.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    if sans:
        b = b.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def make_pki(directory: str | Path, nodes: list[str]) -> dict[str, Path]:
    """Create (or overwrite) the files; returns their paths by role."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("segscope lab CA", ca_key, _name("segscope lab CA"), ca_key, ca=True)
    (d / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    _write_key(d / "ca.key", ca_key)
    paths = {"ca": d / "ca.pem"}
    for node in nodes:
        key = ec.generate_private_key(ec.SECP256R1())
        sans = [
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("::1")),
            x509.DNSName("localhost"),
            x509.DNSName(node),
        ]
        cert = _cert(
            f"segscope agent {node}",
            key,
            ca.subject,
            ca_key,
            ca=False,
            usage=[ExtendedKeyUsageOID.SERVER_AUTH],
            sans=sans,
        )
        (d / f"agent-{node}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(d / f"agent-{node}.key", key)
        paths[f"agent-{node}.pem"], paths[f"agent-{node}.key"] = d / f"agent-{node}.pem", d / f"agent-{node}.key"
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _cert("segscope controller", key, ca.subject, ca_key, ca=False, usage=[ExtendedKeyUsageOID.CLIENT_AUTH])
    (d / "controller.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(d / "controller.key", key)
    paths["controller.pem"], paths["controller.key"] = d / "controller.pem", d / "controller.key"
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--nodes", required=True, help="comma-separated node names")
    args = ap.parse_args()
    for role, path in make_pki(args.dir, args.nodes.split(",")).items():
        print(f"{role}: {path}")


if __name__ == "__main__":
    main()
