"""segscope's alert rules, as code: the Grafana alerting provisioning file
dashboards/provisioning/alerting/segscope.yaml is generated from RULES (dashboards/generate.py),
and `evaluate()` runs a rule the way Grafana's alerting engine does (query over the rule's
relative time range, reduce each series, threshold, pending for `for`, then firing) against any
InfluxDB: the tests prove each rule fires and stays silent where it must, and `segscope-report`
lists what fires now.

Objectives: every STAMP session gets DEFAULT_ONE_WAY_DELAY_US; dashboards/objectives.yaml
names stricter ones per path (sender node + ssid), each its own rule. Every link measured in-line
(IOAM, `inline_hop_delay`) gets DEFAULT_LINK_DELAY_US; objectives.yaml names other ones per link,
each its own rule (and the default rule leaves those links to it).

The provisioning file is built with grafana-foundation-sdk's alert rule builders (query A is an
InfluxQL query, dashboards/influxdb.py; B and C are the SDK's reduce and threshold expressions)
and written in Grafana's file layout (dashboards/alerting_file.py).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

import yaml
from grafana_foundation_sdk.builders import alerting as alerting_sdk
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import alerting as alerting_model

with warnings.catch_warnings():
    # the expressions' module loads the SDK's v2 dashboard models, which warn on import
    warnings.simplefilter("ignore", DeprecationWarning)
    from grafana_foundation_sdk.builders import expr

from dashboards import alerting_file, influxdb

HERE = Path(__file__).resolve().parent
DATASOURCE_UID = "segscope-influxdb"
DEFAULT_ONE_WAY_DELAY_US = 10_000
DEFAULT_LINK_DELAY_US = 5_000
LOSS_RATIO_CRITICAL = 0.01
INCOMPLETE_BLOCKS_RUN = 5  # a flow starting and stopping makes up to 3 (partial_block, missing_*)
LAG_MESSAGES = 10_000
ERROR_ESTIMATE_US = 1_000.0


Reducer = Literal["last", "mean", "sum", "max", "min", "count"]  # Grafana's reduce expression
Comparison = Literal["gt", "lt"]  # of Grafana's threshold expression, the two the rules use


@dataclass
class Rule:
    uid: str
    title: str
    query: str  # InfluxQL with $timeFilter (and $__interval)
    reducer: Reducer
    op: Comparison
    threshold: float
    window_s: int  # relativeTimeRange.from
    for_s: int
    severity: str
    summary: str  # {{ $labels.x }} and {{ $values.B }} as Grafana templates them
    description: str
    interval_ms: int = 10_000
    labels: dict = field(default_factory=dict)


def delay_rule(uid: str, title: str, objective_us: float, where: str = "", severity: str = "warning") -> Rule:
    return Rule(
        uid=uid,
        title=title,
        query='SELECT mean("mean_us") FROM "stamp_delay" WHERE "direction" != \'round_trip\' '
        f'{where}AND $timeFilter GROUP BY time(10s), "node", "ssid", "direction" fill(none)',
        reducer="mean",
        op="gt",
        threshold=objective_us,
        window_s=60,
        for_s=60,
        severity=severity,
        summary="{{ $labels.direction }} delay of session {{ $labels.node }}/{{ $labels.ssid }} is "
        "{{ humanize $values.B.Value }} us, objective " + f"{objective_us:g} us",
        description="Mean one-way delay over the last minute is above the path's objective. Check the "
        "path dashboard for when it started and whether loss rose with it (congestion) or the "
        "path changed (a new SID list, a reroute); the round trip tells whether both directions "
        "moved. One-way values need synchronised clocks (see the clock alert).",
    )


def _objectives_file() -> dict:
    path = HERE / "objectives.yaml"
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


def objectives() -> list[dict]:
    """Per-path one-way delay objectives: [{node, ssid, one_way_delay_us, severity}]."""
    return _objectives_file().get("paths", [])


def link_objectives() -> list[dict]:
    """Per-link delay objectives: [{link, delay_us, severity}], link as inline_hop_delay names it."""
    return _objectives_file().get("links", [])


def influxql_string(value: str) -> str:
    """A string literal in InfluxQL."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def link_rule_uid(link: str) -> str:
    """segscope-link-<link as a slug>; Grafana's uids have at most 40 characters, so a long link
    keeps the start of its slug and gets a hash of the whole link."""
    slug = re.sub(r"[^a-z0-9]+", "-", link.lower()).strip("-")
    uid = f"segscope-link-{slug}"
    if len(uid) <= 40:
        return uid
    return f"segscope-link-{slug[:17].rstrip('-')}-{hashlib.sha1(link.encode()).hexdigest()[:8]}"


