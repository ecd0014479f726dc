"""`status`: each session, flow and in-line monitor of the intent, its state on the agents, its
latest delay (`stamp_delay`), loss (`altmark_loss`) and worst hop (`inline_hop_delay`) from
InfluxDB (InfluxQL over the v1 HTTP API); and what `controller run` repaired
(`segscope_controller_repair`) and which of its replicas leads (`segscope_controller`).
"""

from __future__ import annotations

import time
from typing import Any

import requests

from controller.agents import AgentError
from controller.core import Controller
from controller.steering import describe_candidates, render_candidates

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


def window_loss(url: str, db: str, flow_id: int, window_s: float) -> dict:
    """A flow's loss over the last window_s seconds: complete blocks summed (tx, rx, lost, ratio)
    and the incomplete ones counted (their numbers are not loss, only what one side saw)."""
    where = f"\"flow\" = '{flow_id}' AND time > now() - {int(window_s * 1000)}ms"
    q = (
        f'SELECT sum("tx_packets") AS tx, sum("rx_packets") AS rx, sum("lost") AS lost, count("lost") AS blocks '
        f'FROM "altmark_loss" WHERE {where} AND "complete" = true'
    )
    rows = influx_query(url, db, q)
    q_inc = f'SELECT count("tx_packets") AS n FROM "altmark_loss" WHERE {where} AND "complete" = false'
    inc = influx_query(url, db, q_inc)
    row = rows[0] if rows else {}
    tx, lost = row.get("tx") or 0, row.get("lost") or 0
    return {
        "window_s": window_s,
        "blocks": row.get("blocks") or 0,
        "tx_packets": tx,
        "rx_packets": row.get("rx") or 0,
        "lost": lost,
        "loss_ratio": (lost / tx) if tx else None,
        "incomplete_blocks": (inc[0].get("n") or 0) if inc else 0,
    }


