"""segscope-report: one self-contained HTML page with the dashboards' figures, for people without
Grafana and for tickets.

    segscope-report --since 1h [--out segscope-report.html] [--influx-url URL] [--db segscope]

What it shows, from InfluxDB (the same queries as the Grafana panels, dashboards/generate.py,
with Grafana's macros filled in): the alerts that fire now (dashboards/alerts.py, evaluated as
Grafana would), per STAMP session the delay per direction (mean, percentiles, jitter, samples,
last result) and a chart of it, per path measured in-line (IOAM on sampled real packets) each
hop's delay (a table and bars: how the path's delay splits by link; hops not measured say so)
with the end-to-end delay and the sequence loss, per flow the exact loss (blocks, lost, ratio,
D-mark delay) and a chart of the loss per block, and the pipeline's counters. Charts are inline SVG: the file needs
nothing else to open, offline. Credentials: SEGSCOPE_INFLUX_USER / SEGSCOPE_INFLUX_PASSWORD.
"""

from __future__ import annotations

import argparse
import datetime as dt
import html
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dashboards import alerts, generate
from dashboards.generate import panel_queries
from segscope_schemas import influxql
from segscope_schemas.names import INFLUXDB_DATABASE
from segscope_schemas.version import VERSION_LINE

DIRECTIONS = ("forward", "reverse", "round_trip")
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
# the hops of a path: a palette of their own, so a hop's bar is never mistaken for a chart's line
HOP_COLOURS = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#edc948", "#76b7b2", "#ff9da7", "#9c755f",
               "#e15759", "#bab0ac", "#86bcb6", "#d37295")  # fmt: skip
NOT_MEASURED = "not measured"


class ReportError(RuntimeError):
    pass


@dataclass
class Influx:
    url: str
    db: str
    auth: tuple[str, str] | None = None

    def series(self, query: str) -> list[dict]:
        """[{"name", "tags", "columns", "values"}] of every series the query returns."""
        try:
            return influxql.series(self.url, query, self.db, self.auth)
        except influxql.InfluxQLError as exc:
            raise ReportError(f"{query!r}: {exc}") from exc


def panel_query(dash: dict, title: str, ref: str = "A") -> str:
    for t, r, q in panel_queries(dash):
        if t == title and r == ref:
            return q
    raise KeyError(f"dashboard {dash['uid']} has no panel {title!r} target {ref}")


def grafana(query: str, start_ns: int, end_ns: int, interval_ms: int) -> str:
    """A panel query as Grafana sends it with every variable at All."""
    q = alerts.expand(query, start_ns, end_ns, interval_ms)
    for var in ("node", "ssid", "direction", "flow", "path"):
        q = q.replace(f"/^${var}$/", "/.*/")
    return q


