"""YAML with positions: plain Python values plus the LINE:COLUMN of every key and value.

PyYAML's composer keeps a start mark on every node; the safe loader throws them away when it
constructs Python objects. We compose the node tree ourselves and convert it, remembering the
mark of each value (and of each mapping key) under its path, e.g. ("stamp_sessions", 0,
"rate_pps"). Errors can then point at the exact line and column a user has to change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

Path_ = tuple  # ("stamp_sessions", 0, "rate_pps")


@dataclass
class Problem:
    """One error in a file: where (LINE:COLUMN, path), what is wrong, how to fix it."""

    line: int
    column: int
    where: str
    what: str
    fix: str

    def format(self, file: str) -> str:
        head = f"{file}:{self.line}:{self.column}: "
        return (
            head
            + (f"{self.where}: " if self.where else "")
            + f"{self.what}"
            + (f". Fix: {self.fix}" if self.fix else "")
        )


def fmt_path(where: Path_) -> str:
    text = ""
    for part in where:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


@dataclass
class MarkedDoc:
    """The document as plain values, positions by path, and the problems found so far."""

    file: str
    value_pos: dict[Path_, tuple[int, int]] = field(default_factory=dict)
    key_pos: dict[Path_, tuple[int, int]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    def pos(self, where: Path_, at_key: bool = False) -> tuple[int, int]:
        if at_key and where in self.key_pos:
            return self.key_pos[where]
        while where:
            if where in self.value_pos:
                return self.value_pos[where]
            where = where[:-1]
        return self.value_pos.get((), (1, 1))

    def error(self, where: Path_, what: str, fix: str = "", at_key: bool = False) -> None:
        line, col = self.pos(where, at_key)
        self.problems.append(Problem(line, col, fmt_path(where), what, fix))

    # ------------------------------------------------------------------ conversion
    def convert(self, node: yaml.Node, where: Path_ = ()) -> Any:
        self.value_pos[where] = (node.start_mark.line + 1, node.start_mark.column + 1)
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = _scalar(key_node)
                sub = where + (key,)
                self.key_pos[sub] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
                if key in out:
                    self.error(sub, f"key {key!r} appears twice", "keep only one of them", at_key=True)
                    continue
                out[key] = self.convert(value_node, sub)
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.convert(item, where + (i,)) for i, item in enumerate(node.value)]
        return _scalar(node)


def _scalar(node: yaml.Node) -> Any:
    if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
        return f"<{'mapping' if isinstance(node, yaml.MappingNode) else 'list'}>"  # complex key
    return yaml.constructor.SafeConstructor().construct_object(node)


def load_marked(text: str, file: str) -> tuple[Any, MarkedDoc]:
    """Parse text; returns (value, doc). A syntax error becomes one Problem with its position."""
    doc = MarkedDoc(file)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        context = f" ({exc.context} at line {exc.context_mark.line + 1})" if exc.context and exc.context_mark else ""
        doc.problems.append(
            Problem(
                line,
                col,
                "",
                f"YAML syntax error: {exc.problem}{context}",
                "correct the YAML syntax (indentation, quotes, brackets)",
            )
        )
        return None, doc
    except yaml.YAMLError as exc:
        doc.problems.append(Problem(1, 1, "", f"YAML error: {exc}", "correct the YAML syntax"))
        return None, doc
    if root is None:
        return None, doc
    return doc.convert(root), doc
