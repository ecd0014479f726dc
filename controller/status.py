"""`status`: each session and flow of the intent, its state on the agents, its latest delay
(`stamp_delay`) and loss (`altmark_loss`) from InfluxDB (InfluxQL over the v1 HTTP API).
"""

from __future__ import annotations

import time
from typing import Any

import requests

from controller.agents import AgentError
from controller.core import Controller

STATE_NAMES = {0: "unknown", 1: "created", 2: "running", 3: "stopped"}


def influx_query(url: str, db: str, query: str, timeout: float = 5.0) -> list[dict]:
    """InfluxQL via /query (epoch=ns); rows of every series as dicts, GROUP BY tags merged in."""
    resp = requests.post(
        f"{url.rstrip('/')}/query", params={"db": db, "epoch": "ns"}, data={"q": query}, timeout=timeout
    )
    resp.raise_for_status()
    rows = []
    for result in resp.json().get("results", []):
        if "error" in result:
            raise RuntimeError(f"InfluxDB: {result['error']} (query: {query})")
        for series in result.get("series", []):
            for values in series.get("values", []):
                row = dict(zip(series["columns"], values))
                row.update(series.get("tags", {}))
                rows.append(row)
    return rows


def _quote(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("'", "\\'")


def latest_delay(url: str, db: str, node: str, ssid: int) -> dict[str, dict]:
    q = (
        f"SELECT * FROM \"stamp_delay\" WHERE \"node\" = '{_quote(node)}' AND \"ssid\" = '{ssid}' "
        f"GROUP BY \"direction\" ORDER BY time DESC LIMIT 1"
    )
    return {row["direction"]: row for row in influx_query(url, db, q)}


def latest_loss(url: str, db: str, flow_id: int) -> dict | None:
    q = f"SELECT * FROM \"altmark_loss\" WHERE \"flow\" = '{flow_id}' ORDER BY time DESC LIMIT 1"
    rows = influx_query(url, db, q)
    return rows[0] if rows else None


def collect(ctl: Controller, influx_url: str, influx_db: str) -> dict:
    """Everything status shows, as one JSON-able dict (also what --json prints)."""
    out: dict[str, Any] = {"nodes": {}, "sessions": [], "flows": [], "influx_error": None}
    sessions_by_node: dict[str, dict] = {}
    flows_by_node: dict[str, dict] = {}
    for name, node in sorted(ctl.intent.nodes.items()):
        try:
            client = ctl.client(name)
            from segscope_proto.segscope.agent.v1 import flowmon_pb2, stamp_pb2

            sess = client.call(client.stamp, "ListStampSessions", stamp_pb2.ListStampSessionsRequest()).sessions
            mons = client.call(client.flowmon, "ListFlowMonitors", flowmon_pb2.ListFlowMonitorsRequest()).monitors
            sessions_by_node[name] = {(s.session.role, s.session.ssid): s for s in sess}
            flows_by_node[name] = {(m.monitor.side, m.monitor.flow_id): m for m in mons}
            out["nodes"][name] = {"agent": node.agent, "reachable": True}
        except AgentError as exc:
            out["nodes"][name] = {"agent": node.agent, "reachable": False, "error": str(exc)}
    now_ns = time.time_ns()
    for s in ctl.intent.stamp_sessions:
        snd = sessions_by_node.get(s.sender.node, {}).get((1, s.ssid))
        refl = sessions_by_node.get(s.reflector.node, {}).get((2, s.ssid))
        row: dict[str, Any] = {
            "ssid": s.ssid,
            "sender": s.sender.node,
            "reflector": s.reflector.node,
            "segs": list(s.segs),
            "return_segs": list(s.return_segs),
            "rate_pps": s.rate_pps,
            "sender_state": STATE_NAMES.get(snd.state, "?") if snd else "absent",
            "reflector_state": STATE_NAMES.get(refl.state, "?") if refl else "absent",
            "packets_sent": snd.packets_sent if snd else None,
            "results_collected": snd.results_collected if snd else None,
            "delay": {},
        }
        try:
            for direction, p in latest_delay(influx_url, influx_db, s.sender.node, s.ssid).items():
                row["delay"][direction] = {
                    "mean_us": p.get("mean_us"),
                    "min_us": p.get("min_us"),
                    "max_us": p.get("max_us"),
                    "p99_us": p.get("p99_us"),
                    "count": p.get("count"),
                    "age_s": round((now_ns - p["time"]) / 1e9, 1),
                }
        except (requests.RequestException, RuntimeError) as exc:
            out["influx_error"] = str(exc)
        out["sessions"].append(row)
    for f in ctl.intent.flows:
        tx = flows_by_node.get(f.ingress.node, {}).get((1, f.flow_id))
        rx = flows_by_node.get(f.egress.node, {}).get((2, f.flow_id))
        row = {
            "flow_id": f.flow_id,
            "method": f.method,
            "ingress": f.ingress.node,
            "egress": f.egress.node,
            "segs": list(f.segs),
            "tx": "installed" if tx else "absent",
            "rx": "installed" if rx else "absent",
            "loss": None,
        }
        try:
            p = latest_loss(influx_url, influx_db, f.flow_id)
            if p:
                row["loss"] = {
                    k: p.get(k) for k in ("tx_packets", "rx_packets", "lost", "loss_ratio", "complete", "reason")
                }
                row["loss"]["age_s"] = round((now_ns - p["time"]) / 1e9, 1)
        except (requests.RequestException, RuntimeError) as exc:
            out["influx_error"] = str(exc)
        out["flows"].append(row)
    return out


def _fmt(value, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}{unit}"
    return f"{value}{unit}"


def render(status: dict) -> str:
    lines = []
    for name, n in status["nodes"].items():
        lines.append(
            f"node {name:<6} agent {n['agent']:<22} " + ("ok" if n["reachable"] else f"UNREACHABLE ({n['error']})")
        )
    lines.append("")
    hdr = (
        f"{'ssid':>5} {'sender':<7}{'reflector':<10}{'state (s/r)':<18}{'sent':>8} "
        f"{'fwd mean':>10} {'rev mean':>10} {'rtt mean':>10} {'rtt p99':>10} {'age':>6}"
    )
    lines += ["STAMP sessions (latest second in InfluxDB, stamp_delay)", hdr, "-" * len(hdr)]
    for s in status["sessions"]:
        d = s["delay"]
        f, r, t = d.get("forward", {}), d.get("reverse", {}), d.get("round_trip", {})
        age = t.get("age_s", f.get("age_s"))
        lines.append(
            f"{s['ssid']:>5} {s['sender']:<7}{s['reflector']:<10}"
            f"{s['sender_state'] + '/' + s['reflector_state']:<18}{_fmt(s['packets_sent']):>8} "
            f"{_fmt(f.get('mean_us'), ' us'):>10} {_fmt(r.get('mean_us'), ' us'):>10} "
            f"{_fmt(t.get('mean_us'), ' us'):>10} {_fmt(t.get('p99_us'), ' us'):>10} "
            f"{_fmt(age, ' s'):>6}"
        )
    if not status["sessions"]:
        lines.append("(no STAMP sessions in the intent)")
    lines.append("")
    hdr = (
        f"{'flow':>6} {'method':<8}{'ingress':<8}{'egress':<8}{'tx/rx':<20}{'tx pkts':>9} {'rx pkts':>9} "
        f"{'lost':>6} {'loss %':>8} {'block':<12}{'age':>6}"
    )
    lines += ["Monitored flows (latest block in InfluxDB, altmark_loss)", hdr, "-" * len(hdr)]
    for f in status["flows"]:
        loss = f["loss"] or {}
        ratio = loss.get("loss_ratio")
        lines.append(
            f"{f['flow_id']:>6} {f['method']:<8}{f['ingress']:<8}{f['egress']:<8}"
            f"{f['tx'] + '/' + f['rx']:<20}{_fmt(loss.get('tx_packets')):>9} {_fmt(loss.get('rx_packets')):>9} "
            f"{_fmt(loss.get('lost')):>6} {_fmt(ratio * 100 if ratio is not None else None, '', 3):>8} "
            f"{(loss.get('reason') or '-'):<12}{_fmt(loss.get('age_s'), ' s'):>6}"
        )
    if not status["flows"]:
        lines.append("(no monitored flows in the intent)")
    if status.get("influx_error"):
        lines += ["", f"InfluxDB not readable: {status['influx_error']}"]
    return "\n".join(lines)
