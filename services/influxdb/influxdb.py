"""InfluxDB 1.x (Debian's influxd) with influxd.conf from this folder. Ready = /ping answers
204; then the database of the name registry is set up as segscope-influx-setup does it (same code,
setup.ensure_database): retention policies and the rollups' continuous queries (rollups.py), with
the raw policy kept forever unless SEGSCOPE_INFLUX_RAW_RETENTION says otherwise (tests write fixed
vectors with old timestamps). No users: the local stack runs without authentication. query() and
write() speak the v1 HTTP API (InfluxQL, line protocol), which InfluxDB 1.x, 2.x and 3 all accept."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Iterable

import requests

from segscope_schemas.names import INFLUXDB_DATABASE
from services.influxdb import rollups
from services.influxdb.setup import Influx, SetupError, ensure_database
from services.supervise import Service, StackError

HERE = Path(__file__).resolve().parent
# the stack's defaults; SEGSCOPE_INFLUX_*_RETENTION override them as they do segscope-influx-setup's
STACK_RETENTION = rollups.Retention(raw="INF", rollup_1m="400d", rollup_1h="INF")


class InfluxDB(Service):
    name = "influxdb"
    config_file = "influxd.conf"
    ready_timeout = 45.0
    stop_timeout = 15.0

    def __init__(self, run_dir, say, http_port: int, rpc_port: int, keep_data: bool = True) -> None:
        super().__init__(run_dir, say)
        self.http_port = http_port
        self.rpc_port = rpc_port
        self.keep_data = keep_data
        self.url = f"http://127.0.0.1:{http_port}"
        self.db = INFLUXDB_DATABASE

    def check_ready(self, timeout: float) -> bool:
        return requests.get(f"{self.url}/ping", timeout=timeout).status_code == 204

    def start(self) -> None:
        influxd = shutil.which("influxd") or "/usr/bin/influxd"
        if not Path(influxd).exists():
            raise StackError("influxdb: `influxd` not found (Debian package influxdb); run `make setup`")
        self.check_ports_free((self.http_port, self.rpc_port))
        data_dir = self.dir / "data"
        if not self.keep_data:
            shutil.rmtree(data_dir, ignore_errors=True)
        data_dir.mkdir(parents=True, exist_ok=True)
        self.render(
            HERE / "influxd.conf", self.config_path, HTTP_PORT=self.http_port, RPC_PORT=self.rpc_port, DATA_DIR=data_dir
        )
        pid = self.spawn([influxd, "run", "-config", str(self.config_path)])
        self.wait_ready(self.ready_timeout, pid)

    def after_ready(self) -> None:
        try:
            retention = rollups.Retention.from_env(dict(os.environ), STACK_RETENTION)
            ensure_database(Influx(self.url, None, None), self.db, retention, say=self.say)
        except (SetupError, rollups.RollupError) as exc:
            raise StackError(f"influxdb: {exc}") from None

    def query(self, query: str, db: str | None = None, timeout: float = 10.0) -> list[dict]:
        """Run InfluxQL via /query (epoch=ns); rows of every series as dicts (columns + GROUP BY tags)."""
        resp = requests.post(
            f"{self.url}/query", params={"db": db or self.db, "epoch": "ns"}, data={"q": query}, timeout=timeout
        )
        try:
            body = resp.json()
        except ValueError:
            raise StackError(f"InfluxDB query {query!r}: HTTP {resp.status_code}: {resp.text[:300]}") from None
        if resp.status_code != 200 or "error" in body:
            raise StackError(f"InfluxDB query {query!r}: HTTP {resp.status_code}: {body}")
        rows: list[dict] = []
        for result in body.get("results", []):
            if "error" in result:
                raise StackError(f"InfluxDB query {query!r}: {result['error']}")
            for series in result.get("series", []):
                tags = series.get("tags", {})
                for values in series.get("values", []):
                    row = dict(zip(series["columns"], values, strict=True))
                    row.update(tags)
                    rows.append(row)
        return rows

    def query_settled(
        self, query: str, db: str | None = None, settle_s: float = 1.0, timeout: float = 10.0
    ) -> list[dict]:
        """query(), for data that is still being written: InfluxDB 1.x applies a point's fields to
        its cache one by one, so a query racing a write can return that point with some fields
        null (influxdata/influxdb#8546, closed wontfix). This runs the query, waits settle_s (a
        write finishes in milliseconds), runs it again and returns the second run's rows at the
        times the first run returned: each of them was written completely by then. Points that
        arrived in between are left out, as they may be mid-write themselves."""
        first = {row["time"] for row in self.query(query, db=db, timeout=timeout)}
        time.sleep(settle_s)
        return [row for row in self.query(query, db=db, timeout=timeout) if row["time"] in first]

    def write(
        self, lines: str | Iterable[str], db: str | None = None, precision: str = "ns", timeout: float = 10.0
    ) -> None:
        """Write line protocol via /write; raises StackError with InfluxDB's message on rejection."""
        body = lines if isinstance(lines, str) else "\n".join(lines)
        resp = requests.post(
            f"{self.url}/write",
            params={"db": db or self.db, "precision": precision},
            data=body.encode(),
            timeout=timeout,
        )
        if resp.status_code != 204:
            raise StackError(f"InfluxDB write: HTTP {resp.status_code}: {resp.text[:300]}")
