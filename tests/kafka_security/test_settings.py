"""segscope_kafka's settings without a broker: each protocol and mechanism mapped onto librdkafka,
aiokafka, Faust and Telegraf; secrets read from files only; every unusable setting refused with a
message naming the variable and the fix, the same message from the C tools (kafka_security.h) as from
Python. The broker side (logins, ACLs, refusals) is tests/e2e/test_kafka_security.py."""

from __future__ import annotations

import ssl
import subprocess
import tomllib
from pathlib import Path

import pytest

from segscope_kafka import MECHANISMS, KafkaConfigError, from_env, kafka_config, refusal_message
from segscope_kafka.acls import ROLES, kafka_acls_commands, role_acls
from segscope_kafka.telegraf import render
from segscope_schemas import names

REPO = Path(__file__).resolve().parents[2]
STREAMER = REPO / "build" / "collectors" / "stamp_streamer"
P = "SEGSCOPE_KAFKA_"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    """A CA, and a client certificate with a plain and an encrypted key."""
    from cryptography.hazmat.primitives import serialization

    from controller.pki import make_pki

    d = tmp_path_factory.mktemp("pki")
    paths = make_pki(d, ["n"])
    key = serialization.load_pem_private_key(paths["controller.key"].read_bytes(), None)
    enc = d / "encrypted.key"
    enc.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"keypass"),
        )
    )
    (d / "keypass").write_text("keypass\n")
    (d / "password").write_text("s3cret-$HOME-\"q\"\n")  # one trailing newline: not part of it
    (d / "empty").write_text("")
    (d / "two-lines").write_text("a\nb\n")
    return {
        "dir": d,
        "ca": paths["ca"],
        "cert": paths["controller.pem"],
        "key": paths["controller.key"],
        "enc": enc,
        "keypass": d / "keypass",
        "password": d / "password",
    }


def sasl_ssl(pki, **extra) -> dict[str, str]:
    return {
        P + "SECURITY_PROTOCOL": "SASL_SSL",
        P + "SASL_USERNAME": "segscope-agent",
        P + "SASL_PASSWORD_FILE": str(pki["password"]),
        P + "SSL_CA_FILE": str(pki["ca"]),
        **extra,
    }


def test_plaintext_is_the_default_and_adds_nothing():
    sec = from_env({})
    assert sec.protocol == "PLAINTEXT" and sec.librdkafka() == {} and sec.aiokafka() == {}
    assert sec.faust_credentials() is None
    base = {"bootstrap.servers": "b:9092", "acks": "all"}
    conf = kafka_config(base, {})
    assert {k: v for k, v in conf.items() if k != "error_cb"} == base


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_each_mechanism_maps_onto_every_client(pki, mechanism):
    sec = from_env(sasl_ssl(pki, **{P + "SASL_MECHANISM": mechanism.lower()}))
    assert sec.mechanism == mechanism and sec.password == 's3cret-$HOME-"q"'
    assert sec.librdkafka() == {
        "security.protocol": "sasl_ssl",
        "sasl.mechanism": mechanism,
        "sasl.username": "segscope-agent",
        "sasl.password": 's3cret-$HOME-"q"',
        "ssl.ca.location": str(pki["ca"]),
        "ssl.endpoint.identification.algorithm": "https",
    }
    kw = sec.aiokafka()
    assert kw["security_protocol"] == "SASL_SSL" and kw["sasl_mechanism"] == mechanism
    assert kw["sasl_plain_username"] == "segscope-agent" and kw["sasl_plain_password"] == 's3cret-$HOME-"q"'
    ctx = kw["ssl_context"]
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname  # the broker is verified, name included
    creds = sec.faust_credentials()
    assert type(creds).__name__ == "SASLCredentials" and creds.mechanism.value == mechanism
    assert creds.protocol.value == "SASL_SSL"
    assert "s3cret" not in repr(sec) and "s3cret" not in repr(creds) and "s3cret" not in sec.describe()


