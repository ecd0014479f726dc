"""The Kafka security settings of one segscope program, from its environment.

Every Kafka client of segscope (the agent and its C tools through librdkafka, the Faust
processors through aiokafka, Telegraf through sarama, segscope-topics, the topology publisher and
the Jalapeno outputs) reads the same variables; the C tools read them in
collectors/kafka_security.h with the same rules and messages. docs/security.md explains them.

    SEGSCOPE_KAFKA_SECURITY_PROTOCOL     PLAINTEXT (default), SSL, SASL_PLAINTEXT, SASL_SSL
    SEGSCOPE_KAFKA_SASL_MECHANISM        SCRAM-SHA-512 (default with SASL), SCRAM-SHA-256, PLAIN
    SEGSCOPE_KAFKA_SASL_USERNAME         the principal's user name
    SEGSCOPE_KAFKA_SASL_PASSWORD_FILE    a file holding its password (one trailing newline ignored)
    SEGSCOPE_KAFKA_SSL_CA_FILE           PEM CA bundle of the brokers' certificates (default: the
                                         system's trust store)
    SEGSCOPE_KAFKA_SSL_CERT_FILE         PEM client certificate (optional; with SSL_KEY_FILE)
    SEGSCOPE_KAFKA_SSL_KEY_FILE          its PEM private key
    SEGSCOPE_KAFKA_SSL_KEY_PASSWORD_FILE a file holding the key's password (an encrypted key)

Secrets come from files only (a Kubernetes Secret mounted as files, a 0600 file in a run dir):
never from the command line, where `ps` shows them, and never from a variable holding the value
(SEGSCOPE_KAFKA_SASL_PASSWORD is refused). Broker certificates are always verified, host name
included. A setting that cannot be used raises KafkaConfigError naming the variable and the fix.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field

ENV_PREFIX = "SEGSCOPE_KAFKA_"
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")
DEFAULT_MECHANISM = "SCRAM-SHA-512"

# setting (after the prefix) -> what it holds: the one list docs, --help and errors name
SETTINGS = {
    "SECURITY_PROTOCOL": "PLAINTEXT (default), SSL, SASL_PLAINTEXT or SASL_SSL",
    "SASL_MECHANISM": "SCRAM-SHA-512 (default with SASL), SCRAM-SHA-256 or PLAIN",
    "SASL_USERNAME": "the SASL user name (the principal User:<name> the ACLs name)",
    "SASL_PASSWORD_FILE": "a file holding the SASL password (one trailing newline is ignored)",
    "SSL_CA_FILE": "PEM CA bundle that signed the brokers' certificates (default: the system's trust store)",
    "SSL_CERT_FILE": "PEM client certificate, for brokers that ask for one (with SSL_KEY_FILE)",
    "SSL_KEY_FILE": "PEM private key of SSL_CERT_FILE",
    "SSL_KEY_PASSWORD_FILE": "a file holding the password of an encrypted SSL_KEY_FILE",
}
# variables with a security-looking name that are not settings: refused, so a typo is not ignored
_FAMILIES = ("SECURITY_", "SASL_", "SSL_")
SECRET_MAX_BYTES = 4096


class KafkaConfigError(ValueError):
    """A Kafka security setting that cannot be used; the message names the variable and the fix."""


@dataclass(frozen=True)
class KafkaSecurity:
    """One program's Kafka security. PLAINTEXT (the default) adds nothing to a client's config."""

    protocol: str = "PLAINTEXT"
    mechanism: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    key_password: str | None = field(default=None, repr=False)
    prefix: str = ENV_PREFIX

    @property
    def uses_sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def uses_ssl(self) -> bool:
        return self.protocol.endswith("SSL")

    def var(self, setting: str) -> str:
        return self.prefix + setting

    def describe(self) -> str:
        """What a start-up log line may say (never a secret)."""
        parts = [self.protocol]
        if self.uses_sasl:
            parts.append(f"{self.mechanism} user {self.username!r}")
        if self.uses_ssl:
            parts.append(f"CA {self.ca_file or 'system trust store'}")
            if self.cert_file:
                parts.append(f"client certificate {self.cert_file}")
        return ", ".join(parts)

    # ------------------------------------------------------------------ client configs
    def librdkafka(self) -> dict[str, str]:
        """librdkafka properties (confluent-kafka; the C tools set the same): {} for PLAINTEXT."""
        if self.protocol == "PLAINTEXT":
            return {}
        conf = {"security.protocol": self.protocol.lower()}
        if self.uses_sasl:
            conf.update(
                {"sasl.mechanism": self.mechanism, "sasl.username": self.username, "sasl.password": self.password}
            )
        if self.uses_ssl:
            # "probe": the system's CA locations (confluent-kafka's wheel has its own OpenSSL)
            conf["ssl.ca.location"] = self.ca_file or "probe"
            conf["ssl.endpoint.identification.algorithm"] = "https"
            if self.cert_file:
                conf["ssl.certificate.location"] = self.cert_file
                conf["ssl.key.location"] = self.key_file
                if self.key_password is not None:
                    conf["ssl.key.password"] = self.key_password
        return conf

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of aiokafka / Faust (None without SSL): verifies the broker and its name."""
        if not self.uses_ssl:
            return None
        ctx = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file, password=self.key_password)
        return ctx

    def aiokafka(self) -> dict:
        """Keyword arguments of AIOKafkaProducer / AIOKafkaConsumer / AIOKafkaAdminClient."""
        if self.protocol == "PLAINTEXT":
            return {}
        kw: dict = {"security_protocol": self.protocol}
        if self.uses_ssl:
            kw["ssl_context"] = self.ssl_context()
        if self.uses_sasl:
            kw.update(
                sasl_mechanism=self.mechanism, sasl_plain_username=self.username, sasl_plain_password=self.password
            )
        return kw

    def faust_credentials(self):
        """Faust's broker_credentials (None for PLAINTEXT): SASLCredentials or SSLCredentials."""
        if self.protocol == "PLAINTEXT":
            return None
        import faust

        ctx = self.ssl_context()
        if self.uses_sasl:
            return faust.SASLCredentials(
                username=self.username, password=self.password, ssl_context=ctx, mechanism=self.mechanism
            )
        return faust.SSLCredentials(ctx)


