"""The Debian packages' launchers: read a configuration file under /etc/segscope/, check it, and
exec the program with it. Every problem is reported as `FILE:LINE: key: what. Fix: how` (all at
once) and the launcher exits 2 without starting anything.

    agent-launch /etc/segscope/agent.conf            (segscope-agent.service)
    agent-launch --check /etc/segscope/agent.conf    (check only; prints the command it would run)
    processor-launch delay /etc/segscope/processors.conf   (segscope-processor@delay.service)

The build (packaging/debian/build.py) installs this file twice, as /usr/lib/segscope/agent-launch
(run by the agent's venv python) and /usr/lib/segscope/processor-launch (the processors' venv);
the program's name picks the mode.

agent.conf: `key = value` lines, `#` comments, blank lines (AGENT_KEYS below lists the keys).
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
    "extra_args": ("", "further `segscope-agent` flags, e.g. extra_args = --log-level DEBUG"),
}
REQUIRED = ("node", "listen", "tls_cert", "tls_key", "tls_client_ca")
FILES = ("tls_cert", "tls_key", "tls_client_ca")
NUMBERS = {"stats_interval": float, "topology_interval": float, "stamp_linger_ms": int, "workers": int}
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


def agent_command(path: Path) -> tuple[list[str], Problems]:
    """The agent's argv from agent.conf, and the problems found (argv is only usable without)."""
    problems = Problems(str(path))
    pairs = read_pairs(path, LINE_RE, problems, "`key = value`")
    args: list[str] = []
    for key, (value, n) in pairs.items():
        if key not in AGENT_KEYS:
            problems.add(n, f"{key}: unknown key. Fix: {_did_you_mean(key, AGENT_KEYS)}")
            continue
        flag, good = AGENT_KEYS[key]
        if value == "":
            if key in REQUIRED:
                problems.add(n, f"{key}: not set. Fix: write {good}")
            continue  # an optional key left empty: the agent's default
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
        if key == "extra_args":
            try:
                args += shlex.split(value)
            except ValueError as exc:
                problems.add(n, f"extra_args: {exc}. Fix: balance the quotes")
        else:
            args += [flag, value]
    for key in REQUIRED:
        if key not in pairs:
            problems.add(0, f"{key}: missing. Fix: add a line `{key} = ...`: {AGENT_KEYS[key][1]}")
    return args, problems


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
        full_env = {**os.environ, **env}
    else:
        path = Path(argv[0] if argv else "/etc/segscope/agent.conf")
        args, problems = agent_command(path)
        cmd = [str(PREFIX / "agent" / "bin" / "segscope-agent"), *args]
        full_env = {**os.environ, "SEGSCOPE_BUILD_DIR": str(LIB)}
    if problems.items:
        print(problems.report(), file=sys.stderr)
        return 2
    if check:
        print(shlex.join(cmd))
        return 0
    sys.stdout.flush()
    os.execve(cmd[0], cmd, full_env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
