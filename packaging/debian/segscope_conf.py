"""The Debian packages' launchers: read a configuration file under /etc/segscope/, check it, and
exec the program with it. Every problem is reported as `FILE:LINE: key: what. Fix: how` (all at
once) and the launcher exits 2 without starting anything.

    agent-launch /etc/segscope/agent.conf            (segscope-agent.service)
    agent-launch --check /etc/segscope/agent.conf    (check only; prints the command it would run
                                                      and its SEGSCOPE_KAFKA_* environment)
    processor-launch delay /etc/segscope/processors.conf   (segscope-processor@delay.service)

The build (packaging/debian/build.py) installs this file twice, as /usr/lib/segscope/agent-launch
(run by the agent's venv python) and /usr/lib/segscope/processor-launch (the processors' venv);
the program's name picks the mode.

agent.conf: `key = value` lines, `#` comments, blank lines. AGENT_KEYS below are the agent's flags
(on_stop defaults to handover: a restart leaves the data path measuring for the next agent);
KAFKA_KEYS its Kafka security, given to it as SEGSCOPE_KAFKA_* variables (never as arguments: a
command line is anyone's to read), and the only ones it gets (inherited ones are dropped).
processors.conf: `VARIABLE=value` lines: the processors' environment variables
(`segscope-delay-processor --help` lists them), `#` comments, blank lines.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = Path(os.environ.get("SEGSCOPE_PREFIX", "/opt/segscope"))
LIB = Path(os.environ.get("SEGSCOPE_LIB", "/usr/lib/segscope"))

# key -> (agent flag, what a good value looks like: used in the Fix of an error)
AGENT_KEYS: dict[str, tuple[str, str]] = {
    "node": ("--node", "this router's name, e.g. node = R1"),
    "listen": ("--listen", "the management address and port, e.g. listen = [2001:db8::1]:50051 or 192.0.2.1:50051"),
    "tls_cert": ("--tls-cert", "the agent's certificate (PEM), e.g. tls_cert = /etc/segscope/tls/agent.pem"),
    "tls_key": ("--tls-key", "its private key (PEM, mode 0600), e.g. tls_key = /etc/segscope/tls/agent.key"),
    "tls_client_ca": ("--tls-client-ca", "the CA of the controller's certificate, e.g. /etc/segscope/tls/ca.pem"),
    "kafka": ("--kafka", "the Kafka bootstrap HOST:PORT list, e.g. kafka = kafka1.example.net:9092"),
    "instance": ("--instance", "a bpffs instance name [A-Za-z0-9_.-], default the node name"),
    "health": ("--health", "HOST:PORT of the HTTP health endpoint, e.g. health = 127.0.0.1:9640"),
    "state_dir": ("--state-dir", "a directory under /run/segscope (the unit's only writable runtime directory)"),
    "stats_interval": ("--stats-interval", "seconds, e.g. stats_interval = 1"),
    "topology_interval": ("--topology-interval", "seconds, e.g. topology_interval = 30"),
    "stamp_linger_ms": ("--stamp-linger-ms", "milliseconds 0..10000, e.g. stamp_linger_ms = 200"),
    "workers": ("--workers", "gRPC worker threads, e.g. workers = 16"),
    "log_level": ("--log-level", "one of DEBUG, INFO, WARNING, ERROR"),
    "on_stop": ("--on-stop", "handover (default: a restart or upgrade leaves the measurement running) or teardown"),
    "inline_egress_hook": (
        "--inline-egress-hook",
        "auto (default: tc on a veth without XDP, else xdp), xdp (the XDP chain) or tc (TC ingress)",
    ),
    "adopt_timeout": ("--adopt-timeout", "seconds 0.1..86400 the data path waits for the next agent, e.g. 30"),
    "extra_args": ("", "further `segscope-agent` flags, e.g. extra_args = --log-level DEBUG"),
}
# agent.conf key -> the SEGSCOPE_KAFKA_* variable the agent and its C tools read (segscope_kafka);
# given as the agent's environment, never on its command line (where `ps` shows it)
KAFKA_KEYS: dict[str, tuple[str, str]] = {
    "kafka_security_protocol": ("SECURITY_PROTOCOL", "PLAINTEXT (default), SSL, SASL_PLAINTEXT or SASL_SSL"),
    "kafka_sasl_mechanism": ("SASL_MECHANISM", "SCRAM-SHA-512 (default with SASL), SCRAM-SHA-256 or PLAIN"),
    "kafka_username": ("SASL_USERNAME", "the SASL user Kafka knows this agent as, e.g. kafka_username = agent"),
    "kafka_password_file": (
        "SASL_PASSWORD_FILE",
        "a root-only (0600) file holding the SASL password, e.g. kafka_password_file = /etc/segscope/kafka.password",
    ),
    "kafka_ca": ("SSL_CA_FILE", "the PEM CA of the brokers' certificates, e.g. kafka_ca = /etc/segscope/kafka-ca.pem"),
    "kafka_cert": ("SSL_CERT_FILE", "a PEM client certificate, for brokers that ask for one (with kafka_key)"),
    "kafka_key": ("SSL_KEY_FILE", "the PEM private key of kafka_cert (mode 0600)"),
    "kafka_key_password_file": ("SSL_KEY_PASSWORD_FILE", "a root-only (0600) file holding kafka_key's password"),
}
KAFKA_ENV_PREFIX = "SEGSCOPE_KAFKA_"
KAFKA_SECURITY_VARS = tuple(KAFKA_ENV_PREFIX + family for family in ("SECURITY_", "SASL_", "SSL_"))
SECRET_FILES = ("kafka_password_file", "kafka_key_password_file", "kafka_key")
DEFAULTS = {"on_stop": "handover"}  # a restart (systemctl restart, a package upgrade) without a gap
REQUIRED = ("node", "listen", "tls_cert", "tls_key", "tls_client_ca")
FILES = ("tls_cert", "tls_key", "tls_client_ca")
NUMBERS = {
    "adopt_timeout": float,
    "stats_interval": float,
    "topology_interval": float,
    "stamp_linger_ms": int,
    "workers": int,
}
LINE_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")
ENV_LINE_RE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*?)\s*$")
PROCESSORS = ("delay", "loss", "inline", "topology")


@dataclass
class Problems:
    """What is wrong, as (file, line, text); line 0 = the file as a whole."""

    path: str
    items: list[tuple[str, int, str]] = field(default_factory=list)

    def add(self, line: int, text: str, path: str | Path | None = None) -> None:
        self.items.append((str(path or self.path), line, text))

    def report(self) -> str:
        return "\n".join(f"{path}:{line}: {text}" for path, line, text in sorted(self.items))


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _did_you_mean(key: str, known) -> str:
    close = difflib.get_close_matches(key, list(known), n=1)
    return f"did you mean `{close[0]}`?" if close else "use one of: " + ", ".join(sorted(known))


def read_pairs(path: Path, pattern: re.Pattern, problems: Problems, what: str) -> dict[str, tuple[str, int]]:
    """key -> (value, line) of every `key = value` line; comments (#) and blank lines skipped."""
    out: dict[str, tuple[str, int]] = {}
    try:
        text = path.read_text()
    except OSError as exc:
        problems.add(0, f"cannot read the file: {exc.strerror}. Fix: create it (the package ships an example)")
        return out
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = pattern.match(raw)
        if not m:
            problems.add(n, f"{line[:40]!r} is not a {what} line. Fix: write {what}, one per line (# starts a comment)")
            continue
        key, value = m.group(1), m.group(2)
        if " #" in value and not value.startswith(("'", '"')):
            value = value.split(" #", 1)[0].rstrip()
        if key in out:
            problems.add(n, f"{key}: set twice (first on line {out[key][1]}). Fix: keep one of the two lines")
        out[key] = (_unquote(value), n)
    return out


def _host_port(value: str) -> tuple[str, int] | None:
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d+)|([^:\[\]]+):(\d+)", value)
    if not m:
        return None
    host, port = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    if m.group(1):
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return None
    return host, int(port)


