"""End to end for the NOC view: the demo's network and intent (line5_bare, controller/examples/
demo_pm.yaml: a STAMP session A -> B and alternate-marked flow 7 on A's policy), 2 ms injected A->B
and 1 ms B->A, LOSS_PCT % of flow 7's packets dropped on R by nftables, H1 pinging H2 as the flow's
traffic. Then, against the real InfluxDB:

- every query of every panel of the four dashboards returns the series the panel expects
  (named by its tags, non-empty), with the template variables set to this run's session and flow
  (the in-line measurement's queries run and are empty: this network has none);
- every alert rule's query returns series, "Packet loss on a flow" fires and the delay objectives
  (5 ms for this path, 10 ms default) stay silent;
- segscope-report writes a page that headless Chromium (Debian's package) renders to a screenshot
  that is not blank, showing the injected delay (forward mean 2.0-2.4 ms) and the measured loss
  (the sum of `lost` over complete blocks: more than 0, at most the packets nftables dropped), and
  its per-hop section saying there is no in-line result.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controller.intent import load_intent
from controller.pipeline import ControlledPipeline
from dashboards import alerts, generate
from dashboards.generate import panel_queries
from dashboards.report import Influx
from netlab import Lab, teardown
from tests.isolation import own_name
from tests.noc import browser

REPO = Path(__file__).resolve().parents[2]
TOPOLOGY = REPO / "netlab" / "topologies" / "line5_bare.yaml"
INTENT = REPO / "controller" / "examples" / "demo_pm.yaml"
PREFIX = own_name("noc")
DURATION_S, RATE = 15, 100
FWD_US, REV_US = 2000, 1000
LOSS_PCT = 3.0
FLOW_SID = "fc00:3::d6"  # flow 7's last SID: its packets' destination after R's End

pytestmark = [pytest.mark.e2e, pytest.mark.datapath]

# Panels that show trouble: with none in a healthy run their query returns nothing; the query
# still runs (a syntax or name error fails the test) and the alert tests prove them with data.
TROUBLE_ONLY = {
    "Incomplete blocks and why",
    "Incomplete loss blocks per flow",
}
# This network has no in-line (IOAM) measurement: queries of its measurements run (a syntax or
# name error fails the test) and return nothing; tests/noc/test_inline_view.py checks their
# numbers on in-line results written to InfluxDB.
IN_LINE = re.compile(r'FROM "inline_\w+"')


@pytest.fixture(scope="module")
def run(stack, bpffs, tmp_path_factory):
    teardown(PREFIX)
    tmp = tmp_path_factory.mktemp("noc")
    lab = Lab.up(TOPOLOGY, prefix=PREFIX, delay_us={"ar": (FWD_US, REV_US)})
    pipe = ControlledPipeline(lab, stack, tmp)
    ping = freshness = None
    try:
        freshness = subprocess.Popen(
            [sys.executable, "-m", "processors.freshness", "--report-s", "2", "--influx-url", stack.influx_url,
             "--bootstrap", stack.kafka_bootstrap],
            cwd=REPO, stdout=open(tmp / "freshness.log", "w"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        pipe.start_agents()
        pipe.start_processor("delay")
        pipe.start_processor("loss")
        loss = lab.add_loss("R", LOSS_PCT, match=f"ip6 daddr {FLOW_SID}")
        intent = load_intent(INTENT)
        session = dataclasses.replace(intent.stamp_sessions[0], rate_pps=RATE, duration_s=DURATION_S)
        intent.stamp_sessions[0] = session
        since = time.time_ns()
        pipe.apply(intent)
        # H1 -> H2 through A's policy: flow 7's traffic, 200 packets/s while the session runs
        ping = lab.popen("H1", ["ping", "-6", "-q", "-i", "0.005", "-w", str(DURATION_S), "fd00:b::1"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        pipe.wait_stopped("A", session.ssid, timeout_s=DURATION_S + 30)
        ping_out = ping.communicate(timeout=30)[0]
        dropped = lab.loss_counter(loss)
        influx = Influx(stack.influx_url, stack.influx_db)
        # wait until the loss processor has published the blocks that ran (timeout 10 s + margin)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rows = influx.series(f'SELECT count("lost") FROM "altmark_loss" WHERE "flow" = \'7\' AND time >= {since}')
            delay = influx.series(f'SELECT count("count") FROM "stamp_delay" WHERE time >= {since}')
            if rows and rows[0]["values"][0][1] >= DURATION_S - 3 and delay:
                break
            time.sleep(1)
        time.sleep(3)  # one more flush of every counter line and freshness report
        yield {"since": since, "influx": influx, "dropped": dropped, "ping": ping_out, "ssid": session.ssid,
               "tmp": tmp, "stack": stack}  # fmt: skip
    finally:
        if ping and ping.poll() is None:
            ping.kill()
        if freshness is not None:
            freshness.terminate()
            freshness.wait(timeout=10)
        pipe.stop()
        lab.down()


def as_grafana(query: str, since_ns: int, ssid: int) -> str:
    q = alerts.expand(query, since_ns - 60 * 10**9, time.time_ns(), 1000)
    return (
        q.replace("/^$node$/", "/^A$/")
        .replace("/^$ssid$/", f"/^{ssid}$/")
        .replace("/^$direction$/", "/^(forward|reverse|round_trip)$/")
        .replace("/^$flow$/", "/^7$/")
        .replace("/^$path$/", "/.*/")
    )


@pytest.mark.parametrize("name", sorted(generate.DASHBOARDS))
def test_every_panel_query_returns_its_series(run, name):
    dash = json.loads((REPO / "dashboards" / name).read_text())
    empty = []
    for title, ref, query in panel_queries(dash):
        series = run["influx"].series(as_grafana(query, run["since"], run["ssid"]))
        if not series and IN_LINE.search(query):
            continue
        if not series:
            empty.append(f"{title} [{ref}]")
            continue
        # the series are named by the tags the panel's legend uses
        panel = next(p for p in dash["panels"] if p["title"] == title)
        alias = next(t.get("alias", "") for t in panel["targets"] if t["refId"] == ref)
        for tag in re.findall(r"\$tag_(\w+)", alias):
            assert all(tag in s["tags"] for s in series), (title, ref, tag)
        assert any(v is not None for s in series for row in s["values"] for v in row[1:]), (title, ref)
    assert set(e.split(" [")[0] for e in empty) <= TROUBLE_ONLY, empty


def test_path_variable_finds_the_sessions_and_flows_on_a_sid_list(run):
    """The path dashboard's variables, as Grafana runs them: the SID lists come from the agents'
    inventory lines; choosing one gives the session and the flow that travel it."""
    dash = json.loads((REPO / "dashboards" / "path.json").read_text())
    var = {v["name"]: v["query"] for v in dash["templating"]["list"] if v["type"] == "query"}

    def values(name: str, **chosen) -> set[str]:
        q = var[name]
        for k, v in chosen.items():
            q = q.replace(f"/^${k}$/", "/^" + re.escape(v) + "$/")
        return {row[1] for s in run["influx"].series(q) for row in s["values"]}

    # (SHOW TAG VALUES has no time range: other tests' agents on the shared stack show up too)
    assert "fc00:2::e" in values("path")  # the STAMP session's SID list (reflector address after it)
    assert "A" in values("node", path="fc00:2::e")
    assert str(run["ssid"]) in values("ssid", path="fc00:2::e", node="A")
    assert "7" in values("flow", path="fc00:2::e,fc00:3::d6")  # the flow on A's policy
    assert "7" not in values("flow", path="fc00:2::e")  # not on the STAMP session's path


def test_every_alert_query_returns_series(run):
    now = time.time_ns()
    # A second has error_estimate_max_us only if a record had both clocks synchronized; on a host
    # whose kernel says "unsynchronized" (no NTP/PTP daemon) every record counts in `unsynchronized`.
    (unsync,) = run["influx"].series(
        f'SELECT sum("unsynchronized"), sum("count") FROM "stamp_delay" WHERE "direction" = \'round_trip\' '
        f'AND time >= {run["since"]}'
    )
    all_unsynchronized = unsync["values"][0][1] == unsync["values"][0][2]
    checked = []
    for rule in alerts.rules():
        if rule.uid in ("segscope-incomplete-blocks", "segscope-dead-letters", "segscope-steering-no-candidate"):
            continue  # a series only with trouble, or with steering (proven in tests/noc/test_alert_rules.py)
        if IN_LINE.search(rule.query):
            assert run["influx"].series(alerts.expand(rule.query, run["since"], now, rule.interval_ms)) == []
            continue  # no in-line measurement here (the link rules: tests/noc/test_alert_rules.py)
        if rule.uid == "segscope-clock-error" and all_unsynchronized:
            continue
        if rule.uid.startswith("segscope-delay-"):
            q = alerts.expand(rule.query, run["since"], now, rule.interval_ms)  # the whole run
        else:
            q = alerts.expand(rule.query, now - rule.window_s * 10**9, now, rule.interval_ms)
        assert run["influx"].series(q), (rule.uid, q)
        checked.append(rule.uid)
    assert len(checked) >= 8, checked


def test_loss_alert_fires_and_delay_objectives_stay_silent(run):
    now = time.time_ns()
    rules = {r.uid: r for r in alerts.rules()}
    states = alerts.evaluate(rules["segscope-loss-any"], run["influx"].series, [now])
    ours = {k: v for k, v in states.items() if ("flow", "7") in k}  # the shared stack may hold other flows
    assert list(ours.values()) == ["Alerting"], states
    for uid in ("segscope-delay-default", "segscope-delay-a-1"):
        # evaluated over the run: the series exist (the session measured) and stay Normal
        times = [run["since"] + k * 10 * 10**9 for k in range(1, DURATION_S // 10 + 2)]
        states = alerts.evaluate(rules[uid], run["influx"].series, times)
        assert states and set(states.values()) == {"Normal"}, (uid, states)


def test_report_in_chromium_shows_the_delay_and_the_loss(run):
    tmp = run["tmp"]
    out = tmp / "report.html"
    env = {**os.environ, "SEGSCOPE_INFLUX_URL": run["stack"].influx_url}
    # the window of this run only (from its start, whole seconds): other tests of the session write
    # into the same database (the in-line ones: a per-hop section this network cannot have)
    window_s = math.ceil((time.time_ns() - run["since"]) / 1e9) + 1
    r = subprocess.run([sys.executable, "-m", "dashboards.report", "--since", f"{window_s}s", "--out", str(out),
                        "--json"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    fig = json.loads(out.with_suffix(".json").read_text())
    dom = browser.dom(out, tmp / "chromium-dom")
    png = tmp / "report.png"
    img = browser.screenshot(out, png, tmp / "chromium-png", (1100, 1700))
    shutil.copy(png, REPO / ".run" / "noc-report.png") if (REPO / ".run").is_dir() else None
    assert img.size == (1100, 1700)
    assert browser.not_blank(img)

    # the injected delay: session A/ssid, forward mean 2.0-2.4 ms, shown in the page
    row = fig["sessions"][f"A/{run['ssid']}"]["directions"]["forward"]
    assert FWD_US <= row["mean"] <= FWD_US + 400, row
    shown = f"{row['mean']:,.1f}"
    assert re.search(rf"<td class=\"l\">forward</td><td>{re.escape(shown)}</td>", dom), shown
    # the measured loss: flow 7's lost packets over complete blocks, the nftables drops bound it
    flow = fig["flows"]["7"]
    assert 0 < flow["lost"] <= run["dropped"], (flow, run["dropped"])
    assert f"<td>{flow['lost']:,}</td>" in dom
    assert "Packet loss on a flow" in dom  # the alert that fires is listed
    assert "flow 7 (A → B)" in dom
    # the per-hop section is there; this network has no in-line (IOAM) measurement, and the page
    # says so rather than showing an empty table (the section with data: tests/noc/test_inline_view.py)
    assert fig["inline_paths"] == {}
    assert "<h2>Delay per hop (in-line measurement of real traffic)</h2>" in dom
    assert "no in-line results in this window" in dom


def test_freshness_is_measured_for_delay_and_loss(run, capsys):
    """segscope-freshness saw the run's points arrive: samples for both measurements, the median
    within a few seconds (a second is final 2 s after it ends, plus Kafka, Telegraf's 1 s flush and
    the 0.5 s poll; a block waits for its end + T/2 at the collector). The p99 is printed, not
    judged: on the shared test stack a processor may also publish other tests' old points, which
    are (rightly) counted as minutes old."""
    rows = run["influx"].series(
        f'SELECT sum("samples"), max("p99_ms"), min("p50_ms") FROM "segscope_freshness" WHERE time >= {run["since"]} '
        'GROUP BY "measurement"'
    )
    got = {s["tags"]["measurement"]: s["values"][0][1:] for s in rows}
    with capsys.disabled():
        print(f"\n[freshness] samples, worst p99 ms, best p50 ms: {got}")
    assert set(got) == {"stamp_delay", "altmark_loss"}, got
    for m, (samples, p99, p50) in got.items():
        # the median: a second is final 2 s after it ends, then up to 1 s processor flush, Kafka,
        # Telegraf's 1 s flush and the 0.5 s poll (measured 2.8-4.3 s for stamp_delay in full runs)
        assert samples > 5 and 0 < p50 < 10_000 and p99 >= p50, (m, samples, p50, p99)