def link_delay_rule(uid: str, title: str, objective_us: float, where: str = "", severity: str = "warning") -> Rule:
    """Mean delay of the sampled real packets on a link (IOAM, one hop of a path) over the last
    minute, packet-weighted (sum of delays / packets), per link and path."""
    return Rule(
        uid=uid,
        title=title,
        query='SELECT sum("sum_us") / sum("count") FROM "inline_hop_delay" WHERE "measured" = true '
        f'{where}AND $timeFilter GROUP BY "link", "path"',
        reducer="last",
        op="gt",
        threshold=objective_us,
        window_s=60,
        for_s=60,
        severity=severity,
        summary="link {{ $labels.link }} on path {{ $labels.path }}: mean delay {{ humanize $values.B.Value }} us "
        "over the last minute, objective " + f"{objective_us:g} us",
        description="Sampled real packets (in-line IOAM measurement) took longer than the link's objective "
        "between these two nodes. The path dashboard's per-hop chart shows when it started and whether "
        "the path's other links moved with it (a queue or a reroute under this link) or only this one "
        "(also a clock step at one of its two nodes: per-hop delays need both clocks synchronized). The "
        "overview lists the worst links; a hop shown as not measured has no IOAM entry from its node.",
    )


def rules() -> list[Rule]:
    out = [delay_rule("segscope-delay-default", "One-way delay above objective", DEFAULT_ONE_WAY_DELAY_US)]
    for o in objectives():
        node, ssid = str(o["node"]), str(o["ssid"])
        out.append(
            delay_rule(
                f"segscope-delay-{node}-{ssid}".lower(),
                f"One-way delay above objective ({node}/{ssid})",
                float(o["one_way_delay_us"]),
                where=f"AND \"node\" = '{node}' AND \"ssid\" = '{ssid}' ",
                severity=o.get("severity", "critical"),
            )
        )
    linked = [str(o["link"]) for o in link_objectives()]
    out.append(
        link_delay_rule(
            "segscope-link-delay-default",
            "Link delay above objective",
            DEFAULT_LINK_DELAY_US,
            # a link with its own objective is its own rule's business
            where="".join(f'AND "link" != {influxql_string(link)} ' for link in linked),
        )
    )
    for o in link_objectives():
        link = str(o["link"])
        out.append(
            link_delay_rule(
                link_rule_uid(link),
                f"Link delay above objective ({link})",
                float(o["delay_us"]),
                where=f'AND "link" = {influxql_string(link)} ',
                severity=o.get("severity", "critical"),
            )
        )
    out += [
        Rule(
            uid="segscope-loss-any",
            title="Packet loss on a flow",
            query='SELECT sum("lost") FROM "altmark_loss" WHERE "complete" = true AND $timeFilter '
            'GROUP BY "flow", "tx_node", "rx_node"',
            reducer="last",
            op="gt",
            threshold=0,
            window_s=60,
            for_s=0,
            severity="warning",
            summary="flow {{ $labels.flow }} ({{ $labels.tx_node }} -> {{ $labels.rx_node }}) lost "
            "{{ $values.B.Value }} packets in the last minute",
            description="Exact alternate-marking loss: packets coloured at the ingress edge that never "
            "reached the egress edge. Look at the path dashboard's lost-per-block panel: steady loss "
            "points at a link or a queue, bursts at a flap or a reroute.",
        ),
        Rule(
            uid="segscope-loss-ratio",
            title="Loss ratio above threshold",
            query='SELECT sum("lost") / sum("tx_packets") FROM "altmark_loss" WHERE "complete" = true AND '
            '$timeFilter GROUP BY "flow", "tx_node", "rx_node"',
            reducer="last",
            op="gt",
            threshold=LOSS_RATIO_CRITICAL,
            window_s=300,
            for_s=60,
            severity="critical",
            summary="flow {{ $labels.flow }} loses {{ humanizePercentage $values.B.Value }} of its packets "
            f"(threshold {LOSS_RATIO_CRITICAL:.0%}, 5 minutes)",
            description="Sustained loss above the threshold on an SRv6 path: customer traffic is being "
            "dropped. Find the lossy segment with the node dashboards (device drops) and the topology.",
        ),
        Rule(
            uid="segscope-incomplete-blocks",
            title="Loss blocks incomplete",
            query='SELECT count("reason") FROM "altmark_loss" WHERE "complete" = false AND $timeFilter GROUP BY "flow"',
            reducer="last",
            op="gt",
            threshold=INCOMPLETE_BLOCKS_RUN - 1,
            window_s=300,
            for_s=0,
            severity="warning",
            summary="flow {{ $labels.flow }}: {{ $values.B.Value }} blocks without an exact loss number in 5 minutes",
            description="The path dashboard lists each block's reason. missing_rx/missing_tx: an edge's "
            "agent or collector is down or cannot reach "
            "Kafka; agent_restart/partial_block: a restart; conflicting_*: two nodes claim one side. "
            "Loss is not measured while this lasts.",
        ),
        Rule(
            uid="segscope-session-silent",
            title="STAMP session silent",
            query='SELECT count("count") FROM "stamp_delay" WHERE "direction" = \'round_trip\' AND $timeFilter '
            'GROUP BY time(30s), "node", "ssid" fill(0)',
            reducer="last",
            op="lt",
            threshold=1,
            window_s=600,
            for_s=60,
            severity="critical",
            summary="STAMP session {{ $labels.node }}/{{ $labels.ssid }} produced no result for 30 s",
            description="A session that measured in the last 10 minutes has gone quiet: the path may be "
            "broken (test packets or replies lost), the reflector gone, or the pipeline stalled (see "
            "the pipeline alert). A session stopped on purpose also ends here: silence it.",
        ),
        Rule(
            uid="segscope-clock-unsynchronized",
            title="Clock not synchronized",
            query='SELECT max("unsynchronized") FROM "stamp_delay" WHERE "direction" = \'round_trip\' AND '
            '$timeFilter GROUP BY "node", "ssid"',
            reducer="last",
            op="gt",
            threshold=0,
            window_s=120,
            for_s=60,
            severity="warning",
            summary="session {{ $labels.node }}/{{ $labels.ssid }}: a clock is not synchronized (S bit clear "
            "in {{ $values.B.Value }} test packets of one second)",
            description="The sender's or the reflector's STAMP Error Estimate says its clock is not "
            "synchronized (RFC 8762 S bit): one-way delays of this path are meaningless, the round "
            "trip is still right. Check PTP/NTP (chrony, ptp4l) on the two nodes.",
        ),
        Rule(
            uid="segscope-clock-error",
            title="Timestamp error estimate large",
            query='SELECT max("error_estimate_max_us") FROM "stamp_delay" WHERE "direction" = \'round_trip\' AND '
            '$timeFilter GROUP BY "node", "ssid"',
            reducer="max",
            op="gt",
            threshold=ERROR_ESTIMATE_US,
            window_s=120,
            for_s=60,
            severity="warning",
            summary="session {{ $labels.node }}/{{ $labels.ssid }}: one-way delays may be off by up to "
            "{{ $values.B.Value }} us (sender + reflector Error Estimate)",
            description="The clocks are synchronized but loosely: a one-way delay can be wrong by this "
            f"much (threshold {ERROR_ESTIMATE_US:g} us). Compare with the round trip, improve the time "
            "source (PTP with hardware timestamps) before trusting one-way objectives.",
        ),
        Rule(
            uid="segscope-pipeline-lag",
            title="Pipeline lagging",
            query='SELECT max("lag_messages") FROM "segscope_consumer" WHERE $timeFilter '
            'GROUP BY "processor", "topic", "partition"',
            reducer="last",
            op="gt",
            threshold=LAG_MESSAGES,
            window_s=120,
            for_s=120,
            severity="warning",
            summary="{{ $labels.processor }} processor is {{ $values.B.Value }} messages behind on "
            "{{ $labels.topic }}[{{ $labels.partition }}]",
            description="Results reach InfluxDB late. Add processor replicas (up to the topic's "
            "partitions) or look for a slow InfluxDB/Kafka.",
        ),
        Rule(
            uid="segscope-steering-no-candidate",
            title="Steering: no candidate meets the objective",
            query='SELECT max("alert") FROM "steering_policy" WHERE $timeFilter '
            'GROUP BY time(10s), "node", "policy" fill(none)',
            reducer="last",
            op="gt",
            threshold=0,
            window_s=60,
            for_s=30,
            severity="critical",
            summary="policy {{ $labels.policy }} on {{ $labels.node }}: no candidate path meets its objective, "
            "or none is measured",
            description="segscope-steer cannot find a path for this policy within the objective's limits, "
            "or no candidate's probe has fresh measurements (a stopped delay processor, probes that "
            "stopped): it does not move traffic. `controller status` shows the policy's state and text.",
        ),
        Rule(
            uid="segscope-pipeline-stalled",
            title="Processor stalled",
            query='SELECT count("records_in") FROM "segscope_processor" WHERE $timeFilter '
            'GROUP BY time(30s), "processor" fill(0)',
            reducer="last",
            op="lt",
            threshold=1,
            window_s=600,
            for_s=60,
            severity="critical",
            summary="the {{ $labels.processor }} processor has not reported for 30 s",
            description="Processors publish their counters every second while they run: this one is down "
            "or cannot reach Kafka. Nothing new reaches InfluxDB from it.",
        ),
        Rule(
            uid="segscope-dead-letters",
            title="Dead letters growing",
            # per worker process: N workers' counters are separate series (instance tag)
            query='SELECT spread("malformed_batches") FROM "segscope_processor" WHERE $timeFilter '
            'GROUP BY "processor", "instance"',
            reducer="last",
            op="gt",
            threshold=0,
            window_s=300,
            for_s=0,
            severity="warning",
            summary="{{ $labels.processor }} processor ({{ $labels.instance }}) dead-lettered "
            "{{ $values.B.Value }} malformed batches in 5 minutes",
            description="Records that could not be decoded went to segscope.deadletter with the reason: "
            "read the topic (a producer with another version, a corrupted message).",
        ),
    ]
    return out


