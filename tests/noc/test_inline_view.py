"""The in-line measurement of real traffic (IOAM) as the NOC sees it, on results written to the
real InfluxDB as the in-line processor writes them (`inline_delay`, `inline_hop_delay`,
`inline_loss`; line protocol from their spec) over one minute, one point per flow, hop and second:

- every in-line query of the path dashboard and the overview (taken from the generated JSON, run
  as Grafana runs it: macros and template variables filled in) returns the numbers the test wrote:
  each hop's packet-weighted mean per interval (the stacked chart, whose top plus the hop not
  measured is the end-to-end delay), the per-hop table (a hop not measured has no numbers), the
  in-line delay next to STAMP's, the sequence loss and reordering per interval and in total, and
  the 10 worst links of 12 with their paths;
- the path dashboard's variables find the in-line paths and flows;
- segscope-report's per-hop section, opened in headless Chromium: the table's numbers, and in the
  screenshot each hop's bar as long, relative to the others and to the end-to-end delay, as its
  mean delay (measured in pixels), the hop not measured an empty row.

Ground truth is what the test wrote (the records below), never what the code computed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from dashboards import alerts, generate
from dashboards.generate import panel_queries
from dashboards.report import HOP_COLOURS, Influx
from tests.noc import browser

REPO = Path(__file__).resolve().parents[2]
S = 10**9
INTERVAL_MS = 10_000  # $__interval of the queries: 10 s buckets
P1, P2 = "fc00:2::e,fc00:3::d6", "fc00:4::e,fc00:3::d6"
HIDDEN_US = 500.0  # what the not-measured link R->S adds to P1's end-to-end delay


@dataclass(frozen=True)
class HopSecond:
    t: int
    flow: str
    path: str
    hop: int
    link: str
    count: int | None  # None: not measured
    mean_us: float = 0.0
    p99_us: float = 0.0
    max_us: float = 0.0

    @property
    def sum_us(self) -> float:
        return (self.count or 0) * self.mean_us


@dataclass(frozen=True)
class EndToEndSecond:
    t: int
    flow: str
    path: str
    count: int
    mean_us: float
    p99_us: float


@dataclass(frozen=True)
class LossSecond:
    t: int
    flow: str
    path: str
    received: int
    lost: int
    duplicated: int
    reordered: int


def tag(value: str) -> str:
    return value.replace(",", "\\,").replace(" ", "\\ ").replace("=", "\\=")


def ends(link: str) -> tuple[str, str, str, str]:
    (a, a_if), (b, b_if) = (end.split(":") for end in link.split("->"))
    return a, a_if, b, b_if


def extra_paths() -> dict[str, list[tuple[str, float]]]:
    """Four more paths of two hops each (one link shared with P2): 12 measured links in all."""
    return {
        f"fc00:{5 + i}::e,fc00:3::d6": [(f"A:{4 + i}->Y{i}:1", 2000.0 + 250 * i), (f"Y{i}:2->B:2" if i else "X:2->B:2",
                                                                                  100.0 + 40 * i)]
        for i in range(4)
    }  # fmt: skip


def records(t0: int) -> tuple[list[HopSecond], list[EndToEndSecond], list[LossSecond]]:
    """One minute of in-line results from t0 (10 s aligned), one point per flow, hop and second.
    P1 carries flows 9 and 10 (hop 1, R->S, not measured: R adds no IOAM entry), P2 flow 11."""
    hops, e2e, loss = [], [], []
    for k in range(60):
        t = t0 + k * S
        c9 = 20 + k % 5
        m0, m2 = 1000.0 + 10 * k, 300.0 + 10 * (k % 3)
        hops += [
            HopSecond(t, "9", P1, 0, "A:1->R:1", c9, m0, m0 + 100 + k, m0 + 200),
            HopSecond(t, "9", P1, 1, "R:2->S:1", None),
            HopSecond(t, "9", P1, 2, "S:2->B:1", c9, m2, m2 + 40, m2 + 60),
            HopSecond(t, "10", P1, 0, "A:1->R:1", 5, 1500.0, 1600.0, 1700.0),
            HopSecond(t, "10", P1, 1, "R:2->S:1", None),
            HopSecond(t, "10", P1, 2, "S:2->B:1", 5, 350.0, 380.0, 390.0),
            HopSecond(t, "11", P2, 0, "A:3->X:1", 10, 7000.0 + k, 7300.0 + k, 7400.0),
            HopSecond(t, "11", P2, 1, "X:2->B:2", 10, 200.0, 230.0, 240.0),
        ]
        for i, (p, links) in enumerate(extra_paths().items()):
            hops += [HopSecond(t, str(12 + i), p, h, link, 4, mean, mean + 10, mean + 20)
                     for h, (link, mean) in enumerate(links)]  # fmt: skip
        e2e += [
            EndToEndSecond(t, "9", P1, c9, m0 + HIDDEN_US + m2, m0 + HIDDEN_US + m2 + 150),
            EndToEndSecond(t, "10", P1, 5, 1500.0 + HIDDEN_US + 350.0, 2500.0),
            EndToEndSecond(t, "11", P2, 10, 7200.0 + k, 7600.0 + k),
        ]
        lost9 = 2 if k % 10 == 3 else 0
        loss += [
            LossSecond(t, "9", P1, c9, lost9, 1 if k == 17 else 0, 3 if k % 20 == 5 else 0),
            LossSecond(t, "10", P1, 5, 1 if k == 42 else 0, 0, 0),
            LossSecond(t, "11", P2, 10, 0, 0, 1 if k == 30 else 0),
        ]
    return hops, e2e, loss


def line_protocol(hops, e2e, loss) -> list[str]:
    flows = {"9": ("A", "B"), "10": ("A", "B"), "11": ("A", "B")}
    out = []
    for h in hops:
        a, a_if, b, b_if = ends(h.link)
        series = (f"inline_hop_delay,flow={h.flow},path={tag(h.path)},hop={h.hop},link={h.link},from_node={a},"
                  f"to_node={b},from_if={a_if},to_if={b_if}")  # fmt: skip
        if h.count is None:
            out.append(f"{series} measured=false {h.t}")
        else:
            out.append(
                f"{series} count={h.count}i,sum_us={h.sum_us},min_us={h.mean_us - 50},mean_us={h.mean_us},"
                f"p50_us={h.mean_us},p99_us={h.p99_us},max_us={h.max_us},ipdv_mean_us=4.0,measured=true {h.t}"
            )
    for d in e2e:
        ingress, egress = flows[d.flow]
        out.append(
            f"inline_delay,flow={d.flow},ingress={ingress},egress={egress},path={tag(d.path)} count={d.count}i,"
            f"sum_us={d.count * d.mean_us},min_us={d.mean_us - 80},mean_us={d.mean_us},p50_us={d.mean_us},"
            f"p99_us={d.p99_us},max_us={d.p99_us + 20},ipdv_mean_us=6.0,newest_ns={d.t + S // 2}i {d.t}"
        )
    for x in loss:
        ingress, egress = flows[x.flow]
        ratio = x.lost / (x.received + x.lost)
        out.append(
            f"inline_loss,flow={x.flow},ingress={ingress},egress={egress},path={tag(x.path)} received={x.received}i,"
            f"lost={x.lost}i,duplicated={x.duplicated}i,reordered={x.reordered}i,loss_bursts={1 if x.lost else 0}i,"
            f"loss_burst_max={x.lost}i,loss_ratio={ratio} {x.t}"
        )
    return out


def stamp_and_inventory(t0: int) -> list[str]:
    """STAMP's forward delay of session A/1 beside the in-line results, and the agents' inventory
    lines the path dashboard's variables also read."""
    out = [f"stamp_delay,node=A,ssid=1,path=fc00:2::e,direction=forward count=10i,mean_us={2000.0 + k},"
           f"sum_us={10 * (2000.0 + k)} {t0 + k * S}" for k in range(60)]  # fmt: skip
    out += [
        f"segscope_stamp_session,node=A,ssid=1,role=sender,path=fc00:2::e,return_path=fc00:2::e rate_pps=10i {t0}",
        f"segscope_stamp_session,node=B,ssid=1,role=reflector,path=fc00:9::9,return_path=fc00:9::9 rate_pps=10i {t0}",
        f"segscope_flow,node=A,flow=7,side=tx,path={tag(P1)},method=dscp,device=a0 period_ms=1000i {t0}",
        f"segscope_flow,node=B,flow=8,side=rx,path={tag(P1)},method=dscp,device=b0 period_ms=1000i {t0}",
    ]
    return out


