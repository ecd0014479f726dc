"""segscope-influx-setup: prepare an InfluxDB 1.x that runs with authentication for segscope:
the admin user (created only while the server has no user at all, which InfluxDB allows without
credentials), the database, a writer user (Telegraf: WRITE) and a reader user (Grafana, the
controller's status: READ). Idempotent: an existing user gets its password set again, so rotating
a Secret and re-running is how passwords change. The Helm chart runs it as Telegraf's init container.

Credentials come from the environment (Kubernetes Secrets), never from flags:
    SEGSCOPE_INFLUX_ADMIN_USER / _ADMIN_PASSWORD      required
    SEGSCOPE_INFLUX_WRITER_USER / _WRITER_PASSWORD    optional pair
    SEGSCOPE_INFLUX_READER_USER / _READER_PASSWORD    optional pair

    segscope-influx-setup --url http://influxdb:8086 --database segscope [--timeout 120]

Exit codes: 0 ready, 1 the server refused (message names the statement), 2 bad environment.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

import requests

from segscope_schemas import influxql
from segscope_schemas.version import VERSION_LINE

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")


class SetupError(Exception):
    pass


def _ident(value: str, what: str) -> str:
    if not _NAME.match(value):
        raise SetupError(f"{what} {value!r} is not a plain name (letters, digits, _ . -; at most 64)")
    return f'"{value}"'


def _secret(value: str) -> str:
    # InfluxQL string literal: single quotes, backslash-escaped
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class Influx:
    def __init__(self, url: str, user: str | None, password: str | None, timeout: float = 10.0) -> None:
        self.url, self.auth, self.timeout = url.rstrip("/"), (user, password) if user else None, timeout

    def q(self, statement: str, shown: str | None = None) -> list:
        """The rows of every series (statements name their database themselves)."""
        try:
            found = influxql.series(self.url, statement, auth=self.auth, timeout=self.timeout)
        except influxql.InfluxQLError as exc:
            raise SetupError(f"{shown or statement}: {exc}") from exc
        return [row for s in found for row in s["values"]]


def wait_ping(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if requests.get(f"{url.rstrip('/')}/ping", timeout=3).status_code == 204:
                return
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            raise SetupError(f"{url}/ping did not answer 204 within {timeout_s:.0f} s")
        time.sleep(1.0)


def setup(url: str, database: str, env: dict[str, str], timeout_s: float = 120.0, say=print) -> None:
    admin, admin_pw = env.get("SEGSCOPE_INFLUX_ADMIN_USER", ""), env.get("SEGSCOPE_INFLUX_ADMIN_PASSWORD", "")
    if not admin or not admin_pw:
        raise SetupError("SEGSCOPE_INFLUX_ADMIN_USER and SEGSCOPE_INFLUX_ADMIN_PASSWORD must be set (a Secret)")
    wait_ping(url, timeout_s)
    anonymous = Influx(url, None, None)
    try:
        # auth off: the list; auth on without any user: refused with "create admin user first";
        # auth on with users: 401 (only an admin may list them)
        no_user_yet = anonymous.q("SHOW USERS") == []
    except SetupError as exc:
        no_user_yet = "create admin user first" in str(exc)
    if no_user_yet:
        anonymous.q(f"CREATE USER {_ident(admin, 'admin user')} WITH PASSWORD {_secret(admin_pw)} WITH ALL PRIVILEGES",
                    shown=f"CREATE USER {admin} (admin)")  # fmt: skip
        say(f"segscope-influx-setup: created admin user {admin}")
    db = Influx(url, admin, admin_pw)
    existing = {row[0] for row in db.q("SHOW USERS")}
    db.q(f"CREATE DATABASE {_ident(database, 'database')}")
    for role, grant in (("WRITER", "WRITE"), ("READER", "READ")):
        user, pw = env.get(f"SEGSCOPE_INFLUX_{role}_USER", ""), env.get(f"SEGSCOPE_INFLUX_{role}_PASSWORD", "")
        if not user:
            continue
        if not pw:
            raise SetupError(f"SEGSCOPE_INFLUX_{role}_USER is set but SEGSCOPE_INFLUX_{role}_PASSWORD is empty")
        name = _ident(user, f"{role.lower()} user")
        if user in existing:
            db.q(f"SET PASSWORD FOR {name} = {_secret(pw)}", shown=f"SET PASSWORD FOR {user}")
        else:
            db.q(f"CREATE USER {name} WITH PASSWORD {_secret(pw)}", shown=f"CREATE USER {user}")
        db.q(f"GRANT {grant} ON {_ident(database, 'database')} TO {name}")
        say(f"segscope-influx-setup: {role.lower()} user {user}: {grant} on {database}")
    say(f"segscope-influx-setup: database {database} ready at {url}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="segscope-influx-setup", description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", action="version", version=VERSION_LINE)
    ap.add_argument("--url", required=True, help="InfluxDB v1 HTTP API, e.g. http://influxdb:8086")
    ap.add_argument("--database", required=True)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for /ping (default 120)")
    args = ap.parse_args(argv)
    try:
        setup(args.url, args.database, dict(os.environ), args.timeout)
    except SetupError as exc:
        print(f"segscope-influx-setup: ERROR: {exc}", file=sys.stderr)
        return 2 if "must be set" in str(exc) or "is empty" in str(exc) or "plain name" in str(exc) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
