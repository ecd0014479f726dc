"""The local stack's Kafka with TLS, SASL and ACLs (`python -m services.stack up --kafka-security sasl_ssl`).

What it makes, under <run dir>/kafka/security/ (kept across restarts, remade with --fresh):

    ca.pem                     the stack's CA (its key ca.key stays here, 0600)
    broker.pem                 the broker's key and certificate (127.0.0.1, localhost), PEM keystore
    <role>/client.pem, .key    a client certificate per role (the listener requires one)
    <role>/password            a random password per role (0600)
    <role>/kafka.env           the SEGSCOPE_KAFKA_* settings of a program of that role (no secret
                               in it: it names the password file), for `set -a; . kafka.env`

The broker listens with SASL_SSL on the stack's Kafka port (TLS with a required client
certificate; SASL SCRAM-SHA-512, SCRAM-SHA-256 and PLAIN), its controller listener with mutual
TLS, and authorizes with KRaft's StandardAuthorizer: no ACL, no access. Users: one per role
(segscope_kafka.acls: agent, processor, telegraf, admin), SCRAM credentials written by
`kafka-storage format --add-scram` (its arguments in a 0600 file, `java @file`, so no password is
on a command line), PLAIN ones in the listener's JAAS config (server.properties, 0600). The
admin user is the super user; every other role gets segscope_kafka.acls.role_acls(role).

Each role's mechanism (ROLE_MECHANISM) is the one its clients log in with here: the agent's C tools
link Debian 12's librdkafka 2.0.2, whose SCRAM Kafka 4.x refuses (collectors/kafka_security.h), so
the agent role uses PLAIN over TLS; the others use SCRAM.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import secrets
import shutil
from pathlib import Path

from segscope_kafka import KafkaSecurity, from_env
from segscope_kafka.acls import ROLES, acl_bindings

ROLE_MECHANISM = {
    "admin": "SCRAM-SHA-512",
    "agent": "PLAIN",
    "processor": "SCRAM-SHA-512",
    "controller": "SCRAM-SHA-512",
    "telegraf": "SCRAM-SHA-512",
}
BROKER_CN = "segscope-stack-broker"


def user_of(role: str) -> str:
    return f"segscope-{role}"


def _write_private(path: Path, data: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


class StackKafkaSecurity:
    def __init__(self, kafka_dir: Path):
        self.dir = kafka_dir / "security"

    # ------------------------------------------------------------------ files
    def role_dir(self, role: str) -> Path:
        return self.dir / role

    def password(self, role: str) -> str:
        return (self.role_dir(role) / "password").read_text()

    def prepare(self, fresh: bool) -> None:
        """Make the CA, certificates and passwords, unless they exist (and not fresh)."""
        if fresh:
            shutil.rmtree(self.dir, ignore_errors=True)
        done = self.dir / "done.json"
        if done.exists() and json.loads(done.read_text()).get("roles") == list(ROLES):
            return  # made before, for these roles (a new role remakes them all: its user and ACLs too)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        os.chmod(self.dir, 0o700)
        self._make_pki()
        for role in ROLES:
            _write_private(self.role_dir(role) / "password", secrets.token_urlsafe(24))
            env = {f"SEGSCOPE_KAFKA_{k}": v for k, v in self._settings(role).items()}
            (self.role_dir(role) / "kafka.env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
        (self.dir / "done.json").write_text(json.dumps({"roles": list(ROLES), "mechanisms": ROLE_MECHANISM}))

    def _make_pki(self) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        def name(cn: str) -> x509.Name:
            return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

        now = dt.datetime.now(dt.timezone.utc)

        def cert(cn, key, issuer, issuer_key, ca=False, sans=()):
            b = (
                x509.CertificateBuilder()
                .subject_name(name(cn))
                .issuer_name(issuer)
                .public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5))
                .not_valid_after(now + dt.timedelta(days=30))
                .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
            )
            if sans:
                b = b.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
            return b.sign(issuer_key, hashes.SHA256())

        def key_pem(key) -> bytes:
            fmt = serialization.PrivateFormat.PKCS8  # Kafka's PEM keystore wants PKCS#8
            return key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption())

        def cert_pem(c) -> bytes:
            return c.public_bytes(serialization.Encoding.PEM)

        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = cert("segscope stack Kafka CA", ca_key, name("segscope stack Kafka CA"), ca_key, ca=True)
        (self.dir / "ca.pem").write_bytes(cert_pem(ca))
        _write_private(self.dir / "ca.key", key_pem(ca_key))
        key = ec.generate_private_key(ec.SECP256R1())
        sans = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
        _write_private(
            self.dir / "broker.pem", key_pem(key) + cert_pem(cert(BROKER_CN, key, ca.subject, ca_key, sans=sans))
        )
        for role in ROLES:
            key = ec.generate_private_key(ec.SECP256R1())
            (self.role_dir(role)).mkdir(parents=True, exist_ok=True)
            (self.role_dir(role) / "client.pem").write_bytes(cert_pem(cert(user_of(role), key, ca.subject, ca_key)))
            _write_private(self.role_dir(role) / "client.key", key_pem(key))

    def _settings(self, role: str, mechanism: str | None = None, password_file: Path | None = None) -> dict[str, str]:
        d = self.role_dir(role)
        return {
            "SECURITY_PROTOCOL": "SASL_SSL",
            "SASL_MECHANISM": mechanism or ROLE_MECHANISM[role],
            "SASL_USERNAME": user_of(role),
            "SASL_PASSWORD_FILE": str(password_file or d / "password"),
            "SSL_CA_FILE": str(self.dir / "ca.pem"),
            "SSL_CERT_FILE": str(d / "client.pem"),
            "SSL_KEY_FILE": str(d / "client.key"),
        }

    def client_env(self, role: str, mechanism: str | None = None, password_file: Path | None = None) -> dict[str, str]:
        """The SEGSCOPE_KAFKA_* variables of a program of `role` (another mechanism or password file: tests)."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
        return {f"SEGSCOPE_KAFKA_{k}": v for k, v in self._settings(role, mechanism, password_file).items()}

    def security(self, role: str) -> KafkaSecurity:
        return from_env(self.client_env(role))

    # ------------------------------------------------------------------ the broker
    def server_properties(self) -> dict[str, str]:
        """The template values of services/kafka/server.properties for a SASL_SSL broker."""
        jaas_users = " ".join(f'user_{user_of(r)}="{self.password(r)}"' for r in ROLES)
        admin, admin_pw = user_of("admin"), self.password("admin")
        lines = [
            "# SASL_SSL with ACLs (services/kafka/security.py); this file holds passwords: mode 0600",
            "sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256,PLAIN",
            "sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram."
            f'ScramLoginModule required username="{admin}" password="{admin_pw}";',
            "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram."
            "ScramLoginModule required;",
            "listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule "
            f'required username="{admin}" password="{admin_pw}" {jaas_users};',
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={self.dir / 'broker.pem'}",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={self.dir / 'ca.pem'}",
            # clients present a certificate (each role has one); the controller listener is mutual TLS
            "listener.name.sasl_ssl.ssl.client.auth=required",
            "listener.name.controller.ssl.client.auth=required",
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            f"super.users=User:{admin};User:CN={BROKER_CN}",
            "allow.everyone.if.no.acl.found=false",
        ]
        return {"LISTENER": "SASL_SSL", "CONTROLLER_PROTOCOL": "SSL", "SECURITY": "\n".join(lines)}

    def format_arguments(self) -> list[str]:
        """`kafka-storage format` arguments adding every role's SCRAM credentials (both SHA sizes)."""
        args = []
        for role in ROLES:
            for mech in ("SCRAM-SHA-512", "SCRAM-SHA-256"):
                args += ["--add-scram", f"{mech}=[name={user_of(role)},password={self.password(role)}]"]
        return args

    def apply_acls(self, admin) -> int:
        """Create every role's ACLs (idempotent); returns how many bindings were asked for."""
        bindings = [b for role in ROLES if role != "admin" for b in acl_bindings(role, f"User:{user_of(role)}")]
        for future in admin.create_acls(bindings, request_timeout=30).values():
            future.result(timeout=40)
        return len(bindings)
