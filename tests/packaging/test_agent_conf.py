"""agent.conf as agent-launch reads it (packaging/debian/segscope_conf.py), without building a
package: the launcher run as `agent-launch` (its name picks the mode) with `--check`, and once
for real into a stand-in `segscope-agent` that prints what it was given.

- on_stop: handover unless the file says teardown (the unit's restarts are hitless with it).
- the Kafka security keys become SEGSCOPE_KAFKA_* in the agent's environment (file names only:
  the password is in no argument and no variable); inherited SEGSCOPE_KAFKA_* security variables
  are dropped, agent.conf is the one place.
- every bad value is named by FILE:LINE (0: a key that is missing), its key and a Fix.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "packaging" / "debian" / "segscope_conf.py"
CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
PASSWORD = "s3cret-of-the-agent"


@pytest.fixture
def etc(tmp_path) -> Path:
    """A stand-in /etc/segscope: TLS files, a 0600 password file, the brokers' CA, the launcher."""
    for name in ("agent.pem", "agent.key", "ca.pem"):
        (tmp_path / name).write_text(CA_PEM)
    (tmp_path / "kafka-ca.pem").write_text(CA_PEM)
    pw = tmp_path / "kafka.password"
    pw.write_text(PASSWORD + "\n")
    pw.chmod(0o600)
    (tmp_path / "agent-launch").symlink_to(LAUNCHER)
    return tmp_path


def base(etc: Path) -> str:
    return (
        f"node = R1\nlisten = 127.0.0.1:50051\ntls_cert = {etc}/agent.pem\ntls_key = {etc}/agent.key\n"
        f"tls_client_ca = {etc}/ca.pem\nkafka = kafka1.example.net:9093\n"
    )


SASL_SSL = (
    "kafka_security_protocol = SASL_SSL\nkafka_sasl_mechanism = SCRAM-SHA-512\nkafka_username = agent\n"
    "kafka_password_file = {etc}/kafka.password\nkafka_ca = {etc}/kafka-ca.pem\n"
)


