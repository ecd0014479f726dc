"""segscope's Grafana dashboards and alert rules, as code. Writes:

    dashboards/overview.json    worst paths by delay, jitter and loss now; silent sessions; nodes
    dashboards/path.json        one path: delay both ways, round trip, percentiles, jitter, loss per
                                block and per window, D-mark delay, incomplete blocks
    dashboards/node.json        one node: datapath counters (every outcome and drop), reflector TX
    dashboards/pipeline.json    records per stage, consumer lag, dead letters, drops by reason
    dashboards/provisioning/alerting/segscope.yaml   the alert rules (dashboards/alerts.py)

    .local/venv/bin/python -m dashboards.generate [--check]

--check writes nothing and exits 1 when a committed file differs from what this code makes (the
tests run it, so the JSON never drifts from its source). Measurements and fields:
schemas/metrics.md. Every query is run against a real InfluxDB by tests/e2e/test_noc_view.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dashboards import alerts
from dashboards.grafana import (
    Panel,
    custom_variable,
    dashboard,
    query_variable,
    row,
    target,
    thresholds,
)
from segscope_schemas.generated import write_or_check

HERE = Path(__file__).resolve().parent

SESSION = '"node" =~ /^$node$/ AND "ssid" =~ /^$ssid$/'
DIRECTION = '"direction" =~ /^$direction$/'
FLOW = '"flow" =~ /^$flow$/'
NODE = '"node" =~ /^$node$/'
PATH = '"path" =~ /^$path$/'
SENDER = '"role" = \'sender\''
T = "$timeFilter"
DELAY_STEPS = thresholds((None, "green"), (alerts.DEFAULT_ONE_WAY_DELAY_US, "red"))
LOSS_STEPS = thresholds((None, "green"), (1e-9, "orange"), (alerts.LOSS_RATIO_CRITICAL, "red"))


def to_path(labels: str) -> list[dict]:
    return [
        {
            "title": "open this path",
            "url": f"/d/segscope-path/segscope-path?${{__url_time_range}}&var-datasource=${{datasource}}&{labels}",
        }
    ]


SESSION_LINK = to_path("var-node=${__field.labels.node}&var-ssid=${__field.labels.ssid}")
FLOW_LINK = to_path("var-flow=${__field.labels.flow}")
NODE_LINK = [
    {
        "title": "open this node",
        "url": "/d/segscope-node/segscope-node?${__url_time_range}&var-datasource=${datasource}"
        "&var-node=${__field.labels.node}",
    }
]


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


def overview() -> dict:
    worst = dict(kind="bargauge", width=8, height=9)
    return dashboard(
        "segscope-overview",
        "segscope — overview",
        "Every SRv6 path at a glance: the worst delay, jitter and loss now, sessions gone silent, "
        "nodes not reporting. Click a bar to open the path.",
        [],
        [
            row("Worst paths now (last value of 1-minute means)"),
            Panel(
                "One-way delay, worst paths",
                targets=[
                    target(
                        "A",
                        'SELECT mean("mean_us") FROM "stamp_delay" WHERE "direction" != \'round_trip\' AND '
                        f'{T} GROUP BY time(1m), "node", "ssid", "direction" fill(none)',
                        "$tag_node/$tag_ssid $tag_direction",
                    )
                ],
                unit="µs",
                thresholds=DELAY_STEPS,
                links=SESSION_LINK,
                description="forward = T2-T1, reverse = T4-T3 (synchronised clocks); red above the "
                "default objective of the delay alert",
                **worst,
            ),
            Panel(
                "Jitter (mean |IPDV|), worst paths",
                targets=[
                    target(
                        "A",
                        'SELECT mean("ipdv_mean_us") FROM "stamp_delay" WHERE "direction" != \'round_trip\' AND '
                        f'{T} GROUP BY time(1m), "node", "ssid", "direction" fill(none)',
                        "$tag_node/$tag_ssid $tag_direction",
                    )
                ],
                unit="µs",
                links=SESSION_LINK,
                description="RFC 3393 IPDV between consecutive test packets, mean per second",
                **worst,
            ),
            Panel(
                "Loss ratio per flow (complete blocks)",
                targets=[
                    target(
                        "A",
                        'SELECT sum("lost") / sum("tx_packets") FROM "altmark_loss" WHERE "complete" = true AND '
                        f'{T} GROUP BY time(1m), "flow" fill(none)',
                        "flow $tag_flow",
                    )
                ],
                unit="percentunit",
                thresholds=LOSS_STEPS,
                links=FLOW_LINK,
                description="exact: packets lost / sent per flow over the last minute of complete "
                "alternate-marking blocks",
                decimals=3,
                **worst,
            ),
            row("Silence and trouble"),
            Panel(
                "STAMP sessions: last result",
                kind="table",
                targets=[
                    target(
                        "A",
                        'SELECT last("count") AS "packets in last second" FROM "stamp_delay" WHERE '
                        f'"direction" = \'round_trip\' AND {T} GROUP BY "node", "ssid"',
                        fmt="table",
                    )
                ],
                description="one row per session; Time is its last measured second: an old time is a "
                "silent session (alert: STAMP session silent)",
                links=SESSION_LINK,
                width=8,
            ),
            Panel(
                "Nodes: last report of the agent",
                kind="table",
                targets=[
                    target(
                        "A",
                        f'SELECT last("rpcs") AS "RPCs served" FROM "segscope_agent" WHERE {T} GROUP BY "node"',
                        fmt="table",
                    )
                ],
                description="agents report every second with --kafka: an old Time is a node that is "
                "down or cannot reach Kafka",
                links=NODE_LINK,
                width=8,
            ),
            Panel(
                "Incomplete loss blocks per flow",
                kind="bargauge",
                targets=[
                    target(
                        "A",
                        f'SELECT count("reason") FROM "altmark_loss" WHERE "complete" = false AND {T} GROUP BY "flow"',
                        "flow $tag_flow",
                    )
                ],
                description="blocks without an exact loss number (a side missing, a restart, a conflict); "
                "the reasons are in the path dashboard",
                thresholds=thresholds((None, "green"), (1, "orange")),
                links=FLOW_LINK,
                width=8,
            ),
        ],
    )


def path() -> dict:
    flow_where = f'"complete" = true AND {FLOW}'
    return dashboard(
        "segscope-path",
        "segscope — path",
        "One SRv6 path: STAMP delay both ways and round trip with percentiles and jitter (session = "
        "sender node + ssid), and the exact loss of the flows on it, per block and per window.",
        [
            # the agents' inventory lines (segscope_stamp_session, segscope_flow) map a SID list to the
            # sessions and flows on it: pick a path, get its sessions and flows
            query_variable(
                "path",
                "path (SID list)",
                f'SHOW TAG VALUES FROM "segscope_stamp_session" WITH KEY = "path" WHERE {SENDER}',
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
                f'SHOW TAG VALUES FROM "segscope_flow" WITH KEY = "flow" WHERE "side" = \'tx\' AND {PATH}',
            ),
        ],
        [
            Panel(
                "Sessions and flows on this path",
                "table",
                [
                    target(
                        "A",
                        f'SELECT last("rate_pps") AS "test packets/s" FROM "segscope_stamp_session" WHERE {SENDER} '
                        f'AND {PATH} AND {T} GROUP BY "node", "ssid", "path", "return_path"',
                        fmt="table",
                    ),
                    target(
                        "B",
                        f'SELECT last("period_ms") AS "block ms" FROM "segscope_flow" WHERE {PATH} AND {T} '
                        'GROUP BY "flow", "side", "node", "path", "method"',
                        fmt="table",
                    ),
                ],
                width=24,
                height=6,
                description="what the agents run on the chosen SID list (their inventory lines, every second)",
            ),
            row("Delay (STAMP)"),
            Panel(
                "Delay, mean per second",
                "timeseries",
                [target("A", delay_by_direction("mean_us"), "$tag_direction $tag_node/$tag_ssid")],
                unit="µs",
                thresholds=DELAY_STEPS,
                description="forward T2-T1, reverse T4-T3, round_trip (T4-T1)-(T3-T2) without the "
                "reflector's hold time",
            ),
            Panel(
                "Delay percentiles",
                "timeseries",
                [
                    target("A", delay_by_direction("p50_us"), "p50 $tag_direction $tag_node/$tag_ssid"),
                    target("B", delay_by_direction("p99_us", "max"), "p99 $tag_direction $tag_node/$tag_ssid"),
                    target("C", delay_by_direction("min_us", "min"), "min $tag_direction $tag_node/$tag_ssid"),
                    target("D", delay_by_direction("max_us", "max"), "max $tag_direction $tag_node/$tag_ssid"),
                ],
                unit="µs",
            ),
            Panel(
                "Jitter: mean |IPDV| (RFC 3393)",
                "timeseries",
                [target("A", delay_by_direction("ipdv_mean_us"), "$tag_direction $tag_node/$tag_ssid")],
                unit="µs",
            ),
            Panel(
                "Test packets measured per second",
                "timeseries",
                [
                    target(
                        "A",
                        f'SELECT sum("count") FROM "stamp_delay" WHERE {SESSION} AND "direction" = \'round_trip\' '
                        f'AND {T} GROUP BY time(1s), "node", "ssid" fill(0)',
                        "$tag_node/$tag_ssid",
                    )
                ],
                unit="pps",
                description="0 while a session runs = replies lost or the pipeline stalled",
            ),
            row("Loss (alternate marking)"),
            Panel(
                "Lost packets per block",
                "timeseries",
                [
                    target(
                        "A",
                        f'SELECT "lost" FROM "altmark_loss" WHERE {flow_where} AND {T} GROUP BY "flow"',
                        "flow $tag_flow",
                    )
                ],
                unit="short",
                draw="bars",
                description="exact per block (complete blocks only: a missing or restarted side gives no number)",
            ),
            Panel(
                "Loss ratio, 1-minute window",
                "timeseries",
                [
                    target(
                        "A",
                        f'SELECT sum("lost") / sum("tx_packets") FROM "altmark_loss" WHERE {flow_where} AND {T} '
                        'GROUP BY time(1m), "flow" fill(none)',
                        "flow $tag_flow",
                    )
                ],
                unit="percentunit",
                thresholds=LOSS_STEPS,
                decimals=3,
            ),
            Panel(
                "Packets per block, ingress and egress",
                "timeseries",
                [
                    target(
                        "A",
                        f'SELECT "tx_packets", "rx_packets" FROM "altmark_loss" WHERE {flow_where} AND {T} '
                        'GROUP BY "flow"',
                        "flow $tag_flow $col",
                    )
                ],
                unit="short",
            ),
            Panel(
                "D-mark delay of real traffic (double marking)",
                "timeseries",
                [
                    target(
                        "A",
                        f'SELECT "dmark_delay_mean_us" FROM "altmark_loss" WHERE {flow_where} AND {T} GROUP BY "flow"',
                        "flow $tag_flow",
                    )
                ],
                unit="µs",
                draw="points",
                description="mean one-way delay of the D-marked packets of each block (RFC 9341)",
            ),
            Panel(
                "Incomplete blocks and why",
                "table",
                [
                    target(
                        "A",
                        f'SELECT "reason", "tx_packets", "rx_packets" FROM "altmark_loss" WHERE "complete" = false '
                        f'AND {FLOW} AND {T} GROUP BY "flow"',
                        fmt="table",
                    )
                ],
                width=24,
                description="why a block has no exact number: missing_tx / missing_rx, partial_block, "
                "agent_restart, conflicting_*, rx_exceeds_tx (schemas/metrics.md)",
            ),
        ],
    )


def node() -> dict:
    stamp = f'{NODE} AND "program" =~ /^stamp_/'
    altmark = f'{NODE} AND "program" =~ /^altmark_/'
    return dashboard(
        "segscope-node",
        "segscope — node",
        "One node's datapath: every outcome counter of its XDP/TC programs (each packet lands in "
        "exactly one), the devices' kernel drops, and the agent.",
        [query_variable("node", "node", 'SHOW TAG VALUES FROM "segscope_datapath" WITH KEY = "node"')],
        [
            row("STAMP programs"),
            Panel(
                "STAMP datapath outcomes per second",
                "timeseries",
                [
                    target(
                        "A",
                        rate("segscope_datapath", "/^(collected|reflected|pass_.*)$/", stamp, '"node", "program"'),
                        "$tag_node $tag_program $col",
                    )
                ],
                unit="pps",
            ),
            Panel(
                "STAMP datapath drops by reason",
                "timeseries",
                [
                    target(
                        "A",
                        increase("segscope_datapath", "/^drop_.*/", stamp, '"node", "program"'),
                        "$tag_node $tag_program $col",
                    )
                ],
                unit="short",
                draw="bars",
                description="drop_malformed_* (bad packets), drop_ringbuf_full (the agent did not read fast "
                "enough), drop_adjust_failed: datapath/README.md",
            ),
            Panel(
                "Reflector TX health: device drops",
                "timeseries",
                [
                    target(
                        "A",
                        increase(
                            "segscope_device", '/^(tx_dropped|rx_dropped)$/', NODE, '"node", "device", "programs"'
                        ),
                        "$tag_node $tag_device ($tag_programs) $col",
                    )
                ],
                unit="short",
                draw="bars",
                description="replies a reflector could not send (XDP_TX into a peer without XDP) show here "
                "and nowhere else",
            ),
            row("Alternate-marking programs"),
            Panel(
                "Alternate marking outcomes per second",
                "timeseries",
                [
                    target(
                        "A",
                        rate("segscope_datapath", "/^(coloured|counted|pass)_.*/", altmark, '"node", "program"'),
                        "$tag_node $tag_program $col",
                    )
                ],
                unit="pps",
            ),
            row("Agent"),
            Panel(
                "Agent RPCs and errors per second",
                "timeseries",
                [target("A", rate("segscope_agent", '/^(rpcs|rpc_errors)$/', NODE, '"node"'), "$tag_node $col")],
                unit="reqps",
            ),
            Panel(
                "Agent STAMP records per second",
                "timeseries",
                [
                    target(
                        "A",
                        rate("segscope_agent", '/^(records_read|records_streamed|records_dropped)$/', NODE, '"node"'),
                        "$tag_node $col",
                    )
                ],
                unit="pps",
            ),
        ],
    )


def pipeline() -> dict:
    return dashboard(
        "segscope-pipeline",
        "segscope — pipeline",
        "Records through each stage (agent, Kafka, processors, Telegraf), how far behind the "
        "processors are, dead letters and every counted drop.",
        [],
        [
            row("Throughput"),
            Panel(
                "Records per second by stage",
                "timeseries",
                [
                    target(
                        "A", rate("segscope_agent", '/^records_streamed$/', "", '"node"'), "agent $tag_node streamed"
                    ),
                    target(
                        "B",
                        rate("segscope_processor", '/^(records_in|points_out)$/', "", '"processor", "instance"'),
                        "$tag_processor $tag_instance $col",
                    ),
                    target(
                        "C",
                        rate("segscope_altmark_collector", '/^records_delivered$/', "", '"node"'),
                        "altmark collector $tag_node delivered",
                    ),
                ],
                unit="ops",
                width=24,
            ),
            row("Behind and broken"),
            Panel(
                "Freshness: packet to InfluxDB",
                "timeseries",
                [
                    target(
                        "A",
                        f'SELECT max("p99_ms") AS "p99", mean("p50_ms") AS "p50" FROM "segscope_freshness" WHERE {T} '
                        'GROUP BY time($__interval), "measurement" fill(none)',
                        "$tag_measurement $col",
                    )
                ],
                unit="ms",
                thresholds=thresholds((None, "green"), (5000, "orange"), (30000, "red")),
                description="how old a result is when it becomes visible in InfluxDB: from its newest packet "
                "(newest_ns: the largest T1 of a stamp_delay second, the end of an altmark_loss block) to the poll "
                "that first saw it (segscope-freshness, error <= its poll period). Target (issue 17): stamp_delay "
                "p99 <= 2 s; altmark_loss <= T/2 + 2 s",
            ),
            Panel(
                "Processor input behind (consumer lag)",
                "timeseries",
                [
                    target(
                        "A",
                        f'SELECT max("lag_messages") FROM "segscope_consumer" WHERE {T} '
                        'GROUP BY time($__interval), "processor", "topic", "partition" fill(none)',
                        "$tag_processor $tag_topic[$tag_partition]",
                    ),
                ],
                unit="short",
                thresholds=thresholds((None, "green"), (alerts.LAG_MESSAGES, "red")),
                description="messages not yet read; held-uncommitted ones are in the processor's /metrics",
            ),
            Panel(
                "Dead letters",
                "timeseries",
                [
                    target(
                        "A",
                        increase(
                            "segscope_processor",
                            "/^(malformed_batches|processing_errors|malformed_views|dead_letters)$/",
                            "",
                            '"processor", "instance"',  # counters are per worker process
                        ),
                        "$tag_processor $tag_instance $col",
                    )
                ],
                unit="short",
                draw="bars",
                description="records that could not be decoded went to segscope.deadletter with the reason",
            ),
            Panel(
                "Drops by reason",
                "timeseries",
                [
                    target(
                        "A", increase("segscope_agent", '/^records_dropped$/', "", '"node"'), "agent $tag_node $col"
                    ),
                    target(
                        "B",
                        increase(
                            "segscope_processor",
                            '/^(late_records_dropped|invalid_records|duplicate_records)$/',
                            "",
                            '"processor", "instance"',  # counters are per worker process
                        ),
                        "$tag_processor $tag_instance $col",
                    ),
                    target(
                        "C",
                        increase("segscope_datapath", '/^drop_ringbuf_full$/', "", '"node", "program"'),
                        "$tag_node $tag_program ring buffer full",
                    ),
                    target(
                        "D",
                        increase("segscope_altmark_collector", '/^records_failed$/', "", '"node"'),
                        "altmark collector $tag_node failed",
                    ),
                ],
                unit="short",
                draw="bars",
                width=24,
                description="duplicates are removed, not lost (a replay after a restart); everything else here "
                "is a record that did not make it",
            ),
        ],
    )


DASHBOARDS = {"overview.json": overview, "path.json": path, "node.json": node, "pipeline.json": pipeline}


def render() -> dict[Path, str]:
    out = {HERE / name: json.dumps(make(), indent=2, ensure_ascii=False) + "\n" for name, make in DASHBOARDS.items()}
    out[HERE / "provisioning" / "alerting" / "segscope.yaml"] = alerts.provisioning_yaml()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a committed file differs")
    args = ap.parse_args()
    return write_or_check(render(), args.check, ".local/venv/bin/python -m dashboards.generate")


if __name__ == "__main__":
    sys.exit(main())
