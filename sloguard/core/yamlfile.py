"""YAML files read with the line of every key, so errors can point at the line to fix."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError


class YamlFileError(Exception):
    """The file cannot be read or parsed; the message starts with `file:line:`."""


Position = tuple[int, int]  # 1-based line and column


def read_yaml(path: Path) -> tuple[Any, dict[tuple[str, ...], Position]]:
    """The parsed document and a map from each key path to its 1-based line and column."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise YamlFileError(f"{path}: cannot read: {exc.strerror}") from exc
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise YamlFileError(f"{where}: invalid YAML: {getattr(exc, 'problem', None) or exc}") \
            from exc
    return document, line_map(node)


def load_model(path: Path, model: Any, empty: str,
               context: Callable[[Any], dict[str, Any]] | None = None,
               ) -> tuple[Any, dict[tuple[str, ...], Position]]:
    """Read and validate one file against a pydantic model: the model and the line map, or
    YamlFileError with every problem as `file:line:column: field: problem` (what rule, policy and
    lab scenario files share). `empty` says what the file should define when it is empty.
    `context(document)`: pydantic's validation context, for a field checked against another
    part of the file that must still be reported at its own line."""
    document, lines = read_yaml(path)
    if document is None:
        raise YamlFileError(f"{path}:1:1: the file is empty; {empty}")
    try:
        return model.model_validate(
            document, context=context(document) if context else None), lines
    except ValidationError as exc:
        raise YamlFileError(validation_problems(path, exc, lines)) from exc


def line_map(node: yaml.Node | None) -> dict[tuple[str, ...], Position]:
    lines: dict[tuple[str, ...], Position] = {}

    def walk(current: yaml.Node, path: tuple[str, ...]) -> None:
        if isinstance(current, yaml.MappingNode):
            for key, value in current.value:
                child = (*path, str(key.value))
                lines[child] = (key.start_mark.line + 1, key.start_mark.column + 1)
                walk(value, child)
        elif isinstance(current, yaml.SequenceNode):
            for index, item in enumerate(current.value):
                child = (*path, str(index))
                lines[child] = (item.start_mark.line + 1, item.start_mark.column + 1)
                walk(item, child)

    if node is not None:
        walk(node, ())
    return lines


def nearest(lines: dict[tuple[str, ...], Position], loc: tuple[str, ...]) -> Position:
    """Where `loc` is, or its closest enclosing key (for missing or unknown fields)."""
    return next((lines[loc[:n]] for n in range(len(loc), 0, -1) if loc[:n] in lines), (1, 1))


def validation_problems(path: Path, exc: Any, lines: dict[tuple[str, ...], Position]) -> str:
    """A pydantic ValidationError of a YAML file as `file:line:column: field: problem` lines,
    one per error: what rule and policy files report."""
    problems = []
    for error in exc.errors():
        loc = tuple(str(p) for p in error["loc"])
        line, column = nearest(lines, loc)
        msg = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            msg = "unknown field"
        problems.append(f"{path}:{line}:{column}: {'.'.join(loc)}: {msg}")
    return "\n".join(problems)
