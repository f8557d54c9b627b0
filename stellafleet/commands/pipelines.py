"""`stella pipelines`: the installed pipeline variants, what each wraps, and whether it is ready to run."""

from __future__ import annotations

import argparse
import shutil
from importlib.metadata import EntryPoint
from typing import Any

from stellafleet import pipelines
from stellafleet.commands import config_file_arg, repository_or_none
from stellafleet.core import jsontext
from stellafleet.core.config import Config, load_config
from stellafleet.core.errors import EXIT_OK, StellaError
from stellafleet.core.terminal import aligned
from stellafleet.pipelines.agentcli import AgentCliPipeline


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "pipelines",
        help="list the installed pipeline variants and whether each is ready",
        description=(
            "List the pipeline variants installed through the `stella.pipelines` entry-point group: what "
            "each wraps, whether that CLI is on PATH, its version, and what (if anything) keeps it from "
            "running."
        ),
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.set_defaults(func=run)


def describe(name: str, entry: EntryPoint, config: Config) -> dict[str, Any]:
    """One variant: where it comes from, what it wraps, and whether it is ready."""
    dist = getattr(entry, "dist", None)
    info: dict[str, Any] = {
        "name": name,
        "entry_point": entry.value,
        "package": f"{dist.name} {dist.version}" if dist is not None else None,
        "description": None,
        "wraps": None,
        "cli_path": None,
        "version": None,
        "ready": False,
        "problem": None,
    }
    try:
        pipeline = pipelines.load(name)
        info["description"] = str(getattr(pipeline, "description", "") or "")
        if isinstance(pipeline, AgentCliPipeline):
            info["wraps"] = pipeline.settings(config).binary
            info["cli_path"] = pipeline.cli_path(config)
            info["version"] = pipeline.version(config) if info["cli_path"] else None
        else:
            wraps = getattr(pipeline, "wraps", None)  # optional (the Pipeline protocol says so)
            if isinstance(wraps, str) and wraps:
                info["wraps"] = wraps
                info["cli_path"] = shutil.which(wraps)
            info["version"] = pipeline.version()
        info["problem"] = pipeline.preflight(config)
    except StellaError as exc:
        info["problem"] = str(exc)
    except Exception as exc:  # a broken plugin is listed as broken, not allowed to hide the others
        info["problem"] = f"{type(exc).__name__}: {exc}"
    info["ready"] = info["problem"] is None
    return info


def render_table(rows: list[dict[str, Any]]) -> str:
    header = ("NAME", "WRAPS", "ON PATH", "VERSION", "STATUS", "PACKAGE", "DESCRIPTION")
    table = [header]
    for row in rows:
        on_path = "-" if row["wraps"] is None else ("yes" if row["cli_path"] else "no")
        table.append(
            (
                row["name"],
                row["wraps"] or "-",
                on_path,
                row["version"] or "-",
                "ready" if row["ready"] else "not ready",
                row["package"] or "-",
                row["description"] or "",
            )
        )
    lines = aligned(table)
    problems = [_problem_lines(row["name"], row["problem"]) for row in rows if row["problem"]]
    if problems:
        lines += ["", "not ready:", *problems]
    return "\n".join(lines)


def _problem_lines(name: str, problem: str) -> str:
    text = problem.removeprefix(f"pipeline {name}: ")
    return "\n".join(f"    {line}" if i else f"  {name}: {line}" for i, line in enumerate(text.splitlines()))


def run(args: argparse.Namespace) -> int:
    # it also works outside a repository (the user's file and --config)
    config = load_config(repository_or_none(), config_file=config_file_arg(args))
    rows = [describe(name, entry, config) for name, entry in pipelines.available().items()]
    if args.json:
        print(jsontext.dumps({"pipelines": rows}, indent=2))
    elif not rows:
        print("no pipelines installed (the `stella.pipelines` entry-point group is empty)")
    else:
        print(render_table(rows))
    return EXIT_OK