def test_default_mechanism_is_scram_sha_512(pki):
    assert from_env(sasl_ssl(pki)).mechanism == "SCRAM-SHA-512"


def test_sasl_plaintext_and_ssl_only(pki):
    sec = from_env(
        {
            P + "SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            P + "SASL_USERNAME": "u",
            P + "SASL_PASSWORD_FILE": str(pki["password"]),
        }
    )
    assert sec.librdkafka()["security.protocol"] == "sasl_plaintext" and "ssl.ca.location" not in sec.librdkafka()
    assert sec.ssl_context() is None and sec.faust_credentials().protocol.value == "SASL_PLAINTEXT"
    tls = from_env(
        {P + "SECURITY_PROTOCOL": "SSL", P + "SSL_CERT_FILE": str(pki["cert"]), P + "SSL_KEY_FILE": str(pki["key"])}
    )
    conf = tls.librdkafka()
    assert conf["ssl.ca.location"] == "probe"  # no CA file: the system's trust store
    assert conf["ssl.certificate.location"] == str(pki["cert"]) and "sasl.mechanism" not in conf
    assert type(tls.faust_credentials()).__name__ == "SSLCredentials"


def test_encrypted_client_key_with_its_password_file(pki):
    env = sasl_ssl(
        pki,
        **{
            P + "SSL_CERT_FILE": str(pki["cert"]),
            P + "SSL_KEY_FILE": str(pki["enc"]),
            P + "SSL_KEY_PASSWORD_FILE": str(pki["keypass"]),
        },
    )
    sec = from_env(env)
    assert sec.key_password == "keypass" and sec.librdkafka()["ssl.key.password"] == "keypass"
    sec.ssl_context()  # loads the encrypted key with it (raises if the password were wrong)


# every unusable setting: (environment, the variable the message must start with, a word of the fix)
BAD = [
    ({P + "SECURITY_PROTOCOL": "TLS"}, P + "SECURITY_PROTOCOL='TLS': unknown protocol", "SASL_SSL"),
    (
        {P + "SECURITY_PROTOCOL": "SASL_SSL", P + "SASL_MECHANISM": "GSSAPI"},
        P + "SASL_MECHANISM='GSSAPI': unknown mechanism",
        "SCRAM-SHA-512, SCRAM-SHA-256, PLAIN",
    ),
    ({P + "SECURITY_PROTOCOL": "SASL_SSL"}, P + "SASL_USERNAME: missing", "set it"),
    ({P + "SECURITY_PROTOCOL": "SASL_SSL", P + "SASL_USERNAME": "u"}, P + "SASL_PASSWORD_FILE: missing", "file"),
    ({P + "SASL_PASSWORD": "x"}, P + "SASL_PASSWORD: a secret is read from a file only", P + "SASL_PASSWORD_FILE"),
    ({P + "SSL_CERTFILE": "x"}, P + "SSL_CERTFILE: not a Kafka security setting", P + "SSL_CERT_FILE"),
    (
        {P + "SSL_CA_FILE": "/x"},
        P + "SSL_CA_FILE: set, but " + P + "SECURITY_PROTOCOL=PLAINTEXT does not use TLS",
        "SSL",
    ),
    (
        {P + "SASL_USERNAME": "u"},
        P + "SASL_USERNAME: set, but " + P + "SECURITY_PROTOCOL=PLAINTEXT does not use SASL",
        "SASL_SSL",
    ),
]


