"""What a succeeded isolated task left uncommitted is committed for it (a shared task's never is)."""

from __future__ import annotations

from stellafleet.core.errors import StellaError
from stellafleet.core.workercontext import WorkerContext
from stellafleet.git import gitops
from stellafleet.git.lane import commit_paths
from stellafleet.pipelines.base import PipelineResult


def commit_leftovers(ctx: WorkerContext, result: PipelineResult) -> PipelineResult:
    """A succeeded isolated task's uncommitted changes, committed for it; a failed commit fails the task."""
    if not result.success or ctx.shared:
        return result
    try:
        paths = gitops.changed_paths(ctx.workspace)
        if paths:
            message = f"{ctx.task_title or ctx.task_id} ({ctx.pipeline}, uncommitted changes)"
            sha = commit_paths(ctx, paths, message)
            result.summary = f"{result.summary}; committed what it left uncommitted in {sha[:12]}"
    except StellaError as exc:
        result.success = False
        result.summary = f"{result.summary}; its uncommitted changes could not be committed: {exc}"
        result.error = result.summary
    return result