# --------------------------------------------------------------------------- provisioning file
def to_grafana(rule: Rule) -> alerting_sdk.Rule:
    """The rule as Grafana alerting runs it: query A (InfluxQL over the rule's window), B reduces
    each series to one number, C compares it with the threshold; firing after `for`."""
    query = (
        influxdb.InfluxQLQuery()
        .ref_id("A")
        .query(rule.query)
        .result_format(influxdb.ResultFormat.TIME_SERIES)
        .interval_ms(rule.interval_ms)
        .max_data_points(43200)
    )
    reduce_each = (
        expr.TypeReduce()
        .ref_id("B")
        .expression("A")
        .reducer(rule.reducer)
        .settings(expr.ExprTypeReduceSettings().mode("dropNN"))  # empty seconds are no evidence
    )
    threshold = (
        expr.TypeThreshold()
        .ref_id("C")
        .expression("B")
        .conditions(
            [expr.ExprTypeThresholdConditions().evaluator(
                expr.ExprTypeThresholdConditionsEvaluator().type(rule.op).params([float(rule.threshold)]))]
        )
    )  # fmt: skip
    return (
        alerting_sdk.Rule(rule.title)
        .uid(rule.uid)
        .condition("C")
        .queries(
            [
                alerting_sdk.Query("A")
                .relative_time_range(alerting_model.RelativeTimeRange(from_val=rule.window_s, to=0))
                .datasource_uid(DATASOURCE_UID)
                .model(query),
                alerting_sdk.Query("B").datasource_uid("__expr__").model(reduce_each),
                alerting_sdk.Query("C").datasource_uid("__expr__").model(threshold),
            ]
        )
        .no_data_state("OK")  # a series that is gone is not an alert (silence: its own rule)
        .exec_err_state("Error")
        .for_val(f"{rule.for_s}s")
        .annotations({"summary": rule.summary, "description": rule.description})
        .labels({"severity": rule.severity, "team": "noc", **rule.labels})
        .is_paused(False)
    )


