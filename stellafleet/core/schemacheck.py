"""JSON Schema checks compiled into plain Python closures, and values described in plain words.

The bundled schemas (plans, the config) are checked on every load, most often with data that is valid.
jsonschema takes a tenth of a second to import and builds a validator per schema, so a schema is
compiled once, here, into nested closures over the subset of JSON Schema the bundled schemas use; only
data that fails the compiled check goes through jsonschema (imported then), whose errors the callers
turn into plain words. The compiled check is conservative: when it says "valid", jsonschema agrees
(property tests hold it to that); when in doubt it says "invalid" and jsonschema has the last word.
"""

from __future__ import annotations

import datetime
import functools
import json
import math
import re
from collections.abc import Callable
from pathlib import Path as FilePath
from typing import Any

Check = Callable[[Any], bool]
Path = tuple[Any, ...]  # a location inside checked data: keys and list indexes

_ANNOTATIONS = frozenset(
    {"$schema", "$id", "$defs", "$comment", "title", "description", "default", "examples", "deprecated"}
)


def compile_check(schema: dict[str, Any]) -> Check:
    """A fast validity check for schema; True means jsonschema would accept the data too."""
    return SchemaCompiler(schema).compile(schema)


def run_check(check: Check, data: Any) -> bool:
    """check(data), where data nested too deeply (a self-referencing YAML alias) counts as invalid."""
    try:
        return check(data)
    except RecursionError:
        return False


class BundledSchema:
    """A schema file shipped inside the package: its text, its data, the compiled check, and jsonschema's
    validator, each made once and only when first asked for."""

    def __init__(self, path: FilePath) -> None:
        # read beside its module: importlib.resources would cost a worker more than the whole check
        self.path = path

    @functools.cached_property
    def text(self) -> str:
        return self.path.read_text(encoding="utf-8")

    @functools.cached_property
    def data(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.text)
        return loaded

    @functools.cached_property
    def check(self) -> Check:
        return compile_check(self.data)

    @functools.cached_property
    def validator(self) -> Any:
        import jsonschema  # a tenth of a second to import: only for data the compiled check refused

        return jsonschema.Draft202012Validator(self.data)

    def is_valid(self, data: Any) -> bool:
        return run_check(self.check, data)


class SchemaCompiler:
    """Turns the subset of JSON Schema the bundled schemas use into nested closures."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self.refs: dict[str, Check] = {}

    def compile(self, node: dict[str, Any]) -> Check:
        checks: list[Check] = []
        unknown = set(node) - _ANNOTATIONS - _SUPPORTED
        if unknown:
            raise ValueError(f"the compiled schema check does not support schema keywords {sorted(unknown)}")
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
                raise ValueError("the compiled schema check supports string enums only")
            checks.append(lambda value: isinstance(value, str) and value in choices)
        if strict["string"] or any(key in node for key in ("pattern", "minLength", "maxLength")):
            checks.append(self._string(node, strict["string"]))
        if "minimum" in node:
            least = node["minimum"]
            checks.append(lambda value: not is_number(value) or value >= least)
        if "exclusiveMinimum" in node:
            floor = node["exclusiveMinimum"]
            checks.append(lambda value: not is_number(value) or value > floor)
        if strict["array"] or any(key in node for key in ("items", "minItems", "uniqueItems")):
            checks.append(self._array(node, strict["array"]))
        if strict["object"] or any(key in node for key in ("properties", "required", "additionalProperties")):
            checks.append(self._object(node, strict["object"]))
        return _all_of(checks)

    def _ref(self, ref: str) -> Check:
        # every reference resolves to the same compiled closure (a placeholder first, so a
        # schema that refers to itself compiles too)
        if not ref.startswith("#/$defs/"):
            raise ValueError(f"the compiled schema check resolves local $defs only, not {ref}")
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
        # additionalProperties: true, false, or a schema every other value must match
        other: Check | None = self.compile(additional) if isinstance(additional, dict) else None
        if other is None and additional not in (True, False):
            raise ValueError("the compiled schema check supports additionalProperties: true, false, a schema")

        def check(value: Any) -> bool:
            if not isinstance(value, dict):
                return not strict
            for key in required:
                if key not in value:
                    return False
            for key, element in value.items():
                sub = properties.get(key) if type(key) is str else None
                if sub is None:
                    if other is not None:
                        if not other(element):
                            return False
                    elif not additional:
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
        "minimum",
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


def is_number(value: Any) -> bool:
    """A JSON number: an int or a float, never a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


_TYPE_TESTS: dict[str, Check] = {
    "object": lambda value: isinstance(value, dict),
    "array": lambda value: isinstance(value, list),
    "string": lambda value: isinstance(value, str),
    "number": is_number,
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
# values in plain words

TYPE_WORDS = {
    "array": "a list",
    "string": "a string",
    "number": "a number",
    "integer": "a whole number",
    "boolean": "true or false",
    "null": "null",
}


def closest(value: Any, choices: list[Any]) -> str | None:
    """The choice value most likely misspells, or None."""
    import difflib  # only when something is wrong

    if not isinstance(value, str):
        return None
    names = [choice for choice in choices if isinstance(choice, str)]
    close = difflib.get_close_matches(value, names, n=1, cutoff=0.6)
    return close[0] if close else None


def suggest(value: Any, choices: list[Any], *, listing: bool = False) -> str:
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
        return article(table_word)
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return f"a date/time ({value.isoformat()})"
    return f"a {type(value).__name__}"


def sort_key(path: Path) -> tuple[tuple[int, Any], ...]:
    """Document order for locations: list indexes before keys, each in order."""
    return tuple((0, part) if isinstance(part, int) else (1, str(part)) for part in path)
