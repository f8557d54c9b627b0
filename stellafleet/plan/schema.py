"""The bundled plan JSON Schema, checked by jsonschema, and each of its problems in plain words."""

from __future__ import annotations

import json
from pathlib import Path as FilePath
from typing import Any

from stellafleet.core.schemaerrors import (
    TYPE_WORDS,
    BundledSchema,
    Path,
    SchemaProblem,
    article,
    describe,
    show,
    sort_key,
    suggest,
)

ID_PATTERN = "^[A-Za-z0-9._-]+$"


BUNDLED = BundledSchema(FilePath(__file__).parent / "plan.schema.json")


def schema_text() -> str:
    """The schema exactly as shipped (what `stella plan schema` prints)."""
    return BUNDLED.text


def schema_problems(data: Any, *, table_word: str = "table") -> list[tuple[Path, str]]:
    """Every schema violation as (location, message), in document order; [] when valid."""
    try:
        found = BUNDLED.problems(data)
    except RecursionError:
        return [((), "the plan is nested too deeply (a self-referencing YAML alias?)")]
    problems = [(problem.path, _explain(problem, table_word)) for problem in found]
    problems.sort(key=lambda item: sort_key(item[0]))
    return problems


def _explain(problem: SchemaProblem, table_word: str) -> str:
    path, keyword, expected, instance = problem.path, problem.keyword, problem.expected, problem.instance
    if keyword == "required":
        return _missing(path[:-1], path[-1])
    if keyword == "additionalProperties":
        return f"unknown key{suggest(instance, problem.allowed, listing=True)}"
    if keyword == "type":
        return _wrong_type(path, expected, instance, table_word)
    if keyword == "enum":
        choices = " or ".join(json.dumps(choice) for choice in expected)
        return f"must be {choices}, not {show(instance)}{suggest(instance, expected)}"
    if keyword == "pattern":
        return _pattern(expected, instance)
    if keyword in ("minLength", "minItems"):
        return "the plan has no tasks" if path == ("tasks",) else "must not be empty"
    if keyword == "maxLength":
        return f"{show(instance)} is longer than {expected} characters"
    if keyword == "uniqueItems":
        return f"{show(_first_repeat(instance))} is listed more than once"
    if keyword == "exclusiveMinimum":
        return f"must be a number of seconds greater than {expected}, not {show(instance)}"
    return problem.message  # a keyword added to the schema later: jsonschema's own words


def _missing(path: Path, name: str) -> str:
    if path == () and name == "tasks":
        return 'missing: a plan is a list of tasks ([[tasks]] in TOML, "tasks": [...] in JSON/YAML)'
    if name == "prompt":
        return "missing: every task needs a prompt"
    if name == "id":
        return "missing: every task needs an id (letters, digits, '.', '_', '-')"
    return "missing"


def _wrong_type(path: Path, expected: str | list[str], instance: Any, table_word: str) -> str:
    kinds = [expected] if isinstance(expected, str) else list(expected)
    table = article(table_word)
    words = " or ".join(table if kind == "object" else TYPE_WORDS.get(kind, kind) for kind in kinds)
    if path == ():
        return f'a plan must be {table} with a "tasks" list, not {describe(instance, table_word)}'
    hint = ""
    if "array" in kinds and isinstance(instance, str):
        hint = f" (write [{json.dumps(instance)}])"
    return f"must be {words}, not {describe(instance, table_word)}{hint}"


def _pattern(pattern: str, instance: Any) -> str:
    if pattern == ID_PATTERN:
        return f"{show(instance)} is not a valid task id: use letters, digits, '.', '_' and '-'"
    if pattern == "\\S":
        return "must not be empty"
    return f"{show(instance)} does not match {pattern}"


def _first_repeat(values: list[Any]) -> Any:
    for index, value in enumerate(values):
        if any(_same(value, other) for other in values[:index]):
            return value
    return values[0] if values else None


def _same(left: Any, right: Any) -> bool:
    return type(left) is type(right) and left == right