# --------------------------------------------------------------------------- SVG charts
def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** int(f"{raw:e}".split("e")[1])
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = (lo // step) * step
    return [first + i * step for i in range(n + 2) if first + i * step <= hi + step * 0.001]


def _fmt(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def svg_chart(series: list[tuple[str, list[tuple[int, float]]]], unit: str, bars: bool = False,
              width: int = 960, height: int = 260) -> str:  # fmt: skip
    """A line (or bar) chart of time series [(label, [(t_ns, value)])] as inline SVG."""
    pts = [(t, v) for _, s in series for t, v in s if v is not None]
    if not pts:
        return '<p class="empty">no data in this window</p>'
    left, right, top, bottom = 70, 40, 10, 40
    w, h = width - left - right, height - top - bottom
    t0, t1 = min(t for t, _ in pts), max(t for t, _ in pts)
    t1 = t1 if t1 > t0 else t0 + 10**9
    if bars:  # room for the first and the last bar
        step = (t1 - t0) / max(1, max(len(s) for _, s in series) - 1)
        t0, t1 = t0 - step / 2, t1 + step / 2
    vmin = min(0.0, min(v for _, v in pts))
    vmax = max(v for _, v in pts)
    yt = _ticks(vmin, vmax if vmax > vmin else vmin + 1)
    vmin, vmax = min(vmin, yt[0]), max(vmax, yt[-1])

    def x(t):
        return left + (t - t0) / (t1 - t0) * w

    def y(v):
        return top + h - (v - vmin) / (vmax - vmin) * h

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 22 * len(series)}" '
           f'role="img" font-family="sans-serif" font-size="11">']  # fmt: skip
    out.append(f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="#fafafa" stroke="#ccc"/>')
    for v in yt:
        out.append(f'<line x1="{left}" x2="{left + w}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#e3e3e3"/>')
        out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{_fmt(v)}</text>')
    out.append(f'<text x="12" y="{top + h / 2:.0f}" transform="rotate(-90 12 {top + h / 2:.0f})" '
               f'text-anchor="middle">{html.escape(unit)}</text>')  # fmt: skip
    for i in range(6):
        t = t0 + (t1 - t0) * i / 5
        label = dt.datetime.fromtimestamp(t / 1e9, dt.timezone.utc).strftime("%H:%M:%S")
        out.append(f'<text x="{x(t):.1f}" y="{top + h + 16}" text-anchor="middle">{label}</text>')
    out.append(f'<text x="{left + w}" y="{top + h + 32}" text-anchor="end">time (UTC)</text>')
    n_bars = max(len(s) for _, s in series) or 1
    bar_w = max(1.0, w / n_bars / max(1, len(series)) * 0.8)
    shift = bar_w * len(series) / 2  # the bars of one time sit centred on it
    for i, (label, s) in enumerate(series):
        colour = COLOURS[i % len(COLOURS)]
        s = [(t, v) for t, v in s if v is not None]
        if bars:
            for t, v in s:
                out.append(f'<rect x="{x(t) - shift + i * bar_w:.1f}" y="{min(y(v), y(0)):.1f}" width="{bar_w:.1f}" '
                           f'height="{abs(y(0) - y(v)):.1f}" fill="{colour}"/>')  # fmt: skip
        elif len(s) == 1:
            out.append(f'<circle cx="{x(s[0][0]):.1f}" cy="{y(s[0][1]):.1f}" r="3" fill="{colour}"/>')
        else:
            path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in s)
            out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{path}"/>')
        ly = height + 14 + 22 * i
        out.append(f'<rect x="{left}" y="{ly - 9}" width="12" height="10" fill="{colour}"/>')
        out.append(f'<text x="{left + 18}" y="{ly}">{html.escape(label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def svg_hop_bars(hops: list[dict], end_to_end_us: float | None, width: int = 960) -> str:
    """How one path's delay splits by hop: a stacked bar of the measured hops' means (the rest of
    the end-to-end delay, if any, is what the hops not measured took), then one bar per hop on the
    same scale, labelled with its link; a hop not measured is an empty dashed box."""
    measured = [h for h in hops if h["mean"] is not None]
    total = sum(h["mean"] for h in measured)
    scale_us = max(total, end_to_end_us or 0.0)
    if not hops or scale_us <= 0:
        return '<p class="empty">no hop measured in this window</p>'
    left, bar_h, gap, label_w = 250, 18, 8, 110
    span = width - left - label_w
    rows = len(hops) + 1
    height = 14 + rows * (bar_h + gap) + 16

    def w(us: float) -> int:
        return max(1, round(us / scale_us * span))

    e = html.escape
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
           'font-family="sans-serif" font-size="12" shape-rendering="crispEdges">']  # fmt: skip
    y = 10
    out.append(f'<text x="{left - 8}" y="{y + 13}" text-anchor="end" font-weight="bold">path, end to end</text>')
    x = left
    for h in measured:
        colour = HOP_COLOURS[h["first"] % len(HOP_COLOURS)]
        out.append(f'<rect x="{x}" y="{y}" width="{w(h["mean"])}" height="{bar_h}" fill="{colour}"/>')
        x += w(h["mean"])
    if end_to_end_us and end_to_end_us > total:  # the part no measured hop accounts for
        rest = w(end_to_end_us) - (x - left)
        if rest > 0:
            out.append(f'<rect x="{x}" y="{y}" width="{rest}" height="{bar_h}" fill="#eeeeee" stroke="#999999" '
                       'stroke-dasharray="4 3"/>')  # fmt: skip
            x += rest
    shown = end_to_end_us if end_to_end_us is not None else total
    out.append(f'<text x="{x + 6}" y="{y + 13}">{_fmt(shown)} µs</text>')
    for h in hops:
        y += bar_h + gap
        label = f"hop {h['hop']} {h['link']}"
        out.append(f'<text x="{left - 8}" y="{y + 13}" text-anchor="end">{e(label)}</text>')
        if h["mean"] is None:
            out.append(f'<rect x="{left}" y="{y}" width="{span // 4}" height="{bar_h}" fill="none" stroke="#999999" '
                       f'stroke-dasharray="4 3"/><text x="{left + 6}" y="{y + 13}" fill="#666666">'
                       f"{NOT_MEASURED}</text>")  # fmt: skip
            continue
        colour = HOP_COLOURS[h["first"] % len(HOP_COLOURS)]
        out.append(f'<rect x="{left}" y="{y}" width="{w(h["mean"])}" height="{bar_h}" fill="{colour}"/>')
        out.append(f'<text x="{left + w(h["mean"]) + 6}" y="{y + 13}">{_fmt(h["mean"])} µs</text>')
    out.append(f'<text x="{left}" y="{height - 4}" fill="#666666">mean delay of the sampled packets, µs; '
               "dashed: not measured hop by hop</text></svg>")  # fmt: skip
    return "\n".join(out)