def bad_files(pki) -> list:
    d = pki["dir"]
    sasl = {P + "SECURITY_PROTOCOL": "SASL_SSL", P + "SASL_USERNAME": "u"}
    return [
        (
            {**sasl, P + "SASL_PASSWORD_FILE": str(d / "nope")},
            f"{P}SASL_PASSWORD_FILE='{d / 'nope'}': no such file",
            "point it",
        ),
        (
            {**sasl, P + "SASL_PASSWORD_FILE": str(d / "empty")},
            f"{P}SASL_PASSWORD_FILE='{d / 'empty'}': the file is empty",
            "write",
        ),
        (
            {**sasl, P + "SASL_PASSWORD_FILE": str(d / "two-lines")},
            f"{P}SASL_PASSWORD_FILE='{d / 'two-lines'}': holds more than one line",
            "one line",
        ),
        (
            {**sasl, P + "SASL_PASSWORD_FILE": str(pki["password"]), P + "SSL_CA_FILE": str(d / "nope.pem")},
            f"{P}SSL_CA_FILE='{d / 'nope.pem'}': no such file",
            "CA",
        ),
        (
            {P + "SECURITY_PROTOCOL": "SSL", P + "SSL_CA_FILE": str(pki["password"])},
            f"{P}SSL_CA_FILE='{pki['password']}': no PEM CERTIFICATE in it",
            "PEM form",
        ),
        (
            {P + "SECURITY_PROTOCOL": "SSL", P + "SSL_CA_FILE": str(d / "nope.pem")},
            f"{P}SSL_CA_FILE='{d / 'nope.pem'}': no such file",
            "CA",
        ),
        ({P + "SECURITY_PROTOCOL": "SSL", P + "SSL_CERT_FILE": str(pki["cert"])}, f"{P}SSL_KEY_FILE: missing", "both"),
        (
            {
                P + "SECURITY_PROTOCOL": "SSL",
                P + "SSL_CERT_FILE": str(pki["cert"]),
                P + "SSL_KEY_FILE": str(pki["enc"]),
            },
            f"{P}SSL_KEY_PASSWORD_FILE: missing: the key in {pki['enc']} is encrypted",
            "key's password",
        ),
    ]


def all_bad(pki) -> list:
    return BAD + bad_files(pki)


def test_every_unusable_setting_is_named_with_its_fix(pki):
    for env, start, fix in all_bad(pki):
        with pytest.raises(KafkaConfigError) as e:
            from_env(env)
        msg = str(e.value)
        assert msg.startswith(start), (env, msg)
        assert "; fix: " in msg and fix in msg.split("; fix: ", 1)[1], msg
        assert "s3cret" not in msg  # a secret file's content is never shown


