"""The InfluxDB (InfluxQL) query of Grafana's built-in InfluxDB data source, in the style of
grafana-foundation-sdk: a typed model (`Dataquery`, a `cogvariants.Dataquery` like the SDK's
Prometheus or Loki queries) and its builder (`InfluxQLQuery`, a `cogbuilder.Builder`).

The SDK generates its data queries from the schemas the data source plugins publish; Grafana's
InfluxDB plugin publishes none, so the SDK has no InfluxDB query. This one covers what segscope
writes: a raw InfluxQL query (`rawQuery: true`) with its result format and legend alias, plus
`intervalMs` / `maxDataPoints`, which alert rule queries carry. The fields are those of the
plugin's `InfluxQuery` (public/app/plugins/datasource/influxdb/types.ts in Grafana); the visual
editor's fields (select, groupBy, tags ...) are not modelled: a query read back with them keeps
them in `editor_fields` and writes them out unchanged.

Importing this module registers the variant "influxdb" with the SDK's runtime, so
`Dashboard.from_json` reads InfluxDB targets back as `Dataquery` (tests/noc checks the
generated files that way).
"""

from __future__ import annotations

import enum
import typing

from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import runtime as cogruntime
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.models import common

DATASOURCE_TYPE = "influxdb"


class ResultFormat(enum.StrEnum):
    """How the plugin shapes the result: one frame per series, one table, or log lines."""

    TIME_SERIES = "time_series"
    TABLE = "table"
    LOGS = "logs"


class Dataquery(cogvariants.Dataquery):
    # A unique identifier for the query within the list of targets (panel) or data (alert rule).
    ref_id: str
    # The data source; None in an alert rule, where the query's datasourceUid names it.
    datasource: typing.Optional[common.DataSourceRef]
    # True: `query` is sent as written (Grafana still substitutes $timeFilter, $__interval and
    # template variables); false: the visual editor builds the query.
    raw_query: bool
    # The InfluxQL statement.
    query: str
    result_format: ResultFormat
    # Legend of each series: $tag_<name>, $col, $m (measurement) are substituted by the plugin.
    alias: typing.Optional[str]
    # Hidden targets are run but not shown (an expression may still use them).
    hide: typing.Optional[bool]
    # Alert rule queries: the interval $__interval expands to, and the point budget.
    interval_ms: typing.Optional[float]
    max_data_points: typing.Optional[int]
    # Fields of the plugin's visual editor, kept as they were read.
    editor_fields: dict[str, object]

    def __init__(
        self,
        ref_id: str = "",
        datasource: typing.Optional[common.DataSourceRef] = None,
        raw_query: bool = True,
        query: str = "",
        result_format: typing.Optional[ResultFormat] = None,
        alias: typing.Optional[str] = None,
        hide: typing.Optional[bool] = None,
        interval_ms: typing.Optional[float] = None,
        max_data_points: typing.Optional[int] = None,
        editor_fields: typing.Optional[dict[str, object]] = None,
    ) -> None:
        self.ref_id = ref_id
        self.datasource = datasource
        self.raw_query = raw_query
        self.query = query
        self.result_format = result_format if result_format is not None else ResultFormat.TIME_SERIES
        self.alias = alias
        self.hide = hide
        self.interval_ms = interval_ms
        self.max_data_points = max_data_points
        self.editor_fields = editor_fields if editor_fields is not None else {}

    def to_json(self) -> dict[str, object]:
        payload: dict[str, object] = {"refId": self.ref_id}
        if self.datasource is not None:
            payload["datasource"] = self.datasource
        payload["rawQuery"] = self.raw_query
        payload["resultFormat"] = self.result_format
        payload["query"] = self.query
        if self.alias is not None:
            payload["alias"] = self.alias
        if self.hide is not None:
            payload["hide"] = self.hide
        if self.interval_ms is not None:
            payload["intervalMs"] = self.interval_ms
        if self.max_data_points is not None:
            payload["maxDataPoints"] = self.max_data_points
        payload.update(self.editor_fields)
        return payload

    @classmethod
    def from_json(cls, data: dict[str, typing.Any]) -> typing.Self:
        known = {"refId", "datasource", "rawQuery", "resultFormat", "query", "alias", "hide", "intervalMs",
                 "maxDataPoints"}  # fmt: skip
        args: dict[str, typing.Any] = {"editor_fields": {k: v for k, v in data.items() if k not in known}}
        if "refId" in data:
            args["ref_id"] = data["refId"]
        if "datasource" in data:
            args["datasource"] = common.DataSourceRef.from_json(data["datasource"])
        if "rawQuery" in data:
            args["raw_query"] = data["rawQuery"]
        if "resultFormat" in data:
            args["result_format"] = ResultFormat(data["resultFormat"])
        if "query" in data:
            args["query"] = data["query"]
        if "alias" in data:
            args["alias"] = data["alias"]
        if "hide" in data:
            args["hide"] = data["hide"]
        if "intervalMs" in data:
            args["interval_ms"] = data["intervalMs"]
        if "maxDataPoints" in data:
            args["max_data_points"] = data["maxDataPoints"]
        return cls(**args)


def variant_config() -> cogruntime.DataqueryConfig:
    return cogruntime.DataqueryConfig(identifier=DATASOURCE_TYPE, from_json_hook=Dataquery.from_json)


class InfluxQLQuery(cogbuilder.Builder[Dataquery]):
    """A raw InfluxQL query: InfluxQLQuery().ref_id("A").query('SELECT ... WHERE $timeFilter ...')."""

    _internal: Dataquery

    def __init__(self) -> None:
        self._internal = Dataquery()

    def build(self) -> Dataquery:
        return self._internal

    def ref_id(self, ref_id: str) -> typing.Self:
        if not ref_id:
            raise ValueError("ref_id must not be empty")
        self._internal.ref_id = ref_id
        return self

    def datasource(self, datasource: common.DataSourceRef) -> typing.Self:
        self._internal.datasource = datasource
        return self

    def query(self, query: str) -> typing.Self:
        """The statement, sent as written (rawQuery)."""
        if not query.strip():
            raise ValueError("an InfluxQL query must not be empty")
        self._internal.query = query
        self._internal.raw_query = True
        return self

    def result_format(self, result_format: ResultFormat) -> typing.Self:
        self._internal.result_format = result_format
        return self

    def alias(self, alias: str) -> typing.Self:
        self._internal.alias = alias
        return self

    def hide(self, hide: bool) -> typing.Self:
        self._internal.hide = hide
        return self

    def interval_ms(self, interval_ms: float) -> typing.Self:
        if not interval_ms > 0:
            raise ValueError("interval_ms must be > 0")
        self._internal.interval_ms = interval_ms
        return self

    def max_data_points(self, max_data_points: int) -> typing.Self:
        if not max_data_points > 0:
            raise ValueError("max_data_points must be > 0")
        self._internal.max_data_points = max_data_points
        return self


cogruntime.register_dataquery_variant(variant_config())