def agent_command(path: Path) -> tuple[list[str], dict[str, str], Problems]:
    """The agent's argv and its Kafka environment (SEGSCOPE_KAFKA_*) from agent.conf, and the
    problems found (argv and environment are only usable without)."""
    problems = Problems(str(path))
    pairs = read_pairs(path, LINE_RE, problems, "`key = value`")
    args: list[str] = []
    for key, (value, n) in pairs.items():
        if key in KAFKA_KEYS:
            continue  # the environment, below
        if key not in AGENT_KEYS:
            problems.add(n, f"{key}: {_unknown_key_fix(key)}")
            continue
        flag, good = AGENT_KEYS[key]
        if value == "":
            if key in REQUIRED:
                problems.add(n, f"{key}: not set. Fix: write {good}")
            continue  # an optional key left empty: the agent's default
        _check_agent_value(key, value, n, good, problems)
        if key == "extra_args":
            try:
                args += shlex.split(value)
            except ValueError as exc:
                problems.add(n, f"extra_args: {exc}. Fix: balance the quotes")
        else:
            args += [flag, value]
    for key, value in DEFAULTS.items():
        if not pairs.get(key, ("", 0))[0]:
            args += [AGENT_KEYS[key][0], value]
    _check_handover(pairs, problems)
    for key in REQUIRED:
        if key not in pairs:
            problems.add(0, f"{key}: missing. Fix: add a line `{key} = ...`: {AGENT_KEYS[key][1]}")
    env = kafka_env(pairs, problems)
    return args, env, problems


