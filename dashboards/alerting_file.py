"""Grafana's alerting provisioning file (provisioning/alerting/*.yaml, `apiVersion: 1`, `groups`),
in the style of grafana-foundation-sdk, around the SDK's own alert rule.

The SDK's `alerting.Rule` and `alerting.RuleGroup` are the HTTP provisioning API's shapes: a rule
carries `folderUID`, `orgID` and `ruleGroup`, a group `folderUid` and an interval in seconds.
Grafana's file provisioning groups rules differently: the group names its org (`orgId`), its
folder by title (`folder`, created if missing) and its interval as a duration (`30s`), and its
rules carry none of the three. `ProvisionedRuleGroup` is that group; its rules are the SDK's
`alerting.Rule` models (built with `alerting.Rule(...)`), written without the three API-only
keys. Everything else of a rule (uid, title, condition, data, noDataState, execErrState, for,
annotations, labels, isPaused) has the same name in both formats.
"""

from __future__ import annotations

import re
import typing

from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import alerting

# keys of the API's rule that the file puts on the group instead
API_ONLY_RULE_KEYS = ("folderUID", "orgID", "ruleGroup")
# the order Grafana's own export writes (for a reader of the file; Grafana does not care)
RULE_KEY_ORDER = ("uid", "title", "condition", "data", "noDataState", "execErrState", "for", "annotations", "labels",
                  "isPaused")  # fmt: skip
QUERY_KEY_ORDER = ("refId", "relativeTimeRange", "datasourceUid", "model")
DURATION = re.compile(r"\d+[smhd]")


class ProvisionedRuleGroup:
    org_id: int
    # Rule group name, unique in its folder.
    name: str
    # Folder title; Grafana creates the folder when it does not exist.
    folder: str
    # How often every rule of the group is evaluated, as a duration ("30s", "1m").
    interval: str
    rules: list[alerting.Rule]

    def __init__(self, org_id: int = 1, name: str = "", folder: str = "", interval: str = "1m",
                 rules: typing.Optional[list[alerting.Rule]] = None) -> None:  # fmt: skip
        self.org_id = org_id
        self.name = name
        self.folder = folder
        self.interval = interval
        self.rules = rules if rules is not None else []

    def to_json(self) -> dict[str, object]:
        return {
            "orgId": self.org_id,
            "name": self.name,
            "folder": self.folder,
            "interval": self.interval,
            "rules": [file_rule(r) for r in self.rules],
        }

    @classmethod
    def from_json(cls, data: dict[str, typing.Any]) -> typing.Self:
        args: dict[str, typing.Any] = {}
        for key, arg in (("orgId", "org_id"), ("name", "name"), ("folder", "folder"), ("interval", "interval")):
            if key in data:
                args[arg] = data[key]
        if "rules" in data:
            args["rules"] = [alerting.Rule.from_json(r) for r in data["rules"]]
        return cls(**args)


def in_order(payload: dict[str, object], order: tuple[str, ...]) -> dict[str, object]:
    return {**{k: payload[k] for k in order if k in payload}, **payload}


def file_rule(rule: alerting.Rule) -> dict[str, object]:
    """A rule as the provisioning file writes it: the API's JSON without the group's keys."""
    payload = in_order({k: v for k, v in rule.to_json().items() if k not in API_ONLY_RULE_KEYS}, RULE_KEY_ORDER)
    payload["data"] = [in_order(q.to_json(), QUERY_KEY_ORDER) for q in rule.data]
    return payload


class AlertingProvisioning:
    api_version: int
    groups: list[ProvisionedRuleGroup]

    def __init__(self, api_version: int = 1, groups: typing.Optional[list[ProvisionedRuleGroup]] = None) -> None:
        self.api_version = api_version
        self.groups = groups if groups is not None else []

    def to_json(self) -> dict[str, object]:
        return {"apiVersion": self.api_version, "groups": self.groups}

    @classmethod
    def from_json(cls, data: dict[str, typing.Any]) -> typing.Self:
        return cls(api_version=data.get("apiVersion", 1),
                   groups=[ProvisionedRuleGroup.from_json(g) for g in data.get("groups", [])])  # fmt: skip


class RuleGroup(cogbuilder.Builder[ProvisionedRuleGroup]):
    """RuleGroup("segscope").folder("segscope").interval("30s").with_rule(alerting.Rule("...")...)"""

    _internal: ProvisionedRuleGroup

    def __init__(self, name: str) -> None:
        if not 1 <= len(name) <= 190:
            raise ValueError("a rule group name has 1 to 190 characters")
        self._internal = ProvisionedRuleGroup(name=name)

    def build(self) -> ProvisionedRuleGroup:
        uids = [r.uid for r in self._internal.rules]
        if len(set(uids)) != len(uids):
            raise ValueError(f"rule group {self._internal.name}: duplicate rule uids {sorted(str(u) for u in uids)}")
        return self._internal

    def org_id(self, org_id: int) -> typing.Self:
        self._internal.org_id = org_id
        return self

    def folder(self, folder: str) -> typing.Self:
        if not folder:
            raise ValueError("a provisioned rule group needs a folder")
        self._internal.folder = folder
        return self

    def interval(self, interval: str) -> typing.Self:
        if not DURATION.fullmatch(interval):
            raise ValueError(f"interval {interval!r}: a duration such as 30s or 1m")
        self._internal.interval = interval
        return self

    def with_rule(self, rule: cogbuilder.Builder[alerting.Rule]) -> typing.Self:
        built = rule.build()
        if not built.uid:
            raise ValueError(f"rule {built.title!r}: a provisioned rule needs a uid (it identifies the rule)")
        if not built.for_val or not DURATION.fullmatch(built.for_val):
            raise ValueError(f"rule {built.uid}: `for` {built.for_val!r} is not a duration")
        self._internal.rules.append(built)
        return self


class AlertingFile(cogbuilder.Builder[AlertingProvisioning]):
    _internal: AlertingProvisioning

    def __init__(self) -> None:
        self._internal = AlertingProvisioning()

    def build(self) -> AlertingProvisioning:
        return self._internal

    def with_group(self, group: cogbuilder.Builder[ProvisionedRuleGroup]) -> typing.Self:
        self._internal.groups.append(group.build())
        return self