def worst_hop(url: str, db: str, flow_id: int, window_s: float) -> dict | None:
    """The hop with the highest mean delay in the newest second of the flow's inline_hop_delay
    points within window_s (measured hops only), or None when there is none.

    The points of one second reach InfluxDB in more than one write (Telegraf's batches), so the
    newest second can lack a hop for a moment, and compared alone a lesser hop was reported as
    the worst (seen on a loaded machine). A newest second with fewer hops than the one before it
    is taken as still being written, and the one before it is compared (after a change to a path
    with fewer measured hops, that is one second late)."""
    q = (
        f"SELECT \"mean_us\", \"count\", \"measured\" FROM \"inline_hop_delay\" WHERE \"flow\" = '{flow_id}' "
        f"AND time > now() - {int(window_s * 1000)}ms GROUP BY * ORDER BY time DESC LIMIT 2"
    )  # each hop's two newest points: the newest second and the one before it are all it compares
    rows = [r for r in influx_query(url, db, q) if r.get("measured") is True and r.get("mean_us") is not None]
    if not rows:
        return None
    by_second: dict[int, list[dict]] = {}
    for r in rows:
        by_second.setdefault(r["time"] // 1_000_000_000, []).append(r)
    newest, *older = sorted(by_second, reverse=True)
    if older and len(by_second[newest]) < len(by_second[older[0]]):
        newest = older[0]
    top = max(by_second[newest], key=lambda r: r["mean_us"])
    return {
        k: top.get(k) for k in ("hop", "link", "from_node", "to_node", "from_if", "to_if", "mean_us", "count", "time")
    }


def recent_repairs(url: str, db: str, window_s: float, limit: int = 20) -> list[dict]:
    """The newest repairs of `controller run` (any replica) within window_s, newest first."""
    q = (
        f'SELECT * FROM "segscope_controller_repair" WHERE time > now() - {int(window_s * 1000)}ms '
        f"ORDER BY time DESC LIMIT {int(limit)}"
    )
    return influx_query(url, db, q)


def recent_steering(url: str, db: str, window_s: float, limit: int = 20) -> list[dict]:
    """The newest steering decisions of segscope-steer (any replica) within window_s, newest first."""
    q = (
        f'SELECT * FROM "steering_decision" WHERE time > now() - {int(window_s * 1000)}ms '
        f"ORDER BY time DESC LIMIT {int(limit)}"
    )
    return influx_query(url, db, q)


def steering_states(url: str, db: str, window_s: float = 60.0) -> list[dict]:
    """Each steered policy's newest steering_policy point within window_s (active path, alert)."""
    q = (
        f'SELECT * FROM "steering_policy" WHERE time > now() - {int(window_s * 1000)}ms '
        f'GROUP BY "node", "policy" ORDER BY time DESC LIMIT 1'
    )
    return influx_query(url, db, q)


def run_replicas(url: str, db: str, window_s: float = 60.0) -> list[dict]:
    """Each replica of `controller run` seen within window_s: its newest counter line."""
    q = (
        f'SELECT * FROM "segscope_controller" WHERE time > now() - {int(window_s * 1000)}ms '
        f'GROUP BY "replica" ORDER BY time DESC LIMIT 1'
    )
    return influx_query(url, db, q)


def _steering_status(url: str, db: str, window_s: float, now: int) -> dict:
    fields = ("from", "to", "from_delay_us", "to_delay_us", "from_loss_pct", "to_loss_pct", "rule", "error")
    return {
        "window_s": window_s,
        "policies": [
            {k: r.get(k) for k in ("node", "policy", "active", "state", "alert_text", "switch", "rollback")}
            | {"alert": bool(r.get("alert")), "age_s": round((now - r["time"]) / 1e9, 1)}
            for r in steering_states(url, db)
        ],
        "decisions": [
            {"age_s": round((now - r["time"]) / 1e9, 1), **{k: r.get(k) for k in ("node", "policy", "kind", "replica")}}
            | {k: r.get(k) for k in fields}
            | {"dry_run": bool(r.get("dry_run")), "ok": bool(r.get("ok"))}
            for r in recent_steering(url, db, window_s)
        ],
    }


def session_loss(snd) -> dict:
    """Packets received by the sender's agent, and, once the run has stopped, the exact loss
    (sent - received). While the sender runs its live `sent` is at most a second old and replies
    are in flight, so no loss is claimed then (None)."""
    if snd is None:
        return {"packets_received": None, "packets_lost": None, "loss_ratio": None}
    sent, got = snd.packets_sent, snd.results_collected
    if snd.state == 2:  # STAMP_SESSION_STATE_RUNNING
        return {"packets_received": got, "packets_lost": None, "loss_ratio": None}
    lost = max(0, sent - got)
    return {"packets_received": got, "packets_lost": lost, "loss_ratio": (lost / sent) if sent else None}


def collect(
    ctl: Controller, influx_url: str, influx_db: str, window_s: float = 60.0, repairs_window_s: float = 3600.0
) -> dict:
    """Everything status shows, as one JSON-able dict (also what --json prints)."""
    out: dict[str, Any] = {
        "nodes": {},
        "sessions": [],
        "flows": [],
        "inline_monitors": [],
        "run": {"window_s": repairs_window_s, "replicas": [], "repairs": []},
        "influx_error": None,
    }
    sessions_by_node: dict[str, dict] = {}
    flows_by_node: dict[str, dict] = {}
    inline_by_node: dict[str, dict] = {}
    clients = {}
    for name, node in sorted(ctl.intent.nodes.items()):
        try:
            client = ctl.client(name)
            from segscope_proto.segscope.agent.v1 import flowmon_pb2, stamp_pb2

            sess = client.call(client.stamp, "ListStampSessions", stamp_pb2.ListStampSessionsRequest()).sessions
            mons = client.call(client.flowmon, "ListFlowMonitors", flowmon_pb2.ListFlowMonitorsRequest()).monitors
            sessions_by_node[name] = {(s.session.role, s.session.ssid): s for s in sess}
            flows_by_node[name] = {(m.monitor.side, m.monitor.flow_id): m for m in mons}
            clients[name] = client
            if ctl.intent.inline_monitors:
                from segscope_proto.segscope.agent.v1 import inline_pb2

                inl = client.call(client.inline, "ListInlineMonitors", inline_pb2.ListInlineMonitorsRequest()).monitors
                inline_by_node[name] = {(m.monitor.side, m.monitor.flow_id): m for m in inl}
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
            **session_loss(snd),
            # replies the reflector's devices failed to send (lost silently before this existed)
            "reflector_tx_dropped": refl.reflector_tx_dropped if refl else None,
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
    try:
        now = time.time_ns()
        out["run"]["replicas"] = [
            {
                "replica": r.get("replica"),
                "leader": bool(r.get("leader")),
                "repairs": r.get("repairs"),
                "repair_errors": r.get("repair_errors"),
                "left_alone": r.get("left_alone"),
                "agents_up": r.get("agents_up"),
                "agents": r.get("agents"),
                "age_s": round((now - r["time"]) / 1e9, 1),
            }
            for r in run_replicas(influx_url, influx_db)
        ]
        out["run"]["repairs"] = [
            {
                "age_s": round((now - r["time"]) / 1e9, 1),
                **{
                    k: r.get(k) for k in ("node", "action", "kind", "key", "rpcs", "reason", "after_agent_s", "replica")
                },
                "ok": bool(r.get("ok")),
                "error": r.get("error"),
            }
            for r in recent_repairs(influx_url, influx_db, repairs_window_s)
        ]
        if ctl.intent.steering:
            out["steering"] = _steering_status(influx_url, influx_db, repairs_window_s, now)
            out["steering"]["entries"] = [describe_candidates(s) for s in ctl.intent.steering]
    except (requests.RequestException, RuntimeError) as exc:
        out["influx_error"] = str(exc)
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
            "window": None,
        }
        try:
            row["window"] = window_loss(influx_url, influx_db, f.flow_id, window_s)
            p = latest_loss(influx_url, influx_db, f.flow_id)
            if p:
                row["loss"] = {
                    k: p.get(k) for k in ("tx_packets", "rx_packets", "lost", "loss_ratio", "complete", "reason")
                }
                row["loss"]["age_s"] = round((now_ns - p["time"]) / 1e9, 1)
        except (requests.RequestException, RuntimeError) as exc:
            out["influx_error"] = str(exc)
        out["flows"].append(row)
    for m in ctl.intent.inline_monitors:
        out["inline_monitors"].append(
            _inline_row(m, clients, inline_by_node, influx_url, influx_db, window_s, now_ns, out)
        )
    return out


