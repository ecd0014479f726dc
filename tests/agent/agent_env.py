"""Test helper: start a segscope agent (python -m agent) for one node of a netlab lab,
with fresh test certificates, and hand back its address and channel credentials.

    from tests.agent.agent_env import start_agent
    agent = start_agent(lab.ns("A"), "A", tmp_path)          # mutual TLS by default
    with agent.channel() as ch:
        Srv6ServiceStub(ch).ListPolicies(ListPoliciesRequest())
    agent.stop()

The agent listens on 127.0.0.1:0 (the kernel picks a free port; the agent prints it), so
concurrent test sessions never collide. Certificates (cryptography, EC P-256, 1 day):
a test CA, a server certificate for 127.0.0.1/localhost, a client certificate from the same CA
and a "rogue" client certificate from another CA (must be refused under mutual TLS).
"""

from __future__ import annotations

import atexit
import datetime as dt
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from ipaddress import ip_address
from pathlib import Path

import grpc

REPO = Path(__file__).resolve().parents[2]


# --- certificates -----------------------------------------------------------------------------
@dataclass
class Pki:
    dir: Path
    ca_pem: Path
    server_pem: Path
    server_key: Path
    client_pem: Path
    client_key: Path
    rogue_pem: Path  # client cert signed by a different CA
    rogue_key: Path

    def client_credentials(self, with_cert: bool = True, rogue: bool = False) -> grpc.ChannelCredentials:
        ca = self.ca_pem.read_bytes()
        if not with_cert:
            return grpc.ssl_channel_credentials(ca)
        cert, key = (self.rogue_pem, self.rogue_key) if rogue else (self.client_pem, self.client_key)
        return grpc.ssl_channel_credentials(ca, key.read_bytes(), cert.read_bytes())


def make_test_pki(directory: str | Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> Pki:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def save_key(path: Path, key) -> None:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        os.chmod(path, 0o600)

    def cert(cn: str, key, issuer: x509.Name, issuer_key, *, ca: bool, eku=None, sans=()) -> x509.Certificate:
        b = (
            x509.CertificateBuilder()
            .subject_name(name(cn))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if eku:
            b = b.add_extension(x509.ExtendedKeyUsage([eku]), critical=False)
        if sans:
            b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    def pem(path: Path, c: x509.Certificate) -> None:
        path.write_bytes(c.public_bytes(serialization.Encoding.PEM))

    ca_key, rogue_ca_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = cert("segscope agent test CA", ca_key, name("segscope agent test CA"), ca_key, ca=True)
    sans = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    p = Pki(
        d,
        d / "ca.pem",
        d / "server.pem",
        d / "server.key",
        d / "client.pem",
        d / "client.key",
        d / "rogue.pem",
        d / "rogue.key",
    )
    pem(p.ca_pem, ca)
    server_key, client_key, rogue_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    pem(
        p.server_pem,
        cert("agent", server_key, ca.subject, ca_key, ca=False, eku=ExtendedKeyUsageOID.SERVER_AUTH, sans=sans),
    )
    pem(p.client_pem, cert("controller", client_key, ca.subject, ca_key, ca=False, eku=ExtendedKeyUsageOID.CLIENT_AUTH))
    pem(
        p.rogue_pem,
        cert("rogue", rogue_key, name("rogue CA"), rogue_ca_key, ca=False, eku=ExtendedKeyUsageOID.CLIENT_AUTH),
    )
    save_key(p.server_key, server_key)
    save_key(p.client_key, client_key)
    save_key(p.rogue_key, rogue_key)
    return p


# --- the agent process ------------------------------------------------------------------------
@dataclass
class AgentHandle:
    node: str
    netns: str | None
    address: str  # "127.0.0.1:PORT"
    pki: Pki | None  # None: plaintext agent
    mtls: bool
    proc: subprocess.Popen
    log_path: Path
    codes: dict = field(default_factory=dict)

    def credentials(self, with_cert: bool = True, rogue: bool = False) -> grpc.ChannelCredentials:
        """Channel credentials of the test controller (client cert from the test CA)."""
        assert self.pki is not None, "plaintext agent: use grpc.insecure_channel(address)"
        return self.pki.client_credentials(with_cert, rogue)

    def channel(self, **kw) -> grpc.Channel:
        if self.pki is None:
            return grpc.insecure_channel(self.address)
        return grpc.secure_channel(self.address, self.credentials(**kw))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout_s: float = 20.0) -> int:
        if self.proc.returncode is not None:
            return self.proc.returncode
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait()


def start_agent(
    netns: str | None,
    node: str,
    run_dir: str | Path,
    *,
    tls: bool = True,
    mtls: bool = True,
    pki: Pki | None = None,
    kafka: str | None = None,
    instance: str | None = None,
    extra_args: list[str] | tuple[str, ...] = (),
    log_level: str = "INFO",
    timeout_s: float = 30.0,
) -> AgentHandle:
    """Start an agent for `node` (its netns), wait until its health service says SERVING."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if tls and pki is None:
        pki = make_test_pki(run_dir / f"certs-{node}")
    cmd = [sys.executable, "-m", "agent", "--node", node, "--listen", "127.0.0.1:0", "--log-level", log_level]
    if netns:
        cmd += ["--netns", netns]
    if instance:
        cmd += ["--instance", instance]
    if tls:
        cmd += ["--tls-cert", str(pki.server_pem), "--tls-key", str(pki.server_key)]
        if mtls:
            cmd += ["--tls-client-ca", str(pki.ca_pem)]
    else:
        cmd += ["--insecure"]
    if kafka:
        cmd += ["--kafka", kafka]
    cmd += list(extra_args)
    log_path = run_dir / f"agent-{node}.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "schemas" / "python")])}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True)
    handle = None
    deadline = time.monotonic() + timeout_s
    try:
        while handle is None:
            if proc.poll() is not None:
                raise RuntimeError(f"agent {node} exited {proc.returncode}: {log_path.read_text()[-3000:]}")
            m = re.search(r"listening on port (\d+)", log_path.read_text(errors="replace"))
            if m:
                handle = AgentHandle(
                    node, netns, f"127.0.0.1:{m.group(1)}", pki if tls else None, tls and mtls, proc, log_path
                )
                # the agent runs in its own session: make sure it does not outlive a caller that
                # forgets stop() or dies on an exception (stop() of a stopped agent is a no-op)
                atexit.register(handle.stop)
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"agent {node} did not start within {timeout_s} s: {log_path.read_text()[-3000:]}")
            time.sleep(0.05)
        with handle.channel() as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            while True:
                try:
                    if (
                        stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2).status
                        == health_pb2.HealthCheckResponse.SERVING
                    ):
                        return handle
                except grpc.RpcError as e:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"agent {node} not SERVING: {e.code().name} {e.details()}") from None
                time.sleep(0.05)
    except BaseException:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        raise
