"""TLS and mutual TLS (a client without a certificate, or with one from another CA, is refused),
plaintext only on request, the health service and server reflection."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from segscope_proto.segscope.agent.v1 import srv6_pb2 as pb
from segscope_proto.segscope.agent.v1 import srv6_pb2_grpc
from tests.agent.agent_env import start_agent

SERVICES = {
    "segscope.agent.v1.Srv6Service",
    "segscope.agent.v1.StampService",
    "segscope.agent.v1.FlowMonitorService",
    "segscope.agent.v1.InlineMonitorService",
}


def list_policies(channel: grpc.Channel) -> list[str]:
    return [
        p.destination
        for p in srv6_pb2_grpc.Srv6ServiceStub(channel).ListPolicies(pb.ListPoliciesRequest(), timeout=5).policies
    ]


def test_mtls_accepts_the_controller_and_refuses_others(agents):
    a = agents["A"]
    assert a.mtls
    with a.channel() as ch:
        assert "fd00:b::/64" in list_policies(ch)
    for kw in (dict(with_cert=False), dict(rogue=True)):
        with grpc.secure_channel(a.address, a.credentials(**kw)) as ch:
            with pytest.raises(grpc.RpcError) as e:
                list_policies(ch)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE, kw
    with grpc.insecure_channel(a.address) as ch:  # plaintext to a TLS port
        with pytest.raises(grpc.RpcError) as e:
            list_policies(ch)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE


def test_server_tls_without_client_ca_and_plaintext_on_request(lab, pki, tmp_path):
    tls = start_agent(lab.ns("H1"), "H1", tmp_path / "tls", pki=pki, mtls=False)
    plain = start_agent(lab.ns("H2"), "H2", tmp_path / "plain", tls=False)
    try:
        with grpc.secure_channel(tls.address, pki.client_credentials(with_cert=False)) as ch:
            assert list_policies(ch) == []  # H1 has no SRv6 policy; TLS without client cert is fine
        # the client checks the server: a CA that did not sign the server cert fails
        with grpc.secure_channel(tls.address, grpc.ssl_channel_credentials(pki.rogue_pem.read_bytes())) as ch:
            with pytest.raises(grpc.RpcError) as e:
                list_policies(ch)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        with grpc.insecure_channel(plain.address) as ch:
            assert list_policies(ch) == []
        assert "listening on 127.0.0.1:0" in tls.log() and "(port" in tls.log() and "TLS" in tls.log()
        assert "plaintext" in plain.log()
    finally:
        assert tls.stop() == 0 and plain.stop() == 0


def test_agent_refuses_to_start_without_tls_or_with_bad_flags(tmp_path):
    import subprocess
    import sys

    from tests.agent.agent_env import REPO

    base = [sys.executable, "-m", "agent", "--node", "X", "--listen", "127.0.0.1:0"]
    for extra, msg in (
        ([], "--tls-cert and --tls-key are required"),
        (["--insecure", "--netns", "agt-nonexistent"], "--netns: no network namespace"),
        (["--tls-cert", str(tmp_path / "nope.pem"), "--tls-key", "x"], "--tls_cert".replace("_", "-")),
        (["--insecure", "--health", "9644"], "--health='9644' is not HOST:PORT; fix"),
        (["--insecure", "--stamp-linger-ms", "20000"], "--stamp-linger-ms: 20000 out of range 0..10000 ms"),
    ):
        r = subprocess.run(base + extra, capture_output=True, text=True, cwd=REPO, timeout=30)
        assert r.returncode == 2 and msg in r.stderr, (extra, r.stderr)


def test_health_serving_for_every_service(agents):
    with agents["B"].channel() as ch:
        h = health_pb2_grpc.HealthStub(ch)
        for svc in ["", *SERVICES]:
            assert (
                h.Check(health_pb2.HealthCheckRequest(service=svc), timeout=5).status
                == health_pb2.HealthCheckResponse.SERVING
            ), svc
        with pytest.raises(grpc.RpcError) as e:
            h.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_lists_and_describes_the_services(agents):
    with agents["R"].channel() as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        reqs = [
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol="segscope.agent.v1.Srv6Service"),
        ]
        answers = list(stub.ServerReflectionInfo(iter(reqs), timeout=5))
        names = {s.name for s in answers[0].list_services_response.service}
        assert SERVICES <= names and "grpc.health.v1.Health" in names
        from google.protobuf import descriptor_pb2

        fd = descriptor_pb2.FileDescriptorProto.FromString(answers[1].file_descriptor_response.file_descriptor_proto[0])
        assert fd.package == "segscope.agent.v1"
        methods = {m.name for s in fd.service for m in s.method}
        assert {"CreatePolicy", "UpdatePolicy", "ApplyBatch", "StreamOperations"} <= methods
