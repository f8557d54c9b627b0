"""The bundled JSON Schemas checked by jsonschema, its errors as one SchemaProblem per thing to fix."""

from __future__ import annotations

import datetime
import difflib
import functools
import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path as FilePath
from typing import TYPE_CHECKING, Any

from stellafleet.core.terminal import printable

if TYPE_CHECKING:
    import jsonschema

_SURROGATE = re.compile("[\ud800-\udfff]")
Path = tuple[Any, ...]  # a location inside checked data: keys and list indexes


@dataclass(frozen=True)
class SchemaProblem:
    """One thing wrong at `path`: the JSON Schema `keyword` it breaks, with its `expected` value."""

    path: Path
    keyword: str
    expected: Any
    schema: Mapping[str, Any]
    instance: Any
    message: str  # jsonschema's own words, for a keyword nobody phrases
    allowed: tuple[str, ...] = ()


class BundledSchema:
    """A schema file shipped beside its module: its text, its data and jsonschema's validator."""

    def __init__(self, path: FilePath, *, finite: bool = False) -> None:
        """finite: a "number" is finite and an "integer" an int (not 1e9)."""
        self.path = path
        self.finite = finite
        self._validators: dict[str | None, jsonschema.Draft202012Validator] = {}

    @functools.cached_property
    def text(self) -> str:
        return self.path.read_text(encoding="utf-8")

    @functools.cached_property
    def data(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.text)
        return loaded

    def validator(self, definition: str | None = None) -> jsonschema.Draft202012Validator:
        """The validator of the whole schema, or of one of its $defs (its references resolved)."""
        if definition not in self._validators:
            root = (
                self.data
                if definition is None
                else {"$ref": f"#/$defs/{definition}", "$defs": self.data["$defs"]}
            )
            self._validators[definition] = _validator_kind(self.finite)(root)
        return self._validators[definition]

    def problems(self, data: Any, *, definition: str | None = None, base: Path = ()) -> list[SchemaProblem]:
        """Every problem of data, as found at base (jsonschema's order); [] when valid."""
        errors = self.validator(definition).iter_errors(data)
        return [problem for error in errors for problem in _split(error, base)]


def _finite_number(checker: Any, instance: Any) -> bool:
    if isinstance(instance, bool) or not isinstance(instance, int | float):
        return False
    try:
        return math.isfinite(instance)
    except OverflowError:  # an int beyond any float
        return False


def _whole_number(checker: Any, instance: Any) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


@functools.cache
def _validator_kind(finite: bool) -> Any:
    # imported when a document is first checked: a worker whose config is known good never loads it
    import jsonschema

    if not finite:
        return jsonschema.Draft202012Validator
    return jsonschema.validators.extend(
        jsonschema.Draft202012Validator,
        type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine_many(
            {"number": _finite_number, "integer": _whole_number}
        ),
    )


def _split(error: jsonschema.ValidationError, base: Path) -> Iterator[SchemaProblem]:
    path: Path = (*base, *error.absolute_path)
    instance = error.instance
    common = {
        "keyword": str(error.validator),
        "expected": error.validator_value,
        "schema": error.schema if isinstance(error.schema, Mapping) else {},
        "message": error.message,
    }
    if error.validator == "additionalProperties" and isinstance(instance, dict):
        allowed = tuple(common["schema"].get("properties", {}))
        for key in instance:
            if key not in allowed:
                # a non-string key (YAML allows them) must not pass for a list index
                where = (*path, key if isinstance(key, str) else repr(key))
                yield SchemaProblem(where, instance=key, allowed=allowed, **common)
    elif error.validator == "required" and isinstance(instance, dict):
        for name in error.validator_value:
            if name not in instance:
                yield SchemaProblem((*path, name), instance=None, **common)
    else:
        yield SchemaProblem(path, instance=instance, **common)


TYPE_WORDS = {
    "array": "a list",
    "string": "a string",
    "number": "a number",
    "integer": "a whole number",
    "boolean": "true or false",
    "null": "null",
}


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def closest(value: Any, choices: list[Any] | tuple[Any, ...]) -> str | None:
    """The choice value most likely misspells, or None."""
    if not isinstance(value, str):
        return None
    names = [choice for choice in choices if isinstance(choice, str)]
    close = difflib.get_close_matches(value, names, n=1, cutoff=0.6)
    return close[0] if close else None


def suggest(value: Any, choices: list[Any] | tuple[Any, ...], *, listing: bool = False) -> str:
    """' (did you mean "x"?)' for the closest choice; with listing, else every choice; or ''."""
    close = closest(value, choices)
    if close is not None:
        return f" (did you mean {json.dumps(close)}?)"
    names = [choice for choice in choices if isinstance(choice, str)]
    if listing and names:
        return f" (expected one of: {', '.join(names)})"
    return ""


def article(word: str) -> str:
    return f"an {word}" if word[:1] in "aeiou" else f"a {word}"


def show(value: Any) -> str:
    """A value as a user wrote it: strings in double quotes, containers by kind only."""
    if isinstance(value, str):
        # a lone surrogate (no text) is escaped
        text = printable(
            _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(value, ensure_ascii=False))
        )
        return text if len(text) <= 60 else text[:56] + '..."'
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int) and value.bit_length() > 100:
        return "a very large number"
    if isinstance(value, int | float):
        return repr(value)
    return describe(value)


def describe(value: Any, table_word: str = "table") -> str:
    """What kind of value this is, with the value itself when it is short."""
    if isinstance(value, bool):
        return f"a boolean ({show(value)})"
    if isinstance(value, str):
        return f"a string ({show(value)})"
    if isinstance(value, int | float):
        return f"a number ({show(value)})"
    if value is None:
        return "null"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return article(table_word)
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return f"a date/time ({value.isoformat()})"
    return f"a {type(value).__name__}"


def sort_key(path: Path) -> tuple[tuple[int, Any], ...]:
    """Document order for locations: list indexes before keys, each in order."""
    return tuple((0, part) if isinstance(part, int) else (1, str(part)) for part in path)