# ---------------------------------------------------------------------- reading the environment
def _fail(var: str, value: str | None, why: str, fix: str) -> KafkaConfigError:
    shown = "" if value is None else f"={value!r}"
    return KafkaConfigError(f"{var}{shown}: {why}; fix: {fix}")


def read_secret(var: str, path: str, what: str) -> str:
    """The text of a secret file (one trailing newline dropped), or KafkaConfigError naming `var`."""
    try:
        with open(path, "rb") as f:
            data = f.read(SECRET_MAX_BYTES + 1)
    except FileNotFoundError:
        raise _fail(
            var, path, "no such file", f"point it at the file holding {what} (e.g. a mounted Secret key)"
        ) from None
    except IsADirectoryError:
        raise _fail(var, path, "is a directory", f"point it at the file holding {what}, not its folder") from None
    except OSError as e:
        raise _fail(var, path, f"cannot read it ({e.strerror})", "make it readable by this program's user") from None
    if len(data) > SECRET_MAX_BYTES:
        raise _fail(var, path, f"longer than {SECRET_MAX_BYTES} bytes", f"the file must hold {what} only")
    if data.endswith(b"\r\n"):
        data = data[:-2]
    elif data.endswith(b"\n"):
        data = data[:-1]
    if not data:
        raise _fail(var, path, "the file is empty", f"write {what} into it")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _fail(var, path, "not UTF-8 text", f"the file must hold {what} as text") from None
    if "\n" in text or "\r" in text or "\0" in text:
        raise _fail(var, path, "holds more than one line", f"the file must hold {what} only, on one line")
    return text


