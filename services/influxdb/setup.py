"""segscope-influx-setup: prepare an InfluxDB 1.x that runs with authentication for segscope:
the admin user (created only while the server has no user at all, which InfluxDB allows without
credentials), the database, its retention policies and continuous queries (raw `autogen`, the
rollups `rollup_1m` and `rollup_1h`: services/influxdb/rollups.py), a writer user (Telegraf: WRITE)
and a reader user (Grafana, the controller's status: READ). Idempotent: an existing user gets its
password set again, so rotating a Secret and re-running is how passwords change; a changed
retention ALTERs its policy; a changed continuous query is replaced. The Helm chart runs it as
Telegraf's init container; the local stack (services/influxdb/influxdb.py) calls ensure_database().

Credentials come from the environment (Kubernetes Secrets), never from flags:
    SEGSCOPE_INFLUX_ADMIN_USER / _ADMIN_PASSWORD      required
    SEGSCOPE_INFLUX_WRITER_USER / _WRITER_PASSWORD    optional pair
    SEGSCOPE_INFLUX_READER_USER / _READER_PASSWORD    optional pair

    segscope-influx-setup --url http://influxdb:8086 --database segscope [--timeout 120]
        [--raw-retention INF] [--rollup-1m-retention 400d] [--rollup-1h-retention INF]
        [--backfill FROM TO] [--rollups-only]

Retentions: INF or <n>h|d|w (at least 1h); each flag's default comes from its variable
SEGSCOPE_INFLUX_RAW_RETENTION, _ROLLUP_1M_RETENTION, _ROLLUP_1H_RETENTION, else INF, 400d, INF
(raw INF: this tool never deletes data unless asked to; the chart sets 30d).
--backfill 2026-11-01T00:00:00Z 2026-11-08T00:00:00Z runs the continuous queries' SELECT ... INTO
once over that range (whole hours), for points written before the queries existed or changed later.

--rollups-only: in a database segscope shares with another system (Jalapeno's mdt_db), only the
rollup retention policies and continuous queries: `autogen` is not ALTERed, no user is created or
changed, and the admin credentials are optional (used when set).

Exit codes: 0 ready, 1 the server refused (message names the statement), 2 bad environment.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from datetime import datetime

import requests

from segscope_schemas import influxql
from segscope_schemas.version import VERSION_LINE
from services.influxdb import rollups

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")


class SetupError(Exception):
    pass


class BadSetting(SetupError):
    """Wrong environment or flags (exit 2): the message names the variable or flag and the fix."""


def _ident(value: str, what: str) -> str:
    if not _NAME.match(value):
        raise BadSetting(f"{what} {value!r} is not a plain name (letters, digits, _ . -; at most 64)")
    return f'"{value}"'


def _secret(value: str) -> str:
    # InfluxQL string literal: single quotes, backslash-escaped
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class Influx:
    def __init__(self, url: str, user: str | None, password: str | None, timeout: float = 10.0) -> None:
        self.url, self.auth, self.timeout = url.rstrip("/"), (user, password) if user else None, timeout

    def series(self, statement: str) -> list[dict]:
        """Every series of the answer; influxql.InfluxQLError when refused (rollups.Run)."""
        return influxql.series(self.url, statement, auth=self.auth, timeout=self.timeout)

    def q(self, statement: str, shown: str | None = None) -> list:
        """The rows of every series (statements name their database themselves)."""
        try:
            found = self.series(statement)
        except influxql.InfluxQLError as exc:
            raise SetupError(f"{shown or statement}: {exc}") from exc
        return [row for s in found for row in s["values"]]


def ensure_database(db: Influx, database: str, retention: rollups.Retention, say=print, raw: bool = True) -> None:
    """The database with its retention policies and continuous queries, as the settings say
    (raw=False: `autogen` left as it is, rollups.ensure)."""
    db.q(f"CREATE DATABASE {_ident(database, 'database')}")  # no-op when it exists
    try:
        rollups.ensure(db.series, database, retention, say=say, raw=raw)
    except (influxql.InfluxQLError, rollups.RollupError) as exc:
        raise SetupError(f"retention policies / continuous queries of {database}: {exc}") from exc


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


def _retention(env: dict[str, str], given: rollups.Retention | None) -> rollups.Retention:
    """The retention durations given, else from SEGSCOPE_INFLUX_*_RETENTION or the defaults."""
    try:
        return given or rollups.Retention.from_env(env)
    except rollups.RollupError as exc:
        raise BadSetting(str(exc)) from None


def _backfill(db, database: str, backfill: tuple[int, int], say) -> None:
    """Run the rollups once over backfill = (from_ns, to_ns)."""
    try:
        n = rollups.backfill(db.series, database, *backfill, say=say)
    except (influxql.InfluxQLError, rollups.RollupError) as exc:
        raise SetupError(f"backfill: {exc}") from exc
    say(f"segscope-influx-setup: backfill wrote {n} rollup points")


def setup(
    url: str,
    database: str,
    env: dict[str, str],
    timeout_s: float = 120.0,
    say=print,
    retention: rollups.Retention | None = None,
    backfill: tuple[int, int] | None = None,
) -> None:
    """`retention` None: from the environment (SEGSCOPE_INFLUX_*_RETENTION) or the defaults.
    `backfill` (from_ns, to_ns): run the rollups once over that range after the setup."""
    retention = _retention(env, retention)
    admin, admin_pw = env.get("SEGSCOPE_INFLUX_ADMIN_USER", ""), env.get("SEGSCOPE_INFLUX_ADMIN_PASSWORD", "")
    if not admin or not admin_pw:
        raise BadSetting("SEGSCOPE_INFLUX_ADMIN_USER and SEGSCOPE_INFLUX_ADMIN_PASSWORD must be set (a Secret)")
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
    ensure_database(db, database, retention, say)
    for role, grant in (("WRITER", "WRITE"), ("READER", "READ")):
        user, pw = env.get(f"SEGSCOPE_INFLUX_{role}_USER", ""), env.get(f"SEGSCOPE_INFLUX_{role}_PASSWORD", "")
        if not user:
            continue
        if not pw:
            raise BadSetting(f"SEGSCOPE_INFLUX_{role}_USER is set but SEGSCOPE_INFLUX_{role}_PASSWORD is empty")
        name = _ident(user, f"{role.lower()} user")
        if user in existing:
            db.q(f"SET PASSWORD FOR {name} = {_secret(pw)}", shown=f"SET PASSWORD FOR {user}")
        else:
            db.q(f"CREATE USER {name} WITH PASSWORD {_secret(pw)}", shown=f"CREATE USER {user}")
        db.q(f"GRANT {grant} ON {_ident(database, 'database')} TO {name}")
        say(f"segscope-influx-setup: {role.lower()} user {user}: {grant} on {database}")
    say(f"segscope-influx-setup: database {database} ready at {url}")
    if backfill:
        _backfill(db, database, backfill, say)


def setup_rollups_only(
    url: str,
    database: str,
    env: dict[str, str],
    timeout_s: float = 120.0,
    say=print,
    retention: rollups.Retention | None = None,
    backfill: tuple[int, int] | None = None,
) -> None:
    """--rollups-only: in a database segscope shares (Jalapeno's mdt_db) only the rollup retention
    policies and the continuous queries: `autogen` (its owner's raw retention) is never ALTERed and
    no user is created or changed. The admin credentials are used when set (creating an RP or a
    CQ needs an admin where auth is on), else none (auth off)."""
    if env.get("SEGSCOPE_INFLUX_RAW_RETENTION"):
        raise BadSetting(
            "SEGSCOPE_INFLUX_RAW_RETENTION is set but --rollups-only leaves autogen's retention to the "
            "database's owner: unset it, or run without --rollups-only"
        )
    retention = _retention(env, retention)
    admin, admin_pw = env.get("SEGSCOPE_INFLUX_ADMIN_USER", ""), env.get("SEGSCOPE_INFLUX_ADMIN_PASSWORD", "")
    if bool(admin) != bool(admin_pw):
        raise BadSetting(
            "set both SEGSCOPE_INFLUX_ADMIN_USER and SEGSCOPE_INFLUX_ADMIN_PASSWORD (an admin of the server), "
            "or neither (a server without authentication)"
        )
    wait_ping(url, timeout_s)
    db = Influx(url, admin or None, admin_pw or None)
    ensure_database(db, database, retention, say, raw=False)
    say(f"segscope-influx-setup: rollups of {database} ready at {url} (autogen and users left as they are)")
    if backfill:
        _backfill(db, database, backfill, say)


def _time_ns(text: str) -> int:
    """RFC 3339 UTC time (2026-11-01T00:00:00Z) -> epoch ns."""
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an RFC 3339 time like 2026-11-01T00:00:00Z") from None
    if t.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no time zone; add Z (UTC), e.g. 2026-11-01T00:00:00Z")
    return int(t.timestamp()) * 1_000_000_000 + t.microsecond * 1000


def main(argv: list[str] | None = None, env: dict[str, str] | None = None) -> int:
    """env: the environment to read (None: os.environ)."""
    ap = argparse.ArgumentParser(prog="segscope-influx-setup", description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", action="version", version=VERSION_LINE)
    ap.add_argument("--url", required=True, help="InfluxDB v1 HTTP API, e.g. http://influxdb:8086")
    ap.add_argument("--database", required=True)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for /ping (default 120)")
    for name, (var, flag) in rollups.Retention.SOURCES.items():
        ap.add_argument(flag, dest=name, help=f"retention of {name}: INF or <n>h|d|w (default ${var}, else "
                        f"{getattr(rollups.Retention(), name)})")  # fmt: skip
    ap.add_argument("--backfill", nargs=2, type=_time_ns, metavar=("FROM", "TO"),
                    help="then run the rollups once over [FROM, TO), RFC 3339 UTC times")  # fmt: skip
    ap.add_argument("--rollups-only", action="store_true",
                    help="only the rollup retention policies and continuous queries, in a database another "
                         "system owns (Jalapeno's mdt_db): autogen and users are left alone")  # fmt: skip
    args = ap.parse_args(argv)
    if args.backfill and args.backfill[0] >= args.backfill[1]:
        ap.error("--backfill FROM TO: FROM must be before TO")  # exit 2 before touching the server
    if args.rollups_only and args.raw:
        ap.error("--raw-retention with --rollups-only: autogen's retention is left to the database's owner; drop one")
    env = dict(os.environ if env is None else env)
    try:
        from_env = rollups.Retention.from_env(env)
        retention = rollups.Retention(
            **{name: getattr(args, name) or getattr(from_env, name) for name in rollups.Retention.SOURCES}
        )
        run = setup_rollups_only if args.rollups_only else setup
        run(args.url, args.database, env, args.timeout, retention=retention, backfill=args.backfill)
    except rollups.RollupError as exc:
        print(f"segscope-influx-setup: ERROR: {exc}", file=sys.stderr)
        return 2
    except SetupError as exc:
        print(f"segscope-influx-setup: ERROR: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, BadSetting) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
