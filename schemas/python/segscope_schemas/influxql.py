"""InfluxQL over the v1 HTTP API (/query), which InfluxDB 1.x, 2.x and 3 all accept: one client for
the programs that read InfluxDB (segscope-report, segscope-freshness, segscope-influx-setup).
The local stack's own helper (services/influxdb/influxdb.py) flattens rows for the tests; this
keeps each series with its tags, as Grafana sees it."""

from __future__ import annotations

import requests


class InfluxQLError(RuntimeError):
    """The server answered with an error (HTTP status or an error in the results), or not at all."""


def series(url: str, query: str, db: str | None = None, auth: tuple[str, str] | None = None,
           timeout: float = 30.0) -> list[dict]:  # fmt: skip
    """[{"name", "tags", "columns", "values"}] of every series `query` returns (times in epoch ns;
    SHOW statements give series without a name, or without values when empty)."""
    params = {"epoch": "ns", **({"db": db} if db else {})}
    try:
        r = requests.post(f"{url.rstrip('/')}/query", params=params, data={"q": query}, auth=auth, timeout=timeout)
    except requests.RequestException as exc:
        raise InfluxQLError(f"InfluxDB at {url} did not answer: {exc}") from exc
    body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
    err = body.get("error") or next((x["error"] for x in body.get("results", []) if "error" in x), None)
    if r.status_code != 200 or err:
        raise InfluxQLError(f"HTTP {r.status_code}: {err or r.text[:200]}")
    return [
        {"name": s.get("name", ""), "tags": s.get("tags", {}), "columns": s["columns"], "values": s.get("values", [])}
        for res in body.get("results", [])
        for s in res.get("series", [])
    ]