def write(influx: Influx, lines: list[str]) -> None:
    for i in range(0, len(lines), 5000):
        r = requests.post(f"{influx.url}/write", params={"db": influx.db, "precision": "ns"},
                          data="\n".join(lines[i : i + 5000]), timeout=30)  # fmt: skip
        assert r.status_code == 204, r.text


@pytest.fixture(scope="module")
def minute(stack):
    """A database holding one minute of in-line results, ending about now."""
    name = f"inline_{uuid.uuid4().hex[:10]}"
    stack.influx_query(f'CREATE DATABASE "{name}"')
    influx = Influx(stack.influx_url, name)
    t0 = time.time_ns() // (10 * S) * (10 * S) - 60 * S
    hops, e2e, loss = records(t0)
    write(influx, line_protocol(hops, e2e, loss) + stamp_and_inventory(t0))
    yield {"influx": influx, "t0": t0, "end": t0 + 59 * S, "hops": hops, "e2e": e2e, "loss": loss, "stack": stack}
    requests.post(f"{stack.influx_url}/query", data={"q": f'DROP DATABASE "{name}"'}, timeout=10)


def query_of(dash: dict, title: str, ref: str = "A") -> str:
    (query,) = [q for t, r, q in panel_queries(dash) if t == title and r == ref]
    return query


