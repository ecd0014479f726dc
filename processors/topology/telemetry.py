"""Which segscope.metrics lines go to Jalapeno's `jalapeno.telemetry` topic, and in what format.

Jalapeno's telegraf-egress (install/processors/telegraf-egress/telegraf_egress_cfg.yaml) reads
that topic with `[[inputs.kafka_consumer]] topics = ["jalapeno.telemetry"] data_format = "influx"`
(max_message_len 1000000) and writes InfluxDB database `mdt_db` with `precision = "s"`; its
telegraf-ingress produces to it with Telegraf's kafka output (influx line protocol, the default
format). So a message is InfluxDB line protocol, several lines per message allowed. segscope's
lines are line protocol already: they are forwarded unchanged (nanosecond timestamps; Jalapeno's
Telegraf stores them at second precision, which keeps segscope's one-point-per-second series).
"""

from __future__ import annotations

DEFAULT_TOPIC = "jalapeno.telemetry"
DEFAULT_MEASUREMENTS = ("stamp_delay", "altmark_loss")
MAX_MESSAGE_BYTES = 1_000_000  # telegraf-egress max_message_len


def measurement_of(line: str) -> str:
    """The measurement name of a line-protocol line (up to the first unescaped ',' or ' ')."""
    i = 0
    while i < len(line):
        c = line[i]
        if c == "\\":
            i += 2
            continue
        if c in ", ":
            break
        i += 1
    return line[:i].replace("\\,", ",").replace("\\ ", " ")


def select_lines(text: str, measurements: frozenset[str] | None) -> list[str]:
    """The lines of `text` to forward: every non-comment line of the listed measurements (None:
    every line)."""
    out = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if measurements is None or measurement_of(line) in measurements:
            out.append(line)
    return out


def messages(lines: list[str]) -> list[bytes]:
    """Lines joined into messages no larger than telegraf-egress accepts."""
    out, cur, size = [], [], 0
    for line in lines:
        n = len(line.encode()) + 1
        if cur and size + n > MAX_MESSAGE_BYTES:
            out.append("\n".join(cur).encode())
            cur, size = [], 0
        cur.append(line)
        size += n
    if cur:
        out.append("\n".join(cur).encode())
    return out