def _inline_row(m, clients, inline_by_node, influx_url, influx_db, window_s, now_ns, out) -> dict:
    """One in-line monitor: its sides on the agents, their counters, the worst hop in InfluxDB."""
    from segscope_proto.segscope.agent.v1 import inline_pb2

    row: dict[str, Any] = {
        "flow_id": m.flow_id,
        "ingress": m.ingress.node,
        "egress": m.egress.node,
        "segs": list(m.segs),
        "sampling": {"every": m.sample_every} if m.sample_every else {"interval_us": m.sample_interval_us},
        "ingress_state": "absent",
        "egress_state": "absent",
        "sampled": None,
        "instrumented": None,
        "skipped": None,
        "records": None,
        "worst_hop": None,
    }
    for side, node in (
        (inline_pb2.INLINE_SIDE_INGRESS, m.ingress.node),
        (inline_pb2.INLINE_SIDE_EGRESS, m.egress.node),
    ):
        name = "ingress" if side == inline_pb2.INLINE_SIDE_INGRESS else "egress"
        if (side, m.flow_id) not in inline_by_node.get(node, {}):
            continue
        row[f"{name}_state"] = "installed"
        client = clients[node]
        try:
            res = client.call(
                client.inline,
                "GetInlineMonitorResults",
                inline_pb2.GetInlineMonitorResultsRequest(side=side, flow_id=m.flow_id),
            )
        except AgentError as exc:
            row[f"{name}_state"] = f"error: {exc.code}"
            continue
        if res.WhichOneof("counters") == "ingress":
            c = res.ingress
            row.update(
                sampled=c.sampled, instrumented=c.instrumented, skipped=c.skipped_mtu + c.skipped_gso + c.skipped_other
            )
            row["skipped_by_reason"] = {"mtu": c.skipped_mtu, "gso": c.skipped_gso, "other": c.skipped_other}
        elif res.WhichOneof("counters") == "egress":
            row["records"] = res.egress.records
    try:
        hop = worst_hop(influx_url, influx_db, m.flow_id, window_s)
        if hop is not None:
            hop["age_s"] = round((now_ns - hop.pop("time")) / 1e9, 1)
        row["worst_hop"] = hop
    except (requests.RequestException, RuntimeError) as exc:
        out["influx_error"] = str(exc)
    return row


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
        f"{'ssid':>5} {'sender':<7}{'reflector':<10}{'state (s/r)':<18}{'sent':>8} {'rcvd':>8} {'lost':>7} "
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
            f"{_fmt(s.get('packets_received')):>8} "
            f"{_fmt(s.get('packets_lost')):>7} "
            f"{_fmt(f.get('mean_us'), ' us'):>10} {_fmt(r.get('mean_us'), ' us'):>10} "
            f"{_fmt(t.get('mean_us'), ' us'):>10} {_fmt(t.get('p99_us'), ' us'):>10} "
            f"{_fmt(age, ' s'):>6}"
        )
    if not status["sessions"]:
        lines.append("(no STAMP sessions in the intent)")
    if any(s.get("sender_state") == "running" for s in status["sessions"]):
        lines.append("(lost: exact once a run has stopped; '-' while it runs, replies are in flight)")
    for s in status["sessions"]:
        if s.get("reflector_tx_dropped"):
            lines.append(
                f"WARNING ssid {s['ssid']}: reflector {s['reflector']} failed to send "
                f"{s['reflector_tx_dropped']} frames on its devices (TX drops): replies are being lost there"
            )
    lines.append("")
    window = next((f["window"]["window_s"] for f in status["flows"] if f.get("window")), None)
    hdr = (
        f"{'flow':>6} {'method':<8}{'ingress':<8}{'egress':<8}{'tx/rx':<20}{'blocks':>7} {'tx pkts':>9} "
        f"{'rx pkts':>9} {'lost':>6} {'loss %':>8} {'incompl':>8} | {'latest':<12}{'age':>6}"
    )
    title = f"Monitored flows (complete blocks of the last {_fmt(window, ' s', 0)}; latest block; altmark_loss)"
    lines += [title, hdr, "-" * len(hdr)]
    for f in status["flows"]:
        loss, w = f["loss"] or {}, f.get("window") or {}
        ratio = w.get("loss_ratio")
        lines.append(
            f"{f['flow_id']:>6} {f['method']:<8}{f['ingress']:<8}{f['egress']:<8}"
            f"{f['tx'] + '/' + f['rx']:<20}{_fmt(w.get('blocks')):>7} {_fmt(w.get('tx_packets')):>9} "
            f"{_fmt(w.get('rx_packets')):>9} {_fmt(w.get('lost')):>6} "
            f"{_fmt(ratio * 100 if ratio is not None else None, '', 3):>8} {_fmt(w.get('incomplete_blocks')):>8} | "
            f"{(loss.get('reason') or '-'):<12}{_fmt(loss.get('age_s'), ' s'):>6}"
        )
    if not status["flows"]:
        lines.append("(no monitored flows in the intent)")
    lines.append("")
    hdr = (
        f"{'flow':>6} {'ingress':<8}{'egress':<8}{'state (i/e)':<22}{'sampled':>9} {'instr.':>9} {'skipped':>8} "
        f"{'records':>9} | {'worst hop (newest second)':<28}{'mean':>11}{'age':>7}"
    )
    lines += ["In-line monitors (IOAM; counters from the agents; inline_hop_delay)", hdr, "-" * len(hdr)]
    for m in status.get("inline_monitors", []):
        hop = m.get("worst_hop")
        if hop:
            where = f"{hop.get('from_node')}->{hop.get('to_node')}" + (f" ({hop['link']})" if hop.get("link") else "")
            worst, mean, age = where, _fmt(hop.get("mean_us"), " us"), _fmt(hop.get("age_s"), " s")
        else:
            worst, mean, age = "n/a", "n/a", "-"
        lines.append(
            f"{m['flow_id']:>6} {m['ingress']:<8}{m['egress']:<8}{m['ingress_state'] + '/' + m['egress_state']:<22}"
            f"{_fmt(m['sampled']):>9} {_fmt(m['instrumented']):>9} {_fmt(m['skipped']):>8} {_fmt(m['records']):>9} | "
            f"{worst[:28]:<28}{mean:>11}{age:>7}"
        )
    if not status.get("inline_monitors"):
        lines.append("(no in-line monitors in the intent)")
    if "run" in status:
        lines += _render_run(status["run"])
    if "steering" in status:
        lines += _render_steering(status["steering"])
    if status.get("influx_error"):
        lines += ["", f"InfluxDB not readable: {status['influx_error']}"]
    return "\n".join(lines)