def as_grafana(query: str, m: dict, path: str = ".*", flow: str = ".*") -> str:
    """As Grafana sends it over the minute, with $path / $flow chosen (a single value or All)."""
    q = alerts.expand(query, m["t0"], m["end"], INTERVAL_MS)
    for var, value in {"path": path, "flow": flow, "node": "A", "ssid": "1"}.items():
        q = q.replace(f"/^${var}$/", f"/^{value}$/")
    return q


def by_series(series: list[dict], *keys: str) -> dict[tuple, dict[int, float]]:
    """{(tag values): {time ns: value}} of a time series result (first value column)."""
    out = {}
    for s in series:
        out[tuple(s["tags"][k] for k in keys)] = {
            int(row[0]): row[1] for row in s["values"] if row[1] is not None
        }  # fmt: skip
    return out


def bucket(t: int, width_s: int = 10) -> int:
    return t - t % (width_s * S)


def weighted(points) -> dict[tuple, dict[int, float]]:
    """Ground truth of sum(sum_us) / sum(count) per (key) and 10 s bucket; points: (key, t, count, sum)."""
    sums: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    for key, t, count, total in points:
        acc = sums[key][bucket(t)]
        acc[0] += total
        acc[1] += count
    return {k: {b: s / c for b, (s, c) in v.items()} for k, v in sums.items()}


def series_eq(got: dict[int, float], want: dict[int, float]) -> None:
    assert sorted(got) == sorted(want)
    for b, v in want.items():
        assert got[b] == pytest.approx(v, rel=1e-9), (b, got[b], v)


PATH = generate.as_json(generate.path())
OVERVIEW = generate.as_json(generate.overview())


