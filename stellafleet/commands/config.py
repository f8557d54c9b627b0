"""`stella config`: the effective configuration and where each value came from, and the config's schema."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from typing import Any

from stellafleet.commands import config_file_arg, print_schema, repository_or_none, usage
from stellafleet.core import configschema, jsontext
from stellafleet.core.config import DEFAULT_SOURCE, Config, config_files, load_config
from stellafleet.core.errors import EXIT_OK

Leaf = tuple[tuple[str, ...], Any, str]  # a key's path, its value, where the value came from


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "config",
        help="show the effective configuration, or print its JSON Schema",
        description=(
            "The configuration is ~/.config/stella/config.toml, then .stella/config.toml (or the file "
            "given with --config), then the environment (STELLA_MODEL, STELLA_BASE_URL, STELLA_PROVIDER). "
            "Every file is checked against the bundled schema: any problem stops every command with exit 2."
        ),
    )
    parser.set_defaults(func=lambda args: usage(parser))
    sub = parser.add_subparsers(dest="config_command", metavar="SUBCOMMAND")
    show = sub.add_parser(
        "show", help="every setting in effect and where it came from (exit 2 naming every problem)"
    )
    show.add_argument("--json", action="store_true", help="print one JSON document")
    show.set_defaults(func=show_command)
    schema = sub.add_parser("schema", help="print the bundled config JSON Schema")
    schema.set_defaults(func=lambda args: print_schema(configschema.BUNDLED.text))


def show_command(args: argparse.Namespace) -> int:
    root, config_file = repository_or_none(), config_file_arg(args)
    config = load_config(root, config_file=config_file)
    files = [
        {"kind": file.kind, "path": str(file.path), "exists": file.path.is_file()}
        for file in config_files(root, config_file=config_file)
    ]
    leaves = effective(config)
    if args.json:
        document = {
            "files": files,
            "config": _nested(leaves),
            "sources": {configschema.location(path): source for path, _, source in leaves},
        }
        print(jsontext.dumps(document, indent=2, ensure_ascii=False))
    else:
        print(render(files, leaves))
    return EXIT_OK


def effective(config: Config) -> list[Leaf]:
    """Every setting the code reads, as set or by default (unset optional keys left out), with its source:
    every section of the schema, in its order."""
    sections: dict[str, Any] = {}
    for name in configschema.BUNDLED.data["properties"]:
        sections[name] = _pipelines(config) if name == "pipelines" else _plain(getattr(config, name))
    executor = sections["executor"]  # a task's resources as its file says them: [executor.tasks.ID] resources
    executor["tasks"] = {task: {"resources": wanted} for task, wanted in executor["tasks"].items()}
    return [(path, value, config.origins.get(path, DEFAULT_SOURCE)) for path, value in _leaves(sections)]


def _plain(value: Any) -> Any:
    """A typed section (a dataclass, a mapping of them) as nested dicts."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: _plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    return value


def _pipelines(config: Config) -> dict[str, Any]:
    pipelines = config.pipelines
    command = pipelines.command
    tables: dict[str, Any] = {
        "command": {"run": command.run, "tasks": {task: {"run": run} for task, run in command.tasks.items()}}
    }
    tables.update({name: dataclasses.asdict(agent) for name, agent in pipelines.agents.items()})
    tables.update(pipelines.plugins)
    return tables


def _leaves(data: Any, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    if isinstance(data, dict):
        return [leaf for key, value in data.items() for leaf in _leaves(value, (*prefix, key))]
    if data is None:
        return []
    return [(prefix, list(data) if isinstance(data, tuple) else data)]


def _nested(leaves: list[Leaf]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for path, value, _ in leaves:
        node = nested
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return nested


def render(files: list[dict[str, Any]], leaves: list[Leaf]) -> str:
    """TOML a config file could hold, each value commented with its source; the files read on top."""
    lines = ["# files, lowest first (the environment overrides them):"]
    for file in files:
        lines.append(f"#   {file['kind']:<15} {file['path']}" + ("" if file["exists"] else " (not found)"))
    width = min(max((len(_assignment(path, value)) for path, value, _ in leaves), default=0), 48)
    table: tuple[str, ...] | None = None
    for path, value, source in leaves:
        if path[:-1] != table:
            table = path[:-1]
            lines += ["", configschema.location(table, table=True)]
        lines.append(f"{_assignment(path, value):<{width}}  # {source}")
    return "\n".join(lines)


def _assignment(path: tuple[str, ...], value: Any) -> str:
    return f"{configschema.toml_key(path[-1])} = {_toml(value)}"


def _toml(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    if isinstance(value, int | float | str):
        return jsontext.dumps(value, ensure_ascii=False)
    return jsontext.dumps(str(value))
