"""segscope's Grafana dashboards and alert rules, as code, built with grafana-foundation-sdk's
typed builders (dashboards, panels, variables, links; alert rules in dashboards/alerts.py) and
InfluxQL queries (dashboards/influxdb.py, the SDK has no InfluxDB query). Writes:

    dashboards/overview.json    worst paths by delay, jitter and loss now; silent sessions; nodes;
                                worst links by in-line delay
    dashboards/path.json        one path: delay both ways, round trip, percentiles, jitter, loss per
                                block and per window, D-mark delay, incomplete blocks; in-line
                                measurement of real traffic: delay per hop stacked, end to end next
                                to STAMP, sequence loss and reordering
    dashboards/node.json        one node: datapath counters (every outcome and drop), reflector TX
    dashboards/pipeline.json    records per stage, consumer lag, dead letters, drops by reason
    dashboards/provisioning/alerting/segscope.yaml   the alert rules (dashboards/alerts.py)

    .local/venv/bin/python -m dashboards.generate [--check]

--check writes nothing and exits 1 when a committed file differs from what this code makes (the
tests run it, so the JSON never drifts from its source). Measurements and fields:
schemas/metrics.md. Every query is run against a real InfluxDB by tests/e2e/test_noc_view.py and
tests/noc/test_inline_view.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Callable, Union

from grafana_foundation_sdk.builders import common as common_sdk
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common

with warnings.catch_warnings():
    # The SDK asks for its v2 dashboard; Grafana's file provisioning (dashboards/provisioning/
    # dashboards) loads the classic dashboard JSON these builders write, which Grafana 12 serves.
    warnings.simplefilter("ignore", DeprecationWarning)
    from grafana_foundation_sdk.builders import bargauge, table, timeseries
    from grafana_foundation_sdk.builders import dashboard as dashboard_sdk
    from grafana_foundation_sdk.models import dashboard as dashboard_model

from dashboards import alerts, influxdb
from segscope_schemas.generated import write_or_check

HERE = Path(__file__).resolve().parent

DATASOURCE = common.DataSourceRef(type_val="influxdb", uid="${datasource}")
DEFAULT_DATASOURCE_UID = "segscope-influxdb"

SESSION = '"node" =~ /^$node$/ AND "ssid" =~ /^$ssid$/'
DIRECTION = '"direction" =~ /^$direction$/'
FLOW = '"flow" =~ /^$flow$/'
NODE = '"node" =~ /^$node$/'
PATH = '"path" =~ /^$path$/'
INLINE = f"{PATH} AND {FLOW}"  # in-line measurement: per flow, on the chosen SID lists
SENDER = '"role" = \'sender\''
T = "$timeFilter"

PanelBuilder = Union[timeseries.Panel, bargauge.Panel, table.Panel]
LayoutItem = Union[dashboard_sdk.Row, PanelBuilder]


# --------------------------------------------------------------------------- building blocks
def influxql(ref: str, query: str, alias: str = "",
             fmt: influxdb.ResultFormat = influxdb.ResultFormat.TIME_SERIES) -> influxdb.InfluxQLQuery:  # fmt: skip
    q = influxdb.InfluxQLQuery().ref_id(ref).datasource(DATASOURCE).query(query).result_format(fmt)
    return q.alias(alias) if alias else q


def table_query(ref: str, query: str) -> influxdb.InfluxQLQuery:
    return influxql(ref, query, fmt=influxdb.ResultFormat.TABLE)


def thresholds(*steps: tuple[float | None, str]) -> dashboard_sdk.ThresholdsConfig:
    """thresholds((None, "green"), (5000, "orange"), (10000, "red"))"""
    return (
        dashboard_sdk.ThresholdsConfig()
        .mode(dashboard_model.ThresholdsMode.ABSOLUTE)
        .steps([dashboard_model.Threshold(value=v, color=c) for v, c in steps])
    )


def by_thresholds() -> dashboard_sdk.FieldColor:
    return dashboard_sdk.FieldColor().mode(dashboard_model.FieldColorModeId.THRESHOLDS)


def delay_steps() -> dashboard_sdk.ThresholdsConfig:
    return thresholds((None, "green"), (alerts.DEFAULT_ONE_WAY_DELAY_US, "red"))


def link_delay_steps() -> dashboard_sdk.ThresholdsConfig:
    return thresholds((None, "green"), (alerts.DEFAULT_LINK_DELAY_US, "red"))


def loss_steps() -> dashboard_sdk.ThresholdsConfig:
    return thresholds((None, "green"), (1e-9, "orange"), (alerts.LOSS_RATIO_CRITICAL, "red"))


class LinkAbovePanels(dashboard_model.DashboardLink):
    """A link without `placement`, where Grafana shows it: above the panels (dashboard links) or
    in the data link menu (field links). The SDK's DashboardLink fixes placement to
    "inControlsMenu" (grafana/grafana-foundation-sdk#1272), which Grafana 12.3 does not render
    for a link of type dashboards."""

    def to_json(self) -> dict[str, object]:
        payload = super().to_json()
        payload.pop("placement", None)
        return payload


class Link(dashboard_sdk.DashboardLink):
    def __init__(self, title: str) -> None:
        super().__init__(title)
        self._internal = LinkAbovePanels(title=title)


DataLinks = list[cogbuilder.Builder[dashboard_model.DashboardLink]]


def to_path(labels: str) -> DataLinks:
    url = f"/d/segscope-path/segscope-path?${{__url_time_range}}&var-datasource=${{datasource}}&{labels}"
    return [Link("open this path").url(url)]


def session_link() -> DataLinks:
    return to_path("var-node=${__field.labels.node}&var-ssid=${__field.labels.ssid}")


def flow_link() -> DataLinks:
    return to_path("var-flow=${__field.labels.flow}")


def node_link() -> DataLinks:
    url = (
        "/d/segscope-node/segscope-node?${__url_time_range}&var-datasource=${datasource}"
        "&var-node=${__field.labels.node}"
    )
    return [Link("open this node").url(url)]


def series(title: str, unit: str, *targets: influxdb.InfluxQLQuery, width: int = 12, height: int = 8,
           description: str = "") -> timeseries.Panel:  # fmt: skip
    """A time series panel: legend as a table with mean, max and last; tooltip with every series."""
    panel = (
        timeseries.Panel()
        .title(title)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(height)
        .legend(
            common_sdk.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["mean", "max", "lastNotNull"])
        )
        .tooltip(common_sdk.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI).sort(common.SortOrder.DESCENDING))
    )
    for target in targets:
        panel = panel.with_target(target)
    return panel.description(description) if description else panel


def with_limit_line(panel: timeseries.Panel, steps: dashboard_sdk.ThresholdsConfig) -> timeseries.Panel:
    """Thresholds drawn as lines; the series keep their own colours."""
    return panel.thresholds(steps).thresholds_style(
        common_sdk.GraphThresholdsStyleConfig().mode(common.GraphThresholdsStyleMode.LINE)
    )


def bars(panel: timeseries.Panel) -> timeseries.Panel:
    return panel.draw_style(common.GraphDrawStyle.BARS).fill_opacity(60)


def points(panel: timeseries.Panel) -> timeseries.Panel:
    return panel.draw_style(common.GraphDrawStyle.POINTS).fill_opacity(0)


def worst(title: str, unit: str, target: influxdb.InfluxQLQuery, description: str) -> bargauge.Panel:
    """A horizontal bar per series, its last value: the overview's worst-of lists."""
    return (
        bargauge.Panel()
        .title(title)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(8)
        .height(9)
        .orientation(common.VizOrientation.HORIZONTAL)
        .reduce_options(common_sdk.ReduceDataOptions().calcs(["lastNotNull"]).values(False).fields(""))
        .with_target(target)
        .description(description)
    )


def rows_of(title: str, *targets: influxdb.InfluxQLQuery, width: int = 8, height: int = 8,
            description: str = "") -> table.Panel:  # fmt: skip
    panel = table.Panel().title(title).datasource(DATASOURCE).span(width).height(height).show_header(True)
    for target in targets:
        panel = panel.with_target(target)
    return panel.description(description) if description else panel


def without_time_column() -> dashboard_model.DataTransformerConfig:
    """An aggregate over the whole range has one time, the range's start: not worth a column."""
    return dashboard_model.DataTransformerConfig(id_val="organize", options={"excludeByName": {"Time": True}})


def query_variable(name: str, label: str, query: str, multi: bool = True) -> dashboard_sdk.QueryVariable:
    variable = (
        dashboard_sdk.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(query)
        # on time range change: new sessions and flows appear by themselves
        .refresh(dashboard_model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .include_all(multi)
        .multi(multi)
        .sort(dashboard_model.VariableSort.NUMERICAL_ASC)
    )
    return variable.current(dashboard_model.VariableOption(text="All", value="$__all")) if multi else variable


def custom_variable(name: str, label: str, values: list[str]) -> dashboard_sdk.CustomVariable:
    return (
        dashboard_sdk.CustomVariable(name)
        .label(label)
        .values(",".join(values))
        .include_all(True)
        .multi(True)
        .current(dashboard_model.VariableOption(text="All", value="$__all"))
        .options([dashboard_model.VariableOption(text=v, value=v, selected=False) for v in values])
    )


def datasource_variable() -> dashboard_sdk.DatasourceVariable:
    return (
        dashboard_sdk.DatasourceVariable("datasource")
        .label("InfluxDB")
        .type("influxdb")
        .current(dashboard_model.VariableOption(text=DEFAULT_DATASOURCE_UID, value=DEFAULT_DATASOURCE_UID))
        .hide(dashboard_model.VariableHide.DONT_HIDE)
    )


VariableBuilder = Union[dashboard_sdk.QueryVariable, dashboard_sdk.CustomVariable]


def dashboard(uid: str, title: str, description: str, variables: list[VariableBuilder],
              layout: list[LayoutItem],
              annotations: tuple[dashboard_sdk.AnnotationQuery, ...] = ()) -> dashboard_sdk.Dashboard:  # fmt: skip
    """layout: panels and rows, placed left to right on Grafana's 24 columns; a panel that does
    not fit on the line starts the next one, a row always does."""
    dash = (
        dashboard_sdk.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["segscope", "srv6"])
        .editable()
        .refresh("10s")
        .time("now-1h", "now")
        .version(1)
        .link(
            Link("segscope")
            .type(dashboard_model.DashboardLinkType.DASHBOARDS)
            .tags(["segscope"])
            .as_dropdown(False)
            .include_vars(True)
            .keep_time(True)
        )
        # Grafana's own annotations (alert state changes, annotations made by hand), as Grafana writes
        # them; without them the SDK writes an annotation container with no list
        .annotation(
            dashboard_sdk.AnnotationQuery()
            .name("Annotations & Alerts")
            .datasource(common.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
            .built_in(1)
            .type("dashboard")
            .enable(True)
            .hide(True)
            .icon_color("rgba(0, 211, 255, 1)")
        )
        .with_variable(datasource_variable())
    )
    for annotation in annotations:
        dash = dash.annotation(annotation)
    for variable in variables:
        dash = dash.with_variable(variable)
    x = y = line_h = 0
    for panel_id, item in enumerate(layout, start=1):
        if isinstance(item, dashboard_sdk.Row):
            y, x, line_h = y + line_h, 0, 0
            dash = dash.with_row(item.id(panel_id).grid_pos(dashboard_model.GridPos(h=1, w=24, x=0, y=y)))
            y += 1
            continue
        size = item.build().grid_pos or dashboard_model.GridPos()  # what the panel asked for
        if x + size.w > 24:
            y, x, line_h = y + line_h, 0, 0
        dash = dash.with_panel(item.id(panel_id).grid_pos(dashboard_model.GridPos(h=size.h, w=size.w, x=x, y=y)))
        x, line_h = x + size.w, max(line_h, size.h)
    return dash


def as_json(dash: dashboard_sdk.Dashboard) -> dict:
    """The dashboard as Grafana reads it (the JSON a provisioned file holds)."""
    return json.loads(json.dumps(dash.build(), cls=JSONEncoder))


def panel_queries(dash: dict) -> list[tuple[str, str, str]]:
    """(panel title, refId, query) of every InfluxQL target of a dashboard's JSON."""
    return [(p["title"], t["refId"], t["query"]) for p in dash["panels"] for t in p.get("targets", [])]


# --------------------------------------------------------------------------- InfluxQL
def delay_by_direction(field: str, fn: str = "mean", where: str = DIRECTION) -> str:
    return (
        f'SELECT {fn}("{field}") FROM "stamp_delay" WHERE {SESSION} AND {where} AND {T} '
        f'GROUP BY time($__interval), "node", "ssid", "direction" fill(none)'
    )


def rate(measurement: str, fields: str, where: str, by: str) -> str:
    """Per-second rate of monotonic counters (they restart at 0 with their process: non-negative)."""
    cond = f"{where} AND {T}" if where else T
    return (
        f'SELECT non_negative_derivative(last({fields}), 1s) FROM "{measurement}" WHERE {cond} '
        f"GROUP BY time($__interval), {by} fill(none)"
    )


def increase(measurement: str, fields: str, where: str, by: str) -> str:
    """What a monotonic counter added per interval."""
    cond = f"{where} AND {T}" if where else T
    return (
        f'SELECT non_negative_difference(last({fields})) FROM "{measurement}" WHERE {cond} '
        f"GROUP BY time($__interval), {by} fill(none)"
    )


# Mean delay of sampled real packets: sum of their delays / their number (packet-weighted, so
# the hops' means of one path add up to the path's mean).
PACKET_MEAN = 'sum("sum_us") / sum("count")'

# per hop of a path over the whole range; also the report's per-hop table (dashboards/report.py)
HOPS_OF_THE_PATH = (
    f'SELECT {PACKET_MEAN} AS "mean µs", max("p99_us") AS "p99 µs (worst second)", max("max_us") AS "max µs", '
    'sum("count") AS "packets", count("mean_us") / count("measured") AS "measured" '
    f'FROM "inline_hop_delay" WHERE {INLINE} AND {T} GROUP BY "path", "hop", "link", "from_node", "to_node"'
)

# the links with the largest mean delay over the range, with the path each was measured on
WORST_LINKS = (
    'SELECT top("mean", "link", "path", 10) AS "mean µs", "p99" AS "p99 µs (worst second)", "packets" FROM '
    f'(SELECT {PACKET_MEAN} AS "mean", max("p99_us") AS "p99", sum("count") AS "packets" FROM "inline_hop_delay" '
    f'WHERE "measured" = true AND {T} GROUP BY "link", "path")'
)


# --------------------------------------------------------------------------- dashboards
def overview() -> dashboard_sdk.Dashboard:
    return dashboard(
        "segscope-overview",
        "segscope — overview",
        "Every SRv6 path at a glance: the worst delay, jitter and loss now, sessions gone silent, "
        "nodes not reporting, the slowest links. Click a bar or a link to open the path.",
        [],
        [
            dashboard_sdk.Row("Worst paths now (last value of 1-minute means)"),
            worst(
                "One-way delay, worst paths",
                "µs",
                influxql(
                    "A",
                    'SELECT mean("mean_us") FROM "stamp_delay" WHERE "direction" != \'round_trip\' AND '
                    f'{T} GROUP BY time(1m), "node", "ssid", "direction" fill(none)',
                    "$tag_node/$tag_ssid $tag_direction",
                ),
                "forward = T2-T1, reverse = T4-T3 (synchronised clocks); red above the default objective of "
                "the delay alert",
            )
            .thresholds(delay_steps())
            .color_scheme(by_thresholds())
            .data_links(session_link()),
            worst(
                "Jitter (mean |IPDV|), worst paths",
                "µs",
                influxql(
                    "A",
                    'SELECT mean("ipdv_mean_us") FROM "stamp_delay" WHERE "direction" != \'round_trip\' AND '
                    f'{T} GROUP BY time(1m), "node", "ssid", "direction" fill(none)',
                    "$tag_node/$tag_ssid $tag_direction",
                ),
                "RFC 3393 IPDV between consecutive test packets, mean per second",
            ).data_links(session_link()),
            worst(
                "Loss ratio per flow (complete blocks)",
                "percentunit",
                influxql(
                    "A",
                    'SELECT sum("lost") / sum("tx_packets") FROM "altmark_loss" WHERE "complete" = true AND '
                    f'{T} GROUP BY time(1m), "flow" fill(none)',
                    "flow $tag_flow",
                ),
                "exact: packets lost / sent per flow over the last minute of complete alternate-marking blocks",
            )
            .thresholds(loss_steps())
            .color_scheme(by_thresholds())
            .decimals(3)
            .data_links(flow_link()),
            dashboard_sdk.Row("Silence and trouble"),
            rows_of(
                "STAMP sessions: last result",
                table_query(
                    "A",
                    'SELECT last("count") AS "packets in last second" FROM "stamp_delay" WHERE '
                    f'"direction" = \'round_trip\' AND {T} GROUP BY "node", "ssid"',
                ),
                description="one row per session; Time is its last measured second: an old time is a "
                "silent session (alert: STAMP session silent)",
            ).data_links(session_link()),
            rows_of(
                "Nodes: last report of the agent",
                table_query(
                    "A", f'SELECT last("rpcs") AS "RPCs served" FROM "segscope_agent" WHERE {T} GROUP BY "node"'
                ),
                description="agents report every second with --kafka: an old Time is a node that is down or "
                "cannot reach Kafka",
            ).data_links(node_link()),
            bargauge.Panel()
            .title("Incomplete loss blocks per flow")
            .datasource(DATASOURCE)
            .unit("short")
            .span(8)
            .height(8)
            .orientation(common.VizOrientation.HORIZONTAL)
            .reduce_options(common_sdk.ReduceDataOptions().calcs(["lastNotNull"]).values(False).fields(""))
            .with_target(
                influxql(
                    "A",
                    f'SELECT count("reason") FROM "altmark_loss" WHERE "complete" = false AND {T} GROUP BY "flow"',
                    "flow $tag_flow",
                )
            )
            .description(
                "blocks without an exact loss number (a side missing, a restart, a conflict); the reasons are "
                "in the path dashboard"
            )
            .thresholds(thresholds((None, "green"), (1, "orange")))
            .color_scheme(by_thresholds())
            .data_links(flow_link()),
            dashboard_sdk.Row("Links (in-line measurement of real traffic)"),
            rows_of(
                "Worst links by delay (in-line)",
                table_query("A", WORST_LINKS),
                width=24,
                height=8,
                description="the 10 links whose sampled real packets (IOAM) took longest over the time "
                "range: mean = sum of their delays / packets, with the path each was measured on; red "
                "above the default objective of the link delay alert. Click a row to open the path",
            )
            .unit("µs")
            .thresholds(link_delay_steps())
            .color_scheme(by_thresholds())
            .override_by_name(
                "mean µs",
                [
                    dashboard_model.DynamicConfigValue(
                        id_val="custom.cellOptions", value=common.TableColoredBackgroundCellOptions()
                    )
                ],
            )
            .override_by_name("packets", [dashboard_model.DynamicConfigValue(id_val="unit", value="short")])
            .sort_by([common_sdk.TableSortByFieldState().display_name("mean µs").desc(True)])
            .with_transformation(without_time_column())
            .data_links(to_path("var-path=${__data.fields.path}")),
        ],
    )


def steering_annotation() -> dashboard_sdk.AnnotationQuery:
    """segscope-steer's decisions on the policies of the selected node: when traffic moved, from
    which candidate to which, and the rule that fired (schemas/metrics.md, steering_decision)."""
    query = (
        'SELECT "rule", "from", "to", "kind", "from_delay_us", "to_delay_us" FROM "steering_decision" '
        f'WHERE "node" =~ /^$node$/ AND {T}'
    )
    return (
        dashboard_sdk.AnnotationQuery()
        .name("Steering decisions")
        .datasource(DATASOURCE)
        .enable(True)
        .icon_color("rgba(255, 152, 48, 1)")
        .target(influxql("A", query, fmt=influxdb.ResultFormat.TABLE))
        .mappings(
            {
                "text": dashboard_sdk.AnnotationEventFieldMapping()
                .source(dashboard_model.AnnotationEventFieldSource.FIELD)
                .value("rule"),
                "tags": dashboard_sdk.AnnotationEventFieldMapping()
                .source(dashboard_model.AnnotationEventFieldSource.FIELD)
                .value("kind"),
            }
        )
    )


def path() -> dashboard_sdk.Dashboard:
    flow_where = f'"complete" = true AND {FLOW}'
    return dashboard(
        "segscope-path",
        "segscope — path",
        "One SRv6 path: STAMP delay both ways and round trip with percentiles and jitter (session = "
        "sender node + ssid), the exact loss of the flows on it, per block and per window, and the "
        "in-line measurement of their real packets: delay per hop, end to end, sequence loss.",
        [
            # the agents' inventory lines (segscope_stamp_session, segscope_flow) map a SID list to the
            # sessions and flows on it; in-line results carry their SID list themselves
            query_variable(
                "path",
                "path (SID list)",
                'SHOW TAG VALUES FROM "segscope_stamp_session", "inline_delay" WITH KEY = "path" '
                "WHERE \"role\" != 'reflector'",
            ),
            query_variable(
                "node",
                "sender node",
                f'SHOW TAG VALUES FROM "segscope_stamp_session" WITH KEY = "node" WHERE {SENDER} AND {PATH}',
            ),
            query_variable(
                "ssid",
                "STAMP session",
                f'SHOW TAG VALUES FROM "segscope_stamp_session" WITH KEY = "ssid" WHERE {SENDER} AND {PATH} AND {NODE}',
            ),
            custom_variable("direction", "direction", ["forward", "reverse", "round_trip"]),
            query_variable(
                "flow",
                "flow",
                # alternate marking: the flow's ingress side; in-line: every flow measured
                f'SHOW TAG VALUES FROM "segscope_flow", "inline_delay" WITH KEY = "flow" WHERE "side" != \'rx\' '
                f"AND {PATH}",
            ),
        ],
        [
            rows_of(
                "Sessions and flows on this path",
                table_query(
                    "A",
                    f'SELECT last("rate_pps") AS "test packets/s" FROM "segscope_stamp_session" WHERE {SENDER} '
                    f'AND {PATH} AND {T} GROUP BY "node", "ssid", "path", "return_path"',
                ),
                table_query(
                    "B",
                    f'SELECT last("period_ms") AS "block ms" FROM "segscope_flow" WHERE {PATH} AND {T} '
                    'GROUP BY "flow", "side", "node", "path", "method"',
                ),
                width=24,
                height=6,
                description="what the agents run on the chosen SID list (their inventory lines, every second)",
            ),
            dashboard_sdk.Row("Delay (STAMP)"),
            with_limit_line(
                series(
                    "Delay, mean per second",
                    "µs",
                    influxql("A", delay_by_direction("mean_us"), "$tag_direction $tag_node/$tag_ssid"),
                    description="forward T2-T1, reverse T4-T3, round_trip (T4-T1)-(T3-T2) without the "
                    "reflector's hold time",
                ),
                delay_steps(),
            ),
            series(
                "Delay percentiles",
                "µs",
                influxql("A", delay_by_direction("p50_us"), "p50 $tag_direction $tag_node/$tag_ssid"),
                influxql("B", delay_by_direction("p99_us", "max"), "p99 $tag_direction $tag_node/$tag_ssid"),
                influxql("C", delay_by_direction("min_us", "min"), "min $tag_direction $tag_node/$tag_ssid"),
                influxql("D", delay_by_direction("max_us", "max"), "max $tag_direction $tag_node/$tag_ssid"),
            ),
            series(
                "Jitter: mean |IPDV| (RFC 3393)",
                "µs",
                influxql("A", delay_by_direction("ipdv_mean_us"), "$tag_direction $tag_node/$tag_ssid"),
            ),
            series(
                "Test packets measured per second",
                "pps",
                influxql(
                    "A",
                    f'SELECT sum("count") FROM "stamp_delay" WHERE {SESSION} AND "direction" = \'round_trip\' '
                    f'AND {T} GROUP BY time(1s), "node", "ssid" fill(0)',
                    "$tag_node/$tag_ssid",
                ),
                description="0 while a session runs = replies lost or the pipeline stalled",
            ),
            dashboard_sdk.Row("Loss (alternate marking)"),
            bars(
                series(
                    "Lost packets per block",
                    "short",
                    influxql(
                        "A",
                        f'SELECT "lost" FROM "altmark_loss" WHERE {flow_where} AND {T} GROUP BY "flow"',
                        "flow $tag_flow",
                    ),
                    description="exact per block (complete blocks only: a missing or restarted side gives no number)",
                )
            ),
            with_limit_line(
                series(
                    "Loss ratio, 1-minute window",
                    "percentunit",
                    influxql(
                        "A",
                        f'SELECT sum("lost") / sum("tx_packets") FROM "altmark_loss" WHERE {flow_where} AND {T} '
                        'GROUP BY time(1m), "flow" fill(none)',
                        "flow $tag_flow",
                    ),
                ).decimals(3),
                loss_steps(),
            ),
            series(
                "Packets per block, ingress and egress",
                "short",
                influxql(
                    "A",
                    f'SELECT "tx_packets", "rx_packets" FROM "altmark_loss" WHERE {flow_where} AND {T} GROUP BY "flow"',
                    "flow $tag_flow $col",
                ),
            ),
            points(
                series(
                    "D-mark delay of real traffic (double marking)",
                    "µs",
                    influxql(
                        "A",
                        f'SELECT "dmark_delay_mean_us" FROM "altmark_loss" WHERE {flow_where} AND {T} GROUP BY "flow"',
                        "flow $tag_flow",
                    ),
                    description="mean one-way delay of the D-marked packets of each block (RFC 9341)",
                )
            ),
            rows_of(
                "Incomplete blocks and why",
                table_query(
                    "A",
                    f'SELECT "reason", "tx_packets", "rx_packets" FROM "altmark_loss" WHERE "complete" = false '
                    f'AND {FLOW} AND {T} GROUP BY "flow"',
                ),
                width=24,
                description="why a block has no exact number: missing_tx / missing_rx, partial_block, "
                "agent_restart, conflicting_*, rx_exceeds_tx (schemas/metrics.md)",
            ),
            dashboard_sdk.Row("In-line measurement of real traffic (IOAM, sampled packets)"),
            # one chart per chosen path: hops of different paths must not stack onto each other
            series(
                "Delay per hop, stacked: $path",
                "µs",
                influxql(
                    "A",
                    f'SELECT {PACKET_MEAN} FROM "inline_hop_delay" WHERE "measured" = true AND {INLINE} AND {T} '
                    'GROUP BY time($__interval), "path", "hop", "link" fill(none)',
                    "hop $tag_hop $tag_link",
                ),
                width=24,
                height=9,
                description="each hop's mean delay of the sampled real packets (sum of their delays / packets "
                "per interval), stacked: the top edge is the path's in-line one-way delay, split by link. Hop 0 "
                "is the ingress edge to the first transit node. A hop not measured (its node adds no IOAM "
                "entry) has no band here and reads 'not measured' in the table below",
            )
            .stacking(common_sdk.StackingConfig().mode(common.StackingMode.NORMAL))
            .fill_opacity(60)
            .repeat("path")
            .repeat_direction("v"),
            rows_of(
                "Hops of the path (in-line)",
                table_query("A", HOPS_OF_THE_PATH),
                width=24,
                height=7,
                description="per hop over the time range: mean = sum of the sampled packets' delays / packets, "
                "the worst second's p99, the largest delay, packets, and the share of the flows' seconds in "
                "which the hop was measured; 'not measured': its node added no IOAM entry",
            )
            .unit("µs")
            .no_value("not measured")
            .override_by_name("packets", [dashboard_model.DynamicConfigValue(id_val="unit", value="short")])
            .override_by_name("measured", [dashboard_model.DynamicConfigValue(id_val="unit", value="percentunit")])
            .with_transformation(without_time_column()),
            with_limit_line(
                series(
                    "In-line and STAMP one-way delay",
                    "µs",
                    influxql(
                        "A",
                        f'SELECT {PACKET_MEAN} FROM "inline_delay" WHERE {INLINE} AND {T} '
                        'GROUP BY time($__interval), "path", "flow" fill(none)',
                        "in-line mean, flow $tag_flow",
                    ),
                    influxql(
                        "B",
                        f'SELECT max("p99_us") FROM "inline_delay" WHERE {INLINE} AND {T} '
                        'GROUP BY time($__interval), "path", "flow" fill(none)',
                        "in-line p99, flow $tag_flow",
                    ),
                    influxql(
                        "C",
                        f'SELECT mean("mean_us") FROM "stamp_delay" WHERE {SESSION} AND "direction" = \'forward\' '
                        f'AND {T} GROUP BY time($__interval), "node", "ssid" fill(none)',
                        "STAMP forward mean $tag_node/$tag_ssid",
                    ),
                    description="real packets of the flows (IOAM, ingress edge to egress edge) next to the STAMP "
                    "test packets of the sessions chosen above: a gap between them is the price of being "
                    "customer traffic (queues, another forwarding class) or a different route",
                ),
                delay_steps(),
            ),
            bars(
                series(
                    "Sampled packets lost, reordered, duplicated (in-line)",
                    "short",
                    influxql(
                        "A",
                        'SELECT sum("lost") AS "lost", sum("reordered") AS "reordered", sum("duplicated") AS '
                        f'"duplicated" FROM "inline_loss" WHERE {INLINE} AND {T} '
                        'GROUP BY time($__interval), "path", "flow" fill(none)',
                        "flow $tag_flow $col",
                    ),
                    description="from the IOAM sequence numbers of the sampled packets at the egress edge: a "
                    "gap is lost, a late number reordered, a repeated one duplicated",
                )
            ),
            with_limit_line(
                series(
                    "In-line loss ratio of sampled packets, 1-minute window",
                    "percentunit",
                    influxql(
                        "A",
                        'SELECT sum("lost") / (sum("received") + sum("lost")) FROM "inline_loss" '
                        f'WHERE {INLINE} AND {T} GROUP BY time(1m), "path", "flow" fill(none)',
                        "flow $tag_flow",
                    ),
                    description="lost / (received + lost) sampled packets: an estimate of the flow's loss from "
                    "its samples; alternate marking above counts every packet",
                ).decimals(3),
                loss_steps(),
            ),
            rows_of(
                "In-line flows on this path: sequence loss",
                table_query(
                    "A",
                    'SELECT sum("received") AS "received", sum("lost") AS "lost", '
                    'sum("lost") / (sum("received") + sum("lost")) AS "loss ratio", sum("reordered") AS "reordered", '
                    'sum("duplicated") AS "duplicated", sum("loss_bursts") AS "loss bursts", '
                    f'max("loss_burst_max") AS "longest burst" FROM "inline_loss" WHERE {INLINE} AND {T} '
                    'GROUP BY "path", "flow", "ingress", "egress"',
                ),
                width=12,
                description="per flow over the time range, sampled packets; a burst is a run of consecutive "
                "sequence numbers lost",
            )
            .override_by_name("loss ratio", [dashboard_model.DynamicConfigValue(id_val="unit", value="percentunit")])
            .with_transformation(without_time_column()),
        ],
        annotations=(steering_annotation(),),
    )


def node() -> dashboard_sdk.Dashboard:
    stamp = f'{NODE} AND "program" =~ /^stamp_/'
    altmark = f'{NODE} AND "program" =~ /^altmark_/'
    return dashboard(
        "segscope-node",
        "segscope — node",
        "One node's datapath: every outcome counter of its XDP/TC programs (each packet lands in "
        "exactly one), the devices' kernel drops, and the agent.",
        [query_variable("node", "node", 'SHOW TAG VALUES FROM "segscope_datapath" WITH KEY = "node"')],
        [
            dashboard_sdk.Row("STAMP programs"),
            series(
                "STAMP datapath outcomes per second",
                "pps",
                influxql(
                    "A",
                    rate("segscope_datapath", "/^(collected|reflected|pass_.*)$/", stamp, '"node", "program"'),
                    "$tag_node $tag_program $col",
                ),
            ),
            bars(
                series(
                    "STAMP datapath drops by reason",
                    "short",
                    influxql(
                        "A",
                        increase("segscope_datapath", "/^drop_.*/", stamp, '"node", "program"'),
                        "$tag_node $tag_program $col",
                    ),
                    description="drop_malformed_* (bad packets), drop_ringbuf_full (the agent did not read fast "
                    "enough), drop_adjust_failed: datapath/README.md",
                )
            ),
            bars(
                series(
                    "Reflector TX health: device drops",
                    "short",
                    influxql(
                        "A",
                        increase(
                            "segscope_device", "/^(tx_dropped|rx_dropped)$/", NODE, '"node", "device", "programs"'
                        ),
                        "$tag_node $tag_device ($tag_programs) $col",
                    ),
                    description="replies a reflector could not send (XDP_TX into a peer without XDP) show here "
                    "and nowhere else",
                )
            ),
            dashboard_sdk.Row("Alternate-marking programs"),
            series(
                "Alternate marking outcomes per second",
                "pps",
                influxql(
                    "A",
                    rate("segscope_datapath", "/^(coloured|counted|pass)_.*/", altmark, '"node", "program"'),
                    "$tag_node $tag_program $col",
                ),
            ),
            dashboard_sdk.Row("Agent"),
            series(
                "Agent RPCs and errors per second",
                "reqps",
                influxql("A", rate("segscope_agent", "/^(rpcs|rpc_errors)$/", NODE, '"node"'), "$tag_node $col"),
            ),
            series(
                "Agent STAMP records per second",
                "pps",
                influxql(
                    "A",
                    rate("segscope_agent", "/^(records_read|records_streamed|records_dropped)$/", NODE, '"node"'),
                    "$tag_node $col",
                ),
            ),
        ],
    )


def pipeline() -> dashboard_sdk.Dashboard:
    return dashboard(
        "segscope-pipeline",
        "segscope — pipeline",
        "Records through each stage (agent, Kafka, processors, Telegraf), how far behind the "
        "processors are, dead letters and every counted drop.",
        [],
        [
            dashboard_sdk.Row("Throughput"),
            series(
                "Records per second by stage",
                "ops",
                influxql("A", rate("segscope_agent", "/^records_streamed$/", "", '"node"'), "agent $tag_node streamed"),
                influxql(
                    "B",
                    rate("segscope_processor", "/^(records_in|points_out)$/", "", '"processor", "instance"'),
                    "$tag_processor $tag_instance $col",
                ),
                influxql(
                    "C",
                    rate("segscope_altmark_collector", "/^records_delivered$/", "", '"node"'),
                    "altmark collector $tag_node delivered",
                ),
                width=24,
            ),
            dashboard_sdk.Row("Behind and broken"),
            with_limit_line(
                series(
                    "Freshness: packet to InfluxDB",
                    "ms",
                    influxql(
                        "A",
                        f'SELECT max("p99_ms") AS "p99", mean("p50_ms") AS "p50" FROM "segscope_freshness" WHERE {T} '
                        'GROUP BY time($__interval), "measurement" fill(none)',
                        "$tag_measurement $col",
                    ),
                    description="how old a result is when it becomes visible in InfluxDB: from its newest packet "
                    "(newest_ns: the largest T1 of a stamp_delay second, the end of an altmark_loss block) to the "
                    "poll that first saw it (segscope-freshness, error <= its poll period). Target: stamp_delay "
                    "p99 <= 2 s; altmark_loss <= T/2 + 2 s",
                ),
                thresholds((None, "green"), (5000, "orange"), (30000, "red")),
            ),
            with_limit_line(
                series(
                    "Processor input behind (consumer lag)",
                    "short",
                    influxql(
                        "A",
                        f'SELECT max("lag_messages") FROM "segscope_consumer" WHERE {T} '
                        'GROUP BY time($__interval), "processor", "topic", "partition" fill(none)',
                        "$tag_processor $tag_topic[$tag_partition]",
                    ),
                    description="messages not yet read; held-uncommitted ones are in the processor's /metrics",
                ),
                thresholds((None, "green"), (alerts.LAG_MESSAGES, "red")),
            ),
            bars(
                series(
                    "Dead letters",
                    "short",
                    influxql(
                        "A",
                        increase(
                            "segscope_processor",
                            "/^(malformed_batches|processing_errors|malformed_views|dead_letters)$/",
                            "",
                            '"processor", "instance"',  # counters are per worker process
                        ),
                        "$tag_processor $tag_instance $col",
                    ),
                    description="records that could not be decoded went to segscope.deadletter with the reason",
                )
            ),
            bars(
                series(
                    "Drops by reason",
                    "short",
                    influxql(
                        "A", increase("segscope_agent", "/^records_dropped$/", "", '"node"'), "agent $tag_node $col"
                    ),
                    influxql(
                        "B",
                        increase(
                            "segscope_processor",
                            "/^(late_records_dropped|invalid_records|duplicate_records)$/",
                            "",
                            '"processor", "instance"',  # counters are per worker process
                        ),
                        "$tag_processor $tag_instance $col",
                    ),
                    influxql(
                        "C",
                        increase("segscope_datapath", "/^drop_ringbuf_full$/", "", '"node", "program"'),
                        "$tag_node $tag_program ring buffer full",
                    ),
                    influxql(
                        "D",
                        increase("segscope_altmark_collector", "/^records_failed$/", "", '"node"'),
                        "altmark collector $tag_node failed",
                    ),
                    width=24,
                    description="duplicates are removed, not lost (a replay after a restart); everything else "
                    "here is a record that did not make it",
                )
            ),
        ],
    )


DASHBOARDS: dict[str, Callable[[], dashboard_sdk.Dashboard]] = {
    "overview.json": overview,
    "path.json": path,
    "node.json": node,
    "pipeline.json": pipeline,
}


def render() -> dict[Path, str]:
    out = {
        HERE / name: json.dumps(as_json(make()), indent=2, ensure_ascii=False) + "\n"
        for name, make in DASHBOARDS.items()
    }
    out[HERE / "provisioning" / "alerting" / "segscope.yaml"] = alerts.provisioning_yaml()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a committed file differs")
    args = ap.parse_args()
    return write_or_check(render(), args.check, ".local/venv/bin/python -m dashboards.generate")


if __name__ == "__main__":
    sys.exit(main())