def as_points(s: dict, column: int = 1) -> list[tuple[int, float]]:
    return [(row[0], row[column]) for row in s["values"] if row[column] is not None]


# --------------------------------------------------------------------------- the figures
def collect(influx: Influx, since_s: int, now_ns: int | None = None) -> dict:
    now_ns = now_ns or time.time_ns()
    start = now_ns - since_s * 10**9
    interval_ms = max(1000, since_s * 1000 // 400)  # about 400 points per chart, as Grafana would
    path, overview, pipe = (generate.as_json(make()) for make in (generate.path, generate.overview, generate.pipeline))
    fig: dict = {"since_s": since_s, "start_ns": start, "end_ns": now_ns, "interval_ms": interval_ms}

    # delay per session and direction: the path dashboard's panel, and a summary over the window
    delay_series = influx.series(grafana(panel_query(path, "Delay, mean per second"), start, now_ns, interval_ms))
    summary = influx.series(
        'SELECT mean("mean_us") AS mean, min("min_us") AS min, percentile("p50_us", 50) AS p50, '
        'max("p99_us") AS p99, max("max_us") AS max, mean("ipdv_mean_us") AS jitter, sum("count") AS samples, '
        'max("error_estimate_max_us") AS error_us, sum("unsynchronized") AS unsync FROM "stamp_delay" '
        f'WHERE time >= {start} AND time <= {now_ns} GROUP BY "node", "ssid", "direction"'
    )
    window = f"time >= {start} AND time <= {now_ns}"
    last = {
        (s["tags"]["node"], s["tags"]["ssid"]): s["values"][-1][0]
        for s in influx.series(f'SELECT last("count") FROM "stamp_delay" WHERE {window} GROUP BY "node", "ssid"')
    }
    sessions: dict[str, dict] = {}  # "node/ssid"
    for s in summary:
        node, ssid = s["tags"]["node"], s["tags"]["ssid"]
        row = dict(zip(s["columns"], s["values"][0], strict=True))
        st = sessions.setdefault(f"{node}/{ssid}", {"node": node, "ssid": ssid, "directions": {}, "chart": [],
                                                      "last_ns": last.get((node, ssid))})  # fmt: skip
        st["directions"][s["tags"]["direction"]] = row
    for s in delay_series:
        key = f"{s['tags']['node']}/{s['tags']['ssid']}"
        if key in sessions:
            sessions[key]["chart"].append((s["tags"]["direction"], as_points(s)))
    fig["sessions"] = dict(sorted(sessions.items()))

    # in-line measurement per path: each hop (the path dashboard's table "Hops of the path
    # (in-line)"), the end-to-end delay and the sequence loss of the sampled packets
    paths: dict[str, dict] = {}

    def inline_path(name: str) -> dict:
        return paths.setdefault(name, {"hops": [], "end_to_end": {}, "loss": {}})

    for s in influx.series(grafana(panel_query(path, "Hops of the path (in-line)"), start, now_ns, interval_ms)):
        row = dict(zip(s["columns"], s["values"][0], strict=True))
        tags = s["tags"]
        inline_path(tags["path"])["hops"].append(
            # hop=<i>, or <first>-<last> for a span over transit nodes that add no IOAM entry
            {"hop": tags["hop"], "first": int(tags["hop"].split("-")[0]), "link": tags["link"],
             "from_node": tags["from_node"], "to_node": tags["to_node"],
             "mean": row["mean µs"], "p99": row["p99 µs (worst second)"], "max": row["max µs"],
             "packets": row["packets"], "measured": row["measured"] or 0.0}
        )  # fmt: skip
    for s in influx.series(
        'SELECT sum("sum_us") / sum("count") AS "mean", max("p99_us") AS "p99", sum("count") AS "packets" '
        f'FROM "inline_delay" WHERE {window} GROUP BY "path"'
    ):
        inline_path(s["tags"]["path"])["end_to_end"] = dict(zip(s["columns"], s["values"][0], strict=True))
    for s in influx.series(
        'SELECT sum("received") AS "received", sum("lost") AS "lost", sum("reordered") AS "reordered", '
        'sum("duplicated") AS "duplicated", max("loss_burst_max") AS "longest_burst" FROM "inline_loss" '
        f'WHERE {window} GROUP BY "path"'
    ):
        inline_path(s["tags"]["path"])["loss"] = dict(zip(s["columns"], s["values"][0], strict=True))
    for p in paths.values():
        p["hops"].sort(key=lambda h: (h["first"], h["hop"]))
    fig["inline_paths"] = dict(sorted(paths.items()))

    # loss per flow: the panel "Lost packets per block", and the totals of the window
    flows: dict[str, dict] = {}
    for s in influx.series(
        'SELECT sum("tx_packets") AS tx, sum("rx_packets") AS rx, sum("lost") AS lost, count("lost") AS blocks, '
        'mean("dmark_delay_mean_us") AS dmark_us FROM "altmark_loss" WHERE "complete" = true AND '
        f'time >= {start} AND time <= {now_ns} GROUP BY "flow", "tx_node", "rx_node"'
    ):
        row = dict(zip(s["columns"], s["values"][0], strict=True))
        f = flows.setdefault(s["tags"]["flow"], {"incomplete": {}, "chart": [], **s["tags"]})
        f.update(row)
        f["ratio"] = (row["lost"] / row["tx"]) if row.get("tx") else None
    for s in influx.series(
        f'SELECT "reason" FROM "altmark_loss" WHERE "complete" = false AND {window} GROUP BY "flow"'
    ):  # reason is a field: counted here, per flow
        f = flows.setdefault(s["tags"]["flow"], {"incomplete": {}, "chart": [], "flow": s["tags"]["flow"]})
        for _, reason in s["values"]:
            f["incomplete"][reason] = f["incomplete"].get(reason, 0) + 1
    for s in influx.series(grafana(panel_query(path, "Lost packets per block"), start, now_ns, interval_ms)):
        if s["tags"]["flow"] in flows:
            flows[s["tags"]["flow"]]["chart"].append((f"flow {s['tags']['flow']} lost", as_points(s)))
    fig["flows"] = dict(sorted(flows.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else kv[0]))

    # pipeline: what each stage counted in the window (counters: last - first)
    stages = []
    for measurement, tag in (("segscope_processor", "processor"), ("segscope_agent", "node")):
        for s in influx.series(
            f'SELECT spread(/^(records_in|points_out|records_streamed|records_dropped|malformed_batches|'
            f'late_records_dropped|processing_errors)$/) FROM "{measurement}" WHERE time >= {start} AND '
            f'time <= {now_ns} GROUP BY "{tag}"'
        ):
            row = {c.removeprefix("spread_"): v for c, v in zip(s["columns"][1:], s["values"][0][1:], strict=True)}
            stages.append((f"{measurement.removeprefix('segscope_')} {s['tags'][tag]}", row))
    fig["stages"] = stages
    lag = influx.series(grafana(panel_query(pipe, "Processor input behind (consumer lag)"), start, now_ns, interval_ms))
    fig["max_lag"] = max((v for s in lag for _, v in as_points(s)), default=None)
    fig["silent_nodes"] = [
        (s["tags"]["node"], s["values"][-1][0])
        for s in influx.series(grafana(panel_query(overview, "Nodes: last report of the agent"), start, now_ns, 1000))
    ]

    # alerts: each rule evaluated over its `for` at its group interval, as Grafana would
    firing = []
    for rule in alerts.rules():
        steps = max(1, rule.for_s // 30 + 1)
        times = [now_ns - (steps - 1 - i) * 30 * 10**9 for i in range(steps)]
        states = alerts.evaluate(rule, influx.series, times)
        last_eval = {tuple(sorted(i.labels.items())): i for i in alerts.evaluate_once(rule, influx.series, now_ns)}
        for key, st in sorted(states.items()):
            if st in ("Alerting", "Pending"):
                inst = last_eval.get(key)
                firing.append(
                    {"rule": rule.title, "severity": rule.severity, "state": st,
                     "summary": alerts.render_summary(rule, dict(key), inst.value if inst else None)}
                )  # fmt: skip
    fig["alerts"] = firing
    return fig


# --------------------------------------------------------------------------- HTML
CSS = """
body{font-family:sans-serif;margin:24px;color:#222;max-width:1000px}
h1{font-size:22px;margin-bottom:4px} h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin-bottom:4px} .meta{color:#666;font-size:13px}
table{border-collapse:collapse;font-size:13px;margin:6px 0 10px} th,td{border:1px solid #ddd;padding:3px 8px;
text-align:right} th{background:#f2f2f2} td.l,th.l{text-align:left}
.alert-critical{background:#fde2e1} .alert-warning{background:#fff4d6} .ok{color:#2a7a2a} .empty{color:#888}
td.not-measured{color:#666;font-style:italic}
"""


def _num(v, digits: int = 1) -> str:
    return "–" if v is None else (f"{v:,.{digits}f}" if isinstance(v, float) else f"{v:,}")


def _time(ns: int | None) -> str:
    if ns is None:
        return "–"
    return dt.datetime.fromtimestamp(ns / 1e9, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def render_html(fig: dict, influx: Influx) -> str:
    e = html.escape
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>segscope report</title><style>{CSS}</style>"
           "</head><body>", "<h1>segscope report</h1>",
           f"<p class='meta'>{_time(fig['start_ns'])} to {_time(fig['end_ns'])} ({fig['since_s'] // 60} min) · "
           f"InfluxDB {e(influx.url)}, database {e(influx.db)} · {e(VERSION_LINE)}</p>"]  # fmt: skip
    out.append("<h2>Alerts firing now</h2>")
    if fig["alerts"]:
        out.append("<table><tr><th class='l'>severity</th><th class='l'>state</th><th class='l'>alert</th>"
                   "<th class='l'>what</th></tr>")  # fmt: skip
        for a in fig["alerts"]:
            out.append(f"<tr class='alert-{e(a['severity'])}'><td class='l'>{e(a['severity'])}</td>"
                       f"<td class='l'>{e(a['state'])}</td><td class='l'>{e(a['rule'])}</td>"
                       f"<td class='l'>{e(a['summary'])}</td></tr>")  # fmt: skip
        out.append("</table>")
    else:
        out.append("<p class='ok'>none</p>")

    out.append("<h2>Delay per path (STAMP)</h2>")
    if not fig["sessions"]:
        out.append("<p class='empty'>no STAMP results in this window</p>")
    for s in fig["sessions"].values():
        out.append(f"<h3>session {e(s['ssid'])} from {e(s['node'])} · last result {_time(s['last_ns'])}</h3>")
        out.append("<table><tr><th class='l'>direction</th><th>mean µs</th><th>min µs</th><th>p50 µs</th>"
                   "<th>p99 µs</th><th>max µs</th><th>jitter µs</th><th>samples</th><th>clock error µs</th>"
                   "<th>unsync</th></tr>")  # fmt: skip
        for d in DIRECTIONS:
            r = s["directions"].get(d)
            if r:
                out.append(f"<tr><td class='l'>{d}</td><td>{_num(r['mean'])}</td><td>{_num(r['min'])}</td>"
                           f"<td>{_num(r['p50'])}</td><td>{_num(r['p99'])}</td><td>{_num(r['max'])}</td>"
                           f"<td>{_num(r['jitter'])}</td><td>{_num(r['samples'])}</td>"
                           f"<td>{_num(r['error_us'], 3)}</td><td>{_num(r['unsync'])}</td></tr>")  # fmt: skip
        out.append("</table>")
        chart = sorted(s["chart"], key=lambda c: DIRECTIONS.index(c[0]) if c[0] in DIRECTIONS else 9)
        out.append(svg_chart(chart, "delay, µs (mean per interval)"))

    out.append("<h2>Delay per hop (in-line measurement of real traffic)</h2>")
    if not fig["inline_paths"]:
        out.append("<p class='empty'>no in-line results in this window</p>")
    for name, p in fig["inline_paths"].items():
        e2e, loss = p["end_to_end"], p["loss"]
        head = f"path {e(name)}"
        if e2e.get("mean") is not None:
            head += f" · end to end {_num(e2e['mean'])} µs over {_num(e2e['packets'])} sampled packets"
        if loss.get("received") is not None:
            sent = (loss["received"] or 0) + (loss["lost"] or 0)
            head += f" · lost {_num(loss['lost'])} of {_num(sent)}, reordered {_num(loss['reordered'])}"
        out.append(f"<h3>{head}</h3>")
        out.append("<table><tr><th>hop</th><th class='l'>link</th><th class='l'>from → to</th><th>mean µs</th>"
                   "<th>p99 µs (worst second)</th><th>max µs</th><th>packets</th>"
                   "<th>measured</th></tr>")  # fmt: skip
        for h in p["hops"]:
            ends = f"{h['from_node']} → {h['to_node']}"
            if h["mean"] is None:
                cells = f"<td colspan='4' class='l not-measured'>{NOT_MEASURED}</td>"
            else:
                cells = (f"<td>{_num(h['mean'])}</td><td>{_num(h['p99'])}</td><td>{_num(h['max'])}</td>"
                         f"<td>{_num(h['packets'])}</td>")  # fmt: skip
            out.append(f"<tr><td>{h['hop']}</td><td class='l'>{e(h['link'])}</td><td class='l'>{e(ends)}</td>{cells}"
                       f"<td>{h['measured']:.0%}</td></tr>")  # fmt: skip
        out.append("</table>")
        out.append(svg_hop_bars(p["hops"], e2e.get("mean")))

    out.append("<h2>Loss per flow (alternate marking, exact)</h2>")
    if not fig["flows"]:
        out.append("<p class='empty'>no alternate-marking results in this window</p>")
    for flow, f in fig["flows"].items():
        edges = f"{f.get('tx_node', '?')} → {f.get('rx_node', '?')}"
        out.append(f"<h3>flow {e(flow)} ({e(edges)})</h3>")
        ratio = "–" if f.get("ratio") is None else f"{f['ratio']:.3%}"
        incomplete = ", ".join(f"{k}: {v}" for k, v in sorted(f["incomplete"].items())) or "none"
        out.append("<table><tr><th>complete blocks</th><th>packets sent</th><th>received</th><th>lost</th>"
                   "<th>loss ratio</th><th>D-mark delay µs</th><th class='l'>incomplete blocks</th></tr>"
                   f"<tr><td>{_num(f.get('blocks'))}</td><td>{_num(f.get('tx'))}</td><td>{_num(f.get('rx'))}</td>"
                   f"<td>{_num(f.get('lost'))}</td><td>{ratio}</td><td>{_num(f.get('dmark_us'))}</td>"
                   f"<td class='l'>{e(incomplete)}</td></tr></table>")  # fmt: skip
        out.append(svg_chart(f["chart"], "packets lost per block", bars=True))

    out.append("<h2>Pipeline</h2>")
    out.append(f"<p>largest consumer lag in the window: {_num(fig['max_lag'])} messages</p>")
    if fig["stages"]:
        cols = sorted({k for _, row in fig["stages"] for k in row})
        out.append("<table><tr><th class='l'>stage</th>" + "".join(f"<th>{e(c)}</th>" for c in cols) + "</tr>")
        for name, row in fig["stages"]:
            out.append(f"<tr><td class='l'>{e(name)}</td>" + "".join(f"<td>{_num(row.get(c))}</td>" for c in cols)
                       + "</tr>")  # fmt: skip
        out.append("</table><p class='meta'>counted in the window (last − first of each counter)</p>")
    if fig["silent_nodes"]:
        out.append("<table><tr><th class='l'>node</th><th class='l'>last agent report</th></tr>"
                   + "".join(f"<tr><td class='l'>{e(n)}</td><td class='l'>{_time(t)}</td></tr>"
                             for n, t in fig["silent_nodes"]) + "</table>")  # fmt: skip
    out.append("<p class='meta'>Figures: schemas/metrics.md. Dashboards with the same queries: "
               "dashboards/*.json.</p></body></html>")  # fmt: skip
    return "\n".join(out)


def parse_since(text: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if not text or text[-1] not in units or not text[:-1].isdigit() or int(text[:-1]) <= 0:
        raise ValueError(f"--since {text!r}: expected a number and a unit, e.g. 30m, 1h, 2d")
    return int(text[:-1]) * units[text[-1]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="segscope-report", description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", action="version", version=VERSION_LINE)
    ap.add_argument("--since", default="1h", help="window up to now, e.g. 15m, 1h, 2d (default 1h)")
    ap.add_argument("--out", default="segscope-report.html", help="HTML file to write")
    ap.add_argument("--influx-url", default=os.environ.get("SEGSCOPE_INFLUX_URL", "http://127.0.0.1:18086"))
    ap.add_argument("--db", default=os.environ.get("SEGSCOPE_INFLUX_DB", INFLUXDB_DATABASE))
    ap.add_argument("--json", action="store_true", help="also write the figures as JSON next to the HTML")
    args = ap.parse_args(argv)
    try:
        since = parse_since(args.since)
    except ValueError as exc:
        ap.error(str(exc))
    user = os.environ.get("SEGSCOPE_INFLUX_USER")
    influx = Influx(args.influx_url, args.db, (user, os.environ.get("SEGSCOPE_INFLUX_PASSWORD", "")) if user else None)
    try:
        fig = collect(influx, since)
    except ReportError as exc:
        print(f"segscope-report: ERROR: {exc}", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.write_text(render_html(fig, influx))
    if args.json:
        out.with_suffix(".json").write_text(json.dumps(fig, indent=1, default=str))
    n_alerts = len(fig["alerts"])
    print(f"{out.resolve()}  ({len(fig['sessions'])} sessions, {len(fig['inline_paths'])} paths in-line, "
          f"{len(fig['flows'])} flows, {n_alerts} alerts)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
