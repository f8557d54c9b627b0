"""One engine tool: name, description, JSON Schema parameters, and the check of the model's arguments."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stellafleet.engine.errors import FormatError
from stellafleet.engine.messages import ToolSpec

_JSON_TYPE = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return _JSON_TYPE.get(type(value), type(value).__name__)


def param(kind: str, description: str) -> dict[str, Any]:
    if kind == "array":
        return {"type": "array", "items": {"type": "string"}, "description": description}
    return {"type": kind, "description": description}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    params: dict[str, dict[str, Any]]
    required: tuple[str, ...]
    run: Callable[[dict[str, Any]], str]

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(
            self.name,
            self.description,
            {"type": "object", "properties": self.params, "required": list(self.required)},
        )

    def check(self, args: Any) -> dict[str, Any]:
        """The arguments, type-checked (numbers and booleans given as text are accepted); FormatError."""
        takes = ", ".join(self.params) or "no arguments"
        if not isinstance(args, dict):
            raise FormatError(
                f"{self.name}: the arguments must be a JSON object, not {_kind(args)} ({takes})"
            )
        unknown = [k for k in args if k not in self.params]
        if unknown:
            raise FormatError(f"{self.name}: unknown argument {unknown[0]!r} (it takes: {takes})")
        missing = [k for k in self.required if args.get(k) is None]
        if missing:
            raise FormatError(f"{self.name}: missing required argument {missing[0]!r} (it takes: {takes})")
        checked: dict[str, Any] = {}
        for key, value in args.items():
            if value is None:
                continue
            kind = self.params[key]["type"]
            checked[key] = _coerce(self.name, key, kind, value)
        return checked


def _coerce(tool: str, key: str, kind: str, value: Any) -> Any:
    bad = FormatError(
        f"{tool}: argument {key!r} must be {'an' if kind[0] in 'aio' else 'a'} {kind}, got {_kind(value)}"
    )
    if kind == "string":
        if not isinstance(value, str):
            raise bad
        return value
    if kind == "integer":
        if isinstance(value, bool):
            raise bad
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
        raise bad
    if kind == "boolean":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise bad
    if kind == "array":
        if isinstance(value, str):
            return [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise bad
        return value
    raise AssertionError(kind)
