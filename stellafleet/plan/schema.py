"""The bundled plan JSON Schema: a compiled fast check, and jsonschema's errors in plain words.

Valid plans (the common case, and the big ones) are checked by a validator compiled once from the
schema into plain Python closures; only a plan that fails it goes through jsonschema, whose errors
are then turned into one readable problem each. The compiled check is conservative: when it says
"valid", jsonschema agrees (a property test holds it to that); when in doubt it says "invalid" and
jsonschema has the last word.
"""

from __future__ import annotations

import datetime
import difflib
import functools
import json
import math
import re
from collections.abc import Callable, Iterator
from importlib import resources
from typing import Any

import jsonschema

Check = Callable[[Any], bool]
Path = tuple[Any, ...]  # a location inside the plan data: keys and list indexes

ID_PATTERN = "^[A-Za-z0-9._-]+$"
_ANNOTATIONS = frozenset(
    {"$schema", "$id", "$defs", "$comment", "title", "description", "default", "examples", "deprecated"}
)


@functools.cache
def schema_text() -> str:
    """The schema exactly as shipped (what `stella plan schema` prints)."""
    return resources.files("stellafleet").joinpath("plan/plan.schema.json").read_text(encoding="utf-8")


@functools.cache
def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(schema_text())
    return loaded


@functools.cache
def _validator() -> Any:
    return jsonschema.Draft202012Validator(schema())


@functools.cache
def compiled_check() -> Check:
    """A fast validity check compiled once from the schema; True means jsonschema would accept too."""
    return _Compiler(schema()).compile(schema())


def is_valid(data: Any) -> bool:
    try:
        return compiled_check()(data)
    except RecursionError:
        return False


def schema_problems(data: Any, *, table_word: str = "table") -> list[tuple[Path, str]]:
    """Every schema violation as (location, message), in document order; [] when valid."""
    if is_valid(data):
        return []
    try:
        errors = list(_validator().iter_errors(data))
    except RecursionError:
        return [((), "the plan is nested too deeply (a self-referencing YAML alias?)")]
    problems: list[tuple[Path, str]] = []
    for error in errors:
        problems.extend(_explain(error, table_word))
    problems.sort(key=lambda item: _sort_key(item[0]))
    return problems


# ---------------------------------------------------------------------------------------------
# the compiled check


