"""Retention policies and continuous queries (CQs) of the segscope database, generated here only.

Three retention policies (RPs):

    autogen     raw points as Telegraf writes them (the database's DEFAULT policy)
    rollup_1m   one point per series and minute, from autogen        (continuous queries *_1m)
    rollup_1h   one point per series and hour, from rollup_1m        (continuous queries *_1h)

Each rollup keeps the raw measurement name and tags (`GROUP BY time(...), *`), and its fields are
what can be summed again without loss: counts, sums, minimums, maximums, histogram buckets. A
histogram bucket keeps its field name (`b<i>`, `low`, `high`) in every RP, so one query reads any of
them (`FROM "rollup_1h"."stamp_delay_histogram"`). docs/querying.md ("Rollups") lists the fields.

Why the 1 h rollup reads the 1 m rollup and not the raw points: it reads 60 times fewer points (a
histogram point has up to 562 fields), and it still works once the raw points have expired (raw
30 d in the chart, 1 m 400 d), e.g. for a --backfill of the 1 h rollup. Every 1 h field is a sum,
min or max of 1 m fields, which is exact. The price: a 1 h window is final only once its 1 m windows
are (RESAMPLE FOR below covers that).

Late points: the delay processor publishes a second ~2 s after it ends and publishes it again if
records come up to 60 s late (SEGSCOPE_DELAY_RETENTION_S); the loss processor publishes a block
again while what is known about it changes, up to 300 s after its first record. A CQ recomputes
each window for RESAMPLE FOR after it starts, so a window is final once its points are:

    stamp_delay, stamp_delay_histogram   1 m: EVERY 1m FOR 3m    (window end + 62 s + Telegraf)
    altmark_loss                         1 m: EVERY 1m FOR 10m   (block end + 300 s; periods <= 3 min)
    every measurement                    1 h: EVERY 10m FOR 90m  (after the 1 m rollup is final)

Points changed later than that (a processor replaying its input after a crash) reach the rollups
with `segscope-influx-setup --backfill FROM TO`, which runs the same SELECT ... INTO bodies once over
that range (aligned to whole hours, 1 m first, then 1 h).

A CQ writes only the windows it finds points in: a window whose points all vanish keeps its old
rollup point. That is why the loss rollup counts blocks in its own CQ without a WHERE
(`blocks`, every block), beside the sums over complete blocks (WHERE complete = true).

    python -m services.influxdb.rollups [--database segscope] > services/influxdb/rollups.influxql
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable

from segscope_schemas import delay_histogram, influxql
from segscope_schemas.names import INFLUXDB_DATABASE

RAW_RP = "autogen"
RP_1M = "rollup_1m"
RP_1H = "rollup_1h"
NS = 1_000_000_000
HOUR_NS = 3600 * NS


class RollupError(Exception):
    """A bad setting (the message names it and the fix) or a statement the server refused."""


# ------------------------------------------------------------------ retention settings
# InfluxQL duration literals an RP accepts: INF or a whole number of hours, days, weeks (>= 1 h).
_DURATION = re.compile(r"^(?:INF|[1-9][0-9]*[hdw])$")
_UNIT_S = {"h": 3600, "d": 86400, "w": 7 * 86400}


def duration_s(literal: str) -> int:
    """Seconds of an RP duration literal; 0 for INF (InfluxDB's own encoding of "keep forever")."""
    if literal == "INF":
        return 0
    return int(literal[:-1]) * _UNIT_S[literal[-1]]


def shown_duration_s(shown: str) -> int:
    """Seconds of a duration as SHOW RETENTION POLICIES prints it (Go: "720h0m0s", "0s")."""
    m = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", shown)
    if not m or not shown:
        raise RollupError(f"cannot read the retention policy duration {shown!r} InfluxDB reported")
    h, mi, s = (int(x or 0) for x in m.groups())
    return h * 3600 + mi * 60 + s


@dataclass(frozen=True)
class Retention:
    """How long each RP keeps its points: INF or <n>h / <n>d / <n>w (InfluxDB's minimum is 1 h)."""

    raw: str = "INF"
    rollup_1m: str = "400d"
    rollup_1h: str = "INF"

    # setting -> (environment variable, command-line flag)
    SOURCES = {
        "raw": ("SEGSCOPE_INFLUX_RAW_RETENTION", "--raw-retention"),
        "rollup_1m": ("SEGSCOPE_INFLUX_ROLLUP_1M_RETENTION", "--rollup-1m-retention"),
        "rollup_1h": ("SEGSCOPE_INFLUX_ROLLUP_1H_RETENTION", "--rollup-1h-retention"),
    }

    def __post_init__(self) -> None:
        for name, (var, flag) in self.SOURCES.items():
            value = getattr(self, name)
            if not _DURATION.match(value) or (value != "INF" and duration_s(value) < 3600):
                raise RollupError(
                    f"{flag} / {var} = {value!r} is not a retention InfluxDB accepts; "
                    f"fix: INF (keep forever) or a whole number of h, d or w of at least 1h, e.g. 30d"
                )

    @classmethod
    def from_env(cls, env: dict[str, str], default: Retention | None = None) -> Retention:
        base = default or cls()
        return cls(**{name: env.get(var) or getattr(base, name) for name, (var, _) in cls.SOURCES.items()})

    def by_rp(self) -> dict[str, str]:
        return {RAW_RP: self.raw, RP_1M: self.rollup_1m, RP_1H: self.rollup_1h}


# ------------------------------------------------------------------ the continuous queries
def _q(name: str) -> str:
    return '"' + name.replace('"', '\\"') + '"'


@dataclass(frozen=True)
class ContinuousQuery:
    name: str  # segscope_<measurement>[_<what>]_<interval>
    measurement: str
    source_rp: str
    target_rp: str
    interval: str  # GROUP BY time(...)
    every: str
    resample_for: str
    fields: tuple[tuple[str, str], ...]  # (aggregate expression, output field)
    where: str = ""  # condition on fields (never on time: the CQ or the backfill sets the range)

    def select(self, database: str, time_range: str = "") -> str:
        cond = " AND ".join(c for c in (self.where, time_range) if c)
        return (
            "SELECT "
            + ", ".join(f"{expr} AS {_q(out)}" for expr, out in self.fields)
            + f" INTO {_q(database)}.{_q(self.target_rp)}.{_q(self.measurement)}"
            + f" FROM {_q(database)}.{_q(self.source_rp)}.{_q(self.measurement)}"
            + (f" WHERE {cond}" if cond else "")
            + f" GROUP BY time({self.interval}), *"
        )

    def create(self, database: str) -> str:
        return (
            f"CREATE CONTINUOUS QUERY {_q(self.name)} ON {_q(database)} "
            f"RESAMPLE EVERY {self.every} FOR {self.resample_for} BEGIN {self.select(database)} END"
        )


def _delay_fields(from_raw: bool) -> tuple[tuple[str, str], ...]:
    return (
        ('sum("count")', "count"),
        ('sum("sum_us")', "sum_us"),
        # packet-weighted: the mean of all delays in the window, not a mean of per-second means
        ('sum("sum_us") / sum("count")', "mean_us"),
        ('min("min_us")', "min_us"),
        ('max("max_us")', "max_us"),
        # the largest per-second p99: an upper bound of the window's p99, NOT its p99 (that one
        # comes from stamp_delay_histogram)
        ('max("p99_us")' if from_raw else 'max("p99_max_us")', "p99_max_us"),
        # seconds with at least one packet (raw points), summed in the 1 h rollup
        ('count("count")' if from_raw else 'sum("seconds")', "seconds"),
        ('sum("unsynchronized")', "unsynchronized"),
        ('max("error_estimate_max_us")', "error_estimate_max_us"),
    )


def _histogram_fields() -> tuple[tuple[str, str], ...]:
    return tuple((f"sum({_q(f)})", f) for f in delay_histogram.field_names())


_LOSS_SUMS = ("tx_packets", "rx_packets", "lost", "tx_bytes", "rx_bytes")


def continuous_queries(every: str | None = None) -> list[ContinuousQuery]:
    """Every CQ, 1 m ones first (the 1 h ones read them). `every` overrides RESAMPLE EVERY of all
    of them (tests use 1s to see a run within seconds)."""
    delay_1m = dict(interval="1m", every=every or "1m", resample_for="3m", source_rp=RAW_RP, target_rp=RP_1M)
    loss_1m = dict(delay_1m, resample_for="10m")
    hourly = dict(interval="1h", every=every or "10m", resample_for="90m", source_rp=RP_1M, target_rp=RP_1H)
    return [
        ContinuousQuery("segscope_stamp_delay_1m", "stamp_delay", fields=_delay_fields(True), **delay_1m),
        ContinuousQuery(
            "segscope_stamp_delay_histogram_1m", delay_histogram.MEASUREMENT, fields=_histogram_fields(), **delay_1m
        ),
        ContinuousQuery(
            "segscope_altmark_loss_1m",
            "altmark_loss",
            fields=(*((f"sum({_q(f)})", f) for f in _LOSS_SUMS), ('count("lost")', "complete_blocks")),
            where='"complete" = true',
            **loss_1m,
        ),
        # every block, complete or not: never stale when a block changes between the two kinds
        ContinuousQuery(
            "segscope_altmark_loss_blocks_1m", "altmark_loss", fields=(('count("complete")', "blocks"),), **loss_1m
        ),  # fmt: skip
        ContinuousQuery("segscope_stamp_delay_1h", "stamp_delay", fields=_delay_fields(False), **hourly),
        ContinuousQuery(
            "segscope_stamp_delay_histogram_1h", delay_histogram.MEASUREMENT, fields=_histogram_fields(), **hourly
        ),
        ContinuousQuery(
            "segscope_altmark_loss_1h",
            "altmark_loss",
            fields=tuple((f"sum({_q(f)})", f) for f in (*_LOSS_SUMS, "complete_blocks", "blocks")),
            **hourly,
        ),
    ]


def statements(database: str, retention: Retention, every: str | None = None) -> list[str]:
    """The InfluxQL that sets everything up on an empty database (rollups.influxql holds it for the
    defaults). ensure() runs the same statements, but only those that change something."""
    out = []
    for rp, duration in retention.by_rp().items():
        default = " DEFAULT" if rp == RAW_RP else ""
        out.append(f"CREATE RETENTION POLICY {_q(rp)} ON {_q(database)} DURATION {duration} REPLICATION 1{default}")
    return out + [cq.create(database) for cq in continuous_queries(every)]


# ------------------------------------------------------------------ applying them
# statement -> its series [{"name", "tags", "columns", "values"}]; raises influxql.InfluxQLError when
# the server refuses it (segscope_schemas.influxql.series with the URL, database and credentials bound)
Run = Callable[[str], list[dict]]


def _rows(run: Run, statement: str) -> list[list]:
    return [row for s in run(statement) for row in s["values"]]


def ensure(
    run: Run, database: str, retention: Retention, every: str | None = None, say=print, raw: bool = True
) -> None:
    """Create or ALTER the RPs and create or replace the CQs so the database matches the settings;
    a second run with the same settings changes nothing. CQs named segscope_* that are no longer
    generated are dropped. raw=False (--rollups-only, a database someone else owns, e.g.
    Jalapeno's mdt_db): `autogen` is only checked to exist (the rollups read it), never ALTERed,
    whatever retention.raw says."""
    db = _q(database)
    # rows: name, duration, shardGroupDuration, replicaN, default
    rps = {row[0]: row for row in _rows(run, f"SHOW RETENTION POLICIES ON {db}")}
    for rp, duration in retention.by_rp().items():
        default = rp == RAW_RP
        have = rps.get(rp)
        if default and not raw:
            if have is None:
                raise RollupError(
                    f"database {database} has no retention policy {RAW_RP}, which the rollups read; "
                    f"fix: create it (CREATE RETENTION POLICY {RAW_RP} ON {database} DURATION INF REPLICATION 1 "
                    "DEFAULT) or run the full setup, which manages it"
                )
            continue
        clause = f"DURATION {duration} REPLICATION 1" + (" DEFAULT" if default else "")
        if have is None:
            run(f"CREATE RETENTION POLICY {_q(rp)} ON {db} {clause}")
            say(f"segscope-influx-setup: retention policy {rp} created: {duration}{' (default)' if default else ''}")
        elif shown_duration_s(have[1]) != duration_s(duration) or (default and not have[4]):
            run(f"ALTER RETENTION POLICY {_q(rp)} ON {db} {clause}")
            say(f"segscope-influx-setup: retention policy {rp} altered: {have[1]} -> {duration}")
    existing = {}
    for s in run("SHOW CONTINUOUS QUERIES"):  # one series per database
        if s["name"] == database:
            existing.update({row[0]: row[1] for row in s["values"]})
    wanted = continuous_queries(every)
    for cq in wanted:
        text = cq.create(database)
        if cq.name in existing:
            try:
                run(text)  # the same query again is a no-op; another one is refused
                continue
            except influxql.InfluxQLError as exc:
                if "already exists" not in str(exc):
                    raise
            run(f"DROP CONTINUOUS QUERY {_q(cq.name)} ON {db}")
            run(text)
            say(f"segscope-influx-setup: continuous query {cq.name} replaced")
        else:
            run(text)
            say(f"segscope-influx-setup: continuous query {cq.name} created ({cq.interval} into {cq.target_rp})")
    for name in sorted(set(existing) - {cq.name for cq in wanted}):
        if name.startswith("segscope_"):
            run(f"DROP CONTINUOUS QUERY {_q(name)} ON {db}")
            say(f"segscope-influx-setup: continuous query {name} dropped (no longer generated)")


def _rfc3339(ns: int) -> str:
    return datetime.fromtimestamp(ns // NS, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def backfill(
    run: Run, database: str, start_ns: int, end_ns: int, where: str = "", chunk_s: int = 86400, say=print
) -> int:
    """Run every CQ's SELECT ... INTO once over [start, end), widened to whole hours, in chunks of
    `chunk_s` (bounded memory per statement): first all 1 m CQs, then the 1 h ones, which read
    the 1 m rollup. `where`: an InfluxQL condition on tags (e.g. `"node" = 'A'`) to roll up only
    those series (each series is rolled up on its own, so a subset is exact). Returns the points
    written."""
    if end_ns <= start_ns:
        raise RollupError(f"--backfill: FROM {_rfc3339(start_ns)} is not before TO {_rfc3339(end_ns)}")
    start = start_ns // HOUR_NS * HOUR_NS
    end = -(-end_ns // HOUR_NS) * HOUR_NS
    written = 0
    for cq in continuous_queries():
        for lo in range(start, end, chunk_s * NS):
            hi = min(end, lo + chunk_s * NS)
            cond = f"time >= {lo} AND time < {hi}" + (f" AND ({where})" if where else "")
            rows = _rows(run, cq.select(database, cond))
            written += sum(int(r[1]) for r in rows)  # (time, written)
        say(f"segscope-influx-setup: backfill {cq.name}: {_rfc3339(start)} .. {_rfc3339(end)}")
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m services.influxdb.rollups", description="print the rollup InfluxQL")
    ap.add_argument("--database", default=INFLUXDB_DATABASE)
    args = ap.parse_args(argv)
    print(f"-- generated by `python -m services.influxdb.rollups --database {args.database}`; do not edit.")
    print("-- Retention: the defaults of segscope-influx-setup (raw INF, rollup_1m 400d, rollup_1h INF).")
    for statement in statements(args.database, Retention()):
        print(statement + ";")
    return 0


if __name__ == "__main__":
    sys.exit(main())
