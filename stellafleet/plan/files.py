"""Reading a plan file (TOML, JSON, YAML by suffix), its syntax errors carrying line and column."""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stellafleet.core.errors import PlanError

PLAN_SUFFIXES = (".toml", ".json", ".yaml", ".yml")
# Far above any real plan; reading stops there, so a path like /dev/zero is refused instead of read forever.
MAX_PLAN_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class PlanFile:
    """What a plan file holds, parsed; table_word is what the format calls a table (for messages)."""

    data: Any
    sha256: str
    table_word: str


def read_plan_file(path: str | Path) -> PlanFile:
    """Read and parse a plan file by its suffix; PlanError (with line and column) when it cannot."""
    name = str(path)
    plan_path = Path(path)
    suffix = plan_path.suffix.lower()
    if suffix not in PLAN_SUFFIXES:
        shown = f'"{plan_path.suffix}"' if plan_path.suffix else "(none)"
        raise PlanError([f"{name}: unknown plan format {shown}: use .toml, .json, .yaml or .yml"])
    raw, text = _read(plan_path, name)
    data = _PARSERS[suffix](text, name)
    return PlanFile(data, hashlib.sha256(raw).hexdigest(), _TABLE_WORDS[suffix])


def read_fragment_file(path: Path, name: str) -> PlanFile | None:
    """A fragment from $STELLA_PLAN_OUT (JSON when it starts with `{`, else TOML); None: none written."""
    if not path.exists():
        return None
    raw, text = _read(path, name)
    suffix = ".json" if text.lstrip().startswith("{") else ".toml"
    return PlanFile(_PARSERS[suffix](text, name), hashlib.sha256(raw).hexdigest(), _TABLE_WORDS[suffix])


def _read(plan_path: Path, name: str) -> tuple[bytes, str]:
    """The file's bytes and its UTF-8 text; PlanError when it cannot be read as a plan."""
    try:
        with plan_path.open("rb") as stream:
            raw = stream.read(MAX_PLAN_BYTES + 1)
    except FileNotFoundError:
        raise PlanError([f"{name}: no such file"]) from None
    except IsADirectoryError:
        raise PlanError([f"{name}: is a directory, not a plan file"]) from None
    except OSError as exc:
        raise PlanError([f"{name}: cannot read: {exc.strerror or exc}"]) from None
    if len(raw) > MAX_PLAN_BYTES:
        raise PlanError([f"{name}: larger than {MAX_PLAN_BYTES // (1024 * 1024)} MiB: not a plan file"])
    try:
        return raw, raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise PlanError([f"{name}:{line}: not UTF-8 text (byte {exc.start})"]) from None


def _parse_toml(text: str, name: str) -> Any:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        found = re.search(r"\s*\(at line (\d+), column (\d+)\)$", message)
        if found:
            line, column = found.groups()
            raise PlanError([f"{name}:{line}:{column}: invalid TOML: {message[: found.start()]}"]) from None
        found = re.search(r"\s*\(at end of document\)$", message)
        if found:
            line = text.count("\n") + 1
            problem = f"{name}:{line}: invalid TOML: {message[: found.start()]} at end of file"
            raise PlanError([problem]) from None
        raise PlanError([f"{name}: invalid TOML: {message}"]) from None
    except (ValueError, RecursionError) as exc:
        raise PlanError([f"{name}: invalid TOML: {exc}"]) from None


def _parse_json(text: str, name: str) -> Any:
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                problem = f"{name}: invalid JSON: key {json.dumps(key)} appears twice in one object"
                raise PlanError([problem])
            result[key] = value
        return result

    try:
        return json.loads(text, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as exc:
        raise PlanError([f"{name}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}"]) from None
    except (ValueError, RecursionError) as exc:
        raise PlanError([f"{name}: invalid JSON: {exc}"]) from None


def _parse_yaml(text: str, name: str) -> Any:
    from ruamel.yaml import YAML
    from ruamel.yaml.error import MarkedYAMLError, YAMLError

    try:
        return YAML(typ="safe", pure=True).load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        what = " ".join(part for part in (exc.context, exc.problem) if part) or "cannot parse"
        what = " ".join(what.split())
        where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark is not None else name
        start = exc.context_mark
        if start is not None and mark is not None and start.line != mark.line:
            what += f" (it starts at line {start.line + 1}, column {start.column + 1})"
        raise PlanError([f"{where}: invalid YAML: {what}"]) from None
    except (YAMLError, ValueError, TypeError, RecursionError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PlanError([f"{name}: invalid YAML: {first}"]) from None


_PARSERS: dict[str, Callable[[str, str], Any]] = {
    ".toml": _parse_toml,
    ".json": _parse_json,
    ".yaml": _parse_yaml,
    ".yml": _parse_yaml,
}
_TABLE_WORDS = {".toml": "table", ".json": "object", ".yaml": "mapping", ".yml": "mapping"}


def workspace_of(plan_path: Path) -> Path:
    """The git repository holding the plan (nearest directory with a .git), else its directory."""
    start = plan_path.resolve().parent
    for directory in (start, *start.parents):
        if (directory / ".git").exists():
            return directory
    return start