def test_hops_stacked_split_the_paths_delay_by_link(minute):
    """The stacked chart of P1 (its repeat for path = P1, every flow): one band per measured hop,
    each the packet-weighted mean of both flows per 10 s; hop 1 (not measured) has none. For one
    flow, the bands add up to the in-line end-to-end delay less the hidden link."""
    query = query_of(PATH, "Delay per hop, stacked: $path")
    got = by_series(minute["influx"].series(as_grafana(query, minute, path=P1)), "hop", "link")
    want = weighted(((str(h.hop), h.link), h.t, h.count, h.sum_us) for h in minute["hops"]
                    if h.path == P1 and h.count is not None)  # fmt: skip
    assert set(got) == {("0", "A:1->R:1"), ("2", "S:2->B:1")} == set(want)
    for key in want:
        series_eq(got[key], want[key])

    one_flow = by_series(minute["influx"].series(as_grafana(query, minute, path=P1, flow="9")), "hop", "link")
    e2e = by_series(
        minute["influx"].series(as_grafana(query_of(PATH, "In-line and STAMP one-way delay"), minute, P1, "9")),
        "flow",
    )[("9",)]
    stacked_top = {b: one_flow[("0", "A:1->R:1")][b] + one_flow[("2", "S:2->B:1")][b] for b in e2e}
    assert len(stacked_top) == 6
    for b, top in stacked_top.items():
        assert top + HIDDEN_US == pytest.approx(e2e[b], rel=1e-9)


def test_hops_table_marks_the_hop_not_measured(minute):
    rows = {
        (s["tags"]["path"], s["tags"]["hop"]): dict(zip(s["columns"], s["values"][0]))
        for s in minute["influx"].series(as_grafana(query_of(PATH, "Hops of the path (in-line)"), minute))
    }
    assert len(rows) == 3 + 2 + 4 * 2
    for (path, hop), row in rows.items():
        written = [h for h in minute["hops"] if h.path == path and str(h.hop) == hop]
        measured = [h for h in written if h.count is not None]
        if not measured:  # what Grafana shows as "not measured" (the panel's noValue)
            assert (path, hop) == (P1, "1")
            assert [row[c] for c in ("mean µs", "p99 µs (worst second)", "max µs", "packets", "measured")] == [None] * 5
            continue
        packets = sum(h.count for h in measured)
        assert row["packets"] == packets
        assert row["mean µs"] == pytest.approx(sum(h.sum_us for h in measured) / packets, rel=1e-12)
        assert row["p99 µs (worst second)"] == max(h.p99_us for h in measured)
        assert row["max µs"] == max(h.max_us for h in measured)
        assert row["measured"] == 1.0
    one = next(s for s in minute["influx"].series(as_grafana(query_of(PATH, "Hops of the path (in-line)"), minute))
               if s["tags"]["hop"] == "1")  # fmt: skip
    assert one["tags"] == {"path": P1, "hop": "1", "link": "R:2->S:1", "from_node": "R", "to_node": "S"}


def test_in_line_delay_next_to_stamp(minute):
    query = lambda ref: as_grafana(query_of(PATH, "In-line and STAMP one-way delay", ref), minute)  # noqa: E731
    mean = by_series(minute["influx"].series(query("A")), "path", "flow")
    want = weighted(((d.path, d.flow), d.t, d.count, d.count * d.mean_us) for d in minute["e2e"])
    assert set(mean) == set(want) == {(P1, "9"), (P1, "10"), (P2, "11")}
    for key in want:
        series_eq(mean[key], want[key])
    p99 = by_series(minute["influx"].series(query("B")), "path", "flow")
    for key in want:
        worst = defaultdict(float)
        for d in minute["e2e"]:
            if (d.path, d.flow) == key:
                worst[bucket(d.t)] = max(worst[bucket(d.t)], d.p99_us)
        series_eq(p99[key], dict(worst))
    stamp = by_series(minute["influx"].series(query("C")), "node", "ssid")
    series_eq(stamp[("A", "1")], {bucket(minute["t0"] + k * S): 2000.0 + k - k % 10 + 4.5 for k in range(0, 60, 10)})