def _render_run(run: dict) -> list[str]:
    """Which replica of `controller run` leads, and its newest repairs."""
    lines = [""]
    leaders = [r["replica"] for r in run.get("replicas", []) if r.get("leader")]
    lines.append(
        f"controller run: {len(run.get('replicas', []))} replica(s) seen in the last minute"
        + (f", leader {', '.join(leaders)}" if leaders else ", none leads")
    )
    repairs = run.get("repairs", [])
    lines.append(
        f"repairs in the last {_fmt(run.get('window_s'), ' s', 0)}: {len(repairs)}"
        + (" (newest first)" if repairs else "")
    )
    for r in repairs:
        after = f", {r['after_agent_s']:.2f} s after the agent came back" if r.get("after_agent_s") is not None else ""
        state = "ok" if r.get("ok") else f"FAILED: {r.get('error')}"
        lines.append(
            f"  {_fmt(r.get('age_s'), ' s'):>8} ago  {r.get('node') or '-':<6} {r.get('action') or '':<8}"
            f"{r.get('kind') or '':<16} {r.get('key') or '':<14} [{r.get('rpcs')}] {r.get('reason')}{after}: {state}"
        )
    return lines


def _render_steering(steering: dict) -> list[str]:
    """Each steered policy's active path and alert, and segscope-steer's newest decisions."""
    lines = ["", "steering (segscope-steer):"]
    for entry in steering.get("entries", []):
        lines += render_candidates(entry)
    for p in steering.get("policies", []):
        alert = f"  ALERT: {p.get('alert_text')}" if p.get("alert") else ""
        lines.append(
            f"  {p.get('node')} {p.get('policy')}: on {p.get('active')} ({p.get('state')}), "
            f"{_fmt(p.get('switch'))} switches, {_fmt(p.get('rollback'))} rollbacks{alert}"
        )
    decisions = steering.get("decisions", [])
    lines.append(f"decisions in the last {_fmt(steering.get('window_s'), ' s', 0)}: {len(decisions)}")
    for d in decisions:
        what = "dry-run " if d.get("dry_run") else ""
        state = "ok" if d.get("ok") else f"NOT DONE: {d.get('error')}"
        lines.append(
            f"  {_fmt(d.get('age_s'), ' s'):>8} ago  {d.get('node')} {d.get('policy')} {what}{d.get('kind')} "
            f"{d.get('from')} ({_fmt(d.get('from_delay_us'), ' us', 0)}, {_fmt(d.get('from_loss_pct'), ' %', 2)}) -> "
            f"{d.get('to')} ({_fmt(d.get('to_delay_us'), ' us', 0)}, {_fmt(d.get('to_loss_pct'), ' %', 2)}): "
            f"{d.get('rule')}: {state}"
        )
    return lines
