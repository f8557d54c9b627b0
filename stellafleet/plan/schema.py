"""The bundled plan JSON Schema: a compiled fast check, and jsonschema's errors in plain words.

Valid plans (the common case, and the big ones) are checked by a validator compiled once from the
schema into plain Python closures (core/schemacheck.py); only a plan that fails it goes through
jsonschema, whose errors are then turned into one readable problem each. The compiled check is
conservative: when it says "valid", jsonschema agrees (a property test holds it to that); when in doubt
it says "invalid" and jsonschema has the last word.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path as FilePath
from typing import Any

from stellafleet.core.schemacheck import (
    TYPE_WORDS,
    BundledSchema,
    Check,
    Path,
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


def schema() -> dict[str, Any]:
    return BUNDLED.data


def compiled_check() -> Check:
    """A fast validity check compiled once from the schema; True means jsonschema would accept too."""
    return BUNDLED.check


def is_valid(data: Any) -> bool:
    return BUNDLED.is_valid(data)


def schema_problems(data: Any, *, table_word: str = "table") -> list[tuple[Path, str]]:
    """Every schema violation as (location, message), in document order; [] when valid."""
    if is_valid(data):
        return []
    try:
        errors = list(BUNDLED.validator.iter_errors(data))
    except RecursionError:
        return [((), "the plan is nested too deeply (a self-referencing YAML alias?)")]
    problems: list[tuple[Path, str]] = []
    for error in errors:
        problems.extend(_explain(error, table_word))
    problems.sort(key=lambda item: sort_key(item[0]))
    return problems


# ---------------------------------------------------------------------------------------------
# jsonschema errors in plain words


def _explain(error: Any, table_word: str) -> Iterator[tuple[Path, str]]:
    path: Path = tuple(error.absolute_path)
    keyword = error.validator
    instance = error.instance
    if keyword == "required":
        for name in error.validator_value:
            if isinstance(instance, dict) and name not in instance:
                yield (*path, name), _missing(path, name)
    elif keyword == "additionalProperties":
        allowed = list(error.schema.get("properties", {}))
        for key in instance if isinstance(instance, dict) else ():
            if key not in allowed:  # a non-string key (YAML allows them) must not pass for a list index
                yield (
                    (*path, key if isinstance(key, str) else repr(key)),
                    f"unknown key{suggest(key, allowed, listing=True)}",
                )
    elif keyword == "type":
        yield path, _wrong_type(path, error.validator_value, instance, table_word)
    elif keyword == "enum":
        choices = " or ".join(json.dumps(choice) for choice in error.validator_value)
        yield path, f"must be {choices}, not {show(instance)}{suggest(instance, error.validator_value)}"
    elif keyword == "pattern":
        yield path, _pattern(error.validator_value, instance)
    elif keyword in ("minLength", "minItems"):
        yield path, "the plan has no tasks" if path == ("tasks",) else "must not be empty"
    elif keyword == "maxLength":
        yield path, f"{show(instance)} is longer than {error.validator_value} characters"
    elif keyword == "uniqueItems":
        yield path, f"{show(_first_repeat(instance))} is listed more than once"
    elif keyword == "exclusiveMinimum":
        yield path, f"must be a number of seconds greater than {error.validator_value}, not {show(instance)}"
    else:  # a keyword added to the schema later: jsonschema's own words are still one clear line
        yield path, error.message


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
