"""Telegraf's Kafka security, from the same settings as every other program.

Telegraf's kafka_consumer takes its SASL password as a value (no file option in the build segscope
uses), and enable_tls is a boolean that `--strict-env-handling` cannot substitute from the
environment. So the config Telegraf runs is rendered: services/telegraf/telegraf.conf with the
security options inserted into its [[inputs.kafka_consumer]] table, written 0600 where only Telegraf
reads it (the local stack: its run dir; Kubernetes: an in-memory volume, by an init container running
`segscope-kafka telegraf-config`). The password stays out of the command line and the environment.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from segscope_kafka.settings import KafkaConfigError, KafkaSecurity

TABLE = "[[inputs.kafka_consumer]]"
MARK = "  ## Kafka security (rendered by segscope_kafka.telegraf from SEGSCOPE_KAFKA_*; docs/security.md)"
# a value Telegraf would read as a secret-store reference (@{store:key}) in a secret option
_SECRET_REF = re.compile(r"@\{\w+:\w+\}")


def _toml_string(value: str) -> str:
    # a TOML basic string (JSON's escapes are TOML's); `$` doubled: Telegraf substitutes ${VAR} in
    # every string and reads $$ as one $
    return json.dumps(value, ensure_ascii=False).replace("$", "$$")


def security_lines(sec: KafkaSecurity) -> list[str]:
    """The kafka_consumer options of `sec` (none for PLAINTEXT)."""
    if sec.protocol == "PLAINTEXT":
        return []
    lines = [MARK]
    if sec.uses_sasl:
        if _SECRET_REF.search(sec.password or ""):
            raise KafkaConfigError(
                f"{sec.var('SASL_PASSWORD_FILE')}: the password contains @{{...:...}}, which Telegraf reads as a "
                "secret-store reference; fix: choose a password without that pattern"
            )
        lines += [
            f"  sasl_mechanism = {_toml_string(sec.mechanism)}",
            f"  sasl_username = {_toml_string(sec.username)}",
            f"  sasl_password = {_toml_string(sec.password)}",
        ]
    lines.append(f"  enable_tls = {'true' if sec.uses_ssl else 'false'}")
    if sec.uses_ssl:
        if sec.ca_file:
            lines.append(f"  tls_ca = {_toml_string(sec.ca_file)}")
        if sec.cert_file:
            lines += [f"  tls_cert = {_toml_string(sec.cert_file)}", f"  tls_key = {_toml_string(sec.key_file)}"]
            if sec.key_password is not None:
                lines.append(f"  tls_key_pwd = {_toml_string(sec.key_password)}")
    return lines


def render(template: str, sec: KafkaSecurity) -> str:
    """`template` (telegraf.conf) with `sec`'s options first in its kafka_consumer table."""
    if template.count(TABLE) != 1:
        raise ValueError(f"the Telegraf config must have exactly one {TABLE} table")
    lines = security_lines(sec)
    if not lines:
        return template
    head, tail = template.split(TABLE, 1)
    first, _, rest = tail.partition("\n")
    return head + TABLE + first + "\n" + "\n".join(lines) + "\n" + rest


def write_config(template_path: str | os.PathLike, out_path: str | os.PathLike, sec: KafkaSecurity) -> Path:
    """Render into out_path, readable by this user only (it may hold the password)."""
    out = Path(out_path)
    text = render(Path(template_path).read_text(), sec)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, out)
    return out
