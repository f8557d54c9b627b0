"""The bundled config JSON Schema, and each problem of a config table as one sentence naming the key as
TOML writes it (`fleet.max_concurrency`, `[fleet]`) with a hint: the closest key, the type, or removed."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path as FilePath
from typing import Any

from stellafleet.core.configsections import BUILTIN_PIPELINES
from stellafleet.core.schemaerrors import (
    TYPE_WORDS,
    BundledSchema,
    Path,
    SchemaProblem,
    closest,
    describe,
    is_number,
    show,
    suggest,
)

# The entry-point group pipelines are installed under; pipelines/ takes its GROUP from here.
PIPELINE_GROUP = "stella.pipelines"
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
# Keys that were settings once: an old config naming one is told the setting is gone.
REMOVED_KEYS = {
    ("fleet", "fork_workers"): "every task is one plain worker process now",
    ("pipelines", "command", "direct"): "every command task runs under its own worker process now",
}


@dataclass(frozen=True)
class Problem:
    """One thing wrong, at a location in the config data; `text` is a sentence that names it."""

    path: Path
    text: str
    keyword: str = ""


URL_PATTERN = "^https?://[^/\\s]"
# its text is what `stella config schema` prints
BUNDLED = BundledSchema(FilePath(__file__).parent / "config.schema.json", finite=True)


def problems(data: Any, *, installed: Callable[[], Iterable[str]] | None = None) -> list[Problem]:
    """Every problem of one config table, in document order; [] when valid. `installed`: the installed
    pipelines, asked only for a [pipelines.NAME] the schema does not know (without it: taken as written)."""
    found = _unique(BUNDLED.problems(data))
    if installed is not None:
        found += _unknown_pipelines(data, installed)
    order = {path: index for index, path in enumerate(_paths(data))}
    return sorted(found, key=lambda problem: _position(problem.path, order))


def subtable_problems(data: Any, definition: str, path: Path) -> list[Problem]:
    """The problems of one table checked against the schema's $defs/definition, as if found at path."""
    return _unique(BUNDLED.problems(data, definition=definition, base=path))


def _unique(found: Iterable[SchemaProblem]) -> list[Problem]:
    """One problem per location: a value that breaks several keywords is described once, as a whole."""
    by_path: dict[Path, Problem] = {}
    for problem in found:
        if problem.path not in by_path:
            by_path[problem.path] = Problem(problem.path, _explain(problem), problem.keyword)
    return list(by_path.values())


def _unknown_pipelines(data: Any, installed: Callable[[], Iterable[str]]) -> list[Problem]:
    tables = data.get("pipelines") if isinstance(data, dict) else None
    if not isinstance(tables, dict):
        return []
    names = [name for name in tables if name not in BUILTIN_PIPELINES]
    if not names:
        return []
    known = sorted({*BUILTIN_PIPELINES, *installed()})
    return [
        Problem(
            ("pipelines", name),
            f"{location(('pipelines', name), table=True)} is not a built-in or installed pipeline"
            + (suggest(name, known) or f" (pipelines: {', '.join(known)})"),
            "pipeline",
        )
        for name in names
        if name not in known
    ]


def location(path: Path, *, table: bool = False) -> str:
    """A key as TOML writes it: `watch.poll_interval`, `prices."qwen2.5:14b"`; a section as `[watch]`."""
    if not path:
        return "the config"
    dotted = ".".join(toml_key(str(part)) for part in path if not isinstance(part, int))
    dotted += "".join(f"[{part}]" for part in path if isinstance(part, int))  # a list item: only last
    return f"[{dotted}]" if table or len(path) == 1 else dotted


def toml_key(key: str) -> str:
    """One key as TOML writes it: bare when it can be, else quoted."""
    return key if _BARE_KEY.match(key) else json.dumps(key, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------
# jsonschema errors in plain words


def _explain(problem: SchemaProblem) -> str:
    path, keyword = problem.path, problem.keyword
    if keyword == "additionalProperties":
        return _unknown_key(path, list(problem.allowed))
    if keyword == "required":
        about = problem.schema.get("properties", {}).get(path[-1], {}).get("description")
        return f"{location(path)} is missing" + (f": {about}" if about else "")
    if keyword in _VALUE_KEYWORDS:
        got = show(problem.instance) if is_number(problem.instance) else describe(problem.instance)
        return f"{location(path)} must be {expected(problem.schema)}, not {got}"
    return f"{location(path)}: {problem.message}"  # a keyword added to the schema later


_VALUE_KEYWORDS = frozenset({"type", "enum", "minimum", "exclusiveMinimum", "pattern", "minLength"})


def _unknown_key(path: Path, allowed: list[str]) -> str:
    key = path[-1]
    if path in REMOVED_KEYS:
        return (
            f"{location(path)} is not a known key (this setting was removed: {REMOVED_KEYS[path]}; delete it)"
        )
    if len(path) == 1:
        close = closest(key, allowed)
        hint = f"did you mean [{close}]?" if close else f"sections: {', '.join(f'[{n}]' for n in allowed)}"
        return f"{location(path)} is not a known section ({hint})"
    if not allowed:
        return f"{location(path)} is not a known key ({location(path[:-1], table=True)} takes no keys)"
    # a key cut short ("input" for "input_per_mtok") is as likely a slip as a misspelt one
    starting = [name for name in allowed if name.startswith(str(key))]
    close = closest(key, allowed) or (starting[0] if len(starting) == 1 else None)
    hint = f"did you mean {json.dumps(close)}?" if close else f"keys: {', '.join(allowed)}"
    return f"{location(path)} is not a known key ({hint})"


def expected(node: Mapping[str, Any]) -> str:
    """What a value must be, in words, from its whole schema (its $ref resolved)."""
    if "$ref" in node:
        beside = {key: value for key, value in node.items() if key != "$ref"}
        node = {**BUNDLED.data["$defs"][node["$ref"].removeprefix("#/$defs/")], **beside}
    if "enum" in node:
        return "one of " + ", ".join(map(str, node["enum"]))
    kinds = node.get("type", [])
    return " or ".join(_kind_words(kind, node) for kind in ([kinds] if isinstance(kinds, str) else kinds))


def _kind_words(kind: str, node: Mapping[str, Any]) -> str:
    if kind in ("number", "integer"):
        noun = "number" if kind == "number" else "whole number"
        if node.get("exclusiveMinimum") == 0:
            return f"a positive {noun}"
        if "minimum" in node:
            return f"a {noun} >= {node['minimum']:g}"
        return f"a {noun}"
    if kind == "string":
        if node.get("pattern") == "\\S" or node.get("minLength", 0) > 0:
            return "a non-empty string"
        if node.get("pattern") == URL_PATTERN:
            return "an http:// or https:// URL"
        if "pattern" in node:
            return "a name of letters, digits, '.', '_' and '-'"
        return "a string"
    if kind == "array" and node.get("items", {}).get("type") == "string":
        return "a list of strings"
    return "a table" if kind == "object" else TYPE_WORDS.get(kind, kind)


# ---------------------------------------------------------------------------------------------
# document order


def _paths(data: Any, prefix: Path = ()) -> Iterator[Path]:
    """Every location in data, in the order TOML read it."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield (*prefix, key)
            yield from _paths(value, (*prefix, key))


def _position(path: Path, order: dict[Path, int]) -> tuple[int, int]:
    """Where path stands in the document (a missing key: right after its table)."""
    for depth in range(len(path), -1, -1):
        if path[:depth] in order:
            return order[path[:depth]], len(path) - depth
    return -1, len(path)