def test_sequence_loss_and_reordering(minute):
    counts = minute["influx"].series(
        as_grafana(query_of(PATH, "Sampled packets lost, reordered, duplicated (in-line)"), minute)
    )
    got = {
        (s["tags"]["flow"], int(row[0])): dict(zip(s["columns"][1:], row[1:])) for s in counts for row in s["values"]
    }
    want: dict[tuple, dict[str, int]] = defaultdict(lambda: {"lost": 0, "reordered": 0, "duplicated": 0})
    for x in minute["loss"]:
        w = want[(x.flow, bucket(x.t))]
        w["lost"], w["reordered"], w["duplicated"] = (w["lost"] + x.lost, w["reordered"] + x.reordered,
                                                      w["duplicated"] + x.duplicated)  # fmt: skip
    assert got == dict(want)
    assert sum(v["lost"] for v in got.values()) == 6 * 2 + 1 and sum(v["reordered"] for v in got.values()) == 9 + 1

    ratio = by_series(minute["influx"].series(as_grafana(
        query_of(PATH, "In-line loss ratio of sampled packets, 1-minute window"), minute)), "path", "flow")  # fmt: skip
    for key in ((P1, "9"), (P1, "10"), (P2, "11")):
        per_minute: dict[int, list[int]] = defaultdict(lambda: [0, 0])
        for x in minute["loss"]:
            if (x.path, x.flow) == key:
                per_minute[bucket(x.t, 60)][0] += x.lost
                per_minute[bucket(x.t, 60)][1] += x.received + x.lost
        series_eq(ratio[key], {b: lost / sent for b, (lost, sent) in per_minute.items()})

    (total,) = [s for s in minute["influx"].series(as_grafana(
        query_of(PATH, "In-line flows on this path: sequence loss"), minute, path=P1, flow="9"))]  # fmt: skip
    row = dict(zip(total["columns"], total["values"][0]))
    nine = [x for x in minute["loss"] if x.flow == "9"]
    received, lost = sum(x.received for x in nine), sum(x.lost for x in nine)
    assert total["tags"] == {"path": P1, "flow": "9", "ingress": "A", "egress": "B"}
    assert (row["received"], row["lost"], row["reordered"], row["duplicated"]) == (received, 12, 9, 1)
    assert row["loss ratio"] == pytest.approx(lost / (received + lost))
    assert (row["loss bursts"], row["longest burst"]) == (6, 2)


def test_worst_links_by_delay(minute):
    """The overview's table: the 10 slowest of the 12 measured (link, path) pairs over the range,
    slowest first, packet-weighted, each with its path (X:2->B:2 is on two paths, a pair each: on
    P2 among the 10, on the other path one of the two fastest)."""
    (result,) = minute["influx"].series(as_grafana(query_of(OVERVIEW, "Worst links by delay (in-line)"), minute))
    rows = [dict(zip(result["columns"], v)) for v in result["values"]]
    pairs: dict[tuple, list[HopSecond]] = defaultdict(list)
    for h in minute["hops"]:
        if h.count is not None:
            pairs[(h.link, h.path)].append(h)
    assert len(pairs) == 12
    truth = sorted(
        ((sum(h.sum_us for h in hs) / sum(h.count for h in hs), link, path, max(h.p99_us for h in hs),
          sum(h.count for h in hs)) for (link, path), hs in pairs.items()),
        reverse=True,
    )[:10]  # fmt: skip
    assert [(r["link"], r["path"]) for r in rows] == [(link, path) for _, link, path, _, _ in truth]
    for r, (mean, _, _, p99, packets) in zip(rows, truth):
        assert r["mean µs"] == pytest.approx(mean, rel=1e-12)
        assert (r["p99 µs (worst second)"], r["packets"]) == (p99, packets)
    listed = [(r["link"], r["path"]) for r in rows]
    assert ("X:2->B:2", P2) in listed and ("X:2->B:2", "fc00:5::e,fc00:3::d6") not in listed


