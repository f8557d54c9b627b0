"""Pipeline plugins, found through the `stella.pipelines` entry-point group."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from stellafleet.config import Config
from stellafleet.errors import StellaError
from stellafleet.pipelines.base import Pipeline, PipelineResult, SpendReporter

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

GROUP = "stella.pipelines"

__all__ = ["GROUP", "Pipeline", "PipelineResult", "SpendReporter", "available", "load", "preflight"]


def _entry_points() -> dict[str, EntryPoint]:
    # Imported here, not at the top: every fleet worker imports this package, and importlib.metadata
    # is a large share of a worker's start-up time (the fleet's per-task overhead).
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=GROUP)}


def available() -> dict[str, EntryPoint]:
    """Installed variants by name (not imported yet)."""
    return dict(sorted(_entry_points().items()))


def load(name: str) -> Pipeline:
    eps = _entry_points()
    if name not in eps:
        installed = ", ".join(sorted(eps)) or "none"
        raise StellaError(f"unknown pipeline {name!r}: installed pipelines are {installed}")
    try:
        factory = eps[name].load()
    except Exception as exc:  # a broken third-party plugin must not take stella down with a traceback
        raise StellaError(f"pipeline {name!r} failed to load from {eps[name].value}: {exc}") from None
    pipeline: Pipeline = factory()
    return pipeline


# --- preflight (pipelines area): checked by the fleet before anything starts ---


def preflight(names: Iterable[str], config: Config) -> list[str]:
    """Every problem that keeps the named pipelines from running (empty when all are ready)."""
    problems: list[str] = []
    for name in dict.fromkeys(names):
        try:
            pipeline = load(name)
        except StellaError as exc:
            problems.append(str(exc))
            continue
        try:
            problem = pipeline.preflight(config)
        except StellaError as exc:
            problem = str(exc)
        except Exception as exc:  # a third-party plugin's bug is reported, not raised
            problem = f"preflight failed: {type(exc).__name__}: {exc}"
        if problem:
            named = problem.startswith(f"pipeline {name}")
            problems.append(problem if named else f"pipeline {name}: {problem}")
    return problems
