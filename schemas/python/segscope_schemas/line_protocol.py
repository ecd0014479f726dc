"""Parse InfluxDB line protocol (the format of segscope.metrics) into (measurement, tags, fields, ts).

Only what segscope's producers write is needed, but the parser follows the full escaping rules
(https://docs.influxdata.com/influxdb/v1/write_protocols/line_protocol_reference/): `\\,`, `\\=`,
`\\ ` in measurement/tag keys/values, quoted string fields with `\\"` and `\\\\`, integer `i`
fields, floats, booleans (t/true/f/false, any case). A line it cannot read raises LineError.
"""

from __future__ import annotations

from dataclasses import dataclass


class LineError(ValueError):
    pass


@dataclass(frozen=True)
class Point:
    measurement: str
    tags: dict
    fields: dict
    timestamp_ns: int | None


def _split_unescaped(text: str, sep: str, quotes: bool = False) -> list[str]:
    """Split on `sep` not preceded by a backslash (and, with quotes, not inside "...")."""
    # Fast paths (what segscope's producers write: no escapes): str.split, which the character
    # loop below would equal, at a twentieth of its cost (bench/topology_points.py).
    if "\\" not in text:
        if not quotes or '"' not in text:
            return text.split(sep)
        return _split_quoted_plain(text, sep)
    parts, cur, i, in_quotes = [], [], 0, False
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            cur.append(text[i : i + 2])
            i += 2
            continue
        if quotes and ch == '"':
            in_quotes = not in_quotes
        if ch == sep and not in_quotes:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    if in_quotes:
        raise LineError("unterminated string field")
    parts.append("".join(cur))
    return parts


def _split_quoted_plain(text: str, sep: str) -> list[str]:
    """_split_unescaped(text, sep, quotes=True) for a text without backslashes: the pieces between
    double quotes at odd positions are inside a string and are not split."""
    pieces = text.split('"')
    if len(pieces) % 2 == 0:
        raise LineError("unterminated string field")
    parts = [""]
    for k, piece in enumerate(pieces):
        if k % 2:
            parts[-1] += '"' + piece + '"'
        else:
            first, *rest = piece.split(sep)
            parts[-1] += first
            parts.extend(rest)
    return parts


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in ',= "\\':
            out.append(text[i + 1])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _field_value(raw: str):
    if not raw:
        raise LineError("empty field value")
    if raw[0] == '"':
        if len(raw) < 2 or raw[-1] != '"':
            raise LineError(f"bad string field {raw!r}")
        return _unescape(raw[1:-1])
    low = raw.lower()
    if low in ("t", "true"):
        return True
    if low in ("f", "false"):
        return False
    try:
        if raw[-1] in "iu":
            return int(raw[:-1])
        return float(raw)
    except ValueError:
        raise LineError(f"bad field value {raw!r}") from None


def parse_fields(section: str) -> dict:
    """The field set of a line (the part between the first and the last blank) as a dict."""
    fields = {}
    for item in _split_unescaped(section, ",", quotes=True):
        key, sep, value = item.partition("=")
        while key.endswith("\\") and sep:  # an escaped '=' inside the key
            k2, sep, value = value.partition("=")
            key = key + "=" + k2
        if not sep or not key:
            raise LineError(f"bad field {item!r}")
        fields[_unescape(key)] = _field_value(value)
    return fields


def plain_field(section: str, name: str):
    """The value of field `name` in a field set without backslashes (the last one, as parse_fields
    keeps it), None when it has no such field; LineError when that value (or a quote) is broken."""
    items = _split_quoted_plain(section, ",") if '"' in section else section.split(",")
    found = None
    for item in items:
        key, sep, value = item.partition("=")
        if key == name and sep:
            found = value
    return None if found is None else _field_value(found)


def parse_line(line: str) -> Point:
    line = line.strip()
    if not line or line.startswith("#"):
        raise LineError("empty line")
    sections = _split_unescaped(line, " ", quotes=True)
    sections = [s for s in sections if s != ""]
    if len(sections) not in (2, 3):
        raise LineError(f"expected 'measurement[,tags] fields [timestamp]', got {len(sections)} parts")
    head = _split_unescaped(sections[0], ",")
    measurement = _unescape(head[0])
    if not measurement:
        raise LineError("empty measurement")
    tags = {}
    for item in head[1:]:
        kv = _split_unescaped(item, "=")
        if len(kv) != 2 or not kv[0] or not kv[1]:
            raise LineError(f"bad tag {item!r}")
        tags[_unescape(kv[0])] = _unescape(kv[1])
    fields = parse_fields(sections[1])
    ts = None
    if len(sections) == 3:
        try:
            ts = int(sections[2])
        except ValueError:
            raise LineError(f"bad timestamp {sections[2]!r}") from None
    return Point(measurement, tags, fields, ts)


def parse_lines(text: str) -> tuple[list[Point], list[tuple[str, str]]]:
    """All points of a message and the (line, error) pairs of lines that could not be read."""
    points, bad = [], []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            points.append(parse_line(line))
        except LineError as e:
            bad.append((line, str(e)))
    return points, bad
