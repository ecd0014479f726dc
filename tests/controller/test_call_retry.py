"""AgentClient.call: a read (List*) is repeated once when the transport broke under it (UNAVAILABLE,
or gRPC's "Stream removed" after a TLS stream corruption, grpc/grpc#28557); a change never is, and a
second failure is reported with node, method and code. The stub stands in for the generated one:
it is the retry policy under test, the channels themselves are tested against real agents."""

from __future__ import annotations

import grpc
import pytest

from controller.agents import AgentClient, AgentError
from controller.intent import NodeSpec, TlsFiles
from tests.agent.agent_env import make_test_pki


class Broken(grpc.RpcError):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


class FlakyStub:
    def __init__(self, failures):
        self.failures = list(failures)
        self.calls = 0

    def __getattr__(self, method):
        def call(request, timeout=None):
            self.calls += 1
            if self.failures:
                raise self.failures.pop(0)
            return f"{method} ok"

        return call


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    pki = make_test_pki(tmp_path_factory.mktemp("pki"))
    c = AgentClient(NodeSpec("A", "127.0.0.1:1", TlsFiles(str(pki.ca_pem), str(pki.client_pem), str(pki.client_key))))
    yield c
    c.close()


CORRUPTED = Broken(grpc.StatusCode.UNKNOWN, "Stream removed (Unwrap failed (TSI_DATA_CORRUPTED))")
DOWN = Broken(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")


@pytest.mark.parametrize("failure", [CORRUPTED, DOWN], ids=["tls-corrupted", "unavailable"])
def test_a_read_is_retried_once(client, failure):
    stub, before = FlakyStub([failure]), client.counter.retries
    assert client.call(stub, "ListPolicies", None) == "ListPolicies ok"
    assert stub.calls == 2 and client.counter.retries == before + 1


def test_a_read_failing_twice_is_reported(client):
    stub = FlakyStub([CORRUPTED, CORRUPTED])
    with pytest.raises(AgentError) as exc:
        client.call(stub, "ListFlowMonitors", None)
    assert stub.calls == 2 and "node A: ListFlowMonitors: UNKNOWN: Stream removed" in str(exc.value)


@pytest.mark.parametrize("failure", [CORRUPTED, DOWN], ids=["tls-corrupted", "unavailable"])
def test_a_change_is_never_retried(client, failure):
    stub = FlakyStub([failure])
    with pytest.raises(AgentError):
        client.call(stub, "CreatePolicy", None)
    assert stub.calls == 1


def test_other_errors_are_not_retried(client):
    stub = FlakyStub([Broken(grpc.StatusCode.INVALID_ARGUMENT, "segs: empty")])
    with pytest.raises(AgentError, match="INVALID_ARGUMENT"):
        client.call(stub, "ListPolicies", None)
    assert stub.calls == 1
