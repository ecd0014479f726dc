"""Node names as Kubernetes names them (RFC 1123: worker-1, rtr-2.example): the chart passes the
node's name to its agent (--node=$(NODE_NAME)), so the intent, the agent and every place a node's
name is a key or a tag take them; the labs' names (A, R1, core_1) stay valid. The limit is the
batch header's node field (32 bytes): a longer name is refused where it is given, with the rule."""

from __future__ import annotations

import numpy as np
import pytest

from agent.__main__ import parse_args
from controller.intent import IntentError, parse_intent
from processors.delay.aggregate import escape_tag
from processors.topology.model import safe_key
from segscope_schemas import stamp_record
from segscope_schemas.batch_envelope import BATCH_NODE_LEN, node_name_problem

KUBERNETES_NAMES = ["worker-1", "rtr-2.example", "ip-10-0-3-17.ec2.internal", "a" * BATCH_NODE_LEN]
LAB_NAMES = ["A", "R1", "core_1", "x"]
BAD_NAMES = ["-worker", "worker-", "worker.", ".worker", "a b", "a/b", "a,b", "a=b", "", "a" * (BATCH_NODE_LEN + 1)]

TLS = {"ca": "/c/ca.crt", "cert": "/c/tls.crt", "key": "/c/tls.key"}


def intent_text(sender: str, reflector: str) -> str:
    return f"""version: 1
nodes:
  {sender!r}: {{agent: "127.0.0.1:20100", tls: {TLS}}}
  {reflector!r}: {{agent: "127.0.0.1:20101", tls: {TLS}}}
stamp_sessions:
  - ssid: 7
    sender: {{node: {sender!r}, address: "fc00:84::1", dev: eth0}}
    reflector: {{node: {reflector!r}, address: "fc00:84::2", dev: eth0}}
    segs: []
    return_segs: []
    rate_pps: 20
"""


@pytest.mark.parametrize("name", KUBERNETES_NAMES + LAB_NAMES)
def test_the_intent_takes_kubernetes_and_lab_node_names(name):
    intent = parse_intent(intent_text(name, "refl-1"))
    assert set(intent.nodes) == {name, "refl-1"}
    session = intent.stamp_sessions[0]
    assert (session.sender.node, session.reflector.node) == (name, "refl-1")


@pytest.mark.parametrize("name", BAD_NAMES)
def test_the_intent_refuses_a_bad_node_name_with_the_rule(name):
    with pytest.raises(IntentError) as err:
        parse_intent(intent_text(name, "refl-1"))
    text = str(err.value)
    assert f"node name {name!r} is not valid" in text and "[A-Za-z0-9_.-]" in text, text
    assert f"1-{BATCH_NODE_LEN} characters" in text


@pytest.mark.parametrize("name", KUBERNETES_NAMES + LAB_NAMES)
def test_the_agent_takes_the_name_the_chart_gives_it(name):
    assert parse_args(["--node", name, "--listen", "[::]:20100", "--insecure"]).node == name


@pytest.mark.parametrize("name", ["worker-", "a b", "a" * (BATCH_NODE_LEN + 1)])
def test_the_agent_refuses_a_bad_node_name_at_its_start(name, capsys):
    with pytest.raises(SystemExit) as ex:
        parse_args(["--node", name, "--listen", "[::]:20100", "--insecure"])
    assert ex.value.code == 2
    assert f"node name {name!r} is not valid" in capsys.readouterr().err


@pytest.mark.parametrize("name", KUBERNETES_NAMES)
def test_a_kubernetes_node_name_as_key_and_tag(name):
    """Where the name is a key or a tag, it is carried as it is: the batch header (the delay
    processor's node of every record), the Kafka key "<node>/<ssid>" (split at its last '/'), the
    Influx tag (no escaping needed), the topology documents' _key (no hashed fallback)."""
    assert node_name_problem(name) is None
    records = np.zeros(3, dtype=stamp_record.STAMP_RECORD_DTYPE)
    header, decoded = stamp_record.decode_batch(stamp_record.encode_batch(records, name, batch_seq=9))
    assert header.node == name and len(decoded) == 3
    node, _, ssid = f"{name}/7".rpartition("/")
    assert (node, ssid) == (name, "7")
    assert escape_tag(name) == name
    key = f"0_0_0_{name}"
    assert safe_key(key) == key
