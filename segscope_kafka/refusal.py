"""When Kafka refuses a client: a clear message naming the settings to check, said once.

A refusal (a wrong user or password, a CA that did not sign the broker's certificate, a principal
without the ACL for a topic or group) is a configuration error: retrying cannot fix it, so a
program reports it and exits non-zero (or, if it must stay up, holds it in its health state). An
unreachable Kafka is not a refusal: programs wait for it as before.

    conf = kafka_config({"bootstrap.servers": b})          # error_cb = report_refusals(...)
    watch = RefusalWatch(security); conf = kafka_config(base, error_cb=watch)
    watch.refused                                          # the first refusal's message, or None
    metadata(admin, watch, timeout_s)                      # list_topics, KafkaRefused at once
"""

from __future__ import annotations

import logging
import re
import threading
import time

from segscope_kafka.settings import KafkaSecurity

log = logging.getLogger("segscope.kafka")

DOCS = "docs/security.md"


class KafkaRefused(RuntimeError):
    """Kafka refused this client (login, TLS or ACL); the message names what to check."""


def _codes():
    from confluent_kafka import KafkaError

    login = {KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED}
    acl = {
        KafkaError.TOPIC_AUTHORIZATION_FAILED: "topic",
        KafkaError.GROUP_AUTHORIZATION_FAILED: "consumer group",
        KafkaError.CLUSTER_AUTHORIZATION_FAILED: "cluster",
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "transactional id",
    }
    return login, {KafkaError._SSL}, acl


# librdkafka's timing suffix, which differs between two otherwise equal refusals
_TIMING = re.compile(r" \(after \d+ms in state \w+\)")


def refusal_message(code: int, text: str, sec: KafkaSecurity, what: str = "") -> str | None:
    """The message for a librdkafka error code that is a refusal; None for any other error.
    `what`: the topic or group the request was for, when known."""
    login, tls, acl = _codes()
    text = _TIMING.sub("", text)
    if code in login:
        if "SSL" in text and "SASL" not in text:
            return tls_message(text, sec)
        if not sec.uses_sasl:
            return (
                f"Kafka refused the connection ({text}); fix: the listener wants a login: set "
                f"{sec.var('SECURITY_PROTOCOL')} to SASL_SSL with {sec.var('SASL_USERNAME')} and "
                f"{sec.var('SASL_PASSWORD_FILE')} ({DOCS})"
            )
        return (
            f"Kafka refused the login of user {sec.username!r} with {sec.mechanism} ({text}); fix: check "
            f"{sec.var('SASL_USERNAME')}, the password in the file {sec.var('SASL_PASSWORD_FILE')} names, and "
            f"that the user has {sec.mechanism} credentials on the cluster ({DOCS})"
        )
    if code in tls:
        return tls_message(text, sec)
    if code in acl:
        who = f"user {sec.username!r}" if sec.uses_sasl else "this client"
        on = f"{acl[code]} {what}" if what else f"a {acl[code]}"
        return (
            f"Kafka refused {who} access to {on} ({text}); fix: this principal lacks the ACL: run the program "
            f"with its own role's credentials ({sec.var('SASL_USERNAME')}) or grant the ACL ({DOCS}, ACLs per role)"
        )
    return None


def tls_message(text: str, sec: KafkaSecurity) -> str:
    if not sec.uses_ssl:
        return (
            f"TLS with the broker failed ({text}); fix: {sec.var('SECURITY_PROTOCOL')}={sec.protocol} does not "
            "speak TLS; use SSL or SASL_SSL for a TLS listener"
        )
    return (
        f"TLS with the broker failed ({text}); fix: {sec.var('SSL_CA_FILE')} must hold the CA that signed the "
        "broker's certificate, and the bootstrap address must be a name or address in that certificate; a broker "
        f"that asks for a client certificate needs {sec.var('SSL_CERT_FILE')} and {sec.var('SSL_KEY_FILE')} ({DOCS})"
    )


class RefusalWatch:
    """A confluent-kafka error_cb (also usable for delivery reports through note()) that keeps the
    first refusal, logs each distinct refusal once at ERROR and calls on_refused(message) once."""

    def __init__(self, sec: KafkaSecurity, on_refused=None, program: str = ""):
        self.sec = sec
        self.on_refused = on_refused
        self.program = program
        self.refused: str | None = None
        self.count = 0  # refusals seen (librdkafka repeats them on every reconnect)
        self._said: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, err) -> None:
        self.note(err.code(), err.str())

    def note(self, code: int, text: str, what: str = "") -> str | None:
        msg = refusal_message(code, text, self.sec, what)
        if msg is None:
            return None
        with self._lock:
            self.count += 1
            first = self.refused is None
            if first:
                self.refused = msg
            new = msg not in self._said
            self._said.add(msg)
        if new:
            log.error("%s%s", f"{self.program}: " if self.program else "", msg)
        if first and self.on_refused is not None:
            self.on_refused(msg)
        return msg

    def raise_if_refused(self) -> None:
        if self.refused is not None:
            raise KafkaRefused(self.refused)


def report_refusals(sec: KafkaSecurity) -> RefusalWatch:
    """The default error_cb of kafka_config(): says a refusal once; the program decides the rest."""
    return RefusalWatch(sec)


def metadata(client, watch: RefusalWatch, timeout_s: float, topic: str | None = None):
    """client.list_topics() once the cluster answers, within timeout_s; KafkaRefused as soon as the
    watch saw a refusal (instead of waiting out the timeout); the last KafkaException on timeout."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout_s
    while True:
        step = min(1.0, max(0.1, deadline - time.monotonic()))
        try:
            md = client.list_topics(topic, timeout=step) if topic else client.list_topics(timeout=step)
            if md.brokers:
                return md
        except KafkaException:
            if time.monotonic() >= deadline:
                poll(client)
                watch.raise_if_refused()
                raise
        poll(client)
        watch.raise_if_refused()
        if time.monotonic() >= deadline:
            raise KafkaException(f"Kafka did not answer within {timeout_s:.0f} s")


def poll(client) -> None:
    """Serve the client's callbacks (error_cb) without consuming anything."""
    try:
        client.poll(0)
    except Exception:  # noqa: BLE001 - a Consumer must not poll messages here; it serves them in consume()
        pass


def login_check(bootstrap: str, sec: KafkaSecurity, timeout_s: float = 10.0) -> bool:
    """True once the cluster answers a metadata request with this program's credentials; False if
    it does not answer within timeout_s (unreachable: not a refusal); KafkaRefused if it refuses."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    watch = RefusalWatch(sec)
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2, **sec.librdkafka(), "error_cb": watch})
    try:
        metadata(admin, watch, timeout_s)
        return True
    except KafkaException:
        return False
