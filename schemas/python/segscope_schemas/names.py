"""Shared names (Kafka topics, consumer groups, InfluxDB database, bpffs root) from schemas/names.toml.

    from segscope_schemas import names
    names.TOPIC_STAMP_RECORDS          # "segscope.stamp.records"
    names.TOPIC_PARTITIONS             # {"segscope.stamp.records": 2, ...}

The TOML file is the registry; this module and the generated C header
(schemas/c/segscope_names.h, `python -m segscope_schemas.names --c-header`) only read it, so a
name is changed in one place. Deployed without a checkout, the file ships beside this module.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

_CANDIDATES = (
    Path(__file__).resolve().parents[2] / "names.toml",  # checkout: schemas/names.toml
    Path(__file__).resolve().parent / "names.toml",
)  # installed copy


def _load() -> dict:
    for path in _CANDIDATES:
        if path.is_file():
            with path.open("rb") as f:
                return tomllib.load(f)
    raise FileNotFoundError(f"segscope names registry not found (looked in {', '.join(map(str, _CANDIDATES))})")


REGISTRY = _load()

TOPIC_STAMP_RECORDS: str = REGISTRY["topics"]["stamp_records"]["name"]
TOPIC_ALTMARK_BLOCKS: str = REGISTRY["topics"]["altmark_blocks"]["name"]
TOPIC_IOAM_RECORDS: str = REGISTRY["topics"]["ioam_records"]["name"]
TOPIC_ALTMARK_BY_FLOW: str = REGISTRY["topics"]["altmark_blocks_by_flow"]["name"]
TOPIC_METRICS: str = REGISTRY["topics"]["metrics"]["name"]
TOPIC_METRICS_NEWEST: str = REGISTRY["topics"]["metrics_newest"]["name"]
TOPIC_DEADLETTER: str = REGISTRY["topics"]["deadletter"]["name"]
TOPIC_TOPOLOGY: str = REGISTRY["topics"]["topology"]["name"]
TOPIC_PATHS: str = REGISTRY["topics"]["paths"]["name"]
TOPIC_CONTROLLER_LEADER: str = REGISTRY["topics"]["controller_leader"]["name"]
# partitions the local stack creates each topic with (the processors' parallelism follows them)
TOPIC_PARTITIONS: dict[str, int] = {t["name"]: int(t["partitions"]) for t in REGISTRY["topics"].values()}
# topic configs every creator must set (e.g. cleanup.policy=compact); topics without one: {}
TOPIC_CONFIG: dict[str, dict[str, str]] = {
    t["name"]: {k: str(v) for k, v in t.get("config", {}).items()} for t in REGISTRY["topics"].values()
}

GROUP_TELEGRAF: str = REGISTRY["groups"]["telegraf"]
GROUP_DELAY: str = REGISTRY["groups"]["delay"]
GROUP_LOSS: str = REGISTRY["groups"]["loss"]
GROUP_TOPOLOGY: str = REGISTRY["groups"]["topology"]
GROUP_INLINE: str = REGISTRY["groups"]["inline"]
GROUP_CONTROLLER: str = REGISTRY["groups"]["controller"]
GROUPS: dict[str, str] = dict(REGISTRY["groups"])

INFLUXDB_DATABASE: str = REGISTRY["influxdb"]["database"]
BPFFS_PIN_ROOT: str = REGISTRY["bpffs"]["pin_root"]


def c_header() -> str:
    """The C view of the registry (schemas/c/segscope_names.h)."""
    lines = [
        "/* GENERATED from schemas/names.toml by `python -m segscope_schemas.names --c-header`:",
        " * edit the TOML, then `make -C schemas names`. Shared names of segscope (Kafka topics,",
        " * consumer groups, InfluxDB database, bpffs pin root). */",
        "#ifndef SEGSCOPE_NAMES_H",
        "#define SEGSCOPE_NAMES_H",
        "",
    ]
    for key, topic in REGISTRY["topics"].items():
        lines.append(f"/* {topic['doc']} */")
        lines.append(f'#define SEGSCOPE_TOPIC_{key.upper()} "{topic["name"]}"')
    lines.append("")
    for key, group in REGISTRY["groups"].items():
        lines.append(f'#define SEGSCOPE_GROUP_{key.upper()} "{group}"')
    lines += [
        "",
        f'#define SEGSCOPE_INFLUXDB_DATABASE "{INFLUXDB_DATABASE}"',
        f'#define SEGSCOPE_BPFFS_PIN_ROOT "{BPFFS_PIN_ROOT}"',
        "",
        "#endif /* SEGSCOPE_NAMES_H */",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:] != ["--c-header"]:
        sys.exit("usage: python -m segscope_schemas.names --c-header > schemas/c/segscope_names.h")
    sys.stdout.write(c_header())