def provisioning() -> alerting_file.AlertingFile:
    group = alerting_file.RuleGroup("segscope").org_id(1).folder("segscope").interval("30s")
    for rule in rules():
        group = group.with_rule(to_grafana(rule))
    return alerting_file.AlertingFile().with_group(group)


def provisioning_yaml() -> str:
    doc = json.loads(json.dumps(provisioning().build(), cls=JSONEncoder))
    head = (
        "# GENERATED by `python -m dashboards.generate` from dashboards/alerts.py: edit that, then regenerate.\n"
        "# Grafana alerting provisioning (provisioning/alerting/): query A, reduce B, threshold C, for.\n"
    )
    return head + yaml.safe_dump(doc, sort_keys=False, width=120, allow_unicode=True)


# --------------------------------------------------------------------------- evaluation
QueryFn = Callable[[str], list[dict]]  # InfluxQL -> [{"tags": {...}, "values": [[t_ns, v], ...]}]


def expand(query: str, start_ns: int, end_ns: int, interval_ms: int) -> str:
    """Grafana's InfluxQL macros for an absolute range."""
    return query.replace("$timeFilter", f"time >= {start_ns} AND time <= {end_ns}").replace(
        "$__interval", f"{max(interval_ms, 1)}ms"
    )


def reduce(values: list, reducer: str) -> float | None:
    nums = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if reducer == "count":
        return float(len(nums))
    if not nums:
        return None
    return {
        "last": lambda: nums[-1],
        "mean": lambda: sum(nums) / len(nums),
        "sum": lambda: sum(nums),
        "max": lambda: max(nums),
        "min": lambda: min(nums),
    }[reducer]()