def test_path_and_flow_variables_find_the_in_line_flows(minute):
    var = {v["name"]: v["query"] for v in PATH["templating"]["list"] if v["type"] == "query"}

    def values(name: str, **chosen: str) -> set[str]:
        q = var[name]
        for k, v in chosen.items():
            q = q.replace(f"/^${k}$/", "/^" + re.escape(v) + "$/")
        return {row[1] for s in minute["influx"].series(q) for row in s["values"]}

    assert values("path") == {"fc00:2::e", P1, P2}  # STAMP's sender side (not the reflector's), in-line flows
    assert values("flow", path=P1) == {"7", "9", "10"}  # the altmark flow's rx side does not count
    assert values("flow", path=P2) == {"11"}


def test_report_shows_each_hop_of_each_path(minute, tmp_path):
    """segscope-report over the database, opened in headless Chromium: P1's per-hop table has the
    written numbers and hop 1 not measured; in the screenshot, P1's bars: the stacked bar's
    segments are as long as the hops' own bars, hop 0 : hop 2 as their means, the measured part
    of the stacked bar : the whole as (hop 0 + hop 2) : the end-to-end delay, and an empty row
    where hop 1 is. The link delay alert of P2's slow first link is listed."""
    out = tmp_path / "report.html"
    env = {**os.environ, "SEGSCOPE_INFLUX_URL": minute["stack"].influx_url}
    r = subprocess.run([sys.executable, "-m", "dashboards.report", "--since", "10m", "--db", minute["influx"].db,
                        "--out", str(out), "--json"], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    fig = json.loads(out.with_suffix(".json").read_text())
    one = fig["inline_paths"][P1]
    assert [h["hop"] for h in one["hops"]] == ["0", "1", "2"] and one["hops"][1]["mean"] is None
    p1_hops = [h for h in minute["hops"] if h.path == P1 and h.count is not None]
    mean = {hop: sum(h.sum_us for h in p1_hops if h.hop == hop) / sum(h.count for h in p1_hops if h.hop == hop)
            for hop in (0, 2)}  # fmt: skip
    p1_e2e = [d for d in minute["e2e"] if d.path == P1]
    e2e = sum(d.count * d.mean_us for d in p1_e2e) / sum(d.count for d in p1_e2e)
    assert one["hops"][0]["mean"] == pytest.approx(mean[0]) and one["hops"][2]["mean"] == pytest.approx(mean[2])
    assert one["end_to_end"]["mean"] == pytest.approx(e2e)

    dom = browser.dom(out, tmp_path / "chromium-dom")
    section = dom[dom.index("<h2>Delay per hop (in-line measurement of real traffic)</h2>") :]
    p1_section = section[section.index(f"<h3>path {P1}") : section.index(f"<h3>path {P2}")]
    assert f"end to end {e2e:,.1f} µs over {sum(d.count for d in p1_e2e):,} sampled packets" in p1_section
    assert "lost 13 of " in p1_section and "reordered 9" in p1_section
    not_measured = '<td colspan="4" class="l not-measured">not measured</td><td>0%</td>'
    assert f'<td>1</td><td class="l">R:2-&gt;S:1</td><td class="l">R → S</td>{not_measured}' in p1_section
    assert f"<td>0</td><td class=\"l\">A:1-&gt;R:1</td><td class=\"l\">A → R</td><td>{mean[0]:,.1f}</td>" in p1_section
    assert f"<td>2</td><td class=\"l\">S:2-&gt;B:1</td><td class=\"l\">S → B</td><td>{mean[2]:,.1f}</td>" in p1_section
    assert "Link delay above objective" in dom and f"link A:3-&gt;X:1 on path {P2}: mean delay" in dom

    img = browser.screenshot(out, tmp_path / "report.png", tmp_path / "chromium-png", (1100, 3200))
    (REPO / ".run").is_dir() and img.save(REPO / ".run" / "noc-report-inline.png")
    assert browser.not_blank(img)
    rows = browser.bands(img, list(HOP_COLOURS))
    stacked, hop0, hop2 = rows[:3]  # P1 comes first; its hop 1 row has no colour
    pitch = hop0[0] - stacked[0]
    assert hop2[0] - hop0[0] == 2 * pitch, rows[:4]  # the empty row of hop 1 in between
    mid = lambda band: (band[0] + band[1]) // 2  # noqa: E731
    (seg0,), (seg2,) = browser.runs(img, mid(stacked), HOP_COLOURS[0]), browser.runs(img, mid(stacked), HOP_COLOURS[2])
    (bar0,), (bar2,) = browser.runs(img, mid(hop0), HOP_COLOURS[0]), browser.runs(img, mid(hop2), HOP_COLOURS[2])
    assert seg0[1] == bar0[1] and seg2[1] == bar2[1] and seg2[0] == seg0[0] + seg0[1]
    assert bar0[1] / bar2[1] == pytest.approx(mean[0] / mean[2], rel=0.02)
    rest = browser.runs(img, mid(stacked), "#eeeeee")  # the part of the end-to-end no measured hop explains
    whole = max(x + w for x, w in rest) + 1 - seg0[0]  # up to the dashed outline's right edge
    assert (bar0[1] + bar2[1]) / whole == pytest.approx((mean[0] + mean[2]) / e2e, rel=0.02)


def test_report_shows_a_span_over_hops_not_measured(stack, tmp_path):
    """Where transit nodes add no IOAM entry, the processor writes the span it can measure from the
    node before them to the node after (`hop=<first>-<last>`, schemas/metrics.md) beside the hops
    not measured: the report lists it in path order with its own numbers, between hop 0 and hop 3."""
    name = f"inline_span_{uuid.uuid4().hex[:10]}"
    stack.influx_query(f'CREATE DATABASE "{name}"')
    influx = Influx(stack.influx_url, name)
    t0 = time.time_ns() // S * S - 30 * S
    path = "fc00:7::e,fc00:3::d6"
    hops = [("0", "A:1->R:1", 400.0), ("1", "R:2->S:1", None), ("2", "S:2->T:1", None), ("1-2", "R:2->T:1", 900.0),
            ("3", "T:2->B:1", 250.0)]  # fmt: skip
    lines = []
    for k in range(20):
        for hop, link, mean in hops:
            a, a_if, b, b_if = ends(link)
            series = (f"inline_hop_delay,flow=21,path={tag(path)},hop={hop},link={link},from_node={a},to_node={b},"
                      f"from_if={a_if},to_if={b_if}")  # fmt: skip
            fields = ("measured=false,unmeasured=10i" if mean is None else f"count=10i,sum_us={10 * mean},"
                      f"mean_us={mean},p99_us={mean + 30},max_us={mean + 40},measured=true")  # fmt: skip
            lines.append(f"{series} {fields} {t0 + k * S}")
    write(influx, lines)
    out = tmp_path / "report.html"
    env = {**os.environ, "SEGSCOPE_INFLUX_URL": stack.influx_url}
    r = subprocess.run([sys.executable, "-m", "dashboards.report", "--since", "10m", "--db", name, "--out", str(out),
                        "--json"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    shown = json.loads(out.with_suffix(".json").read_text())["inline_paths"][path]["hops"]
    assert [h["hop"] for h in shown] == ["0", "1", "1-2", "2", "3"]
    span = shown[2]
    assert (span["from_node"], span["to_node"], span["packets"]) == ("R", "T", 200)
    assert span["mean"] == pytest.approx(900.0)
    assert [h["mean"] is None for h in shown] == [False, True, False, True, False]
    dom = browser.dom(out, tmp_path / "chromium-dom")
    numbers = "<td>900</td><td>930</td><td>940</td><td>200</td>"
    assert f'<td>1-2</td><td class="l">R:2-&gt;T:1</td><td class="l">R → T</td>{numbers}' in dom