def _pem_file(var: str, path: str, marker: bytes, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise _fail(var, path, "no such file", f"point it at {what}") from None
    except OSError as e:
        raise _fail(var, path, f"cannot read it ({e.strerror})", "make it readable by this program's user") from None
    if marker not in data:
        label = "PRIVATE KEY" if b"PRIVATE KEY" in marker else "CERTIFICATE"
        raise _fail(var, path, f"no PEM {label} in it", f"point it at {what} in PEM form")
    return data


def from_env(environ: dict[str, str] | None = None, prefix: str = ENV_PREFIX) -> KafkaSecurity:
    """The settings under `prefix` in `environ` (default os.environ); KafkaConfigError if unusable."""
    env = os.environ if environ is None else environ

    def get(setting: str) -> str | None:
        value = env.get(prefix + setting)
        return value.strip() if value is not None and value.strip() else None

    known = set(SETTINGS)
    for name in env:
        rest = name[len(prefix) :] if name.startswith(prefix) else None
        if rest and rest.startswith(_FAMILIES) and rest not in known:
            if rest == "SASL_PASSWORD":
                raise _fail(
                    name,
                    None,
                    "a secret is read from a file only (a variable's value shows in the process environment)",
                    f"write the password to a file readable only by this program and set {prefix}SASL_PASSWORD_FILE",
                )
            raise _fail(
                name, None, "not a Kafka security setting", f"use one of {', '.join(prefix + s for s in SETTINGS)}"
            )

    protocol = (get("SECURITY_PROTOCOL") or "PLAINTEXT").upper().replace("-", "_")
    if protocol not in PROTOCOLS:
        raise _fail(
            prefix + "SECURITY_PROTOCOL",
            get("SECURITY_PROTOCOL"),
            "unknown protocol",
            f"use one of {', '.join(PROTOCOLS)}",
        )
    sasl, tls = protocol.startswith("SASL_"), protocol.endswith("SSL")

    def refuse_unused(settings: tuple[str, ...], needs: str, protocols: str) -> None:
        for s in settings:
            if get(s) is not None:
                raise _fail(
                    prefix + s,
                    None,
                    f"set, but {prefix}SECURITY_PROTOCOL={protocol} does not use {needs}",
                    f"set {prefix}SECURITY_PROTOCOL to {protocols}, or unset {prefix + s}",
                )

    out: dict = {"protocol": protocol, "prefix": prefix}
    if sasl:
        mechanism = (get("SASL_MECHANISM") or DEFAULT_MECHANISM).upper()
        if mechanism not in MECHANISMS:
            raise _fail(
                prefix + "SASL_MECHANISM",
                get("SASL_MECHANISM"),
                "unknown mechanism",
                f"use one of {', '.join(MECHANISMS)}",
            )
        username = get("SASL_USERNAME")
        if username is None:
            raise _fail(
                prefix + "SASL_USERNAME",
                None,
                f"missing ({protocol} logs in with a user name)",
                "set it to the user Kafka knows this program as",
            )
        pw_file = get("SASL_PASSWORD_FILE")
        if pw_file is None:
            raise _fail(
                prefix + "SASL_PASSWORD_FILE",
                None,
                f"missing ({protocol} needs the password of user {username!r})",
                "set it to the path of a file holding the password",
            )
        out.update(
            mechanism=mechanism,
            username=username,
            password=read_secret(prefix + "SASL_PASSWORD_FILE", pw_file, "the password"),
        )
    else:
        refuse_unused(("SASL_MECHANISM", "SASL_USERNAME", "SASL_PASSWORD_FILE"), "SASL", "SASL_SSL or SASL_PLAINTEXT")
    if tls:
        ca = get("SSL_CA_FILE")
        if ca is not None:
            _pem_file(
                prefix + "SSL_CA_FILE",
                ca,
                b"-----BEGIN CERTIFICATE-----",
                "the CA certificate(s) that signed the brokers' certificates",
            )
        cert, key = get("SSL_CERT_FILE"), get("SSL_KEY_FILE")
        if (cert is None) != (key is None):
            missing = "SSL_KEY_FILE" if key is None else "SSL_CERT_FILE"
            raise _fail(
                prefix + missing,
                None,
                "missing: a client certificate needs both its certificate and its key",
                f"set {prefix}{missing} too, or unset both",
            )
        key_password = None
        if cert is not None:
            _pem_file(prefix + "SSL_CERT_FILE", cert, b"-----BEGIN CERTIFICATE-----", "the client certificate")
            key_pem = _pem_file(
                prefix + "SSL_KEY_FILE", key, b"PRIVATE KEY-----", "the client certificate's private key"
            )
            kp_file = get("SSL_KEY_PASSWORD_FILE")
            if kp_file is not None:
                key_password = read_secret(prefix + "SSL_KEY_PASSWORD_FILE", kp_file, "the key's password")
            elif b"ENCRYPTED" in key_pem:
                raise _fail(
                    prefix + "SSL_KEY_PASSWORD_FILE",
                    None,
                    f"missing: the key in {key} is encrypted",
                    "set it to a file holding the key's password",
                )
        elif get("SSL_KEY_PASSWORD_FILE") is not None:
            raise _fail(
                prefix + "SSL_KEY_PASSWORD_FILE",
                None,
                "set without a client certificate",
                f"set {prefix}SSL_CERT_FILE and {prefix}SSL_KEY_FILE, or unset it",
            )
        out.update(ca_file=ca, cert_file=cert, key_file=key, key_password=key_password)
    else:
        refuse_unused(
            ("SSL_CA_FILE", "SSL_CERT_FILE", "SSL_KEY_FILE", "SSL_KEY_PASSWORD_FILE"), "TLS", "SASL_SSL or SSL"
        )
    return KafkaSecurity(**out)


def kafka_config(base: dict, environ: dict[str, str] | None = None, prefix: str = ENV_PREFIX, error_cb=None) -> dict:
    """A confluent-kafka config: `base` plus this program's security (nothing for PLAINTEXT) and,
    unless `base` has one, an error_cb that reports a refusal once, clearly (refusal.report)."""
    from segscope_kafka.refusal import report_refusals

    sec = from_env(environ, prefix)
    conf = {**base, **sec.librdkafka()}
    if "error_cb" not in conf:
        conf["error_cb"] = error_cb or report_refusals(sec)
    return conf
