"""Pipeline plugins, found through the `stella.pipelines` entry-point group."""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

from stellafleet.errors import StellaError
from stellafleet.pipelines.base import Pipeline, PipelineResult, SpendReporter

GROUP = "stella.pipelines"

__all__ = ["GROUP", "Pipeline", "PipelineResult", "SpendReporter", "available", "load"]


def _entry_points() -> dict[str, EntryPoint]:
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
