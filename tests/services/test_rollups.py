"""Retention policies and continuous queries (services/influxdb/rollups.py) on the stack's real
InfluxDB: created with the set durations, idempotent, ALTERed and replaced when settings change;
a real CQ run (RESAMPLE EVERY 1s here) rolls up points, late ones included; --backfill writes the
numbers computed from the raw points. Each test uses a database of its own (dropped at the end),
so the shared `segscope` database and its CQs are never touched.
"""

from __future__ import annotations

import random
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from segscope_schemas import delay_histogram
from services.influxdb import rollups, setup
from services.influxdb.rollups import RP_1H, RP_1M, Retention

NS = 1_000_000_000
MINUTE = 60 * NS
HOUR = 3600 * NS


@pytest.fixture
def database(stack):
    name = f"rol_{uuid.uuid4().hex[:8]}"
    yield name
    stack.influx_query(f'DROP DATABASE "{name}"')  # its RPs and CQs go with it


def ensure(stack, db: str, retention: Retention, every: str | None = None) -> list[str]:
    said: list[str] = []
    influx = setup.Influx(stack.influx_url, None, None)
    setup.ensure_database(influx, db, retention, say=said.append)
    if every:  # the same CQs with a short RESAMPLE EVERY (tests only)
        rollups.ensure(influx.series, db, retention, every=every, say=said.append)
    return said


def policies(stack, db: str) -> dict[str, tuple[str, bool]]:
    rows = stack.influx_query(f'SHOW RETENTION POLICIES ON "{db}"')
    return {r["name"]: (r["duration"], r["default"]) for r in rows}


def cqs(stack, db: str) -> dict[str, str]:
    influx = setup.Influx(stack.influx_url, None, None)
    return {row[0]: row[1] for s in influx.series("SHOW CONTINUOUS QUERIES") if s["name"] == db for row in s["values"]}


# ------------------------------------------------------------------ raw points with known numbers
def delay_second(rng, t_ns: int, node: str, ssid: int, n: int) -> tuple[list[str], dict]:
    """One second of one session (forward): its stamp_delay and stamp_delay_histogram lines as the
    delay processor writes them, and the numbers they carry."""
    d = rng.integers(1_500_000, 2_600_000, n)
    stats = {
        "count": n,
        "sum_us": int(d.sum()) / 1000,
        "min_us": int(d.min()) / 1000,
        "max_us": int(d.max()) / 1000,
        "p99_us": float(np.percentile(d, 99)) / 1000,
        "hist": delay_histogram.counts(d),
    }
    tags = f"node={node},ssid={ssid},direction=forward,path=fc00:2::e\\,fc00:3::d6"
    fields = ",".join(f"{k}={stats[k]}" for k in ("sum_us", "min_us", "max_us", "p99_us"))
    lines = [
        f"stamp_delay,{tags} count={n}i,mean_us={stats['sum_us'] / n},{fields} {t_ns}",
        f"stamp_delay_histogram,{tags} " + ",".join(f"{k}={v}i" for k, v in stats["hist"].items()) + f" {t_ns}",
    ]
    return lines, stats


def loss_block(t_ns: int, flow: int, tx: int, rx: int | None) -> str:
    tags = f"altmark_loss,flow={flow},method=dscp,period_ms=1000,tx_node=A,rx_node=B,path=fc00:2::e"
    if rx is None:
        return f'{tags} tx_packets={tx}i,tx_bytes={tx * 100}i,complete=false,reason="missing_rx" {t_ns}'
    return (
        f"{tags} tx_packets={tx}i,rx_packets={rx}i,lost={tx - rx}i,tx_bytes={tx * 100}i,rx_bytes={rx * 100}i,"
        f'complete=true,reason="ok" {t_ns}'
    )


def expected_delay(seconds: list[dict]) -> dict:
    hist = delay_histogram.merge([s["hist"] for s in seconds])
    count = sum(s["count"] for s in seconds)
    total = sum(s["sum_us"] for s in seconds)
    return {
        "count": count,
        "sum_us": total,
        "mean_us": total / count,
        "min_us": min(s["min_us"] for s in seconds),
        "max_us": max(s["max_us"] for s in seconds),
        "p99_max_us": max(s["p99_us"] for s in seconds),
        "seconds": len(seconds),
        "hist": hist,
    }


def rollup_rows(stack, db: str, rp: str, measurement: str, t_ns: int) -> list[dict]:
    return stack.influx_query(f'SELECT * FROM "{db}"."{rp}"."{measurement}" WHERE time = {t_ns}', db=db)