def crosses(value: float, op: str, threshold: float) -> bool:
    return value > threshold if op == "gt" else value < threshold


@dataclass
class Instance:
    labels: dict
    value: float | None
    condition: bool


def evaluate_once(rule: Rule, query: QueryFn, at_ns: int) -> list[Instance]:
    """One evaluation at time `at_ns`: one instance per series (label set) the query returns."""
    q = expand(rule.query, at_ns - rule.window_s * 10**9, at_ns, rule.interval_ms)
    out = []
    for series in query(q):
        v = reduce([row[1] for row in series["values"]], rule.reducer)
        out.append(Instance(dict(series["tags"]), v, v is not None and crosses(v, rule.op, rule.threshold)))
    return out


def evaluate(rule: Rule, query: QueryFn, times_ns: list[int]) -> dict[tuple, str]:
    """Evaluate at successive times (ascending, one rule interval apart) with Grafana's state
    machine: a series whose condition holds becomes Pending, and Alerting once it has held for
    `for`; a series whose condition fails (or that is gone: noDataState OK) is Normal.
    Returns {labels as a sorted tuple: state} after the last evaluation."""
    since: dict[tuple, int] = {}
    state: dict[tuple, str] = {}
    for at in times_ns:
        seen = set()
        for inst in evaluate_once(rule, query, at):
            key = tuple(sorted(inst.labels.items()))
            seen.add(key)
            if inst.condition:
                since.setdefault(key, at)
                state[key] = "Alerting" if at - since[key] >= rule.for_s * 10**9 else "Pending"
            else:
                since.pop(key, None)
                state[key] = "Normal"
        for key in set(state) - seen:
            since.pop(key, None)
            state[key] = "Normal"
    return state


def render_summary(rule: Rule, labels: dict, value: float | None) -> str:
    """The rule's summary with Grafana's {{ $labels.x }} / {{ $values.B.Value }} filled in."""

    def val(_m=None) -> str:
        if value is None:
            return "?"
        if "humanizePercentage" in (_m.group(0) if _m else ""):
            return f"{value:.2%}"
        return f"{value:.6g}"

    text = re.sub(r"\{\{\s*humanizePercentage \$values\.B\.Value\s*\}\}", val, rule.summary)
    text = re.sub(r"\{\{\s*(humanize )?\$values\.B\.Value\s*\}\}", lambda m: val(), text)
    return re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", lambda m: str(labels.get(m.group(1), "")), text)
