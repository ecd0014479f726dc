"""A small builder for Grafana dashboard JSON (schemaVersion 39) with InfluxQL targets: what
dashboards/generate.py writes the dashboards with. Plain dicts, no Grafana SDK: every field the
files carry is visible here, and the tests read the same structures back.

Every panel and variable uses the datasource variable `${datasource}` (type influxdb), so a file
imports into any Grafana and binds to whichever InfluxDB the user picks; provisioned, it defaults
to the datasource `segscope-influxdb` (dashboards/provisioning/datasources/segscope.yaml).
"""

from __future__ import annotations

from dataclasses import dataclass, field

DATASOURCE = {"type": "influxdb", "uid": "${datasource}"}
DEFAULT_DATASOURCE_UID = "segscope-influxdb"
SCHEMA_VERSION = 39


def target(ref: str, query: str, alias: str = "", fmt: str = "time_series") -> dict:
    t = {"refId": ref, "datasource": DATASOURCE, "rawQuery": True, "resultFormat": fmt, "query": query}
    if alias:
        t["alias"] = alias
    return t


def thresholds(*steps: tuple[float | None, str]) -> dict:
    """thresholds((None, "green"), (5000, "orange"), (10000, "red"))"""
    return {"mode": "absolute", "steps": [{"value": v, "color": c} for v, c in steps]}


@dataclass
class Panel:
    title: str
    kind: str  # timeseries | stat | table | bargauge | text
    targets: list[dict]
    unit: str = "short"
    description: str = ""
    width: int = 12
    height: int = 8
    thresholds: dict | None = None
    links: list[dict] = field(default_factory=list)
    options: dict = field(default_factory=dict)
    draw: str = ""  # timeseries: "bars" or "points"; default lines
    decimals: int | None = None

    def to_json(self, pid: int, x: int, y: int) -> dict:
        defaults: dict = {"unit": self.unit}
        if self.thresholds:
            defaults["thresholds"] = self.thresholds
            defaults["color"] = {"mode": "thresholds"}
        if self.decimals is not None:
            defaults["decimals"] = self.decimals
        if self.links:
            defaults["links"] = self.links
        if self.draw:
            defaults["custom"] = {"drawStyle": self.draw, "fillOpacity": 60 if self.draw == "bars" else 0}
        p = {
            "id": pid,
            "type": self.kind,
            "title": self.title,
            "datasource": DATASOURCE,
            "gridPos": {"x": x, "y": y, "w": self.width, "h": self.height},
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": self.options or default_options(self.kind),
            "targets": self.targets,
        }
        if self.description:
            p["description"] = self.description
        if self.thresholds and self.kind == "timeseries":
            p["fieldConfig"]["defaults"].setdefault("custom", {})["thresholdsStyle"] = {"mode": "line"}
        return p


def default_options(kind: str) -> dict:
    if kind == "timeseries":
        return {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["mean", "max", "lastNotNull"]}}
    if kind in ("stat", "bargauge"):
        return {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}, "orientation": "horizontal"}
    if kind == "table":
        return {"showHeader": True, "footer": {"show": False}}
    return {}


def row(title: str) -> dict:
    return {"type": "row", "title": title, "collapsed": False, "panels": []}


def query_variable(name: str, label: str, query: str, multi: bool = True) -> dict:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": query,
        "refresh": 2,  # on time range change: new sessions and flows appear by themselves
        "includeAll": multi,
        "multi": multi,
        "current": {"text": "All", "value": "$__all"} if multi else {},
        "sort": 3,
    }


def custom_variable(name: str, label: str, values: list[str]) -> dict:
    return {
        "name": name,
        "label": label,
        "type": "custom",
        "query": ",".join(values),
        "includeAll": True,
        "multi": True,
        "current": {"text": "All", "value": "$__all"},
        "options": [{"text": v, "value": v, "selected": False} for v in values],
    }


def datasource_variable() -> dict:
    return {
        "name": "datasource",
        "label": "InfluxDB",
        "type": "datasource",
        "query": "influxdb",
        "current": {"text": DEFAULT_DATASOURCE_UID, "value": DEFAULT_DATASOURCE_UID},
        "hide": 0,
    }


def dashboard(uid: str, title: str, description: str, variables: list[dict], layout: list) -> dict:
    """layout: Panel objects and row(...) dicts, laid out left to right, 24 columns wide."""
    panels, pid, x, y, line_h = [], 1, 0, 0, 0
    for item in layout:
        if isinstance(item, dict):  # a row starts a new line
            y += line_h
            x, line_h = 0, 0
            panels.append({**item, "id": pid, "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}})
            pid, y = pid + 1, y + 1
            continue
        if x + item.width > 24:
            y += line_h
            x, line_h = 0, 0
        panels.append(item.to_json(pid, x, y))
        pid, x, line_h = pid + 1, x + item.width, max(line_h, item.height)
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "tags": ["segscope", "srv6"],
        "links": [
            {
                "title": "segscope",
                "type": "dashboards",
                "tags": ["segscope"],
                "asDropdown": False,
                "includeVars": True,
                "keepTime": True,
            },
        ],  # fmt: skip
        "templating": {"list": [datasource_variable(), *variables]},
        "panels": panels,
    }


def panel_queries(dash: dict) -> list[tuple[str, str, str]]:
    """(panel title, refId, query) of every InfluxQL target of a dashboard."""
    return [(p["title"], t["refId"], t["query"]) for p in dash["panels"] for t in p.get("targets", [])]