def _unknown_key_fix(key: str) -> str:
    if key in ("kafka_password", "kafka_sasl_password"):
        return (
            "a password is read from a file only (agent.conf is readable by more than the agent). "
            "Fix: write it to a 0600 file and set kafka_password_file = that file"
        )
    return f"unknown key. Fix: {_did_you_mean(key, [*AGENT_KEYS, *KAFKA_KEYS])}"


def _check_agent_value(key: str, value: str, n: int, good: str, problems: Problems) -> None:
    """One problem at most for one agent flag's value."""
    if key in FILES and not os.path.isfile(value):
        problems.add(n, f"{key}: no such file {value!r}. Fix: install the file there, or write {good}")
    elif key in FILES and not os.access(value, os.R_OK):
        problems.add(n, f"{key}: {value!r} is not readable. Fix: chmod it so root can read it")
    elif key == "listen":
        hp = _host_port(value)
        if hp is None or not 1 <= hp[1] <= 65535:
            problems.add(n, f"listen: {value!r} is not HOST:PORT. Fix: write {good}")
        elif hp[1] < 1024:
            problems.add(
                n,
                f"listen: port {hp[1]} needs CAP_NET_BIND_SERVICE, which the unit does not grant. "
                "Fix: use a port >= 1024, e.g. 50051",
            )
    elif key in NUMBERS:
        try:
            if NUMBERS[key](value) < 0:
                raise ValueError
        except ValueError:
            problems.add(n, f"{key}: {value!r} is not a number >= 0. Fix: write {good}")
    elif key == "log_level" and value not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        problems.add(n, f"log_level: {value!r} is not a level. Fix: write {good}")
    elif key == "instance" and not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", value):
        problems.add(n, f"instance: {value!r} is not a name. Fix: write {good}")
    elif key == "state_dir" and not (value == "/run/segscope" or value.startswith("/run/segscope/")):
        problems.add(n, f"state_dir: {value!r} is read-only for the service. Fix: write {good}")
    elif key == "inline_egress_hook" and value not in ("auto", "xdp", "tc"):
        problems.add(
            n, f"inline_egress_hook: {value!r} is none of auto, xdp, tc. Fix: write inline_egress_hook = {good}"
        )
    elif key == "on_stop" and value not in ("handover", "teardown"):
        problems.add(n, f"on_stop: {value!r} is neither handover nor teardown. Fix: write on_stop = {good}")


def _check_handover(pairs: dict[str, tuple[str, int]], problems: Problems) -> None:
    """handover leaves the data path waiting for the next agent: it needs an adoption timeout > 0."""
    on_stop = pairs.get("on_stop", ("", 0))[0] or DEFAULTS["on_stop"]
    value, n = pairs.get("adopt_timeout", ("", 0))
    try:
        seconds = float(value) if value else None
    except ValueError:
        return  # said by _check_agent_value
    if seconds is None:
        return
    if seconds == 0 and on_stop == "handover":
        problems.add(
            n,
            "adopt_timeout: 0 makes the data path die with the agent, but on_stop is handover (the default). "
            "Fix: write adopt_timeout = 30, or on_stop = teardown",
        )
    elif seconds != 0 and not 0.1 <= seconds <= 86400:
        problems.add(n, f"adopt_timeout: {value} is out of range. Fix: write {AGENT_KEYS['adopt_timeout'][1]}")


def kafka_env(pairs: dict[str, tuple[str, int]], problems: Problems) -> dict[str, str]:
    """SEGSCOPE_KAFKA_* of the kafka_* keys, checked the way the agent and its C tools will read
    them (segscope_kafka.from_env: the files are read, the PEM markers looked for); a problem names
    the key and its line, and the key to set when one is missing."""
    env = {KAFKA_ENV_PREFIX + KAFKA_KEYS[k][0]: v for k, (v, _) in pairs.items() if k in KAFKA_KEYS and v}
    lines = {KAFKA_ENV_PREFIX + KAFKA_KEYS[k][0]: n for k, (_, n) in pairs.items() if k in KAFKA_KEYS}
    if not env:
        return env
    if not pairs.get("kafka", ("", 0))[0]:
        first = min(lines.values())
        problems.add(first, "kafka_*: set, but not kafka (the bootstrap servers). Fix: write kafka = HOST:PORT")
    for key in SECRET_FILES:
        value, n = pairs.get(key, ("", 0))
        mode = _mode(value)
        if mode is not None and mode & 0o077:
            problems.add(n, f"{key}: {value!r} has mode {mode:04o}: other users can read it. Fix: chmod 0600 {value}")
    try:
        from segscope_kafka import KafkaConfigError, from_env
    except ImportError:  # the agent's venv has it; a bare python (tests of this file) may not
        return env
    try:
        from_env(env)
    except KafkaConfigError as exc:
        var = str(exc).split("=", 1)[0].split(":", 1)[0]
        problems.add(lines.get(var, 0), _in_conf_words(str(exc)))
    return env


