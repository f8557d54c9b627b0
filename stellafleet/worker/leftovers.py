"""The one rule for what a succeeded isolated task left uncommitted, whatever its pipeline.

An isolated task's worktree has one writer and its branch is its only work product, so what the task
changed but did not commit (an agent whose `git commit` failed in a hook, one that forgot) is committed
for it through the lane, with a message saying so, before the attempt ends. A shared task's tree has other
writers: nothing is committed for it. A task that succeeded with no commit at all is flagged where runs
are shown (state/ledger_runs.py's no_commits).
"""

from __future__ import annotations

from stellafleet.core.errors import StellaError
from stellafleet.core.workercontext import WorkerContext
from stellafleet.git import gitops
from stellafleet.git.lane import commit_paths
from stellafleet.pipelines.base import PipelineResult


def leftover_message(ctx: WorkerContext) -> str:
    return f"{ctx.task_title or ctx.task_id} ({ctx.pipeline}, uncommitted changes)"


def commit_leftovers(ctx: WorkerContext, result: PipelineResult) -> PipelineResult:
    """A succeeded isolated task's uncommitted changes, committed for it; a commit that fails fails the
    task (its work would otherwise be lost with the worktree)."""
    if not result.success or ctx.shared:
        return result
    try:
        paths = gitops.changed_paths(ctx.workspace)
        if paths:
            sha = commit_paths(ctx, paths, leftover_message(ctx))
            result.summary = f"{result.summary}; committed what it left uncommitted in {sha[:12]}"
    except StellaError as exc:
        result.success = False
        result.summary = f"{result.summary}; its uncommitted changes could not be committed: {exc}"
        result.error = result.summary
    return result
