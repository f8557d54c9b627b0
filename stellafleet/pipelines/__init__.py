"""Pipeline plugins, found through the `stella.pipelines` entry-point group."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from stellafleet.core.configschema import PIPELINE_GROUP
from stellafleet.core.errors import StellaError
from stellafleet.core.schemaerrors import suggest

if TYPE_CHECKING:  # not imported at run time: the claim hook, run per tool call, imports this package
    from importlib.metadata import EntryPoint

    from stellafleet.core.config import Config
    from stellafleet.pipelines.base import Pipeline

# stella's own entry points (pyproject.toml, checked by a test): a worker loads its built-in pipeline without
# importlib.metadata reading every installed package's metadata
BUILTIN = {
    "plain": "stellafleet.pipelines.plain:PlainPipeline",
    "command": "stellafleet.pipelines.command:CommandPipeline",
    "claude-code": "stellafleet.pipelines.claude_code:ClaudeCodePipeline",
    "codex": "stellafleet.pipelines.codex:CodexPipeline",
    "aider": "stellafleet.pipelines.aider:AiderPipeline",
}


def available() -> dict[str, EntryPoint]:
    """Installed variants by name (not imported yet)."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in sorted(entry_points(group=PIPELINE_GROUP), key=lambda ep: ep.name)}


def unknown_pipeline(name: str, installed: Iterable[str]) -> str:
    """`unknown pipeline 'x'` with the closest installed name, and every installed one."""
    names = sorted(installed)
    listing = ", ".join(names) or "none"
    return f"unknown pipeline {name!r}{suggest(name, names)}: installed pipelines are {listing}"


def load(name: str, installed: Mapping[str, EntryPoint] | None = None) -> Pipeline:
    """The pipeline called name, from the installed ones (`available()`; looked up when not given)."""
    if installed is None and name in BUILTIN:
        module, _, attr = BUILTIN[name].partition(":")
        factory = getattr(importlib.import_module(module), attr)
    else:
        eps = available() if installed is None else installed
        if name not in eps:
            raise StellaError(unknown_pipeline(name, eps))
        try:
            factory = eps[name].load()
        except Exception as exc:  # a broken third-party plugin must not take stella down with a traceback
            raise StellaError(f"pipeline {name!r} failed to load from {eps[name].value}: {exc}") from None
    pipeline: Pipeline = factory()
    return pipeline


# A pipeline name, or (name, model) for tasks that name their own model (None: the configured default).
PipelineUse = str | tuple[str, str | None]


def preflight(
    uses: Iterable[PipelineUse],
    config: Config,
    *,
    spend_limited: bool = False,
    installed: Mapping[str, EntryPoint] | None = None,
) -> list[str]:
    """Every problem that keeps these pipelines from running (empty: ready), asked once per model."""
    problems: list[str] = []
    loaded: dict[str, Pipeline | None] = {}
    for name, model in dict.fromkeys((use, None) if isinstance(use, str) else use for use in uses):
        if name not in loaded:
            try:
                loaded[name] = load(name, installed)
            except StellaError as exc:
                loaded[name] = None
                problems.append(str(exc))
        pipeline = loaded[name]
        if pipeline is None:
            continue
        problem = ask_preflight(pipeline, config, spend_limited=spend_limited, model=model)
        if problem:
            named = problem if problem.startswith(f"pipeline {name}") else f"pipeline {name}: {problem}"
            if named not in problems:
                problems.append(named)
    return problems


def ask_preflight(
    pipeline: Pipeline, config: Config, *, spend_limited: bool, model: str | None
) -> str | None:
    """pipeline.preflight, passing only the keywords it takes; a raised error becomes the problem."""
    facts: dict[str, Any] = {"spend_limited": spend_limited, "model": model}
    try:
        takes = _keywords(pipeline.preflight)
        return pipeline.preflight(config, **{k: v for k, v in facts.items() if takes is None or k in takes})
    except StellaError as exc:
        return str(exc)
    except Exception as exc:  # a third-party plugin's bug is reported, not raised
        return f"preflight failed: {type(exc).__name__}: {exc}"


def _keywords(function: Callable[..., Any]) -> set[str] | None:
    """The keyword arguments function accepts by name; None when it takes any (**kwargs)."""
    import inspect

    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # no signature to read: call it the old way
        return set()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return {p.name for p in parameters if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