def _mode(path: str) -> int | None:
    try:
        return os.stat(path).st_mode & 0o777 if path else None
    except OSError:
        return None  # a missing file: from_env says so, with its line


def _in_conf_words(text: str) -> str:
    """segscope_kafka's message with agent.conf's key names for its variables (longest first)."""
    for key, (setting, _) in sorted(KAFKA_KEYS.items(), key=lambda kv: -len(kv[1][0])):
        text = text.replace(KAFKA_ENV_PREFIX + setting, key)
    text = text.replace("; fix: ", ". Fix: ", 1)
    return re.sub(r"^(\w+)=", r"\1: ", text)  # `kafka_ca: '/x.pem': no such file`, as the other keys


def processor_env(name: str, paths: list[Path]) -> tuple[dict[str, str], Problems]:
    """The environment for processor `name` from the files (later files win), checked by the
    processor's own settings class; problems name the file and line of the variable."""
    import importlib

    problems = Problems(str(paths[0]))
    env: dict[str, str] = {}
    where: dict[str, tuple[Path, int]] = {}
    for path in paths:
        for key, (value, n) in read_pairs(
            path, ENV_LINE_RE, Problems(str(path), problems.items), "`VARIABLE=value`"
        ).items():
            env[key], where[key] = value, (path, n)
    known = {"SEGSCOPE_KAFKA"}
    for proc in PROCESSORS:
        known |= {var for var, _ in importlib.import_module(f"processors.{proc}.config").ENV.values()}
    for key, (path, n) in where.items():
        if key not in known:
            problems.add(n, f"{key}: not a setting of any processor. Fix: {_did_you_mean(key, known)}", path)
    config = importlib.import_module(f"processors.{name}.config")
    cls = next(
        v for k, v in vars(config).items() if k.endswith("Config") and k != "EnvConfig" and hasattr(v, "from_env")
    )
    try:
        cls.from_env({**os.environ, **env})
    except Exception as exc:  # noqa: BLE001 - the processor's own words, placed at its variable's line
        text = str(exc)
        # the variable the message names (the longest: SEGSCOPE_X_S, not SEGSCOPE_X)
        hits = sorted((k for k in where if re.search(rf"\b{re.escape(k)}\b", text)), key=len, reverse=True)
        if hits:
            path, n = where[hits[0]]
            problems.add(n, f"{hits[0]}: {text}", path)
        else:
            problems.add(0, f"{text}. Fix: see `segscope-{name}-processor --help`")
    return env, problems


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    prog = Path(sys.argv[0]).name
    check = "--check" in argv
    argv = [a for a in argv if a != "--check"]
    if prog.startswith("processor") or (argv and argv[0] in PROCESSORS and not prog.startswith("agent")):
        if not argv or argv[0] not in PROCESSORS:
            print(f"usage: {prog} [--check] {{{','.join(PROCESSORS)}}} FILE...", file=sys.stderr)
            return 2
        # FILE...: later files win; a leading "-" marks a file that may be absent (as systemd's)
        files = argv[1:] or ["/etc/segscope/processors.conf"]
        paths = [Path(p.lstrip("-")) for p in files if not (p.startswith("-") and not Path(p[1:]).exists())]
        name = argv[0]
        env, problems = processor_env(name, paths)
        cmd = [str(PREFIX / "processors" / "bin" / f"segscope-{name}-processor")]
        full_env, shown = {**os.environ, **env}, {}
    else:
        path = Path(argv[0] if argv else "/etc/segscope/agent.conf")
        args, kafka, problems = agent_command(path)
        cmd = [str(PREFIX / "agent" / "bin" / "segscope-agent"), *args]
        # agent.conf is the one place of the agent's Kafka security: inherited settings go
        inherited = {k: v for k, v in os.environ.items() if not k.startswith(KAFKA_SECURITY_VARS)}
        full_env, shown = {**inherited, **kafka, "SEGSCOPE_BUILD_DIR": str(LIB)}, kafka
    if problems.items:
        print(problems.report(), file=sys.stderr)
        return 2
    if check:
        print(shlex.join(cmd))
        for var, value in sorted(shown.items()):
            print(f"{var}={value}")  # the agent's Kafka settings: file names, never a secret
        return 0
    sys.stdout.flush()
    os.execve(cmd[0], cmd, full_env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