def assert_delay_rollup(stack, db: str, rp: str, t_ns: int, want: dict) -> None:
    (row,) = rollup_rows(stack, db, rp, "stamp_delay", t_ns)
    assert row["path"] == "fc00:2::e,fc00:3::d6" and row["direction"] == "forward"  # tags kept
    for k in ("count", "seconds"):
        assert row[k] == want[k], (k, row)
    for k in ("sum_us", "mean_us", "min_us", "max_us", "p99_max_us"):
        assert row[k] == pytest.approx(want[k], rel=1e-12), (k, row)
    (hrow,) = rollup_rows(stack, db, rp, "stamp_delay_histogram", t_ns)
    got = {k: v for k, v in hrow.items() if delay_histogram.is_bucket(k) and v is not None}
    assert got == want["hist"]  # same field names as the raw points, exact sums


def wait_for(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except (AssertionError, ValueError) as exc:
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} not seen within {timeout:.0f} s: {exc}") from exc
            time.sleep(0.3)


# ------------------------------------------------------------------ tests
def test_policies_and_queries_are_created_altered_and_replaced_idempotently(stack, database):
    db = database
    said = ensure(stack, db, Retention(raw="INF", rollup_1m="400d", rollup_1h="INF"))
    assert policies(stack, db) == {
        "autogen": ("0s", True),
        RP_1M: ("9600h0m0s", False),
        RP_1H: ("0s", False),
    }
    names = [cq.name for cq in rollups.continuous_queries()]
    assert sorted(cqs(stack, db)) == sorted(names) and len(names) == 7
    shown = cqs(stack, db)
    assert "RESAMPLE EVERY 1m FOR 3m" in shown["segscope_stamp_delay_1m"]
    assert "RESAMPLE EVERY 10m FOR 90m" in shown["segscope_stamp_delay_histogram_1h"]
    assert (
        f"INTO {db}.{RP_1H}.stamp_delay_histogram FROM {db}.{RP_1M}.stamp_delay_histogram"
        in shown["segscope_stamp_delay_histogram_1h"]
    )
    assert "sum(b559) AS b559" in shown["segscope_stamp_delay_histogram_1m"]
    assert sum(1 for s in said if "created" in s) == 2 + 7  # autogen exists with the database

    # the same settings again: nothing to do, nothing said, nothing changed
    assert ensure(stack, db, Retention(raw="INF", rollup_1m="400d", rollup_1h="INF")) == []
    assert cqs(stack, db) == shown

    # new durations: ALTERed in place (autogen stays the default Telegraf writes to)
    said = ensure(stack, db, Retention(raw="30d", rollup_1m="200d", rollup_1h="52w"))
    assert policies(stack, db) == {
        "autogen": ("720h0m0s", True),
        RP_1M: ("4800h0m0s", False),
        RP_1H: ("8736h0m0s", False),
    }
    assert sorted(s.split(":")[1].split()[2] for s in said if "altered" in s) == sorted(["autogen", RP_1M, RP_1H])

    # a changed query replaces the old one; a segscope_* query no longer generated is dropped,
    # anyone else's is left alone
    influx = setup.Influx(stack.influx_url, None, None)
    for name in ("segscope_retired_1m", "site_own_cq"):
        influx.q(
            f'CREATE CONTINUOUS QUERY "{name}" ON "{db}" BEGIN SELECT count("v") INTO "{db}"."{RP_1M}"."x" '
            f'FROM "{db}"."autogen"."x" GROUP BY time(1m) END'
        )
    said = []
    rollups.ensure(influx.series, db, Retention("30d", "200d", "52w"), every="30s", say=said.append)
    assert sum("replaced" in s for s in said) == 7 and any("segscope_retired_1m dropped" in s for s in said)
    after = cqs(stack, db)
    assert sorted(after) == sorted([*names, "site_own_cq"])
    assert "RESAMPLE EVERY 30s FOR 3m" in after["segscope_stamp_delay_1m"]