def launch(etc: Path, text: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    conf = etc / "agent.conf"
    conf.write_text(text)
    return subprocess.run(
        [sys.executable, str(etc / "agent-launch"), *args, str(conf)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": str(REPO), "SEGSCOPE_PREFIX": str(etc / "prefix"), **(env or {})},
    )


def test_good_file_gives_handover_and_the_kafka_environment(etc):
    r = launch(etc, base(etc) + SASL_SSL.format(etc=etc), "--check")
    assert r.returncode == 0, r.stderr
    command, *env_lines = r.stdout.splitlines()
    assert command.endswith("--kafka kafka1.example.net:9093 --on-stop handover"), command
    assert sorted(env_lines) == [
        "SEGSCOPE_KAFKA_SASL_MECHANISM=SCRAM-SHA-512",
        f"SEGSCOPE_KAFKA_SASL_PASSWORD_FILE={etc}/kafka.password",
        "SEGSCOPE_KAFKA_SASL_USERNAME=agent",
        "SEGSCOPE_KAFKA_SECURITY_PROTOCOL=SASL_SSL",
        f"SEGSCOPE_KAFKA_SSL_CA_FILE={etc}/kafka-ca.pem",
    ]
    assert PASSWORD not in r.stdout + r.stderr
    r = launch(etc, base(etc) + "on_stop = teardown\nadopt_timeout = 10\n", "--check")
    assert r.returncode == 0, r.stderr
    assert "--on-stop teardown --adopt-timeout 10" in r.stdout and "--on-stop handover" not in r.stdout
    r = launch(etc, base(etc) + "inline_egress_hook = tc\n", "--check")
    assert r.returncode == 0, r.stderr
    assert "--inline-egress-hook tc" in r.stdout, r.stdout


def test_the_agent_gets_the_settings_as_its_environment_never_as_arguments(etc):
    """The real exec: a stand-in segscope-agent prints its argv and its SEGSCOPE_KAFKA_* variables."""
    fake = etc / "prefix" / "agent" / "bin" / "segscope-agent"
    fake.parent.mkdir(parents=True)
    fake.write_text('#!/bin/sh\necho "ARGV $*"\nenv | grep ^SEGSCOPE_ | sort\n')
    fake.chmod(0o755)
    inherited = {"SEGSCOPE_KAFKA_SASL_USERNAME": "someone-else", "SEGSCOPE_KAFKA_SSL_CERT_FILE": "/x.pem"}
    r = launch(etc, base(etc) + SASL_SSL.format(etc=etc), env=inherited)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    argv = lines[0]
    assert argv.startswith("ARGV --node R1 ") and argv.endswith("--on-stop handover"), argv
    assert "kafka.password" not in argv and PASSWORD not in r.stdout and "SASL" not in argv
    env = dict(line.split("=", 1) for line in lines[1:])
    assert env["SEGSCOPE_KAFKA_SASL_USERNAME"] == "agent"  # the file's, not the inherited one
    assert env["SEGSCOPE_KAFKA_SASL_PASSWORD_FILE"] == f"{etc}/kafka.password"
    assert "SEGSCOPE_KAFKA_SSL_CERT_FILE" not in env  # inherited, not in agent.conf: dropped
    assert env["SEGSCOPE_BUILD_DIR"] == "/usr/lib/segscope"


# (what to append to the good file, the line it lands on (0: the file), what the error says)
BAD = {
    "password_in_the_file": ("kafka_password = hunter2\n", 7, "kafka_password: a password is read from a file only"),
    "typo": ("kafka_usernme = agent\n", 7, "kafka_usernme: unknown key. Fix: did you mean `kafka_username`?"),
    "protocol": ("kafka_security_protocol = SASL_TLS\n", 7, "kafka_security_protocol: 'SASL_TLS': unknown protocol"),
    "mechanism": (
        "kafka_security_protocol = SASL_SSL\nkafka_sasl_mechanism = GSSAPI\nkafka_username = a\n"
        "kafka_password_file = {etc}/kafka.password\n",
        8,
        "kafka_sasl_mechanism: 'GSSAPI': unknown mechanism. Fix: use one of SCRAM-SHA-512",
    ),
    "no_username": (
        "kafka_security_protocol = SASL_SSL\nkafka_password_file = {etc}/kafka.password\n",
        0,
        "kafka_username: missing (SASL_SSL logs in with a user name). Fix:",
    ),
    "no_password_file": (
        "kafka_security_protocol = SASL_SSL\nkafka_username = agent\n",
        0,
        "kafka_password_file: missing (SASL_SSL needs the password of user 'agent'). Fix:",
    ),
    "password_file_absent": (
        "kafka_security_protocol = SASL_SSL\nkafka_username = a\nkafka_password_file = {etc}/nope\n",
        9,
        "kafka_password_file: '{etc}/nope': no such file. Fix:",
    ),
    "password_file_readable_by_all": (
        "kafka_security_protocol = SASL_SSL\nkafka_username = a\nkafka_password_file = {etc}/open.password\n",
        9,
        "kafka_password_file: '{etc}/open.password' has mode 0644: other users can read it. "
        "Fix: chmod 0600 {etc}/open.password",
    ),
    "ca_not_pem": (
        "kafka_security_protocol = SSL\nkafka_ca = {etc}/kafka.password\n",
        8,
        "kafka_ca: '{etc}/kafka.password': no PEM CERTIFICATE in it. Fix:",
    ),
    "ca_without_tls": (
        "kafka_ca = {etc}/kafka-ca.pem\n",
        7,
        "kafka_ca: set, but kafka_security_protocol=PLAINTEXT does not use TLS. Fix:",
    ),
    "cert_without_key": (
        "kafka_security_protocol = SSL\nkafka_cert = {etc}/kafka-ca.pem\n",
        0,
        "kafka_key: missing: a client certificate needs both its certificate and its key. Fix:",
    ),
    "on_stop": ("on_stop = later\n", 7, "on_stop: 'later' is neither handover nor teardown. Fix: write on_stop = "),
    "inline_egress_hook": (
        "inline_egress_hook = ebpf\n",
        7,
        "inline_egress_hook: 'ebpf' is none of auto, xdp, tc. Fix: write inline_egress_hook = auto",
    ),
    "handover_without_adoption": ("adopt_timeout = 0\n", 7, "adopt_timeout: 0 makes the data path die with the agent"),
    "adopt_timeout_range": ("adopt_timeout = 0.01\n", 7, "adopt_timeout: 0.01 is out of range. Fix:"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_each_bad_setting_is_named_by_file_line_and_fix(etc, case):
    extra, line, said = BAD[case]
    (etc / "open.password").write_text("pw\n")
    (etc / "open.password").chmod(0o644)
    r = launch(etc, base(etc) + extra.format(etc=etc), "--check")
    assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr)
    want = f"{etc}/agent.conf:{line}: {said.format(etc=etc)}"
    assert want in r.stderr, r.stderr
    assert "Fix:" in r.stderr.split(want, 1)[1].splitlines()[0] or "Fix:" in want
    assert "SEGSCOPE_KAFKA_" not in r.stderr  # the file's words, not the variables behind them


def test_kafka_security_without_kafka_is_said(etc):
    text = base(etc).replace("kafka = kafka1.example.net:9093\n", "") + SASL_SSL.format(etc=etc)
    r = launch(etc, text, "--check")
    assert r.returncode == 2
    assert f"{etc}/agent.conf:6: kafka_*: set, but not kafka (the bootstrap servers). Fix: write kafka =" in r.stderr