def test_the_c_tools_refuse_the_same_settings_with_the_same_messages(pki):
    """stamp_streamer (kafka_security.h) checks before it opens anything: exit 2, the Python message."""
    import os

    base = {k: v for k, v in os.environ.items() if not k.startswith(P)}
    for env, _start, _fix in all_bad(pki):
        with pytest.raises(KafkaConfigError) as e:
            from_env(env)
        r = subprocess.run(
            [str(STREAMER), "--ringbuf", "/nonexistent", "--node", "n", "--brokers", "127.0.0.1:1"],
            env={**base, **env},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.returncode == 2, (env, r.stderr)
        # (before it, a warning about SCRAM with an old librdkafka may come: kafka_security.h)
        assert r.stderr.strip().splitlines()[-1] == f"stamp_streamer: {e.value}", (env, r.stderr)


def test_the_c_tools_accept_good_settings(pki):
    import os

    base = {k: v for k, v in os.environ.items() if not k.startswith(P)}
    env = sasl_ssl(
        pki,
        **{P + "SASL_MECHANISM": "PLAIN", P + "SSL_CERT_FILE": str(pki["cert"]), P + "SSL_KEY_FILE": str(pki["key"])},
    )
    r = subprocess.run(
        [str(STREAMER), "--ringbuf", "/nonexistent", "--node", "n", "--brokers", "127.0.0.1:1"],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=30,
    )
    # past the settings: it fails on the ring buffer, which does not exist
    assert r.returncode == 1 and "--ringbuf: bpf_obj_get /nonexistent" in r.stderr, r.stderr


def test_refusal_messages_name_the_settings(pki):
    from confluent_kafka import KafkaError

    sec = from_env(sasl_ssl(pki))
    login = refusal_message(
        KafkaError._AUTHENTICATION, "SASL authentication error: invalid (after 3ms in state AUTH_REQ)", sec
    )
    assert "refused the login of user 'segscope-agent' with SCRAM-SHA-512" in login
    assert P + "SASL_PASSWORD_FILE" in login and "after 3ms" not in login
    tls = refusal_message(KafkaError._SSL, "SSL handshake failed: certificate verify failed", sec)
    assert tls.startswith("TLS with the broker failed") and P + "SSL_CA_FILE" in tls
    acl = refusal_message(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Broker: Topic authorization failed", sec, "t1")
    assert "access to topic t1" in acl and "lacks the ACL" in acl
    assert refusal_message(KafkaError._TRANSPORT, "Connection refused", sec) is None  # unreachable: not a refusal


def test_telegraf_config_rendering(pki):
    template = (REPO / "services" / "telegraf" / "telegraf.conf").read_text()
    assert render(template, from_env({})) == template  # PLAINTEXT: the file as it is
    env = sasl_ssl(pki, **{P + "SSL_CERT_FILE": str(pki["cert"]), P + "SSL_KEY_FILE": str(pki["key"])})
    text = render(template, from_env(env))
    consumer = tomllib.loads(text.replace("$$", "$"))["inputs"]["kafka_consumer"][0]
    assert consumer["sasl_mechanism"] == "SCRAM-SHA-512" and consumer["sasl_username"] == "segscope-agent"
    assert consumer["sasl_password"] == 's3cret-$HOME-"q"'  # Telegraf reads $$ as $: no ${HOME} substitution
    assert 'sasl_password = "s3cret-$$HOME-\\"q\\""' in text
    assert consumer["enable_tls"] is True and consumer["tls_ca"] == str(pki["ca"])
    assert consumer["tls_cert"] == str(pki["cert"]) and consumer["tls_key"] == str(pki["key"])
    assert consumer["topics"] == ["${SEGSCOPE_TOPIC_METRICS}"]  # the rest of the table is untouched


def test_role_acls():
    agent = role_acls("agent")
    assert {a.operation for a in agent} == {"WRITE", "DESCRIBE"} and all(a.resource == "topic" for a in agent)
    assert names.TOPIC_STAMP_RECORDS in {a.name for a in agent} and names.TOPIC_ALTMARK_BY_FLOW not in {
        a.name for a in agent
    }
    proc = role_acls("processor")
    writes = {a.name for a in proc if a.operation == "WRITE"}
    assert names.TOPIC_METRICS in writes and names.TOPIC_STAMP_RECORDS not in writes
    tele = role_acls("telegraf")
    assert {(a.resource, a.name, a.operation) for a in tele} == {
        ("topic", names.TOPIC_METRICS, "READ"),
        ("topic", names.TOPIC_METRICS, "DESCRIBE"),
        ("group", names.GROUP_TELEGRAF, "READ"),
    }
    cmds = kafka_acls_commands({"telegraf": "User:tg"})
    assert len(cmds) == 3 and all("--allow-principal User:tg" in c for c in cmds)
    ctl = role_acls("controller")  # its election, its lines and segscope-steer's input, nothing else
    assert {(a.resource, a.name, a.pattern, a.operation) for a in ctl} == {
        ("topic", names.TOPIC_CONTROLLER_LEADER, "literal", "READ"),
        ("topic", names.TOPIC_CONTROLLER_LEADER, "literal", "DESCRIBE"),
        ("group", names.GROUP_CONTROLLER, "literal", "READ"),
        ("topic", names.TOPIC_METRICS, "literal", "READ"),
        ("topic", names.TOPIC_METRICS, "literal", "WRITE"),
        ("topic", names.TOPIC_METRICS, "literal", "DESCRIBE"),
        ("group", "segscope-steer", "prefixed", "READ"),
    }
    # the processor role no longer covers the controller's group and topic
    assert not [a for a in proc if a.name.startswith(names.GROUP_CONTROLLER)]
    assert set(ROLES) == {"agent", "processor", "controller", "telegraf", "admin"}