def test_rollups_only_leaves_autogen_and_users_alone(stack, database, monkeypatch, capsys):
    """A database another system owns (Jalapeno's mdt_db: its autogen, its users): --rollups-only
    adds the rollup RPs and CQs, ALTERs nothing, creates no user."""
    db, user = database, f"owner_{database}"
    for var in ("SEGSCOPE_INFLUX_ADMIN_USER", "SEGSCOPE_INFLUX_ADMIN_PASSWORD", "SEGSCOPE_INFLUX_WRITER_USER",
                "SEGSCOPE_INFLUX_WRITER_PASSWORD", "SEGSCOPE_INFLUX_READER_USER", "SEGSCOPE_INFLUX_READER_PASSWORD",
                "SEGSCOPE_INFLUX_RAW_RETENTION", "SEGSCOPE_INFLUX_ROLLUP_1M_RETENTION"):  # fmt: skip
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SEGSCOPE_INFLUX_WRITER_USER", f"never_{database}")  # not for --rollups-only
    monkeypatch.setenv("SEGSCOPE_INFLUX_WRITER_PASSWORD", "never-used")
    stack.influx_query(f'CREATE DATABASE "{db}" WITH DURATION 7d')  # the owner's raw retention
    stack.influx_query(f"CREATE USER \"{user}\" WITH PASSWORD 'owner-pw'")
    try:
        users = stack.influx_query("SHOW USERS")
        args = ["--url", stack.influx_url, "--database", db, "--rollups-only", "--rollup-1m-retention", "100d"]
        assert setup.main(args) == 0
        want = {"autogen": ("168h0m0s", True), RP_1M: ("2400h0m0s", False), RP_1H: ("0s", False)}
        assert policies(stack, db) == want
        assert sorted(cqs(stack, db)) == sorted(cq.name for cq in rollups.continuous_queries())
        assert stack.influx_query("SHOW USERS") == users
        out = capsys.readouterr().out
        assert out.count("created") == 2 + 7 and "autogen" not in out.split("ready at")[0]
        assert setup.main(args) == 0 and "created" not in capsys.readouterr().out  # idempotent
        # what the owner's autogen must not get: refused before the server is touched, naming the fix
        with pytest.raises(SystemExit) as exit_info:
            setup.main([*args, "--raw-retention", "30d"])
        assert exit_info.value.code == 2 and "--raw-retention with --rollups-only" in capsys.readouterr().err
        monkeypatch.setenv("SEGSCOPE_INFLUX_RAW_RETENTION", "30d")
        assert setup.main(args) == 2 and "SEGSCOPE_INFLUX_RAW_RETENTION is set" in capsys.readouterr().err
        assert policies(stack, db) == want and stack.influx_query("SHOW USERS") == users
        # the rollups read autogen: a database without it is refused, by name (exit 1: the server's state)
        stack.influx_query(f'DROP RETENTION POLICY "autogen" ON "{db}"')
        monkeypatch.delenv("SEGSCOPE_INFLUX_RAW_RETENTION")
        assert setup.main(args) == 1 and f"database {db} has no retention policy autogen" in capsys.readouterr().err
    finally:
        stack.influx_query(f'DROP USER "{user}"')


def test_bad_retention_is_refused_with_the_flag_and_the_fix(stack, capsys):
    code = setup.main(["--url", stack.influx_url, "--database", "never_created", "--raw-retention", "30 days"])
    err = capsys.readouterr().err
    assert code == 2 and "--raw-retention / SEGSCOPE_INFLUX_RAW_RETENTION = '30 days'" in err and "fix:" in err
    with pytest.raises(rollups.RollupError, match="SEGSCOPE_INFLUX_ROLLUP_1M_RETENTION = '30m'"):
        Retention.from_env({"SEGSCOPE_INFLUX_ROLLUP_1M_RETENTION": "30m"})  # below InfluxDB's 1 h minimum
    with pytest.raises(SystemExit) as exit_info:  # refused before the server is touched
        setup.main(["--url", stack.influx_url, "--database", "never_created", "--backfill",
                    "2026-11-02T00:00:00Z", "2026-11-01T00:00:00Z"])  # fmt: skip
    assert exit_info.value.code == 2 and "FROM must be before TO" in capsys.readouterr().err
    assert setup._time_ns("2026-11-01T00:00:00Z") == 1_793_491_200 * NS
    assert "never_created" not in str(stack.influx_query("SHOW DATABASES"))


