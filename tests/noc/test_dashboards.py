"""dashboards/: the JSON and the alerting file are what dashboards/generate.py makes, and they have
what a NOC engineer and an importing Grafana need (datasource variable, units, links that resolve,
every query bounded by the time range). The queries run against real data in tests/e2e/test_noc_view.py;
the alert rules fire and stay silent in tests/dashboards/test_alert_rules.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dashboards import alerts, generate
from dashboards.generate import panel_queries

REPO = Path(__file__).resolve().parents[2]
DASH = REPO / "dashboards"
FILES = sorted(generate.DASHBOARDS)


def load(name: str) -> dict:
    return json.loads((DASH / name).read_text())


def test_committed_files_are_generated():
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'schemas' / 'python'}"}
    out = subprocess.run([sys.executable, "-m", "dashboards.generate", "--check"], cwd=REPO, env=env,
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr


def test_check_catches_a_hand_edit(tmp_path, monkeypatch):
    """--check compares byte for byte: a panel edited in Grafana and exported is refused."""
    monkeypatch.setattr(generate, "HERE", tmp_path)
    for path, text in generate.render().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    monkeypatch.setattr(sys, "argv", ["generate", "--check"])
    assert generate.main() == 0
    edited = load("path.json") | {}
    p = tmp_path / "path.json"
    p.write_text(p.read_text().replace('"unit": "µs"', '"unit": "ms"', 1))
    assert generate.main() == 1
    assert edited  # the fixture file existed


@pytest.mark.parametrize("name", FILES)
def test_every_panel_uses_the_datasource_variable(name):
    d = load(name)
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "influxdb"
    for p in d["panels"]:
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "influxdb", "uid": "${datasource}"}, p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}"
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"]["uid"] == "${datasource}"
    assert "segscope-influxdb" not in json.dumps(d["panels"])  # no hard-wired datasource uid


@pytest.mark.parametrize("name", FILES)
def test_every_query_is_bounded_and_uses_defined_variables(name):
    d = load(name)
    defined = {v["name"] for v in d["templating"]["list"]} | {"timeFilter", "__interval"}
    for title, ref, q in panel_queries(d):
        assert "$timeFilter" in q, f"{title} {ref}: unbounded query"
        used = set(re.findall(r"\$(\w+)", q)) - {"tag_node"}
        assert used <= defined, f"{title} {ref}: undefined {used - defined}"


@pytest.mark.parametrize("name", FILES)
def test_every_panel_has_a_unit_and_a_title(name):
    for p in load(name)["panels"]:
        if p["type"] in ("row", "table"):
            continue
        assert p["fieldConfig"]["defaults"]["unit"], p["title"]
        assert p["title"] and p["targets"]


def test_delay_panels_are_in_microseconds_and_loss_ratio_in_percent():
    checked = 0
    for name in FILES:
        for p in load(name)["panels"]:
            if p["type"] in ("row", "table"):
                continue
            queries = " ".join(t["query"] for t in p["targets"])
            unit = p["fieldConfig"]["defaults"]["unit"]
            if re.search(r'\("\w+_us"\)|SELECT "\w+_us"', queries):
                assert unit == "µs", (name, p["title"])
                checked += 1
            if 'sum("lost") / sum("tx_packets")' in queries:
                assert unit == "percentunit", (name, p["title"])
                checked += 1
    assert checked >= 8


def test_links_point_at_existing_dashboards():
    uids = {load(n)["uid"] for n in FILES}
    for name in FILES:
        d = load(name)
        for p in d["panels"]:
            for link in p.get("fieldConfig", {}).get("defaults", {}).get("links", []):
                uid = re.match(r"/d/([\w-]+)/", link["url"]).group(1)
                assert uid in uids, (name, p["title"], link["url"])
                for var in re.findall(r"var-(\w+)=", link["url"]):
                    target = next(load(n) for n in FILES if load(n)["uid"] == uid)
                    assert var in {v["name"] for v in target["templating"]["list"]}, (link["url"], var)
        assert d["links"][0]["tags"] == ["segscope"] and "segscope" in d["tags"]


def test_the_four_views_exist():
    titles = {load(n)["uid"]: {p["title"] for p in load(n)["panels"]} for n in FILES}
    assert set(titles) == {"segscope-overview", "segscope-path", "segscope-node", "segscope-pipeline"}
    assert "Loss ratio per flow (complete blocks)" in titles["segscope-overview"]
    assert {"Lost packets per block", "D-mark delay of real traffic (double marking)"} <= titles["segscope-path"]
    assert "STAMP datapath drops by reason" in titles["segscope-node"]
    assert "Processor input behind (consumer lag)" in titles["segscope-pipeline"]
    path_vars = {v["name"] for v in load("path.json")["templating"]["list"]}
    assert {"path", "node", "ssid", "direction", "flow"} <= path_vars


def test_alert_provisioning_file():
    doc = yaml.safe_load((DASH / "provisioning" / "alerting" / "segscope.yaml").read_text())
    (group,) = doc["groups"]
    rules = {r["uid"]: r for r in group["rules"]}
    assert set(rules) == {r.uid for r in alerts.rules()}
    provisioned_ds = yaml.safe_load((DASH / "provisioning" / "datasources" / "segscope.yaml").read_text())
    ds_uid = provisioned_ds["datasources"][0]["uid"]
    for r in rules.values():
        a, b, c = r["data"]
        assert a["datasourceUid"] == ds_uid and "$timeFilter" in a["model"]["query"]
        assert b["model"]["expression"] == "A" and c["model"]["expression"] == "B" and r["condition"] == "C"
        assert r["annotations"]["summary"] and len(r["annotations"]["description"]) > 60
        assert r["labels"]["severity"] in ("warning", "critical")
        assert re.fullmatch(r"\d+s", r["for"])
    expected = {"segscope-delay-default", "segscope-loss-any", "segscope-loss-ratio", "segscope-incomplete-blocks",
                "segscope-session-silent", "segscope-clock-unsynchronized", "segscope-pipeline-lag",
                "segscope-pipeline-stalled", "segscope-dead-letters"}  # fmt: skip
    assert expected <= set(rules)
    # per-path objectives (dashboards/objectives.yaml) each have their rule
    for o in alerts.objectives():
        uid = f"segscope-delay-{o['node']}-{o['ssid']}".lower()
        cond = rules[uid]["data"][2]["model"]["conditions"][0]["evaluator"]
        assert cond == {"type": "gt", "params": [float(o["one_way_delay_us"])]}


def test_summary_templates_are_filled():
    rule = next(r for r in alerts.rules() if r.uid == "segscope-loss-ratio")
    text = alerts.render_summary(rule, {"flow": "7"}, 0.0312)
    assert text.startswith("flow 7 loses 3.12% of its packets") and "{{" not in text


# --------------------------------------------------------------------------- Grafana's schema types
def _without_link_placement(doc, in_links: bool = False):
    """The SDK writes placement "inControlsMenu" on every link it reads back (the generator drops
    it, dashboards/generate.py LinkAbovePanels): not a key of the file."""
    if isinstance(doc, dict):
        return {
            k: _without_link_placement(v, k == "links") for k, v in doc.items() if not (in_links and k == "placement")
        }
    if isinstance(doc, list):
        return [_without_link_placement(v, in_links) for v in doc]
    return doc


@pytest.mark.parametrize("name", FILES)
def test_files_read_back_through_grafanas_schema_types(name):
    """Every key of the file is a field of the SDK's types (Grafana's dashboard schema, each panel
    plugin's options and field config): read into them and written out, the file comes back
    unchanged. A misspelt or unknown option would be dropped on the way and show here."""
    import warnings

    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from grafana_foundation_sdk.models.dashboard import Dashboard

    register_default_plugins()
    written = load(name)
    typed = Dashboard.from_json(written)
    assert all(type(t).__name__ == "Dataquery" for p in typed.panels or [] for t in getattr(p, "targets", None) or [])
    assert _without_link_placement(json.loads(json.dumps(typed, cls=JSONEncoder))) == written


def test_alerting_file_reads_back_through_grafanas_schema_types():
    """The provisioning file's rules are the SDK's alert rule type (the file's layout around it:
    dashboards/alerting_file.py): read back, every rule is unchanged."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    from dashboards.alerting_file import AlertingProvisioning

    written = yaml.safe_load((DASH / "provisioning" / "alerting" / "segscope.yaml").read_text())
    typed = AlertingProvisioning.from_json(written)
    assert [r.uid for g in typed.groups for r in g.rules] == [r.uid for r in alerts.rules()]
    assert json.loads(json.dumps(typed, cls=JSONEncoder)) == written


