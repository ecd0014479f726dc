"""The ACLs of segscope's roles: one principal per role, each allowed what its programs do and no more.

    agent      the node side (the agent, its C tools, the user-space STAMP tools, the topology
               publisher): writes the records topics, segscope.paths, segscope.topology and its
               counters on segscope.metrics; reads nothing
    processor  the delay, loss, in-line and topology processors: read their inputs, write
               segscope.metrics, the summary, dead letters and the re-keyed altmark blocks; own the
               topics and consumer groups named after their app ids (progress topics, Faust's
               internal topics, helper groups)
    controller `segscope-controller run`: its leader election (the consumer group
               segscope-controller on the topic segscope-controller.leader: read, never written)
               and its counter and repair lines on segscope.metrics (written; `controller status`
               reads them from InfluxDB); and `segscope-steer` (docs/steering.md), which logs in
               as this role: segscope.metrics read (the probes' stamp_delay points), its leader
               groups segscope-steer.<set> on the same leader topic (group prefix segscope-steer)
    telegraf   reads segscope.metrics in its consumer group
    admin      creates topics and users (segscope-topics, the local stack): a super user or a
               principal with CREATE / ALTER on the cluster

The local stack (services/kafka) grants exactly these; `python -m segscope_kafka acls` prints them
as kafka-acls commands for a production cluster (docs/security.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from segscope_schemas import names

ROLES = ("agent", "processor", "controller", "telegraf", "admin")
STEER_GROUP_PREFIX = "segscope-steer"  # segscope-steer.<policy set> (controller/steer/__main__.py)


@dataclass(frozen=True)
class Acl:
    resource: str  # "topic" | "group" | "cluster"
    name: str
    pattern: str  # "literal" | "prefixed"
    operation: str  # Kafka's operation name: READ, WRITE, DESCRIBE, CREATE, ALL, ...


def role_acls(role: str) -> list[Acl]:
    """The ALLOW ACLs of `role` (admin: none, it is a super user)."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
    out: list[Acl] = []

    def topics(ops: tuple[str, ...], *topic_names: str) -> None:
        out.extend(Acl("topic", t, "literal", op) for t in topic_names for op in ops)

    if role == "agent":
        topics(
            ("WRITE", "DESCRIBE"),
            names.TOPIC_STAMP_RECORDS,
            names.TOPIC_ALTMARK_BLOCKS,
            names.TOPIC_IOAM_RECORDS,
            names.TOPIC_PATHS,
            names.TOPIC_TOPOLOGY,
            names.TOPIC_METRICS,
        )
    elif role == "processor":
        inputs = (
            names.TOPIC_STAMP_RECORDS,
            names.TOPIC_ALTMARK_BLOCKS,
            names.TOPIC_IOAM_RECORDS,
            names.TOPIC_PATHS,
            names.TOPIC_TOPOLOGY,
        )
        topics(("READ", "DESCRIBE"), *inputs)
        # written, and read back (metrics: the topology processor; the summary; the re-keyed blocks; dead letters
        # are read by the topology processor's letter count)
        topics(
            ("READ", "WRITE", "DESCRIBE"),
            names.TOPIC_METRICS,
            names.TOPIC_METRICS_NEWEST,
            names.TOPIC_ALTMARK_BY_FLOW,
            names.TOPIC_DEADLETTER,
        )
        for name, group in sorted(names.GROUPS.items()):
            if name not in ("telegraf", "controller"):
                # <app id>.progress, Faust's <app id>-__assignor-__leader and changelogs; <app id>-* groups
                out.append(Acl("topic", group, "prefixed", "ALL"))
                out.append(Acl("group", group, "prefixed", "ALL"))
        out.append(Acl("group", "segscope-paths-", "prefixed", "ALL"))  # processors/paths.py (never joined)
    elif role == "controller":
        topics(("READ", "DESCRIBE"), names.TOPIC_CONTROLLER_LEADER)
        topics(("READ", "WRITE", "DESCRIBE"), names.TOPIC_METRICS)  # read: segscope-steer's input
        out.append(Acl("group", names.GROUP_CONTROLLER, "literal", "READ"))
        out.append(Acl("group", STEER_GROUP_PREFIX, "prefixed", "READ"))  # segscope-steer's leader groups
    elif role == "telegraf":
        topics(("READ", "DESCRIBE"), names.TOPIC_METRICS)
        out.append(Acl("group", names.GROUP_TELEGRAF, "literal", "READ"))
    return out


def kafka_acls_commands(principals: dict[str, str], bootstrap: str = "BROKER:9093") -> list[str]:
    """kafka-acls.sh commands granting each role's ACLs to its principal ({role: 'User:name'})."""
    lines = []
    for role, principal in principals.items():
        for a in role_acls(role):
            target = {"topic": f"--topic {a.name}", "group": f"--group {a.name}", "cluster": "--cluster"}[a.resource]
            pattern = " --resource-pattern-type prefixed" if a.pattern == "prefixed" else ""
            lines.append(
                f"kafka-acls.sh --bootstrap-server {bootstrap} --command-config admin.properties --add "
                f"--allow-principal {principal} --operation {a.operation.title()} {target}{pattern}"
            )
    return lines


def acl_bindings(role: str, principal: str):
    """confluent-kafka AclBinding objects of one role (the local stack creates them as admin)."""
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    kinds = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP, "cluster": ResourceType.BROKER}
    patterns = {"literal": ResourcePatternType.LITERAL, "prefixed": ResourcePatternType.PREFIXED}
    return [
        AclBinding(
            kinds[a.resource],
            a.name,
            patterns[a.pattern],
            principal,
            "*",
            getattr(AclOperation, a.operation),
            AclPermissionType.ALLOW,
        )
        for a in role_acls(role)
    ]