class _Compiler:
    """Turns the subset of JSON Schema the plan schema uses into nested closures."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self.refs: dict[str, Check] = {}

    def compile(self, node: dict[str, Any]) -> Check:
        checks: list[Check] = []
        unknown = set(node) - _ANNOTATIONS - _SUPPORTED
        if unknown:
            raise ValueError(f"the compiled plan check does not support schema keywords {sorted(unknown)}")
        if "$ref" in node:
            checks.append(self._ref(node["$ref"]))
        kind = node.get("type")
        # a single type merges into its keywords' closure (one call per value instead of two)
        strict = {"string": False, "array": False, "object": False}
        if isinstance(kind, str) and kind in strict:
            strict[kind] = True
        elif kind is not None:
            checks.append(_type_check(kind))
        if "enum" in node:
            choices = list(node["enum"])
            if not all(isinstance(choice, str) for choice in choices):
                raise ValueError("the compiled plan check supports string enums only")
            checks.append(lambda value: isinstance(value, str) and value in choices)
        if strict["string"] or any(key in node for key in ("pattern", "minLength", "maxLength")):
            checks.append(self._string(node, strict["string"]))
        if "exclusiveMinimum" in node:
            floor = node["exclusiveMinimum"]
            checks.append(lambda value: not _is_number(value) or value > floor)
        if strict["array"] or any(key in node for key in ("items", "minItems", "uniqueItems")):
            checks.append(self._array(node, strict["array"]))
        if strict["object"] or any(key in node for key in ("properties", "required", "additionalProperties")):
            checks.append(self._object(node, strict["object"]))
        return _all_of(checks)

    def _ref(self, ref: str) -> Check:
        # every reference resolves to the same compiled closure (a placeholder first, so a
        # schema that refers to itself compiles too)
        if not ref.startswith("#/$defs/"):
            raise ValueError(f"the compiled plan check resolves local $defs only, not {ref}")
        if ref not in self.refs:
            target = self.root["$defs"][ref.removeprefix("#/$defs/")]
            cell: list[Check] = []
            self.refs[ref] = lambda value: cell[0](value)
            cell.append(self.compile(target))
            self.refs[ref] = cell[0]
        return self.refs[ref]

    def _string(self, node: dict[str, Any], strict: bool) -> Check:
        search = re.compile(node["pattern"]).search if "pattern" in node else None
        low = node.get("minLength", 0)
        high = node.get("maxLength", math.inf)

        def check(value: Any) -> bool:
            if not isinstance(value, str):
                return not strict
            return low <= len(value) <= high and (search is None or search(value) is not None)

        return check

    def _array(self, node: dict[str, Any], strict: bool) -> Check:
        item = self.compile(node["items"]) if "items" in node else None
        low = node.get("minItems", 0)
        unique = bool(node.get("uniqueItems", False))

        def check(value: Any) -> bool:
            if not isinstance(value, list):
                return not strict
            if len(value) < low:
                return False
            # uniqueness is decided exactly for strings; anything else is left to jsonschema
            if unique and (
                not all(type(element) is str for element in value) or len(set(value)) != len(value)
            ):
                return False
            if item is not None:
                for element in value:
                    if not item(element):
                        return False
            return True

        return check

    def _object(self, node: dict[str, Any], strict: bool) -> Check:
        properties = {key: self.compile(sub) for key, sub in node.get("properties", {}).items()}
        required = tuple(node.get("required", ()))
        additional = node.get("additionalProperties", True)
        if additional not in (True, False):
            raise ValueError("the compiled plan check supports additionalProperties true or false only")

        def check(value: Any) -> bool:
            if not isinstance(value, dict):
                return not strict
            for key in required:
                if key not in value:
                    return False
            for key, element in value.items():
                sub = properties.get(key) if type(key) is str else None
                if sub is None:
                    if not additional:
                        return False
                elif not sub(element):
                    return False
            return True

        return check


_SUPPORTED = frozenset(
    {
        "$ref",
        "type",
        "enum",
        "pattern",
        "minLength",
        "maxLength",
        "exclusiveMinimum",
        "items",
        "minItems",
        "uniqueItems",
        "properties",
        "required",
        "additionalProperties",
    }
)


def _all_of(checks: list[Check]) -> Check:
    """One closure for several checks (plain calls: this runs for every value of a big plan)."""
    if not checks:
        return lambda value: True
    if len(checks) == 1:
        return checks[0]
    if len(checks) == 2:
        first, second = checks
        return lambda value: first(value) and second(value)

    return lambda value: all(one(value) for one in checks)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


_TYPE_TESTS: dict[str, Check] = {
    "object": lambda value: isinstance(value, dict),
    "array": lambda value: isinstance(value, list),
    "string": lambda value: isinstance(value, str),
    "number": _is_number,
    "integer": lambda value: (
        (isinstance(value, int) and not isinstance(value, bool))
        or (isinstance(value, float) and value.is_integer())
    ),
    "boolean": lambda value: isinstance(value, bool),
    "null": lambda value: value is None,
}


def _type_check(kind: str | list[str]) -> Check:
    kinds = [kind] if isinstance(kind, str) else list(kind)
    tests = [_TYPE_TESTS[name] for name in kinds]
    if len(tests) == 1:
        return tests[0]
    return lambda value: any(test(value) for test in tests)


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
                    f"unknown key{_suggest(key, allowed, listing=True)}",
                )
    elif keyword == "type":
        yield path, _wrong_type(path, error.validator_value, instance, table_word)
    elif keyword == "enum":
        choices = " or ".join(json.dumps(choice) for choice in error.validator_value)
        yield path, f"must be {choices}, not {show(instance)}{_suggest(instance, error.validator_value)}"
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


_TYPE_WORDS = {
    "array": "a list",
    "string": "a string",
    "number": "a number",
    "integer": "a whole number",
    "boolean": "true or false",
    "null": "null",
}


def _wrong_type(path: Path, expected: str | list[str], instance: Any, table_word: str) -> str:
    kinds = [expected] if isinstance(expected, str) else list(expected)
    table = _article(table_word)
    words = " or ".join(table if kind == "object" else _TYPE_WORDS.get(kind, kind) for kind in kinds)
    if path == ():
        return f'a plan must be {table} with a "tasks" list, not {describe(instance, table_word)}'
    hint = ""
    if "array" in kinds and isinstance(instance, str):
        hint = f" (write [{json.dumps(instance)}])"
    return f"must be {words}, not {describe(instance, table_word)}{hint}"


def _article(word: str) -> str:
    return f"an {word}" if word[:1] in "aeiou" else f"a {word}"


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


def _suggest(value: Any, choices: list[Any], *, listing: bool = False) -> str:
    names = [choice for choice in choices if isinstance(choice, str)]
    if isinstance(value, str):
        close = difflib.get_close_matches(value, names, n=1, cutoff=0.6)
        if close:
            return f" (did you mean {json.dumps(close[0])}?)"
    if listing and names:
        return f" (expected one of: {', '.join(names)})"
    return ""


def suggest(value: str, choices: list[str]) -> str:
    """' (did you mean "x"?)' for the closest choice, or ''."""
    return _suggest(value, choices)


def show(value: Any) -> str:
    """A value as a user wrote it: strings in double quotes, containers by kind only."""
    if isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
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
        return _article(table_word)
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return f"a date/time ({value.isoformat()})"
    return f"a {type(value).__name__}"


def _sort_key(path: Path) -> tuple[tuple[int, Any], ...]:
    return tuple((0, part) if isinstance(part, int) else (1, str(part)) for part in path)