def test_continuous_queries_roll_up_late_points_too(stack, database):
    """A real CQ run: RESAMPLE EVERY 1s (FOR as in production), points of the last full minute;
    then a late second and a block turning complete in the same minute: the rollups follow."""
    db = database
    ensure(stack, db, Retention(), every="1s")
    rng = np.random.default_rng(16)
    window = time.time_ns() // MINUTE * MINUTE - MINUTE  # the last full minute
    lines, seconds = [], []
    for s in range(5):
        ls, st = delay_second(rng, window + s * NS, "A", 1, 200)
        lines += ls
        seconds.append(st)
    lines += [loss_block(window + s * NS, 7, 1000, 990 - s) for s in range(3)]
    lines.append(loss_block(window + 3 * NS, 7, 500, None))  # missing_rx for now
    stack.influx_write(lines, db=db)

    hour = window // HOUR * HOUR
    wait_for(lambda: assert_delay_rollup(stack, db, RP_1M, window, expected_delay(seconds)), 15, "1 m rollup")

    def loss(rp: str, t: int, want: dict) -> None:
        (row,) = rollup_rows(stack, db, rp, "altmark_loss", t)
        assert {k: row.get(k) for k in want} == want, row

    loss_1m = {"tx_packets": 3000, "rx_packets": 2967, "lost": 33, "complete_blocks": 3, "blocks": 4}
    wait_for(lambda: loss(RP_1M, window, loss_1m), 10, "1 m loss rollup")
    wait_for(lambda: assert_delay_rollup(stack, db, RP_1H, hour, expected_delay(seconds)), 10, "1 h rollup")

    # late: a second at +30 s (re-emitted by the processor after the window was rolled up) and the
    # missing rx side arriving (the block overwritten as complete)
    late, st = delay_second(rng, window + 30 * NS, "A", 1, 50)
    stack.influx_write([*late, loss_block(window + 3 * NS, 7, 500, 495)], db=db)
    seconds.append(st)
    wait_for(lambda: assert_delay_rollup(stack, db, RP_1M, window, expected_delay(seconds)), 10, "late point in 1 m")
    loss_1m.update(tx_packets=3500, rx_packets=3462, lost=38, complete_blocks=4)
    wait_for(lambda: loss(RP_1M, window, loss_1m), 10, "late rx side in 1 m")
    wait_for(lambda: loss(RP_1H, hour, loss_1m), 10, "late rx side in 1 h")


def test_backfill_writes_the_rollups_computed_from_the_raw_points(stack, database):
    """Points written three hours ago, before any CQ could see them: --backfill over their range
    gives each 1 m and 1 h rollup point the numbers computed here from the raw points."""
    db = database
    ensure(stack, db, Retention())
    rng = np.random.default_rng(7)
    rnd = random.Random(7)
    start = (time.time_ns() // HOUR - 3) * HOUR + 58 * MINUTE  # crosses an hour boundary
    by_minute: dict[int, list[dict]] = {}
    lines = []
    for s in range(0, 240, 7):  # every 7th second over 4 minutes
        t = start + s * NS
        ls, st = delay_second(rng, t, "B", 2, rnd.randrange(20, 300))
        lines += ls
        by_minute.setdefault(t // MINUTE * MINUTE, []).append(st)
    stack.influx_write(lines, db=db)

    said: list[str] = []
    influx = setup.Influx(stack.influx_url, None, None)
    written = rollups.backfill(influx.series, db, start, start + 4 * MINUTE, say=said.append)
    assert len(said) == 7  # one line per CQ
    assert written == 2 * len(by_minute) + 2 * 2  # stamp_delay + histogram, 4 minutes and 2 hours
    for minute, secs in by_minute.items():
        assert_delay_rollup(stack, db, RP_1M, minute, expected_delay(secs))
    for hour in (start // HOUR * HOUR, start // HOUR * HOUR + HOUR):
        secs = [s for m, ss in by_minute.items() if m // HOUR * HOUR == hour for s in ss]
        assert_delay_rollup(stack, db, RP_1H, hour, expected_delay(secs))
    # once more: the same points again, nothing else (idempotent)
    assert rollups.backfill(influx.series, db, start, start + 4 * MINUTE, say=said.append) == written
    assert len(stack.influx_query(f'SELECT "count" FROM "{db}"."{RP_1M}"."stamp_delay"', db=db)) == len(by_minute)


def test_the_committed_influxql_is_what_the_code_generates(capsys):
    """services/influxdb/rollups.influxql (for sites that set InfluxDB up by hand) cannot drift."""
    assert rollups.main([]) == 0
    committed = (Path(rollups.__file__).parent / "rollups.influxql").read_text()
    regenerate = "python -m services.influxdb.rollups > services/influxdb/rollups.influxql"
    assert capsys.readouterr().out == committed, f"regenerate: {regenerate}"