MYPY = [sys.executable, "-m", "mypy", "--follow-imports=silent", "--ignore-missing-imports", "--no-error-summary"]


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory) -> Path:
    """One mypy cache for the two checks below: the SDK's modules are analysed once, not twice
    (a fresh cache per module run; the cache changes how long mypy takes, never what it reports)."""
    return tmp_path_factory.mktemp("mypy-cache")


def test_generator_type_checks_against_grafanas_schema_types(mypy_cache):
    """mypy over the generator with the SDK's types (Grafana's schemas: enums, literals such as a
    reducer's name, which builder goes where): what no running Grafana checks here."""
    sources = [
        "dashboards/generate.py",
        "dashboards/alerts.py",
        "dashboards/influxdb.py",
        "dashboards/alerting_file.py",
    ]
    out = subprocess.run([*MYPY, "--cache-dir", str(mypy_cache), *sources], cwd=REPO,
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_type_check_sees_the_sdk(tmp_path, mypy_cache):
    """The same check refuses what Grafana would: without the SDK's types in view (not installed,
    or imports silenced to Any) the test above would pass on anything."""
    bad = tmp_path / "bad_rule.py"
    bad.write_text(
        "from grafana_foundation_sdk.builders import expr, timeseries\n"
        'expr.TypeReduce().reducer("avg")\n'  # Grafana's reducers: sum mean min max count last median
        'timeseries.Panel().repeat_direction("vertical")\n'  # "h" or "v"
    )
    out = subprocess.run([*MYPY, "--cache-dir", str(mypy_cache), str(bad)], cwd=REPO,
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 1
    assert 'Argument 1 to "reducer" of "TypeReduce" has incompatible type "Literal[\'avg\']"' in out.stdout, out.stdout
    assert 'Argument 1 to "repeat_direction" of "Panel"' in out.stdout, out.stdout
